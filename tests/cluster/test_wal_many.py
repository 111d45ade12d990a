"""``WriteAheadLog.append_many`` (issue 19): many records, one call, one future; packed
into entries with whatever else is queued, in call order, on both metadata drivers."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import walkit
from support.client import client, index_of, local_cluster
from support.metadata import Driver, driver  # noqa: F401  (fixture)
from walkit import LSN, WriteAheadLog
from walkit.client._submit import QuickFuture
from walkit.errors import InvalidArgumentError, UsageError, WriterFencedError
from walkit.wal._many import ManyFuture, complete_entry

pytestmark = pytest.mark.timeout(180)


# -- completing entries whose records were appended together -----------------------------------

@given(st.lists(st.integers(0, 6), min_size=1, max_size=12), st.lists(st.integers(1, 7), min_size=1, max_size=30))
def test_groups_complete_with_their_lsns_whatever_the_entry_boundaries(calls: list[int], cuts: list[int]) -> None:
    """Calls of 0 (an ``append_async``) or n records (an ``append_many``) queued in order,
    cut into entries anywhere: every future gets exactly its records' LSNs, in order,
    and a group completes only with its last entry."""
    slots: list[object] = []
    expected: list[tuple[object, int]] = []  # future, records
    for n in calls:
        fut: object = ManyFuture(n) if n else QuickFuture()
        slots += [fut] * max(n, 1)
        expected.append((fut, max(n, 1)))
    lsns: list[LSN] = []
    entry, start = 0, 0
    cut_iter = iter(cuts * len(slots))
    while start < len(slots):
        end = min(len(slots), start + next(cut_iter))
        complete_entry(slots[start:end], 1, entry)
        lsns += [LSN(1, entry, slot) for slot in range(end - start)]
        groups = {id(f): f for f in slots[end:] if isinstance(f, ManyFuture)}
        assert not any(f.done() for f in groups.values()), "a group completed before its last entry"
        entry, start = entry + 1, end
    at = 0
    for fut, n in expected:
        assert isinstance(fut, QuickFuture) and fut.done()
        want = lsns[at:at + n]
        assert fut.result() == (want if isinstance(fut, ManyFuture) else want[0])
        at += n


def test_a_groups_lsns_are_made_once_when_first_asked_for_by_any_waiter() -> None:
    """The completer notes runs only; the list is made by the first ``result()`` - a
    waiting thread, a done callback or an asyncio caller - and every caller gets that
    same list, also when several threads ask at once."""
    fut = ManyFuture(5)
    complete_entry([fut] * 2, 3, 7)
    complete_entry([fut] * 3, 3, 8)
    assert fut.done() and fut.runs == [(3, 7, 0, 2), (3, 8, 0, 3)]
    want = [LSN(3, 7, 0), LSN(3, 7, 1), LSN(3, 8, 0), LSN(3, 8, 1), LSN(3, 8, 2)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: fut.result(), range(64)))
    assert got[0] == want and all(g is got[0] for g in got)  # one list, made once
    assert all(lsn.__class__ is LSN for lsn in got[0])

    waiting = ManyFuture(2)  # asked for before it completes: a blocked waiter, a callback, asyncio
    seen: list[list[LSN]] = []
    waiting.add_done_callback(lambda f: seen.append(f.result()))
    waiter = concurrent.futures.ThreadPoolExecutor(1)
    blocked = waiter.submit(waiting.result, 10)

    async def main() -> list[LSN]:
        wrapped = asyncio.wrap_future(waiting)
        asyncio.get_running_loop().call_later(0.05, complete_entry, [waiting] * 2, 4, 0)
        return await wrapped

    assert asyncio.run(main()) == [LSN(4, 0, 0), LSN(4, 0, 1)]
    assert blocked.result(10) is seen[0] is waiting.result()
    waiter.shutdown()

    failed = ManyFuture(3)
    complete_entry([failed], 1, 0)
    failed.set_exception(WriterFencedError("fenced", log="x"))
    with pytest.raises(WriterFencedError):
        failed.result()


# -- on a cluster ------------------------------------------------------------------------------------

@pytest.fixture
def bk(tmp_path: Path, driver: Driver) -> Iterator[walkit.BookKeeper]:  # noqa: F811
    with local_cluster(tmp_path, driver, bookies=4) as cluster, client(cluster) as bk:
        bk.cluster = cluster  # type: ignore[attr-defined]
        yield bk


def test_append_many_in_order_with_single_appends_and_across_entries(bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "many", max_entry_bytes=4096) as wal:
        assert wal.append_many([]).result(timeout=30) == []
        single = wal.append_async(b"first")
        batch = [b"m%04d" % i + b"." * 90 for i in range(500)]  # ~50 KB: many entries of 4 KiB
        many = wal.append_many(iter(batch))  # any iterable
        after = [wal.append_async(b"after %d" % i) for i in range(50)]
        second = wal.append_many([bytearray(b"ba"), memoryview(b"mv")])
        lsns = many.result(timeout=60)
        assert len(lsns) == 500 and lsns == sorted(lsns) and lsns[0] > single.result(timeout=30)
        assert len({(lsn.segment, lsn.entry) for lsn in lsns}) >= 12, "a large batch spans several entries"
        assert [f.result(timeout=30) for f in after] == sorted(f.result() for f in after)
        assert after[0].result() > lsns[-1] and second.result(timeout=30)[0] > after[-1].result()
        assert wal.flush() == second.result()[-1] == wal.last_lsn
        replayed = dict(wal.replay())
        assert [replayed[lsn] for lsn in lsns] == batch
        assert [replayed[lsn] for lsn in second.result()] == [b"ba", b"mv"]
        assert list(replayed.values()) == [b"first", *batch, *(b"after %d" % i for i in range(50)), b"ba", b"mv"]


def test_a_flush_waits_for_a_group_without_making_its_lsns(bk: walkit.BookKeeper) -> None:
    """``flush()`` after ``append_many`` waits for the group on the client's loop without
    taking its result: the LSNs are made by the caller who asks for them, not there."""
    with WriteAheadLog.open(bk, "many-flush") as wal:
        many = wal.append_many([b"r%d" % i for i in range(300)])
        last = wal.flush()
        assert isinstance(many, ManyFuture) and many.done() and many.runs and many._result is None
        lsns = many.result()
        assert len(lsns) == 300 and lsns[-1] == last and not many.runs


def test_append_many_refuses_bad_input_whole(bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "strict", max_entry_bytes=4096, max_record_bytes=6000) as wal:
        lsn = wal.append(b"ok")
        with pytest.raises(InvalidArgumentError):
            wal.append_many([b"fine", "text"])  # type: ignore[list-item]
        with pytest.raises(InvalidArgumentError) as caught:
            wal.append_many([b"fine", b"x" * 8192])
        assert caught.value.context["size"] == 8192
        assert wal.flush() == lsn and [r for _, r in wal.replay()] == [b"ok"], "a refused batch queued records"
    with pytest.raises(UsageError):
        wal.append_many([b"closed"])


def test_append_many_survives_a_killed_bookie(bk: walkit.BookKeeper) -> None:
    cluster = bk.cluster  # type: ignore[attr-defined]
    with WriteAheadLog.open(bk, "durable") as wal:
        first = wal.append_many([b"a%d" % i for i in range(3000)])
        first.result(timeout=30)
        ensemble = bk.ledger_metadata(wal.metadata().segments[-1].ledger_id).ensembles[-1][1]
        cluster.kill_bookie(index_of(cluster, ensemble[0]))
        groups = [wal.append_many([b"g%d-%d" % (g, i) for i in range(200)]) for g in range(20)]
        records = dict(wal.replay()) if wal.flush() else {}
        for g, fut in enumerate(groups):
            assert [records[lsn] for lsn in fut.result(timeout=60)] == [b"g%d-%d" % (g, i) for i in range(200)]


def test_a_fenced_writer_fails_its_groups(bk: walkit.BookKeeper) -> None:
    old = WriteAheadLog.open(bk, "fenced")
    kept = old.append_many([b"k%d" % i for i in range(100)]).result(timeout=30)
    with WriteAheadLog.open(bk, "fenced") as new:
        late = old.append_many([b"late"] * 10)
        with pytest.raises(WriterFencedError):
            late.result(timeout=30)
        assert [r for _, r in new.replay()][:100] == [b"k%d" % i for i in range(100)]
        assert len(kept) == 100
    old.close()


def test_asyncio_append_many(bk: walkit.BookKeeper) -> None:
    from walkit.aio import AsyncWriteAheadLog

    async def main() -> None:
        async with await AsyncWriteAheadLog.open(bk, "async-many") as wal:
            lsns = await wal.append_many([b"x%d" % i for i in range(1000)])
            assert len(lsns) == 1000 and lsns == sorted(lsns)
            assert [r async for _, r in wal.replay()] == [b"x%d" % i for i in range(1000)]

    asyncio.run(asyncio.wait_for(main(), 120))
