"""Torture runs (issue 7): seeded faults against a WAL workload and a raw-ledger workload,
judged by the history checker; and the checker itself, fed histories with each anomaly.

``pytest -m torture`` runs only the seeded runs (20 seeds of 30 s, two at a time, each in a
process of its own: tests/torture_run.py); ``--torture-seed N`` reproduces one
(docs/reliability.md)."""

from __future__ import annotations

import pickle
from collections.abc import Sequence

import pytest

from conftest import torture_seeds
from torture_history import Anomaly, History, Read, check, late_acknowledgments
from torture_ledgers import ledger_payload
from torture_support import BOOKIES, QA, QW, ZK_DOWN, ZK_FAULT, ZK_VICTIMS, Fault, Report, make_plan, payload
from torture_run import TortureRuns


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
    for fault in plan.faults:
        at = fault.start
        assert _overlapping(plan.faults, at, {"kill", "damage-journal"}) <= QW - QA, plan
        assert _overlapping(plan.faults, at, {"kill", "damage-journal", "partition", "read-only"}) <= 2, plan
        assert fault.kind in {"failover", "expire-writer", ZK_FAULT} or 0 <= fault.bookie < BOOKIES
    assert len({f.bookie for f in plan.faults if f.kind == "damage-journal"}) <= QA - 1
    zk = [f for f in plan.faults if f.kind == ZK_FAULT]
    assert (plan.metadata == "zk3") == bool(zk), plan
    for fault in zk:  # one node down at a time, each for 1 to 4 s, inside the run
        assert _overlapping(plan.faults, fault.start, {ZK_FAULT}) == 1 and fault.how in ZK_VICTIMS, plan
        assert ZK_DOWN[0] <= fault.end - fault.start <= ZK_DOWN[1] and fault.end <= plan.seconds, plan
    assert [f.start for f in plan.faults] == sorted(f.start for f in plan.faults)
    assert payload(seed, 1, 1) == payload(seed, 1, 1) != payload(seed, 1, 2)
    assert ledger_payload(seed, 1, 1) == ledger_payload(seed, 1, 1) != ledger_payload(seed, 1, 2)


def test_a_report_is_plain_data() -> None:
    report = Report(make_plan(0, 5.0), counts={"acked": 1}, anomalies=[Anomaly("lost", "ledger: x")])
    assert pickle.loads(pickle.dumps(report)) == report


def test_plans_cover_every_fault_kind() -> None:
    kinds = {f.kind for seed in range(20) for f in make_plan(seed, 5.0).faults}
    assert kinds == {"kill", "damage-journal", "failover", "partition", "slow-disk", "read-only", "expire-bookie",
                     "expire-writer", ZK_FAULT}
    assert {(p.mode, p.metadata) for p in map(lambda s: make_plan(s, 5.0), range(20))} == {
        (mode, metadata) for mode in ("processes", "hooks") for metadata in ("local", "zk", "zk3")}
    assert {f.how for seed in range(20) for f in make_plan(seed, 5.0).faults if f.kind == ZK_FAULT} == set(ZK_VICTIMS)


# -- the runs --------------------------------------------------------------------------------------

@pytest.mark.torture
@pytest.mark.timeout(600)
def test_torture(torture_seed: int, torture_runs: TortureRuns, request: pytest.FixtureRequest) -> None:
    """Seed ``torture_seed``'s run (started with the seeds around it: tests/torture_run.py)."""
    report = torture_runs.report(torture_seed, lambda: request.getfixturevalue("zk_server").hosts)
    print(report)
    assert report.counts["acked"] > 0, f"nothing was acknowledged\n{report}"
    assert not report.anomalies, f"anomalies found\n{report}"
