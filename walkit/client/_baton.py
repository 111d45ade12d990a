"""The baton: a lone synchronous caller runs the client's loop itself (issue 38).

Theory of operation
-------------------
The client's state lives on one asyncio loop (:class:`~walkit.client._loop.LoopThread`).
Handed over to that loop's thread, one synchronous append cost four thread wake-ups: the
self-pipe write that wakes the loop, the loop's epoll wake-ups for the answers, and the
futex wake of the caller when its future completes - most of an append's client CPU,
kernel time. The baton removes them for a *lone* caller (one synchronous ``append`` or
``add_entry`` with nothing else of the client in flight): that caller runs the loop's
iterations on its own thread (``BaseEventLoop._run_once``, a private method of the
standard library's selector loop; with any other loop - uvloop - there is no baton and
every call is handed over as before) until its future is done, sending its add and
reading the bookies' answers itself. Nothing else is woken.

**Who may run the loop when.** Exactly one thread runs the loop at any instant; the
baton says which (:attr:`Baton.state`, under :attr:`Baton._lock`, :attr:`Baton._cond`'s lock):

* ``LOOP`` - the loop thread, as always (running callbacks or waiting in epoll);
* ``PARKED`` - nobody: the loop thread waits on :attr:`_cond`, outside epoll, and the
  next lone caller takes the baton without waking anyone;
* ``HELD`` - a lone caller, :attr:`driver`, runs the loop; the loop thread stays parked.

**How the loop thread parks.** Only at the top of an iteration, inside the selector's
``select`` (wrapped: :meth:`_selecting`), where no callback is half run and everything
``_run_once`` does next it reads afresh; after a park it polls without blocking. It parks
when a lone caller asked for it (found the loop thread in charge: that add was handed
over as before, :attr:`_want`), that caller's future is done, nothing is ready to run,
and the client says it is quiet (no add pending on any writer, no ensemble change, no
connection being made, no coroutine of another thread's still running, no replay or
tail handed out: the ``quiet`` predicate of ``LoopThread`` and the client core). So a parked loop
owes nobody an answer - except the late answers of adds already complete (a third
bookie's), which the next drive reads.

**How the loop thread takes over again.** Any thread other than the one running the loop
that hands it work (``call_soon_threadsafe``: another application thread's append, the
asyncio API, a read, a metadata call finishing, ``LoopThread.stop``) goes through the
loop's self-pipe write, which is wrapped (:meth:`_written`): while ``PARKED`` it gives the
baton back to the loop thread and wakes it; while ``HELD`` it asks the driver to hand over
(:attr:`_handover`, set before the byte is written, so the driver's epoll wakes and sees
it) - the driver then gives the baton to the loop thread, wakes it, and waits for its own
future as any caller does. A second caller arriving while one drives is such a thread:
from then on work goes to the loop thread as before. The loop thread also takes the
baton back by itself when nobody has driven for :attr:`slice` seconds (:data:`PARK_SLICE`),
the bound on how late a parked loop notices what came from a socket meanwhile (a
connection lost, a read's answer on a client that also appends alone), and when a live
timer of the loop is due while nobody drives. A driver parks the baton without waking
anyone, so while drives leave a live timer due within a slice behind them (a writer's
idle LAC waiting to see whether the next append carries it, walkit/client/_writer_lac.py),
the loop thread looks every :attr:`tick` (:data:`PARK_TICK`, 1 ms) rather than every
slice - a wake-up of its own, nobody else's: such a timer runs at most that late (a
slice late when the first drive to leave one is still under way), and one that the next
drive cancelled (the next append carried that LAC) takes nothing back. Drives that leave
no near timer (a plain ledger's adds: the only timer is the add-timeout sweep, seconds
away) cost the loop thread no wake-up but the slice's.

**A driver's iterations** run with the loop as the thread's running loop and the loop's
async-generator hooks (both restored after). Callbacks already ready run without the
``select(0)`` an iteration starts with (a few passes in a row, then a whole iteration:
timers, epoll), so an add's hops cost no epoll call each. It stops driving once its
future is done and nothing is ready to run (what its add's completion queued - a
flush - goes out before it returns), then parks the baton (no wake-up). A timer its add
armed (the writer's idle LAC, after its short wait) is the parked loop thread's to run,
unless the next append cancels it first (walkit/client/_writer_lac.py): cancelled timers
never take the baton back.

**Interplay with stop and close.** ``LoopThread.stop`` hands the loop a coroutine from
another thread: the driver hands over and the loop thread cancels what runs, failing the
adds in flight (the waiting caller gets the client's "closed" error); a loop stopped is
never parked again (:attr:`closed`) and a later caller is refused as before.

**KeyboardInterrupt.** A driver on the main thread may get SIGINT while it runs the loop.
Raised inside a callback, it would leave the client half updated (an answer read and not
counted, a future never completed), so while the main thread drives, SIGINT's handler is
one that raises (calls the application's handler) only when the signal came while the
loop waited in ``select`` - where nothing is consumed yet - and otherwise holds the
signal until the iteration ends, then gives the baton to the loop thread and calls the
handler. Either way the add goes on on the loop thread; the caller gets the
KeyboardInterrupt; the client keeps working for other threads. The baton's own lock is
taken with the C lock's ``with`` (no Python frame in which a KeyboardInterrupt could land
between taking and giving it back), never with the Condition's.

Counters for tests (not timings): :attr:`loop_iterations` (iterations the loop thread
ran) and :attr:`pokes` (self-pipe writes from threads other than the one running the
loop): a lone append changes neither.
"""

from __future__ import annotations

import asyncio
import heapq
import signal
import sys
import threading
import time
from asyncio import events
from collections.abc import Callable
from concurrent.futures import Future
from types import CodeType, FrameType
from typing import Any, TypeVar, cast

__all__ = ["Baton", "PARK_SLICE", "PARK_TICK", "can_hold"]

T = TypeVar("T")

LOOP, PARKED, HELD = "loop", "parked", "held"
#: How long the loop thread stays parked without a drive before it runs the loop again
#: (and how often it wakes to look while a caller drives).
PARK_SLICE = 0.02
#: How often the parked loop thread looks for a timer due (a drive may have armed one).
PARK_TICK = 0.001
#: Passes over the ready callbacks a driver makes before a full iteration (timers, epoll).
_READY_PASSES = 8
_MAIN = threading.main_thread().ident
#: The C functions under ``signal.signal`` / ``getsignal``: the Python wrappers turn
#: handlers into enums (by a ValueError, for a function), 14 µs a swap against 0.6.
_SIGNALS: Any = getattr(signal, "_signal", signal)


def can_hold(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether a caller can run ``loop``'s iterations: the standard library's selector loop."""
    return isinstance(loop, asyncio.selector_events.BaseSelectorEventLoop) and hasattr(loop, "_run_once")


class Baton:
    """Who runs ``loop`` (module docstring); made on the loop thread ``loop_ident``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, loop_ident: int, quiet: Callable[[], bool]) -> None:
        assert can_hold(loop)
        self.loop: Any = cast(Any, loop)  # a BaseSelectorEventLoop; its private parts are used below
        self.quiet = quiet  # (loop) whether the client owes nobody an answer (module docstring)
        self.slice = PARK_SLICE
        self.tick = PARK_TICK
        self.state = LOOP
        self.driver = 0  # (HELD) the thread that runs the loop
        self.closed = False
        self.loop_iterations = 0
        self.pokes = 0
        self.park_looks = 0  # times the parked loop thread looked at the baton
        self._loop_ident = loop_ident
        # (re-entrant: a GC finalizer may call_soon_threadsafe.) Entered as the C RLock
        # itself, never as ``with self._cond``: Condition's __enter__/__exit__ are Python
        # frames, and a KeyboardInterrupt raised at the start of __exit__ left the lock held
        # - the loop thread then hung at close, waiting for it
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._callers = 0  # synchronous callers inside run()
        self._want = False  # a lone caller's add was handed over: park once it is done
        self._lone: Future[Any] | None = None  # that add's future (None: not started yet)
        self._lone_ident = 0  # that caller, while it starts its call (its own hand-over is no other's work)
        self._handover = False  # (HELD) work came from another thread: the driver gives the loop back
        self._released_at = 0.0
        self._near_timer = False  # the last drive parked with a live timer due within a slice
        selector = self.loop._selector
        self._select: Callable[[float | None], list[Any]] = selector.select
        self._safe_codes: frozenset[CodeType] = frozenset((type(selector).select.__code__,
                                                           Baton._selecting.__code__))
        selector.select = self._selecting
        self._write = self.loop._write_to_self
        self.loop._write_to_self = self._written

    # -- the caller's side -------------------------------------------------------------
    def run(self, start: Callable[..., Future[T]], *args: Any) -> Future[T]:
        """``start(*args)``'s future: done, the loop driven on this thread, when the baton
        is free and this is the only synchronous caller; else handed over (the caller
        waits for it, ``result()``: no frames of this module in a raised error's traceback)."""
        me = threading.get_ident()
        take = counted = False
        try:
            with self._lock:
                self._callers += 1
                counted = True
                take = self.state == PARKED and self._callers == 1 and not self.closed and \
                    events._get_running_loop() is None
                if take:
                    self.state, self.driver, self._handover = HELD, me, False
            if take:
                return self._held(start, args)
            with self._lock:  # alone, handed over: the loop thread parks once this is done
                lone = self._callers == 1 and self.state == LOOP and not self.closed
                if lone:
                    self._want, self._lone, self._lone_ident = True, None, me
            try:
                fut = start(*args)
            except BaseException:
                if lone:
                    with self._lock:
                        self._lone_ident, self._want = 0, False
                raise
            if lone:
                with self._lock:
                    self._lone_ident = 0
                    if self._want:
                        self._lone = fut
            return fut
        finally:
            if counted:
                with self._lock:
                    self._callers -= 1

    def _held(self, start: Callable[..., Future[T]], args: tuple[Any, ...]) -> Future[T]:
        """(Driver) start the call on the loop and drive it to its end, or until work
        from another thread (or a SIGINT) makes it hand the loop over."""
        loop = self.loop
        hooks = sys.get_asyncgen_hooks()
        events._set_running_loop(loop)
        sys.set_asyncgen_hooks(firstiter=loop._asyncgen_firstiter_hook, finalizer=loop._asyncgen_finalizer_hook)
        sigint = _Sigint(self._safe_codes, self._write) if self.driver == _MAIN else None
        try:
            fut = start(*args)
            self._drive(fut, sigint)
        except BaseException:
            if self.state == HELD and self.driver == threading.get_ident():
                self._give_back()
            raise
        finally:
            events._set_running_loop(None)
            sys.set_asyncgen_hooks(*hooks)
            if sigint is not None:
                sigint.restore()  # a SIGINT held meanwhile raises here, the loop handed over
        return fut

    def _drive(self, fut: Future[Any], sigint: _Sigint | None) -> None:
        """(Driver) run the loop's iterations until ``fut`` is done and nothing is ready
        (the baton is then parked), or until others came or a SIGINT was held (the loop
        thread has the loop then). Callbacks already ready run without an iteration's
        ``select(0)`` first (up to :data:`_READY_PASSES` times in a row): the hops of a
        lone add (append, pump, send, flush) cost no epoll call each, and answers that
        came meanwhile (a third bookie's, late) are read after this add went out."""
        loop = self.loop
        run_once, ready = loop._run_once, loop._ready
        passes = 0
        while True:  # the ends are looked at before each step: a call done when started
            # (an add on a writer that already failed) must not wait in a select that
            # nothing will wake (no timer, nothing ready, no answer owed)
            if self._handover or loop._stopping or self.closed or (sigint is not None and sigint.held):
                self._give_back()
                return
            if fut.done() and not ready:
                with self._lock:
                    if self._handover or ready:
                        continue
                    when = self._next_timer()  # (the driver runs the loop: it may drop cancelled ones)
                    self._near_timer = when is not None and when - loop.time() < self.slice
                    self.state, self.driver = PARKED, 0
                    self._released_at = time.monotonic()
                return
            if ready and passes < _READY_PASSES:  # what is ready, without asking epoll first
                passes += 1
                for _ in range(len(ready)):
                    handle = ready.popleft()
                    if not handle._cancelled:
                        handle._run()
            else:
                passes = 0
                run_once()

    def _give_back(self) -> None:
        """(Driver) the loop thread runs the loop from now on (woken for it)."""
        with self._lock:
            self.state, self.driver, self._handover = LOOP, 0, False
            self._cond.notify_all()

    # -- the loop thread's side --------------------------------------------------------
    def _selecting(self, timeout: float | None) -> list[Any]:
        """The selector's ``select``: the driver's as it is; on the loop thread, the place
        where it parks (module docstring)."""
        if threading.get_ident() == self._loop_ident:
            self.loop_iterations += 1
            if timeout != 0 and self._want and self._park():
                timeout = 0  # what came meanwhile, without blocking: _run_once reads the rest afresh
        return self._select(timeout)

    def _park(self) -> bool:
        """(Loop thread) park until the baton is the loop thread's again; False when the
        loop may not park now."""
        with self._lock:
            lone = self._lone
            if not self._want or self.closed or lone is None or not lone.done() or not self.quiet():
                return False
            self._want, self._lone = False, None
            self.state, self._released_at = PARKED, time.monotonic()
            while self.state != LOOP:
                self.park_looks += 1
                now = time.monotonic()
                wait = self.tick if self._near_timer else self.slice  # (HELD: until the driver parks)
                if self.state == PARKED:
                    if now - self._released_at >= self.slice or self._timer_due():
                        self.state = LOOP
                        break
                    wait = min(self.slice - (now - self._released_at), self._timer_in())
                self._cond.wait(wait)
            return True

    def _timer_in(self) -> float:
        when = self._next_timer()
        return self.slice if when is None else max(0.0, when - self.loop.time())

    def _timer_due(self) -> bool:
        when = self._next_timer()
        return when is not None and when <= self.loop.time()

    def _next_timer(self) -> float | None:
        """(Loop thread, ``PARKED``: nobody runs the loop) when the loop's first live timer
        is due. Cancelled timers at the head are dropped as ``_run_once`` drops them: a
        writer's idle LAC wait, cancelled by the next append, must not take the loop back."""
        loop = self.loop
        scheduled = loop._scheduled
        while scheduled and scheduled[0]._cancelled:
            loop._timer_cancelled_count -= 1
            heapq.heappop(scheduled)._scheduled = False
        return float(scheduled[0]._when) if scheduled else None

    def _written(self) -> None:
        """The loop's self-pipe write (``call_soon_threadsafe``): work from another thread."""
        me = threading.get_ident()
        if me != self._loop_ident and me != self.driver:
            self.pokes += 1
            with self._lock:
                if me != self._lone_ident:
                    self._want = False
                if self.state == PARKED:
                    self.state = LOOP
                    self._cond.notify_all()
                elif self.state == HELD:
                    self._handover = True  # before the byte: the driver's select wakes to it
        self._write()

    def close(self) -> None:
        """The loop stops: never parked again, the baton back with the loop thread."""
        with self._lock:
            self.closed = True
            if self.state == PARKED:
                self.state = LOOP
            elif self.state == HELD:
                self._handover = True
            self._cond.notify_all()


class _Sigint:
    """(Main thread, driving) SIGINT raises only while the loop waits in ``select``;
    otherwise it is held until :meth:`restore` (module docstring, "KeyboardInterrupt"),
    and the loop's self-pipe written so that the iteration under way does not block."""

    def __init__(self, safe: frozenset[CodeType], wake: Callable[[], None]) -> None:
        self._previous = _SIGNALS.getsignal(signal.SIGINT)
        self._safe = safe
        self._wake = wake  # the loop's self-pipe: a select about to block returns at once
        self.held: tuple[int, FrameType | None] | None = None
        self._active = callable(self._previous)
        if self._active:
            _SIGNALS.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if frame is not None and frame.f_code in self._safe:
            self._call(signum, frame)
        elif self.held is None:
            self.held = (signum, frame)
            self._wake()

    def _call(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous
        assert callable(previous)
        previous(signum, frame)

    def restore(self) -> None:
        """The previous handler again; a signal held meanwhile goes to it now."""
        if not self._active:
            return
        self._active = False
        _SIGNALS.signal(signal.SIGINT, self._previous)
        held, self.held = self.held, None
        if held is not None:
            self._call(*held)

