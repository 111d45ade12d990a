"""LedgerStorage: entries and per-ledger state of a bookie, in entry logs plus an index.

Theory of operation
-------------------
``add_entry`` puts the entry in the *write cache* (:mod:`bookie.storage._writecache`;
``add_entries`` does the same for several entries under one lock acquisition; a refused
entry does not stop the others); ``set_master_key`` / ``set_fenced`` / ``set_explicit_lac``
change the ledger's in-memory state and mark it dirty. Nothing is durable until
:meth:`LedgerStorage.flush` (the bookie's checkpoint), whose order is the whole
crash-safety argument:

0. *place* the write cache: ledger by ledger and entry by entry in id order, each entry
   is appended as a record to the active entry log of its ledger's dir
   (``ledger_id % len(dirs)``) through an in-memory buffer, and its location goes into
   a *pending* map (a batch of entries per lock acquisition; a ledger's entries added
   between two placements so lie one after another in the log). The placement syncs an
   active log each time ``placement_sync_bytes`` more of it was written out, outside the
   lock: only earlier than step 2 would, which orders nothing differently.
   :meth:`LedgerStorage.place` does this step alone (the bookie, when the write cache is
   full between checkpoints): the pending map then waits for the next flush;
1. under the lock: write out the log buffers, take the pending map and snapshots of the
   dirty headers (new adds go to the write cache meanwhile);
2. without the lock: sync every entry log written since the last flush, fsync the logs
   directory if a log was created — now every taken record is durable and reachable;
3. write the taken slots and headers into the index files and sync them (a new index
   file is written as ``.tmp``, synced, renamed), then make the new names durable - or,
   for a dir given ``SLOT_LOG_LEDGERS`` ledgers or more, append the slots of most of
   them to the dir's slot log instead (:mod:`bookie.storage._slotlog`: one write, runs
   kept in RAM, merged into the index files when the log is full). A dir
   that got ``SYNCFS_FILES`` files or more, on a file system with a syncer (Linux
   syncfs(2), :class:`bookie.fs.Syncer`), syncs them all with one syncfs and the names
   with a second; otherwise each file is synced and each directory that got a new index
   file or bucket is fsynced;
4. under the lock: drop the taken map (reads now find those entries in the index).

So an index slot never points at bytes that are not durable; after a crash an entry
is either reachable and byte-identical or absent, and everything a completed flush
covered is there. The RAM kept per entry is the write cache (the entries added since
the last placement began) and the pending map (a location per entry placed since the
last flush; the bookie bounds it with ``flushEntriesThreshold``).

Reads look an entry up under the lock (the write cache, the pending and flushing maps,
then the index slot) and read and verify its record outside it; an entry still in a log's write buffer
is copied under the lock. :meth:`LedgerStorage.get_entries` reads a run of consecutive
entries the same way with one index pread and few log preads (:mod:`bookie.storage._ranges`).
Two bounded caches (:mod:`bookie.storage._cache`) sit in front: a single read that
goes to the disk reads the entries after it ahead, and log buffers written out lately
are kept, so preads of them are answered from memory.

A full disk is not a failure: a log buffer that cannot be written (ENOSPC) stays in
memory, readable; a placement that needs a new log the disk has no room for stops, and
what it did not place stays in the write cache; a flush that meets ENOSPC before step 2
took nothing, and one that meets it in step 3 is undone
(:meth:`LedgerStorage._abort_flush`) - either way it raises, the next flush starts
over, and ``on_no_space`` is told. Failed syncs are never "no space": they fail the
storage (their dirty pages may be gone; only a reopen and the journal's replay know).

Assumes: the journal holds everything since the last completed flush and replays it
(re-adds overwrite, which is why they are allowed). Recovers: :meth:`open` reads every
index header (the newer valid copy of two), removes ``.idx.tmp`` files a crash left
behind, and starts new entry logs. Any I/O error on the write path leaves the
storage *failed*: writes and flushes raise ``StorageError`` until it is reopened (after
a failed fsync the kernel may have dropped the dirty pages, so a retry could lie).
"""

from __future__ import annotations

import errno
import functools
import logging
import threading
import time
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from bookie.fs import File, FileSystem, is_no_space
from bookie.storage._cache import KeptFirst, ReadAheadCache, RecentWrites
from bookie.storage._entrylog import EntryLogWriter, LogGone, Preader, open_log_for_read, read_record
from bookie.storage._format import (
    MAX_ENTRY_ID,
    MAX_ENTRY_SIZE,
    IndexHeader,
    check_entry_ids,
    check_limits,
    unpack_location,
)
from bookie.storage._handles import HandleCache
from bookie.storage._index import (
    LedgerState,
    load_index,
    read_slot,
    read_slots,
    runs_of,
    write_header,
    write_run,
    write_slots,
)
from bookie.storage._ledgerdir import LedgerDir, LogFlush
from bookie.storage._ranges import in_memory, located, read_range
from bookie.storage._reclaim import EntryLogReclaim
from bookie.storage._slotlog import encode_run
from bookie.storage._state import LedgerStates
from bookie.storage._writecache import PLACE_BATCH, PLACE_BATCH_BYTES, WriteCache
from walkit.errors import (
    CorruptionError,
    EntryTooLargeError,
    InvalidArgumentError,
    NoSuchEntryError,
    NoSuchLedgerError,
    WalkitError,
)

__all__ = ["LedgerStorage"]

log = logging.getLogger("bookie.storage")

_OPEN_LOG_FILES = 64  # entry logs kept open for reads (each dir holds few logs at a time)
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
#: where the file system has a syncer (:meth:`LedgerStorage._write_index`).
SYNCFS_FILES = 8
#: A flush that gives a dir this many ledgers or more appends their slots to its slot log
#: (:mod:`bookie.storage._slotlog`) rather than writing an index file per ledger.
SLOT_LOG_LEDGERS = 8
SLOT_LOG = 32 << 20  # indexSlotLogMaxSizeMb's default: bytes a dir's slot log holds before a merge
PLACEMENT_SYNC = 2 << 20  # flushEntrylogBytes' default: a placement syncs a log each time this much more is written
_READ_AHEAD_WAIT = 10.0  # seconds a read waits for a running read-ahead of its entry at most


@dataclass
class _DirIndex:
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
class _FlushPlan:
    logs: list[LogFlush]
    slots: dict[int, dict[int, int]]
    headers: dict[int, IndexHeader]
    created: set[int]
    index: list[_DirIndex] | None = None


class LedgerStorage(EntryLogReclaim, LedgerStates):
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
        super().__init__()
        self._fs = fs
        #: entries read ahead by single reads (guarded by the lock)
        self._read_ahead = ReadAheadCache(read_ahead_cache_bytes, read_ahead_batch, read_ahead_batch_bytes)
        #: log buffers written out lately (its own lock)
        self._recent = RecentWrites(recent_writes_bytes)
        self._dirs = [
            LedgerDir(fs, root, i, entry_log_size_limit, write_buffer_size, recent=self._recent,
                      slot_log_bytes=slot_log_bytes)
            for i, root in enumerate(ledger_dirs)
        ]
        self._flush_lock = threading.Lock()
        #: bytes of a dir's log a placement writes out between two syncs of it (0: synced by the flush only)
        self._placement_sync = placement_sync_bytes
        #: entries added since the last flush, placed sorted by the next (guarded by the lock)
        self._cache = WriteCache()
        #: the cache's hard bound: past it adds are written through to the logs
        self._write_through_at = 2 * write_cache_bytes
        self._pending: dict[int, dict[int, int]] = {}
        self._flushing: dict[int, dict[int, int]] = {}
        self._index_files: HandleCache[int] = HandleCache(self._open_index, open_index_files)
        self._log_files: HandleCache[tuple[int, int]] = HandleCache(self._open_log, _OPEN_LOG_FILES)

    # --- lifecycle ------------------------------------------------------------------
    def open(self) -> None:
        """Load every ledger's state from the dirs (made if missing)."""
        with self._flush_lock, self._lock:
            if self._is_open:
                return
            self._states, self._pending, self._flushing, self._dirty = {}, {}, {}, set()
            self._cache.clear()
            self._failure = None
            self._read_ahead.clear()
            self._recent.clear()
            try:
                for d in self._dirs:
                    d.prepare()
                    d.scan_logs()
                    for ledger_id, path in d.scan_index():
                        self._load_ledger(d, ledger_id, path)
                    self._load_slot_log(d)
                for d in self._dirs:
                    d.load_usage(self._states)
            except BaseException:
                self._close_dirs()  # their syncers
                raise
            self._is_open = True

    def close(self) -> None:
        """Flush (unless the storage failed) and release every file."""
        if not self._is_open:
            return
        try:
            if self._failure is None:
                self._flush(drain=True)  # the slot logs' runs into their index files too
                for d in self._dirs:  # the active logs are sealed now: keep their usage
                    if d.writer is not None:
                        self._write_usage(d, [d.writer])
                with self._flush_lock, self._failing:  # a cleanly stopped bookie leaves none
                    for d in self._dirs:
                        with self._lock:
                            d.slot_log.remove()
        finally:
            with self._flush_lock, self._lock:
                self._close_dirs()
                self._index_files.close_all()
                self._log_files.close_all()
                self._pending, self._flushing = {}, {}
                self._cache.clear()
                self._read_ahead.clear()
                self._recent.clear()
                self._is_open = False

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

    # --- entries --------------------------------------------------------------------
    def add_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """Store an entry (creating the ledger if needed); re-adding overwrites."""
        failed = self.add_entries([(ledger_id, entry_id, data)])
        if failed:
            raise failed[0][1]

    def add_entries(self, entries: list[tuple[int, int, bytes]]) -> list[tuple[int, Exception]]:
        """Store several entries, in order, under one lock acquisition: each as
        :meth:`add_entry` would. A refused entry does not stop the others; returns the
        refusals as ``(index in entries, error)`` (empty when every entry was stored).

        An entry goes to the write cache (:mod:`bookie.storage._writecache`): the next
        flush places it in its dir's log. The hot path: an entry of a ledger already
        known, ids in range, ``bytes`` data, a storage that has not failed, is one dict
        insert; anything else takes :meth:`_add_checked`, which checks each point and
        raises the right error."""
        failed: list[tuple[int, Exception]] = []
        dirs, states, cache = self._dirs, self._states, self._cache
        read_ahead = self._read_ahead
        cached, reading = read_ahead.ledger_ids, read_ahead.reading_ahead  # usually empty: one test per entry
        added = 0
        with self._lock:
            active = cache.active  # swapped by a flush, under the lock
            room = self._write_through_at - cache.bytes  # past it: written through
            last_ledger, state, slots = -1, None, None
            for i, (ledger_id, entry_id, data) in enumerate(entries):
                if ledger_id != last_ledger:
                    state = states.get(ledger_id)
                    last_ledger, slots = -1, None
                if (state is None or self._failure is not None or type(data) is not bytes
                        or not 0 <= entry_id <= MAX_ENTRY_ID or len(data) > MAX_ENTRY_SIZE):
                    try:
                        data, state = self._add_checked(ledger_id, entry_id, data)
                    except Exception as exc:  # noqa: BLE001 - refuses this entry only
                        failed.append((i, exc))
                        last_ledger = -1
                        continue
                assert state is not None
                if added >= room and not cache.holds(ledger_id, entry_id):
                    error = self._write_through(ledger_id, entry_id, data, state)
                    if error is not None:
                        failed.append((i, error))
                    continue
                if entry_id > state.last_entry_id:
                    state.last_entry_id = entry_id
                if slots is None:
                    slots = active.get(ledger_id)
                    if slots is None:
                        slots = active[ledger_id] = {}
                    last_ledger = ledger_id
                old = slots.get(entry_id)
                slots[entry_id] = data
                added += len(data) if old is None else len(data) - len(old)
                if (cached or reading) and (ledger_id in cached or ledger_id in reading):
                    read_ahead.added(ledger_id, entry_id)  # re-adding overwrites: no copy of the old bytes stays
            cache.bytes += added
            full = [exc for exc in map(LedgerDir.no_space, dirs) if exc is not None]
        if full:  # entries placed in a log buffer the disk has no room for wait in memory: say so
            self._report(self.on_no_space, full[0])
        return failed

    def _write_through(self, ledger_id: int, entry_id: int, data: bytes, state: LedgerState) -> Exception | None:
        """(Lock held) the cache is full (adds outrun the checkpoints): the entry goes
        straight to its dir's log; returns the error that refused it (a full disk)."""
        dirs = self._dirs
        try:
            with self._failing:
                location = dirs[ledger_id % len(dirs)].append(ledger_id, entry_id, data)
        except Exception as exc:  # noqa: BLE001 - refuses this entry only (a full disk)
            return exc
        self._pending.setdefault(ledger_id, {})[entry_id] = location
        if entry_id > state.last_entry_id:
            state.last_entry_id = entry_id
        read_ahead = self._read_ahead
        if ledger_id in read_ahead.ledger_ids or ledger_id in read_ahead.reading_ahead:
            read_ahead.added(ledger_id, entry_id)
        return None

    def _add_checked(self, ledger_id: int, entry_id: int, data: bytes) -> tuple[bytes, LedgerState]:
        """One entry with every check (lock held): its bytes (a copy of anything else)
        and its ledger's state."""
        check_entry_ids(ledger_id, entry_id)
        if len(data) > MAX_ENTRY_SIZE:
            raise EntryTooLargeError("entry too large", ledger=ledger_id, entry=entry_id, size=len(data))
        return bytes(data), self._writable_state(ledger_id)

    def cached_bytes(self) -> int:
        """Bytes of the entries in the write cache: added since the last placement began,
        or not placed yet by one running (or one that failed)."""
        return self._cache.bytes

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The entry's data, verified (CRC and ids) against the stored record. From
        memory when it can (a log's write buffer, a copy read ahead); else, unless it is
        the ledger's last entry, the entries after it are read ahead with it (one
        batched read) and kept for the reads that follow. A read-ahead that fails (a
        damaged record further on) falls back to reading this one entry alone."""
        d = self._dir(ledger_id)
        read_ahead = self._read_ahead
        location = 0
        for _ in range(3):  # a running read-ahead that covers the entry is waited for, then memory asked again
            location, data, state = self._locate(d, ledger_id, entry_id, on_disk=not read_ahead.enabled)
            if data is not None:
                return data
            if not (read_ahead.enabled and entry_id < state.last_entry_id):
                break
            with self._lock:
                mine, done = read_ahead.begin(ledger_id, entry_id)
            if mine:
                return self._read_ahead_from(d, ledger_id, entry_id, state, done)
            done.wait(_READ_AHEAD_WAIT)
        if read_ahead.enabled:
            with self._lock:
                read_ahead.stats.misses += 1
        return self._read_entry(d, ledger_id, entry_id, location)

    def _read_ahead_from(self, d: LedgerDir, ledger_id: int, entry_id: int, state: LedgerState,
                         done: threading.Event) -> bytes:
        """Read ``entry_id`` and the entries after it in one batched read; keep all but
        the first (unless the ledger was deleted, or made again, meanwhile)."""
        read_ahead = self._read_ahead
        entries: list[bytes] = []
        try:
            entries = self.get_entries(ledger_id, entry_id, read_ahead.batch, read_ahead.batch_bytes)
        except (WalkitError, OSError):  # damage further on, a delete: the entry is read alone
            entries = []  # below, which says what is wrong
        finally:
            with self._lock:
                if entries and self._states.get(ledger_id) is state:
                    read_ahead.fill(ledger_id, entry_id + 1, entries[1:], state)
                read_ahead.end(ledger_id, entry_id, done)
        return entries[0] if entries else self._read_entry(d, ledger_id, entry_id)

    def _read_entry(self, d: LedgerDir, ledger_id: int, entry_id: int, location: int = 0) -> bytes:
        """One entry read alone (``location``: where a lookup just found it, 0: look)."""
        tried = 0
        for _ in range(3):  # compaction may move the entry and remove its old log meanwhile
            data: bytes | None = None
            if not location:
                location, data, _ = self._locate(d, ledger_id, entry_id)
            if data is not None:
                return data
            if location == tried:
                break
            tried, location = location, 0
            try:
                return self._read_log(d, tried, ledger_id, entry_id)
            except LogGone:
                continue
        log_id, offset = unpack_location(tried)
        raise CorruptionError("index points at a missing entry log", ledger=ledger_id, entry=entry_id,
                              log=log_id, offset=offset)

    def get_entries(self, ledger_id: int, first: int, count: int, max_bytes: int) -> list[bytes]:
        """The stored entries ``first``, ``first + 1``, ..., consecutive: at most ``count``,
        ending before the first entry not stored and before the one whose data would
        take the total past ``max_bytes`` (the first entry always). Each verified as
        :meth:`get_entry` verifies one, read with far fewer preads
        (:mod:`bookie.storage._ranges`). NoSuchEntryError when ``first`` is not stored."""
        if count < 1 or max_bytes < 0:
            raise InvalidArgumentError("count must be positive and max_bytes not negative", ledger=ledger_id,
                                       first=first, count=count, max_bytes=max_bytes)
        d = self._dir(ledger_id)
        with self._lock:
            state = self._existing_state(ledger_id)
            if not 0 <= first <= state.last_entry_id:
                raise NoSuchEntryError("entry not stored", ledger=ledger_id, entry=first)
            tables = [t[ledger_id] for t in (self._pending, self._flushing) if ledger_id in t]
            if ledger_id in d.slot_log.runs:  # older than the maps, newer than the index file
                tables.append(d.slot_log.window(ledger_id, first, min(count, state.last_entry_id - first + 1)))
            known = in_memory(self._cache.tables(ledger_id), tables, d.read_buffered, d.buffer_span(), ledger_id, first,
                              min(count, state.last_entry_id - first + 1),
                              max_bytes, state.on_disk)
        slots: list[int] = []
        if 0 in known:
            with self._index_file(ledger_id) as f:
                slots = read_slots(f, first, len(known))
        sources = located(known, slots)
        if not sources:
            raise NoSuchEntryError("entry not stored", ledger=ledger_id, entry=first)
        return read_range(sources, ledger_id, first, max_bytes, functools.partial(self._log_file, d),
                          functools.partial(self._read_entry, d, ledger_id))

    def memory_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The entry's data, verified, when memory has it - its entry log's write buffer,
        or a copy read ahead - (no I/O, fit for an event loop), else None
        (:meth:`get_entry` reads it). Raises NoSuchLedgerError for a ledger not stored."""
        d = self._dir(ledger_id)
        with self._lock:
            state = self._existing_state(ledger_id)
            data = self._cache.get(ledger_id, entry_id)
            if data is not None:
                return data
            location = self._memory_slot(ledger_id, entry_id)
            data = d.read_buffered(location, ledger_id, entry_id) if location else None
            return self._read_ahead.get(ledger_id, entry_id, state) if data is None else data

    def cache_stats(self) -> dict[str, dict[str, Any]]:
        """What the read caches hold and how often they answered (:mod:`bookie.storage._cache`)."""
        with self._lock:
            read_ahead = self._read_ahead.stats.as_dict()
        return {"read_ahead": read_ahead, "recent_writes": self._recent.stats.as_dict()}

    def _locate(self, d: LedgerDir, ledger_id: int, entry_id: int,
                on_disk: bool = True) -> tuple[int, bytes | None, LedgerState]:
        """The entry's location, with its data when memory has it (a log's buffer, a
        copy read ahead); and the ledger's state. Without ``on_disk``, an entry that is
        not in memory gets location 0 rather than its index slot (a read-ahead reads
        the slots of the entries after it too)."""
        with self._lock:
            state = self._existing_state(ledger_id)
            if not 0 <= entry_id <= MAX_ENTRY_ID:
                raise NoSuchEntryError("entry id out of range", ledger=ledger_id, entry=entry_id)
            data = self._cache.get(ledger_id, entry_id)
            if data is not None:
                return 0, data, state
            location = self._memory_slot(ledger_id, entry_id)
            if location:
                data = d.read_buffered(location, ledger_id, entry_id)
                if data is not None:
                    return location, data, state
            read_ahead = self._read_ahead
            if read_ahead.enabled:
                data = read_ahead.get(ledger_id, entry_id, state)
                if data is not None:
                    return location, data, state
            indexed = state.on_disk
        if not on_disk:
            return location, None, state
        if not location and indexed:
            location = self._disk_slot(ledger_id, entry_id)
        if not location:
            raise NoSuchEntryError("entry not stored", ledger=ledger_id, entry=entry_id)
        return location, None, state

    def stored_entries(self, ledger_id: int, first: int, last: int) -> list[int]:
        """The ids in ``first..last`` whose entry is stored (index slots, no data read)."""
        if not 0 <= first <= last <= MAX_ENTRY_ID:
            raise InvalidArgumentError("entry range out of bounds", ledger=ledger_id, first=first, last=last)
        with self._lock:
            state = self._existing_state(ledger_id)
            found = {e for table in (self._pending, self._flushing) for e in table.get(ledger_id, {})
                     if first <= e <= last}
            found |= self._dir(ledger_id).slot_log.window(ledger_id, first, last - first + 1).keys()
            found |= {e for e in self._cache.entry_ids(ledger_id) if first <= e <= last}
            on_disk = state.on_disk
        if on_disk:
            with self._index_file(ledger_id) as f:
                slots = read_slots(f, first, last - first + 1)
            found.update(first + i for i, slot in enumerate(slots) if slot)
        return sorted(found)

    def delete_ledger(self, ledger_id: int) -> None:
        """Forget the ledger: index file, state and its share of every entry log's usage
        (the space comes back when GC deletes or compacts those logs)."""
        d = self._dir(ledger_id)
        with self._flush_lock:
            with self._lock:
                self._check_writable()
                state = self._existing_state(ledger_id)
                d.slot_log.forget(ledger_id)  # its runs; the next flush voids its records
                del self._states[ledger_id]
                self._cache.drop_ledger(ledger_id)
                self._pending.pop(ledger_id, None)
                self._read_ahead.drop_ledger(ledger_id)
                self._dirty.discard(ledger_id)
                d.drop_ledger(ledger_id)
            if state.on_disk:  # remove before discarding: no reader caches a stale handle
                with self._failing:  # a file left behind would haunt a re-created ledger
                    self._fs.remove(d.index_path(ledger_id))
                    self._fs.fsync_dir(d.bucket_dir(ledger_id))
            self._index_files.discard(ledger_id)

    def slot_log_slots(self) -> int:
        """Index slots the dirs' slot logs hold (durable; in RAM too until a merge)."""
        with self._lock:
            return sum(d.slot_log.slots for d in self._dirs)

    def pending_index_entries(self) -> int:
        """Entries only in RAM: in the write cache, or placed with their location only in
        RAM (0 right after a flush)."""
        with self._lock:
            return sum(len(m) for t in (self._pending, self._flushing) for m in t.values()) + self._cache.count()

    # --- flush ----------------------------------------------------------------------
    def place(self) -> None:
        """Place the write cache in the entry logs now (a flush's step 0, alone): the
        entries leave memory for the logs, their locations wait in memory for the next
        flush, which writes the index. A full disk raises (what was not placed stays
        cached); any other I/O error fails the storage."""
        with self._flush_lock:
            self._place()

    def flush(self) -> None:
        """Make everything added so far durable (see the module docstring for the order).
        A full disk (ENOSPC while writing a log buffer or an index file) makes the flush
        raise but leaves the storage as it was - the entries stay reachable in memory,
        the next flush tries again; any other error fails the storage."""
        self._flush()

    def _flush(self, drain: bool = False) -> None:
        """:meth:`flush`; with ``drain``, a flush that merges every slot log that holds
        anything (the storage closing)."""
        with self._flush_lock:
            self._place()
            with self._lock:
                self._check_writable()
                with self._failing:
                    plan = self._begin_flush()
            with self._failing:
                self._sync_logs(plan)
            try:
                with self._failing:
                    self._write_index(plan, drain)
            except OSError as exc:
                if is_no_space(exc):
                    with self._lock:
                        self._abort_flush(plan)
                    with self._failing:  # before any later flush completes (see _slotlog)
                        for d in self._dirs:
                            d.slot_log.cut()
                raise
            with self._lock:
                self._end_flush(plan)

    def _place(self) -> None:
        """Step 0 (flush lock held): the write cache's entries appended to their dirs'
        logs, ledger by ledger and entry by entry in id order, their locations put in the
        pending map. They are placed in batches of at most ``PLACE_BATCH`` entries or
        ``PLACE_BATCH_BYTES`` (the first entry always), across ledgers, one acquisition of
        the lock each (10,000 ledgers of a few entries are ~10 acquisitions, not 10,000);
        after each full batch it yields, so that an add waiting for the lock gets it.
        Each time ``placement_sync_bytes`` more of a dir's active log was written out, that
        log is synced, outside the lock: the flush's writeback goes to the disk in small
        syncs, so that a journal on the same disk never waits behind a large one (and the
        flush's own sync finds little left; the flush lock keeps the log open meanwhile).
        A full disk (no room for a new log) stops it: the rest stays cached for the next
        flush."""
        cache = self._cache
        with self._lock:
            self._check_writable()
            ledgers = cache.begin()
        synced: dict[int, tuple[EntryLogWriter, int]] = {}  # dir -> a log, and its bytes written out when synced
        batch: list[tuple[int, list[int], dict[int, bytes]]] = []
        count = size = 0
        for ledger_id in ledgers:
            # only this flush changes ``placing`` (the flush lock): sorted and sized without the lock
            order = cache.order(ledger_id)
            slots = cache.placing[ledger_id]
            start = 0
            for at, entry_id in enumerate(order, 1):
                count, size = count + 1, size + len(slots[entry_id])
                if count >= PLACE_BATCH or size >= PLACE_BATCH_BYTES:
                    batch.append((ledger_id, order[start:at], slots))
                    self._place_batch(batch, synced)
                    time.sleep(0)  # an add woken by the lock's release takes it: else it is retaken at once
                    batch, count, size, start = [], 0, 0, at
            if start < len(order):
                batch.append((ledger_id, order[start:], slots))
        if batch:
            self._place_batch(batch, synced)

    def _place_batch(self, batch: list[tuple[int, list[int], dict[int, bytes]]],
                     synced: dict[int, tuple[EntryLogWriter, int]]) -> None:
        """One hold of the lock of :meth:`_place`: ``(ledger, entry ids, its slots)``
        appended to the logs; then the logs due a sync synced, outside it."""
        cache, due = self._cache, []
        with self._lock:
            self._check_writable()
            pending = self._pending  # swapped by _begin_flush, never while placing: the flush lock
            dirs: dict[int, LedgerDir] = {}
            for ledger_id, entry_ids, slots in batch:
                table = pending.get(ledger_id)
                if table is None:
                    table = pending[ledger_id] = {}
                d = self._dir(ledger_id)
                dirs[d.number] = d
                placed = size = 0
                try:
                    with self._failing:
                        for entry_id in entry_ids:
                            data = slots[entry_id]
                            table[entry_id] = d.append(ledger_id, entry_id, data)
                            size += len(data)
                            placed += 1
                finally:
                    cache.placed(ledger_id, entry_ids if placed == len(entry_ids) else entry_ids[:placed], size)
            for d in dirs.values():
                to_sync = self._due_sync(d, synced)
                if to_sync is not None:
                    due.append(to_sync)
        for writer in due:  # outside the lock: adds go on meanwhile
            with self._failing:
                writer.file.sync()

    def _due_sync(self, d: LedgerDir, synced: dict[int, tuple[EntryLogWriter, int]]) -> EntryLogWriter | None:
        """(Lock held, placing) ``d``'s active log if ``placement_sync_bytes`` more of it
        were written out since its last sync by this placement (noted as synced now)."""
        w = d.writer
        if not self._placement_sync or w is None:
            return None
        last = synced.get(d.number)
        done = last[1] if last is not None and last[0] is w else 0
        if w.buffer_start - done < self._placement_sync:
            return None
        synced[d.number] = (w, w.buffer_start)
        return w

    def _begin_flush(self) -> _FlushPlan:
        for d in self._dirs:  # first, as it may find the disk full: nothing is taken yet
            d.write_out()
        logs = [d.begin_flush() for d in self._dirs]
        slots, self._pending = self._pending, {}
        self._flushing = slots
        self._dirty |= {lid for lid in slots if not self._states[lid].on_disk}
        headers = {lid: self._states[lid].snapshot() for lid in self._dirty}
        self._dirty = set()
        created = {lid for lid in headers if not self._states[lid].on_disk}
        return _FlushPlan(logs=logs, slots=slots, headers=headers, created=created)

    def _sync_logs(self, plan: _FlushPlan) -> None:
        for log_flush in plan.logs:
            for writer in log_flush.sync:
                writer.file.sync()
        for log_flush in plan.logs:
            if log_flush.fsync_dir is not None:
                self._fs.fsync_dir(log_flush.fsync_dir)
        for d, log_flush in zip(self._dirs, plan.logs):
            if log_flush.close:  # rolled and now synced: sealed
                self._write_usage(d, log_flush.close)

    def _write_usage(self, d: LedgerDir, writers: list[EntryLogWriter]) -> None:
        """Sealed logs' usage files, then the directory fsync that makes them durable
        (so after a crash only logs above every sealed one lack one). A file that cannot
        be written is rebuilt at open."""
        try:
            for writer in writers:
                d.write_usage(writer)
            self._fs.fsync_dir(d.logs_dir)
        except OSError as exc:
            log.warning("entry logs %s in %s: usage files not written (rebuilt at the next start): %s",
                        [w.log_id for w in writers], d.root, exc)

    def _write_index(self, plan: _FlushPlan, drain: bool = False) -> None:
        """Step 3: the taken slots and the dirty headers into the index files or the slot
        logs (:meth:`_plan_index`), synced; a slot log that merged emptied (its runs are in
        the synced files now); new files renamed into place, then their names made
        durable. A dir whose file system has a
        syncer and that writes ``SYNCFS_FILES`` files or more syncs them all (and its slot
        log) with one syncfs, and their names with a second (a sync per file cost ~80 µs of
        CPU and ~0.1 ms of disk each: seconds per checkpoint at 10,000 ledgers)."""
        dirs = self._dirs
        plan.index = index = [self._plan_index(d, plan, drain) for d in dirs]
        batched = [d.syncer is not None and len(i.files) >= SYNCFS_FILES for d, i in zip(dirs, index)]
        new_dirs: set[str] = set()  # to fsync: of the dirs synced file by file
        for d, i, together in zip(dirs, index, batched):
            runs = d.slot_log.runs
            for ledger_id in i.files:
                created = ledger_id in plan.created
                if created:
                    made = self._make_bucket(ledger_id)
                    if not together:
                        new_dirs |= made
                with self._index_files.use(ledger_id, create=created) as f:
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
            d = self._dir(ledger_id)
            self._fs.rename(d.new_index_path(ledger_id), d.index_path(ledger_id))
            self._index_files.discard(ledger_id)
            renamed.add(d.number)
        for d, together in zip(dirs, batched):
            if together and d.number in renamed:
                d.syncer.sync()  # type: ignore[union-attr]  # the new names and buckets
        for path in sorted(new_dirs, key=len, reverse=True):  # buckets before index/
            self._fs.fsync_dir(path)

    def _plan_index(self, d: LedgerDir, plan: _FlushPlan, drain: bool = False) -> _DirIndex:
        """Which of the dir's ledgers get their index file written and which only a slot
        log record (see :mod:`bookie.storage._slotlog`): with ``SLOT_LOG_LEDGERS`` ledgers
        or more in the dir, a ledger that has an index file, no header to write and new
        slots of consecutive ids is deferred. A ledger written whose slots the log holds
        gets its new slots logged too (the log's last record of an entry is the newest).
        A log that would pass its bound merges instead (and every log, with ``drain``):
        every ledger with runs gets its index file written, and nothing is logged."""
        sl, n = d.slot_log, len(self._dirs)
        mine = sorted(lid for lid in plan.slots.keys() | plan.headers.keys() if lid % n == d.number)
        may_defer = sl.max_bytes > 0 and len(mine) >= SLOT_LOG_LEDGERS
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
            return _DirIndex(sorted(set(mine) | sl.runs.keys()), {}, set(), b"", set(), True)
        return _DirIndex(files, deferred, logged, raw, voided, False)

    def _make_bucket(self, ledger_id: int) -> set[str]:
        """The directories to fsync once the ledger's new index file is in place."""
        d = self._dir(ledger_id)
        if d.ensure_bucket(ledger_id):
            return {d.bucket_dir(ledger_id), d.index_dir}
        return {d.bucket_dir(ledger_id)}

    def _abort_flush(self, plan: _FlushPlan) -> None:
        """Undo a flush the disk had no room for (lock held): its slots go back to the
        pending map (slots added since are newer), its headers are dirty again, its new
        index files will be made again (``.tmp``), its synced rolled logs will be sealed
        by the next flush. Index slots and headers it wrote point at synced records and
        are written again, so the retry needs nothing from this attempt."""
        for ledger_id, slots in plan.slots.items():
            if ledger_id in self._states:
                slots.update(self._pending.get(ledger_id, {}))
                self._pending[ledger_id] = slots
        self._flushing = {}
        self._dirty |= plan.headers.keys() & self._states.keys()
        for ledger_id in plan.created:
            self._index_files.discard(ledger_id)
            d = self._dir(ledger_id)  # its bucket may not be durable in index/: the retry makes it so
            d.buckets.discard(d.bucket_dir(ledger_id))
        for d, log_flush in zip(self._dirs, plan.logs):
            d.rolled = log_flush.close + d.rolled

    def _end_flush(self, plan: _FlushPlan) -> None:
        for ledger_id, header in plan.headers.items():
            state = self._states.get(ledger_id)
            if state is not None:
                state.seq = header.seq
                state.on_disk = True
        self._flushing = {}
        for d, i in zip(self._dirs, plan.index or ()):
            sl = d.slot_log
            if i.merge:
                sl.emptied()
                continue
            for ledger_id in i.files:
                sl.written(ledger_id, ledger_id in i.logged)
            for ledger_id, (first, locations) in i.deferred.items():
                if ledger_id in self._states:
                    sl.defer(ledger_id, first, locations)
            sl.voided_written(i.voided)
            sl.appended(len(i.records))
        for d, log_flush in zip(self._dirs, plan.logs):
            for writer in log_flush.close:
                d.seal(writer)
                writer.close()

    # --- helpers --------------------------------------------------------------------
    def _dir(self, ledger_id: int) -> LedgerDir:
        return self._dirs[ledger_id % len(self._dirs)]

    def _load_ledger(self, d: LedgerDir, ledger_id: int, path: str) -> None:
        if ledger_id % len(self._dirs) != d.number:
            raise CorruptionError("ledger index in the wrong ledger dir", ledger=ledger_id, dir=d.root)
        f = self._fs.open(path)
        try:
            self._states[ledger_id] = load_index(f, ledger_id, path)
        finally:
            f.close()

    def _memory_slot(self, ledger_id: int, entry_id: int) -> int:
        """(Lock held) the newest location memory knows: the pending and flushing maps,
        then the slot log's runs (durable, not yet in the index file); 0: ask the file."""
        for table in (self._pending, self._flushing):
            slots = table.get(ledger_id)
            if slots is not None and entry_id in slots:
                return slots[entry_id]
        return self._dir(ledger_id).slot_log.slot(ledger_id, entry_id)

    def _load_slot_log(self, d: LedgerDir) -> None:
        """Replay the dir's slot log (at open, after its index files): the runs it holds
        may reach past the last entry an index file has."""
        d.slot_log.load(self._states)
        for ledger_id, runs in d.slot_log.runs.items():
            state = self._states[ledger_id]
            state.last_entry_id = max(state.last_entry_id, *(first + len(locations) - 1 for first, locations in runs))

    def _disk_slot(self, ledger_id: int, entry_id: int) -> int:
        try:  # not through _index_file: a generator context costs a single read ~3 us
            with self._index_files.use(ledger_id) as f:
                return read_slot(f, entry_id)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            raise NoSuchLedgerError("ledger deleted", ledger=ledger_id) from exc

    @contextmanager
    def _index_file(self, ledger_id: int) -> Iterator[File]:
        """The ledger's index file, for reading (NoSuchLedgerError: deleted meanwhile)."""
        try:
            with self._index_files.use(ledger_id) as f:
                yield f
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            raise NoSuchLedgerError("ledger deleted", ledger=ledger_id) from exc

    def _read_log(self, d: LedgerDir, location: int, ledger_id: int, entry_id: int) -> bytes:
        log_id, offset = unpack_location(location)
        try:  # not through _log_file: a generator context costs a single read ~3 us
            with self._log_files.use((d.number, log_id)) as f:
                return read_record(self._kept_first(f, d, log_id), log_id, offset, ledger_id, entry_id)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            raise LogGone() from exc

    @contextmanager
    def _log_file(self, d: LedgerDir, log_id: int) -> Iterator[Preader]:
        """An entry log of ``d``, for reading, its bytes written lately from memory
        (LogGone: it is not there)."""
        try:
            with self._log_files.use((d.number, log_id)) as f:
                yield self._kept_first(f, d, log_id)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            raise LogGone() from exc

    def _kept_first(self, f: File, d: LedgerDir, log_id: int) -> Preader:
        """``f``, with the recent-writes cache in front when it is on."""
        return KeptFirst(f, self._recent, d.number, log_id) if self._recent.stats.max_bytes else f

    def _open_index(self, ledger_id: int, create: bool) -> File:
        """The index file, or with ``create`` a new, empty ``.tmp`` file for it."""
        d = self._dir(ledger_id)
        if not create:
            return self._fs.open(d.index_path(ledger_id))
        f = self._fs.open(d.new_index_path(ledger_id), create=True)
        f.truncate(0)
        return f

    def _open_log(self, key: tuple[int, int], create: bool) -> File:
        d = self._dirs[key[0]]
        return open_log_for_read(self._fs, d.log_path(key[1]), key[1])

