"""The ledger client for asyncio applications: the same client as ``walkit.BookKeeper``
(its core runs on a loop thread of its own), awaited on the caller's loop.

::

    async with await walkit.aio.connect(uri) as bk:
        lh = await bk.create_ledger()
        entry_id = await lh.add_entry(b"change")
        done = await lh.add_entry_async(b"next")   # queued; await `done` for its id
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id)
        async for entry in rh.read(0, rh.last_add_confirmed):
            ...
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Mapping
from types import TracebackType
from typing import IO, Any, TypeVar

from walkit.client import BookKeeper, Entry, LedgerReader, LedgerWriter, ReadState, check_payload, check_range
from walkit.errors import InvalidArgumentError, LedgerClosedError, UsageError
from walkit.metadata import LedgerMetadata
from walkit.wal import LSN, LogReader, Snapshot, WriteAheadLog

__all__ = ["AsyncBookKeeper", "AsyncLedgerHandle", "AsyncLogReader", "AsyncReadHandle", "AsyncWriteAheadLog", "Entry",
           "connect"]

T = TypeVar("T")


async def connect(metadata_uri: str, **options: Any) -> AsyncBookKeeper:
    """A client of the cluster at ``metadata_uri`` (options: ``walkit.ClientConfig``)."""
    loop = asyncio.get_running_loop()
    bk = await loop.run_in_executor(None, lambda: BookKeeper(metadata_uri, **options))
    return AsyncBookKeeper(bk)


class AsyncBookKeeper:
    def __init__(self, bk: BookKeeper) -> None:
        self.sync = bk  # the synchronous client this wraps (same connections, same core)

    async def _on_core(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.sync._closed:
            coro.close()
            raise UsageError("client is closed")
        return await asyncio.wrap_future(self.sync._loop.submit(coro))

    async def create_ledger(self, ensemble_size: int = 3, write_quorum: int = 3, ack_quorum: int = 2,
                            digest: str = "crc32c", password: bytes = b"",
                            custom_metadata: Mapping[str, bytes] | None = None) -> AsyncLedgerHandle:
        writer = await self._on_core(self.sync._create(ensemble_size, write_quorum, ack_quorum, digest, password,
                                                       custom_metadata))
        return AsyncLedgerHandle(self, writer)

    async def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> AsyncReadHandle:
        return AsyncReadHandle(self, await self._on_core(self.sync._open(ledger_id, password, recovery)))

    async def delete_ledger(self, ledger_id: int) -> None:
        await self._on_core(self.sync._core.md(self.sync.delete_ledger, ledger_id))

    async def list_ledgers(self) -> list[int]:
        return await self._on_core(self.sync._core.md(lambda: list(self.sync.list_ledgers())))

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return await self._on_core(self.sync._core.md(self.sync.ledger_metadata, ledger_id))

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.sync.close)

    async def __aenter__(self) -> AsyncBookKeeper:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


async def _read_chunks(bk: AsyncBookKeeper, state: ReadState, first: int, last: int) -> AsyncIterator[Entry]:
    check_range(state.reader.ledger_id, first, last, state.lac)
    chunk = bk.sync.config.read_parallelism * 4
    start = first
    while start <= last:
        end = min(last, start + chunk - 1)
        for entry in await bk._on_core(state.read(start, end)):
            yield entry
        start = end + 1


class AsyncLedgerHandle:
    def __init__(self, bk: AsyncBookKeeper, writer: LedgerWriter) -> None:
        self._bk = bk
        self._writer = writer
        self._closed = False

    @property
    def ledger_id(self) -> int:
        return self._writer.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._writer.meta

    @property
    def last_add_confirmed(self) -> int:
        return self._writer.lac

    @property
    def length(self) -> int:
        return self._writer.lac_length

    async def add_entry_async(self, data: bytes) -> asyncio.Future[int]:
        """Queue an entry (waiting, without blocking the loop, while ``max_pending_adds``
        are in flight); the returned future gives its id once it is durable on Qa
        bookies. Futures complete in entry order."""
        if self._closed:
            raise LedgerClosedError("ledger handle is closed", ledger=self.ledger_id)
        payload = check_payload(data, self._bk.sync.config.max_frame_size, self._writer.meta.digest)
        slots = self._writer.slots
        delay = 0.0005
        while not slots.acquire(blocking=False):  # no thread parked on the semaphore: cancel-safe
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)
        return asyncio.wrap_future(self._writer.submit(payload, reserved=True))  # releases the slot if it raises

    async def add_entry(self, data: bytes) -> int:
        """Add an entry; its id once it and every lower one are durable on Qa bookies."""
        return await (await self.add_entry_async(data))

    async def read(self, first: int, last: int) -> list[Entry]:
        state = ReadState(LedgerReader(self._bk.sync._core, self._writer.meta, self._writer.key),
                          self._writer.version, self._writer.lac)
        return [entry async for entry in _read_chunks(self._bk, state, first, last)]

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._bk._on_core(self._writer.close())


class AsyncReadHandle:
    def __init__(self, bk: AsyncBookKeeper, state: ReadState) -> None:
        self._bk = bk
        self._state = state

    @property
    def ledger_id(self) -> int:
        return self._state.reader.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._state.metadata

    @property
    def last_add_confirmed(self) -> int:
        return self._state.lac

    @property
    def is_closed(self) -> bool:
        return self._state.closed

    @property
    def length(self) -> int:
        return self._state.length

    def read(self, first: int, last: int) -> AsyncIterator[Entry]:
        """``async for entry in handle.read(first, last)``."""
        return _read_chunks(self._bk, self._state, first, last)

    async def read_last_add_confirmed(self) -> int:
        return await self._bk._on_core(self._state.read_lac())

    async def wait_for_lac(self, previous: int, timeout: float) -> int:
        return await self._bk._on_core(self._state.wait_lac(previous, timeout))

    async def follow(self, start: int = 0, *, poll_timeout: float = 1.0) -> AsyncIterator[Entry]:
        """Entries from ``start`` on as the LAC passes them; ends once the ledger is
        closed and read to its end."""
        if not isinstance(start, int) or start < 0:
            raise InvalidArgumentError("follow starts at an entry id >= 0", start=start)
        next_id, limit = start, self._bk.sync.config.read_parallelism * 4
        while True:
            batch = await self._bk._on_core(self._state.follow_step(next_id, poll_timeout, limit))
            if batch is None:
                return
            for entry in batch:
                next_id = entry.entry_id + 1
                yield entry


# -- the write-ahead log -----------------------------------------------------------------------

_BATCH = 256


async def _drain(iterator: Iterator[T]) -> AsyncIterator[T]:
    """An async iterator over a blocking one: batches pulled on an executor thread."""
    loop = asyncio.get_running_loop()

    def pull() -> list[T]:
        return list(itertools.islice(iterator, _BATCH))

    while True:
        batch = await loop.run_in_executor(None, pull)
        if not batch:
            return
        for item in batch:
            yield item


def _one_by_one(iterator: Iterator[T]) -> AsyncIterator[T]:
    """Like :func:`_drain` but handing over every item as soon as it comes (tailing)."""

    async def gen() -> AsyncIterator[T]:
        loop = asyncio.get_running_loop()
        done = object()
        while True:
            item = await loop.run_in_executor(None, next, iterator, done)
            if item is done:
                return
            yield item  # type: ignore[misc]

    return gen()


class AsyncWriteAheadLog:
    """``walkit.WriteAheadLog`` for asyncio: ``await AsyncWriteAheadLog.open(...)``,
    ``await log.append(record)``, ``async for lsn, record in log.replay()``."""

    def __init__(self, wal: WriteAheadLog) -> None:
        self.sync = wal

    @classmethod
    async def open(cls, client_or_uri: AsyncBookKeeper | BookKeeper | str, name: str,
                   **options: Any) -> AsyncWriteAheadLog:
        target = client_or_uri.sync if isinstance(client_or_uri, AsyncBookKeeper) else client_or_uri
        loop = asyncio.get_running_loop()
        return cls(await loop.run_in_executor(None, lambda: WriteAheadLog.open(target, name, **options)))

    @staticmethod
    async def reader(client_or_uri: AsyncBookKeeper | BookKeeper | str, name: str,
                     **options: Any) -> AsyncLogReader:
        target = client_or_uri.sync if isinstance(client_or_uri, AsyncBookKeeper) else client_or_uri
        loop = asyncio.get_running_loop()
        return AsyncLogReader(await loop.run_in_executor(None, lambda: WriteAheadLog.reader(target, name, **options)))

    @property
    def epoch(self) -> int:
        return self.sync.epoch

    async def append_async(self, record: bytes) -> asyncio.Future[LSN]:
        """Queue a record; the future gives its LSN once durable (in append order)."""
        return asyncio.wrap_future(self.sync.append_async(record))

    async def append(self, record: bytes) -> LSN:
        return await asyncio.wrap_future(self.sync.append_async(record))

    async def append_many(self, records: Iterable[bytes]) -> list[LSN]:
        """Append ``records`` together (``WriteAheadLog.append_many``); their LSNs, in
        order, once the last of them is durable on a quorum."""
        return await asyncio.wrap_future(self.sync.append_many(records))

    async def flush(self) -> LSN | None:
        return await asyncio.get_running_loop().run_in_executor(None, self.sync.flush)

    async def snapshot(self, data: bytes | IO[bytes], lsn: LSN) -> Snapshot:
        return await asyncio.get_running_loop().run_in_executor(None, self.sync.snapshot, data, lsn)

    async def latest_snapshot(self) -> Snapshot | None:
        return await asyncio.get_running_loop().run_in_executor(None, self.sync.latest_snapshot)

    def replay(self, after: LSN | None = None) -> AsyncIterator[tuple[LSN, bytes]]:
        return _drain(self.sync.replay(after))

    async def truncate(self, before: LSN) -> int:
        return await asyncio.get_running_loop().run_in_executor(None, self.sync.truncate, before)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.sync.close)

    async def __aenter__(self) -> AsyncWriteAheadLog:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncLogReader:
    def __init__(self, reader: LogReader) -> None:
        self.sync = reader

    def replay(self, after: LSN | None = None) -> AsyncIterator[tuple[LSN, bytes]]:
        return _drain(self.sync.replay(after))

    def tail(self, after: LSN | None = None, *, poll_timeout: float = 1.0) -> AsyncIterator[tuple[LSN, bytes]]:
        return _one_by_one(self.sync.tail(after, poll_timeout=poll_timeout))

    async def latest_snapshot(self) -> Snapshot | None:
        return await asyncio.get_running_loop().run_in_executor(None, self.sync.latest_snapshot)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.sync.close)
