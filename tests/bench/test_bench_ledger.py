"""``walkit bench ledger``: a very short run on three bookie processes gives a sane report
(no timing assertions: the machine is shared), and cleans up after itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from walkit.bench.ledger import format_markdown, run_ledger_bench
from walkit.cli import main
from walkit.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(180)


def _check_phase(phase: dict[str, Any]) -> None:
    assert phase["entries"] > 0 and phase["entries_per_s"] > 0 and phase["seconds"] > 0, phase
    assert 0 < phase["p50_ms"] <= phase["p99_ms"] <= phase["p999_ms"], phase
    assert phase["client_cpu_us_per_entry"] > 0 and phase["bookie_cpu_us_per_entry"] >= 0, phase
    assert phase["other_cpu_cores"] >= 0 and phase["steal_cores"] >= 0, phase


def test_short_run_reports_both_phases_and_cleans_up(tmp_path: Path) -> None:
    report = run_ledger_bench(str(tmp_path), seconds=0.5, in_flight=16, bookies=3, warmup=0.2)
    _check_phase(report["sequential"])
    _check_phase(report["pipelined"])
    assert report["pipelined"]["in_flight"] == 16
    assert (report["bookies"], report["ensemble"], report["write_quorum"], report["ack_quorum"]) == (3, 3, 3, 2)
    assert report["entry_size"] == 1024
    assert set(report["checks"]) == {"sequential_p50_met", "sequential_p99_met", "pipelined_rate_met"}
    assert all(isinstance(ok, bool) for ok in report["checks"].values())
    table = format_markdown(report)
    assert "| sequential" in table and "| pipelined (16 in flight)" in table
    assert list(tmp_path.iterdir()) == []  # the cluster's directory is gone


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                  loop: str) -> None:
    """With WALKIT_EVENT_LOOP=loop (issue 38's A/B): the client and every bookie ran it, and the report says so."""
    if loop == "uvloop":
        pytest.importorskip("uvloop", reason="uvloop is not installed (walkit[test] declares it)")
    monkeypatch.setenv("WALKIT_EVENT_LOOP", loop)
    args = ["bench", "ledger", "--json", "--seconds", "0.3", "--in-flight", "8", "--size", "100", "--dir", str(tmp_path)]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["entry_size"] == 100 and report["pipelined"]["entries"] > 0
    assert report["event_loop"] == {"client": loop, "bookies": [loop]}
    assert list(tmp_path.iterdir()) == []


def test_refuses_fewer_bookies_than_the_ensemble(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        run_ledger_bench(str(tmp_path), seconds=0.1, bookies=2)
