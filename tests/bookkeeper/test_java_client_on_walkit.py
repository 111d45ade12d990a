"""Apache BookKeeper 4.18.2's own Java client writing to and reading from walkit bookies
(issue 37): three walkit bookies in this process, announced to the Java client by a bare
``<root>/available/127.0.0.1:<port>`` node each (a test fixture, not walkit's
registration: BookKeeper reads an empty node as a legacy host:port bookie id)."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bookie.server import BookieServer
from support.bookie import config
from support.bookkeeper import JavaCluster, JavaPeer, PeerError, payload
from support.zk import ZooKeeperServer

pytestmark = pytest.mark.bookkeeper


class WalkitBookies:
    """Walkit bookies on an event loop of their own (the Java peer blocks this thread)."""

    def __init__(self, base: Path, count: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: list[BookieServer] = []
        for i in range(count):
            server = BookieServer(config(base / f"walkit{i}", bookie_id=f"walkit-{i}"))
            self._run(server.start())
            self.servers.append(server)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def stop(self) -> None:
        for server in self.servers:
            self._run(server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def walkit_cluster(bk_classpath: str, zk_server: ZooKeeperServer,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[JavaCluster]:
    cluster = JavaCluster(bk_classpath, zk_server.hosts, bookies=0)
    bookies = WalkitBookies(tmp_path_factory.mktemp("walkit-bookies"), 3)
    try:
        for server in bookies.servers:
            cluster.zk.create(f"{cluster.root}/available/127.0.0.1:{server.port}", b"", ephemeral=True,
                              makepath=True)
        yield cluster
    finally:
        bookies.stop()
        cluster.stop()


@pytest.fixture(params=["v3", "v2"])
def peer(request: pytest.FixtureRequest, walkit_cluster: JavaCluster) -> Iterator[JavaPeer]:
    p = walkit_cluster.peer(v2=request.param == "v2")
    try:
        yield p
    finally:
        p.close()


def test_java_client_adds_reads_tails_and_recovers_on_walkit_bookies(peer: JavaPeer,
                                                                      walkit_cluster: JavaCluster) -> None:
    ledger = peer.create(ensemble=3, write_quorum=3, ack_quorum=2, password="pw")
    assert peer.add(ledger, count=200, seed=3) == list(range(200))  # pipelined: each carries LAC -1
    single = [f"one {i}".encode() for i in range(5)]
    assert [peer.add(ledger, [p], pipelined=False)[0] for p in single] == list(range(200, 205))
    assert peer.read(ledger, 0, 199) == [payload(3, i) for i in range(200)]
    assert peer.read(ledger, 200, 204) == single
    assert peer.read_lac(ledger) == 203  # READ_LAC: the last entry's piggy-backed LAC
    lac, entry = peer.tail(ledger, 204, timeout_ms=300)  # long poll (the writer's handle knows LAC 204)
    assert lac >= 203 and entry in (None, single[4])
    reader = walkit_cluster.peer()  # v3: v2 has no long polls
    try:  # a reader's long poll (v3; v2 has none: the client polls by reading)
        assert reader.open(ledger, password="pw")["lac"] == 203
        assert reader.tail(ledger, 204, timeout_ms=300) == (203, None)  # timed out on every bookie
        reader.send("tail", ledger=ledger, entry=204, timeout_ms=10_000)
        time.sleep(0.5)
        assert peer.add(ledger, [b"woken"], pipelined=False) == [205]  # carries LAC 204
        answer = reader.result(40)
        assert answer["lac"] == 204 and base64.b64decode(answer["payload"]) == single[4]
    finally:
        reader.close()
    info = peer.open(ledger, recovery=True, password="pw")  # fencing reads, recovery adds, close
    assert info["closed"] and info["lac"] == 205
    with pytest.raises(PeerError):  # the writer is fenced out
        peer.add(ledger, count=1)
    empty = peer.create(ensemble=3, write_quorum=3, ack_quorum=2, password="pw")
    recovered = peer.open(empty, recovery=True, password="pw")  # fencing reads answered ENOENTRY
    assert recovered["closed"] and recovered["lac"] == -1
