"""Ledger creations from concurrent callers joined into one store transaction.

Theory of operation
-------------------
Creating a ledger stores one new node. Alone, that is one request to ZooKeeper (or
one SQLite transaction) per ledger, and an application that creates many ledgers at
once from several threads pays a request, a reply and the driver's hand-offs for each.
:class:`CreateJoiner` lets concurrent creations share one: the first caller *leads* -
it takes every creation waiting (``max_ops`` at most) and commits them as one
transaction of creates - while the callers that arrive meanwhile queue; when the
leader is done, the next waiting caller leads the next group. A caller alone is a
group of one, sent as the plain create it always was, so a lone creation costs nothing
more.

What a create guarantees is unchanged. A transaction is all or nothing: if any of
its creates fails - a node already there, a parent directory missing (a transaction
makes no parents) - none of them is made, and each caller of the group makes its
creation alone with the plain create, which makes parents and raises what is wrong
with its own node; the caller (``LedgerManager.create``) tells a create of its own
that landed before a lost reply - also a lost transaction's - from a conflict by
reading the node back. A store that does not answer (MetadataUnavailableError, after
its retry deadline) fails every caller of the group at once, with no second wait.

Threads: any. The leader commits outside the lock; waiting callers block on a
condition (a creation is a blocking call on the caller's thread, or on a metadata
thread for the asyncio API).
"""

from __future__ import annotations

import threading

from walkit.errors import MetadataUnavailableError, WalkitError
from walkit.metadata._store import Create, MetadataStore

__all__ = ["CreateJoiner"]

MAX_OPS = 64  # creations in one transaction at most


class _Creation:
    __slots__ = ("path", "data", "done", "error")

    def __init__(self, path: str, data: bytes) -> None:
        self.path, self.data = path, data
        self.done = False
        #: why its group failed (None: made by it, or not committed yet)
        self.error: BaseException | None = None


class CreateJoiner:
    """Concurrent creations of nodes, joined into transactions (see the module docstring)."""

    def __init__(self, store: MetadataStore, max_ops: int = MAX_OPS) -> None:
        if max_ops < 2:
            raise ValueError("a group holds two creations at least")
        self._store = store
        self._max = max_ops
        self._cond = threading.Condition()
        self._waiting: list[_Creation] = []
        self._leading = False
        #: groups committed and the creations they carried (how much joining happens)
        self.groups = self.joined = 0

    def create(self, path: str, data: bytes) -> None:
        """``store.create(path, data, make_parents=True)``, with the same errors, sent
        together with whatever other creations are waiting."""
        mine = _Creation(path, data)
        with self._cond:
            self._waiting.append(mine)
            while not mine.done:
                if self._leading:
                    self._cond.wait()
                    continue
                self._leading = True
                group = self._waiting[: self._max]
                del self._waiting[: self._max]
                # what the others are told unless the commit returns: an interrupted leader
                error: BaseException | None = WalkitError("the creation's group was not committed", path=path)
                self._cond.release()
                try:
                    error = self._commit(group)
                finally:
                    self._cond.acquire()
                    for creation in group:
                        creation.done, creation.error = True, error
                    self._leading = False
                    self._cond.notify_all()
        if mine.error is None:
            return
        if isinstance(mine.error, MetadataUnavailableError):  # the store does not answer: no second wait
            raise mine.error
        self._store.create(path, data, make_parents=True)  # alone: its own error, or made after all

    def _commit(self, group: list[_Creation]) -> BaseException | None:
        """Make the group's nodes; None, or the error that stopped them (for a group of
        one, raised: it is its caller's own create)."""
        self.groups += 1
        self.joined += len(group)
        if len(group) == 1:
            self._store.create(group[0].path, group[0].data, make_parents=True)
            return None
        try:
            self._store.transaction([Create(c.path, c.data) for c in group])
        except WalkitError as exc:
            return exc
        return None
