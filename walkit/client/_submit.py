"""The two cross-thread primitives of a writer's add path, made cheap for it.

* :class:`AddFuture` is a ``concurrent.futures.Future`` (applications and
  ``asyncio.wrap_future`` get one, nothing else): ``done()`` and the ``result()`` of a
  future that finished with a result read its state without taking its condition.
  Safe because a future's state only ever moves once, to a final value, and the writer
  of that move stores the result (or exception) first: under the interpreter lock one
  attribute read sees either the old state (then Future's own code runs, under its
  condition) or the final one with the result already in place. Everything else -
  completing, cancelling, callbacks, waiting, ``concurrent.futures.wait`` - is
  Future's own code. The producer of a pipelined writer calls both once per add, and
  the stock ones take the condition each time (~2 µs each here).
* :class:`Slots` bounds the adds in flight (``max_pending_adds``) with a counter under
  the writer's submission lock, which ``submit`` holds anyway: taking a slot costs an
  integer test, and the client loop frees a batch of slots in one acquisition. A
  condition on the same lock is waited on only when no slot is free. It offers what
  ``threading.BoundedSemaphore`` offered its callers (``acquire(blocking)``,
  ``release()``, ValueError on a release past the limit), in a fraction of the time
  (that one is pure Python in 3.11: ~5 µs per acquire and release here).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED

__all__ = ["AddFuture", "Slots"]

_DONE = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED))


class AddFuture(Future[int]):
    """The future of one add (its entry id). See the module docstring."""

    def done(self) -> bool:
        return self._state in _DONE

    def result(self, timeout: float | None = None) -> int:
        if self._state == FINISHED and self._exception is None:
            result = self._result
            assert result is not None  # an add's result is its entry id
            return result
        return super().result(timeout)


class Slots:
    """``limit`` slots counted under ``lock`` (the writer's submission lock)."""

    def __init__(self, limit: int, lock: threading.Lock) -> None:
        self.limit = limit
        self.free = limit  # read and written only under the lock
        self._lock = lock
        self._freed = threading.Condition(lock)
        self._waiting = 0

    def acquire(self, blocking: bool = True) -> bool:
        """Take a slot, waiting for one if ``blocking``; False when none is free (not blocking)."""
        with self._lock:
            return self.take_locked(blocking)

    def release(self, n: int = 1) -> None:
        """Give back ``n`` slots (ValueError past the limit, as BoundedSemaphore raises)."""
        with self._lock:
            self.release_locked(n)

    def take_locked(self, blocking: bool) -> bool:
        """:meth:`acquire` for a caller holding the lock (a wait releases it meanwhile)."""
        if self.free > 0:
            self.free -= 1
            return True
        if not blocking:
            return False
        self._waiting += 1
        try:
            while self.free <= 0:
                self._freed.wait()
        finally:
            self._waiting -= 1
        self.free -= 1
        return True

    def release_locked(self, n: int = 1) -> None:
        """:meth:`release` for a caller holding the lock."""
        if self.free + n > self.limit:
            raise ValueError(f"slots released too many times (limit={self.limit})")
        self.free += n
        if self._waiting:
            self._freed.notify(n)
