"""The torture seeds' scheduler (tests/support/torture/run.py): order, concurrency, failures."""

from __future__ import annotations

from pathlib import Path

import pytest

import support.torture.run as torture_run
from support.torture.run import TortureRunError, TortureRuns
from support.torture.plan import make_plan


def no_zookeeper() -> str:
    raise AssertionError("no plan of these seeds uses the suite's ZooKeeper")


def test_a_run_that_overruns_is_killed_and_reported_with_its_output(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torture_run, "GRACE", -1.0)  # every run is over its time at the first look
    seed = next(s for s in range(50) if make_plan(s, 1.0).metadata != "zk")
    runs = TortureRuns([seed], 1.0, 1, tmp_path)
    with pytest.raises(TortureRunError, match=f"torture seed {seed}: its process exited -9 .* without a report"):
        runs.report(seed, no_zookeeper)
    assert (tmp_path / f"seed-{seed}" / "output.txt").exists()


def test_runs_start_in_seed_order_and_at_most_jobs_at_a_time(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    runs = TortureRuns([3, 1, 2], 1.0, 2, tmp_path)

    def start(run: torture_run._Run, zookeeper: object) -> None:
        started.append(run.seed)
        run.started = 1.0  # a run that never ends, as far as the scheduler can tell
        run.process = FakeProcess()  # type: ignore[assignment]

    class FakeProcess:
        def poll(self) -> None:
            return None

    monkeypatch.setattr(torture_run, "GRACE", 1e9)
    monkeypatch.setattr(runs, "_start", start)
    runs._step(no_zookeeper)
    runs._step(no_zookeeper)
    assert started == [3, 1]  # the order asked for, two at a time; the third waits for a free slot
