"""The journal file being appended to, and where in it the next batch goes: opening
this run's first file, rolling to the next one, the recycled-file terminator and the
zero filler that runs ahead of a new file's tail.

Theory of operation. A batch that leaves the file past ``max_size`` makes the journal
roll to the next id (:meth:`JournalTail.roll`): the next file is opened first, then the
old one closed, so a failed open changes nothing. The next file is a recycled one when
the journal's gc (:meth:`JournalTail.retire`) kept a retired journal free (appends then
overwrite written blocks: no extent conversion at each fdatasync), else a new file whose
space is reserved (fallocate) in steps of ``prealloc_size`` and zero-filled ahead of the
tail (:mod:`bookie.journal._zero`). Frames carry a CRC seeded with the file's id, so a
recycled file's earlier life never reads as this one; each batch written into a recycled
file is followed by a zero block (:attr:`JournalTail.terminator`) that marks where this
life ends (docs/format.md).

Who moves what: :attr:`JournalTail.pos` (the file offset of the next batch, always
aligned) is moved under the journal's producer lock by the thread holding the flush
claim - closing a batch, or putting a refused one back - and reset by a roll, which the
journal thread makes only while no flush is in flight; :attr:`JournalTail.current` and
:attr:`JournalTail.journal_id` change only at a roll. Opening a file restarts the
journal's marks at its first batch (``restart_marks``): everything before is in older
files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from bookie.fs import FileSystem, is_no_space
from bookie.journal._config import JournalConfig, JournalStats
from bookie.journal._files import JournalFiles, OpenJournal
from bookie.journal._mark import LogMark
from bookie.journal._zero import ZeroFiller
from walkit.logs import context

__all__ = ["JournalTail"]

log = logging.getLogger("bookie.journal")


class JournalTail:
    """The file the journal appends to, rolled at ``max_size`` (see the module docstring)."""

    def __init__(self, fs: FileSystem, config: JournalConfig, stats: JournalStats, *,
                 restart_marks: Callable[[LogMark], None]) -> None:
        a = config.alignment
        self._cfg, self._stats, self._restart_marks = config, stats, restart_marks
        self._files = JournalFiles(
            fs, config.directory, alignment=a, direct_io=config.direct_io, prealloc_size=config.prealloc_size,
            max_backups=config.max_backups, recycle_files=config.recycle_files,
        )
        self.current: OpenJournal | None = None
        self._filler = ZeroFiller(fs, config.zero_fill_rate, alignment=a) if config.zero_fill_rate > 0 else None
        self.journal_id = -1
        self.pos = 0  # file offset of the next batch; always aligned
        self._zero_block = fs.alloc_buffer(a)
        #: a zero block written after each batch (recycled files: marks the end of this life)
        self.terminator: memoryview | None = None
        self.direct = False  # the file is written with O_DIRECT

    def open_first(self, min_id: int) -> BaseException | None:
        """Open this run's first file - its id above every existing one, and at least
        ``min_id``. When the disk has no room for it, start without a file and return
        the ENOSPC: records are framed for it as usual; the first batch makes it (a
        :meth:`roll`) - or, while the disk is still full, is refused with the ENOSPC.
        The marks point at where its records will begin: everything before is in older
        files."""
        journal_id = max(self._files.next_id(), min_id)
        try:
            self._open(journal_id)
            return None
        except OSError as exc:
            if not is_no_space(exc):
                raise
            log.warning("journal %d: no room in %s for a new journal file (%s); started without one: writes are"
                        " refused until its disk has room, then the file is made by the first batch", journal_id,
                        self._cfg.directory, exc, extra=context(journal=journal_id, directory=self._cfg.directory))
            self.journal_id = journal_id
            self.pos = self._cfg.alignment
            self._restart_marks(LogMark(journal_id, self.pos))
            return exc

    def start_filler(self) -> None:
        if self._filler is not None:
            self._filler.start()

    def roll(self) -> None:
        """Open the next file, then close this one (if the open fails, nothing changed)."""
        old = self.current
        self._open(self.next_id())
        if old is not None:
            old.file.close()
            self._stats.rolls += 1

    def next_id(self) -> int:
        """The file the next roll opens: this run's first when it has none yet."""
        return self.journal_id if self.current is None else self.journal_id + 1

    def _open(self, journal_id: int) -> None:
        """Open journal ``journal_id`` as the one appended to (the zero filler moves to it:
        no zero write goes to the file before once this returns)."""
        cur = self.current = self._files.open(journal_id)
        if self._filler is not None:
            self._filler.attach(cur, self._cfg.max_size)
        self.direct = cur.file.direct
        self.journal_id = journal_id
        self.pos = self._cfg.alignment
        # In a recycled file the earlier life's bytes follow our tail: each batch is
        # followed by a zero block so that replay can tell where this life ends.
        self.terminator = self._zero_block.view if cur.previous_id else None
        self._restart_marks(LogMark(journal_id, self.pos))

    @property
    def zero_filled(self) -> tuple[int, int]:
        """Bytes of zeros the filler wrote ahead of new files' tails, and its zero writes
        that failed (each ended the filling of one file)."""
        f = self._filler
        return (f.written, f.failures) if f is not None else (0, 0)

    def retire(self, before: int) -> list[int]:
        """Retire journal files below id ``before``, keeping ``max_backups`` of them: up
        to ``recycle_files`` become free files for later rolls, the rest are removed."""
        return self._files.retire(before)

    def close(self) -> None:
        """The journal's threads have stopped: stop the filler, close the file."""
        if self._filler is not None:
            self._filler.stop()
        if self.current is not None:
            self.current.file.close()
            self.current = None
        self._zero_block.close()
