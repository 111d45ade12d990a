"""LedgerStorage: entries and per-ledger state of a bookie, in entry logs plus an index.

Theory of operation
-------------------
:class:`LedgerStorage` is the storage's face and the owner of its parts, each in a
module of its own around one shared state (:mod:`bookie.storage._shared`, which states
the locking rule):

- the lifecycle: open, close, a ledger's deletion - here;
- the add path: the write cache, or written through (:mod:`bookie.storage._adds`);
- the per-ledger state API: master key, fence, explicit LAC (:mod:`bookie.storage._state`);
- reads: one entry, a run of entries, memory only (:mod:`bookie.storage._reads`);
- placement: the write cache into the entry logs (:mod:`bookie.storage._placement`);
- the flush protocol and its crash-safety argument (:mod:`bookie.storage._flush`);
- garbage collection's side: sealed logs, compaction's steps (:mod:`bookie.storage._reclaim`);
- the open index files and entry logs (:mod:`bookie.storage._files`).

``add_entry`` puts the entry in the *write cache* (:mod:`bookie.storage._writecache`;
``add_entries`` does the same for several entries under one lock acquisition; a refused
entry does not stop the others); ``set_master_key`` / ``set_fenced`` / ``set_explicit_lac``
change the ledger's in-memory state and mark it dirty. Nothing is durable until
:meth:`LedgerStorage.flush` (the bookie's checkpoint; see :mod:`bookie.storage._flush`
for its order and why a crash at any point loses nothing acknowledged).
:meth:`LedgerStorage.place` places the write cache alone (the bookie, when the cache is
full between checkpoints): the locations then wait in the pending map for the next
flush. Past twice ``write_cache_bytes`` cached (adds outrun the checkpoints), an add is
written straight to its dir's log, its location to the pending map. The RAM kept per
entry is the write cache and the pending map (a location per entry placed since the
last flush; the bookie bounds it with ``flushEntriesThreshold``).

A full disk is not a failure: a log buffer that cannot be written (ENOSPC) stays in
memory, readable; a placement that needs a new log the disk has no room for stops, and
what it did not place stays in the write cache; a flush that meets ENOSPC raises and is
undone, and ``on_no_space`` is told. Any other I/O error on the write path leaves the
storage *failed*: writes and flushes raise ``StorageError`` until it is reopened (after
a failed fsync the kernel may have dropped the dirty pages, so a retry could lie).

Assumes: the journal holds everything since the last completed flush and replays it
(re-adds overwrite, which is why they are allowed). Recovers: :meth:`LedgerStorage.open`
reads every index header (the newer valid copy of two), replays the slot logs, removes
``.idx.tmp`` files a crash left behind, and starts new entry logs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bookie.fs import FileSystem
from bookie.storage._adds import EntryAdds
from bookie.storage._cache import ReadAheadCache, RecentWrites
from bookie.storage._files import StorageFiles
from bookie.storage._flush import Flush
from bookie.storage._format import check_limits
from bookie.storage._index import load_index
from bookie.storage._ledgerdir import LedgerDir
from bookie.storage._placement import Placement
from bookie.storage._reads import EntryReads
from bookie.storage._reclaim import EntryLogInfo, EntryLogReclaim, Record
from bookie.storage._shared import StorageShared
from bookie.storage._state import LedgerStates
from bookie.storage._writecache import PLACE_BATCH, PLACE_BATCH_BYTES, WriteCache
from walkit.errors import CorruptionError, InvalidArgumentError

__all__ = ["LedgerStorage", "SLOT_LOG"]

_WRITE_BUFFER = 256 << 10  # entry-log buffer written at this size
#: The caches' bounds unless told (the bookie's keys dbStorage_readAheadCacheMaxSizeMb,
#: dbStorage_readAheadCacheBatchSize, dbStorage_readAheadCacheBatchBytesSize,
#: recentWritesCacheMaxSizeMb have the same defaults)
READ_AHEAD_CACHE = 64 << 20
READ_AHEAD_BATCH = 100
READ_AHEAD_BATCH_BYTES = 1 << 20
RECENT_WRITES_CACHE = 16 << 20
WRITE_CACHE = 64 << 20  # dbStorage_writeCacheMaxSizeMb's default: adds are written through past twice that
#: A flush that writes this many index files of a dir or more syncs them with one syncfs
#: where the file system has a syncer (:mod:`bookie.storage._flush`, step 3; read when a
#: storage is made).
SYNCFS_FILES = 8
#: A flush that gives a dir this many ledgers or more appends their slots to its slot log
#: (:mod:`bookie.storage._slotlog`) rather than writing an index file per ledger (read
#: when a storage is made).
SLOT_LOG_LEDGERS = 8
SLOT_LOG = 32 << 20  # indexSlotLogMaxSizeMb's default: bytes a dir's slot log holds before a merge
PLACEMENT_SYNC = 2 << 20  # flushEntrylogBytes' default: a placement syncs a log each time this much more is written


class LedgerStorage(LedgerStates):
    """Thread-safe ledger storage over a :class:`~bookie.fs.FileSystem`."""

    def __init__(
        self,
        fs: FileSystem,
        ledger_dirs: list[str],
        *,
        entry_log_size_limit: int = 1 << 30,
        open_index_files: int = 256,
        write_buffer_size: int = _WRITE_BUFFER,
        read_ahead_cache_bytes: int = READ_AHEAD_CACHE,
        read_ahead_batch: int = READ_AHEAD_BATCH,
        read_ahead_batch_bytes: int = READ_AHEAD_BATCH_BYTES,
        recent_writes_bytes: int = RECENT_WRITES_CACHE,
        write_cache_bytes: int = WRITE_CACHE,
        placement_sync_bytes: int = PLACEMENT_SYNC,
        slot_log_bytes: int = SLOT_LOG,
    ) -> None:
        check_limits(ledger_dirs, entry_log_size_limit, open_index_files, write_buffer_size)
        if min(read_ahead_cache_bytes, read_ahead_batch_bytes, recent_writes_bytes, write_cache_bytes,
               placement_sync_bytes, slot_log_bytes) < 0 or read_ahead_batch < 1:
            raise InvalidArgumentError("cache bounds must not be negative, the read-ahead batch at least 1",
                                       read_ahead_cache_bytes=read_ahead_cache_bytes,
                                       read_ahead_batch=read_ahead_batch, read_ahead_batch_bytes=read_ahead_batch_bytes,
                                       recent_writes_bytes=recent_writes_bytes, write_cache_bytes=write_cache_bytes,
                                       placement_sync_bytes=placement_sync_bytes, slot_log_bytes=slot_log_bytes)
        recent = RecentWrites(recent_writes_bytes)
        dirs = [LedgerDir(fs, root, i, entry_log_size_limit, write_buffer_size, recent=recent,
                          slot_log_bytes=slot_log_bytes) for i, root in enumerate(ledger_dirs)]
        shared = StorageShared(fs, dirs, WriteCache(2 * write_cache_bytes),
                               ReadAheadCache(read_ahead_cache_bytes, read_ahead_batch, read_ahead_batch_bytes), recent)
        super().__init__(shared)
        #: the dirs and the write cache (fixed for the storage's life)
        self._dirs, self._cache = dirs, shared.cache
        self._files = StorageFiles(fs, dirs, recent, open_index_files)
        self._adds = EntryAdds(shared)
        self._reads = EntryReads(shared, self._files)
        self._placement = Placement(shared, PLACE_BATCH, PLACE_BATCH_BYTES, placement_sync_bytes)
        #: SYNCFS_FILES and SLOT_LOG_LEDGERS as they are now (tests lower them before making a storage)
        self._flusher = Flush(shared, self._files, self._placement, syncfs_files=SYNCFS_FILES,
                              slot_log_ledgers=SLOT_LOG_LEDGERS)
        self._reclaim = EntryLogReclaim(shared, self._files)

    # --- lifecycle ------------------------------------------------------------------
    def open(self) -> None:
        """Load every ledger's state from the dirs (made if missing)."""
        sh = self._shared
        with sh.flush_lock, sh.lock:
            if sh.is_open:
                return
            sh.states, sh.pending, sh.flushing, sh.dirty = {}, {}, {}, set()
            sh.cache.clear()
            sh.failure = None
            sh.read_ahead.clear()
            sh.recent.clear()
            try:
                for d in self._dirs:
                    d.prepare()
                    d.scan_logs()
                    for ledger_id, path in d.scan_index():
                        self._load_ledger(d, ledger_id, path)
                    self._load_slot_log(d)
                for d in self._dirs:
                    d.load_usage(sh.states)
            except BaseException:
                self._close_dirs()  # their syncers
                raise
            sh.is_open = True

    def close(self) -> None:
        """Flush (unless the storage failed) and release every file."""
        sh = self._shared
        if not sh.is_open:
            return
        try:
            if sh.failure is None:
                self._flusher.run(drain=True)  # the slot logs' runs into their index files too
                for d in self._dirs:  # the active logs are sealed now: keep their usage
                    if d.writer is not None:
                        self._flusher.write_usage(d, [d.writer])
                with sh.flush_lock, sh.failing:  # a cleanly stopped bookie leaves none
                    for d in self._dirs:
                        with sh.lock:
                            d.slot_log.remove()
        finally:
            with sh.flush_lock, sh.lock:
                self._close_dirs()
                self._files.close_all()
                sh.pending, sh.flushing = {}, {}
                sh.cache.clear()
                sh.read_ahead.clear()
                sh.recent.clear()
                sh.is_open = False

    def _close_dirs(self) -> None:
        """Close every dir's files and syncer (one that fails to close does not keep the
        others open; the first error is raised)."""
        error: BaseException | None = None
        for d in self._dirs:
            try:
                d.close()
            except BaseException as exc:  # noqa: BLE001 - raised below, after the others closed
                error = error or exc
        if error is not None:
            raise error

    def _load_ledger(self, d: LedgerDir, ledger_id: int, path: str) -> None:
        if ledger_id % len(self._dirs) != d.number:
            raise CorruptionError("ledger index in the wrong ledger dir", ledger=ledger_id, dir=d.root)
        f = self._shared.fs.open(path)
        try:
            self._shared.states[ledger_id] = load_index(f, ledger_id, path)
        finally:
            f.close()

    def _load_slot_log(self, d: LedgerDir) -> None:
        """Replay the dir's slot log (at open, after its index files): the runs it holds
        may reach past the last entry an index file has."""
        states = self._shared.states
        d.slot_log.load(states)
        for ledger_id, runs in d.slot_log.runs.items():
            state = states[ledger_id]
            state.last_entry_id = max(state.last_entry_id, *(first + len(locations) - 1 for first, locations in runs))

    # --- entries --------------------------------------------------------------------
    def add_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """Store an entry (creating the ledger if needed); re-adding overwrites."""
        failed = self.add_entries([(ledger_id, entry_id, data)])
        if failed:
            raise failed[0][1]

    def add_entries(self, entries: list[tuple[int, int, bytes]]) -> list[tuple[int, Exception]]:
        """Store several entries, in order, under one lock acquisition; the refusals as
        ``(index in entries, error)`` (:meth:`bookie.storage._adds.EntryAdds.add_entries`)."""
        return self._adds.add_entries(entries)

    def delete_ledger(self, ledger_id: int) -> None:
        """Forget the ledger: index file, state and its share of every entry log's usage
        (the space comes back when GC deletes or compacts those logs)."""
        sh = self._shared
        d = sh.dir(ledger_id)
        with sh.flush_lock:
            with sh.lock:
                sh.check_writable()
                state = sh.existing_state(ledger_id)
                d.slot_log.forget(ledger_id)  # its runs; the next flush voids its records
                del sh.states[ledger_id]
                self._cache.drop_ledger(ledger_id)
                sh.pending.pop(ledger_id, None)
                sh.read_ahead.drop_ledger(ledger_id)
                sh.dirty.discard(ledger_id)
                d.drop_ledger(ledger_id)
            if state.on_disk:  # remove before discarding: no reader caches a stale handle
                with sh.failing:  # a file left behind would haunt a re-created ledger
                    sh.fs.remove(d.index_path(ledger_id))
                    sh.fs.fsync_dir(d.bucket_dir(ledger_id))
            self._files.index.discard(ledger_id)

    def slot_log_slots(self) -> int:
        """Index slots the dirs' slot logs hold (durable; in RAM too until a merge)."""
        with self._shared.lock:
            return sum(d.slot_log.slots for d in self._dirs)

    def pending_index_entries(self) -> int:
        """Entries only in RAM: in the write cache, or placed with their location only in
        RAM (0 right after a flush)."""
        sh = self._shared
        with sh.lock:
            return sum(len(m) for t in (sh.pending, sh.flushing) for m in t.values()) + self._cache.count()

    def cached_bytes(self) -> int:
        """Bytes of the entries in the write cache: added since the last placement began,
        or not placed yet by one running (or one that failed)."""
        return self._cache.bytes

    # --- reads (bookie.storage._reads) -----------------------------------------------
    def get_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The entry's data, verified (:meth:`EntryReads.get_entry <bookie.storage._reads.EntryReads.get_entry>`)."""
        return self._reads.get_entry(ledger_id, entry_id)

    def get_entries(self, ledger_id: int, first: int, count: int, max_bytes: int) -> list[bytes]:
        """Stored entries from ``first`` on, consecutive (:meth:`bookie.storage._reads.EntryReads.get_entries`)."""
        return self._reads.get_entries(ledger_id, first, count, max_bytes)

    def memory_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The entry when memory has it, else None (:meth:`bookie.storage._reads.EntryReads.memory_entry`)."""
        return self._reads.memory_entry(ledger_id, entry_id)

    def stored_entries(self, ledger_id: int, first: int, last: int) -> list[int]:
        """The ids in ``first..last`` whose entry is stored (index slots, no data read)."""
        return self._reads.stored_entries(ledger_id, first, last)

    def cache_stats(self) -> dict[str, dict[str, Any]]:
        """What the read caches hold and how often they answered (:mod:`bookie.storage._cache`)."""
        return self._reads.cache_stats()

    def slot_log_bytes(self) -> int:
        """Bytes of the dirs' slot log files (their ends, headers included): what a
        checkpoint appended is the difference across it."""
        with self._shared.lock:
            return sum(d.slot_log.end for d in self._dirs)

    # --- flush (bookie.storage._placement, bookie.storage._flush) --------------------
    def place(self) -> None:
        """Place the write cache in the entry logs now (a flush's step 0, alone): the
        entries leave memory for the logs, their locations wait in memory for the next
        flush, which writes the index. A full disk raises (what was not placed stays
        cached); any other I/O error fails the storage."""
        with self._shared.flush_lock:
            self._placement.place()

    def flush(self, *, merge_slot_logs: bool = False) -> None:
        """Make everything added so far durable (:mod:`bookie.storage._flush` for the
        order). A full disk (ENOSPC while writing a log buffer or an index file) makes the
        flush raise but leaves the storage as it was - the entries stay reachable in
        memory, the next flush tries again; any other error fails the storage. With
        ``merge_slot_logs``, every slot log that holds anything is merged into the index
        files (as a closing storage does)."""
        self._flusher.run(drain=merge_slot_logs)

    # --- garbage collection (bookie.storage._reclaim) ---------------------------------
    def entry_logs(self) -> list[EntryLogInfo]:
        """Every sealed entry log with its usage, by dir and log id."""
        return self._reclaim.entry_logs()

    def log_size(self, dir_no: int, log_id: int) -> int:
        """The size of a sealed log's file."""
        return self._reclaim.log_size(dir_no, log_id)

    def log_records(self, dir_no: int, log_id: int) -> Iterator[Record]:
        """The intact records of a sealed log, in order."""
        return self._reclaim.log_records(dir_no, log_id)

    def mark_compacting(self, dir_no: int, log_id: int) -> None:
        """Compaction's step 1: the durable marker."""
        self._reclaim.mark_compacting(dir_no, log_id)

    def relocate(self, dir_no: int, log_id: int, records: list[Record]) -> tuple[int, int]:
        """Compaction's step 2: the live ones of ``records`` copied; (entries, bytes)."""
        return self._reclaim.relocate(dir_no, log_id, records)

    def remove_log(self, dir_no: int, log_id: int) -> int:
        """Compaction's step 4 (or a log of dead ledgers): a sealed log deleted; bytes freed."""
        return self._reclaim.remove_log(dir_no, log_id)

    def remove_dead_unsealed_logs(self) -> list[tuple[int, int, int]]:
        """Every unsealed log without a live ledger's record deleted: ``(dir, log id, bytes)``."""
        return self._reclaim.remove_dead_unsealed_logs()
