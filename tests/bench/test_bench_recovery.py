"""``walkit bench recovery``: a tiny run (50 ledgers, 0.05 GiB, five bookie processes)
through the command line gives a sane report - ``walkit recover`` copied exactly the lost
share, autorecovery repaired every ledger the other lost bookie was in, the writer's
percentiles are ordered - renders as a table, and cleans up after itself. No timing
assertions: the machine is shared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from walkit.bench.recovery import format_markdown, run_recovery_bench
from walkit.cli import main
from walkit.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(180)


def _check_writer(phase: dict[str, Any]) -> None:
    assert phase["entries"] > 0 and phase["entries_per_s"] > 0 and phase["seconds"] > 0, phase
    assert 0 < phase["p50_ms"] <= phase["p99_ms"] <= phase["p999_ms"] <= phase["max_ms"], phase
    assert min(phase["client_cpu_cores"], phase["bookie_cpu_cores"], phase["tool_cpu_cores"]) >= 0, phase
    assert phase["other_cpu_cores"] >= 0 and phase["steal_cores"] >= 0, phase


def _check_share(share: dict[str, Any], entry_size: int) -> None:
    assert 0 < share["ledgers"] <= share["fragments"] <= share["entries"], share
    assert share["bytes"] == share["entries"] * entry_size


def test_tiny_run_recovers_both_losses_and_reports_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "recovery", "--json", "--gib", "0.05", "--ledgers", "50", "--seconds", "1",
            "--session-timeout", "3", "--dir", str(tmp_path)]  # 2 s sessions expire at times on a loaded machine
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["bookies"], report["ensemble"], report["write_quorum"], report["ack_quorum"]) == (5, 3, 3, 2)
    size = report["entry_size"]
    assert report["load"]["ledgers"] == 50 and report["load"]["bytes"] == 50 * 16 * size
    manual, auto = report["recover"], report["autorecovery"]
    assert manual["bookie"] != auto["bookie"]
    _check_share(manual["share"], size)
    assert manual["entries_copied"] == manual["share"]["entries"]  # exactly the lost share
    assert manual["fragments_replaced"] == manual["share"]["fragments"]
    assert (manual["failures"], manual["open_ledgers"]) == (0, 0)
    _check_share(auto["share"], size)
    assert auto["ledgers_repaired_logged"] >= auto["share"]["ledgers"]  # every ledger it was in
    assert 0 < auto["expiry_s"] < auto["seconds_from_kill"]
    for recovery in (manual, auto):
        assert recovery["seconds"] > 0 and recovery["mb_per_s"] > 0, recovery
    for phase in (report["idle"], manual["writer"], report["idle_before_autorecovery"], auto["writer"]):
        _check_writer(phase)
    table = format_markdown(report)
    assert "| walkit recover (" in table and "| during autorecovery |" in table
    assert list(tmp_path.iterdir()) == []  # the cluster's directory is gone


def test_refuses_nonsense(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        run_recovery_bench(str(tmp_path), ledgers=0)
    with pytest.raises(InvalidArgumentError):
        run_recovery_bench(str(tmp_path), gib=0)
    assert list(tmp_path.iterdir()) == []
