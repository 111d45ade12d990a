"""``walkit bench scale``: one tiny run of every case through the command line (``--json``)
gives a sane report - a row per size, ordered sizes, recovered ledgers complete, nothing
negative - renders as tables, and cleans up after itself; nonsense is refused before
anything starts. No timing assertions: the machine is shared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bookie.storage import SLOT_LOG
from walkit.bench._checkpoint import checkpoint_rows
from walkit.bench.scale import CASES, format_markdown, run_scale_bench
from walkit.cli import main
from walkit.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(300)

TINY = ["--ledgers", "4", "--entries", "40", "--concurrent", "4", "--seconds", "0.3", "--in-flight", "8",
        "--gib", "0.002", "--max-ledger-entries", "200", "--segments", "2", "--snapshots", "1",
        "--checkpoint-interval", "1", "--session-timeout", "3"]


def _check_cpu(row: dict[str, Any]) -> None:
    assert row["seconds"] > 0 and min(row["client_cpu_s"], row["bookie_cpu_s"]) >= 0, row
    assert row["other_cpu_cores"] >= 0 and row["steal_cores"] >= 0, row


def _check_memory(case: dict[str, Any]) -> None:
    rows = case["rows"]
    assert [(r["ledgers"], r["entries"]) for r in rows] == [(1, 1), (1, 4), (4, 40)]
    assert case["empty_rss_mib"] > 10
    for r in rows:
        assert r["rss_max_mib"] >= r["rss_mib"] > 10 and isinstance(r["bytes_per_ledger"], int), r
        assert r["fill"]["entries"] > 0 and r["fill"]["entries_per_s"] > 0, r
    assert rows[1]["marginal_bytes_per_ledger"] is None  # as many ledgers as the row before


def _check_throughput(case: dict[str, Any]) -> None:
    assert [r["ledgers"] for r in case["rows"]] == [1, 4] and case["in_flight"] == 8
    for r in case["rows"]:
        assert r["entries"] > 0 and r["entries_per_s"] > 0 and r["ratio"] > 0, r
        assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["p999_ms"], r
    assert case["rows"][0]["ratio"] == 1.0


def _check_restart(case: dict[str, Any]) -> None:
    rows = case["rows"]
    assert [r["entries"] for r in rows] == [0, 2] and rows[0]["fill"] is None and rows[1]["fill"]["mb_per_s"] > 0
    assert rows[1]["fill"]["ensemble_changes"] == 0  # the restarted bookie took its share
    for r in rows:
        crash, graceful = r["crash"], r["graceful"]
        _check_cpu(crash)
        _check_cpu(graceful)
        assert crash["expiry_s"] > 0 and graceful["stop_seconds"] >= 0, r
        assert 0 <= crash["replayed_entries"] <= r["entries"] and graceful["replayed_entries"] == 0, r
        assert crash["bookie_cpu_s"] > 0  # the new process's start, followed across the restart


def _check_checkpoint(case: dict[str, Any]) -> None:
    rows = case["rows"]
    assert [(r["ledgers"], r["mode"]) for r in rows] == [(1, "index files"), (1, "slot log"), (4, "index files"),
                                                         (4, "slot log")]
    for r in rows:
        assert r["entries"] == 40 and r["flush_ms"] > 0 and r["cpu_ms"] > 0 and r["cpu_us_per_ledger"] > 0, r
        assert r["slot_log_bytes"] == 0 and r["merge_ms"] is None, r  # too few ledgers for the slot log


def test_checkpoint_rows_with_enough_ledgers_for_the_slot_log(tmp_path: Path) -> None:
    index, slots = checkpoint_rows(str(tmp_path), [16], 160)
    assert (index["mode"], slots["mode"]) == ("index files", "slot log")
    assert index["slot_log_bytes"] == 0 and index["checkpoints_per_merge"] is None and index["merge_ms"] is None
    assert slots["slot_log_bytes"] == 16 * (28 + 10 * 8)  # a record of 10 slots per ledger
    assert slots["checkpoints_per_merge"] == SLOT_LOG // slots["slot_log_bytes"] and slots["merge_ms"] > 0
    assert list(tmp_path.iterdir()) == []


def _check_recovery(case: dict[str, Any]) -> None:
    assert [r["entries"] for r in case["rows"]] == [2, 20, 200] and len(case["tail_rows"]) == 1
    for r in [*case["rows"], *case["tail_rows"]]:
        _check_cpu(r)
        assert r["last_entry"] == r["entries"] - 1, r  # every acknowledged entry survived recovery
        assert r["tail"] == r["last_entry"] - r["lac_before"] >= 1, r
    assert case["rows"][-1]["tail"] <= 100  # all but the last 100 were confirmed before those were sent


def _check_wal(case: dict[str, Any]) -> None:
    assert [r["segments"] for r in case["segments"]] == [2] and case["rolls"]["rolls"] == 1
    assert [r["snapshots"] for r in case["snapshots"]] == [0, 1]
    for r in [*case["segments"], *case["snapshots"]]:
        _check_cpu(r)
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"], r


def test_tiny_run_of_every_case_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "scale", "--json", *TINY, "--dir", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cases"] == list(CASES) and (report["ensemble"], report["write_quorum"], report["ack_quorum"]) == (
        3, 3, 2)
    assert report["creation"]["ledgers"] == 4 and report["creation"]["per_s"] > 0
    for check, name in ((_check_memory, "memory"), (_check_throughput, "throughput"),
                        (_check_checkpoint, "checkpoint"), (_check_restart, "restart"),
                        (_check_recovery, "recovery"), (_check_wal, "wal")):
        check(report[name])
        _check_cpu(report[name]["total"])
    assert report["checks"] == {"throughput_ratio_met": None}  # 10,000 ledgers were not measured
    table = format_markdown(report)
    assert "| 4 | 40 |" in table and "not measured" in table and "| 2 segments |" in table
    assert "| case | wall s |" in table and table.count("\n| wal |") == 1
    assert "| 4 | 40 | slot log |" in table
    assert list(tmp_path.iterdir()) == []  # every cluster's directory is gone


@pytest.mark.parametrize("bad", [{"ledgers": 0}, {"entries": 0}, {"concurrent": 0}, {"gib": 0}, {"seconds": 0},
                                 {"max_ledger_entries": 0}, {"segments": 0}, {"snapshots": -1},
                                 {"checkpoint_interval": 0}, {"session_timeout": -1}, {"in_flight": 0},
                                 {"cases": ["memory", "nonsense"]}, {"cases": []}])
def test_refuses_nonsense(tmp_path: Path, bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        run_scale_bench(str(tmp_path), **bad)
    assert list(tmp_path.iterdir()) == []  # refused before anything started


def test_cli_refuses_nonsense_with_exit_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "scale", "--gib", "0", "--dir", str(tmp_path)]) == 2
    assert "gib" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
