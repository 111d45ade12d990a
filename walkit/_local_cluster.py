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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

import tomli_w

from walkit._files import write_atomic
from walkit.errors import (
    BookieError,
    BookieUnavailableError,
    ConfigError,
    InvalidArgumentError,
    UsageError,
    WalkitError,
)

if TYPE_CHECKING:
    from bookie._config import BookieConfig
    from bookie.server import BookieServer
    from walkit.client import BookKeeper

__all__ = ["LocalCluster"]

T = TypeVar("T")

HOST = "127.0.0.1"
STATE_FILE = "cluster.json"
CONF_FILE = "bookie.toml"
_STATE_FORMAT = "walkit-local-cluster 1"
_SERVING = re.compile(r"bookie (\S+) serving on \S+:(\d+)")
_ADMIN = re.compile(r"admin endpoint on http://\S+:(\d+)/")  # logged before "serving on"
# Set by LocalCluster itself, never by bookie_options: they make a bookie this bookie.
_OWNED = frozenset({"bookie_id", "bookie_port", "bind_address", "advertised_address", "journal_directory",
                    "ledger_directories", "metadata_service_uri", "zk_timeout"})
_STOP_TIMEOUT = 60.0  # a graceful stop answers adds in flight and checkpoints
_LOG_TAIL = 3000  # characters of a bookie's log quoted in an error


@dataclasses.dataclass
class _Slot:
    """One bookie of the cluster: where it lives and who it is (0 / "" until its first start)."""

    index: int
    directory: Path
    port: int = 0
    bookie_id: str = ""
    admin_port: int = 0  # the admin endpoint of its latest start (0: none)

    @property
    def conf(self) -> Path:
        return self.directory / CONF_FILE


class _Started(NamedTuple):
    """What a bookie got at its start."""

    bookie_id: str
    port: int
    admin_port: int  # 0: no admin endpoint


class _Runner(Protocol):
    """How bookies run: in this process or as child processes."""

    def launch(self, slot: _Slot, config: BookieConfig) -> None: ...

    def wait_started(self, slot: _Slot, timeout: float) -> _Started: ...

    def kill(self, slot: _Slot) -> None: ...

    def stop(self, slots: list[_Slot]) -> None: ...

    def running(self, slot: _Slot) -> bool: ...

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
        _make_dir(self._dir)
        state = _load_state(self._dir / STATE_FILE)
        self._uri = _choose_uri(self._dir, metadata_uri, state.get("metadata_uri"))
        self._config(_Slot(0, self._bookie_dir(0)))  # the options' values are checked before anything starts
        self._instance_id = _open_cluster(self._uri, state.get("instance_id"), session_timeout)
        self._slots = [_Slot(i, self._bookie_dir(i), b["port"], b["bookie_id"]) for i, b in enumerate(state["bookies"])]
        self._slots += [_Slot(i, self._bookie_dir(i)) for i in range(len(self._slots), bookies)]
        self._save()
        self._runner: _Runner = _ProcessRunner() if processes else _InProcessRunner(on_server)
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
        return len(_load_state(Path(data_dir).resolve() / STATE_FILE)["bookies"])

    def is_running(self, i: int) -> bool:
        return not self._stopped and self._runner.running(self._slot(i))

    def bookie_pid(self, i: int) -> int:
        """The process id of running bookie ``i`` (``processes=True``; e.g. to read its CPU time)."""
        slot = self._running_slot(i)
        if not isinstance(self._runner, _ProcessRunner):
            raise UsageError("bookie_pid() needs bookie processes (LocalCluster(processes=True))", data_dir=self._dir)
        return self._runner._procs[slot.index].pid  # the runner is this module's own

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
            slot = _Slot(len(self._slots), self._bookie_dir(len(self._slots)))
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

    def _slot(self, i: int) -> _Slot:
        if not isinstance(i, int) or not 0 <= i < len(self._slots):
            raise InvalidArgumentError("no such bookie", bookie=i, bookies=len(self._slots))
        return self._slots[i]

    def _running_slot(self, i: int) -> _Slot:
        slot = self._slot(i)
        self._check_open()
        if not self._runner.running(slot):
            raise UsageError("bookie is not running", bookie=i, id=slot.bookie_id)
        return slot

    def _in_process(self, what: str) -> _InProcessRunner:
        self._check_open()
        if not isinstance(self._runner, _InProcessRunner):
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

    def _config(self, slot: _Slot) -> BookieConfig:
        from bookie import BookieConfig

        options = dict(self._options)
        if options.get("http_server_enabled"):
            options.setdefault("http_server_port", 0)  # a free one each: the bookies share their options
            options.setdefault("http_server_address", HOST)
        return BookieConfig(bookie_id=slot.bookie_id, bookie_port=slot.port, bind_address=HOST,
                            journal_directory=str(slot.directory / "journal"),
                            ledger_directories=[str(slot.directory / "ledgers")], metadata_service_uri=self._uri,
                            zk_timeout=max(1, round(self._session_timeout * 1000)), **options)

    def _start(self, slots: list[_Slot]) -> None:
        """Start ``slots`` together; remember the ports and ids of those that came up."""
        for slot in slots:
            if slot.port:
                _check_port_free(slot)
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
                _write_conf(slot, config)
            except WalkitError as exc:
                errors.append(exc)
        self._save()
        if errors:
            raise errors[0]

    def _save(self) -> None:
        state = {"format": _STATE_FORMAT, "metadata_uri": self._uri, "instance_id": self._instance_id,
                 "bookies": [{"port": s.port, "bookie_id": s.bookie_id} for s in self._slots]}
        _write_atomically(self._dir / STATE_FILE, json.dumps(state, indent=2) + "\n")


# -- cluster.json and the metadata store -----------------------------------------------------

def _load_state(path: Path) -> dict[str, Any]:
    """The remembered state, or a fresh one; ConfigError when it is unreadable."""
    if not path.exists():
        return {"bookies": []}
    try:
        state = json.loads(path.read_text())
        bookies = state["bookies"]
        ok = (state.get("format") == _STATE_FORMAT and isinstance(state.get("metadata_uri"), str)
              and isinstance(state.get("instance_id"), str)
              and all(isinstance(b["port"], int) and isinstance(b["bookie_id"], str) for b in bookies))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError("cannot read the local cluster's state", path=path) from exc
    if not ok:
        raise ConfigError("not a local cluster state file", path=path, format=repr(state.get("format")))
    return dict(state)


def _choose_uri(data_dir: Path, asked: str | None, remembered: str | None) -> str:
    if remembered is not None and asked is not None and asked != remembered:
        raise ConfigError("this directory's cluster uses another metadata service", path=data_dir / STATE_FILE,
                          remembered=remembered, asked=asked)
    return asked or remembered or f"local://{data_dir / 'metadata'}"


def _open_cluster(uri: str, instance_id: str | None, session_timeout: float) -> str:
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


def _make_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("cannot create the local cluster's directory", path=path, reason=exc.strerror) from exc


def _write_atomically(path: Path, text: str) -> None:
    """:func:`walkit._files.write_atomic` (the old text or the new, never half), its
    failure a ConfigError naming the file."""
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise ConfigError("cannot write the local cluster's file", path=path, reason=exc.strerror) from exc


def _write_conf(slot: _Slot, config: BookieConfig) -> None:
    """The configuration of the bookie as it runs: the id, port and admin port it got."""
    admin_port = slot.admin_port or config.http_server_port
    got = dataclasses.replace(config, bookie_id=slot.bookie_id, bookie_port=slot.port, http_server_port=admin_port)
    header = (f"# bookie {slot.index} of a walkit local cluster, as its latest start ran it (rewritten by the next).\n"
              f"# Once the cluster is stopped: walkit bookie start --conf {slot.conf}\n")
    _make_dir(slot.directory)
    _write_atomically(slot.conf, header + _toml(got))


def _check_port_free(slot: _Slot) -> None:
    """The bind the server will make (SO_REUSEADDR, as asyncio's), tried first."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, slot.port))
        except OSError as exc:
            raise _port_taken(slot) from exc


def _port_taken(slot: _Slot) -> ConfigError:
    return ConfigError("a bookie's remembered port is taken: free it to restart the bookie under its id",
                       port=slot.port, bookie=slot.index, id=slot.bookie_id)


# -- in-process bookies --------------------------------------------------------------------

class _LoopThread:
    """One thread running one asyncio event loop; coroutines are submitted from outside."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="walkit-local-cluster", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            tasks = asyncio.all_tasks(self.loop)
            for task in tasks:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if threading.current_thread() is self._thread:
            coro.close()
            raise UsageError("LocalCluster methods block: do not call them from its own event loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float, what: str, **context: object) -> T:
        fut = self.submit(coro)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            fut.cancel()
            raise BookieUnavailableError(f"{what} did not finish in time", timeout=timeout, **context) from exc

    def close(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()


class _InProcessRunner:
    """Every BookieServer on one :class:`_LoopThread`."""

    def __init__(self, on_server: Callable[[int, BookieServer], None] | None = None) -> None:
        self._loop = _LoopThread()
        self._on_server = on_server
        self._servers: dict[int, BookieServer] = {}
        self._starting: dict[int, concurrent.futures.Future[_Started]] = {}
        self._forced_usage: dict[int, float] = {}  # set_read_only: what the disks of a bookie look like

    def launch(self, slot: _Slot, config: BookieConfig) -> None:
        self._starting[slot.index] = self._loop.submit(self._start(slot, config))

    def wait_started(self, slot: _Slot, timeout: float) -> _Started:
        fut = self._starting.pop(slot.index)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            fut.cancel()
            raise BookieUnavailableError("bookie did not start in time", bookie=slot.index, timeout=timeout) from exc

    async def _start(self, slot: _Slot, config: BookieConfig) -> _Started:
        from bookie.server import BookieServer

        server = BookieServer(config, disk_usage=lambda path: self._disk_usage(slot.index, path))
        if self._on_server is not None:
            self._on_server(slot.index, server)
        try:
            await server.start()
        except WalkitError:
            raise
        except OSError as exc:  # the bind
            if exc.errno == errno.EADDRINUSE:
                raise _port_taken(slot) from exc
            raise BookieError("bookie could not start", bookie=slot.index, reason=str(exc)) from exc
        self._servers[slot.index] = server
        asyncio.get_running_loop().create_task(self._forget_when_stopped(slot.index, server))
        return _Started(server.bookie_id, server.port, server.http_port)

    async def _forget_when_stopped(self, index: int, server: BookieServer) -> None:
        """A server may stop by itself (registration lost for good): then it is not running."""
        await server.wait_stopped()
        if self._servers.get(index) is server:
            del self._servers[index]

    def _disk_usage(self, index: int, path: str) -> float:
        from bookie.server import disk_usage

        forced = self._forced_usage.get(index)
        return disk_usage(path) if forced is None else forced

    def server(self, slot: _Slot) -> BookieServer:
        server = self._servers.get(slot.index)
        if server is None:
            raise UsageError("bookie is not running", bookie=slot.index, id=slot.bookie_id)
        return server

    def running(self, slot: _Slot) -> bool:
        return slot.index in self._servers

    def kill(self, slot: _Slot) -> None:
        self._loop.call(self._kill(slot.index), _STOP_TIMEOUT, "killing a bookie", bookie=slot.index)

    async def _kill(self, index: int) -> None:
        server = self._servers.pop(index, None)
        if server is None:  # it stopped by itself meanwhile
            return
        await _abort(server)
        await server.stop()

    def stop(self, slots: list[_Slot]) -> None:
        self._loop.call(self._stop([s.index for s in slots]), _STOP_TIMEOUT, "stopping bookies",
                        bookies=",".join(str(s.index) for s in slots))

    async def _stop(self, indexes: list[int]) -> None:
        servers = {i: self._servers.pop(i) for i in indexes if i in self._servers}
        await asyncio.gather(*(server.stop() for server in servers.values()))
        failed = {i: s.stop_error for i, s in servers.items() if s.stop_error is not None}
        if failed:
            i, error = next(iter(failed.items()))
            raise BookieError("bookie did not stop cleanly", bookie=i, failed=len(failed)) from error

    def set_read_only(self, slot: _Slot, readonly: bool) -> None:
        self._forced_usage[slot.index] = 1.0 if readonly else 0.0
        server = self.server(slot)
        try:
            self._loop.call(server.check_disks(), _STOP_TIMEOUT, "switching mode", bookie=slot.index)
        finally:
            if not readonly:
                del self._forced_usage[slot.index]  # back to the real disks
        if server.readonly != readonly:
            raise BookieError("the bookie did not switch mode (see its log)", bookie=slot.index, readonly=readonly)

    def close(self) -> None:
        """Stop what is still running (a cluster dropped without stop()), then the loop."""
        if self._servers:
            with contextlib.suppress(WalkitError):
                self._loop.call(self._stop(list(self._servers)), _STOP_TIMEOUT, "stopping bookies")
        self._loop.close()


async def _abort(server: BookieServer) -> None:
    """Drop every connection without answering and close the listening socket, as a crash
    would. BookieServer has no public switch for this (its ``stop`` is graceful), so the
    test harness reaches into it here.

    The listener stops accepting before it is closed, and the connections it accepted
    just before get the loop iterations they need to reach ``connection_made``: asyncio
    3.11 never closes a socket it accepted whose transport is made after
    ``Server.close()`` (its peer would wait for ever), so they are aborted here instead."""
    _abort_connections(server)
    listener = server._server
    if listener is not None:
        loop = asyncio.get_running_loop()
        for sock in listener.sockets:
            loop.remove_reader(sock.fileno())
        for _ in range(3):  # accept task step, then connection_made
            await asyncio.sleep(0)
        listener.close()
    _abort_connections(server)
    await asyncio.sleep(0)  # connection_lost ran: the stop finds no connection to answer on


def _abort_connections(server: BookieServer) -> None:
    for conn in list(server._connections):
        if conn.transport is not None:
            conn.transport.abort()


# -- bookies as processes ------------------------------------------------------------------

class _ProcessRunner:
    """``python -m bookie --conf <dir>/bookie.toml`` per bookie."""

    def __init__(self) -> None:
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._log_from: dict[int, int] = {}

    def launch(self, slot: _Slot, config: BookieConfig) -> None:
        conf = slot.conf
        _make_dir(slot.directory)
        _write_atomically(conf, "# written by walkit.LocalCluster for this start\n" + _toml(config))
        log_path = slot.directory / "bookie.log"
        try:
            self._log_from[slot.index] = log_path.stat().st_size if log_path.exists() else 0
            with open(log_path, "ab") as log:
                self._procs[slot.index] = subprocess.Popen(
                    [sys.executable, "-m", "bookie", "--conf", str(conf)], stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, env=_child_env())
        except OSError as exc:
            raise BookieError("cannot start the bookie process", bookie=slot.index, reason=str(exc)) from exc

    def wait_started(self, slot: _Slot, timeout: float) -> _Started:
        proc = self._procs[slot.index]
        deadline = time.monotonic() + timeout
        while True:
            log = self._log(slot)
            found = _SERVING.search(log)
            if found:
                admin = _ADMIN.search(log, 0, found.start())
                return _Started(found.group(1), int(found.group(2)), int(admin.group(1)) if admin else 0)
            if proc.poll() is not None:
                self._procs.pop(slot.index)
                raise self._start_failed(slot, f"bookie process exited with {proc.returncode}")
            if time.monotonic() > deadline:
                self.kill(slot)
                raise BookieUnavailableError("bookie process did not start serving in time", bookie=slot.index,
                                             timeout=timeout, log=self._tail(slot))
            time.sleep(0.05)

    def _start_failed(self, slot: _Slot, what: str) -> WalkitError:
        tail = self._tail(slot)
        if slot.port and "address already in use" in tail.lower():
            return _port_taken(slot)
        return BookieError(what, bookie=slot.index, log=tail)

    def _log(self, slot: _Slot) -> str:
        """What the bookie logged since its latest launch."""
        with open(slot.directory / "bookie.log", "rb") as fh:
            fh.seek(self._log_from.get(slot.index, 0))
            return fh.read().decode(errors="replace")

    def _tail(self, slot: _Slot) -> str:
        return "\n" + self._log(slot)[-_LOG_TAIL:]

    def running(self, slot: _Slot) -> bool:
        proc = self._procs.get(slot.index)
        return proc is not None and proc.poll() is None

    def kill(self, slot: _Slot) -> None:
        proc = self._procs.pop(slot.index)
        proc.kill()
        proc.wait(_STOP_TIMEOUT)

    def stop(self, slots: list[_Slot]) -> None:
        procs = {s.index: (s, self._procs.pop(s.index)) for s in slots if s.index in self._procs}
        for _, proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        errors = [error for slot, proc in procs.values() if (error := self._reap(slot, proc)) is not None]
        if errors:
            raise errors[0]

    def _reap(self, slot: _Slot, proc: subprocess.Popen[bytes]) -> WalkitError | None:
        try:
            code = proc.wait(_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return BookieError("bookie process did not stop in time: killed", bookie=slot.index, log=self._tail(slot))
        if code != 0:
            return BookieError("bookie process did not stop cleanly", bookie=slot.index, exit_code=code,
                               log=self._tail(slot))
        return None

    def close(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._procs.clear()


def _child_env() -> dict[str, str]:
    """The child imports the very bookie and walkit this process runs."""
    import bookie

    root = str(Path(bookie.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=root + (os.pathsep + path if path else ""))


def _toml(config: BookieConfig) -> str:
    """The configuration's non-default values, under BookKeeper's key names."""
    from bookie import BookieConfig

    defaults = BookieConfig()
    return tomli_w.dumps({f.metadata["key"]: getattr(config, f.name) for f in dataclasses.fields(config)
                          if getattr(config, f.name) != getattr(defaults, f.name)})
