"""A local cluster's directory: what it remembers of each bookie, and the files it keeps.

Theory of operation
-------------------
:class:`Slot` is one bookie of a :class:`~walkit.LocalCluster`: its number, its
directory, and - once it has started - the port and id it got (0 / "" until then) and the
admin port of its latest start. ``cluster.json`` (:data:`STATE_FILE`) holds what a
restart needs: the metadata URI, the instance id, and each bookie's port and id;
:func:`load_state` reads it (a fresh state when there is none, ConfigError when it is not
one), and the cluster writes it with :func:`write_atomically`. A bookie's
``bookie.toml`` (:data:`CONF_FILE`) is rewritten by :func:`write_conf` after every start
with the id, port and admin port it got: the file ``walkit bookie start --conf`` would run
that same bookie with.

Crash safety: every file here is written whole or not at all (temporary file, rename,
directory fsync: :func:`walkit._files.write_atomic`), so a crash mid-write leaves the old
``cluster.json`` - the one whose ports and ids match the cookies on the bookies' disks.

A remembered port is tried before its bookie starts (:func:`check_port_free`): a bookie
on another port would be another bookie, so a port something else holds is refused
(:func:`port_taken`, a ConfigError naming it) rather than replaced.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import tomli_w

from walkit._files import write_atomic
from walkit.errors import ConfigError

if TYPE_CHECKING:
    from bookie import BookieConfig

__all__ = ["CONF_FILE", "HOST", "STATE_FILE", "STATE_FORMAT", "STOP_TIMEOUT", "Slot", "Started", "check_port_free",
           "choose_uri", "load_state", "make_dir", "open_cluster", "port_taken", "toml", "write_atomically",
           "write_conf"]

HOST = "127.0.0.1"
STATE_FILE = "cluster.json"
CONF_FILE = "bookie.toml"
STATE_FORMAT = "walkit-local-cluster 1"
STOP_TIMEOUT = 60.0  # a graceful stop answers adds in flight and checkpoints


@dataclasses.dataclass
class Slot:
    """One bookie of the cluster: where it lives and who it is (0 / "" until its first start)."""

    index: int
    directory: Path
    port: int = 0
    bookie_id: str = ""
    admin_port: int = 0  # the admin endpoint of its latest start (0: none)

    @property
    def conf(self) -> Path:
        return self.directory / CONF_FILE


class Started(NamedTuple):
    """What a bookie got at its start."""

    bookie_id: str
    port: int
    admin_port: int  # 0: no admin endpoint


def load_state(path: Path) -> dict[str, Any]:
    """The remembered state, or a fresh one; ConfigError when it is unreadable."""
    if not path.exists():
        return {"bookies": []}
    try:
        state = json.loads(path.read_text())
        bookies = state["bookies"]
        ok = (state.get("format") == STATE_FORMAT and isinstance(state.get("metadata_uri"), str)
              and isinstance(state.get("instance_id"), str)
              and all(isinstance(b["port"], int) and isinstance(b["bookie_id"], str) for b in bookies))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError("cannot read the local cluster's state", path=path) from exc
    if not ok:
        raise ConfigError("not a local cluster state file", path=path, format=repr(state.get("format")))
    return dict(state)


def choose_uri(data_dir: Path, asked: str | None, remembered: str | None) -> str:
    if remembered is not None and asked is not None and asked != remembered:
        raise ConfigError("this directory's cluster uses another metadata service", path=data_dir / STATE_FILE,
                          remembered=remembered, asked=asked)
    return asked or remembered or f"local://{data_dir / 'metadata'}"


def open_cluster(uri: str, instance_id: str | None, session_timeout: float) -> str:
    """Initialise the cluster the first time; afterwards require the same one. Its instance id."""
    from walkit.metadata import connect, init_cluster, open_metadata_store, parse_metadata_uri

    if instance_id is not None:  # ClusterLayoutError when it is gone or another one
        with connect(uri, instance_id=instance_id, session_timeout=session_timeout) as cluster:
            return cluster.info.instance_id
    parsed = parse_metadata_uri(uri)
    store = open_metadata_store(parsed, session_timeout=session_timeout, create=True)  # its own, the first time
    try:
        return init_cluster(store, parsed.root, parsed.layout).instance_id
    finally:
        store.close()


def make_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("cannot create the local cluster's directory", path=path, reason=exc.strerror) from exc


def write_atomically(path: Path, text: str) -> None:
    """:func:`walkit._files.write_atomic` (the old text or the new, never half), its
    failure a ConfigError naming the file."""
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise ConfigError("cannot write the local cluster's file", path=path, reason=exc.strerror) from exc


def write_conf(slot: Slot, config: BookieConfig) -> None:
    """The configuration of the bookie as it runs: the id, port and admin port it got."""
    admin_port = slot.admin_port or config.http_server_port
    got = dataclasses.replace(config, bookie_id=slot.bookie_id, bookie_port=slot.port, http_server_port=admin_port)
    header = (f"# bookie {slot.index} of a walkit local cluster, as its latest start ran it (rewritten by the next).\n"
              f"# Once the cluster is stopped: walkit bookie start --conf {slot.conf}\n")
    make_dir(slot.directory)
    write_atomically(slot.conf, header + toml(got))


def check_port_free(slot: Slot) -> None:
    """The bind the server will make (SO_REUSEADDR, as asyncio's), tried first."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, slot.port))
        except OSError as exc:
            raise port_taken(slot) from exc


def port_taken(slot: Slot) -> ConfigError:
    return ConfigError("a bookie's remembered port is taken: free it to restart the bookie under its id",
                       port=slot.port, bookie=slot.index, id=slot.bookie_id)


def toml(config: BookieConfig) -> str:
    """The configuration's non-default values, under BookKeeper's key names."""
    defaults = type(config)()
    return tomli_w.dumps({f.metadata["key"]: getattr(config, f.name) for f in dataclasses.fields(config)
                          if getattr(config, f.name) != getattr(defaults, f.name)})
