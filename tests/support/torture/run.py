"""Torture seeds in processes of their own, several at a time.

A seed's run (:func:`harness.torture`) spends most of its 30 s waiting: on
fault offsets, on timeouts, on bookies coming back. Runs of different seeds share
nothing but the suite's ZooKeeper (each on a path of its own), so the suite runs
``jobs`` of them at once, each in a fresh interpreter (no thread, logger or bookie of
one run can leak into the next), and each test waits for its own seed's report.

``python -m support.torture.run SEED SECONDS DIR [ZOOKEEPER]`` (in tests/) runs one seed in the
foreground: it prints the report, writes it (pickled) to ``DIR/report.pickle`` and
exits 0 when the run found no anomaly, 1 when it did. :class:`TortureRuns` starts those
processes, at most ``jobs`` at a time, in seed order, and hands each test its report.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from support.disk import release_mounts
from support.torture import TESTS, child_env
from support.torture.harness import Report, torture
from support.torture.plan import make_plan

GRACE = 240.0  # beyond its planned seconds, how long one run may take before it is killed


class TortureRunError(Exception):
    """A seed's process died or overran without writing its report."""


@dataclasses.dataclass
class _Run:
    seed: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    started: float = 0.0
    finished: float = 0.0

    @property
    def output(self) -> Path:
        return self.directory / "output.txt"

    @property
    def report_file(self) -> Path:
        return self.directory / "report.pickle"


class TortureRuns:
    """Seeds ``seeds`` of ``seconds`` each, ``jobs`` at a time, started in order as
    :meth:`report` is asked for them (and for the ones after them)."""

    def __init__(self, seeds: Sequence[int], seconds: float, jobs: int, directory: Path) -> None:
        self.seconds = seconds
        self.jobs = max(1, jobs)
        self._runs = {seed: _Run(seed, directory / f"seed-{seed}") for seed in seeds}
        self._queue = list(seeds)
        self.reports: dict[int, Report] = {}
        self.walls: dict[int, float] = {}

    def report(self, seed: int, zookeeper: Callable[[], str]) -> Report:
        """Seed ``seed``'s report, once its run ended (starting runs as slots free up;
        ``zookeeper()``: the suite's ZooKeeper, for the runs that use one)."""
        run = self._runs[seed]
        while True:
            self._step(zookeeper)
            if run.process is not None and run.finished:
                return self._collect(run)
            time.sleep(0.1)

    def _step(self, zookeeper: Callable[[], str]) -> None:
        running = [r for r in self._runs.values() if r.process is not None and not r.finished]
        for run in running:
            if run.process is not None and run.process.poll() is not None:
                self._finish(run)
            elif time.monotonic() - run.started > self.seconds + GRACE:
                assert run.process is not None
                run.process.kill()
                run.process.wait()
                self._finish(run)
        while self._queue and sum(1 for r in self._runs.values() if r.process is not None and not r.finished) < self.jobs:
            self._start(self._runs[self._queue.pop(0)], zookeeper)

    def _start(self, run: _Run, zookeeper: Callable[[], str]) -> None:
        run.directory.mkdir(parents=True, exist_ok=True)
        plan = make_plan(run.seed, self.seconds)
        args = [sys.executable, "-m", "support.torture.run", str(run.seed), repr(self.seconds), str(run.directory)]
        if plan.metadata == "zk":
            args.append(zookeeper())
        run.log = run.output.open("wb")
        run.started = time.monotonic()
        run.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=run.log, stderr=subprocess.STDOUT,
                                       cwd=TESTS, env=child_env())

    def _finish(self, run: _Run) -> None:
        """The run's process ended: what a killed run left mounted is released."""
        release_mounts(run.directory)
        run.finished = time.monotonic()
        self.walls[run.seed] = run.finished - run.started
        if run.log is not None:
            run.log.close()

    def _collect(self, run: _Run) -> Report:
        assert run.process is not None
        if not run.report_file.exists():
            tail = run.output.read_text(errors="replace")[-6000:]
            raise TortureRunError(f"torture seed {run.seed}: its process exited {run.process.returncode} after "
                                  f"{self.walls[run.seed]:.0f} s without a report; its output ends:\n{tail}")
        with run.report_file.open("rb") as f:
            report: Report = pickle.load(f)
        self.reports[run.seed] = report
        return report

    def stop(self) -> None:
        """Kill whatever still runs (a test that failed early leaves later seeds going)."""
        self._queue.clear()
        for run in self._runs.values():
            if run.process is not None and not run.finished:
                run.process.kill()
                run.process.wait()
                self._finish(run)


def main(argv: Sequence[str]) -> int:
    seed, seconds, directory = int(argv[0]), float(argv[1]), Path(argv[2])
    zookeeper = argv[3] if len(argv) > 3 else None
    directory.mkdir(parents=True, exist_ok=True)
    report = torture(make_plan(seed, seconds), directory, zookeeper)
    print(report, flush=True)
    partial = directory / "report.pickle.partial"
    with partial.open("wb") as f:
        pickle.dump(report, f)
    partial.rename(directory / "report.pickle")
    return 1 if report.anomalies else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
