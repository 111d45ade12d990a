"""The Java client against three Java bookies (Apache BookKeeper 4.18.2), both wire protocols."""

from __future__ import annotations

import threading
import time

import pytest

from support.bookkeeper import JavaCluster, payload

pytestmark = pytest.mark.bookkeeper


@pytest.fixture(params=["v3", "v2"])
def peer(request: pytest.FixtureRequest, java_cluster: JavaCluster):
    p = java_cluster.peer(v2=request.param == "v2")
    try:
        yield p
    finally:
        p.close()


def test_add_pipelined_and_one_by_one_read_back(peer) -> None:
    ledger = peer.create()
    assert peer.add(ledger, count=1000, seed=7) == list(range(1000))
    single = [f"entry {i}".encode() * (i % 5 + 1) for i in range(100)]
    ids = [peer.add(ledger, [p], pipelined=False)[0] for p in single]
    assert ids == list(range(1000, 1100))
    assert peer.read(ledger, 0, 999) == [payload(7, i) for i in range(1000)]
    assert peer.read(ledger, 1000, 1099) == single
    assert peer.read_lac(ledger) >= 1098
    peer.close_ledger(ledger)
    info = peer.open(ledger)
    assert info["closed"] and info["lac"] == 1099
    assert ledger in peer.list_ledgers()
    peer.delete(ledger)
    assert ledger not in peer.list_ledgers()


def test_tail_with_long_polls(java_cluster: JavaCluster, peer) -> None:
    if peer.v2:
        pytest.skip("long-poll reads (readLastAddConfirmedAndEntry) are a v3 wire protocol request; on v2 it hung")
    writer = java_cluster.peer(v2=peer.v2)
    try:
        ledger = writer.create()
        writer.add(ledger, count=1, seed=3)
        peer.open(ledger)
        done = threading.Event()

        def write() -> None:
            for i in range(1, 30):
                writer.add(ledger, [payload(3, i)], pipelined=False)
            done.set()

        thread = threading.Thread(target=write)
        thread.start()
        got = []
        entry = 0
        while entry < 29:  # the last entry is confirmed only by the close (or a later add)
            lac, data = peer.tail(ledger, entry, timeout_ms=2000)
            if data is not None:
                got.append(data)
                entry += 1
        thread.join(60)
        assert done.is_set()
        assert got == [payload(3, i) for i in range(29)]
        writer.close_ledger(ledger)
        # The close writes the ledger metadata only: the bookies' LAC stays at 28 (no explicit
        # LAC by default), so a tailing reader learns of entry 29 by opening the ledger again.
        assert peer.tail(ledger, 29, timeout_ms=500) == (28, None)
        peer.close_ledger(ledger)
        info = peer.open(ledger)
        assert info["closed"] and info["lac"] == 29
        assert peer.read(ledger, 29, 29) == [payload(3, 29)]
    finally:
        writer.close()


def test_writer_killed_recovery_reads_exactly_acknowledged(java_cluster: JavaCluster, peer) -> None:
    writer = java_cluster.peer(v2=peer.v2)
    ledger = writer.create()
    writer.send("add", ledger=ledger, count=5000, seed=11, report=True)
    deadline = time.monotonic() + 60
    while len(writer.acks) < 500 and time.monotonic() < deadline:
        time.sleep(0.01)
    writer.kill()
    acked = sorted(writer.acks)
    assert len(acked) >= 500
    info = peer.open(ledger, recovery=True)
    assert info["closed"]
    lac = info["lac"]
    assert acked == list(range(len(acked)))  # acks come in order, without gaps
    assert lac >= acked[-1]  # recovery keeps every acknowledged entry (and may keep more that reached Qa)
    assert peer.read(ledger, 0, lac) == [payload(11, i) for i in range(lac + 1)]
    writer.close()
