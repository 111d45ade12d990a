"""``walkit sandbox``: a cluster other processes connect to, stopped by SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

import walkit

ROOT = Path(__file__).resolve().parent.parent


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    proc = subprocess.Popen([sys.executable, "-m", "walkit.cli", "sandbox", "--data", str(tmp_path / "c"),
                             "--bookies", "3", *extra], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    info: dict[str, str] = {}
    for line in proc.stdout:  # bounded by the test timeout
        line = line.strip()
        if line == "ready":
            return proc, info
        key, _, value = line.partition("=")
        info[key] = value
    proc.wait(10)
    pytest.fail(f"sandbox exited with {proc.returncode} before it was ready: {info}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sandbox_serves_clients_and_stops_on_signal(tmp_path: Path, signum: signal.Signals) -> None:
    proc, info = _start(tmp_path)
    try:
        assert info["metadata_uri"].startswith("local://")
        assert Path(info["metadata_uri"].removeprefix("local://"), "metadata.sqlite").is_file()  # sandbox makes it
        assert len([k for k in info if k.startswith("bookie.")]) == 3
        with walkit.BookKeeper(info["metadata_uri"]) as bk:
            lh = bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw")
            assert lh.add_entry(b"hello") == 0
            lh.close()
            rh = bk.open_ledger(lh.ledger_id, password=b"pw")
            assert [e.data for e in rh.read(0, 0)] == [b"hello"]
        proc.send_signal(signum)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
