"""Read-only metadata stores (issue 35): the inspection commands write nothing and work
where the ``local://`` store cannot be written.

A read-only ``LocalMetadataStore`` takes no session, starts no heartbeat, reaps nothing
and refuses every change (``MetadataReadOnlyError``); its file keeps its bytes and mtime.
Root ignores permission bits, so "cannot be written" is a read-only tmpfs mount (skipped
where mounting is not allowed): a store copied there cleanly closed (no WAL: opened
``immutable``) and one left by a killed writer (its WAL and index beside it), and a copy
of a live cluster's store that every inspection command reads while the bookies serve.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import walkit
from walkit.cli import main
from walkit.errors import MetadataError, MetadataReadOnlyError
from walkit.metadata import Create, LocalMetadataStore, init_cluster

pytestmark = pytest.mark.timeout(300)

FILE = "metadata.sqlite"


def _files(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Each file's bytes and mtime (ns), but the WAL index: readers mark it as they read."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir())
            if not p.name.endswith("-shm")}


def _killed_writer(directory: Path, session_timeout: float) -> None:
    """A process that makes a store with /p and an ephemeral /e/x, then dies without
    closing it (as kill -9 would): its session row stays, its WAL is not folded in."""
    code = textwrap.dedent(f"""
        import os
        from walkit.metadata import LocalMetadataStore
        store = LocalMetadataStore({str(directory)!r}, create=True, session_timeout={session_timeout})
        store.create("/p", b"persistent")
        store.create("/e")
        store.create("/e/x", b"ephemeral", ephemeral=True)
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate()}


def test_a_read_only_store_writes_nothing_and_refuses_changes(tmp_path: Path) -> None:
    writer = LocalMetadataStore(str(tmp_path), create=True)
    writer.create("/a", b"1")
    writer.create("/a/b", b"2")
    writer.close()
    before, threads = _files(tmp_path), _threads()
    store = LocalMetadataStore(str(tmp_path), read_only=True)
    try:
        assert store.read_only and store.session_id == 0
        assert "walkit-md-heartbeat" not in _threads() - threads
        assert store.get("/a")[0] == b"1" and store.children("/a") == ["b"] and store.exists("/nope") is None
        seen: list[bytes | None] = []
        store.watch_data("/a/b", lambda data, stat: seen.append(data))
        assert seen == [b"2"]
        for change in (lambda: store.create("/c"), lambda: store.create("/c", ephemeral=True),
                       lambda: store.set("/a", b"x"), lambda: store.delete("/a/b"),
                       lambda: store.transaction([Create("/c")]), store.expire_session):
            with pytest.raises(MetadataReadOnlyError, match="read-only"):
                change()
    finally:
        store.close()
    after = _files(tmp_path)
    assert after[FILE] == before[FILE], "the store file keeps its bytes and mtime"
    assert set(after) <= {FILE, f"{FILE}-wal"} and after.get(f"{FILE}-wal", (b"",))[0] == b""


def test_a_read_only_store_hides_expired_sessions_nodes_without_reaping_them(tmp_path: Path) -> None:
    lease = 3.0
    started = time.monotonic()
    _killed_writer(tmp_path, session_timeout=lease)  # its lease began between started and ended
    ended = time.monotonic()
    live = LocalMetadataStore(str(tmp_path), read_only=True)
    try:
        visible = live.children("/e")
    finally:
        live.close()
    if time.monotonic() - started < lease:  # a slow machine may be past the lease already
        assert visible == ["x"]
    time.sleep(max(0.0, ended + lease + 0.2 - time.monotonic()))
    before = _files(tmp_path)
    store = LocalMetadataStore(str(tmp_path), read_only=True)
    try:
        assert store.exists("/e/x") is None and store.children("/e") == []
        stat = store.exists("/e")
        assert stat is not None and stat.num_children == 0
        assert store.get("/p")[0] == b"persistent"
    finally:
        store.close()
    assert _files(tmp_path) == before, "nothing reaped: the file and its WAL are as the killed writer left them"
    writer = LocalMetadataStore(str(tmp_path))  # a writer reaps
    try:
        assert writer.children("/e") == []
    finally:
        writer.close()


# -- a read-only mount ---------------------------------------------------------------------------

@dataclass
class Mount:
    path: Path

    def seal(self) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True, timeout=30)
        with pytest.raises(OSError):
            (self.path / "probe").write_bytes(b"x")


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Mount]:
    """A small tmpfs at tmp_path/ro, read-write until ``seal()``; unmounted after."""
    where = tmp_path / "ro"
    where.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True,
                              text=True, timeout=30)
    except OSError as exc:
        pytest.skip(f"cannot mount: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield Mount(where)
    finally:
        _unmount(where)


def _unmount(where: Path) -> None:
    gc.collect()  # SQLite connections dropped without close() let their files go
    for _ in range(50):
        if subprocess.run(["umount", str(where)], capture_output=True, timeout=30).returncode == 0:
            return
        time.sleep(0.1)
    subprocess.run(["umount", "-l", str(where)], check=True, timeout=30)


def _copy_store(source: Path, target: Path) -> None:
    for name in (FILE, f"{FILE}-wal", f"{FILE}-shm"):
        if (source / name).exists():
            shutil.copy2(source / name, target / name)


@pytest.mark.parametrize("left", ["closed", "killed"])
def test_a_read_only_store_opens_on_a_read_only_mount(tmp_path: Path, mount: Mount, left: str) -> None:
    """closed: the file alone (no WAL; opened ``immutable``); killed: the file, its WAL
    holding what was written and the WAL index (opened ``mode=ro``, the WAL read)."""
    made = tmp_path / "made"
    if left == "closed":
        writer = LocalMetadataStore(str(made), create=True)
        writer.create("/p", b"persistent")
        writer.close()
    else:
        _killed_writer(made, session_timeout=60.0)
        assert (made / f"{FILE}-wal").stat().st_size > 0
    _copy_store(made, mount.path)
    mount.seal()
    store = LocalMetadataStore(str(mount.path), read_only=True)
    try:
        assert store.get("/p")[0] == b"persistent"
        if left == "killed":
            assert store.children("/e") == ["x"]  # its 60 s lease is not over: the WAL was read
        with pytest.raises(MetadataReadOnlyError):
            store.set("/p", b"x")
    finally:
        store.close()
    with pytest.raises(MetadataError):  # a store that would write cannot open there
        LocalMetadataStore(str(mount.path)).close()


# -- the inspection commands on a copy of a live cluster's store --------------------------------

@dataclass
class Live:
    cluster: walkit.LocalCluster
    store: Path  # the live store's directory
    ledger: int  # closed, 3 entries
    bookie: str


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """Bookies with 60 s sessions: their registrations in a copy stay live while the test
    reads it; four of them, so that a dry run of recover finds a target for E=3."""
    base = tmp_path_factory.mktemp("readonly")
    with walkit.LocalCluster(base / "cluster", bookies=4, session_timeout=60.0) as cluster:
        with cluster.client() as bk:
            lh = bk.create_ledger(3, 2, 2)
            for i in range(3):
                lh.add_entry(b"entry %d" % i)
            lh.close()
            with walkit.WriteAheadLog.open(bk, "orders") as log:
                log.append(b"order 1")
                log.append(b"order 2")
        yield Live(cluster, Path(cluster.metadata_uri.removeprefix("local://")), lh.ledger_id, cluster.bookie_ids[0])


def _backup(source: Path, target: Path) -> None:
    """A consistent copy of a store in use (SQLite's online backup)."""
    src = sqlite3.connect(f"file:{source / FILE}?mode=ro", uri=True)
    dst = sqlite3.connect(target / FILE)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


def _inspections(live: Live) -> list[list[str]]:
    lid = str(live.ledger)
    return [["cluster", "info", "--json"], ["bookie", "list", "--json"], ["bookie", "gc", "--json"],
            ["ledger", "list", "--json"], ["ledger", "show", lid, "--json"], ["ledger", "read", lid, "--json"],
            ["log", "list", "--json"], ["log", "show", "orders", "--json"], ["log", "read", "orders", "--json"],
            ["autorecovery", "status", "--json"], ["autorecovery", "list-underreplicated", "--json"],
            ["autorecovery", "who-is-auditor", "--json"],
            ["recover", "--bookie", live.bookie, "--dry-run", "--json"]]


def _run(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def _check_outputs(outputs: dict[str, Any], live: Live) -> None:
    info = outputs["cluster info"]
    assert len(info["bookies"]["writable"]) == 4 and info["ledgers"] >= 2 and info["logs"] == 1
    assert live.ledger in [row["ledger"] for row in outputs["ledger list"]]
    assert outputs["recover"]["dry_run"] is True


@pytest.mark.parametrize("where", ["read-only-mount", "writable-directory"])
def test_inspection_commands_read_a_copy_and_write_nothing(tmp_path: Path, request: pytest.FixtureRequest,
                                                           capsys: pytest.CaptureFixture[str], live: Live,
                                                           where: str) -> None:
    if where == "read-only-mount":
        target = request.getfixturevalue("mount")
        copy = target.path
    else:
        copy = tmp_path / "copy"
        copy.mkdir()
    _backup(live.store, copy)
    if where == "read-only-mount":
        target.seal()
    before = _files(copy)
    uri = f"local://{copy}"
    outputs: dict[str, Any] = {}
    for args in _inspections(live):
        code, out, err = _run(capsys, [*args, "--metadata", uri])
        assert code == 0, (args, err)
        name = " ".join(args[:2]) if args[0] != "recover" else "recover"
        try:
            outputs[name] = json.loads(out)
        except ValueError:  # records, one JSON object a line
            outputs[name] = out
    _check_outputs(outputs, live)
    after = _files(copy)
    assert after[FILE] == before[FILE], "the store file keeps its bytes and mtime"
    assert after.get(f"{FILE}-wal", (b"",))[0] == b"", "no write went to the WAL either"
    code, _, err = _run(capsys, ["ledger", "delete", str(live.ledger), "--yes", "--metadata", uri])
    if where == "read-only-mount":  # a command that writes cannot open the store there: one clear line
        assert code == 2 and err.startswith("walkit: ") and "Traceback" not in err
    else:
        assert code == 0  # a copy in a writable directory is a store like any other
