"""What every part of one client shares: options, the loop thread, the bookie pool, the
metadata session, and what the client has learnt about bookies' health."""

from __future__ import annotations

import asyncio
import random
import time
import weakref
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from walkit.client._config import ClientConfig
from walkit.client._loop import LoopThread
from walkit.client._pool import BookiePool, Endpoint, parse_endpoint
from walkit.client._stats import CLIENTS
from walkit.errors import NotEnoughBookiesError, UsageError, WalkitError
from walkit.metadata import Cluster, read_registration

__all__ = ["ClientCore"]

T = TypeVar("T")

FAILURE_MEMORY = 60.0  # seconds a failed bookie is picked last (BookKeeper's failure history)


class _Failable(Protocol):
    def fail_for_close(self, error: WalkitError) -> None: ...


class ClientCore:
    def __init__(self, config: ClientConfig, cluster: Cluster, loop: LoopThread) -> None:
        self.config = config
        self.cluster = cluster
        self.ledgers = cluster.ledgers
        self.loop = loop
        self._metadata = ThreadPoolExecutor(4, thread_name_prefix="walkit-metadata")
        self.pool = BookiePool(config, self._resolve)
        self._failed_at: dict[str, float] = {}
        self.closing = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.writers: weakref.WeakSet[_Failable] = weakref.WeakSet()
        self.stats = CLIENTS.new(self)  # written on the loop thread only (walkit/client/_stats.py)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as a task the core keeps (asyncio keeps only weak references) and
        cancels when the client closes."""
        if self.closing:
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def md(self, fn: Callable[..., T], *args: object) -> T:
        """Run a blocking metadata call off the loop."""
        return await asyncio.get_running_loop().run_in_executor(self._metadata, fn, *args)

    async def _resolve(self, bookie: str) -> Endpoint:
        return await self.md(self._registration_of, bookie)

    def _registration_of(self, bookie: str) -> Endpoint:
        return parse_endpoint(bookie, read_registration(self.cluster.store, self.cluster.info, bookie))

    # -- bookie health and placement ---------------------------------------------------
    def bookie_failed(self, bookie: str) -> None:
        self._failed_at[bookie] = time.monotonic()

    def recently_failed(self, bookie: str) -> bool:
        at = self._failed_at.get(bookie)
        return at is not None and time.monotonic() - at < FAILURE_MEMORY

    def read_order(self, bookies: tuple[str, ...] | list[str]) -> list[str]:
        """Replicas to read from: as given, recently failed ones last."""
        return sorted(bookies, key=self.recently_failed)

    async def choose_bookies(self, count: int, exclude: set[str]) -> list[str]:
        """``count`` distinct writable bookies not in ``exclude``, at random, bookies
        that failed lately only when no others are left (NotEnoughBookiesError)."""
        writable = (await self.md(self.cluster.bookies)).writable
        candidates = [b for b in writable if b not in exclude]
        if len(candidates) < count:
            raise NotEnoughBookiesError("not enough writable bookies", needed=count, available=len(candidates),
                                        excluded=len(exclude & writable) or None)
        random.shuffle(candidates)
        candidates.sort(key=self.recently_failed)
        return candidates[:count]

    async def close(self) -> None:
        """Fail what writers still have in flight (their outcome is unknown), stop the
        core's tasks, close every connection."""
        self.closing = True
        error = UsageError("client closed with adds in flight: their outcome is unknown")
        for writer in list(self.writers):
            writer.fail_for_close(error)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.pool.close()
        self._metadata.shutdown(wait=False)
        CLIENTS.retire(self)
