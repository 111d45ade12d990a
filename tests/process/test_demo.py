"""``walkit demo`` end to end: SIGKILL, failover by snapshot + replay, fencing - PASS."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _demo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The demo run away from the checkout (its example is part of the package)."""
    return subprocess.run([sys.executable, "-m", "walkit.cli", "demo", "--seconds", "3", "--data",
                           str(tmp_path / "data"), *args], cwd=tmp_path, capture_output=True, text=True, timeout=180)


def test_demo_passes(tmp_path: Path) -> None:
    proc = _demo(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("PASS"), proc.stdout
    assert "FAIL" not in proc.stdout
    for what in ("records", "throughput", "append latency", "failover", "snapshot used", "fencing"):
        assert any(line.strip().startswith(what) for line in lines), what
    assert "primary writing" in proc.stderr  # the progress bar


def test_demo_json_report(tmp_path: Path) -> None:
    proc = _demo(tmp_path, "--json", "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["pass"] and all(check["pass"] for check in report["checks"])
    crash = report["crash"]
    assert crash["records"] > 0 and crash["failover_s"] > 0
    assert crash["unacknowledged_in_state"] <= crash["unacknowledged_in_flight"]
    assert set(crash["latency_ms"]) == {"p50", "p99", "p99.9"}
    assert report["fence"]["fenced_with"].startswith("WriterFencedError")
