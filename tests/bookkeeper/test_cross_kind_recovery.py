"""Recovery and fencing across the two clients, in one BookKeeper-format cluster (issue 37).

Three clusters of ``support.mixed.MixedCluster``, each for the whole module: three
walkit bookie processes; three Java bookies (Apache BookKeeper 4.18.2); two walkit
bookies and one Java bookie, so that every E=3 ledger there is a mixed ensemble. On
each, BookKeeper's Java client (``JavaPeer``) and the walkit client use the same
metadataServiceUri: a ledger one creates is in BookKeeper's own tree, found, fenced,
recovered, tailed and read by the other without any copying. Writers are killed
(SIGKILL, adds in flight: the Java peer, or a walkit writer in a process of its own) or
abandoned; recovery keeps every acknowledged entry. Every test but the CLI one runs in
both of BookKeeper's dialects (the Java peer's ``useV2WireProtocol``; the walkit
client's ``use_v2_wire_protocol``, which matters when it speaks to Java bookies).

``WALKIT_SLOW=1`` writes 10,000 entries where CI writes 2,000.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.bookkeeper import JavaPeer, PeerError, payload
from support.mixed import MixedCluster
from support.zk import ZooKeeperServer
from walkit.errors import LedgerFencedError

pytestmark = pytest.mark.bookkeeper

COUNT = 10_000 if os.environ.get("WALKIT_SLOW") == "1" else 2_000
SIZE = 200


@pytest.fixture(scope="module")
def on_walkit(bk_classpath: str, zk_server: ZooKeeperServer) -> Iterator[MixedCluster]:
    """Three walkit bookie processes, registered in BookKeeper's format."""
    cluster = MixedCluster(bk_classpath, zk_server.hosts, walkit=3)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def on_java(bk_classpath: str, zk_server: ZooKeeperServer) -> Iterator[MixedCluster]:
    """Three Java bookies."""
    cluster = MixedCluster(bk_classpath, zk_server.hosts, java=3)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def on_mixed(bk_classpath: str, zk_server: ZooKeeperServer) -> Iterator[MixedCluster]:
    """Two walkit bookies and one Java bookie: every E=3 ledger holds both kinds."""
    cluster = MixedCluster(bk_classpath, zk_server.hosts, walkit=2, java=1)
    try:
        yield cluster
    finally:
        cluster.stop()


CLUSTERS = {"walkit-bookies": "on_walkit", "java-bookies": "on_java", "mixed-bookies": "on_mixed"}


@pytest.fixture(params=["v3", "v2"])
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=list(CLUSTERS))
def cluster(request: pytest.FixtureRequest) -> MixedCluster:
    return request.getfixturevalue(CLUSTERS[request.param])  # type: ignore[no-any-return]


def _wait_acks(peer: JavaPeer, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(peer.acks) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"the Java writer had {len(peer.acks)} acks, not {count}, after {timeout} s")
        time.sleep(0.005)


def _bookies_of(cluster: MixedCluster, ledger: int) -> set[str]:
    with cluster.client() as bk:
        return {b for _, ensemble in bk.ledger_metadata(ledger).ensembles for b in ensemble}


@pytest.mark.parametrize("bookies", ["walkit-bookies", "mixed-bookies"])
def test_a_java_writer_killed_mid_stream_is_recovered_by_the_walkit_client(request: pytest.FixtureRequest,
                                                                          bookies: str, dialect: str) -> None:
    """The Java client writes to three walkit bookies (or two walkit and one Java) and is
    SIGKILLed with adds in flight; the walkit client opens the ledger with recovery and
    reads every entry the Java writer had acknowledged, and nothing but the writer's bytes."""
    on_walkit: MixedCluster = request.getfixturevalue(CLUSTERS[bookies])
    writer = on_walkit.peer(v2=dialect == "v2")
    try:
        ledger = writer.create(3, 3, 2, digest="CRC32C", password="pw")
        writer.send("add", ledger=ledger, count=COUNT, size=SIZE, seed=21, report=True)
        _wait_acks(writer, COUNT // 4)
    finally:
        writer.kill()
    acked = sorted(writer.acks)
    assert acked == list(range(len(acked)))  # in order, no gaps
    assert _bookies_of(on_walkit, ledger) == on_walkit.running()
    with on_walkit.client(dialect) as bk:
        rh = bk.open_ledger(ledger, password=b"pw")
        assert rh.is_closed and rh.metadata.digest == "bk-crc32c"
        lac = rh.last_add_confirmed
        assert acked[-1] <= lac < COUNT  # every acknowledged entry; more only if it reached Qa
        assert [e.data for e in rh.read(0, lac)] == [payload(21, i, SIZE) for i in range(lac + 1)]
    writer.close()


def test_a_walkit_writer_is_fenced_by_a_java_recovery_open(cluster: MixedCluster, dialect: str) -> None:
    with cluster.client(dialect) as bk:
        lh = bk.create_ledger(3, 3, 2, digest="bk-crc32c", password=b"pw")
        assert [lh.add_entry(b"w%d" % i) for i in range(30)] == list(range(30))
        peer = cluster.peer(v2=dialect == "v2")
        try:
            info = peer.open(lh.ledger_id, recovery=True, digest="CRC32C", password="pw")
            assert info["closed"] and info["lac"] == 29
            with pytest.raises(LedgerFencedError):
                lh.add_entry(b"after the fence")
            assert peer.read(lh.ledger_id, 0, 29) == [b"w%d" % i for i in range(30)]
        finally:
            peer.close()
        assert bk.ledger_metadata(lh.ledger_id).state.name == "CLOSED"


def test_a_java_writer_is_fenced_by_a_walkit_recovery_open(cluster: MixedCluster, dialect: str) -> None:
    peer = cluster.peer(v2=dialect == "v2")
    try:
        ledger = peer.create(3, 3, 2, digest="MAC", password="pw")
        assert peer.add(ledger, [b"j%d" % i for i in range(20)], pipelined=False) == list(range(20))
        with cluster.client(dialect) as bk:
            rh = bk.open_ledger(ledger, password=b"pw")  # fences with BookKeeper's SHA-1 key
            assert rh.is_closed and rh.last_add_confirmed == 19 and rh.metadata.digest == "bk-hmac"
            with pytest.raises(PeerError) as fenced:
                peer.add(ledger, [b"after the fence"], pipelined=False)
            assert "fenced" in str(fenced.value).lower() or "Closed" in fenced.value.code, fenced.value
            assert [e.data for e in rh.read(0, 19)] == [b"j%d" % i for i in range(20)]
    finally:
        peer.close()


def test_the_java_client_recovers_and_reads_a_ledger_the_walkit_client_abandoned(
        cluster: MixedCluster, dialect: str) -> None:
    """The walkit client writes (pipelined, then one at a time) and is closed with the
    ledger still open; BookKeeper's Java client recovers it from the cluster's own tree,
    checking the walkit writer's digests and fencing with its key, and reads it all.
    CRC32C in v3, HMAC in v2 (the digest and the dialect are independent)."""
    digest = "bk-crc32c" if dialect == "v3" else "bk-hmac"
    bk = cluster.client(dialect)
    try:
        lh = bk.create_ledger(3, 3, 2, digest=digest, password=b"pw")
        futures = [lh.add_entry_async(b"a%d" % i) for i in range(COUNT)]
        assert [f.result(120) for f in futures] == list(range(COUNT))
        assert lh.add_entry(b"last") == COUNT
    finally:
        bk.close()  # abandoned: never closed
    peer = cluster.peer(v2=dialect == "v2")
    try:
        info = peer.open(lh.ledger_id, recovery=True, digest={"bk-crc32c": "CRC32C", "bk-hmac": "MAC"}[digest],
                         password="pw")
        assert info["closed"] and info["lac"] == COUNT
        got: list[bytes] = []
        for first in range(0, COUNT + 1, 1000):
            got += peer.read(lh.ledger_id, first, min(first + 999, COUNT))
        assert got == [b"a%d" % i for i in range(COUNT)] + [b"last"]
    finally:
        peer.close()


def test_walkit_ledger_read_on_a_java_cluster(on_java: MixedCluster, capsys: pytest.CaptureFixture[str]) -> None:
    """`walkit ledger read` (the CLI, v3) reads ledgers the Java client wrote on Java
    bookies, by the cluster's own URI: a closed one entirely, and one whose writer was
    killed up to the LAC its entries carry (the CLI opens without recovery, as a Java
    reader without recovery would: the last entry is not confirmed yet)."""
    from walkit.cli import main

    peer = on_java.peer()
    try:
        closed = peer.create(3, 3, 2, digest="CRC32C", password="pw")
        assert peer.add(closed, [b"one", b"two", b"\x00three"], pipelined=False) == [0, 1, 2]
        peer.close_ledger(closed)
        left_open = peer.create(3, 2, 2, digest="MAC", password="pw")
        assert peer.add(left_open, count=50, size=20, seed=4, pipelined=False) == list(range(50))
    finally:
        peer.kill()
    capsys.readouterr()
    assert main(["ledger", "read", str(closed), "--password", "pw", "--json", "--metadata", on_java.uri]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r.get("text") for r in rows] == ["one", "two", "\x00three"]
    assert main(["ledger", "read", str(left_open), "--password", "pw", "--format", "hex", "--metadata",
                 on_java.uri]) == 0
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [(int(pos), data) for pos, data in lines] == [(i, payload(4, i, 20).hex()) for i in range(49)]


def test_each_client_tails_the_others_writer_on_a_mixed_ensemble(on_mixed: MixedCluster, dialect: str) -> None:
    """Two walkit bookies and one Java bookie: the walkit client follows a Java writer
    entry by entry until the close, and (v3: BookKeeper's Java client long-polls only
    there) the Java client long-polls a walkit writer's entries as they are confirmed."""
    writer = on_mixed.peer(v2=dialect == "v2")
    try:
        ledger = writer.create(3, 3, 2, digest="CRC32C", password="pw")
        writer.add(ledger, [payload(8, 0)], pipelined=False)

        def java_writes() -> None:
            for i in range(1, 40):
                writer.add(ledger, [payload(8, i)], pipelined=False)
                time.sleep(0.005)
            writer.close_ledger(ledger)

        thread = threading.Thread(target=java_writes)
        with on_mixed.client(dialect) as bk:
            rh = bk.open_ledger(ledger, password=b"pw", recovery=False)
            thread.start()
            got = [e.data for e in rh.follow(0, poll_timeout=0.5)]
            thread.join(60)
            assert got == [payload(8, i) for i in range(40)]
    finally:
        writer.close()
    if dialect == "v2":
        return  # the Java client's readLastAddConfirmedAndEntry hangs in v2 (tests/bookkeeper/test_java_cluster.py)
    reader = on_mixed.peer()
    try:
        with on_mixed.client(dialect) as bk:
            lh = bk.create_ledger(3, 3, 2, digest="bk-crc32c", password=b"pw")
            lh.add_entry(b"t0")
            reader.open(lh.ledger_id, digest="CRC32C", password="pw")

            def walkit_writes() -> None:
                for i in range(1, 30):
                    lh.add_entry(b"t%d" % i)
                    time.sleep(0.005)

            thread = threading.Thread(target=walkit_writes)
            thread.start()
            tailed: list[bytes] = []
            deadline = time.monotonic() + 60
            while len(tailed) < 29 and time.monotonic() < deadline:  # entry 29: confirmed by no later add
                _, data = reader.tail(lh.ledger_id, len(tailed), timeout_ms=2000)
                if data is not None:
                    tailed.append(data)
            thread.join(60)
            assert tailed == [b"t%d" % i for i in range(29)]
            lh.close()
    finally:
        reader.close()


WALKIT_WRITER = """
import json, sys
import walkit
uri, dialect, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
bk = walkit.BookKeeper(uri, use_v2_wire_protocol=dialect == "v2", add_timeout=5.0, connect_timeout=5.0)
lh = bk.create_ledger(3, 3, 2, digest="bk-crc32c", password=b"pw")
print(json.dumps({"ledger": lh.ledger_id}), flush=True)
for start in range(0, count, 50):
    futures = [lh.add_entry_async(b"k%d" % i) for i in range(start, min(start + 50, count))]
    for future in futures:
        print(future.result(60), flush=True)
"""


def test_a_walkit_writer_process_killed_mid_stream_is_recovered_by_the_java_client(
        on_mixed: MixedCluster, dialect: str, tmp_path: Path) -> None:
    """The walkit client, in a process of its own, writes to two walkit bookies and a
    Java one and is SIGKILLed with adds in flight; BookKeeper's Java client recovers the
    ledger and reads every entry the walkit writer had acknowledged."""
    script = tmp_path / "writer.py"
    script.write_text(WALKIT_WRITER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, str(script), on_mixed.uri, dialect, str(COUNT)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout is not None
        ledger = json.loads(proc.stdout.readline())["ledger"]
        acked = [int(proc.stdout.readline()) for _ in range(COUNT // 4)]
    finally:
        proc.kill()
        rest, err = proc.communicate(30)
    acked += [int(line) for line in rest.splitlines() if line.strip().isdigit()]
    assert acked == list(range(len(acked))), err[-2000:]
    peer = on_mixed.peer(v2=dialect == "v2")
    try:
        info = peer.open(ledger, recovery=True, digest="CRC32C", password="pw")
        lac = info["lac"]
        assert info["closed"] and acked[-1] <= lac < COUNT
        got: list[bytes] = []
        for first in range(0, lac + 1, 1000):
            got += peer.read(ledger, first, min(first + 999, lac))
        assert got == [b"k%d" % i for i in range(lac + 1)]
    finally:
        peer.close()


@pytest.mark.parametrize("java_digest,digest", [("CRC32", "bk-crc32"), ("DUMMY", "bk-dummy")])
def test_the_other_digests_cross_both_ways_on_a_mixed_ensemble(on_mixed: MixedCluster, dialect: str,
                                                               java_digest: str, digest: str) -> None:
    """BookKeeper's CRC32 (which walkit has no digest of its own for) and DUMMY: a Java
    writer's ledger recovered and read by the walkit client, a walkit writer's by the
    Java client, on two walkit bookies and a Java one."""
    peer = on_mixed.peer(v2=dialect == "v2")
    try:
        java_ledger = peer.create(3, 3, 2, digest=java_digest, password="pw")
        assert peer.add(java_ledger, count=300, size=64, seed=5) == list(range(300))
        with on_mixed.client(dialect) as bk:
            rh = bk.open_ledger(java_ledger, password=b"pw")
            assert rh.metadata.digest == digest and rh.last_add_confirmed == 299
            assert [e.data for e in rh.read(0, 299)] == [payload(5, i, 64) for i in range(300)]
            lh = bk.create_ledger(3, 3, 2, digest=digest, password=b"pw")
            assert [f.result(60) for f in [lh.add_entry_async(b"d%d" % i) for i in range(300)]] == list(range(300))
            lh.close()
        info = peer.open(lh.ledger_id, digest=java_digest, password="pw")
        assert info["closed"] and info["lac"] == 299
        assert peer.read(lh.ledger_id, 0, 299) == [b"d%d" % i for i in range(300)]
    finally:
        peer.close()


def test_large_entries_cross_both_ways_on_a_mixed_ensemble(on_mixed: MixedCluster, dialect: str) -> None:
    """Entries of 1 MiB (BookKeeper's frames hold up to 5 MB): the Java client's read by
    the walkit client and the walkit client's by the Java client."""
    big = 1 << 20
    peer = on_mixed.peer(v2=dialect == "v2")
    try:
        java_ledger = peer.create(3, 3, 2, digest="CRC32C", password="pw")
        assert peer.add(java_ledger, count=4, size=big, seed=41) == [0, 1, 2, 3]
        peer.close_ledger(java_ledger)
        with on_mixed.client(dialect) as bk:
            rh = bk.open_ledger(java_ledger, password=b"pw")
            assert [e.data for e in rh.read(0, 3)] == [payload(41, i, big) for i in range(4)]
            lh = bk.create_ledger(3, 3, 2, digest="bk-crc32c", password=b"pw")
            mine = [bytes([i]) * big for i in range(4)]
            assert [lh.add_entry(data) for data in mine] == [0, 1, 2, 3]
            lh.close()
        assert peer.open(lh.ledger_id, digest="CRC32C", password="pw")["lac"] == 3
        assert peer.read(lh.ledger_id, 0, 3) == mine
    finally:
        peer.close()


def test_empty_ledgers_are_recovered_across_clients(on_mixed: MixedCluster, dialect: str) -> None:
    """A writer of either client dies before its first add: the other recovers the empty
    ledger and closes it with no entry (last entry -1, length 0)."""
    peer = on_mixed.peer(v2=dialect == "v2")
    try:
        java_ledger = peer.create(3, 3, 2, digest="CRC32C", password="pw")
    finally:
        peer.kill()
    bk = on_mixed.client(dialect)
    try:
        lh = bk.create_ledger(3, 3, 2, digest="bk-hmac", password=b"pw")
    finally:
        bk.close()  # abandoned with no entry
    with on_mixed.client(dialect) as reader:
        rh = reader.open_ledger(java_ledger, password=b"pw")
        assert rh.is_closed and rh.last_add_confirmed == -1 and rh.length == 0
        meta = reader.ledger_metadata(java_ledger)
        assert meta.state.name == "CLOSED" and meta.last_entry_id == -1
    peer = on_mixed.peer(v2=dialect == "v2")
    try:
        info = peer.open(lh.ledger_id, recovery=True, digest="MAC", password="pw")
        assert info["closed"] and info["lac"] == -1 and info["length"] == 0
        assert peer.open(java_ledger, digest="CRC32C", password="pw")["lac"] == -1  # as walkit closed it
    finally:
        peer.close()


def _held(bookie_id: str, ledger: int, entries: int) -> set[int]:
    """The entries of ``ledger`` a bookie (of either kind) holds, asked in v3 one by one."""
    import asyncio

    from walkit.client._bk_bookie_client import BkBookieClient
    from walkit.errors import WalkitError

    host, port = bookie_id.rsplit(":", 1)

    async def go() -> set[int]:
        conn = await BkBookieClient.connect(host, int(port))
        held: set[int] = set()
        try:
            for entry in range(entries):
                try:
                    await conn.read_entry(ledger, entry)
                except WalkitError:  # ENOENTRY / ENOLEDGER: not here
                    continue
                held.add(entry)
        finally:
            await conn.close()
        return held
    return asyncio.run(go())


def test_striped_ledgers_put_each_entry_where_bookkeeper_looks(on_mixed: MixedCluster, dialect: str) -> None:
    """E=3, Qw=2 on two walkit bookies and a Java one: each entry is on the bookies of
    BookKeeper's round-robin write set (ensemble[(e + i) % E], i < Qw) - the Java
    writer's as BookKeeper places them, the walkit writer's the same - so either client
    reading or recovering looks where the other wrote."""
    count = 60
    peer = on_mixed.peer(v2=dialect == "v2")
    try:
        java_ledger = peer.create(3, 2, 2, digest="CRC32C", password="pw")
        assert peer.add(java_ledger, count=count, size=32, seed=51) == list(range(count))
        with on_mixed.client(dialect) as bk:
            lh = bk.create_ledger(3, 2, 2, digest="bk-crc32c", password=b"pw")
            assert [lh.add_entry(b"s%d" % i) for i in range(count)] == list(range(count))
            for ledger in (java_ledger, lh.ledger_id):
                ensemble = bk.ledger_metadata(ledger).ensembles[0][1]
                for k, bookie in enumerate(ensemble):
                    want = {e for e in range(count) if k in ((e % 3), ((e + 1) % 3))}
                    assert _held(bookie, ledger, count) == want, (ledger, bookie)
            lh.close()
            rh = bk.open_ledger(java_ledger, password=b"pw")  # recovery of the striped Java ledger
            assert rh.last_add_confirmed == count - 1
            assert [e.data for e in rh.read(0, count - 1)] == [payload(51, i, 32) for i in range(count)]
        assert peer.open(lh.ledger_id, digest="CRC32C", password="pw")["lac"] == count - 1
        assert peer.read(lh.ledger_id, 0, count - 1) == [b"s%d" % i for i in range(count)]
    finally:
        peer.close()


@pytest.mark.parametrize("bookies", ["java-bookies", "walkit-bookies"])
def test_an_idle_walkit_writers_explicit_lac_reaches_the_java_readers_read_lac(
        request: pytest.FixtureRequest, bookies: str) -> None:
    """v3 (v2 has no WRITE_LAC): a walkit writer gone idle sends its LAC on its own
    (``idle_lac``). BookKeeper's Java reader (no recovery) learns it both ways it can: a
    long poll, and ``readLastAddConfirmed`` - which in v3 is READ_LAC, answered from the
    bookies' explicit LAC (the WRITE_LAC body) beside the last entry. Java bookies keep the
    body from BookKeeper's v3 WRITE_LAC; walkit bookies from walkit's own, under its flag
    LAC_BODY (docs/format.md, WRITE_LAC)."""
    cluster: MixedCluster = request.getfixturevalue(CLUSTERS[bookies])
    peer = cluster.peer()
    try:
        with cluster.client("v3", idle_lac=True) as bk:
            lh = bk.create_ledger(3, 3, 2, digest="bk-hmac", password=b"pw")
            for i in range(5):
                lh.add_entry(b"i%d" % i)
            peer.open(lh.ledger_id, digest="MAC", password="pw")
            assert peer.tail(lh.ledger_id, 4, timeout_ms=5000) == (4, b"i4")  # the long poll sees it
            deadline = time.monotonic() + 5
            lac = peer.read_lac(lh.ledger_id)
            while lac < 4 and time.monotonic() < deadline:
                time.sleep(0.1)
                lac = peer.read_lac(lh.ledger_id)
            assert lac == 4, "READ_LAC told only the last entry's piggy-backed LAC (3)"
            lh.close()
    finally:
        peer.close()
