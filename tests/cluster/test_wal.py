"""WriteAheadLog (issue 6): LSNs, batched appends, rolling, snapshots, replay, tailing,
writer failover, retention and namespaces, on an in-process LocalCluster."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import walkit
from support.client import client, index_of, local_cluster
from support.metadata import Driver, driver  # noqa: F401  (fixture)
from walkit import LSN, WriteAheadLog
from walkit.client import LedgerClient
from walkit.errors import (
    FormatError,
    InvalidArgumentError,
    NoSuchLedgerError,
    NoSuchLogError,
    UsageError,
    WriterFencedError,
)
from walkit.wal import LogMetadata, LogReader, delete_log, list_logs, set_namespace_defaults
from walkit.wal import _node as wal_node
from walkit.wal import _readers as wal_readers
from walkit.wal._format import pack_records, unpack_records

pytestmark = pytest.mark.timeout(180)


# -- pure parts ----------------------------------------------------------------------------------

@given(st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 2**20))
def test_lsn_text_round_trip(segment: int, entry: int, slot: int) -> None:
    lsn = LSN(segment, entry, slot)
    assert LSN.parse(str(lsn)) == lsn and hash(LSN.parse(str(lsn))) == hash(lsn)


def test_lsn_order_and_bad_text() -> None:
    assert LSN(1, 5, 9) < LSN(1, 6, 0) < LSN(2, 0, 0)
    assert sorted([LSN(2, 0, 0), LSN(1, 0, 1), LSN(1, 0, 0)]) == [LSN(1, 0, 0), LSN(1, 0, 1), LSN(2, 0, 0)]
    for text in ("", "1/2", "1/2/3/4", "a/b/c", "-1/0/0", " 1/2/3"):
        with pytest.raises(InvalidArgumentError):
            LSN.parse(text)
    with pytest.raises(InvalidArgumentError):
        LSN(-1, 0, 0)


@given(st.lists(st.binary(max_size=300), max_size=50))
def test_record_batches_round_trip(records: list[bytes]) -> None:
    assert unpack_records(pack_records(records)) == records


@given(st.lists(st.binary(max_size=300), max_size=50))
def test_version_1_record_batches_are_still_read(records: list[bytes]) -> None:
    v1 = b"WKRB\x01" + struct.pack(">I", len(records)) + b"".join(struct.pack(">I", len(r)) + r for r in records)
    assert unpack_records(v1) == records
    assert unpack_records(memoryview(pack_records(records))) == records
    with pytest.raises(FormatError):
        unpack_records(v1 + b"x")
    with pytest.raises(FormatError):
        unpack_records(b"WKRB\x03" + v1[5:])  # a version from the future


@given(st.lists(st.binary(min_size=1, max_size=50), min_size=1, max_size=10), st.data())
def test_damaged_record_batches_are_refused(records: list[bytes], data: st.DataObject) -> None:
    packed = pack_records(records)
    cut = data.draw(st.integers(0, len(packed) - 1))
    with pytest.raises(FormatError):
        unpack_records(packed[:cut])
    with pytest.raises(FormatError):
        unpack_records(packed + b"x")


# -- with a cluster -----------------------------------------------------------------------------

@pytest.fixture
def bk(tmp_path: Path, driver: Driver) -> Iterator[walkit.BookKeeper]:
    with local_cluster(tmp_path, driver, bookies=4) as cluster, client(cluster) as bk:
        bk.cluster = cluster  # type: ignore[attr-defined]
        yield bk


def test_replay_after_any_lsn_gives_exactly_the_records_after_it(bk: walkit.BookKeeper) -> None:
    """Entries of several records, across two segments: replay(after=x) for every LSN x
    (and for points between and past them) is the suffix after x, with its LSNs."""
    with WriteAheadLog.open(bk, "suffixes", roll_bytes=60, roll_seconds=3600) as wal:
        lsns = wal.append_many([b"a%d" % i for i in range(4)]).result(30)
        lsns += wal.append_many([b"b%d" % i for i in range(3)]).result(30)
        lsns.append(wal.append(b"c"))
        lsns += wal.append_many([b"d%d" % i for i in range(3)]).result(30)
        records = [b"a%d" % i for i in range(4)] + [b"b%d" % i for i in range(3)] + [b"c"] + \
            [b"d%d" % i for i in range(3)]
        assert len({(lsn.segment, lsn.entry) for lsn in lsns}) >= 4 and len({lsn.segment for lsn in lsns}) >= 2
        assert list(wal.replay()) == list(zip(lsns, records))
        for i, lsn in enumerate(lsns):
            assert list(wal.replay(after=lsn)) == list(zip(lsns, records))[i + 1:], f"after {lsn}"
            between = LSN(lsn.segment, lsn.entry, lsn.slot + 100)  # past the entry's last slot
            assert [r for _, r in wal.replay(after=between)] == \
                [r for later, r in zip(lsns, records) if (later.segment, later.entry) > (lsn.segment, lsn.entry)]


def test_append_replay_and_batching(bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "orders") as wal:
        first = [wal.append(b"r%d" % i) for i in range(20)]
        assert first == sorted(first) and len(set(first)) == 20
        assert all(lsn.slot == 0 for lsn in first)  # one at a time: one entry each
        futures = [wal.append_async(b"b%d" % i) for i in range(3000)]
        lsns = [f.result(timeout=60) for f in futures]
        assert lsns == sorted(lsns) and lsns[0] > first[-1]
        entries = {(lsn.segment, lsn.entry) for lsn in lsns}
        assert len(entries) < len(lsns)  # records in flight together share entries
        assert wal.flush() == lsns[-1] == wal.last_lsn
        replayed = list(wal.replay())
        assert [r for _, r in replayed] == [b"r%d" % i for i in range(20)] + [b"b%d" % i for i in range(3000)]
        assert [lsn for lsn, _ in replayed] == first + lsns
        assert [r for _, r in wal.replay(after=lsns[99])] == [b"b%d" % i for i in range(100, 3000)]
    reader = WriteAheadLog.reader(bk, "orders")
    assert len(list(reader.replay())) == 3020
    reader.close()


def test_records_replayed_from_runs_are_bytes_of_their_own(bk: walkit.BookKeeper) -> None:
    """Where E = Qw a pass reads in runs and its reader's entries are views of the answers'
    frames (``payload_views``): every record it hands out - of a one-record entry, of a
    batch, reassembled from fragments - is ``bytes`` of its own, equal to what was
    appended, from a replay, a reader's replay and a tail alike."""
    big = bytes(range(256)) * 40  # 10 KiB: fragments of an entry of 4 KiB at most
    with WriteAheadLog.open(bk, "own-bytes", ensemble_size=3, write_quorum=3, ack_quorum=2,
                            max_entry_bytes=4096) as wal:
        lsns = [wal.append(b"one%d" % i) for i in range(5)]
        lsns += wal.append_many([b"many%d" % i for i in range(50)]).result(30)
        lsns.append(wal.append(big))
        lsns.append(wal.append(b"last"))
        expected = [b"one%d" % i for i in range(5)] + [b"many%d" % i for i in range(50)] + [big, b"last"]
        with WriteAheadLog.reader(bk, "own-bytes") as reader:
            tail = reader.tail(poll_timeout=0.2)
            passes = {"replay": list(wal.replay()), "reader": list(reader.replay()),
                      "tail": [next(tail) for _ in expected]}
        for name, got in passes.items():
            assert got == list(zip(lsns, expected)), name
            assert all(type(record) is bytes for _, record in got), name


def test_bad_input_is_refused_and_loses_nothing(bk: walkit.BookKeeper) -> None:
    with pytest.raises(InvalidArgumentError):
        WriteAheadLog.open(bk, "bad/name")
    with pytest.raises(NoSuchLogError):
        WriteAheadLog.reader(bk, "never-written")
    with WriteAheadLog.open(bk, "strict", max_entry_bytes=4096, max_record_bytes=6000) as wal:
        lsn = wal.append(b"ok")
        with pytest.raises(InvalidArgumentError):
            wal.append("text")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            wal.append(b"x" * 8192)  # over max_record_bytes (over an entry is fine: tests/cluster/test_wal_large.py)
        with pytest.raises(InvalidArgumentError):
            wal.snapshot(b"state", LSN(lsn.segment, lsn.entry + 5, 0))
        assert [r for _, r in wal.replay()] == [b"ok"]
    with pytest.raises(UsageError):
        wal.append(b"closed")


def test_rolling_by_size_and_age_keeps_order(bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "rolling", roll_bytes=20_000, roll_seconds=3600, max_entry_bytes=4096) as wal:
        lsns = [f.result(timeout=60) for f in [wal.append_async(b"x" * 500 + b"%d" % i) for i in range(300)]]
        assert len({lsn.segment for lsn in lsns}) >= 3
        assert max(lsn.slot for lsn in lsns) < 4096 // (503 + 4)  # queued records split to fit an entry
        assert lsns == sorted(lsns)
        assert len(wal.metadata().segments) >= 3
        assert [r for _, r in wal.replay()] == [b"x" * 500 + b"%d" % i for i in range(300)]
    with WriteAheadLog.open(bk, "aging", roll_seconds=0.2) as wal:
        a = wal.append(b"a")
        time.sleep(0.3)
        b = wal.append(b"b")
        assert b.segment == a.segment + 1


def test_snapshots_and_truncation(bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "snap", roll_bytes=5_000) as wal:
        assert wal.latest_snapshot() is None
        lsns = [wal.append(b"%04d" % i + b"." * 200) for i in range(100)]
        assert wal.truncate(lsns[-1]) == 0  # no snapshot: nothing may go
        state = b"S" * (3 << 20) + b"end"  # several chunks
        snap = wal.snapshot(io.BytesIO(state), lsns[59])
        assert snap.lsn == lsns[59] and snap.size == len(state)
        latest = wal.latest_snapshot()
        assert latest is not None and latest.lsn == lsns[59] and latest.read() == state
        with latest.open() as stream:
            assert stream.read(5) == b"SSSSS" and len(stream.read()) == len(state) - 5
        with pytest.raises(InvalidArgumentError):
            wal.snapshot(b"older", lsns[10])
        segments_before = wal.metadata().segments
        dropped = wal.truncate(lsns[-1])  # only below the snapshot
        after = wal.metadata()
        assert dropped == len([s for s in segments_before if s.seq < lsns[59].segment]) > 0
        assert all(s.seq >= lsns[59].segment for s in after.segments)
        for gone in segments_before[:dropped]:
            with pytest.raises(NoSuchLedgerError):
                bk.ledger_metadata(gone.ledger_id)
        assert [r for _, r in wal.replay(after=snap.lsn)] == [b"%04d" % i + b"." * 200 for i in range(60, 100)]
        with pytest.raises(InvalidArgumentError):
            list(wal.replay(after=lsns[0]))  # those records are gone
        newer = wal.snapshot(b"newer", lsns[80])
        assert [s.lsn for s in wal.snapshots()] == [snap.lsn, newer.lsn]  # snapshots_kept: 2
        newest = wal.snapshot(iter([b"new", b"est"]), lsns[90])
        with pytest.raises(NoSuchLedgerError):
            bk.ledger_metadata(snap.ledger_id)  # the snapshot pushed out: its ledger is deleted
        assert [s.lsn for s in wal.snapshots()] == [newer.lsn, newest.lsn]
        assert wal.latest_snapshot().read() == b"newest"  # type: ignore[union-attr]


def test_failover_fences_the_old_writer_and_keeps_every_acknowledged_record(bk: walkit.BookKeeper) -> None:
    cluster = bk.cluster  # type: ignore[attr-defined]
    with client(cluster) as other:
        old = WriteAheadLog.open(other, "kv")
        acked = [old.append(b"a%d" % i) for i in range(50)]
        in_flight = [old.append_async(b"f%d" % i) for i in range(200)]
        new = WriteAheadLog.open(bk, "kv")
        assert new.epoch == old.epoch + 1
        with pytest.raises(WriterFencedError):
            old.append(b"after failover")
        with pytest.raises(WriterFencedError):
            old.append(b"never again")
        with pytest.raises(WriterFencedError):
            old.snapshot(b"state", acked[-1])
        records = dict(new.replay())
        assert all(records[lsn] == b"a%d" % i for i, lsn in enumerate(acked))
        for i, fut in enumerate(in_flight):
            if fut.exception(timeout=30) is None:  # acknowledged: must be there
                assert records[fut.result()] == b"f%d" % i
        new_lsn = new.append(b"new writer")
        assert new_lsn.segment > max(lsn.segment for lsn in records)
        old.close()
        new.close()


def test_reader_tails_across_rolls_and_failover(bk: walkit.BookKeeper) -> None:
    cluster = bk.cluster  # type: ignore[attr-defined]
    wal = WriteAheadLog.open(bk, "tailed", roll_bytes=2_000)
    wal.append(b"before")
    reader = WriteAheadLog.reader(bk, "tailed")
    seen: list[bytes] = []

    def follow() -> None:
        for _, record in reader.tail(poll_timeout=0.3):
            seen.append(record)
            if record == b"last":
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    for i in range(40):
        wal.append(b"t%03d" % i + b"-" * 100)  # several rolls
    with client(cluster) as other:
        successor = WriteAheadLog.open(other, "tailed")
        successor.append(b"last")
        thread.join(30)
        assert not thread.is_alive()
        assert seen == [b"before"] + [b"t%03d" % i + b"-" * 100 for i in range(40)] + [b"last"]
        successor.close()
    reader.close()
    with pytest.raises(WriterFencedError):
        wal.append(b"fenced")
    wal.close()


def test_a_tail_learns_of_a_new_segment_from_the_node_watch(bk: walkit.BookKeeper,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wal_readers, "POLL", 120.0)  # the node is not read again on a timer within this test
    cluster = bk.cluster  # type: ignore[attr-defined]
    wal = WriteAheadLog.open(bk, "watched")
    wal.append(b"one")
    wal.close()  # its segment closed, no next one: a tail has to wait for the log to move on
    reader = WriteAheadLog.reader(bk, "watched")
    seen: list[bytes] = []
    ended: list[BaseException] = []

    def follow(tail: LogReader) -> None:
        try:
            for _, record in tail.tail(poll_timeout=0.3):
                seen.append(record)
                if record == b"two":
                    return
        except BaseException as exc:  # noqa: BLE001 - looked at below
            ended.append(exc)

    thread = threading.Thread(target=follow, args=(reader,), daemon=True)
    thread.start()
    for _ in range(200):
        if seen:
            break
        time.sleep(0.05)
    assert seen == [b"one"]
    time.sleep(0.5)  # the tail now waits on the node's watch
    with client(cluster) as other:
        successor = WriteAheadLog.open(other, "watched")  # epoch bumped, segment 2 added
        successor.append(b"two")
        thread.join(30)
        assert not thread.is_alive(), "the new segment was not noticed (no watch: the next read is 120 s away)"
        assert seen == [b"one", b"two"] and not ended
        successor.close()
    # closing a reader ends its tail at once, even while it waits for the log to move on
    last = max(lsn for lsn, _ in reader.replay())

    def wait_on() -> None:
        try:
            for _, record in reader.tail(last, poll_timeout=0.3):
                seen.append(record)
        except BaseException as exc:  # noqa: BLE001 - looked at below
            ended.append(exc)

    seen.clear()
    waiting = threading.Thread(target=wait_on, daemon=True)
    waiting.start()
    for _ in range(400):  # past the successor's closed segment: waiting on the node's watch
        if reader._watch.waiting:
            break
        time.sleep(0.05)
    assert reader._watch.waiting == 1
    reader.close()
    waiting.join(10)
    assert not waiting.is_alive() and seen == [] and len(ended) == 1 and isinstance(ended[0], UsageError)


def test_a_tail_leaves_a_rolled_segment_without_waiting_out_its_long_poll(bk: walkit.BookKeeper) -> None:
    wal = WriteAheadLog.open(bk, "rolling", roll_bytes=200)
    first = wal.append(b"r00" + b"-" * 24)
    reader = WriteAheadLog.reader(bk, "rolling")
    records = [b"r%02d" % i + b"-" * 24 for i in range(30)]
    seen: list[bytes] = []
    failed: list[BaseException] = []

    def follow() -> None:
        try:
            for _, record in reader.tail(poll_timeout=120.0):  # a poll is never waited out within this test
                seen.append(record)
                if record == records[-1]:
                    return
        except BaseException as exc:  # noqa: BLE001 - looked at below
            failed.append(exc)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    for record in records[1:]:
        wal.append(record)
        time.sleep(0.02)  # the tail catches up and long-polls between appends, across every roll
    thread.join(30)
    assert not failed, failed
    assert not thread.is_alive(), f"stuck after {len(seen)} records: a closed segment's poll was waited out"
    assert seen == records and first.segment == 1 and len(wal.metadata().segments) >= 3
    assert reader._watch.version is None, "the tail is over: its watch stopped with it"
    reader.close()
    wal.close()


def test_a_killed_bookie_loses_no_acknowledged_record(bk: walkit.BookKeeper) -> None:
    cluster = bk.cluster  # type: ignore[attr-defined]
    with WriteAheadLog.open(bk, "durable") as wal:
        futures = [wal.append_async(b"d%d" % i) for i in range(2000)]
        futures[100].result(timeout=30)
        ensemble = bk.ledger_metadata(wal.metadata().segments[-1].ledger_id).ensembles[-1][1]
        cluster.kill_bookie(index_of(cluster, ensemble[0]))
        futures += [wal.append_async(b"d%d" % i) for i in range(2000, 3000)]
        lsns = [f.result(timeout=60) for f in futures]
        records = dict(wal.replay())
        assert [records[lsn] for lsn in lsns] == [b"d%d" % i for i in range(3000)]


def test_namespaces_list_delete_and_defaults(bk: walkit.BookKeeper) -> None:
    set_namespace_defaults(bk, "tenants", ensemble_size=3, write_quorum=2, ack_quorum=2, roll_bytes=1 << 20)
    with WriteAheadLog.open(bk, "alpha", namespace="tenants") as alpha:
        alpha.append(b"a")
        assert alpha.settings.write_quorum == 2 and alpha.settings.roll_bytes == 1 << 20
    with WriteAheadLog.open(bk, "beta", namespace="tenants", write_quorum=3) as beta:
        beta.append(b"b")
        assert beta.settings.write_quorum == 3
        ledgers = [s.ledger_id for s in beta.metadata().segments]
    assert list_logs(bk, "tenants") == ["alpha", "beta"]
    assert list_logs(bk, "empty") == []
    delete_log(bk, "tenants", "beta")
    assert list_logs(bk, "tenants") == ["alpha"]
    for ledger_id in ledgers:
        with pytest.raises(NoSuchLedgerError):
            bk.ledger_metadata(ledger_id)
    with pytest.raises(NoSuchLogError):
        delete_log(bk, "tenants", "beta")
    with pytest.raises(InvalidArgumentError):
        set_namespace_defaults(bk, "tenants", nonsense=1)


def test_asyncio_write_ahead_log(bk: walkit.BookKeeper) -> None:
    import asyncio

    from walkit.aio import AsyncWriteAheadLog

    async def main() -> None:
        async with await AsyncWriteAheadLog.open(bk, "async-log") as wal:
            first = await wal.append(b"one")
            pending = [await wal.append_async(b"n%d" % i) for i in range(100)]
            lsns = await asyncio.gather(*pending)
            assert lsns == sorted(lsns) and lsns[0] > first
            assert await wal.flush() == lsns[-1]
            assert [r async for _, r in wal.replay()] == [b"one"] + [b"n%d" % i for i in range(100)]
            snap = await wal.snapshot(b"state", lsns[-1])
            assert (await wal.latest_snapshot()).lsn == snap.lsn  # type: ignore[union-attr]
            reader = await AsyncWriteAheadLog.reader(bk, "async-log")
            tail = reader.tail(lsns[-1], poll_timeout=0.3)
            await wal.append(b"tailed")
            lsn, record = await asyncio.wait_for(tail.__anext__(), 30)
            assert record == b"tailed" and lsn > lsns[-1]
            await reader.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def test_asyncio_appends_in_flight_keep_order_values_and_survive_cancellation(bk: walkit.BookKeeper) -> None:
    """The relay (walkit/aio.py): thousands in flight, mixed with awaited appends and the
    synchronous face's, complete in append order with the LSNs replay gives; a cancelled
    future's record is written all the same; a second event loop gets its own relay."""
    import asyncio

    from walkit.aio import AsyncWriteAheadLog

    wal: AsyncWriteAheadLog | None = None

    async def first() -> list[LSN]:
        nonlocal wal
        wal = await AsyncWriteAheadLog.open(bk, "async-window")
        pending: list[asyncio.Future[LSN]] = []
        awaited: list[LSN] = []
        for i in range(3000):
            pending.append(await wal.append_async(b"a%d" % i))
            if i == 1500:  # not done: the loop has not run since it was queued
                assert pending[-1].cancel()  # its record goes all the same
            if i % 1000 == 999:  # an awaited append behind a thousand queued ones
                awaited.append(await wal.append(b"w%d" % i))
        sync = wal.sync.append_async(b"sync")  # the synchronous face of the same writer
        cancelled = pending[1500]
        lsns = await asyncio.gather(*(f for f in pending if f is not cancelled))
        lsns.insert(1500, LSN(0, 0, 0))
        assert all(lsns[i] < awaited[0] for i in range(1000)) and lsns[1000] > awaited[0]
        assert sync.result(timeout=30) > max(lsns[-1], awaited[-1])
        return [*lsns[:1000], awaited[0], *lsns[1000:2000], awaited[1], *lsns[2000:], awaited[2], sync.result()]

    async def second() -> LSN:
        assert wal is not None
        futures = [await wal.append_async(b"b%d" % i) for i in range(10)]  # a new loop: a new relay
        lsns = await asyncio.gather(*futures)
        assert lsns == sorted(lsns)
        await wal.close()
        return lsns[0]

    lsns = asyncio.run(asyncio.wait_for(first(), 120))
    after = asyncio.run(asyncio.wait_for(second(), 60))
    assert after > lsns[-1]
    expected = [*(b"a%d" % i for i in range(1000)), b"w999", *(b"a%d" % i for i in range(1000, 2000)), b"w1999",
                *(b"a%d" % i for i in range(2000, 3000)), b"w2999", b"sync"]
    reader = WriteAheadLog.reader(bk, "async-window")
    replayed = list(reader.replay())
    reader.close()
    assert [r for _, r in replayed[:len(expected)]] == expected
    replayed_lsns = [lsn for lsn, _ in replayed[:len(expected)]]
    unknown = lsns.index(LSN(0, 0, 0))  # the cancelled one's: only replay tells it
    assert replayed[unknown][1] == b"a1500"
    lsns[unknown] = replayed_lsns[unknown]
    assert replayed_lsns == lsns


def test_a_fenced_asyncio_writer_fails_every_pending_append(bk: walkit.BookKeeper) -> None:
    """Every asyncio append either got an LSN that replay holds or the writer's error,
    and every one queued after the fence fails with it (their futures already done when
    queued: the relay wakes on its own loop)."""
    import asyncio

    from walkit.aio import AsyncWriteAheadLog

    cluster = bk.cluster  # type: ignore[attr-defined]

    async def main() -> None:
        with client(cluster) as other:
            old = await AsyncWriteAheadLog.open(other, "async-fenced")
            before = [await old.append_async(b"f%d" % i) for i in range(500)]
            new = await AsyncWriteAheadLog.open(bk, "async-fenced")
            with pytest.raises(WriterFencedError):
                await old.append(b"fenced")
            after = [await old.append_async(b"x%d" % i) for i in range(300)]
            outcomes = await asyncio.gather(*before, *after, return_exceptions=True)
            assert all(isinstance(o, WriterFencedError) for o in outcomes[500:])
            records = {lsn: record async for lsn, record in new.replay()}
            for i, outcome in enumerate(outcomes[:500]):
                if not isinstance(outcome, BaseException):
                    assert records[outcome] == b"f%d" % i
                else:
                    assert isinstance(outcome, WriterFencedError)
            await old.close()
            await new.close()

    asyncio.run(asyncio.wait_for(main(), 120))


# -- review findings: lost replies, races, refusals ------------------------------------------------

def _lose_next_reply(wal: WriteAheadLog) -> None:
    """The next write of the log node lands but reports a lost compare-and-set (what a
    ZooKeeper retry after a dropped connection sees)."""
    from walkit.errors import MetadataVersionError

    _fail_write(wal._node, [MetadataVersionError("simulated lost reply")], lands=True)


def _fail_write(node: object, errors: list[Exception], *, lands: bool, skip: int = 0) -> None:
    """The log node's writes after the next ``skip`` fail with ``errors`` (one each): after
    landing (``lands``: the reply was lost, as when the session expires with the write in
    flight) or before. ``node`` is a ``_LogNode`` or the class itself (for ``open``)."""
    real = node.write  # type: ignore[attr-defined]
    left = [skip]

    def write(*args: object) -> int:
        if left[0] > 0 or not errors:
            left[0] -= 1
            return real(*args)  # type: ignore[no-any-return]
        if lands:
            real(*args)
        raise errors.pop(0)

    node.write = write  # type: ignore[attr-defined]


def _every_segment_readable(bk: walkit.BookKeeper, name: str) -> list[int]:
    """The log's segments' ledgers, each asserted to exist."""
    ledgers = [s.ledger_id for s in WriteAheadLog.reader(bk, name).metadata().segments]
    for ledger_id in ledgers:
        bk.ledger_metadata(ledger_id)  # NoSuchLedgerError: a segment's records are gone
    return ledgers


def test_metadata_changes_whose_reply_was_lost_are_not_applied_twice(bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "lost-roll", roll_bytes=300) as wal:
        wal.append(b"a" * 400)
        _lose_next_reply(wal)
        wal.append(b"b" * 400)  # rolls first
        wal.append(b"c")
        seqs = [s.seq for s in wal.metadata().segments]
        assert seqs == sorted(set(seqs))
        assert [r[:1] for _, r in wal.replay()] == [b"a", b"b", b"c"]
    with WriteAheadLog.open(bk, "lost-snapshot") as wal:
        x = wal.append(b"x")
        wal.snapshot(b"s1", x)
        _lose_next_reply(wal)
        wal.snapshot(b"s2", x)
        assert wal.latest_snapshot().read() == b"s2"  # type: ignore[union-attr]


def test_a_change_that_landed_though_it_failed_keeps_its_ledger(bk: walkit.BookKeeper,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment added to the log whose writer heard an error (its session expired with
    the write in flight) is in the log: its ledger must stay (torture seed 12 lost a
    writer's records this way), and the next writer goes on after it."""
    from walkit.errors import SessionExpiredError
    from walkit.wal._node import LogNode as _LogNode

    with monkeypatch.context() as patch:  # open: the new log's node is made claimed (no write); the
        patch.setattr(_LogNode, "write", _LogNode.write)  # segment's write lands, its reply is lost
        _fail_write(_LogNode, [SessionExpiredError("simulated expiry")], lands=True, skip=0)
        with pytest.raises(SessionExpiredError):
            WriteAheadLog.open(bk, "landed", roll_bytes=300)
    _every_segment_readable(bk, "landed")
    with WriteAheadLog.open(bk, "landed") as wal:  # rolls at 300 bytes (the log's setting)
        _fail_write(wal._node, [SessionExpiredError("simulated expiry")], lands=True)  # the roll's write
        acked = [wal.append(b"a" * 400)]
        with pytest.raises(SessionExpiredError):
            wal.append(b"b" * 400)  # the roll's segment landed; the writer heard an error
    ledgers = _every_segment_readable(bk, "landed")
    assert len(ledgers) == 3
    with WriteAheadLog.open(bk, "landed") as wal:
        acked.append(wal.append(b"c"))
        _fail_write(wal._node, [SessionExpiredError("simulated expiry")], lands=True, skip=1)  # not the naming
        with pytest.raises(SessionExpiredError):
            wal.snapshot(b"state", acked[-1])  # its record landed: its ledger is kept
        snapshot = wal.latest_snapshot()
        assert snapshot is not None and snapshot.read() == b"state"
    assert [lsn for lsn, _ in WriteAheadLog.reader(bk, "landed").replay()] == acked


def _meddle_while_the_segment_is_made(bk: walkit.BookKeeper, monkeypatch: pytest.MonkeyPatch, name: str,
                                      change: Callable[[LogMetadata], LogMetadata]) -> None:
    """While ``open`` makes its new segment's ledger (after its claim), the log node is
    rewritten with ``change`` applied: another process's write between the claim and
    the segment's add."""
    client_type = type(bk.client)
    real = client_type.create
    node = wal_node.LogNode(bk.client.cluster, "default", name)

    async def create(self: LedgerClient, *args: object) -> object:
        def meddle() -> None:
            meta, version = node.read()
            node.write(change(meta), version)

        await self.metadata(meddle)
        monkeypatch.setattr(client_type, "create", real)  # once
        return await real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(client_type, "create", create)


def test_the_segments_add_writes_over_the_claim_unread_and_never_over_a_change_since(
        bk: walkit.BookKeeper, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new log's node is made already claimed (epoch 1, version 0), and the first
    segment is added by a compare-and-set at the version the claim left, unread. A write
    by someone else in between fails that compare-and-set: the add reads the node again
    and keeps that write - or, when it was another writer's claim, gives up fenced,
    deleting the ledger it made."""
    import dataclasses

    calls: list[str] = []

    def counted(kind: str) -> Callable[..., object]:
        real = getattr(wal_node.LogNode, kind)

        def call(self: wal_node.LogNode, *args: object) -> object:
            calls.append(kind)
            return real(self, *args)
        return call

    for kind in ("read", "write"):
        monkeypatch.setattr(wal_node.LogNode, kind, counted(kind))
    with WriteAheadLog.open(bk, "claimed") as wal:
        assert calls == ["write"]  # a new log: made claimed, its segment added unread - one write after the create
        calls.clear()
        meta = wal.metadata()
        assert meta.epoch == 1 and [s.seq for s in meta.segments] == [1]
    calls.clear()
    WriteAheadLog.open(bk, "claimed").close()
    assert calls[:3] == ["read", "write", "write"]  # a reopen: the claim's read and write, the add's write
    monkeypatch.undo()
    before = set(bk.list_ledgers())
    _meddle_while_the_segment_is_made(bk, monkeypatch, "claimed", lambda m: dataclasses.replace(
        m, settings=dataclasses.replace(m.settings, snapshots_kept=7)))
    with WriteAheadLog.open(bk, "claimed") as wal:  # a change since the claim: kept, the segment added
        meta = wal.metadata()
        assert meta.epoch == 3 and meta.settings.snapshots_kept == 7 and [s.seq for s in meta.segments] == [1, 2, 3]
    assert len(set(bk.list_ledgers()) - before) == 1
    _meddle_while_the_segment_is_made(bk, monkeypatch, "claimed", lambda m: dataclasses.replace(m, epoch=m.epoch + 1))
    before = set(bk.list_ledgers())
    with pytest.raises(WriterFencedError):  # another writer claimed the log meanwhile
        WriteAheadLog.open(bk, "claimed")
    meta = WriteAheadLog.reader(bk, "claimed").metadata()
    assert meta.epoch == 5 and [s.seq for s in meta.segments] == [1, 2, 3]
    assert set(bk.list_ledgers()) == before  # the fenced open's ledger was deleted


def test_a_segment_add_that_landed_though_its_compare_and_set_was_refused_is_kept_once(
        bk: walkit.BookKeeper, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store may send a write again after losing its reply; the second try then
    loses its compare-and-set to the first. The segment's add, written unread, reads the
    node, finds its segment there, and the open succeeds with it once."""
    from walkit.errors import MetadataVersionError

    with monkeypatch.context() as patch:
        patch.setattr(wal_node.LogNode, "write", wal_node.LogNode.write)
        _fail_write(wal_node.LogNode, [MetadataVersionError("its own write, sent again")], lands=True)
        wal = WriteAheadLog.open(bk, "retried")
    with wal:
        assert [s.seq for s in wal.metadata().segments] == [1] and wal.metadata().epoch == 1
        assert wal.append(b"r") == LSN(1, 0, 0)


def test_writers_racing_to_open_a_new_log_get_distinct_epochs_and_only_the_last_appends(
        bk: walkit.BookKeeper) -> None:
    """Several writers open the same new log at once: one makes the node (epoch 1), the
    others bump it; each that opens holds its own epoch, and every one but the newest is
    fenced at its first append."""
    for name in ("race-1", "race-2"):
        start = threading.Barrier(3)

        def open_it(_: int) -> WriteAheadLog | WriterFencedError:
            start.wait()
            try:
                return WriteAheadLog.open(bk, name)
            except WriterFencedError as exc:  # fenced while it opened: a later writer claimed the log
                return exc

        with ThreadPoolExecutor(3) as pool:
            outcomes = list(pool.map(open_it, range(3)))
        opened = [o for o in outcomes if isinstance(o, WriteAheadLog)]
        try:
            assert opened
            epochs = sorted(w.epoch for w in opened)
            meta = WriteAheadLog.reader(bk, name).metadata()
            assert len(set(epochs)) == len(epochs) and epochs[-1] == meta.epoch <= 3
            seqs = [s.seq for s in meta.segments]
            assert seqs == list(range(1, len(seqs) + 1))
            newest = max(opened, key=lambda w: w.epoch)
            for wal in opened:
                if wal is newest:
                    wal.append(b"mine")
                else:
                    with pytest.raises(WriterFencedError):
                        wal.append(b"stale")
            assert [r for _, r in WriteAheadLog.reader(bk, name).replay()] == [b"mine"]
        finally:
            for wal in opened:
                wal.close()


def test_a_change_that_surely_failed_deletes_its_ledger(bk: walkit.BookKeeper, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the store refused the write, or cannot tell, the answer decides: refused (and
    settled by a write at the version read) deletes the ledger; unknown keeps it."""
    from walkit.errors import MetadataUnavailableError
    from walkit.wal._node import LogNode as _LogNode

    before = set(bk.list_ledgers())
    with WriteAheadLog.open(bk, "refused", roll_bytes=300) as wal:
        wal.append(b"a" * 400)
        _fail_write(wal._node, [MetadataUnavailableError("simulated refusal")], lands=False)
        with pytest.raises(MetadataUnavailableError):
            wal.append(b"b" * 400)
    segments = _every_segment_readable(bk, "refused")
    assert set(bk.list_ledgers()) - before == set(segments)  # the roll's ledger was deleted
    with monkeypatch.context() as patch:  # the store cannot even be read: keep the ledger
        patch.setattr(_LogNode, "write", _LogNode.write)
        _fail_write(_LogNode, [MetadataUnavailableError("simulated outage")], lands=False, skip=1)
        real_read = _LogNode.read
        calls = [0]

        def read(self: _LogNode) -> object:
            calls[0] += 1
            if calls[0] > 1:  # the claim's read works (the segment's add writes unread); the settling one not
                raise MetadataUnavailableError("simulated outage")
            return real_read(self)

        patch.setattr(_LogNode, "read", read)
        with pytest.raises(MetadataUnavailableError):
            WriteAheadLog.open(bk, "refused")
    kept = set(bk.list_ledgers()) - before - set(segments)
    assert len(kept) == 1  # may be the log's: kept
    assert _every_segment_readable(bk, "refused") == segments


def test_a_change_landing_after_it_was_settled_as_failed_is_refused(bk: walkit.BookKeeper) -> None:
    """A roll's segment write gives up (MetadataUnavailableError: no answer within the
    retry deadline) while still on its way, and reaches the store only after the writer
    settled it as failed and deleted the segment's ledger: the settling write at the
    version it read makes the late one a stale compare-and-set, so the log never names
    the deleted ledger."""
    from walkit.errors import MetadataUnavailableError, MetadataVersionError

    late: list[tuple[object, ...]] = []
    with WriteAheadLog.open(bk, "late-landing", roll_bytes=300) as wal:
        acked = [wal.append(b"a" * 400)]
        real = wal._node.write

        def give_up(*args: object) -> int:
            wal._node.write = real  # type: ignore[method-assign]  # the roll's write only
            late.append(args)
            raise MetadataUnavailableError("metadata unavailable (simulated): no answer within the retry deadline")

        wal._node.write = give_up  # type: ignore[method-assign]
        with pytest.raises(MetadataUnavailableError):
            wal.append(b"b" * 400)  # rolls first
    with pytest.raises(MetadataVersionError):
        real(*late[0])  # type: ignore[arg-type]  # the write arrives at last
    _every_segment_readable(bk, "late-landing")
    assert [lsn for lsn, _ in WriteAheadLog.reader(bk, "late-landing").replay()] == acked


def test_an_older_snapshot_landing_late_is_refused(bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "snap-race") as wal:
        early = wal.append(b"1")
        late = wal.append(b"2")
        wal.snapshot(b"newer", late)
        wal.core.admin.check_snapshot_lsn = lambda lsn: None  # type: ignore[method-assign]  # as if checked before
        with pytest.raises(InvalidArgumentError):
            wal.snapshot(b"older", early)
        assert wal.latest_snapshot().lsn == late  # type: ignore[union-attr]
        assert wal.latest_snapshot().read() == b"newer"  # type: ignore[union-attr]


def test_appends_racing_close_are_refused_not_lost(bk: walkit.BookKeeper) -> None:
    wal = WriteAheadLog.open(bk, "closing")
    stop = threading.Event()
    outcomes: list[object] = []

    def producer() -> None:
        while not stop.is_set():
            try:
                outcomes.append(wal.append_async(b"r"))
            except UsageError:
                return

    thread = threading.Thread(target=producer)
    thread.start()
    time.sleep(0.2)
    wal.close()
    stop.set()
    thread.join(10)
    for fut in outcomes:  # every accepted append completed one way or the other
        assert fut.exception(timeout=10) is None  # type: ignore[attr-defined]
    assert len(list(WriteAheadLog.reader(bk, "closing").replay())) == len(outcomes)


def test_reading_past_truncation_is_an_error_not_a_gap(bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "gaps", roll_bytes=1_000) as wal:
        lsns = [wal.append(b"%03d" % i + b"." * 300) for i in range(30)]
        reader = WriteAheadLog.reader(bk, "gaps")
        replay = reader.replay()
        next(replay)
        wal.snapshot(b"state", lsns[-1])
        assert wal.truncate(lsns[-1]) > 0
        with pytest.raises(NoSuchLedgerError):
            list(replay)  # its next segments are gone: say so
        with pytest.raises(InvalidArgumentError):
            list(reader.replay())  # from the start: those records are gone
        with pytest.raises(InvalidArgumentError):
            next(reader.tail())
        assert list(reader.replay(after=lsns[-1])) == []
        reader.close()


def test_writer_options_that_cannot_work_are_refused(tmp_path: Path, driver: Driver) -> None:
    if driver.spec.driver != "local":
        pytest.skip("argument checks: one driver is enough")
    with local_cluster(tmp_path, driver, bookies=3) as cluster:
        with client(cluster, max_pending_adds=2) as small:
            with pytest.raises(InvalidArgumentError):
                WriteAheadLog.open(small, "x", max_inflight_entries=4)
        with client(cluster, max_frame_size=65536) as framed:
            with pytest.raises(InvalidArgumentError):
                WriteAheadLog.open(framed, "y", max_entry_bytes=1 << 20)


# -- a log never closed ------------------------------------------------------------------------------------

_NEVER_CLOSED = {
    "the cluster closed, not the log": """
with walkit.LocalCluster(sys.argv[1], bookies=3) as cluster:
    log = walkit.WriteAheadLog.open(cluster.metadata_uri, "orders")
    log.append(b"a")
""",
    "a client and a tail left open": """
with walkit.LocalCluster(sys.argv[1], bookies=3) as cluster:
    bk = walkit.BookKeeper(cluster.metadata_uri)
    log = walkit.WriteAheadLog.open(bk, "orders")
    log.append(b"a")
    tail = walkit.WriteAheadLog.reader(bk, "orders").tail()
    next(tail)
""",
    "nothing closed": """
cluster = walkit.LocalCluster(sys.argv[1], bookies=3)
log = walkit.WriteAheadLog.open(cluster.metadata_uri, "orders")
log.append(b"a")
""",
}


@pytest.mark.parametrize("case", list(_NEVER_CLOSED))
def test_a_log_never_closed_leaves_no_task_pending_at_exit(tmp_path: Path, case: str) -> None:
    """A program that exits without closing its log (or its client) ends cleanly: the
    client's loop winds its tasks down at exit (the log's retention task was destroyed
    pending, and Python said so on stderr). Where the cluster was closed, stderr is
    empty."""
    code = "import sys\nimport walkit\n" + _NEVER_CLOSED[case]
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cluster")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Task was destroyed" not in done.stderr, done.stderr
    if case != "nothing closed":  # (a LocalCluster never closed stops its bookies at exit: it may say so)
        assert done.stderr == "", done.stderr
