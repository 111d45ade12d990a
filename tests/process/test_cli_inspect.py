"""The inspection commands: ``walkit cluster info``, ``walkit ledger list|show|read|delete``,
``walkit log list|show|read|tail`` and the offline ``walkit bookie info|lastmark|
readjournal|readlog|cookie get`` - human and JSON output, record formats, confirmation,
errors, and that reading never fences a writer.

Most tests share one in-process cluster on local:// (module scope); one runs on both
metadata drivers; the offline tools get a one-bookie cluster of their own, stopped.
"""

from __future__ import annotations

import base64
import io
import json
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

import walkit
from support.client import FAST, client, local_cluster
from support.metadata import Driver, driver  # noqa: F401 (fixture)
from walkit.cli import _parser, _parsers, main

BINARY = b"\x00\xffbin\n"


@dataclass
class World:
    cluster: walkit.LocalCluster
    bk: walkit.BookKeeper
    uri: str
    closed: walkit.LedgerHandle  # closed: 5 text entries and a binary one, custom metadata
    open: walkit.LedgerHandle  # still open: its writer goes on
    log: walkit.WriteAheadLog  # default/orders: 4 text records and a binary one


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("inspect")
    with walkit.LocalCluster(base / "cluster", bookies=3, session_timeout=2.0) as cluster:
        bk = cluster.client(**FAST)
        closed = bk.create_ledger(3, 2, 2, custom_metadata={"app": b"demo", "raw": b"\xff\xfe"})
        for i in range(5):
            closed.add_entry(f"entry {i}".encode())
        closed.add_entry(BINARY)
        closed.close()
        opened = bk.create_ledger(3, 3, 2, password=b"secret")
        for i in range(4):
            opened.add_entry(b"open %d" % i)
        log = walkit.WriteAheadLog.open(bk, "orders")
        for i in range(4):
            log.append(b"order %d" % i)
        log.append(BINARY)
        other = walkit.WriteAheadLog.open(bk, "audit", namespace="ns2")
        other.append(b"a")
        other.close()
        try:
            yield World(cluster, bk, cluster.metadata_uri, closed, opened, log)
        finally:
            log.close()
            bk.close()


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


# -- cluster -----------------------------------------------------------------------------------

def test_cluster_info(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    info = run_json(capsys, "cluster", "info", "--metadata", world.uri)
    assert info["layout"] == "hierarchical" and info["root"] == "/ledgers"
    assert sorted(info["bookies"]["writable"]) == sorted(world.cluster.bookie_ids)
    assert info["bookies"]["readonly"] == [] and info["logs"] >= 2
    ledgers = info["ledgers"]
    assert ledgers >= 4  # two ledgers, and a segment of each log
    code, out, _ = run(capsys, "cluster", "info", "--metadata", world.uri)
    assert code == 0 and info["instance_id"] in out and f"ledgers     {ledgers}" in out
    assert "writable    3 bookies" in out


# -- ledgers -----------------------------------------------------------------------------------

def test_ledger_list_and_show(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    rows = run_json(capsys, "ledger", "list", "--metadata", world.uri)
    by_id = {r["ledger"]: r for r in rows}
    c = by_id[world.closed.ledger_id]
    assert (c["state"], c["ensemble_size"], c["write_quorum"], c["ack_quorum"], c["last_entry_id"]) == \
        ("CLOSED", 3, 2, 2, 5)
    assert c["custom_metadata"] == {"app": {"text": "demo"}, "raw": {"base64": base64.b64encode(b"\xff\xfe").decode()}}
    assert by_id[world.open.ledger_id]["state"] == "OPEN"
    assert [r["ledger"] for r in rows] == sorted(by_id)
    assert len(run_json(capsys, "ledger", "list", "--metadata", world.uri, "--limit", "2")) == 2
    code, out, err = run(capsys, "ledger", "list", "--metadata", world.uri)
    line = next(x for x in out.splitlines() if x.split()[0] == str(world.closed.ledger_id))
    assert line.split()[1:4] == ["CLOSED", "3/2/2", "5"] and "app=demo raw=\\xff\\xfe" in line
    assert f"{len(rows)} ledgers" in err

    shown = run_json(capsys, "ledger", "show", str(world.open.ledger_id), "--metadata", world.uri)
    assert shown["state"] == "OPEN" and shown["digest"] == "crc32c" and shown["password"] == "set"
    ensemble = list(world.open.metadata.ensembles[0][1])
    assert shown["fragments"] == [{"first_entry": 0, "last_entry": None, "bookies": ensemble}]
    code, out, _ = run(capsys, "ledger", "show", str(world.closed.ledger_id), "--metadata", world.uri)
    assert code == 0 and "E=3 Qw=2 Qa=2" in out and "password     empty" in out and "entries 0..5:" in out


def test_ledger_read_formats_and_no_fencing(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    lid, uri = str(world.closed.ledger_id), world.uri
    code, out, _ = run(capsys, "ledger", "read", lid, "--metadata", uri)
    assert code == 0 and out.splitlines() == [f"{i}\tentry {i}" for i in range(5)] + ["5\t\\x00\\xffbin\\n"]
    code, out, _ = run(capsys, "ledger", "read", lid, "--metadata", uri, "--from", "4", "--format", "hex")
    assert out.splitlines() == [f"4\t{b'entry 4'.hex()}", f"5\t{BINARY.hex()}"]
    code, out, _ = run(capsys, "ledger", "read", lid, "--metadata", uri, "--from", "4", "--json")
    assert [json.loads(x) for x in out.splitlines()] == [
        {"entry": 4, "text": "entry 4"}, {"entry": 5, "base64": base64.b64encode(BINARY).decode()}]
    code, out, _ = run(capsys, "ledger", "read", lid, "--metadata", uri, "--from", "1", "--to", "2", "--format", "raw")
    assert out == "entry 1\nentry 2\n"

    # An open ledger is read up to its LAC without recovery: its writer is not fenced.
    oid = str(world.open.ledger_id)
    code, out, _ = run(capsys, "ledger", "read", oid, "--metadata", uri, "--password", "secret")
    assert code == 0 and out.splitlines()[0] == "0\topen 0" and len(out.splitlines()) >= 3
    world.open.add_entry(b"after the read")  # the writer goes on; its metadata says OPEN still
    assert world.bk.ledger_metadata(world.open.ledger_id).state.name == "OPEN"


def test_ledger_errors(world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = world.uri
    code, _, err = run(capsys, "ledger", "show", "987654", "--metadata", uri)
    assert code == 2 and err.startswith("walkit: no such ledger") and "ledger=987654" in err
    code, _, err = run(capsys, "ledger", "read", str(world.closed.ledger_id), "--metadata", uri, "--to", "99")
    assert code == 2 and "--to is past the last readable entry" in err and "last_add_confirmed=5" in err
    code, _, err = run(capsys, "ledger", "read", str(world.open.ledger_id), "--metadata", uri)
    assert code == 2 and "wrong password" in err
    for bad in ("abc", "-1", str(1 << 63)):
        with pytest.raises(SystemExit) as exc:
            main(["ledger", "show", bad, "--metadata", uri])
        assert exc.value.code == 2
        assert "ledger id" in capsys.readouterr().err
    code, _, err = run(capsys, "ledger", "list", "--metadata", f"local://{tmp_path}/md")
    assert code == 2 and err.startswith("walkit: ") and "Traceback" not in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_ledger_delete_asks_first(world: World, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    doomed = world.bk.create_ledger(3, 2, 2)
    doomed.close()
    lid = str(doomed.ledger_id)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # not a terminal: refuse, never wait
    code, _, err = run(capsys, "ledger", "delete", lid, "--metadata", world.uri)
    assert code == 2 and "not confirmed (stdin is not a terminal); pass --yes" in err
    monkeypatch.setattr(sys, "stdin", _Terminal("n\n"))
    code, out, err = run(capsys, "ledger", "delete", lid, "--metadata", world.uri)
    assert code == 1 and "not deleted" in err and f"delete ledger {lid} (CLOSED" in out
    assert world.bk.ledger_metadata(doomed.ledger_id).state.name == "CLOSED"
    monkeypatch.setattr(sys, "stdin", _Terminal("y\n"))
    code, out, _ = run(capsys, "ledger", "delete", lid, "--metadata", world.uri)
    assert code == 0 and f"deleted ledger {lid}" in out
    again = world.bk.create_ledger(3, 2, 2)
    again.close()
    assert run_json(capsys, "ledger", "delete", str(again.ledger_id), "--metadata", world.uri, "--yes") == \
        {"deleted": again.ledger_id}
    code, _, err = run(capsys, "ledger", "delete", lid, "--metadata", world.uri, "--yes")
    assert code == 2 and "no such ledger" in err


# -- logs --------------------------------------------------------------------------------------

def test_log_list_and_show(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    logs = run_json(capsys, "log", "list", "--metadata", world.uri)
    assert [(d["namespace"], d["log"]) for d in logs] == [("default", "orders"), ("ns2", "audit")]
    assert logs[0]["epoch"] == 1 and logs[0]["segments"] == 1 and logs[1]["segments"] == 1
    only = run_json(capsys, "log", "list", "--metadata", world.uri, "--namespace", "ns2")
    assert [d["log"] for d in only] == ["audit"]
    code, out, _ = run(capsys, "log", "list", "--metadata", world.uri)
    assert "default/orders" in out and "ns2/audit" in out

    shown = run_json(capsys, "log", "show", "orders", "--metadata", world.uri)
    assert shown["last_lsn"] == "1/4/0" and shown["settings"]["ensemble_size"] == 3 and shown["snapshots"] == []
    (segment,) = shown["segments"]
    assert segment["seq"] == 1 and segment["state"] == "OPEN" and segment["last_entry"] == 4
    code, out, _ = run(capsys, "log", "show", "audit", "--namespace", "ns2", "--metadata", world.uri)
    assert code == 0 and "last LSN   1/0/0" in out and "CLOSED" in out and "LSN 1/0/0 .. 1/0/*" in out
    assert "retention  none (truncate by hand); the newest 2 snapshot(s) kept" in out and "holds      -" in out


def test_log_show_tells_what_retention_keeps(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    with walkit.WriteAheadLog.open(world.bk, "policy", retention=walkit.Retention(max_age=86400, before_snapshot=True),
                                   snapshots_kept=3) as wal:
        lsn = wal.append(b"x")
        wal.snapshot(b"state", lsn)
        with walkit.WriteAheadLog.reader(world.bk, "policy", hold=True) as held, \
                walkit.WriteAheadLog.reader(world.bk, "policy", cursor="indexer") as cursor:
            cursor.commit(lsn)
            assert list(held.replay()) == [(lsn, b"x")]
            shown = run_json(capsys, "log", "show", "policy", "--metadata", world.uri)
            assert sorted((h["by"], h["position"]) for h in shown["holds"]) == [
                ("cursor indexer", str(lsn)), ("reader", f"{lsn.segment}/0/0")]
            assert shown["settings"]["retention"] == {"max_age": 86400, "before_snapshot": True}
            assert shown["settings"]["snapshots_kept"] == 3 and shown["pending_snapshots"] == []
            code, out, _ = run(capsys, "log", "show", "policy", "--metadata", world.uri)
            assert code == 0 and "segments closed over 86400 s ago, everything before the oldest snapshot kept; " \
                "the newest 3 snapshot(s) kept" in out
            assert f"cursor indexer at {lsn}" in out and "reader at " in out
        shown = run_json(capsys, "log", "show", "policy", "--metadata", world.uri)
        assert [h["by"] for h in shown["holds"]] == ["cursor indexer"]  # the reader's hold went with it


def test_log_read_formats(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    uri = world.uri
    code, out, _ = run(capsys, "log", "read", "orders", "--metadata", uri)
    assert out.splitlines() == [f"1/{i}/0\torder {i}" for i in range(4)] + ["1/4/0\t\\x00\\xffbin\\n"]
    code, out, _ = run(capsys, "log", "read", "orders", "--metadata", uri, "--after", "1/2/0", "--format", "json")
    assert [json.loads(x) for x in out.splitlines()] == [
        {"lsn": "1/3/0", "text": "order 3"}, {"lsn": "1/4/0", "base64": base64.b64encode(BINARY).decode()}]
    code, out, _ = run(capsys, "log", "read", "orders", "--metadata", uri, "--limit", "2", "--format", "hex")
    assert out.splitlines() == [f"1/{i}/0\t{(b'order %d' % i).hex()}" for i in range(2)]
    raw = subprocess.run([sys.executable, "-m", "walkit.cli", "log", "read", "orders", "--metadata", uri,
                          "--after", "1/2/0", "--format", "raw"], capture_output=True, timeout=60)
    assert raw.returncode == 0 and raw.stdout == b"order 3\n" + BINARY + b"\n"


def test_log_errors(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "log", "read", "nope", "--metadata", world.uri)
    assert code == 2 and "no such log" in err and "log=nope" in err
    code, _, err = run(capsys, "log", "show", "orders", "--namespace", "elsewhere", "--metadata", world.uri)
    assert code == 2 and "no such log" in err
    with pytest.raises(SystemExit) as exc:
        main(["log", "read", "orders", "--after", "1-2-3", "--metadata", world.uri])
    assert exc.value.code == 2 and "not an LSN" in capsys.readouterr().err


def test_truncated_log_reads_from_its_first_kept_record(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    with walkit.WriteAheadLog.open(world.bk, "kept") as w:
        w.append(b"gone")
    with walkit.WriteAheadLog.open(world.bk, "kept") as w:
        lsn = w.append(b"stays")
        w.snapshot(b"state", lsn)
        assert w.truncate(lsn) == 1
    code, out, err = run(capsys, "log", "read", "kept", "--metadata", world.uri)
    assert code == 0 and out == f"{lsn}\tstays\n" and "truncated: records before 2/0/0 are gone" in err
    code, _, err = run(capsys, "log", "read", "kept", "--metadata", world.uri, "--after", "1/0/0")
    assert code == 2 and "truncated" in err
    shown = run_json(capsys, "log", "show", "kept", "--metadata", world.uri)
    assert shown["truncated"] == "2/0/0" and shown["snapshots"][0]["lsn"] == str(lsn)


def _lines(stream: IO[bytes], count: int, timeout: float = 20.0) -> list[bytes]:
    lines: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(lines) < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"only {lines!r} in {timeout} s"
        if select.select([stream], [], [], remaining)[0]:
            line = stream.readline()
            assert line, f"end of stream after {lines!r}"
            lines.append(line)
    return lines


def test_log_tail_follows_until_sigint(world: World) -> None:
    w = walkit.WriteAheadLog.open(world.bk, "live")
    try:
        before = w.append(b"before the tail")
        proc = subprocess.Popen([sys.executable, "-m", "walkit.cli", "log", "tail", "live", "--metadata", world.uri,
                                 "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        try:
            assert proc.stderr is not None and proc.stdout is not None
            started = _lines(proc.stderr, 1)[0].decode()
            assert f"after {before}" in started
            lsns = [w.append(b"tailed 1"), w.append(BINARY)]
            got = [json.loads(x) for x in _lines(proc.stdout, 2)]
            assert got == [{"lsn": str(lsns[0]), "text": "tailed 1"},
                           {"lsn": str(lsns[1]), "base64": base64.b64encode(BINARY).decode()}]
            later = w.append(b"tailed 2")
            assert json.loads(_lines(proc.stdout, 1)[0]) == {"lsn": str(later), "text": "tailed 2"}
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=20) == 130  # Ctrl-C ends a tail: 128 + SIGINT
            assert b"Traceback" not in proc.stderr.read()
        finally:
            proc.kill()
            proc.wait()
        w.append(b"the writer was never fenced")
    finally:
        w.close()


@pytest.mark.parametrize("moment", ["at once", "0.05 s", "0.2 s", "0.4 s", "waiting", "after a record", "streaming"])
def test_log_tail_ends_at_once_whenever_sigint_comes(world: World, moment: str) -> None:
    """Ctrl-C ends a tail within seconds at any instant: during start-up, imports and
    connecting (a few moments after the start), in the middle of a long poll, right after
    a record (as above), while records stream. Once the tail has started: exit status
    130, no traceback, every line printed whole; before, Python's own SIGINT handling may
    end it (killed by SIGINT, which a shell shows as 130 too). A KeyboardInterrupt raised
    in the main thread could stop it inside a lock the client's loop needed (the loop
    then hung for good) or be lost in a weakref callback: SIGINT only wakes it now
    (walkit/cli/_sigint.py)."""
    started = moment in ("waiting", "after a record", "streaming")
    with walkit.WriteAheadLog.open(world.bk, "sigint-" + moment.replace(" ", "-").replace(".", "")) as w:
        w.append(b"before the tail")
        streaming = threading.Event()

        def stream() -> None:
            n = 0
            while not streaming.is_set():
                w.append(b"streamed %d" % n)
                n += 1

        writer = threading.Thread(target=stream)
        proc = subprocess.Popen([sys.executable, "-m", "walkit.cli", "log", "tail", w.name, "--metadata", world.uri,
                                 "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        assert proc.stderr is not None and proc.stdout is not None
        try:
            early: list[bytes] = _lines(proc.stderr, 1) if started else []
            printed: list[bytes] = []
            if moment == "waiting":
                time.sleep(0.5)  # half way through the tail's first long poll (1 s)
            elif moment == "after a record":
                w.append(b"tailed")
                printed = _lines(proc.stdout, 1)
            elif moment == "streaming":
                writer.start()
                printed = _lines(proc.stdout, 3)
            elif moment != "at once":
                time.sleep(float(moment.split()[0]))
            proc.send_signal(signal.SIGINT)
            sent = time.monotonic()
            out, err = proc.communicate(timeout=20)  # read on: a full pipe would stop the tail's prints
            took = time.monotonic() - sent
        finally:
            streaming.set()
            if writer.is_alive():
                writer.join()
            proc.kill()
            proc.wait()
    assert took < 10, f"{took:.1f} s after SIGINT"
    out = b"".join(printed) + out
    if started:
        assert proc.returncode == 130, (proc.returncode, err)
        assert b"Traceback" not in err and b"Exception ignored" not in err, err
        assert b"tailing log" in b"".join(early) and (out == b"" or out.endswith(b"\n"))
        assert all(json.loads(line)["lsn"] for line in out.splitlines())
    else:  # CPython's: killed by SIGINT, or exit status 1 when it came while CPython itself started
        # (importing the site module, or runpy for -m: "Could not import runpy module")
        startup = b"init_import_site" in err or b"Could not import runpy module" in err
        assert proc.returncode in (130, -signal.SIGINT) or (proc.returncode == 1 and startup), (proc.returncode, err)
        assert out == b""


# -- both metadata drivers ---------------------------------------------------------------------

def test_inspection_on_both_drivers(tmp_path: Path, driver: Driver, capsys: pytest.CaptureFixture[str]) -> None:
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        uri = cluster.metadata_uri
        handle = bk.create_ledger(3, 2, 2, custom_metadata={"k": b"v"})
        handle.add_entry(b"hello")
        handle.close()
        with walkit.WriteAheadLog.open(bk, "journal") as w:
            lsn = w.append(b"record")
        info = run_json(capsys, "cluster", "info", "--metadata", uri)
        assert info["ledgers"] == 2 and info["logs"] == 1 and len(info["bookies"]["writable"]) == 3
        (row, _) = run_json(capsys, "ledger", "list", "--metadata", uri)
        assert row["ledger"] == handle.ledger_id and row["custom_metadata"] == {"k": {"text": "v"}}
        code, out, _ = run(capsys, "ledger", "read", str(handle.ledger_id), "--metadata", uri)
        assert (code, out) == (0, "0\thello\n")
        code, out, _ = run(capsys, "log", "read", "journal", "--metadata", uri)
        assert (code, out) == (0, f"{lsn}\trecord\n")
        assert [d["log"] for d in run_json(capsys, "log", "list", "--metadata", uri)] == ["journal"]


# -- a bookie's disks, offline -----------------------------------------------------------------

@pytest.fixture(scope="module")
def disks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, str]]:
    """A one-bookie cluster, stopped: (journal dir, ledger dir, metadata URI)."""
    base = tmp_path_factory.mktemp("disks")
    with walkit.LocalCluster(base / "cluster", bookies=1, session_timeout=2.0) as cluster:
        with cluster.client(**FAST, idle_lac=False) as bk:  # (the journal: the key and the entries, no LAC)
            handle = bk.create_ledger(1, 1, 1)
            for i in range(5):
                handle.add_entry(b"x" * (100 + i))  # one flush each: five flush starts in the journal
            handle.close()
        uri = cluster.metadata_uri
    yield base / "cluster/bookie-0/journal", base / "cluster/bookie-0/ledgers", uri


def test_bookie_info_and_lastmark(disks: tuple[Path, Path, str], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    journal, ledgers, _ = disks
    capsys.readouterr()
    conf = tmp_path / "bookie.toml"
    conf.write_text(f'journalDirectory = "{journal}"\nledgerDirectories = ["{ledgers}"]\n')
    info = run_json(capsys, "bookie", "info", "--conf", str(conf))
    assert info["running"] is False and info["cookies_agree"] and info["bookie_id"]
    j, d = info["directories"]
    assert j["kind"] == "journal" and j["journal_files"] == 1 and j["cookie"]["bookie_id"] == info["bookie_id"]
    assert d["entry_logs"] == 1 and d["index_files"] == 1 and d["entry_log_bytes"] > 5 * 100
    assert d["slot_log_bytes"] == 0  # none: a clean stop removes it (and one ledger never needs one)
    assert d["last_mark"]["journal_id"] == 1 and d["last_mark"]["offset"] > 4096
    code, out, _ = run(capsys, "bookie", "info", "--journal-dir", str(journal), "--ledger-dir", str(ledgers))
    assert code == 0 and "not running" in out and "entry logs   1" in out and "lastMark     journal 1" in out
    assert "index files  1, slot log 0 B" in out
    marks = run_json(capsys, "bookie", "lastmark", "--ledger-dir", str(ledgers))
    assert marks == {str(ledgers): d["last_mark"]}
    code, out, _ = run(capsys, "bookie", "lastmark", "--conf", str(conf))
    assert code == 0 and out.startswith(f"{ledgers}\tjournal 1 (0000000000000001.txn) offset ")
    code, _, err = run(capsys, "bookie", "info")
    assert code == 2 and "--conf FILE" in err
    code, _, err = run(capsys, "bookie", "info", "--conf", str(tmp_path / "missing.toml"))
    assert code == 2 and "cannot read configuration" in err
    (tmp_path / "odd" / "current").mkdir(parents=True)
    (tmp_path / "odd" / "current" / "logs").write_bytes(b"not a directory")
    code, _, err = run(capsys, "bookie", "info", "--ledger-dir", str(tmp_path / "odd"))
    assert code == 2 and err.startswith("walkit: listdir failed") and "Traceback" not in err


def test_bookie_readjournal_and_readlog(disks: tuple[Path, Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    journal, ledgers, _ = disks
    path = str(journal / "0000000000000001.txn")
    code, out, _ = run(capsys, "bookie", "readjournal", path)
    rows = [line.split() for line in out.splitlines()[2:-1]]
    assert code == 0 and [r[1] for r in rows] == ["MASTER_KEY"] + ["ENTRY"] * 5
    assert [r[3] for r in rows[1:]] == ["0", "1", "2", "3", "4"] and "the end of the journal" in out
    doc = run_json(capsys, "bookie", "readjournal", path, "--padding")
    assert doc["journal_id"] == 1 and doc["stop"]["verdict"] == "end"
    assert {r["type"] for r in doc["records"]} == {"MASTER_KEY", "ENTRY", "PADDING"}
    assert len(run_json(capsys, "bookie", "readjournal", path, "--limit", "2")["records"]) == 2

    (log,) = (ledgers / "current" / "logs").glob("*.log")
    doc = run_json(capsys, "bookie", "readlog", str(log))
    assert [(r["entry"], r["size"] > 100) for r in doc["records"]] == [(i, True) for i in range(5)]
    assert doc["intact"] and doc["records"][0]["offset"] == 512
    code, out, _ = run(capsys, "bookie", "readlog", str(log), "--ledger", "12345")
    assert code == 0 and "0 records; intact to the end of the file" in out
    code, _, err = run(capsys, "bookie", "readlog", str(journal / "0000000000000001.txn"))
    assert code == 2 and "not an entry log name" in err
    code, _, err = run(capsys, "bookie", "readjournal", str(journal / "0000000000000009.txn"))
    assert code == 2 and "No such file" in err and "Traceback" not in err


def test_bookie_readjournal_says_where_a_damaged_journal_stops(disks: tuple[Path, Path, str], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    journal, _, _ = disks
    data = bytearray((journal / "0000000000000001.txn").read_bytes())
    damaged = tmp_path / "0000000000000001.txn.broken"
    data[8192 + 20] ^= 0xFF  # the second flush's entry: later flushes stay valid
    damaged.write_bytes(bytes(data))
    code, out, _ = run(capsys, "bookie", "readjournal", str(damaged))
    assert code == 1 and "stopped at offset 8192" in out and "(valid data at offset 12288)" in out
    assert "DAMAGED" in out and "walkit journal repair" in out
    assert len(out.splitlines()) == 2 + 2 + 1  # title, header, the records before the damage, the stop

    torn = tmp_path / "0000000000000002.txn"
    original = bytes((journal / "0000000000000001.txn").read_bytes())
    torn.write_bytes(original[:24576] + b"\x07" * 100)  # a last flush that did not reach the disk whole
    doc = run_json(capsys, "bookie", "readjournal", str(torn))
    assert doc["stop"]["verdict"] == "torn" and doc["stop"]["offset"] == 24576 and len(doc["records"]) == 6

    header = tmp_path / "0000000000000003.txn"
    header.write_bytes(b"\x00" * 4096)
    code, _, err = run(capsys, "bookie", "readjournal", str(header))
    assert code == 2 and "not a walkit journal" in err


def test_bookie_cookie_get(disks: tuple[Path, Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal, ledgers, uri = disks
    doc = run_json(capsys, "bookie", "cookie", "get", "--journal-dir", str(journal), "--ledger-dir", str(ledgers),
                   "--metadata", uri)
    disk = doc["directories"][str(journal)]["cookie"]
    assert doc["directories"][str(ledgers)]["cookie"] == disk and disk["ledger_dirs"] == [str(ledgers)]
    assert doc["metadata"]["cookie"] == disk and doc["metadata"]["compared"] == "the same as the disks'"
    code, out, _ = run(capsys, "bookie", "cookie", "get", "--ledger-dir", str(ledgers))
    assert code == 0 and f"bookie {disk['bookie_id']}" in out
    elsewhere = tmp_path / "empty"
    elsewhere.mkdir()
    code, out, _ = run(capsys, "bookie", "cookie", "get", "--ledger-dir", str(elsewhere))
    assert code == 0 and "no cookie" in out


def test_bookie_info_sees_a_running_bookie(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    base = Path(world.uri.removeprefix("local://")).parent / "bookie-0"
    code, out, _ = run(capsys, "bookie", "info", "--journal-dir", str(base / "journal"),
                       "--ledger-dir", str(base / "ledgers"))
    assert code == 0 and "RUNNING" in out


# -- every command: logging options, no tracebacks ----------------------------------------------

def test_every_command_takes_the_logging_options(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    parsers = _parsers()[1]
    assert len(parsers) > 30
    for p in parsers:
        assert {"-v", "--log-level"} <= set(p._option_string_actions), p.prog
    assert run(capsys, "-v", "ledger", "list", "--metadata", world.uri, "--log-level", "debug")[0] == 0
    assert run(capsys, "cluster", "info", "--metadata", world.uri, "-v")[0] == 0
    with pytest.raises(SystemExit):
        main(["cluster", "info", "--metadata", world.uri, "--log-level", "loud"])
    assert "not a log level" in capsys.readouterr().err


# -- no store made on a typo; $WALKIT_METADATA when --metadata is not given (issue 35) -----------

_EVERY_USE = [  # what reads, and what would write: none of them makes a store
    ["cluster", "info"], ["bookie", "list"], ["bookie", "gc"], ["ledger", "list"], ["ledger", "show", "1"],
    ["ledger", "read", "1"], ["ledger", "delete", "1", "--yes"], ["log", "list"], ["log", "show", "orders"],
    ["log", "read", "orders"], ["log", "tail", "orders"], ["autorecovery", "status"],
    ["autorecovery", "list-underreplicated"], ["autorecovery", "who-is-auditor"], ["autorecovery", "disable"],
    ["recover", "--bookie", "127.0.0.1:1", "--dry-run"], ["recover", "--bookie", "127.0.0.1:1"],
    ["decommission", "--bookie", "127.0.0.1:1"], ["bookie", "cookie", "delete", "--bookie", "127.0.0.1:1", "--yes"],
]


@pytest.mark.parametrize("args", _EVERY_USE, ids=" ".join)
def test_a_typo_in_a_local_path_is_an_error_and_makes_no_store(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               args: list[str]) -> None:
    typo = tmp_path / "mdd"
    code, out, err = run(capsys, *args, "--metadata", f"local://{typo}")
    assert code == 2 and out == ""
    assert err.startswith(f"walkit: no metadata store at {typo}") and f"walkit init --metadata local://{typo}" in err
    assert not typo.exists()


@pytest.fixture
def initialised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """A cluster without bookies: enough for the commands that read metadata only."""
    uri = f"local://{tmp_path / 'md'}"
    assert main(["init", "--metadata", uri]) == 0
    capsys.readouterr()
    return uri


def test_walkit_metadata_stands_for_the_option(initialised: str, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("WALKIT_METADATA", initialised)
    assert run_json(capsys, "cluster", "info")["metadata"] == initialised
    assert run_json(capsys, "bookie", "list") == {"writable": [], "readonly": []}
    assert run_json(capsys, "ledger", "list") == []
    assert run_json(capsys, "log", "list") == []
    assert run_json(capsys, "autorecovery", "status")["underreplicated"] == 0


def test_the_option_wins_over_walkit_metadata(initialised: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    typo = f"local://{tmp_path / 'mdd'}"
    monkeypatch.setenv("WALKIT_METADATA", typo)
    assert run_json(capsys, "cluster", "info", "--metadata", initialised)["metadata"] == initialised
    monkeypatch.setenv("WALKIT_METADATA", initialised)
    code, _, err = run(capsys, "cluster", "info", "--metadata", typo)
    assert code == 2 and "no metadata store at" in err and not (tmp_path / "mdd").exists()


@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_neither_option_nor_variable_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str], value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("WALKIT_METADATA", raising=False)
    else:
        monkeypatch.setenv("WALKIT_METADATA", value)
    for args in (["ledger", "list"], ["autorecovery", "status"], ["init"]):
        with pytest.raises(SystemExit) as exc:
            main(args)
        err = capsys.readouterr().err
        assert exc.value.code == 2
        assert f"usage: walkit {' '.join(args)}" in err and "give --metadata URI or set WALKIT_METADATA" in err


def test_every_metadata_option_falls_back_to_walkit_metadata() -> None:
    """One helper adds --metadata everywhere: its help names the variable, and argparse
    itself requires nothing (the check runs after parsing, with the variable read)."""
    options = [a for p in _parsers()[1] for a in p._actions if "--metadata" in a.option_strings]
    assert len(options) >= 20
    for action in options:
        assert action.help is not None and "$WALKIT_METADATA" in action.help
        assert action.default is None and not action.required
