"""The ledger client's face the log uses, until ``walkit.client.LedgerClient`` lands.

TEMPORARY (issue 36): the names below are exactly ``LedgerClient``'s (the client's
public async core: one metadata session, one loop thread, the ClientCore). Once
``BookKeeper.client`` exists, :func:`ledger_client` returns it and this adapter goes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from walkit.client import BookKeeper, ClientConfig, LedgerWriter, LoopThread, ReadState
from walkit.errors import UsageError
from walkit.metadata import Cluster

__all__ = ["ledger_client"]

T = TypeVar("T")


class _Client:
    def __init__(self, bk: BookKeeper) -> None:
        self._bk = bk
        self.config: ClientConfig = bk.config
        self.metadata_uri = bk.metadata_uri

    @property
    def cluster(self) -> Cluster:
        return self._bk._cluster

    @property
    def loop(self) -> LoopThread:
        return self._bk._loop

    @property
    def ledgers(self) -> Any:
        return self._bk._core.ledgers

    @property
    def closed(self) -> bool:
        return self._bk._closed

    def check_open(self) -> None:
        if self._bk._closed:
            raise UsageError("client is closed")

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._bk._closed:
            coro.close()
            raise UsageError("client is closed")
        return self._bk._loop.run(coro, timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return self._bk._loop.submit(coro)

    async def on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._bk._closed:
            coro.close()
            raise UsageError("client is closed")
        try:
            return await asyncio.wrap_future(self._bk._loop.submit(coro))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            raise UsageError("client closed while the call ran") from None

    async def metadata(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._bk._core.md(fn, *args)

    async def create(self, ensemble_size: int, write_quorum: int, ack_quorum: int, digest: str, password: bytes,
                     custom_metadata: Mapping[str, bytes] | None) -> LedgerWriter:
        return await self._bk._create(ensemble_size, write_quorum, ack_quorum, digest, password, custom_metadata)

    async def open(self, ledger_id: int, password: bytes, recovery: bool) -> ReadState:
        return await self._bk._open(ledger_id, password, recovery)



def ledger_client(bk: BookKeeper) -> _Client:
    """``bk``'s LedgerClient (``bk.client`` once the client exports it)."""
    return _Client(bk)
