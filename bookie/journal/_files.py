"""The journal directory: naming, opening the next file (recycled or new), reserving
space, and retiring files behind a checkpoint mark.

Files are ``<id:016x>.txn``; retired ones kept for reuse are ``<id:016x>.txn.free``.
Opening journal N takes the lowest free file when there is one - renamed to N, header
rewritten with ``previous id`` = its old id, directory synced - so appends overwrite
blocks that are already written; otherwise a new file is created and its space is
reserved by ``fallocate`` in ``prealloc_size`` steps. :meth:`JournalFiles.next_id` is
above every id in the directory, free files included, so a recycled file never gets back
the id - and the frame-CRC seed - of its earlier life.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from bookie.fs import File, FileSystem, is_no_space
from bookie.journal._format import JournalHeader, journal_name, parse_journal_name
from walkit.errors import NativeIOError

__all__ = ["JournalFiles", "OpenJournal", "list_journals", "free_journals"]

log = logging.getLogger("bookie.journal")

_FREE = ".free"


def list_journals(fs: FileSystem, directory: str) -> list[int]:
    """Ids of the journal files in ``directory``, ascending."""
    ids = (parse_journal_name(n) for n in fs.listdir(directory))
    return sorted(i for i in ids if i is not None)


def free_journals(fs: FileSystem, directory: str) -> list[int]:
    """Old ids of the free (recyclable) journal files, ascending."""
    names = (n[: -len(_FREE)] for n in fs.listdir(directory) if n.endswith(_FREE))
    ids = (parse_journal_name(n) for n in names)
    return sorted(i for i in ids if i is not None)


@dataclass
class OpenJournal:
    """The journal file being written."""

    file: File
    journal_id: int
    #: the id of its earlier life when it was recycled (0: a new file)
    previous_id: int
    #: bytes from 0 known to be allocated (written blocks or reserved space)
    allocated: int
    prealloc_size: int
    #: the last step did not fit: batches reserve exactly their size (warned once)
    tight: bool = False
    # Shared with the zero filler (bookie.journal._zero, whose docstring says why this is
    # safe), under ``cond``: bytes below ``allocated`` are the journal's, the filler
    # writes only at and past it.
    cond: threading.Condition = field(default_factory=lambda: threading.Condition(threading.Lock()))  # taken per batch
    #: the end of the last batch reserved
    tail: int = 0
    #: the filler fills up to here (0: this file is not filled)
    zero_limit: int = 0
    #: the filler is woken when a batch leaves fewer bytes than this filled ahead
    zero_low_water: int = 0
    #: while filled: a batch past the filled bytes fallocates this much at a time (the
    #: filler's chunk), not ``prealloc_size``, so the filler soon takes over again
    zero_step: int = 0
    #: a chunk starting at ``allocated`` is being written
    zeroing: bool = False
    #: batches waiting for that chunk (the filler claims no other meanwhile)
    waiters: int = 0
    filler_parked: bool = False
    detached: bool = False

    def reserve(self, end: int) -> None:
        """Make sure bytes up to ``end`` are allocated, so an fdatasync need not grow the
        file: zero-filled by the filler already, or else fallocate, in ``prealloc_size``
        steps. When a whole step does not fit (ENOSPC) exactly ``end`` is asked for: a
        nearly full disk still takes batches until it is really full, rather than
        refusing writes with megabytes free. If that fails too, the error is raised
        (:func:`bookie.fs.is_no_space` tells it)."""
        cond = self.cond
        cond.acquire()  # its lock's own methods (C): ``with cond`` is two Python calls, per batch
        try:
            if end > self.tail:
                self.tail = end
            if end > self.allocated and self.zeroing:  # the chunk in flight starts at allocated
                self.waiters += 1
                try:
                    while self.zeroing:
                        cond.wait()
                finally:
                    self.waiters -= 1
                cond.notify_all()  # the filler parked for us
            if end > self.allocated:
                self._allocate(end)
                if self.filler_parked:
                    cond.notify_all()  # the filler goes on past what was just reserved
            elif self.filler_parked and self.allocated - end < self.zero_low_water:
                cond.notify_all()  # the filler tops up the space ahead
        finally:
            cond.release()

    def _allocate(self, end: int) -> None:
        filling = self.allocated < self.zero_limit and not self.detached  # the filler goes on past this
        step = self.zero_step if filling else self.prealloc_size
        target = -(-end // step) * step
        try:
            self.file.allocate(self.allocated, target - self.allocated)
        except OSError as exc:
            if not is_no_space(exc) or target == end:
                raise
            if not self.tight:
                self.tight = True
                log.warning("journal %s: no room for a %d-byte preallocation step, reserving %d bytes only: %s",
                            self.file.path, target - self.allocated, end - self.allocated, exc)
            self.file.allocate(self.allocated, end - self.allocated)
            target = end
        else:
            self.tight = False
        self.allocated = target


class JournalFiles:
    """Thread-safe: the checkpoint thread retires files while the journal thread opens."""

    def __init__(
        self, fs: FileSystem, directory: str, *, alignment: int, direct_io: bool, prealloc_size: int,
        max_backups: int, recycle_files: int,
    ) -> None:
        self._fs, self.directory = fs, directory
        self._alignment, self._direct_io = alignment, direct_io
        self._prealloc = max(prealloc_size, alignment)
        self._max_backups, self._recycle = max_backups, recycle_files
        self._lock = threading.Lock()

    def next_id(self) -> int:
        """An id above every journal id used in the directory."""
        with self._lock:
            used = list_journals(self._fs, self.directory) + free_journals(self._fs, self.directory)
        return max(used, default=0) + 1

    def open(self, journal_id: int) -> OpenJournal:
        """Start journal ``journal_id`` (durably named, header synced)."""
        a, d = self._alignment, self.directory
        path = f"{d}/{journal_name(journal_id)}"
        with self._lock:
            free = free_journals(self._fs, d)
            previous = free[0] if free else 0
            try:
                if previous:
                    self._fs.rename(f"{d}/{journal_name(previous)}{_FREE}", path)
                f = self._fs.open(path, create=True, direct=self._direct_io)
            except OSError as exc:
                raise NativeIOError(exc.errno or 5, "cannot create journal", path=path) from exc
            # A recycled file also gets its terminator right away: an empty new life must
            # end at a zero block too, not run into the earlier life's frames.
            try:
                self._write_header(f, JournalHeader(journal_id=journal_id, alignment=a, previous_id=previous),
                                   terminated=bool(previous))
            except BaseException:  # e.g. a full disk: leave no file named for this id, whose
                f.close()  # header replay would stumble on; a recycled file is free again
                self._undo(path, f"{d}/{journal_name(previous)}{_FREE}" if previous else None)
                raise
            self._fs.fsync_dir(d)
        allocated = max(a, f.size() // a * a) if previous else a
        log.info("journal %s opened (direct=%s, recycled from %s)", path, f.direct, previous or "-")
        return OpenJournal(f, journal_id, previous, allocated, self._prealloc)

    def retire(self, before: int) -> list[int]:
        """Retire journals with ids below ``before``, keeping ``max_backups`` of them: up
        to ``recycle_files`` become free files, the rest are removed."""
        d = self.directory
        with self._lock:
            old = [i for i in list_journals(self._fs, d) if i < before]
            doomed = old[: max(0, len(old) - self._max_backups)]
            free = len(free_journals(self._fs, d))
            for jid in doomed:
                path = f"{d}/{journal_name(jid)}"
                if free < self._recycle:
                    self._fs.rename(path, path + _FREE)
                    free += 1
                else:
                    self._fs.remove(path)
            if doomed:
                self._fs.fsync_dir(d)
        return doomed

    def _undo(self, path: str, free: str | None) -> None:
        try:
            if free is None:
                self._fs.remove(path)
            else:
                self._fs.rename(path, free)
            self._fs.fsync_dir(self.directory)
        except OSError as exc:
            log.warning("journal %s: could not undo the file whose header failed: %s", path, exc)

    def _write_header(self, f: File, header: JournalHeader, *, terminated: bool) -> None:
        a = self._alignment
        buf = self._fs.alloc_buffer(2 * a if terminated else a)  # zero-filled
        try:
            buf.view[:a] = header.encode()
            f.pwrite(buf.view, 0)
        finally:
            buf.close()
        f.sync()
