"""Giving entry-log space back: the storage's side of garbage collection and compaction.

Theory of operation
-------------------
Only *sealed* logs (synced, taking no more records; :mod:`bookie.storage._ledgerdir`)
are compacted; a log not sealed yet is deleted when none of its ledgers exists any more
(:meth:`EntryLogReclaim.remove_dead_unsealed_logs`: a full disk may keep every flush
from sealing anything, and such logs are then the only room GC can give back). :meth:`EntryLogReclaim.entry_logs` reports each with its usage (live and
total record bytes, from :mod:`bookie.storage._usage`), so choosing needs no I/O.

*Deleting* a log (:meth:`EntryLogReclaim.remove_log`) is allowed when no index slot can
point into it: every ledger that had records in it is deleted (its usage is empty), or
a compaction moved its live records out and a flush made the move durable.

*Compacting* a log is, in order:

1. :meth:`mark_compacting`: a durable marker ``<log>.compact`` next to the log, so a
   bookie that crashes anywhere after this point finishes the compaction after restart
   (whatever the usage then says);
2. :meth:`log_records` + :meth:`relocate`, in batches: a record is *live* when its
   ledger's location for that entry is exactly this record (the index, or the pending
   map for an entry added again since, which then wins); live records are appended to
   the ledger dir's active log through the ordinary add path (pending map), verified
   bytes unchanged. The flush lock is held while a batch is checked and copied, so no
   flush moves an index slot between the check and the copy;
3. :meth:`~bookie.storage.LedgerStorage.flush`: copies durable, then slots point at them;
4. :meth:`remove_log`: log, usage file and marker go, then the directory is fsynced.

A crash before 3 completes leaves every slot on the old log, which is still there; after
3, the slots point at durable copies; the marker makes the next pass check the old log
again record by record (all dead now) and remove it. So a live entry is always readable
and no slot ever points at missing bytes. A reader that looked up a location just before
a move and opens the old log after it was removed retries with the new location
(:meth:`~bookie.storage.LedgerStorage.get_entry`).

Not journaled: copies need no journal, because the old record stays until the copies
are durable. Compaction never runs two passes over one log at once (the collector's
thread is the only caller).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from bookie.storage._entrylog import open_log_for_read
from bookie.storage._files import StorageFiles
from bookie.storage._format import RECORD_HEADER
from bookie.storage._index import read_slot, read_slots
from bookie.storage._ledgerdir import LedgerDir
from bookie.storage._shared import StorageShared
from bookie.storage._usage import scan_records
from walkit.errors import UsageError

__all__ = ["EntryLogInfo", "EntryLogReclaim", "Record"]

#: ``(offset in its log, ledger id, entry id, data)``
Record = tuple[int, int, int, bytes]
_SLOT_RUN = 4096  # index slots read in one pread when checking a run of entries


@dataclass(frozen=True)
class EntryLogInfo:
    """One sealed entry log, as garbage collection sees it."""

    dir: int
    log_id: int
    total_bytes: int
    live_bytes: int
    ledgers: int
    compacting: bool
    #: Where its intact records end (its size, or less: a torn tail left by a crash).
    end: int

    @property
    def live_fraction(self) -> float:
        return self.live_bytes / self.total_bytes if self.total_bytes else 0.0


class EntryLogReclaim:
    """Garbage collection's side of the storage, over its shared state and open files
    (see the module docstring); ``LedgerStorage`` hands its calls here."""

    def __init__(self, shared: StorageShared, files: StorageFiles) -> None:
        self._shared = shared
        self._files = files

    def entry_logs(self) -> list[EntryLogInfo]:
        """Every sealed entry log with its usage, by dir and log id."""
        with self._shared.lock:
            return [
                EntryLogInfo(d.number, log_id, u.total, u.live, len(u.ledgers), log_id in d.compacting, u.end)
                for d in self._shared.dirs for log_id, u in sorted(d.usage.items())
            ]

    def log_size(self, dir_no: int, log_id: int) -> int:
        """The size of a sealed log's file."""
        f = open_log_for_read(self._shared.fs, self._sealed(dir_no, log_id).log_path(log_id), log_id)
        try:
            return f.size()
        finally:
            f.close()

    def log_records(self, dir_no: int, log_id: int) -> Iterator[Record]:
        """The intact records of a sealed log, in order (see ``scan_records``); the
        caller compares where they end with the log's ``end`` to know it saw them all."""
        d = self._sealed(dir_no, log_id)
        f = open_log_for_read(self._shared.fs, d.log_path(log_id), log_id)
        try:
            yield from scan_records(f, log_id)
        finally:
            f.close()

    def mark_compacting(self, dir_no: int, log_id: int) -> None:
        """Step 1: the durable marker (the log is then compacted to the end, even
        after a crash)."""
        d = self._sealed(dir_no, log_id)
        with self._shared.lock:
            self._shared.check_writable()
        f = self._shared.fs.open(d.marker_path(log_id), create=True)
        f.close()
        self._shared.fs.fsync_dir(d.logs_dir)
        with self._shared.lock:
            d.compacting.add(log_id)

    def relocate(self, dir_no: int, log_id: int, records: list[Record]) -> tuple[int, int]:
        """Step 2: copy the live ones of ``records`` (read from sealed log ``log_id``)
        to the active log; returns (entries, record bytes) copied. Durable, and seen by
        the index, after the next flush."""
        d = self._sealed(dir_no, log_id)
        with self._shared.flush_lock:
            with self._shared.lock:
                self._shared.check_writable()
            live = self._live_records(log_id, records)
            moved = size = 0
            with self._shared.lock:
                self._shared.check_writable()
                for _, ledger_id, entry_id, data in live:
                    pending = self._shared.pending.get(ledger_id)
                    if ledger_id not in self._shared.states or (pending is not None and entry_id in pending) \
                            or self._shared.cache.get(ledger_id, entry_id) is not None:
                        continue  # deleted, or added again since: the newer copy wins
                    location = self._append(d, ledger_id, entry_id, data)
                    self._shared.pending.setdefault(ledger_id, {})[entry_id] = location
                    moved += 1
                    size += RECORD_HEADER.size + len(data)
        return moved, size

    def remove_log(self, dir_no: int, log_id: int) -> int:
        """Step 4 (or a log whose ledgers are all gone): delete a sealed log, its usage
        file and its marker; returns the bytes freed. The caller guarantees that no
        index slot points into it (see the module docstring)."""
        d = self._sealed(dir_no, log_id)
        with self._shared.lock:  # a failed storage may not have made a ledger's deletion durable
            self._shared.check_writable()
        size = self.log_size(dir_no, log_id)
        with self._shared.lock:
            d.usage.pop(log_id, None)
            d.compacting.discard(log_id)
        self._files.logs.discard((dir_no, log_id))  # a reader holding it keeps its handle
        self._shared.recent.drop_log(dir_no, log_id)
        self._shared.fs.remove(d.log_path(log_id))
        for path in (d.usage_path(log_id), d.marker_path(log_id)):
            if self._shared.fs.exists(path):
                self._shared.fs.remove(path)
        self._shared.fs.fsync_dir(d.logs_dir)
        return size

    def remove_dead_unsealed_logs(self) -> list[tuple[int, int, int]]:
        """Delete every log not sealed yet (rolled, or the active one) that holds no
        record of a live ledger; ``(dir, log id, bytes freed)`` of each. A disk too full
        for a flush to complete seals nothing, so without this the room deleted ledgers
        take in those logs would come back only after a flush - which may need exactly
        that room. No index slot or pending location points into such a log (a ledger's
        deletion drops both), and the flush lock keeps it out of a running flush; after
        a crash the journal may add the deleted ledgers' entries again, and GC deletes
        them again (they are deleted in the metadata)."""
        removed: list[tuple[int, int, int]] = []
        with self._shared.flush_lock:
            with self._shared.lock:  # a failed storage may not have made a ledger's deletion durable
                self._shared.check_writable()
                dead = [(d, w) for d in self._shared.dirs for w in d.take_dead_logs()]
                for d, w in dead:
                    self._shared.recent.drop_log(d.number, w.log_id)
            for d, w in dead:
                self._files.logs.discard((d.number, w.log_id))
                w.close()
                self._shared.fs.remove(w.path)
                removed.append((d.number, w.log_id, w.buffer_start))
            for d in {d.number: d for d, _ in dead}.values():
                self._shared.fs.fsync_dir(d.logs_dir)
        return removed

    # --- helpers ------------------------------------------------------------------------
    def _sealed(self, dir_no: int, log_id: int) -> LedgerDir:
        if not 0 <= dir_no < len(self._shared.dirs) or log_id not in self._shared.dirs[dir_no].usage:
            raise UsageError("not a sealed entry log", dir=dir_no, log=log_id)
        return self._shared.dirs[dir_no]

    def _append(self, d: LedgerDir, ledger_id: int, entry_id: int, data: bytes) -> int:
        with self._shared.failing:  # an I/O error leaves the storage failed, as for any add
            return d.append(ledger_id, entry_id, data)

    def _live_records(self, log_id: int, records: list[Record]) -> list[Record]:
        """The records that their ledger's index still points at (flush lock held, so
        no slot moves meanwhile)."""
        by_ledger: dict[int, list[Record]] = {}
        for record in records:
            by_ledger.setdefault(record[1], []).append(record)
        live: list[Record] = []
        for ledger_id, recs in by_ledger.items():
            with self._shared.lock:
                state = self._shared.states.get(ledger_id)
                on_disk = state is not None and state.on_disk
            if not on_disk:
                continue  # deleted (or re-created since, with nothing in this log)
            slots = self._slots(ledger_id, [r[2] for r in recs])
            live += [r for r in recs if slots.get(r[2]) == (log_id << 32) | r[0]]
        return live

    def _slots(self, ledger_id: int, entries: list[int]) -> dict[int, int]:
        """The ledger's location of each of ``entries``: its slot log's runs (newer), else
        its index file (flush lock held: neither changes meanwhile)."""
        lo, hi = min(entries), max(entries)
        with self._shared.lock:
            logged = self._shared.dirs[ledger_id % len(self._shared.dirs)].slot_log.window(ledger_id, lo, hi - lo + 1)
        with self._files.index.use(ledger_id) as f:
            if hi - lo < _SLOT_RUN:
                slots = dict(zip(range(lo, hi + 1), read_slots(f, lo, hi - lo + 1)))
            else:
                slots = {e: read_slot(f, e) for e in entries if e not in logged}
        slots.update(logged)
        return slots
