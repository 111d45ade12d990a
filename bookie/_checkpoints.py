"""Checkpoints: ledger storage made durable, and the journal behind it let go.

Theory of operation
-------------------
A checkpoint (every ``flushInterval`` ms, when ``flushEntriesThreshold`` entries wait in
memory, and at start and shutdown) takes the journal's settled mark M, flushes and syncs
ledger storage, writes M into every ledger directory, and deletes journal files behind M
beyond ``journalMaxBackups``. Every record before M is in storage - an entry (and a key
that came with it) was put there before it was journaled, a state record by its
callback, which returned before the journal settled M - so after the flush it is durable
in storage; replaying from M is enough. The mark is written only after the flush
returned, so a crash at any point replays from a mark whose records are all in the
journal or durable in storage. Checkpoints run one at a time (a lock of their own, not
the bookie's: adds never wait for a flush).

Between checkpoints, once the write cache holds ``dbStorage_writeCacheMaxSizeMb``, the
checkpoint thread only *places* it in the entry logs (``LedgerStorage.place``: sorted by
ledger, locations kept in memory until the next checkpoint writes the index): the
cache's size bounds memory without making checkpoints - whose index writes cost per
ledger touched - come more often.

Faults: an I/O error writing the mark (not a full disk) fails the bookie, as a storage
error does - its disk is failing - and from then on, as once the storage failed, the
thread checkpoints nothing more: the mark stays where it is, short of anything not
flushed. A full disk only fails that checkpoint (logged once until one succeeds): the
entries wait in memory and the journal is kept. At start a full ledger disk does not
stop the start (:meth:`Checkpoints.at_start`), at shutdown neither does it stop the
stop (:meth:`Checkpoints.at_shutdown`): the next start replays the journal.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from bookie._config import BookieConfig
from bookie._faults import DiskFaults, where
from bookie.fs import FileSystem, is_no_space
from bookie.journal import Journal, LogMark, write_mark
from bookie.storage import LedgerStorage
from walkit.logs import context
from walkit.metrics import LATENCY_BUCKETS, Histogram

__all__ = ["Checkpoints", "Stores"]

log = logging.getLogger("bookie")


class Stores(Protocol):
    """What a checkpoint flushes and trims (the bookie: BookieShutdownError when not started)."""

    @property
    def storage(self) -> LedgerStorage: ...

    @property
    def journal(self) -> Journal: ...


class Checkpoints:
    """One bookie's checkpoints and the thread that makes them (see the module docstring)."""

    def __init__(self, config: BookieConfig, fs: FileSystem, stores: Stores, faults: DiskFaults) -> None:
        self.config = config
        self.fs = fs
        self._stores = stores
        self._faults = faults
        self._lock = threading.Lock()
        self.count = 0  # checkpoints done, and how long each took (bookie/_metrics.py)
        self.seconds = Histogram(LATENCY_BUCKETS)
        self.placements = 0  # a full write cache placed between checkpoints (the checkpoint thread only)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._running = False
        self._pending = 0
        self._write_cache_bytes = config.write_cache_max_size_mb << 20
        self._no_space = False  # the last checkpoint found a disk full (logged once)
        self.mark_failed = False  # writing lastMark met an I/O error: no more checkpoints

    def checkpoint(self) -> LogMark:
        """Flush storage and advance the LastLogMark; returns the new mark."""
        with self._lock:
            started = time.monotonic()
            journal, storage = self._stores.journal, self._stores.storage
            mark = journal.settled_mark()
            self._pending = 0
            storage.flush()
            self._write_mark(mark)
            journal.gc(mark)
            self.count += 1  # under the checkpoint lock: one writer (walkit.metrics)
            self.seconds.observe(time.monotonic() - started)
            return mark

    def _write_mark(self, mark: LogMark) -> None:
        """Write the mark in every ledger directory; an I/O error there (not a full disk)
        fails the bookie as a storage error does: its disk is failing. A full disk is
        reported (``on_no_space``) as any write that meets one."""
        dirs = list(self.config.ledger_directories)
        try:
            write_mark(self.fs, dirs, mark)
        except OSError as exc:
            if is_no_space(exc):
                self._faults.no_space(where(exc, dirs), exc)
            else:
                self.mark_failed = True
                self._faults.failed(where(exc, dirs), exc)
            raise

    def at_start(self) -> None:
        """The checkpoint at start. A full ledger disk does not stop the start: the
        journal keeps what could not be flushed, the checkpoint loop tries again, and
        the disk was reported full (``on_no_space``: the server starts read-only)."""
        try:
            self.checkpoint()
        except OSError as exc:
            if not is_no_space(exc):
                raise
            self._no_space = True
            log.warning("bookie %s: no space for the checkpoint at start (%s); started anyway: the journal is"
                        " kept until a checkpoint succeeds", self.config.effective_bookie_id, exc,
                        extra=context(bookie=self.config.effective_bookie_id))

    def at_shutdown(self) -> None:
        """The last checkpoint, once the journal completed every add: none after a
        failure (nothing more is flushed), and a full disk does not stop the stop (the
        next start replays the journal)."""
        try:
            if self._stores.journal.failed is None and self._stores.storage.failure is None and not self.mark_failed:
                self.checkpoint()
        except OSError as exc:
            if not is_no_space(exc):
                raise  # the journal keeps what the checkpoint could not flush (replayed at the start)
            log.warning("bookie %s: no space for the last checkpoint; the next start replays the journal: %s",
                        self.config.effective_bookie_id, exc, extra=context(bookie=self.config.effective_bookie_id))

    def count_pending(self, n: int) -> None:
        """``n`` more entries wait in memory: a checkpoint starts early once they are
        ``flushEntriesThreshold`` many; the write cache is placed once it holds
        ``dbStorage_writeCacheMaxSizeMb``."""
        self._pending += n
        if self._pending >= self.config.flush_entries_threshold \
                or self._stores.storage.cached_bytes() >= self._write_cache_bytes:
            self._wake.set()

    # --- the checkpoint thread ---------------------------------------------------------
    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="bookie-checkpoint", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (a checkpoint in progress completes first)."""
        self._running = False
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        interval = self.config.flush_interval / 1000.0
        last = time.monotonic()  # the last checkpoint (or attempt)
        while True:
            self._wake.wait(max(0.0, last + interval - time.monotonic()))
            self._wake.clear()
            if not self._running:
                return
            if self.mark_failed or self._stores.storage.failure is not None:
                last = time.monotonic()
                continue  # a failed storage (or mark) flushes nothing more: the mark stays where it is
            try:
                if self._pending < self.config.flush_entries_threshold and time.monotonic() - last < interval:
                    self._stores.storage.place()  # woken by a full write cache: placed, not checkpointed
                    self.placements += 1
                    continue
                last = time.monotonic()
                self.checkpoint()
                self._no_space = False
            except OSError as exc:
                if not is_no_space(exc):
                    log.exception("checkpoint failed; journals are kept until one succeeds")
                elif not self._no_space:
                    self._no_space = True
                    log.warning("checkpoint: a disk is full (%s); entries wait in memory and the journal is kept"
                                " until a checkpoint succeeds", exc,
                                extra=context(bookie=self.config.effective_bookie_id))
            except Exception:  # noqa: BLE001 - report and retry at the next interval
                log.exception("checkpoint failed; journals are kept until one succeeds")
