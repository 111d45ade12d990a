"""Torture runs (issue 7): seeded faults against a WAL workload and a raw-ledger workload,
judged by the history checker; and the checker itself, fed histories with each anomaly.
Since issue 16 autorecovery runs in every bookie, half the long plans lose a bookie for
good, and every run ends with every ledger back to its write quorum.

``pytest -m torture`` runs only the seeded runs (12 seeds of 20 s, two at a time, each in a
process of its own: tests/support/torture/run.py); ``--torture-seed N`` reproduces one
(docs/reliability.md)."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Sequence
from pathlib import Path

import pytest

import support.torture.plan as torture_plan
import walkit
from support.torture.options import torture_seeds
from support.torture.history import Anomaly, History, Read, check, late_acknowledgments
from support.torture.ledgers import ledger_payload
from support.torture.run import TortureRuns
from support.torture.harness import Report
from support.torture.plan import (
    BOOKIES,
    DISK_FULL,
    FSYNC_FAIL,
    Fault,
    LOCK_FOR,
    LOST,
    LOST_MIN_SECONDS,
    METADATA_LOCK,
    OUTAGE_MIN_SECONDS,
    OUTAGE_QUIET,
    QA,
    QW,
    REPAIR_SECONDS,
    ZK_DOWN,
    ZK_FAULT,
    ZK_OUTAGE,
    ZK_OUTAGE_FOR,
    ZK_VICTIMS,
    make_plan,
)
from support.torture.repair import await_write_quorum
from support.torture.workload import payload
from walkit.metadata import UnderReplication, connect


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "torture_seed" in metafunc.fixturenames:
        metafunc.parametrize("torture_seed", torture_seeds(metafunc.config))


# -- the checker -----------------------------------------------------------------------------------

def _history(acks: Sequence[tuple[int, int, tuple[int, int, int] | None]]) -> History:
    """Writer w sends record s (payload ``w/s``) at time s, acknowledged at time s + 0.5 with the LSN."""
    h = History()
    for writer, seq, lsn in acks:
        h.sent(writer, seq, f"{writer}/{seq}".encode(), float(seq))
        if lsn is not None:
            h.acked(writer, seq, lsn, seq + 0.5)
    return h


def _log(*records: tuple[int, int, int, str]) -> Read:
    read = Read("ref", "final", 100.0, complete=True)
    read.records = [((s, e, i), data.encode()) for s, e, i, data in records]
    return read


def _kinds(anomalies: list[Anomaly]) -> list[str]:
    return sorted(a.kind for a in anomalies)


CLEAN = [(1, 1, (1, 0, 0)), (1, 2, (1, 0, 1)), (1, 3, (1, 1, 0))]
CLEAN_LOG = ((1, 0, 0, "1/1"), (1, 0, 1, "1/2"), (1, 1, 0, "1/3"))


def test_a_clean_history_has_no_anomaly() -> None:
    h = _history([*CLEAN, (1, 4, None)])  # record 4's outcome is unknown: absent is fine
    h.opened(1, 0.0)
    tail = h.read("tail", "tail", 1.0)
    tail.records = _log(*CLEAN_LOG).records[:2]
    assert check(h, _log(*CLEAN_LOG)) == []
    h.failed(1, 4, "LedgerFencedError")  # and so is present: unknown outcome, read consistently
    assert check(h, _log(*CLEAN_LOG, (2, 0, 0, "1/4"))) == []


@pytest.mark.parametrize(("log", "kinds"), [
    (CLEAN_LOG[:2], ["lost"]),
    ((*CLEAN_LOG[:2], (1, 1, 0, "1/9")), ["altered", "phantom"]),
    ((*CLEAN_LOG[:2], (1, 1, 0, "1/3"), (1, 2, 0, "1/3")), ["duplicate"]),
    ((CLEAN_LOG[1], CLEAN_LOG[0], CLEAN_LOG[2]), ["read-order"]),
    ((CLEAN_LOG[0], CLEAN_LOG[2]), ["gap", "lost"]),
])
def test_the_reference_log_is_checked(log: tuple[tuple[int, int, int, str], ...], kinds: list[str]) -> None:
    assert _kinds(check(_history(CLEAN), _log(*log))) == kinds


def test_acknowledgments_must_be_unique_and_in_send_order() -> None:
    reused = _history([(1, 1, (1, 0, 0)), (2, 2, (1, 0, 0))])
    assert "lsn-reused" in _kinds(check(reused, _log((1, 0, 0, "1/1"))))
    backwards = _history([(1, 1, (1, 1, 0)), (1, 2, (1, 0, 0))])
    assert "ack-order" in _kinds(check(backwards, _log((1, 0, 0, "1/2"), (1, 1, 0, "1/1"))))


def test_an_acknowledgment_after_a_newer_writer_opened_is_reported() -> None:
    h = _history(CLEAN)  # writer 1's acks come at 1.5, 2.5, 3.5
    h.opened(2, 3.0)
    found = check(h, _log(*CLEAN_LOG))
    assert _kinds(found) == ["ack-after-failover"] and "writer 1 record 3" in found[0].detail
    h.opened(2, 4.0)
    assert check(h, _log(*CLEAN_LOG)) == []


def test_a_fenced_ledger_may_see_late_acks_inside_its_recovered_end_only() -> None:
    h = _history(CLEAN)  # writer 1's acks come at 1.5, 2.5, 3.5 (the shape matters, not ledger-like LSNs)
    h.fenced(1, 3.0, (1, 1, 0))  # recovered up to record 3 at 3.0: its ack at 3.5 was only late
    assert check(h, _log(*CLEAN_LOG)) == []
    assert [(a.writer, a.seq) for a in late_acknowledgments(h)] == [(1, 3)]
    h = _history(CLEAN)
    h.fenced(1, 3.0, (1, 0, 1))  # recovered up to record 2: record 3's ack got past the fence
    found = check(h, _log(*CLEAN_LOG[:2]))
    assert _kinds(found) == ["ack-after-failover", "lost"] and "writer 1 record 3" in found[0].detail
    assert late_acknowledgments(h) == []
    h = _history(CLEAN)
    h.fenced(1, 1.0, (1, 0, 0))  # the earliest recovery open counts: a later one ended the same
    h.fenced(1, 9.0, (1, 0, 0))
    assert _kinds(check(h, _log(*CLEAN_LOG))) == ["ack-after-failover", "ack-after-failover"]


def test_reads_must_be_prefixes_of_the_log_and_complete_reads_hold_everything() -> None:
    h = _history(CLEAN)
    flip = h.read("tail", "tail", 1.0)  # returned an unacknowledged record that later went away
    h.sent(1, 4, b"1/4", 4.0)
    flip.records = [((1, 0, 0), b"1/1"), ((1, 0, 1), b"1/4")]
    assert _kinds(check(h, _log(*CLEAN_LOG))) == ["divergence"]
    flip.records = []
    longer = h.read("replayer", "replay", 2.0)
    longer.records = [*_log(*CLEAN_LOG).records, ((2, 0, 0), b"1/4")]
    assert _kinds(check(h, _log(*CLEAN_LOG))) == ["divergence"]
    longer.records = []
    short = h.read("fresh", "final", 3.0)
    short.complete = True
    short.records = _log(*CLEAN_LOG).records[:2]
    assert _kinds(check(h, _log(*CLEAN_LOG))) == ["missed"]
    short.complete = False  # a read during the run may stop anywhere
    assert check(h, _log(*CLEAN_LOG)) == []


# -- the plan --------------------------------------------------------------------------------------

def _overlapping(faults: tuple[Fault, ...], at: float, kinds: set[str]) -> int:
    return sum(f.kind in kinds and f.start <= at <= f.end for f in faults)


@pytest.mark.parametrize("seed", range(200))
def test_plans_are_reproducible_and_within_the_limits(seed: int) -> None:
    plan = make_plan(seed, 30.0)
    assert plan == make_plan(seed, 30.0)
    lost = [f for f in plan.faults if f.kind == LOST]
    down = {"kill", "damage-journal", LOST, FSYNC_FAIL}
    impairing = down | {"partition", "read-only", DISK_FULL}
    for fault in plan.faults:
        at = fault.start
        assert _overlapping(plan.faults, at, down) <= QW - QA, plan
        assert _overlapping(plan.faults, at, impairing) <= 2, plan
        assert fault.kind in {"failover", "expire-writer", ZK_FAULT, ZK_OUTAGE, METADATA_LOCK} or (
            0 <= fault.bookie < BOOKIES + len(lost)), plan
    for fault in plan.faults:  # disks: the kind the cluster can hurt, never a lost bookie after its loss
        if fault.kind in (DISK_FULL, FSYNC_FAIL):
            assert (plan.mode, fault.how) in {("processes", "journal"), ("processes", "ledgers"),
                                              ("processes", "both"), ("hooks", "journal"), ("hooks", "ledgers")}
            assert (fault.kind == DISK_FULL) == (plan.mode == "processes") and 0 <= fault.bookie < BOOKIES, plan
            assert not [f for f in lost if f.bookie == fault.bookie and fault.end >= f.start], plan
            assert fault.end <= plan.seconds, plan
    outages = [f for f in plan.faults if f.kind in (ZK_OUTAGE, METADATA_LOCK)]
    assert len(outages) <= 1, plan
    for outage in outages:  # whatever needs metadata to begin or end is kept away from it
        assert plan.seconds >= OUTAGE_MIN_SECONDS and outage.end < plan.seconds, plan
        assert (outage.kind, plan.metadata) in {(ZK_OUTAGE, "zk3"), (METADATA_LOCK, "local")}, plan
        low, high = ZK_OUTAGE_FOR if outage.kind == ZK_OUTAGE else LOCK_FOR
        assert low <= outage.end - outage.start <= high, plan
        quiet = (outage.start - OUTAGE_QUIET[0], outage.end + OUTAGE_QUIET[1])
        assert not [f for f in plan.faults if f is not outage and f.kind not in {"partition", "slow-disk"}
                    and f.start <= quiet[1] and quiet[0] <= max(f.end, f.start + (REPAIR_SECONDS if f.kind == LOST
                                                                                   else 0))], plan
    assert len({f.bookie for f in plan.faults if f.kind == "damage-journal"}) <= QA - 1
    assert len(lost) <= 1, plan
    for loss in lost:  # see plan._lose_one
        assert loss.start <= plan.seconds / 2 and loss.end < plan.seconds, plan
        quiet = max(loss.end, loss.start + REPAIR_SECONDS)
        assert not [f for f in plan.faults if f.kind in down - {LOST} and f.start <= quiet and loss.start <= f.end]
        assert all(f.bookie != loss.bookie for f in plan.faults if f.end >= loss.start and f is not loss), plan
        assert all(f.start > loss.end for f in plan.faults if f.bookie == BOOKIES), plan  # the fresh bookie
        assert all(f.end < loss.start and f.bookie == loss.bookie for f in plan.faults if f.kind == "damage-journal")
    zk = [f for f in plan.faults if f.kind == ZK_FAULT]
    assert (plan.metadata == "zk3") == bool(zk), plan
    for fault in zk:  # one node down at a time, each for 1 to 4 s, inside the run
        assert _overlapping(plan.faults, fault.start, {ZK_FAULT}) == 1 and fault.how in ZK_VICTIMS, plan
        assert ZK_DOWN[0] <= fault.end - fault.start <= ZK_DOWN[1] and fault.end <= plan.seconds, plan
    assert [f.start for f in plan.faults] == sorted(f.start for f in plan.faults)
    assert payload(seed, 1, 1) == payload(seed, 1, 1) != payload(seed, 1, 2)
    assert ledger_payload(seed, 1, 1) == ledger_payload(seed, 1, 1) != ledger_payload(seed, 1, 2)


def test_a_loss_comes_from_a_stream_of_its_own_and_only_drops_or_moves_faults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Half the long plans of either kind lose a bookie; without the loss each plan is the
    one it was before losses existed, and the loss only drops faults or gives the lost
    bookie's to the fresh one."""
    plans = {seed: make_plan(seed, 30.0) for seed in range(40)}
    losing = {seed for seed, plan in plans.items() if any(f.kind == LOST for f in plan.faults)}
    assert 10 <= len(losing) <= 30 and {plans[s].mode for s in losing} == {"processes", "hooks"}
    assert {plans[s].metadata for s in losing} == {"local", "zk", "zk3"}
    assert not any(f.kind == LOST for seed in range(40) for f in make_plan(seed, LOST_MIN_SECONDS - 1).faults)
    monkeypatch.setattr(torture_plan, "_disk_faults", lambda rng, faults, seconds, mode: faults)
    monkeypatch.setattr(torture_plan, "_outage", lambda rng, faults, seconds, metadata: faults)
    plans = {seed: make_plan(seed, 30.0) for seed in range(40)}  # the disk and outage streams come later
    monkeypatch.setattr(torture_plan, "LOST_CHANCE", 0.0)
    for seed in losing:
        base = make_plan(seed, 30.0).faults
        victim = next(f.bookie for f in plans[seed].faults if f.kind == LOST)
        for fault in plans[seed].faults:
            assert fault.kind == LOST or fault in base or (
                fault.bookie == BOOKIES and dataclasses.replace(fault, bookie=victim) in base), fault
    assert all(make_plan(seed, 30.0) == plans[seed] for seed in set(plans) - losing)


def test_disk_faults_and_outages_come_from_streams_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Disk faults only add faults to a plan (its other faults are those it had before
    they existed), and an outage only drops faults (those that need metadata near it)."""
    plans = {seed: make_plan(seed, 30.0) for seed in range(60)}
    assert sum(any(f.kind in (ZK_OUTAGE, METADATA_LOCK) for f in p.faults) for p in plans.values()) >= 5
    monkeypatch.setattr(torture_plan, "_outage", lambda rng, faults, seconds, metadata: faults)
    no_outage = {seed: make_plan(seed, 30.0) for seed in plans}
    for seed, plan in plans.items():
        assert {f for f in plan.faults if f.kind not in (ZK_OUTAGE, METADATA_LOCK)} <= set(no_outage[seed].faults)
    monkeypatch.setattr(torture_plan, "_disk_faults", lambda rng, faults, seconds, mode: faults)
    for seed, plan in no_outage.items():
        base = make_plan(seed, 30.0).faults
        assert [f for f in plan.faults if f.kind not in (DISK_FULL, FSYNC_FAIL)] == list(base), seed


def test_the_write_quorum_check_sees_ledgers_naming_a_lost_bookie_and_markers_left(tmp_path: Path) -> None:
    """The end of a run (``await_write_quorum``), here with no autorecovery to repair:
    a closed ledger naming the lost bookie is an anomaly, an abandoned open ledger is
    closed first, a marker left is an anomaly, and without either the cluster passes."""
    with walkit.LocalCluster(tmp_path, 3) as cluster, cluster.client() as bk:
        handles = [bk.create_ledger(3, 3, 2), bk.create_ledger(3, 3, 2)]
        for handle in handles:
            handle.add_entry(b"x")
        handles[0].close()  # the second stays open, abandoned
        lost = cluster.bookie_ids[0]
        cluster.kill_bookie(0)
        anomalies, verdict = await_write_quorum(cluster.metadata_uri, {lost: "lost for good"}, timeout=0.5)
        assert [a.kind for a in anomalies] == ["under-replicated"], verdict
        assert f"gone for good ({lost}): {sorted(h.ledger_id for h in handles)}" in verdict, verdict  # both closed now
        assert f"abandoned open ledgers closed by the check: {handles[1].ledger_id} (closed)" in verdict
        assert await_write_quorum(cluster.metadata_uri, {}, timeout=0.5)[0] == []
        with connect(cluster.metadata_uri) as meta:
            UnderReplication(meta.store, meta.info).mark(handles[0].ledger_id, [lost])
        anomalies, verdict = await_write_quorum(cluster.metadata_uri, {}, timeout=0.5)
        assert [a.kind for a in anomalies] == ["under-replicated"] and f"marked: [{handles[0].ledger_id}]" in verdict


def test_a_report_is_plain_data() -> None:
    report = Report(make_plan(0, 5.0), counts={"acked": 1}, anomalies=[Anomaly("lost", "ledger: x")])
    assert pickle.loads(pickle.dumps(report)) == report


def test_plans_cover_every_fault_kind() -> None:
    kinds = {f.kind for seed in range(20) for f in make_plan(seed, 5.0).faults}
    assert kinds - {DISK_FULL, FSYNC_FAIL} == {"kill", "damage-journal", "failover", "partition", "slow-disk",
                                               "read-only", "expire-bookie", "expire-writer", ZK_FAULT}
    assert {(p.mode, p.metadata) for p in map(lambda s: make_plan(s, 5.0), range(20))} == {
        (mode, metadata) for mode in ("processes", "hooks") for metadata in ("local", "zk", "zk3")}
    assert {f.how for seed in range(20) for f in make_plan(seed, 5.0).faults if f.kind == ZK_FAULT} == set(ZK_VICTIMS)
    long = [make_plan(seed, 30.0) for seed in range(40)]
    assert {f.kind for p in long for f in p.faults} >= {DISK_FULL, FSYNC_FAIL, ZK_OUTAGE, METADATA_LOCK, LOST}
    assert {(f.kind, f.how) for p in long for f in p.faults if f.kind in (DISK_FULL, FSYNC_FAIL)} == {
        (DISK_FULL, "journal"), (DISK_FULL, "ledgers"), (DISK_FULL, "both"), (FSYNC_FAIL, "journal"),
        (FSYNC_FAIL, "ledgers")}


# -- the runs --------------------------------------------------------------------------------------

@pytest.mark.torture
@pytest.mark.timeout(600)
def test_torture(torture_seed: int, torture_runs: TortureRuns, request: pytest.FixtureRequest) -> None:
    """Seed ``torture_seed``'s run (started with the seeds around it: tests/support/torture/run.py)."""
    report = torture_runs.report(torture_seed, lambda: request.getfixturevalue("zk_server").hosts)
    print(report)
    assert report.counts["acked"] > 0, f"nothing was acknowledged\n{report}"
    assert not report.anomalies, f"anomalies found\n{report}"
