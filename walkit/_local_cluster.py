"""``walkit.LocalCluster``: a whole walkit cluster on this machine, for embedding and tests.

Theory of operation
-------------------
A local cluster is a directory::

    <data_dir>/cluster.json            what a restart needs: metadata URI, instance id,
                                       each bookie's port and id
    <data_dir>/metadata/               the embedded local:// store (unless another URI is given)
    <data_dir>/bookie-<i>/journal/     bookie i's journal directory
    <data_dir>/bookie-<i>/ledgers/     bookie i's ledger directory
    <data_dir>/bookie-<i>/bookie.toml  its configuration (BookKeeper key names), rewritten by
                                       every start with what the bookie got (id, port, admin port)
    <data_dir>/bookie-<i>/bookie.log   process mode: its stderr

Opening it initialises the cluster in the metadata store (``init_cluster``, idempotent)
the first time, and afterwards checks that the store still holds the same cluster (the
instance id kept in ``cluster.json``; the bookies' cookies carry it too). Then it starts
every bookie, all at once, and waits until each is registered and serving.

A bookie's first start binds port 0 on 127.0.0.1 and the port it got, with its id
``127.0.0.1:<port>``, is written to ``cluster.json`` (atomically: temporary file, rename,
directory fsync). Every later start, in this object or after re-opening the directory,
binds that same port under the same id, so the cookies on its disks, the cookie in
metadata and the clients' view of the ensembles all stay valid. A remembered port that
something else holds is refused before the bookie starts (:class:`ConfigError` naming
it): a bookie on another port would be another bookie.

With ``httpServerEnabled`` (``bookie_options={"http_server_enabled": True}``) each bookie's
admin endpoint listens on 127.0.0.1 on a free port of its own, chosen anew at every start
(unless ``http_server_port`` is given: then every bookie asks for that one)
(:meth:`LocalCluster.admin_url`). Once a bookie is up, its ``bookie.toml`` is written with
the id, port and admin port it got: the file ``walkit bookie start --conf`` (``python -m
bookie --conf``) would run that same bookie with, once the cluster is stopped.

Two ways to run the bookies:

* in-process (default): every :class:`~bookie.server.BookieServer` runs on one dedicated
  thread with its own asyncio event loop, so the caller may be synchronous code or have
  an event loop of its own. Every method of this class blocks until the loop thread has
  done the work. The in-process servers are reachable (:meth:`LocalCluster.server`) for
  tests that inject faults.
* ``processes=True``: each bookie is ``python -m bookie --conf <dir>/bookie.toml``; the
  start is complete when its log says "serving on".

Faults: :meth:`~LocalCluster.kill_bookie` is SIGKILL for a process. In-process it closes
the listening socket and aborts every connection, so no request in flight is answered,
then releases the server's resources (its metadata session and registration, journal,
storage and directory locks) so that the same bookie can be restarted in this process.
Unlike a real crash, the registration goes at once instead of at the session's expiry;
process mode shows the expiry.
:meth:`~LocalCluster.set_read_only` makes an in-process bookie see its ledger disks as
full (or empty) and runs the server's own disk check, exactly the path the disk monitor
takes; the override stays with the bookie across ``restart_bookie`` until it is lifted
(not across a re-open of the directory).
``on_server`` (in-process only) is called with every :class:`~bookie.server.BookieServer`
the cluster creates, before it starts: the seam where ``walkit.testing`` sets the
server's test hooks (a proxy as its registered endpoint, corrupted reads).

This module is the cluster itself (which bookies it has, starting them together,
``cluster.json`` kept in step); the directory's files and what a bookie is live in
:mod:`walkit._local_state`, and the two ways to run bookies in
:mod:`walkit._local_inprocess` and :mod:`walkit._local_processes`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from walkit._local_inprocess import InProcessRunner
from walkit._local_processes import ProcessRunner
from walkit._local_state import (
    HOST,
    STATE_FILE,
    STATE_FORMAT,
    Slot,
    Started,
    check_port_free,
    choose_uri,
    load_state,
    make_dir,
    open_cluster,
    write_atomically,
    write_conf,
)
from walkit.errors import ConfigError, InvalidArgumentError, UsageError, WalkitError

if TYPE_CHECKING:
    from bookie import BookieConfig
    from bookie.server import BookieServer
    from walkit.client import BookKeeper

__all__ = ["LocalCluster"]

# Set by LocalCluster itself, never by bookie_options: they make a bookie this bookie.
_OWNED = frozenset({"bookie_id", "bookie_port", "bind_address", "advertised_address", "journal_directory",
                    "ledger_directories", "metadata_service_uri", "zk_timeout"})


class _Runner(Protocol):
    """How bookies run: in this process or as child processes."""

    def launch(self, slot: Slot, config: BookieConfig) -> None: ...

    def wait_started(self, slot: Slot, timeout: float) -> Started: ...

    def kill(self, slot: Slot) -> None: ...

    def stop(self, slots: list[Slot]) -> None: ...

    def running(self, slot: Slot) -> bool: ...

    def close(self) -> None: ...


class LocalCluster:
    """``bookies`` bookies on 127.0.0.1 and a metadata store, all under ``data_dir``.

    Started by the constructor; :meth:`stop` (or leaving a ``with`` block) stops it.
    Opening the same directory again brings back the same cluster: same metadata URI
    (when none is given), bookie ids, ports and data, and every bookie it ever had
    (``bookies`` is a minimum). Bookie numbers (``i``) are 0-based, in order of creation.

    ``metadata_uri`` defaults to ``local://<data_dir>/metadata``; ``bookie_options`` are
    :class:`~bookie.BookieConfig` attribute values for every bookie (not the ones that
    make a bookie this bookie: ports, directories, ids, metadata); ``session_timeout``
    (seconds) is the bookies' metadata session timeout (``zkTimeout``). ``on_server(i,
    server)`` (in-process only) sees each new server of bookie ``i`` before it starts
    (fault-injection hooks: ``walkit.testing``)."""

    def __init__(self, data_dir: str | os.PathLike[str], bookies: int = 3, processes: bool = False, *,
                 metadata_uri: str | None = None, bookie_options: Mapping[str, Any] | None = None,
                 session_timeout: float = 10.0,
                 on_server: Callable[[int, BookieServer], None] | None = None) -> None:
        if bookies < 0 or session_timeout <= 0:
            raise InvalidArgumentError("need bookies >= 0 and session_timeout > 0", bookies=bookies,
                                       session_timeout=session_timeout)
        if processes and on_server is not None:
            raise InvalidArgumentError("on_server needs in-process bookies (processes=False)")
        self._dir = Path(data_dir).resolve()
        self._processes = processes
        self._options = dict(bookie_options or {})
        self._session_timeout = session_timeout
        self._lock = threading.RLock()
        self._stopped = False
        self._check_options()
        make_dir(self._dir)
        state = load_state(self._dir / STATE_FILE)
        self._uri = choose_uri(self._dir, metadata_uri, state.get("metadata_uri"))
        self._config(Slot(0, self._bookie_dir(0)))  # the options' values are checked before anything starts
        self._instance_id = open_cluster(self._uri, state.get("instance_id"), session_timeout)
        self._slots = [Slot(i, self._bookie_dir(i), b["port"], b["bookie_id"]) for i, b in enumerate(state["bookies"])]
        self._slots += [Slot(i, self._bookie_dir(i)) for i in range(len(self._slots), bookies)]
        self._save()
        self._runner: _Runner = ProcessRunner() if processes else InProcessRunner(on_server)
        self._finalizer = weakref.finalize(self, self._runner.close)  # no orphan bookies if never stopped
        try:
            self._start(self._slots)
        except BaseException:
            self.stop()
            raise

    # -- what the cluster is ------------------------------------------------------------
    @property
    def metadata_uri(self) -> str:
        return self._uri

    @property
    def data_dir(self) -> Path:
        return self._dir

    @property
    def bookie_ids(self) -> list[str]:
        """Every bookie's id (index = bookie number), running or not."""
        return [slot.bookie_id for slot in self._slots]

    def bookie_address(self, i: int) -> tuple[str, int]:
        return HOST, self._slot(i).port

    def admin_url(self, i: int) -> str | None:
        """``http://127.0.0.1:<port>`` of running bookie ``i``'s admin endpoint (None: not
        running, or no ``http_server_enabled``)."""
        slot = self._slot(i)
        return f"http://{HOST}:{slot.admin_port}" if slot.admin_port and self.is_running(i) else None

    def conf_path(self, i: int) -> Path:
        """Bookie ``i``'s configuration file (written by its first start)."""
        return self._slot(i).conf

    @staticmethod
    def remembered_bookies(data_dir: str | os.PathLike[str]) -> int:
        """How many bookies the local cluster in ``data_dir`` has (0: none there yet); the
        directory is only read."""
        return len(load_state(Path(data_dir).resolve() / STATE_FILE)["bookies"])

    def is_running(self, i: int) -> bool:
        return not self._stopped and self._runner.running(self._slot(i))

    def bookie_pid(self, i: int) -> int:
        """The process id of running bookie ``i`` (``processes=True``; e.g. to read its CPU time)."""
        slot = self._running_slot(i)
        if not isinstance(self._runner, ProcessRunner):
            raise UsageError("bookie_pid() needs bookie processes (LocalCluster(processes=True))", data_dir=self._dir)
        return self._runner.pid(slot)

    def server(self, i: int) -> BookieServer:
        """The in-process server of bookie ``i`` (to inject faults)."""
        runner = self._in_process("server()")
        return runner.server(self._slot(i))

    # -- bookies ------------------------------------------------------------------------
    def kill_bookie(self, i: int) -> None:
        """Crash bookie ``i``: SIGKILL, or (in-process) drop every connection unanswered."""
        with self._lock:
            slot = self._running_slot(i)
            self._runner.kill(slot)

    def stop_bookie(self, i: int) -> None:
        """Stop bookie ``i`` gracefully (adds in flight answered, deregistered, checkpointed)."""
        with self._lock:
            slot = self._running_slot(i)
            self._runner.stop([slot])

    def restart_bookie(self, i: int) -> None:
        """Start bookie ``i`` again on its directories, port and id (stopped first if running)."""
        with self._lock:
            slot = self._slot(i)
            self._check_open()
            if self._runner.running(slot):
                self._runner.stop([slot])
            self._start([slot])

    def add_bookie(self) -> int:
        """Start one more bookie; its number. (One that fails to start stays in the
        cluster, not running: :meth:`restart_bookie` tries again.)"""
        with self._lock:
            self._check_open()
            slot = Slot(len(self._slots), self._bookie_dir(len(self._slots)))
            self._slots.append(slot)
            self._start([slot])
            return slot.index

    def set_read_only(self, i: int, readonly: bool = True) -> None:
        """Make in-process bookie ``i`` read-only (its disks look full) or writable again
        (the real disk usage decides from then on), through the server's disk check."""
        with self._lock:
            runner = self._in_process("set_read_only()")
            runner.set_read_only(self._running_slot(i), readonly)

    def client(self, **options: Any) -> BookKeeper:
        """``walkit.BookKeeper(self.metadata_uri, **options)``: a client of this cluster
        (the caller closes it)."""
        from walkit.client import BookKeeper  # on use: running bookies never needs the client

        return BookKeeper(self.metadata_uri, **options)

    # -- lifecycle ------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop every bookie gracefully (idempotent)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            runner = getattr(self, "_runner", None)
            if runner is None:
                return
            try:
                runner.stop([s for s in self._slots if runner.running(s)])
            finally:
                self._finalizer()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        mode = "processes" if self._processes else "in-process"
        return f"LocalCluster({str(self._dir)!r}, bookies={len(self._slots)}, {mode}, uri={self._uri!r})"

    # -- internals ------------------------------------------------------------------------
    def _bookie_dir(self, i: int) -> Path:
        return self._dir / f"bookie-{i}"

    def _check_open(self) -> None:
        if self._stopped:
            raise UsageError("the local cluster is stopped", data_dir=self._dir)

    def _slot(self, i: int) -> Slot:
        if not isinstance(i, int) or not 0 <= i < len(self._slots):
            raise InvalidArgumentError("no such bookie", bookie=i, bookies=len(self._slots))
        return self._slots[i]

    def _running_slot(self, i: int) -> Slot:
        slot = self._slot(i)
        self._check_open()
        if not self._runner.running(slot):
            raise UsageError("bookie is not running", bookie=i, id=slot.bookie_id)
        return slot

    def _in_process(self, what: str) -> InProcessRunner:
        self._check_open()
        if not isinstance(self._runner, InProcessRunner):
            raise UsageError(f"{what} needs in-process bookies (LocalCluster(processes=False))", data_dir=self._dir)
        return self._runner

    def _check_options(self) -> None:
        from bookie import BookieConfig

        keys = {f.name: f.metadata["key"] for f in dataclasses.fields(BookieConfig)}
        unknown = sorted(set(self._options) - set(keys))
        if unknown:
            raise ConfigError("unknown bookie options (BookieConfig attribute names)", options=",".join(unknown))
        owned = sorted(set(self._options) & _OWNED)
        if owned:
            raise ConfigError("bookie options that the local cluster sets itself, for each bookie",
                              options=",".join(owned), keys=",".join(keys[name] for name in owned))

    def _config(self, slot: Slot) -> BookieConfig:
        from bookie import BookieConfig

        options = dict(self._options)
        if options.get("http_server_enabled"):
            options.setdefault("http_server_port", 0)  # a free one each: the bookies share their options
            options.setdefault("http_server_address", HOST)
        return BookieConfig(bookie_id=slot.bookie_id, bookie_port=slot.port, bind_address=HOST,
                            journal_directory=str(slot.directory / "journal"),
                            ledger_directories=[str(slot.directory / "ledgers")], metadata_service_uri=self._uri,
                            zk_timeout=max(1, round(self._session_timeout * 1000)), **options)

    def _start(self, slots: list[Slot]) -> None:
        """Start ``slots`` together; remember the ports and ids of those that came up."""
        for slot in slots:
            if slot.port:
                check_port_free(slot)
        timeout = 30.0 + 3 * self._session_timeout  # a restart waits out its previous session
        errors: list[BaseException] = []
        launched = {}
        for slot in slots:
            slot.admin_port = 0
            config = self._config(slot)
            try:
                self._runner.launch(slot, config)
                launched[slot.index] = slot, config
            except WalkitError as exc:
                errors.append(exc)
        for slot, config in launched.values():
            try:
                slot.bookie_id, slot.port, slot.admin_port = self._runner.wait_started(slot, timeout)
                write_conf(slot, config)
            except WalkitError as exc:
                errors.append(exc)
        self._save()
        if errors:
            raise errors[0]

    def _save(self) -> None:
        state = {"format": STATE_FORMAT, "metadata_uri": self._uri, "instance_id": self._instance_id,
                 "bookies": [{"port": s.port, "bookie_id": s.bookie_id} for s in self._slots]}
        write_atomically(self._dir / STATE_FILE, json.dumps(state, indent=2) + "\n")
