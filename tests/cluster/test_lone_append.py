"""A lone synchronous append runs the client's loop on the caller's thread (issue 38,
walkit/client/_baton.py), on an in-process LocalCluster: it wakes no other thread of the
client (the baton's counters, not timings); many threads appending at once get every
record in, in order; Ctrl-C in the middle of an append; a bookie lost during a lone
append; the asyncio API beside it; the client closed while a caller runs its loop."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

import walkit
from support.client import client, local_cluster
from support.metadata import Driver, driver  # noqa: F401  (fixture)
from walkit import LSN, WriteAheadLog
from walkit.aio import AsyncWriteAheadLog
from walkit.client._baton import Baton
from walkit.errors import UsageError, WalkitError

pytestmark = pytest.mark.timeout(180)


def _baton(bk: walkit.BookKeeper) -> Baton:
    baton = bk.client.loop._make_baton()
    assert baton is not None
    baton.slice = baton.tick = 3600.0  # the loop thread takes the loop back only when woken: counters, not clocks
    return baton


def _parked(baton: Baton, append: object) -> None:
    """Appends (handed over) until the loop thread parked for a lone caller."""
    deadline = time.monotonic() + 20
    while baton.state != "parked":
        assert time.monotonic() < deadline, baton.state
        append()  # type: ignore[operator]


def _replayed(bk: walkit.BookKeeper, name: str) -> list[tuple[LSN, bytes]]:
    with WriteAheadLog.reader(bk, name) as reader:
        return list(reader.replay())


@pytest.fixture
def cluster(tmp_path: Path, driver: Driver) -> Iterator[walkit.LocalCluster]:  # noqa: F811
    with local_cluster(tmp_path, driver, bookies=4) as cluster:
        yield cluster


def test_a_lone_append_wakes_no_other_thread(cluster: walkit.LocalCluster) -> None:
    with client(cluster) as bk:
        baton = _baton(bk)
        with WriteAheadLog.open(bk, "lone", ensemble_size=3, write_quorum=3, ack_quorum=2) as wal:
            lsns = [wal.append(b"first")]
            _parked(baton, lambda: lsns.append(wal.append(b"before")))
            iterations, pokes = baton.loop_iterations, baton.pokes
            for i in range(100):
                lsns.append(wal.append(b"%d" % i))
            assert (baton.loop_iterations, baton.pokes) == (iterations, pokes)  # the loop thread never ran
            assert baton.state == "parked"
            assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns)
            lh = bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)  # a plain ledger too
            ids = [lh.add_entry(b"e")]
            _parked(baton, lambda: ids.append(lh.add_entry(b"e")))
            iterations, pokes = baton.loop_iterations, baton.pokes
            ids += [lh.add_entry(b"%d" % i) for i in range(50)]
            assert (baton.loop_iterations, baton.pokes) == (iterations, pokes)
            assert ids == list(range(len(ids)))
            lh.close()
        assert [lsn for lsn, _ in _replayed(bk, "lone")] == lsns


def test_many_threads_appending_at_once(cluster: walkit.LocalCluster) -> None:
    threads, each = 8, 60
    with client(cluster) as bk:
        baton = _baton(bk)
        with WriteAheadLog.open(bk, "many", ensemble_size=3, write_quorum=3, ack_quorum=2) as wal:
            _parked(baton, lambda: wal.append(b"warm"))
            got: dict[int, list[tuple[LSN, bytes]]] = {}
            start = threading.Barrier(threads)

            def writer(t: int) -> None:
                start.wait()
                mine = got.setdefault(t, [])
                for i in range(each):
                    record = b"%d-%d" % (t, i)
                    mine.append((wal.append(record), record))

            workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join(120)
            assert sum(len(v) for v in got.values()) == threads * each
            for mine in got.values():
                assert [lsn for lsn, _ in mine] == sorted(lsn for lsn, _ in mine)  # each thread's in order
            appended = sorted(pair for mine in got.values() for pair in mine)
            assert len({lsn for lsn, _ in appended}) == len(appended)
            assert baton.pokes > 0  # they met: the loop thread took over
            wal.append(b"alone again")
        replayed = _replayed(bk, "many")
        assert [pair for pair in replayed if pair[1] not in (b"warm", b"alone again")] == appended


def test_ctrl_c_in_the_middle_of_appends(cluster: walkit.LocalCluster) -> None:
    """SIGINT sent at random instants while the main thread appends alone: each append
    returns its LSN or raises KeyboardInterrupt; the log holds every record whose append
    returned, in order, and the client keeps working, for this thread and another."""
    armed = [False]

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if armed[0]:  # only inside the append below: never in this test's own lines
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with client(cluster) as bk:
            baton = _baton(bk)
            with WriteAheadLog.open(bk, "ctrl-c", ensemble_size=3, write_quorum=3, ack_quorum=2) as wal:
                _parked(baton, lambda: wal.append(b"warm"))
                returned: list[tuple[LSN, bytes]] = []
                interrupted = 0
                stop = threading.Event()

                def pester() -> None:
                    chance = random.Random(38)
                    while not stop.wait(chance.uniform(0.0002, 0.006)):
                        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

                pest = threading.Thread(target=pester)
                pest.start()
                try:
                    for i in range(5000):
                        if len(returned) >= 150 and interrupted >= 20:
                            break
                        record = b"r%d" % i
                        try:
                            armed[0] = True
                            lsn = wal.append(record)
                            armed[0] = False
                            returned.append((lsn, record))
                        except KeyboardInterrupt:
                            armed[0] = False
                            interrupted += 1
                finally:
                    stop.set()
                    pest.join()
                assert interrupted >= 20 and len(returned) >= 150
                other: list[LSN] = []
                helper = threading.Thread(target=lambda: other.extend(wal.append(b"other") for _ in range(20)))
                helper.start()
                helper.join(60)
                assert len(other) == 20
                returned.append((wal.append(b"last"), b"last"))
                assert [lsn for lsn, _ in returned] == sorted(lsn for lsn, _ in returned)
            replayed = dict(_replayed(bk, "ctrl-c"))
            for lsn, record in returned:
                assert replayed[lsn] == record
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("bookies, outcome", [(4, "ensemble change"), (3, "clear error")])
def test_a_bookie_lost_during_a_lone_append(tmp_path: Path, driver: Driver, bookies: int,  # noqa: F811
                                            outcome: str) -> None:
    """Qa = Qw = 3: a lost bookie's answer is needed. With a fourth bookie the appends go
    on after an ensemble change; without, they fail with a WalkitError, and none hangs."""
    with local_cluster(tmp_path, driver, bookies=bookies) as cluster, client(cluster) as bk:
        baton = _baton(bk)
        wal = WriteAheadLog.open(bk, "lost", ensemble_size=3, write_quorum=3, ack_quorum=3)
        _parked(baton, lambda: wal.append(b"warm"))
        victim = cluster.bookie_ids.index(wal.core.ledger.ensemble[0])
        appended = threading.Event()
        killer = threading.Thread(target=lambda: (appended.wait(30), cluster.kill_bookie(victim)))
        killer.start()
        lsns: list[LSN] = []
        error: WalkitError | None = None
        try:
            for i in range(300):
                lsns.append(wal.append(b"%d" % i))
                if i == 20:
                    appended.set()
        except WalkitError as exc:
            error = exc
        killer.join(30)
        if outcome == "ensemble change":
            assert error is None and len(lsns) == 300 and wal.core.ledger.ensemble_changes >= 1
            assert lsns == sorted(lsns)
            wal.close()
        else:
            assert error is not None and len(lsns) >= 21
            with pytest.raises(WalkitError):
                wal.append(b"after")
            bk.client.loop.run(asyncio.sleep(0))  # the client's loop still answers


def test_the_asyncio_api_alongside(cluster: walkit.LocalCluster) -> None:
    with client(cluster) as bk:
        baton = _baton(bk)
        with WriteAheadLog.open(bk, "sync", ensemble_size=3, write_quorum=3, ack_quorum=2) as wal:
            _parked(baton, lambda: wal.append(b"warm"))
            from_aio: list[LSN] = []

            async def aio_appends() -> None:
                log = await AsyncWriteAheadLog.open(bk, "async", ensemble_size=3, write_quorum=3,
                                                    ack_quorum=2)
                async with log:
                    for i in range(100):
                        from_aio.append(await log.append(b"a%d" % i))
                        await asyncio.sleep(0)

            other = threading.Thread(target=asyncio.run, args=(aio_appends(),))
            other.start()
            lsns = [wal.append(b"s%d" % i) for i in range(150)]
            other.join(120)
            assert len(from_aio) == 100 and from_aio == sorted(from_aio)
            assert lsns == sorted(lsns) and len(set(lsns)) == 150
        assert [r for _, r in _replayed(bk, "sync")][-150:] == [b"s%d" % i for i in range(150)]
        assert [r for _, r in _replayed(bk, "async")] == [b"a%d" % i for i in range(100)]


def test_close_while_a_caller_runs_the_loop(cluster: walkit.LocalCluster) -> None:
    bk = cluster.client()
    baton = _baton(bk)
    wal = WriteAheadLog.open(bk, "closing", ensemble_size=3, write_quorum=3, ack_quorum=2)
    _parked(baton, lambda: wal.append(b"warm"))
    going = threading.Event()
    ended: list[BaseException] = []

    def appender() -> None:
        try:
            while True:
                wal.append(b"x")
                going.set()
        except (UsageError, WalkitError) as exc:
            ended.append(exc)

    thread = threading.Thread(target=appender)
    thread.start()
    assert going.wait(30)
    bk.close()
    thread.join(30)
    assert not thread.is_alive() and len(ended) == 1
    assert baton.closed


def test_no_parking_while_a_tail_of_the_same_client_reads(cluster: walkit.LocalCluster) -> None:
    """A tail's long poll may be waiting for its answer on a socket: the loop thread must
    be there to read it, so it does not park for a lone writer while a sequence is open."""
    with client(cluster) as bk:
        baton = _baton(bk)
        with WriteAheadLog.open(bk, "followed", ensemble_size=3, write_quorum=3, ack_quorum=2) as wal:
            _parked(baton, lambda: wal.append(b"warm"))
            reader = WriteAheadLog.reader(bk, "followed")
            seen: list[bytes] = []
            all_seen = threading.Event()

            def follow() -> None:
                with contextlib.suppress(UsageError):
                    for _lsn, record in reader.tail(None, poll_timeout=0.2):
                        seen.append(record)
                        if record == b"t49":
                            all_seen.set()
                            return

            tail = threading.Thread(target=follow)
            tail.start()
            deadline = time.monotonic() + 30
            while not bk.client.loop._handed:  # the tail's first step is on the loop
                assert time.monotonic() < deadline
                time.sleep(0.001)
            for i in range(50):
                wal.append(b"t%d" % i)
                assert baton.state != "parked"
            assert all_seen.wait(60)
            tail.join(30)
            reader.close()
            assert [r for r in seen if r.startswith(b"t")] == [b"t%d" % i for i in range(50)]
