"""``walkit bench gc``: a tiny run of both parts (2,000 ledgers in ``local://`` metadata;
one compaction case on three bookie processes with 1 MiB entry logs) gives a sane report
and renders, and cleans up after itself. No timing assertions: the machine is shared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from walkit.bench.gc import BOOKIE_LEDGERS, format_markdown, run_gc_bench, scan_sizes
from walkit.cli import main
from walkit.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(120)


def _check_scan(scan: dict[str, Any]) -> None:
    (case,) = scan["cases"]
    assert (case["store"], case["ledgers"], case["bookie_ledgers"], case["deleted"]) == ("local://", 2000, 2000, 200)
    assert case["removed"] == [200, 200]  # every pass (1 timed + 1 under tracemalloc) removed exactly the deleted ones
    assert case["errors"] == []
    calls = case["metadata_calls"]
    assert calls["exists"] == 200 and calls["sync"] >= 1 and calls["list"] >= 3 and "read" not in calls, calls
    assert case["pass_seconds"] > 0 and case["ledgers_listed_per_s"] > 0 and case["populate_seconds"] >= 0
    assert 0 < case["peak_python_mib"] < 64, case  # one directory of names, not the world
    assert case["peak_rss_growth_mib"] is None or case["peak_rss_growth_mib"] >= 0
    assert scan["memory_bounded"] == {"local://": None}  # one size only
    assert scan["zookeeper_skipped"]


def _check_compaction(comp: dict[str, Any]) -> None:
    (case,) = comp["cases"]
    assert case["rate"] == "unthrottled" and case["live_target"] == 0.5
    assert case["ledgers_removed"] == [5, 5, 5]  # half of the ten ledgers, on each bookie
    assert 0.3 < case["live_fraction"] < 0.8, case
    figures = case["compaction"]
    assert figures["errors"] == [] and figures["logs_compacted"] >= 3, figures
    assert figures["copied_mib"] > 0 and figures["mb_per_s_per_bookie"] > 0 and figures["reclaimed_mib"] > 0
    for window in (case["idle"], case["compacting"]):
        assert window["adds"] > 0, window
        assert 0 < window["p50_ms"] <= window["p99_ms"] <= window["p999_ms"], window
        assert window["bookie_cpu_cores"] >= 0 and window["steal_cores"] >= 0


def test_tiny_run_of_both_parts(tmp_path: Path) -> None:
    report = run_gc_bench(str(tmp_path), ledgers=2000, zk="none", repeats=1, seconds=0.5, warmup=0.2,
                          unthrottled_volume_mib=4, log_mib=1, rates=("unthrottled",), fractions=(0.5,))
    _check_scan(report["scan"])
    _check_compaction(report["compaction"])
    assert report["machine_before"]["cpus"] and report["machine_after"]["steal_cores"] >= 0
    table = format_markdown(report)
    assert "| local:// | 2,000 |" in table and "(unthrottled) | 4 | 50% /" in table, table
    assert list(tmp_path.iterdir()) == []  # stores, storage and clusters are gone


def test_cli_json_scan_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "gc", "--json", "--part", "scan", "--ledgers", "1000", "--zk", "none", "--repeats", "1",
            "--dir", str(tmp_path)]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert "compaction" not in report and report["scan"]["cases"][0]["removed"] == [100, 100]
    assert list(tmp_path.iterdir()) == []


def test_sizes_keep_the_bookie_side_the_same() -> None:
    assert scan_sizes(1_000_000) == [10_000, 100_000, 1_000_000]
    assert scan_sizes(2000) == [2000]
    assert all(n >= BOOKIE_LEDGERS for n in scan_sizes(300_000))


def test_refuses_nonsense(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        run_gc_bench(str(tmp_path), ledgers=0)
    with pytest.raises(InvalidArgumentError):
        run_gc_bench(str(tmp_path), fractions=(1.5,))
