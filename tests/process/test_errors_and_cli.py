"""The exception tree's stable codes, and the command line."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
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


# --- start-up errors that say what to do (issue 35, item 5) -------------------------------------

def _conf_errors() -> list[tuple[str, Callable[[Path], Path], str]]:
    def missing(tmp: Path) -> Path:
        return tmp / "bokie.toml"

    def directory(tmp: Path) -> Path:
        return tmp

    def bad_toml(tmp: Path) -> Path:
        (tmp / "bookie.toml").write_text('bookiePort = 3181\njournalDirectory = /srv/journal\n')
        return tmp / "bookie.toml"

    def unreadable(tmp: Path) -> Path:
        (tmp / "bookie.toml").write_text("bookiePort = 3181\n")
        (tmp / "bookie.toml").chmod(0)
        return tmp / "bookie.toml"

    return [("missing", missing, r"cannot read configuration: no such file \(path=.*bokie\.toml\)"),
            ("directory", directory, r"cannot read configuration: is a directory \(path="),
            ("syntax", bad_toml, r"cannot read configuration: not valid TOML: .*\(path=.* line=2 column=20\)"),
            ("unreadable", unreadable, r"cannot read configuration: permission denied \(path=")]


@pytest.mark.parametrize(("name", "make", "message"), _conf_errors(), ids=[c[0] for c in _conf_errors()])
def test_a_configuration_file_that_cannot_be_read_says_why(tmp_path: Path, name: str, make: Callable[[Path], Path],
                                                           message: str, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo'd path, a directory, a TOML syntax error (with its line and column) and an
    unreadable file each give their own message, not one "cannot read configuration"."""
    from bookie import _config
    from bookie._config import BookieConfig

    path = make(tmp_path)
    if name == "unreadable" and os.access(path, os.R_OK):  # root reads it anyway: refuse as the kernel would

        def refuse(file: str, *args: object) -> None:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), file)

        monkeypatch.setattr(_config, "open", refuse, raising=False)
    with pytest.raises(errors.ConfigError, match=message):
        BookieConfig.from_toml(str(path))
    assert main(["bookie", "info", "--conf", str(path)]) == 2  # the offline tools read it the same way
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize(("argv", "default"), [(["bookie", "start"], "INFO"), (["ledger", "list"], "WARNING"),
                                               ([], "WARNING")])
def test_help_names_each_commands_real_log_level(argv: list[str], default: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`walkit bookie start` logs INFO unless told otherwise; other commands WARNING."""
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"default {default})" in help_text
    assert f"default {'WARNING' if default == 'INFO' else 'INFO'})" not in help_text


def test_bookie_start_takes_vv_for_debug() -> None:
    """-vv on `walkit bookie start` is DEBUG (it was INFO: the bookie set its own level
    from --log-level alone)."""
    from bookie._main import _log_level

    assert _log_level(argparse.Namespace(log_level=None, verbose=0)) == logging.INFO
    assert _log_level(argparse.Namespace(log_level=None, verbose=2)) == logging.DEBUG
    assert _log_level(argparse.Namespace(log_level=logging.ERROR, verbose=2)) == logging.ERROR
    assert _log_level(argparse.Namespace(log_level="WARNING")) == logging.WARNING  # python -m bookie
    assert _log_level(argparse.Namespace()) == logging.INFO


def _walkit(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "walkit.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(120)
def test_unreachable_zookeeper_is_one_line_unless_asked_for_more() -> None:
    """kazoo logs each reconnect attempt (a dozen lines over the connect timeout); below
    -v only walkit's last line is printed, naming the address and the timeout."""
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        hosts = f"127.0.0.1:{s.getsockname()[1]}"
    uri = f"zk://{hosts}/ledgers"
    quiet, verbose = _walkit("ledger", "list", "--metadata", uri), _walkit("ledger", "list", "--metadata", uri, "-v")
    _, quiet_err = quiet.communicate(timeout=90)
    _, verbose_err = verbose.communicate(timeout=90)
    assert quiet.returncode == verbose.returncode == 2
    assert "kazoo" not in quiet_err, quiet_err
    assert quiet_err.strip().splitlines() == [f"walkit: cannot connect to ZooKeeper: no server answered within "
                                              f"the connect timeout (hosts={hosts} timeout=15s)"]
    assert "WARNING kazoo.client: Connection dropped" in verbose_err
    assert verbose_err.strip().splitlines()[-1] == quiet_err.strip()
