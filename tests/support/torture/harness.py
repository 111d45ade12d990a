"""Seeded torture runs: a WAL workload and a raw-ledger workload on a real cluster
under random faults, each recorded as a :class:`~support.torture.history.History` and judged by
:func:`support.torture.history.check`.

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
really fill, and are freed at the fault's end: :mod:`support.torture.disks`), ``fsync-fail`` in
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
import time
from pathlib import Path
from typing import TYPE_CHECKING

from support.torture.churn import Churn
from support.torture.clusters import Cluster, EnsembleFaults, HookCluster, LockFaults, Losses, ProcessCluster
from support.torture.history import Anomaly, History, check
from support.torture.ledgers import LedgerWorkload
from support.torture.plan import CLIENT, ENTRY_BYTES, Plan, INSTANT
from support.torture.repair import attempt, await_writable, await_write_quorum
from support.torture.workload import Workload, replay_once
import walkit
from walkit.errors import WalkitError

if TYPE_CHECKING:
    from support.zk import ZooKeeperEnsemble


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
                    [(f.end, 1, f) for f in plan.faults if f.kind not in INSTANT], key=lambda e: (e[0], e[1]))
    for at, phase, fault in events:
        delay = t0 + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        verb = "end" if phase else "begin"
        if fault.kind == "failover" and ledgers is not None:
            ledgers.failover()
        action = functools.partial(cluster.end, fault) if phase else functools.partial(cluster.begin, fault, workload)
        outcome = attempt(action)
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
