"""The flush protocol: what makes the ledger storage's entries and ledger states durable.

Crash-safety argument
---------------------
Nothing the storage is given is durable until :meth:`Flush.run` (the bookie's
checkpoint) completes; until then the journal holds it and replays it after a crash
(re-adds overwrite, which is why they are allowed). The flush lock serialises flushes,
placements, compaction batches and deletions. A flush's order is the whole argument:

0. *place* the write cache (:mod:`bookie.storage._placement`): each entry is appended as
   a record to its dir's active entry log and its location goes into the pending map.
   Nothing is promised yet.
1. under the storage lock (:meth:`Flush._begin`): write out the log buffers, take the
   pending map (it becomes the *flushing* map, still read by readers) and snapshots of
   the dirty headers; new adds go to the write cache meanwhile. A full disk here
   (ENOSPC writing a buffer) is met before anything is taken.
2. without the lock (:meth:`Flush.sync_logs`): sync every entry log written since the
   last flush, fsync the logs directory if a log was created — now every taken record is
   durable and reachable. Rolled logs synced here get their usage files (then a fsync of
   their directory; a missing one is rebuilt at open), and step 4 seals them.
3. (:meth:`Flush._write_index`) write the taken slots and headers into the index files
   and sync them (a new index file is written as ``.tmp``, synced, renamed), then make
   the new names durable - or, for a dir given ``slot_log_ledgers`` ledgers or more,
   append the slots of most of them to the dir's slot log instead
   (:mod:`bookie.storage._slotlog`: one write, runs kept in RAM, merged into the index
   files when the log is full). A dir that got ``syncfs_files`` files or more, on a file
   system with a syncer (Linux syncfs(2), :class:`bookie.fs.Syncer`), syncs them all
   with one syncfs and the names with a second; otherwise each file is synced and each
   directory that got a new index file or bucket is fsynced.
4. under the lock (:meth:`Flush._end`): drop the flushing map (reads now find those
   entries in the index or the slot log's runs), note the headers as on disk, seal and
   close the rolled logs.

*A power cut loses nothing acknowledged*: an index slot is written only in step 3,
after step 2 made the record it points at durable, so an index slot never points at
bytes that are not durable; after a crash an entry is either reachable and
byte-identical or absent (and then the journal adds it again: the bookie moves the
journal's mark only past what a completed flush covered). Everything a completed flush
covered is there: its files were synced before it completed, and a ``.idx`` name always
holds a synced header (the ``.tmp`` is synced before the rename; a ``.tmp`` left by a
crash is removed at open).
A torn header write loses nothing either: each index file holds two header copies with
sequence numbers, and open takes the newer valid one.

*A power cut resurrects nothing deleted*: a ledger's deletion (under the flush lock)
drops its cached and pending entries and removes its index file, fsyncing the bucket,
before it returns; a flush undone later never gives a deleted ledger its slots back. Its
slot-log records are made void by the next flush's *deleted* record, synced before any
new name goes into place, and records of a ledger without an index file are void at
open. A slot log that merges is emptied only after every run is in a synced index file
and before any new index file is renamed into place (see :mod:`bookie.storage._slotlog`).

*A full disk is not a failure*: a flush that meets ENOSPC before step 2 took nothing;
one that meets it in step 3 is undone (:meth:`Flush._abort`: its slots go back to the
pending map, its headers are dirty again, its new index files will be made again) and
what it appended to the slot logs is cut off at once (``SlotLog.cut``: a later replay
must not put those runs over newer index slots) - either way it raises, the next flush
starts over, and ``on_no_space`` is told. The index slots and headers it did write point
at synced records and are written again, so the retry needs nothing from it. Failed syncs are never "no space": they fail the storage (their dirty pages may be
gone; only a reopen and the journal's replay know), and every later write raises.
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass

from bookie.fs import is_no_space
from bookie.storage._entrylog import EntryLogWriter
from bookie.storage._files import StorageFiles
from bookie.storage._format import IndexHeader
from bookie.storage._index import runs_of, write_header, write_run, write_slots
from bookie.storage._ledgerdir import LedgerDir, LogFlush
from bookie.storage._placement import Placement
from bookie.storage._shared import StorageShared
from bookie.storage._slotlog import encode_run

__all__ = ["Flush"]

log = logging.getLogger("bookie.storage")


@dataclass
class DirIndex:
    """Step 3 in one ledger dir: which index files it writes and what its slot log gets."""

    #: Ledgers whose index file is written (their runs in the slot log first, then the new slots).
    files: list[int]
    #: Ledgers whose new slots go to the slot log only: ``(first entry id, locations)``.
    deferred: dict[int, tuple[int, array[int]]]
    #: Of ``files``: ledgers whose new slots are appended to the slot log too.
    logged: set[int]
    #: The records appended to the slot log (first the *deleted* records of ``voided``).
    records: bytes
    #: Deleted ledgers whose earlier records this flush makes void.
    voided: set[int]
    #: The slot log's runs all go to their index files, and the log is emptied.
    merge: bool


@dataclass
class FlushPlan:
    """What one flush took in step 1, and what step 3 decided for each dir."""

    logs: list[LogFlush]
    slots: dict[int, dict[int, int]]
    headers: dict[int, IndexHeader]
    created: set[int]
    index: list[DirIndex] | None = None


class Flush:
    """The flush protocol over the shared state (see the module docstring)."""

    def __init__(self, shared: StorageShared, files: StorageFiles, placement: Placement, *,
                 syncfs_files: int, slot_log_ledgers: int) -> None:
        self._shared, self._files, self._placement = shared, files, placement
        #: a dir that writes this many index files or more syncs them with one syncfs (given a syncer)
        self._syncfs_files = syncfs_files
        #: a dir given this many ledgers or more appends their slots to its slot log
        self._slot_log_ledgers = slot_log_ledgers

    def run(self, drain: bool = False) -> None:
        """Steps 0 to 4 (the flush lock taken here); with ``drain``, every slot log that
        holds anything merges (the storage closing)."""
        sh = self._shared
        with sh.flush_lock:
            self._placement.place()
            with sh.lock:
                sh.check_writable()
                with sh.failing:
                    plan = self._begin()
            with sh.failing:
                self.sync_logs(plan)
            try:
                with sh.failing:
                    self._write_index(plan, drain)
            except OSError as exc:
                if is_no_space(exc):
                    with sh.lock:
                        self._abort(plan)
                    with sh.failing:  # before any later flush completes (see _slotlog)
                        for d in sh.dirs:
                            d.slot_log.cut()
                raise
            with sh.lock:
                self._end(plan)

    def _begin(self) -> FlushPlan:
        """Step 1 (lock held)."""
        sh = self._shared
        for d in sh.dirs:  # first, as it may find the disk full: nothing is taken yet
            d.write_out()
        logs = [d.begin_flush() for d in sh.dirs]
        slots, sh.pending = sh.pending, {}
        sh.flushing = slots
        sh.dirty |= {lid for lid in slots if not sh.states[lid].on_disk}
        headers = {lid: sh.states[lid].snapshot() for lid in sh.dirty}
        sh.dirty = set()
        created = {lid for lid in headers if not sh.states[lid].on_disk}
        return FlushPlan(logs=logs, slots=slots, headers=headers, created=created)

    def sync_logs(self, plan: FlushPlan) -> None:
        """Step 2 (no lock): the taken records durable, rolled logs sealed."""
        sh = self._shared
        for log_flush in plan.logs:
            for writer in log_flush.sync:
                writer.file.sync()
        for log_flush in plan.logs:
            if log_flush.fsync_dir is not None:
                sh.fs.fsync_dir(log_flush.fsync_dir)
        for d, log_flush in zip(sh.dirs, plan.logs):
            if log_flush.close:  # rolled and now synced: sealed
                self.write_usage(d, log_flush.close)

    def write_usage(self, d: LedgerDir, writers: list[EntryLogWriter]) -> None:
        """Sealed logs' usage files, then the directory fsync that makes them durable
        (so after a crash only logs above every sealed one lack one). A file that cannot
        be written is rebuilt at open."""
        try:
            for writer in writers:
                d.write_usage(writer)
            self._shared.fs.fsync_dir(d.logs_dir)
        except OSError as exc:
            log.warning("entry logs %s in %s: usage files not written (rebuilt at the next start): %s",
                        [w.log_id for w in writers], d.root, exc)

    def _write_index(self, plan: FlushPlan, drain: bool = False) -> None:
        """Step 3: the taken slots and the dirty headers into the index files or the slot
        logs (:meth:`_plan_index`), synced; a slot log that merged emptied (its runs are in
        the synced files now); new files renamed into place, then their names made
        durable. A dir whose file system has a
        syncer and that writes ``syncfs_files`` files or more syncs them all (and its slot
        log) with one syncfs, and their names with a second (a sync per file cost ~80 µs of
        CPU and ~0.1 ms of disk each: seconds per checkpoint at 10,000 ledgers)."""
        sh = self._shared
        dirs, index_files = sh.dirs, self._files.index
        plan.index = index = [self._plan_index(d, plan, drain) for d in dirs]
        batched = [d.syncer is not None and len(i.files) >= self._syncfs_files for d, i in zip(dirs, index)]
        new_dirs: set[str] = set()  # to fsync: of the dirs synced file by file
        for d, i, together in zip(dirs, index, batched):
            runs = d.slot_log.runs
            for ledger_id in i.files:
                created = ledger_id in plan.created
                if created:
                    made = self._make_bucket(ledger_id)
                    if not together:
                        new_dirs |= made
                with index_files.use(ledger_id, create=created) as f:
                    header = plan.headers.get(ledger_id)
                    if header is not None:
                        write_header(f, header)
                    for first, locations in runs.get(ledger_id, ()):  # oldest first: the newest wins
                        write_run(f, first, locations)
                    write_slots(f, plan.slots.get(ledger_id, {}))
                    if not together:
                        f.sync()
            if i.records:
                d.slot_log.append(i.records)
                if not together:
                    d.slot_log.sync()
            if together:
                d.syncer.sync()  # type: ignore[union-attr]  # batched: it has one
            if i.merge:  # every run is in its synced index file now; before any new name (see _slotlog)
                d.slot_log.reset()
        renamed: set[int] = set()
        for ledger_id in sorted(plan.created):  # reopened later under the final name (clearer errors)
            d = sh.dir(ledger_id)
            sh.fs.rename(d.new_index_path(ledger_id), d.index_path(ledger_id))
            index_files.discard(ledger_id)
            renamed.add(d.number)
        for d, together in zip(dirs, batched):
            if together and d.number in renamed:
                d.syncer.sync()  # type: ignore[union-attr]  # the new names and buckets
        for path in sorted(new_dirs, key=len, reverse=True):  # buckets before index/
            sh.fs.fsync_dir(path)

    def _plan_index(self, d: LedgerDir, plan: FlushPlan, drain: bool = False) -> DirIndex:
        """Which of the dir's ledgers get their index file written and which only a slot
        log record (see :mod:`bookie.storage._slotlog`): with ``slot_log_ledgers`` ledgers
        or more in the dir, a ledger that has an index file, no header to write and new
        slots of consecutive ids is deferred. A ledger written whose slots the log holds
        gets its new slots logged too (the log's last record of an entry is the newest).
        A log that would pass its bound merges instead (and every log, with ``drain``):
        every ledger with runs gets its index file written, and nothing is logged."""
        sl, n = d.slot_log, len(self._shared.dirs)
        mine = sorted(lid for lid in plan.slots.keys() | plan.headers.keys() if lid % n == d.number)
        may_defer = sl.max_bytes > 0 and len(mine) >= self._slot_log_ledgers
        files: list[int] = []
        deferred: dict[int, tuple[int, array[int]]] = {}
        logged: set[int] = set()
        voided = {lid for lid in sl.voided if lid % n == d.number}  # all of them: they are its ledgers
        records: list[bytes] = [sl.void_records(voided)] if voided else []
        for ledger_id in mine:
            slots = plan.slots.get(ledger_id, {})
            first = min(slots) if slots else 0
            if (may_defer and slots and ledger_id not in plan.headers and max(slots) - first + 1 == len(slots)):
                locations = array("Q", [slots[e] for e in range(first, first + len(slots))])
                deferred[ledger_id] = (first, locations)
                records.append(encode_run(ledger_id, first, locations))
                continue
            files.append(ledger_id)
            if ledger_id in sl.logged and slots:
                logged.add(ledger_id)
                records += [encode_run(ledger_id, run[0], array("Q", [slots[e] for e in run])) for run in runs_of(slots)]
        raw = b"".join(records)
        if drain or (raw and sl.end + len(raw) > sl.max_bytes):
            return DirIndex(sorted(set(mine) | sl.runs.keys()), {}, set(), b"", set(), True)
        return DirIndex(files, deferred, logged, raw, voided, False)

    def _make_bucket(self, ledger_id: int) -> set[str]:
        """The directories to fsync once the ledger's new index file is in place."""
        d = self._shared.dir(ledger_id)
        if d.ensure_bucket(ledger_id):
            return {d.bucket_dir(ledger_id), d.index_dir}
        return {d.bucket_dir(ledger_id)}

    def _abort(self, plan: FlushPlan) -> None:
        """Undo a flush the disk had no room for (lock held): its slots go back to the
        pending map (slots added since are newer), its headers are dirty again, its new
        index files will be made again (``.tmp``), its synced rolled logs will be sealed
        by the next flush. Index slots and headers it wrote point at synced records and
        are written again, so the retry needs nothing from this attempt."""
        sh = self._shared
        for ledger_id, slots in plan.slots.items():
            if ledger_id in sh.states:
                slots.update(sh.pending.get(ledger_id, {}))
                sh.pending[ledger_id] = slots
        sh.flushing = {}
        sh.dirty |= plan.headers.keys() & sh.states.keys()
        for ledger_id in plan.created:
            self._files.index.discard(ledger_id)
            d = sh.dir(ledger_id)  # its bucket may not be durable in index/: the retry makes it so
            d.buckets.discard(d.bucket_dir(ledger_id))
        for d, log_flush in zip(sh.dirs, plan.logs):
            d.rolled = log_flush.close + d.rolled

    def _end(self, plan: FlushPlan) -> None:
        """Step 4 (lock held)."""
        sh = self._shared
        for ledger_id, header in plan.headers.items():
            state = sh.states.get(ledger_id)
            if state is not None:
                state.seq = header.seq
                state.on_disk = True
        sh.flushing = {}
        for d, i in zip(sh.dirs, plan.index or ()):
            sl = d.slot_log
            if i.merge:
                sl.emptied()
                continue
            for ledger_id in i.files:
                sl.written(ledger_id, ledger_id in i.logged)
            for ledger_id, (first, locations) in i.deferred.items():
                if ledger_id in sh.states:
                    sl.defer(ledger_id, first, locations)
            sl.voided_written(i.voided)
            sl.appended(len(i.records))
        for d, log_flush in zip(sh.dirs, plan.logs):
            for writer in log_flush.close:
                d.seal(writer)
                writer.close()
