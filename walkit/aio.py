"""The ledger client and the write-ahead log for asyncio applications: the same client
as ``walkit.BookKeeper`` (its core runs on a loop thread of its own), awaited on the
caller's loop.

::

    async with await walkit.aio.connect(uri) as bk:
        lh = await bk.create_ledger()
        entry_id = await lh.add_entry(b"change")
        done = await lh.add_entry_async(b"next")   # queued; await `done` for its id
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id)
        async for entry in rh.read(0, rh.last_add_confirmed):
            ...
        async with await walkit.aio.AsyncWriteAheadLog.open(bk, "orders") as log:
            lsn = await log.append(b"record")
            async for lsn, record in log.replay():
                ...

Where things run: every call is a coroutine of the client's core run on its loop
(``walkit.client.LedgerClient.on_loop``), awaited here through ``asyncio.wrap_future`` - the very
coroutines the synchronous API runs and waits for, so both behave alike. A replay or a
tail is an async generator on the core loop that hands over batches of entries (a
replay's next chunk read meanwhile); the records are made here, on the caller's loop.
No thread of the caller's (no ``run_in_executor``) is used: blocking metadata calls
run on the client's own metadata threads (``LedgerClient.metadata``). Exceptions: ``connect``
and closing a client (``AsyncBookKeeper.close``, or a log's ``close`` when the log was
opened from a URI) run the blocking connect and shutdown on the default executor;
``snapshot``, ``truncate``, ``latest_snapshot`` and ``snapshots`` run the synchronous
methods on a metadata thread of the client (they are blocking today). A
:class:`~walkit.wal.Snapshot` that is returned reads with blocking calls.

Appends do not go through ``asyncio.wrap_future``: that costs a condition on the writer's
future, a callback, and a wake-up of the caller's loop (a write to its self-pipe) for
every record - ~47 µs of CPU a record with 1,000 in flight. A log's appends from one event
loop go through a :class:`_Relay` instead: the writer's futures and the loop's futures
side by side in two queues, in append order, and one done-callback on the oldest writer
future still pending. The writer completes its futures in append order (entries complete
in order; a failed writer fails every pending record), so when that one is done, a run
of others usually is too: one wake-up of the caller's loop copies the results of every
done future at the front and arms the next. A cancelled asyncio future changes nothing
(the record is under way, as ``wrap_future``'s cancel of a started future did not stop
it either); its result is dropped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Coroutine, Iterable, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

from walkit.client import BookKeeper, Entry, LedgerClient, LedgerWriter, ReadState, check_payload, check_range
from walkit.errors import InvalidArgumentError, LedgerClosedError, UsageError, WalkitError
from walkit.metadata import LedgerMetadata
from walkit.wal import (
    LSN,
    LogReader,
    Snapshot,
    SnapshotData,
    SnapshotJob,
    WriteAheadLog,
    asnapshot_chunks,
    open_reader,
    wait_locked,
)

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

    @property
    def client(self) -> LedgerClient:
        """The async core this client runs on (``walkit.client.LedgerClient``), as ``sync.client``."""
        return self.sync.client

    async def create_ledger(self, ensemble_size: int = 3, write_quorum: int = 3, ack_quorum: int = 2,
                            digest: str = "crc32c", password: bytes = b"",
                            custom_metadata: Mapping[str, bytes] | None = None) -> AsyncLedgerHandle:
        client = self.client
        writer = await client.on_loop(client.create(ensemble_size, write_quorum, ack_quorum, digest, password,
                                                    custom_metadata))
        return AsyncLedgerHandle(client, writer)

    async def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> AsyncReadHandle:
        client = self.client
        return AsyncReadHandle(client, await client.on_loop(client.open(ledger_id, password, recovery)))

    async def delete_ledger(self, ledger_id: int) -> None:
        await self.client.on_loop(self.client.metadata(self.sync.delete_ledger, ledger_id))

    async def list_ledgers(self) -> list[int]:
        return await self.client.on_loop(self.client.metadata(lambda: list(self.sync.list_ledgers())))

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return await self.client.on_loop(self.client.metadata(self.sync.ledger_metadata, ledger_id))

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.sync.close)

    async def __aenter__(self) -> AsyncBookKeeper:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


async def _on_core(bk: BookKeeper, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``bk``'s loop and await it here (``LedgerClient.on_loop``)."""
    return await bk.client.on_loop(coro)


async def _read_chunks(client: LedgerClient, state: ReadState, first: int, last: int) -> AsyncIterator[Entry]:
    check_range(state.reader.ledger_id, first, last, state.lac)
    chunk = client.config.read_parallelism * 4
    start = first
    while start <= last:
        end = min(last, start + chunk - 1)
        for entry in await client.on_loop(state.read(start, end)):
            yield entry
        start = end + 1


class AsyncLedgerHandle:
    def __init__(self, client: LedgerClient, writer: LedgerWriter) -> None:
        self._client = client
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
        payload = check_payload(data, self._client.config.max_frame_size, self._writer.meta.digest)
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
        writer = self._writer
        state = self._client.read_state(writer.meta, writer.codec, writer.version, writer.lac)
        return [entry async for entry in _read_chunks(self._client, state, first, last)]

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._client.on_loop(self._writer.close())


class AsyncReadHandle:
    def __init__(self, client: LedgerClient, state: ReadState) -> None:
        self._client = client
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
        return _read_chunks(self._client, self._state, first, last)

    async def read_last_add_confirmed(self) -> int:
        return await self._client.on_loop(self._state.read_lac())

    async def wait_for_lac(self, previous: int, timeout: float) -> int:
        return await self._client.on_loop(self._state.wait_lac(previous, timeout))

    async def follow(self, start: int = 0, *, poll_timeout: float = 1.0) -> AsyncIterator[Entry]:
        """Entries from ``start`` on as the LAC passes them; ends once the ledger is
        closed and read to its end."""
        if not isinstance(start, int) or start < 0:
            raise InvalidArgumentError("follow starts at an entry id >= 0", start=start)
        next_id, limit = start, self._client.config.read_parallelism * 4
        while True:
            batch = await self._client.on_loop(self._state.follow_step(next_id, poll_timeout, limit))
            if batch is None:
                return
            for entry in batch:
                next_id = entry.entry_id + 1
                yield entry


# -- the write-ahead log -----------------------------------------------------------------------

async def _client_of(client_or_uri: AsyncBookKeeper | BookKeeper | str) -> tuple[BookKeeper, bool]:
    """The client a log handle runs on, and whether the handle owns it (made from a URI)."""
    if isinstance(client_or_uri, AsyncBookKeeper):
        return client_or_uri.sync, False
    if isinstance(client_or_uri, BookKeeper):
        return client_or_uri, False
    if isinstance(client_or_uri, str):
        return (await connect(client_or_uri)).sync, True
    raise InvalidArgumentError("expected a walkit.aio.AsyncBookKeeper, a walkit.BookKeeper or a metadata URI",
                               type=type(client_or_uri).__name__)


async def _close_owned(bk: BookKeeper, owned: bool) -> None:
    if owned:
        await AsyncBookKeeper(bk).close()


async def _blocking(bk: BookKeeper, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A blocking metadata call on ``bk``'s metadata threads (``LedgerClient.metadata``), awaited."""
    return await bk.client.on_loop(bk.client.metadata(functools.partial(fn, *args, **kwargs)))


class AsyncWriteAheadLog:
    """``walkit.WriteAheadLog`` for asyncio: ``await AsyncWriteAheadLog.open(...)``,
    ``await log.append(record)``, ``async for lsn, record in log.replay()``. The same
    errors as the synchronous log, raised at the same points: both drive one writer core
    (``WriteAheadLog.core``, walkit/wal/_writer.py), this one awaiting its coroutines."""

    def __init__(self, wal: WriteAheadLog) -> None:
        self.sync = wal  # the synchronous face of the same log (same core, same client)
        self.core = wal.core
        self._bk = wal.bookkeeper
        self._relay: _Relay | None = None  # the appends of the loop that appended last

    @classmethod
    async def open(cls, client_or_uri: AsyncBookKeeper | BookKeeper | str, name: str,
                   **options: Any) -> AsyncWriteAheadLog:
        """``WriteAheadLog.open`` (the same options)."""
        bk, owned = await _client_of(client_or_uri)
        try:
            return cls(await bk.client.on_loop(WriteAheadLog.opening(bk, owned, name, **options)))
        except BaseException:
            await _close_owned(bk, owned)
            raise

    @staticmethod
    async def reader(client_or_uri: AsyncBookKeeper | BookKeeper | str, name: str,
                     **options: Any) -> AsyncLogReader:
        """``WriteAheadLog.reader`` (the same options)."""
        bk, owned = await _client_of(client_or_uri)
        try:
            return AsyncLogReader(await _blocking(bk, open_reader, bk, owned, name, **options))
        except BaseException:
            await _close_owned(bk, owned)
            raise

    @property
    def name(self) -> str:
        return self.sync.name

    @property
    def epoch(self) -> int:
        return self.sync.epoch

    @property
    def last_lsn(self) -> LSN | None:
        return self.core.last_lsn

    async def append_async(self, record: bytes) -> asyncio.Future[LSN]:
        """Queue a record; the future gives its LSN once durable (in append order)."""
        return self._queued(record)

    async def append(self, record: bytes) -> LSN:
        """Append a record; its LSN once it is durable on a quorum of bookies."""
        return await self._queued(record)

    def _queued(self, record: bytes) -> asyncio.Future[LSN]:
        """(Caller's loop) ``record`` queued on the writer; its future on this loop."""
        loop = asyncio.get_running_loop()
        relay = self._relay
        if relay is None or relay.loop is not loop:  # another loop: the old relay finishes on its own
            relay = self._relay = _Relay(loop)
        return relay.add(self.core.append_async(record))

    async def append_many(self, records: Iterable[bytes]) -> list[LSN]:
        """Append ``records`` together (``WriteAheadLog.append_many``); their LSNs, in
        order, once the last of them is durable on a quorum."""
        return await asyncio.wrap_future(self.core.append_many(records))

    async def flush(self) -> LSN | None:
        """Wait until every record appended so far is durable; the last LSN."""
        return await self._bk.client.on_loop(self.core.flush())

    async def snapshot(self, data: SnapshotData | AsyncIterable[bytes], lsn: LSN) -> Snapshot:
        """``WriteAheadLog.snapshot``; ``data`` may also be an async iterable of byte chunks.
        Each step runs on the client's loop (walkit/wal/_snapshots.py)."""
        core, bk = self.core, self._bk
        on_loop = bk.client.on_loop
        core.check_snapshot(data, lsn)
        admin = core.admin
        async with wait_locked(admin.lock):
            await _blocking(bk, admin.check_snapshot_lsn, lsn)
            job = SnapshotJob(core.state, lsn)
            try:
                await on_loop(job.begin())
                async for chunk in asnapshot_chunks(data):
                    await on_loop(job.add(chunk))
                snapshot, pruned = await on_loop(job.commit())
            except BaseException as exc:
                admin.snapshot_failed(exc)
                with contextlib.suppress(UsageError):
                    await asyncio.shield(on_loop(job.abort()))
                raise
            await on_loop(admin.snapshotted(snapshot, pruned))
            return snapshot

    async def latest_snapshot(self) -> Snapshot | None:
        return await _blocking(self._bk, self.sync.latest_snapshot)

    async def snapshots(self) -> list[Snapshot]:
        return await _blocking(self._bk, self.sync.snapshots)

    def replay(self, after: LSN | None = None) -> AsyncGenerator[tuple[LSN, bytes], None]:
        """``async for lsn, record in log.replay(after)``: every durable record after ``after``."""
        return self.sync.replay_pass(after).arecords()

    async def truncate(self, before: LSN) -> int:
        """``WriteAheadLog.truncate`` (the cut on a metadata thread of the client)."""
        admin = self.core.admin
        self.core.check_truncate(before)
        async with wait_locked(admin.lock):
            return await _blocking(self._bk, admin.truncate_locked, before)

    async def close(self) -> None:
        """Wait for appended records, close the segment (carried through even if the caller
        is cancelled meanwhile)."""
        wal = self.sync
        if wal.closed:
            return
        try:
            await asyncio.shield(self._bk.client.on_loop(self.core.finish()))
        finally:
            await _close_owned(self._bk, wal.shut())

    async def __aenter__(self) -> AsyncWriteAheadLog:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc is None:
            await self.close()
        else:
            with contextlib.suppress(WalkitError):
                await self.close()


class _Relay:
    """(One caller's loop) the writer's futures of that loop's appends turned into futures
    of the loop, one wake-up a run of completed records (module docstring)."""

    __slots__ = ("loop", "_sources", "_futures", "_armed")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._sources: collections.deque[Future[LSN]] = collections.deque()  # the writer's, in append order
        self._futures: collections.deque[asyncio.Future[LSN]] = collections.deque()  # beside them: no pair a record
        self._armed = False  # the oldest pending writer future will wake the loop

    def add(self, source: Future[LSN]) -> asyncio.Future[LSN]:
        """The loop's future for the writer's ``source`` (appended after every other)."""
        fut: asyncio.Future[LSN] = self.loop.create_future()
        self._sources.append(source)
        self._futures.append(fut)
        if not self._armed:
            self._arm()
        return fut

    def _arm(self) -> None:
        self._armed = True
        self._sources[0].add_done_callback(self._wake)

    def _wake(self, _: Future[LSN]) -> None:
        """(The client's loop, or the caller's for a future already done) drain on the caller's loop."""
        if not self.loop.is_closed():  # as wrap_future: nobody is left to tell
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        """(Caller's loop) complete the futures whose writer futures are done, from the
        front; arm the next one still pending."""
        sources, futures = self._sources, self._futures
        while sources and sources[0].done():
            source, fut = sources.popleft(), futures.popleft()
            if fut.done():  # cancelled by its caller: the record is written all the same
                continue
            error = source.exception()
            if error is None:
                fut.set_result(source.result())
            else:
                fut.set_exception(error)
        self._armed = False
        if sources:
            self._arm()


class AsyncLogReader:
    """``walkit.wal.LogReader`` for asyncio: ``async for lsn, record in reader.tail()``."""

    def __init__(self, reader: LogReader) -> None:
        self.sync = reader  # the synchronous reader this drives
        self._bk = reader.bookkeeper

    @property
    def name(self) -> str:
        return self.sync.name

    def replay(self, after: LSN | None = None) -> AsyncGenerator[tuple[LSN, bytes], None]:
        """``async for lsn, record in reader.replay(after)``."""
        return self.sync.replay_pass(after).arecords()

    def tail(self, after: LSN | None = None, *,
             poll_timeout: float = 1.0) -> AsyncGenerator[tuple[LSN, bytes], None]:
        """``async for lsn, record in reader.tail(after)``: records as they become durable,
        for ever (``break``, ``aclose()`` or cancel the task to stop; closing the reader
        ends it with UsageError)."""
        return self.sync.tail_pass(after, poll_timeout).arecords()

    async def latest_snapshot(self) -> Snapshot | None:
        return await _blocking(self._bk, self.sync.latest_snapshot)

    async def snapshots(self) -> list[Snapshot]:
        return await _blocking(self._bk, self.sync.snapshots)

    async def position(self) -> LSN | None:
        """The named cursor's committed position (``LogReader.position``)."""
        return await _blocking(self._bk, lambda: self.sync.position)

    async def commit(self, lsn: LSN) -> None:
        """Store ``lsn`` as the named cursor's position (``LogReader.commit``)."""
        await _blocking(self._bk, self.sync.commit, lsn)

    async def delete_cursor(self) -> None:
        await _blocking(self._bk, self.sync.delete_cursor)

    async def close(self) -> None:
        """Close the reader: a tail under way ends (UsageError), holds are released."""
        reader, bk = self.sync, self._bk
        if bk.client.closed:  # nothing runs on that client any more: as the synchronous close does
            reader.close()
            return
        await _close_owned(bk, await _blocking(bk, reader.shut))

    async def __aenter__(self) -> AsyncLogReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
