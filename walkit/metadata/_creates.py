"""Ledger creations from concurrent callers joined into one store transaction.

Theory of operation
-------------------
Creating a ledger stores one new node. Alone, that is one request to ZooKeeper (or
one SQLite transaction) per ledger, and an application that creates many ledgers at
once from several threads pays a request, a reply and the driver's hand-offs for each.
:class:`CreateJoiner` lets concurrent creations share one: the first caller *leads* -
it takes its own creation and those waiting behind it (``max_ops`` creations and
``max_bytes`` of node data at most: a ZooKeeper request must stay under its 1 MiB
``jute.maxbuffer``) and commits them as one transaction of creates - while the
callers that arrive meanwhile queue; when the
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
its retry deadline) fails every caller of the group, and every one queued behind it,
at once: none of them waits out a second deadline. A caller interrupted while queued
leaves the queue (its node is not made).

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
#: node bytes in one transaction at most (a ZooKeeper request must stay under jute.maxbuffer,
#: 1 MiB by default; a larger node goes alone, as a plain create)
MAX_BYTES = 256 << 10


class _Creation:
    __slots__ = ("path", "data", "done", "error")

    def __init__(self, path: str, data: bytes) -> None:
        self.path, self.data = path, data
        self.done = False
        #: why its group failed (None: made by it, or not committed yet)
        self.error: BaseException | None = None


class CreateJoiner:
    """Concurrent creations of nodes, joined into transactions (see the module docstring)."""

    def __init__(self, store: MetadataStore, max_ops: int = MAX_OPS, max_bytes: int = MAX_BYTES) -> None:
        if max_ops < 2:
            raise ValueError("a group holds two creations at least")
        self._store = store
        self._max_ops, self._max_bytes = max_ops, max_bytes
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
            while self._leading and not mine.done:
                try:
                    self._cond.wait()
                except BaseException:  # interrupted while queued: it is not made
                    if mine in self._waiting:
                        self._waiting.remove(mine)
                    raise
            if not mine.done:  # lead: this creation first, then what waits behind it
                self._leading = True
                self._waiting.remove(mine)
                group = self._take(mine)
        if not mine.done:
            self._lead(group)
        if mine.error is None:
            return
        if isinstance(mine.error, MetadataUnavailableError):  # the store does not answer: no second wait
            raise MetadataUnavailableError("the metadata store did not answer a group of creations",
                                           path=path) from mine.error
        self._store.create(path, data, make_parents=True)  # alone: its own error, or made after all

    def _take(self, mine: _Creation) -> list[_Creation]:
        """(lock held) ``mine`` and the creations waiting behind it, within the bounds."""
        group, size = [mine], len(mine.data)
        while self._waiting and len(group) < self._max_ops and size + len(self._waiting[0].data) <= self._max_bytes:
            size += len(self._waiting[0].data)
            group.append(self._waiting.pop(0))
        return group

    def _lead(self, group: list[_Creation]) -> None:
        """Commit ``group``, then tell its creations (and, when the store does not
        answer, every creation waiting: they would only wait out the same deadline)."""
        # what the others are told unless the commit returns: an interrupted leader
        error: BaseException | None = WalkitError("the creation's group was not committed", path=group[0].path)
        try:
            error = self._commit(group)
        except BaseException as exc:  # a group of one: its caller's own create raised
            error = exc
            raise
        finally:
            with self._cond:
                told = group
                if isinstance(error, MetadataUnavailableError):
                    told, self._waiting = group + self._waiting, []
                for creation in told:
                    creation.done, creation.error = True, error
                self._leading = False
                self._cond.notify_all()

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
