"""The client's event loop, on a thread of its own.

Every piece of a client's state (connections, ledger handles' pending adds, reads in
flight) lives on this one loop, so none of it needs a lock. The synchronous API hands
work over with :meth:`LoopThread.submit` / :meth:`LoopThread.call` and waits on a
``concurrent.futures.Future``; the asyncio API awaits the same futures on the caller's
loop (``asyncio.wrap_future``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from walkit.errors import UsageError, WalkitError

__all__ = ["LoopThread"]

T = TypeVar("T")
log = logging.getLogger(__name__)


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._stopped = False
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=name, daemon=True)
        self._thread.start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(ready.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _check_running(self) -> None:
        if self._stopped:
            raise UsageError("client is closed")

    def in_loop(self) -> bool:
        return threading.get_ident() == self._thread.ident

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; its future (for the sync or the asyncio API)."""
        if self._stopped:
            coro.close()
            raise UsageError("client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

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

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop soon (from the loop itself: without writing to
        the loop's wake-up pipe, which only another thread needs)."""
        if self._stopped:
            raise UsageError("client is closed")
        try:
            if threading.get_ident() == self._thread.ident:
                self.loop.call_soon(fn, *args)
            else:
                self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            raise UsageError("client is closed") from None

    def stop(self) -> None:
        """Cancel what still runs on the loop (an ensemble change, a read), let it
        unwind, and end the thread."""
        if not self._thread.is_alive() or self._stopped:
            return
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
        await self.loop.shutdown_asyncgens()
