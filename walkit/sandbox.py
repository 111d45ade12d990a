"""``walkit sandbox``: a :class:`~walkit.LocalCluster` in the foreground, for other processes.

It prints, one ``key=value`` per line on stdout (flushed), what a client and an operator
need::

    metadata_uri=local:///.../metadata       what every client and tool takes (--metadata)
    bookie.0=127.0.0.1:40123                 bookie 0's id (its bookie-protocol address)
    ...
    admin.0=http://127.0.0.1:40124           bookie 0's admin endpoint (--admin only)
    ...
    pid.0=12345                              bookie 0's process (--processes only)
    ...
    conf.0=/.../bookie-0/bookie.toml         bookie 0's configuration, as it runs
    ...
    data_dir=/...
    ready

and then waits. SIGINT or SIGTERM stops the bookies gracefully (adds in flight answered,
checkpointed) and the process exits 0. A signal that arrives while the cluster is still
starting is kept and acted on as soon as the start is over. Without ``--data`` the
cluster lives in a temporary directory, removed at the end.

Bookie options (``--bookie-option KEY=VALUE``) use the configuration file's key names and
values (TOML; a bare word is a string) and are checked by the code that checks a
configuration file, before anything starts. ``--admin`` is ``httpServerEnabled=true``:
each bookie's admin endpoint on 127.0.0.1, on a free port of its own.

A data directory keeps its bookies: without ``--bookies`` the sandbox starts the ones it
holds (3 in a new one). Asking for more adds bookies; asking for fewer is refused (a
:class:`~walkit.errors.UsageError` naming both counts), because the bookies left out
would hold copies of ledgers that then stay one copy short, and clients would find
their ensembles' bookies gone.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import tempfile
import threading
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any

from walkit.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from walkit import LocalCluster

__all__ = ["DEFAULT_BOOKIES", "parse_bookie_options", "run_sandbox"]

DEFAULT_BOOKIES = 3  # a new directory's: the default ensemble (E=3) fits


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@contextlib.contextmanager
def _directory(data: str | None) -> Iterator[str]:
    if data is not None:
        yield data
        return
    with tempfile.TemporaryDirectory(prefix="walkit-sandbox-") as tmp:
        yield tmp


def _toml_value(text: str) -> Any:
    """``text`` as a TOML value (``true``, ``0.5``, ``"a b"``, ``["x"]``); a bare word is a string."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def parse_bookie_options(pairs: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as configuration-file values (BookKeeper key names -> values);
    ConfigError for a pair without ``=`` or a key. The later of two equal keys wins."""
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError("a bookie option is KEY=VALUE, with a key of the bookie configuration file "
                              "(python -m bookie --config-reference)", option=repr(pair))
        values[key.strip()] = _toml_value(text.strip())
    return values


def _attributes(options: Mapping[str, Any]) -> dict[str, Any]:
    """Configuration-file values checked as a configuration file is (ConfigError naming
    the key), as :class:`~bookie.BookieConfig` attribute values."""
    from bookie import BookieConfig

    BookieConfig.from_dict(dict(options))
    names = BookieConfig.keys()
    return {names[key]: value for key, value in options.items()}


def _bookie_count(directory: str, asked: int | None) -> int:
    """The bookies to start: ``asked``, or the ones the directory holds (3 in a new one)."""
    from walkit import LocalCluster

    held = LocalCluster.remembered_bookies(directory)
    if asked is None:
        return held or DEFAULT_BOOKIES
    if asked < held:
        raise UsageError(f"this data directory holds {held} bookies, more than asked: start them all (--bookies "
                         f"{held}, or no --bookies), or give another --data directory for a new cluster",
                         bookies=asked, holds=held, data=directory)
    return asked


def _print_ready(cluster: LocalCluster, processes: bool) -> None:
    """The ``key=value`` lines of the module docstring, then ``ready``."""
    count = len(cluster.bookie_ids)
    lines = [f"metadata_uri={cluster.metadata_uri}"]
    lines += [f"bookie.{i}={bookie_id}" for i, bookie_id in enumerate(cluster.bookie_ids)]
    lines += [f"admin.{i}={url}" for i in range(count) if (url := cluster.admin_url(i)) is not None]
    if processes:
        lines += [f"pid.{i}={cluster.bookie_pid(i)}" for i in range(count)]
    lines += [f"conf.{i}={cluster.conf_path(i)}" for i in range(count)]
    lines += [f"data_dir={cluster.data_dir}", "ready"]
    for line in lines:
        print(line, flush=True)


def run_sandbox(data: str | None, bookies: int | None = None, processes: bool = False, *, admin: bool = False,
                bookie_options: Mapping[str, Any] | None = None) -> int:
    """Run the cluster until SIGINT/SIGTERM; the exit code (0: stopped cleanly).

    ``bookies``: None for the ones ``data`` holds (3 in a new directory); fewer than it
    holds is a UsageError. ``bookie_options``: configuration-file keys and values for
    every bookie; ``admin``: ``httpServerEnabled`` too."""
    from walkit import LocalCluster

    options = _attributes({**(bookie_options or {}), **({"httpServerEnabled": True} if admin else {})})
    stop = threading.Event()
    with _stop_on_signals(stop), _directory(data) as directory:
        count = _bookie_count(directory, bookies)
        with LocalCluster(directory, bookies=count, processes=processes, bookie_options=options) as cluster:
            _print_ready(cluster, processes)
            while not stop.wait(0.5):  # a bounded wait: the signal handler runs between waits
                pass
            print("stopping", file=sys.stderr, flush=True)
    return 0
