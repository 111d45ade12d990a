"""``walkit bench read`` (issue 19): a short run reports every case and cleans up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from walkit.bench.read import AMONG, INTERVALS, ROLL_INTERVAL, ROLL_RECORDS, format_markdown, run_read_bench
from walkit.bench.read import ratios as report_ratios
from walkit.cli import main
from walkit.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(300)


def test_short_run_reports_every_case_and_cleans_up(tmp_path: Path) -> None:
    report = run_read_bench(str(tmp_path), gib=0.005, one_per_entry=200, ledger_entries=500, samples=20)
    replay = report["replay"]
    assert set(replay) == {"100", "1024", "1024-one-per-entry", "ledger-1024", "ledger-1024-catch-up",
                           "ledger-1024-among"}
    assert replay["ledger-1024"]["written"]["records"] == 500
    assert replay["ledger-1024-among"]["written"]["records"] == 250 * AMONG  # AMONG ledgers of half as many
    for key, case in replay.items():
        written = case["written"]["records"] // (AMONG if key == "ledger-1024-among" else 1)  # one of them is read
        assert written > 0 and case["written"]["records_per_s"] > 0, key
        phases = {"ledger-1024-catch-up": ("catching up",), "100": ("cold", "hot"), "1024": ("cold", "hot"),
                  "ledger-1024-among": ("cold", "hot")}.get(key, ("cold", "hot", "hot, entry by entry"))
        assert set(case) == {"written", *phases}, key
        for phase in phases:
            r = case[phase]
            assert r["records"] == written and r["records_per_s"] > 0 and r["mb_per_s"] > 0, (key, phase, r)
    assert replay["ledger-1024-catch-up"]["catching up"]["written_meanwhile"] > 0  # followed while being written
    baseline = report["baseline"]
    assert set(baseline) == {"file-100", "sqlite-100", "file-1024", "sqlite-1024"}
    for key, case in baseline.items():
        count = replay["100"]["written"]["records"] if key.endswith("-100") else 200  # as many as the walkit logs
        assert case["written"]["records"] == count, key
        for phase in ("cold", "hot"):
            assert case[phase]["records"] == count and case[phase]["records_per_s"] > 0, (key, phase)
            assert case[phase]["caches"] == {"read_ahead": None, "recent_writes": None}  # no bookie read
    assert replay["100"]["cold"]["files_dropped"] > 0  # the bookies' files were dropped from the page cache
    assert replay["ledger-1024"]["hot, entry by entry"]["caches"]["read_ahead"] >= 0.5  # single reads read ahead
    assert [case["interval_ms"] for case in report["tail"]] == [i * 1000 for i in (*INTERVALS, ROLL_INTERVAL)]
    assert [case["roll_records"] for case in report["tail"]] == [None] * len(INTERVALS) + [ROLL_RECORDS]
    assert report["tail"][-1]["segments"] >= 2, "the rolling case rolled"
    for case in report["tail"]:
        assert case["samples"] >= 10 and 0 <= case["p50_ms"] <= case["p99_ms"] <= case["p999_ms"], case
    assert all(isinstance(ok, bool) for ok in report["checks"].values())
    table = format_markdown(report)
    assert "1 KiB records, one per entry, hot, entry by entry" in table and "ledger of 1 KiB entries" in table
    assert f"written among {AMONG - 1} others, cold" in table and "still being written, a follower, catching up" in table
    assert "baseline: SQLite table, 1 KiB rows, cold" in table and "baseline: local file, 100 B records, hot" in table
    ratios = report_ratios(report)
    assert set(ratios) == {"100 B records, batched log (records/s)", "1 KiB records, batched log (MB/s)",
                           "1 KiB records, one per entry (records/s)"}
    assert all(r["file"] > 0 and r["sqlite"] > 0 for r in ratios.values())
    assert "| 1 KiB records, one per entry (records/s) |" in table
    assert "one every 250 ms" in table and "a new segment every 20" in table and "targets:" in table
    assert list(tmp_path.iterdir()) == []


def test_cli_json_and_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "read", "--json", "--gib", "0.002", "--one-per-entry", "20", "--ledger-entries", "50",
                 "--samples", "10", "--dir", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["replay"]["100"]["hot"]["records"] > 0 and len(report["tail"]) == len(INTERVALS) + 1
    for bad in ({"gib": 0}, {"one_per_entry": 0}, {"ledger_entries": 0}, {"samples": 5}):
        with pytest.raises(InvalidArgumentError):
            run_read_bench(str(tmp_path), **bad)  # type: ignore[arg-type]
