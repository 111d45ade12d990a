"""The journal writer on MemFS and on the real disk through both I/O backends.

The behaviour tests run on three file systems: MemFS, RealFS over the C shim and RealFS
over the pure-Python backend (on ``tmp_path``, ext4 here, so O_DIRECT is honoured); the
fault-injection tests run on MemFS. What is checked, besides "what went in comes out":

* callbacks run once each, in submission order, and only after the fdatasync that
  covers the record's bytes (an I/O spy orders writes, syncs and acks; on MemFS a power
  cut right after the acks loses nothing that was acknowledged);
* the file layout: every flush starts at an aligned offset with a frame flagged
  FLAG_FLUSH_START and ends with PADDING up to the next boundary;
* rolling, gc, I/O failure, shutdown and many producers at once.
"""

from __future__ import annotations

import array
import linecache
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from bookie import native
from bookie.fs import File, FileSystem
from bookie.fs.mem import MemFS
from bookie.fs.real import RealFS
from bookie.journal import (
    KEY_RECORD,
    FrameType,
    GroupCommitPolicy,
    Journal,
    JournalConfig,
    LogMark,
    list_journals,
    replay,
    scan_journal,
)
from bookie.journal import _framing
from bookie.journal._format import FLAG_FLUSH_START, FRAME_HEADER
from walkit.errors import BookieShutdownError, InvalidArgumentError, WalkitError
from support.journal import Rec, Recorder, submit

KIB = 1024
MIB = 1024 * KIB
A = 4096  # journal alignment



# --- fixtures and helpers ------------------------------------------------------------------


@dataclass
class Env:
    name: str
    fs: FileSystem
    dir: str
    journals: list[Journal] = field(default_factory=list)

    def journal(self, clock: Callable[[], float] = time.monotonic, **kw: Any) -> Journal:
        kw.setdefault("prealloc_size", 64 * KIB)
        j = Journal(self.fs, JournalConfig(self.dir, **kw), clock=clock)
        j.start()
        self.journals.append(j)
        return j


def _backend_fs(name: str) -> RealFS:
    try:
        return RealFS(native.get_backend(name))
    except ImportError as exc:
        if native.MODE == "require":
            raise
        pytest.skip(f"{name} backend unavailable: {exc}")


@pytest.fixture(params=["mem", "native", "python"])
def env(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Env]:
    if request.param == "mem":
        e = Env("mem", MemFS(), "/journal")
    else:
        e = Env(request.param, _backend_fs(request.param), str(tmp_path / "journal"))
    yield e
    for j in e.journals:
        j.shutdown()


@pytest.fixture
def mem() -> Iterator[Env]:
    e = Env("mem", MemFS(), "/journal")
    yield e
    for j in e.journals:
        j.shutdown()



def replayed(fs: FileSystem, directory: str, mark: LogMark | None = None, *, torn_ok: bool = False) -> list[Rec]:
    target = Recorder()
    report = replay(fs, directory, mark, target)
    assert torn_ok or not report.torn, f"a cleanly shut down journal has no torn tail: {report.torn}"
    entries = sum(1 for r in target.records if r[0] == "entry")
    assert report.entries == entries, f"report counts {report.entries} entries, target saw {entries}"
    return target.records


class Acks:
    """Callback that records ``(ctx, error)`` per call, in call order."""

    def __init__(self, on_call: Callable[[BaseException | None, Any], None] | None = None) -> None:
        self.calls: list[tuple[Any, BaseException | None]] = []
        self._cond = threading.Condition()
        self._on_call = on_call

    def __call__(self, err: BaseException | None, ctx: Any) -> None:
        if self._on_call is not None:
            self._on_call(err, ctx)
        with self._cond:
            self.calls.append((ctx, err))
            self._cond.notify_all()

    def wait(self, n: int, timeout: float = 20.0) -> None:
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.calls) >= n, timeout)
        assert ok, f"only {len(self.calls)} of {n} callbacks arrived within {timeout}s"


class GatedClock:
    """The real clock, except that while the gate is shut every thread but the test's own
    waits at it: the journal thread stops at its next look at the clock, so records can
    be queued before it acts on any of them."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self._owner = threading.current_thread()

    def __call__(self) -> float:
        if threading.current_thread() is not self._owner:
            assert self.gate.wait(10), "the test left the clock gate shut"
        return time.monotonic()




def payload(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@dataclass(frozen=True)
class Frame:
    journal_id: int
    offset: int
    ftype: int
    flags: int
    body: bytes

    @property
    def end(self) -> int:
        return self.offset + FRAME_HEADER.size + len(self.body)


def frames_of(fs: FileSystem, directory: str) -> list[Frame]:
    """Every valid frame of every journal file, with its file offset."""
    out: list[Frame] = []
    for jid in list_journals(fs, directory):
        frames, stop, alignment = scan_journal(fs, directory, jid)
        assert alignment == A, f"journal {jid}: header alignment {alignment}"
        off = alignment
        for ftype, flags, body in frames:
            out.append(Frame(jid, off, ftype, flags, body))
            off += FRAME_HEADER.size + len(body)
        assert off == stop.offset, f"journal {jid}: frames end at {off}, scan stopped at {stop.offset}"
    return out


def check_flush_layout(frames: list[Frame], expected_flushes: int) -> None:
    """Each flush: first frame aligned and flagged FLAG_FLUSH_START, PADDING (if any) last
    and ending on a boundary; files hold whole flushes only."""
    starts = [f for f in frames if f.flags & FLAG_FLUSH_START]
    assert len(starts) == expected_flushes, f"{len(starts)} frames flagged FLUSH_START, journal made {expected_flushes} flushes"
    for f in starts:
        assert f.offset % A == 0, f"flush start at unaligned offset {f.offset} in journal {f.journal_id}"
    for i, f in enumerate(frames):
        first_in_file = i == 0 or frames[i - 1].journal_id != f.journal_id
        after_padding = i > 0 and frames[i - 1].ftype == FrameType.PADDING and not first_in_file
        if first_in_file or after_padding:
            assert f.flags & FLAG_FLUSH_START, f"frame at {f.journal_id}:{f.offset} begins a flush but is not flagged"
        if f.ftype == FrameType.PADDING:
            assert f.end % A == 0, f"padding at {f.journal_id}:{f.offset} ends at unaligned {f.end}"
            assert f.body == bytes(len(f.body)), f"padding at {f.journal_id}:{f.offset} is not zeros"
        last_in_file = i == len(frames) - 1 or frames[i + 1].journal_id != f.journal_id
        if last_in_file:
            assert f.end % A == 0, f"journal {f.journal_id} data ends at unaligned {f.end}: a flush was cut"


def records_of(frames: list[Frame]) -> list[Rec]:
    """Decode frames the way replay should (an independent reading of the format)."""
    out: list[Rec] = []
    for f in frames:
        b = f.body
        lid = int.from_bytes(b[:8], "little")
        if f.ftype == FrameType.ENTRY:
            out.append(("entry", lid, int.from_bytes(b[8:16], "little", signed=True), b[16:]))
        elif f.ftype == FrameType.MASTER_KEY:
            out.append(("master_key", lid, b[8:]))
        elif f.ftype == FrameType.FENCE:
            out.append(("fence", lid))
        elif f.ftype == FrameType.LAC:
            out.append(("lac", lid, int.from_bytes(b[8:16], "little", signed=True)))
    return out


# --- an I/O spy: the order of writes, syncs and acknowledgements -------------------------------


class _SpyFile:
    def __init__(self, inner: File, events: list[tuple[Any, ...]]) -> None:
        self._inner = inner
        self._events = events

    def pwrite(self, data: Any, offset: int) -> int:
        n = self._inner.pwrite(data, offset)
        self._events.append(("write", self._inner.path, offset, len(memoryview(data))))
        return n

    def pwritev(self, buffers: list[Any], offset: int) -> int:
        n = self._inner.pwritev(buffers, offset)
        self._events.append(("write", self._inner.path, offset, n))
        return n

    def sync(self) -> None:
        self._inner.sync()
        self._events.append(("sync", self._inner.path))

    def pwritev_sync(self, buffers: list[Any], offset: int, datasync: bool = True) -> int:
        n = self.pwritev(buffers, offset)  # the inner file's two steps, each logged
        self.sync()
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class SpyFS:
    """Wraps a FileSystem; logs every completed pwrite(v) and sync of every file."""

    def __init__(self, inner: FileSystem) -> None:
        self._inner = inner
        self.events: list[tuple[Any, ...]] = []  # list.append is atomic: one global order

    def open(self, path: str, *, create: bool = False, direct: bool = False) -> _SpyFile:
        return _SpyFile(self._inner.open(path, create=create, direct=direct), self.events)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _norm(path: str) -> str:
    return "/" + "/".join(p for p in path.split("/") if p)


def check_acks_follow_sync(events: list[tuple[Any, ...]], frames: list[Frame], directory: str) -> None:
    """For every ("ack", ctx) event: the bytes of record ``ctx`` (the ctx-th non-padding
    frame) were all written before it, and a sync of that file came after those writes
    and before the ack."""
    records = [f for f in frames if f.ftype != FrameType.PADDING]
    for k, ev in enumerate(events):
        if ev[0] != "ack":
            continue
        ctx = ev[1]
        f = records[ctx]
        path = _norm(f"{directory}/{f.journal_id:016x}.txn")
        covering = [
            (i, e) for i, e in enumerate(events[:k])
            if e[0] == "write" and _norm(e[1]) == path and e[2] < f.end and e[2] + e[3] > f.offset
        ]
        covered = sum(min(f.end, e[2] + e[3]) - max(f.offset, e[2]) for _, e in covering)
        assert covered >= f.end - f.offset, (
            f"record {ctx} ({f.journal_id}:{f.offset}..{f.end}) acknowledged before all its bytes were written "
            f"({covered} of {f.end - f.offset})"
        )
        last_write = max(i for i, _ in covering)
        synced = any(e[0] == "sync" and _norm(e[1]) == path for e in events[last_write + 1 : k])
        assert synced, f"record {ctx} acknowledged without an fdatasync of {path} after its last write"


# --- round trip -------------------------------------------------------------------------------

SIZES = [0, 1, 4063, 4068, 4095, 4096, 100 * KIB, 3 * MIB]  # 4063/4068: padding < header / none


def _workload() -> list[list[Rec]]:
    """Groups of records; each group is awaited before the next, so flush boundaries
    fall between groups (and sometimes inside them)."""
    e = [("entry", 7, i, payload(n, i)) for i, n in enumerate(SIZES)]
    return [
        [("master_key", 7, b"k" * 20), e[0]],
        [e[1], e[2], ("lac", 7, 1)],
        [e[3]],
        [e[4], ("entry", 8, 0, b"\x00" * 17), e[5], ("fence", 8)],
        [e[6], ("lac", 7, 5)],
        [e[7]],
        [("fence", 7), ("lac", 8, -1), ("master_key", 9, b""), ("entry", 9, 2**62, b"last")],
    ]


def test_round_trip_sizes_and_meta_records(env: Env) -> None:
    spy = SpyFS(env.fs)
    j = Journal(spy, JournalConfig(env.dir, prealloc_size=64 * KIB, buffer_size=1 * MIB))  # 3 MiB entry spills
    j.start()
    env.journals.append(j)
    expected: list[Rec] = []

    def on_call(err: BaseException | None, ctx: Any) -> None:
        spy.events.append(("ack", ctx, err))

    acks = Acks(on_call)
    for group in _workload():
        for rec in group:
            submit(j, rec, acks, len(expected))
            expected.append(rec)
        acks.wait(len(expected))
    j.shutdown()

    assert acks.calls == [(i, None) for i in range(len(expected))], (
        f"callbacks must run once each, in order, without error: {[(c, type(e).__name__) for c, e in acks.calls]}"
    )
    got = replayed(env.fs, env.dir)
    assert len(got) == len(expected), f"replayed {len(got)} records, wrote {len(expected)}"
    for i, (g, w) in enumerate(zip(got, expected, strict=True)):
        assert g == w, f"record {i}: replayed {g[:3]}... differs from written {w[:3]}..."
    assert replayed(env.fs, env.dir) == expected, "a second replay differs from the first"

    frames = frames_of(env.fs, env.dir)
    assert records_of(frames) == expected, "the frames on disk do not decode to what was written"
    check_flush_layout(frames, j.stats.flushes)
    assert j.stats.flushes >= len(_workload()), f"each awaited group needs its own flush: {j.stats}"
    check_acks_follow_sync(spy.events, frames, env.dir)


@pytest.mark.parametrize("cut_at", [0, 3, 9, -1])
def test_acknowledged_records_survive_a_power_cut(mem: Env, cut_at: int) -> None:
    """The power goes out (every unsynced byte dropped) the moment the callback of record
    ``cut_at`` runs, the journal still busy: that record and all before it replay whole."""
    fs = mem.fs
    assert isinstance(fs, MemFS)
    expected = [rec for group in _workload() for rec in group]
    cut = cut_at % len(expected)

    def on_call(err: BaseException | None, ctx: Any) -> None:
        if ctx == cut and err is None:
            fs.crash(None)

    j = mem.journal(buffer_size=1 * MIB)
    acks = Acks(on_call)
    for i, rec in enumerate(expected):
        try:
            submit(j, rec, acks, i)
        except BookieShutdownError:
            break  # the power cut killed the journal
    j.shutdown()
    acked = [c for c, e in acks.calls if e is None]
    assert acked[: cut + 1] == list(range(cut + 1)), f"records up to {cut} were acknowledged in order: {acked}"
    got = replayed(fs, mem.dir, torn_ok=True)  # the batch after the cut may have reached the disk in part
    assert got[: cut + 1] == expected[: cut + 1], f"acknowledged records lost by a power cut at record {cut}"
    assert got == expected[: len(got)], "replay returned records that were not written, or out of order"


def test_power_cut_control_without_sync_data(mem: Env) -> None:
    """Control for the test above: with sync_data=False acks follow the write only, and
    the same power cut does lose acknowledged records - so that check can fail."""
    fs = mem.fs
    assert isinstance(fs, MemFS)
    j = mem.journal(sync_data=False)
    acks = Acks()
    for i in range(20):
        j.log_entry(1, i, payload(100, i), acks, i)
    acks.wait(20)
    fs.crash(None)
    assert replayed(fs, mem.dir) == [], "without fdatasync an unsynced write survived a power cut that drops all"


# --- rolling and gc ------------------------------------------------------------------------


def _fill_files(j: Journal, count: int, per_group: int = 3, size: int = 3000) -> list[Rec]:
    """Write awaited groups until the journal has rolled ``count`` times."""
    expected: list[Rec] = []
    acks = Acks()
    while j.stats.rolls < count:
        for _ in range(per_group):
            rec = ("entry", 3, len(expected), payload(size, len(expected)))
            submit(j, rec, acks, len(expected))
            expected.append(rec)
        acks.wait(len(expected))
        assert len(expected) < 10_000, f"the journal does not roll: {j.stats}"
    assert all(e is None for _, e in acks.calls), "a write failed while filling files"
    return expected


def test_rolling_produces_several_files_and_replay_crosses_them(env: Env) -> None:
    j = env.journal(max_size=16 * KIB)
    expected = _fill_files(j, 4)
    j.shutdown()
    ids = list_journals(env.fs, env.dir)
    assert len(ids) >= 5 and ids == list(range(ids[0], ids[0] + len(ids))), f"journal files {ids}"
    assert j.stats.rolls == len(ids) - 1, f"{j.stats.rolls} rolls, {len(ids)} files"
    frames = frames_of(env.fs, env.dir)
    assert set(ids[:-1]) <= {f.journal_id for f in frames}, "a rolled file holds no frames"
    check_flush_layout(frames, j.stats.flushes)
    assert replayed(env.fs, env.dir) == expected, "replay across rolled files lost or reordered records"

    # A new run starts a new file after the old ones and replay still reads all of them.
    j2 = env.journal(max_size=16 * KIB)
    assert j2.current_journal_id == ids[-1] + 1, f"restart opened {j2.current_journal_id}, files were {ids}"
    acks = Acks()
    j2.log_entry(4, 0, b"after restart", acks, 0)
    acks.wait(1)
    j2.shutdown()
    assert replayed(env.fs, env.dir) == [*expected, ("entry", 4, 0, b"after restart")]


def test_gc_keeps_max_backups_behind_the_mark(env: Env) -> None:
    j = env.journal(max_size=16 * KIB)
    written = _fill_files(j, 5)
    j.shutdown()
    ids = list_journals(env.fs, env.dir)
    assert len(ids) >= 6, f"expected at least 6 files, got {ids}"

    # The next run: its start is the mark a checkpoint would write before any new record.
    j2 = env.journal(max_size=1 * MIB, max_backups=2)
    mark = j2.last_mark()
    assert mark == LogMark(ids[-1] + 1, A), f"a new run starts at the header end of a new file, got {mark}"
    assert j2.gc(LogMark(ids[0], A)) == [], "nothing lies before a mark in the first file"
    assert j2.gc(LogMark(ids[2], A)) == [], "the two files behind the mark are the backups to keep"
    removed = j2.gc(mark)
    assert removed == ids[:-2], f"gc({mark}) removed {removed}, files were {ids}"
    assert list_journals(env.fs, env.dir) == [*ids[-2:], mark.journal_id], "gc kept the wrong files"
    assert j2.gc(mark) == [], "gc is idempotent"

    acks = Acks()
    j2.log_entry(5, 0, b"after gc", acks, 0)
    acks.wait(1)
    j2.shutdown()
    assert replayed(env.fs, env.dir, mark) == [("entry", 5, 0, b"after gc")], "replay from the mark after gc"
    everything = replayed(env.fs, env.dir)
    tail = [*written, ("entry", 5, 0, b"after gc")]
    assert len(everything) > 1 and everything == tail[-len(everything) :], "the backups kept do not replay whole"
    if isinstance(env.fs, MemFS):
        env.fs.crash(None)
        assert list_journals(env.fs, env.dir) == [*ids[-2:], mark.journal_id], "gc's removals were not made durable"


# --- failures and shutdown ------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["write", "sync"])
def test_io_failure_fails_the_batch_and_kills_the_journal(mem: Env, fault: str) -> None:
    """An injected EIO fails its batch and everything queued behind it - each record's
    callback exactly once, in order, with the error - and the journal refuses more."""
    fs = mem.fs
    assert isinstance(fs, MemFS)
    clock = GatedClock()
    j = mem.journal(clock=clock)
    good = Acks()
    for i in range(5):
        j.log_entry(1, i, payload(50, i), good, i)
    good.wait(5)
    assert good.calls == [(i, None) for i in range(5)]

    clock.gate.clear()  # queue the next records before the journal acts on any of them
    (fs.fail_next_write if fault == "write" else fs.fail_next_sync)()
    bad = Acks()
    for i in range(5, 25):
        j.log_entry(1, i, payload(50, i), bad, i)
    clock.gate.set()
    bad.wait(20)
    assert isinstance(j.failed, OSError), f"journal.failed is {j.failed!r} after an injected {fault} error"
    with pytest.raises(BookieShutdownError) as info:
        j.log_entry(1, 99, b"late", bad, 99)
    assert isinstance(info.value, WalkitError)
    j.shutdown()

    ctxs = [c for c, _ in bad.calls]
    assert ctxs == list(range(5, 25)), f"every queued record is called back once, in order: {ctxs}"
    assert all(isinstance(e, OSError) for _, e in bad.calls), f"failed records got {[e for _, e in bad.calls]}"
    assert replayed(fs, mem.dir)[:5] == [("entry", 1, i, payload(50, i)) for i in range(5)], "records acked before the failure"


def test_every_submitted_record_gets_exactly_one_callback_after_failure(mem: Env) -> None:
    """2000 records queued, then the first fdatasync fails: each gets exactly one callback,
    with the error - none acknowledged, none forgotten in the queue."""
    fs = mem.fs
    assert isinstance(fs, MemFS)
    clock = GatedClock()
    j = mem.journal(clock=clock)
    clock.gate.clear()
    fs.fail_next_sync()
    acks = Acks()
    for i in range(2000):
        j.log_entry(2, i, b"x" * 100, acks, i)
    clock.gate.set()
    acks.wait(2000, timeout=10)
    j.shutdown()
    ctxs = [c for c, _ in acks.calls]
    assert ctxs == list(range(2000)), f"2000 submitted, {len(ctxs)} callbacks ({len(set(ctxs))} distinct), or out of order"
    assert all(e is not None for _, e in acks.calls), "a record was acknowledged although its sync failed"


class LostCallback(AssertionError):
    pass


def test_record_submitted_while_the_journal_dies_is_called_back(mem: Env) -> None:
    """Deterministic replay of the race: the producer is paused (by a trace hook) after
    the liveness check and before the record is framed into the batch, while another
    record makes the journal die. The paused record must still be called back."""
    fs = mem.fs
    assert isinstance(fs, MemFS)
    j = mem.journal()
    acks = Acks()
    codes = {Journal._add.__code__, Journal.log_entry.__code__}
    paused: list[bool] = []

    refused: list[str] = []

    def kill_the_journal() -> None:
        fs.fail_next_sync()
        try:  # the journal lock makes this wait for the paused producer
            j.log_entry(1, 0, b"doomed", acks, "doomed")
        except BookieShutdownError:
            refused.append("doomed")  # refused at the call: as good as a callback
        deadline = time.monotonic() + 5
        while j.failed is None and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)  # the journal thread drains its queue and exits

    def local(frame: Any, event: str, arg: Any) -> Any:
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        if event == "line" and "frames.append" in line and not paused:  # a record or entries
            paused.append(True)
            killer = threading.Thread(target=kill_the_journal)
            killer.start()
            killer.join(1.0)  # a fixed journal blocks the killer on its lock: go on after 1 s
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code in codes else None

    sys.settrace(tracer)
    try:
        j.log_entry(1, 1, b"racing", acks, "racing")
    finally:
        sys.settrace(None)
    assert paused, "the trace hook never found the framing call in Journal.log_entry or _add"
    deadline = time.monotonic() + 2
    while len(acks.calls) + len(refused) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    j.shutdown()
    if sorted([c for c, _ in acks.calls] + refused) != ["doomed", "racing"]:
        raise LostCallback(f"callbacks: {acks.calls}, refused at the call: {refused}")


def test_roll_failure_does_not_call_back_an_acknowledged_batch_twice(mem: Env) -> None:
    """The batch that fills the file is synced and acknowledged; then the roll to the next
    file fails. Its callbacks must not run again with the roll's error."""
    fs = mem.fs
    assert isinstance(fs, MemFS)

    def on_call(err: BaseException | None, ctx: Any) -> None:
        if err is None and ctx == 0:
            fs.fail_next_write()  # the next mutating op is the roll's create of the new file

    acks = Acks(on_call)
    j = mem.journal(max_size=8 * KIB)  # header + one 4 KiB flush: roll after the first flush
    j.log_entry(1, 0, b"fills the file", acks, 0)
    deadline = time.monotonic() + 10
    while j.failed is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert j.failed is not None, "the injected roll failure did not kill the journal"
    j.shutdown()
    assert acks.calls[0] == (0, None), f"the entry was synced, its first callback is a success: {acks.calls}"
    assert len(acks.calls) == 1, f"callback ran {len(acks.calls)} times: {[(c, repr(e)) for c, e in acks.calls]}"


@pytest.mark.parametrize(
    "bad", [(-1, 0, b"x"), (1, 2**63, b"x"), (1, 0, "not bytes")], ids=["negative ledger", "entry id overflow", "str data"]
)
def test_bad_record_is_refused_at_the_call_and_the_journal_stays_up(mem: Env, bad: tuple[Any, Any, Any]) -> None:
    j = mem.journal()
    acks = Acks()
    with pytest.raises(InvalidArgumentError):
        j.log_entry(*bad, acks, "bad")
    time.sleep(0.05)  # time enough for the journal thread to choke on it, were it queued
    assert j.failed is None, f"one bad record killed the journal: {j.failed!r}"
    j.log_entry(1, 0, b"good", acks, "good")
    acks.wait(1)
    assert acks.calls == [("good", None)], f"callbacks: {acks.calls}"


def test_shutdown_flushes_everything_queued(env: Env) -> None:
    # nothing but shutdown flushes
    j = env.journal(policy=GroupCommitPolicy(max_group_wait=3600.0, buffered_writes_threshold=512 * KIB,
                                             buffered_entries_threshold=0, flush_when_queue_empty=False))
    acks = Acks()
    expected = [("entry", 6, i, payload(i * 37 % 1500, i)) for i in range(300)]
    for i, rec in enumerate(expected):
        submit(j, rec, acks, i)
    j.shutdown()
    assert acks.calls == [(i, None) for i in range(len(expected))], "shutdown returned before acknowledging all"
    assert set(j.stats.reasons) == {"shutdown"}, f"flush reasons {j.stats.reasons}"
    with pytest.raises(BookieShutdownError):
        j.log_entry(6, 999, b"too late")
    assert replayed(env.fs, env.dir) == expected


def test_many_producers(env: Env) -> None:
    threads, per_thread = 8, 2000
    j = env.journal(prealloc_size=1 * MIB)
    acks = Acks()
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def produce(t: int) -> None:
        try:
            start.wait()
            for i in range(per_thread):
                j.log_entry(100 + t, i, t.to_bytes(1, "little") * (i % 64) + i.to_bytes(4, "little"), acks, (t, i))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, f"producers failed: {errors}"
    acks.wait(threads * per_thread, timeout=30)
    j.shutdown()

    assert all(e is None for _, e in acks.calls), "a record failed"
    assert len(acks.calls) == threads * per_thread, f"{len(acks.calls)} callbacks for {threads * per_thread} records"
    for t in range(threads):
        order = [i for (tt, i), _ in acks.calls if tt == t]
        assert order == list(range(per_thread)), f"thread {t}: callbacks out of order or missing"
    got = replayed(env.fs, env.dir)
    assert len(got) == threads * per_thread
    for t in range(threads):
        mine = [r for r in got if r[1] == 100 + t]
        want = [("entry", 100 + t, i, t.to_bytes(1, "little") * (i % 64) + i.to_bytes(4, "little")) for i in range(per_thread)]
        assert mine == want, f"thread {t}: replay lost, changed or reordered its entries"
    check_flush_layout(frames_of(env.fs, env.dir), j.stats.flushes)


def test_stats_count_every_record_with_or_without_callback(mem: Env) -> None:
    j = mem.journal()
    acks = Acks()
    j.log_master_key(1, b"k")  # no callback
    j.log_fence(1)  # no callback
    j.log_entry(1, 0, b"x", acks, "e")
    acks.wait(1)
    j.shutdown()
    assert j.stats.records == 3, f"stats: {j.stats}"


def test_log_entries_frames_a_group_under_one_callback(env: Env) -> None:
    """The bookie's hot path: new master keys, then a group of entries spanning several
    buffers, framed in one call; one callback for the group, once durable; replay gives
    every record in order."""
    j = env.journal(buffer_size=64 * KIB)
    acks = Acks()
    group = [(7, i, bytes([i % 251]) * (i * 997 % 9000)) for i in range(300)]  # ~1.3 MiB: several segments
    j.log_entries(group, acks, "group", [(KEY_RECORD, 7, 0, b"key", None, None)])
    acks.wait(1)
    j.log_entries([(8, 0, b"x")], acks, "second")
    acks.wait(2)
    j.shutdown()
    assert acks.calls == [("group", None), ("second", None)], "one callback per group, in order, no error"
    assert j.stats.records == len(group) + 2, f"every framed record is counted: {j.stats}"
    want = [("master_key", 7, b"key"), *[("entry", *e) for e in group], ("entry", 8, 0, b"x")]
    assert replayed(env.fs, env.dir) == want


def test_log_entries_refusals(mem: Env) -> None:
    """No entry: refused at the call. A value that cannot be framed: the group's callback
    gets the error, once, and the journal stays up. A shut-down journal: refused at the
    call, no callback."""
    j = mem.journal()
    acks = Acks()
    with pytest.raises(InvalidArgumentError):
        j.log_entries([], acks, "empty")
    j.log_entries([(1, 0, b"a"), (-1, 1, b"b")], acks, "bad")
    acks.wait(1)
    assert [c for c, _ in acks.calls] == ["bad"] and acks.calls[0][1] is not None, acks.calls
    j.log_entries([(1, 2, b"c")], acks, "after")
    acks.wait(2)
    assert acks.calls[1] == ("after", None), "the journal stays up after a group it could not frame"
    j.shutdown()
    with pytest.raises(BookieShutdownError):
        j.log_entries([(1, 3, b"d")], acks, "late")
    time.sleep(0.05)
    assert len(acks.calls) == 2, f"a refused call is not called back: {acks.calls}"


class _Id(int):
    pass


class _Blob(bytes):
    pass


#: log_entry's odd values: refused at the call (the first three), framed, or taken and
#: failed through the callback (a memoryview of 4-byte items: not a byte buffer).
ODD_ENTRIES: list[tuple[Any, Any, Any]] = [
    (True, 0, b"x"), (_Id(1), 0, b"x"), (1, 0, array.array("B", b"x")),
    (1, 1, bytearray(b"ba")), (1, 2, _Blob(b"blob")), (1, 3, memoryview(b"abcdef")[1:4]),
    (1, 4, memoryview(array.array("I", [7]))), (1, 5, b"plain"),
]


def _log_odd_entries(monkeypatch: pytest.MonkeyPatch, c_framing: bool) -> tuple[list[str], list[Rec]]:
    """Each of ODD_ENTRIES through ``log_entry``, then a refusal on the shut-down
    journal: what happened to each, and what replay finds."""
    if not c_framing:
        monkeypatch.setattr(_framing, "C_FRAMING", None)
    env = Env("mem", MemFS(), "/journal")
    j = env.journal()
    acks = Acks()
    outcome: list[str] = []
    for i, entry in enumerate(ODD_ENTRIES):
        try:
            j.log_entry(*entry, acks, i)
        except WalkitError as exc:
            outcome.append(f"{i}: raised {type(exc).__name__}")
    j.shutdown()
    outcome += [f"{i}: called back with {type(err).__name__}" for i, err in acks.calls]
    for late in ((-1, 0, b"x"), (1, 9, b"x")):  # the record's own fault first, as log_records says
        with pytest.raises(WalkitError) as info:
            j.log_entry(*late, acks, "late")
        outcome.append(f"late: raised {type(info.value).__name__}")
    monkeypatch.undo()
    return outcome, replayed(env.fs, env.dir)


def test_log_entry_takes_and_refuses_with_c_framing_as_without(monkeypatch: pytest.MonkeyPatch) -> None:
    """``log_entry`` frames plain values in one C call and checks only what C hands back:
    what it refuses at the call, fails through the callback and writes is what the
    reference (no C framing) does."""
    with_c, without_c = _log_odd_entries(monkeypatch, True), _log_odd_entries(monkeypatch, False)
    assert with_c == without_c
    assert with_c[0] == [
        "0: raised InvalidArgumentError", "1: raised InvalidArgumentError", "2: raised InvalidArgumentError",
        "6: called back with ValueError",  # at once, on the caller's thread
        "3: called back with NoneType", "4: called back with NoneType", "5: called back with NoneType",
        "7: called back with NoneType",
        "late: raised InvalidArgumentError", "late: raised BookieShutdownError",
    ]
    assert with_c[1] == [("entry", 1, 1, b"ba"), ("entry", 1, 2, b"blob"), ("entry", 1, 3, b"bcd"),
                         ("entry", 1, 5, b"plain")]


def test_the_settled_mark_passes_a_batch_only_after_its_callbacks(env: Env) -> None:
    """A callback may apply its record's state (the bookie puts master keys, fences and
    LACs in ledger storage there, once durable); a checkpoint takes the settled mark, so
    that mark must not pass a record whose callback has not returned - while the durable
    mark already has when the callback runs."""
    j = env.journal()
    seen: list[tuple[LogMark, LogMark]] = []
    done = threading.Event()

    def cb(err: BaseException | None, ctx: Any) -> None:
        seen.append((j.last_mark(), j.settled_mark()))
        done.set()

    start = j.settled_mark()
    j.log_fence(1, cb)
    assert done.wait(10)
    durable, settled = seen[0]
    assert settled == start < durable, f"settled {settled} passed the record before its callback (durable {durable})"
    j.log_entry(1, 0, b"x")
    j.shutdown()
    assert j.settled_mark() == j.last_mark() > durable, "the settled mark follows once the callbacks returned"


# --- kicks: a deferring producer flushes on its own thread when the journal is idle -----------


class _OverlapFile:
    """Counts write + syncs in progress at once on one journal file (at most one is allowed)."""

    def __init__(self, inner: File, fs: "OverlapFS") -> None:
        self._inner, self._fs = inner, fs

    def pwritev_sync(self, buffers: list[Any], offset: int, datasync: bool = True) -> int:
        fs = self._fs
        with fs.lock:
            fs.in_flight += 1
            fs.most = max(fs.most, fs.in_flight)
            fs.threads.add(threading.current_thread().name)
        try:
            time.sleep(fs.hold)  # widen the window a second flush would need
            return self._inner.pwritev_sync(buffers, offset, datasync)
        finally:
            with fs.lock:
                fs.in_flight -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class OverlapFS:
    def __init__(self, inner: FileSystem, hold: float = 0.0) -> None:
        self._inner, self.hold = inner, hold
        self.lock = threading.Lock()
        self.in_flight = self.most = 0
        self.threads: set[str] = set()

    def open(self, path: str, *, create: bool = False, direct: bool = False) -> _OverlapFile:
        return _OverlapFile(self._inner.open(path, create=create, direct=direct), self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ThreadAcks(Acks):
    """Acks that also remember the thread each callback ran on."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        super().__init__(lambda err, ctx: self.threads.append(threading.current_thread().name))


def test_a_deferred_group_waits_for_the_kick_and_an_idle_journal_flushes_it_inline(env: Env) -> None:
    """``defer=True`` does not wake the parked journal thread: nothing is written until the
    kick. On an idle journal the kick writes, syncs and calls back on the caller's thread
    before it returns; ``inline=False`` hands the batch to the sync thread instead. Every
    record replays, each flush has its layout, every ack followed its fdatasync."""
    spy = SpyFS(env.fs)
    j = Journal(spy, JournalConfig(env.dir, prealloc_size=64 * KIB))  # type: ignore[arg-type]
    j.start()
    env.journals.append(j)
    acks = ThreadAcks()
    j.log_entries([(3, 0, payload(100, 0))], lambda e, c: (spy.events.append(("ack", 0)), acks(e, c)), "a",
                  defer=True)
    time.sleep(0.05)
    assert acks.calls == [] and j.stats.flushes == 0, "a deferred record was flushed before the kick"
    j.kick(inline=True)
    assert acks.calls == [("a", None)], "an idle journal's inline kick returns after the callback"
    assert acks.threads == [threading.current_thread().name]
    assert j.stats.records == 1 and j.stats.flushes == 1 and j.stats.reasons == {"max_wait": 1}  # it waited 50 ms
    j.log_entries([(3, 1, payload(200, 1)), (3, 2, payload(5000, 2))],
                  lambda e, c: (spy.events.append(("ack", 1)), spy.events.append(("ack", 2)), acks(e, c)), "b",
                  defer=True)
    j.kick(inline=False)
    acks.wait(2)
    assert acks.calls[1] == ("b", None) and acks.threads[1] == "bookie-journal-sync", acks.threads
    j.kick(inline=True)  # nothing framed: nothing happens
    j.shutdown()
    assert j.stats.flushes == 2, f"one flush per kick: {j.stats}"
    want = [("entry", 3, 0, payload(100, 0)), ("entry", 3, 1, payload(200, 1)), ("entry", 3, 2, payload(5000, 2))]
    assert replayed(env.fs, env.dir) == want
    frames = frames_of(env.fs, env.dir)
    check_flush_layout(frames, 2)
    check_acks_follow_sync(spy.events, frames, env.dir)


def test_a_kick_while_a_flush_is_in_flight_leaves_the_batch_to_group_commit(mem: Env) -> None:
    """With a flush in flight the kick returns at once: the deferred records join the
    next batch, written by the journal's threads after the first one's sync, in order."""
    j = mem.journal()
    acks = ThreadAcks()
    j.sync_delay = 0.5
    j.log_entry(1, 0, b"first", acks, "first")  # wakes the journal thread as ever
    deadline = time.monotonic() + 5
    while j.stats.flushes == 0 and not j._claim.busy and time.monotonic() < deadline:
        time.sleep(0.001)
    j.sync_delay = 0.0  # only the flush in flight is slow now
    j.log_entries([(1, 1, b"second")], acks, "second", defer=True)
    started = time.monotonic()
    j.kick(inline=True)
    assert time.monotonic() - started < 0.3, "the kick waited for the flush in flight"
    assert acks.calls == [], "a kick flushed while another flush was in flight"
    acks.wait(2)
    assert acks.calls == [("first", None), ("second", None)]
    assert acks.threads == ["bookie-journal-sync"] * 2, acks.threads
    assert j.stats.flushes == 2
    j.shutdown()
    assert replayed(mem.fs, mem.dir) == [("entry", 1, 0, b"first"), ("entry", 1, 1, b"second")]


def test_a_slow_disk_sends_kicked_batches_to_the_sync_thread(mem: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """An inline flush blocks its caller for a write + sync: after one slower than
    INLINE_MAX_SYNC (here: any), kicks hand their batches to the sync thread."""
    from bookie.journal import _writer

    j = mem.journal()
    acks = ThreadAcks()
    j.log_entries([(1, 0, b"a")], acks, "a", defer=True)
    j.kick()
    assert acks.threads == [threading.current_thread().name]
    monkeypatch.setattr(_writer, "INLINE_MAX_SYNC", 0.0)
    j.log_entries([(1, 1, b"b")], acks, "b", defer=True)
    j.kick()
    acks.wait(2)
    assert acks.threads[1] == "bookie-journal-sync", acks.threads


def test_an_inline_flush_wakes_no_other_thread(mem: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle journal's inline kick writes, syncs and calls back on the caller's thread
    and leaves the journal's threads asleep: the sync thread is not woken at the flush's
    end (a wake-up per lone add was a tenth of a bookie's CPU), nor the journal thread."""
    from bookie.journal import _writer

    monkeypatch.setattr(_writer, "INLINE_MAX_SYNC", 60.0)  # a slow test machine's disk still flushes inline
    j = mem.journal()
    acks = ThreadAcks()
    j.log_entries([(1, 0, b"a")], acks, "a", defer=True)
    j.kick()
    assert acks.threads == [threading.current_thread().name]
    deadline = time.monotonic() + 5  # both threads parked again after the first flush
    while not (j._waiting == _writer._UNTIMED and j._claim._handed._waiters) and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.001)
    woken: list[str] = []
    for cond in (j._claim._handed, j._cond):  # a woken thread loops and waits again: counted here
        wait = cond.wait

        def counted(timeout: float | None = None, _wait: Any = wait) -> bool:
            woken.append(threading.current_thread().name)
            return bool(_wait(timeout))

        monkeypatch.setattr(cond, "wait", counted)
    for e in range(1, 51):
        j.log_entries([(1, e, b"x")], acks, e, defer=True)
        j.kick()
    time.sleep(0.05)
    assert acks.threads == [threading.current_thread().name] * 51 and j.stats.flushes == 51
    assert woken == [], f"threads woken by inline flushes: {woken}"


def test_a_kick_under_a_group_wait_wakes_the_journal_thread(mem: Env) -> None:
    """When the policy says wait (journalFlushWhenQueueEmpty off), the kick wakes the
    journal thread, which times the group wait and flushes for MAX_WAIT."""
    j = mem.journal(policy=GroupCommitPolicy(max_group_wait=0.05, flush_when_queue_empty=False))
    acks = ThreadAcks()
    started = time.monotonic()
    j.log_entries([(1, 0, b"a")], acks, "a", defer=True)
    j.kick()
    assert acks.calls == [], "the kick flushed inline although the policy said wait"
    acks.wait(1)
    assert time.monotonic() - started >= 0.04
    assert acks.threads == ["bookie-journal-sync"] and j.stats.reasons == {"max_wait": 1}


@pytest.mark.parametrize("producers", [0, 4])
def test_kicks_racing_producers_never_overlap_two_flushes(env: Env, producers: int) -> None:
    """A kicking thread that defers, like the bookie's loop - alone (its hand-offs to the
    sync thread race its next kicks) or beside four producer threads waking the journal
    as ever: at most one write + sync is ever in progress, every record is acknowledged
    once and in its thread's order, and replay has them all."""
    ofs = OverlapFS(env.fs, hold=0.001)  # one segment per batch: check_flush_layout reads padding as a flush's end
    j = Journal(ofs, JournalConfig(env.dir, prealloc_size=1 * MIB, buffer_size=8 * MIB))  # type: ignore[arg-type]
    j.start()
    env.journals.append(j)
    acks = Acks()
    per_thread = 1500
    start = threading.Barrier(producers + 1)
    errors: list[BaseException] = []

    def produce(t: int) -> None:
        try:
            start.wait()
            for i in range(per_thread):
                j.log_entry(10 + t, i, payload(i % 300, i), acks, (t, i))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def kicker() -> None:
        try:
            start.wait()
            for i in range(0, per_thread, 3):
                group = [(10 + producers, k, payload(k % 300, k)) for k in range(i, i + 3)]
                j.log_entries(group, lambda e, c: [acks(e, (producers, k)) for k in c], list(range(i, i + 3)),
                              defer=True)
                j.kick(inline=i % 2 == 0)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=produce, args=(t,)) for t in range(producers)]
    workers.append(threading.Thread(target=kicker, name="kicker"))
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    total = (producers + 1) * per_thread
    acks.wait(total, timeout=60)
    j.shutdown()
    assert ofs.most == 1, f"{ofs.most} write + syncs were in progress at once"
    assert "kicker" in ofs.threads, f"no kick ever flushed inline (flushes by {ofs.threads})"
    assert all(e is None for _, e in acks.calls) and len(acks.calls) == total
    for t in range(producers + 1):
        assert [i for (tt, i), _ in acks.calls if tt == t] == list(range(per_thread)), f"thread {t}: order"
    got = replayed(env.fs, env.dir)
    for t in range(producers + 1):
        assert [r for r in got if r[1] == 10 + t] == [("entry", 10 + t, i, payload(i % 300, i))
                                                      for i in range(per_thread)], f"thread {t}: replay"
    check_flush_layout(frames_of(env.fs, env.dir), j.stats.flushes)
