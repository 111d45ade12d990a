"""Under-replication shared with Apache BookKeeper 4.18.2 (walkit/metadata/_bk_underreplication.py):
BookieShell lists the marks walkit writes (with their missing replicas and walkit's lock
holder), names walkit's auditor, flips the ``disable`` switch walkit reads (and walkit's
flip is what BookieShell reports), and reads and sets the ``lostBookieRecoveryDelay`` walkit's
auditor made and uses; a Java auditor (``AutoRecoveryMain``) and walkit's
autorecovery daemon stand in one election and exactly one of them audits - the Java one
while it lives (walkit's daemon waits in line and audits nothing), then walkit's; the mark
the Java auditor wrote for a stopped Java bookie is read by walkit's ``UnderReplication``,
and walkit's auditor adds the next lost bookie to it, which BookieShell lists; a Java
replication worker repairs a ledger walkit marked and deletes walkit's mark."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.bookkeeper import JVM_FLAGS, JavaCluster
from walkit.metadata import Cluster, UnderReplication, connect
from walkit.metadata._bk_paths import election_path
from walkit.metadata._bk_records import BookieNote
from walkit.recovery import AutoRecovery, AutoRecoveryConfig

pytestmark = [pytest.mark.bookkeeper, pytest.mark.timeout(300)]

GHOST = "127.0.0.1:3999"  # a bookie nobody runs: the missing replica of walkit's marks
OWNER = "walkit-auditor-1"  # a valid BookKeeper bookie id: BookieShell whoisauditor parses it


def _until(what: str, check: Callable[[], bool], timeout: float = 60.0, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen in {timeout:.0f} s: {what}\n{log.read_text()[-3000:] if log else ''}")
        time.sleep(0.2)


@pytest.fixture
def walkit_side(java_cluster: JavaCluster) -> Iterator[tuple[Cluster, UnderReplication]]:
    with connect(java_cluster.metadata_uri) as cluster:
        assert cluster.info.format == "bookkeeper"
        yield cluster, UnderReplication(cluster.store, cluster.info)


def _status(java_cluster: JavaCluster) -> str:
    """``autorecovery`` without options: BookieShell's report of the switch."""
    line = next(x for x in java_cluster.shell("autorecovery").splitlines() if "Autorecovery status" in x)
    return "disabled" if re.search(r"\bdisabled\b", line) else "enabled" if re.search(r"\benabled\b", line) else line


def test_bookieshell_reads_walkits_marks_locks_switch_and_auditor(
        java_cluster: JavaCluster, walkit_side: tuple[Cluster, UnderReplication]) -> None:
    _, ur = walkit_side
    ledger, far = 123456, (3 << 40) | 77
    ur.mark(ledger, [GHOST])
    ur.mark(far, ["127.0.0.1:3998", GHOST])
    assert ur.lock(ledger, "walkit-worker-1")
    try:
        out = java_cluster.shell("listunderreplicated", "-printmissingreplica", "-printreplicationworkerid")
        assert re.search(rf"\b{ledger}\b", out) and re.search(rf"\b{far}\b", out), out[-3000:]
        assert GHOST in out and "127.0.0.1:3998" in out and "walkit-worker-1" in out, out[-3000:]
        out = java_cluster.shell("listunderreplicated", "-missingreplica", "127.0.0.1:3998")
        assert re.search(rf"\b{far}\b", out) and not re.search(rf"\b{ledger}\b", out), out[-3000:]
    finally:
        ur.unlock(ledger)
        ur.drop(ledger)
        ur.drop(far)
    assert "count=0" in java_cluster.shell("listunderreplicated", "-c").replace(" ", ""), "walkit's drop is seen"

    java_cluster.shell("autorecovery", "-d")
    assert ur.disabled()
    ur.set_disabled(False)
    assert _status(java_cluster) == "enabled"
    ur.set_disabled(True)
    assert _status(java_cluster) == "disabled"
    java_cluster.shell("autorecovery", "-e")
    assert not ur.disabled()

    assert ur.take_seat(OWNER)
    try:
        out = java_cluster.shell("whoisauditor")
        assert OWNER in out, out[-3000:]
    finally:
        ur.leave_seat()
    assert ur.auditor() is None

    cluster, _ = walkit_side
    delay = f"{java_cluster.root}/underreplication/lostBookieRecoveryDelay"
    assert ur.lost_bookie_recovery_delay(7.0) == 7.0  # the first auditor's configured value, made the cluster's
    try:
        assert _shell_delay(java_cluster) == 7
        java_cluster.shell("lostbookierecoverydelay", "-set", "9")
        assert ur.lost_bookie_recovery_delay(7.0) == 9.0, "BookieShell's value reaches walkit's auditor"
    finally:
        cluster.store.delete(delay)  # the next test's Java auditor starts from its own configuration


def _shell_delay(java_cluster: JavaCluster) -> int:
    out = java_cluster.shell("lostbookierecoverydelay", "-get")
    line = next((x for x in out.splitlines() if "LostBookieRecoveryDelay value" in x), "")
    found = re.search(r"delay\W{0,3}(\d+)", line)
    assert found, out[-3000:]
    return int(found.group(1))


def _auto_recovery_main(java_cluster: JavaCluster, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(["java", *JVM_FLAGS, "-cp", java_cluster.classpath,
                                 "org.apache.bookkeeper.replication.AutoRecoveryMain", "--conf",
                                 str(java_cluster.bookies[0].conf)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_one_auditor_between_java_and_walkit(java_cluster: JavaCluster,
                                             walkit_side: tuple[Cluster, UnderReplication]) -> None:
    cluster, ur = walkit_side
    first, second, last = java_cluster.bookies
    peer = java_cluster.peer()
    try:
        ledger = peer.create(ensemble=3, write_quorum=3, ack_quorum=2)
        peer.add(ledger, [b"one", b"two"], pipelined=False)
        peer.close_ledger(ledger)
    finally:
        peer.close()
    election = election_path(java_cluster.root)
    log = java_cluster.directory / "autorecovery-election.log"
    java = _auto_recovery_main(java_cluster, log)
    daemon = AutoRecovery(java_cluster.metadata_uri, OWNER, AutoRecoveryConfig(lost_bookie_recovery_delay=0.0),
                          session_timeout=4.0)
    try:
        _until("the Java auditor elected", lambda: ur.auditor() == first.bookie_id, log=log)
        daemon.start()
        _until("walkit's vote in line", lambda: len(cluster.store.children(election)) == 2, log=log)
        time.sleep(3.0)  # a few of the daemon's ticks: it must not audit
        assert ur.auditor() == first.bookie_id and daemon.audits == 0
        assert cluster.store.get(election)[0] == BookieNote(first.bookie_id).encode()

        last.stop()  # the Java auditor marks the ledger; walkit reads BookKeeper's mark
        _until("the Java auditor's mark", lambda: (m := ur.read(ledger)) is not None and last.bookie_id in m.bookies,
               log=log)
        assert ledger in ur.ledgers()

        _stop(java)  # its vote goes: walkit's daemon is next in line
        _until("walkit's auditor elected", lambda: ur.auditor() == OWNER and daemon.audits >= 1, timeout=30.0)
        assert cluster.store.get(election)[0] == BookieNote(OWNER).encode()
        assert "I'm starting as Auditor" in log.read_text(), "the Java auditor did act while elected"

        second.stop()  # walkit's auditor adds it to BookKeeper's mark
        _until("walkit's auditor's mark", lambda: (m := ur.read(ledger)) is not None and second.bookie_id in m.bookies)
        out = java_cluster.shell("listunderreplicated", "-printmissingreplica")
        assert re.search(rf"\b{ledger}\b", out) and second.bookie_id in out and last.bookie_id in out, out[-3000:]
        assert daemon.error is None
    finally:
        _stop(java)
        daemon.stop()
        for bookie in (second, last):
            if not bookie.running:
                bookie.start()


def test_a_java_replication_worker_repairs_what_walkit_marked(
        java_cluster: JavaCluster, walkit_side: tuple[Cluster, UnderReplication]) -> None:
    """walkit holds the auditor's seat and marks a Java ledger whose bookie stopped; the Java
    replication worker of ``AutoRecoveryMain`` (not the auditor: walkit's vote is first) takes
    walkit's mark under BookKeeper's lock, re-replicates and deletes it."""
    cluster, ur = walkit_side
    peer = java_cluster.peer()
    try:
        ledger = peer.create(ensemble=2, write_quorum=2, ack_quorum=2)
        peer.add(ledger, [b"one", b"two", b"three"], pipelined=False)
        peer.close_ledger(ledger)
    finally:
        peer.close()
    ensemble = cluster.ledgers.read(ledger)[0].ensembles[0][1]
    victim = next(b for b in java_cluster.bookies if b.bookie_id == ensemble[-1])
    log = java_cluster.directory / "autorecovery-worker.log"
    assert ur.take_seat(OWNER)
    java = None
    try:
        victim.stop()
        ur.mark(ledger, [victim.bookie_id])  # what walkit's auditor does for a lost bookie
        java = _auto_recovery_main(java_cluster, log)
        _until("the Java worker repaired walkit's mark", lambda: not ur.is_marked(ledger), timeout=90.0, log=log)
        assert ur.auditor() == OWNER and "I'm starting as Auditor" not in log.read_text()
        meta = cluster.ledgers.read(ledger)[0]
        assert victim.bookie_id not in meta.ensembles[-1][1] and ensemble[0] in meta.ensembles[-1][1]
        assert ledger not in ur.ledgers()
    finally:
        if java is not None:
            _stop(java)
        ur.leave_seat()
        if not victim.running:
            victim.start()
