"""The embedded metadata store: the ZooKeeper-shaped tree in one SQLite file.

Theory of operation
-------------------
``LocalMetadataStore(directory)`` keeps the tree in ``<directory>/metadata.sqlite``,
shared by any number of stores in any number of processes on one machine. The file
must be there (``NoMetadataStoreError`` otherwise: a typo in a path never makes a
second, empty cluster); only ``create=True`` - ``walkit init``, the local clusters that
make their own - makes the directory and the file. SQLite is told so too: the URI mode
``rw`` never creates, ``rwc`` does.

Schema::

    nodes(path PK, parent, data, version, cversion, ctime, mtime,
          ephemeral_owner, mzxid, pzxid)           -- index on parent
    sessions(id INTEGER PK AUTOINCREMENT, expires_at)
    meta(key PK, value)                            -- 'seq': the change counter

Guarantees.

* Every operation is one short SQLite transaction; writes take ``BEGIN IMMEDIATE``
  (the database write lock) so reads-then-writes such as a version check are atomic
  across processes: CAS on ``version`` is linearizable. A :meth:`transaction` runs all
  its ops in one such transaction and rolls back on the first failure.
* The WAL journal with ``synchronous=FULL`` makes each committed write durable; a crash
  mid-transaction leaves the previous state.
* Each write that changes the tree bumps the global counter ``meta.seq`` once and
  stamps it on the nodes it touched: ``mzxid`` (node created or data set) and ``pzxid``
  (children created or deleted). A delete-and-recreate therefore never looks unchanged.
* Sequential children are named ``<path><parent cversion:010d>``; ``cversion`` only
  grows, so names under one parent are unique and increasing.
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
where the file and its directory cannot be written. SQLite opens the file ``mode=ro``:
it never writes it (a write through the store raises ``MetadataReadOnlyError`` before
SQLite is asked). There is no session (``session_id`` 0), no heartbeat and no reaping;
instead reads hide the ephemeral nodes of expired sessions, as if they had been reaped
(a watch hears of that only once a writer reaps them). In WAL mode a reader needs the
``-shm`` index beside the file: in a writable directory SQLite makes it (and an empty
``-wal``) if no process has; in a read-only one it reads those that are there. A
read-only directory with neither (no process has the store open, and the last one
folded the WAL into the file) is opened ``immutable``: all of the store is in the file.
Such a reader does not see a writer that opens the store later (on a read-only mount
there can be none).

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
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from walkit.errors import (
    InvalidArgumentError,
    MetadataError,
    MetadataReadOnlyError,
    MetadataUnavailableError,
    MetadataVersionError,
    NoMetadataStoreError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from walkit.metadata._store import (
    ANY_VERSION,
    Check,
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

_BUSY_SLACK = 0.05  # waited less than this for our own lock: give SQLite the whole timeout

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    path TEXT PRIMARY KEY, parent TEXT, data BLOB NOT NULL,
    version INTEGER NOT NULL, cversion INTEGER NOT NULL,
    ctime REAL NOT NULL, mtime REAL NOT NULL, ephemeral_owner INTEGER NOT NULL,
    mzxid INTEGER NOT NULL, pzxid INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS nodes_parent ON nodes(parent);
CREATE INDEX IF NOT EXISTS nodes_owner ON nodes(ephemeral_owner);
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('seq', 0);
INSERT OR IGNORE INTO nodes VALUES ('/', NULL, x'', 0, 0, 0, 0, 0, 0, 0);
"""

_COLUMNS = "path, data, version, cversion, ctime, mtime, ephemeral_owner, mzxid, pzxid"

# A read-only store's reads: the nodes of expired sessions are as good as reaped.
_LIVE = " AND (ephemeral_owner = 0 OR ephemeral_owner IN (SELECT id FROM sessions WHERE expires_at >= ?))"

_FILE = "metadata.sqlite"


class _Row(NamedTuple):
    path: str
    data: bytes
    version: int
    cversion: int
    ctime: float
    mtime: float
    owner: int
    mzxid: int
    pzxid: int


def _blob(data: bytes, path: str) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError("node data must be bytes", path=path, type=type(data).__name__)
    return bytes(data)


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


class _Txn:
    """The tree operations inside one open SQLite transaction. ``live_only``: nodes of
    expired sessions are not there (a read-only store, which cannot reap them)."""

    def __init__(self, conn: sqlite3.Connection, now: float, live_only: bool = False) -> None:
        self.conn = conn
        self.now = now
        self._seq: int | None = None
        self._live = _LIVE if live_only else ""
        self._live_args: tuple[float, ...] = (now,) if live_only else ()

    def seq(self) -> int:
        """The change number of this transaction (bumped on first use)."""
        if self._seq is None:
            self.conn.execute("UPDATE meta SET value = value + 1 WHERE key = 'seq'")
            self._seq = int(self.conn.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()[0])
        return self._seq

    def row(self, path: str) -> _Row | None:
        found = self.conn.execute(f"SELECT {_COLUMNS} FROM nodes WHERE path = ?{self._live}",
                                  (path, *self._live_args)).fetchone()
        return _Row(*found) if found else None

    def must(self, path: str, ctx: dict[str, object]) -> _Row:
        found = self.row(path)
        if found is None:
            raise NoNodeError("no such node", path=path, **ctx)
        return found

    def stat(self, row: _Row) -> Stat:
        count = self.conn.execute(f"SELECT COUNT(*) FROM nodes WHERE parent = ?{self._live}",
                                  (row.path, *self._live_args)).fetchone()[0]
        return Stat(row.version, row.cversion, row.owner, row.ctime, row.mtime, int(count))

    def children(self, path: str) -> list[str]:
        rows = self.conn.execute(f"SELECT path FROM nodes WHERE parent = ?{self._live}",
                                 (path, *self._live_args)).fetchall()
        return sorted(str(r[0]).rsplit("/", 1)[1] for r in rows)

    def touch_parent(self, parent: str) -> None:
        self.conn.execute("UPDATE nodes SET cversion = cversion + 1, pzxid = ? WHERE path = ?",
                          (self.seq(), parent))

    def create(self, op: Create, owner: int, make_parents: bool, ctx: dict[str, object]) -> str:
        if op.path == "/":
            raise NodeExistsError("node exists", path="/", **ctx)
        if not op.sequential:  # a sequential path may end in "/": the suffix is the name
            check_path(op.path)
        parent = check_path(_parent(op.path))
        prow = self.row(parent)
        if prow is None and make_parents:
            self.make_path(parent, ctx)
            prow = self.must(parent, ctx)
        if prow is None:
            raise NoNodeError("parent node does not exist", path=op.path, parent=parent, **ctx)
        if prow.owner:
            raise InvalidArgumentError("ephemeral nodes cannot have children", path=op.path, **ctx)
        name = check_path(f"{op.path}{prow.cversion:010d}" if op.sequential else op.path)
        if self.row(name) is not None:
            raise NodeExistsError("node exists", path=name, **ctx)
        if op.ephemeral and not self.session_alive(owner):
            raise SessionExpiredError("session expired", session=owner, path=name, **ctx)
        seq = self.seq()
        self.conn.execute("INSERT INTO nodes VALUES (?, ?, ?, 0, 0, ?, ?, ?, ?, ?)",
                          (name, parent, _blob(op.data, name), self.now, self.now, owner if op.ephemeral else 0, seq, seq))
        self.touch_parent(parent)
        return name

    def make_path(self, path: str, ctx: dict[str, object]) -> None:
        if path == "/" or self.row(path) is not None:
            return
        self.make_path(_parent(path), ctx)
        self.create(Create(path), 0, False, ctx)

    def set(self, op: SetData, ctx: dict[str, object]) -> Stat:
        row = self.must(op.path, ctx)
        self.check_version(row, op.version, ctx)
        self.conn.execute("UPDATE nodes SET data = ?, version = version + 1, mtime = ?, mzxid = ? WHERE path = ?",
                          (_blob(op.data, op.path), self.now, self.seq(), op.path))
        return self.stat(self.must(op.path, ctx))

    def delete(self, op: Delete, recursive: bool, ctx: dict[str, object]) -> None:
        if op.path == "/":
            raise InvalidArgumentError("the root cannot be deleted", path="/", **ctx)
        row = self.must(op.path, ctx)
        self.check_version(row, op.version, ctx)
        if self.stat(row).num_children and not recursive:
            raise NotEmptyError("node has children", path=op.path, **ctx)
        if recursive:  # every path below starts with "<path>/"; "0" sorts right after "/"
            self.conn.execute("DELETE FROM nodes WHERE path >= ? AND path < ?", (op.path + "/", op.path + "0"))
        self.conn.execute("DELETE FROM nodes WHERE path = ?", (op.path,))
        self.touch_parent(_parent(op.path))

    def check(self, op: Check, ctx: dict[str, object]) -> None:
        self.check_version(self.must(op.path, ctx), op.version, ctx)

    @staticmethod
    def check_version(row: _Row, expected: int, ctx: dict[str, object]) -> None:
        if expected != ANY_VERSION and expected != row.version:
            raise MetadataVersionError("version mismatch", path=row.path, expected=expected,
                                       actual=row.version, **ctx)

    def apply(self, op: Op, owner: int, ctx: dict[str, object]) -> str | Stat | None:
        if isinstance(op, Create):
            return self.create(op, owner, False, ctx)
        if isinstance(op, SetData):
            return self.set(op, ctx)
        if isinstance(op, Delete):
            self.delete(op, False, ctx)
        else:
            self.check(op, ctx)
        return None

    def session_alive(self, session: int) -> bool:
        found = self.conn.execute("SELECT expires_at FROM sessions WHERE id = ?", (session,)).fetchone()
        return found is not None and float(found[0]) >= self.now

    def end_sessions(self, sessions: Sequence[int]) -> None:
        """Delete the sessions and their ephemeral nodes."""
        for session in sessions:
            rows = self.conn.execute("SELECT path FROM nodes WHERE ephemeral_owner = ?", (session,)).fetchall()
            for (path,) in rows:
                self.delete(Delete(str(path)), True, {})
            self.conn.execute("DELETE FROM sessions WHERE id = ?", (session,))

    def reap_expired(self) -> None:
        rows = self.conn.execute("SELECT id FROM sessions WHERE expires_at < ?", (self.now,)).fetchall()
        self.end_sessions([int(r[0]) for r in rows])


def _open(file: str, query: str, timeout: float) -> sqlite3.Connection:
    """A connection to ``file`` through an SQLite URI (``query``: ``mode=rwc`` creates the
    file, ``mode=rw`` and ``mode=ro`` do not)."""
    target = f"file:{urllib.parse.quote(os.path.abspath(file))}?{query}"
    return sqlite3.connect(target, uri=True, isolation_level=None, check_same_thread=False, timeout=timeout)


def _open_read_only(file: str, timeout: float) -> sqlite3.Connection:
    """``mode=ro``; ``immutable`` where SQLite cannot make the WAL index and there is no
    WAL to read (see the module docstring)."""
    try:
        return _probed(_open(file, "mode=ro", timeout))
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode != sqlite3.SQLITE_CANTOPEN or os.path.exists(file + "-wal"):
            raise
    return _probed(_open(file, "mode=ro&immutable=1", timeout))


def _probed(conn: sqlite3.Connection) -> sqlite3.Connection:
    """``conn`` once it has read the change counter (SQLite opens files lazily: a file
    it cannot read, or one that is not a walkit store, fails here); closed if not."""
    try:
        conn.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn


class _Conn:
    """One SQLite connection guarded by a lock; one short transaction at a time.
    ``mode`` ``rwc`` (creates the file), ``rw`` or ``ro`` (read-only, and its reads skip
    the nodes of expired sessions)."""

    def __init__(self, file: str, busy_timeout: float, pragmas: Sequence[str], mode: str) -> None:
        self.file = file
        self._busy = busy_timeout
        self._busy_ms = int(busy_timeout * 1000)  # SQLite's busy_timeout as last set
        self.live_only = mode == "ro"
        self.lock = threading.RLock()
        self.conn: sqlite3.Connection | None = None
        try:
            self.conn = _open_read_only(file, busy_timeout) if mode == "ro" else _open(file, f"mode={mode}",
                                                                                       busy_timeout)
            for pragma in (f"busy_timeout = {self._busy_ms}", *pragmas):
                self.conn.execute(f"PRAGMA {pragma}")
        except sqlite3.Error as exc:
            self.close()
            raise MetadataUnavailableError("cannot open the metadata database", file=file, mode=mode,
                                           error=exc) from exc

    @contextlib.contextmanager
    def txn(self, begin: str, reap: bool) -> Iterator[_Txn]:
        started = time.monotonic()
        if not self.lock.acquire(timeout=self._busy):  # another thread of ours waits on SQLite's lock
            raise MetadataUnavailableError("metadata unavailable: database busy", file=self.file, waited=self._busy)
        try:
            if self.conn is None:
                raise MetadataUnavailableError("metadata store is closed")
            conn = self.conn
            self._limit_busy_wait(conn, time.monotonic() - started)
            try:
                conn.execute(begin)
            except sqlite3.Error as exc:
                raise MetadataUnavailableError("metadata unavailable: database locked or failing", file=self.file,
                                               error=exc, waited=round(time.monotonic() - started, 3)) from exc
            try:
                tx = _Txn(conn, time.time(), self.live_only)
                if reap:
                    tx.reap_expired()
                yield tx
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back already
                    conn.execute("ROLLBACK")
                raise MetadataUnavailableError("metadata database failed", file=self.file, error=exc) from exc
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
        finally:
            self.lock.release()

    def _limit_busy_wait(self, conn: sqlite3.Connection, waited: float) -> None:
        """Give SQLite what is left of ``busy_timeout`` after waiting ``waited`` for our
        own lock, so that a call waits ``busy_timeout`` in all, not once per thread ahead."""
        want = self._busy_ms if waited < _BUSY_SLACK else max(1, int((self._busy - waited) * 1000))
        if want != self._busy_ms:
            conn.execute(f"PRAGMA busy_timeout = {want}")
            self._busy_ms = want

    def close(self) -> None:
        with self.lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None


class _Db:
    """Two connections: writes on one, reads on the other, so that reads (WAL mode: never
    blocked by a writer) go on while a write of this store waits for the database lock.
    Read-only: the reader alone (``mode=ro``), and :meth:`write` refuses."""

    def __init__(self, file: str, busy_timeout: float = RETRY_DEADLINE, *, create: bool = False,
                 read_only: bool = False) -> None:
        self.file = file
        self._writer: _Conn | None = None
        if read_only:
            self._reader = _Conn(file, busy_timeout, (), "ro")
            return
        self._writer = _Conn(file, busy_timeout, ("journal_mode = WAL", "synchronous = FULL"),
                             "rwc" if create else "rw")
        try:
            with self.write(reap=False) as tx:
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    tx.conn.execute(statement)
            self._reader = _Conn(file, busy_timeout, (), "rw")
        except BaseException:
            self._writer.close()
            raise

    def read(self) -> contextlib.AbstractContextManager[_Txn]:
        return self._reader.txn("BEGIN", reap=False)

    @property
    def write_lock(self) -> threading.RLock:
        """Held around every write transaction of this store: whoever holds it (from a
        thread that is in no transaction) knows none is open - the demo freezes a
        process with it held, so the frozen process leaves SQLite's lock free."""
        return (self._writer or self._reader).lock

    def write(self, reap: bool = True) -> contextlib.AbstractContextManager[_Txn]:
        if self._writer is None:
            raise MetadataReadOnlyError("metadata store opened read-only: it makes no changes", file=self.file)
        return self._writer.txn("BEGIN IMMEDIATE", reap=reap)

    def reap(self) -> None:
        """End expired sessions and remove their ephemeral nodes, in a transaction of
        its own (every write transaction also does this first)."""
        with self.write(reap=False) as tx:
            tx.reap_expired()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader.close()


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
        self._db = _Db(_store_file(directory, create), busy_timeout, create=create, read_only=read_only)
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
            cur = tx.conn.execute("INSERT INTO sessions (expires_at) VALUES (?)", (tx.now + self._timeout,))
            return int(cur.lastrowid or 0)

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
                    cur = tx.conn.execute("UPDATE sessions SET expires_at = ? WHERE id = ?",
                                          (tx.now + self._timeout, session))
                    alive = cur.rowcount == 1
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
            seq = int(tx.conn.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()[0])
            expired = not self._read_only and tx.conn.execute(
                "SELECT 1 FROM sessions WHERE expires_at < ? LIMIT 1", (tx.now,)).fetchone()
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
