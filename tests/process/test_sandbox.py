"""``walkit sandbox``: a cluster other processes connect to, stopped by SIGTERM; its admin
endpoints, bookie options and per-bookie configuration files; a data directory's bookie count."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import walkit
from bookie import BookieConfig

ROOT = Path(__file__).resolve().parents[2]


def _start(tmp_path: Path, *extra: str, bookies: int | None = 3) -> tuple[subprocess.Popen[str], dict[str, str]]:
    count = [] if bookies is None else ["--bookies", str(bookies)]
    proc = subprocess.Popen([sys.executable, "-m", "walkit.cli", "sandbox", "--data", str(tmp_path / "c"), *count,
                             *extra], cwd=ROOT, stdout=subprocess.PIPE, text=True)
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


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _sandbox_error(tmp_path: Path, *args: str) -> str:
    """``walkit sandbox`` that must refuse to start: its one line on stderr."""
    done = subprocess.run([sys.executable, "-m", "walkit.cli", "sandbox", "--data", str(tmp_path / "c"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "ready" not in done.stdout, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("walkit: "), done.stderr
    return lines[0]


@pytest.mark.timeout(120)
def test_admin_gives_each_bookie_an_endpoint_and_a_reusable_config(tmp_path: Path) -> None:
    proc, info = _start(tmp_path, "--admin", "--bookie-option", "autoRecoveryDaemonEnabled=true",
                        "--bookie-option", "journalMaxGroupWaitMSec=0.5")
    try:
        for i in range(3):
            admin, conf = info[f"admin.{i}"], Path(info[f"conf.{i}"])
            assert re.fullmatch(r"http://127\.0\.0\.1:\d+", admin), admin
            assert _get(admin + "/heartbeat") == (200, b"OK\n")
            status, body = _get(admin + "/api/v1/bookie/info")
            assert status == 200 and json.loads(body)["id"] == info[f"bookie.{i}"]
            status, body = _get(admin + "/api/v1/autorecovery/status")  # the option in effect: 404 without it
            assert status == 200 and "owner" in json.loads(body)
            assert conf == tmp_path / "c" / f"bookie-{i}" / "bookie.toml"
            written = BookieConfig.from_toml(str(conf))  # what `walkit bookie start --conf` reads
            port = int(admin.rsplit(":", 1)[1])
            assert (written.bookie_id, written.bookie_port) == (info[f"bookie.{i}"], int(info[f"bookie.{i}"][10:]))
            assert written.http_server_enabled and written.http_server_port == port
            assert written.auto_recovery_daemon_enabled and written.journal_max_group_wait_msec == 0.5
            assert written.metadata_service_uri == info["metadata_uri"]
        assert not any(k.startswith("pid.") for k in info)  # in-process bookies have no pid of their own
    finally:
        _stop(proc)


@pytest.mark.timeout(120)
def test_without_admin_no_admin_lines_and_processes_print_their_pids(tmp_path: Path) -> None:
    proc, info = _start(tmp_path, "--processes")
    try:
        assert not any(k.startswith("admin.") for k in info)
        for i in range(3):
            pid = int(info[f"pid.{i}"])
            assert f"{tmp_path / 'c'}/bookie-{i}/bookie.toml" in Path(f"/proc/{pid}/cmdline").read_text()
            assert not BookieConfig.from_toml(info[f"conf.{i}"]).http_server_enabled
    finally:
        _stop(proc)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("option", "named"), [
    ("noSuchKey=1", "noSuchKey"),
    ("journalMaxGroupWaitMSec=soon", "journalMaxGroupWaitMSec"),
    ("diskUsageThreshold=2", "diskUsageThreshold"),
    ("bookiePort=3181", "bookiePort"),
    ("journalDirectory=/tmp/j", "journalDirectory"),
    ("journalSyncData", "journalSyncData"),
    ("=1", "KEY=VALUE"),
])
def test_a_bad_bookie_option_is_a_one_line_error(tmp_path: Path, option: str, named: str) -> None:
    line = _sandbox_error(tmp_path, "--bookie-option", option)
    assert named in line, line
    assert not (tmp_path / "c" / "cluster.json").exists()  # nothing started


@pytest.mark.timeout(120)
def test_fewer_bookies_than_the_directory_holds_is_an_error(tmp_path: Path) -> None:
    with walkit.LocalCluster(tmp_path / "c", bookies=3):
        pass
    line = _sandbox_error(tmp_path, "--bookies", "2")
    assert "bookies=2" in line and "holds=3" in line and "--bookies 3" in line, line
    proc, info = _start(tmp_path, bookies=None)  # without --bookies: the ones it holds
    try:
        assert sorted(k for k in info if k.startswith("bookie.")) == ["bookie.0", "bookie.1", "bookie.2"]
    finally:
        _stop(proc)
