"""Apache BookKeeper 4.18.2's own Java client and tools on walkit bookies (issue 37).

Three walkit bookies in this process run with the Java cluster's own metadata
(``metadataServiceUri`` = the ``zk+hierarchical://`` URI of a tree BookKeeper's
``initnewcluster`` made): they register as a BookKeeper bookie does (BookieServiceInfo
under ``available/``, BookKeeper's cookie under ``cookies/``), so the Java client and
BookieShell find them by that registration alone. Their garbage collector lists the
ledgers of BookKeeper's tree (every ``GC_MS``): it keeps what the Java client wrote and
collects what it, or walkit's own client, deleted."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bookie.server import BookieServer
from support.bookie import config
from support.bookkeeper import JavaCluster, JavaPeer, PeerError, payload
from support.zk import ZooKeeperServer, free_port
from walkit.cli import main as walkit_main
from walkit.client import Endpoint, parse_endpoint
from walkit.client import connect as walkit_connect
from walkit.metadata import connect, read_registration
from walkit.metadata._bk_records import BkCookie, BookieServiceInfo

pytestmark = pytest.mark.bookkeeper

GC_MS = 300  # the walkit bookies' gcWaitTime and gcOverreplicatedLedgerWaitTime: every pass checks both


class WalkitBookies:
    """Walkit bookies on an event loop of their own (the Java peer blocks this thread),
    with ``uri`` as their metadata and their default ids (``127.0.0.1:<port>``);
    ``overrides`` more of their configuration (TLS, for one)."""

    def __init__(self, base: Path, count: int, uri: str, **overrides: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: list[BookieServer] = []
        try:
            for i in range(count):
                server = BookieServer(config(base / f"walkit{i}", bookie_id="", metadata_service_uri=uri,
                                             gc_wait_time=GC_MS, gc_overreplicated_ledger_wait_time=GC_MS,
                                             zk_timeout=10000, **overrides))
                self.run(server.start())
                self.servers.append(server)
        except BaseException:
            self.stop()
            raise

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    @property
    def ids(self) -> set[str]:
        return {s.bookie_id for s in self.servers}

    def set_readonly(self, server: BookieServer, readonly: bool) -> None:
        server.forced_readonly = readonly
        self.run(server.check_disks())

    def stop(self) -> None:
        for server in self.servers:
            self.run(server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def walkit_cluster(bk_classpath: str, zk_server: ZooKeeperServer) -> Iterator[JavaCluster]:
    """BookKeeper's ``initnewcluster`` tree, no Java bookie."""
    cluster = JavaCluster(bk_classpath, zk_server.hosts, bookies=0)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def walkit_bookies(walkit_cluster: JavaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WalkitBookies]:
    bookies = WalkitBookies(tmp_path_factory.mktemp("walkit-bookies"), 3, walkit_cluster.metadata_uri)
    try:
        yield bookies
    finally:
        bookies.stop()


@pytest.fixture(params=["v3", "v2"])
def peer(request: pytest.FixtureRequest, walkit_cluster: JavaCluster,
         walkit_bookies: WalkitBookies) -> Iterator[JavaPeer]:
    p = walkit_cluster.peer(v2=request.param == "v2")
    try:
        yield p
    finally:
        p.close()


def _listed(out: str) -> set[str]:
    return set(re.findall(r"bookieAddr=BookieID:(127\.0\.0\.1:\d+)", out))


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.1)


def test_walkit_bookies_register_where_bookkeeper_looks(walkit_cluster: JavaCluster,
                                                        walkit_bookies: WalkitBookies,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    zk, root = walkit_cluster.zk, walkit_cluster.root
    for server in walkit_bookies.servers:
        assert server.bookie_id == f"127.0.0.1:{server.port}"
        data, _ = zk.get(f"{root}/available/{server.bookie_id}")
        info = BookieServiceInfo.decode(data)
        assert [(e.protocol, e.host, e.port) for e in info.endpoints] == [("bookie-rpc", "127.0.0.1", server.port)]
        assert dict(info.properties)["walkit.protocol"] == "1"
        cookie = BkCookie.decode(zk.get(f"{root}/cookies/{server.bookie_id}")[0])
        assert cookie.bookie_id == server.bookie_id and cookie.instance_id == zk.get(f"{root}/INSTANCEID")[0].decode()
    assert _listed(walkit_cluster.shell("listbookies", "-rw")) == walkit_bookies.ids
    first = walkit_bookies.servers[0]
    out = walkit_cluster.shell("cookie_get", first.bookie_id)  # BookKeeper's tools read the cookie as theirs
    assert f"Cookie for bookie '{first.bookie_id}' is:" in out, out[-3000:]
    assert f'journalDir: "{first.config.journal_directory}"' in out, out[-3000:]
    with connect(walkit_cluster.metadata_uri, read_only=True) as cluster:  # walkit's own view of it
        assert cluster.info.format == "bookkeeper" and cluster.bookies().writable == walkit_bookies.ids
        some = walkit_bookies.servers[0]
        assert parse_endpoint(some.bookie_id, read_registration(cluster.store, cluster.info, some.bookie_id),
                              cluster.info.format) == Endpoint("127.0.0.1", some.port, False, "walkit")
    victim = walkit_bookies.servers[1]
    walkit_bookies.set_readonly(victim, True)
    try:
        assert _listed(walkit_cluster.shell("listbookies", "-ro")) == {victim.bookie_id}
        assert _listed(walkit_cluster.shell("listbookies", "-rw")) == walkit_bookies.ids - {victim.bookie_id}
        capsys.readouterr()
        assert walkit_main(["bookie", "list", "--metadata", walkit_cluster.metadata_uri, "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert listed["readonly"] == [victim.bookie_id]
        assert set(listed["writable"]) == walkit_bookies.ids - {victim.bookie_id}
        assert listed["kinds"] == {b: "walkit" for b in walkit_bookies.ids}
    finally:
        walkit_bookies.set_readonly(victim, False)
    assert _listed(walkit_cluster.shell("listbookies", "-rw")) == walkit_bookies.ids


def test_bookie_shell_simpletest_bookieinfo_and_readledger_on_walkit_bookies(walkit_cluster: JavaCluster,
                                                                  walkit_bookies: WalkitBookies) -> None:
    out = walkit_cluster.shell("simpletest", "-ensemble", "3", "-writeQuorum", "3", "-ackQuorum", "2",
                               "-numEntries", "50")
    assert re.search(r"50 entries written to ledger \d+", out), out[-3000:]
    peer = walkit_cluster.peer()
    try:
        ledger = peer.create(ensemble=3, write_quorum=2, ack_quorum=2)
        peer.add(ledger, [b"alpha", b"beta", b"gamma"], pipelined=False)
        peer.close_ledger(ledger)
    finally:
        peer.close()
    out = walkit_cluster.shell("readledger", "-msg", "-ledgerid", str(ledger), "-firstentryid", "0",
                               "-lastentryid", "2")
    for word in ("alpha", "beta", "gamma"):
        assert word in out, out[-3000:]
    out = walkit_cluster.shell("bookieinfo")  # GET_BOOKIE_INFO to every registered bookie: disk space
    for server in walkit_bookies.servers:
        assert re.search(rf"Port:{server.port}, .*free=[1-9][0-9]*\(.*total=[1-9]", out), out[-3000:]
    assert "Total disk capacity in the cluster" in out, out[-3000:]
    stored = [s.bookie is not None and ledger in s.bookie.ledgers() for s in walkit_bookies.servers]
    assert sum(stored) == 3  # ensemble 3: every walkit bookie has its share


def test_gc_keeps_java_ledgers_and_collects_the_ones_either_client_deleted(walkit_cluster: JavaCluster,
                                                                           walkit_bookies: WalkitBookies) -> None:
    peer = walkit_cluster.peer()
    try:
        kept, by_java, by_walkit = (peer.create(ensemble=3, write_quorum=3, ack_quorum=2) for _ in range(3))
        for ledger in (kept, by_java, by_walkit):
            peer.add(ledger, count=20, seed=ledger)
            peer.close_ledger(ledger)
        servers = walkit_bookies.servers
        assert all(s.bookie is not None for s in servers)
        passes = {s.bookie_id: s.bookie.gc.status()["passes"] for s in servers}  # type: ignore[union-attr]
        _wait(lambda: all(s.bookie.gc.status()["passes"] >= passes[s.bookie_id] + 3  # type: ignore[union-attr]
                          for s in servers), 30, "three GC passes on every walkit bookie")
        for s in servers:  # Java's ledgers are in BookKeeper's tree: kept
            assert s.bookie is not None and {kept, by_java, by_walkit} <= set(s.bookie.ledgers())
            last = s.bookie.gc.status()["last_pass"]  # the over-replication step read BookKeeper's records
            assert last["metadata_unavailable"] is False and not last["cut_short"], last
            assert s.bookie.gc.status()["totals"]["overreplicated_removed"] == 0
        peer.delete(by_java)
        with walkit_connect(walkit_cluster.metadata_uri) as walkit_client:  # walkit's client, BookKeeper's tree
            assert walkit_client.ledger_metadata(by_walkit).digest == "bk-crc32c"
            walkit_client.delete_ledger(by_walkit)
        assert {by_java, by_walkit}.isdisjoint(peer.list_ledgers()) and kept in peer.list_ledgers()
        _wait(lambda: all({by_java, by_walkit}.isdisjoint(s.bookie.ledgers())  # type: ignore[union-attr]
                          for s in servers), 30, "every walkit bookie collected the deleted ledgers")
        for s in servers:
            assert s.bookie is not None and kept in s.bookie.ledgers()
            assert s.bookie.gc.status()["totals"]["ledgers_removed"] >= 2
        assert peer.open(kept)["lac"] == 19
        assert peer.read(kept, 0, 19) == [payload(kept, i) for i in range(20)]
    finally:
        peer.close()


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


@pytest.mark.parametrize("manager", ["flat", "longhierarchical"])
def test_on_a_cluster_walkit_init_made_java_finds_walkit_bookies_and_their_gc_follows(
        manager: str, bk_classpath: str, zk_server: ZooKeeperServer, tmp_path: Path) -> None:
    """``walkit init --format bookkeeper`` under BookKeeper's other two managers; only walkit
    bookies: BookieShell lists them, the Java client writes and reads through them, and
    their GC collects the ledger it deleted at that manager's paths."""
    from kazoo.client import KazooClient

    chroot = f"/wk-{uuid.uuid4().hex[:12]}"
    uri = f"zk+{manager}://{zk_server.hosts}{chroot}/ledgers"
    assert walkit_main(["init", "--metadata", uri, "--format", "bookkeeper"]) == 0
    conf = tmp_path / "client.conf"
    conf.write_text(f"metadataServiceUri={uri}\n")
    bookies = WalkitBookies(tmp_path / "bookies", 3, uri)
    try:
        out = subprocess.run(["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", bk_classpath,
                              "org.apache.bookkeeper.bookie.BookieShell", "-conf", str(conf), "listbookies", "-rw"],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and _listed(out.stdout + out.stderr) == bookies.ids, out.stderr[-3000:]
        peer = JavaPeer(bk_classpath, uri, tmp_path)
        try:
            kept, doomed = (peer.create(ensemble=3, write_quorum=2, ack_quorum=2) for _ in range(2))
            for ledger in (kept, doomed):
                assert peer.add(ledger, count=10, seed=7) == list(range(10))
                assert peer.read(ledger, 0, 9) == [payload(7, i) for i in range(10)]
                peer.close_ledger(ledger)
            peer.delete(doomed)
        finally:
            peer.close()
        servers = [s for s in bookies.servers if s.bookie is not None]
        _wait(lambda: all(doomed not in s.bookie.ledgers() for s in servers), 30,  # type: ignore[union-attr]
              "the deleted ledger collected")
        assert sum(kept in s.bookie.ledgers() for s in servers) == 3  # type: ignore[union-attr]  # striped: all hold some
    finally:
        bookies.stop()
        zk = KazooClient(zk_server.hosts)
        zk.start(timeout=15)
        try:
            zk.delete(chroot, recursive=True)
        finally:
            zk.stop()
            zk.close()


def test_a_walkit_bookie_process_from_bookkeepers_own_bk_server_conf_joins_the_java_cluster(
        bk_classpath: str, zk_server: ZooKeeperServer, tmp_path: Path) -> None:
    """BookKeeper 4.18's default bk_server.conf with the Java cluster's metadataServiceUri,
    started by ``walkit bookie start``: it registers with its admin endpoint, the Java
    client writes and reads through it, and SIGTERM deregisters it."""
    golden = Path(__file__).parents[1] / "unit" / "golden" / "bookkeeper" / "bk_server.conf"
    cluster = JavaCluster(bk_classpath, zk_server.hosts, bookies=0)
    port, http_port = free_port(), free_port()
    changes = {"bookiePort": str(port), "journalDirectories": str(tmp_path / "journal"),
               "ledgerDirectories": str(tmp_path / "ledgers"), "metadataServiceUri": cluster.metadata_uri,
               "httpServerEnabled": "true", "httpServerPort": str(http_port), "httpServerHost": "127.0.0.1"}
    text = golden.read_text(encoding="iso-8859-1")
    for key, value in changes.items():
        text, count = re.subn(rf"^{key}=.*$", f"{key}={value}", text, flags=re.M)
        assert count == 1, key
    conf = tmp_path / "bk_server.conf"
    conf.write_text(text, encoding="iso-8859-1")
    log_path = tmp_path / "bookie.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "walkit.cli", "bookie", "start", "--conf", str(conf)],
                                stdout=log, stderr=subprocess.STDOUT)
    node = f"{cluster.root}/available/127.0.0.1:{port}"
    try:
        _wait(lambda: proc.poll() is not None or cluster.zk.exists(node) is not None, 60, "registered")
        assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
        info = BookieServiceInfo.decode(cluster.zk.get(node)[0])
        assert [(e.id, e.protocol, e.port) for e in info.endpoints] == [
            ("bookie", "bookie-rpc", port), ("httpserver", "http", http_port)]
        peer = cluster.peer()
        try:
            ledger = peer.create(ensemble=1, write_quorum=1, ack_quorum=1)
            assert peer.add(ledger, count=5, seed=9) == list(range(5))
            assert peer.read(ledger, 0, 4) == [payload(9, i) for i in range(5)]
        finally:
            peer.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert cluster.zk.exists(node) is None
    finally:
        proc.kill()
        proc.wait()
        cluster.stop()

