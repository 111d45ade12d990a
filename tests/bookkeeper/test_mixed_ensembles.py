"""Ledgers whose ensembles hold walkit bookies and Java bookies at once (issue 37).

One BookKeeper-format cluster (``support.mixed.MixedCluster``) per module. Each test
starts exactly the bookies a new ledger must land on - two walkit bookies and one Java
bookie, or one and two - so that both clients, which place a ledger at random among the
writable bookies, put theirs on those three; then one spare of each kind. The walkit
client and BookKeeper's Java client each write a ledger (E=3, Qw=3, Qa=2) in three
phases; during the second a walkit bookie of the ensemble is SIGKILLed with adds in
flight, during the third the ensemble's Java bookie. Each writer replaces the dead bookie
(ensemble change) and goes on; every add is acknowledged, and each client reads back all
the other wrote. Every test runs in both dialects: the Java peer's
``useV2WireProtocol`` and what the walkit client speaks to the Java bookies.

Also on mixed ensembles: each client recovers the other's ledger with a bookie of the
ensemble dead; a restarted walkit bookie, the only one left, serves both clients' ledgers.
The WriteAheadLog test puts a log on one walkit and two Java bookies: append, snapshot,
replay from another process, reopen (fencing the first writer). Every bookie's garbage
collector runs all along.

``WALKIT_SLOW=1`` writes 10,000 entries per ledger where CI writes 2,000.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import walkit
from support.bookkeeper import JavaPeer, payload
from support.mixed import MixedCluster
from support.zk import ZooKeeperServer
from walkit.errors import LedgerFencedError

pytestmark = pytest.mark.bookkeeper

COUNT = 10_000 if os.environ.get("WALKIT_SLOW") == "1" else 2_000
SIZE = 200
PHASE = COUNT // 3


GC_OFTEN_WALKIT = {"gcWaitTime": 300, "gcOverreplicatedLedgerWaitTime": 300}
GC_OFTEN_JAVA = {"gcWaitTime": "1000", "gcOverreplicatedLedgerWaitTime": "1000"}


@pytest.fixture(scope="module")
def mixed(bk_classpath: str, zk_server: ZooKeeperServer) -> Iterator[MixedCluster]:
    """The cluster's tree; each test starts (and stops) the bookies it needs. Every
    bookie's garbage collector runs all the time (every 300 ms on walkit bookies, every
    second on Java ones, both with their over-replication step): none may take an entry
    of a live ledger of either client."""
    cluster = MixedCluster(bk_classpath, zk_server.hosts, java_conf=GC_OFTEN_JAVA, walkit_conf=GC_OFTEN_WALKIT)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["v3", "v2"])
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


HALF = PHASE // 2
#: (seed, count) of each add command, two per phase: a bookie dies between the two
#: commands of phases 1 and 2, while the first one's adds are still flowing.
CHUNKS = [(100 + k, HALF if k % 2 == 0 else PHASE - HALF) for k in range(6)]
TOTAL = sum(n for _, n in CHUNKS)


def _expected() -> list[bytes]:
    return [payload(seed, i, SIZE) for seed, n in CHUNKS for i in range(n)]


def _wait_acks(peer: JavaPeer, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(peer.acks) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"the Java writer had {len(peer.acks)} acks, not {count}, after {timeout} s")
        time.sleep(0.002)


def _wait_replaced(bk: walkit.BookKeeper, ledger: int, victims: set[str], timeout: float = 60.0) -> None:
    """Until the last fragment of ``ledger`` holds none of ``victims``. A writer learns of
    a dead bookie from the adds it sends it; those adds complete with Qa acks from the
    others, and a writer (either client, as BookKeeper's) that is closed before the failed
    connection is reported records the ledger as it is. So each ledger is closed only once
    its writer replaced both victims - which is what the test is about."""
    deadline = time.monotonic() + timeout
    while set(bk.ledger_metadata(ledger).ensembles[-1][1]) & victims:
        if time.monotonic() > deadline:
            raise AssertionError(f"ledger {ledger}: a dead bookie still in {bk.ledger_metadata(ledger).ensembles}")
        time.sleep(0.01)


@pytest.mark.parametrize("walkits,javas", [(2, 1), (1, 2)], ids=["2walkit-1java", "1walkit-2java"])
def test_a_bookie_of_each_kind_dies_mid_write_and_nothing_acknowledged_is_lost(
        mixed: MixedCluster, dialect: str, walkits: int, javas: int) -> None:
    peer = bk = None
    try:
        first_walkit, first_java = mixed.start(walkit=walkits, java=javas)
        mixed.wait_only_running()
        three = {b.bookie_id for b in first_walkit} | {b.bookie_id for b in first_java}
        peer = mixed.peer(v2=dialect == "v2")
        bk = mixed.client(dialect)
        java_ledger = peer.create(3, 3, 2, digest="CRC32C", password="pw")
        lh = bk.create_ledger(3, 3, 2, digest="bk-crc32c", password=b"pw")
        for ledger in (java_ledger, lh.ledger_id):  # both on the three, whatever their kinds
            ensembles = bk.ledger_metadata(ledger).ensembles
            assert len(ensembles) == 1 and set(ensembles[0][1]) == three
        spares, spare_javas = mixed.start(walkit=1, java=1)
        victims = [first_walkit[0].bookie_id, first_java[0].bookie_id]
        futures: list[object] = []
        done = 0
        for k, (seed, n) in enumerate(CHUNKS):
            if k == 4:  # the first victim's registration gone, or the Java client may pick it again
                mixed.wait_only_running()
            peer.send("add", ledger=java_ledger, count=n, size=SIZE, seed=seed, pipelined=True, report=True)
            futures += [lh.add_entry_async(payload(seed, i, SIZE)) for i in range(n)]
            if k in (2, 4):  # the first command of phases 1 and 2: kill while its adds flow
                futures[done + n // 10].result(60)  # type: ignore[attr-defined]
                _wait_acks(peer, done + n // 10)
                mixed.kill(victims[k // 2 - 1])
            assert peer.result(180)["entries"] == list(range(done, done + n))
            done += n
        assert [f.result(180) for f in futures] == list(range(TOTAL))  # type: ignore[attr-defined]
        for ledger in (java_ledger, lh.ledger_id):
            _wait_replaced(bk, ledger, set(victims))
        lh.close()
        peer.close_ledger(java_ledger)
        everyone = three | {spares[0].bookie_id, spare_javas[0].bookie_id}
        for ledger in (java_ledger, lh.ledger_id):
            meta = bk.ledger_metadata(ledger)
            assert meta.state.name == "CLOSED" and meta.last_entry_id == TOTAL - 1
            last = set(meta.ensembles[-1][1])
            assert len(meta.ensembles) >= 2 and not last & set(victims) and last <= everyone, meta.ensembles
        # each client reads everything the other wrote
        rh = bk.open_ledger(java_ledger, password=b"pw")
        assert [e.data for e in rh.read(0, TOTAL - 1)] == _expected()
        info = peer.open(lh.ledger_id, digest="CRC32C", password="pw")
        assert info["closed"] and info["lac"] == TOTAL - 1
        got: list[bytes] = []
        for first in range(0, TOTAL, 500):
            got += peer.read(lh.ledger_id, first, min(first + 499, TOTAL - 1))
        assert got == _expected()
    finally:
        if peer is not None:
            peer.close()
        if bk is not None:
            bk.close()
        mixed.stop_bookies()


@pytest.mark.parametrize("dialect,dead", [("v3", "bookkeeper"), ("v2", "walkit")],
                         ids=["v3-java-bookie-dead", "v2-walkit-bookie-dead"])
def test_each_client_recovers_the_others_ledger_with_a_bookie_of_the_ensemble_dead(
        mixed: MixedCluster, dialect: str, dead: str) -> None:
    """Two walkit bookies and one Java bookie, a spare of each kind. The Java writer is
    SIGKILLed with adds in flight and the walkit writer abandons its ledger; then one
    bookie of the ensemble dies (the Java one, or a walkit one). Each client recovers the
    other's ledger with the two that are left - fencing, reading the tail and writing it
    back (Qa=2 of them answer) - and reads every acknowledged entry."""
    peer = bk = None
    try:
        first_walkit, first_java = mixed.start(walkit=2, java=1)
        mixed.wait_only_running()
        peer = mixed.peer(v2=dialect == "v2")
        bk = mixed.client(dialect)
        java_ledger = peer.create(3, 3, 2, digest="CRC32C", password="pw")
        lh = bk.create_ledger(3, 3, 2, digest="bk-hmac", password=b"pw")
        mixed.start(walkit=1, java=1)
        futures = [lh.add_entry_async(payload(7, i, SIZE)) for i in range(PHASE)]
        peer.send("add", ledger=java_ledger, count=PHASE, size=SIZE, seed=9, report=True)
        assert [f.result(120) for f in futures] == list(range(PHASE))
        _wait_acks(peer, PHASE // 3)
        peer.kill()
        acked = sorted(peer.acks)
        assert acked == list(range(len(acked)))
        bk.close()  # the walkit writer abandons its ledger
        victim = (first_java[0] if dead == "bookkeeper" else first_walkit[0]).bookie_id
        mixed.kill(victim)
        mixed.wait_only_running()
        with mixed.client(dialect) as recovering:
            rh = recovering.open_ledger(java_ledger, password=b"pw")
            assert rh.is_closed and acked[-1] <= rh.last_add_confirmed < PHASE
            lac = rh.last_add_confirmed
            assert [e.data for e in rh.read(0, lac)] == [payload(9, i, SIZE) for i in range(lac + 1)]
        peer = mixed.peer(v2=dialect == "v2")
        info = peer.open(lh.ledger_id, recovery=True, digest="MAC", password="pw")
        assert info["closed"] and info["lac"] == PHASE - 1
        got: list[bytes] = []
        for first in range(0, PHASE, 500):
            got += peer.read(lh.ledger_id, first, min(first + 499, PHASE - 1))
        assert got == [payload(7, i, SIZE) for i in range(PHASE)]
    finally:
        if peer is not None:
            peer.close()
        if bk is not None:
            bk.close()
        mixed.stop_bookies()


def test_a_restarted_walkit_bookie_alone_serves_both_clients_ledgers(mixed: MixedCluster, dialect: str) -> None:
    """Two walkit bookies and a Java one hold a ledger of each client (closed). One walkit
    bookie is restarted (SIGTERM, same port and disks: it registers again with its
    BookKeeper cookie); the other two die. Each client then reads both ledgers whole from
    the restarted walkit bookie alone."""
    peer = None
    try:
        walkits, javas = mixed.start(walkit=2, java=1)
        mixed.wait_only_running()
        peer = mixed.peer(v2=dialect == "v2")
        java_ledger = peer.create(3, 3, 2, digest="CRC32C", password="pw")
        assert peer.add(java_ledger, count=PHASE, size=SIZE, seed=31) == list(range(PHASE))
        peer.close_ledger(java_ledger)
        with mixed.client(dialect) as bk:
            lh = bk.create_ledger(3, 3, 2, digest="bk-crc32c", password=b"pw")
            assert [f.result(60) for f in [lh.add_entry_async(payload(32, i, SIZE)) for i in range(PHASE)]] == list(
                range(PHASE))
            lh.close()
        survivor = walkits[0]
        assert survivor.terminate() == 0
        survivor.start()
        mixed.wait_registered(survivor.bookie_id)
        mixed.kill(walkits[1].bookie_id)
        mixed.kill(javas[0].bookie_id)
        mixed.wait_only_running()
        assert mixed.running() == {survivor.bookie_id}
        expected = {java_ledger: [payload(31, i, SIZE) for i in range(PHASE)],
                    lh.ledger_id: [payload(32, i, SIZE) for i in range(PHASE)]}
        with mixed.client(dialect) as bk:
            for ledger, want in expected.items():
                assert [e.data for e in bk.open_ledger(ledger, password=b"pw").read(0, PHASE - 1)] == want
        for ledger, want in expected.items():
            assert peer.open(ledger, digest="CRC32C", password="pw")["lac"] == PHASE - 1
            got: list[bytes] = []
            for first in range(0, PHASE, 500):
                got += peer.read(ledger, first, min(first + 499, PHASE - 1))
            assert got == want
    finally:
        if peer is not None:
            peer.close()
        mixed.stop_bookies()


REPLAY = """
import hashlib, json, sys
import walkit
with walkit.BookKeeper(sys.argv[1], use_v2_wire_protocol=sys.argv[2] == "v2") as bk:
    with walkit.WriteAheadLog.reader(bk, sys.argv[3]) as reader:
        records = [(lsn, record) for lsn, record in reader.replay()]
        snap = reader.latest_snapshot()
        state = None if snap is None else snap.read()
print(json.dumps({"count": len(records), "lsns": [str(lsn) for lsn, _ in records],
                  "sha": hashlib.sha256(b"".join(r for _, r in records)).hexdigest(),
                  "snapshot": None if snap is None else [str(snap.lsn), state.decode()]}))
"""


def test_write_ahead_log_with_java_bookies_in_its_ensembles(mixed: MixedCluster, dialect: str,
                                                             tmp_path: Path) -> None:
    """A WriteAheadLog on the BookKeeper-format cluster, its segments on one walkit and two
    Java bookies: append, snapshot, replay in another process, reopen (fencing the first
    writer), append on, replay."""
    import hashlib

    name = f"orders-{dialect}"
    try:
        mixed.start(walkit=1, java=2)
        mixed.wait_only_running()
        with mixed.client(dialect) as bk:
            wal = walkit.WriteAheadLog.open(bk, name, ensemble_size=3, write_quorum=3, ack_quorum=2)
            lsns = [wal.append(b"rec-%d" % i) for i in range(300)]
            lsns += wal.append_many([b"rec-%d" % i for i in range(300, COUNT)]).result(120)
            snap = wal.snapshot(b"state-at-99", lsns[99])
            segment = bk.ledger_metadata(wal.metadata().segments[0].ledger_id)
            assert segment.digest.startswith("bk-")
            kinds = sorted(mixed.kind(b) for b in segment.ensembles[0][1])
            assert kinds == ["bookkeeper", "bookkeeper", "walkit"]
            records = [b"rec-%d" % i for i in range(COUNT)]
            script = tmp_path / "replay.py"
            script.write_text(REPLAY)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
            run = subprocess.run([sys.executable, str(script), mixed.uri, dialect, name], capture_output=True, text=True,
                                 timeout=120, env=env)
            assert run.returncode == 0, run.stderr[-3000:]
            other = json.loads(run.stdout.strip().splitlines()[-1])
            assert other["count"] == COUNT and other["lsns"] == [str(lsn) for lsn in lsns]
            assert other["sha"] == hashlib.sha256(b"".join(records)).hexdigest()
            assert other["snapshot"] == [str(snap.lsn), "state-at-99"]
            with walkit.WriteAheadLog.open(bk, name) as second:  # fences the first writer's segment
                with pytest.raises(LedgerFencedError):
                    wal.append(b"from the fenced writer")
                more = second.append_many([b"more-%d" % i for i in range(100)]).result(60)
                replayed = list(second.replay())
                assert [r for _, r in replayed] == records + [b"more-%d" % i for i in range(100)]
                assert [lsn for lsn, _ in replayed] == lsns + more
                latest = second.latest_snapshot()
                assert latest is not None and latest.lsn == lsns[99]
            wal.close()
    finally:
        mixed.stop_bookies()
