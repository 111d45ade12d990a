"""One contract for both flavours of the write-ahead log: ``walkit.WriteAheadLog`` (sync)
and ``walkit.aio.AsyncWriteAheadLog`` (asyncio), driven through the same tests by a small
adapter (the ``flavour`` fixture). The asyncio flavour runs on an application event loop
whose executor refuses work: nothing of it may take a thread of the caller's (issue 20).
Then what only asyncio has: cancelling a tail, and no thread taken at all."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

import walkit
from support.client import client, local_cluster
from support.metadata import Driver, StoreSpec
from walkit import LSN, WriteAheadLog
from walkit.aio import AsyncBookKeeper, AsyncLogReader, AsyncWriteAheadLog
from walkit.errors import (
    InvalidArgumentError,
    NoSuchLedgerError,
    NoSuchLogError,
    UsageError,
    WriterFencedError,
)

pytestmark = pytest.mark.timeout(180)

T = TypeVar("T")
_END = object()


# -- the adapter --------------------------------------------------------------------------------

class Tail:
    """A tail consumed in the background (a thread, or a task on the application loop):
    what it hands over, in order, and how it ended."""

    def __init__(self) -> None:
        self.items: queue.Queue[object] = queue.Queue()
        self.stop: Callable[[], None] = lambda: None

    def next(self, timeout: float = 30.0) -> tuple[LSN, bytes]:
        item = self.items.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, tuple)
        return item


class Stream:
    """A replay (or tail) iterated one record at a time from the test's thread."""

    def __init__(self, step: Callable[[], object]) -> None:
        self._step = step

    def next(self) -> tuple[LSN, bytes]:
        item = self._step()
        if item is _END:
            raise StopIteration
        assert isinstance(item, tuple)
        return item

    def rest(self) -> list[tuple[LSN, bytes]]:
        out = []
        while (item := self._step()) is not _END:
            assert isinstance(item, tuple)
            out.append(item)
        return out


class SyncFlavour:
    name = "sync"

    def open(self, bk: walkit.BookKeeper, name: str, **options: Any) -> Any:
        return WriteAheadLog.open(bk, name, **options)

    def reader(self, bk: walkit.BookKeeper, name: str, **options: Any) -> Any:
        return WriteAheadLog.reader(bk, name, **options)

    def do(self, handle: Any, method: str, *args: Any) -> Any:
        return getattr(handle, method)(*args)

    def append_many(self, wal: Any, records: list[bytes]) -> list[LSN]:
        return wal.append_many(records).result(60)  # type: ignore[no-any-return]

    def replay(self, handle: Any, after: Any = None) -> list[tuple[LSN, bytes]]:
        return list(handle.replay(after))

    def stream(self, handle: Any, after: Any = None) -> Stream:
        records = handle.replay(after)
        return Stream(lambda: next(records, _END))

    def tail(self, reader: Any, after: LSN | None = None, poll_timeout: float = 0.3) -> Tail:
        tail = Tail()

        def consume() -> None:
            try:
                for item in reader.tail(after, poll_timeout=poll_timeout):
                    tail.items.put(item)
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                tail.items.put(exc)

        threading.Thread(target=consume, daemon=True, name="test-tail").start()
        return tail

    def sync_of(self, handle: Any) -> Any:
        return handle

    def close(self) -> None:
        pass


class _RefusingExecutor(concurrent.futures.ThreadPoolExecutor):
    """The application loop's default executor: any use is a failure of the test (it never
    starts a thread)."""

    def __init__(self, calls: list[str]) -> None:
        super().__init__(1)
        self.calls = calls

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        self.calls.append(getattr(fn, "__qualname__", repr(fn)))
        raise AssertionError("walkit.aio used an executor thread of the caller's loop")


class AsyncFlavour:
    """walkit.aio on an application event loop of its own (a thread standing for the
    application), whose executor refuses work and whose run_in_executor fails."""

    name = "async"

    def __init__(self) -> None:
        self.executor_calls: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(_RefusingExecutor(self.executor_calls))

        def refuse(executor: Any, fn: Any, *args: Any) -> Any:
            self.executor_calls.append(getattr(fn, "__qualname__", repr(fn)))
            raise AssertionError("walkit.aio called run_in_executor on the caller's loop")

        self.loop.run_in_executor = refuse  # type: ignore[method-assign, assignment]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="application-loop")
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 90.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def open(self, bk: walkit.BookKeeper, name: str, **options: Any) -> Any:
        return self.run(AsyncWriteAheadLog.open(bk, name, **options))

    def reader(self, bk: walkit.BookKeeper, name: str, **options: Any) -> Any:
        return self.run(AsyncWriteAheadLog.reader(bk, name, **options))

    def do(self, handle: Any, method: str, *args: Any) -> Any:
        return self.run(getattr(handle, method)(*args))

    def append_many(self, wal: Any, records: list[bytes]) -> list[LSN]:
        return self.run(wal.append_many(records))  # type: ignore[no-any-return]

    def replay(self, handle: Any, after: Any = None) -> list[tuple[LSN, bytes]]:
        async def collect() -> list[tuple[LSN, bytes]]:
            return [item async for item in handle.replay(after)]

        return self.run(collect())

    def stream(self, handle: Any, after: Any = None) -> Stream:
        records = handle.replay(after)

        async def step() -> object:
            try:
                return await records.__anext__()  # type: ignore[no-any-return]
            except StopAsyncIteration:
                return _END

        return Stream(lambda: self.run(step()))

    def tail(self, reader: Any, after: LSN | None = None, poll_timeout: float = 0.3) -> Tail:
        tail = Tail()

        async def consume() -> None:
            try:
                async for item in reader.tail(after, poll_timeout=poll_timeout):
                    tail.items.put(item)
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                tail.items.put(exc)

        task = asyncio.run_coroutine_threadsafe(consume(), self.loop)
        tail.stop = task.cancel
        return tail

    def sync_of(self, handle: Any) -> Any:
        return handle.sync

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        assert self.executor_calls == [], f"executor used for {self.executor_calls}"


Flavour = SyncFlavour | AsyncFlavour


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> Iterator[Flavour]:
    chosen: Flavour = SyncFlavour() if request.param == "sync" else AsyncFlavour()
    try:
        yield chosen
    finally:
        chosen.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[walkit.LocalCluster]:
    """The flavours are what differs here, not the metadata drivers (tests/cluster/test_wal.py runs both)."""
    with local_cluster(tmp_path, Driver(StoreSpec("local", str(tmp_path / "md"))), bookies=3) as cluster:
        yield cluster


@pytest.fixture
def bk(cluster: walkit.LocalCluster) -> Iterator[walkit.BookKeeper]:
    with client(cluster) as bk:
        yield bk


def _wait(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout} s")
        time.sleep(0.01)


# -- the contract -------------------------------------------------------------------------------

def test_appends_flush_and_replay(bk: walkit.BookKeeper, flavour: Flavour) -> None:
    wal = flavour.open(bk, "orders", roll_bytes=100, roll_seconds=3600)
    one = [flavour.do(wal, "append", b"r%d" % i) for i in range(10)]
    assert one == sorted(one) and len(set(one)) == 10 and len({lsn.segment for lsn in one}) >= 2  # rolled
    many = flavour.append_many(wal, [b"m%d" % i for i in range(500)])
    assert many == sorted(many) and many[0] > one[-1]
    assert flavour.do(wal, "flush") == many[-1] == flavour.sync_of(wal).last_lsn
    records = [b"r%d" % i for i in range(10)] + [b"m%d" % i for i in range(500)]
    replayed = flavour.replay(wal)
    assert replayed == list(zip(one + many, records))
    for i in (0, 4, 9, 10, 300, 509):
        assert flavour.replay(wal, (one + many)[i]) == replayed[i + 1:], f"after {(one + many)[i]}"
    reader = flavour.reader(bk, "orders")
    assert flavour.replay(reader) == replayed
    assert flavour.replay(reader, many[-1]) == []
    flavour.do(reader, "close")
    flavour.do(wal, "close")
    assert flavour.replay(flavour.reader(bk, "orders")) == replayed  # (an unclosed reader: nothing is held)


def test_bad_input_and_unknown_logs(bk: walkit.BookKeeper, flavour: Flavour) -> None:
    with pytest.raises(NoSuchLogError):
        flavour.reader(bk, "never-written")
    with pytest.raises(InvalidArgumentError):
        flavour.open(bk, "bad/name")
    with pytest.raises(InvalidArgumentError):
        flavour.open(bk, "fine", max_inflight_entries=0)
    wal = flavour.open(bk, "strict")
    lsn = flavour.do(wal, "append", b"ok")
    with pytest.raises(InvalidArgumentError):
        flavour.do(wal, "append", "text")
    with pytest.raises(InvalidArgumentError):
        flavour.append_many(wal, [b"fine", "text"])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError):
        flavour.replay(wal, "1/0/0")
    with pytest.raises(InvalidArgumentError):
        flavour.do(wal, "snapshot", b"state", "1/0/0")
    with pytest.raises(InvalidArgumentError):
        flavour.do(wal, "snapshot", b"state", LSN(lsn.segment, lsn.entry + 5, 0))
    with pytest.raises(InvalidArgumentError):
        flavour.do(wal, "truncate", 5)
    assert flavour.replay(wal) == [(lsn, b"ok")], "refused input queued nothing"
    flavour.do(wal, "close")


def test_closed_handles_refuse_use(bk: walkit.BookKeeper, flavour: Flavour) -> None:
    wal = flavour.open(bk, "closing")
    lsn = flavour.do(wal, "append", b"one")
    reader = flavour.reader(bk, "closing")
    flavour.do(wal, "close")
    flavour.do(wal, "close")  # twice: nothing more happens
    calls: list[Callable[[], object]] = [
        lambda: flavour.do(wal, "append", b"late"), lambda: flavour.append_many(wal, [b"late"]),
        lambda: flavour.replay(wal), lambda: flavour.do(wal, "snapshot", b"state", lsn),
        lambda: flavour.do(wal, "truncate", lsn)]
    for call in calls:
        with pytest.raises(UsageError):
            call()
    assert flavour.replay(reader) == [(lsn, b"one")]
    flavour.do(reader, "close")
    with pytest.raises(UsageError):
        flavour.replay(reader)
    with pytest.raises(UsageError):
        flavour.tail(reader).next()


def test_snapshot_truncate_and_reading_past_the_cut(bk: walkit.BookKeeper, flavour: Flavour) -> None:
    wal = flavour.open(bk, "snap", roll_bytes=300, roll_seconds=3600)
    assert flavour.do(wal, "latest_snapshot") is None
    records = [b"%03d" % i + b"." * 100 for i in range(20)]
    lsns = [flavour.do(wal, "append", record) for record in records]
    assert len({lsn.segment for lsn in lsns}) >= 4
    assert flavour.do(wal, "truncate", lsns[-1]) == 0  # no snapshot: nothing may go
    reader = flavour.reader(bk, "snap")
    replay = flavour.stream(reader)
    assert replay.next() == (lsns[0], records[0])  # a replay under way, in the first segment
    snap = flavour.do(wal, "snapshot", b"state", lsns[14])
    assert snap.lsn == lsns[14]
    latest = flavour.do(wal, "latest_snapshot")
    assert latest is not None and latest.lsn == lsns[14] and latest.read() == b"state"
    assert flavour.do(reader, "latest_snapshot").lsn == lsns[14]
    dropped = flavour.do(wal, "truncate", lsns[-1])
    assert dropped == len({lsn.segment for lsn in lsns if lsn.segment < lsns[14].segment}) > 0
    with pytest.raises(NoSuchLedgerError):
        replay.rest()  # its next segments are gone: said, never skipped
    with pytest.raises(InvalidArgumentError):
        flavour.replay(wal, lsns[0])  # those records are gone
    with pytest.raises(InvalidArgumentError):
        flavour.replay(reader)
    with pytest.raises(InvalidArgumentError):
        flavour.tail(reader).next()
    assert [r for _, r in flavour.replay(wal, snap.lsn)] == records[15:]
    assert [r for _, r in flavour.replay(reader, snap.lsn)] == records[15:]
    flavour.do(reader, "close")
    flavour.do(wal, "close")


def test_tail_follows_rolls_and_a_new_writer(bk: walkit.BookKeeper, cluster: walkit.LocalCluster,
                                             flavour: Flavour) -> None:
    wal = flavour.open(bk, "tailed", roll_bytes=500)
    before = flavour.do(wal, "append", b"before")
    reader = flavour.reader(bk, "tailed")
    tail = flavour.tail(reader)
    assert tail.next() == (before, b"before")
    sent = [b"t%02d" % i + b"-" * 100 for i in range(20)]
    lsns = [flavour.do(wal, "append", record) for record in sent]  # several rolls
    assert len({lsn.segment for lsn in lsns}) >= 3
    assert [tail.next() for _ in sent] == list(zip(lsns, sent))
    with client(cluster) as other:
        successor = flavour.open(other, "tailed")  # fences the first writer
        with pytest.raises(WriterFencedError):
            flavour.do(wal, "append", b"fenced")
        with pytest.raises(WriterFencedError):
            flavour.do(wal, "snapshot", b"state", lsns[-1])
        last = flavour.do(successor, "append", b"last")
        assert last.segment > lsns[-1].segment
        assert tail.next() == (last, b"last")
        flavour.do(successor, "close")
    flavour.do(wal, "close")  # a fenced writer closes without a word
    flavour.do(reader, "close")
    with pytest.raises(UsageError):
        tail.next(10)  # closing the reader ended the tail


def test_closing_a_reader_ends_a_waiting_tail(bk: walkit.BookKeeper, flavour: Flavour) -> None:
    wal = flavour.open(bk, "watched")
    one = flavour.do(wal, "append", b"one")
    flavour.do(wal, "close")  # its segment closed, no next one: the tail waits for the log to move on
    reader = flavour.reader(bk, "watched")
    tail = flavour.tail(reader, poll_timeout=0.3)
    assert tail.next() == (one, b"one")
    watch = flavour.sync_of(reader)._watch
    _wait(lambda: watch.waiting == 1, what="the tail waits on the node's watch")
    flavour.do(reader, "close")
    with pytest.raises(UsageError):
        tail.next(10)
    _wait(lambda: watch.version is None and watch._holders == 0, what="the tail released the watch")


# -- asyncio only ---------------------------------------------------------------------------------

async def _core_tasks(bk: walkit.BookKeeper) -> int:
    """The tasks on the client's loop (from the application's loop)."""

    async def count() -> int:
        return len(asyncio.all_tasks()) - 1  # this one aside

    return await asyncio.wrap_future(bk.client.loop.submit(count()))


async def _settled(bk: walkit.BookKeeper, baseline: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while (now := await _core_tasks(bk)) != baseline:
        assert time.monotonic() < deadline, f"{now - baseline} task(s) left on the client's loop"
        await asyncio.sleep(0.01)


def test_the_async_flavour_takes_no_thread(bk: walkit.BookKeeper, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole life of a log - open, appends, flush, replay, tail, snapshot, truncate,
    close - on an application loop: no executor thread, and no thread started from the
    application's loop (the client's loop starts its metadata threads as it needs them)."""
    started: list[tuple[str, str]] = []  # (the starting thread, the new one)
    start = threading.Thread.start

    def recorded(thread: threading.Thread) -> None:
        started.append((threading.current_thread().name, thread.name))
        start(thread)

    flavour = AsyncFlavour()
    monkeypatch.setattr(threading.Thread, "start", recorded)
    try:
        async def life() -> None:
            async with await AsyncWriteAheadLog.open(AsyncBookKeeper(bk), "threads", roll_bytes=200) as wal:
                lsns = [await wal.append(b"r%d" % i + b"." * 50) for i in range(10)]
                lsns += await wal.append_many([b"m%d" % i for i in range(100)])
                assert await wal.flush() == lsns[-1]
                assert len([item async for item in wal.replay()]) == 110
                async with await AsyncWriteAheadLog.reader(bk, "threads") as reader:
                    tail = reader.tail(lsns[-2], poll_timeout=0.2)
                    assert (await tail.__anext__())[0] == lsns[-1]
                    await tail.aclose()
                await wal.snapshot(b"state", lsns[50])
                assert await wal.truncate(lsns[-1]) > 0

        flavour.run(life())
        assert not [new for starter, new in started if starter == flavour.thread.name], started
    finally:
        monkeypatch.undo()
        flavour.close()


@pytest.mark.parametrize("how", ["cancel", "break", "aclose"])
def test_stopping_an_async_tail_leaves_nothing_running(bk: walkit.BookKeeper, how: str) -> None:
    wal = WriteAheadLog.open(bk, "stopped")
    first = wal.append(b"one")

    async def scenario() -> None:
        reader = await AsyncWriteAheadLog.reader(bk, "stopped")
        watch = reader.sync._watch
        baseline = await _core_tasks(bk)
        got: list[bytes] = []
        if how == "cancel":
            async def consume() -> None:
                async for _, record in reader.tail(poll_timeout=60.0):  # a poll that is never waited out
                    got.append(record)

            task = asyncio.ensure_future(consume())
            while not got:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # long-polling on the client's loop now
            assert await _core_tasks(bk) > baseline
            began = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        elif how == "break":
            async for lsn, record in reader.tail(poll_timeout=60.0):
                assert lsn == first
                break
            began = time.monotonic()
        else:
            tail = reader.tail(poll_timeout=60.0)
            assert await tail.__anext__() == (first, b"one")
            began = time.monotonic()
            await tail.aclose()
            assert watch._holders == 0, "aclose() returns once the tail is over on the client's loop"
        await _settled(bk, baseline)
        while watch._holders and time.monotonic() - began < 2.0:  # released on a metadata thread, just after
            await asyncio.sleep(0.01)
        assert time.monotonic() - began < 2.0, "the tail did not stop promptly"
        assert watch._holders == 0 and watch.version is None, "the tail's watch outlived it"
        # the reader goes on working, and so does a new tail
        tail = reader.tail(first, poll_timeout=0.2)
        pending = asyncio.ensure_future(tail.__anext__())
        await asyncio.sleep(0.1)
        wal.append_async(b"two")
        lsn, record = await asyncio.wait_for(pending, 30)
        assert record == b"two" and lsn > first
        await tail.aclose()
        await reader.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    wal.close()


def test_an_async_tail_hears_another_client(bk: walkit.BookKeeper, cluster: walkit.LocalCluster) -> None:
    async def scenario() -> None:
        async with await walkit.aio.connect(cluster.metadata_uri, read_timeout=2.0) as writer_bk:
            async with await AsyncWriteAheadLog.open(writer_bk, "shared") as wal:
                await wal.append(b"first")
                reader: AsyncLogReader = await AsyncWriteAheadLog.reader(AsyncBookKeeper(bk), "shared")
                tail = reader.tail(poll_timeout=0.3)
                assert (await tail.__anext__())[1] == b"first"
                pending = asyncio.ensure_future(tail.__anext__())
                await asyncio.sleep(0.5)  # the tail waits for the next record
                assert not pending.done()
                lsn = await wal.append(b"from the other client")
                assert await asyncio.wait_for(pending, 10) == (lsn, b"from the other client")
                await tail.aclose()
                await reader.close()

    asyncio.run(asyncio.wait_for(scenario(), 90))


def test_snapshots_kept_streamed_and_a_failed_one_cleaned_up(bk: walkit.BookKeeper, flavour: Flavour) -> None:
    wal = flavour.open(bk, "kept", snapshots_kept=2)
    lsns = [flavour.do(wal, "append", b"r%d" % i) for i in range(4)]
    before = set(bk.list_ledgers())

    def failing() -> Iterator[bytes]:
        yield b"half"
        raise OSError("the state went away")

    with pytest.raises(OSError):
        flavour.do(wal, "snapshot", failing(), lsns[0])
    assert flavour.do(wal, "snapshots") == [] and set(bk.list_ledgers()) == before  # never listed, deleted
    for i, lsn in enumerate(lsns[1:]):
        flavour.do(wal, "snapshot", iter([b"state ", b"%d" % i]), lsn)
    kept = flavour.do(wal, "snapshots")
    assert [s.lsn for s in kept] == lsns[2:] and [s.read() for s in kept] == [b"state 1", b"state 2"]
    assert b"".join(kept[0].chunks()) == b"state 1"
    flavour.do(wal, "close")


def test_a_named_cursor_holds_its_position(bk: walkit.BookKeeper, flavour: Flavour) -> None:
    wal = flavour.open(bk, "cursor", roll_bytes=300, retention=walkit.Retention(before_snapshot=True))
    lsns = [flavour.do(wal, "append", b"%03d" % i + b"." * 100) for i in range(12)]
    reader = flavour.reader(bk, "cursor", cursor="indexer")
    flavour.do(reader, "commit", lsns[2])
    flavour.do(wal, "snapshot", b"s", lsns[-1])
    assert flavour.do(wal, "truncate", lsns[-1]) == lsns[2].segment - 1  # not past the cursor
    assert [lsn for lsn, _ in flavour.replay(reader, lsns[2])] == lsns[3:]
    with WriteAheadLog.reader(bk, "cursor", cursor="indexer") as same:
        assert same.position == lsns[2]
    flavour.do(reader, "delete_cursor")
    flavour.do(reader, "close")
    flavour.do(wal, "close")


def test_an_async_snapshot_streams_from_an_async_iterable(bk: walkit.BookKeeper) -> None:
    async def run() -> bytes:
        async with await AsyncWriteAheadLog.open(bk, "async-stream") as wal:
            lsn = await wal.append(b"x")

            async def chunks() -> Any:
                for i in range(3):
                    yield b"%d" % i * (600 << 10)

            snap = await wal.snapshot(chunks(), lsn)
            assert snap.size == 3 * (600 << 10)
            return b"".join(snap.chunks())

    assert asyncio.run(run()) == b"".join(b"%d" % i * (600 << 10) for i in range(3))
