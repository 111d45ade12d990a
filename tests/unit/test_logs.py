"""Structured log context (walkit/logs.py): records name their ledger, bookie, log...
as attributes; the text and JSON formatters print them; the CLI's --log-format; and real
components set the context (a bookie turning read-only, a writer's ensemble change, a
WAL roll) (issue 17, "Logs")."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import walkit
from support.bookie import config, in_process, run
from support.client import FAST, index_of
from walkit import WriteAheadLog
from walkit.logs import CONTEXT_KEYS, ContextFormatter, JsonFormatter, configure, context

pytestmark = pytest.mark.timeout(120)


def _record(msg: str = "ledger %d failed", *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("walkit.test", logging.WARNING, __file__, 1, msg, args or (7,), None)
    record.__dict__.update(extra)
    return record


def test_context_keeps_known_keys_and_drops_none() -> None:
    assert context(ledger=7, bookie="h:1", entry=None) == {"ledger": 7, "bookie": "h:1"}
    with pytest.raises(ValueError) as err:
        context(ledger=1, peer="x")
    assert "peer" in str(err.value) and "ledger" in str(err.value)
    assert set(CONTEXT_KEYS) >= {"bookie", "ledger", "entry", "log"}


def test_text_formatter_appends_the_context() -> None:
    line = ContextFormatter().format(_record(ledger=7, bookie="h:1"))
    assert line.endswith("WARNING walkit.test: ledger 7 failed [bookie=h:1 ledger=7]")
    assert ContextFormatter().format(_record()).endswith("walkit.test: ledger 7 failed")


def test_json_formatter_one_object_per_record_with_context_and_traceback() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord("walkit.test", logging.ERROR, __file__, 1, "failed %s", ("x",), sys.exc_info())
    record.__dict__.update(context(ledger=3, log="orders"))
    out = json.loads(JsonFormatter().format(record))
    assert out["level"] == "ERROR" and out["logger"] == "walkit.test" and out["message"] == "failed x"
    assert out["ledger"] == 3 and out["log"] == "orders" and "RuntimeError: boom" in out["exception"]
    assert out["time"].endswith("Z") and "T" in out["time"]


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    """The root logger, and kazoo's level, as they were before the test."""
    root, library = logging.getLogger(), logging.getLogger("kazoo")
    saved = (list(root.handlers), root.level, library.level)
    try:
        yield root
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
        library.setLevel(saved[2])


def test_configure_leaves_a_configured_root_alone_unless_forced(capsys: pytest.CaptureFixture[str],
                                                                  root_logging: logging.Logger) -> None:
    assert root_logging.handlers  # pytest's
    assert configure(logging.INFO, "json") is False
    assert configure(logging.INFO, "json", stream=sys.stdout, force=True) is True
    logging.getLogger("walkit.test").info("hello %s", "there", extra=context(bookie="b:1"))
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["message"] == "hello there" and out["bookie"] == "b:1"
    with pytest.raises(ValueError):
        configure(fmt="xml", force=True)


@pytest.mark.parametrize(("level", "default", "kazoo"), [
    (logging.WARNING, logging.WARNING, logging.ERROR),  # walkit ...
    (logging.INFO, logging.WARNING, logging.NOTSET),  # walkit ... -v
    (logging.INFO, logging.INFO, logging.ERROR),  # a bookie
    (logging.DEBUG, logging.INFO, logging.NOTSET),  # a bookie, --log-level DEBUG
])
def test_kazoo_is_heard_only_above_the_commands_default(level: int, default: int, kazoo: int,
                                                        root_logging: logging.Logger) -> None:
    """kazoo logs each reconnect attempt: held at ERROR unless more than the default is asked for."""
    assert configure(level, stream=sys.stdout, force=True, default=default) is True
    assert logging.getLogger("kazoo").level == kazoo and root_logging.level == level


def test_a_bookie_started_by_the_cli_logs_json_lines_with_its_id(tmp_path: Path) -> None:
    conf = tmp_path / "bookie.toml"
    conf.write_text(f'bookiePort = 0\nbookieId = "json-bookie"\njournalDirectory = "{tmp_path / "j"}"\n'
                    f'ledgerDirectories = ["{tmp_path / "l"}"]\n')
    proc = subprocess.Popen([sys.executable, "-m", "walkit.cli", "bookie", "start", "--conf", str(conf), "-v",
                             "--log-format", "json"], stderr=subprocess.PIPE, text=True)
    lines: list[dict[str, object]] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(json.loads(line))  # every line is one JSON object
            if "serving on" in str(lines[-1]["message"]):
                break
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
        lines += [json.loads(line) for line in rest.splitlines() if line.strip()]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    serving = [line for line in lines if "serving on" in str(line["message"])]
    assert serving and serving[0]["bookie"] == "json-bookie" and serving[0]["level"] == "INFO"
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert any("stopped" in str(line["message"]) and line.get("bookie") == "json-bookie" for line in lines)
    bad = subprocess.run([sys.executable, "-m", "walkit.cli", "init", "--metadata", f"local://{tmp_path / 'md'}",
                          "--log-format", "xml"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--log-format" in bad.stderr


def test_components_name_their_subject(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    usage = {"now": 0.5}

    async def body() -> None:
        cfg = config(tmp_path / "one", disk_usage_threshold=0.95, disk_usage_lwm_threshold=0.9)
        async with in_process(cfg, disk_usage=lambda path: usage["now"]) as server:
            usage["now"] = 0.99
            await server.check_disks()

    run(body)
    full = [r for r in caplog.records if "read-only" in r.getMessage()]
    assert full and full[0].__dict__["bookie"] == "test-bookie"

    with walkit.LocalCluster(tmp_path / "cluster", bookies=4, session_timeout=2.0) as cluster, \
            cluster.client(**FAST) as bk:
        lh = bk.create_ledger(3, 3, 2)
        lh.add_entry(b"before")
        victim = lh.metadata.ensembles[0][1][0]
        cluster.kill_bookie(index_of(cluster, victim))
        for i in range(20):
            lh.add_entry(b"after-%d" % i)
        changed = [r for r in caplog.records if "changing the ensemble" in r.getMessage()]
        assert changed and changed[0].__dict__["ledger"] == lh.ledger_id and changed[0].__dict__["bookie"] == victim
        with WriteAheadLog.open(bk, "logged", roll_bytes=200) as wal:
            for i in range(50):
                wal.append(b"record %d" % i)
        rolled = [r for r in caplog.records if "rolled to segment" in r.getMessage()]
        assert rolled and rolled[0].__dict__["log"] == "logged" and rolled[0].__dict__["namespace"] == "default"
        assert isinstance(rolled[0].__dict__["ledger"], int)
