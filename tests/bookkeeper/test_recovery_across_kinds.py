"""Re-replication across kinds of bookie, against Apache BookKeeper 4.18.2 itself (issue 37).

Each test has a BookKeeper-format cluster of its own (``support.mixed.MixedCluster``):
walkit bookie processes and Java bookies in one tree, both clients on its one URI.
Closed ledgers - ``bk-crc32c`` and ``bk-hmac`` written by the walkit client, ``CRC32C``
and ``MAC`` ones written by BookKeeper's Java client - lose a bookie of their ensemble
(SIGKILL) and are re-replicated onto a spare:

- by ``walkit recover`` (:func:`walkit.recovery.recover`, what the CLI calls), a Java
  bookie lost or a walkit one, onto a walkit spare or a Java one: a Java bookie among the
  sources or as the target makes it a client copy (walkit/recovery/_client_copy.py);
- by walkit's autorecovery daemon, from an under-replication mark;
- by BookKeeper's own ``AutoRecoveryMain`` (auditor and replication worker), a ledger the
  walkit client wrote on walkit bookies only;

and a client copy passes over a damaged replica, and fails an entry no replica holds
intact; walkit refuses to decommission a Java bookie.

Then one more original member of the ensemble is killed, so some entries are left only
on the spare, and both clients read every entry back.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from support.bookkeeper import JVM_FLAGS, JavaBookie, payload
from support.mixed import MixedCluster
from support.zk import ZooKeeperServer
from walkit.client import BookieClient, EntryCodec
from walkit.errors import InvalidArgumentError
from walkit.metadata import UnderReplication, connect
from walkit.recovery import AutoRecovery, AutoRecoveryConfig, count_held, decommission, lost_fragments, recover
from walkit.recovery._replicator import LIST_TIMEOUT, Replicator

pytestmark = pytest.mark.bookkeeper

T = TypeVar("T")
COUNT = 200  # entries per ledger
SIZE = 100
JAVA_DIGEST = {"bk-crc32c": "CRC32C", "bk-hmac": "MAC"}


@dataclass(frozen=True)
class Written:
    ledger_id: int
    digest: str  # walkit's name
    password: bytes
    payloads: list[bytes]


@pytest.fixture
def mixed(bk_classpath: str, zk_server: ZooKeeperServer) -> Iterator[MixedCluster]:
    cluster = MixedCluster(bk_classpath, zk_server.hosts)
    try:
        yield cluster
    finally:
        cluster.stop()


def _until(what: str, check: Callable[[], bool], timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
            raise AssertionError(f"{what}: not within {timeout} s\n{tail}")
        time.sleep(0.2)


def _walkit_ledger(cluster: MixedCluster, digest: str, tag: int, write_quorum: int = 2) -> Written:
    password = b"walkit-%d" % tag
    payloads = [b"%s-%d-" % (digest.encode(), tag) + bytes([e % 251]) * (e % 90) for e in range(COUNT)]
    with cluster.client() as bk:
        lh = bk.create_ledger(3, write_quorum, 2, digest=digest, password=password)
        futures = [lh.add_entry_async(p) for p in payloads]
        assert [f.result() for f in futures] == list(range(COUNT))
        lh.close()
    return Written(lh.ledger_id, digest, password, payloads)


def _java_ledger(cluster: MixedCluster, digest: str, seed: int) -> Written:
    peer = cluster.peer()
    try:
        ledger = peer.create(3, 2, 2, digest=JAVA_DIGEST[digest], password="java-%d" % seed)
        peer.add(ledger, count=COUNT, size=SIZE, seed=seed)
        peer.close_ledger(ledger)
    finally:
        peer.close()
    return Written(ledger, digest, b"java-%d" % seed, [payload(seed, i, SIZE) for i in range(COUNT)])


def _ensemble(cluster: MixedCluster, ledger_id: int) -> tuple[str, ...]:
    with connect(cluster.uri) as store:
        [(_, ensemble)] = store.ledgers.read(ledger_id)[0].ensembles
        return ensemble


def _both_clients_read_everything(cluster: MixedCluster, ledgers: list[Written]) -> None:
    with cluster.client() as bk:
        for w in ledgers:
            rh = bk.open_ledger(w.ledger_id, password=w.password)
            assert rh.is_closed and rh.last_add_confirmed == COUNT - 1
            assert [e.data for e in rh.read(0, COUNT - 1)] == w.payloads, w
    peer = cluster.peer()
    try:
        for w in ledgers:
            peer.open(w.ledger_id, digest=JAVA_DIGEST[w.digest], password=w.password.decode())
            assert peer.read(w.ledger_id, 0, COUNT - 1) == w.payloads, w
    finally:
        peer.close()


def _add(cluster: MixedCluster, kind: str) -> str:
    return cluster.add_walkit().bookie_id if kind == "walkit" else cluster.add_java().bookie_id


@pytest.mark.parametrize("spare", ["walkit", "java"], ids=["walkit-spare", "java-spare"])
@pytest.mark.parametrize("lost_kind", ["java", "walkit"], ids=["java-lost", "walkit-lost"])
def test_walkit_recover_puts_a_lost_bookies_copies_on_a_spare_of_either_kind(mixed: MixedCluster, lost_kind: str,
                                                                             spare: str) -> None:
    """Two walkit bookies and one Java bookie hold a walkit-written bk-crc32c and bk-hmac
    ledger and a Java-written CRC32C one (E=3, Qw=2); one of them is SIGKILLed and
    ``walkit recover`` copies what it held onto the spare - through the client when a Java
    bookie is a source or the target, or the ledger is bk-hmac; pushed by a walkit bookie
    otherwise - durable before the CAS."""
    walkit_bookies, java_bookies = mixed.start(walkit=2, java=1)
    ledgers = [_walkit_ledger(mixed, "bk-crc32c", 1), _walkit_ledger(mixed, "bk-hmac", 2),
               _java_ledger(mixed, "bk-crc32c", 3)]
    target = _add(mixed, spare)
    lost = java_bookies[0].bookie_id if lost_kind == "java" else walkit_bookies[0].bookie_id
    before = {w.ledger_id: _ensemble(mixed, w.ledger_id) for w in ledgers}
    with connect(mixed.uri) as store:
        held = sum(count_held(work) for w in ledgers for work in lost_fragments(store.ledgers.read(w.ledger_id)[0], lost))
    mixed.kill(lost)
    report = recover(mixed.uri, lost, target=target)
    # walkit bookies at both ends push what they can check (bk-crc32c, the Java client's too);
    # a Java bookie at either end, or bk-hmac, and the client copies
    paths = {"push": 2, "client": 1} if (lost_kind, spare) == ("java", "walkit") else {"client": 3}
    assert report.failures == [] and report.fragments_replaced == 3 and report.copy_paths == paths
    assert report.entries_copied == held
    for w in ledgers:
        assert _ensemble(mixed, w.ledger_id) == tuple(target if b == lost else b for b in before[w.ledger_id])
    # one more original member gone: what it shared with the lost bookie is on the spare only
    mixed.kill(next(b for b in before[ledgers[0].ledger_id] if b not in (lost, target)))
    _both_clients_read_everything(mixed, ledgers)


def test_walkits_autorecovery_worker_repairs_a_marked_ledger_across_kinds(mixed: MixedCluster) -> None:
    """A Java-written MAC (bk-hmac) ledger and a walkit-written bk-crc32c one lose their
    Java bookie; the ledgers are marked under-replicated with it and walkit's autorecovery
    daemon re-replicates them onto a walkit spare and completes the marks."""
    _, java_bookies = mixed.start(walkit=2, java=1)
    ledgers = [_java_ledger(mixed, "bk-hmac", 4), _walkit_ledger(mixed, "bk-crc32c", 5)]
    target = mixed.add_walkit().bookie_id
    lost = java_bookies[0].bookie_id
    mixed.kill(lost)
    mixed.wait_only_running()  # as an auditor marks: once its registration is gone (else it looks back)
    with connect(mixed.uri) as store:
        marks = UnderReplication(store.store, store.info)
        for w in ledgers:
            marks.mark(w.ledger_id, [lost])
        daemon = AutoRecovery(mixed.uri, "walkit-autorecovery-1", AutoRecoveryConfig(lost_bookie_recovery_delay=0.0),
                              session_timeout=4.0)
        daemon.start()
        try:
            _until("the marks completed", lambda: not any(marks.is_marked(w.ledger_id) for w in ledgers), 60.0)
            assert daemon.error is None and daemon.repaired >= 2
        finally:
            daemon.stop()
    for w in ledgers:
        assert lost not in _ensemble(mixed, w.ledger_id) and target in _ensemble(mixed, w.ledger_id)
    mixed.kill(next(b for b in _ensemble(mixed, ledgers[0].ledger_id) if b != target))
    _both_clients_read_everything(mixed, ledgers)


def test_bookkeepers_autorecovery_repairs_a_walkit_ledger_on_walkit_bookies(mixed: MixedCluster) -> None:
    """BookKeeper's own AutoRecoveryMain (auditor and replication worker, Java) finds the
    walkit bookie lost under a ledger the walkit client wrote on walkit bookies only, and
    re-replicates it with BookKeeper's code onto the walkit spare: the walkit bookies serve
    BookKeeper's reads and recovery adds, and the metadata walkit wrote is BookKeeper's."""
    walkit_bookies, _ = mixed.start(walkit=3)
    ledgers = [_walkit_ledger(mixed, "bk-crc32c", 6)]
    target = mixed.add_walkit().bookie_id
    lost = walkit_bookies[0].bookie_id
    conf = JavaBookie(mixed.java.classpath, mixed.uri, mixed.java.zk, mixed.java.root,
                      mixed.directory / "autorecovery").conf  # a configuration only: no bookie starts
    log = mixed.directory / "autorecovery.log"
    mixed.kill(lost)
    with open(log, "ab") as out:
        java = subprocess.Popen(["java", *JVM_FLAGS, "-cp", mixed.java.classpath,
                                 "org.apache.bookkeeper.replication.AutoRecoveryMain", "--conf", str(conf)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        _until("BookKeeper's worker replaced the lost bookie",
               lambda: lost not in _ensemble(mixed, ledgers[0].ledger_id), 90.0, log)
    finally:
        java.terminate()
        try:
            java.wait(15)
        except subprocess.TimeoutExpired:
            java.kill()
            java.wait()
    assert target in _ensemble(mixed, ledgers[0].ledger_id)
    mixed.kill(next(b for b in _ensemble(mixed, ledgers[0].ledger_id) if b != target))
    _both_clients_read_everything(mixed, ledgers)


def test_a_java_bookie_tells_what_it_holds_and_is_not_decommissioned_by_walkit(mixed: MixedCluster) -> None:
    """What a Java bookie holds (re-replication's ``present``, which the auditor's deeper
    check and a worker use): its default DbLedgerStorage does not serve
    GET_LIST_OF_ENTRIES_OF_LEDGER (UnsupportedOperationException, no answer), so after
    LIST_TIMEOUT the bookie's entries are read one by one, from then on at once. walkit
    cannot make a Java bookie read-only (it has no walkit ADMIN op), so ``walkit
    decommission`` refuses it with the reason, and nothing changes."""
    _, java_bookies = mixed.start(walkit=2, java=1)
    ledgers = [_walkit_ledger(mixed, "bk-crc32c", 7)]
    mixed.add_walkit()
    bookie = java_bookies[0].bookie_id
    before = _ensemble(mixed, ledgers[0].ledger_id)

    position = before.index(bookie)
    ledger_id = ledgers[0].ledger_id

    async def present() -> list[tuple[set[int], float]]:
        with connect(mixed.uri) as store:
            replicator = Replicator(store)
            seen: list[tuple[set[int], float]] = []
            try:
                for args in ((ledger_id, 0, COUNT - 1), (ledger_id, 10, 12), (ledger_id + 1_000_000, 0, 10)):
                    t0 = time.monotonic()
                    seen.append((await replicator.present(bookie, *args), time.monotonic() - t0))
            finally:
                await replicator.close()
            return seen

    (whole, first_wait), (some, _), (none, later_wait) = asyncio.run(present())
    assert whole == {e for e in range(COUNT) if (position - e) % 3 < 2}  # E=3, Qw=2
    assert some == {e for e in (10, 11, 12) if (position - e) % 3 < 2}
    assert none == set()  # no such ledger there
    assert first_wait >= LIST_TIMEOUT and later_wait < LIST_TIMEOUT  # asked once, then read
    with pytest.raises(InvalidArgumentError, match="read-only") as refused:
        decommission(mixed.uri, bookie)
    assert "walkit recover" in str(refused.value) and bookie in str(refused.value)
    assert _ensemble(mixed, ledgers[0].ledger_id) == before and bookie in mixed.registered()


def _raw(bookie: str, act: Callable[[BookieClient], Awaitable[T]]) -> T:
    """``act`` on a plain walkit connection to the walkit bookie ``bookie``."""
    host, _, port = bookie.rpartition(":")

    async def go() -> T:
        client = await BookieClient.connect(host, int(port))
        try:
            return await act(client)
        finally:
            await client.close()

    return asyncio.run(go())


def test_a_client_copy_passes_over_a_damaged_replica_and_reports_an_entry_none_holds_intact(
        mixed: MixedCluster) -> None:
    """bk-hmac ledgers (E=Qw=3: a client copy, even between walkit bookies) on three walkit bookies:
    entry 0's copy on the first source is damaged, so the copy of the other source is the
    one written to the target; in a second ledger entry 1 is damaged on both survivors, so
    that fragment fails with ReplicasLostError's reason and keeps naming the lost bookie."""
    mixed.start(walkit=3)
    good_ledger, lost_ledger = _walkit_ledger(mixed, "bk-hmac", 8, 3), _walkit_ledger(mixed, "bk-hmac", 9, 3)
    target = mixed.add_walkit().bookie_id
    lost, first_source, second_source = _ensemble(mixed, good_ledger.ledger_id)

    def damage(w: Written, entry_id: int, bookie: str) -> bytes:
        intact = _raw(second_source, lambda c: c.read_entry(w.ledger_id, entry_id)).data
        key = EntryCodec.of("bk-hmac", w.password).master_key
        _raw(bookie, lambda c: c.add_entry(w.ledger_id, entry_id, key, intact[:-1] + bytes([intact[-1] ^ 1]), True))
        return bytes(intact)

    intact = damage(good_ledger, 0, first_source)  # entry 0's sources, in write-set order: first, second
    assert intact != bytes(_raw(first_source, lambda c: c.read_entry(good_ledger.ledger_id, 0)).data)
    damage(lost_ledger, 1, first_source)
    damage(lost_ledger, 1, second_source)
    mixed.kill(lost)
    report = recover(mixed.uri, lost, target=target)
    assert report.fragments_replaced == 1 and report.copy_paths == {"client": 1}
    [failure] = report.failures
    assert failure["ledger"] == lost_ledger.ledger_id and "intact" in failure["error"]
    assert bytes(_raw(target, lambda c: c.read_entry(good_ledger.ledger_id, 0)).data) == intact
    assert lost in _ensemble(mixed, lost_ledger.ledger_id) and target in _ensemble(mixed, good_ledger.ledger_id)
