"""Contract tests for every MetadataStore driver (fixtures: ``support.metadata``)."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from support.metadata import SESSION_TIMEOUT, Driver, ExpirableStore, StoreSpec, driver, open_store, ready_child, store, wait_for
from walkit.errors import (
    ClusterLayoutError,
    InvalidArgumentError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from walkit.metadata._cluster import CLUSTER_DIRS, init_cluster, read_cluster
from walkit.metadata._local import LocalMetadataStore
from walkit.metadata._store import Check, Create, Delete, MetadataStore, SessionState, SetData, Stat

__all__ = ["driver", "store"]  # fixtures used by name


# -- basic semantics -------------------------------------------------------------------


def test_root_exists_and_create_get_set_delete(store: ExpirableStore) -> None:
    assert store.exists("/") is not None
    assert store.create("/a", b"one") == "/a"
    data, stat = store.get("/a")
    assert (data, stat.version, stat.num_children, stat.ephemeral_owner) == (b"one", 0, 0, 0)
    assert store.set("/a", b"two").version == 1
    assert store.get("/a")[0] == b"two"
    store.create("/a/b")
    assert store.exists("/a") == store.get("/a")[1]
    assert store.get("/a")[1].num_children == 1
    assert store.get("/a")[1].cversion == 1
    store.delete("/a/b")
    store.delete("/a")
    assert store.exists("/a") is None


def test_children_sorted(store: ExpirableStore) -> None:
    store.create("/p")
    for name in ["c", "a", "b"]:
        store.create(f"/p/{name}")
    store.create("/p/a/deep")
    assert store.children("/p") == ["a", "b", "c"]
    assert store.children("/p/b") == []
    assert "p" in store.children("/")


def test_errors(store: ExpirableStore) -> None:
    store.create("/a")
    store.create("/a/b")
    with pytest.raises(NodeExistsError):
        store.create("/a")
    with pytest.raises(NodeExistsError):
        store.create("/")
    with pytest.raises(NoNodeError):
        store.create("/missing/child")
    for call in (lambda: store.get("/nope"), lambda: store.set("/nope", b""), lambda: store.delete("/nope"),
                 lambda: store.children("/nope")):
        with pytest.raises(NoNodeError) as info:
            call()
        assert info.value.context["path"] == "/nope"
    with pytest.raises(NotEmptyError):
        store.delete("/a")
    with pytest.raises(InvalidArgumentError):
        store.set("/a", "text")  # type: ignore[arg-type]
    for bad in ["a", "/a/", "//a", "/a/../b", ""]:
        with pytest.raises(InvalidArgumentError):
            store.create(bad)


def test_recursive_delete(store: ExpirableStore) -> None:
    store.create("/r/x/y", make_parents=True)
    store.create("/r/z")
    store.create("/rr")  # shares the prefix, must survive
    store.delete("/r", recursive=True)
    assert store.exists("/r") is None and store.exists("/r/x/y") is None
    assert store.exists("/rr") is not None


def test_make_parents(store: ExpirableStore) -> None:
    assert store.create("/m/n/o", b"leaf", make_parents=True) == "/m/n/o"
    assert store.get("/m")[0] == b"" and store.get("/m/n/o")[0] == b"leaf"
    store.create("/m/n/p", make_parents=True)  # existing parents are fine
    assert store.children("/m/n") == ["o", "p"]


def test_version_cas(store: ExpirableStore) -> None:
    store.create("/v", b"0")
    assert store.set("/v", b"1", version=0).version == 1
    with pytest.raises(MetadataVersionError) as info:
        store.set("/v", b"x", version=0)
    assert info.value.context["expected"] == 0 and info.value.context["actual"] == 1
    with pytest.raises(MetadataVersionError):
        store.delete("/v", version=5)
    assert store.get("/v")[0] == b"1"
    store.delete("/v", version=1)
    assert store.exists("/v") is None


def test_sequential_unique_increasing(store: ExpirableStore) -> None:
    store.create("/q")
    names = [store.create("/q/item-", sequential=True) for _ in range(20)]
    assert names == sorted(names) and len(set(names)) == 20
    assert all(len(n) == len("/q/item-") + 10 for n in names)
    store.delete(names[-1])
    later = store.create("/q/item-", sequential=True)
    assert later > names[-1]


# -- sessions and ephemeral nodes ---------------------------------------------------


def test_ephemeral_vanishes_on_close(driver: Driver) -> None:
    owner, observer = driver.make_store(), driver.make_store()
    owner.create("/eph", b"x", ephemeral=True)
    assert observer.get("/eph")[1].ephemeral_owner == owner.session_id != 0
    owner.close()
    assert observer.exists("/eph") is None


def test_ephemeral_vanishes_on_session_expiry(driver: Driver) -> None:
    owner, observer = driver.make_store(), driver.make_store()
    states: list[SessionState] = []
    owner.add_session_listener(states.append)
    old_session = owner.session_id
    owner.create("/eph", ephemeral=True)
    owner.create("/keep")
    owner.expire_session()
    wait_for(lambda: observer.exists("/eph") is None)
    # A driver may report SUSPENDED (connection lost) first; the contract is LOST, then CONNECTED.
    wait_for(lambda: [s for s in states if s is not SessionState.SUSPENDED] == [SessionState.LOST, SessionState.CONNECTED])
    assert owner.session_id != old_session and observer.exists("/keep") is not None
    owner.create("/eph", ephemeral=True)  # the new session works
    assert observer.get("/eph")[1].ephemeral_owner == owner.session_id


def test_ephemeral_nodes_cannot_have_children(store: ExpirableStore) -> None:
    store.create("/e", ephemeral=True)
    with pytest.raises(InvalidArgumentError):
        store.create("/e/child")


# -- transactions ----------------------------------------------------------------------


def test_transaction_applies_all(store: ExpirableStore) -> None:
    store.create("/t", b"0")
    results = store.transaction([Create("/t/a", b"a"), SetData("/t", b"1", version=0), Check("/t", 1),
                                 Create("/t/s-", sequential=True), Delete("/t/a")])
    assert results[0] == "/t/a" and isinstance(results[1], Stat) and results[1].version == 1
    assert results[2] is None and results[3] == "/t/s-0000000001" and results[4] is None
    assert store.children("/t") == ["s-0000000001"]


def test_transaction_is_atomic(store: ExpirableStore) -> None:
    store.create("/t", b"0")
    with pytest.raises(MetadataVersionError) as info:
        store.transaction([Create("/t/new"), Check("/t", 7), SetData("/t", b"x")])
    assert info.value.context["op_index"] == 1
    assert store.exists("/t/new") is None and store.get("/t") == (b"0", store.get("/t")[1])
    assert store.get("/t")[1].version == 0
    with pytest.raises(NoNodeError) as info2:
        store.transaction([SetData("/t", b"y"), Delete("/t/none")])
    assert info2.value.context["op_index"] == 1 and store.get("/t")[0] == b"0"


# -- watches ---------------------------------------------------------------------------


def test_watch_data(driver: Driver) -> None:
    watcher, writer = driver.make_store(), driver.make_store()
    seen: list[bytes | None] = []
    watch = watcher.watch_data("/w", lambda data, stat: seen.append(data))
    assert seen == [None]
    writer.create("/w", b"1")
    wait_for(lambda: seen[-1:] == [b"1"])
    writer.set("/w", b"2")
    wait_for(lambda: seen[-1:] == [b"2"])
    writer.delete("/w")
    wait_for(lambda: seen[-1:] == [None])
    watch.cancel()
    writer.create("/w", b"3")
    time.sleep(0.2)
    assert seen[-1] is None


def test_a_change_right_after_a_watch_first_read_is_reported(driver: Driver) -> None:
    """The node changes between the watch's first read and the end of its first report
    (here: by that report), while the store's watcher threads run on: the change is
    reported next, not lost until some later change."""
    watcher, writer = driver.make_store(), driver.make_store()
    writer.create("/r", b"0")
    seen: list[bytes | None] = []

    def changed(data: bytes | None, stat: Stat | None) -> None:
        seen.append(data)
        if len(seen) == 1:
            writer.set("/r", b"1")
            time.sleep(0.3)  # a local store's poller (every 50 ms) sees the change meanwhile

    watcher.watch_data("/r", changed)
    wait_for(lambda: seen[-1:] == [b"1"])
    assert seen == [b"0", b"1"]


def test_watch_children(driver: Driver) -> None:
    watcher, writer = driver.make_store(), driver.make_store()
    writer.create("/c")
    seen: list[list[str] | None] = []
    watcher.watch_children("/c", seen.append)
    assert seen == [[]]
    writer.create("/c/x")
    wait_for(lambda: seen[-1:] == [["x"]])
    writer.set("/c/x", b"data changes do not count")
    writer.create("/c/y")
    wait_for(lambda: seen[-1:] == [["x", "y"]])
    assert [] not in seen[1:] and ["x"] in seen
    writer.delete("/c", recursive=True)
    wait_for(lambda: seen[-1:] == [None])


# -- concurrency -----------------------------------------------------------------------


def cas_increment(store: MetadataStore, path: str) -> None:
    while True:
        data, stat = store.get(path)
        try:
            store.set(path, str(int(data) + 1).encode(), version=stat.version)
            return
        except MetadataVersionError:
            continue


def test_concurrent_threads_cas_counter(driver: Driver) -> None:
    stores = [driver.make_store() for _ in range(2)]
    stores[0].create("/counter", b"0")

    def work(store: MetadataStore) -> None:
        for _ in range(40):
            cas_increment(store, "/counter")

    threads = [threading.Thread(target=work, args=(stores[i % 2],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stores[0].get("/counter")[0] == b"320"


def seq_worker(spec: StoreSpec, count: int, out: Any, gate: Any) -> None:
    store = open_store(spec)
    try:
        gate.wait(timeout=60)  # start together so the writers really contend
        out.put([store.create("/seq/n-", sequential=True) for _ in range(count)])
        for _ in range(count // 5):
            cas_increment(store, "/counter")
    finally:
        store.close()


def ephemeral_worker(spec: StoreSpec, out: Any) -> None:
    store = open_store(spec)
    store.create("/killed", ephemeral=True)
    out.put("ready")
    time.sleep(60)


def test_multiprocess_sequential_and_cas(driver: Driver) -> None:
    store = driver.make_store()
    store.create("/seq")
    store.create("/counter", b"0")
    ctx = multiprocessing.get_context("spawn")
    out, gate = ctx.Queue(), ctx.Barrier(4)
    procs = [ctx.Process(target=seq_worker, args=(driver.spec, 250, out, gate)) for _ in range(4)]
    for proc in procs:
        proc.start()
    names = [name for _ in procs for name in out.get(timeout=60)]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert len(names) == 1000 and len(set(names)) == 1000
    assert sorted(store.children("/seq")) == sorted(n.rsplit("/", 1)[1] for n in names)
    assert store.get("/counter")[0] == b"200"


def test_killed_process_ephemeral_node_expires(driver: Driver) -> None:
    observer = driver.make_store()
    with ready_child(ephemeral_worker, driver.spec) as kill:
        assert observer.exists("/killed") is not None
        kill()
        killed_at = time.monotonic()
        wait_for(lambda: observer.exists("/killed") is None, timeout=SESSION_TIMEOUT * 4)
        assert time.monotonic() - killed_at < SESSION_TIMEOUT * 3


# -- local driver only -------------------------------------------------------------------


def test_local_lapsed_lease_reconnects_with_new_session(tmp_path: Path) -> None:
    """A process paused past its lease finds its session gone: LOST, then CONNECTED."""
    store = LocalMetadataStore(str(tmp_path), session_timeout=0.3, poll_interval=0.02, create=True)
    try:
        states: list[SessionState] = []
        store.add_session_listener(states.append)
        old_session = store.session_id
        store.create("/eph", ephemeral=True)
        with sqlite3.connect(tmp_path / "metadata.sqlite") as conn:  # what a long pause looks like
            conn.execute("UPDATE sessions SET expires_at = 0 WHERE id = ?", (old_session,))
        wait_for(lambda: states == [SessionState.LOST, SessionState.CONNECTED])
        assert store.exists("/eph") is None and store.session_id != old_session
        time.sleep(0.5)  # the new session is renewed past its first lease
        store.create("/eph", ephemeral=True)
        assert store.get("/eph")[1].ephemeral_owner == store.session_id
    finally:
        store.close()


# -- on top of the store: the cluster layout (same tests on every driver) --------------------


def test_init_cluster_is_idempotent_and_complete(store: ExpirableStore) -> None:
    info = init_cluster(store, "/ledgers")
    assert str(uuid.UUID(info.instance_id)) == info.instance_id and info.layout == "hierarchical"
    assert init_cluster(store, "/ledgers") == info, "a second init must change nothing"
    assert read_cluster(store, "/ledgers") == info
    for d in CLUSTER_DIRS:
        assert store.exists(f"/ledgers/{d}") is not None, d


def test_concurrent_inits_agree_on_one_cluster(driver: Driver) -> None:
    stores = [driver.make_store() for _ in range(4)]
    results: list[object] = []
    barrier = threading.Barrier(len(stores))

    def run(s: ExpirableStore) -> None:
        barrier.wait()
        results.append(init_cluster(s, "/deep/root"))

    threads = [threading.Thread(target=run, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and len({r.instance_id for r in results}) == 1, results  # type: ignore[attr-defined]


def test_cluster_errors_are_clear(store: ExpirableStore) -> None:
    with pytest.raises(ClusterLayoutError, match="walkit init"):
        read_cluster(store, "/ledgers")
    init_cluster(store, "/ledgers", "flat")
    with pytest.raises(ClusterLayoutError) as info:
        init_cluster(store, "/ledgers", "hierarchical")
    assert info.value.context["existing"] == "flat"
    store.set("/ledgers/LAYOUT", b"bookkeeper layout 2\n")
    with pytest.raises(ClusterLayoutError, match="cannot use"):
        read_cluster(store, "/ledgers")
    store.set("/ledgers/LAYOUT", b"walkit-layout 1\nledgers flat\n")
    store.set("/ledgers/INSTANCEID", b"not-a-uuid")
    with pytest.raises(ClusterLayoutError, match="UUID"):
        read_cluster(store, "/ledgers")
