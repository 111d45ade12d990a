"""Placement: the write cache's entries appended to the entry logs, their locations to the pending map.

Theory of operation
-------------------
A flush's step 0 (:mod:`bookie.storage._flush`), and the bookie's way of emptying a full
write cache between checkpoints (``LedgerStorage.place``). Ledger by ledger and entry by
entry in id order, each entry is appended as a record to the active entry log of its
ledger's dir (``ledger_id % len(dirs)``) through an in-memory buffer, and its location
goes into :attr:`~bookie.storage._shared.StorageShared.pending`. An entry leaves the
cache in the same hold of the storage lock that puts its location in the pending map, so
a reader finds it in one or the other (:mod:`bookie.storage._writecache`).

Entries are placed in batches of at most ``batch`` entries or ``batch_bytes`` (the first
entry always), across ledgers, one acquisition of the lock each (10,000 ledgers of a few
entries are ~10 acquisitions, not 10,000); after each full batch the placement yields
(``time.sleep(0)``), so that an add waiting for the lock gets it: an add waits about one
batch, never the whole placement. Sorting and sizing happen without the lock: only a
placement changes the cache's ``placing`` half, and the caller holds the flush lock.

Each time ``sync_bytes`` more of a dir's active log was written out, that log is synced,
outside the lock: the writeback goes to the disk in small syncs, so that a journal on
the same disk never waits behind a large one (and the flush's own sync finds little
left). Safe: a sync earlier than the flush's step 2 orders nothing differently, and the
flush lock keeps the log open meanwhile.

Nothing placed is durable or indexed yet: the journal still holds it. A full disk (no
room for a new log) stops the placement: what it did not place stays in the cache for
the next one; any other I/O error fails the storage.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from itertools import accumulate

from bookie.storage._entrylog import EntryLogWriter
from bookie.storage._ledgerdir import LedgerDir
from bookie.storage._shared import StorageShared

__all__ = ["Placement"]

#: ``(ledger id, entry ids in order, the ledger's cached entries)``: one ledger's share of a batch
Share = tuple[int, list[int], dict[int, bytes]]


class Placement:
    """Places the write cache (see the module docstring). :meth:`place` is called with
    the flush lock held."""

    def __init__(self, shared: StorageShared, batch: int, batch_bytes: int, sync_bytes: int) -> None:
        self._shared = shared
        self._batch, self._batch_bytes = batch, batch_bytes
        #: bytes of a dir's log a placement writes out between two syncs of it (0: synced by the flush only)
        self._sync_bytes = sync_bytes

    def place(self) -> None:
        """Every entry of the write cache appended to its dir's log, its location put in
        the pending map, in batches (see the module docstring). A full disk raises (what
        was not placed stays cached); any other I/O error fails the storage."""
        sh = self._shared
        cache = sh.cache
        with sh.lock:
            sh.check_writable()
            ledgers = cache.begin()
        synced: dict[int, tuple[EntryLogWriter, int]] = {}  # dir -> a log, and its bytes written out when synced
        batch: list[Share] = []
        count = size = 0
        for ledger_id in ledgers:
            # only this flush changes ``placing`` (the flush lock): sorted and sized without the lock
            order = cache.order(ledger_id)
            slots = cache.placing[ledger_id]
            sizes = list(accumulate(map(len, map(slots.__getitem__, order))))  # bytes up to each entry, in C
            start = base = 0  # base: the ledger's bytes before ``start``
            while start < len(order):
                # the entry that fills the batch: the batch-th, or the one that reaches batch_bytes
                at = min(start + self._batch - count - 1, bisect_left(sizes, self._batch_bytes - size + base, start))
                if at >= len(order):  # this ledger's rest fills no batch: the next ledgers join it
                    batch.append((ledger_id, order[start:], slots))
                    count, size = count + len(order) - start, size + sizes[-1] - base
                    break
                batch.append((ledger_id, order[start : at + 1], slots))
                self._place_batch(batch, synced)
                time.sleep(0)  # an add woken by the lock's release takes it: else it is retaken at once
                batch, count, size, start, base = [], 0, 0, at + 1, sizes[at]
        if batch:
            self._place_batch(batch, synced)

    def _place_batch(self, batch: list[Share], synced: dict[int, tuple[EntryLogWriter, int]]) -> None:
        """One hold of the lock of :meth:`place`: ``(ledger, entry ids, its slots)``
        appended to the logs; then the logs due a sync synced, outside it."""
        sh = self._shared
        cache, due = sh.cache, []
        with sh.lock:
            sh.check_writable()
            pending = sh.pending  # swapped by a flush's step 1, never while placing: the flush lock
            dirs: dict[int, LedgerDir] = {}
            for ledger_id, entry_ids, slots in batch:
                table = pending.get(ledger_id)
                if table is None:
                    table = pending[ledger_id] = {}
                d = sh.dir(ledger_id)
                dirs[d.number] = d
                d.run_placed = 0
                try:
                    with sh.failing:
                        d.append_run(ledger_id, entry_ids, slots, table)
                finally:
                    placed = d.run_placed
                    done = entry_ids if placed == len(entry_ids) else entry_ids[:placed]
                    cache.placed(ledger_id, done, sum(map(len, map(slots.__getitem__, done))))
            for d in dirs.values():
                to_sync = self._due_sync(d, synced)
                if to_sync is not None:
                    due.append(to_sync)
        for writer in due:  # outside the lock: adds go on meanwhile
            with sh.failing:
                writer.file.sync()

    def _due_sync(self, d: LedgerDir, synced: dict[int, tuple[EntryLogWriter, int]]) -> EntryLogWriter | None:
        """(Lock held, placing) ``d``'s active log if ``sync_bytes`` more of it were
        written out since its last sync by this placement (noted as synced now)."""
        w = d.writer
        if not self._sync_bytes or w is None:
            return None
        last = synced.get(d.number)
        done = last[1] if last is not None and last[0] is w else 0
        if w.buffer_start - done < self._sync_bytes:
            return None
        synced[d.number] = (w, w.buffer_start)
        return w
