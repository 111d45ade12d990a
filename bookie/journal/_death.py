"""How the journal dies: the first I/O error kills it, once, and nothing later is taken.

Theory of operation
-------------------
Any I/O error kills the journal, whichever thread meets it: the journal thread (a roll,
a write it made itself), the sync thread or an inline flush (a write or an fdatasync
that failed), the space guard (an error that is not ENOSPC). :class:`JournalDeath` keeps
the first such error (:attr:`JournalDeath.error`; later ones are the same death's
echoes) and tells ``on_failure`` once, on the thread that met it, after the producer
lock is released. From then on:

- the batch being built fails its callbacks (:meth:`JournalDeath.die`, on the journal
  thread as it exits; the batch in flight is failed by whoever was writing it), and
  every later submission is refused with :meth:`JournalDeath.refusal`, a
  :class:`~walkit.errors.BookieShutdownError` naming the cause - exactly once each;
- :meth:`JournalDeath.fail` (any other thread) wakes the journal thread, which sees the
  error and exits the same way.

It is never retried: after a failed fdatasync the kernel may have dropped the dirty
pages, so a later sync that succeeds would prove nothing ("fsyncgate"). The journal reads
:attr:`JournalDeath.error` on its hot paths under its producer lock; it is written only
here, under that lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from bookie.journal._batch import OpenBatch, call_back
from walkit.errors import BookieShutdownError
from walkit.logs import context

__all__ = ["JournalDeath"]

log = logging.getLogger("bookie.journal")


class JournalDeath:
    """The journal's death (module docstring): its error, its listener, and the two ways
    of dying."""

    __slots__ = ("error", "on_failure", "_directory", "_lock", "_cond", "_building", "_journal_id")

    def __init__(self, directory: str, *, lock: threading.Lock, cond: threading.Condition, building: OpenBatch,
                 journal_id: Callable[[], int]) -> None:
        self.error: BaseException | None = None  # the first I/O error (under the producer lock)
        #: ``on_failure(error)``: called once, on the thread that met it, when an I/O
        #: error killed the journal (the bookie turns read-only for good).
        self.on_failure: Callable[[BaseException], None] | None = None
        self._directory = directory
        self._lock, self._cond, self._building = lock, cond, building
        self._journal_id = journal_id  # the current file's id, for the messages

    def refusal(self) -> BaseException:
        """What a submission to a dead - or shut down - journal is refused with."""
        if self.error is not None:
            return BookieShutdownError("journal failed", journal=self._journal_id(), cause=self.error)
        return BookieShutdownError("journal is shut down", journal=self._journal_id())

    def die(self, exc: BaseException) -> None:
        """(Journal thread) fail the batch being built and refuse everything later
        (exactly once each)."""
        building = self._building
        with self._lock:
            first = self.error is None
            if first:
                journal_id = self._journal_id()
                log.error("journal %d in %s failed: %s", journal_id, self._directory, exc,
                          extra=context(journal=journal_id, directory=self._directory))
                self.error = exc
            records, building.records = building.records, []
            building.entries, building.oldest = 0, None
        call_back(records, exc)
        if first:
            self._report(exc)

    def fail(self, exc: BaseException) -> None:
        """An I/O error off the journal thread: the journal is dead; wake its thread."""
        with self._lock:
            first = self.error is None
            self.error = self.error or exc
            self._cond.notify()
        if first:
            self._report(exc)

    def _report(self, exc: BaseException) -> None:
        if self.on_failure is not None:
            try:
                self.on_failure(exc)
            except Exception:  # noqa: BLE001 - the journal is dead either way
                log.exception("journal %d: failure listener raised", self._journal_id())
