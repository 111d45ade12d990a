"""Shared fixtures: a real ZooKeeper (started only when a test asks for it), and the
torture runs' options and scheduler.

The tests are in folders by kind; markers, not folders, select what runs (``-m torture``,
``-m slow``, ``-m spark``, ``-m realdisk``):

- ``unit/``: one piece in-process, no cluster (codecs, journal framing and policy, storage
  on MemFS and the real file system, metadata records, placement, golden files);
- ``crash/``: power cuts, torn writes, full and failing disks against the journal,
  storage, GC and a bookie (MemFS models, real small file systems);
- ``cluster/``: real bookies on loopback (LocalCluster, ZooKeeper): the ledger client,
  WAL, recovery, metadata drivers and outages, the admin endpoint, metrics, Spark;
- ``process/``: what runs as processes of its own: bookie processes, the CLI, sandbox,
  demo, the scale fuzzer;
- ``torture/``: the randomized fault runs, their scheduler and record, the churn soak;
- ``bench/``: the benchmarks' short forms and options;
- ``package/``: the wheel and sdist, README and docs run as written, mypy, the layers'
  arrows and the house's measures;
- ``support/``: what they share, a package (``from support.bookie import ...``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.torture.options import torture_jobs, torture_seconds, torture_seeds
from support.zk import ZooKeeperEnsemble, ZooKeeperServer


@pytest.fixture(scope="session")
def zk_server() -> Iterator[ZooKeeperServer]:
    """One standalone ZooKeeper on 127.0.0.1 for the whole run (installed if missing)."""
    server = ZooKeeperServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def walkit_zookeeper(zk_server: ZooKeeperServer) -> str:
    """The walkit.testing plugin's ZooKeeper is the suite's: one JVM for the whole run."""
    return zk_server.hosts


@pytest.fixture(scope="module")
def zk_ensemble_module() -> Iterator[ZooKeeperEnsemble]:
    """A fresh 3-node ZooKeeper ensemble on 127.0.0.1 per test module."""
    ensemble = ZooKeeperEnsemble()
    try:
        yield ensemble
    finally:
        ensemble.stop()


@pytest.fixture
def zk_ensemble(zk_ensemble_module: ZooKeeperEnsemble) -> ZooKeeperEnsemble:
    """The module's ensemble with all three nodes serving: nodes killed by an earlier test
    (even a failed one) are restarted on their own data before this test starts."""
    zk_ensemble_module.restore()
    return zk_ensemble_module


# -- torture runs (tests/torture/test_torture.py, docs/reliability.md) ------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torture", "seeded fault-injection runs (pytest -m torture)")
    group.addoption("--torture-seed", type=int, action="append", default=None, metavar="N",
                    help="run only torture seed N (repeatable); default: seeds 0 .. --torture-seeds - 1")
    group.addoption("--torture-seeds", type=int, default=None, metavar="COUNT",
                    help="how many seeds (default: $WALKIT_TORTURE_SEEDS or 12)")
    group.addoption("--torture-first-seed", type=int, default=0, metavar="N",
                    help="the seeds run are N .. N + COUNT - 1 (default 0: the CI's seeds first)")
    group.addoption("--torture-seconds", type=float, default=None, metavar="S",
                    help="seconds of faults per seed (default: $WALKIT_TORTURE_SECONDS or 20)")
    group.addoption("--torture-record", default=None, metavar="FILE",
                    help="append one line per seed run to FILE (docs/torture-record.jsonl: the project's record; "
                         "python tests/support/torture/record.py then rewrites docs/reliability.md's table)")
    group.addoption("--torture-jobs", type=int, default=None, metavar="N",
                    help="seeds run at once, each in a process of its own (default: $WALKIT_TORTURE_JOBS or 2)")


@pytest.fixture(scope="session")
def torture_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's torture seeds, run ``--torture-jobs`` at a time in processes of their
    own (tests/support/torture/run.py); each ``test_torture[seed]`` waits for its seed's report."""
    from support.torture.run import TortureRuns

    config = request.config
    runs = TortureRuns(torture_seeds(config), torture_seconds(config), torture_jobs(config),
                       tmp_path_factory.mktemp("torture"))
    config.stash[_TORTURE_RUNS] = runs
    try:
        yield runs
    finally:
        runs.stop()


_TORTURE_RUNS = pytest.StashKey[Any]()


_FOLDER_SECONDS: dict[str, float] = {}  # tests' folder -> wall time of its tests' phases


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Adds each phase's (set-up, call, tear-down) wall time to the test's folder."""
    parts = report.nodeid.split("/")
    folder = parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0].partition("::")[0]
    _FOLDER_SECONDS[folder] = _FOLDER_SECONDS.get(folder, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """What each folder of tests cost (what CI's time goes to); then one line per
    torture seed run: faults injected, records acknowledged, anomalies."""
    if _FOLDER_SECONDS:
        terminalreporter.section("time by folder")
        for folder, spent in sorted(_FOLDER_SECONDS.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{folder:10s} {spent:7.0f} s")
    runs = config.stash.get(_TORTURE_RUNS, None)
    if runs is None or not runs.reports:
        return
    record = config.getoption("--torture-record")
    if record:
        from support.torture.record import append, commit_of, entry

        commit = commit_of(Path(__file__).parent)
        append(Path(record), (entry(report, runs.walls.get(seed, 0.0), commit)
                              for seed, report in sorted(runs.reports.items())))
        terminalreporter.write_line(f"torture: {len(runs.reports)} runs appended to {record}")
    terminalreporter.section("torture runs")
    for seed, report in sorted(runs.reports.items()):
        plan = report.plan
        terminalreporter.write_line(
            f"seed {seed:3d} ({plan.mode}, {plan.metadata}, {plan.seconds:g} s, {runs.walls.get(seed, 0):.0f} s wall): "
            f"{len(plan.faults)} faults, {report.counts.get('acked', 0)} records acknowledged, "
            f"{len(report.anomalies)} anomalies")
