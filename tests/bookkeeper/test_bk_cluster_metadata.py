"""walkit's metadata layer on Apache BookKeeper 4.18.2's own clusters, and BookKeeper on
clusters walkit made (walkit/metadata/_cluster.py, _ledgers.py, _bk_ledgers.py).

One Java cluster (``initnewcluster`` and three Java bookies) per module: walkit connects
to it, reads what the Java client wrote; ``walkit init --format bookkeeper`` makes a tree
equal to what ``initnewcluster`` makes, and BookieShell reads ledgers walkit created there.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from support.bookkeeper import JavaBookie, JavaCluster, JavaPeer
from support.zk import ZooKeeperServer
from walkit.metadata import (
    LedgerManager,
    LedgerMetadata,
    LedgerState,
    UnderReplication,
    connect,
    init_cluster,
    open_metadata_store,
    walkit_path,
)
from walkit.metadata._bk_paths import INT_MAX
from walkit.metadata._bk_records import InstanceId, Layout

pytestmark = pytest.mark.bookkeeper


def _dump(zk: Any, path: str) -> dict[str, bytes]:
    found = {path: zk.get(path)[0] or b""}
    for child in zk.get_children(path):
        found.update(_dump(zk, f"{path}/{child}"))
    return found


def test_walkit_connects_to_a_cluster_bookkeeper_made(java_cluster: JavaCluster) -> None:
    with connect(java_cluster.metadata_uri, read_only=True) as cluster:
        assert cluster.info.format == "bookkeeper"
        assert cluster.info.layout == "hierarchical"
        assert cluster.info.root == java_cluster.root
        instance = java_cluster.zk.get(f"{java_cluster.root}/INSTANCEID")[0]
        assert cluster.info.instance_id == InstanceId.decode(instance).value
    plain = java_cluster.metadata_uri.replace("zk+hierarchical://", "zk://")
    with connect(plain, read_only=True) as cluster:
        assert cluster.info.layout == "hierarchical"


def test_walkit_init_makes_what_bookkeepers_init_makes(bk_classpath: str, zk_server: ZooKeeperServer) -> None:
    java = JavaCluster(bk_classpath, zk_server.hosts, bookies=0)  # initnewcluster alone
    try:
        theirs = _dump(java.zk, java.root)
        root = f"/wk-{uuid.uuid4().hex[:12]}/ledgers"
        store = open_metadata_store(f"zk+hierarchical://{zk_server.hosts}{root}")
        try:
            info = init_cluster(store, root, format="bookkeeper")
        finally:
            store.close()
        ours = _dump(java.zk, root)
        java.zk.delete(root.rsplit("/", 1)[0], recursive=True)
    finally:
        java.stop()
    relative = {path[len(java.root):]: data for path, data in theirs.items()}
    mine = {path[len(root):]: data for path, data in ours.items()}
    assert sorted(mine) == sorted(relative) == ["", "/INSTANCEID", "/LAYOUT", "/available", "/available/readonly"]
    assert mine["/LAYOUT"] == relative["/LAYOUT"] == Layout.for_manager("hierarchical").encode()
    assert uuid.UUID(mine["/INSTANCEID"].decode()) and uuid.UUID(relative["/INSTANCEID"].decode())
    assert mine["/INSTANCEID"].decode() == info.instance_id
    assert {k: v for k, v in mine.items() if k != "/INSTANCEID"} == {k: v for k, v in relative.items()
                                                                      if k != "/INSTANCEID"}


# --- (a) what the Java client wrote, read by walkit --------------------------------------------


def test_walkit_reads_the_ledgers_the_java_client_made(java_cluster: JavaCluster) -> None:
    peer = java_cluster.peer()
    try:
        closed = peer.create()
        peer.add(closed, [b"alpha", b"beta", b"gamma"], pipelined=False)
        peer.close_ledger(closed)
        hmac = peer.create(ensemble=2, write_quorum=2, ack_quorum=1, digest="MAC", password="s3cret")
        peer.add(hmac, [b"one"], pipelined=False)
        peer.close_ledger(hmac)
        crc32 = peer.create(ensemble=3, write_quorum=2, ack_quorum=2, digest="CRC32", password="pw")
        peer.add(crc32, [b"x", b"y"], pipelined=False)  # left open
        dummy = peer.create(ensemble=1, write_quorum=1, ack_quorum=1, digest="DUMMY")
        java_ids = {closed, hmac, crc32, dummy}
        assert java_ids <= set(peer.list_ledgers())
    finally:
        peer.close()
    bookies = {b.bookie_id for b in java_cluster.bookies}
    with connect(java_cluster.metadata_uri, read_only=True) as cluster:
        assert java_ids <= set(cluster.ledgers.ledger_ids())
        m, _ = cluster.ledgers.read(closed)
        assert (m.ensemble_size, m.write_quorum, m.ack_quorum, m.digest) == (3, 3, 2, "bk-crc32c")
        assert (m.state, m.last_entry_id, m.length) == (LedgerState.CLOSED, 2, len(b"alphabetagamma"))
        assert m.bk_password == b"" and m.check_password(b"") and set(m.ensembles[0][1]) == bookies
        m, _ = cluster.ledgers.read(hmac)
        assert (m.ensemble_size, m.write_quorum, m.ack_quorum, m.digest) == (2, 2, 1, "bk-hmac")
        assert m.bk_password == b"s3cret" and m.check_password(b"s3cret") and not m.check_password(b"")
        assert (m.state, m.last_entry_id, m.length) == (LedgerState.CLOSED, 0, 3)
        assert len(m.ensembles) == 1 and set(m.ensembles[0][1]) <= bookies and m.ensembles[0][0] == 0
        m, _ = cluster.ledgers.read(crc32)
        assert (m.digest, m.bk_password, m.state, m.last_entry_id) == ("bk-crc32", b"pw", LedgerState.OPEN, -1)
        assert (m.ensemble_size, m.write_quorum, m.ack_quorum) == (3, 2, 2)
        m, _ = cluster.ledgers.read(dummy)
        assert (m.digest, m.ensemble_size, m.state) == ("bk-dummy", 1, LedgerState.OPEN)
        assert m.ctime > 0  # BookKeeper stores none by default: the znode's creation time


def test_walkit_ledger_cli_on_a_java_clusters_uri(java_cluster: JavaCluster, capsys: pytest.CaptureFixture[str]
                                                  ) -> None:
    from walkit.cli import main

    peer = java_cluster.peer()
    try:
        ledger = peer.create(ensemble=2, write_quorum=2, ack_quorum=2, digest="MAC", password="pw")
        peer.add(ledger, [b"abc", b"de"], pipelined=False)
        peer.close_ledger(ledger)
    finally:
        peer.close()
    capsys.readouterr()
    assert main(["ledger", "list", "--metadata", java_cluster.metadata_uri, "--json"]) == 0
    listed = {row["ledger"]: row for row in json.loads(capsys.readouterr().out)}
    assert listed[ledger]["state"] == "CLOSED" and listed[ledger]["last_entry_id"] == 1
    assert (listed[ledger]["ensemble_size"], listed[ledger]["write_quorum"]) == (2, 2)
    assert main(["ledger", "show", str(ledger), "--metadata", java_cluster.metadata_uri, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["digest"] == "bk-hmac" and shown["password"] == "set" and shown["length"] == 5
    assert set(shown["fragments"][0]["bookies"]) <= {b.bookie_id for b in java_cluster.bookies}
    assert main(["cluster", "info", "--metadata", java_cluster.metadata_uri, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "bookkeeper" and info["layout"] == "hierarchical" and info["ledgers"] >= 1
    assert set(info["bookies"]["writable"]) == {b.bookie_id for b in java_cluster.bookies}


# --- (b) ids: walkit and the Java client in one cluster -----------------------------------------


def test_walkit_and_java_clients_never_share_a_ledger_id(java_cluster: JavaCluster) -> None:
    """Two walkit managers (64 ids per draw, and one) create ledgers while the Java client
    creates its own: no id is taken twice, and every ledger is there with its creator's
    metadata."""
    peer = java_cluster.peer()
    clusters = [connect(java_cluster.metadata_uri) for _ in range(2)]
    managers = [LedgerManager(clusters[0].store, clusters[0].info, id_range=64),
                LedgerManager(clusters[1].store, clusters[1].info, id_range=1)]
    bookie = java_cluster.bookies[0].bookie_id
    walkit_ids: list[int] = []
    lock = threading.Lock()

    def make(m: LedgerManager) -> None:
        for _ in range(100):
            lid = m.new_ledger_id()
            m.create(LedgerMetadata.create(lid, (bookie,), write_quorum=1, ack_quorum=1, password=b"walkit",
                                           ctime=1, digest="bk-crc32c"))
            with lock:
                walkit_ids.append(lid)

    try:
        sent = [peer.send("create", ensemble=1, write_quorum=1, ack_quorum=1, digest="CRC32C", password="java")
                for _ in range(40)]
        threads = [threading.Thread(target=make, args=(m,)) for m in managers]
        for t in threads:
            t.start()
        java_ids = [int(peer.result()["ledger"]) for _ in sent]
        for t in threads:
            t.join()
        after = peer.create(ensemble=1, write_quorum=1, ack_quorum=1)
        seen_by_java = set(peer.list_ledgers())
        listed = set(managers[0].ledger_ids())
        passwords = {lid: managers[0].read(lid)[0].bk_password for lid in (*walkit_ids, *java_ids)}
    finally:
        peer.close()
        for c in clusters:
            c.close()
    assert len(set(walkit_ids)) == len(walkit_ids) == 200
    assert len(set(java_ids)) == 40 and not set(java_ids) & set(walkit_ids)
    assert after not in walkit_ids and after > max(java_ids)
    assert {*walkit_ids, *java_ids, after} <= listed and {*walkit_ids, *java_ids} <= seen_by_java
    assert all(passwords[lid] == b"walkit" for lid in walkit_ids)
    assert all(passwords[lid] == b"java" for lid in java_ids)  # nobody overwrote anybody's ledger
    assert max(walkit_ids + java_ids + [after]) < INT_MAX  # all from BookKeeper's 31-bit generator


# --- (c) BookKeeper on a cluster walkit made ----------------------------------------------------


def test_bookkeeper_uses_a_cluster_walkit_made(bk_classpath: str, zk_server: ZooKeeperServer,
                                               tmp_path: Path) -> None:
    """``walkit init --format bookkeeper``; walkit's LedgerManager creates ledgers and walkit's
    own nodes (WAL namespace) below ID-walkit, an under-replication mark in BookKeeper's own
    tree (tests/bookkeeper/test_bk_underreplication.py); BookieShell lists and
    shows exactly the ledgers; a Java bookie registers and a Java client writes a ledger there,
    which walkit reads."""
    from walkit.cli import main

    root = f"/wk-{uuid.uuid4().hex[:12]}/ledgers"
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    assert main(["init", "--metadata", uri, "--format", "bookkeeper"]) == 0
    conf = tmp_path / "client.conf"
    conf.write_text(f"metadataServiceUri={uri}\n")
    from kazoo.client import KazooClient

    zk = KazooClient(zk_server.hosts)
    zk.start(timeout=15)
    bookie = JavaBookie(bk_classpath, uri, zk, root, tmp_path / "bookie")
    try:
        with connect(uri) as cluster:
            m = cluster.ledgers
            made = []
            for digest, password in (("bk-crc32c", b""), ("bk-hmac", b"s3cret"), ("bk-crc32", b"pw")):
                lid = m.new_ledger_id()
                m.create(LedgerMetadata.create(lid, ("127.0.0.1:3181", "127.0.0.1:3182"), write_quorum=2,
                                               ack_quorum=1, password=password, ctime=1_700_000_000_000,
                                               digest=digest, custom={"app": b"walkit"}))
                made.append(lid)
            m.update(made[0], lambda md: md.closed(41, 4200))
            UnderReplication(cluster.store, cluster.info).mark(made[1], ["127.0.0.1:3182"])
            cluster.store.create(walkit_path(cluster.info, "logs/ns/orders"), b"{}", make_parents=True)
            cluster.store.create(walkit_path(cluster.info, "logholds/ns/orders"), make_parents=True)
        assert sorted(zk.get_children(root)) == ["00", "ID-walkit", "INSTANCEID", "LAYOUT", "available", "idgen",
                                                 "underreplication"]  # the mark is BookKeeper's record
        listed = {int(x) for x in re.findall(r"ledgerId=(\d+)", _shell(bk_classpath, conf, "listledgers"))}
        assert listed == set(made)
        out = _shell(bk_classpath, conf, "ledgermetadata", "-ledgerid", str(made[0]))
        for field in (r"state=CLOSED", r"lastEntryId=41\b", r"length=4200\b", r"digestType=CRC32C",
                      r"ensembleSize=2\b", r"writeQuorumSize=2\b", r"ackQuorumSize=1\b", "127.0.0.1:3181"):
            assert re.search(field, out), (field, out[-2000:])
        out = _shell(bk_classpath, conf, "ledgermetadata", "-ledgerid", str(made[1]))
        assert re.search(r"state=OPEN", out) and re.search(r"digestType=MAC", out), out[-2000:]
        bookie.start()
        peer = JavaPeer(bk_classpath, uri, tmp_path)
        try:
            java = peer.create(ensemble=1, write_quorum=1, ack_quorum=1, digest="CRC32C", password="j")
            peer.add(java, [b"from", b"java"], pipelined=False)
            peer.close_ledger(java)
        finally:
            peer.close()
        assert java not in made
        with connect(uri, read_only=True) as cluster:
            assert set(cluster.ledgers.ledger_ids()) == {*made, java}
            m2, _ = cluster.ledgers.read(java)
            assert (m2.digest, m2.bk_password, m2.last_entry_id, m2.length) == ("bk-crc32c", b"j", 1, 8)
            assert m2.ensembles[0][1] == (bookie.bookie_id,)
    finally:
        bookie.stop()
        zk.delete(root.rsplit("/", 1)[0], recursive=True)
        zk.stop()
        zk.close()


def _shell(classpath: str, conf: Path, *args: str) -> str:
    run = subprocess.run(["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", classpath,
                          "org.apache.bookkeeper.bookie.BookieShell", "-conf", str(conf), *args],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    return run.stdout + run.stderr


@pytest.mark.parametrize("manager", ["flat", "longhierarchical"])
def test_bookie_shell_lists_walkits_ledgers_under_the_other_managers(bk_classpath: str, zk_server: ZooKeeperServer,
                                                                     tmp_path: Path, manager: str) -> None:
    """The flat and long-hierarchical trees walkit keeps are BookKeeper's: BookieShell lists
    the ledgers walkit created (a long id too) and nothing of walkit's own nodes."""
    root = f"/wk-{uuid.uuid4().hex[:12]}/ledgers"
    uri = f"zk+{manager}://{zk_server.hosts}{root}"
    store = open_metadata_store(uri)
    try:
        init_cluster(store, root, manager, format="bookkeeper")  # type: ignore[arg-type]
        with connect(uri) as cluster:
            made = [cluster.ledgers.new_ledger_id(), cluster.ledgers.new_ledger_id(), 2**40 + 3]
            for lid in made:
                cluster.ledgers.create(LedgerMetadata.create(lid, ("127.0.0.1:3181",), write_quorum=1, ack_quorum=1,
                                                             password=b"pw", ctime=1, digest="bk-crc32c"))
            cluster.store.create(walkit_path(cluster.info, "logs/ns/orders"), b"{}", make_parents=True)
            idgen = root if manager == "flat" else f"{root}/idgen"
            assert any(n.startswith("ID-0") for n in cluster.store.children(idgen))  # the drawn range's, still there
            conf = tmp_path / "client.conf"
            conf.write_text(f"metadataServiceUri={uri}\n")
            out = _shell(bk_classpath, conf, "listledgers")
        assert {int(x) for x in re.findall(r"ledgerId=(\d+)", out)} == set(made), out[-2000:]
        out = _shell(bk_classpath, conf, "ledgermetadata", "-ledgerid", str(2**40 + 3))
        assert re.search(r"digestType=CRC32C", out) and re.search(r"state=OPEN", out), out[-2000:]
    finally:
        store.delete(root.rsplit("/", 1)[0], recursive=True)
        store.close()


def test_past_31_bits_walkit_and_java_draw_from_the_same_hob(java_cluster: JavaCluster) -> None:
    """Once ``idgen-long`` exists (a client ran out of 31-bit ids; made here by hand, as
    ZooKeeper's counter cannot be set) Java's LongZkLedgerIdGenerator and walkit both draw
    ``HOB-0000000001``'s counter: long ids, interleaved, never the same. Runs last in the
    module: the cluster's ids are long from here on."""
    java_cluster.zk.create(f"{java_cluster.root}/idgen-long")
    peer = java_cluster.peer()
    try:
        with connect(java_cluster.metadata_uri) as cluster:
            m = LedgerManager(cluster.store, cluster.info, id_range=3)
            ids = []
            for _ in range(4):
                ids.append(("java", peer.create(ensemble=1, write_quorum=1, ack_quorum=1)))
                ids.append(("walkit", m.new_ledger_id()))
            mine = ids[1][1]
            m.create(LedgerMetadata.create(mine, (java_cluster.bookies[0].bookie_id,), write_quorum=1, ack_quorum=1,
                                           password=b"", ctime=1, digest="bk-crc32c"))
            listed = set(cluster.ledgers.ledger_ids())
        assert {lid for who, lid in ids if who == "java"} | {mine} <= set(peer.list_ledgers())
    finally:
        peer.close()
    values = [lid for _, lid in ids]
    assert len(set(values)) == len(values) and all(lid >> 32 == 1 for lid in values), ids
    assert {lid for who, lid in ids if who == "java"} | {mine} <= listed
    assert java_cluster.zk.get_children(f"{java_cluster.root}/idgen-long") == ["HOB-0000000001"]


def _read_from_bookie(port: int, ledger: int, entry: int) -> object:
    """One v3 READ_ENTRY straight to a Java bookie (walkit's codec, client side): the
    decoded answer (ReadEntryResponse, or ErrorResponse once the bookie has no such ledger)."""
    from walkit.protocol._bk_v3 import decode_response, encode_request
    from walkit.protocol._messages import ReadEntry

    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(encode_request(ReadEntry(ledger, entry, request_id=1)))
        head = _recv_exactly(s, 4)
        return decode_response(_recv_exactly(s, struct.unpack(">I", head)[0]))


def _recv_exactly(s: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = s.recv(size - len(data))
        assert chunk, "the bookie closed the connection"
        data += chunk
    return data


def test_java_bookie_gc_keeps_walkits_tree_and_collects_what_walkit_deleted(
        bk_classpath: str, zk_server: ZooKeeperServer, tmp_path: Path) -> None:
    """A Java bookie (GC every second) on a cluster walkit made: the Java client writes two
    ledgers; walkit deletes one's metadata, creates one of its own and keeps walkit's own nodes
    below ID-walkit. The bookie's GC collects the deleted ledger, keeps the other, and its GC
    thread keeps running (no exception from walkit's nodes)."""
    from kazoo.client import KazooClient

    from walkit.protocol._messages import ErrorResponse, ReadEntryResponse

    root = f"/wk-{uuid.uuid4().hex[:12]}/ledgers"
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    store = open_metadata_store(uri)
    init_cluster(store, root, format="bookkeeper")
    store.close()
    zk = KazooClient(zk_server.hosts)
    zk.start(timeout=15)
    bookie = JavaBookie(bk_classpath, uri, zk, root, tmp_path / "bookie")
    with open(bookie.conf, "a") as conf:
        conf.write("gcWaitTime=1000\n")
    try:
        bookie.start()
        peer = JavaPeer(bk_classpath, uri, tmp_path)
        try:
            doomed = peer.create(ensemble=1, write_quorum=1, ack_quorum=1)
            kept = peer.create(ensemble=1, write_quorum=1, ack_quorum=1)
            for lid in (doomed, kept):
                peer.add(lid, [b"entry zero", b"entry one"], pipelined=False)
                peer.close_ledger(lid)
        finally:
            peer.close()
        assert isinstance(_read_from_bookie(bookie.port, doomed, 0), ReadEntryResponse)
        with connect(uri) as cluster:
            cluster.store.create(walkit_path(cluster.info, "logs/ns/orders"), b"{}", make_parents=True)
            ours = cluster.ledgers.new_ledger_id()
            cluster.ledgers.create(LedgerMetadata.create(ours, (bookie.bookie_id,), write_quorum=1, ack_quorum=1,
                                                         password=b"", ctime=1, digest="bk-crc32c"))
            cluster.ledgers.delete(doomed)
        deadline = time.monotonic() + 30
        while isinstance(_read_from_bookie(bookie.port, doomed, 0), ReadEntryResponse):
            assert time.monotonic() < deadline, "the Java bookie's GC did not collect the ledger walkit deleted\n" + \
                bookie.log_tail()
            time.sleep(0.5)
        gone = _read_from_bookie(bookie.port, doomed, 0)
        assert isinstance(gone, ErrorResponse) and gone.status.name in ("ENOLEDGER", "ENOENTRY")
        time.sleep(2.5)  # two more GC rounds with walkit's nodes and walkit's ledger in the tree
        answer = _read_from_bookie(bookie.port, kept, 1)
        assert isinstance(answer, ReadEntryResponse) and answer.data.endswith(b"entry one")
        assert bookie.running
        log = bookie.log.read_text(errors="replace")
        assert not re.search(r"(?i)(garbage|\bgc\b).*(exception|error)|(exception|error).*(garbage|\bgc\b)", log), \
            bookie.log_tail()
    finally:
        bookie.stop()
        zk.delete(root.rsplit("/", 1)[0], recursive=True)
        zk.stop()
        zk.close()
