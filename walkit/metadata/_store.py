"""The metadata store interface: a small ZooKeeper-shaped tree with versioned CAS.

Everything above it (cluster layout, ledger manager, bookie registration, WAL logs) is
written against :class:`MetadataStore` only; the drivers are ``zk://`` (Apache ZooKeeper
through kazoo) and ``local://`` (an SQLite file shared by the processes of one machine).

Model: absolute slash-separated paths; every node holds bytes and a ``version`` that
starts at 0 and grows by one on each set; a parent counts changes to its children
(``cversion``), which names sequential children (``<prefix><10-digit counter>``).
Ephemeral nodes belong to the session that created them and vanish when it ends or
expires. Conditional writes take an expected version (-1: any) and raise
:class:`~walkit.errors.MetadataVersionError` on a mismatch. Watches call back on a
thread of the store (never block there; never call the store from a session listener,
nor wait there for a lock that is held across a store call).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from walkit.errors import InvalidArgumentError

__all__ = [
    "check_path",
    "Stat",
    "SessionState",
    "Create",
    "SetData",
    "Delete",
    "Check",
    "Op",
    "Watch",
    "MetadataStore",
    "ANY_VERSION",
    "RETRY_DEADLINE",
]

ANY_VERSION = -1
# Seconds a store call waits for the store (ZooKeeper unreachable, the local:// database
# locked) before it fails with MetadataUnavailableError: long enough to wait out a
# ZooKeeper leader election or a restart, short enough that callers see the outage.
RETRY_DEADLINE = 30.0


def check_path(path: str) -> str:
    """An absolute path without empty, "." or ".." parts or NUL (both drivers)."""
    parts = path.split("/") if isinstance(path, str) else []
    bad = not isinstance(path, str) or not path.startswith("/") or "\x00" in path
    if not bad and path != "/" and any(p in ("", ".", "..") for p in parts[1:]):
        bad = True
    if bad:
        raise InvalidArgumentError("invalid metadata path", path=path)
    return path


@dataclass(frozen=True)
class Stat:
    version: int  # data version: 0 at create, +1 per set
    cversion: int  # changes to the children (creates and deletes)
    ephemeral_owner: int  # session id, 0 for a persistent node
    ctime: float  # seconds since the epoch
    mtime: float
    num_children: int


class SessionState(enum.Enum):
    CONNECTED = "connected"
    SUSPENDED = "suspended"  # connection lost, session may still be alive
    LOST = "lost"  # session expired: ephemeral nodes are gone; a new session follows


@dataclass(frozen=True)
class Create:
    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequential: bool = False


@dataclass(frozen=True)
class SetData:
    path: str
    data: bytes
    version: int = ANY_VERSION


@dataclass(frozen=True)
class Delete:
    path: str
    version: int = ANY_VERSION


@dataclass(frozen=True)
class Check:
    path: str
    version: int


Op = Create | SetData | Delete | Check


class Watch(Protocol):
    def cancel(self) -> None: ...


class MetadataStore(Protocol):
    """See the module docstring. All methods are thread-safe."""

    @property
    def session_id(self) -> int: ...

    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False,
               make_parents: bool = False) -> str:
        """Create a node; returns its path (with the sequence suffix when sequential).
        Raises NodeExistsError, NoNodeError (parent missing and not make_parents)."""
        ...

    def get(self, path: str) -> tuple[bytes, Stat]:
        """Raises NoNodeError."""
        ...

    def exists(self, path: str) -> Stat | None: ...

    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> Stat:
        """Raises NoNodeError, MetadataVersionError."""
        ...

    def delete(self, path: str, version: int = ANY_VERSION, *, recursive: bool = False) -> None:
        """Raises NoNodeError, MetadataVersionError, NotEmptyError (children, not recursive)."""
        ...

    def children(self, path: str) -> list[str]:
        """Child names, sorted. Raises NoNodeError."""
        ...

    def sync(self, path: str) -> None:
        """Bring this session's view up to date with every write acknowledged anywhere
        before the call (ZooKeeper's ``sync``: a follower catches up with the leader),
        so that a read after it cannot miss them. A no-op where reads are never stale."""
        ...

    def transaction(self, ops: Sequence[Op]) -> list[str | Stat | None]:
        """All or nothing. Results per op: the created path, the new Stat, None (delete,
        check). On failure raises the first op's error with ``op_index`` in its context."""
        ...

    def watch_data(self, path: str, callback: Callable[[bytes | None, Stat | None], None]) -> Watch:
        """Call back now and after every change of the node (None, None: it does not exist)."""
        ...

    def watch_children(self, path: str, callback: Callable[[list[str] | None], None]) -> Watch:
        """Call back now and after every change of the children (None: no such node)."""
        ...

    def add_session_listener(self, callback: Callable[[SessionState], None]) -> None:
        """``callback(state)`` on every session change, on a thread of the store. It must
        neither call the store nor wait for anything that may be waiting on the store
        (such as a lock held across a store call): that thread is the one that would
        complete the call."""
        ...

    def remove_session_listener(self, callback: Callable[[SessionState], None]) -> None:
        """Forget a listener (a no-op if it is not registered)."""
        ...

    def close(self) -> None:
        """End the session (its ephemeral nodes go) and release resources."""
        ...
