"""Group commit: the pure flush decision on a fake clock, then the same rule inside a Journal.

The table rows read as "the policy, the state of the batch at ``now``,
and what the journal must do". A Journal test then shows that the writer asks the policy
with its own clock and nothing else: on a frozen fake clock with a huge group wait no
flush happens, however long the real clock runs, until the fake clock is moved.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from bookie.fs.mem import MemFS
from bookie.journal import FlushReason, GroupCommitPolicy, Journal, JournalConfig, flush_reason, wait_timeout

#: A group wait close to BookKeeper's 2 ms but exact in binary, as are T0 and every
#: offset below, so "exactly at the threshold" rows really are exact in float arithmetic.
W = 2.0**-9
KIB = 1024


@dataclass(frozen=True)
class Case:
    name: str
    policy: GroupCommitPolicy
    now: float
    oldest: float | None
    nbytes: int = 0
    entries: int = 1
    want: FlushReason | None = None


def pol(wait: float = W, nbytes: int = 512 * KIB, entries: int = 0, queue_empty: bool = False) -> GroupCommitPolicy:
    """Every field spelled out: the rows must not depend on the defaults of the day."""
    return GroupCommitPolicy(
        max_group_wait=wait, buffered_writes_threshold=nbytes, buffered_entries_threshold=entries, flush_when_queue_empty=queue_empty
    )


P = pol()  # one trigger at a time: wait W, 512 KiB, entries off, queue-empty off
BK = pol(wait=0.002)  # BookKeeper's defaults (walkit turns flush-when-queue-empty on)
BIG = pol(wait=3600.0)  # the clock never triggers by itself
T0 = 1024.0  # a fake clock reading far from 0, as time.monotonic() is

CASES = [
    # --- BookKeeper's settings, from a clock at 0 -----------------------------------------
    Case("BookKeeper settings: 1 ms in, nothing", BK, 0.001, 0.0),
    Case("BookKeeper settings: 2 ms in, max wait", BK, 0.002, 0.0, want=FlushReason.MAX_WAIT),
    Case("BookKeeper settings: 512 KiB", BK, 0.0, 0.0, nbytes=512 * KIB, want=FlushReason.MAX_BYTES),
    # --- the empty batch -------------------------------------------------------------
    Case("empty batch, queue empty, long after", P, T0 + 10, None, entries=0),
    Case("empty batch even with flush-when-queue-empty", pol(queue_empty=True), T0, None, entries=0),
    Case("empty batch ignores byte counters", P, T0, None, nbytes=10 << 20, entries=0),
    # --- max wait ---------------------------------------------------------------------
    Case("fresh entry, queue empty: keep gathering", P, T0, T0),
    Case("just under the group wait", P, T0 + W * 0.999, T0),
    Case("exactly at the group wait", P, T0 + W, T0, want=FlushReason.MAX_WAIT),
    Case("past the group wait", P, T0 + 1.0, T0, want=FlushReason.MAX_WAIT),
    Case("not yet due: half the wait", P, T0 + W / 2, T0),
    Case("huge wait: an hour in, nothing", BIG, T0 + 3599, T0),
    Case("huge wait: an hour later, flush", BIG, T0 + 3600, T0, want=FlushReason.MAX_WAIT),
    # --- bytes threshold ------------------------------------------------------------
    Case("one byte under the bytes threshold", P, T0, T0, nbytes=512 * KIB - 1),
    Case("exactly at the bytes threshold", P, T0, T0, nbytes=512 * KIB, want=FlushReason.MAX_BYTES),
    Case("over the bytes threshold", P, T0, T0, nbytes=3 << 20, want=FlushReason.MAX_BYTES),
    Case("bytes threshold while overdue: max wait first", P, T0 + 1, T0, nbytes=512 * KIB, want=FlushReason.MAX_WAIT),
    Case("small bytes threshold", pol(nbytes=4096), T0, T0, nbytes=4096, want=FlushReason.MAX_BYTES),
    # --- entries threshold --------------------------------------------------------------
    Case("entries threshold off (0): a million entries", P, T0, T0, nbytes=100, entries=1_000_000),
    Case("one entry under the entries threshold", pol(entries=10), T0, T0, entries=9),
    Case("exactly at the entries threshold", pol(entries=10), T0, T0, entries=10, want=FlushReason.MAX_ENTRIES),
    Case("over the entries threshold", pol(entries=10), T0, T0, entries=11, want=FlushReason.MAX_ENTRIES),
    Case("entries threshold 1: every entry", pol(entries=1), T0, T0, entries=1, want=FlushReason.MAX_ENTRIES),
    # --- flush when the queue is empty --------------------------------------------------
    Case("queue empty, option off", P, T0, T0),
    Case("queue empty, option on", pol(queue_empty=True), T0, T0, want=FlushReason.QUEUE_EMPTY),
    Case("queue empty, option on, overdue: max wait wins", pol(queue_empty=True), T0 + W, T0, want=FlushReason.MAX_WAIT),
    # --- several triggers: the order the function documents -------------------------------
    Case("bytes and entries: bytes first", pol(entries=2), T0, T0, nbytes=1 << 20, entries=2, want=FlushReason.MAX_BYTES),
    Case("entries and queue empty: entries first", pol(entries=2, queue_empty=True), T0, T0, entries=2, want=FlushReason.MAX_ENTRIES),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_flush_reason(case: Case) -> None:
    got = flush_reason(
        case.policy, now=case.now, oldest_enqueued=case.oldest, buffered_bytes=case.nbytes,
        buffered_entries=case.entries,
    )
    assert got is case.want, f"{case.name}: flush_reason -> {got}, expected {case.want} ({case})"


WAIT_CASES = [
    # (name, policy, now, oldest, expected timeout)
    ("no batch: sleep until woken", P, T0, None, None),
    ("no batch with a huge wait", BIG, T0, None, None),
    ("fresh batch: the whole wait", P, T0, T0, W),
    ("half way", P, T0 + W / 2, T0, W / 2),
    ("exactly due: zero", P, T0 + W, T0, 0.0),
    ("overdue: zero, never negative", P, T0 + 7, T0, 0.0),
    ("huge wait, fresh", BIG, T0, T0, 3600.0),
    ("huge wait, ten minutes in", BIG, T0 + 600, T0, 3000.0),
]


@pytest.mark.parametrize(("name", "policy", "now", "oldest", "want"), WAIT_CASES, ids=[c[0] for c in WAIT_CASES])
def test_wait_timeout(name: str, policy: GroupCommitPolicy, now: float, oldest: float | None, want: float | None) -> None:
    got = wait_timeout(policy, now=now, oldest_enqueued=oldest)
    if want is None:
        assert got is None, f"{name}: expected to sleep until woken, got timeout {got}"
    else:
        assert got == pytest.approx(want, abs=1e-12), f"{name}: timeout {got}, expected {want}"


@pytest.mark.parametrize("elapsed", [0.0, W / 3, W / 2, W * 0.999, W, W * 1.5, 10.0])
def test_wait_timeout_ends_where_flush_reason_starts(elapsed: float) -> None:
    """Sleeping for the timeout lands exactly where MAX_WAIT fires: no spin, no extra wait."""
    now = T0 + elapsed
    timeout = wait_timeout(P, now=now, oldest_enqueued=T0)
    assert timeout is not None
    reason_now = flush_reason(P, now=now, oldest_enqueued=T0, buffered_bytes=0, buffered_entries=1)
    reason_after = flush_reason(P, now=now + timeout, oldest_enqueued=T0, buffered_bytes=0, buffered_entries=1)
    assert reason_after is FlushReason.MAX_WAIT, f"after sleeping {timeout}s at +{elapsed}s the batch is still not due"
    assert (timeout == 0.0) == (reason_now is FlushReason.MAX_WAIT), (
        f"at +{elapsed}s: timeout {timeout} but flush_reason says {reason_now}"
    )


# --- the rule inside a running Journal ---------------------------------------------------------


class FakeClock:
    def __init__(self, start: float = T0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


def _wait_for(pred: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


def test_journal_flushes_only_when_the_fake_clock_says_so() -> None:
    """Huge group wait, no other trigger: the journal thread parks (its real timeout is
    computed from the frozen fake clock, an hour), so nothing is flushed however long we
    wait in real time. Each later submission wakes it; it flushes only once the fake
    clock has passed the group wait."""
    fs, clock = MemFS(), FakeClock()
    cfg = JournalConfig("/j", policy=BIG, prealloc_size=64 * KIB)
    journal = Journal(fs, cfg, clock=clock)
    journal.start()
    acked: list[tuple[int, BaseException | None]] = []

    def cb(err: BaseException | None, ctx: Any) -> None:
        acked.append((ctx, err))

    try:
        journal.log_entry(1, 0, b"a", cb, 0)
        time.sleep(0.05)  # real time passes (the thread takes the record in microseconds); the fake clock does not
        assert acked == [] and journal.stats.flushes == 0, f"flushed on a frozen clock: {acked}, {journal.stats}"

        clock.advance(3599.0)  # not yet due: the wake-up must not flush
        journal.log_entry(1, 1, b"b", cb, 1)
        time.sleep(0.05)
        assert acked == [] and journal.stats.flushes == 0, f"flushed before the group wait: {acked}, {journal.stats}"

        clock.advance(1.0)  # the oldest entry is now exactly due
        journal.log_entry(1, 2, b"c", cb, 2)
        _wait_for(lambda: len(acked) == 3, "the batch to be acknowledged")
        assert acked == [(0, None), (1, None), (2, None)], f"one batch, in order, without error: {acked}"
        assert journal.stats.flushes == 1, f"expected exactly one flush, stats={journal.stats}"
        assert journal.stats.reasons == {"max_wait": 1}, f"flush reasons: {journal.stats.reasons}"
    finally:
        journal.shutdown()
    assert journal.stats.flushes == 1, f"shutdown had nothing left to flush, stats={journal.stats}"


class GatedClock(FakeClock):
    """A fake clock that holds every thread but the test's own while the gate is shut:
    the journal thread stops at its first look at the clock, so a backlog can build up."""

    def __init__(self, start: float = T0) -> None:
        super().__init__(start)
        self.gate = threading.Event()
        self._owner = threading.current_thread()

    def __call__(self) -> float:
        if threading.current_thread() is not self._owner:
            assert self.gate.wait(10), "the test never opened the clock gate"
        return super().__call__()


def test_journal_groups_overdue_backlog_into_one_flush() -> None:
    """groupWhenTimeout inside the journal: 50 entries queued at T0 while the journal
    thread was held, all overdue when it looks, go out in ONE flush - not one each."""
    fs, clock = MemFS(), GatedClock()
    cfg = JournalConfig("/j", policy=BIG, prealloc_size=64 * KIB)
    journal = Journal(fs, cfg, clock=clock)
    journal.start()
    acked: list[tuple[int, BaseException | None]] = []
    try:
        for i in range(50):
            journal.log_entry(7, i, bytes([i]) * i, lambda err, ctx: acked.append((ctx, err)), i)
        clock.advance(3600.0)  # every queued entry is now exactly due
        clock.gate.set()
        _wait_for(lambda: len(acked) == 50, "the backlog to be acknowledged")
        assert acked == [(i, None) for i in range(50)], f"acks out of order or failed: {acked}"
        assert journal.stats.flushes == 1, f"the overdue backlog took {journal.stats.flushes} flushes, expected 1"
        assert journal.stats.reasons == {"max_wait": 1}, f"flush reasons: {journal.stats.reasons}"
    finally:
        clock.gate.set()
        journal.shutdown()


@pytest.mark.parametrize(
    ("policy", "sizes", "reason"),
    [
        (pol(wait=3600.0, queue_empty=True), [10], "queue_empty"),
        (pol(wait=3600.0, entries=3), [10, 10, 10], "max_entries"),
        (pol(wait=3600.0, nbytes=8 * KIB), [3000, 3000, 3000], "max_bytes"),
    ],
    ids=["queue empty", "entries threshold", "bytes threshold"],
)
def test_each_trigger_flushes_a_journal_on_a_frozen_clock(policy: GroupCommitPolicy, sizes: list[int], reason: str) -> None:
    """With the clock frozen, only the trigger under test can flush - and it does, on the
    record that reaches it (not before: the earlier ones wait)."""
    fs, clock = MemFS(), FakeClock()
    journal = Journal(fs, JournalConfig("/j", policy=policy, prealloc_size=64 * KIB), clock=clock)
    journal.start()
    acked: list[tuple[int, BaseException | None]] = []
    try:
        for i, n in enumerate(sizes):
            if i:
                time.sleep(0.02)  # let the thread take the previous record alone
                assert acked == [], f"flushed after {i} of {len(sizes)} records: {journal.stats}"
            journal.log_entry(1, i, bytes(n), lambda err, ctx: acked.append((ctx, err)), i)
        _wait_for(lambda: len(acked) == len(sizes), f"the {reason} flush")
        assert acked == [(i, None) for i in range(len(sizes))], f"acks: {acked}"
        assert journal.stats.reasons == {reason: 1}, f"flush reasons: {journal.stats.reasons}"
    finally:
        journal.shutdown()


@pytest.mark.parametrize("wait", [float("inf"), 1e10])
def test_unbounded_group_wait_does_not_kill_the_journal(wait: float) -> None:
    journal = Journal(MemFS(), JournalConfig("/j", policy=pol(wait=wait, entries=2), prealloc_size=64 * KIB))
    journal.start()
    acked: list[tuple[int, BaseException | None]] = []
    try:
        journal.log_entry(1, 0, b"a", lambda err, ctx: acked.append((ctx, err)), 0)
        time.sleep(0.05)  # the thread parks with a timeout computed from the huge wait
        assert journal.failed is None, f"the journal died waiting: {journal.failed!r}"
        journal.log_entry(1, 1, b"b", lambda err, ctx: acked.append((ctx, err)), 1)  # entries threshold: flush
        _wait_for(lambda: len(acked) == 2, "the entries-threshold flush")
        assert acked == [(0, None), (1, None)], f"acks: {acked}"
    finally:
        journal.shutdown()
