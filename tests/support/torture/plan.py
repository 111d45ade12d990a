"""A torture seed's plan: the run's parameters (cluster shape, fault kinds and
durations, the bookies' options) and :func:`make_plan`, which draws the cluster kind, the
metadata store and the schedule of faults from the seed's random streams (the theory of
operation is :mod:`support.torture.harness`'s)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from support.torture.disks import JOURNAL_MB


BOOKIES, ENSEMBLE, QW, QA = 5, 3, 3, 2
LOG = "torture"
WINDOW = 8  # appends in flight per writer
ENTRY_BYTES = 8192  # the log's max_entry_bytes: small, so that records of several entries are cheap
LARGE_EVERY = 10  # about one record in this many is larger than an entry (2 or 3 fragments)
ROLL_SECONDS = 1.5  # segments roll often, so rolls meet faults
REPLAY_EVERY = 0.8
SESSION_TIMEOUT = 2.0
CLIENT: dict[str, Any] = {"add_timeout": 2.0, "read_timeout": 2.0, "speculative_read_timeout": 0.2,
                          "connect_timeout": 2.0, "session_timeout": 5.0}
HOOK_FAULTS = ("kill", "partition", "slow-disk", "read-only", "expire-bookie", "expire-writer", "failover")
PROCESS_FAULTS = ("kill", "kill", "damage-journal", "failover")
DISK_FULL = "disk-full"  # processes: the victim's journal and/or ledger disk really fills
FSYNC_FAIL = "fsync-fail"  # hooks: the victim's journal or ledger fsyncs fail (EIO); restarted at the end
ZK_OUTAGE = "zk-outage"  # zk3: every ZooKeeper node down
METADATA_LOCK = "metadata-lock"  # local: the store's database locked by a stuck process
DOWN = {"kill", "damage-journal", "lose-bookie", FSYNC_FAIL}
IMPAIRING = DOWN | {"partition", "read-only", DISK_FULL}
INSTANT = {"expire-bookie", "expire-writer", "failover"}
#: Garbage collection runs all the time in torture runs, so that its "never collect what
#: may be live" is judged under the same faults as everything else (session expiry and
#: ZooKeeper nodes down while a pass lists and confirms; crashes mid-compaction): a pass
#: every 0.5 s, small entry logs sealed by a checkpoint every 2 s, compaction due every
#: few seconds, not throttled, and of every log with a little dead data in it (major:
#: under 95 % live), so that the workloads' live entries are moved again and again.
GC_OPTIONS: dict[str, float] = {
    "gc_wait_time": 500,
    "gc_overreplicated_ledger_wait_time": 3000,
    "entry_log_size_limit": 1 << 20,
    "flush_interval": 2000,
    "minor_compaction_interval": 2,
    "major_compaction_interval": 5,
    "minor_compaction_threshold": 0.5,
    "major_compaction_threshold": 0.95,
    "compaction_rate_by_entries": 100000,
}
#: Autorecovery runs in every bookie of a torture run (walkit/recovery/_autorecovery.py):
#: the ledgers of a bookie gone ``LOST_DELAY`` seconds are re-replicated. That is longer
#: than a ``kill`` keeps a bookie unregistered (its session expires 2 s after the SIGKILL,
#: the restart comes at most 2 s after the kill, plus the start), so temporarily killed
#: bookies are not re-replicated as a rule; a restart held up by an earlier event may be,
#: which is allowed (the bookie's copies are then over-replicated, and garbage collection
#: takes them). An open ledger's marker is looked at again every second (BookKeeper
#: waits 30 s for its writer: a torture run is shorter).
LOST_DELAY = 5  # lostBookieRecoveryDelay, s
AUTORECOVERY_OPTIONS: dict[str, object] = {
    "auto_recovery_daemon_enabled": True,
    "lost_bookie_recovery_delay": LOST_DELAY,
    "open_ledger_rereplication_grace_period": 1000,
}
#: Disks: checked every second (a full one is seen at once, a freed one soon), and
#: journals rolled small and reserved a MiB at a time, so a full journal disk is met
#: within a batch or two (the ``disk-full`` fault: tests/support/torture/disks.py).
DISK_OPTIONS: dict[str, object] = {
    "disk_check_interval": 1000,
    "journal_max_size_mb": JOURNAL_MB,
    "journal_pre_alloc_size_mb": 1,
}
BOOKIE_OPTIONS: dict[str, object] = {**GC_OPTIONS, **AUTORECOVERY_OPTIONS, **DISK_OPTIONS}
LOST = "lose-bookie"
LOST_CHANCE = 0.5  # of a run of at least LOST_MIN_SECONDS losing a bookie for good
LOST_MIN_SECONDS = 20.0  # shorter runs have no room for the loss, the delay and the repair
JOIN_AFTER = (2.0, 8.0)  # seconds from the loss to the fresh bookie's start
#: After a loss no other bookie goes down until the repair is expected done: the lost
#: bookie's session expires, the auditor waits out the delay, the workers copy.
REPAIR_SECONDS = SESSION_TIMEOUT + LOST_DELAY + 5.0
PASSWORDS = (b"", b"churn")  # the ledgers' passwords: WAL and ledger workloads, churn
REPAIR_WAIT = 60.0  # seconds the end of a run waits for every ledger to be back to its write quorum
WRITABLE_WAIT = 30.0  # seconds the end of a run waits for every bookie to be writable again
ZK_FAULT = "zk-node-down"
ZK_DOWN = (1.0, 4.0)  # seconds a ZooKeeper node stays down
ZK_VICTIMS = ("leader", "session")  # the leader, or the node of the ledger writer's session
DISK_GAP = (3.0, 8.0)  # seconds between two disk faults of a plan
DISK_FULL_FOR = (2.0, 6.0)  # seconds a disk stays full: long enough to be met and seen
FSYNC_FAIL_FOR = (0.5, 3.0)  # seconds a bookie whose fsync failed stays read-only before its restart
OUTAGE_CHANCE = 0.5  # of a plan of at least OUTAGE_MIN_SECONDS on zk3 or local having a metadata outage
OUTAGE_MIN_SECONDS = 15.0
ZK_OUTAGE_FOR = (5.0, 30.0)  # seconds every ZooKeeper node is down (at most 40 % of the run)
LOCK_FOR = (2.0, 8.0)  # seconds the local:// database stays locked: under its busy timeout (the 30 s retry deadline), calls wait
OUTAGE_QUIET = (3.0, 2.0)  # seconds before and after an outage without faults that need metadata
#: Faults whose start or end needs metadata (a bookie's start or registration, a session
#: expiry, a ZooKeeper node's restart, a writer's open - which also holds up the schedule
#: while it waits): none is placed around a metadata outage.
_NEEDS_METADATA = DOWN | {"read-only", "expire-bookie", "expire-writer", ZK_FAULT, DISK_FULL, "failover"}


# -- the plan ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Fault:
    start: float
    end: float
    kind: str
    bookie: int = -1
    how: str = ""
    salt: int = 0

    def __str__(self) -> str:
        victim = f" bookie {self.bookie}" if self.bookie >= 0 else ""
        how = f" ({self.how})" if self.how else ""
        span = f"{self.start:.2f}s" if self.kind in INSTANT else f"{self.start:.2f}-{self.end:.2f}s"
        return f"{span} {self.kind}{victim}{how}"


@dataclasses.dataclass(frozen=True)
class Plan:
    seed: int
    seconds: float
    mode: str  # "processes" or "hooks"
    metadata: str  # "local", "zk" (standalone, the caller's) or "zk3" (an ensemble of the run's own)
    faults: tuple[Fault, ...]


def make_plan(seed: int, seconds: float) -> Plan:
    """The run ``seed`` names: cluster kind, metadata store, fault schedule. Half the
    ``zk`` plans are ``zk3`` plans, with ``zk-node-down`` faults from a second stream;
    half the plans of ``LOST_MIN_SECONDS`` or more lose a bookie for good, as a third
    stream says (:func:`_lose_one`)."""
    rng = random.Random(seed)
    mode = rng.choice(["processes", "hooks"])
    metadata = rng.choice(["local", "zk"])
    menu = PROCESS_FAULTS if mode == "processes" else HOOK_FAULTS
    faults: list[Fault] = []
    t = rng.uniform(0.3, 0.8)
    while t < seconds - 0.5:
        kind = rng.choice(menu)
        end = t if kind in INSTANT else min(seconds, t + rng.uniform(0.3, 2.0))
        fault = _place(rng, Fault(t, end, kind, salt=rng.getrandbits(32)), faults, mode)
        if fault is not None:
            faults.append(fault)
        t += rng.uniform(0.2, 1.0)
    lost_rng = random.Random(f"{seed}/lost")
    if seconds >= LOST_MIN_SECONDS and lost_rng.random() < LOST_CHANCE:
        faults = _lose_one(lost_rng, faults, seconds)
    faults = _disk_faults(random.Random(f"{seed}/disk"), faults, seconds, mode)
    zk_rng = random.Random(f"{seed}/zk")
    if metadata == "zk" and zk_rng.random() < 0.5:
        metadata = "zk3"
        faults += _zk_faults(zk_rng, seconds)
    faults = _outage(random.Random(f"{seed}/outage"), faults, seconds, metadata)
    return Plan(seed, seconds, mode, metadata, tuple(sorted(faults, key=lambda f: f.start)))


def _zk_faults(rng: random.Random, seconds: float) -> list[Fault]:
    """``zk-node-down`` faults one after another (one node down at a time), each 1 to 4 s
    (less when the run ends first, never under 1 s), 0.5 to 2 s apart."""
    faults: list[Fault] = []
    t = rng.uniform(0.5, 1.5)
    while t <= seconds - ZK_DOWN[0]:
        end = min(seconds, t + rng.uniform(*ZK_DOWN))
        faults.append(Fault(t, end, ZK_FAULT, how=rng.choice(ZK_VICTIMS)))
        t = end + rng.uniform(0.5, 2.0)
    return faults


def _lose_one(rng: random.Random, faults: list[Fault], seconds: float) -> list[Fault]:
    """``faults`` with a ``lose-bookie`` fault in the first half of the run: bookie L is
    SIGKILLed and its journal and ledger directories deleted; a fresh bookie, number
    ``BOOKIES`` (a new id: L's id would be refused by its cookie, by design), joins at the
    fault's end, 2 to 8 s later; autorecovery puts back what L held.

    Why the checker stays honest: every acknowledged entry has Qa = 2 copies, so one
    outside L, and nothing else in the run may destroy that one. A kill loses nothing
    synced; journal damage - the one fault that destroys acknowledged data - is never
    placed after the loss, and when one came before it, L is that damaged bookie (the
    plan damages at most Qa - 1 = 1 bookie), so the copies the damage cost were L's own.

    Why the cluster stays usable (the limit of Qw - Qa = 1 bookie down at a time): L
    counts as down from the loss until the fresh bookie joined and the repair is
    expected done (``REPAIR_SECONDS`` after the loss): no ``kill`` or ``damage-journal``
    overlaps that window, so no write set loses two bookies and every copy autorecovery
    needs has its source up. A repair that takes longer is only slower: a kill after the
    window makes a copy whose one source it took fail, the worker retries after a
    back-off, and the entry is readable again at the restart. L counts as impaired
    until the fresh bookie joined (at most 2 impaired at a time, as for other faults).
    Faults placed on L that overlap the loss are dropped; those starting after the
    fresh bookie joined go to it (it took L's place, so the placement's limits hold)."""
    start = rng.uniform(1.0, seconds / 2)
    join = start + rng.uniform(*JOIN_AFTER)
    quiet = max(join, start + REPAIR_SECONDS)
    damaged = [f.bookie for f in faults if f.kind == "damage-journal" and f.end < start]
    idle = [b for b in range(BOOKIES) if not any(f.bookie == b and f.start <= start <= f.end for f in faults)]
    victim = damaged[0] if damaged else rng.choice(idle or list(range(BOOKIES)))
    lost = Fault(start, join, LOST, bookie=victim, how=f"fresh bookie {BOOKIES} joins at the end")
    kept: list[Fault] = []
    for fault in faults:
        if fault.kind == "damage-journal" and fault.end >= start:
            continue
        if fault.kind in DOWN and fault.start <= quiet and start <= fault.end:
            continue
        if fault.bookie == victim and fault.end >= start:
            if fault.start <= join:
                continue
            fault = dataclasses.replace(fault, bookie=BOOKIES)
        if fault.kind in IMPAIRING and fault.start <= join and start <= fault.end and sum(
                f.kind in IMPAIRING and f.start <= fault.end and fault.start <= f.end for f in kept) >= 1:
            continue
        kept.append(fault)
    return [*kept, lost]


def _disk_faults(rng: random.Random, faults: list[Fault], seconds: float, mode: str) -> list[Fault]:
    """``faults`` with disks that fail, from a stream of their own (the plan's other faults
    stay what they were before these existed): in the ``processes`` kind ``disk-full``
    (the victim's journal disk, ledger disk or both really fill: :mod:`torture_disks`),
    in the ``hooks`` kind ``fsync-fail`` (the victim's next journal or ledger fsyncs fail
    with EIO; it is crashed and restarted at the fault's end, as an operator would).

    Each is placed as the other faults are (:func:`_place`: a fsync-fail counts as down,
    a full disk as impaired), with a loss's whole repair window counted as down, and
    never on a bookie lost for good after its loss."""
    kind, span = (DISK_FULL, DISK_FULL_FOR) if mode == "processes" else (FSYNC_FAIL, FSYNC_FAIL_FOR)
    losses = [f for f in faults if f.kind == LOST]
    placed = list(faults)
    context = [dataclasses.replace(f, end=max(f.end, f.start + REPAIR_SECONDS)) if f.kind == LOST else f
               for f in faults]
    t = rng.uniform(1.0, 5.0)
    while t < seconds - 1.0:
        end = min(seconds - 0.5, t + rng.uniform(*span))
        how = rng.choice(["journal", "ledgers", "both"] if kind == DISK_FULL else ["journal", "ledgers"])
        fault = _place(rng, Fault(t, end, kind, salt=rng.getrandbits(32)), context, mode)
        if fault is not None and not any(fault.bookie == f.bookie and fault.end >= f.start for f in losses):
            fault = dataclasses.replace(fault, how=how)
            placed.append(fault)
            context.append(fault)
        t = end + rng.uniform(*DISK_GAP)
    return placed


def _outage(rng: random.Random, faults: list[Fault], seconds: float, metadata: str) -> list[Fault]:
    """``faults`` with, in half the plans of ``OUTAGE_MIN_SECONDS`` or more, a metadata
    outage from a stream of its own: ``zk-outage`` (every node of the run's ZooKeeper
    ensemble SIGKILLed, then restarted) on ``zk3``, ``metadata-lock`` (a stuck process
    holds the database's write lock) on ``local``; never on ``zk``, whose ZooKeeper the
    suite's other runs share. Adds to open ledgers go on through it; whatever needs
    metadata waits (the workloads' own rolls, creations, recoveries and writers replacing
    failed ones). Faults that need metadata to begin or end (a bookie's restart, a
    session expiry, read-only, a ZooKeeper node's restart, a failover) are dropped from the outage
    and ``OUTAGE_QUIET`` around it; a plan whose loss repairs then has no outage."""
    kind = {"zk3": ZK_OUTAGE, "local": METADATA_LOCK}.get(metadata)
    if kind is None or seconds < OUTAGE_MIN_SECONDS or rng.random() >= OUTAGE_CHANCE:
        return faults
    low, high = ZK_OUTAGE_FOR if kind == ZK_OUTAGE else LOCK_FOR
    length = rng.uniform(low, max(low, min(high, 0.4 * seconds)))
    start = rng.uniform(OUTAGE_QUIET[0], seconds - length - 2 * OUTAGE_QUIET[1])
    end = start + length
    quiet = (start - OUTAGE_QUIET[0], end + OUTAGE_QUIET[1])
    if any(f.kind == LOST and f.start <= quiet[1] and quiet[0] <= max(f.end, f.start + REPAIR_SECONDS)
           for f in faults):
        return faults
    kept = [f for f in faults if not (f.kind in _NEEDS_METADATA and f.start <= quiet[1] and quiet[0] <= f.end)]
    return [*kept, Fault(start, end, kind)]


def _place(rng: random.Random, fault: Fault, placed: list[Fault], mode: str) -> Fault | None:
    """``fault`` with a victim and a manner, or None where the limits leave no room."""
    overlapping = [f for f in placed if f.start <= fault.end and fault.start <= f.end]
    if fault.kind == "failover":
        if any(f.kind == "failover" and abs(f.start - fault.start) < 1.0 for f in placed):
            return None
        ways = ["kill-first", "overlap-then-kill"] if mode == "processes" else ["overlap-then-close"]
        return dataclasses.replace(fault, how=rng.choice(ways))
    if fault.kind == "expire-writer":
        return fault
    busy = {f.bookie for f in overlapping if f.bookie >= 0}
    free = [b for b in range(BOOKIES) if b not in busy]
    if fault.kind == "damage-journal":
        damaged = {f.bookie for f in placed if f.kind == "damage-journal"}
        free = [b for b in free if b in damaged or len(damaged) < QA - 1]
    if fault.kind in DOWN and sum(f.kind in DOWN for f in overlapping) >= QW - QA:
        return None
    if fault.kind in IMPAIRING and sum(f.kind in IMPAIRING for f in overlapping) >= 2:
        return None
    if not free:
        return None
    how = {"slow-disk": f"{rng.choice([0.05, 0.2, 0.5])} s per sync",
           "damage-journal": rng.choice(["truncate", "corrupt"])}.get(fault.kind, "")
    return dataclasses.replace(fault, bookie=rng.choice(free), how=how)
