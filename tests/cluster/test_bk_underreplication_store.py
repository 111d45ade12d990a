"""Under-replication in a BookKeeper-format cluster (walkit/metadata/_bk_underreplication.py,
chosen by ``UnderReplication`` from ``ClusterInfo.format``), on both metadata drivers:
each operation writes BookKeeper 4.18's own records at BookKeeper's paths (bytes equal to
the golden files BookKeeper wrote, tests/unit/golden/bookkeeper/), reads the marks, locks and
votes BookKeeper writes, and a walkit-format cluster keeps its own tree untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.metadata import Driver, driver  # noqa: F401  (fixture)
from walkit.errors import ClusterLayoutError
from walkit.metadata import ClusterInfo, UnderReplication, init_cluster
from walkit.metadata._bk_paths import election_path, ur_lock_path, ur_path
from walkit.metadata._bk_records import BookieNote, UrLayout, UrMark
from walkit.metadata._store import MetadataStore

ROOT = "/ledgers"
GOLDEN = Path(__file__).resolve().parents[1] / "unit" / "golden" / "bookkeeper"
BASE = f"{ROOT}/underreplication"
LOST, OTHER = "127.0.0.1:49567", "127.0.0.1:3182"


def _bk(driver: Driver) -> tuple[MetadataStore, ClusterInfo]:
    store = driver.make_store()
    return store, init_cluster(store, ROOT, "hierarchical", format="bookkeeper")


def _tree(store: MetadataStore, path: str) -> list[str]:
    out = [path]
    for name in store.children(path):
        out += _tree(store, f"{path}/{name}")
    return out


def test_a_mark_is_bookkeepers_record_at_bookkeepers_path(driver: Driver) -> None:
    store, info = _bk(driver)
    ur = UnderReplication(store, info)
    ur.mark(3, [LOST])
    data, _ = store.get(f"{BASE}/ledgers/0000/0000/0000/0003/urL0000000003")
    assert UrMark.decode(data).replicas == (LOST,)
    golden = (GOLDEN / "auditor" / "underreplication-mark").read_bytes()
    assert UrMark(UrMark.decode(data).replicas, UrMark.decode(golden).ctime).encode() == golden
    assert store.get(f"{BASE}/LAYOUT")[0] == (GOLDEN / "underreplication-LAYOUT").read_bytes()
    assert store.children(BASE) == ["LAYOUT", "ledgers", "locks"]
    assert not any("ID-walkit" in p for p in _tree(store, ROOT)), "nothing of it in walkit's own nodes"
    marker = ur.read(3)
    assert marker is not None and marker.bookies == {LOST} and marker.since > 1.7e9 and marker.locked_by is None
    ur.mark(3, [OTHER, LOST])  # appended, in BookKeeper's order: what was there first
    assert UrMark.decode(store.get(ur_path(ROOT, 3))[0]).replicas == (LOST, OTHER)
    before = store.get(ur_path(ROOT, 3))[1].version
    ur.mark(3, [OTHER])  # nothing new: not rewritten
    assert store.get(ur_path(ROOT, 3))[1].version == before
    big = (5 << 48) | (6 << 32) | 7
    ur.mark(big, [OTHER])
    assert store.exists(ur_path(ROOT, big)) is not None
    assert ur.ledgers() == [3, big] and ur.is_marked(big) and not ur.is_marked(4)


def test_bookkeepers_own_mark_and_lock_are_read(driver: Driver) -> None:
    store, info = _bk(driver)
    ur = UnderReplication(store, info)
    store.create(ur_path(ROOT, 3), (GOLDEN / "auditor" / "underreplication-mark").read_bytes(), make_parents=True)
    store.create(ur_lock_path(ROOT, 3), (GOLDEN / "auditor" / "underreplication-lock").read_bytes(), make_parents=True)
    store.create(f"{BASE}/ledgers/0000/0000/0000/0003/not-a-mark")
    marker = ur.read(3)
    assert marker is not None
    assert (marker.bookies, marker.since, marker.locked_by) == ({LOST}, 1796524414.9, "localhost")
    assert ur.ledgers() == [3]
    assert not ur.lock(3, "walkit-1"), "BookKeeper's worker holds it"


def test_lock_complete_and_the_hierarchy_pruned(driver: Driver) -> None:
    store, info = _bk(driver)
    other = driver.make_store()
    mine, theirs = UnderReplication(store, info), UnderReplication(other, info)
    mine.mark(3, [LOST])
    mine.mark(2, [LOST])
    assert not mine.lock(9, "w1"), "no mark, no lock"
    assert store.exists(ur_lock_path(ROOT, 9)) is None
    assert mine.lock(3, "w1") and mine.lock(3, "w1"), "taken, and still ours"
    assert not theirs.lock(3, "w2")
    lock, stat = store.get(ur_lock_path(ROOT, 3))
    assert lock == BookieNote("w1").encode() == b'bookieId: "w1"\n' and stat.ephemeral_owner == store.session_id
    theirs.unlock(3)
    assert store.exists(ur_lock_path(ROOT, 3)) is not None, "another worker's lock is left alone"
    marker = mine.read(3)
    assert marker is not None and marker.locked_by == "w1"
    theirs.mark(3, [OTHER])  # the auditor adds a bookie meanwhile: kept for another round
    assert not mine.complete(marker)
    assert mine.is_marked(3) and store.exists(ur_lock_path(ROOT, 3)) is None
    assert mine.lock(3, "w1")
    marker = mine.read(3)
    assert marker is not None and mine.complete(marker)
    assert store.exists(ur_lock_path(ROOT, 3)) is None and not mine.is_marked(3)
    assert store.children(f"{BASE}/ledgers/0000/0000/0000") == ["0002"], "3's directory pruned, 2's kept"
    assert theirs.lock(2, "w2")
    theirs.drop(2)
    assert store.children(f"{BASE}/ledgers") == [] and store.children(f"{BASE}/locks") == []
    assert mine.ledgers() == []


def test_a_dead_workers_lock_goes_with_its_session(driver: Driver) -> None:
    store, info = _bk(driver)
    doomed = driver.make_store()
    UnderReplication(store, info).mark(5, [LOST])
    assert UnderReplication(doomed, info).lock(5, "doomed")
    assert not UnderReplication(store, info).lock(5, "w1")
    doomed.expire_session()
    assert UnderReplication(store, info).lock(5, "w1")


def test_the_switch_is_bookkeepers_disable_node(driver: Driver) -> None:
    store, info = _bk(driver)
    ur = UnderReplication(store, info)
    assert not ur.disabled()
    ur.set_disabled(True)
    ur.set_disabled(True)
    assert store.get(f"{BASE}/disable")[0] == b"" and ur.disabled()
    ur.set_disabled(False)
    assert store.exists(f"{BASE}/disable") is None and not ur.disabled()
    store.create(f"{BASE}/disable", b"")  # as BookieShell's toggle writes it
    assert ur.disabled()


def test_the_auditors_delay_is_the_clusters(driver: Driver) -> None:
    store, info = _bk(driver)
    ur = UnderReplication(store, info)
    assert ur.lost_bookie_recovery_delay(30.5) == 30.0, "made from the first auditor's configuration, whole seconds"
    assert store.get(f"{BASE}/lostBookieRecoveryDelay")[0] == b"30"
    assert ur.lost_bookie_recovery_delay(5.0) == 30.0, "then the cluster's"
    store.set(f"{BASE}/lostBookieRecoveryDelay", b"0")  # as BookieShell lostbookierecoverydelay -set writes it
    assert ur.lost_bookie_recovery_delay(5.0) == 0.0
    store.set(f"{BASE}/lostBookieRecoveryDelay", b"soon")
    assert ur.lost_bookie_recovery_delay(5.0) == 5.0, "unreadable: the configured value"


def test_the_election_is_bookkeepers(driver: Driver) -> None:
    store, info = _bk(driver)
    java, later = driver.make_store(), driver.make_store()
    election = election_path(ROOT)
    assert UnderReplication(store, info).auditor() is None
    # A Java candidate voted first: its vote is the lowest, walkit's waits in line.
    store.create(election, make_parents=True)
    java_vote = java.create(f"{election}/V_", (GOLDEN / "auditor" / "auditor-vote").read_bytes(), ephemeral=True,
                            sequential=True)
    ours, theirs = UnderReplication(store, info), UnderReplication(later, info)
    assert not ours.take_seat("walkit-a") and not ours.take_seat("walkit-a")
    assert not theirs.take_seat("walkit-b")
    votes = store.children(election)
    assert len(votes) == 3 and votes[0] == java_vote.rsplit("/", 1)[1]
    assert store.get(f"{election}/{votes[1]}")[0] == b'bookieId: "walkit-a"\n', "one vote per session, kept"
    assert ours.auditor() == "127.0.0.1:59023"
    java.expire_session()  # the Java auditor dies: the next in line is elected
    assert ours.take_seat("walkit-a") and not theirs.take_seat("walkit-b")
    assert store.get(election)[0] == BookieNote("walkit-a").encode(), "the elected one writes itself there"
    assert theirs.auditor() == "walkit-a"
    UnderReplication(store, info).leave_seat()
    assert theirs.take_seat("walkit-b") and ours.auditor() == "walkit-b"
    assert len(store.children(election)) == 1


def test_a_foreign_under_replication_layout_is_refused(driver: Driver) -> None:
    store, info = _bk(driver)
    store.create(f"{BASE}/LAYOUT", UrLayout("FANCY", 2).encode(), make_parents=True)
    with pytest.raises(ClusterLayoutError, match="LAYOUT"):
        UnderReplication(store, info).mark(1, [LOST])


def test_a_walkit_cluster_keeps_its_own_markers(driver: Driver) -> None:
    store = driver.make_store()
    info = init_cluster(store, ROOT, "hierarchical")
    ur = UnderReplication(store, info)
    ur.mark(3, [LOST])
    assert ur.lock(3, "w1") and ur.take_seat("w1")
    ur.set_disabled(True)
    base = f"{ROOT}/underreplication"
    assert sorted(store.children(base)) == ["auditor", "disable", "ledgers"]
    data = store.get(f"{base}/ledgers/L{3:019d}")[0]
    assert json.loads(data)["bookies"] == [LOST] and store.get(f"{base}/ledgers/L{3:019d}/lock")[0] == b"w1"
    assert store.get(f"{base}/auditor")[0] == b"w1"
    assert ur.lost_bookie_recovery_delay(2.5) == 2.5 and store.exists(f"{base}/lostBookieRecoveryDelay") is None


def test_walkit_autorecovery_cli_on_bookkeepers_tree(driver: Driver, capsys: pytest.CaptureFixture[str]) -> None:
    """``walkit autorecovery`` inspects and switches a BookKeeper-format cluster's tree: the
    mark and lock a Java worker wrote, the Java auditor's vote, the disable node."""
    from support.metadata import cluster_uri
    from walkit.cli import main

    store, _ = _bk(driver)
    store.create(ur_path(ROOT, 3), (GOLDEN / "auditor" / "underreplication-mark").read_bytes(), make_parents=True)
    store.create(ur_lock_path(ROOT, 3), (GOLDEN / "auditor" / "underreplication-lock").read_bytes(), make_parents=True)
    store.create(election_path(ROOT), (GOLDEN / "auditor" / "auditorelection").read_bytes(), make_parents=True)
    store.create(f"{election_path(ROOT)}/V_", (GOLDEN / "auditor" / "auditor-vote").read_bytes(), ephemeral=True,
                 sequential=True)
    uri = cluster_uri(driver)
    assert main(["autorecovery", "list-underreplicated", "--metadata", uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"ledger": 3, "bookies": [LOST], "since": "2026-12-06T02:33:34+00:00", "locked_by": "localhost"}]
    assert main(["autorecovery", "disable", "--metadata", uri]) == 0
    assert store.exists(f"{BASE}/disable") is not None
    capsys.readouterr()
    assert main(["autorecovery", "status", "--metadata", uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"enabled": False, "auditor": "127.0.0.1:59023", "underreplicated": 1,
                                                   "being_repaired": 1}
