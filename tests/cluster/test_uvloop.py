"""walkit under uvloop (issue 38): an application that sets uvloop's event-loop policy
before walkit starts gets uvloop loops for the client and the in-process bookies (and the
pytest plugin's proxies), whose transports are not ``asyncio.Transport`` subclasses; every
``connection_made`` once asserted they were, so every connection died and every add
failed with "not enough writable bookies". These run the same paths on those loops."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import walkit
from walkit import WriteAheadLog
from walkit._testing import FaultyCluster
from walkit.eventloop import ENV_VAR

uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed (walkit[test] declares it)")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def uvloop_policy() -> Iterator[None]:
    """uvloop's event-loop policy for the test, the one before restored afterwards."""
    before = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(before)


def _adds_and_reads(bk: walkit.BookKeeper, count: int = 20) -> None:
    """A ledger on three bookies (E=3 Qw=3 Qa=2) takes ``count`` adds and reads them back."""
    payloads = [b"uv-%d" % i * 50 for i in range(count)]
    with bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2) as lh:
        assert [lh.add_entry(p) for p in payloads] == list(range(count))
        ledger = lh.ledger_id
    with bk.open_ledger(ledger) as rh:
        assert [e.data for e in rh.read(0, count - 1)] == payloads


@pytest.mark.usefixtures("uvloop_policy")
def test_a_local_cluster_takes_adds_under_uvloops_policy(tmp_path: Path) -> None:
    with walkit.LocalCluster(tmp_path / "c", bookies=3) as cluster, cluster.client() as bk:
        assert isinstance(bk.client.loop.loop, uvloop.Loop)  # the client's loop is uvloop's
        assert isinstance(cluster.server(0).loop, uvloop.Loop)  # and so is the bookies'
        _adds_and_reads(bk)


@pytest.mark.usefixtures("uvloop_policy")
def test_a_write_ahead_log_appends_under_uvloops_policy(tmp_path: Path) -> None:
    with walkit.LocalCluster(tmp_path / "c", bookies=3) as cluster, cluster.client() as bk:
        with WriteAheadLog.open(bk, "uv") as wal:
            lsns = [wal.append(b"one"), *wal.append_many([b"two", b"three"]).result(30)]
        with WriteAheadLog.reader(bk, "uv") as reader:
            assert list(reader.replay()) == list(zip(lsns, [b"one", b"two", b"three"]))


@pytest.mark.usefixtures("uvloop_policy")
def test_the_pytest_plugins_cluster_under_uvloops_policy(tmp_path: Path) -> None:
    """walkit.testing's cluster: its bookies behind loopback proxies, on uvloop too; a
    partitioned bookie is replaced and the ledger keeps writing."""
    with FaultyCluster(tmp_path / "c") as cluster, cluster.client(add_timeout=2.0) as bk:
        assert isinstance(bk.client.loop.loop, uvloop.Loop)
        _adds_and_reads(bk)
        with bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3) as lh:
            lh.add_entry(b"before")
            cluster.partition(cluster.bookie_ids.index(lh.metadata.ensembles[0][1][0]))
            assert lh.add_entry(b"after") == 1
            assert lh.ensemble_changes >= 1


def test_bookie_processes_and_the_client_on_uvloop_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """WALKIT_EVENT_LOOP=uvloop: the bookie processes (which inherit it) and the client's
    loop thread run uvloop, and a ledger and a log work across them."""
    monkeypatch.setenv(ENV_VAR, "uvloop")
    with walkit.LocalCluster(tmp_path / "c", bookies=3, processes=True) as cluster, cluster.client() as bk:
        for i in range(3):
            log = (cluster.data_dir / f"bookie-{i}" / "bookie.log").read_text()
            assert "event loop: uvloop)" in log, log
        assert isinstance(bk.client.loop.loop, uvloop.Loop)
        _adds_and_reads(bk)
        with WriteAheadLog.open(bk, "uv") as wal:
            lsn = wal.append(b"record")
        with WriteAheadLog.reader(bk, "uv") as reader:
            assert list(reader.replay()) == [(lsn, b"record")]
