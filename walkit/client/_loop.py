"""The client's event loop, on a thread of its own.

Every piece of a client's state (connections, ledger handles' pending adds, reads in
flight) lives on this one loop, so none of it needs a lock. The synchronous API hands
work over with :meth:`LoopThread.submit` / :meth:`LoopThread.call` and waits on a
``concurrent.futures.Future``; the asyncio API awaits the same futures on the caller's
loop (``asyncio.wrap_future``).

A lone synchronous caller (:meth:`LoopThread.lone_run`: ``WriteAheadLog.append``,
``LedgerHandle.add_entry``) does not hand its call over: it takes the loop's baton and
runs the loop's iterations on its own thread until its call is done, waking no other
thread; a second caller, or work from any other thread, gives the loop back to this
thread (walkit/client/_baton.py). While a caller holds the baton, :meth:`LoopThread.in_loop`
is true on its thread: it is the loop's thread for that while.

A sequence read on the loop (a replay's chunks, a tail's entries) is an async generator
that runs there; :meth:`LoopThread.iterate` hands its items to a thread and
:meth:`LoopThread.aiterate` to another event loop, one hand-off per item (so items are
chunks, not records), and both close it on the loop when their consumer stops early, so
nothing of it (a read under way, a watch) outlives the consumer. A thread waits for each
item on a lock of its own, not on a future (:class:`_Steps`), so that a KeyboardInterrupt
- Ctrl-C in ``for lsn, record in reader.tail()`` - may stop it at any instant.

The thread is a daemon (a client never closed must not keep the process alive). At
interpreter exit it would be frozen wherever it was and its tasks - a WriteAheadLog's
retention pass, a tail - destroyed pending ("Task was destroyed but it is pending!"), so
every loop still running is stopped at exit (:func:`_stop_at_exit`) as
:meth:`LoopThread.stop` stops one: its tasks cancelled and awaited; the sequences it
handed out closed, each closing what it uses in order (the loop's
``shutdown_asyncgens`` closes every async generator at once, and a tail whose watch was
closed under it failed with "generator didn't stop after athrow()"); the loop closed.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import contextlib
import functools
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from walkit.client._baton import Baton, can_hold
from walkit.errors import UsageError, WalkitError
from walkit.eventloop import new_event_loop

__all__ = ["LoopThread"]

T = TypeVar("T")
log = logging.getLogger(__name__)

_running: weakref.WeakSet[LoopThread] = weakref.WeakSet()  # the loops to stop at exit
_running_lock = threading.Lock()


def _stop_at_exit() -> None:
    """(atexit) stop every client loop still running: a client, or a WriteAheadLog,
    the program never closed. Registered when a first loop starts, so it runs before
    the exit hooks registered earlier - a LocalCluster's, which stops its bookies:
    clients go first, as with-blocks would have it."""
    with _running_lock:
        loops = list(_running)
    for loop in loops:
        loop.stop()


class LoopThread:
    """One daemon thread running one asyncio event loop; work is handed over from other
    threads (:meth:`submit`, :meth:`run`, :meth:`call`, :meth:`iterate`) or other loops
    (:meth:`aiterate`). The client runs on one; so do a :class:`~walkit.LocalCluster`'s
    in-process bookies and ``walkit.testing``'s proxies, which pass ``stop_at_exit=False``:
    their owner stops them at exit itself (gracefully, its bookies first), after the
    clients' loops."""

    def __init__(self, name: str, *, stop_at_exit: bool = True) -> None:
        self.loop = new_event_loop()  # WALKIT_EVENT_LOOP's kind (walkit.eventloop)
        self._stopped = False
        #: (loop only) the sequences handed to consumers (iterate, aiterate), closed first at stop
        self._handed: weakref.WeakSet[AsyncGenerator[Any, None]] = weakref.WeakSet()
        #: (loop) whether the loop owes nobody an answer, so that it may park for a lone
        #: caller (walkit/client/_baton.py); None: no caller ever runs this loop (set by the client)
        self.quiet: Callable[[], bool] | None = None
        self.baton: Baton | None = None  # made by the first lone_run that can use one
        self._baton_lock = threading.Lock()
        self._submitted = 0  # coroutines submitted and not done: one may be waiting for a bookie's answer
        self._submitted_lock = threading.Lock()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=name, daemon=True)
        self._thread.start()
        ready.wait()
        if not stop_at_exit:
            return
        with _running_lock:
            if not _running:
                atexit.unregister(_stop_at_exit)  # (a later registration runs earlier)
                atexit.register(_stop_at_exit)
            _running.add(self)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(ready.set)
        try:
            self.loop.run_forever()
        finally:  # its executor's threads (a name lookup, a bookie's file work) end first
            with contextlib.suppress(RuntimeError):
                self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _check_running(self) -> None:
        if self._stopped:
            raise UsageError("client is closed")

    def in_loop(self) -> bool:
        """Whether this thread runs the loop: the loop's thread, or a caller holding its baton."""
        me = threading.get_ident()
        return me == self._thread.ident or (self.baton is not None and me == self.baton.driver)

    def lone_run(self, start: Callable[..., concurrent.futures.Future[T]], *args: Any) -> concurrent.futures.Future[T]:
        """(Another thread, about to wait) ``start(*args)``, which starts a call on the loop
        and returns its future; that future - done, run by this thread itself and no other
        woken, when this is the only synchronous caller and the loop owes nobody else
        anything (walkit/client/_baton.py), else handed over as :meth:`call` does, for the
        caller to wait on. Never from the loop itself (its caller would wait for ever)."""
        baton = self.baton
        if baton is None:
            baton = self._make_baton()
            if baton is None:
                return start(*args)
        return baton.run(start, *args)

    def _make_baton(self) -> Baton | None:
        with self._baton_lock:
            if self.baton is None and self.quiet is not None and can_hold(self.loop) and not self._stopped:
                self.baton = Baton(self.loop, self._thread.ident or 0, self._quiet)
            return self.baton

    def _quiet(self) -> bool:
        """(Loop) whether the loop may park for a lone caller: the client's ``quiet``, no
        sequence handed out and no coroutine submitted still running (a tail's read, a
        ``run`` of another thread - an open, a LAC read - may be waiting for an answer)."""
        quiet = self.quiet
        return not self._handed and not self._submitted and quiet is not None and quiet()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; its future (for the sync or the asyncio API)."""
        if self._stopped:
            coro.close()
            raise UsageError("client is closed")
        with self._submitted_lock:
            self._submitted += 1
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except BaseException:
            self._settled(None)
            raise
        fut.add_done_callback(self._settled)
        return fut

    def _settled(self, _: object) -> None:
        with self._submitted_lock:
            self._submitted -= 1

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (never from the loop itself:
        that would wait for ever)."""
        if self.in_loop():
            coro.close()
            raise UsageError("a blocking walkit call was made from the client's own event loop thread "
                             "(from a callback?); use the asyncio API or another thread")
        return self.result(self.submit(coro), timeout)

    def result(self, fut: concurrent.futures.Future[T], timeout: float | None = None) -> T:
        """Wait for what :meth:`submit` started (never on the loop itself)."""
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            raise WalkitError("the client's loop did not finish in time", timeout=timeout) from None
        except concurrent.futures.CancelledError:
            raise UsageError("client closed while the call ran") from None

    def iterate(self, agen: AsyncGenerator[T, None], waited: Callable[[float], None] | None = None) -> Iterator[T]:
        """(Another thread) the items of ``agen``, an async generator run on the loop one
        step per item; ``waited(s)``: told how long each item was waited for (its end is
        no item). Stopping early (``close()`` of this generator, a KeyboardInterrupt at any
        instant) cancels the step under way and closes ``agen`` on the loop, waiting for
        it (:class:`_Steps`)."""
        if self.in_loop():
            raise UsageError("a blocking walkit read was made from the client's own event loop thread "
                             "(from a callback?); use the asyncio API or another thread")
        steps = _Steps(self, agen)
        try:
            while True:
                began = time.monotonic()
                more, item = steps.next()
                if not more:
                    return
                if waited is not None:
                    waited(time.monotonic() - began)
                yield item
        finally:
            steps.close(wait=not self.in_loop())

    async def aiterate(self, agen: AsyncGenerator[T, None],
                       waited: Callable[[float], None] | None = None) -> AsyncGenerator[T, None]:
        """(Another event loop) :meth:`iterate` for asyncio: the items of ``agen``, run on
        this loop a step per item, awaited without blocking the caller's loop (no thread
        of its). Cancelling the consumer cancels the step under way; stopping early
        (``aclose()``, a ``break``, a cancelled task) closes ``agen`` on this loop."""
        over = False
        try:
            while True:
                began = time.monotonic()
                try:
                    more, item = await asyncio.wrap_future(self.submit(_step(agen, self._handed)))
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # the consumer was cancelled, and the step with it: agen is closed below
                    over = True  # the step was cancelled on this loop: the client closed
                    raise UsageError("client closed while the call ran") from None
                except BaseException:
                    over = True  # agen raised: it is over
                    raise
                if not more:
                    over = True
                    return
                if waited is not None:
                    waited(time.monotonic() - began)
                yield item  # type: ignore[misc]
        finally:
            if not over and not self._stopped:
                with contextlib.suppress(UsageError):
                    await asyncio.shield(asyncio.wrap_future(self.submit(_aclose(agen))))

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop soon (from the loop itself: without writing to
        the loop's wake-up pipe, which only another thread needs)."""
        if self._stopped:
            raise UsageError("client is closed")
        try:
            if self.in_loop():
                self.loop.call_soon(fn, *args)
            else:
                self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            raise UsageError("client is closed") from None

    def stop(self) -> None:
        """Cancel what still runs on the loop (an ensemble change, a read), let it
        unwind, close the sequences handed out, and end the thread."""
        with _running_lock:
            _running.discard(self)
        if not self._thread.is_alive() or self._stopped:
            return
        with self._baton_lock:
            if self.baton is not None:
                self.baton.close()  # a caller running the loop hands it back; never parked again
        if self.in_loop():
            self._stopped = True
            self.loop.stop()
            return
        try:
            asyncio.run_coroutine_threadsafe(self._cancel_tasks(), self.loop).result(10)
        except (concurrent.futures.TimeoutError, RuntimeError):
            log.warning("client loop tasks did not finish cancelling in 10 s")
        self._stopped = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    async def _cancel_tasks(self) -> None:
        me = asyncio.current_task()
        for _ in range(10):  # cancelling may start more (a callback's task): until none is left
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            if not tasks:
                break
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for agen in list(self._handed):  # each closes the generators it uses, in order
            await _aclose(agen)
        await self.loop.shutdown_asyncgens()


class _Steps:
    """The steps of one :meth:`LoopThread.iterate`, between its consumer's thread and the loop.

    The consumer waits for a step on a lock of its own that the loop releases once the
    step's outcome is in, never on a ``concurrent.futures.Future``: that one's Condition is
    entered in Python code, and a KeyboardInterrupt (Ctrl-C, raised wherever the main
    thread is) landing just after its lock was taken left the lock held - the loop then
    blocked for good when it came to complete the future, and every clean-up waited out
    its timeout. The step's task lives on the loop only: an interrupted consumer cannot
    lose track of it (:meth:`close` cancels it, lets it end, then closes ``agen``), and
    never frees it (freeing a task runs a weakref callback, where a KeyboardInterrupt is
    lost)."""

    def __init__(self, owner: LoopThread, agen: AsyncGenerator[Any, None]) -> None:
        self._owner = owner
        self._agen = agen
        self._task: asyncio.Task[tuple[bool, Any]] | None = None  # (loop) the step under way
        self._outcome: tuple[bool, Any] | BaseException | None = None
        self._over = False  # agen ended (exhausted, or raised): nothing to close
        self._closing: asyncio.Task[None] | None = None  # (loop) close()'s work

    def next(self) -> tuple[bool, Any]:
        """(Consumer) ``agen``'s next item: (True, item), or (False, None) at its end."""
        ready = threading.Lock()
        ready.acquire()
        self._owner.call(self._begin, ready)
        # Interrupted, nothing is held (close() finds the step on the loop). In slices: a
        # signal that came just before the wait blocked is handled when it returns.
        while not ready.acquire(timeout=1.0):
            if self._owner.stopped:  # stopped before the step ran: it never will
                raise UsageError("client closed while the call ran")
        outcome, self._outcome = self._outcome, None
        if isinstance(outcome, BaseException):
            self._over = True  # agen raised, or was cancelled in its step (the client closed)
            raise outcome
        assert outcome is not None
        self._over = not outcome[0]
        return outcome

    def _begin(self, ready: threading.Lock) -> None:
        """(Loop) start a step; ``ready`` is released once its outcome is in."""
        self._task = self._owner.loop.create_task(_step(self._agen, self._owner._handed))
        self._task.add_done_callback(functools.partial(self._settle, ready))

    def _settle(self, ready: threading.Lock, task: asyncio.Task[tuple[bool, Any]]) -> None:
        self._task = None
        if task.cancelled():
            self._outcome = UsageError("client closed while the call ran")
        else:
            error = task.exception()
            self._outcome = error if error is not None else task.result()
        ready.release()

    def close(self, wait: bool) -> None:
        """(Consumer) stop early: the step under way cancelled and ended, then ``agen``
        closed, on the loop (waiting up to 10 s for that when ``wait``)."""
        if self._over:
            return
        closed = threading.Lock()
        closed.acquire()
        try:
            self._owner.call(self._close, closed)
        except UsageError:
            return  # the client is closed: its loop cancelled and closed everything
        self._over = True
        if wait:
            closed.acquire(timeout=10)

    def _close(self, closed: threading.Lock) -> None:
        async def close() -> None:
            try:
                task = self._task
                while task is not None and not task.done():  # agen ends with the step's CancelledError
                    task.cancel()  # again if a step swallowed it (3.11's wait_for, its future done too)
                    await asyncio.wait((task,), timeout=0.1)
                await _aclose(self._agen)  # one whose step ended with an item is closed here
            finally:
                closed.release()

        self._closing = self._owner.loop.create_task(close())


async def _step(agen: AsyncGenerator[T, None], handed: weakref.WeakSet[AsyncGenerator[Any, None]]) -> tuple[
        bool, T | None]:
    """(Loop) the next item of ``agen``: (True, item), or (False, None) at its end;
    ``agen`` is in ``handed`` from its first step on."""
    handed.add(agen)
    try:
        return True, await agen.__anext__()
    except StopAsyncIteration:
        return False, None


async def _aclose(agen: AsyncGenerator[Any, None]) -> None:
    """(Loop) close ``agen`` (one still running a cancelled step ends by itself)."""
    try:
        await agen.aclose()
    except Exception as exc:  # nobody is left to hear of it
        if not (isinstance(exc, RuntimeError) and "already running" in str(exc)):  # that one: the
            log.warning("an abandoned read failed while it was closed", exc_info=True)  # cancelled step ends it
