"""Garbage collection and compaction (``bookie.gc``, ``bookie.storage._usage`` and
``_reclaim``), in this process: the pure policy with a fake clock, the scan of ledger
ranges, entry-log usage, a collector over a storage on MemFS (and the real disk) with a
fake metadata store - deleted and over-replicated ledgers, every hazard of the scan,
minor and major compaction, its time budget, pace, suspension and damaged logs, reads
and adds while it runs - then the same through a ``Bookie`` and the ADMIN wire op.

Power cuts during garbage collection are in ``tests/crash/test_gc_crash.py``.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie import Bookie, BookieConfig
from bookie.fs import FileSystem, read_all
from bookie.fs.mem import MemFS
from bookie.gc import GarbageCollector, RateLimiter
from bookie.gc._compactor import compact_log
from bookie.gc._policy import CompactionRule, Kind, candidates, compaction_rule, due_compaction, suspension
from bookie.gc._scan import is_overreplicated, unlisted
from bookie.storage import EntryLogInfo, LedgerStorage
from bookie.storage._format import LOG_HEADER_SIZE, RECORD_HEADER
from bookie.storage._usage import LogUsage, decode_usage, encode_usage
from support.bookie import client_of, config, in_process, run
from walkit.errors import (
    BookieShutdownError,
    CorruptionError,
    FormatError,
    InvalidArgumentError,
    MetadataUnavailableError,
    NoSuchLedgerError,
    ProtocolError,
)
from walkit.metadata import LedgerMetadata
from walkit.metadata._paths import LEGACY_LIMIT, MAX_LEDGER_ID, Layout, iter_ledger_ranges, ledger_path
from walkit.protocol import ENTRY_HEADER, AdminRequest, encode_entry

BOOKIE = "bookie-1:3181"
OTHERS = ("bookie-2:3181", "bookie-3:3181", "bookie-4:3181")
ROOT = "/ledgers"
PAYLOAD = 100
REC = RECORD_HEADER.size + PAYLOAD  # one record of an entry of PAYLOAD bytes
LOG_LIMIT = LOG_HEADER_SIZE + 10 * REC  # an entry log of exactly ten such records
ROLL = 999  # the ledger of the record that rolls the last planned log (sealing it)

Plan = list[list[int]]  # per entry log, the ledger of each of its records, in order
Data = dict[tuple[int, int], bytes]


def payload(ledger: int, entry: int) -> bytes:
    return (f"L{ledger}E{entry}|".encode() * PAYLOAD)[:PAYLOAD]


class FakeClock:
    """A clock that moves only when told to, or by the sleeps it is asked for."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


# --- pure policy ---------------------------------------------------------------------------
def test_rate_limiter_spaces_acquires_evenly() -> None:
    clock = FakeClock(0.0)
    limiter = RateLimiter(10, clock=clock, sleep=clock.sleep)
    for _ in range(10):
        limiter.acquire()
    assert clock.sleeps == pytest.approx([0.1] * 9)  # the first is free, then one slot each
    limiter.acquire(5)  # 5 units book half a second
    limiter.acquire()
    assert clock.sleeps[-2:] == pytest.approx([0.1, 0.5])
    clock.now += 60.0  # idle for a minute: no credit saved up, so no burst afterwards
    limiter.acquire()
    limiter.acquire()
    assert clock.sleeps[-1] == pytest.approx(0.1) and len(clock.sleeps) == 12
    assert sum(clock.sleeps) == pytest.approx(0.9 + 0.1 + 0.5 + 0.1)
    for bad in (0, -1.0):
        with pytest.raises(InvalidArgumentError):
            RateLimiter(bad)


def _rules(minor: tuple[float, float] = (0.2, 3600),
           major: tuple[float, float] = (0.8, 86400)) -> dict[Kind, CompactionRule]:
    return {"minor": CompactionRule("minor", *minor, 0), "major": CompactionRule("major", *major, 0)}


def test_due_compaction() -> None:
    last: dict[Kind, float] = {"minor": 0.0, "major": 0.0}
    assert due_compaction(3599, last, _rules()) is None
    assert due_compaction(3600, last, _rules()) == "minor"
    assert due_compaction(86400, last, _rules()) == "major"  # both due: major first
    assert due_compaction(86400, {"minor": 86000.0, "major": 0.0}, _rules()) == "major"
    assert due_compaction(10**9, last, _rules(minor=(0.2, 0), major=(0.8, -1))) is None  # interval <= 0: off
    assert due_compaction(10**9, last, _rules(minor=(0.0, 60), major=(-1.0, 60))) is None  # threshold <= 0: off
    assert due_compaction(10**9, last, _rules(major=(0.0, 60))) == "minor"


def test_compaction_rule_follows_the_config() -> None:
    c = BookieConfig(minor_compaction_threshold=0.1, minor_compaction_interval=60,
                     minor_compaction_max_time_millis=1500, major_compaction_threshold=0.7,
                     major_compaction_interval=600, major_compaction_max_time_millis=0)
    assert compaction_rule(c, "minor") == CompactionRule("minor", 0.1, 60, 1.5)
    assert compaction_rule(c, "major") == CompactionRule("major", 0.7, 600, 0.0)


def _info(log_id: int, live: int, total: int = 1000, ledgers: int = 1, dir: int = 0) -> EntryLogInfo:
    return EntryLogInfo(dir, log_id, total, live, ledgers, False, LOG_HEADER_SIZE + total)


def test_candidates_emptiest_first() -> None:
    logs = [_info(1, 500), _info(2, 100), _info(3, 0, ledgers=0), _info(4, 799), _info(5, 800), _info(6, 100, dir=1),
            _info(7, 50, total=2000), _info(8, 1000)]
    assert [(i.dir, i.log_id) for i in candidates(logs, 0.8)] == [(0, 7), (0, 2), (1, 6), (0, 1), (0, 4)]
    assert [i.log_id for i in candidates(logs, 0.2)] == [7, 2, 6]
    assert candidates(logs, 0.0) == [] and candidates([], 0.8) == []


def test_suspension() -> None:
    c = BookieConfig()  # warn 0.90, threshold 0.95, isForceGCAllowWhenNoSpace false
    assert suspension("major", 0.89, c, False) is None
    reason = suspension("major", 0.90, c, False)
    assert reason is not None and "major" in reason and "90" in reason
    assert suspension("minor", 0.94, c, False) is None  # minor keeps going up to the threshold
    assert suspension("minor", 0.95, c, False) is not None
    assert suspension("minor", 0.99, c, True) is not None  # forced, but not allowed on a full disk
    allowed = BookieConfig(is_force_gc_allow_when_no_space=True)
    assert suspension("major", 0.99, allowed, True) is None and suspension("minor", 0.99, allowed, True) is None
    assert suspension("major", 0.99, allowed, False) is not None  # only a forced pass may
    lax = BookieConfig(disk_usage_warn_threshold=0.99)  # a warning above the threshold: the threshold rules
    assert suspension("major", 0.95, lax, False) is not None and suspension("major", 0.94, lax, False) is None


# --- scan: unlisted ids, ledger ranges -----------------------------------------------------------
def test_unlisted_against_hand_made_ranges() -> None:
    ranges = [(10, 19, [11, 15]), (30, 39, [30, 39]), (40, 49, [])]
    local = [1, 9, 10, 11, 15, 18, 20, 25, 29, 30, 35, 39, 40, 45, 50, 1000]
    # before the first range, ids of a range it does not list, gaps between ranges, an
    # empty range, after the last one
    assert list(unlisted(local, ranges)) == [1, 9, 10, 18, 20, 25, 29, 35, 40, 45, 50, 1000]
    assert list(unlisted(local, [])) == local
    assert list(unlisted([], ranges)) == []
    assert list(unlisted([11, 15, 30, 39], ranges)) == []


def _tree(ids: set[int], layout: Layout, noise: bool = True) -> Callable[[str], list[str]]:
    """``children(path)`` of a store holding the nodes of ``ids`` (and foreign nodes)."""
    paths = [ledger_path(ROOT, i, layout) for i in ids]

    def children(path: str) -> list[str]:
        prefix = path + "/"
        names = {p[len(prefix):].split("/")[0] for p in paths if p.startswith(prefix)}
        if noise and path == ROOT:
            names |= {"available", "idgen", "LAYOUT", "INSTANCEID", "12345"}
        return sorted(names)

    return children


def _check_ranges(ids: set[int], layout: Layout) -> list[tuple[int, int, list[int]]]:
    ranges = list(iter_ledger_ranges(ROOT, _tree(ids, layout), layout))
    seen: list[int] = []
    for n, (first, last, listed) in enumerate(ranges):
        assert 0 <= first <= last <= MAX_LEDGER_ID
        assert listed == sorted(listed) and all(first <= i <= last for i in listed)
        if n:
            assert ranges[n - 1][1] < first, "ranges must ascend and be disjoint"
        seen += listed
    assert seen == sorted(ids), "every id in exactly one range"
    return ranges


def test_ledger_ranges_of_both_id_layouts() -> None:
    ids = {1, 2, 9999, 10001, LEGACY_LIMIT - 1, LEGACY_LIMIT, LEGACY_LIMIT + 3, 10**18 + 7}
    ranges = _check_ranges(ids, "hierarchical")
    assert [(a, b) for a, b, _ in ranges] == [
        (0, 9999), (10000, 19999),
        (2147480000, LEGACY_LIMIT - 1),  # the last legacy leaf stops below Integer.MAX_VALUE
        (LEGACY_LIMIT, 2147489999),  # the first long leaf starts at it
        (10**18, 10**18 + 9999),
    ]
    assert [i for _, _, listed in ranges for i in listed] == sorted(ids)
    assert _check_ranges(ids, "flat") == [(0, MAX_LEDGER_ID, sorted(ids))]
    assert list(iter_ledger_ranges(ROOT, _tree(set(), "hierarchical"))) == []


_ids = st.sets(st.one_of(st.integers(0, 40_000), st.integers(LEGACY_LIMIT - 30_000, LEGACY_LIMIT + 30_000),
                         st.integers(0, MAX_LEDGER_ID)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(ids=_ids, local=_ids, layout=st.sampled_from(["hierarchical", "flat"]))
def test_ranges_and_unlisted_property(ids: set[int], local: set[int], layout: Layout) -> None:
    ranges = _check_ranges(ids, layout)
    bookie = sorted(local | set(list(ids)[:5]))
    assert list(unlisted(bookie, ranges)) == sorted(set(bookie) - ids)


def _meta(ledger_id: int, ensemble: tuple[str, ...] = (BOOKIE, OTHERS[0], OTHERS[1])) -> LedgerMetadata:
    return LedgerMetadata.create(ledger_id, ensemble, write_quorum=2, ack_quorum=2, password=b"pw", ctime=1)


@pytest.fixture(scope="module")
def metas() -> dict[str, LedgerMetadata]:
    """Ledger 0's metadata in every shape the over-replication check tells apart (built
    once: creating one hashes a password)."""
    opened = _meta(0)
    moved = opened.with_ensemble(0, (OTHERS[2], OTHERS[0], OTHERS[1]))  # replaces fragment 0: BOOKIE is gone
    later = opened.with_ensemble(5, (OTHERS[2], OTHERS[0], OTHERS[1]))  # BOOKIE still holds entries 0..4
    return {"open": opened, "closed": opened.closed(9, 100), "moved_open": moved, "moved": moved.closed(9, 100),
            "later": later.closed(9, 100)}


def _as(meta: LedgerMetadata, ledger_id: int) -> LedgerMetadata:
    return LedgerMetadata(**{**meta.__dict__, "ledger_id": ledger_id})


def test_is_overreplicated(metas: dict[str, LedgerMetadata]) -> None:
    assert is_overreplicated(metas["moved"], BOOKIE)
    assert not is_overreplicated(metas["moved_open"], BOOKIE)  # open: its writer may still change it
    assert not is_overreplicated(metas["later"], BOOKIE)  # named by one fragment
    assert not is_overreplicated(metas["closed"], BOOKIE) and not is_overreplicated(metas["open"], BOOKIE)
    assert is_overreplicated(metas["closed"], "stranger:1")


# --- entry-log usage -------------------------------------------------------------------------
def test_usage_round_trip_and_refusals() -> None:
    usage = LogUsage(7)
    for ledger, size in ((3, 100), (1, 50), (3, 24), (2**63 - 1, 1)):
        usage.add(ledger, size)
    raw = encode_usage(usage)
    back = decode_usage(raw, 7, "x.use")
    assert back == usage and back.live == back.total == 175
    assert decode_usage(encode_usage(LogUsage(9)), 9, "y.use") == LogUsage(9)
    refused: list[tuple[bytes, type[Exception] | tuple[type[Exception], ...]]] = [
        (raw[:10], CorruptionError), (raw[:-1], CorruptionError), (raw + b"\0", CorruptionError),
        (b"X" + raw[1:], FormatError),
        (raw[:8] + b"\x09" + raw[9:], CorruptionError),  # the CRC covers the version (intact: test_format_versions)
    ]
    for at in range(len(raw)):  # any flipped byte is caught (CRC, magic, version or count)
        refused.append((raw[:at] + bytes([raw[at] ^ 0x10]) + raw[at + 1:], (CorruptionError, FormatError)))
    for bad, error in refused:
        with pytest.raises(error):
            decode_usage(bad, 7, "x.use")
    with pytest.raises(CorruptionError, match="another log"):
        decode_usage(raw, 8, "x.use")


def test_usage_drop_and_keep_only() -> None:
    usage = LogUsage(1, {1: 100, 2: 300}, 500, 400)  # 100 bytes of a ledger deleted before
    assert usage.live_fraction == 0.8
    usage.drop(2)
    usage.drop(5)
    assert (usage.ledgers, usage.live, usage.total) == ({1: 100}, 100, 500)
    usage.keep_only({})
    assert (usage.ledgers, usage.live, usage.live_fraction) == ({}, 0, 0.0)
    assert LogUsage(2).live_fraction == 0.0


# --- storage, collector and fake metadata --------------------------------------------------------
class FakeMetadata:
    """The metadata side of the collector (:class:`bookie.gc.GcMetadata`): ledger ids to
    metadata, laid out as the hierarchical store would, with hooks for every hazard."""

    def __init__(self, ledgers: dict[int, LedgerMetadata]) -> None:
        self.ledgers = dict(ledgers)
        self.unlisted_but_existing: set[int] = set()  # a listing that raced a create
        self.fail_after_ranges: int | None = None
        self.fail_exists: set[int] = set()
        self.fail_read = False
        self.on_range: Callable[[int], None] | None = None
        self.calls: list[str] = []

    def sync(self) -> None:
        self.calls.append("sync")

    def ledger_ranges(self, before_call: Callable[[], object] | None = None) -> Iterator[tuple[int, int, list[int]]]:
        self.calls.append("ledger_ranges")
        tree = _tree(set(self.ledgers) - self.unlisted_but_existing, "hierarchical", noise=False)

        def children(path: str) -> list[str]:
            if before_call is not None:
                before_call()
            self.calls.append(f"list {path}")
            return tree(path)

        for n, item in enumerate(iter_ledger_ranges(ROOT, children)):
            if self.fail_after_ranges is not None and n >= self.fail_after_ranges:
                raise MetadataUnavailableError("store unreachable", path=ROOT)
            yield item
            if self.on_range is not None:
                self.on_range(n)

    def exists(self, ledger_id: int) -> bool:
        self.calls.append(f"exists {ledger_id}")
        if ledger_id in self.fail_exists:
            raise MetadataUnavailableError("store unreachable", ledger=ledger_id)
        return ledger_id in self.ledgers

    def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        self.calls.append(f"read {ledger_id}")
        if self.fail_read:
            raise MetadataUnavailableError("store unreachable", ledger=ledger_id)
        if ledger_id not in self.ledgers:
            raise NoSuchLedgerError("no such ledger", ledger=ledger_id)
        return self.ledgers[ledger_id], 0


def _real_fs() -> FileSystem:
    real = pytest.importorskip("bookie.fs.real")
    fs: FileSystem = real.RealFS()
    return fs


@dataclass
class Env:
    fs: FileSystem
    root: str
    usage: float = 0.1  # what disk_usage() answers
    opened: list[LedgerStorage] = field(default_factory=list)
    collectors: list[GarbageCollector] = field(default_factory=list)

    @property
    def dirs(self) -> list[str]:
        return [f"{self.root}/ledgers0"]

    @property
    def logs_dir(self) -> str:
        return f"{self.dirs[0]}/current/logs"

    def log_path(self, log_id: int, kind: str = "log") -> str:
        return f"{self.logs_dir}/{log_id:016x}.{kind}"

    def index_path(self, ledger: int) -> str:
        return f"{self.dirs[0]}/current/index/{ledger & 0xff:02x}/{ledger:016x}.idx"

    def files(self) -> list[str]:
        return self.fs.listdir(self.logs_dir)

    def disk_bytes(self) -> int:
        return sum(len(read_all(self.fs, f"{self.logs_dir}/{n}")) for n in self.files())

    def storage(self, limit: int = LOG_LIMIT) -> LedgerStorage:
        s = LedgerStorage(self.fs, self.dirs, entry_log_size_limit=limit)
        s.open()
        self.opened.append(s)
        return s

    def config(self, **overrides: Any) -> BookieConfig:
        values: dict[str, Any] = dict(ledger_directories=self.dirs, journal_directory=f"{self.root}/journal",
                                      gc_metadata_op_rate_limit=10**9, compaction_rate_by_entries=10**9,
                                      compaction_rate_by_bytes=10**12)
        values.update(overrides)
        return BookieConfig(**values)

    def collector(self, s: LedgerStorage, metadata: FakeMetadata | None = None, *,
                  clock: Callable[[], float] = time.monotonic, free_space: Callable[[str], int | None] = lambda d: None,
                  **overrides: Any) -> GarbageCollector:
        gc = GarbageCollector(s, self.config(**overrides), BOOKIE, metadata=metadata, delete_ledger=s.delete_ledger,
                              disk_usage=lambda d: self.usage, free_space=free_space, clock=clock)
        self.collectors.append(gc)
        return gc


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env(MemFS(), "/b")
    yield e
    _cleanup(e)


@pytest.fixture(params=["mem", "real"])
def any_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    e = Env(MemFS(), "/b") if request.param == "mem" else Env(_real_fs(), str(tmp_path))
    yield e
    _cleanup(e)


def _cleanup(e: Env) -> None:
    for gc in e.collectors:
        gc.stop()
    for s in e.opened:
        try:
            s.close()
        except Exception:  # noqa: BLE001 - a test that failed its storage on purpose
            pass


def fill(s: LedgerStorage, plan: Plan, start: dict[int, int] | None = None) -> Data:
    """Add one entry per record of ``plan`` (entry ids counted per ledger), then one of
    ROLL that rolls the last planned log, and flush: every planned log is sealed. Each
    planned log's entries are flushed before the next log's are added (a flush places
    the entries it finds sorted by ledger: within one log, in the plan's order by ledger)."""
    next_entry = dict(start or {})
    data: Data = {}
    for ledgers in plan + [[ROLL]]:
        for ledger in ledgers:
            entry = next_entry.get(ledger, 0)
            next_entry[ledger] = entry + 1
            s.add_entry(ledger, entry, payload(ledger, entry))
            data[(ledger, entry)] = payload(ledger, entry)
        s.flush()
    return data


def check(s: LedgerStorage, data: Data, deleted: frozenset[int] | set[int] = frozenset()) -> None:
    for (ledger, entry), value in data.items():
        if ledger in deleted:
            assert not s.has_ledger(ledger)
        else:
            assert s.get_entry(ledger, entry) == value, f"ledger={ledger} entry={entry}"


def logs_of(s: LedgerStorage) -> dict[int, EntryLogInfo]:
    return {i.log_id: i for i in s.entry_logs()}


def last_pass(gc: GarbageCollector) -> dict[str, Any]:
    last = gc.status()["last_pass"]
    assert last is not None
    result: dict[str, Any] = last
    return result


def flip(fs: FileSystem, path: str, offset: int) -> None:
    f = fs.open(path)
    try:
        byte = f.pread(1, offset)
        f.pwrite(bytes([byte[0] ^ 0x40]), offset)
        f.sync()
    finally:
        f.close()


# --- usage at open ---------------------------------------------------------------------------
def test_usage_files_of_sealed_logs(env: Env) -> None:
    s = env.storage()
    fill(s, [[1] * 10, [1, 2] * 5, [2] * 10])
    assert {i: (u.total_bytes, u.live_bytes, u.ledgers) for i, u in logs_of(s).items()} == {
        1: (10 * REC, 10 * REC, 1), 2: (10 * REC, 10 * REC, 2), 3: (10 * REC, 10 * REC, 1)}
    assert all(env.fs.exists(env.log_path(i, "use")) for i in (1, 2, 3))
    assert not env.fs.exists(env.log_path(4, "use"))  # the active log is not sealed
    s.close()  # ... until the storage closes
    assert env.fs.exists(env.log_path(4, "use"))


@pytest.mark.parametrize("damage", ["missing", "flipped", "truncated", "foreign"])
def test_missing_or_damaged_usage_file_is_rebuilt(env: Env, damage: str) -> None:
    s = env.storage()
    fill(s, [[1, 2] * 5, [1, 3] * 5])
    s.delete_ledger(3)
    before = {i: u for i, u in logs_of(s).items() if i in (1, 2)}
    s.close()
    use = env.log_path(2, "use")
    good = read_all(env.fs, use)
    if damage == "missing":
        env.fs.remove(use)
    elif damage == "flipped":
        flip(env.fs, use, len(good) - 9)
    else:
        f = env.fs.open(use)
        if damage == "truncated":
            f.truncate(12)
        else:  # log 1's usage, as long as log 2's
            f.pwrite(read_all(env.fs, env.log_path(1, "use")), 0)
        f.close()
    s = env.storage()
    assert {i: u for i, u in logs_of(s).items() if i in (1, 2)} == before  # rebuilt, ledger 3 dropped again
    assert read_all(env.fs, use) == good
    assert logs_of(s)[2].live_bytes == 5 * REC and logs_of(s)[2].ledgers == 1


def test_leftovers_removed_at_open(env: Env) -> None:
    s = env.storage()
    fill(s, [[1] * 10])
    s.close()
    names = {env.log_path(1, "use.tmp"), env.log_path(40, "use"), env.log_path(41, "compact"),
             env.log_path(42, "use.tmp")}
    for path in names:
        env.fs.open(path, create=True).close()
    s = env.storage()
    assert not any(env.fs.exists(p) for p in names)
    assert set(env.files()) == {f"{i:016x}.{k}" for i in (1, 2) for k in ("log", "use")}
    assert logs_of(s)[1].live_bytes == 10 * REC and not logs_of(s)[1].compacting


def test_deleted_ledger_leaves_usage_also_across_restart(env: Env) -> None:
    s = env.storage()
    fill(s, [[1, 2] * 5, [2] * 10])
    assert logs_of(s)[1].live_bytes == 10 * REC
    s.delete_ledger(2)
    after = {i: (u.live_bytes, u.ledgers, u.total_bytes) for i, u in logs_of(s).items()}
    assert after == {1: (5 * REC, 1, 10 * REC), 2: (0, 0, 10 * REC)}
    s.close()
    s = env.storage()  # the usage files still name ledger 2: dropped again at open
    assert {i: (u.live_bytes, u.ledgers, u.total_bytes) for i, u in logs_of(s).items()}.items() >= after.items()


# --- deleted ledgers -------------------------------------------------------------------------
def _md(*ids: int) -> FakeMetadata:
    template = _meta(0)
    return FakeMetadata({i: _as(template, i) for i in ids})


def test_deleted_ledgers_leave_the_bookie(any_env: Env) -> None:
    env = any_env
    s = env.storage()
    data = fill(s, [[1] * 10, [2] * 10, [4, 2] * 5, [1, 3] * 5])
    md = _md(1, 3, ROLL)
    gc = env.collector(s, md)
    stats = gc.run_pass(1, forced=True)
    assert (stats.ledgers_removed, stats.entry_logs_deleted, stats.entry_logs_compacted) == (2, 2, 0)
    assert stats.bytes_reclaimed == 2 * LOG_LIMIT
    for ledger in (2, 4):
        assert not s.has_ledger(ledger) and not env.fs.exists(env.index_path(ledger))
        with pytest.raises(NoSuchLedgerError):
            s.get_entry(ledger, 0)
    for log_id in (2, 3):
        assert not any(env.fs.exists(env.log_path(log_id, k)) for k in ("log", "use", "compact"))
    assert sorted(logs_of(s)) == [1, 4] and s.ledgers() == [1, 3, ROLL]
    check(s, data, {2, 4})
    assert gc.run_pass(2, forced=True).ledgers_removed == 0  # nothing more to do
    s.close()
    s = env.storage()
    check(s, data, {2, 4})
    assert sorted(logs_of(s)) == [1, 4, 5]


def _hazard_setup(env: Env) -> tuple[LedgerStorage, Data, FakeMetadata]:
    """Ledgers in three leaf directories of the store (ranges [0, 9999], [10000, 19999]
    and beyond the last one); 2, 10002 and 20001 are deleted from the store."""
    s = env.storage()
    ledgers = [1, 2, 3, 10001, 10002, 20001]
    data = fill(s, [ledgers * 2])
    return s, data, _md(1, 3, 10001, ROLL)


def test_sync_comes_before_the_listing(env: Env) -> None:
    s, data, md = _hazard_setup(env)
    stats = env.collector(s, md).run_pass(1)
    assert md.calls[0] == "sync" and md.calls[1] == "ledger_ranges"
    assert [c for c in md.calls if c.startswith("exists")] == ["exists 2", "exists 10002", "exists 20001"]
    assert stats.ledgers_removed == 3 and s.ledgers() == [1, 3, ROLL, 10001]
    check(s, data, {2, 10002, 20001})


def test_ledger_created_after_the_scan_started_is_kept(env: Env) -> None:
    s, data, md = _hazard_setup(env)

    def create_on_bookie(n: int) -> None:  # a writer's first add lands while the store is listed
        if n == 0:
            s.add_entry(5, 0, payload(5, 0))
            s.add_entry(15000, 0, payload(15000, 0))

    md.on_range = create_on_bookie
    gc = env.collector(s, md)
    assert gc.run_pass(1).ledgers_removed == 3
    assert s.has_ledger(5) and s.get_entry(5, 0) == payload(5, 0) and s.get_entry(15000, 0) == payload(15000, 0)
    assert "exists 5" not in md.calls and "exists 15000" not in md.calls
    check(s, data, {2, 10002, 20001})


def test_unlisted_ledger_that_exists_is_kept(env: Env) -> None:
    s, data, md = _hazard_setup(env)
    md.unlisted_but_existing = {3, 10001}  # created between the listing of its directory and the check
    gc = env.collector(s, md)
    assert gc.run_pass(1).ledgers_removed == 3
    assert {"exists 3", "exists 10001"} <= set(md.calls)
    check(s, data, {2, 10002, 20001})


def test_store_error_during_the_listing_keeps_undecided_ledgers(env: Env) -> None:
    s, data, md = _hazard_setup(env)
    md.fail_after_ranges = 1  # the first directory is compared, then the store goes away
    gc = env.collector(s, md)
    assert gc.run_pass(1).ledgers_removed == 1
    assert not s.has_ledger(2) and s.has_ledger(10002) and s.has_ledger(20001)
    cut = last_pass(gc)["cut_short"]
    assert len(cut) == 1 and "undecided ledgers kept" in cut[0] and last_pass(gc)["error"] is None
    check(s, data, {2})
    md.fail_after_ranges = None
    assert gc.run_pass(2).ledgers_removed == 2 and last_pass(gc)["cut_short"] == []
    check(s, data, {2, 10002, 20001})


def test_store_error_on_exists_keeps_undecided_ledgers(env: Env) -> None:
    s, data, md = _hazard_setup(env)
    md.fail_exists = {10002}
    gc = env.collector(s, md)
    assert gc.run_pass(1).ledgers_removed == 1
    assert s.has_ledger(10002) and s.has_ledger(20001) and "exists 20001" not in md.calls
    assert "undecided ledgers kept" in last_pass(gc)["cut_short"][0]
    check(s, data, {2})


def test_no_metadata_store_removes_no_ledger(env: Env) -> None:
    s = env.storage()
    data = fill(s, [[1, 2] * 5])
    gc = env.collector(s, None)
    assert gc.run_pass(1, forced=True).ledgers_removed == 0 and gc.status()["metadata"] is False
    check(s, data)


# --- over-replicated ledgers -----------------------------------------------------------------------
def _over_setup(env: Env, metas: dict[str, LedgerMetadata]) -> tuple[LedgerStorage, Data, FakeMetadata]:
    s = env.storage()
    data = fill(s, [[1, 2, 3, 4, 5] * 2])
    md = FakeMetadata({1: _as(metas["moved"], 1), 2: _as(metas["moved_open"], 2), 3: _as(metas["later"], 3),
                       4: _as(metas["closed"], 4), 5: _as(metas["moved"], 5), ROLL: _as(metas["open"], ROLL)})
    return s, data, md


def test_overreplicated_ledger_removed_once_found_so_for_the_wait(env: Env, metas: dict[str, LedgerMetadata]) -> None:
    s, data, md = _over_setup(env, metas)
    clock = FakeClock()
    gc = env.collector(s, md, clock=clock, gc_overreplicated_ledger_wait_time=60_000)
    assert gc.run_pass(1, forced=True).overreplicated_removed == 0  # the first check only suspects
    clock.now += 1
    assert gc.run_pass(2, forced=True).overreplicated_removed == 0  # forced again at once: too soon
    check(s, data)
    md.ledgers[5] = _as(metas["closed"], 5)  # re-replicated back here meanwhile: no longer a suspect
    clock.now += 60
    stats = gc.run_pass(3, forced=True)
    assert stats.overreplicated_removed == 1 and not s.has_ledger(1)
    assert s.ledgers() == [2, 3, 4, 5, ROLL]  # open, named by a fragment, ordinary, cleared
    md.ledgers[5] = _as(metas["moved"], 5)
    assert gc.run_pass(4, forced=True).overreplicated_removed == 0  # a suspect anew: its wait starts again
    clock.now += 59
    assert gc.run_pass(5, forced=True).overreplicated_removed == 0
    clock.now += 1
    assert gc.run_pass(6, forced=True).overreplicated_removed == 1
    assert s.ledgers() == [2, 3, 4, ROLL] and gc.status()["totals"]["overreplicated_removed"] == 2
    check(s, data, {1, 5})


def test_overreplication_check_waits_its_interval(env: Env, metas: dict[str, LedgerMetadata]) -> None:
    s, data, md = _over_setup(env, metas)
    clock = FakeClock()
    gc = env.collector(s, md, clock=clock, gc_overreplicated_ledger_wait_time=60_000)

    def reads() -> int:
        return sum(c.startswith("read") for c in md.calls)

    gc.run_pass(1)  # 0 s since the collector started: no check
    assert reads() == 0
    clock.now += 61
    gc.run_pass(2)  # checked: suspects
    assert reads() == 6 and s.has_ledger(1)
    clock.now += 30
    gc.run_pass(3)  # 30 s since the check: none
    assert reads() == 6 and s.has_ledger(1)
    clock.now += 31
    assert gc.run_pass(4).overreplicated_removed == 2
    check(s, data, {1, 5})


def test_store_error_during_overreplication_check_keeps_suspects(env: Env, metas: dict[str, LedgerMetadata]) -> None:
    s, data, md = _over_setup(env, metas)
    clock = FakeClock()
    gc = env.collector(s, md, clock=clock, gc_overreplicated_ledger_wait_time=60_000)
    gc.run_pass(1, forced=True)
    clock.now += 61
    md.fail_read = True
    assert gc.run_pass(2, forced=True).overreplicated_removed == 0
    assert any("over-replicated" in c and "undecided ledgers kept" in c for c in last_pass(gc)["cut_short"])
    md.fail_read = False
    assert gc.run_pass(3, forced=True).overreplicated_removed == 2  # still suspects since pass 1
    check(s, data, {1, 5})


def test_metadata_unavailable_ends_the_metadata_steps_of_the_pass(env: Env, metas: dict[str, LedgerMetadata]) -> None:
    """The store gives up on the first listing: the over-replication check (due) is not
    even tried - one retry deadline per pass, not one per step - nothing is removed,
    one reason is given and the pass counted; the next pass, not forced, runs both
    steps (the check stayed due) and counts nothing more."""
    s, data, md = _over_setup(env, metas)
    md.ledgers = {lid: m for lid, m in md.ledgers.items() if lid != 4}  # deleted: a candidate for step 1
    clock = FakeClock()
    gc = env.collector(s, md, clock=clock, gc_overreplicated_ledger_wait_time=60_000)
    clock.now += 61
    md.fail_after_ranges = 0
    stats = gc.run_pass(1)
    assert (stats.ledgers_removed, stats.overreplicated_removed) == (0, 0)
    assert not any(c.startswith(("read", "exists")) for c in md.calls), md.calls
    cut = last_pass(gc)["cut_short"]
    assert len(cut) == 1 and cut[0].startswith("metadata unavailable: deleted ledgers") and "next pass" in cut[0]
    assert last_pass(gc)["metadata_unavailable"] is True and gc.status()["metadata_unavailable_passes"] == 1
    check(s, data)
    md.fail_after_ranges, md.calls = None, []
    stats = gc.run_pass(2)
    assert stats.ledgers_removed == 1 and sum(c.startswith("read") for c in md.calls) == 5
    assert last_pass(gc)["metadata_unavailable"] is False and last_pass(gc)["cut_short"] == []
    assert gc.status()["metadata_unavailable_passes"] == 1
    check(s, data, {4})


# --- compaction ----------------------------------------------------------------------------------
def test_minor_then_major_compaction(any_env: Env) -> None:
    env = any_env
    s = env.storage()
    data = fill(s, [[1] + [2] * 9, [1] * 5 + [2] * 5, [1] * 9 + [2], [2] * 10, [3] * 10])
    s.delete_ledger(2)
    fractions = {i: round(u.live_fraction, 2) for i, u in logs_of(s).items()}
    assert fractions == {1: 0.1, 2: 0.5, 3: 0.9, 4: 0.0, 5: 1.0}
    disk = env.disk_bytes()
    gc = env.collector(s)
    stats = gc.run_pass(1, forced=True, compact="minor")
    assert (stats.entry_logs_deleted, stats.entry_logs_compacted, stats.entries_copied) == (1, 1, 1)
    assert (stats.bytes_copied, stats.bytes_reclaimed) == (REC, 2 * LOG_LIMIT)
    assert sorted(logs_of(s)) == [2, 3, 5]
    assert not any(env.fs.exists(env.log_path(i, k)) for i in (1, 4) for k in ("log", "use", "compact"))
    check(s, data, {2})
    stats = gc.run_pass(2, forced=True, compact="major")
    assert (stats.entry_logs_deleted, stats.entry_logs_compacted, stats.entries_copied) == (0, 1, 5)
    assert stats.bytes_reclaimed == LOG_LIMIT
    assert sorted(logs_of(s)) == [3, 5]
    status = gc.status()
    assert status["totals"] == {"ledgers_removed": 0, "overreplicated_removed": 0, "entry_logs_deleted": 1,
                                "entry_logs_compacted": 2, "entries_copied": 6, "bytes_copied": 6 * REC,
                                "bytes_reclaimed": 3 * LOG_LIMIT}
    assert status["last_pass"]["entry_logs_compacted"] == 1 and status["compaction"] == "idle"
    assert status["entry_logs"] == {"count": 2, "total_bytes": 20 * REC, "live_bytes": 19 * REC,
                                    "live_fraction": 0.95, "compacting": 0}
    assert all(v is not None for v in status["last_compaction"].values())
    assert env.disk_bytes() < disk - 2 * LOG_LIMIT
    check(s, data, {2})
    assert gc.run_pass(3, forced=True, compact="major").entry_logs_compacted == 0  # 0.9 and 1.0 stay
    s.close()
    s = env.storage()
    check(s, data, {2})
    assert not any(n.endswith(".compact") for n in env.files())
    assert all(not i.compacting and i.live_fraction > 0.8 for i in s.entry_logs())


def test_compaction_when_due(env: Env) -> None:
    s = env.storage()
    data = fill(s, [[1] + [2] * 9, [1] * 5 + [2] * 5])
    s.delete_ledger(2)
    clock = FakeClock()
    gc = env.collector(s, clock=clock, minor_compaction_interval=60, major_compaction_interval=600)
    assert gc.run_pass(1).entry_logs_compacted == 0  # nothing due yet
    clock.now += 60
    assert gc.run_pass(2).entry_logs_compacted == 1 and sorted(logs_of(s)) == [2]  # minor
    clock.now += 60
    assert gc.run_pass(3).entry_logs_compacted == 0  # minor again: 0.5 stays
    clock.now += 600
    assert gc.run_pass(4).entry_logs_compacted == 1 and logs_of(s) == {}  # major
    check(s, data, {2})


def _big_log(env: Env, live: int = 150, dead: int = 50) -> tuple[LedgerStorage, Data]:
    """One sealed log of ``live`` records of ledger 1 and ``dead`` of deleted ledger 2."""
    s = env.storage(limit=LOG_HEADER_SIZE + (live + dead) * REC)
    order = ([1] * (live // dead) + [2]) * dead + [1] * (live % dead)
    data = fill(s, [[ledger] for ledger in order])  # a flush after each: the records lie in this order
    s.delete_ledger(2)
    assert sorted(logs_of(s)) == [1]
    return s, data


def test_max_run_time_cuts_a_pass_and_the_next_finishes_it(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    s, data = _big_log(env)
    clock = FakeClock()
    gc = env.collector(s, clock=clock, major_compaction_max_time_millis=1000, minor_compaction_max_time_millis=1000,
                       minor_compaction_interval=0, major_compaction_interval=0)  # never due
    relocate = s.relocate
    batches: list[int] = []

    def slow_relocate(dir_no: int, log_id: int, records: list[tuple[int, int, int, bytes]]) -> tuple[int, int]:
        batches.append(len(records))
        if len(batches) == 1:
            clock.now += 3600  # the first batch took an hour
        return relocate(dir_no, log_id, records)

    monkeypatch.setattr(s, "relocate", slow_relocate)
    stats = gc.run_pass(1, forced=True, compact="major")
    assert batches == [64] and 0 < stats.entries_copied < 64 and stats.entry_logs_compacted == 0
    assert any("ran out of time" in c for c in last_pass(gc)["cut_short"])
    assert logs_of(s)[1].compacting and env.fs.exists(env.log_path(1, "compact"))
    assert gc.status()["entry_logs"]["compacting"] == 1
    check(s, data, {2})
    first = stats.entries_copied
    stats = gc.run_pass(2)  # not forced, nothing due: the marker alone brings the log back
    assert stats.entry_logs_compacted == 1 and stats.entries_copied == 150 - first  # the moved ones are dead now
    assert gc.status()["totals"]["entries_copied"] == 150
    assert logs_of(s) == {} and not any(env.fs.exists(env.log_path(1, k)) for k in ("log", "use", "compact"))
    check(s, data, {2})
    s.close()
    check(env.storage(), data, {2})


def test_cut_short_compaction_continues_after_restart(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    s, data = _big_log(env)
    clock = FakeClock()
    gc = env.collector(s, clock=clock, major_compaction_max_time_millis=1)
    relocate = s.relocate

    def slow(*args: Any) -> tuple[int, int]:
        clock.now += 1
        return relocate(*args)

    monkeypatch.setattr(s, "relocate", slow)
    gc.run_pass(1, forced=True, compact="major")
    s.close()
    s = env.storage(limit=LOG_HEADER_SIZE + 200 * REC)
    assert logs_of(s)[1].compacting  # the marker is durable
    check(s, data, {2})
    assert env.collector(s).run_pass(1).entry_logs_compacted == 1 and 1 not in logs_of(s)
    check(s, data, {2})


def _compact_paced(env: Env, by_bytes: bool, rate: float) -> tuple[FakeClock, int, int]:
    s, data = _big_log(env, live=200, dead=50)
    clock = FakeClock()
    limiter = RateLimiter(rate, clock=clock, sleep=clock.sleep)
    out = compact_log(s, logs_of(s)[1], limiter, by_bytes, math.inf, lambda: False, clock)
    assert out.done and out.entries == 200 and out.bytes_copied == 200 * REC
    check(s, data, {2})
    return clock, out.entries, out.bytes_copied


def test_compaction_pace_by_entries(env: Env) -> None:
    clock, entries, _ = _compact_paced(env, False, 50)
    # charged after each batch of 64 records (dead ones cost nothing): the last batch's
    # charge is owed to whatever comes next
    slept = sum(clock.sleeps)
    assert (entries - 64) / 50 <= slept <= entries / 50 and len(clock.sleeps) >= 3


def test_compaction_pace_by_bytes(env: Env) -> None:
    clock, _, size = _compact_paced(env, True, 50 * REC)
    slept = sum(clock.sleeps)
    assert (size - 64 * REC) / (50 * REC) <= slept <= size / (50 * REC)


def test_collector_paces_compaction_in_real_time(env: Env) -> None:
    s, data = _big_log(env, live=130, dead=50)
    gc = env.collector(s, compaction_rate_by_entries=300)
    t0 = time.monotonic()
    assert gc.run_pass(1, forced=True, compact="major").entries_copied == 130
    assert time.monotonic() - t0 >= 0.25  # two waits of about 43 / 300 s (batches of 64 records, 2/3 live)
    check(s, data, {2})


def test_collector_throttles_by_bytes(env: Env) -> None:
    s, data = _big_log(env, live=130, dead=50)
    gc = env.collector(s, is_throttle_by_bytes=True, compaction_rate_by_bytes=300 * REC,
                       compaction_rate_by_entries=1)  # by entries this would take minutes
    t0 = time.monotonic()
    assert gc.run_pass(1, forced=True, compact="major").entries_copied == 130
    assert 0.25 <= time.monotonic() - t0 < 5
    check(s, data, {2})


def test_compaction_suspended_on_a_full_disk(env: Env) -> None:
    s = env.storage()
    data = fill(s, [[1] + [2] * 9, [1] * 5 + [2] * 5, [2] * 10])
    s.delete_ledger(2)
    gc = env.collector(s)
    env.usage = 0.93  # above diskUsageWarnThreshold (0.90), below diskUsageThreshold (0.95)
    stats = gc.run_pass(1, forced=True, compact="major")
    # major is suspended there; minor (it copies the least) runs instead: the 0.1 log only
    assert stats.entry_logs_deleted == 1 and stats.entry_logs_compacted == 1
    status = gc.status()
    assert any("major compaction suspended (disk 93.0% full" in c and "minor compaction instead" in c
               for c in status["last_pass"]["cut_short"])
    assert sorted(logs_of(s)) == [2] and status["disk_usage"] == 0.93
    env.usage = 0.97  # above diskUsageThreshold: no compaction at all
    assert gc.run_pass(2, forced=True, compact="major").entry_logs_compacted == 0
    status = gc.status()
    assert status["compaction"].startswith("suspended: disk 97.0% full")
    assert any(c.startswith("compaction suspended") for c in status["last_pass"]["cut_short"])
    allowed = env.collector(s, is_force_gc_allow_when_no_space=True)
    assert allowed.run_pass(1, forced=True, compact="major").entry_logs_compacted == 1
    assert allowed.status()["compaction"] == "idle" and logs_of(s) == {}
    check(s, data, {2})


def test_log_that_would_not_fit_is_skipped(env: Env) -> None:
    s = env.storage()
    data = fill(s, [[1] + [2] * 9, [1] * 5 + [2] * 5])
    s.delete_ledger(2)
    gc = env.collector(s, free_space=lambda d: (16 << 20) + 3 * REC)  # room for log 1's live bytes, not log 2's
    stats = gc.run_pass(1, forced=True, compact="major")
    assert stats.entry_logs_compacted == 1 and sorted(logs_of(s)) == [2]
    cut = last_pass(gc)["cut_short"]
    assert len(cut) == 1 and "entry log 2" in cut[0] and "would not fit in the free space" in cut[0]
    check(s, data, {2})


def test_damaged_log_is_never_removed(env: Env) -> None:
    s = env.storage()
    data = fill(s, [[1, 2, 2, 1, 2, 1, 2, 2, 2, 1], [1] * 6 + [2] * 4])
    s.delete_ledger(2)
    s.close()
    # log 1 holds ledger 1's entries 0-3, then ledger 2's (a flush places by ledger): damage entry 2
    flip(env.fs, env.log_path(1), LOG_HEADER_SIZE + 2 * REC + RECORD_HEADER.size + 3)
    s = env.storage()
    gc = env.collector(s)
    stats = gc.run_pass(1, forced=True, compact="major")
    assert last_pass(gc)["error"] is None and stats.entry_logs_compacted == 1  # log 2, after the damaged one
    assert sorted(logs_of(s)) == [1, 3] and env.fs.exists(env.log_path(1))  # 3: the active log at the close
    assert gc.status()["damaged_entry_logs"] == ["0:1"] and logs_of(s)[1].compacting
    for entry in (0, 1, 3, 4, 5, 6, 7, 8, 9):  # before the damage (copied), after it (in place), in log 2
        assert s.get_entry(1, entry) == data[(1, entry)]
    with pytest.raises(CorruptionError):
        s.get_entry(1, 2)
    assert gc.run_pass(2, forced=True, compact="major").entry_logs_compacted == 0  # not tried again
    assert env.fs.exists(env.log_path(1))


def test_reads_and_adds_while_compacting(env: Env) -> None:
    rng = random.Random(5)
    s = env.storage()
    data = fill(s, [[rng.choice([1, 2, 3, 4, 5, 6]) for _ in range(10)] for _ in range(120)])
    for ledger in (5, 6):
        s.delete_ledger(ledger)
    live = {k: v for k, v in data.items() if k[0] not in (5, 6)}
    gc = env.collector(s, compaction_rate_by_entries=2000)
    gc.start()
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = [0]
    added: Data = {}

    def reader() -> None:
        try:
            while not stop.is_set():
                for (ledger, entry), value in live.items():
                    assert s.get_entry(ledger, entry) == value, f"ledger={ledger} entry={entry}"
                    reads[0] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def writer() -> None:
        try:
            entry = 0
            while not stop.is_set():
                value = payload(50, entry)
                s.add_entry(50, entry, value)
                added[(50, entry)] = value
                assert s.get_entry(50, entry // 2) == payload(50, entry // 2)
                entry += 1
                if entry % 50 == 0:
                    s.flush()
                time.sleep(0.0005)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader), threading.Thread(target=reader), threading.Thread(target=writer)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.05)
        before = reads[0]
        number = gc.request("major")
        assert gc.wait_for(number, timeout=60)
        during = reads[0] - before
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[0]
    last = last_pass(gc)
    assert last["number"] == number and last["forced"] and last["error"] is None
    assert last["entry_logs_compacted"] > 50 and last["entries_copied"] > 300
    assert during > 0 and added
    check(s, {**live, **added})
    s.close()
    check(env.storage(), {**live, **added})


def test_request_and_wait_for_on_a_started_collector(env: Env) -> None:
    s = env.storage()
    data = fill(s, [[1] + [2] * 9])
    s.delete_ledger(2)
    gc = env.collector(s)
    assert not gc.wait_for(1, timeout=0.05)  # not started: no pass comes
    gc.start()
    first = gc.request()
    assert first == 1 and gc.wait_for(first, timeout=30)
    assert last_pass(gc)["entry_logs_compacted"] == 0 and sorted(logs_of(s)) == [1]  # no kind asked: none due
    second = gc.request("minor")
    assert gc.wait_for(second, timeout=30) and logs_of(s) == {}
    assert gc.status()["passes"] == second and gc.status()["running"] is False
    gc.stop()
    assert not gc.wait_for(second + 1, timeout=1)
    check(s, data, {2})


# --- through a Bookie ------------------------------------------------------------------------------
KEY = b"gc-test-master-key"
BODY = PAYLOAD - ENTRY_HEADER.size  # an entry of PAYLOAD bytes


def bookie_entry(ledger: int, entry: int) -> bytes:
    return encode_entry(ledger, entry, entry - 1, BODY, (f"{ledger}/{entry}:".encode() * BODY)[:BODY])


def _bookie_config(**overrides: Any) -> BookieConfig:
    values: dict[str, Any] = dict(bookie_id=BOOKIE, journal_directory="/bk/journal",
                                  ledger_directories=["/bk/ledgers0"], journal_pre_alloc_size_mb=1,
                                  journal_max_size_mb=64, flush_interval=3_600_000,
                                  entry_log_size_limit=LOG_HEADER_SIZE + 200 * REC)
    values.update(overrides)
    return BookieConfig(**values)


def _gc_threads(others: frozenset[threading.Thread] = frozenset()) -> list[threading.Thread]:
    """The live GC threads, but ``others`` (those of bookies a failed test left behind)."""
    return [t for t in threading.enumerate() if t.name == "bookie-gc" and t.is_alive() and t not in others]


def test_bookie_shutdown_during_slow_compaction_and_restart() -> None:
    fs = MemFS()
    others = frozenset(_gc_threads())
    b = Bookie(_bookie_config(compaction_rate_by_entries=5), fs=fs)
    with pytest.raises(BookieShutdownError):
        b.gc.status()
    b.start()
    try:
        futures: list[Future[None]] = []
        expect: Data = {}
        counts = {1: 0, 2: 0, ROLL: 0}
        for group in [[1, 1, 1, 2]] * 50 + [[ROLL]]:  # a checkpoint after each: ledger 2's records among 1's
            for ledger in group:
                expect[(ledger, counts[ledger])] = bookie_entry(ledger, counts[ledger])
                futures.append(b.add_entry(ledger, counts[ledger], KEY, expect[(ledger, counts[ledger])]))
                counts[ledger] += 1
            for fut in futures:
                fut.result(20)
            b.checkpoint()
        b.delete_ledger(2)
        b.checkpoint()
        assert [round(i.live_fraction, 2) for i in b.storage.entry_logs()] == [0.75]
        number = b.gc.request("major")
        deadline = time.monotonic() + 20
        while not b.gc.status()["compaction"].startswith("running"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.3)  # the first batch (48 live entries) is copied; the pace now waits 48 / 5 s
        t0 = time.monotonic()
    finally:
        b.shutdown()
    assert time.monotonic() - t0 < 3 and not _gc_threads(others)  # not the 9 s left of the wait
    cut = b.gc.status()["last_pass"]
    assert cut["number"] == number and cut["entries_copied"] > 0 and any("stopping" in c for c in cut["cut_short"])
    b = Bookie(_bookie_config(), fs=fs)
    b.start()
    try:
        assert {i.log_id: i.compacting for i in b.storage.entry_logs()}[1]
        assert fs.exists("/bk/ledgers0/current/logs/0000000000000001.compact")
        number = b.gc.request()
        assert b.gc.wait_for(number, timeout=30)
        assert b.gc.status()["last_pass"]["entry_logs_compacted"] == 1
        assert all(i.log_id != 1 for i in b.storage.entry_logs())
        assert not fs.exists("/bk/ledgers0/current/logs/0000000000000001.compact")
        assert not fs.exists("/bk/ledgers0/current/logs/0000000000000001.log")
        for (ledger, entry), value in expect.items():
            if ledger != 2:
                assert b.read_entry(ledger, entry) == value
    finally:
        b.shutdown()
    assert not _gc_threads(others)


# --- the ADMIN wire op -----------------------------------------------------------------------------
STATUS_KEYS = {"bookie", "metadata", "running", "passes", "metadata_unavailable_passes", "next_pass_in_seconds",
               "last_pass", "totals", "compaction", "last_compaction", "entry_logs", "damaged_entry_logs", "disk_usage",
               "readonly"}


def test_admin_gc_status_and_run(tmp_path: Path) -> None:
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            client = await client_of(server)
            status = await client.admin("gc.status")
            assert set(status) == STATUS_KEYS and status["passes"] == 0 and status["readonly"] is False
            ran = await client.admin("gc.run", {"compact": "major"})
            assert set(ran) == {"pass"} and ran["pass"] >= 1
            for _ in range(400):
                status = await client.admin("gc.status")
                if status["passes"] >= ran["pass"]:
                    break
                await asyncio.sleep(0.05)
            assert status["passes"] >= ran["pass"] and status["last_pass"]["forced"] is True
            assert status["last_pass"]["error"] is None
            refusals: list[tuple[str, Any, str]] = [
                ("gc.nope", {}, "unknown admin command"),
                ("gc.run", {"compact": "huge"}, "compact must be null, minor or major"),
                ("gc.status", [1, 2], "must be a JSON object"),
            ]
            for command, args, message in refusals:
                with pytest.raises(ProtocolError, match=message):
                    await client.admin(command, args)
            with pytest.raises(ProtocolError, match="not JSON"):
                await client._call(AdminRequest("gc.status", b"{not json"))
            assert set(await client.admin("gc.status")) == STATUS_KEYS  # the connection is still usable
            await client.close()

    run(body)


def test_an_entry_log_created_but_never_written_is_removed_at_open() -> None:
    """A crash right after a log file was created leaves it shorter than a header and a
    record: nothing can point into it, so open removes it (one that is longer but whose
    header is unreadable is left alone, never deleted or compacted)."""
    fs = MemFS()
    s = LedgerStorage(fs, ["/d"])
    s.open()
    s.add_entry(1, 0, b"e")
    s.close()
    logs = "/d/current/logs"
    for log_id, size in ((7, 0), (8, LOG_HEADER_SIZE), (9, 4096)):
        f = fs.open(f"{logs}/{log_id:016x}.log", create=True)
        f.pwrite(bytes(size), 0) if size else None
        f.sync()
        f.close()
    fs.fsync_dir(logs)
    s = LedgerStorage(fs, ["/d"])
    s.open()
    names = fs.listdir(logs)
    assert f"{7:016x}.log" not in names and f"{8:016x}.log" not in names
    assert f"{9:016x}.log" in names and 9 not in {i.log_id for i in s.entry_logs()}
    assert s.get_entry(1, 0) == b"e"
    s.close()


# --- findings of the review, kept as regressions ---------------------------------------------
def test_a_damaged_sealed_log_that_lost_its_usage_file_is_left_alone(env: Env) -> None:
    """Log 1's usage file is lost and a record of ledger 1 in it is damaged: the rebuild
    at open stops there and would not see ledger 2's records after it. A log below one
    with a valid usage file cannot be the one a crash tore, so it is left alone: never
    deleted (not even when ledger 1 goes) nor compacted; ledger 2 stays readable."""
    s = env.storage()
    data = fill(s, [[1] * 3 + [2] * 7, [3] * 10])
    s.close()
    env.fs.remove(env.log_path(1, "use"))
    flip(env.fs, env.log_path(1), LOG_HEADER_SIZE + 2 * REC + RECORD_HEADER.size + 5)  # ledger 1, entry 2
    s = env.storage()
    assert 1 not in logs_of(s) and 2 in logs_of(s)
    s.delete_ledger(1)
    gc = env.collector(s)
    stats = gc.run_pass(1, forced=True, compact="major")
    assert stats.entry_logs_deleted == 0 and env.fs.exists(env.log_path(1))
    check(s, data, {1})


def _full_before_a_flush(env: Env, s: LedgerStorage, plan: list[int], room: int) -> Data:
    """Add one entry per ledger of ``plan`` (nothing flushed), leave ``room`` bytes free on
    the disk and flush: the flush places the entries (the logs it rolls are written out),
    then has no room to write the active log's buffer - it seals nothing, and so the
    rolled logs stay unsealed."""
    data: Data = {}
    for ledger in plan:
        entry = sum(1 for (lid, _) in data if lid == ledger)
        s.add_entry(ledger, entry, payload(ledger, entry))
        data[(ledger, entry)] = payload(ledger, entry)
    assert isinstance(env.fs, MemFS)
    env.fs.capacity = env.fs.used_bytes() + room
    with pytest.raises(OSError, match="No space left"):
        s.flush()
    assert s.entry_logs() == []
    return data


def test_unsealed_logs_of_deleted_ledgers_give_the_room_a_flush_needs(env: Env) -> None:
    """The disk filled before any flush completed: no log is sealed. The rolled logs
    that only deleted ledgers filled are deleted all the same - the flush that would
    seal them needs the room they take - and then the flush succeeds."""
    s = env.storage()
    # a flush places ledger 1 first: logs 1-2 hold ledger 1 (written out as they rolled),
    # log 3 (active) ledger 2, with no room to write it
    data = _full_before_a_flush(env, s, [2] * 5 + [1] * 20, room=2 * LOG_LIMIT + 100)
    gc = env.collector(s)
    assert gc.run_pass(1).entry_logs_deleted == 0  # ledger 1 still lives: nothing to give back
    assert s.pending_index_entries() == 25
    s.delete_ledger(1)
    stats = gc.run_pass(2)
    assert (stats.entry_logs_deleted, stats.bytes_reclaimed) == (2, 2 * LOG_LIMIT)
    assert sorted(env.files()) == [f"{3:016x}.log"]
    check(s, data, {1})  # ledger 2's entries are read from the active log's buffer
    s.flush()  # the room came back: this flush completes
    assert s.pending_index_entries() == 0
    check(s, data, {1})
    s.close()
    env.fs.capacity = None
    s = env.storage()
    check(s, data, {1})
    assert sorted(logs_of(s)) == [3] and logs_of(s)[3].live_bytes == 5 * REC


def test_an_active_log_of_deleted_ledgers_is_deleted_too(env: Env) -> None:
    s = env.storage()
    data = _full_before_a_flush(env, s, [2] * 15, room=LOG_LIMIT + 100)  # log 1 rolled, log 2 active: ledger 2
    s.delete_ledger(2)
    stats = env.collector(s).run_pass(1)
    # the active log's buffer never reached the disk (it waited for room): it frees nothing
    assert (stats.entry_logs_deleted, stats.bytes_reclaimed) == (2, LOG_LIMIT)
    assert env.files() == []
    s.add_entry(1, 0, payload(1, 0))  # the next add starts a new log, above the deleted ones
    s.flush()
    assert env.files() == [f"{3:016x}.log"] and s.get_entry(1, 0) == payload(1, 0)
    check(s, data, {2})


def test_no_log_is_removed_once_the_storage_failed(env: Env) -> None:
    """The unlink of a deleted ledger's index fails: the storage is failed and may not
    have made the deletion durable, so the log that ledger filled is not removed."""
    s = env.storage()
    fill(s, [[1] * 10])
    md = FakeMetadata({ROLL: LedgerMetadata.create(ROLL, (BOOKIE, *OTHERS[:2]), write_quorum=3, ack_quorum=2,
                                                   password=b"", ctime=0)})
    gc = env.collector(s, md)
    env.fs.fail_next_write()
    gc.run_pass(1)
    assert gc.run_pass(2).entry_logs_deleted == 0 and env.fs.exists(env.log_path(1))
    assert "failed earlier" in last_pass(gc)["error"] and gc.status()["damaged_entry_logs"] == []


def test_an_empty_log_that_cannot_be_removed_does_not_stop_compaction(env: Env) -> None:
    s = env.storage()
    data = fill(s, [[1] * 10, [2] * 10, [4] * 9 + [5]])
    s.close()
    f = env.fs.open(env.log_path(1))
    f.pwrite(b"\xff", 3)  # the header of log 1 damaged; its usage file is fine
    f.sync()
    f.close()
    s = env.storage()
    s.delete_ledger(1)
    s.delete_ledger(4)  # log 1 empty, log 3 10 % live
    gc = env.collector(s)
    stats = gc.run_pass(1, forced=True, compact="minor")
    assert stats.entry_logs_compacted == 1 and last_pass(gc)["error"] is None
    assert gc.status()["damaged_entry_logs"] == ["0:1"]
    check(s, data, {1, 4})
