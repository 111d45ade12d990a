"""``walkit bench wal``: a very short run on three bookie processes gives a sane report
for every case and both baselines (no timing assertions: the machine is shared), and
cleans up after itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from walkit.bench._floor import ReplicatedFloor
from walkit.bench.wal import CASES, RATIOS, format_markdown, run_wal_bench
from walkit.cli import main
from walkit.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(240)


def _check_case(case: dict[str, Any]) -> None:
    assert case["records"] > 0 and case["records_per_s"] > 0 and case["seconds"] > 0, case
    assert case["mb_per_s"] >= 0, case
    assert 0 < case["p50_ms"] <= case["p99_ms"] <= case["p999_ms"], case
    assert case["client_cpu_us_per_record"] > 0 and case["bookie_cpu_us_per_record"] >= 0, case
    assert case["other_cpu_cores"] >= 0 and case["steal_cores"] >= 0, case


def test_short_run_reports_every_case_and_cleans_up(tmp_path: Path) -> None:
    report = run_wal_bench(str(tmp_path), seconds=0.5, in_flight=16, warmup=0.2, samples=20)
    assert set(report["sizes"]) == {"100", "1024"}
    for size, cases in report["sizes"].items():
        assert set(cases) == set(CASES)
        for case in cases.values():
            _check_case(case)
        for key in ("wal_sequential", "wal_in_flight", "wal_many"):
            assert cases[key]["entries_per_s"] > 0 and cases[key]["records_per_entry"] >= 1, (size, cases[key])
        many = cases["wal_many"]  # counted per record: calls of 1,000 records
        assert many["records"] % 1000 == 0 and many["records"] > 0 and many["records_per_entry"] > 1, many
        assert cases["wal_sequential"]["records_per_entry"] == 1  # one record in flight: one entry each
        assert cases["wal_in_flight"]["in_flight"] == 16
        assert set(report["ratios"][size]) == set(RATIOS)
        assert all(r["records_per_s"] > 0 for r in report["ratios"][size].values())
    assert (report["bookies"], report["ensemble"], report["write_quorum"], report["ack_quorum"]) == (3, 3, 3, 2)
    assert all(isinstance(ok, bool) for ok in report["checks"].values())
    table = format_markdown(report)
    assert "| 100 B: walkit, 16 in flight |" in table and "SQLite" in table and "targets:" in table
    assert "append_many of 1,000 records" in table and "many_vs_sqlite_batched" in table
    assert "| 100 B: floor: 3 minimal servers" in table and "sequential_vs_floor" in table
    assert [(t["interval_ms"], t["samples"]) for t in report["tail"]] == [(0.0, 20), (20.0, 20)]
    assert all(0 <= t["p50_ms"] <= t["p99_ms"] for t in report["tail"]), report["tail"]
    assert "| back to back | 20 |" in table and "| one every 20 ms | 20 |" in table and "tail visibility p50" in table
    loops = report["event_loop"]  # WALKIT_EVENT_LOOP's choice, the same in the client and its bookie processes
    assert loops["bookies"] == [loops["client"]] and loops["client"] in ("asyncio", "uvloop"), loops
    assert f"event loops: client {loops['client']}, bookies {loops['client']}" in table
    assert list(tmp_path.iterdir()) == []  # the cluster's directory and the baselines' files are gone


def test_the_floor_servers_answer_two_of_three_and_leave_nothing(tmp_path: Path) -> None:
    """The floor's writer returns once two servers have a record on disk; each server
    writes every record it gets; closing stops the servers and removes their files."""
    record = b"r" * 100
    with ReplicatedFloor(tmp_path, len(record)) as floor:
        pids = floor.pids
        assert len(pids) == 3 and len(list(tmp_path.iterdir())) == 3
        assert sum(floor.append(record) for _ in range(50)) == 50
        with pytest.raises(ValueError):
            floor.append(b"short")
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError):
        ReplicatedFloor(tmp_path, 0)


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "wal", "--json", "--seconds", "0.3", "--in-flight", "8", "--samples", "10", "--dir", str(tmp_path)]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["in_flight"] == 8 and report["sizes"]["100"]["wal_in_flight"]["records"] > 0
    assert list(tmp_path.iterdir()) == []


def test_refuses_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        run_wal_bench(str(tmp_path), seconds=0.1, in_flight=0)
    with pytest.raises(InvalidArgumentError):
        run_wal_bench(str(tmp_path), seconds=0.1, samples=5)
    assert list(tmp_path.iterdir()) == []
