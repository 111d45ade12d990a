"""The metadata store's SQLite connections: opening the file, one transaction at a time,
bounded waits for the database lock.

Theory of operation
-------------------
A :class:`Db` holds two connections to one store file: writes on one, reads on the
other, so that reads (WAL mode: never blocked by a writer) go on while a write of this
store waits for the database lock. Each :class:`Conn` runs one short transaction at a
time under a lock of its own and hands it over as a :class:`~walkit.metadata._sqlite_tree.Txn`;
a transaction that raises is rolled back, and an SQLite failure becomes
``MetadataUnavailableError`` naming the file.

Durability: the writer runs with ``journal_mode=WAL`` and ``synchronous=FULL``, so each
committed write is durable and a crash mid-transaction leaves the previous state. Writes
begin ``BEGIN IMMEDIATE`` (the database write lock), which makes a read-then-write (a
version check) atomic across processes.

Opening: the URI mode ``rw`` never creates the file, ``rwc`` does (``create=True``), and
a read-only store's reader is ``mode=ro``: SQLite never writes the file, and a write
through the store raises ``MetadataReadOnlyError`` before SQLite is asked. In WAL mode a
reader needs the ``-shm`` index beside the file: in a writable directory SQLite makes it
(and an empty ``-wal``) if no process has; in a read-only one it reads those that are
there. A read-only directory with neither (no process has the store open, and the last
one folded the WAL into the file) is opened ``immutable``: all of the store is in the
file. Such a reader does not see a writer that opens the store later (on a read-only
mount there can be none). A connection reads the change counter once before it is used
(SQLite opens files lazily): a file that is not a walkit store fails at the open.

Busy waits: a database that stays locked (another process holds its write lock) makes a
write wait at most ``busy_timeout`` in all - for this store's write connection (one call
at a time) and then for SQLite's lock, whose busy timeout is cut to what is left - and
then raise ``MetadataUnavailableError`` with the cause.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence

from walkit.errors import MetadataReadOnlyError, MetadataUnavailableError
from walkit.metadata._sqlite_tree import SCHEMA, Txn
from walkit.metadata._store import RETRY_DEADLINE

__all__ = ["Conn", "Db"]

_BUSY_SLACK = 0.05  # waited less than this for our own lock: give SQLite the whole timeout


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


class Conn:
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
    def txn(self, begin: str, reap: bool) -> Iterator[Txn]:
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
                tx = Txn(conn, time.time(), self.live_only)
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


class Db:
    """Two connections: writes on one, reads on the other, so that reads (WAL mode: never
    blocked by a writer) go on while a write of this store waits for the database lock.
    Read-only: the reader alone (``mode=ro``), and :meth:`write` refuses."""

    def __init__(self, file: str, busy_timeout: float = RETRY_DEADLINE, *, create: bool = False,
                 read_only: bool = False) -> None:
        self.file = file
        self._writer: Conn | None = None
        if read_only:
            self._reader = Conn(file, busy_timeout, (), "ro")
            return
        self._writer = Conn(file, busy_timeout, ("journal_mode = WAL", "synchronous = FULL"),
                             "rwc" if create else "rw")
        try:
            with self.write(reap=False) as tx:
                for statement in filter(str.strip, SCHEMA.split(";")):
                    tx.conn.execute(statement)
            self._reader = Conn(file, busy_timeout, (), "rw")
        except BaseException:
            self._writer.close()
            raise

    def read(self) -> contextlib.AbstractContextManager[Txn]:
        return self._reader.txn("BEGIN", reap=False)

    @property
    def write_lock(self) -> threading.RLock:
        """Held around every write transaction of this store: whoever holds it (from a
        thread that is in no transaction) knows none is open - the demo freezes a
        process with it held, so the frozen process leaves SQLite's lock free."""
        return (self._writer or self._reader).lock

    def write(self, reap: bool = True) -> contextlib.AbstractContextManager[Txn]:
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


