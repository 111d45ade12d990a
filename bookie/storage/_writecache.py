"""The write cache: entries added since the last flush, placed in the entry logs sorted
by ledger and entry when a flush comes (DbLedgerStorage's write cache, our way).

Theory of operation
-------------------
An add does not touch an entry log: :meth:`LedgerStorage.add_entries` puts the entry's
bytes in :attr:`WriteCache.active` (ledger id -> entry id -> data; a re-add replaces the
older bytes), under the storage lock - one dict insert, no CRC, no copy. The journal
makes the entry durable, as before; the storage promised nothing until a flush.

A flush first *places* the cache (:meth:`WriteCache.begin` swaps :attr:`active` into
:attr:`placing`, where adds made meanwhile cannot land): ledger by ledger in id order,
entry by entry in id order, each entry is appended to its ledger dir's active log and its
location goes into the storage's pending map, in batches of at most ``PLACE_BATCH``
entries and ``PLACE_BATCH_BYTES``, of as many ledgers as they take, under the storage
lock (the sorting is done outside it). After each full batch the placement yields
(``time.sleep(0)``), so that an add woken by the lock's release usually takes it before
the placement retakes it: an add waits for about a batch, not for the whole placement.
Each time ``flushEntrylogBytes`` (2 MiB) more of a dir's active log was written out, the
placement syncs that log, outside the lock: its writeback goes to the disk in small
syncs, not in one large one at the end, which a journal syncing on the same disk would
wait behind. Then the flush goes on as it always did (sync the logs, write the index).
The bookie also places a full cache between checkpoints (:meth:`LedgerStorage.place`:
this step alone; the locations wait in the pending map for the next checkpoint). So the
records of one ledger added between two placements lie one after another in the logs,
whatever else was added among them: a reader of that ledger later reads them with few
preads, and the read-ahead reads only that ledger's bytes.

Reads look in the cache first (:attr:`active`, then :attr:`placing`: the newest copy);
an entry leaves the cache only once its location is in the pending map, under the same
lock, so a reader finds it in one place or the other. A placement that fails (a full
disk: no room for a new log) leaves what it did not place in :attr:`placing`; the next
one places it first (adds made since are newer: they replace it).

Memory: the cache holds the entries added since the last placement started (and those
a running one has not placed yet). The bookie places it once it holds
``dbStorage_writeCacheMaxSizeMb`` (:meth:`LedgerStorage.cached_bytes`), and every
checkpoint places it first. It never holds more than twice that: past it (adds faster
than placements) an add is written straight to its dir's log, in arrival order, as it
was before the cache existed - unless the cache holds a copy of that entry, which the
newer one must replace there (newest wins).
"""

from __future__ import annotations

__all__ = ["PLACE_BATCH", "PLACE_BATCH_BYTES", "WriteCache"]

PLACE_BATCH = 1024  # entries placed under one acquisition of the storage lock at most ...
PLACE_BATCH_BYTES = 1 << 20  # ... and bytes (the first entry always): adds wait about one such batch


class WriteCache:
    """See the module docstring. Every method is called with the storage lock held."""

    __slots__ = ("active", "placing", "bytes", "write_through_at")

    def __init__(self, write_through_at: int) -> None:
        #: the hard bound: with this many bytes cached, adds are written through to the logs
        self.write_through_at = write_through_at
        #: entries added since the last placement began: ledger id -> entry id -> data
        self.active: dict[int, dict[int, bytes]] = {}
        #: entries a flush is placing (or a failed flush left): read as the cache's older half
        self.placing: dict[int, dict[int, bytes]] = {}
        #: bytes of the data cached, both halves
        self.bytes = 0

    def clear(self) -> None:
        self.active, self.placing, self.bytes = {}, {}, 0

    def room(self) -> int:
        """Bytes an add may still cache before adds are written through (negative: past it)."""
        return self.write_through_at - self.bytes

    def grew(self, size: int) -> None:
        """Adds (under the lock since :meth:`room`) cached ``size`` more bytes of data."""
        self.bytes += size

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The newest cached bytes of the entry, or None."""
        for table in (self.active, self.placing):
            slots = table.get(ledger_id)
            if slots is not None:
                data = slots.get(entry_id)
                if data is not None:
                    return data
        return None

    def tables(self, ledger_id: int) -> list[dict[int, bytes]]:
        """The ledger's cached entries, newest first (none: an empty list)."""
        return [t[ledger_id] for t in (self.active, self.placing) if ledger_id in t]

    def entry_ids(self, ledger_id: int) -> set[int]:
        return {e for table in self.tables(ledger_id) for e in table}

    def count(self) -> int:
        """Entries cached (each copy of a re-added one)."""
        return sum(len(m) for t in (self.active, self.placing) for m in t.values())

    def holds(self, ledger_id: int, entry_id: int) -> bool:
        return any(entry_id in t.get(ledger_id, ()) for t in (self.active, self.placing))

    def drop_ledger(self, ledger_id: int) -> None:
        for table in (self.active, self.placing):
            slots = table.pop(ledger_id, None)
            if slots:
                self.bytes -= sum(map(len, slots.values()))
        self.bytes = max(0, self.bytes)

    def begin(self) -> list[int]:
        """A placement starts: the active entries join those left to place (newer
        ones replace older); the ledgers to place, in id order."""
        if self.active:
            if self.placing:  # a failed placement's leftovers: newer copies replace theirs, recounted
                for ledger_id, slots in self.active.items():
                    left = self.placing.get(ledger_id)
                    if left is None:
                        self.placing[ledger_id] = slots
                    else:
                        left.update(slots)
                self.bytes = sum(sum(map(len, slots.values())) for slots in self.placing.values())
            else:
                self.placing = self.active  # the count stays exact: nothing merged
            self.active = {}
        return sorted(self.placing)

    def order(self, ledger_id: int) -> list[int]:
        """The ledger's entries left to place, in id order (only a flush, holding the
        flush lock, changes :attr:`placing`: the list stays true while it places them)."""
        return sorted(self.placing.get(ledger_id, ()))

    def placed(self, ledger_id: int, entry_ids: list[int], size: int) -> None:
        """Those entries (``size`` bytes of data) have their locations in the pending map
        now: out of the cache."""
        self.bytes = max(0, self.bytes - size)
        slots = self.placing.get(ledger_id)
        if slots is None:
            return
        if len(entry_ids) == len(slots):
            del self.placing[ledger_id]
            return
        for entry_id in entry_ids:
            del slots[entry_id]
