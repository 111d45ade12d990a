"""The metadata tree in SQLite: its schema, and every operation on it inside one transaction.

Theory of operation
-------------------
Schema::

    nodes(path PK, parent, data, version, cversion, ctime, mtime,
          ephemeral_owner, mzxid, pzxid)           -- index on parent
    sessions(id INTEGER PK AUTOINCREMENT, expires_at)
    meta(key PK, value)                            -- 'seq': the change counter

A :class:`Txn` is the tree's operations inside one open SQLite transaction, which its
owner (:mod:`walkit.metadata._sqlite_db`) began and commits or rolls back; everything
here is therefore atomic: a version checked is the version changed (CAS on ``version`` is
linearizable, writes being ``BEGIN IMMEDIATE``), and a failed op of a multi-op
transaction leaves nothing behind once its owner rolls back.

* Each write that changes the tree bumps the global counter ``meta.seq`` once
  (:meth:`Txn.seq`, on first use in the transaction) and stamps it on the nodes it
  touched: ``mzxid`` (node created or data set) and ``pzxid`` (children created or
  deleted). A delete-and-recreate therefore never looks unchanged to a watch.
* Sequential children are named ``<path><parent cversion:010d>``; ``cversion`` only
  grows, so names under one parent are unique and increasing.
* Ephemeral nodes belong to a session row with a lease (``expires_at``);
  :meth:`Txn.reap_expired` ends the sessions whose lease lapsed, deleting their nodes.
  A read-only store cannot reap: its transactions are ``live_only``, and every read
  skips the nodes of expired sessions as if they had been reaped.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import NamedTuple

from walkit.errors import (
    InvalidArgumentError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from walkit.metadata._store import ANY_VERSION, Check, Create, Delete, Op, SetData, Stat, check_path

__all__ = ["SCHEMA", "Row", "Txn"]

SCHEMA = """
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


class Row(NamedTuple):
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


class Txn:
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

    def row(self, path: str) -> Row | None:
        found = self.conn.execute(f"SELECT {_COLUMNS} FROM nodes WHERE path = ?{self._live}",
                                  (path, *self._live_args)).fetchone()
        return Row(*found) if found else None

    def must(self, path: str, ctx: dict[str, object]) -> Row:
        found = self.row(path)
        if found is None:
            raise NoNodeError("no such node", path=path, **ctx)
        return found

    def stat(self, row: Row) -> Stat:
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
    def check_version(row: Row, expected: int, ctx: dict[str, object]) -> None:
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


    # -- sessions and the change counter (the store's heartbeat and poller) -------------
    def new_session(self, timeout: float) -> int:
        """A new session whose lease runs ``timeout`` seconds from now; its id."""
        cur = self.conn.execute("INSERT INTO sessions (expires_at) VALUES (?)", (self.now + timeout,))
        return int(cur.lastrowid or 0)

    def renew_session(self, session: int, timeout: float) -> bool:
        """Extend ``session``'s lease to ``timeout`` seconds from now (False: it is gone)."""
        cur = self.conn.execute("UPDATE sessions SET expires_at = ? WHERE id = ?", (self.now + timeout, session))
        return cur.rowcount == 1

    def change_counter(self) -> int:
        """``meta.seq``: moved by every change to the tree."""
        return int(self.conn.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()[0])

    def any_expired(self) -> bool:
        """Whether some session's lease has lapsed (its nodes are to be reaped)."""
        found = self.conn.execute("SELECT 1 FROM sessions WHERE expires_at < ? LIMIT 1", (self.now,)).fetchone()
        return found is not None
