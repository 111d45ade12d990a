"""Sequential reads in runs (READ_RANGE; walkit/client/_ranges.py) against in-process
bookies: one replica per reader, runs cut at ensemble changes, entries missing or
corrupt on a replica, a bookie failing in the middle of a read, fenced and truncated
ledgers, bookies that do not know the op, striped ledgers entry by entry."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import walkit
from support.client import FAST, index_of, raw_add
from support.metadata import wait_for
from walkit.client._core import NO_RANGE_MEMORY
from walkit.errors import BookieError, DigestMismatchError, LedgerFencedError, NoSuchEntryError
from walkit.protocol import ErrorResponse, Op, ReadRange, Status

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[walkit.LocalCluster]:
    with walkit.LocalCluster(tmp_path / "cluster", bookies=4) as c:
        yield c


def _client(cluster: walkit.LocalCluster, **options: Any) -> walkit.BookKeeper:
    # no idle LAC: the recovery tests here need a writer whose LAC lags its last entries
    return cluster.client(**{**FAST, "idle_lac": False, **options})


def _payload(i: int) -> bytes:
    return b"entry-%d-" % i + bytes(i % 300)


def _write(bk: walkit.BookKeeper, count: int, *, close: bool = True, **kwargs: Any) -> walkit.LedgerHandle:
    lh = bk.create_ledger(**kwargs)
    futures = [lh.add_entry_async(_payload(i)) for i in range(count)]
    assert [f.result(timeout=60) for f in futures] == list(range(count))
    if close:
        lh.close()
    return lh


def _count_range_reads(cluster: walkit.LocalCluster) -> Counter[str]:
    """Per bookie id, the READ_RANGE requests its core answers from now on."""
    served: Counter[str] = Counter()
    for i, bookie_id in enumerate(cluster.bookie_ids):
        if not cluster.is_running(i):
            continue
        bookie = cluster.server(i).bookie
        assert bookie is not None
        real = bookie.read_entries

        def counted(*args: Any, real: Callable[..., list[bytes]] = real, bookie_id: str = bookie_id) -> list[bytes]:
            served[bookie_id] += 1
            return real(*args)

        bookie.read_entries = counted  # type: ignore[method-assign]
    return served


def _stats(bk: walkit.BookKeeper) -> Any:
    return bk.client._core.stats


def test_a_ledger_reads_in_runs_from_one_replica(cluster: walkit.LocalCluster) -> None:
    with _client(cluster) as writer:
        lh = _write(writer, 3000, ensemble_size=3, write_quorum=3, ack_quorum=2)
    served = _count_range_reads(cluster)
    with _client(cluster) as bk:
        rh = bk.open_ledger(lh.ledger_id)
        assert [e.data for e in rh.read(0, 2999)] == [_payload(i) for i in range(3000)]
        stats = _stats(bk)
        assert stats.reads == 3000
        assert 0 < stats.range_reads <= 20, f"{stats.range_reads} requests for 3000 entries"
        assert len(served) == 1, f"every run of one reader goes to one replica (sticky): {served}"
        assert [e.data for e in rh.read(1234, 1240)] == [_payload(i) for i in range(1234, 1241)]


def test_runs_stop_at_an_ensemble_change(cluster: walkit.LocalCluster) -> None:
    with _client(cluster) as writer:
        lh = writer.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        first = [lh.add_entry_async(_payload(i)) for i in range(500)]
        assert [f.result(timeout=60) for f in first] == list(range(500))
        victim = lh.metadata.ensembles[0][1][0]
        cluster.kill_bookie(index_of(cluster, victim))
        rest = [lh.add_entry_async(_payload(i)) for i in range(500, 999)]
        assert [f.result(timeout=60) for f in rest] == list(range(500, 999))
        wait_for(lambda: lh.ensemble_changes >= 1, 10)  # Qa acks need not wait for the change
        assert lh.add_entry(_payload(999)) == 999  # on the new ensemble
        lh.close()
        fragments = lh.metadata.ensembles
        assert len(fragments) >= 2 and victim not in fragments[-1][1]
    served = _count_range_reads(cluster)
    with _client(cluster) as bk:
        rh = bk.open_ledger(lh.ledger_id)
        assert [e.data for e in rh.read(0, 999)] == [_payload(i) for i in range(1000)]
        assert sum(served.values()) >= len(fragments)
        # entries before the change that the dead bookie held come from the survivors
        assert [e.data for e in rh.read(0, 0)] == [_payload(0)]


def _drop_entry(cluster: walkit.LocalCluster, bookie_id: str, ledger_id: int, missing: int) -> None:
    """Bookie ``bookie_id`` answers as if it did not hold entry ``missing`` of the ledger."""
    bookie = cluster.server(index_of(cluster, bookie_id)).bookie
    assert bookie is not None
    real_many, real_one, real_memory = bookie.read_entries, bookie.read_entry, bookie.read_memory

    def many(ledger: int, first: int, count: int, max_bytes: int) -> list[bytes]:
        if ledger == ledger_id and first == missing:
            raise NoSuchEntryError("entry not stored", ledger=ledger, entry=first)
        entries = real_many(ledger, first, count, max_bytes)
        if ledger == ledger_id and first < missing < first + len(entries):
            entries = entries[: missing - first]
        return entries

    def one(ledger: int, entry: int) -> bytes:
        if ledger == ledger_id and entry == missing:
            raise NoSuchEntryError("entry not stored", ledger=ledger, entry=entry)
        return real_one(ledger, entry)

    def memory(ledger: int, entry: int) -> tuple[bytes, int] | None:  # not from the read-ahead cache either
        return None if ledger == ledger_id and entry == missing else real_memory(ledger, entry)

    bookie.read_entries = many  # type: ignore[method-assign]
    bookie.read_entry = one  # type: ignore[method-assign]
    bookie.read_memory = memory  # type: ignore[method-assign]


def test_an_entry_missing_on_replicas_is_read_from_the_one_that_holds_it(cluster: walkit.LocalCluster) -> None:
    with _client(cluster) as writer:
        lh = _write(writer, 400, ensemble_size=3, write_quorum=3, ack_quorum=2)
    ensemble = lh.metadata.ensembles[0][1]
    for bookie_id in ensemble[:2]:
        _drop_entry(cluster, bookie_id, lh.ledger_id, 123)
    with _client(cluster) as bk:
        rh = bk.open_ledger(lh.ledger_id)
        assert [e.data for e in rh.read(0, 399)] == [_payload(i) for i in range(400)]
        assert [e.data for e in rh.read(123, 125)] == [_payload(i) for i in range(123, 126)]
    _drop_entry(cluster, ensemble[2], lh.ledger_id, 123)
    with _client(cluster) as bk:
        rh = bk.open_ledger(lh.ledger_id)
        with pytest.raises(NoSuchEntryError):
            list(rh.read(0, 399))
        assert [e.data for e in rh.read(124, 399)] == [_payload(i) for i in range(124, 400)]


def test_a_corrupt_entry_in_a_run_is_read_from_another_replica(cluster: walkit.LocalCluster) -> None:
    with _client(cluster) as writer:
        lh = _write(writer, 600, ensemble_size=3, write_quorum=3, ack_quorum=2)
    ensemble = lh.metadata.ensembles[0][1]

    def corrupt(ledger_id: int, entry_id: int, data: bytes) -> bytes:
        return data[:-1] + bytes([data[-1] ^ 0xFF]) if entry_id == 300 else data

    for bookie_id in ensemble[:2]:
        cluster.server(index_of(cluster, bookie_id)).hooks.read = corrupt
    with _client(cluster) as bk:
        rh = bk.open_ledger(lh.ledger_id)
        assert [e.data for e in rh.read(0, 599)] == [_payload(i) for i in range(600)]
    cluster.server(index_of(cluster, ensemble[2])).hooks.read = corrupt
    with _client(cluster) as bk:
        rh = bk.open_ledger(lh.ledger_id)
        with pytest.raises(DigestMismatchError):
            list(rh.read(250, 350))


def test_a_bookie_killed_in_the_middle_of_a_read_is_left_for_another(cluster: walkit.LocalCluster) -> None:
    count = 20_000
    with _client(cluster) as writer:
        lh = _write(writer, count, ensemble_size=3, write_quorum=3, ack_quorum=2)
    served = _count_range_reads(cluster)
    with _client(cluster, read_batch_bytes=64 << 10) as bk:
        rh = bk.open_ledger(lh.ledger_id)
        got: list[bytes] = []
        for entry in rh.read(0, count - 1):
            got.append(entry.data)
            if len(got) == 1000:
                (sticky,) = served
                cluster.kill_bookie(index_of(cluster, sticky))
        assert got == [_payload(i) for i in range(count)]
        assert len(served) == 2, f"the read moved to one other replica: {served}"


def test_fenced_and_truncated_ledgers_read_to_their_end_and_no_further(cluster: walkit.LocalCluster) -> None:
    with _client(cluster) as writer, _client(cluster) as bk:
        # fenced: a recovery closes the ledger under its writer; the fenced bookies serve runs
        lh = _write(writer, 50, close=False, ensemble_size=3, write_quorum=3, ack_quorum=2)
        rh = bk.open_ledger(lh.ledger_id)
        assert rh.is_closed and rh.last_add_confirmed == 49
        assert [e.data for e in rh.read(0, 49)] == [_payload(i) for i in range(50)]
        with pytest.raises(LedgerFencedError):
            lh.add_entry(b"late")
        # truncated: a ledger closed at 49 while a bookie holds an entry 50 past its end
        lh = _write(writer, 50, ensemble_size=3, write_quorum=3, ack_quorum=2)
        meta = lh.metadata
        ensemble = list(meta.ensembles[0][1])
        length = sum(len(_payload(i)) for i in range(50))
        raw_add(cluster, meta, 50, _payload(50), 49, length + len(_payload(50)), ensemble[:1])
        rh = bk.open_ledger(lh.ledger_id)
        assert rh.is_closed and rh.last_add_confirmed == 49
        for bookie_id in ensemble[1:]:  # the reader sticks to the replica that holds entry 50 too
            bk.client._core.bookie_failed(bookie_id)
        served = _count_range_reads(cluster)
        assert [e.data for e in rh.read(0, 49)] == [_payload(i) for i in range(50)]
        assert [e.data for e in rh.read(45, 49)] == [_payload(i) for i in range(45, 50)]
        assert set(served) == {ensemble[0]}
        with pytest.raises(NoSuchEntryError):
            list(rh.read(40, 50))


def _speak_no_range(cluster: walkit.LocalCluster, bookie_id: str) -> None:
    """Bookie ``bookie_id`` answers READ_RANGE as a bookie without the op does."""
    reads = cluster.server(index_of(cluster, bookie_id)).reads
    real = reads.in_pool  # every READ_RANGE is dispatched to the read pool

    def in_pool(conn: Any, req: Any, fn: Any, arg: Any) -> None:
        if isinstance(req, ReadRange):
            conn.respond(ErrorResponse(Op.INVALID, Status.EBADREQ, message="kind 0x07 is no request op",
                                       request_id=req.request_id))
        else:
            real(conn, req, fn, arg)

    reads.in_pool = in_pool  # type: ignore[method-assign]


def test_bookies_without_the_op_are_read_entry_by_entry(cluster: walkit.LocalCluster) -> None:
    with _client(cluster) as writer:
        lh = _write(writer, 500, ensemble_size=3, write_quorum=3, ack_quorum=2)
    ensemble = lh.metadata.ensembles[0][1]
    for bookie_id in ensemble[:2]:
        _speak_no_range(cluster, bookie_id)
    for _ in range(3):  # whichever replica a reader picks first
        with _client(cluster) as bk:
            rh = bk.open_ledger(lh.ledger_id)
            assert [e.data for e in rh.read(0, 499)] == [_payload(i) for i in range(500)]
            assert set(bk.client._core.no_range_reads) <= set(ensemble[:2])
            assert 0 < _stats(bk).range_reads <= 10, "the third replica answers in runs"
    _speak_no_range(cluster, ensemble[2])
    with _client(cluster) as bk:
        rh = bk.open_ledger(lh.ledger_id)
        assert [e.data for e in rh.read(0, 499)] == [_payload(i) for i in range(500)]
        assert set(bk.client._core.no_range_reads) == set(ensemble)
        assert _stats(bk).range_reads == 0 and _stats(bk).reads == 500
        assert not bk.client._core.speaks_range_reads(ensemble[0])
        for bookie_id in ensemble:  # an older bookie is asked again after a while (it may be upgraded)
            bk.client._core.no_range_reads[bookie_id] -= NO_RANGE_MEMORY
        assert all(bk.client._core.speaks_range_reads(b) for b in ensemble)


def test_a_slow_replica_is_left_for_the_next_one_after_the_speculative_timeout(cluster: walkit.LocalCluster) -> None:
    with _client(cluster) as writer:
        lh = _write(writer, 300, ensemble_size=3, write_quorum=3, ack_quorum=2)
    release = threading.Event()
    stuck: list[str] = []
    with _client(cluster, read_timeout=30.0, speculative_read_timeout=0.2) as bk:
        rh = bk.open_ledger(lh.ledger_id)
        served = _count_range_reads(cluster)
        assert [e.data for e in rh.read(0, 9)] == [_payload(i) for i in range(10)]
        (sticky,) = served
        bookie = cluster.server(index_of(cluster, sticky)).bookie
        assert bookie is not None
        real = bookie.read_entries

        def hang(*args: Any) -> list[bytes]:
            stuck.append(sticky)
            release.wait(60)
            return real(*args)

        bookie.read_entries = hang  # type: ignore[method-assign]
        try:
            started = time.monotonic()
            assert [e.data for e in rh.read(10, 299)] == [_payload(i) for i in range(10, 300)]
            assert time.monotonic() - started < 10, "answered while the sticky replica hangs"
            assert stuck and _stats(bk).speculative_reads >= 1
            assert bk.client._core.recently_failed(sticky), "the slow replica is asked last from now on"
        finally:
            release.set()


def test_runs_fit_the_clients_frames_when_the_bookies_allow_bigger_ones(cluster: walkit.LocalCluster) -> None:
    with _client(cluster) as writer:
        lh = writer.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        futures = [lh.add_entry_async(bytes(1020)) for _ in range(200)]
        assert [f.result(timeout=60) for f in futures] == list(range(200))
        lh.close()
    with _client(cluster, max_frame_size=64 << 10) as bk:  # the bookies' frames are 5 MiB
        rh = bk.open_ledger(lh.ledger_id)
        assert [len(e.data) for e in rh.read(0, 199)] == [1020] * 200
        assert _stats(bk).range_reads >= 200 * 1056 // (64 << 10)


def test_striped_ledgers_read_entry_by_entry(cluster: walkit.LocalCluster) -> None:
    with _client(cluster) as writer:
        lh = _write(writer, 300, ensemble_size=4, write_quorum=2, ack_quorum=2)
    with _client(cluster) as bk:
        rh = bk.open_ledger(lh.ledger_id)
        assert [e.data for e in rh.read(0, 299)] == [_payload(i) for i in range(300)]
        assert _stats(bk).range_reads == 0 and _stats(bk).reads == 300


def test_reads_bounded_by_bytes_hold_little(cluster: walkit.LocalCluster) -> None:
    big = bytes(200_000)
    with _client(cluster) as writer:
        lh = writer.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        futures = [lh.add_entry_async(b"%d" % i if i < 1000 else big) for i in range(1100)]
        assert [f.result(timeout=60) for f in futures] == list(range(1100))
        lh.close()
    with _client(cluster, read_batch_bytes=1 << 20, read_batches_in_flight=2) as bk:
        rh = bk.open_ledger(lh.ledger_id)
        sizes = [len(e.data) for e in rh.read(0, 1099)]
        assert sizes == [len(b"%d" % i) for i in range(1000)] + [len(big)] * 100
    # a tailing reader catches up in runs while the writer goes on
    with _client(cluster, idle_lac=True) as writer, _client(cluster) as reader:
        lh = _write(writer, 2000, close=False, ensemble_size=3, write_quorum=3, ack_quorum=2)
        rh = reader.open_ledger(lh.ledger_id, recovery=False)
        assert rh.wait_for_lac(1998, 10) == 1999  # the idle writer published its LAC
        more = [lh.add_entry_async(_payload(i)) for i in range(2000, 2500)]
        seen = [e.data for e in rh.read(0, rh.last_add_confirmed)]
        assert seen == [_payload(i) for i in range(2000)]
        assert [f.result(timeout=60) for f in more] == list(range(2000, 2500))
        assert _stats(reader).range_reads <= 20


def test_recovery_reads_the_unconfirmed_tail_in_runs(cluster: walkit.LocalCluster) -> None:
    with _client(cluster) as writer:
        # the writer's LAC lags (no idle LAC, entries sent before their predecessors were
        # acknowledged): recovery reads the long tail after it
        lh = _write(writer, 3000, close=False, ensemble_size=3, write_quorum=3, ack_quorum=2)
        with _client(cluster) as bk:
            rh = bk.open_ledger(lh.ledger_id)
            assert rh.is_closed and rh.last_add_confirmed == 2999
            stats = _stats(bk)
            assert stats.recoveries == 1 and stats.reads >= 100, f"a tail of {stats.reads} entries read"
            assert 0 < stats.range_reads <= stats.reads // 50, f"{stats.range_reads} rounds for {stats.reads} entries"
            assert [e.data for e in rh.read(0, 2999)] == [_payload(i) for i in range(3000)]
        with pytest.raises(LedgerFencedError):
            lh.add_entry(b"late")


def test_recovery_reads_entry_by_entry_from_bookies_without_the_op(cluster: walkit.LocalCluster) -> None:
    with _client(cluster) as writer:
        lh = _write(writer, 500, close=False, ensemble_size=3, write_quorum=3, ack_quorum=2)
        ensemble = lh.metadata.ensembles[0][1]
        _speak_no_range(cluster, ensemble[1])
        with _client(cluster) as bk:
            rh = bk.open_ledger(lh.ledger_id)
            assert rh.is_closed and rh.last_add_confirmed == 499
            assert not bk.client._core.speaks_range_reads(ensemble[1])
            assert [e.data for e in rh.read(0, 499)] == [_payload(i) for i in range(500)]


def test_recovery_rounds_left_undecided_fall_back_to_single_reads(cluster: walkit.LocalCluster) -> None:
    with _client(cluster) as writer:
        lh = _write(writer, 1000, close=False, ensemble_size=3, write_quorum=3, ack_quorum=2)
        ensemble = lh.metadata.ensembles[0][1]
    cluster.kill_bookie(index_of(cluster, ensemble[0]))  # gone: dropped from the rounds
    broken = cluster.server(index_of(cluster, ensemble[1])).bookie
    assert broken is not None

    def failing(*args: Any) -> list[bytes]:
        raise BookieError("disk says no to runs")

    broken.read_entries = failing  # type: ignore[method-assign]  # single reads still work there
    with _client(cluster) as bk:
        rh = bk.open_ledger(lh.ledger_id)  # one "absent" from runs is too few: single reads decide the end
        assert rh.is_closed and rh.last_add_confirmed == 999
        assert _stats(bk).range_reads >= 1, "the tail was read in rounds first"
        assert [e.data for e in rh.read(0, 999)] == [_payload(i) for i in range(1000)]


def _count_single_reads(cluster: walkit.LocalCluster) -> Counter[str]:
    """Per bookie id, the READ_ENTRY requests its core answers (pool or memory) from now on."""
    served: Counter[str] = Counter()
    for i, bookie_id in enumerate(cluster.bookie_ids):
        bookie = cluster.server(i).bookie
        assert bookie is not None
        for name in ("read_entry", "read_memory"):
            real = getattr(bookie, name)

            def counted(*args: Any, real: Callable[..., Any] = real, bookie_id: str = bookie_id) -> Any:
                served[bookie_id] += 1
                return real(*args)

            setattr(bookie, name, counted)
    return served


def test_entry_by_entry_reads_keep_to_one_replica_where_every_bookie_holds_every_entry(
        cluster: walkit.LocalCluster) -> None:
    with _client(cluster) as writer:
        full = _write(writer, 300, ensemble_size=3, write_quorum=3, ack_quorum=2)
        striped = _write(writer, 300, ensemble_size=4, write_quorum=2, ack_quorum=2)
    served = _count_single_reads(cluster)
    with _client(cluster, range_reads=False) as bk:
        rh = bk.open_ledger(full.ledger_id)
        assert [e.data for e in rh.read(0, 299)] == [_payload(i) for i in range(300)]
        assert len(served) == 1 and sum(served.values()) >= 300, f"sticky: one replica answers them all: {served}"
        served.clear()
        rh = bk.open_ledger(striped.ledger_id)
        assert [e.data for e in rh.read(0, 299)] == [_payload(i) for i in range(300)]
        assert len(served) == 4, f"a striped ledger is read where each entry lives: {served}"
