"""``walkit bench bookkeeper``: a very short run against Apache BookKeeper 4.18.2 gives real
measurements on all three systems (no timing assertions: the machine is shared), with
consistent counts, and cleans up after itself; without Java it says what is missing.
Skipped, with the reason, where Java, javac or Maven (or ZooKeeper) is missing."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from support.bookkeeper import bookkeeper_classpath
from walkit._testing import zookeeper_missing
from walkit.bench.bookkeeper import ROWS, SYSTEMS, Workload, format_markdown, run_bookkeeper_bench
from walkit.cli import main
from walkit.errors import ConfigError, InvalidArgumentError

pytestmark = pytest.mark.timeout(240)

TIMED = ("sequential_100", "sequential_1024", "pipelined_100", "pipelined_1024", "read", "ledgers")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    bookkeeper_classpath()  # skips without java, javac or mvn
    missing = zookeeper_missing()
    if missing is not None:
        pytest.skip(missing)
    directory = tmp_path_factory.mktemp("bench-bk")
    args = ["bench", "bookkeeper", "--json", "--seconds", "0.2", "--warmup", "0.05", "--in-flight", "16",
            "--read-entries", "200", "--tail-samples", "10", "--tail-interval-ms", "5", "--ledgers", "20",
            "--dir", str(directory)]
    out = directory / "report.json"  # capsys is per test: the module's one run prints into a file
    with open(out, "w") as sink, contextlib.redirect_stdout(sink):
        assert main(args) == 0
    assert [p.name for p in directory.iterdir()] == ["report.json"]  # every cluster's directory is gone
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_every_system_ran_every_workload_with_consistent_counts(report: dict[str, Any]) -> None:
    results = report["results"]
    assert set(results) == set(SYSTEMS)
    for system, phases in results.items():
        for name in TIMED:
            phase = phases[name]
            assert phase["entries"] > 0 and phase["entries_per_s"] > 0 and phase["seconds"] > 0, (system, name)
            assert phase["client_cpu_us_per_entry"] > 0, (system, name, phase)
            assert phase["bookie_cpu_us_per_entry"] >= 0, (system, name, phase)
            assert phase["other_cpu_cores"] >= 0 and phase["steal_cores"] >= 0, (system, name, phase)
        for size in (100, 1024):
            seq = phases[f"sequential_{size}"]
            assert 0 < seq["p50_ms"] <= seq["p99_ms"] <= seq["p999_ms"], (system, seq)
        assert phases["read"]["entries"] == 200, system  # the whole closed ledger, no more
        tails = [phases["tail"]] + ([phases["tail_idle_lac"]] if system == "walkit" else [])
        assert all(t["entries"] == 10 and 0 < t["p50_ms"] <= t["p99_ms"] for t in tails), system
        assert phases["ledgers"]["ledgers"] == 20 and phases["ledgers"]["created_per_s"] > 0, system


def test_rows_carry_both_sides_and_their_ratios(report: dict[str, Any]) -> None:
    assert [row["row"] for row in report["rows"]] == [label for _, _, _, label, _, _ in ROWS]
    for row in report["rows"]:
        for system in SYSTEMS:
            assert row[system] > 0, row
            workload = row["workload"]["walkit" if system == "walkit" else "bookkeeper"]
            assert row[system] == report["results"][system][workload][row["figure"]]
        for system in SYSTEMS[1:]:
            assert row[f"walkit_over_{system}"] == round(row["walkit"] / row[system], 2), row
    assert report["workload"]["ledgers"] == 20 and report["ack_quorum"] == 2
    assert report["tuned_bookie"]["journalFlushWhenQueueEmpty"] == "true"
    table = format_markdown(report)
    assert all(f"| {row['row']} |" in table for row in report["rows"])


def test_without_java_it_names_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no java, javac or mvn here
    with pytest.raises(ConfigError, match="java") as caught:
        run_bookkeeper_bench(str(tmp_path), Workload(seconds=0.1))
    assert "java" in caught.value.context["missing"]
    assert list(tmp_path.iterdir()) == []  # refused before anything started


def test_refuses_a_workload_of_nothing(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        run_bookkeeper_bench(str(tmp_path), Workload(read_entries=0))
