"""Reads of the ledger storage: one entry, a run of entries, memory only, which are stored.

Theory of operation
-------------------
A read looks its entry up under the storage lock, newest copy first (see
:mod:`bookie.storage._shared`, "Where an entry is"): the write cache, the pending and
flushing maps, the slot log's runs, then - outside the lock - the index slot; it reads
and verifies the record (CRC and ids) outside the lock too. An entry still in a log's
write buffer is copied under the lock. :meth:`EntryReads.get_entries` reads a run of
consecutive entries the same way with one index pread and few log preads
(:mod:`bookie.storage._ranges`).

Two bounded caches (:mod:`bookie.storage._cache`) sit in front: a single read that goes
to the disk reads the entries after it ahead, and log buffers written out lately are
kept, so preads of them are answered from memory. Misses that a running read-ahead
covers wait for it rather than read the same entries again.

Why a read never returns wrong bytes: a location is never reused and a log's bytes at
an offset never change; a location found under the lock is either still right, or its
log was compacted away after the lookup - then the read finds the log gone
(:class:`~bookie.storage._entrylog.LogGone`) and looks the entry up again (it has moved,
and a flush made the move durable before the log went). A copy read ahead is tagged with
its ledger's state object, so a ledger deleted and made again meanwhile is never answered
from it.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from bookie.storage._entrylog import LogGone
from bookie.storage._files import StorageFiles
from bookie.storage._format import MAX_ENTRY_ID, unpack_location
from bookie.storage._index import LedgerState, read_slots
from bookie.storage._ledgerdir import LedgerDir
from bookie.storage._ranges import in_memory, located, read_range
from bookie.storage._shared import StorageShared
from walkit.errors import CorruptionError, InvalidArgumentError, NoSuchEntryError, WalkitError

__all__ = ["EntryReads"]

_READ_AHEAD_WAIT = 10.0  # seconds a read waits for a running read-ahead of its entry at most


class EntryReads:
    """The storage's reads (see the module docstring); thread-safe."""

    def __init__(self, shared: StorageShared, files: StorageFiles) -> None:
        self._shared = shared
        self._files = files

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The entry's data, verified (CRC and ids) against the stored record. From
        memory when it can (a log's write buffer, a copy read ahead); else, unless it is
        the ledger's last entry, the entries after it are read ahead with it (one
        batched read) and kept for the reads that follow. A read-ahead that fails (a
        damaged record further on) falls back to reading this one entry alone."""
        sh = self._shared
        d = sh.dir(ledger_id)
        read_ahead = sh.read_ahead
        location = 0
        for _ in range(3):  # a running read-ahead that covers the entry is waited for, then memory asked again
            location, data, state = self._locate(d, ledger_id, entry_id, on_disk=not read_ahead.enabled)
            if data is not None:
                return data
            if not (read_ahead.enabled and entry_id < state.last_entry_id):
                break
            with sh.lock:
                mine, done = read_ahead.begin(ledger_id, entry_id)
            if mine:
                return self._read_ahead_from(d, ledger_id, entry_id, state, done)
            done.wait(_READ_AHEAD_WAIT)
        if read_ahead.enabled:
            with sh.lock:
                read_ahead.missed()
        return self._read_entry(d, ledger_id, entry_id, location)

    def _read_ahead_from(self, d: LedgerDir, ledger_id: int, entry_id: int, state: LedgerState,
                         done: threading.Event) -> bytes:
        """Read ``entry_id`` and the entries after it in one batched read; keep all but
        the first (unless the ledger was deleted, or made again, meanwhile)."""
        sh = self._shared
        read_ahead = sh.read_ahead
        entries: list[bytes] = []
        try:
            entries = self.get_entries(ledger_id, entry_id, read_ahead.batch, read_ahead.batch_bytes)
        except (WalkitError, OSError):  # damage further on, a delete: the entry is read alone
            entries = []  # below, which says what is wrong
        finally:
            with sh.lock:
                if entries and sh.states.get(ledger_id) is state:
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
                return self._files.read_log(d, tried, ledger_id, entry_id)
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
        sh = self._shared
        d = sh.dir(ledger_id)
        with sh.lock:
            state = sh.existing_state(ledger_id)
            if not 0 <= first <= state.last_entry_id:
                raise NoSuchEntryError("entry not stored", ledger=ledger_id, entry=first)
            tables = [t[ledger_id] for t in (sh.pending, sh.flushing) if ledger_id in t]
            if ledger_id in d.slot_log.runs:  # older than the maps, newer than the index file
                tables.append(d.slot_log.window(ledger_id, first, min(count, state.last_entry_id - first + 1)))
            known = in_memory(sh.cache.tables(ledger_id), tables, d.read_buffered, d.buffer_span(), ledger_id, first,
                              min(count, state.last_entry_id - first + 1),
                              max_bytes, state.on_disk)
        slots: list[int] = []
        if 0 in known:
            with self._files.index_file(ledger_id) as f:
                slots = read_slots(f, first, len(known))
        sources = located(known, slots)
        if not sources:
            raise NoSuchEntryError("entry not stored", ledger=ledger_id, entry=first)
        return read_range(sources, ledger_id, first, max_bytes, functools.partial(self._files.log_file, d),
                          functools.partial(self._read_entry, d, ledger_id))

    def memory_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The entry's data, verified, when memory has it - its entry log's write buffer,
        or a copy read ahead - (no I/O, fit for an event loop), else None
        (:meth:`get_entry` reads it). Raises NoSuchLedgerError for a ledger not stored."""
        sh = self._shared
        d = sh.dir(ledger_id)
        with sh.lock:
            state = sh.existing_state(ledger_id)
            data = sh.cache.get(ledger_id, entry_id)
            if data is not None:
                return data
            location = sh.memory_slot(ledger_id, entry_id)
            data = d.read_buffered(location, ledger_id, entry_id) if location else None
            return sh.read_ahead.get(ledger_id, entry_id, state) if data is None else data

    def cache_stats(self) -> dict[str, dict[str, Any]]:
        """What the read caches hold and how often they answered (:mod:`bookie.storage._cache`)."""
        sh = self._shared
        with sh.lock:
            read_ahead = sh.read_ahead.stats.as_dict()
        return {"read_ahead": read_ahead, "recent_writes": sh.recent.stats.as_dict()}

    def _locate(self, d: LedgerDir, ledger_id: int, entry_id: int,
                on_disk: bool = True) -> tuple[int, bytes | None, LedgerState]:
        """The entry's location, with its data when memory has it (a log's buffer, a
        copy read ahead); and the ledger's state. Without ``on_disk``, an entry that is
        not in memory gets location 0 rather than its index slot (a read-ahead reads
        the slots of the entries after it too)."""
        sh = self._shared
        with sh.lock:
            state = sh.existing_state(ledger_id)
            if not 0 <= entry_id <= MAX_ENTRY_ID:
                raise NoSuchEntryError("entry id out of range", ledger=ledger_id, entry=entry_id)
            data = sh.cache.get(ledger_id, entry_id)
            if data is not None:
                return 0, data, state
            location = sh.memory_slot(ledger_id, entry_id)
            if location:
                data = d.read_buffered(location, ledger_id, entry_id)
                if data is not None:
                    return location, data, state
            read_ahead = sh.read_ahead
            if read_ahead.enabled:
                data = read_ahead.get(ledger_id, entry_id, state)
                if data is not None:
                    return location, data, state
            indexed = state.on_disk
        if not on_disk:
            return location, None, state
        if not location and indexed:
            location = self._files.disk_slot(ledger_id, entry_id)
        if not location:
            raise NoSuchEntryError("entry not stored", ledger=ledger_id, entry=entry_id)
        return location, None, state

    def stored_entries(self, ledger_id: int, first: int, last: int) -> list[int]:
        """The ids in ``first..last`` whose entry is stored (index slots, no data read)."""
        if not 0 <= first <= last <= MAX_ENTRY_ID:
            raise InvalidArgumentError("entry range out of bounds", ledger=ledger_id, first=first, last=last)
        sh = self._shared
        with sh.lock:
            state = sh.existing_state(ledger_id)
            found = {e for table in (sh.pending, sh.flushing) for e in table.get(ledger_id, {})
                     if first <= e <= last}
            found |= sh.dir(ledger_id).slot_log.window(ledger_id, first, last - first + 1).keys()
            found |= {e for e in sh.cache.entry_ids(ledger_id) if first <= e <= last}
            on_disk = state.on_disk
        if on_disk:
            with self._files.index_file(ledger_id) as f:
                slots = read_slots(f, first, last - first + 1)
            found.update(first + i for i, slot in enumerate(slots) if slot)
        return sorted(found)
