"""The exception tree's stable codes, and the command line."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from walkit import errors
from walkit.cli import main


def test_codes_are_unique_and_rebuild_their_class() -> None:
    classes = [getattr(errors, n) for n in errors.__all__]
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes)), "error codes must be unique"
    for cls in classes:
        err = errors.WalkitError.from_code(cls.code, "m", ledger=7)
        assert type(err) is cls
        assert "ledger=7" in str(err)
    assert type(errors.WalkitError.from_code(99999)) is errors.WalkitError


def test_native_io_error_is_an_oserror_keeping_errno() -> None:
    err = errors.NativeIOError(errno.ENOSPC, "write failed", path="/x", offset=4096)
    assert isinstance(err, OSError) and isinstance(err, errors.WalkitError)
    assert err.errno == errno.ENOSPC and err.filename == "/x"
    assert "offset=4096" in str(err)


def test_bench_journal_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "journal", "--json", "--seconds", "0.05", "--dir", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in report["results"]]
    assert names[0].startswith("floor") and names[1].startswith("raw sequential")
    assert any(n.endswith("256 in flight") for n in names)
    assert any(n.endswith("256 in flight, 16 entries a call") for n in names)
    for r in report["results"]:
        assert r["entries"] > 0 and r["entries_per_s"] > 0, r
        assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["p999_ms"], r
    assert {"1KiB_target_met", "64KiB_target_met", "1KiB_600k_met_one_call_an_entry",
            "1KiB_600k_met_16_a_call"} <= set(report["checks"])
    assert isinstance(report["c_framing"], bool)


def test_journal_repair_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bookie.fs.real import RealFS
    from bookie.journal import Journal, JournalConfig, scan_journal

    fs = RealFS()
    j = Journal(fs, JournalConfig(str(tmp_path), prealloc_size=1 << 16))
    j.start()
    for i in range(3):  # three flushes: wait for each acknowledgement
        done = threading.Event()
        j.log_entry(1, i, b"x" * 5000, lambda err, ev: ev.set(), done)
        assert done.wait(10)
    j.shutdown()
    path = tmp_path / "0000000000000001.txn"
    data = bytearray(path.read_bytes())
    data[4096 + 20] ^= 0xFF  # damage the first frame; later ones stay valid
    path.write_bytes(bytes(data))
    assert main(["journal", "repair", str(path)]) == 0
    out = capsys.readouterr().out
    assert "kept" in out and ".broken" in out
    assert (tmp_path / "0000000000000001.txn.broken").read_bytes() == bytes(data)
    frames, stop, _ = scan_journal(fs, str(tmp_path), 1)
    assert frames == [] and stop.offset == 4096 == stop.size


def test_cli_reports_walkit_errors_cleanly(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "walkit.cli", "journal", "repair", str(tmp_path / "0000000000000009.txn")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("walkit: ") and "Traceback" not in proc.stderr
    assert "no such journal file" in proc.stderr


@pytest.mark.parametrize("name", ["notajournal", "0000000000000001.log", "zz.txn"])
def test_journal_repair_refuses_a_file_that_is_no_journal(tmp_path: Path, name: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / name).write_bytes(b"x" * 100)
    assert main(["journal", "repair", str(tmp_path / name)]) == 2
    assert "not a journal file name" in capsys.readouterr().err
    assert (tmp_path / name).read_bytes() == b"x" * 100 and not (tmp_path / f"{name}.broken").exists()
