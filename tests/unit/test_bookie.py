"""The bookie core (``bookie.Bookie``) on MemFS and on the real disk: adds, reads, LAC,
master keys, fences, bad input, restarts (replay from the mark, journal GC), cookies,
torn and corrupt journals, configuration, concurrency and journal I/O failures."""

from __future__ import annotations

import contextlib
import dataclasses

import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bookie import LAST_ENTRY, Bookie, BookieConfig
from bookie.fs import FileSystem
from bookie.fs.mem import MemFS
from bookie.journal import FrameType, LogMark, highest_mark, journal_name, list_journals, scan_journal, write_mark
from bookie.journal._format import FRAME_HEADER
from walkit.errors import (
    BookieShutdownError,
    ConfigError,
    CookieError,
    CorruptionError,
    EntryTooLargeError,
    InvalidArgumentError,
    LedgerFencedError,
    NativeIOError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
    UsageError,
    WalkitError,
)
from walkit.protocol import AddEntry, encode_entry

KEY = b"writer-master-key-0123456789abcd"
OTHER_KEY = b"another-writer-key"
TIMEOUT = 20.0
BOOKIE_THREADS = ("bookie-journal", "bookie-journal-sync", "bookie-checkpoint")


def entry(ledger: int, entry_id: int, body: bytes = b"", lac: int | None = None) -> bytes:
    """An entry as a client sends it: the 32-byte header naming (ledger, entry), a CRC32C
    digest, then the body."""
    return encode_entry(ledger, entry_id, entry_id - 1 if lac is None else lac, len(body), body)


def body_of(ledger: int, entry_id: int, size: int) -> bytes:
    return random.Random(f"{ledger}/{entry_id}/{size}").randbytes(size)


def ok(fut: Future[None]) -> None:
    """Wait for a future that must succeed."""
    assert fut.result(TIMEOUT) is None, "an add/fence/write_lac future must resolve to None"


def error_of(fut: Future[None]) -> BaseException | None:
    return fut.exception(TIMEOUT)


def bookie_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name in BOOKIE_THREADS and t.is_alive()]


# --- places: MemFS or the real disk ----------------------------------------------------------------


@dataclass
class Place:
    kind: str
    fs: FileSystem
    root: str
    started: list[Bookie] = field(default_factory=list)

    @property
    def journal_dir(self) -> str:
        return f"{self.root}/journal"

    @property
    def ledger_dirs(self) -> list[str]:
        return [f"{self.root}/ledgers0", f"{self.root}/ledgers1"]

    def config(self, **overrides: Any) -> BookieConfig:
        values: dict[str, Any] = dict(
            bookie_id="bookie-under-test:3181",
            journal_directory=self.journal_dir,
            ledger_directories=self.ledger_dirs,
            journal_pre_alloc_size_mb=1,
            journal_max_size_mb=64,
            journal_max_group_wait_msec=1.0,
            journal_flush_when_queue_empty=True,
            flush_interval=3_600_000,  # checkpoints only when a test asks for one
        )
        values.update(overrides)
        return BookieConfig(**values)

    def bookie(self, **overrides: Any) -> Bookie:
        """A started bookie on this place (shut down at the end of the test)."""
        b = Bookie(self.config(**overrides), fs=self.fs)
        self.started.append(b)
        b.start()
        return b

    def journal_path(self, jid: int) -> str:
        return f"{self.journal_dir}/{journal_name(jid)}"

    def journals(self) -> list[int]:
        return list_journals(self.fs, self.journal_dir)

    def mark(self) -> LogMark:
        m = highest_mark(self.fs, self.ledger_dirs)
        assert m is not None, "a started bookie must have written a lastMark"
        return m

    def cleanup(self) -> None:
        for b in self.started:
            try:
                b.shutdown()
            except (OSError, WalkitError):
                pass


def _real_fs() -> FileSystem:
    from bookie.fs.real import RealFS

    return RealFS()


@pytest.fixture(params=["mem", "real"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    p = Place("mem", MemFS(), "/bk") if request.param == "mem" else Place("real", _real_fs(), str(tmp_path))
    yield p
    p.cleanup()
    leaked = bookie_threads()
    assert not leaked, f"bookie threads still running after every bookie was shut down: {leaked}"


@pytest.fixture
def mem() -> Iterator[Place]:
    p = Place("mem", MemFS(), "/bk")
    yield p
    p.cleanup()


def file_op(fs: FileSystem, path: str, op: Callable[[Any], None]) -> None:
    f = fs.open(path)
    try:
        op(f)
        f.sync()
    finally:
        f.close()


def frame_offsets(place: Place, jid: int) -> list[tuple[int, int, int, bytes]]:
    """(offset, type, flags, body) of every valid frame of a journal file."""
    frames, _, alignment = scan_journal(place.fs, place.journal_dir, jid)
    out, pos = [], alignment
    for ftype, flags, body in frames:
        out.append((pos, ftype, flags, body))
        pos += FRAME_HEADER.size + len(body)
    return out


def entry_frame(place: Place, jid: int, ledger: int, entry_id: int) -> tuple[int, bytes]:
    for off, ftype, _, body in frame_offsets(place, jid):
        if ftype == FrameType.ENTRY and int.from_bytes(body[:8], "little") == ledger and int.from_bytes(body[8:16], "little") == entry_id:
            return off, body
    raise AssertionError(f"no journal frame for ledger={ledger} entry={entry_id} in journal {jid}")


# --- adds and reads --------------------------------------------------------------------------------


def test_add_then_read_back_identical_bytes(place: Place) -> None:
    b = place.bookie()
    sizes = [0, 1, 100, 4096, 4097, 70_000, 300_000]
    sent = {(7, e): entry(7, e, body_of(7, e, n)) for e, n in enumerate(sizes)}
    sent.update({(8, e): entry(8, e, body_of(8, e, 10 * e)) for e in range(5)})
    futs = {k: b.add_entry(k[0], k[1], KEY, v) for k, v in sent.items()}
    for k, fut in futs.items():
        assert fut.result(TIMEOUT) is None, f"add {k} did not resolve to None"
    for (ledger, e), data in sent.items():
        got = b.read_entry(ledger, e)
        assert got == data, f"read_entry({ledger}, {e}) returned {len(got)} bytes, not the {len(data)} added"
    assert b.read_entry(7, LAST_ENTRY) == sent[(7, len(sizes) - 1)], "LAST_ENTRY must read the highest entry"
    assert b.read_entry(8, LAST_ENTRY) == sent[(8, 4)], "LAST_ENTRY must read the highest entry"
    assert b.ledgers() == [7, 8]


def test_last_entry_follows_the_highest_id_not_the_latest_add(place: Place) -> None:
    b = place.bookie()
    for e in (0, 5, 2):
        ok(b.add_entry(3, e, KEY, entry(3, e, b"e%d" % e)))
    assert b.read_entry(3, LAST_ENTRY) == entry(3, 5, b"e5")
    with pytest.raises(NoSuchEntryError):
        b.read_entry(3, 1)  # a gap


def test_missing_ledger_and_missing_entry(place: Place) -> None:
    b = place.bookie()
    with pytest.raises(NoSuchLedgerError):
        b.read_entry(1, 0)
    with pytest.raises(NoSuchLedgerError):
        b.read_entry(1, LAST_ENTRY)
    with pytest.raises(NoSuchLedgerError):
        b.read_lac(1)
    ok(b.add_entry(1, 0, KEY, entry(1, 0, b"zero")))
    for missing in (1, 2, 1000, (1 << 40) - 1):
        with pytest.raises(NoSuchEntryError):
            b.read_entry(1, missing)
    with pytest.raises(NoSuchLedgerError):
        b.read_entry(2, 0)  # another ledger of the same dir-modulo class stays unknown


def test_last_entry_of_a_ledger_without_entries(place: Place) -> None:
    b = place.bookie()
    ok(b.fence(4, KEY))
    with pytest.raises(NoSuchEntryError):
        b.read_entry(4, LAST_ENTRY)


def test_read_lac_is_the_max_of_explicit_lac_and_last_entry_header(place: Place) -> None:
    b = place.bookie()
    ok(b.fence(10, KEY))  # a ledger the bookie knows, with no entry and no LAC yet
    assert b.read_lac(10) == -1
    ok(b.add_entry(11, 0, KEY, entry(11, 0, b"a", lac=-1)))
    assert b.read_lac(11) == -1, "no LAC anywhere yet"
    ok(b.add_entry(11, 1, KEY, entry(11, 1, b"b", lac=0)))
    ok(b.add_entry(11, 2, KEY, entry(11, 2, b"c", lac=1)))
    assert b.read_lac(11) == 1, "the LAC carried by the last entry"
    ok(b.write_lac(11, KEY, 2))
    assert b.read_lac(11) == 2, "explicit LAC above the header's"
    ok(b.write_lac(11, KEY, 0))
    assert b.read_lac(11) == 2, "a lower explicit LAC never lowers it"
    ok(b.add_entry(11, 3, KEY, entry(11, 3, b"d", lac=2)))
    ok(b.add_entry(11, 4, KEY, entry(11, 4, b"e", lac=3)))
    assert b.read_lac(11) == 3, "the last entry's header is above the explicit LAC now"
    ok(b.write_lac(12, KEY, 41))  # write_lac on an unknown ledger creates it
    assert b.read_lac(12) == 41


def test_read_lac_reads_the_last_entry_once_while_it_stays_the_last(place: Place) -> None:
    b = place.bookie()
    ok(b.add_entry(11, 0, KEY, entry(11, 0, b"a", lac=-1)))
    ok(b.add_entry(11, 1, KEY, entry(11, 1, b"b", lac=0)))
    reads: list[tuple[int, int]] = []
    real = b.storage.get_entry

    def counted(ledger_id: int, entry_id: int) -> bytes:
        reads.append((ledger_id, entry_id))
        return real(ledger_id, entry_id)

    b.storage.get_entry = counted  # type: ignore[method-assign]
    assert [b.read_lac(11) for _ in range(5)] == [0] * 5
    assert reads == [(11, 1)], "the last entry's LAC is remembered while it stays the last"
    ok(b.add_entry(11, 2, KEY, entry(11, 2, b"c", lac=1)))
    assert b.read_lac(11) == 1 and reads == [(11, 1), (11, 2)]
    ok(b.write_lac(11, KEY, 2))
    assert b.read_lac(11) == 2 and len(reads) == 2, "an explicit LAC needs no entry read"
    # deleted and stored again under the same id: nothing remembered of the old one
    b.delete_ledger(11)
    for i in range(3):
        ok(b.add_entry(11, i, KEY, entry(11, i, b"new", lac=-1)))
    assert b.read_lac(11) == -1


# --- master key ------------------------------------------------------------------------------------


def test_master_key_first_add_stores_it_and_a_different_key_is_refused(place: Place) -> None:
    b = place.bookie()
    ok(b.add_entry(1, 0, KEY, entry(1, 0, b"mine")))
    err = error_of(b.add_entry(1, 1, OTHER_KEY, entry(1, 1, b"intruder")))
    assert isinstance(err, UnauthorizedError), f"add with another key: expected UnauthorizedError, got {err!r}"
    with pytest.raises(NoSuchEntryError):
        b.read_entry(1, 1)
    err = error_of(b.add_entry(1, 0, OTHER_KEY, entry(1, 0, b"overwrite")))
    assert isinstance(err, UnauthorizedError), f"overwrite with another key: got {err!r}"
    assert b.read_entry(1, 0) == entry(1, 0, b"mine")
    err = error_of(b.fence(1, OTHER_KEY))
    assert isinstance(err, UnauthorizedError), f"fence with another key: expected UnauthorizedError, got {err!r}"
    assert not b.is_fenced(1), "a refused fence must not fence"
    err = error_of(b.write_lac(1, OTHER_KEY, 100))
    assert isinstance(err, UnauthorizedError), f"write_lac with another key: got {err!r}"
    assert b.read_lac(1) == -1
    ok(b.add_entry(1, 1, KEY, entry(1, 1, b"mine too")))  # the right key still works


def test_master_key_survives_restart(place: Place) -> None:
    b = place.bookie()
    ok(b.add_entry(1, 0, KEY, entry(1, 0)))
    b.shutdown()
    b2 = place.bookie()
    err = error_of(b2.add_entry(1, 1, OTHER_KEY, entry(1, 1)))
    assert isinstance(err, UnauthorizedError), f"after restart another key must still be refused, got {err!r}"
    ok(b2.add_entry(1, 1, KEY, entry(1, 1)))


# --- fence -----------------------------------------------------------------------------------------


def test_fence_refuses_normal_adds_and_accepts_recovery_adds(place: Place) -> None:
    b = place.bookie()
    for e in range(3):
        ok(b.add_entry(5, e, KEY, entry(5, e, b"before")))
    ok(b.fence(5, KEY))
    assert b.is_fenced(5)
    err = error_of(b.add_entry(5, 3, KEY, entry(5, 3, b"late writer")))
    assert isinstance(err, LedgerFencedError), f"normal add after fence: expected LedgerFencedError, got {err!r}"
    with pytest.raises(NoSuchEntryError):
        b.read_entry(5, 3)
    ok(b.add_entry(5, 3, KEY, entry(5, 3, b"recovered"), recovery=True))
    ok(b.add_entry(5, 1, KEY, entry(5, 1, b"before"), recovery=True))  # recovery re-adds an entry
    assert b.read_entry(5, 3) == entry(5, 3, b"recovered")
    ok(b.fence(5, KEY))  # fencing twice is fine
    err = error_of(b.add_entry(6, 0, KEY, entry(6, 0)))
    assert err is None, f"a fence must not touch other ledgers: {err!r}"


def test_fence_of_a_ledger_never_seen_refuses_the_old_writer(place: Place) -> None:
    b = place.bookie()
    ok(b.fence(99, KEY))
    assert 99 in b.ledgers() and b.is_fenced(99)
    assert b.read_lac(99) == -1
    err = error_of(b.add_entry(99, 0, KEY, entry(99, 0, b"old writer")))
    assert isinstance(err, LedgerFencedError), f"the old writer's add must be refused, got {err!r}"
    err = error_of(b.add_entry(99, 0, OTHER_KEY, entry(99, 0)))
    assert isinstance(err, UnauthorizedError), f"the fence stored the key; another key is refused, got {err!r}"


def test_fence_survives_restart(place: Place) -> None:
    b = place.bookie()
    ok(b.add_entry(5, 0, KEY, entry(5, 0)))
    ok(b.fence(5, KEY))
    ok(b.fence(6, KEY))  # never seen before
    b.shutdown()
    b2 = place.bookie()
    for ledger in (5, 6):
        assert b2.is_fenced(ledger), f"fence of ledger {ledger} lost by a restart"
        err = error_of(b2.add_entry(ledger, 1, KEY, entry(ledger, 1)))
        assert isinstance(err, LedgerFencedError), f"ledger {ledger} after restart: expected LedgerFencedError, got {err!r}"
    assert not b2.is_fenced(7)


def power_off(place: Place, b: Bookie, seed: int | None) -> None:
    """Cut the power under a running bookie: every later I/O fails, its threads are shut
    down (errors of that shutdown are expected), then the disk keeps what was synced
    (with ``seed``: plus a random subset of the unsynced sectors)."""
    assert isinstance(place.fs, MemFS)
    place.fs.arm_crash(after_ops=0)
    try:
        b.shutdown()
    except (OSError, WalkitError):
        pass
    place.fs.crash(None if seed is None else random.Random(seed))


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_fence_survives_a_power_cut(mem: Place, seed: int | None) -> None:
    b = mem.bookie()
    ok(b.add_entry(5, 0, KEY, entry(5, 0)))
    ok(b.fence(5, KEY))
    ok(b.fence(6, KEY))
    power_off(mem, b, seed)
    b2 = mem.bookie()
    assert b2.replay_report is not None and b2.replay_report.records >= 3, "the fences came back by journal replay"
    for ledger in (5, 6):
        assert b2.is_fenced(ledger), f"acknowledged fence of ledger {ledger} lost by a power cut (seed={seed})"
        err = error_of(b2.add_entry(ledger, 1, KEY, entry(ledger, 1)))
        assert isinstance(err, LedgerFencedError), f"ledger {ledger}: expected LedgerFencedError, got {err!r}"
    assert b2.read_entry(5, 0) == entry(5, 0)


# --- explicit LAC ----------------------------------------------------------------------------------


def test_write_lac_survives_restart(place: Place) -> None:
    b = place.bookie()
    ok(b.add_entry(2, 0, KEY, entry(2, 0, lac=-1)))
    ok(b.write_lac(2, KEY, 17))
    ok(b.write_lac(3, KEY, 5))
    b.shutdown()
    b2 = place.bookie()
    assert (b2.read_lac(2), b2.read_lac(3)) == (17, 5), "explicit LACs must survive a restart"


@pytest.mark.parametrize("seed", [None, 4])
def test_write_lac_survives_a_power_cut(mem: Place, seed: int | None) -> None:
    b = mem.bookie()
    ok(b.add_entry(2, 0, KEY, entry(2, 0, lac=-1)))
    ok(b.write_lac(2, KEY, 17))
    power_off(mem, b, seed)
    assert mem.bookie().read_lac(2) == 17, "an acknowledged explicit LAC must survive a power cut"


def test_a_published_lac_is_read_at_once_and_journaled_with_the_next_flush(mem: Place) -> None:
    """publish_lac (the server's WRITE_LAC for a ledger it knows) waits for no fsync: the
    LAC is read at once, and its record rides on the next flush, so it survives a power
    cut after that flush; a power cut before any flush leaves the LAC that flush kept
    (an explicit LAC is a hint that stays true: readers keep the highest they saw)."""
    b = mem.bookie()
    ok(b.add_entry(2, 0, KEY, entry(2, 0, lac=-1)))
    assert b.publish_lac(2, KEY, 0) is True and b.read_lac(2) == 0
    ok(b.add_entry(2, 1, KEY, entry(2, 1, lac=0)))
    assert b.publish_lac(2, KEY, 1) is True and b.read_lac(2) == 1  # above the LAC entry 1 carries
    ok(b.add_entry(5, 0, KEY, entry(5, 0, lac=-1)))  # a flush: ledger 2's LAC record goes with it
    assert b.publish_lac(2, KEY, 1) is True and b.publish_lac(2, KEY, 0) is True and b.read_lac(2) == 1
    assert b.publish_lac(2, KEY, 7) is True and b.read_lac(2) == 7  # rides on no flush: lost below
    power_off(mem, b, None)
    after = mem.bookie()
    assert after.read_lac(2) == 1, "the LAC record that rode on a flush must survive the power cut"
    after.shutdown()


def test_read_recent_serves_just_written_entries_from_memory_only(place: Place) -> None:
    """What a long poll is answered with on the bookie's loop: the entry and the LAC while
    both are in the entry log's buffer; None (the read pool answers) once they are not."""
    b = place.bookie()
    ok(b.add_entry(2, 0, KEY, entry(2, 0, b"zero", lac=-1)))
    ok(b.add_entry(2, 1, KEY, entry(2, 1, b"one", lac=0)))
    assert b.read_recent(2, 0) == (0, entry(2, 0, b"zero", lac=-1), 0)
    assert b.read_recent(2, LAST_ENTRY) == (1, entry(2, 1, b"one", lac=0), 0)
    assert b.read_recent(2, 7) == (1, entry(2, 1, b"one", lac=0), 0), "not stored yet: the last one"
    assert b.publish_lac(2, KEY, 1)
    assert b.read_recent(2, 1) == (1, entry(2, 1, b"one", lac=0), 1), "the explicit LAC counts"
    assert b.read_recent(9, 0) is None  # a ledger not here: the slow path says so
    b.checkpoint()  # the buffer is written out: reads need the disk now
    assert b.read_recent(2, 1) is None
    assert (b.read_entry(2, 1), b.read_lac(2)) == (entry(2, 1, b"one", lac=0), 1)


def test_publish_lac_leaves_ledgers_it_does_not_know_and_bad_input_alone(place: Place) -> None:
    b = place.bookie()
    ok(b.add_entry(2, 0, KEY, entry(2, 0, lac=-1)))
    assert b.publish_lac(3, KEY, 5) is False, "a ledger new to this bookie needs its key journaled first"
    with pytest.raises(NoSuchLedgerError):
        b.read_lac(3)
    with pytest.raises(UnauthorizedError):
        b.publish_lac(2, OTHER_KEY, 1)
    for ledger, key, lac in ((-1, KEY, 1), (2, b"", 1), (2, KEY, -2), (2, KEY, 1 << 63)):
        with pytest.raises(InvalidArgumentError):
            b.publish_lac(ledger, key, lac)
    assert b.read_lac(2) == -1 and b.ledgers() == [2]
    b.shutdown()
    with pytest.raises(BookieShutdownError):
        b.publish_lac(2, KEY, 0)


# --- bad input -------------------------------------------------------------------------------------


BAD_ADDS: dict[str, tuple[int, int, bytes, bytes, type[WalkitError]]] = {
    "negative entry id": (1, -1, KEY, entry(1, -1), InvalidArgumentError),
    "ledger id 2^63": (1 << 63, 0, KEY, entry(0, 0), InvalidArgumentError),
    "negative ledger id": (-1, 0, KEY, entry(0, 0), InvalidArgumentError),
    "header names another entry": (1, 0, KEY, entry(1, 1), InvalidArgumentError),
    "header names another ledger": (1, 0, KEY, entry(2, 0), InvalidArgumentError),
    "payload shorter than a header": (1, 0, KEY, entry(1, 0)[:31], InvalidArgumentError),
    "payload over nettyMaxFrameSizeBytes": (1, 0, KEY, entry(1, 0, bytes(5000)), EntryTooLargeError),
    "empty master key": (1, 0, b"", entry(1, 0), InvalidArgumentError),
    "master key over 64 bytes": (1, 0, bytes(65), entry(1, 0), InvalidArgumentError),
    "entry id beyond the storage's 2^40-1": (1, 1 << 40, KEY, entry(1, 1 << 40), InvalidArgumentError),
}


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=c) for c in BAD_ADDS],
)
def test_bad_add_is_refused_and_nothing_is_stored(place: Place, case: str) -> None:
    ledger, entry_id, key, payload, expected = BAD_ADDS[case]
    b = place.bookie(netty_max_frame_size_bytes=4096)
    err = error_of(b.add_entry(ledger, entry_id, key, payload))
    assert isinstance(err, expected) and isinstance(err, UsageError), f"{case}: expected {expected.__name__}, got {err!r}"
    assert b.ledgers() == [], f"{case}: a refused add created ledgers {b.ledgers()}"
    ok(b.add_entry(1, 0, KEY, entry(1, 0, b"good")))  # the bookie is still fine
    assert b.read_entry(1, 0) == entry(1, 0, b"good")


def test_payload_at_exactly_the_frame_limit_is_accepted(place: Place) -> None:
    b = place.bookie(netty_max_frame_size_bytes=4096)
    data = entry(1, 0, bytes(4096 - 36))
    assert len(data) == 4096
    ok(b.add_entry(1, 0, KEY, data))
    assert b.read_entry(1, 0) == data


@pytest.mark.parametrize(
    ("ledger", "key"), [(-1, KEY), (1 << 63, KEY), (1, b""), (1, bytes(65))], ids=["neg-ledger", "ledger-2^63", "empty-key", "long-key"]
)
def test_bad_fence_and_write_lac_are_refused(place: Place, ledger: int, key: bytes) -> None:
    b = place.bookie()
    for fut in (b.fence(ledger, key), b.write_lac(ledger, key, 3)):
        err = error_of(fut)
        assert isinstance(err, InvalidArgumentError), f"expected InvalidArgumentError, got {err!r}"
    assert b.ledgers() == []


def test_a_write_lac_out_of_range_is_refused(place: Place) -> None:
    b = place.bookie()
    ok(b.add_entry(1, 0, KEY, entry(1, 0, lac=-1)))
    for lac in (-2, 1 << 63):
        err = error_of(b.write_lac(1, KEY, lac))
        assert isinstance(err, InvalidArgumentError), f"LAC {lac}: expected InvalidArgumentError, got {err!r}"
    assert b.read_lac(1) == -1


def test_calls_on_a_bookie_that_is_shut_down_fail(place: Place) -> None:
    b = place.bookie()
    ok(b.add_entry(1, 0, KEY, entry(1, 0)))
    b.shutdown()
    for fut in (b.add_entry(1, 1, KEY, entry(1, 1)), b.fence(1, KEY), b.write_lac(1, KEY, 0)):
        err = error_of(fut)
        assert isinstance(err, BookieShutdownError), f"expected BookieShutdownError, got {err!r}"
    with pytest.raises(BookieShutdownError):
        b.checkpoint()
    b.shutdown()  # a second shutdown is a no-op


# --- restart ---------------------------------------------------------------------------------------


def add_many(b: Bookie, ledgers: list[int], per_ledger: int, size: Callable[[int, int], int], start: int = 0) -> dict[tuple[int, int], bytes]:
    sent: dict[tuple[int, int], bytes] = {}
    futs: list[tuple[tuple[int, int], Future[None]]] = []
    for e in range(start, start + per_ledger):
        for ledger in ledgers:
            data = entry(ledger, e, body_of(ledger, e, size(ledger, e)))
            sent[(ledger, e)] = data
            futs.append(((ledger, e), b.add_entry(ledger, e, KEY, data)))
    for k, fut in futs:
        assert fut.result(TIMEOUT) is None, f"add {k} failed"
    return sent


def assert_all_readable(b: Bookie, sent: dict[tuple[int, int], bytes], when: str) -> None:
    for (ledger, e), data in sorted(sent.items()):
        try:
            got = b.read_entry(ledger, e)
        except WalkitError as exc:
            raise AssertionError(f"{when}: entry ({ledger}, {e}) not readable: {exc!r}") from exc
        assert got == data, f"{when}: entry ({ledger}, {e}) differs ({len(got)} bytes vs {len(data)})"


def test_entries_are_readable_after_restart(place: Place) -> None:
    b = place.bookie()
    sent = add_many(b, [1, 2, 3, 1 << 62], 20, lambda ledger, e: (e * 997 + ledger) % 9000)
    b.shutdown()
    b2 = place.bookie()
    assert b2.replay_report is not None and b2.replay_report.entries == 0, (
        f"a clean shutdown checkpoints everything; replay found {b2.replay_report}"
    )
    assert_all_readable(b2, sent, "after restart")
    assert b2.ledgers() == [1, 2, 3, 1 << 62]
    sent |= add_many(b2, [1, 2], 5, lambda ledger, e: 300, start=20)
    b2.shutdown()
    assert_all_readable(place.bookie(), sent, "after a second restart")


def test_restart_replays_from_the_mark_after_a_checkpoint(mem: Place) -> None:
    b = mem.bookie()
    before = add_many(b, [1, 2], 10, lambda ledger, e: 2000)
    mark = b.checkpoint()
    assert mem.mark() == mark, "checkpoint() must persist the mark it returns"
    after = add_many(b, [1, 2, 3], 7, lambda ledger, e: 3000, start=10)
    power_off(mem, b, None)  # no shutdown checkpoint: the later adds live only in the journal
    b2 = mem.bookie()
    report = b2.replay_report
    assert report is not None
    assert report.files and report.files[0] == mark.journal_id, f"replay must start at the mark's journal: {report}"
    assert report.entries == len(after), f"replay must start at the mark ({mark}): replayed {report.entries}, expected {len(after)}"
    assert_all_readable(b2, before | after, "after a power cut following a checkpoint")


def test_restart_after_checkpoint_and_more_adds(place: Place) -> None:
    b = place.bookie()
    sent = add_many(b, [1, 2], 10, lambda ledger, e: 1500)
    b.checkpoint()
    sent |= add_many(b, [1, 2, 3], 10, lambda ledger, e: 2500, start=10)
    b.shutdown()
    assert_all_readable(place.bookie(), sent, "after checkpoint, more adds and a restart")


@pytest.mark.parametrize("backups", [0, 1, 2])
def test_journal_files_behind_the_mark_beyond_max_backups_are_deleted(place: Place, backups: int) -> None:
    b = place.bookie(journal_max_size_mb=1, journal_max_backups=backups)
    first = b.journal.current_journal_id
    sent: dict[tuple[int, int], bytes] = {}
    for chunk in range(6):  # 6 x 576 KiB, each waited for: a 1 MiB journal holds two at most
        sent |= add_many(b, [1, 2, 3], 3, lambda ledger, e: 64 * 1024, start=3 * chunk)
    journals = place.journals()
    assert len(journals) >= 3, f"~3.4 MiB in 1 MiB journals must roll at least twice; files: {journals}"
    assert journals[0] == first, f"no checkpoint yet, nothing may be deleted: {journals}"
    mark = b.checkpoint()
    assert mark.journal_id >= journals[-2], f"the mark {mark} must be in one of the last two files of {journals}"
    behind = [j for j in place.journals() if j < mark.journal_id]
    expected = [j for j in journals if j < mark.journal_id][-backups:] if backups else []
    assert behind == expected, f"mark={mark} backups={backups}: kept {behind}, expected {expected} (files were {journals})"
    b.shutdown()
    b2 = place.bookie(journal_max_size_mb=1, journal_max_backups=backups)
    assert b2.replay_report is not None and b2.replay_report.torn == []
    assert_all_readable(b2, sent, "after journal GC and restart")


# --- cookies ---------------------------------------------------------------------------------------


def wipe(place: Place, directory: str) -> None:
    """Remove every file below ``directory`` (a replaced disk): the directory stays."""
    if place.kind == "real":
        shutil.rmtree(directory)
        os.makedirs(directory)
        return

    def walk(d: str) -> None:
        for name in place.fs.listdir(d):
            p = f"{d}/{name}"
            try:
                place.fs.listdir(p)
            except FileNotFoundError:
                place.fs.remove(p)
            else:
                walk(p)

    walk(directory)


@pytest.mark.parametrize("which", ["ledger", "journal"])
def test_a_wiped_directory_is_refused_with_a_cookie_error(place: Place, which: str) -> None:
    b = place.bookie()
    ok(b.add_entry(1, 0, KEY, entry(1, 0)))
    b.shutdown()
    wipe(place, place.ledger_dirs[1] if which == "ledger" else place.journal_dir)
    with pytest.raises(CookieError, match="missing cookie"):
        Bookie(place.config(), fs=place.fs).start()
    assert not bookie_threads(), "a refused start must not leave threads behind"


def test_a_foreign_cookie_is_refused(place: Place) -> None:
    b = place.bookie()
    ok(b.add_entry(1, 0, KEY, entry(1, 0)))
    b.shutdown()
    with pytest.raises(CookieError, match="bookie_id"):
        Bookie(place.config(bookie_id="someone-else:3181"), fs=place.fs).start()
    with pytest.raises(CookieError, match="ledger_dirs"):
        Bookie(place.config(ledger_directories=list(reversed(place.ledger_dirs))), fs=place.fs).start()
    assert_all_readable(place.bookie(), {(1, 0): entry(1, 0)}, "the rightful bookie after refusals")


# --- torn tail and corruption in the journal ---------------------------------------------------------


def separate_flushes(b: Bookie, ledger: int, n: int, size: int) -> dict[tuple[int, int], bytes]:
    """``n`` adds, each waited for, so each is its own journal flush."""
    sent = {}
    for e in range(n):
        sent[(ledger, e)] = entry(ledger, e, body_of(ledger, e, size))
        ok(b.add_entry(ledger, e, KEY, sent[(ledger, e)]))
    return sent


def test_torn_journal_tail_is_truncated_and_reported(place: Place) -> None:
    b = place.bookie()
    early = place.mark()
    sent = separate_flushes(b, 1, 6, 12_000)
    jid = b.journal.current_journal_id
    b.shutdown()
    off, body = entry_frame(place, jid, 1, 5)
    cut = off + FRAME_HEADER.size + len(body) // 2
    file_op(place.fs, place.journal_path(jid), lambda f: f.truncate(cut))
    # The shutdown checkpoint's mark never reached the disk: replay starts from the
    # mark written at start, over every flush of this run.
    write_mark(place.fs, place.ledger_dirs, early)
    b2 = place.bookie()
    report = b2.replay_report
    assert report is not None and len(report.torn) == 1, f"expected one torn tail, got {report}"
    torn = report.torn[0]
    assert (torn.journal_id, torn.offset, torn.dropped_bytes) == (jid, off, cut - off), f"torn tail {torn}, cut at {cut}"
    assert report.entries == 5, f"the five whole flushes are replayed: {report}"
    assert_all_readable(b2, sent, "after a torn tail")  # entry 5 also sits in ledger storage
    b2.shutdown()
    b3 = place.bookie()
    assert b3.replay_report is not None and b3.replay_report.torn == [], "the truncation must be durable"


class _KeepAll(random.Random):
    """A power cut that happens to keep every unsynced sector (the test then loses some)."""

    def random(self) -> float:
        return 0.0


def test_power_cut_during_a_flush_leaves_a_torn_tail(mem: Place) -> None:
    b = mem.bookie()
    sent = separate_flushes(b, 1, 3, 5000)
    jid = b.journal.current_journal_id
    assert isinstance(mem.fs, MemFS)
    mem.fs.arm_crash(after_ops=2)  # the next batch's pwrite goes through, its fdatasync dies
    late = entry(1, 3, body_of(1, 3, 40_000))
    err = error_of(b.add_entry(1, 3, KEY, late))
    assert isinstance(err, NativeIOError), f"the add whose fdatasync died must fail with NativeIOError, got {err!r}"
    try:
        b.shutdown()
    except (OSError, WalkitError):
        pass
    mem.fs.crash(_KeepAll())
    off, _ = entry_frame(mem, jid, 1, 3)  # the whole flush happened to reach the disk...
    path = mem.journal_path(jid)
    # ...but for its first sector: the power cut lost the others.
    file_op(mem.fs, path, lambda f: f.pwrite(bytes(64 * 1024 - 512), off + 512))
    b2 = mem.bookie()
    report = b2.replay_report
    assert report is not None and len(report.torn) == 1, f"expected one torn tail, got {report}"
    assert (report.torn[0].journal_id, report.torn[0].offset) == (jid, off), f"{report.torn[0]} vs flush at {off}"
    assert_all_readable(b2, sent, "after a torn flush")
    with pytest.raises(NoSuchEntryError):
        b2.read_entry(1, 3)  # half-written, never acknowledged: invisible


@pytest.mark.parametrize("seed", range(6))
def test_power_cut_with_random_sectors_lost(mem: Place, seed: int) -> None:
    """Power cuts at random points of a stream of adds; a random subset of the unsynced
    sectors survives. Whatever replay reports, acknowledged entries are all there and
    nothing else is visible but what was submitted."""
    b = mem.bookie()
    sent = separate_flushes(b, 1, 3, 5000)
    assert isinstance(mem.fs, MemFS)
    rng = random.Random(seed)
    mem.fs.arm_crash(after_ops=rng.randint(1, 12))
    submitted = {(2, e): entry(2, e, body_of(2, e, rng.randint(0, 30_000))) for e in range(12)}
    futs: dict[tuple[int, int], Future[None]] = {}
    for k, v in submitted.items():
        try:
            futs[k] = b.add_entry(k[0], k[1], KEY, v)
        except OSError:  # the storage's PowerLoss escapes add_entry (see test_add_on_a_dead_disk_...)
            break
    acked = {k: submitted[k] for k, f in futs.items() if error_of(f) is None}
    try:
        b.shutdown()
    except (OSError, WalkitError):
        pass
    mem.fs.crash(random.Random(seed))
    b2 = mem.bookie()
    assert_all_readable(b2, sent | acked, f"seed={seed}")
    for k, data in submitted.items():
        try:
            got = b2.read_entry(*k)
        except (NoSuchEntryError, NoSuchLedgerError):
            continue
        assert got == data, f"seed={seed}: entry {k} is visible but not as it was submitted"


def test_corruption_before_later_flushes_refuses_to_start(place: Place) -> None:
    b = place.bookie()
    early = place.mark()
    separate_flushes(b, 1, 6, 3000)
    jid = b.journal.current_journal_id
    b.shutdown()
    off, _ = entry_frame(place, jid, 1, 1)  # an early flush; flushes 2..5 stay valid

    def flip(f: Any) -> None:
        pos = off + FRAME_HEADER.size + 100
        f.pwrite(bytes([f.pread(1, pos)[0] ^ 0x5A]), pos)

    file_op(place.fs, place.journal_path(jid), flip)
    write_mark(place.fs, place.ledger_dirs, early)  # no checkpoint covers the damaged flush
    with pytest.raises(CorruptionError) as info:
        Bookie(place.config(), fs=place.fs).start()
    assert info.value.context.get("journal") == jid and info.value.context.get("offset") == off, info.value.context
    assert not bookie_threads(), "a refused start must not leave threads behind"


def test_corruption_behind_the_mark_is_not_read(place: Place) -> None:
    """Damage in a flush that a checkpoint covers is never replayed: the start succeeds."""
    b = place.bookie()
    sent = separate_flushes(b, 1, 4, 3000)
    jid = b.journal.current_journal_id
    b.shutdown()  # checkpoint: mark at the end of the journal
    off, _ = entry_frame(place, jid, 1, 1)
    file_op(place.fs, place.journal_path(jid), lambda f: f.pwrite(b"\xff" * 8, off + FRAME_HEADER.size + 40))
    assert_all_readable(place.bookie(), sent, "after damage behind the mark")


# --- configuration -----------------------------------------------------------------------------------


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(v)


def write_toml(path: Path, values: dict[str, Any]) -> str:
    path.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in values.items()))
    return str(path)


def test_config_from_toml_uses_bookkeeper_keys(tmp_path: Path) -> None:
    path = tmp_path / "bk.toml"
    path.write_text(
        'bookieId = "10.0.0.7:3181"\n'
        'journalDirectory = "/data/txn"\n'
        'ledgerDirectories = ["/data/l0", "/data/l1"]\n'
        "journalMaxGroupWaitMSec = 1.5\n"
        "journalFlushWhenQueueEmpty = true\n"
        "journalMaxSizeMB = 512\n"
        "journalMaxBackups = 3\n"
        "flushInterval = 1000\n"
        "nettyMaxFrameSizeBytes = 1048576\n"
        "diskUsageThreshold = 0.9\n"
        "diskUsageLwmThreshold = 0.8\n"
    )
    c = BookieConfig.from_toml(str(path))
    got = (c.bookie_id, c.journal_directory, c.ledger_directories, c.journal_max_group_wait_msec, c.journal_flush_when_queue_empty,
           c.journal_max_size_mb, c.journal_max_backups, c.flush_interval, c.netty_max_frame_size_bytes,
           c.disk_usage_threshold, c.disk_usage_lwm_threshold)
    assert got == ("10.0.0.7:3181", "/data/txn", ["/data/l0", "/data/l1"], 1.5, True, 512, 3, 1000, 1 << 20, 0.9, 0.8)
    assert c.journal_pre_alloc_size_mb == BookieConfig().journal_pre_alloc_size_mb, "unset keys keep their defaults"
    assert c.effective_bookie_id == "10.0.0.7:3181"
    assert BookieConfig(bookie_port=4000).effective_bookie_id == "127.0.0.1:4000"


def test_config_round_trips_through_toml(tmp_path: Path) -> None:
    original = BookieConfig(
        bookie_id='quoted "id" \\ path', journal_directory="/j", ledger_directories=["/a", "/b", "/c"],
        journal_max_group_wait_msec=0.25, journal_buffered_entries_threshold=7, journal_sync_data=False,
        journal_direct_io=False, flush_interval=123, disk_usage_threshold=1.0, disk_usage_lwm_threshold=0.5,
    )
    d = original.to_dict()
    assert set(d) == set(BookieConfig.keys()) and "journalMaxGroupWaitMSec" in d and "ledgerDirectories" in d
    again = BookieConfig.from_toml(write_toml(tmp_path / "rt.toml", d))
    assert again == original, f"round trip changed the config: {again} != {original}"
    assert BookieConfig.from_dict(d) == original


@pytest.mark.parametrize(
    "values",
    [
        {"journalMaxSizeMb": 5},  # wrong case: BookKeeper's key is journalMaxSizeMB
        {"journal_max_size_mb": 5},  # attribute names are not keys
        {"flushInterval": 10, "noSuchKey": 1},
    ],
    ids=["wrong-case", "snake-case", "unknown"],
)
def test_config_unknown_key_is_an_error(tmp_path: Path, values: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="unknown"):
        BookieConfig.from_toml(write_toml(tmp_path / "u.toml", values))


@pytest.mark.parametrize(
    "values",
    [
        {"flushInterval": "1000"},
        {"journalMaxSizeMB": 1.5},
        {"bookiePort": True},
        {"journalFlushWhenQueueEmpty": 1},
        {"journalMaxGroupWaitMSec": "2"},
        {"bookieId": 5},
        {"ledgerDirectories": ["/a", 3]},
        {"ledgerDirectories": "/a"},
    ],
    ids=["int-as-str", "int-as-float", "int-as-bool", "bool-as-int", "float-as-str", "str-as-int", "dir-not-str", "dirs-not-list"],
)
def test_config_wrong_type_is_an_error(tmp_path: Path, values: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        BookieConfig.from_toml(write_toml(tmp_path / "t.toml", values))


@pytest.mark.parametrize(
    "values",
    [
        {"diskUsageThreshold": 0.8, "diskUsageLwmThreshold": 0.9},
        {"diskUsageThreshold": 1.5},
        {"diskUsageLwmThreshold": 0.0},
        {"journalAlignmentSize": 1000},
        {"journalAlignmentSize": 256},
        {"journalMaxSizeMB": 0},
        {"journalPreAllocSizeMB": -1},
        {"journalMaxBackups": -1},
        {"journalMaxGroupWaitMSec": -0.5},
        {"journalBufferedEntriesThreshold": -1},
        {"flushInterval": 0},
        {"flushEntriesThreshold": 0},
        {"nettyMaxFrameSizeBytes": 0},
        {"openFileLimit": 0},
        {"ledgerDirectories": []},
        {"ledgerDirectories": ["/a", "/a"]},
        {"ledgerDirectories": [""]},
        {"nettyMaxFrameSizeBytes": 4095},
        {"bookiePort": 70000},
        {"bindAddress": "0.0.0.0"},
        {"tlsCertificatePath": "/c.pem"},
        {"tlsClientAuthentication": True},
        {"zkTimeout": 0},
        {"metadataRetryDeadlineMs": 0},
        {"maxPendingRequestsPerConnection": 0},
        {"maxConnections": 0},
    ],
    ids=lambda v: ",".join(f"{k}={v[k]}" for k in v),
)
def test_config_invalid_values_are_errors(tmp_path: Path, values: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        BookieConfig.from_toml(write_toml(tmp_path / "v.toml", values))


_WRONG_TYPE = {"str": 5, "int": "7", "float": "fast", "bool": "yes", "list[str]": "/one/path"}
_OUT_OF_RANGE: dict[str, Any] = {
    "bookiePort": -1, "httpServerPort": 65536, "bindAddress": "", "httpServerAddress": "", "journalDirectory": "",
    "advertisedAddress": "0.0.0.0", "metadataServiceUri": "mysql://db/x", "zkTimeout": 0,
    "metadataRetryDeadlineMs": -1,
    "journalAlignmentSize": 1000, "journalMaxGroupWaitMSec": float("nan"), "journalBufferedEntriesThreshold": -1,
    "journalMaxBackups": -1, "journalRecycleFiles": -1, "journalZeroFillRateMB": -1, "journalSyncWarnMillis": 0,
    "entryLogSizeLimit": 0,
    "diskUsageThreshold": 1.5, "diskUsageLwmThreshold": 0.0, "diskUsageWarnThreshold": float("inf"),
    "majorCompactionThreshold": 1.2, "minorCompactionThreshold": 0.9, "lostBookieRecoveryDelay": -5,
    "openLedgerRereplicationGracePeriod": -1, "auditorPeriodicBookieCheckInterval": 0, "gcWaitTime": 0,
    "tlsKeyStore": "/key.pem", "ledgerDirectories": [], "dbStorage_readAheadCacheMaxSizeMb": -1,
    "dbStorage_readAheadCacheBatchSize": 0, "recentWritesCacheMaxSizeMb": -1,
}

_NAMES = {"tlsKeyStore": "tlsCertificatePath"}  # a key alone: the error names the one missing beside it


@pytest.mark.parametrize("key", sorted(BookieConfig.keys()))
def test_every_key_refuses_a_bad_value_naming_the_key(key: str) -> None:
    kind = str(next(f.type for f in dataclasses.fields(BookieConfig) if f.metadata["key"] == key))
    bad_values = [_WRONG_TYPE[kind]] + ([_OUT_OF_RANGE[key]] if key in _OUT_OF_RANGE else [])
    for bad in bad_values:
        with pytest.raises(ConfigError) as err:
            BookieConfig.from_dict({key: bad})
        named = _NAMES.get(key, key) if bad is not _WRONG_TYPE[kind] else key
        assert err.value.context.get("key") == named and named in str(err.value), (key, bad, str(err.value))


def test_with_tls_a_frame_limit_whose_length_could_read_as_tls_is_refused() -> None:
    """A plain frame's first byte is its length's top byte: 0x16 (a TLS record) from
    352 MiB on, so with TLS (bookie.server._tls) the limit must stay below it."""
    tls = {"tlsCertificatePath": "/c.pem", "tlsKeyStore": "/k.pem"}
    with pytest.raises(ConfigError) as err:
        BookieConfig.from_dict({**tls, "nettyMaxFrameSizeBytes": 0x16000000})
    assert err.value.context["key"] == "nettyMaxFrameSizeBytes" and "TLS" in str(err.value)
    assert BookieConfig.from_dict({**tls, "nettyMaxFrameSizeBytes": 0x16000000 - 1}).tls_certificate_path
    assert BookieConfig.from_dict({"nettyMaxFrameSizeBytes": 0x16000000}).netty_max_frame_size_bytes == 0x16000000


def test_journal_alignment_below_4k_needs_buffered_journal_writes() -> None:
    with pytest.raises(ConfigError) as err:
        BookieConfig.from_dict({"journalAlignmentSize": 512})
    assert "journalDirectIO" in str(err.value)
    assert BookieConfig.from_dict({"journalAlignmentSize": 512, "journalDirectIO": False}).journal_alignment_size == 512


def test_a_wildcard_bind_needs_an_advertised_address_even_with_a_bookie_id() -> None:
    with pytest.raises(ConfigError) as err:
        BookieConfig.from_dict({"bindAddress": "0.0.0.0", "bookieId": "bk1"})
    assert err.value.context["key"] == "advertisedAddress"


def test_config_unreadable_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        BookieConfig.from_toml(str(tmp_path / "absent.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("flushInterval = = 3\n")
    with pytest.raises(ConfigError):
        BookieConfig.from_toml(str(bad))


def test_wildcard_bind_with_an_advertised_address_is_fine() -> None:
    config = BookieConfig(bind_address="0.0.0.0", advertised_address="bk1.example", bookie_port=3181)
    assert config.effective_bookie_id == "bk1.example:3181"


def test_config_defaults_are_bookkeepers() -> None:
    c = BookieConfig()
    assert (c.journal_max_group_wait_msec, c.journal_buffered_writes_threshold, c.journal_max_size_mb,
            c.journal_pre_alloc_size_mb, c.journal_max_backups, c.flush_interval, c.netty_max_frame_size_bytes) == (
        2.0, 512 * 1024, 2048, 16, 5, 60000, 5 * 1024 * 1024)


# --- concurrency -------------------------------------------------------------------------------------


def test_concurrent_adds_with_checkpoints(place: Place) -> None:
    b = place.bookie(flush_entries_threshold=50)
    per_thread = 60 if place.kind == "real" else 120
    sent: dict[tuple[int, int], bytes] = {}
    futs: dict[tuple[int, int], Future[None]] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []
    start = threading.Barrier(11)
    done = threading.Event()
    checkpoints = [0]

    def adder(ledger: int, ids: range) -> None:
        try:
            start.wait()
            rng = random.Random(ledger * 1000 + ids.start)
            for e in ids:
                data = entry(ledger, e, body_of(ledger, e, rng.choice([0, 10, 500, 3000, 20_000])))
                fut = b.add_entry(ledger, e, KEY, data)
                with lock:
                    sent[(ledger, e)], futs[(ledger, e)] = data, fut
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    def checkpointer() -> None:
        try:
            start.wait()
            while not done.is_set():
                b.checkpoint()
                checkpoints[0] += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=adder, args=(100 + i, range(per_thread))) for i in range(8)]
    threads += [threading.Thread(target=adder, args=(200, range(k, 2 * per_thread, 2))) for k in (0, 1)]
    ck = threading.Thread(target=checkpointer)
    for t in [*threads, ck]:
        t.start()
    for t in threads:
        t.join(60)
    done.set()
    ck.join(60)
    assert not errors, f"threads raised: {errors!r}"
    assert checkpoints[0] > 0, "the checkpoint thread never completed a checkpoint"
    assert len(futs) == 10 * per_thread
    for k, fut in futs.items():
        assert fut.result(TIMEOUT) is None, f"add {k} failed"
    assert_all_readable(b, sent, "concurrent adds")
    b.shutdown()
    assert_all_readable(place.bookie(), sent, "concurrent adds after restart")


# --- journal I/O failure -------------------------------------------------------------------------------


@pytest.mark.parametrize("power_cut", [False, True], ids=["restart", "restart-after-power-cut"])
def test_journal_sync_failure_fails_pending_and_later_adds(mem: Place, power_cut: bool) -> None:
    assert isinstance(mem.fs, MemFS)
    b = mem.bookie(journal_max_group_wait_msec=50.0, journal_flush_when_queue_empty=False)
    acked = add_many(b, [1, 2], 10, lambda ledger, e: 700)
    mem.fs.fail_next_sync()
    pending = {(1, e): entry(1, e, b"doomed") for e in range(10, 20)}
    futs = [b.add_entry(1, e, KEY, data) for (_, e), data in pending.items()]
    errs = [error_of(f) for f in futs]
    assert all(isinstance(e, (NativeIOError, BookieShutdownError)) for e in errs), f"pending adds must fail: {errs!r}"
    assert isinstance(errs[0], NativeIOError) and errs[0].errno == 5, f"the failed fdatasync's EIO: {errs[0]!r}"
    assert b.journal.failed is not None
    for fut in (b.add_entry(2, 10, KEY, entry(2, 10)), b.fence(2, KEY), b.write_lac(2, KEY, 3)):
        err = error_of(fut)
        assert isinstance(err, BookieShutdownError), f"after the journal died: expected BookieShutdownError, got {err!r}"
    b.shutdown()  # the disk is fine; only the journal is dead
    if power_cut:
        mem.fs.crash(random.Random(7))
    b2 = mem.bookie()
    assert_all_readable(b2, acked, "after a journal failure")
    for (ledger, e), data in pending.items():
        try:
            got = b2.read_entry(ledger, e)
        except NoSuchEntryError:
            continue
        assert got == data, f"unacknowledged entry ({ledger}, {e}) is visible but not as submitted"
    ok(b2.add_entry(3, 0, KEY, entry(3, 0)))


def test_add_on_a_dead_disk_fails_the_future_not_the_call(mem: Place) -> None:
    assert isinstance(mem.fs, MemFS)
    b = mem.bookie()
    ok(b.add_entry(1, 0, KEY, entry(1, 0)))
    mem.fs.arm_crash(after_ops=0)
    futs = []
    for e in range(1, 40):  # 39 x 20 KiB fill the 256 KiB entry-log buffer: storage writes
        futs.append(b.add_entry(1, e, KEY, entry(1, e, bytes(20_000))))
    for fut in futs:
        assert isinstance(error_of(fut), WalkitError)


def test_shutdown_after_power_loss_still_closes_the_storage(mem: Place) -> None:
    assert isinstance(mem.fs, MemFS)
    b = mem.bookie()
    ok(b.add_entry(1, 0, KEY, entry(1, 0)))
    mem.fs.arm_crash(after_ops=0)
    try:
        b.shutdown()  # may report the dead disk...
    except (OSError, WalkitError):
        pass
    assert not bookie_threads(), "shutdown must end the bookie's threads"
    with pytest.raises(UsageError, match="not open"):
        b.storage.ledgers()  # ...but must release the storage


@pytest.mark.parametrize("seed", [None, 5])
def test_replayed_lower_lac_does_not_lower_an_explicit_lac_of_zero(mem: Place, seed: int | None) -> None:
    b = mem.bookie()
    ok(b.write_lac(1, KEY, 0))
    ok(b.write_lac(1, KEY, -1))  # a stale LAC: the bookie keeps the max
    assert b.read_lac(1) == 0
    power_off(mem, b, seed)  # both LAC records come back by replay only
    assert mem.bookie().read_lac(1) == 0, "an acknowledged explicit LAC of 0 must survive replay"


def test_a_batch_of_adds_checks_each_add_on_its_own(place: Place) -> None:
    """add_entries_cb (the adds of one received chunk): a refused add - bad header, other
    key, fenced ledger - refuses only itself; the others are stored, journaled and
    called back once durable; a ledger seen first in the batch gets its key once."""
    b = place.bookie()
    ok(b.add_entry(2, 0, b"k2", entry(2, 0)))
    ok(b.fence(2, b"k2"))
    results: dict[str, BaseException | None] = {}
    done = threading.Event()

    def cb(err: BaseException | None, ctx: Any) -> None:
        results[ctx] = err
        if len(results) == 7:
            done.set()

    b.add_entries_cb([
        (1, 0, b"k1", entry(1, 0), False, "new ledger"),
        (1, 1, b"k1", entry(1, 1), False, "same ledger"),
        (1, 2, b"other", entry(1, 2), False, "other key"),
        (1, 3, b"k1", entry(1, 4), False, "bad header"),
        (2, 1, b"k2", entry(2, 1), False, "fenced"),
        (2, 1, b"k2", entry(2, 1), True, "recovery"),
        (1, 2, b"k1", entry(1, 2), False, "after the refusals"),
    ], cb)
    assert done.wait(TIMEOUT), f"callbacks missing: {results}"
    assert results["new ledger"] is None and results["same ledger"] is None
    assert results["recovery"] is None and results["after the refusals"] is None
    assert isinstance(results["other key"], UnauthorizedError)
    assert isinstance(results["bad header"], InvalidArgumentError)
    assert isinstance(results["fenced"], LedgerFencedError)
    assert [b.read_entry(1, i) for i in range(3)] == [entry(1, i) for i in range(3)]
    assert b.read_entry(2, 1) == entry(2, 1)
    assert b.storage.master_key(1) == b"k1"


def test_a_batch_is_called_back_once_for_its_durable_adds(place: Place) -> None:
    """add_batch_cb (the server's path): the admitted adds come back together, in order,
    in one call once durable; each refused add comes back on its own, at once."""
    b = place.bookie()
    ok(b.add_entry(2, 0, b"k2", entry(2, 0)))
    ok(b.fence(2, b"k2"))
    adds = [AddEntry(1, 0, b"k1", entry(1, 0)), AddEntry(2, 1, b"k2", entry(2, 1)),
            AddEntry(1, 1, b"k1", entry(1, 1)), AddEntry(1, 2, b"k1", entry(1, 3)),
            AddEntry(2, 1, b"k2", entry(2, 1), recovery=True)]
    calls: list[tuple[type | None, list[AddEntry]]] = []
    done = threading.Event()

    def cb(err: BaseException | None, group: list[AddEntry]) -> None:
        calls.append((None if err is None else type(err), group))
        if err is None:
            done.set()

    b.add_batch_cb(adds, cb)
    refused = [c for c in calls if c[0] is not None]  # called at once, before add_batch_cb returns
    assert refused == [(LedgerFencedError, [adds[1]]), (InvalidArgumentError, [adds[3]])], refused
    assert done.wait(TIMEOUT)
    durable = [c for c in calls if c[0] is None]
    assert durable == [(None, [adds[0], adds[2], adds[4]])], "one call for the durable adds, in order"
    assert len(calls) == 3, calls
    assert b.read_entry(1, 1) == entry(1, 1) and b.read_entry(2, 1) == entry(2, 1)


def test_a_batch_looks_up_all_its_ledgers_at_once_as_one_by_one(mem: Place) -> None:
    """The key and fence state a batch of adds over many ledgers reads in one look
    (``LedgerRecords.look_many``) is what one look per ledger reads: a stored ledger, a
    fenced one, one never seen, one whose key is journaled but not yet settled, one with
    a fence in flight."""
    b = mem.bookie()
    ok(b.add_entry(1, 0, b"k1", entry(1, 0)))
    ok(b.add_entry(2, 0, b"k2", entry(2, 0)))
    ok(b.fence(2, b"k2"))
    records = b.records
    ids = [1, 2, 3, 4, 5]
    assert records.look_many(ids) == {i: records.look(i) for i in ids}
    assert records.look_many(ids)[2] == (b"k2", True, True) and records.look_many(ids)[3] == (None, False, False)
    key = records.key_record(4, b"k4", with_entries=False)  # made, not journaled: the key is pending
    fence = records.fence_record(5, lambda err, ctx: None, None)
    views = records.look_many(ids)
    assert views == {i: records.look(i) for i in ids}
    assert views[4] == (b"k4", False, False) and views[5][2], views
    records.drop([key, fence], BookieShutdownError("test over"))
    assert records.look_many(ids) == {i: records.look(i) for i in ids}


def test_a_full_write_cache_is_placed_not_checkpointed() -> None:
    """Once the write cache holds ``dbStorage_writeCacheMaxSizeMb``, the checkpoint thread
    places it in the entry logs and does not checkpoint: the mark stays (the journal still
    holds every entry), the locations wait in memory for the next checkpoint's index
    write, reads find the entries in the logs; a power cut then loses nothing, and a
    checkpoint after it writes the index."""
    fs = MemFS()
    values: dict[str, Any] = dict(bookie_id="b:1", journal_directory="/bk/journal", ledger_directories=["/bk/led"],
                                  journal_pre_alloc_size_mb=1, flush_interval=3_600_000, write_cache_max_size_mb=1)
    b = Bookie(BookieConfig(**values), fs=fs)
    b.start()
    try:
        mark, checkpoints = highest_mark(fs, ["/bk/led"]), b.checkpoints  # the start's checkpoint
        sent = {e: entry(1, e, bytes([e]) * (64 << 10)) for e in range(48)}  # 3 MiB, in two fills of 1.5 MiB
        for fill, placed in ((range(24), 1), (range(24, 48), 2)):  # each fill is placed: the cache fills again
            for fut in [b.add_entry(1, e, KEY, sent[e]) for e in fill]:
                ok(fut)
            deadline = time.monotonic() + 20
            while (b.placements < placed or b.storage.cached_bytes() >= 1 << 20) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert b.placements >= placed and b.storage.cached_bytes() < 1 << 20, (b.placements, b.storage.cached_bytes())
        assert b.checkpoints == checkpoints and highest_mark(fs, ["/bk/led"]) == mark, "placed, not checkpointed"
        assert b.storage.pending_index_entries() >= 32  # placed: located in the logs, not indexed yet
        assert all(b.read_entry(1, e) == data for e, data in sent.items())
    except BaseException:
        b.shutdown()  # no bookie threads left behind for later tests
        raise
    fs.arm_crash(1)  # the power goes: the shutdown's checkpoint cannot happen
    with contextlib.suppress(Exception):
        b.shutdown()
    fs.crash()
    b = Bookie(BookieConfig(**values), fs=fs)
    b.start()  # replays the journal from the mark
    try:
        assert b.replay_report is not None and b.replay_report.entries == len(sent)
        assert all(b.read_entry(1, e) == data for e, data in sent.items())
        b.checkpoint()
        assert b.storage.pending_index_entries() == 0 and b.storage.cached_bytes() == 0
        assert all(b.read_entry(1, e) == data for e, data in sent.items())
    finally:
        b.shutdown()


def test_a_long_journal_is_replayed_a_write_cache_at_a_time() -> None:
    """A restart replays what the journal holds past the mark into ledger storage; the
    storage is flushed each time its write cache holds ``dbStorage_writeCacheMaxSizeMb``,
    so a long journal never sits in memory whole - and every acknowledged entry is there."""
    fs = MemFS()
    values: dict[str, Any] = dict(bookie_id="b:1", journal_directory="/bk/journal", ledger_directories=["/bk/led"],
                                  journal_pre_alloc_size_mb=1, flush_interval=3_600_000)
    b = Bookie(BookieConfig(**values), fs=fs)  # a 64 MiB write cache: no checkpoint while these are added
    b.start()
    mark = highest_mark(fs, ["/bk/led"])  # the start's checkpoint
    sent = {e: entry(1, e, bytes([e]) * (64 << 10)) for e in range(48)}  # 3 MiB
    for fut in [b.add_entry(1, e, KEY, data) for e, data in sent.items()]:
        ok(fut)
    assert b.storage.cached_bytes() >= 3 << 20 and highest_mark(fs, ["/bk/led"]) == mark  # all in the journal
    fs.arm_crash(1)  # the power goes: the shutdown's checkpoint cannot happen
    with contextlib.suppress(Exception):
        b.shutdown()
    fs.crash()
    b = Bookie(BookieConfig(**values, write_cache_max_size_mb=1), fs=fs)
    b.start()
    try:
        assert b.replay_report is not None and b.replay_report.entries == len(sent)
        assert b.replay_flushes >= 2, "the replay flushed the storage each time the cache held 1 MiB"
        assert all(b.read_entry(1, e) == data for e, data in sent.items())
    finally:
        b.shutdown()
