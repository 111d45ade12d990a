"""Metadata outages (issue 18): every ZooKeeper server down for seconds, or the local://
SQLite file locked by a stuck process.

What must hold (docs/architecture.md, "Metadata"):

- every metadata call ends: with MetadataUnavailableError after the store's retry
  deadline (ZooKeeper) or busy timeout (local://), never by waiting for the outage;
- adds to ledgers already open go on and are acknowledged (bookies need no metadata);
- what needs metadata (ledger creation, ensemble change, WAL snapshot and open, a
  bookie's deregistration) waits out an outage shorter than the deadline and works
  again after a longer one;
- no acknowledged record is lost, and a writer replaced after the outage (its session
  expired meanwhile) gets no acknowledgement any more: the new writer fenced it;
- bookies stay registered, or register again after their sessions expired, and a
  graceful stop during the outage ends in bounded time.

The ZooKeeper tests stop all three nodes of a real ensemble (Debian's package, on
127.0.0.1). CI outages last about 6 s; ``WALKIT_SLOW=1`` (or ``-m slow``) adds a 20 s one
and one past the 30 s retry deadline.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import walkit
import walkit.metadata
import walkit.recovery._autorecovery
from support.gc import DiskView, admin, delete_ledgers, make_ledgers
from support.metadata import StuckLocker
from walkit import LSN, WriteAheadLog
from walkit.errors import InvalidArgumentError, MetadataUnavailableError, WriterFencedError
from walkit.metadata import Cluster, connect, open_metadata_store
from walkit.metadata._local import LocalMetadataStore
from walkit.metadata._store import SessionState, SetData
from walkit.metadata._zk import ZooKeeperStore
from support.zk import ZooKeeperEnsemble

pytestmark = pytest.mark.timeout(300)

RETRY_DEADLINE = 30.0  # ZooKeeperStore's default: what clients and bookies use
SHORT_DEADLINE = 1.5  # a store of the tests' own that gives up quickly
SLACK = 3.0  # a busy machine's lateness on top of a deadline
OUTAGE = 6.0  # seconds every ZooKeeper node stays down in CI
SESSION = 10.0  # the server's cap (20 ticks of 500 ms): sessions outlive a CI outage
CLIENT: dict[str, Any] = {"add_timeout": 3.0, "read_timeout": 5.0, "connect_timeout": 5.0,
                          "session_timeout": SESSION}


def slow_selected(config: pytest.Config) -> bool:
    """The long forms run with WALKIT_SLOW=1 or ``-m slow`` (as tests/cluster/test_gc_cluster.py)."""
    expr = str(config.getoption("markexpr") or "")
    return bool(os.environ.get("WALKIT_SLOW")) or ("slow" in expr and "not slow" not in expr)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


class Background:
    """``fn()`` on a thread of its own: its result or error, and when it ended."""

    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        self.name = name
        self.started = time.monotonic()
        self.ended: float | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self._fn = fn
        self._thread = threading.Thread(target=self._run, name=f"outage-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.ended = time.monotonic()

    @property
    def done(self) -> bool:
        return self.ended is not None

    @property
    def elapsed(self) -> float:
        assert self.ended is not None, f"{self.name} has not ended"
        return self.ended - self.started

    def join(self, timeout: float) -> Background:
        self._thread.join(timeout)
        assert self.done, f"{self.name} still running after {timeout:.0f} s more"
        return self

    def value(self, timeout: float) -> Any:
        self.join(timeout)
        if self.error is not None:
            raise AssertionError(f"{self.name} failed: {self.error!r}") from self.error
        return self.result


# -- ZooKeeper -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ensemble_module() -> Iterator[ZooKeeperEnsemble]:
    zk = ZooKeeperEnsemble()
    try:
        yield zk
    finally:
        zk.stop()


@pytest.fixture
def zk(ensemble_module: ZooKeeperEnsemble) -> ZooKeeperEnsemble:
    """This module's own 3-node ensemble, every node serving (a failed test may have
    left it down)."""
    ensemble_module.restore()
    return ensemble_module


def all_down(zk: ZooKeeperEnsemble) -> float:
    """SIGKILL every node; when it happened."""
    for i in range(zk.SIZE):
        zk.kill(i)
    return time.monotonic()


def cluster_root(hosts: str) -> str:
    """A cluster root of its own on the ensemble."""
    root = f"/outage-{uuid.uuid4().hex[:12]}"
    store = ZooKeeperStore(hosts)
    try:
        store.create(root)
    finally:
        store.close()
    return root


def test_every_zookeeper_call_ends_within_its_retry_deadline(zk: ZooKeeperEnsemble) -> None:
    """All nodes down: each kind of call of a store with a short retry deadline fails
    with MetadataUnavailableError within it (all at once, so none waits for another);
    a store with the default deadline waits the outage out; closing a store is quick;
    back, the store answers and a watch set before the outage sees a change made after."""
    root = cluster_root(zk.hosts)
    short = ZooKeeperStore(zk.hosts, session_timeout=SESSION, retry_deadline=SHORT_DEADLINE)
    patient = ZooKeeperStore(zk.hosts, session_timeout=SESSION)
    doomed = ZooKeeperStore(zk.hosts, session_timeout=SESSION)
    try:
        patient.create(f"{root}/a", b"before")
        patient.create(f"{root}/tree/b/c", make_parents=True)
        seen: list[bytes | None] = []
        patient.watch_data(f"{root}/a", lambda data, stat: seen.append(data))
        calls: dict[str, Callable[[], Any]] = {
            "create": lambda: short.create(f"{root}/new"),
            "get": lambda: short.get(f"{root}/a"),
            "exists": lambda: short.exists(f"{root}/a"),
            "set": lambda: short.set(f"{root}/a", b"short"),
            "delete": lambda: short.delete(f"{root}/a"),
            "delete_recursive": lambda: short.delete(f"{root}/tree", recursive=True),
            "children": lambda: short.children(root),
            "sync": lambda: short.sync(root),
            "transaction": lambda: short.transaction([SetData(f"{root}/a", b"short")]),
            "watch_data": lambda: short.watch_data(f"{root}/a", lambda data, stat: None),
            "watch_children": lambda: short.watch_children(root, lambda names: None),
        }
        heard = {SessionState.SUSPENDED: threading.Event(), SessionState.CONNECTED: threading.Event(),
                 SessionState.LOST: threading.Event()}
        suspended, reconnected = heard[SessionState.SUSPENDED], heard[SessionState.CONNECTED]
        states: list[SessionState] = []

        def hear(state: SessionState) -> None:
            states.append(state)
            heard[state].set()

        short.add_session_listener(hear)
        down = all_down(zk)
        # Calls made once the client knows send nothing (a write sent just before might
        # land later, from the log of the last node standing: an unknown outcome).
        assert suspended.wait(10), "the client did not notice the outage"
        running = [Background(name, fn) for name, fn in calls.items()]
        waiting = Background("patient set", lambda: patient.set(f"{root}/a", b"after"))
        closing = Background("close", doomed.close)
        for call in running:
            call.join(SHORT_DEADLINE + 2 * SLACK)
            assert isinstance(call.error, MetadataUnavailableError), f"{call.name}: {call.error or call.result!r}"
            assert call.elapsed <= SHORT_DEADLINE + SLACK, f"{call.name} took {call.elapsed:.1f} s"
            assert call.error.context.get("retry_deadline") == SHORT_DEADLINE, call.error
        assert closing.join(15.0).error is None and closing.elapsed < 12.0, closing.elapsed
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - down)))
        assert not waiting.done, "a call with the default deadline waits for the store"
        # The nodes die one after another: the client may hop to one still standing and
        # hear CONNECTED before the last dies. Only a CONNECTED heard after the restart
        # says it is back (all nodes are down here, so nothing can connect in between).
        assert states[-1] is not SessionState.CONNECTED, states
        reconnected.clear()
        zk.restore()
        assert waiting.value(RETRY_DEADLINE).version == 1
        assert reconnected.wait(20), "the client with the short deadline did not reconnect"  # kazoo backs off up to 2 s
        assert short.get(f"{root}/a")[0] == b"after"
        assert short.exists(f"{root}/new") is None, "a call that gave up before sending anything left nothing"
        short.delete(f"{root}/tree", recursive=True)
        assert short.children(root) == ["a"]
        short.set(f"{root}/a", b"later")
        wait_until(lambda: seen[-1:] == [b"later"], 20, "the watch set before the outage to fire")
    finally:
        zk.restore()
        short.close()
        patient.close()


def test_a_watch_re_reading_through_an_outage_waits_for_zookeeper_and_lives_on(
        zk: ZooKeeperEnsemble, monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch re-reads its node in kazoo's own threads: after each change, and each time
    the connection comes back. A re-read that meets an outage longer than the store's
    retry deadline (the connection back, then gone again before the answer: seen in CI)
    waits it out: nothing is raised into kazoo's thread (where no one would catch it and
    the watch would stay dead until the next reconnect), and the watch sees the next
    change. The re-read is started here the way kazoo starts it on a reconnect, with
    every node down, so that it surely meets the outage."""
    from kazoo.client import KazooState
    from kazoo.recipe.watchers import ChildrenWatch, DataWatch

    root = cluster_root(zk.hosts)
    store = ZooKeeperStore(zk.hosts, session_timeout=SESSION, retry_deadline=SHORT_DEADLINE)
    kazoo_watches: list[Any] = []
    client = store._client
    monkeypatch.setattr(client, "DataWatch", lambda *a: kazoo_watches.append(DataWatch(client, *a))
                        or kazoo_watches[-1])
    monkeypatch.setattr(client, "ChildrenWatch", lambda *a: kazoo_watches.append(ChildrenWatch(client, *a))
                        or kazoo_watches[-1])
    escaped: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.exc_value))
    try:
        store.create(f"{root}/a", b"before")
        data: list[bytes | None] = []
        children: list[list[str] | None] = []
        store.watch_data(f"{root}/a", lambda value, stat: data.append(value))
        store.watch_children(root, children.append)
        assert data == [b"before"] and children == [["a"]] and len(kazoo_watches) == 3  # children: 2
        suspended = threading.Event()
        store.add_session_listener(lambda state: suspended.set() if state is SessionState.SUSPENDED else None)
        all_down(zk)
        assert suspended.wait(10), "the client did not notice the outage"
        for watch in kazoo_watches:
            watch._session_watcher(KazooState.CONNECTED)  # as kazoo on a reconnect: a re-read in its thread
        time.sleep(SHORT_DEADLINE + SLACK)  # past the deadline of every read a watch sets up
        assert escaped == [], f"raised into kazoo's threads: {escaped!r}"
        zk.restore()
        other = ZooKeeperStore(zk.hosts, session_timeout=SESSION)
        try:
            other.set(f"{root}/a", b"after")
            other.create(f"{root}/b")
        finally:
            other.close()
        wait_until(lambda: data[-1:] == [b"after"] and children[-1:] == [["a", "b"]], 30,
                   "both watches to see the changes made after the outage")
        assert escaped == [], f"raised into kazoo's threads: {escaped!r}"
    finally:
        zk.restore()
        store.close()


def append_many(wal: WriteAheadLog, prefix: str, count: int) -> list[tuple[LSN, bytes]]:
    records = [f"{prefix}-{i}".encode() for i in range(count)]
    futures = [wal.append_async(r) for r in records]
    return [(f.result(30), r) for f, r in zip(futures, records)]


def registered(uri: str) -> set[str]:
    with connect(uri) as cluster:
        bookies = cluster.bookies()
        return set(bookies.writable) | set(bookies.readonly)


@pytest.mark.parametrize("outage", [OUTAGE, pytest.param(20.0, marks=pytest.mark.slow)],
                         ids=lambda o: f"{o:.0f}s")
def test_writes_go_on_and_metadata_waits_through_a_zookeeper_outage(
        zk: ZooKeeperEnsemble, tmp_path: Path, outage: float, request: pytest.FixtureRequest) -> None:
    """A WAL writer appends through an outage of every ZooKeeper node (acknowledged while
    it lasts); a ledger creation, a snapshot, a bookie's graceful stop and the ensemble
    change it causes all wait and complete once ZooKeeper is back; the bookies stay
    registered; then the writer's session expires, a second writer opens the log, and
    the first is fenced with every record it had acknowledged in the log."""
    if outage > OUTAGE and not slow_selected(request.config):
        pytest.skip("long form: set WALKIT_SLOW=1 or select -m slow")
    uri = f"zk://{zk.hosts}{cluster_root(zk.hosts)}"
    with walkit.LocalCluster(tmp_path / "cluster", 4, metadata_uri=uri, session_timeout=SESSION) as c:
        bk = c.client(**CLIENT)
        other = c.client(**CLIENT)
        try:
            wal = WriteAheadLog.open(bk, "orders", ensemble_size=3, write_quorum=2, ack_quorum=2)
            acked = append_many(wal, "before", 20)
            down = all_down(zk)

            acked += append_many(wal, "during", 40)  # bookies need no metadata for adds
            assert time.monotonic() - down < outage, "the appends during the outage were not acknowledged in time"
            create = Background("create ledger", lambda: bk.create_ledger(3, 2, 2))
            snapshot = Background("snapshot", lambda: wal.snapshot(b"state", acked[-1][0]))
            victim = c.bookie_ids.index(wal._writer.ensemble[0])
            stop = Background("graceful bookie stop", lambda: c.stop_bookie(victim))
            held = [wal.append_async(f"held-{i}".encode()) for i in range(20)]  # wait for the ensemble change
            time.sleep(max(0.0, outage - (time.monotonic() - down)))
            waited = [b.name for b in (create, snapshot, stop) if not b.done]
            assert waited == ["create ledger", "snapshot", "graceful bookie stop"], \
                [(b.name, b.error) for b in (create, snapshot, stop)]

            up = time.monotonic()
            zk.restore()
            create.value(RETRY_DEADLINE).close()
            snapshot.value(RETRY_DEADLINE)
            stop.value(RETRY_DEADLINE)
            assert stop.ended is not None and stop.ended - up < SLACK + 15, "the stop ended long after ZooKeeper"
            acked += [(f.result(RETRY_DEADLINE), f"held-{i}".encode()) for i, f in enumerate(held)]
            # the held appends may all have been answered before the victim stopped reading: then the
            # writer meets the stopped bookie at its next entries (one record each: consecutive write sets)
            for i in range(30):
                if c.bookie_ids[victim] not in wal._writer.ensemble:
                    break
                acked += append_many(wal, f"probe{i}", 1)
            assert c.bookie_ids[victim] not in wal._writer.ensemble, "the writer replaced the stopped bookie"
            survivors = set(c.bookie_ids) - {c.bookie_ids[victim]}
            wait_until(lambda: registered(uri) == survivors, 20, "the running bookies registered, the stopped one not")

            acked += append_many(wal, "after", 10)
            bk.client.cluster.store.expire_session()  # the writer's session ends
            acked += append_many(wal, "expired", 10)  # nobody took over yet: still the writer
            successor = WriteAheadLog.open(other, "orders")
            with pytest.raises(WriterFencedError):
                wal.append(b"split-brain?")
            records = list(WriteAheadLog.reader(other, "orders").replay())
            assert records == acked, "every acknowledged record, in order, and nothing else"
            successor.append(b"successor")
            successor.close()
        finally:
            bk.close()
            other.close()
            zk.restore()


@pytest.mark.slow
def test_metadata_fails_cleanly_past_the_retry_deadline(zk: ZooKeeperEnsemble, tmp_path: Path,
                                                        request: pytest.FixtureRequest) -> None:
    """An outage longer than the 30 s retry deadline: a ledger creation fails with
    MetadataUnavailableError at the deadline, the writer whose ensemble must change fails
    with it, a bookie's graceful stop ends while ZooKeeper is still down; back, nothing
    acknowledged is lost and a new writer opens the log."""
    if not slow_selected(request.config):
        pytest.skip("long form: set WALKIT_SLOW=1 or select -m slow")
    outage = RETRY_DEADLINE + 12
    uri = f"zk://{zk.hosts}{cluster_root(zk.hosts)}"
    with walkit.LocalCluster(tmp_path / "cluster", 4, metadata_uri=uri, session_timeout=SESSION) as c:
        bk = c.client(**CLIENT)
        other = c.client(**CLIENT)
        try:
            wal = WriteAheadLog.open(bk, "orders", ensemble_size=3, write_quorum=2, ack_quorum=2)
            acked = append_many(wal, "before", 20)
            all_down(zk)
            create = Background("create ledger", lambda: bk.create_ledger(3, 2, 2))
            victim = c.bookie_ids.index(wal._writer.ensemble[0])
            stop = Background("graceful bookie stop", lambda: c.stop_bookie(victim))
            held = [wal.append_async(f"held-{i}".encode()) for i in range(20)]
            create.join(RETRY_DEADLINE + 2 * SLACK)
            assert isinstance(create.error, MetadataUnavailableError), create.error
            assert RETRY_DEADLINE - 1 <= create.elapsed <= RETRY_DEADLINE + SLACK
            stop.value(RETRY_DEADLINE + 2 * SLACK)
            assert stop.elapsed < outage, "the stop waited for ZooKeeper"
            unknown = []  # outcome unknown: the ensemble change could not be recorded, the writer is done
            for i, fut in enumerate(held):
                try:
                    acked.append((fut.result(RETRY_DEADLINE), f"held-{i}".encode()))
                except MetadataUnavailableError as exc:
                    unknown.append(exc)
            assert len(unknown) + sum(1 for _, r in acked if r.startswith(b"held-")) == len(held)
            with pytest.raises(MetadataUnavailableError):
                wal.append(b"after the failure")
            time.sleep(max(0.0, outage - (time.monotonic() - create.started)))
            zk.restore()
            successor = WriteAheadLog.open(other, "orders")
            records = list(WriteAheadLog.reader(other, "orders").replay())
            assert [r for r in records if r in acked] == acked, "every acknowledged record, in order"
            successor.close()
            survivors = set(c.bookie_ids) - {c.bookie_ids[victim]}
            wait_until(lambda: registered(uri) == survivors, SESSION * 3, "the running bookies registered")
        finally:
            bk.close()
            other.close()
            zk.restore()


# -- the retry deadline, configured ----------------------------------------------------------

GC_DEADLINE = 4.0  # the GC test's metadataRetryDeadlineMs (and its client's deadline), in seconds


def passes_ended(c: walkit.LocalCluster, numbers: list[int]) -> bool:
    return all(admin(c, i, "gc.status")["passes"] >= n for i, n in enumerate(numbers))


def force_passes(c: walkit.LocalCluster) -> list[int]:
    """A forced GC pass on every bookie (ADMIN gc.run: no metadata needed); their numbers."""
    return [admin(c, i, "gc.run")["pass"] for i in range(len(c.bookie_ids))]


def store_answers(c: walkit.LocalCluster, i: int) -> bool:
    """Whether in-process bookie ``i``'s own metadata session answers a call again."""
    try:
        c.server(i)._cluster.store.exists("/")
    except MetadataUnavailableError:
        return False
    return True


def test_a_gc_pass_stops_after_one_retry_deadline_while_zookeeper_is_down(zk: ZooKeeperEnsemble,
                                                                          tmp_path: Path) -> None:
    """Bookies with a short ``metadataRetryDeadlineMs`` and a client with the same
    ``metadata_retry_deadline``; every ZooKeeper node stopped: a forced GC pass (both
    steps that need the store due) ends after about one deadline - its first call that
    gives up ends them all, where each step used to wait a deadline of its own - removes
    no ledger, not even those deleted before, says why once and is counted; the client's
    ledger creation fails within its deadline. Back, the next pass removes the deleted
    ledgers and counts nothing more."""
    uri = f"zk://{zk.hosts}{cluster_root(zk.hosts)}"
    options = {"metadata_retry_deadline_ms": round(GC_DEADLINE * 1000), "flush_interval": 200}
    with walkit.LocalCluster(tmp_path / "cluster", 3, metadata_uri=uri, session_timeout=SESSION,
                             bookie_options=options) as c:
        views = [DiskView.of(c, i) for i in range(3)]
        bk = c.client(**CLIENT, metadata_retry_deadline=GC_DEADLINE)
        try:
            kept = make_ledgers(bk, 3, entries=3, threads=1)
            gone = make_ledgers(bk, 3, entries=3, threads=1)
            delete_ledgers(bk, gone, threads=1)
            wait_until(lambda: all(set(kept + gone) <= v.indexed_ledgers() for v in views), 30, "every ledger indexed")

            all_down(zk)
            numbers = force_passes(c)
            create = Background("create ledger", lambda: bk.create_ledger(3, 2, 2))
            wait_until(lambda: passes_ended(c, numbers), 2 * GC_DEADLINE + SLACK, "the forced passes")
            for i in range(3):
                status = admin(c, i, "gc.status")
                last = status["last_pass"]
                assert GC_DEADLINE - 0.5 <= last["seconds"] < 1.5 * GC_DEADLINE, last
                assert last["ledgers_removed"] == last["overreplicated_removed"] == 0, last
                assert last["metadata_unavailable"] is True and status["metadata_unavailable_passes"] == 1, status
                assert len(last["cut_short"]) == 1 and "metadata unavailable" in last["cut_short"][0], last
            assert all(set(kept + gone) <= v.indexed_ledgers() for v in views), "a ledger left a bookie"
            create.join(GC_DEADLINE + 2 * SLACK)
            assert isinstance(create.error, MetadataUnavailableError), create.error or create.result
            assert create.elapsed <= GC_DEADLINE + SLACK, create.elapsed
            assert create.error.context.get("retry_deadline") == GC_DEADLINE, create.error

            zk.restore()
            wait_until(lambda: all(store_answers(c, i) for i in range(3)), 30, "the bookies' sessions back")
            numbers = force_passes(c)
            wait_until(lambda: passes_ended(c, numbers), 30, "the passes once ZooKeeper is back")
            for i in range(3):
                status = admin(c, i, "gc.status")
                assert status["last_pass"]["ledgers_removed"] == len(gone), status["last_pass"]
                assert status["last_pass"]["metadata_unavailable"] is False
                assert status["metadata_unavailable_passes"] == 1
            assert all(not set(gone) & v.indexed_ledgers() and set(kept) <= v.indexed_ledgers() for v in views)
        finally:
            bk.close()
            zk.restore()


# -- local:// --------------------------------------------------------------------------------

def test_a_locked_local_store_fails_writes_after_its_busy_timeout(tmp_path: Path) -> None:
    """A stuck process holds the SQLite write lock: writes from four threads at once all
    fail with MetadataUnavailableError after about one busy timeout (not one after the
    other), reads and new watches go on, and once the lock is gone everything works
    and a watch set before sees the change."""
    busy = 1.0
    store = LocalMetadataStore(str(tmp_path), session_timeout=SESSION, busy_timeout=busy, create=True)
    try:
        store.create("/a", b"before")
        seen: list[bytes | None] = []
        store.watch_data("/a", lambda data, stat: seen.append(data))
        locker = StuckLocker(tmp_path / "metadata.sqlite")
        try:
            calls = [Background("set", lambda: store.set("/a", b"locked")),
                     Background("create", lambda: store.create("/b")),
                     Background("delete", lambda: store.delete("/a")),
                     Background("transaction", lambda: store.transaction([SetData("/a", b"locked")]))]
            for call in calls:
                call.join(busy + 2 * SLACK)
                assert isinstance(call.error, MetadataUnavailableError), f"{call.name}: {call.error!r}"
                assert call.elapsed <= busy + SLACK, f"{call.name} took {call.elapsed:.1f} s"
                assert "metadata.sqlite" in str(call.error.context.get("file")), call.error
            started = time.monotonic()
            assert store.get("/a")[0] == b"before" and store.children("/") == ["a"]
            store.watch_children("/", lambda names: None)
            assert time.monotonic() - started < busy, "reads waited for the lock"
        finally:
            locker.release()
        store.set("/a", b"after")
        store.create("/b")
        wait_until(lambda: seen[-1:] == [b"after"], 10, "the watch to fire")
    finally:
        store.close()


def bookie_session(c: walkit.LocalCluster, i: int) -> int:
    """The metadata session of in-process bookie ``i``."""
    return int(c.server(i)._cluster.store.session_id)


def test_local_cluster_through_a_locked_store(tmp_path: Path) -> None:
    """A LocalCluster on local:// whose metadata file a stuck process locks for longer
    than the sessions last (but less than the busy timeout): the writer's appends go on
    and are acknowledged, a ledger creation waits for the lock, the bookies' expired
    sessions are replaced and they register again, and a new writer finds every record."""
    session = 2.0
    with walkit.LocalCluster(tmp_path / "cluster", 3, session_timeout=session) as c:
        bk = c.client(**{**CLIENT, "session_timeout": session})
        other = c.client(**{**CLIENT, "session_timeout": session})
        try:
            wal = WriteAheadLog.open(bk, "orders", ensemble_size=3, write_quorum=2, ack_quorum=2)
            acked = append_many(wal, "before", 20)
            file = Path(c.metadata_uri.removeprefix("local://")) / "metadata.sqlite"
            sessions = [bookie_session(c, i) for i in range(3)]
            locker = StuckLocker(file)
            try:
                locked = time.monotonic()
                acked += append_many(wal, "during", 40)
                create = Background("create ledger", lambda: bk.create_ledger(3, 2, 2))
                time.sleep(max(0.0, 2.5 * session - (time.monotonic() - locked)))
                assert not create.done, create.error
            finally:
                locker.release()
            create.value(15).close()
            wait_until(lambda: all(bookie_session(c, i) != sessions[i] for i in range(3)), 20,
                       "the bookies' lapsed sessions replaced")
            wait_until(lambda: registered(c.metadata_uri) == set(c.bookie_ids), 20, "every bookie registered again")
            acked += append_many(wal, "after", 10)
            successor = WriteAheadLog.open(other, "orders")
            with pytest.raises(WriterFencedError):
                wal.append(b"split-brain?")
            assert list(WriteAheadLog.reader(other, "orders").replay()) == acked
            successor.close()
        finally:
            bk.close()
            other.close()


def test_the_configured_retry_deadline_reaches_every_metadata_session(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``metadataRetryDeadlineMs`` reaches a bookie's own session and its autorecovery
    daemon's; a client's ``metadata_retry_deadline`` reaches its session, where on
    local:// it is the busy timeout: a write to a store a stuck process locks fails
    after it (not after the 30 s default)."""
    seen: list[tuple[str, float | None]] = []
    real = walkit.metadata.connect

    def spy(name: str) -> Callable[..., Cluster]:
        def connect_spied(uri: str, **options: Any) -> Cluster:
            seen.append((name, options.get("retry_deadline")))
            return real(uri, **options)
        return connect_spied

    monkeypatch.setattr(walkit.metadata, "connect", spy("bookie"))  # the server imports it when it starts
    monkeypatch.setattr(walkit.recovery._autorecovery, "connect", spy("autorecovery"))
    options = {"metadata_retry_deadline_ms": 1250, "auto_recovery_daemon_enabled": True}
    with walkit.LocalCluster(tmp_path / "cluster", 1, bookie_options=options) as c:
        assert ("bookie", 1.25) in seen and ("autorecovery", 1.25) in seen, seen
        deadline = 1.0
        with c.client(metadata_retry_deadline=deadline) as bk:
            locker = StuckLocker(Path(c.metadata_uri.removeprefix("local://")) / "metadata.sqlite")
            try:
                delete = Background("delete ledger", lambda: bk.delete_ledger(12345))
                delete.join(deadline + 2 * SLACK)
            finally:
                locker.release()
            assert isinstance(delete.error, MetadataUnavailableError), delete.error
            assert delete.elapsed <= deadline + SLACK, delete.elapsed


@pytest.mark.parametrize("deadline", [0, -1.5])
def test_a_retry_deadline_that_is_not_positive_is_refused(tmp_path: Path, deadline: float) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        walkit.ClientConfig(metadata_retry_deadline=deadline)
    assert err.value.context.get("option") == "metadata_retry_deadline"
    for uri in (f"local://{tmp_path}", "zk://127.0.0.1:1/ledgers"):  # refused before any connection
        with pytest.raises(InvalidArgumentError):
            open_metadata_store(uri, retry_deadline=deadline)
