"""The flush claim: the one place that says who may close and write a journal batch.

Theory of operation. A journal flush is: close the batch being built, reserve its space,
write it with one ``pwritev`` and one fdatasync, run its callbacks. Three parties may do
it - the journal thread (handing the batch to the sync thread), the sync thread itself
(between two of its flushes) and a kicking caller (:meth:`Journal.kick`, on its own
thread or handing to the sync thread) - and :class:`FlushClaim` makes sure they never
overlap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from bookie.journal._batch import Batch

__all__ = ["FlushClaim"]


class FlushClaim:
    """Who holds the journal's one flush, and the hand-off of a batch to the sync thread.

    **Only one flush is ever in flight.** A batch is closed either by the journal thread
    while the sync thread is idle, or by the sync thread itself between two of its
    flushes, or by a kicking caller that found the journal thread parked and the sync
    thread idle - never two of them. A kick takes the flush with :meth:`claim` (under
    the journal's producer lock) before it closes a batch; the sync thread closes one only
    while it holds the claim; the journal thread closes one only after :meth:`wait_idle`
    found the claim free, while it is awake (so no kick claims) and the sync thread idle
    (so it takes nothing), and takes the claim with :meth:`hand_over`. The claim is kept
    until the flush's callbacks returned (:meth:`release`). So every batch, and its
    FLUSH_START frame, is written after the previous batch's fdatasync returned, and the
    journal's roll (which waits in :meth:`wait_idle`) never changes the file under a
    flush.

    Lock order: the journal's producer lock, then this claim's lock (a kick claims with
    the producer lock held); nobody nests them the other way. Two conditions on the one
    lock, so that each wake-up reaches only the thread that waits for it: the sync thread
    waits on ``_handed`` for a batch (or the stop); the journal thread waits on ``_idle``
    for the flush in flight to end. An inline flush (a kick) then wakes nobody when
    nobody waits - not the idle sync thread at every add.
    """

    def __init__(self) -> None:
        # ``with`` on a Condition is two Python calls (its __enter__ and __exit__), on the
        # lock itself none: claim and release, once per flush, take the lock directly
        self._lock = lock = threading.Lock()
        self._handed = threading.Condition(lock)  # the sync thread waits here for a batch
        self._idle = threading.Condition(lock)  # the journal thread waits here for the flush to end
        self._idle_waiters = 0  # threads in wait_idle: release wakes them, and nobody else
        self._handoff: Batch | None = None
        self._busy = False  # a flush is claimed: in flight, or about to be
        self._stop = False

    @property
    def busy(self) -> bool:
        """A flush is claimed: in flight, or about to be."""
        return self._busy

    def claim(self) -> bool:
        """Take the flush if nobody holds it (a kick; the journal's producer lock held)."""
        with self._lock:
            if self._busy:
                return False
            self._busy = True  # the flush is ours: the journal thread waits for it
            return True

    def hand_over(self, batch: Batch) -> None:
        """Give ``batch`` to the sync thread, which writes it and then releases the claim
        (taken here by the journal thread, or already held by a kick)."""
        with self._handed:
            self._handoff = batch
            self._busy = True
            self._handed.notify_all()

    def release(self) -> None:
        """The flush is over (its callbacks returned): wake whoever waits for it (an
        inline flush, with nobody waiting, notifies nobody: no Python-level
        ``notify_all`` per lone add)."""
        with self._lock:
            self._handoff = None
            self._busy = False
            if self._idle_waiters:
                self._idle.notify_all()

    def wait_idle(self, dead: Callable[[], bool]) -> bool:
        """Wait until no flush is in flight (or ``dead()``); True when one was."""
        waited = False
        with self._lock:
            while self._busy and not dead():
                waited = True
                self._idle_waiters += 1
                try:
                    self._idle.wait()
                finally:
                    self._idle_waiters -= 1
        return waited

    def next_batch(self) -> Batch | None:
        """The sync thread: wait for a hand-off; None once stopped with none pending.
        Busy without a hand-off: a kicking caller flushes on its own thread."""
        with self._handed:
            while self._handoff is None and not self._stop:
                self._handed.wait()
            return self._handoff

    def stop(self) -> None:
        """The journal thread ended: the sync thread stops once idle; wake every waiter."""
        with self._handed:
            self._stop = True
            self._handed.notify_all()
            self._idle.notify_all()
