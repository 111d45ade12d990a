"""Read caches of the ledger storage: entries read ahead, and entry-log bytes written lately.

Theory of operation
-------------------
Two caches, each bounded by bytes and each counting its hits, keep reads off the disk.

**Read-ahead** (:class:`ReadAheadCache`; BookKeeper's ``dbStorage_readAheadCache*`` keys).
A single-entry read (``LedgerStorage.get_entry``, the wire's READ_ENTRY) that has to go
to an entry log reads the entries after it too, in one batched read (``get_entries``:
at most ``batch`` entries and ``batch_bytes`` bytes, one index pread, a few log preads),
and keeps them here, verified. A reader going entry by entry - an older client, the
fencing reads of a recovery, a client with ``range_reads=False``, the auditor - then
finds the next ``batch - 1`` entries in memory: no index or log read, no CRC, and the
bookie answers them on its event loop without a hand-off to the read pool
(``Bookie.read_memory``). Batched reads (READ_RANGE) neither fill nor consult it: they
read runs themselves, and a scan must not push out what single readers use.

Reads of one ledger arrive together (a client keeps dozens in flight), so the misses
right after a batch would each read ahead the same entries: a miss whose entry a
running read-ahead covers waits for it (:meth:`ReadAheadCache.begin`) and then finds
its entry in memory.

Eviction is oldest-inserted first: a forward reader takes each entry once, soon after
it was read ahead, so recency bookkeeping on every hit would buy nothing. A reader
that scans far behind the writer only cycles the cache through its bound.

Correctness: an entry of a ledger has one content (a re-add - journal replay, a
recovery's rewrite - carries the same bytes), but the store says "re-adding
overwrites", so an add of a cached entry drops the copy; every copy is tagged with the
ledger's state object, so a ledger deleted (and created again under the same id) while
a read-ahead was on disk is never answered from it; a deleted ledger's copies are
dropped at once. The storage's lock guards every call.

**Recent writes** (:class:`RecentWrites`; walkit's ``recentWritesCacheMaxSizeMb``).
An entry log's write buffer, once written out to the file, is kept (the newest, up to
the bound) rather than dropped, so a reader close behind the writer - a tail catching
up, a replica copied right after its writes - reads those bytes from memory, not the
page cache, which other files may have taken. The bytes at an offset of a log never
change (logs are append-only and a location is never reused), so a kept buffer is the
file's content; a log's kept buffers are contiguous and the newest ends where the file
ends (a buffer that cannot be kept drops its log's older ones), so a read running past
that end is short exactly as the file's pread is. :class:`KeptFirst` answers a pread
from memory when it lies within them, else from the file. Its own lock: reads take it
without the storage's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Any

from bookie.fs import File

__all__ = ["CacheStats", "KeptFirst", "ReadAheadCache", "RecentWrites"]


class CacheStats:
    """Counts of one cache (read under the lock that guards the cache, or racy by a few)."""

    __slots__ = ("hits", "misses", "filled", "evicted", "bytes", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.hits = self.misses = self.filled = self.evicted = self.bytes = 0
        self.max_bytes = max_bytes

    def as_dict(self) -> dict[str, Any]:
        asked = self.hits + self.misses
        return {"hits": self.hits, "misses": self.misses, "hit_rate": round(self.hits / asked, 4) if asked else None,
                "filled": self.filled, "evicted": self.evicted, "bytes": self.bytes, "max_bytes": self.max_bytes}


class ReadAheadCache:
    """Verified entries read ahead, by ``(ledger, entry)``, at most ``max_bytes`` of data
    (0: off). ``batch`` / ``batch_bytes``: how far one read-ahead goes."""

    def __init__(self, max_bytes: int, batch: int, batch_bytes: int) -> None:
        self.batch = batch
        self.batch_bytes = batch_bytes
        self.stats = CacheStats(max_bytes)
        self._entries: OrderedDict[tuple[int, int], tuple[object, bytes]] = OrderedDict()
        #: ledger -> its cached entry ids (an add or a delete finds its copies at once)
        self._ledgers: dict[int, set[int]] = {}
        #: ledger -> the read-aheads running for it: (first entry, done)
        self._running: dict[int, list[tuple[int, threading.Event]]] = {}
        #: ledger -> entries added while a read-ahead of it ran (it may have read the old
        #: bytes: its fill skips them)
        self._readded: dict[int, set[int]] = {}

    @property
    def enabled(self) -> bool:
        return self.stats.max_bytes > 0 and self.batch > 1

    def get(self, ledger_id: int, entry_id: int, state: object) -> bytes | None:
        """The copy of the entry read ahead for this very ledger ``state``, else None
        (a hit is counted here; a miss where a read goes to the disk: :meth:`begin`, or
        the storage for a read not read ahead)."""
        item = self._entries.get((ledger_id, entry_id))
        if item is not None and item[0] is state:
            self.stats.hits += 1
            return item[1]
        return None

    def begin(self, ledger_id: int, entry_id: int) -> tuple[bool, threading.Event]:
        """``(True, done)``: the caller reads ahead from ``entry_id`` and then calls
        :meth:`end`; ``(False, done)``: a running read-ahead covers the entry - wait on
        ``done``, then ask the cache again."""
        running = self._running.setdefault(ledger_id, [])
        for first, done in running:
            if first <= entry_id < first + self.batch:
                return False, done
        self.stats.misses += 1  # a read that goes to the disk
        done = threading.Event()
        running.append((entry_id, done))
        return True, done

    def missed(self) -> None:
        """A single read went to the disk without reading ahead (the ledger's last entry,
        or one a read-ahead covered but did not keep)."""
        self.stats.misses += 1

    def end(self, ledger_id: int, entry_id: int, done: threading.Event) -> None:
        """The read-ahead :meth:`begin` gave the caller is over (filled or not)."""
        running = self._running.get(ledger_id, [])
        if (entry_id, done) in running:
            running.remove((entry_id, done))
        if not running:
            self._running.pop(ledger_id, None)
            self._readded.pop(ledger_id, None)
        done.set()

    def fill(self, ledger_id: int, first: int, entries: list[bytes], state: object) -> None:
        """Keep ``entries`` (``first``, ``first + 1``, ...) of the ledger whose state is
        ``state``, evicting the oldest copies past the bound; those added again since
        the read-ahead began (:meth:`added`) are left out."""
        readded = self._readded.get(ledger_id, ())
        keep = [(first + i, data) for i, data in enumerate(entries) if first + i not in readded]
        if not keep:
            return
        stats, cached = self.stats, self._entries
        ids = self._ledgers.setdefault(ledger_id, set())
        for entry_id, data in keep:
            key = (ledger_id, entry_id)
            old = cached.pop(key, None)
            if old is not None:
                stats.bytes -= len(old[1])
            cached[key] = (state, data)
            ids.add(entry_id)
            stats.bytes += len(data)
        stats.filled += len(keep)
        while stats.bytes > stats.max_bytes and cached:
            (lid, eid), (_, data) = cached.popitem(last=False)
            stats.bytes -= len(data)
            stats.evicted += 1
            self._forget(lid, eid)

    @property
    def ledger_ids(self) -> dict[int, set[int]]:
        """The ledgers with copies (read only: an add tests it before dropping a copy)."""
        return self._ledgers

    @property
    def reading_ahead(self) -> dict[int, list[tuple[int, threading.Event]]]:
        """The ledgers with a read-ahead running (read only: an add tests it)."""
        return self._running

    def added(self, ledger_id: int, entry_id: int) -> None:
        """The entry was (re-)added: its copy goes, and a read-ahead of its ledger now
        running (which may have read the old bytes) does not keep it."""
        self.drop(ledger_id, entry_id)
        if ledger_id in self._running:
            self._readded.setdefault(ledger_id, set()).add(entry_id)

    def drop(self, ledger_id: int, entry_id: int) -> None:
        """An add overwrote the entry: its copy goes."""
        old = self._entries.pop((ledger_id, entry_id), None)
        if old is not None:
            self.stats.bytes -= len(old[1])
            self._forget(ledger_id, entry_id)

    def drop_ledger(self, ledger_id: int) -> None:
        """The ledger was deleted: every copy of it goes."""
        for entry_id in self._ledgers.pop(ledger_id, ()):
            old = self._entries.pop((ledger_id, entry_id), None)
            if old is not None:
                self.stats.bytes -= len(old[1])

    def clear(self) -> None:
        self._entries.clear()
        self._ledgers.clear()
        self.stats.bytes = 0

    def _forget(self, ledger_id: int, entry_id: int) -> None:
        ids = self._ledgers.get(ledger_id)
        if ids is not None:
            ids.discard(entry_id)
            if not ids:
                del self._ledgers[ledger_id]


class RecentWrites:
    """Entry-log bytes written out lately, by ``(dir number, log id)``: the newest
    buffers, ``max_bytes`` in all (0: off)."""

    def __init__(self, max_bytes: int) -> None:
        self.stats = CacheStats(max_bytes)
        self._lock = threading.Lock()
        #: (dir, log) -> its kept buffers as (start offset, bytes), contiguous, oldest first
        #: (a written-out buffer is kept as it was: its writer never changes it again)
        self._logs: dict[tuple[int, int], list[tuple[int, bytes | bytearray]]] = {}
        self._order: deque[tuple[int, int]] = deque()  # whose buffer was kept, oldest first

    def keep(self, dir_number: int, log_id: int, start: int, data: bytes | bytearray) -> None:
        """``data`` was just written at ``start`` of the log (under the storage's lock)."""
        stats, key = self.stats, (dir_number, log_id)
        with self._lock:
            if len(data) > stats.max_bytes:  # cannot keep it: the log's older buffers would end early
                self._drop(key)
                return
            chunks = self._logs.setdefault(key, [])
            if chunks and chunks[-1][0] + len(chunks[-1][1]) != start:  # not contiguous (cannot happen): restart
                self._drop(key)
                chunks = self._logs.setdefault(key, [])
            chunks.append((start, data))
            self._order.append(key)
            stats.bytes += len(data)
            stats.filled += 1
            while stats.bytes > stats.max_bytes:
                oldest = self._order.popleft()
                kept = self._logs[oldest]
                _, gone = kept.pop(0)
                stats.bytes -= len(gone)
                stats.evicted += 1
                if not kept:
                    del self._logs[oldest]

    def pread(self, dir_number: int, log_id: int, size: int, offset: int) -> bytes | None:
        """The ``size`` bytes at ``offset`` of the log (fewer past its end, as a file's
        pread) when memory holds them from ``offset`` on; None: read the file."""
        with self._lock:
            chunks = self._logs.get((dir_number, log_id))
            if not chunks or offset < chunks[0][0]:
                self.stats.misses += 1
                return None
            end = offset + size
            parts: list[memoryview] = []
            for start, data in chunks:
                stop = start + len(data)
                if stop <= offset:
                    continue
                parts.append(memoryview(data)[max(offset - start, 0) : min(end, stop) - start])
                if stop >= end:
                    break
            self.stats.hits += 1
        return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)

    def drop_log(self, dir_number: int, log_id: int) -> None:
        """The log is gone (garbage collection, compaction)."""
        with self._lock:
            self._drop((dir_number, log_id))

    def clear(self) -> None:
        with self._lock:
            self._logs.clear()
            self._order.clear()
            self.stats.bytes = 0

    def _drop(self, key: tuple[int, int]) -> None:
        chunks = self._logs.pop(key, None)
        if chunks:
            self.stats.bytes -= sum(len(data) for _, data in chunks)
            self._order = deque(k for k in self._order if k != key)  # a few dozen: rare and cheap


class KeptFirst:
    """A log file whose preads :class:`RecentWrites` answers when it can."""

    __slots__ = ("_file", "_recent", "_dir", "_log")

    def __init__(self, f: File, recent: RecentWrites, dir_number: int, log_id: int) -> None:
        self._file, self._recent, self._dir, self._log = f, recent, dir_number, log_id

    def pread(self, size: int, offset: int) -> bytes:
        data = self._recent.pread(self._dir, self._log, size, offset)
        return self._file.pread(size, offset) if data is None else data
