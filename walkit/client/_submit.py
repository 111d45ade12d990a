"""The two cross-thread primitives of an add path, made cheap for it.

* :class:`QuickFuture` is a ``concurrent.futures.Future`` (applications,
  ``concurrent.futures.wait`` and ``asyncio.wrap_future`` get one, nothing else) that
  costs next to nothing until somebody waits on it. A writer makes one per ledger add
  and the WriteAheadLog one per record, at rates where the stock future's
  ``threading.Condition`` - made in its constructor, taken by every ``done()``,
  ``result()`` and ``set_result()`` - was most of the work (~2 µs for each of the four
  here). It differs from the stock future in three ways:

  - **No condition until one is needed.** The constructor sets the state and nothing
    else; the result slot stays empty until the result comes. The first caller that must wait (or
    register a callback on an unfinished future, or ``concurrent.futures.wait`` on it)
    makes the condition, once, under a module lock; Future's own code then runs under
    it. ``done()``, ``exception()`` and ``result()`` of a finished future, and
    ``add_done_callback`` on one, read its state without any lock.
  - **It starts RUNNING**: the add or append it stands for is under way the moment the
    future exists and cannot be called back, so ``cancel()`` returns False, as the
    stock future's does for work that has started (the add used to be written anyway
    after a "successful" cancel). Its state therefore moves exactly once, RUNNING to
    FINISHED, by the one completer that owns it (the client's loop thread, or a failing
    submitter for a future it never queued).
  - **A walkit error raises with a traceback of its own.** A failed writer fails every
    pending and later add with one error instance (so does a WriteAheadLog for its
    appends); the stock ``result()`` re-raises that instance, and each raise piles its
    caller's frames onto those of every raise before (a loop that retries grew the
    traceback by a dozen lines a try). ``result()`` raises a :class:`WalkitError` from its
    own frame: its message has the context, its ``__cause__`` is kept. Other exceptions
    (bugs) keep their traceback.

  Why the lock-free reads are safe: the completer stores the result (or exception)
  first and the FINISHED state second, then looks for a condition; under the
  interpreter lock a reader sees either the old state (then it takes the slow path:
  makes the condition, re-checks the state under it, waits) or the final one with the
  result in place. A waiter that made the condition before the completer looked is
  woken under it; one that made it after finds the state final before waiting.
* :class:`Slots` bounds the adds in flight (``max_pending_adds``) with a counter under
  the writer's submission lock, which ``submit`` holds anyway: taking a slot costs an
  integer test, and the client loop frees a batch of slots in one acquisition. A
  condition on the same lock is waited on only when no slot is free. It offers what
  ``threading.BoundedSemaphore`` offered its callers (``acquire(blocking)``,
  ``release()``, ValueError on a release past the limit), in a fraction of the time
  (that one is pure Python in 3.11: ~5 µs per acquire and release here). The condition
  is made by the first wait: a client writing 10,000 ledgers that never fill their slots
  keeps no condition (five objects the cyclic GC walks) for each. The client's loop gives
  completed adds' slots back without the lock (:meth:`Slots.give_back`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, RUNNING
from typing import Any, TypeVar

from walkit.errors import WalkitError

__all__ = ["QuickFuture", "Slots"]

T = TypeVar("T")
_DONE = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED))
_MAKING = threading.Lock()  # makes conditions; held for a few attribute stores
log = logging.getLogger("concurrent.futures")  # where Future logs a failing callback


class QuickFuture(Future[T]):
    """A future that is cheap to make, complete and read. See the module docstring."""

    # Slots, not the instance dict Future's instances carry: one object per future for the
    # cyclic GC rather than two, which at 10^5 futures a second is most of what GC costs.
    __slots__ = ("_state", "_result", "_exception", "_cv", "_waiters", "_done_callbacks")

    def __init__(self) -> None:  # no condition, no lists: see _condition
        self._state = RUNNING
        self._exception = None
        self._cv: threading.Condition | None = None

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        """The stock future's condition, made by the first caller that needs it."""
        cv = self._cv
        if cv is None:
            with _MAKING:
                cv = self._cv
                if cv is None:
                    self._waiters: list[Any] = []  # before the condition: whoever sees it sees these
                    self._done_callbacks: list[Callable[[Future[T]], object]] = []
                    cv = self._cv = threading.Condition()
        return cv

    def done(self) -> bool:
        return self._state in _DONE

    def cancel(self) -> bool:
        """False: the work is under way (see the module docstring)."""
        return False

    def result(self, timeout: float | None = None) -> T:
        if self._state == FINISHED and self._exception is None:
            return self._result  # type: ignore[return-value]
        try:
            return super().result(timeout)
        except WalkitError as exc:
            # One error instance fails every add of a failed writer (and a log's every later
            # append): re-raised as it is, each raise would pile this caller's frames onto
            # those of every raise before. The message carries the context; start afresh.
            raise exc.with_traceback(None)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def add_done_callback(self, fn: Callable[[Future[T]], object]) -> None:
        if self._state != FINISHED:
            super().add_done_callback(fn)
            return
        try:
            fn(self)
        except Exception:
            log.exception("exception calling callback for %r", self)

    def set_result(self, result: T) -> None:
        if self._state != RUNNING:
            Future.set_result(self, result)  # raises InvalidStateError, as the stock one does
        self._result = result  # what set_results does for each of its futures
        self._state = FINISHED
        if self._cv is not None:
            self._wake(True)

    @staticmethod
    def set_results(futures: Iterable[QuickFuture[T]], results: Iterable[T]) -> None:
        """``set_result`` of each future with its result, pairwise: the completer of a
        batch (a WriteAheadLog entry's records) calls this once rather than once a record."""
        for fut, result in zip(futures, results):
            if fut._state != RUNNING:
                Future.set_result(fut, result)  # raises InvalidStateError, as the stock one does
            fut._result = result
            fut._state = FINISHED
            if fut._cv is not None:
                fut._wake(True)

    def set_exception(self, exception: BaseException | None) -> None:
        if self._state != RUNNING:
            super().set_exception(exception)
            return
        self._exception = exception
        self._state = FINISHED
        if self._cv is not None:
            self._wake(False)

    def _wake(self, ok: bool) -> None:
        """Tell whoever made the condition: waiters, ``wait()``'s waiters, callbacks."""
        with self._condition:
            for waiter in self._waiters:
                if ok:
                    waiter.add_result(self)
                else:
                    waiter.add_exception(self)
            self._condition.notify_all()
        self._invoke_callbacks()  # type: ignore[attr-defined]  # Future's own (not in its stubs)


class Slots:
    """``limit`` slots counted under ``lock`` (the writer's submission lock); the client's
    loop gives completed adds' slots back without it (:meth:`give_back`)."""

    # slots, not an instance dict: a pass over a thousand writers reads each one's state in fewer places
    __slots__ = ("limit", "free", "_lock", "_freed", "_waiting", "returned", "_folded")

    def __init__(self, limit: int, lock: threading.Lock) -> None:
        self.limit = limit
        self.free = limit  # read and written only under the lock
        self._lock = lock
        self._freed: threading.Condition | None = None  # made by the first wait (a writer of many that never waits makes none)
        self._waiting = 0
        self.returned = 0  # slots given back by give_back, ever (written by the loop's thread only)
        self._folded = 0  # how many of those are in ``free`` (under the lock)

    def acquire(self, blocking: bool = True) -> bool:
        """Take a slot, waiting for one if ``blocking``; False when none is free (not blocking)."""
        with self._lock:
            return self.take_locked(blocking)

    def release(self, n: int = 1) -> None:
        """Give back ``n`` slots (ValueError past the limit, as BoundedSemaphore raises)."""
        with self._lock:
            self.release_locked(n)

    def give_back(self, n: int) -> None:
        """(The thread running the client's loop only) give back the slots of ``n`` adds
        just completed, without the lock when no thread waits for a slot. A client
        writing round-robin over a thousand ledgers completes an add per writer at a
        time, and the lock it took here was the one the application's thread was taking
        for that writer's next add (it refills the window with the writer whose add just
        completed): the two threads met on it, each meeting a hand-over of the
        interpreter lock. The count goes to :attr:`returned`, which only this thread
        writes; a taker adds what is new in it to ``free`` under the lock (``_fold``)
        when ``free`` runs out. No wake-up is lost: a taker counts itself in
        ``_waiting`` before it folds for the last time and waits; this looks at
        ``_waiting`` after counting, so either the taker's fold sees the count or this
        sees the taker, and then notifies it under the lock (which the taker gives up
        only by waiting). No ValueError here: completions give back what their adds took."""
        self.returned += n
        if self._waiting:
            with self._lock:
                assert self._freed is not None  # made by the waiter before it counted itself
                self._freed.notify(n)

    def _fold(self) -> None:
        """(Lock held) the slots given back by :meth:`give_back` since the last fold go to ``free``."""
        returned = self.returned
        self.free += returned - self._folded
        self._folded = returned

    def take_locked(self, blocking: bool) -> bool:
        """:meth:`acquire` for a caller holding the lock (a wait releases it meanwhile)."""
        if self.free <= 0:
            self._fold()
        if self.free > 0:
            self.free -= 1
            return True
        if not blocking:
            return False
        freed = self._freed
        if freed is None:
            freed = self._freed = threading.Condition(self._lock)
        self._waiting += 1  # before the last fold: see give_back
        try:
            self._fold()
            while self.free <= 0:
                freed.wait()
                self._fold()
        finally:
            self._waiting -= 1
        self.free -= 1
        return True

    def release_locked(self, n: int = 1) -> None:
        """:meth:`release` for a caller holding the lock."""
        self._fold()
        if self.free + n > self.limit:
            raise ValueError(f"slots released too many times (limit={self.limit})")
        self.free += n
        if self._waiting:
            assert self._freed is not None  # made by the waiter, under this lock
            self._freed.notify(n)
