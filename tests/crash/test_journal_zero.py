"""The journal's zero filler (bookie/journal/_zero.py): zeros ahead of a new file's tail,
never on frames, never into a closed or recycled file, and a failure that only ends the
filling. Every write to the journal's files is logged with its thread and the order in
which it began and ended, so the tests check the invariant itself: a zero write and a
write of frames that touch the same bytes never overlap in time, and the zeros come first."""

from __future__ import annotations

import errno
import itertools
import logging
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from bookie import native
from bookie.fs import File, FileSystem
from bookie.fs.mem import MemFS
from bookie.fs.real import RealFS
from bookie.journal import Journal, JournalConfig, LogMark, list_journals, replay
from bookie.journal import _zero
from support.journal import Recorder

KIB = 1024
MIB = 1024 * KIB
ZERO_THREAD = "bookie-journal-zero"


@dataclass
class Write:
    path: str
    start: int
    end: int
    zeros: bool  # written by the zero filler
    began: int  # order of the write's start among all writes' starts and ends
    ended: int = -1


class _LogFile:
    def __init__(self, inner: File, fs: LogFS) -> None:
        self._inner, self._fs = inner, fs
        self.path = inner.path
        self.direct = inner.direct
        self.closed = False

    def _write(self, length: int, offset: int, do: Any) -> int:
        fs = self._fs
        zeros = threading.current_thread().name == ZERO_THREAD
        with fs.lock:
            if self.closed:  # checked by check_zeros_never_meet_frames (the writer may be the filler's thread)
                fs.late.append((self.path, offset, threading.current_thread().name))
                raise OSError(errno.EBADF, "write to a closed file", self.path)
            w = Write(self.path, offset, offset + length, zeros, next(fs.clock))
            fs.writes.append(w)
        if zeros:
            if fs.fail_zeros:
                raise OSError(errno.EIO, "injected zero-write failure", self.path)
            time.sleep(fs.zero_hold)  # widen the window a batch would have to land in
        try:
            return int(do())
        finally:
            with fs.lock:
                w.ended = next(fs.clock)

    def pwrite(self, data: Any, offset: int) -> int:
        return self._write(len(data), offset, lambda: self._inner.pwrite(data, offset))

    def pwritev(self, buffers: list[memoryview], offset: int) -> int:
        return self._write(sum(len(b) for b in buffers), offset, lambda: self._inner.pwritev(buffers, offset))

    def pwritev_sync(self, buffers: list[memoryview], offset: int, datasync: bool = True) -> int:
        return self._write(sum(len(b) for b in buffers), offset,
                           lambda: self._inner.pwritev_sync(buffers, offset, datasync))

    def allocate(self, offset: int, length: int) -> None:
        with self._fs.lock:
            self._fs.allocations.append((self.path, offset, length))
        self._inner.allocate(offset, length)

    def close(self) -> None:
        with self._fs.lock:
            self.closed = True
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class LogFS:
    """Logs every write to a journal file (``.txn``) and every fallocate; can slow down or
    fail the zero filler's writes."""

    def __init__(self, inner: FileSystem, *, zero_hold: float = 0.0) -> None:
        self._inner = inner
        self.zero_hold = zero_hold
        self.fail_zeros = False
        self.lock = threading.Lock()
        self.clock = itertools.count()
        self.writes: list[Write] = []
        self.allocations: list[tuple[str, int, int]] = []
        self.late: list[tuple[str, int, str]] = []  # writes to a file after it was closed

    def open(self, path: str, *, create: bool = False, direct: bool = False) -> File:
        f = self._inner.open(path, create=create, direct=direct)
        return _LogFile(f, self) if path.endswith(".txn") else f  # type: ignore[return-value]

    def zero_writes(self) -> list[Write]:
        with self.lock:
            return [w for w in self.writes if w.zeros]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def check_zeros_never_meet_frames(fs: LogFS) -> None:
    """No write went to a closed file; each zero write ended before any write of frames
    over the same bytes began, and none began after such a write (zeros never land on
    frames)."""
    assert fs.late == [], f"writes to closed files: {fs.late}"
    writes = fs.writes
    frames = [w for w in writes if not w.zeros and w.start > 0]  # not the header
    for z in (w for w in writes if w.zeros):
        assert z.ended >= 0, f"a zero write never ended: {z}"
        for f in frames:
            if f.path == z.path and f.start < z.end and z.start < f.end:
                assert z.ended < f.began, f"zeros {z} overlap frames {f} in time or came after them"


def _fs(kind: str, tmp_path: Any) -> tuple[FileSystem, str]:
    if kind == "mem":
        return MemFS(zero_fill_pays=True), "/journal"
    try:
        return RealFS(native.get_backend(kind)), str(tmp_path / "journal")
    except ImportError as exc:
        if native.MODE == "require":
            raise
        pytest.skip(f"{kind} backend unavailable: {exc}")


@pytest.fixture(params=["mem", "native"])
def base(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[tuple[FileSystem, str]]:
    yield _fs(request.param, tmp_path)


def _replayed_entries(fs: FileSystem, directory: str) -> list[tuple[int, int, bytes]]:
    target = Recorder()
    report = replay(fs, directory, None, target)
    assert not report.torn
    return [(r[1], r[2], r[3]) for r in target.records if r[0] == "entry"]


def _sequential(j: Journal, ledger: int, entries: range, size: int = 1000) -> list[tuple[int, int, bytes]]:
    """Log entries one at a time, each waited for (a lone writer)."""
    out = []
    for e in entries:
        done = threading.Event()
        data = random.Random(e).randbytes(size)
        j.log_entry(ledger, e, data, lambda err, ctx: ctx.set(), done)
        assert done.wait(10)
        out.append((ledger, e, data))
    return out


def _wait(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_new_file_is_zero_filled_ahead_of_its_tail_and_adds_need_no_fallocate(
        base: tuple[FileSystem, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The filler keeps AHEAD bytes past the tail written (paced, unsynced); batches that
    land there reserve nothing more, and replay reads exactly what was logged."""
    monkeypatch.setattr(_zero, "CHUNK", 64 * KIB)
    monkeypatch.setattr(_zero, "AHEAD", 512 * KIB)
    inner, directory = base
    fs = LogFS(inner)
    j = Journal(fs, JournalConfig(directory, prealloc_size=4 * MIB, zero_fill_rate=256 * MIB))  # type: ignore[arg-type]
    j.start()
    try:
        logged = _sequential(j, 1, range(5))
        _wait(lambda: sum(w.end - w.start for w in fs.zero_writes()) >= 512 * KIB)
        (path,) = {w.path for w in fs.zero_writes()}
        with fs.lock:
            allocated_before = len(fs.allocations)
        logged += _sequential(j, 1, range(5, 200))  # ~800 KiB: the filler keeps ahead, woken as the tail nears
        with fs.lock:
            assert len(fs.allocations) == allocated_before, fs.allocations[allocated_before:]
    finally:
        j.shutdown()
    zeros = fs.zero_writes()
    assert j.zero_filled == (sum(w.end - w.start for w in zeros), 0)
    assert all(w.end - w.start <= 64 * KIB and w.start % 4096 == 0 for w in zeros)
    assert max(w.end for w in zeros) >= max(w.end for w in fs.writes if not w.zeros)
    check_zeros_never_meet_frames(fs)
    assert _replayed_entries(inner, directory) == logged
    assert not [t for t in threading.enumerate() if t.name == ZERO_THREAD and t.is_alive()]


def test_zeros_never_land_on_frames_under_load_and_rolls(base: tuple[FileSystem, str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Four producers outrun a slow filler (each zero write held 2 ms) across many rolls:
    batches catch up with the chunk being written and wait for it, or fallocate past it;
    no zero write ever overlaps or follows frames over the same bytes, none goes to a
    closed file, and every acknowledged entry replays."""
    monkeypatch.setattr(_zero, "CHUNK", 32 * KIB)
    monkeypatch.setattr(_zero, "AHEAD", 256 * KIB)
    inner, directory = base
    fs = LogFS(inner, zero_hold=0.002)
    j = Journal(fs, JournalConfig(directory, max_size=1 * MIB, prealloc_size=256 * KIB,  # type: ignore[arg-type]
                                  zero_fill_rate=1 << 30, recycle_files=0))
    j.start()
    acked: list[tuple[int, int, bytes]] = []
    lock = threading.Lock()

    def producer(ledger: int) -> None:
        rng = random.Random(ledger)
        for e in range(300):
            data = rng.randbytes(rng.choice((100, 3000, 9000)))
            done = threading.Event()
            j.log_entry(ledger, e, data, lambda err, ctx: ctx.set() if err is None else None, done)
            if e % 10 == 9 or e == 299:
                assert done.wait(20)
            with lock:
                acked.append((ledger, e, data))

    threads = [threading.Thread(target=producer, args=(ledger,)) for ledger in (1, 2, 3, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    j.shutdown()
    assert len(list_journals(inner, directory)) >= 3, "the test meant to cross rolls"
    zeros = fs.zero_writes()
    assert zeros, "the filler wrote nothing"
    check_zeros_never_meet_frames(fs)
    got = _replayed_entries(inner, directory)
    for ledger in (1, 2, 3, 4):
        assert [x for x in got if x[0] == ledger] == [x for x in acked if x[0] == ledger]


def test_a_recycled_file_is_not_filled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recycled file's blocks are written already: the filler leaves it alone."""
    monkeypatch.setattr(_zero, "CHUNK", 64 * KIB)
    monkeypatch.setattr(_zero, "AHEAD", 256 * KIB)
    inner = MemFS(zero_fill_pays=True)
    j = Journal(inner, JournalConfig("/journal", max_size=512 * KIB, prealloc_size=64 * KIB, zero_fill_rate=1 << 30,
                                     max_backups=0))
    j.start()
    _sequential(j, 1, range(3), size=300 * KIB)  # two rolls
    j.shutdown()
    j.gc(LogMark(j.current_journal_id + 1, 0))  # every file retired: up to two are free for reuse
    fs = LogFS(inner)
    j = Journal(fs, JournalConfig("/journal", max_size=512 * KIB, prealloc_size=64 * KIB,  # type: ignore[arg-type]
                                  zero_fill_rate=1 << 30))
    j.start()
    try:
        assert j._tail.current is not None and j._tail.current.previous_id, "the test meant a recycled file"
        logged = _sequential(j, 2, range(20))
        time.sleep(0.1)
        assert fs.zero_writes() == []
    finally:
        j.shutdown()
    assert _replayed_entries(inner, "/journal")[-20:] == logged


def test_a_failed_zero_write_ends_the_filling_and_the_journal_goes_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A zero write that fails is logged once and ends the filling of that file: batches
    reserve their space with fallocate again, and nothing is lost."""
    monkeypatch.setattr(_zero, "CHUNK", 64 * KIB)
    inner = MemFS(zero_fill_pays=True)
    fs = LogFS(inner)
    fs.fail_zeros = True
    j = Journal(fs, JournalConfig("/journal", prealloc_size=64 * KIB, zero_fill_rate=1 << 30))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="bookie.journal"):
        j.start()
        try:
            logged = _sequential(j, 1, range(100), size=4000)
            assert j.zero_filled == (0, 1)
        finally:
            j.shutdown()
    assert len([r for r in caplog.records if "zero-filling" in r.getMessage()]) == 1
    assert fs.allocations, "after the failure, batches fallocate their space"
    assert _replayed_entries(inner, "/journal") == logged


def test_no_filler_when_its_rate_is_zero() -> None:
    fs = LogFS(MemFS(zero_fill_pays=True))
    j = Journal(fs, JournalConfig("/journal", prealloc_size=64 * KIB, zero_fill_rate=0))  # type: ignore[arg-type]
    j.start()
    try:
        _sequential(j, 1, range(20))
        assert not [t for t in threading.enumerate() if t.name == ZERO_THREAD and t.is_alive()]
        time.sleep(0.05)
        assert fs.zero_writes() == []
    finally:
        j.shutdown()


def test_a_buffered_journal_is_not_filled() -> None:
    """Zeros through the page cache would be dirty pages that the journal's own
    fdatasyncs write out: a journal without O_DIRECT is not filled."""
    fs = LogFS(MemFS(zero_fill_pays=True))
    j = Journal(fs, JournalConfig("/journal", prealloc_size=64 * KIB, direct_io=False,  # type: ignore[arg-type]
                                  zero_fill_rate=1 << 30))
    j.start()
    try:
        logged = _sequential(j, 1, range(20))
        time.sleep(0.05)
        assert fs.zero_writes() == [] and j.zero_filled == (0, 0)
    finally:
        j.shutdown()
    assert _replayed_entries(fs._inner, "/journal") == logged


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_acknowledged_entries_survive_a_power_cut_while_the_filler_runs(seed: int,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The zeros ahead of the tail are never synced by the filler: a power cut that tears
    every unsynced sector at random - zeros, frames in flight - in the middle of a run
    that crossed rolls keeps every acknowledged entry, and replay finds nothing else."""
    monkeypatch.setattr(_zero, "CHUNK", 32 * KIB)
    monkeypatch.setattr(_zero, "AHEAD", 256 * KIB)
    fs = MemFS(zero_fill_pays=True)
    rng = random.Random(seed)
    cut = rng.randrange(150, 250)
    acked: list[int] = []

    def ack(err: BaseException | None, ctx: int) -> None:
        if err is None:
            acked.append(ctx)
            if ctx == cut:
                fs.crash(random.Random(seed))  # the power goes while the journal and the filler run on

    j = Journal(fs, JournalConfig("/journal", max_size=512 * KIB, prealloc_size=64 * KIB, zero_fill_rate=1 << 30,
                                  recycle_files=0))
    j.start()
    sent: dict[int, bytes] = {}
    for e in range(300):
        sent[e] = random.Random(e).randbytes(rng.choice((100, 3000, 9000)))
        try:
            j.log_entry(1, e, sent[e], ack, e)
        except Exception:  # noqa: BLE001 - the power cut killed the journal
            break
        if e % 5 == 4:
            time.sleep(0.002)  # let the filler run ahead between groups
    _wait(lambda: cut in acked or j.failed is not None)
    j.shutdown()
    assert cut in acked and len(list_journals(fs, "/journal")) >= 2, "the cut was meant to come after a roll"
    assert j.zero_filled[0] > 0, "the filler was meant to run"
    target = Recorder()
    replay(fs, "/journal", None, target)  # a torn tail is allowed: the batch after the cut
    got = [(r[2], r[3]) for r in target.records if r[0] == "entry"]
    assert [e for e, _ in got][: cut + 1] == list(range(cut + 1)), "an acknowledged entry was lost"
    assert all(data == sent[e] for e, data in got)
