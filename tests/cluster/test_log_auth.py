"""Nothing that fails authentication changes a log or a ledger (issue 35, item 1).

A writer's open, a reader's hold or cursor and a ledger's open with recovery check the
password before anything moves: the epoch, a hold node, a fence. A log node written
before logs kept a verifier of their own is checked against its ledgers, and the next
writer with the right password writes the verifier. The administrative paths that name no
password (walkit recover, decommission, ledger delete, delete_log) fence nothing and move
no epoch: walkit/wal/_auth.py and docs/architecture.md ("Ledger passwords").
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import queue
from pathlib import Path
from typing import Any

import pytest

import walkit
from support.client import FAST, client, local_cluster
from support.metadata import Driver, driver  # noqa: F401  (fixture)
from walkit import LSN, WriteAheadLog
from walkit.aio import AsyncWriteAheadLog
from walkit.errors import FormatError, InvalidArgumentError, UnauthorizedError
from walkit.metadata import LedgerState, cluster_path, connect
from walkit.wal._auth import LogAuth
from walkit.wal import LogSettings, list_logs, set_namespace_defaults
from walkit.wal._format import LogMetadata

pytestmark = pytest.mark.timeout(240)

RIGHT, WRONG = b"right password", b"WRONG"


def _node(cluster: walkit.LocalCluster, name: str) -> tuple[LogMetadata, int, str]:
    with connect(cluster.metadata_uri) as meta:
        path = cluster_path(meta.info.root, f"logs/default/{name}")
        data, stat = meta.store.get(path)
    return LogMetadata.decode(data, path), stat.version, path


def _set_node(cluster: walkit.LocalCluster, path: str, data: bytes, version: int) -> None:
    with connect(cluster.metadata_uri) as meta:
        meta.store.set(path, data, version)


def _holds(cluster: walkit.LocalCluster, name: str) -> list[str]:
    with connect(cluster.metadata_uri) as meta:
        path = cluster_path(meta.info.root, f"logholds/default/{name}")
        return meta.store.children(path) if meta.store.exists(path) else []


def _writer(uri: str, commands: Any, out: Any) -> None:
    """A log's writer in a process of its own: appends until told to cross a roll, then
    appends until its segment has changed twice, closes and reports its LSNs."""
    wal = WriteAheadLog.open(uri, "victim", password=RIGHT, roll_bytes=4096)
    lsns: list[str] = []
    try:
        for i in range(20):
            lsns.append(str(wal.append(b"before %d" % i)))
        out.put(("ready", wal.epoch, lsns[-1]))
        commands.get(timeout=120)  # the wrong-password opener has failed meanwhile
        first = LSN.parse(lsns[-1]).segment
        i = 0
        while LSN.parse(lsns[-1]).segment < first + 2:  # across two rolls: each a metadata CAS
            lsns.append(str(wal.append(b"after %d" % i + b"." * 200)))
            i += 1
        wal.close()
        out.put(("done", wal.epoch, lsns))
    except BaseException as exc:
        out.put(("failed", type(exc).__name__, str(exc)))
        raise


def test_a_wrong_password_deposes_no_writer(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=3) as cluster:
        ctx = multiprocessing.get_context("spawn")
        commands, out = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(target=_writer, args=(cluster.metadata_uri, commands, out))
        proc.start()
        try:
            kind, epoch, _ = out.get(timeout=90)
            assert kind == "ready" and epoch == 1
            with client(cluster) as bk:
                before, version, _ = _node(cluster, "victim")
                with pytest.raises(UnauthorizedError, match="wrong password for log"):
                    WriteAheadLog.open(bk, "victim", password=WRONG)
                with pytest.raises(UnauthorizedError):
                    WriteAheadLog.reader(bk, "victim", password=WRONG, hold=True, cursor="audit")
                after, after_version, _ = _node(cluster, "victim")
                assert (after.epoch, after_version) == (before.epoch, version) == (1, version)
                assert _holds(cluster, "victim") == []  # neither the hold nor the cursor was written
                segment = before.segments[-1].ledger_id
                assert bk.ledger_metadata(segment).state is LedgerState.OPEN  # not fenced
            commands.put("go on")
            try:
                result = out.get(timeout=120)
            except queue.Empty:
                pytest.fail("the writer neither finished nor failed")
            assert result[0] == "done", f"the writer was deposed: {result}"
            _, epoch, lsns = result
            assert epoch == 1
            assert LSN.parse(lsns[-1]).segment >= LSN.parse(lsns[19]).segment + 2
        finally:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
        with WriteAheadLog.reader(cluster.metadata_uri, "victim", password=RIGHT) as reader:
            replayed = [str(lsn) for lsn, _ in reader.replay()]
        assert replayed == lsns


def test_the_right_password_still_takes_the_log_over(tmp_path: Path) -> None:
    with walkit.LocalCluster(tmp_path / "c", bookies=3, session_timeout=2.0) as cluster, \
            client(cluster) as bk:
        first = WriteAheadLog.open(bk, "log", password=RIGHT)
        first.append(b"one")
        second = WriteAheadLog.open(bk, "log", password=RIGHT)
        assert second.epoch == 2
        meta, _, _ = _node(cluster, "log")
        assert meta.auth is not None and meta.auth.matches(RIGHT) and not meta.auth.matches(WRONG)
        second.close()
        first.close()


def test_a_wrong_password_fences_no_ledger(tmp_path: Path) -> None:
    with walkit.LocalCluster(tmp_path / "c", bookies=3, session_timeout=2.0) as cluster, \
            client(cluster) as bk:
        lh = bk.create_ledger(password=RIGHT)
        lh.add_entry(b"0")
        with pytest.raises(UnauthorizedError):
            bk.open_ledger(lh.ledger_id, password=WRONG, recovery=True)
        assert bk.ledger_metadata(lh.ledger_id).state is LedgerState.OPEN
        assert lh.add_entry(b"1") == 1  # no bookie was fenced either
        lh.close()


def test_a_node_from_before_verifiers_is_checked_against_its_ledgers(tmp_path: Path) -> None:
    with walkit.LocalCluster(tmp_path / "c", bookies=3, session_timeout=2.0) as cluster, \
            client(cluster) as bk:
        with WriteAheadLog.open(bk, "old", password=RIGHT) as wal:
            wal.append(b"a record")
        meta, version, path = _node(cluster, "old")
        body = json.loads(meta.encode())
        del body["auth"]  # as an earlier walkit wrote it
        _set_node(cluster, path, json.dumps(body, sort_keys=True, separators=(",", ":")).encode(), version)
        with pytest.raises(UnauthorizedError, match="its ledgers have another"):
            WriteAheadLog.open(bk, "old", password=WRONG)
        unchanged, _, _ = _node(cluster, "old")
        assert unchanged.epoch == 1 and unchanged.auth is None
        with WriteAheadLog.open(bk, "old", password=RIGHT) as wal:
            assert wal.epoch == 2
        upgraded, _, _ = _node(cluster, "old")
        assert upgraded.auth is not None and upgraded.auth.matches(RIGHT)
        with pytest.raises(UnauthorizedError, match="wrong password for log"):
            WriteAheadLog.open(bk, "old", password=WRONG)


def test_the_asyncio_api_checks_first_too(tmp_path: Path) -> None:
    with walkit.LocalCluster(tmp_path / "c", bookies=3, session_timeout=2.0) as cluster:
        async def body() -> None:
            wal = await AsyncWriteAheadLog.open(cluster.metadata_uri, "alog", password=RIGHT)
            await wal.append(b"x")
            with pytest.raises(UnauthorizedError):
                await AsyncWriteAheadLog.open(cluster.metadata_uri, "alog", password=WRONG)
            with pytest.raises(UnauthorizedError):
                await AsyncWriteAheadLog.reader(cluster.metadata_uri, "alog", password=WRONG, cursor="c")
            assert _node(cluster, "alog")[0].epoch == 1
            assert _holds(cluster, "alog") == []
            await wal.append(b"y")  # still the writer
            await wal.close()

        asyncio.run(body())


def test_the_verifier_in_the_node_round_trips_and_refuses_what_it_cannot_read() -> None:
    auth = LogAuth.of(RIGHT)
    assert LogAuth.from_json(auth.to_json(), "/p") == auth
    for bad in ({"scheme": "pbkdf2", "salt": "", "hash": ""}, "not a dict",
                {"scheme": "hmac-sha256", "salt": "AAAA", "hash": "AAAA"}):
        with pytest.raises(FormatError):
            LogAuth.from_json(bad, "/p")
    assert LogAuth.of(RIGHT).salt != auth.salt  # salted: two logs with one password differ


def test_administrative_paths_fence_nothing(tmp_path: Path) -> None:
    """walkit recover --dry-run and walkit ledger list on a live log: the writer goes on."""
    from walkit.cli import main

    with walkit.LocalCluster(tmp_path / "c", bookies=4, session_timeout=2.0) as cluster, \
            client(cluster, **FAST) as bk:
        wal = WriteAheadLog.open(bk, "live", password=RIGHT)
        wal.append(b"a")
        meta, _, _ = _node(cluster, "live")
        victim = bk.ledger_metadata(meta.segments[-1].ledger_id).ensembles[-1][1][0]
        assert main(["recover", "--metadata", cluster.metadata_uri, "--dry-run", "--bookie", victim]) == 0
        assert main(["ledger", "list", "--metadata", cluster.metadata_uri]) == 0
        assert main(["log", "show", "--metadata", cluster.metadata_uri, "live", "--password", RIGHT.decode()]) == 0
        wal.append(b"b")
        assert _node(cluster, "live")[0].epoch == 1
        wal.close()


@pytest.mark.parametrize("name", ["two words", "line\nbreak", "star*", ".hidden", "", "x" * 256, "tab\t", "a/b"])
def test_a_new_log_name_follows_the_rules_and_the_error_says_them(tmp_path: Path, name: str) -> None:
    with walkit.LocalCluster(tmp_path / "c", bookies=3, session_timeout=2.0) as cluster, \
            client(cluster) as bk:
        with pytest.raises(InvalidArgumentError, match="letters, digits and"):
            WriteAheadLog.open(bk, name)
        with pytest.raises(InvalidArgumentError, match="letters, digits and"):
            WriteAheadLog.open(bk, "fine", namespace=name)
        with pytest.raises(InvalidArgumentError, match="letters, digits and"):
            set_namespace_defaults(bk, name, snapshots_kept=3)
        assert list_logs(bk) == []


def test_plain_names_pass_and_a_name_from_an_earlier_walkit_is_listed_quoted(tmp_path: Path) -> None:
    from walkit.cli import main

    with walkit.LocalCluster(tmp_path / "c", bookies=3, session_timeout=2.0) as cluster, \
            client(cluster) as bk:
        for name in ("orders", "orders.v2", "tenant-7:events", "user@host", "a+b=c", "Überweisungen"):
            WriteAheadLog.open(bk, name).close()
        # an earlier walkit took any node name: such a log stays reachable and is listed quoted
        with connect(cluster.metadata_uri) as meta:
            body = LogMetadata(1, (), (), None, LogSettings()).encode()
            meta.store.create(cluster_path(meta.info.root, "logs/default/two words"), body, make_parents=True)
        WriteAheadLog.open(bk, "two words").close()  # an existing node: opened
    captured = _run_cli(main, ["log", "list", "--metadata", cluster.metadata_uri])
    assert "default/'two words'" in captured and "default/orders.v2" in captured


def _run_cli(main: Any, argv: list[str]) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()
