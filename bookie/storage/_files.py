"""The ledger storage's open files: index files and entry logs, kept open in bounded LRUs.

Theory of operation
-------------------
:class:`StorageFiles` opens a ledger's index file (or, for a flush that creates it, a new
empty ``.idx.tmp``) and a dir's entry log for reading on demand, and keeps them open in
two :class:`~bookie.storage._handles.HandleCache` s: at most ``open_index_files`` index
files and ``OPEN_LOG_FILES`` logs, so a bookie holding a million ledgers never holds a
million descriptors. A handle in use is pinned, so a discard (a deleted ledger, a
renamed ``.tmp``, a removed log) never closes a file under a reader; the discarding side
removes the file first, so no reader caches a stale handle afterwards.

A read that finds its file gone says why in the storage's terms: an index file gone
means the ledger was deleted meanwhile (``NoSuchLedgerError``); an entry log gone means
compaction moved its records and removed it (:class:`~bookie.storage._entrylog.LogGone`:
the reader looks the entry up again). An entry log read goes through the recent-writes
cache (:class:`~bookie.storage._cache.KeptFirst`) when that is on. No lock of the
storage's is needed: each cache has its own, and file reads take absolute offsets.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

from bookie.fs import File, FileSystem
from bookie.storage._cache import KeptFirst, RecentWrites
from bookie.storage._entrylog import LogGone, Preader, open_log_for_read, read_record
from bookie.storage._format import unpack_location
from bookie.storage._handles import HandleCache
from bookie.storage._index import read_slot
from bookie.storage._ledgerdir import LedgerDir
from walkit.errors import NoSuchLedgerError

__all__ = ["OPEN_LOG_FILES", "StorageFiles"]

OPEN_LOG_FILES = 64  # entry logs kept open for reads (each dir holds few logs at a time)


class StorageFiles:
    """The index files and entry logs of ``dirs`` (see the module docstring)."""

    def __init__(self, fs: FileSystem, dirs: list[LedgerDir], recent: RecentWrites, open_index_files: int) -> None:
        self._fs, self._dirs, self._recent = fs, dirs, recent
        #: index files by ledger id
        self.index: HandleCache[int] = HandleCache(self._open_index, open_index_files)
        #: entry logs by ``(dir number, log id)``
        self.logs: HandleCache[tuple[int, int]] = HandleCache(self._open_log, OPEN_LOG_FILES)

    def close_all(self) -> None:
        self.index.close_all()
        self.logs.close_all()

    def disk_slot(self, ledger_id: int, entry_id: int) -> int:
        """The entry's index slot in its file (0: none)."""
        try:  # not through index_file: a generator context costs a single read ~3 us
            with self.index.use(ledger_id) as f:
                return read_slot(f, entry_id)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            raise NoSuchLedgerError("ledger deleted", ledger=ledger_id) from exc

    @contextmanager
    def index_file(self, ledger_id: int) -> Iterator[File]:
        """The ledger's index file, for reading (NoSuchLedgerError: deleted meanwhile)."""
        try:
            with self.index.use(ledger_id) as f:
                yield f
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            raise NoSuchLedgerError("ledger deleted", ledger=ledger_id) from exc

    def read_log(self, d: LedgerDir, location: int, ledger_id: int, entry_id: int) -> bytes:
        """The entry's record at ``location`` in ``d``, verified (LogGone: the log is not there)."""
        log_id, offset = unpack_location(location)
        try:  # not through log_file: a generator context costs a single read ~3 us
            with self.logs.use((d.number, log_id)) as f:
                return read_record(self._kept_first(f, d, log_id), log_id, offset, ledger_id, entry_id)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            raise LogGone() from exc

    @contextmanager
    def log_file(self, d: LedgerDir, log_id: int) -> Iterator[Preader]:
        """An entry log of ``d``, for reading, its bytes written lately from memory
        (LogGone: it is not there)."""
        try:
            with self.logs.use((d.number, log_id)) as f:
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
        d = self._dirs[ledger_id % len(self._dirs)]
        if not create:
            return self._fs.open(d.index_path(ledger_id))
        f = self._fs.open(d.new_index_path(ledger_id), create=True)
        f.truncate(0)
        return f

    def _open_log(self, key: tuple[int, int], create: bool) -> File:
        d = self._dirs[key[0]]
        return open_log_for_read(self._fs, d.log_path(key[1]), key[1])
