"""A local cluster's in-process bookies: every BookieServer on one event-loop thread.

Theory of operation
-------------------
:class:`InProcessRunner` runs each bookie of a :class:`~walkit.LocalCluster` as a
:class:`~bookie.server.BookieServer` on one :class:`~walkit.client.LoopThread` of its
own (not the clients'; stopped by the runner, not at interpreter exit, so that the
cluster's exit hook stops its bookies gracefully). The cluster's caller may be
synchronous code or have an event loop of its own: every operation is a coroutine run on
that thread and waited for with a deadline (:func:`run_on`), never from the thread itself
(that would wait for ever: a UsageError instead).

All of the runner's state (``_servers``, ``_forced_usage``) is touched on the loop thread
or under the cluster's lock, one operation at a time. A server that stops by itself (its
registration lost for good) is forgotten when it does, so ``running`` tells the truth.

Faults: :meth:`InProcessRunner.kill` aborts every connection and closes the listener, so
no request in flight is answered, then releases the server's resources (session,
registration, journal, storage, directory locks) so the same bookie can start again in
this process. :meth:`InProcessRunner.set_read_only` makes the bookie's ledger disks look
full (or empty) and runs the server's own disk check, the disk monitor's path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from walkit._local_state import STOP_TIMEOUT, Slot, Started, port_taken
from walkit.client import LoopThread
from walkit.errors import BookieError, BookieUnavailableError, UsageError, WalkitError

if TYPE_CHECKING:
    from bookie import BookieConfig
    from bookie.server import BookieServer

__all__ = ["InProcessRunner", "run_on"]

T = TypeVar("T")


def _submit(loop: LoopThread, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """``coro`` started on ``loop`` for a caller that will wait for it: never the loop
    itself (it would wait for ever)."""
    if loop.in_loop():
        coro.close()
        raise UsageError("LocalCluster methods block: do not call them from its own event loop thread")
    return loop.submit(coro)


def run_on(loop: LoopThread, coro: Coroutine[Any, Any, T], timeout: float, what: str, **context: object) -> T:
    """Run ``coro`` on ``loop`` and wait for it (never from the loop itself); past
    ``timeout`` it is cancelled and ``what`` did not finish in time
    (BookieUnavailableError)."""
    fut = _submit(loop, coro)
    try:
        return fut.result(timeout)
    except concurrent.futures.TimeoutError as exc:
        fut.cancel()
        raise BookieUnavailableError(f"{what} did not finish in time", timeout=timeout, **context) from exc


class InProcessRunner:
    """Every BookieServer on one :class:`~walkit.client.LoopThread`."""

    def __init__(self, on_server: Callable[[int, BookieServer], None] | None = None) -> None:
        self._loop = LoopThread("walkit-local-cluster", stop_at_exit=False)
        self._on_server = on_server
        self._servers: dict[int, BookieServer] = {}
        self._starting: dict[int, concurrent.futures.Future[Started]] = {}
        self._forced_usage: dict[int, float] = {}  # set_read_only: what the disks of a bookie look like

    def launch(self, slot: Slot, config: BookieConfig) -> None:
        self._starting[slot.index] = _submit(self._loop, self._start(slot, config))

    def wait_started(self, slot: Slot, timeout: float) -> Started:
        fut = self._starting.pop(slot.index)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            fut.cancel()
            raise BookieUnavailableError("bookie did not start in time", bookie=slot.index, timeout=timeout) from exc

    async def _start(self, slot: Slot, config: BookieConfig) -> Started:
        from bookie.server import BookieServer

        server = BookieServer(config, disk_usage=lambda path: self._disk_usage(slot.index, path))
        if self._on_server is not None:
            self._on_server(slot.index, server)
        try:
            await server.start()
        except WalkitError:
            raise
        except OSError as exc:  # the bind
            if exc.errno == errno.EADDRINUSE:
                raise port_taken(slot) from exc
            raise BookieError("bookie could not start", bookie=slot.index, reason=str(exc)) from exc
        self._servers[slot.index] = server
        asyncio.get_running_loop().create_task(self._forget_when_stopped(slot.index, server))
        return Started(server.bookie_id, server.port, server.http_port)

    async def _forget_when_stopped(self, index: int, server: BookieServer) -> None:
        """A server may stop by itself (registration lost for good): then it is not running."""
        await server.wait_stopped()
        if self._servers.get(index) is server:
            del self._servers[index]

    def _disk_usage(self, index: int, path: str) -> float:
        from bookie.server import disk_usage

        forced = self._forced_usage.get(index)
        return disk_usage(path) if forced is None else forced

    def server(self, slot: Slot) -> BookieServer:
        server = self._servers.get(slot.index)
        if server is None:
            raise UsageError("bookie is not running", bookie=slot.index, id=slot.bookie_id)
        return server

    def running(self, slot: Slot) -> bool:
        return slot.index in self._servers

    def kill(self, slot: Slot) -> None:
        run_on(self._loop, self._kill(slot.index), STOP_TIMEOUT, "killing a bookie", bookie=slot.index)

    async def _kill(self, index: int) -> None:
        server = self._servers.pop(index, None)
        if server is None:  # it stopped by itself meanwhile
            return
        await _abort(server)
        await server.stop()

    def stop(self, slots: list[Slot]) -> None:
        run_on(self._loop, self._stop([s.index for s in slots]), STOP_TIMEOUT, "stopping bookies",
                        bookies=",".join(str(s.index) for s in slots))

    async def _stop(self, indexes: list[int]) -> None:
        servers = {i: self._servers.pop(i) for i in indexes if i in self._servers}
        await asyncio.gather(*(server.stop() for server in servers.values()))
        failed = {i: s.stop_error for i, s in servers.items() if s.stop_error is not None}
        if failed:
            i, error = next(iter(failed.items()))
            raise BookieError("bookie did not stop cleanly", bookie=i, failed=len(failed)) from error

    def set_read_only(self, slot: Slot, readonly: bool) -> None:
        self._forced_usage[slot.index] = 1.0 if readonly else 0.0
        server = self.server(slot)
        try:
            run_on(self._loop, server.check_disks(), STOP_TIMEOUT, "switching mode", bookie=slot.index)
        finally:
            if not readonly:
                del self._forced_usage[slot.index]  # back to the real disks
        if server.readonly != readonly:
            raise BookieError("the bookie did not switch mode (see its log)", bookie=slot.index, readonly=readonly)

    def close(self) -> None:
        """Stop what is still running (a cluster dropped without stop()), then the loop."""
        if self._servers:
            with contextlib.suppress(WalkitError):
                run_on(self._loop, self._stop(list(self._servers)), STOP_TIMEOUT, "stopping bookies")
        self._loop.stop()


async def _abort(server: BookieServer) -> None:
    """Drop every connection without answering and close the listening socket, as a crash
    would. BookieServer has no public switch for this (its ``stop`` is graceful), so the
    test harness reaches into it here.

    The listener stops accepting before it is closed, and the connections it accepted
    just before get the loop iterations they need to reach ``connection_made``: asyncio
    3.11 never closes a socket it accepted whose transport is made after
    ``Server.close()`` (its peer would wait for ever), so they are aborted here instead."""
    _abort_connections(server)
    listener = server._server
    if listener is not None:
        loop = asyncio.get_running_loop()
        for sock in listener.sockets:
            loop.remove_reader(sock.fileno())
        for _ in range(3):  # accept task step, then connection_made
            await asyncio.sleep(0)
        listener.close()
    _abort_connections(server)
    await asyncio.sleep(0)  # connection_lost ran: the stop finds no connection to answer on


def _abort_connections(server: BookieServer) -> None:
    for conn in list(server._connections):
        if conn.transport is not None:
            conn.transport.abort()

