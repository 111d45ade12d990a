"""The embedded metadata store: the ZooKeeper-shaped tree in one SQLite file.

Theory of operation
-------------------
``LocalMetadataStore(directory)`` keeps the tree in ``<directory>/metadata.sqlite``,
shared by any number of stores in any number of processes on one machine. The file
must be there (``NoMetadataStoreError`` otherwise: a typo in a path never makes a
second, empty cluster); only ``create=True`` - ``walkit init``, the local clusters that
make their own - makes the directory and the file. SQLite is told so too: the URI mode
``rw`` never creates, ``rwc`` does.

The tree's schema and its operations inside one transaction are in
:mod:`walkit.metadata._sqlite_tree`; the connections, the durability settings, read-only
opening and bounded waits for the database lock in :mod:`walkit.metadata._sqlite_db`.
This module is the store: sessions and their heartbeat, watches and their poller.

Guarantees.

* Every operation is one short SQLite transaction; writes take ``BEGIN IMMEDIATE``
  (the database write lock) so reads-then-writes such as a version check are atomic
  across processes: CAS on ``version`` is linearizable. A :meth:`transaction` runs all
  its ops in one such transaction and rolls back on the first failure.
* The WAL journal with ``synchronous=FULL`` makes each committed write durable; a crash
  mid-transaction leaves the previous state.
* Ephemeral nodes belong to a session row with a lease (``expires_at``). A heartbeat
  thread renews the lease every ``session_timeout / 3``. Any store that sees an expired
  session (at the start of every write transaction and in its poller) deletes that
  session's ephemeral nodes and its row, so the nodes of a killed process vanish within
  about ``session_timeout`` plus a poll interval.
* Watches: a poller thread checks ``meta.seq`` every ``poll_interval``; when it moved,
  it compares each watched path's ``mzxid`` / ``pzxid`` / existence with what it last
  reported and calls back on the poller thread. Several changes between two polls are
  reported once, with the latest state (as ZooKeeper watches do). The first call, with
  the state at registration, runs synchronously in the registering thread; the watch is
  registered before that first read, so a change right after it is reported next (a
  watch's reports are serialised by its lock: the poller waits for the first one).

Read-only stores (``read_only=True``: the inspection commands) write nothing, and work
where the file and its directory cannot be written (how SQLite opens it then:
:mod:`walkit.metadata._sqlite_db`). There is no session (``session_id`` 0), no heartbeat
and no reaping; instead reads hide the ephemeral nodes of expired sessions, as if they
had been reaped (a watch hears of that only once a writer reaps them).

Assumptions. The processes share one clock (``time.time``) and a local file system
with working POSIX locks (not NFS). Callbacks do not block for long and do not call
the store from a session listener.

Recovery. If this store finds its own session gone (the process was paused past the
lease, or :meth:`expire_session` was called), it tells listeners ``LOST`` (its
ephemeral nodes are gone), opens a new session and tells them ``CONNECTED``. A call
that creates an ephemeral node and finds its session dead waits (up to
``session_timeout``) for that new session and tries once more on it; it raises
``SessionExpiredError`` if none comes.

A database that stays locked (another process holds its write lock: stuck, stopped
with SIGSTOP in the middle of a transaction) makes every write wait at most
``busy_timeout`` in all - for this store's write connection (one call at a time) and
then for SQLite's lock - and then raise ``MetadataUnavailableError`` with the cause.
``busy_timeout`` is this driver's retry deadline: :func:`~walkit.metadata.connect`
passes its ``retry_deadline`` here as it does to the ZooKeeper driver (30 s by default).
Reads go on meanwhile: they have a connection of their own, and in WAL mode readers
never wait for the writer. Once the lock is
released the next call goes through. While no write can pass, no lease is renewed: a
lock held longer than ``session_timeout`` expires the sessions it kept from renewing,
so after it their ephemeral nodes go and their owners hear LOST and then CONNECTED on a
new session, as after a ZooKeeper session expiry.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from walkit.errors import InvalidArgumentError, MetadataError, NoMetadataStoreError, SessionExpiredError
from walkit.metadata._sqlite_db import Db
from walkit.metadata._store import (
    ANY_VERSION,
    Create,
    Delete,
    Op,
    RETRY_DEADLINE,
    SessionState,
    SetData,
    Stat,
    Watch,
    check_path,
)

__all__ = ["LocalMetadataStore"]

_log = logging.getLogger(__name__)

T = TypeVar("T")

_FILE = "metadata.sqlite"


@dataclass
class _Watch:
    store: LocalMetadataStore
    key: int
    path: str
    children: bool
    callback: Callable[..., None]
    token: tuple[int, ...] | None = None  # None: not observed yet; (-1,): node absent
    #: held while the watch reads and reports: one report at a time, in order
    lock: threading.RLock = field(default_factory=threading.RLock)

    def cancel(self) -> None:
        self.store._watches.pop(self.key, None)


def _store_file(directory: str, create: bool) -> str:
    """``<directory>/metadata.sqlite``: made (with the directory) when ``create``, else it
    must be there - NoMetadataStoreError, and nothing made, when it is not."""
    file = os.path.join(directory, _FILE)
    if create:
        os.makedirs(directory, exist_ok=True)
    elif not os.path.isfile(file):
        raise NoMetadataStoreError(f"no metadata store at {directory}: a typo? for a new cluster run "
                                   f"`walkit init --metadata local://{directory}`", file=file)
    return file


class LocalMetadataStore:
    """A :class:`~walkit.metadata._store.MetadataStore` on ``<directory>/metadata.sqlite``
    (``create``: make it if it is not there; ``read_only``: see the module docstring)."""

    def __init__(self, directory: str, *, session_timeout: float = 10.0, poll_interval: float = 0.05,
                 busy_timeout: float = RETRY_DEADLINE, create: bool = False, read_only: bool = False) -> None:
        if session_timeout <= 0 or poll_interval <= 0 or busy_timeout <= 0:
            raise InvalidArgumentError("timeouts must be positive", session_timeout=session_timeout,
                                       poll_interval=poll_interval, busy_timeout=busy_timeout)
        if create and read_only:
            raise InvalidArgumentError("a read-only store cannot create its file", directory=directory)
        self._timeout = session_timeout
        self._poll_interval = poll_interval
        self._read_only = read_only
        self._db = Db(_store_file(directory, create), busy_timeout, create=create, read_only=read_only)
        self._session_lock = threading.Lock()
        self._listeners: list[Callable[[SessionState], None]] = []
        self._watches: dict[int, _Watch] = {}
        self._keys = itertools.count(1)
        self._stop = threading.Event()
        self._session = 0 if read_only else self._open_session()  # 0: none (no row has id 0)
        self._threads = [threading.Thread(target=self._poll_loop, name="walkit-md-poller", daemon=True)]
        if not read_only:
            self._threads.append(threading.Thread(target=self._heartbeat_loop, name="walkit-md-heartbeat",
                                                  daemon=True))
        for thread in self._threads:
            thread.start()

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def write_lock(self) -> threading.RLock:
        """The re-entrant lock held around each of this process's write transactions: a
        holder knows no write of this store is half done (a process may freeze itself
        holding it, and leave the database's own lock free for the others)."""
        return self._db.write_lock

    # -- the MetadataStore protocol ------------------------------------------------

    @property
    def session_id(self) -> int:
        return self._session

    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False,
               make_parents: bool = False) -> str:
        def create(session: int) -> str:
            with self._db.write() as tx:
                return tx.create(Create(path, data, ephemeral, sequential), session, make_parents, {})

        return self._on_live_session(create) if ephemeral else create(self._session)

    def get(self, path: str) -> tuple[bytes, Stat]:
        with self._db.read() as tx:
            row = tx.must(check_path(path), {})
            return bytes(row.data), tx.stat(row)

    def exists(self, path: str) -> Stat | None:
        with self._db.read() as tx:
            row = tx.row(check_path(path))
            return tx.stat(row) if row else None

    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> Stat:
        with self._db.write() as tx:
            return tx.set(SetData(check_path(path), data, version), {})

    def delete(self, path: str, version: int = ANY_VERSION, *, recursive: bool = False) -> None:
        with self._db.write() as tx:
            tx.delete(Delete(check_path(path), version), recursive, {})

    def children(self, path: str) -> list[str]:
        with self._db.read() as tx:
            tx.must(check_path(path), {})
            return tx.children(path)

    def sync(self, path: str) -> None:
        """Every read sees the SQLite file as committed: nothing to catch up."""
        check_path(path)

    def transaction(self, ops: Sequence[Op]) -> list[str | Stat | None]:
        def run(session: int) -> list[str | Stat | None]:
            with self._db.write() as tx:
                return [tx.apply(op, session, {"op_index": i}) for i, op in enumerate(ops)]

        return self._on_live_session(run)

    def watch_data(self, path: str, callback: Callable[[bytes | None, Stat | None], None]) -> Watch:
        return self._add_watch(check_path(path), False, callback)

    def watch_children(self, path: str, callback: Callable[[list[str] | None], None]) -> Watch:
        return self._add_watch(check_path(path), True, callback)

    def add_session_listener(self, callback: Callable[[SessionState], None]) -> None:
        self._listeners.append(callback)

    def remove_session_listener(self, callback: Callable[[SessionState], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(callback)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        self._watches.clear()
        if not self._read_only:
            with contextlib.suppress(MetadataError), self._db.write() as tx:
                tx.end_sessions([self._session])
        self._db.close()

    # -- test hook -------------------------------------------------------------------

    def expire_session(self) -> None:
        """End the session now, as a ZooKeeper session expiry would: its ephemeral nodes
        go, listeners see LOST, then a new session and CONNECTED."""
        old = self._session
        with self._db.write() as tx:
            tx.end_sessions([old])
        self._replace_session(old)

    # -- sessions ----------------------------------------------------------------------

    def _open_session(self) -> int:
        with self._db.write() as tx:
            return tx.new_session(self._timeout)

    def _on_live_session(self, fn: Callable[[int], T]) -> T:
        """``fn(session)``; if this store's session turned out to be dead (its lease lapsed
        while the database was locked, or while this process was paused), once more on
        the new session the heartbeat opens meanwhile (listeners hear LOST first) - as the
        ZooKeeper driver retries on kazoo's new session."""
        session = self._session
        try:
            return fn(session)
        except SessionExpiredError:
            deadline = time.monotonic() + self._timeout  # the heartbeat looks every timeout / 3
            while self._session == session:
                if self._stop.wait(0.01) or time.monotonic() >= deadline:
                    raise
            return fn(self._session)

    def _replace_session(self, old: int) -> None:
        with self._session_lock:
            if self._session != old or self._stop.is_set():
                return
            self._notify(SessionState.LOST)
            self._session = self._open_session()
            self._notify(SessionState.CONNECTED)

    def _notify(self, state: SessionState) -> None:
        for listener in list(self._listeners):
            try:
                listener(state)
            except Exception:
                _log.exception("session listener failed state=%s", state.value)

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self._timeout / 3):
            session = self._session
            try:
                with self._db.write() as tx:  # reaping first also ends our own lapsed lease
                    alive = tx.renew_session(session, self._timeout)
            except MetadataError:
                _log.warning("session heartbeat failed session=%d", session, exc_info=True)
                continue
            if not alive:
                self._replace_session(session)

    # -- watches -----------------------------------------------------------------------

    def _add_watch(self, path: str, children: bool, callback: Callable[..., None]) -> Watch:
        """Registered before its first read: a change made after that read (even by the
        first callback) moves ``meta.seq`` past what the poller saw, so the poller
        reports it - after the first report, which holds the watch's lock."""
        watch = _Watch(self, next(self._keys), path, children, callback)
        with watch.lock:
            self._watches[watch.key] = watch
            try:
                args = self._observe(watch)
                assert args is not None  # a fresh watch has no token yet, and the poller waits for the lock
                callback(*args)
            except BaseException:
                watch.cancel()  # not set up: the caller gets the error, and no watch
                raise
        return watch

    def _observe(self, watch: _Watch) -> tuple[object, ...] | None:
        """Read the watched state; None when it has not changed since the last report."""
        with self._db.read() as tx:
            row = tx.row(watch.path)
            token = (-1,) if row is None else (row.pzxid if watch.children else row.mzxid,)
            if token == watch.token:
                return None
            watch.token = token
            if watch.children:
                return (tx.children(watch.path) if row else None,)
            return (bytes(row.data), tx.stat(row)) if row else (None, None)

    def _poll_loop(self) -> None:
        last_seq = -1
        while not self._stop.wait(self._poll_interval):
            try:
                last_seq = self._poll_once(last_seq)
            except MetadataError:
                _log.warning("metadata poll failed", exc_info=True)

    def _poll_once(self, last_seq: int) -> int:
        with self._db.read() as tx:
            seq = tx.change_counter()
            expired = not self._read_only and tx.any_expired()
        if expired:
            self._db.reap()
            return last_seq
        if seq != last_seq:
            for watch in list(self._watches.values()):
                self._fire(watch)
        return seq

    def _fire(self, watch: _Watch) -> None:
        with watch.lock:
            args = self._observe(watch)
            if args is None or watch.key not in self._watches:
                return
            try:
                watch.callback(*args)
            except Exception:
                _log.exception("watch callback failed path=%s", watch.path)
