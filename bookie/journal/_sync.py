"""The journal's sync thread: one batch at a time, one aligned ``pwritev`` and one
``fdatasync``, then the batch's callbacks.

Theory of operation. :class:`SyncThread` writes a batch with one ``pwritev`` at an
aligned offset (O_DIRECT where allowed) and one ``fdatasync`` - a single call,
:meth:`bookie.fs.File.pwritev_sync`, so the native backend releases the GIL once for
both - then moves the durable mark, runs the batch's callbacks in submission order,
moves the settled mark and calls the flush listeners. Callbacks must be quick; they may
submit new records (appending never blocks: a batch larger than its buffer gets a larger
buffer). Its thread (:meth:`SyncThread.run`) waits for a batch handed over through the
:class:`~bookie.journal._claim.FlushClaim`; a kicking caller holding the claim uses
:meth:`SyncThread.write` on its own thread instead. Either way the writer holds the
claim, so only one batch is written at a time.

Under load the thread **takes the next batch itself**: after a flush it asks the journal
(``take_next``: the same policy the journal thread asks) whether the batch being built
must go now, and if so writes it without handing control back - no thread switch per
batch (in CPython each one can wait a GIL switch interval, 5 ms). It goes idle -
releasing the claim, which wakes the journal thread - when there is nothing to take.

Durability: a callback receives ``None`` only after the fdatasync that covers its frame
returned (or, with ``sync_data=False``, after the write). :attr:`SyncThread.durable`
moves as soon as a batch is durable (before its callbacks: whoever hears of a record
finds the mark past it); :attr:`SyncThread.settled` only after its callbacks returned -
what a checkpoint takes, since a callback may apply the record's state. A failed write
or fdatasync kills the journal (``fail``) and fails the batch's callbacks; it is never
retried: the kernel may have dropped the pages it failed to write, and a second
fdatasync would succeed without them ("fsyncgate"); only a restart, which replays what
is really on disk, knows what is durable.

The journal is seen through three callables, exactly what the thread needs of it:
``take_next`` (close the next batch if the policy says so), ``recycle`` (give a written
batch's buffers back, under the producer lock) and ``fail``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from bookie.journal._batch import Batch, call_back
from bookie.journal._claim import FlushClaim
from bookie.journal._config import JournalConfig, JournalStats
from bookie.journal._mark import LogMark
from walkit.logs import context

__all__ = ["SyncThread"]

log = logging.getLogger("bookie.journal")


class SyncThread:
    """Writes, syncs and acknowledges the journal's batches (see the module docstring)."""

    def __init__(
        self, config: JournalConfig, stats: JournalStats, claim: FlushClaim, clock: Callable[[], float], *,
        take_next: Callable[[], tuple[Batch | None, bool]], recycle: Callable[[Batch], None],
        fail: Callable[[BaseException], None],
    ) -> None:
        self._cfg, self._stats, self._claim, self._clock = config, stats, claim, clock
        self._take_next, self._recycle, self._fail = take_next, recycle, fail
        self.durable = LogMark(-1, 0)  # the end of the durable part of the journal
        self.settled = LogMark(-1, 0)  # the durable mark, once the callbacks before it returned
        self.last_sync = 0.0  # seconds the last write + sync took (a kick reads it)
        #: Test hook (walkit.testing's slow_disk): seconds slept before writing and
        #: syncing each batch, as a slow disk would take; 0 in production.
        self.delay = 0.0
        #: Called after each batch's callbacks, with the new durable mark.
        self.listeners: list[Callable[[LogMark], None]] = []

    def restart_at(self, mark: LogMark) -> None:
        """A new file was opened (no flush in flight): both marks point at its start."""
        self.durable = self.settled = mark

    def run(self) -> None:
        """The thread: write each batch handed over, and the ones it takes itself after
        it, then release the claim; end when the journal thread stopped it, or died."""
        while True:
            batch = self._claim.next_batch()
            if batch is None:
                return
            failed = False
            while batch is not None and not failed:
                failed = self.write(batch)
                if not failed:  # busy all along: nobody else can take a batch now
                    batch, failed = self._take_next()
            self._claim.release()
            if failed:
                return

    def write(self, b: Batch) -> bool:
        """Write, sync and acknowledge one batch; True when the journal died doing it."""
        f = b.target.file
        if self.delay > 0:
            time.sleep(self.delay)
        started = time.monotonic()
        queued_for = self._clock() - b.oldest if b.oldest is not None else 0.0
        try:
            segments = b.segments
            if len(segments) == 1:  # the usual batch: no list comprehension's call
                buf, n = segments[0]
                views = [buf.view[:n]]
            else:
                views = [buf.view[:n] for buf, n in segments]
            if b.terminator is not None:
                views.append(b.terminator)
            if self._cfg.sync_data:  # one call: one GIL release for write + fdatasync
                f.pwritev_sync(views, b.offset)
            else:
                f.pwritev(views, b.offset)
        except BaseException as exc:  # noqa: BLE001 - any failure kills the journal
            log.error("journal %d: write of %d records failed: %s", b.journal_id, len(b.records), exc,
                      extra=context(journal=b.journal_id))
            self._fail(exc)
            call_back(b.records, exc)
            return True
        took = self.last_sync = time.monotonic() - started
        self.durable = LogMark(b.journal_id, b.offset + b.length)
        self._count(b, took, queued_for)
        self._recycle(b)
        call_back(b.records, None)
        self.settled = self.durable  # only the claim's holder moves it now (a roll waits for it)
        for listener in self.listeners:
            listener(self.durable)
        return False

    def _count(self, b: Batch, took: float, queued_for: float) -> None:
        st = self._stats
        st.flushes += 1
        st.records += b.count
        st.bytes_written += b.length
        reason = b.reason.value  # an enum's value: two Python calls, once
        st.reasons[reason] = st.reasons.get(reason, 0) + 1
        st.sync_seconds.observe(took)
        st.queue_wait_seconds.observe(max(0.0, queued_for))
        st.records_per_flush.observe(b.count)
        st.bytes_per_flush.observe(b.length)
        if took > self._cfg.sync_warn:
            st.slow_syncs += 1
            log.warning("journal %d: write+sync of %d records (%d bytes) took %.0f ms (journalSyncWarnMillis: %.0f)",
                        b.journal_id, b.count, b.length, took * 1000, self._cfg.sync_warn * 1000,
                        extra=context(journal=b.journal_id, directory=self._cfg.directory))
