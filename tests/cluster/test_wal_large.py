"""Records of any size (issue 20): a record larger than an entry is written alone, in
fragments in consecutive entries of one segment, and handed out by readers only whole.

Pure parts first (the fragment format, the reassembly rules on hand-made entries), then
a real in-process cluster (tests/support/client.py): round trips from 1 byte to 64 MiB,
mixed sizes through append_async and append_many, replay and tail around and inside a
large record, a roll asked for mid-record, the limits on both sides, a writer process
SIGKILLed mid-record, a writer fenced mid-record, the CLI, and the Spark source's task
boundaries (its reader without Spark, then once through Spark local[2]).

Entries are 4 KiB in most logs here, so that records of many entries stay cheap.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

import walkit
from support.client import FAST
from walkit import LSN, WriteAheadLog
from walkit.client import Entry
from walkit.errors import FormatError, FormatVersionError, InvalidArgumentError, WriterFencedError
from walkit.wal import LogReader, last_lsn
from walkit.wal._format import (
    FRAGMENT_HEAD_SIZE,
    Segment,
    fragment_count,
    is_fragment,
    pack_fragment,
    pack_records,
    unpack_fragment,
    unpack_records,
)
from walkit.wal._records import RecordReader, last_record
from walkit.wal._stats import LogStats

pytestmark = pytest.mark.timeout(300)

ENTRY = 4096  # max_entry_bytes of the logs here
ROOM = ENTRY - FRAGMENT_HEAD_SIZE  # a fragment's bytes in such an entry


def blob(size: int, seed: int = 0) -> bytes:
    """``size`` bytes that differ from one fragment to the next (a misplaced fragment shows)."""
    return random.Random(f"{size}/{seed}").randbytes(size)


# -- the format -----------------------------------------------------------------------------

def fragments(record: bytes, room: int) -> list[bytes]:
    count = fragment_count(len(record), room)
    return [pack_fragment(len(record), i, count, record[i * room:(i + 1) * room]) for i in range(count)]


def test_fragment_entries_round_trip_and_are_no_record_batches() -> None:
    record = blob(2500)
    parts = fragments(record, 1000)
    assert [len(p) for p in parts] == [1021, 1021, 521] and all(is_fragment(p) for p in parts)
    assert parts[1][:21] == b"WKRF\x01" + (2500).to_bytes(8, "big") + (1).to_bytes(4, "big") + (3).to_bytes(4, "big")
    assert b"".join(unpack_fragment(p).data for p in parts) == record
    assert [tuple(unpack_fragment(p))[:3] for p in parts] == [(2500, 0, 3), (2500, 1, 3), (2500, 2, 3)]
    with pytest.raises(FormatError, match="fragment of a record larger than an entry"):
        unpack_records(parts[0])  # a clear error, not garbage
    assert not is_fragment(pack_records([b"x"]))
    with pytest.raises(FormatError):
        unpack_fragment(pack_records([b"x"]))
    with pytest.raises(FormatVersionError, match="record fragment version 2"):
        unpack_fragment(b"WKRF\x02" + parts[0][5:])  # a version from the future
    for damaged in (parts[0][:20], b"WKRF\x01" + (10).to_bytes(8, "big") + (3).to_bytes(4, "big") + (3).to_bytes(4, "big"),
                    b"WKRF\x01" + (1).to_bytes(8, "big") + (0).to_bytes(4, "big") + (1).to_bytes(4, "big") + b"xy"):
        with pytest.raises(FormatError):  # cut short; index past count; more bytes than the record
            unpack_fragment(damaged)


def feed(reader: RecordReader, entries: list[tuple[int, int, bytes]], after: LSN | None = None,
         chunk: int = 0) -> list[tuple[LSN, bytes]]:
    """``(segment, entry id, payload)`` handed to ``reader`` in order, as a pass would:
    one at a time (``chunk`` 0: ``records``), or in chunks of up to ``chunk`` entries of
    one segment (``chunk``, as a replay hands them). A negative ``chunk`` is its absolute
    value with every payload a view of a larger ``bytes`` (a reader's ``payload_views``,
    as the log's passes read): the records handed out are ``bytes`` all the same."""
    out: list[tuple[LSN, bytes]] = []
    views, chunk = chunk < 0, abs(chunk)

    def entry(seq: int, entry_id: int, data: bytes) -> Entry:
        return Entry(100 + seq, entry_id, memoryview(b"frame" + data + b"next")[5:-4] if views else data)  # type: ignore[arg-type]

    if not chunk:
        for seq, entry_id, data in entries:
            out += reader.records(Segment(seq, 100 + seq), entry(seq, entry_id, data), after)
    at = 0
    while chunk and at < len(entries):
        seq = entries[at][0]
        group = list(itertools.takewhile(lambda e: e[0] == seq, entries[at : at + chunk]))
        out += reader.chunk(Segment(seq, 100 + seq), [entry(seq, e, d) for _, e, d in group], after)
        at += len(group)
    assert all(type(record) is bytes for _, record in out)
    return out


CHUNKS = [0, 1, 2, 3, 100, -1, -3, -100]  # one entry at a time, chunks cut at every place; payloads as views


@pytest.mark.parametrize("chunk", CHUNKS)
def test_a_record_reader_hands_out_whole_records_only(chunk: int) -> None:
    big, other = blob(2500, 1), blob(1800, 2)
    parts, others = fragments(big, 1000), fragments(other, 1000)
    log = [(1, 0, pack_records([b"a", b"b"])), *[(1, 1 + i, p) for i, p in enumerate(parts)],
           (1, 4, pack_records([b"c"])), *[(1, 5 + i, p) for i, p in enumerate(others)]]
    whole = [(LSN(1, 0, 0), b"a"), (LSN(1, 0, 1), b"b"), (LSN(1, 3, 0), big), (LSN(1, 4, 0), b"c"),
             (LSN(1, 6, 0), other)]
    reader = RecordReader("t", LogStats())
    assert feed(reader, log, chunk=chunk) == whole
    assert reader.stats.replayed_records == 5 and reader.stats.replayed_entries == 7
    # a pass that starts inside a record skips it; one that starts before it, or at a
    # position between records, gets it whole
    for after, expected in ((LSN(1, 0, 1), whole[2:]), (LSN(1, 0, 99), whole[2:]), (LSN(1, 1, 0), whole[3:]),
                            (LSN(1, 2, 0), whole[3:]), (LSN(1, 3, 0), whole[3:]), (LSN(1, 5, 0), [])):
        start = [e for e in log if (e[0], e[1]) >= (after.segment, after.entry)]
        assert feed(RecordReader("t", LogStats()), start, after, chunk) == expected, after
    # a record its writer never finished: dropped when another segment, a batch or a new
    # record comes; never handed out
    for unfinished_then in ([(2, 0, pack_records([b"n"]))], [(1, 3, pack_records([b"n"]))],
                            [(1, 3 + i, p) for i, p in enumerate(fragments(b"n", 1000))]):
        reader = RecordReader("t", LogStats())
        got = feed(reader, [*log[:3], *unfinished_then], chunk=chunk)
        assert got == [*whole[:2], (LSN(unfinished_then[-1][0], unfinished_then[-1][1], 0), b"n")]
        assert not reader._assembly.active  # the unfinished record's fragments are let go
    assert feed(RecordReader("t", LogStats()), log[:3], chunk=chunk) == whole[:2]  # the pass ends inside it
    # the rest of a record without its start, in a new segment: skipped
    rest = [(2, 0, parts[1]), (2, 1, parts[2]), (2, 2, pack_records([b"z"]))]
    assert feed(RecordReader("t", LogStats()), rest, chunk=chunk) == [(LSN(2, 2, 0), b"z")]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_a_record_reader_refuses_damage_and_records_over_its_limit(chunk: int) -> None:
    big = blob(2500, 3)
    parts = fragments(big, 1000)
    with pytest.raises(FormatError, match="does not follow") as caught:  # fragment 2 right after fragment 0
        feed(RecordReader("t", LogStats()), [(1, 0, parts[0]), (1, 1, parts[2])], chunk=chunk)
    assert caught.value.context["segment"] == 1 and caught.value.context["entry"] == 1
    short = pack_fragment(2500, 2, 3, b"x" * 10)  # the fragments add up to less than the record
    with pytest.raises(FormatError, match="do not add up"):
        feed(RecordReader("t", LogStats()), [(1, 0, parts[0]), (1, 1, parts[1]), (1, 2, short)], chunk=chunk)
    with pytest.raises(FormatError, match="max_record_bytes") as caught:
        feed(RecordReader("t", LogStats(), max_record_bytes=2499), [(1, 0, parts[0])], chunk=chunk)
    assert caught.value.context["size"] == 2500 and caught.value.context["limit"] == 2499
    whole = [(1, i, p) for i, p in enumerate(parts)]
    assert feed(RecordReader("t", LogStats(), max_record_bytes=2500), whole, chunk=chunk) == [(LSN(1, 2, 0), big)]
    with pytest.raises(InvalidArgumentError):
        RecordReader("t", LogStats(), max_record_bytes=0)


def test_runs_of_single_records_read_in_chunks_as_one_at_a_time() -> None:
    """A log written one append at a time (an entry per record) takes the chunk's quick
    path; whatever else comes between (batches, a version-1 batch of one, fragments, an
    empty entry, a length that does not add up) gives the same pairs and counts as
    entry-by-entry reading, and damage ends a chunk only after the records before it."""
    v1 = b"WKRB\x01\x00\x00\x00\x01\x00\x00\x00\x02v1"  # version 1, one record of 2 bytes
    log = [(1, i, pack_records([blob(50 + i, i)])) for i in range(6)] + [
        (1, 6, pack_records([b"x", b"y"])), (1, 7, v1), (1, 8, pack_records([b""])),
        *[(1, 9 + i, p) for i, p in enumerate(fragments(blob(2500, 9), 1000))],
        (1, 12, pack_records([b"q"])), (2, 0, pack_records([b"r"])), (2, 1, pack_records([b"s"]))]
    expected = feed(RecordReader("t", LogStats()), log)
    assert [lsn for lsn, _ in expected][:9] == [LSN(1, i, 0) for i in range(6)] + [LSN(1, 6, 0), LSN(1, 6, 1),
                                                                                LSN(1, 7, 0)]
    assert len(expected) == 14 and expected[-4][1] == blob(2500, 9)
    for chunk in CHUNKS[1:]:
        for after in (None, LSN(1, 2, 0), LSN(1, 6, 0), LSN(1, 10, 0), LSN(1, 12, 0), LSN(2, 0, 0), LSN(3, 0, 0)):
            one, many = RecordReader("t", LogStats()), RecordReader("t", LogStats())
            start = log if after is None else [e for e in log if (e[0], e[1]) >= (after.segment, after.entry)]
            assert feed(many, start, after, chunk) == feed(one, start, after), (chunk, after)
            assert (many.stats.replayed_records, many.stats.replayed_entries) \
                == (one.stats.replayed_records, one.stats.replayed_entries)
    # a single record whose length does not add up is damage: the records before it come first
    bad = pack_records([b"abc"])[:-1]
    reader = RecordReader("t", LogStats())
    pairs = reader.chunk(Segment(1, 101), [Entry(101, i, d) for i, d in enumerate([*[e[2] for e in log[:3]], bad])],
                         None)
    got = []
    with pytest.raises(FormatError, match="not a record batch") as caught:
        for pair in pairs:
            got.append(pair)
    assert got == expected[:3] and caught.value.context["entry"] == 3


def test_the_last_record_is_found_from_the_end() -> None:
    big = blob(2500, 4)
    parts = fragments(big, 1000)
    entries = [pack_records([b"a", b"b"]), *parts, *parts[:2]]  # a whole record, then an unfinished one

    def upto(last: int) -> LSN | None:
        return last_record(7, last, entries.__getitem__)

    assert [upto(last) for last in range(6)] == [LSN(7, 0, 1), LSN(7, 0, 1), LSN(7, 0, 1), LSN(7, 3, 0),
                                                 LSN(7, 3, 0), LSN(7, 3, 0)]
    assert last_record(7, 1, [parts[0], parts[1]].__getitem__) is None


# -- with a cluster ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[walkit.LocalCluster]:
    with walkit.LocalCluster(tmp_path_factory.mktemp("large") / "cluster", bookies=3, session_timeout=2.0) as c:
        yield c


@pytest.fixture(scope="module")
def bk(cluster: walkit.LocalCluster) -> Iterator[walkit.BookKeeper]:
    with cluster.client(**FAST) as client:
        yield client


def replayed(bk: walkit.BookKeeper, name: str, after: LSN | None = None, **options: Any) -> list[tuple[LSN, bytes]]:
    with WriteAheadLog.reader(bk, name, **options) as reader:
        return list(reader.replay(after))


def entries_of(bk: walkit.BookKeeper, ledger_id: int) -> list[bytes]:
    handle = bk.open_ledger(ledger_id, recovery=False)
    return [e.data for e in handle.read(0, handle.last_add_confirmed)] if handle.last_add_confirmed >= 0 else []


class Held:
    """Holds a writer's entry completions once ``after`` fragment entries completed: its
    in-flight room stays taken, so it sends nothing more until :meth:`release`."""

    def __init__(self, wal: WriteAheadLog, after: int) -> None:
        self.wal, self.left = wal, after
        self.real = wal.core._entry_done
        self.calls: list[tuple[Future[int], dict[str, Any]]] = []
        self.reached = threading.Event()
        wal.core._entry_done = self._done  # type: ignore[method-assign]

    def _done(self, done: Future[int], **kwargs: Any) -> None:
        if self.left <= 0:
            self.calls.append((done, kwargs))
            self.reached.set()
            return
        self.left -= not kwargs["futures"]
        self.real(done, **kwargs)

    def release(self) -> None:
        self.wal.core._entry_done = self.real  # type: ignore[method-assign]

        def run() -> None:
            for done, kwargs in self.calls:
                self.real(done, **kwargs)

        self.wal.core.state.client.loop.call(run)


def test_records_from_one_byte_to_many_entries_round_trip(bk: walkit.BookKeeper) -> None:
    sizes = [1, ENTRY - 16, ENTRY - 15, ENTRY, ROOM, ROOM + 1, 2 * ROOM, 2 * ROOM + 1, 3 * ROOM, 10_000, 100_001, 0]
    records = [blob(n, i) for i, n in enumerate(sizes)]
    with WriteAheadLog.open(bk, "sizes", max_entry_bytes=ENTRY) as wal:
        lsns = [wal.append(record) for record in records]
        assert lsns == sorted(lsns) and all(lsn.slot == 0 for lsn in lsns)
        assert wal.last_lsn == lsns[-1] and wal.stats.records == len(records)
        spans = [lsns[0].entry + 1] + [b.entry - a.entry for a, b in zip(lsns, lsns[1:])]
        expected = [1 if n <= ENTRY - 16 else fragment_count(n, ROOM) for n in sizes]
        assert spans == expected  # a record larger than an entry takes consecutive entries, nothing between
        assert wal.stats.entries == sum(expected)
        assert list(wal.replay()) == list(zip(lsns, records))
    assert replayed(bk, "sizes") == list(zip(lsns, records))


def test_a_64_mib_record(bk: walkit.BookKeeper) -> None:
    record = os.urandom(64 << 20)  # exactly the default max_record_bytes
    with WriteAheadLog.open(bk, "huge", ensemble_size=2, write_quorum=2, ack_quorum=2, max_entry_bytes=4 << 20) as wal:
        small = wal.append(b"small")
        lsn = wal.append(record)
        assert lsn == LSN(small.segment, small.entry + fragment_count(64 << 20, (4 << 20) - FRAGMENT_HEAD_SIZE), 0)
        with pytest.raises(InvalidArgumentError) as caught:
            wal.append(record + b"!")
        assert caught.value.context == {"size": (64 << 20) + 1, "limit": 64 << 20}
    got = replayed(bk, "huge")
    assert [lsn for lsn, _ in got] == [small, lsn] and got[1][1] == record
    del got


def test_mixed_sizes_through_append_async_and_append_many(bk: walkit.BookKeeper) -> None:
    rng = random.Random(20)
    sizes = [rng.choice([rng.randint(0, 300), rng.randint(300, 3000), rng.randint(ENTRY, 4 * ENTRY)])
             for _ in range(400)]
    records = [blob(n, i) for i, n in enumerate(sizes)]
    with WriteAheadLog.open(bk, "mixed", max_entry_bytes=ENTRY) as wal:
        futures: list[tuple[int, Future[Any]]] = []
        i = 0
        while i < len(records):  # single appends and groups, queued as fast as they come
            n = rng.choice([1, 1, 3, 17])
            if n == 1:
                futures.append((1, wal.append_async(records[i])))
            else:
                futures.append((n, wal.append_many(records[i:i + n])))
            i += n
        lsns: list[LSN] = []
        for n, fut in futures:
            result = fut.result(60)
            lsns += [result] if n == 1 else result
        assert len(lsns) == len(records) and lsns == sorted(lsns) and len(set(lsns)) == len(lsns)
        for lsn, size in zip(lsns, sizes):
            if size > ENTRY - 16:
                assert lsn.slot == 0
        assert wal.flush() == lsns[-1] == wal.last_lsn and wal.stats.records == len(records)
        assert list(wal.replay()) == list(zip(lsns, records))
        entries = entries_of(bk, wal.core.state.segment.ledger_id)
        assert sum(map(is_fragment, entries)) == sum(fragment_count(n, ROOM) for n in sizes if n > ENTRY - 16)
    assert replayed(bk, "mixed") == list(zip(lsns, records))


def test_replay_after_a_large_record_and_inside_one(bk: walkit.BookKeeper) -> None:
    big = blob(3 * ROOM, 5)  # three fragments
    with WriteAheadLog.open(bk, "after", max_entry_bytes=ENTRY) as wal:
        a = wal.append(b"a")
        large = wal.append(big)
        b = wal.append(b"b")
    assert large == LSN(a.segment, a.entry + 3, 0) and b.entry == large.entry + 1
    log = [(a, b"a"), (large, big), (b, b"b")]
    assert replayed(bk, "after") == log
    assert replayed(bk, "after", a) == log[1:]
    assert replayed(bk, "after", LSN(a.segment, a.entry, 99)) == log[1:]  # between records
    assert replayed(bk, "after", large) == log[2:]
    for inside in (LSN(a.segment, a.entry + 1, 0), LSN(a.segment, a.entry + 2, 7)):  # no record has these
        assert replayed(bk, "after", inside) == log[2:]


def test_a_tail_sees_a_large_record_only_whole(bk: walkit.BookKeeper) -> None:
    big = blob(12 * ROOM, 6)
    wal = WriteAheadLog.open(bk, "tailed", max_entry_bytes=ENTRY, max_inflight_entries=1)
    first = wal.append(b"first")
    reader = WriteAheadLog.reader(bk, "tailed")
    seen: list[tuple[LSN, bytes]] = []

    def follow() -> None:
        for lsn, record in reader.tail(poll_timeout=0.3):
            seen.append((lsn, record))
            if record == b"last":
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    held = Held(wal, after=5)
    fut = wal.append_async(big)
    assert held.reached.wait(30)
    deadline = time.monotonic() + 30
    while reader.stats.replayed_entries < 1 + 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reader.stats.replayed_entries >= 7  # the tail read "first" and six fragments ...
    time.sleep(0.3)
    assert seen == [(first, b"first")] and not fut.done()  # ... and handed out no part of the record
    held.release()
    lsn = fut.result(30)
    wal.append(b"last")
    thread.join(30)
    assert not thread.is_alive()
    assert [r for _, r in seen] == [b"first", big, b"last"] and seen[1][0] == lsn
    reader.close()
    wal.close()


@pytest.mark.parametrize("by", ["bytes", "age"])
def test_a_roll_asked_for_mid_record_waits_for_its_last_fragment(bk: walkit.BookKeeper, by: str) -> None:
    big = blob(20 * ROOM, 7)
    name = f"roll-{by}"
    with WriteAheadLog.open(bk, name, max_entry_bytes=ENTRY, max_inflight_entries=1,
                            roll_bytes=3 * ENTRY if by == "bytes" else None,
                            roll_seconds=0.5 if by == "age" else None) as wal:
        before = wal.append(b"x" * 100)
        held = Held(wal, after=2)
        fut = wal.append_async(big)
        assert held.reached.wait(30)
        if by == "age":
            time.sleep(0.6)  # the segment is old enough to roll now, in the middle of the record
        else:
            assert wal.core.state.segment_bytes >= 3 * ENTRY - 200  # about to be big enough to roll
        held.release()
        lsn = fut.result(30)
        after = wal.append(b"after")
        segments = wal.metadata().segments
    assert lsn.segment == before.segment and after.segment == lsn.segment + 1  # rolled after the record, not in it
    ledger = next(s.ledger_id for s in segments if s.seq == lsn.segment)
    entries = entries_of(bk, ledger)
    assert len(entries) == lsn.entry + 1 and bk.ledger_metadata(ledger).last_entry_id == lsn.entry
    assert [unpack_fragment(e).part for e in entries[before.entry + 1:]] == list(range(20))
    assert replayed(bk, name) == [(before, b"x" * 100), (lsn, big), (after, b"after")]


def test_the_limits_on_both_sides(bk: walkit.BookKeeper) -> None:
    for bad in (0, -1, True, "64", 1.5):
        with pytest.raises(InvalidArgumentError, match="max_record_bytes"):
            WriteAheadLog.open(bk, "limits", max_record_bytes=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="max_record_bytes"):
            WriteAheadLog.reader(bk, "sizes", max_record_bytes=bad)  # type: ignore[arg-type]
    with WriteAheadLog.open(bk, "limits", max_entry_bytes=ENTRY, max_record_bytes=20_000) as wal:
        first = wal.append(blob(20_000))
        with pytest.raises(InvalidArgumentError) as caught:
            wal.append(blob(20_001))
        assert "max_record_bytes" in str(caught.value) and caught.value.context == {"size": 20_001, "limit": 20_000}
        with pytest.raises(InvalidArgumentError):  # checked before anything is queued
            wal.append_many([b"one", blob(30_000), b"three"])
        assert wal.append(b"next") > first
        assert [r for _, r in wal.replay()] == [blob(20_000), b"next"]
    with pytest.raises(FormatError, match="max_record_bytes") as refused:
        replayed(bk, "limits", max_record_bytes=19_999)
    assert refused.value.context["size"] == 20_000 and refused.value.context["limit"] == 19_999
    with WriteAheadLog.reader(bk, "limits", max_record_bytes=19_999) as reader, pytest.raises(FormatError):
        next(iter(reader.tail(poll_timeout=0.2)))
    assert len(replayed(bk, "limits", max_record_bytes=20_000)) == 2


def test_a_writer_fenced_mid_record_fails_that_record_only(bk: walkit.BookKeeper, cluster: walkit.LocalCluster) -> None:
    big = blob(30 * ROOM, 8)
    with cluster.client(**FAST) as other:
        old = WriteAheadLog.open(other, "fenced", max_entry_bytes=ENTRY, max_inflight_entries=1)
        acked = old.append(b"acked")
        held = Held(old, after=4)
        fut = old.append_async(big)
        behind = old.append_async(b"behind")  # queued after the large record
        assert held.reached.wait(30)
        new = WriteAheadLog.open(bk, "fenced", max_entry_bytes=ENTRY)  # fences the old writer's segment
        held.release()
        with pytest.raises(WriterFencedError):
            fut.result(30)
        with pytest.raises(WriterFencedError):
            behind.result(30)
        with pytest.raises(WriterFencedError):
            old.append(b"never")
        old.close()
        dead = entries_of(bk, wal_segment(bk, "fenced", acked.segment))
        assert is_fragment(dead[-1]) and unpack_fragment(dead[-1]).part == 4  # five fragments stayed behind
        assert list(new.replay()) == [(acked, b"acked")]
        assert last_lsn(bk, new.metadata()) == acked  # from the end: past the unfinished record
        lsns = [new.append(b"new"), new.append(big)]
        new.close()
    assert replayed(bk, "fenced") == [(acked, b"acked"), (lsns[0], b"new"), (lsns[1], big)]


def wal_segment(bk: walkit.BookKeeper, name: str, seq: int) -> int:
    with WriteAheadLog.reader(bk, name) as reader:
        return next(s.ledger_id for s in reader.metadata().segments if s.seq == seq)


def _mid_record_writer(uri: str, out: Any) -> None:
    """(A process of its own) append a record, then a large one, and stop the client's
    loop after three of its fragments are durable, until SIGKILL."""
    bk = walkit.BookKeeper(uri, **FAST)
    wal = WriteAheadLog.open(bk, "killed", max_entry_bytes=ENTRY, max_inflight_entries=1)
    out.put(("acked", tuple(wal.append(b"before"))))
    real = wal.core._entry_done
    completed = [0]

    def done(fut: Future[int], **kwargs: Any) -> None:
        real(fut, **kwargs)
        completed[0] += 1
        if completed[0] == 3:
            out.put(("mid", completed[0]))
            time.sleep(3600)  # on the client's loop: nothing more is sent or completed

    wal.core._entry_done = done  # type: ignore[method-assign]
    wal.append_async(blob(50 * ROOM, 9))
    time.sleep(3600)


def test_a_writer_process_killed_mid_record_leaves_nothing_visible(bk: walkit.BookKeeper,
                                                                   cluster: walkit.LocalCluster,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_mid_record_writer, args=(cluster.metadata_uri, out))
    proc.start()
    seen: list[tuple[LSN, bytes]] = []
    try:
        kind, parts = out.get(timeout=120)
        assert kind == "acked"
        before = LSN(*parts)
        reader = WriteAheadLog.reader(bk, "killed", max_record_bytes=1 << 20)

        def follow(tail: LogReader) -> None:
            for lsn, record in tail.tail(poll_timeout=0.3):
                seen.append((lsn, record))
                if record == b"after":
                    return

        thread = threading.Thread(target=follow, args=(reader,), daemon=True)
        thread.start()
        assert out.get(timeout=120)[0] == "mid"
        deadline = time.monotonic() + 30
        # "before" and the fragments up to the writer's last LAC (the third one's LAC is not sent)
        while reader.stats.replayed_entries < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        assert reader.stats.replayed_entries >= 3 and seen == [(before, b"before")]
    finally:
        proc.kill()  # SIGKILL, mid-record
        proc.join(30)
    assert proc.exitcode == -9
    big = blob(7 * ROOM, 10)
    with WriteAheadLog.open(bk, "killed", max_entry_bytes=ENTRY) as wal:  # recovers the dead writer's segment
        dead = entries_of(bk, wal_segment(bk, "killed", before.segment))
        assert len(dead) >= 4 and all(map(is_fragment, dead[1:]))  # the unfinished record's fragments are there
        assert unpack_fragment(dead[-1]).part < unpack_fragment(dead[-1]).parts - 1
        assert last_lsn(bk, wal.metadata()) == before
        assert list(wal.replay()) == [(before, b"before")]
        lsns = [wal.append(b"next"), wal.append(big), wal.append(b"after")]
    thread.join(30)
    assert not thread.is_alive()
    log = [(before, b"before"), (lsns[0], b"next"), (lsns[1], big), (lsns[2], b"after")]
    assert seen == log
    assert replayed(bk, "killed") == log
    reader.close()
    from walkit.cli import main  # the CLI reads through the same reader

    assert main(["log", "read", "killed", "--metadata", cluster.metadata_uri, "--format", "json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["lsn"] for line in lines] == [str(lsn) for lsn, _ in log]
    assert main(["log", "show", "killed", "--metadata", cluster.metadata_uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["last_lsn"] == str(lsns[2])


# -- the Spark source ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spark_log(bk: walkit.BookKeeper) -> list[tuple[LSN, bytes]]:
    """A log of batches and records of 2 to 9 entries, across two segments."""
    pytest.importorskip("pyarrow")
    rng = random.Random(21)
    with WriteAheadLog.open(bk, "spark", max_entry_bytes=ENTRY, roll_bytes=40 * ENTRY) as wal:
        futures = []
        for i in range(60):
            size = rng.choice([rng.randint(1, 200), rng.randint(ENTRY, 9 * ROOM)])
            futures.append(wal.append_async(blob(size, 100 + i)))
            if i % 7 == 0:
                wal.flush()  # entries of one record as well as batches of several
        for fut in futures:
            fut.result(30)
    log = replayed(bk, "spark")
    assert len(log) == 60 and len({lsn.segment for lsn, _ in log}) >= 2
    return log


def _task_rows(uri: str, after: LSN | None, until: LSN | None, per_task: int) -> list[tuple[LSN, bytes]]:
    from walkit.spark._plan import ReadOptions, plan_log
    from walkit.spark._read import log_batches, log_extents

    opts = ReadOptions(metadata=uri, log="spark")
    rows: list[tuple[LSN, bytes]] = []
    with walkit.BookKeeper(uri) as client:
        extents = log_extents(client, opts, after, until)
    for task in plan_log(extents, after=after, until=until, entries_per_partition=per_task):
        for batch in log_batches(uri, b"", "default", "spark", task):
            columns = batch.to_pydict()
            rows += [(LSN.parse(text), record) for text, record in zip(columns["lsn"], columns["record"])]
    return rows


def test_spark_tasks_cut_through_records_and_read_each_once(cluster: walkit.LocalCluster,
                                                            spark_log: list[tuple[LSN, bytes]]) -> None:
    from walkit.spark._plan import END_SLOT

    uri = cluster.metadata_uri
    for per_task in (1, 2, 3, 5, 1000):
        assert _task_rows(uri, None, None, per_task) == spark_log, per_task
    large = [lsn for lsn, record in spark_log if len(record) > ENTRY - 16]
    for lsn in large[:3]:  # a stream offset at an LAC reached mid-record: the record is the next batch's
        inside = LSN(lsn.segment, lsn.entry - 1, END_SLOT)
        assert _task_rows(uri, None, inside, 2) == [x for x in spark_log if x[0] <= inside]
        assert _task_rows(uri, inside, None, 2) == [x for x in spark_log if x[0] > inside]


def test_spark_last_record_skips_an_unfinished_one(bk: walkit.BookKeeper, cluster: walkit.LocalCluster) -> None:
    pytest.importorskip("pyarrow")
    from walkit.spark._plan import ReadOptions
    from walkit.spark._read import last_position, last_record as spark_last_record

    wal = WriteAheadLog.open(bk, "spark-last", max_entry_bytes=ENTRY, max_inflight_entries=1)
    first = wal.append(b"first")
    held = Held(wal, after=2)
    fut = wal.append_async(blob(10 * ROOM, 11))
    assert held.reached.wait(30)
    opts = ReadOptions(metadata=cluster.metadata_uri, log="spark-last")
    time.sleep(0.3)  # the LAC of the fragments reaches the bookies
    assert spark_last_record(bk, opts) == first
    position = last_position(bk, opts)
    assert position is not None and position.entry > first.entry  # inside the record: it comes after it
    held.release()
    lsn = fut.result(30)
    wal.close()
    assert spark_last_record(bk, opts) == lsn


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_spark_reads_large_records_once_across_tasks(cluster: walkit.LocalCluster,
                                                     spark_log: list[tuple[LSN, bytes]]) -> None:
    """Through Spark local[2]: tasks of 3 entries, records of up to 9."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    from walkit.spark import spark_session

    os.environ["PYSPARK_PYTHON"] = sys.executable
    shared = SparkSession.getActiveSession()  # tests/cluster/test_spark.py's, when run in the same session
    session = shared or spark_session("local[2]", "walkit-large", driver_memory="1g",
                                      conf={"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                                            "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
    try:
        rows = (session.read.format("walkit").option("metadata", cluster.metadata_uri).option("log", "spark")
                .option("entriesPerPartition", "3").load().select("lsn", "record").collect())
    finally:
        if shared is None:
            session.stop()
    assert sorted((LSN.parse(r["lsn"]), bytes(r["record"])) for r in rows) == spark_log

