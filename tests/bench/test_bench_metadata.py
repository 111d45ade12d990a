"""``walkit bench metadata``: a small run on both stores gives a sane report (no timing
assertions: the machine is shared), removes what it made, and refuses bad sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from walkit.bench.metadata import format_markdown, run_metadata_bench
from walkit.cli import main
from walkit.errors import InvalidArgumentError
from walkit.metadata import open_metadata_store

pytestmark = pytest.mark.timeout(300)


def _check(phase: dict[str, Any], count: int) -> None:
    assert phase["operations"] == count and phase["per_s"] > 0 and phase["seconds"] > 0, phase
    assert 0 < phase["p50_ms"] <= phase["p99_ms"] <= phase["p999_ms"], phase
    assert phase["client_cpu_us_per_op"] >= 0, phase


def test_both_stores_every_phase_and_nothing_left(tmp_path: Path, zk_server: Any) -> None:
    report = run_metadata_bench(str(tmp_path), ledgers=40, logs=4, threads=3, zk=zk_server.hosts)
    assert set(report["stores"]) == {"local://", "ZooKeeper"} and report["zookeeper_skipped"] is None
    for store in report["stores"].values():
        for name in ("create", "close", "open", "delete"):
            _check(store["ledgers"][name], 40)
        for name in ("create", "get", "delete"):
            _check(store["store"][name], 40)
            _check(store["store_cold"][name], 40)  # the warm-up, before the ledgers' phases
        for name in ("first_open", "reopen"):
            _check(store["wal"][name], 4)
        assert set(store["vs_store"]) == {"create", "open", "delete"} and all(
            r > 0 for r in store["vs_store"].values())
    verifier = report["verifier"]
    assert verifier["v1_ms"] > 0 and verifier["v2_us"] > 0 and verifier["v1_over_v2"] >= 1, verifier
    assert set(report["checks"]) == {"local://_creates_met", "ZooKeeper_creates_met", "local://_wal_opens_met",
                                     "ZooKeeper_wal_opens_met"}
    table = format_markdown(report)
    assert "| local:// | ledger create |" in table and "| ZooKeeper | WAL reopen for writing |" in table
    assert "| ZooKeeper | store create, first run (warm-up) |" in table
    assert list(tmp_path.iterdir()) == []
    store = open_metadata_store(f"zk://{zk_server.hosts}")
    try:
        assert not [c for c in store.children("/") if c.startswith("walkit-bench-md-")], "its ZooKeeper root is gone"
    finally:
        store.close()


def test_cli_json_without_zookeeper(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "metadata", "--json", "--ledgers", "10", "--logs", "0", "--threads", "2", "--zk", "none",
            "--dir", str(tmp_path)]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["stores"]) == ["local://"] and report["stores"]["local://"]["wal"] is None
    assert "not asked for" in report["zookeeper_skipped"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", [{"ledgers": 0}, {"logs": -1}, {"threads": 0}])
def test_refuses_bad_sizes(tmp_path: Path, bad: dict[str, int]) -> None:
    with pytest.raises(InvalidArgumentError):
        run_metadata_bench(str(tmp_path), **{"zk": "none", **bad})
