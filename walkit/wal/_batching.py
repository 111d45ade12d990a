"""Which queued records go into the writer's next ledger entry (a pure policy: no I/O).

Theory of operation
-------------------
The writer queues records while entries are in flight and, as soon as there is room,
turns the front of the queue into one entry (a record batch, walkit/wal/_format.py).
:meth:`BatchPolicy.take` says how many: every queued record when the whole batch fits
(its records and their length table within ``max_entry_bytes`` less the batch head and
a spare of :data:`SPARE` bytes); otherwise records from the front while each one fits -
the first always goes, unless it is larger than :attr:`~BatchPolicy.max_single`, in
which case ``take`` is 0 and that record goes alone, in fragments of
:attr:`~BatchPolicy.fragment_room` bytes, one an entry.

Invariants the writer relies on: what is taken is a prefix of the queue, so records keep
their order; ``take`` is never 0 for a record that fits an entry and never more than
the records given; the numbers depend only on ``max_entry_bytes`` and the record sizes,
so the same queue is cut into the same entries - the bytes on the wire and on disk are
exactly those the writer has always made (the tests check this against the original
arithmetic).
"""

from __future__ import annotations

from collections.abc import Sequence

from walkit.wal._format import BATCH_HEAD_SIZE, FRAGMENT_HEAD_SIZE, RECORD_LENGTH_SIZE

__all__ = ["SPARE", "BatchPolicy"]

#: Bytes of an entry the writer leaves unused when it decides whether a batch fits as a
#: whole and whether a record fits an entry at all (the margin it has always kept).
SPARE = 3


class BatchPolicy:
    """The cut of the queue into entries of at most about ``max_entry_bytes``."""

    __slots__ = ("max_entry_bytes", "max_single", "fragment_room", "_whole")

    def __init__(self, max_entry_bytes: int) -> None:
        self.max_entry_bytes = max_entry_bytes
        #: The largest record that goes into a batch; a larger one goes alone, in fragments.
        self.max_single = max_entry_bytes - BATCH_HEAD_SIZE - RECORD_LENGTH_SIZE - SPARE
        #: A fragment's bytes in an entry (the rest is the fragment head).
        self.fragment_room = max_entry_bytes - FRAGMENT_HEAD_SIZE
        self._whole = max_entry_bytes - BATCH_HEAD_SIZE - SPARE  # records plus length table, for all to go

    def take(self, records: Sequence[bytes]) -> int:
        """How many records from the front of ``records`` (the queue, in order) make the
        next entry: all of them when they fit; 0 when the first is larger than
        :attr:`max_single` (it goes alone, in fragments)."""
        if sum(map(len, records)) + RECORD_LENGTH_SIZE * len(records) <= self._whole:
            return len(records)
        take, size = 0, 0
        for record in records:
            if len(record) > self.max_single or (take and size + len(record) + RECORD_LENGTH_SIZE
                                                 > self.max_entry_bytes):
                break
            take += 1
            size += len(record) + RECORD_LENGTH_SIZE
        return take
