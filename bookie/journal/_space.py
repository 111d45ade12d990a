"""A full journal disk: reserving a batch's space before it is written, and refusing
what the disk has no room for - without killing the journal.

Theory of operation. A full disk is not an I/O error. Before a batch is written its
space is reserved (``fallocate``, :meth:`bookie.journal._files.OpenJournal.reserve`),
and when even the batch's own size does not fit the batch is refused: its records fail
with the ENOSPC, nothing of it reaches the file, the next batch is written where it
would have gone, and ``on_no_space`` is told (the bookie turns read-only). A batch that
was to end the file is refused the same way, with the records framed after it (they
carry the next file's seed), and framing goes back to this file's seed. The journal goes
on, so once space is freed the bookie can be writable again without a restart. The same
holds at a roll (:meth:`SpaceGuard.roll_or_refuse`): when the next file cannot be made,
the records framed for it are refused and the next batch tries the roll again - and at
the journal's start, when the disk has no room for this run's first file: the journal
starts without one and the first batch makes the file, or is refused while there is no
room for it. Replay needs no new space, so a bookie with a full journal disk still
starts (read-only) and serves what it holds.

Why a refusal is safe: the refused batch's space was never written (the reservation
failed before the ``pwritev``), the thread refusing it is the one that closed it - a
claimant in :class:`~bookie.journal._claim.FlushClaim`'s sense, so nobody else closes a
batch meanwhile (and when the batch was to end the file, the file looks full to the
inline and sync-thread flushes) - and putting the file position back happens under the producer lock, where it
was moved. Any error that is not ENOSPC fails the batch's records and is raised: it
kills the journal.

The guard sees of the journal exactly what a refusal takes back: the producer lock, the
batch being built (:class:`~bookie.journal._batch.OpenBatch`), the file position
(:class:`~bookie.journal._tail.JournalTail`), and ``fail`` for an error that is not
ENOSPC met off the journal thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from bookie.fs import is_no_space
from bookie.journal._batch import Batch, Callback, OpenBatch, call_back
from bookie.journal._config import JournalConfig, JournalStats
from bookie.journal._format import frame_seed
from bookie.journal._tail import JournalTail
from walkit.logs import context

__all__ = ["SpaceGuard"]

log = logging.getLogger("bookie.journal")

_Callbacks = list[tuple[Callback, Any]]


class SpaceGuard:
    """Reserves each batch's space; refuses, rather than fails, what does not fit."""

    def __init__(
        self, config: JournalConfig, stats: JournalStats, *, lock: threading.Lock, building: OpenBatch,
        tail: JournalTail, fail: Callable[[BaseException], None],
    ) -> None:
        self._cfg, self._stats = config, stats
        self._lock, self._building, self._tail, self._fail = lock, building, tail, fail
        #: ``on_no_space(error)``: a batch was refused because the disk is full (the
        #: journal lives on; the bookie turns read-only until there is room).
        self.on_no_space: Callable[[BaseException], None] | None = None

    def reserve(self, batch: Batch) -> bool:
        """Make room in the file for ``batch`` (and its terminator). False when the disk
        is full (:func:`~bookie.fs.is_no_space`): the batch is refused - nothing of it
        was written, its records fail with the ENOSPC, the next batch takes its place
        in the file - and the journal lives on. Any other error fails the batch's
        records and is raised (it kills the journal)."""
        end = batch.offset + batch.length + (len(batch.terminator) if batch.terminator is not None else 0)
        try:
            batch.target.reserve(end)
            return True
        except BaseException as exc:  # these records left the batch: fail them here
            if is_no_space(exc):
                self._refuse(batch, exc)
                return False
            call_back(batch.records, exc)
            raise

    def reserve_or_fail(self, batch: Batch) -> bool | None:
        """:meth:`reserve` off the journal thread (a kick, the sync thread), where an
        error must not escape: True when reserved, False when refused for lack of space,
        None when any other failure killed the journal (``fail``)."""
        try:
            return self.reserve(batch)
        except BaseException as exc:  # noqa: BLE001 - any failure kills the journal
            log.error("journal %d: reserving space for %d records failed: %s", batch.journal_id,
                      len(batch.records), exc, extra=context(journal=batch.journal_id))
            self._fail(exc)
            return None

    def _refuse(self, batch: Batch, exc: BaseException) -> None:
        """Drop a batch the disk has no room for (see :meth:`reserve`): the next batch
        goes where it would have gone. When it was to end the file, the records framed
        since carry the next file's seed: they are refused with it, and framing goes on
        with this file's seed (nobody else closes a batch meanwhile: the file looks full
        to the inline and sync-thread flushes)."""
        later: _Callbacks = []
        with self._lock:
            self._tail.pos = batch.offset  # only the thread that closed a batch moves it
            self._building.pool.put_segments(batch.segments)
            if batch.offset + batch.length >= self._cfg.max_size:
                later = self._building.drop()
                self._building.frames.seed = frame_seed(batch.journal_id)
        self._refused(batch.records + later, exc, f"{batch.length} bytes at offset {batch.offset}")

    def roll_or_refuse(self) -> bool:
        """Roll to the next file (the sync thread idle), or make the first one when the
        journal started without it. When the disk has no room for it, the records framed
        for that file are refused (ENOSPC, as in :meth:`reserve`) and False is returned:
        the journal stays where it was, and the next batch tries again. Any other error
        is raised (it kills the journal)."""
        try:
            self._tail.roll()
            return True
        except BaseException as exc:
            if not is_no_space(exc):
                raise
            with self._lock:
                records = self._building.drop()
            self._refused(records, exc, f"no room for journal {self._tail.next_id()}")
            return False

    def _refused(self, records: _Callbacks, exc: BaseException, what: str) -> None:
        """Records the disk had no room for fail with its ENOSPC; the bookie is told."""
        self._stats.no_space += 1
        journal_id = self._tail.journal_id
        log.warning("journal %d: no space for %d records (%s), refused: %s", journal_id, len(records), what,
                    exc, extra=context(journal=journal_id, directory=self._cfg.directory))
        call_back(records, exc)
        if self.on_no_space is not None:
            self.on_no_space(exc)
