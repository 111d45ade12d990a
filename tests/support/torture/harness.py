"""Seeded torture runs: a WAL workload and a raw-ledger workload on a real cluster
under random faults, each recorded as a :class:`~torture_history.History` and judged by
:func:`torture_history.check`.

Theory of operation
-------------------
``random.Random(seed)`` chooses everything that can be chosen up front (:func:`make_plan`):
the cluster kind, the metadata store, and a schedule of faults (start, end, kind, victim),
so a seed always names the same run. Timing is the machine's, so a reproduction replays
the same faults at the same offsets, not the same interleaving to the microsecond.

Two cluster kinds, because each fault needs one or the other:

``processes``  ``LocalCluster(processes=True)``: every bookie is ``python -m bookie``.
               Faults: SIGKILL of a bookie then a restart; SIGKILL of a bookie, its
               newest journal truncated or a byte of its tail flipped while it is down,
               then a restart; writer failover by SIGKILL of the writer's own child
               process (before or after the next writer opened).
``hooks``      ``walkit.testing.FaultyCluster`` (in-process bookies behind loopback
               proxies): faults that need a hook inside the bookie or the network:
               crash + restart, partition of one bookie from every client, slow fsync,
               read-only (disk full), metadata session expiry of a bookie or of the
               writer's client, writer failover (the next writer opens while the old one
               keeps appending; then the old client is closed under it).

Either runs on the embedded ``local://`` store, a real standalone ZooKeeper (``zk``: the
suite's, passed in by the caller) or a 3-node ZooKeeper ensemble the run starts for
itself (``zk3``), whose plans add the fault ``zk-node-down``: SIGKILL of one node (the
leader, or the node holding the ledger writer's session) for 1 to 4 s, then a restart,
never two nodes down at once. ``zk3`` plans are ``zk`` plans with the ZooKeeper faults
drawn from a second stream, ``random.Random(f"{seed}/zk")``: the bookie faults of
every seed stay what they were before ``zk3`` existed.

Disks fail from a stream of their own (``random.Random(f"{seed}/disk")``, so that the
other faults of a seed stay what they were): ``disk-full`` in the ``processes`` kind
(the victim's journal disk - ext4 on a loop device - its ledger disk - a tmpfs - or both
really fill, and are freed at the fault's end: :mod:`torture_disks`), ``fsync-fail`` in
the ``hooks`` kind (the victim's journal or ledger fsyncs fail with EIO; at the end it is
crashed and restarted, as an operator replaces a failing disk). Metadata outages come
from another (``f"{seed}/outage"``): in half the plans of 15 s or more, every node of a
``zk3`` ensemble is SIGKILLed for 5 to 12 s (up to 30 s in longer runs) - ``zk-outage``
- or a stuck process holds the ``local://`` database's lock for 2 to 8 s -
``metadata-lock``; faults that need metadata to begin or end are kept away from it.

Autorecovery runs in every bookie (``AUTORECOVERY_OPTIONS``), and half the plans of
20 s or more (a third stream, ``random.Random(f"{seed}/lost")``) lose a bookie for good
in their first half (``lose-bookie``, either kind): SIGKILL, its journal and ledger
directories deleted, a fresh bookie (a new id, number 5) started 2 to 8 s later. The
plan makes room for it (:func:`_lose_one` says why the checker stays honest), and
after the run every ledger must be back to its write quorum: no closed ledger names a
bookie gone for good and no under-replication marker is left
(:func:`await_write_quorum`, the ``under-replicated`` anomaly otherwise).

The plan keeps the cluster usable: 5 bookies, ensembles of 3 with Qw = 3 and Qa = 2,
at most Qw - Qa = 1 bookie down at a time, at most 2 bookies impaired (down,
partitioned or read-only) at a time, and journal damage on at most Qa - 1 = 1 bookie
per run (damaging a second one could destroy the two copies of an acknowledged entry,
which no replication scheme survives).

The WAL workload: one writer at a time appends records with a window of futures (one in
``LARGE_EVERY`` or so larger than the log's entries, ``ENTRY_BYTES``: written in two or
three fragments, which readers must only ever hand out whole); a
reader thread tails the log from the start (restarting after its last record on errors); a
second reader replays the whole log every ``REPLAY_EVERY`` seconds. A writer that fails
(fenced, too few bookies) is replaced by a new one, as an application would.
After the faults end, every fault is lifted, the last writer closes, a fresh writer
opens and closes (recovering whatever the previous ones left open), a fresh reader
replays the log (the reference), the tail must catch up with it, and a second fresh
reader must read the same. The ledger workload (tests/support/torture/ledgers.py) runs beside
it on clients of its own: ledgers written one after another, fenced by recovery opens
(periodic, and at each ``failover`` fault), followed by a reader; after the faults every
ledger is recovered and read whole (its reference) and read again by a fresh client.
Last, every ledger must be back to its write quorum.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

import walkit
from support.torture.history import Anomaly, History, Lsn, Read, check
from support.torture.churn import Churn
from support.metadata import StuckLocker
from support.torture.disks import JOURNAL_MB, SmallDisks
from support.torture.ledgers import LedgerWorkload
from walkit import LSN, WriteAheadLog
from walkit.errors import NoSuchLedgerError, UnauthorizedError, UsageError, WalkitError
from walkit.metadata import Cluster as MetadataCluster
from walkit.metadata import LedgerMetadata, LedgerState, UnderReplication, connect
from walkit.wal._format import FRAGMENT_HEAD_SIZE
from walkit.testing import FaultyCluster

if TYPE_CHECKING:
    from support.zk import ZooKeeperEnsemble

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
_DOWN = {"kill", "damage-journal", "lose-bookie", FSYNC_FAIL}
_IMPAIRING = _DOWN | {"partition", "read-only", DISK_FULL}
_INSTANT = {"expire-bookie", "expire-writer", "failover"}
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
_NEEDS_METADATA = _DOWN | {"read-only", "expire-bookie", "expire-writer", ZK_FAULT, DISK_FULL, "failover"}
TESTS = Path(__file__).resolve().parents[2]  # tests/: where ``support`` is importable from


def child_env() -> dict[str, str]:
    """The environment of a child process of the harness (a seed's run, a writer): this
    one's, with tests/ first on PYTHONPATH so that ``python -m support.torture.…`` runs."""
    current = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{current}" if current else str(TESTS)}


def payload(seed: int, writer: int, seq: int) -> bytes:
    """The record ``seq`` of ``writer`` in run ``seed``: unique, 1 byte to 2 KiB of noise, or
    (about one in ``LARGE_EVERY``, chosen by a stream of its own) more than an entry
    holds, up to three entries' worth."""
    rng = random.Random(f"{seed}/{writer}/{seq}")
    head = f"w{writer}s{seq}:".encode()
    if random.Random(f"{seed}/{writer}/{seq}/large").randrange(LARGE_EVERY) == 0:
        return head + rng.randbytes(rng.randint(ENTRY_BYTES - 15, 3 * (ENTRY_BYTES - FRAGMENT_HEAD_SIZE) - len(head)))
    return head + rng.randbytes(rng.randint(1, 2048))


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
        span = f"{self.start:.2f}s" if self.kind in _INSTANT else f"{self.start:.2f}-{self.end:.2f}s"
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
        end = t if kind in _INSTANT else min(seconds, t + rng.uniform(0.3, 2.0))
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
        if fault.kind in _DOWN and fault.start <= quiet and start <= fault.end:
            continue
        if fault.bookie == victim and fault.end >= start:
            if fault.start <= join:
                continue
            fault = dataclasses.replace(fault, bookie=BOOKIES)
        if fault.kind in _IMPAIRING and fault.start <= join and start <= fault.end and sum(
                f.kind in _IMPAIRING and f.start <= fault.end and fault.start <= f.end for f in kept) >= 1:
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
    if fault.kind in _DOWN and sum(f.kind in _DOWN for f in overlapping) >= QW - QA:
        return None
    if fault.kind in _IMPAIRING and sum(f.kind in _IMPAIRING for f in overlapping) >= 2:
        return None
    if not free:
        return None
    how = {"slow-disk": f"{rng.choice([0.05, 0.2, 0.5])} s per sync",
           "damage-journal": rng.choice(["truncate", "corrupt"])}.get(fault.kind, "")
    return dataclasses.replace(fault, bookie=rng.choice(free), how=how)


# -- clusters ------------------------------------------------------------------------------------

class Cluster(Protocol):
    metadata_uri: str
    losses: Losses

    def begin(self, fault: Fault, workload: Workload) -> str: ...

    def end(self, fault: Fault) -> str: ...

    def lift_all(self) -> list[str]: ...

    def gone(self) -> dict[str, str]: ...

    def live(self) -> set[str]: ...

    def why(self, bookie_id: str) -> str:
        """What the bookie says of its mode (for a ``stuck-read-only`` report)."""
        ...

    def stop(self) -> None: ...


class Bookies(Protocol):
    """What :class:`Losses` needs of a LocalCluster or a FaultyCluster."""

    @property
    def bookie_ids(self) -> list[str]: ...

    @property
    def data_dir(self) -> Path: ...

    def is_running(self, i: int) -> bool: ...

    def kill_bookie(self, i: int) -> None: ...

    def add_bookie(self) -> int: ...


class Losses:
    """A cluster's bookies lost for good, the fresh ones that joined, and the watch on the
    repair (:class:`RepairWatch`) from the first loss on."""

    def __init__(self, uri: str, bookies: Bookies) -> None:
        self.uri, self._bookies = uri, bookies
        self.lost: dict[int, tuple[str, float]] = {}  # bookie number -> (id, time of the loss)
        self.joined: dict[int, tuple[str, float]] = {}  # bookie number -> (id, time it joined)
        self.watch: RepairWatch | None = None

    def lose(self, i: int) -> str:
        """SIGKILL bookie ``i`` (unless it is down already) and delete its journal and
        ledger directories (its log and configuration stay, for whoever reads them)."""
        c = self._bookies
        bookie_id = c.bookie_ids[i]
        if c.is_running(i):
            c.kill_bookie(i)
        self.lost[i] = (bookie_id, time.monotonic())
        for part in ("journal", "ledgers"):  # resolved: on a small disk they are symlinks into its mount
            shutil.rmtree((c.data_dir / f"bookie-{i}" / part).resolve(), ignore_errors=True)
        if self.watch is None:
            self.watch = RepairWatch(self.uri, bookie_id)
        return f"killed, its journal and ledgers deleted: {bookie_id} is lost for good"

    def join(self, planned: int) -> str:
        """Start the fresh bookie, which should get the number ``planned`` the plan gave it."""
        i = self._bookies.add_bookie()
        bookie_id = self._bookies.bookie_ids[i]
        self.joined[i] = (bookie_id, time.monotonic())
        return f"fresh bookie {i} ({bookie_id}) joined" + ("" if i == planned else f", not {planned} as planned")

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()


class HookCluster:
    """In-process bookies with every hook of :class:`walkit.testing.FaultyCluster`."""

    def __init__(self, directory: Path, metadata_uri: str | None) -> None:
        self.cluster = FaultyCluster(directory, BOOKIES, metadata_uri=metadata_uri, session_timeout=SESSION_TIMEOUT,
                                     bookie_options=BOOKIE_OPTIONS)
        self.metadata_uri = self.cluster.metadata_uri
        self.losses = Losses(self.metadata_uri, self.cluster)
        self._ended: set[Fault] = set()
        self._begun: list[Fault] = []

    def begin(self, fault: Fault, workload: Workload) -> str:
        c, b = self.cluster, fault.bookie
        self._begun.append(fault)
        if fault.kind == "kill":
            c.kill_bookie(b)
        elif fault.kind == LOST:
            return self.losses.lose(b)
        elif fault.kind == "partition":
            c.partition(b)
        elif fault.kind == "slow-disk":
            c.slow_disk(b, float(fault.how.split()[0]))
        elif fault.kind == "read-only":
            c.set_read_only(b, True)
        elif fault.kind in ("expire-bookie", "expire-writer"):
            bk = workload.current_client() if fault.kind == "expire-writer" else None
            if fault.kind == "expire-writer" and bk is None:
                return "no in-process writer client"
            if bk is None:  # a session between ZooKeeper nodes is expired once it is back on one
                c.expire_session(b)
            else:
                c.expire_session(client=bk)
        elif fault.kind == "failover":
            return workload.failover(fault.how)
        elif fault.kind == FSYNC_FAIL:
            if not c.is_running(b):
                return "left alone: not running"
            c.fail_sync(b, fault.how, count=1 << 20)  # every sync until the restart: the disk is failing
            return f"{fault.how} fsyncs fail from now on"
        return "done"

    def end(self, fault: Fault) -> str:
        c, b = self.cluster, fault.bookie
        self._ended.add(fault)
        if fault.kind == FSYNC_FAIL:
            return self._replace_failing_disk(b, fault.how)
        if fault.kind == "kill":
            c.restart_bookie(b)
        elif fault.kind == LOST:
            return self.losses.join(BOOKIES)
        elif fault.kind == "partition":
            c.heal(b)
        elif fault.kind == "slow-disk":
            c.slow_disk(b, 0)
        elif fault.kind == "read-only":
            c.set_read_only(b, False)
        return "done"

    def _replace_failing_disk(self, b: int, directory: str) -> str:
        """The operator's answer to a failing disk: the bookie is crashed (it may not stop
        cleanly on it) and restarted once the disk is sound again; it replays its journal."""
        c = self.cluster
        if not c.is_running(b):
            c.fail_sync(b, directory, 0)
            return "not running"
        failure = c.server(b).failure
        c.kill_bookie(b)
        c.fail_sync(b, directory, 0)
        c.restart_bookie(b)
        return f"{'failed' if failure is not None else 'had not synced'}; crashed and restarted"

    def lift_all(self) -> list[str]:
        notes = []
        for fault in self._begun:
            if fault not in self._ended and fault.kind not in _INSTANT:
                notes.append(f"lifted {fault}: {_attempt(functools.partial(self.end, fault))}")
        return notes

    def gone(self) -> dict[str, str]:
        """The bookies gone for good (id: why)."""
        return {bookie_id: "lost for good" for bookie_id, _ in self.losses.lost.values()}

    def live(self) -> set[str]:
        """The ids of the bookies running now."""
        return {b for i, b in enumerate(self.cluster.bookie_ids) if self.cluster.is_running(i)}

    def why(self, bookie_id: str) -> str:
        server = self.cluster.server(self.cluster.bookie_ids.index(bookie_id))
        return f"read-only {server.readonly}, forced {server.forced_readonly}, failure {server.failure}"

    def stop(self) -> None:
        self.losses.stop()
        self.cluster.stop()


class ProcessCluster:
    """Real bookie processes: SIGKILL, and journal damage while a bookie is down."""

    def __init__(self, directory: Path, metadata_uri: str | None, plan: Plan) -> None:
        victims = {f.bookie for f in plan.faults if f.kind == DISK_FULL}
        self.disks = SmallDisks(directory.parent / "disks", directory, victims)
        try:
            self.cluster = walkit.LocalCluster(directory, BOOKIES, processes=True, metadata_uri=metadata_uri,
                                               session_timeout=SESSION_TIMEOUT, bookie_options=BOOKIE_OPTIONS)
        except BaseException:
            self.disks.release()
            raise
        self.metadata_uri = self.cluster.metadata_uri
        self.losses = Losses(self.metadata_uri, self.cluster)
        self._directory = directory
        self._refused: set[int] = set()  # bookies that refused to start on a damaged journal

    def begin(self, fault: Fault, workload: Workload) -> str:
        if fault.kind == "failover":
            return workload.failover(fault.how)
        if fault.kind == LOST:  # a bookie that refused its damaged journal may be the one lost
            return self.losses.lose(fault.bookie)
        if fault.bookie in self._refused:
            return "left alone: it refused to start on its damaged journal"
        if fault.kind == DISK_FULL:
            return self.disks.fill(fault.bookie, fault.how)
        self.cluster.kill_bookie(fault.bookie)
        if fault.kind == "damage-journal":
            return damage_journal(self._directory / f"bookie-{fault.bookie}" / "journal", fault.how,
                                  random.Random(fault.salt))
        return "killed"

    def end(self, fault: Fault) -> str:
        if fault.kind == LOST:
            return self.losses.join(BOOKIES)
        if fault.kind == DISK_FULL:
            return f"{self._registration(fault.bookie)} when freed; {self.disks.free(fault.bookie)}"
        if fault.kind in _DOWN and fault.bookie not in self._refused and not self.cluster.is_running(fault.bookie):
            return self._restart(fault.bookie)
        return "nothing to do"

    def lift_all(self) -> list[str]:
        """Restart every bookie down (but those refused or lost); a loss whose fresh
        bookie has not joined yet was an end the run did not reach, which cannot happen
        (the plan puts it in the first half)."""
        freed = [f"small disk of {note}" for note in self.disks.free_all()]
        return freed + [f"restart of bookie {i}: {_attempt(functools.partial(self._restart, i))}"
                        for i in range(len(self.cluster.bookie_ids))
                        if i not in self._refused and i not in self.losses.lost and not self.cluster.is_running(i)]

    def gone(self) -> dict[str, str]:
        """The bookies gone for good (id: why)."""
        ids = self.cluster.bookie_ids
        return {**{ids[i]: "refused its damaged journal" for i in self._refused},
                **{bookie_id: "lost for good" for bookie_id, _ in self.losses.lost.values()}}

    def live(self) -> set[str]:
        """The ids of the bookies running now."""
        return {b for i, b in enumerate(self.cluster.bookie_ids) if self.cluster.is_running(i)}

    def why(self, bookie_id: str) -> str:
        """The last lines of the bookie's log that speak of its mode or an error."""
        log = self._directory / f"bookie-{self.cluster.bookie_ids.index(bookie_id)}" / "bookie.log"
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"no log: {exc}"
        said = [line for line in lines if " ERROR " in line or "read-only" in line or "writable" in line]
        return " | ".join(line[:300] for line in said[-4:]) or "its log says nothing of its mode"

    def _registration(self, i: int) -> str:
        """How bookie ``i`` is registered now: writable, read-only or not at all."""
        bookie_id = self.cluster.bookie_ids[i]
        with connect(self.metadata_uri, session_timeout=CLIENT["session_timeout"]) as meta:
            bookies = meta.bookies()
        return ("writable" if bookie_id in bookies.writable else "read-only" if bookie_id in bookies.readonly
                else "not registered")

    def _restart(self, i: int) -> str:
        """Restart bookie ``i``; one that refuses its damaged journal stays down for good
        (CorruptionError: valid data after a bad frame is never hidden)."""
        try:
            self.cluster.restart_bookie(i)
        except WalkitError as exc:
            if "CorruptionError" in str(exc):
                self._refused.add(i)
            raise
        return "restarted"

    def stop(self) -> None:
        self.losses.stop()
        try:
            self.cluster.stop()
        finally:
            self.disks.release()


class EnsembleFaults:
    """A cluster whose metadata store is a 3-node ZooKeeper ensemble: ``zk-node-down`` and
    ``zk-outage`` (every node) here, every other fault passed on to the bookies' cluster.
    A node's restart does not hold up the schedule (a JVM takes seconds to serve): a
    thread waits for it, and the next ZooKeeper fault waits for that thread, so one node
    at most is ever down but during an outage."""

    def __init__(self, cluster: Cluster, ensemble: ZooKeeperEnsemble) -> None:
        self.cluster = cluster
        self.metadata_uri = cluster.metadata_uri
        self.losses = cluster.losses
        self.ensemble = ensemble
        self.session_client: Callable[[], walkit.BookKeeper | None] = lambda: None
        self._down: dict[Fault, list[int]] = {}
        self._restarting: threading.Thread | None = None
        self.notes: list[str] = []

    def begin(self, fault: Fault, workload: Workload) -> str:
        if fault.kind not in (ZK_FAULT, ZK_OUTAGE):
            return self.cluster.begin(fault, workload)
        e = self.ensemble
        self._wait_restart()
        not_serving = [i for i in range(e.SIZE) if not e.mode(i)]
        if not_serving:
            return f"left alone: node {not_serving[0]} is not serving"
        try:
            victims, why = (list(range(e.SIZE)), "every node") if fault.kind == ZK_OUTAGE else self._victim(fault.how)
            for victim in victims:
                e.kill(victim)
        except RuntimeError as exc:
            return f"failed: {str(exc).splitlines()[0][:200]}"
        self._down[fault] = victims
        return f"killed node{'s' if len(victims) > 1 else ''} {', '.join(map(str, victims))} ({why})"

    def _victim(self, how: str) -> tuple[list[int], str]:
        """The node to kill: the leader, or the node holding the session of the ledger
        writer's client (the leader when that is not known)."""
        client = self.session_client() if how == "session" else None
        if client is not None:
            session = getattr(client._cluster.store, "session_id", 0)
            node = self.ensemble.node_of_session(session) if session else None
            if node is not None:
                return [node], f"the ledger writer's session 0x{session:x}"
        return [self.ensemble.leader(timeout=10)], "leader"

    def end(self, fault: Fault) -> str:
        if fault.kind not in (ZK_FAULT, ZK_OUTAGE):
            return self.cluster.end(fault)
        victims = self._down.pop(fault, None)
        if victims is None:
            return "nothing to do"
        names = ", ".join(map(str, victims))

        def restart() -> None:
            self.notes.append(f"ZooKeeper node{'s' if len(victims) > 1 else ''} {names} restarted: "
                              f"{self._restart(*victims)}")

        self._restarting = threading.Thread(target=restart, name="torture-zk-restart", daemon=True)
        self._restarting.start()
        return f"restarting node{'s' if len(victims) > 1 else ''} {names}"

    def _wait_restart(self) -> None:
        if self._restarting is not None:
            self._restarting.join()
            self._restarting = None

    def _restart(self, *nodes: int) -> str:
        """Start ``nodes`` again on their own data (together: an ensemble needs a quorum to
        serve) and wait until each serves."""
        started = time.monotonic()
        try:
            for i in nodes:
                if not self.ensemble.running(i):
                    self.ensemble.start(i)
            for i in nodes:
                self.ensemble.wait_serving(i)
        except RuntimeError as exc:
            return f"failed: {str(exc).splitlines()[0][:200]}"
        return f"serving after {time.monotonic() - started:.1f} s"

    def lift_all(self) -> list[str]:
        self._wait_restart()
        down = [i for i in range(self.ensemble.SIZE) if not self.ensemble.mode(i)]
        notes = [f"restart of ZooKeeper nodes {down}: {self._restart(*down)}"] if down else []
        return self.notes + notes + self.cluster.lift_all()

    def gone(self) -> dict[str, str]:
        return self.cluster.gone()

    def live(self) -> set[str]:
        return self.cluster.live()

    def why(self, bookie_id: str) -> str:
        return self.cluster.why(bookie_id)

    def stop(self) -> None:
        self.cluster.stop()


class LockFaults:
    """A cluster on the embedded ``local://`` store: ``metadata-lock`` here (another
    process takes the database's write lock and is SIGSTOPped, then killed at the
    fault's end), every other fault passed on to the bookies' cluster."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.metadata_uri = cluster.metadata_uri
        self.losses = cluster.losses
        self._file = Path(self.metadata_uri.removeprefix("local://")) / "metadata.sqlite"
        self._lockers: dict[Fault, StuckLocker] = {}

    def begin(self, fault: Fault, workload: Workload) -> str:
        if fault.kind != METADATA_LOCK:
            return self.cluster.begin(fault, workload)
        self._lockers[fault] = StuckLocker(self._file)
        return f"{self._file.name} locked by a stuck process (pid {self._lockers[fault].proc.pid})"

    def end(self, fault: Fault) -> str:
        if fault.kind != METADATA_LOCK:
            return self.cluster.end(fault)
        locker = self._lockers.pop(fault, None)
        if locker is None:
            return "nothing to do"
        locker.release()
        return "the stuck process killed: lock released"

    def lift_all(self) -> list[str]:
        notes = [f"lifted {fault}: {self.end(fault)}" for fault in list(self._lockers)]
        return notes + self.cluster.lift_all()

    def gone(self) -> dict[str, str]:
        return self.cluster.gone()

    def live(self) -> set[str]:
        return self.cluster.live()

    def why(self, bookie_id: str) -> str:
        return self.cluster.why(bookie_id)

    def stop(self) -> None:
        for locker in self._lockers.values():
            locker.release()
        self.cluster.stop()


def damage_journal(directory: Path, how: str, rng: random.Random) -> str:
    """Truncate the newest journal with frames inside its last 64 KiB of frames, or flip
    one byte there. Replay must drop a torn tail and refuse (CorruptionError) valid
    frames after a bad one; either way no acknowledged record may be lost, since the
    other copies of each entry are intact."""
    from bookie.fs.real import RealFS
    from bookie.journal._files import list_journals
    from bookie.journal._format import journal_name
    from bookie.journal._replay import scan_journal

    fs = RealFS()
    for jid in reversed(list_journals(fs, str(directory))):
        frames, stop, alignment = scan_journal(fs, str(directory), jid)
        if not frames:
            continue
        path = directory / journal_name(jid)
        offset = rng.randrange(max(alignment, stop.offset - (64 << 10)), stop.offset)
        if how == "truncate":
            os.truncate(path, offset)
            return f"journal {jid:x} truncated at {offset} (frames ended at {stop.offset})"
        with open(path, "r+b") as fh:
            fh.seek(offset)
            byte = fh.read(1)
            fh.seek(offset)
            fh.write(bytes([byte[0] ^ 0x5A]))
        return f"journal {jid:x}: byte {offset} flipped (frames ended at {stop.offset})"
    return "no journal with frames"


# -- the repair ------------------------------------------------------------------------------------

def _names(meta: LedgerMetadata) -> set[str]:
    return {b for _, ensemble in meta.ensembles for b in ensemble}


class RepairWatch:
    """From a loss on, which ledgers name the lost bookie, once a second, and when none
    does any more: what autorecovery repaired and how long it took. (Judged by
    :func:`await_write_quorum` at the end; this is the report's account.)"""

    def __init__(self, uri: str, bookie: str) -> None:
        self._uri, self.bookie = uri, bookie
        self.lost_at = time.monotonic()
        self.named: set[int] = set()  # every ledger seen naming the bookie
        self.naming: set[int] = set()  # those naming it at the latest look
        self.existing: set[int] = set()
        self.repaired_at: float | None = None  # since when no ledger names it
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torture-repair-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            cluster = connect(self._uri, session_timeout=CLIENT["session_timeout"])
        except WalkitError:
            self.errors += 1
            return
        with cluster:
            opened: set[int] = set()  # ledgers open at the latest look: an ensemble change may add the bookie
            while not self._stop.wait(1.0):
                try:
                    opened = self._look(cluster, opened)
                except WalkitError:
                    self.errors += 1

    def _look(self, cluster: MetadataCluster, opened: set[int]) -> set[int]:
        ids = set(cluster.ledgers.ledger_ids())
        still_open: set[int] = set()
        for ledger_id in sorted((ids - self.existing) | (self.naming & ids) | (opened & ids)):
            try:
                meta, _ = cluster.ledgers.read(ledger_id)
            except NoSuchLedgerError:
                continue
            if meta.state is not LedgerState.CLOSED:
                still_open.add(ledger_id)
            if self.bookie in _names(meta):
                self.naming.add(ledger_id)
                self.named.add(ledger_id)
            else:
                self.naming.discard(ledger_id)
        self.existing, self.naming = ids, self.naming & ids
        if self.naming:
            self.repaired_at = None
        elif self.repaired_at is None:
            self.repaired_at = time.monotonic()
        return still_open

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def account(self) -> str:
        """Ledgers repaired (seen naming the bookie, existing, naming it no more) and how long it took."""
        if not self.named and self.repaired_at is not None:
            return ("autorecovery: no ledger named the lost bookie (it held nothing, or it had been down long "
                    "enough to be repaired before)")
        repaired = len((self.named & self.existing) - self.naming)
        deleted = len(self.named - self.existing)
        took = f"in {self.repaired_at - self.lost_at:.1f} s" if self.repaired_at is not None else "not finished"
        return (f"autorecovery: {repaired} ledgers repaired {took} from the loss ({deleted} more deleted meanwhile, "
                f"{len(self.naming)} still naming it{f', {self.errors} looks failed' if self.errors else ''})")


def await_write_quorum(uri: str, gone: dict[str, str], timeout: float = REPAIR_WAIT) -> tuple[list[Anomaly], str]:
    """After the run, every fault lifted and every ledger recovered: wait until no closed
    ledger names a bookie ``gone`` for good (lost, or refused its damaged journal) and no
    under-replication marker is left; an ``under-replicated`` anomaly if that takes over
    ``timeout`` seconds.

    A ledger still open then has no writer left (the end-of-run recoveries closed every
    ledger the workloads know; what stays open was abandoned: e.g. a segment a WAL writer
    created just before its SIGKILL, never named by the log). If it is marked or names a
    gone bookie, the check closes it first (a recovery open), as BookKeeper's
    replication worker would after ``openLedgerRereplicationGracePeriod`` - walkit's
    waits for the writer - and says so."""
    started, closed = time.monotonic(), None
    verdict: tuple[list[int], list[int], list[int]] | None = None
    while True:
        error = ""
        try:
            with connect(uri, session_timeout=CLIENT["session_timeout"]) as cluster:
                markers = UnderReplication(cluster.store, cluster.info)
                if closed is None:
                    closed = _close_abandoned(uri, cluster, markers, set(gone))
                verdict = _under_replicated(cluster, markers, set(gone))
        except WalkitError as exc:
            error = f", {_summary(exc)}"
        waited = time.monotonic() - started
        if verdict is not None and not error and not verdict[0] and not verdict[1]:
            still_open = f"; open ledgers left alone: {verdict[2]}" if verdict[2] else ""
            return [], f"every ledger at its write quorum after {waited:.1f} s{closed or ''}{still_open}"
        if waited > timeout:
            break
        time.sleep(0.5)
    naming, marked, opened = verdict or ([], [], [])
    detail = (f"after {timeout:g} s, closed ledgers naming a bookie gone for good ({', '.join(sorted(gone)) or '-'}): "
              f"{naming[:10]}, marked: {marked[:10]}, open: {opened[:10]}{closed or ''}{error}")
    return [Anomaly("under-replicated", f"cluster: {detail}")], f"not every ledger at its write quorum: {detail}"


def await_writable(uri: str, expected: set[str], why: Callable[[str], str],
                   timeout: float = WRITABLE_WAIT) -> tuple[list[Anomaly], str]:
    """After the run, every fault lifted: wait until every bookie of ``expected`` (those
    running and not gone for good) is registered writable again - a bookie read-only
    for a full disk must come back once space is freed, one whose fsync failed once it
    was restarted; a ``stuck-read-only`` anomaly if one is not after ``timeout`` s, with
    what each such bookie says of itself (``why``)."""
    started, state = time.monotonic(), ""
    while True:
        try:
            with connect(uri, session_timeout=CLIENT["session_timeout"]) as cluster:
                bookies = cluster.bookies()
            missing = sorted(expected - set(bookies.writable))
            state = f"read-only: {sorted(expected & set(bookies.readonly))}, not registered: " \
                    f"{sorted(expected - set(bookies.writable) - set(bookies.readonly))}"
        except WalkitError as exc:
            missing, state = sorted(expected), _summary(exc)
        waited = time.monotonic() - started
        if not missing:
            return [], f"every bookie writable after {waited:.1f} s"
        if waited > timeout:
            said = "; ".join(f"{b} says: {_said(why, b)}" for b in missing)
            detail = f"after {timeout:g} s, not writable: {missing} ({state}); {said}"
            return [Anomaly("stuck-read-only", f"cluster: {detail}")], detail
        time.sleep(0.5)


def _said(why: Callable[[str], str], bookie_id: str) -> str:
    try:
        return why(bookie_id)
    except Exception as exc:  # noqa: BLE001 - a report, whatever the bookie's state
        return f"unknown ({exc!r})"


def _under_replicated(cluster: MetadataCluster, markers: UnderReplication,
                      gone: set[str]) -> tuple[list[int], list[int], list[int]]:
    """Closed ledgers naming a bookie of ``gone``, ledgers marked under-replicated, open ledgers."""
    naming, opened = [], []
    for ledger_id in cluster.ledgers.ledger_ids():
        try:
            meta, _ = cluster.ledgers.read(ledger_id)
        except NoSuchLedgerError:
            continue
        if meta.state is not LedgerState.CLOSED:
            opened.append(ledger_id)
        elif _names(meta) & gone:
            naming.append(ledger_id)
    return naming, markers.ledgers(), opened


def _close_abandoned(uri: str, cluster: MetadataCluster, markers: UnderReplication, gone: set[str]) -> str:
    """Close (recovery open) every open ledger that is marked or names a bookie of
    ``gone``; a note naming them ("" if none)."""
    marked = set(markers.ledgers())
    abandoned = []
    for ledger_id in cluster.ledgers.ledger_ids():
        try:
            meta, _ = cluster.ledgers.read(ledger_id)
        except NoSuchLedgerError:
            continue
        if meta.state is not LedgerState.CLOSED and (ledger_id in marked or _names(meta) & gone):
            abandoned.append(ledger_id)
    if not abandoned:
        return ""
    with walkit.BookKeeper(uri, **CLIENT) as bk:
        outcomes = [f"{ledger_id} ({_close_one(bk, ledger_id)})" for ledger_id in abandoned]
    return f"; abandoned open ledgers closed by the check: {', '.join(outcomes)}"


def _close_one(bk: walkit.BookKeeper, ledger_id: int) -> str:
    """Recover and close one ledger, with the password of whichever workload made it."""
    for password in PASSWORDS:
        try:
            bk.open_ledger(ledger_id, password, recovery=True).close()
            return "closed"
        except UnauthorizedError:
            continue
        except WalkitError as exc:
            return f"failed: {_summary(exc)}"
    return "failed: no workload's password"
def _attempt(action: Callable[[], str]) -> str:
    try:
        return action()
    except WalkitError as exc:
        return f"failed: {_summary(exc)}"


def _summary(exc: BaseException) -> str:
    """The error's first line, and the last error its quoted bookie log names."""
    lines = str(exc).splitlines() or [""]
    quoted = [line.strip() for line in lines[1:] if "Error" in line]
    return f"{type(exc).__name__}: {lines[0][:200]}" + (f" | {quoted[-1][:300]}" if quoted else "")


# -- writers ---------------------------------------------------------------------------------------

def pump(wal: WriteAheadLog, seed: int, writer: int, stop: threading.Event,
         on_sent: Callable[[int, bytes], None], on_ack: Callable[[int, Lsn, float], None],
         on_fail: Callable[[int, str], None]) -> None:
    """Append records with ``WINDOW`` futures in flight until ``stop`` or the log fails."""
    window = threading.BoundedSemaphore(WINDOW)
    failed = threading.Event()

    def done(seq: int, fut: Future[LSN]) -> None:
        at = time.monotonic()
        error = fut.exception()
        if error is None:
            lsn = fut.result()
            on_ack(seq, (lsn.segment, lsn.entry, lsn.slot), at)
        else:
            on_fail(seq, f"{type(error).__name__}: {str(error)[:200]}")
            failed.set()
        window.release()

    seq = 0
    while not stop.is_set() and not failed.is_set():
        if not window.acquire(timeout=0.1):
            continue
        seq += 1
        data = payload(seed, writer, seq)
        on_sent(seq, data)
        try:
            fut = wal.append_async(data)
        except WalkitError as exc:
            on_fail(seq, f"{type(exc).__name__}: {str(exc)[:200]}")
            return
        fut.add_done_callback(functools.partial(done, seq))


def open_log(bk: walkit.BookKeeper, attempts: int = 5) -> WriteAheadLog:
    """Become the writer, trying again while faults make the open fail."""
    for attempt in range(attempts):
        try:
            return WriteAheadLog.open(bk, LOG, ensemble_size=ENSEMBLE, write_quorum=QW, ack_quorum=QA,
                                      roll_seconds=ROLL_SECONDS, max_entry_bytes=ENTRY_BYTES)
        except WalkitError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


class Writer(Protocol):
    number: int

    def alive(self) -> bool: ...

    def client(self) -> walkit.BookKeeper | None: ...

    def close(self) -> None: ...

    def crash(self) -> None: ...


class ThreadWriter:
    """A writer in this process, on a client of its own."""

    def __init__(self, number: int, uri: str, seed: int, history: History) -> None:
        self.number = number
        self._history = history
        self._stop = threading.Event()
        self._bk = walkit.BookKeeper(uri, **CLIENT)
        try:
            self._wal = open_log(self._bk)
        except BaseException:
            self._bk.close()
            raise
        history.opened(number, time.monotonic())
        self._thread = threading.Thread(target=pump, name=f"torture-writer-{number}", daemon=True, args=(
            self._wal, seed, number, self._stop, lambda s, d: history.sent(number, s, d, time.monotonic()),
            lambda s, lsn, at: history.acked(number, s, lsn, at), lambda s, e: history.failed(number, s, e)))
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def client(self) -> walkit.BookKeeper | None:
        return self._bk

    def close(self) -> None:
        """Stop appending, wait for what is in flight, close the log and the client."""
        self._stop.set()
        self._thread.join(30)
        with contextlib.suppress(WalkitError):
            self._wal.close()
        self._bk.close()

    def crash(self) -> None:
        """Stop appending and close the client under the log (its segment stays open)."""
        self._stop.set()
        self._thread.join(30)
        with contextlib.suppress(WalkitError):
            self._bk.close()


class ChildWriter:
    """A writer in a child process (tests/support/torture/writer.py) that reports on its stdout."""

    def __init__(self, number: int, uri: str, seed: int, history: History) -> None:
        self.number = number
        self._history = history
        self._opened = threading.Event()
        self._proc = subprocess.Popen([sys.executable, "-m", "support.torture.writer", uri, str(number), str(seed)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      cwd=TESTS, env=child_env())
        self._reader = threading.Thread(target=self._read, name=f"torture-child-{number}", daemon=True)
        self._reader.start()
        if not self._opened.wait(60) or self._proc.poll() is not None and not self._opened.is_set():
            self.crash()
            raise WalkitError("writer process did not open the log", writer=number)

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._handle(line.decode(errors="replace").split())
        self._opened.set()  # an exit before the open wakes the constructor too

    def _handle(self, words: list[str]) -> None:
        h, n = self._history, self.number
        try:
            if words[0] == "open":
                h.opened(n, float(words[1]))
                self._opened.set()
            elif words[0] == "sent":
                seq = int(words[1])
                h.sent(n, seq, payload(int(words[2]), n, seq), float(words[3]))
            elif words[0] == "ack":
                h.acked(n, int(words[1]), (int(words[2]), int(words[3]), int(words[4])), float(words[5]))
            elif words[0] == "fail":
                h.failed(n, int(words[1]), " ".join(words[2:]))
        except (IndexError, ValueError, KeyError):
            return  # the torn last line of a killed process

    def alive(self) -> bool:
        return self._proc.poll() is None

    def client(self) -> walkit.BookKeeper | None:
        return None

    def close(self) -> None:
        stdin: IO[bytes] | None = self._proc.stdin
        with contextlib.suppress(OSError):
            if stdin is not None:
                stdin.close()  # EOF: stop, flush, close the log, exit
        try:
            self._proc.wait(60)
        except subprocess.TimeoutExpired:
            self.crash()
        self._reader.join(10)

    def crash(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(signal.SIGKILL)
        self._proc.wait(30)
        self._reader.join(10)


# -- readers ---------------------------------------------------------------------------------------

class Tail:
    """A reader thread that tails the log from its start, resuming after its last record
    when a read fails."""

    def __init__(self, uri: str, history: History) -> None:
        self._bk = walkit.BookKeeper(uri, **CLIENT)
        self._reader = WriteAheadLog.reader(self._bk, LOG)
        self.read = history.read("tail", "tail", time.monotonic())
        self._thread = threading.Thread(target=self._run, name="torture-tail", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        after: LSN | None = None
        while True:
            try:
                for lsn, record in self._reader.tail(after, poll_timeout=0.5):
                    self.read.records.append(((lsn.segment, lsn.entry, lsn.slot), record))
                    after = lsn
            except UsageError:
                return  # closed
            except WalkitError as exc:
                self.read.errors.append(_summary(exc))
                time.sleep(0.2)

    def catch_up(self, count: int, timeout: float) -> bool:
        return self.read.wait_for(count, timeout)

    def close(self) -> None:
        self._reader.close()
        self._thread.join(30)
        self._bk.close()


def replay_once(bk: walkit.BookKeeper, read: Read) -> None:
    """Replay the whole log into ``read`` (an error ends it: what came before stands)."""
    try:
        with WriteAheadLog.reader(bk, LOG) as reader:
            for lsn, record in reader.replay():
                read.records.append(((lsn.segment, lsn.entry, lsn.slot), record))
    except WalkitError as exc:
        read.errors.append(_summary(exc))


class Replayer:
    """Replays the whole log every ``REPLAY_EVERY`` seconds."""

    def __init__(self, uri: str, history: History) -> None:
        self._bk = walkit.BookKeeper(uri, **CLIENT)
        self._history = history
        self._stop = threading.Event()
        self.count = 0
        self._thread = threading.Thread(target=self._run, name="torture-replay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(REPLAY_EVERY):
            replay_once(self._bk, self._history.read("replayer", "replay", time.monotonic()))
            self.count += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self._bk.close()


# -- the workload ------------------------------------------------------------------------------------

class Workload:
    """One writer at a time (replaced when it fails or on failover), a tail, a replayer."""

    def __init__(self, uri: str, seed: int, history: History, in_process: bool) -> None:
        self._uri, self._seed, self._history = uri, seed, history
        self._kind: type[ThreadWriter] | type[ChildWriter] = ThreadWriter if in_process else ChildWriter
        self._lock = threading.Lock()
        self._numbers = 0
        self.notes: list[str] = []
        self._stop = threading.Event()
        self._writer: Writer | None = self._open()
        self.tail = Tail(uri, history)
        self.replayer = Replayer(uri, history)
        self._supervisor = threading.Thread(target=self._supervise, name="torture-supervisor", daemon=True)
        self._supervisor.start()

    @property
    def writers(self) -> int:
        return self._numbers

    def _open(self) -> Writer:
        self._numbers += 1
        return self._kind(self._numbers, self._uri, self._seed, self._history)

    def current_client(self) -> walkit.BookKeeper | None:
        writer = self._writer
        return writer.client() if writer is not None else None

    def _supervise(self) -> None:
        """A writer whose log failed is replaced (after a pause, as an application would)."""
        while not self._stop.wait(0.2):
            with self._lock:
                writer = self._writer
                if writer is None or writer.alive() or self._stop.is_set():
                    continue
                self.notes.append(f"writer {writer.number} failed; opening writer {self._numbers + 1}")
                writer.crash()
                self._writer = None
                self._writer = self._try_open()

    def _try_open(self) -> Writer | None:
        try:
            return self._open()
        except WalkitError as exc:
            self.notes.append(f"writer {self._numbers} could not open: {_summary(exc)}")
            return None

    def failover(self, how: str) -> str:
        """Replace the writer: ``kill-first`` (SIGKILL, then open), ``overlap-then-kill``
        / ``overlap-then-close`` (open while the old one appends, then kill / close it)."""
        with self._lock:
            old = self._writer
            if how == "kill-first" and old is not None:
                old.crash()
            self._writer = None
            self._writer = self._try_open()
            if how != "kill-first" and old is not None:
                time.sleep(0.3)  # the old writer keeps appending against the fence
                old.crash()
            new = self._writer.number if self._writer is not None else "none"
            return f"writer {old.number if old else 'none'} -> {new}"

    def finish(self) -> None:
        """Stop the supervisor and close the last writer gracefully."""
        self._stop.set()
        self._supervisor.join(60)
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def recover(self) -> None:
        """A fresh writer opens (fencing and closing whatever is left open) and closes."""
        with self._lock:
            self._numbers += 1
            number = self._numbers
        with walkit.BookKeeper(self._uri, **CLIENT) as bk:
            open_log(bk, attempts=10).close()
        self._history.opened(number, time.monotonic())


# -- one run -------------------------------------------------------------------------------------------

@dataclasses.dataclass
class LedgerCounts:
    """What the ledger workload did (``counts`` as :meth:`History.counts`)."""

    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    ledgers: int = 0  # created
    failovers: int = 0  # recovery opens of the writer's current ledger
    late_acks: int = 0  # acknowledgments after the recovery open, inside the recovered ledger
    entries: int = 0  # in the reference
    follower_records: int = 0
    follower_errors: int = 0


@dataclasses.dataclass
class Report:
    """One run, as plain data (picklable: a run may happen in a worker process).
    ``anomalies`` holds both workloads', their details prefixed ``wal:`` or ``ledger:``."""

    plan: Plan
    events: list[str] = dataclasses.field(default_factory=list)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    writers: int = 0
    replays: int = 0
    tail_records: int = 0
    tail_errors: int = 0
    log_records: int = 0
    ledger: LedgerCounts = dataclasses.field(default_factory=LedgerCounts)
    repair: list[str] = dataclasses.field(default_factory=list)  # bookies lost, fresh ones, autorecovery
    anomalies: list[Anomaly] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        p = self.plan
        lines = [f"torture seed={p.seed} seconds={p.seconds:g} cluster={p.mode} metadata={p.metadata}",
                 f"  faults planned: {len(p.faults)}", *(f"    {f}" for f in p.faults),
                 "  what happened:", *(f"    {e}" for e in self.events),
                 f"  records: {self.counts}, writers opened: {self.writers}, log: {self.log_records} records",
                 f"  reads: {self.replays} replays, tail {self.tail_records} records ({self.tail_errors} errors "
                 f"resumed)",
                 f"  ledgers: {self.ledger.counts}, ledgers created: {self.ledger.ledgers}, failovers: "
                 f"{self.ledger.failovers}, late acks inside the recovered ledger: {self.ledger.late_acks}, "
                 f"entries: {self.ledger.entries}",
                 f"  ledger reads: follower {self.ledger.follower_records} entries ({self.ledger.follower_errors} "
                 f"errors resumed)",
                 *(f"  {line}" for line in self.repair),
                 f"  anomalies: {len(self.anomalies)}", *(f"    {a}" for a in self.anomalies[:30]),
                 f"  reproduce: pytest tests/torture/test_torture.py -m torture --torture-seed {p.seed} "
                 f"--torture-seconds {p.seconds:g}"]
        return "\n".join(lines)


def run_faults(plan: Plan, cluster: Cluster, workload: Workload, report: Report, t0: float,
               ledgers: LedgerWorkload | None = None) -> None:
    """Begin and end each fault at its planned offset (late when an earlier one blocked);
    a ``failover`` fails the ledger workload over too."""
    events = sorted([(f.start, 0, f) for f in plan.faults] +
                    [(f.end, 1, f) for f in plan.faults if f.kind not in _INSTANT], key=lambda e: (e[0], e[1]))
    for at, phase, fault in events:
        delay = t0 + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        verb = "end" if phase else "begin"
        if fault.kind == "failover" and ledgers is not None:
            ledgers.failover()
        action = functools.partial(cluster.end, fault) if phase else functools.partial(cluster.begin, fault, workload)
        outcome = _attempt(action)
        report.events.append(f"{time.monotonic() - t0:6.2f}s {verb} {fault.kind}"
                             f"{' bookie %d' % fault.bookie if fault.bookie >= 0 else ''}: {outcome}")


def _repair_account(losses: Losses, t0: float, verdict: str) -> list[str]:
    """The report's lines on bookies lost for good, fresh ones and autorecovery."""
    lines = [f"bookie {i} lost for good at t={at - t0:.1f}s ({name})" for i, (name, at) in losses.lost.items()]
    lines += [f"fresh bookie {i} joined at t={at - t0:.1f}s ({name})" for i, (name, at) in losses.joined.items()]
    if losses.watch is not None:
        lines.append(losses.watch.account())
    return [*lines, f"write quorum: {verdict}"]


def torture(plan: Plan, directory: Path, zookeeper: str | None) -> Report:
    """Run ``plan`` in ``directory`` (``zookeeper``: the standalone server's connect string
    for a ``zk`` plan; a ``zk3`` plan starts and stops an ensemble of its own)."""
    ensemble: ZooKeeperEnsemble | None = None
    if plan.metadata == "zk3":
        from support.zk import ZooKeeperEnsemble

        ensemble = ZooKeeperEnsemble()
    try:
        hosts = ensemble.hosts if ensemble is not None else zookeeper
        uri = f"zk://{hosts}/torture-{os.getpid()}-{time.monotonic_ns()}/ledgers" if plan.metadata != "local" else None
        return _run(plan, directory, uri, ensemble)
    finally:
        if ensemble is not None:
            ensemble.stop()


def _run(plan: Plan, directory: Path, uri: str | None, ensemble: ZooKeeperEnsemble | None) -> Report:
    report = Report(plan)
    history = History()
    bookies: Cluster = (ProcessCluster(directory / "cluster", uri, plan) if plan.mode == "processes"
                        else HookCluster(directory / "cluster", uri))
    cluster = (EnsembleFaults(bookies, ensemble) if ensemble is not None
               else LockFaults(bookies) if plan.metadata == "local" else bookies)
    ledgers: LedgerWorkload | None = None
    churn: Churn | None = None
    try:
        workload = Workload(cluster.metadata_uri, plan.seed, history, in_process=plan.mode == "hooks")
        ledgers = LedgerWorkload(cluster.metadata_uri, plan.seed, CLIENT)
        churn = Churn(cluster.metadata_uri, plan.seed, CLIENT)
        if isinstance(cluster, EnsembleFaults):
            cluster.session_client = ledgers.client
        t0 = time.monotonic()  # fault offsets count from a running workload
        try:
            run_faults(plan, cluster, workload, report, t0, ledgers)
            time.sleep(max(0.0, t0 + plan.seconds - time.monotonic()))
            report.events += cluster.lift_all()
        finally:
            report.events.append(churn.stop())
            report.anomalies += churn.anomalies
            workload.finish()
            ledgers.finish()
            report.events += workload.notes
            workload.replayer.close()
        workload.recover()
        reference = history.read("fresh reader 1", "final", time.monotonic())
        with walkit.BookKeeper(cluster.metadata_uri, **CLIENT) as bk:
            replay_once(bk, reference)
        reference.complete = not reference.errors
        if not workload.tail.catch_up(len(reference.records), 30):
            report.events.append(f"tail did not catch up: {len(workload.tail.read.records)} of "
                                 f"{len(reference.records)} records")
        workload.tail.read.complete = True
        workload.tail.close()
        second = history.read("fresh reader 2", "final", time.monotonic())
        with walkit.BookKeeper(cluster.metadata_uri, **CLIENT) as bk:
            replay_once(bk, second)
        second.complete = True
        history.reads.remove(reference)
        anomalies = check(history, reference)
        if reference.errors:
            anomalies.append(Anomaly("missed", f"the reference replay failed: {reference.errors[0]}"))
        report.anomalies += [Anomaly(a.kind, f"wal: {a.detail}") for a in anomalies]
        report.counts = history.counts()
        report.counts["large_acked"] = sum(len(a.payload) > ENTRY_BYTES - 16 and a.lsn is not None
                                           for a in history.appends.values())  # records of 2 or 3 entries
        report.writers = workload.writers
        report.replays = workload.replayer.count
        report.tail_records = len(workload.tail.read.records)
        report.tail_errors = len(workload.tail.read.errors)
        report.log_records = len(reference.records)
        ledger_anomalies, ledger_reference = ledgers.judge()
        report.anomalies += ledger_anomalies
        report.events += [f"ledgers: {note}" for note in ledgers.notes]
        follower = ledgers.follower
        report.ledger = LedgerCounts(
            ledgers.history.counts(), len(ledgers.ledgers.ids),
            ledgers.recoverer.failovers if ledgers.recoverer is not None else 0, ledgers.late_acks(),
            len(ledger_reference.records), len(follower.read.records) if follower is not None else 0,
            len(follower.read.errors) if follower is not None else 0)
        repair_anomalies, verdict = await_write_quorum(cluster.metadata_uri, cluster.gone())
        report.anomalies += repair_anomalies
        stuck, writable = await_writable(cluster.metadata_uri, cluster.live() - set(cluster.gone()), cluster.why)
        report.anomalies += stuck
        verdict = f"{verdict}; {writable}"
        cluster.losses.stop()
        report.repair = _repair_account(cluster.losses, t0, verdict)
    finally:
        if churn is not None:
            churn.stop()
        if ledgers is not None:
            ledgers.close()
        with contextlib.suppress(WalkitError):
            cluster.stop()
    return report
