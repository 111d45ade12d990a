"""Retention that runs itself and snapshots kept by policy (issue 20): the cut's rules
and bounds (pure, with hypothesis), the writer's background passes, readers' holds and
named cursors, snapshots streamed in and out, half-written snapshots cleaned up."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import walkit
from support.client import client, local_cluster
from support.metadata import Driver, driver  # noqa: F401  (fixture)
from walkit import LSN, WriteAheadLog
from walkit.errors import InvalidArgumentError, NoSuchLedgerError, UsageError
from walkit.wal import Retention, set_namespace_defaults
from walkit.wal._format import LogMetadata, LogSettings, Segment, SnapshotRef
from walkit.wal._retention import SegmentFacts, read_holds, segments_to_drop
from walkit.wal._snapshots import SNAPSHOT_CHUNK, SnapshotJob

pytestmark = pytest.mark.timeout(300)

RECORD = b"r" * 200


# -- the cut, pure --------------------------------------------------------------------------------

def _meta(segments: int, snapshots: list[int]) -> LogMetadata:
    return LogMetadata(epoch=1, segments=tuple(Segment(i, 100 + i) for i in range(1, segments + 1)),
                       snapshots=tuple(SnapshotRef(LSN(s, 0, 0), 900 + s, 1) for s in snapshots), truncated=None,
                       settings=LogSettings())


def _facts(size: int = 1000, closed_at: Callable[[int], float | None] = lambda seq: 1000.0 + seq
           ) -> Callable[[Segment], SegmentFacts]:
    return lambda s: SegmentFacts(size, closed_at(s.seq))


def test_before_snapshot_drops_everything_below_the_oldest_kept_snapshot() -> None:
    meta = _meta(6, [3, 5])
    dropped = segments_to_drop(meta, Segment(6, 106), Retention(before_snapshot=True), [], _facts())
    assert [s.seq for s in dropped] == [1, 2]  # the oldest kept snapshot (segment 3) must stay replayable


def test_nothing_goes_without_a_snapshot_or_a_rule() -> None:
    assert segments_to_drop(_meta(6, []), Segment(6, 106), Retention(before_snapshot=True), [], _facts()) == []
    assert segments_to_drop(_meta(6, [5]), Segment(6, 106), Retention(), [], _facts()) == []


def test_age_and_bytes_rules() -> None:
    meta = _meta(6, [6])
    old = segments_to_drop(meta, Segment(6, 106), Retention(max_age=10), [], _facts(), now=1013.5)
    assert [s.seq for s in old] == [1, 2, 3]  # closed at 1001..1003: more than 10 s before 1013.5
    big = segments_to_drop(meta, Segment(6, 106), Retention(max_bytes=2500), [], _facts(), open_bytes=400)
    assert [s.seq for s in big] == [1, 2, 3]  # 5 x 1000 + 400 -> 2400 once three are gone
    unknown = segments_to_drop(meta, Segment(6, 106), Retention(max_age=1), [], _facts(closed_at=lambda seq: None))
    assert unknown == []  # a segment without a known close time is never too old


def test_holds_bound_the_cut() -> None:
    meta = _meta(6, [6])
    rules = Retention(before_snapshot=True)
    assert [s.seq for s in segments_to_drop(meta, None, rules, [LSN(3, 4, 0)], _facts())] == [1, 2]
    assert segments_to_drop(meta, None, rules, [None], _facts()) == []  # held from the start: nothing
    assert [s.seq for s in segments_to_drop(meta, None, Retention(), [], _facts(), before=LSN(4, 0, 0))] == [1, 2, 3]


@given(segments=st.integers(1, 12), snapshot=st.integers(1, 14), current=st.integers(0, 13),
       holds=st.lists(st.one_of(st.none(), st.integers(1, 14)), max_size=3),
       max_age=st.one_of(st.none(), st.floats(0.5, 20)), max_bytes=st.one_of(st.none(), st.integers(1, 20_000)),
       before_snapshot=st.booleans(), before=st.one_of(st.none(), st.integers(1, 14)))
def test_what_a_cut_drops_is_a_prefix_below_every_bound(segments: int, snapshot: int, current: int,
                                                        holds: list[int | None], max_age: float | None,
                                                        max_bytes: int | None, before_snapshot: bool,
                                                        before: int | None) -> None:
    meta = _meta(segments, [min(snapshot, segments)])
    open_segment = Segment(current, 100 + current) if 1 <= current <= segments else None
    held = [None if h is None else LSN(h, 0, 0) for h in holds]
    dropped = segments_to_drop(meta, open_segment, Retention(max_age, max_bytes, before_snapshot), held, _facts(),
                               before=None if before is None else LSN(before, 0, 0), now=1010.0)
    assert list(meta.segments[:len(dropped)]) == dropped  # a prefix
    for segment in dropped:
        assert segment.seq < meta.snapshots[0].lsn.segment and segment != open_segment
        assert all(h is not None and segment.seq < h.segment for h in held)


def test_retention_rules_are_checked() -> None:
    for bad in ({"max_age": 0}, {"max_age": "1d"}, {"max_bytes": -1}, {"max_bytes": 1.5}, {"before_snapshot": 1},
                {"max_size": 10}):
        with pytest.raises(InvalidArgumentError):
            Retention.of(bad)
    with pytest.raises(InvalidArgumentError):
        LogSettings(snapshots_kept=0)
    assert LogSettings.of({"retention": {"max_bytes": 10}}).retention == Retention(max_bytes=10)


# -- with a cluster -------------------------------------------------------------------------------

@pytest.fixture
def bk(tmp_path: Path, driver: Driver) -> Iterator[walkit.BookKeeper]:
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        yield bk


def _wait(condition: Callable[[], bool], seconds: float = 20.0, message: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"condition not met in time {message()}"
        time.sleep(0.05)


def _fill(wal: WriteAheadLog, segments: int) -> list[LSN]:
    """Append until the log has ``segments`` more segments (roll_bytes is small)."""
    start = len(wal.metadata().segments)
    lsns: list[LSN] = []
    while len(wal.metadata().segments) < start + segments:
        lsns.append(wal.append(RECORD))
    return lsns


def _gone(bk: walkit.BookKeeper, ledger_id: int) -> bool:
    try:
        bk.ledger_metadata(ledger_id)
    except NoSuchLedgerError:
        return True
    return False


def test_before_snapshot_retention_runs_after_a_snapshot_and_keeps_every_kept_snapshot_replayable(
        bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "auto", roll_bytes=1000, retention=Retention(before_snapshot=True)) as wal:
        lsns = _fill(wal, 4)
        first = wal.snapshot(b"one", lsns[len(lsns) // 2])
        lsns += _fill(wal, 3)
        second = wal.snapshot(b"two", lsns[-1])
        _wait(lambda: wal.metadata().segments[0].seq == first.lsn.segment)
        meta = wal.metadata()
        assert meta.truncated == LSN(first.lsn.segment, 0, 0)
        assert [s.lsn for s in wal.snapshots()] == [first.lsn, second.lsn]
        # replay after either kept snapshot works
        assert [r for _, r in wal.replay(after=first.lsn)] == [RECORD] * len([x for x in lsns if x > first.lsn])
        assert wal.stats.retention_segments >= first.lsn.segment - 1


def test_a_policy_given_at_open_changes_an_existing_log_and_namespace_defaults_apply_to_new_ones(
        bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "later", roll_bytes=1000) as wal:
        assert wal.settings.retention == Retention() and wal.settings.snapshots_kept == 2
        lsns = _fill(wal, 3)
        wal.snapshot(b"s", lsns[-1])
        assert len(wal.metadata().segments) >= 4  # no rule: nothing went
    with WriteAheadLog.open(bk, "later", retention={"before_snapshot": True}, snapshots_kept=1) as wal:
        assert wal.settings.retention == Retention(before_snapshot=True)
        _wait(lambda: len(wal.metadata().segments) <= 2)  # the first pass, at open
    with WriteAheadLog.open(bk, "later") as wal:  # the log keeps its policy
        assert wal.metadata().settings.snapshots_kept == 1
        assert wal.settings.retention.before_snapshot
    set_namespace_defaults(bk, "kept", retention=Retention(max_bytes=1 << 20), snapshots_kept=3)
    with WriteAheadLog.open(bk, "fresh", namespace="kept") as wal:
        assert wal.settings.retention == Retention(max_bytes=1 << 20) and wal.settings.snapshots_kept == 3
    with pytest.raises(InvalidArgumentError):
        WriteAheadLog.open(bk, "bad", retention={"max_age": -1})
    with pytest.raises(InvalidArgumentError):
        WriteAheadLog.open(bk, "bad", snapshots_kept=0)


def test_bytes_and_age_rules_in_the_background(bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "bytes", roll_bytes=1000, retention=Retention(max_bytes=3000)) as wal:
        lsns = _fill(wal, 6)
        wal.snapshot(b"s", lsns[-1])
        _wait(lambda: sum(bk.ledger_metadata(s.ledger_id).length for s in wal.metadata().segments) <= 3000 + 1000)
        assert len(wal.metadata().segments) < 7
    with WriteAheadLog.open(bk, "age", roll_bytes=1000, retention=Retention(max_age=0.5)) as wal:
        lsns = _fill(wal, 3)
        snap = wal.snapshot(b"s", lsns[-1])
        time.sleep(0.7)
        _fill(wal, 1)  # a roll: the next pass finds the closed segments older than 0.5 s
        _wait(lambda: wal.metadata().segments[0].seq == snap.lsn.segment,
              message=lambda: f"{wal.metadata()} {wal.stats}")


def test_a_held_reader_keeps_the_segments_it_has_not_read_and_releases_them_on_close(bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "held", roll_bytes=1000, retention=Retention(before_snapshot=True)) as wal:
        lsns = _fill(wal, 5)
        reader = WriteAheadLog.reader(bk, "held", hold=True)
        records = reader.replay()
        assert next(records)[0] == lsns[0]  # the pass stands in segment 1
        wal.snapshot(b"s", lsns[-1])
        wal.truncate(lsns[-1])  # an explicit cut is bounded by the hold too
        time.sleep(0.3)
        assert wal.metadata().segments[0].seq == 1
        rest = [lsn for lsn, _ in records]
        assert rest == lsns[1:]  # every record, though retention wanted them gone
        _fill(wal, 1)  # a roll: a pass; the reader's hold now stands at the last segment it read
        _wait(lambda: wal.metadata().segments[0].seq == lsns[-1].segment)
        reader.close()
        assert read_holds(bk.client.cluster.store, wal._node.holds_path) == []


def test_a_named_cursor_is_kept_across_readers_and_bounds_retention(bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "cursor", roll_bytes=1000, retention=Retention(before_snapshot=True)) as wal:
        lsns = _fill(wal, 4)
        with WriteAheadLog.reader(bk, "cursor", cursor="indexer") as reader:
            assert reader.position is None
            reader.commit(lsns[2])
        with WriteAheadLog.reader(bk, "cursor", cursor="indexer") as reader:
            assert reader.position == lsns[2]
            wal.snapshot(b"s", lsns[-1])
            _fill(wal, 1)
            time.sleep(0.3)
            assert wal.metadata().segments[0].seq == lsns[2].segment  # kept from the cursor's segment
            assert [lsn for lsn, _ in reader.replay(after=reader.position)][0] > lsns[2]
            reader.commit(lsns[-1])
            _fill(wal, 1)
            _wait(lambda: wal.metadata().segments[0].seq == lsns[-1].segment)
            with pytest.raises(InvalidArgumentError):
                reader.commit(lsns[0])  # those records are gone
            reader.delete_cursor()
        with WriteAheadLog.reader(bk, "cursor") as plain:
            with pytest.raises(UsageError):
                plain.commit(lsns[-1])
        with pytest.raises(InvalidArgumentError):
            WriteAheadLog.reader(bk, "cursor", cursor="a/b")


def test_a_hold_registered_while_a_cut_is_decided_is_seen(bk: walkit.BookKeeper,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The race of walkit/wal/_retention.py: the cut reads no hold, a reader registers
    one at the log's start, and the cut's compare-and-set must then fail and see it."""
    from walkit.wal import _retention

    with WriteAheadLog.open(bk, "race", roll_bytes=1000) as wal:
        lsns = _fill(wal, 4)
        wal.snapshot(b"s", lsns[-1])
        readers: list[object] = []
        real = _retention.read_holds

        def late_reader(store: object, path: str) -> list[LSN | None]:
            seen = real(store, path)  # type: ignore[arg-type]
            if not readers:
                readers.append(WriteAheadLog.reader(bk, "race", hold=True))  # registers at the start
            return seen

        monkeypatch.setattr(_retention, "read_holds", late_reader)
        assert wal.truncate(lsns[-1]) == 0  # decided again, with the hold: nothing goes
        assert wal.metadata().segments[0].seq == 1
        readers[0].close()  # type: ignore[attr-defined]
        assert wal.truncate(lsns[-1]) == lsns[-1].segment - 1


def test_a_snapshot_failing_half_way_is_never_listed_and_its_ledger_is_deleted(bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "half", roll_bytes=1000) as wal:
        lsn = wal.append(b"x")
        before = set(bk.list_ledgers())

        def chunks() -> Iterator[bytes]:
            yield b"a" * SNAPSHOT_CHUNK
            yield b"b" * 10
            raise OSError("the state's file went away")

        with pytest.raises(OSError):
            wal.snapshot(chunks(), lsn)
        assert wal.snapshots() == [] and wal.metadata().pending == ()
        assert set(bk.list_ledgers()) == before
        with pytest.raises(InvalidArgumentError):
            wal.snapshot(["text, not bytes"], lsn)  # type: ignore[list-item]
        assert set(bk.list_ledgers()) == before
        assert wal.snapshot(b"", lsn).read() == b""  # an empty state is a snapshot too


def test_a_writer_dying_mid_snapshot_leaves_a_name_the_next_writer_cleans_up(bk: walkit.BookKeeper) -> None:
    wal = WriteAheadLog.open(bk, "dead", roll_bytes=1000)
    lsn = wal.append(b"x")
    job = SnapshotJob(wal.core.state, lsn)
    bk.client.loop.run(job.begin())
    bk.client.loop.run(job.add(b"half of the state"))  # ... and the writer dies: no commit, no abort
    assert job._writer is not None
    orphan = job._writer.ledger_id
    assert [p.ledger_id for p in wal.metadata().pending] == [orphan]
    with WriteAheadLog.open(bk, "dead") as next_writer:  # its first pass
        _wait(lambda: next_writer.metadata().pending == ())
        _wait(lambda: _gone(bk, orphan))
        assert next_writer.snapshots() == []
    wal.close()


def test_snapshots_stream_in_and_out(bk: walkit.BookKeeper, tmp_path: Path) -> None:
    source = tmp_path / "state"
    source.write_bytes(os.urandom(SNAPSHOT_CHUNK * 2 + 12345))
    with WriteAheadLog.open(bk, "stream") as wal:
        lsn = wal.append(b"x")
        with source.open("rb") as f:
            snap = wal.snapshot(f, lsn)
        assert snap.size == source.stat().st_size
        pieces = list(snap.chunks())
        assert b"".join(pieces) == source.read_bytes() and max(map(len, pieces)) <= SNAPSHOT_CHUNK
        with snap.open() as stream:
            assert stream.read(100) == source.read_bytes()[:100]
        chosen = wal.snapshot(iter([b"ab", b"", bytearray(b"cd"), memoryview(b"ef")]), lsn)
        assert [s.read() for s in wal.snapshots()] == [source.read_bytes(), b"abcdef"]
        assert chosen.read() == b"abcdef"


def _peak_rss_reset() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, the peak resident set


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.slow
def test_a_large_snapshot_streams_with_bounded_memory(tmp_path: Path) -> None:
    """1 GiB with WALKIT_SLOW=1 (256 MiB otherwise) written from a generator and read
    back chunk by chunk: the client process's peak RSS (the bookies are processes of
    their own) grows by far less than the snapshot."""
    size = (1 << 30) if os.environ.get("WALKIT_SLOW") else (256 << 20)
    block = os.urandom(SNAPSHOT_CHUNK)

    def chunks() -> Iterator[bytes]:
        for _ in range(size // len(block)):
            yield block

    with walkit.LocalCluster(tmp_path / "cluster", bookies=3, processes=True) as cluster, client(cluster) as bk:
        with WriteAheadLog.open(bk, "big") as wal:
            lsn = wal.append(b"x")
            wal.snapshot(b"warm", lsn)  # connections, caches, the first ledgers: not counted
            _peak_rss_reset()
            base = _peak_rss()
            snap = wal.snapshot(chunks(), lsn)
            written = _peak_rss() - base
            _peak_rss_reset()
            base = _peak_rss()
            total = 0
            for piece in snap.chunks():
                assert piece == block[:len(piece)]
                total += len(piece)
            read = _peak_rss() - base
        assert snap.size == total == size
        print(f"snapshot of {size >> 20} MiB: peak RSS +{written >> 20} MiB writing, +{read >> 20} MiB reading")
        assert written < 64 << 20 and read < 64 << 20, (written, read)


def test_snapshots_rolls_and_passes_of_many_logs_on_one_client_never_deadlock(bk: walkit.BookKeeper) -> None:
    """A pass waits for its writer's lock on the client's loop, never on one of the 4
    metadata threads a snapshot under way needs (4 logs snapshotting while they roll
    used to hang every thread of the pool)."""
    import threading

    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with WriteAheadLog.open(bk, f"busy-{i}", roll_bytes=600, retention=Retention(before_snapshot=True)) as wal:
                for _ in range(4):
                    lsns = [wal.append(RECORD) for _ in range(6)]  # rolls: passes
                    wal.snapshot(iter([b"s" * 1000] * 3), lsns[-1])
                    wal.truncate(lsns[-1])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "hung"
    assert errors == []


def test_a_refused_commit_or_pass_leaves_the_hold_where_it_was(bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "refused", roll_bytes=1000, retention=Retention(before_snapshot=True)) as wal:
        lsns = _fill(wal, 4)
        wal.snapshot(b"s", lsns[-1])
        _wait(lambda: wal.metadata().segments[0].seq == lsns[-1].segment)
        with WriteAheadLog.reader(bk, "refused", cursor="c") as reader:
            reader.commit(lsns[-1])
            with pytest.raises(InvalidArgumentError):
                reader.commit(lsns[0])  # cut already: refused, and the cursor stays
            assert reader.position == lsns[-1]
        with WriteAheadLog.reader(bk, "refused", hold=True) as held:
            assert list(held.replay(lsns[-1])) == []
            position = held._hold.position  # type: ignore[union-attr]
            with pytest.raises(InvalidArgumentError):
                list(held.replay(lsns[0]))
            assert held._hold.position == position  # type: ignore[union-attr]
            store = bk.client.cluster.store
            store.delete(held._hold._path)  # type: ignore[union-attr,arg-type]  # as if its session expired
            newest = wal.append(b"y")
            assert list(held.replay(newest)) == []  # its next move holds again
            assert len(read_holds(store, wal._node.holds_path)) == 2  # the cursor and the new hold


def test_a_retention_rule_of_a_newer_walkit_is_kept_and_stops_every_cut(bk: walkit.BookKeeper) -> None:
    from walkit.errors import FormatError

    with WriteAheadLog.open(bk, "newer", roll_bytes=1000) as wal:
        lsns = _fill(wal, 3)
        wal.snapshot(b"s", lsns[-1])
        store, path = bk.client.cluster.store, wal._node.path
        import json
        data, stat = store.get(path)
        body = json.loads(data)
        body["settings"]["retention"] = {"before_snapshot": True, "max_segments": 1}
        store.set(path, json.dumps(body).encode(), stat.version)
        meta = wal.metadata()
        assert meta.unknown_retention == {"max_segments": 1} and meta.settings.retention.before_snapshot
        assert json.loads(meta.encode())["settings"]["retention"] == {"before_snapshot": True, "max_segments": 1}
        with pytest.raises(FormatError):
            wal.truncate(lsns[-1])
        _fill(wal, 1)  # a roll: a pass, which deletes nothing
        time.sleep(0.3)
        assert wal.metadata().segments[0].seq == 1


def test_a_ledger_that_could_not_be_deleted_is_deleted_by_a_later_pass(bk: walkit.BookKeeper,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from walkit.errors import MetadataUnavailableError

    with WriteAheadLog.open(bk, "undeleted", roll_bytes=1000, retention=Retention(before_snapshot=True)) as wal:
        lsns = _fill(wal, 3)
        first = wal.metadata().segments[0]
        ledgers = bk.client.ledgers
        real = ledgers.delete
        refused: list[int] = []

        def refuse_once(ledger_id: int, *args: object) -> None:
            if not refused:
                refused.append(ledger_id)
                raise MetadataUnavailableError("simulated outage")
            real(ledger_id, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(ledgers, "delete", refuse_once)
        wal.snapshot(b"s", lsns[-1])
        _wait(lambda: bool(refused) and wal.metadata().segments[0].seq == lsns[-1].segment)
        assert refused == [first.ledger_id] and first.ledger_id in wal.core.state.undeleted
        _fill(wal, 1)  # the next pass
        _wait(lambda: _gone(bk, first.ledger_id) and not wal.core.state.undeleted)
