"""ZooKeeperStore on a real 3-node ZooKeeper ensemble while single nodes are SIGKILLed.

One node down at a time (2 of 3 keep the quorum). The client must keep its session and
its ephemeral nodes, writes must resume, and no acknowledged write may be lost. A write
whose reply is lost with the connection is retried by kazoo and then fails its version
check (or finds its node existing) although it was applied: such writes are counted
apart, as "applied without acknowledgement", after checking that they are ours.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from walkit.errors import MetadataVersionError, NodeExistsError
from walkit.metadata import BookieRegistration, init_cluster, list_bookies
from walkit.metadata._store import SessionState, Stat
from walkit.metadata._zk import ZooKeeperStore
from support.zk import ZooKeeperEnsemble

pytestmark = pytest.mark.timeout(180)

SESSION_TIMEOUT = 8.0  # seconds: well above a leader election (≈ 0.3–2 s), below the server's 10 s cap
DEADLINE = 20.0  # bound on every wait for progress or a state change
PROGRESS = 25  # acknowledged increments to see before and after each kill


def wait_until(condition: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    """Poll ``condition`` until true; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


class StateLog:
    """A session listener recording the states it hears (runs on kazoo's thread: no blocking)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: list[SessionState] = []

    def __call__(self, state: SessionState) -> None:
        with self._lock:
            self._states.append(state)

    @property
    def states(self) -> list[SessionState]:
        with self._lock:
            return list(self._states)

    def reconnected(self) -> bool:
        """SUSPENDED heard, and CONNECTED after it."""
        states = self.states
        return SessionState.SUSPENDED in states and SessionState.CONNECTED in states[
            states.index(SessionState.SUSPENDED):]


class Writer:
    """A background client loop: CAS increments of ``counter`` and one ephemeral create per
    round under ``parent``, as a single writer (so a version clash can only be our own
    retried write)."""

    def __init__(self, store: ZooKeeperStore, counter: str, parent: str) -> None:
        self.store = store
        self.counter = counter
        self.parent = parent
        self.acked = 0  # increments acknowledged
        self.applied_unacked = 0  # increments applied whose reply was lost
        self.created: list[str] = []  # ephemeral creates acknowledged
        self.created_unacked: list[str] = []  # ephemeral creates applied whose reply was lost
        self.ack_times: list[float] = []  # time.monotonic() of each acknowledged increment
        self.errors: list[BaseException] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zk-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(DEADLINE + 35)  # a call may be in kazoo's 30 s retry
        assert not self._thread.is_alive(), "writer thread did not stop"

    def wait_acked(self, count: int, timeout: float = DEADLINE) -> None:
        with self._cond:
            ok = self._cond.wait_for(lambda: self.acked >= count or bool(self.errors), timeout)
        assert not self.errors, f"writer failed: {self.errors!r}"
        assert ok, f"writer reached {self.acked} acknowledged increments, not {count}, in {timeout:.0f} s"

    def first_ack_after(self, t: float) -> float:
        with self._cond:
            return next(a for a in self.ack_times if a > t)

    def _run(self) -> None:
        try:
            round_no = 0
            while not self._stop.is_set():
                self._increment()
                self._create(f"{self.parent}/e{round_no:08d}")
                round_no += 1
                self._stop.wait(0.005)  # leave the two cores to the JVMs
        except BaseException as exc:  # reported by wait_acked() and the test
            with self._cond:
                self.errors.append(exc)
                self._cond.notify_all()

    def _increment(self) -> None:
        data, stat = self.store.get(self.counter)
        value = int(data)
        try:
            self.store.set(self.counter, str(value + 1).encode(), stat.version)
        except MetadataVersionError:
            data_now, stat_now = self.store.get(self.counter)
            if (int(data_now), stat_now.version) != (value + 1, stat.version + 1):
                raise  # not our own retried write: someone else wrote, or a write was lost
            self.applied_unacked += 1
            return
        with self._cond:
            self.acked += 1
            self.ack_times.append(time.monotonic())
            self._cond.notify_all()

    def _create(self, path: str) -> None:
        try:
            self.store.create(path, ephemeral=True)
        except NodeExistsError:
            stat = self.store.exists(path)
            if stat is None or stat.ephemeral_owner != self.store.session_id:
                raise
            self.created_unacked.append(path)
            return
        self.created.append(path)


@pytest.fixture
def stores(zk_ensemble: ZooKeeperEnsemble) -> Iterator[Callable[[], ZooKeeperStore]]:
    """A factory of ZooKeeperStore clients on the ensemble, closed after the test."""
    opened: list[ZooKeeperStore] = []

    def make() -> ZooKeeperStore:
        store = ZooKeeperStore(zk_ensemble.hosts, session_timeout=SESSION_TIMEOUT)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def base(stores: Callable[[], ZooKeeperStore]) -> str:
    """A fresh persistent node for this test's data."""
    path = f"/ensemble-{uuid.uuid4().hex}"
    admin = stores()
    admin.create(path)
    admin.close()
    return path


def test_writes_survive_leader_failovers(zk_ensemble: ZooKeeperEnsemble, stores: Callable[[], ZooKeeperStore],
                                         base: str) -> None:
    """Kill the leader, restart it, kill the new leader: the writer keeps its session,
    resumes after each kill, and every acknowledged increment and create is there."""
    store = stores()
    log = StateLog()
    store.add_session_listener(log)
    session = store.session_id
    counter = store.create(f"{base}/counter", b"0")
    parent = store.create(f"{base}/eph")
    writer = Writer(store, counter, parent)
    writer.start()
    try:
        writer.wait_acked(PROGRESS)
        resumed: list[float] = []
        for round_no in range(2):
            leader = zk_ensemble.leader()
            before = writer.acked
            killed_at = time.monotonic()
            zk_ensemble.kill(leader)
            writer.wait_acked(before + PROGRESS)
            resumed.append(writer.first_ack_after(killed_at) - killed_at)
            if round_no == 0:
                zk_ensemble.start(leader)
                zk_ensemble.wait_quorum()
                assert zk_ensemble.leader() != leader  # a restarted node joins as a follower
    finally:
        writer.stop()
    assert not writer.errors, f"writer failed: {writer.errors!r}"
    print(f"writes resumed {', '.join(f'{r:.2f}' for r in resumed)} s after the kills; "
          f"{writer.acked} increments acknowledged, {writer.applied_unacked} applied without acknowledgement")

    data, stat = store.get(counter)
    assert int(data) == writer.acked + writer.applied_unacked
    assert stat.version == int(data)  # every set was one of ours
    mine = sorted(p.rsplit("/", 1)[1] for p in writer.created + writer.created_unacked)
    assert store.children(parent) == mine
    for name in mine[:: max(1, len(mine) // 20)]:
        eph = store.exists(f"{parent}/{name}")
        assert eph is not None and eph.ephemeral_owner == session
    assert store.session_id == session
    assert SessionState.LOST not in log.states


def test_session_survives_loss_of_its_server(zk_ensemble: ZooKeeperEnsemble,
                                             stores: Callable[[], ZooKeeperStore], base: str) -> None:
    """Kill the very node the client is connected to: same session, ephemeral node kept,
    bookie registration kept, listener hears SUSPENDED then CONNECTED and never LOST."""
    store = stores()
    log = StateLog()
    store.add_session_listener(log)
    session = store.session_id
    eph = store.create(f"{base}/owner", b"me", ephemeral=True)
    info = init_cluster(store, f"{base}/ledgers")
    registration = BookieRegistration(store, info, "bookie-1")
    registration.register()

    holder: list[int | None] = [None]

    def found() -> bool:
        holder[0] = zk_ensemble.node_of_session(session)
        return holder[0] is not None

    wait_until(found, f"a node listing session 0x{session:x} in 'cons'")
    connected_to = holder[0]
    assert connected_to is not None
    zk_ensemble.kill(connected_to)

    wait_until(log.reconnected, f"SUSPENDED then CONNECTED (heard {log.states})")
    wait_until(lambda: found() and holder[0] != connected_to, "the session on another node")
    assert SessionState.LOST not in log.states
    assert store.session_id == session
    stat = store.exists(eph)
    assert stat is not None and stat.ephemeral_owner == session
    assert store.get(eph)[0] == b"me"
    assert isinstance(store.set(eph, b"still me", stat.version), Stat)
    assert registration.registered and list_bookies(store, info).writable == {"bookie-1"}
    assert store.get(f"{base}/ledgers/available/bookie-1")[1].ephemeral_owner == session
    registration.set_readonly(True)  # and it still works through the new server
    assert list_bookies(store, info).readonly == {"bookie-1"}
    assert SessionState.LOST not in log.states


def test_a_session_between_nodes_is_expired_once_it_is_back(zk_ensemble: ZooKeeperEnsemble,
                                                             stores: Callable[[], ZooKeeperStore], base: str) -> None:
    """The expiry test hook, called just after the client's node died (the session is
    suspended, its id not at hand), waits for the client to be back and then expires it."""
    store = stores()
    log = StateLog()
    store.add_session_listener(log)
    session = store.session_id
    holder: list[int | None] = [None]

    def found() -> bool:
        holder[0] = zk_ensemble.node_of_session(session)
        return holder[0] is not None

    wait_until(found, f"a node listing session 0x{session:x} in 'cons'")
    assert holder[0] is not None
    zk_ensemble.kill(holder[0])  # and a second node: no quorum, so the client stays between nodes
    zk_ensemble.kill(next(i for i in range(ZooKeeperEnsemble.SIZE) if i != holder[0]))
    wait_until(lambda: store._client.client_id is None, "the client to notice its node is gone")
    errors: list[BaseException] = []

    def expire() -> None:
        try:
            store.expire_session()
        except BaseException as exc:  # noqa: BLE001 - the test reports it below
            errors.append(exc)

    expiring = threading.Thread(target=expire)  # called while the client had no session id at hand
    expiring.start()
    time.sleep(1.0)  # (the node left may serve the session again for a moment before it sees the quorum gone)
    assert not errors  # waiting for the session to be back, not failing on its absence
    zk_ensemble.restore()
    expiring.join(60)
    assert not expiring.is_alive() and not errors, errors
    wait_until(lambda: store.session_id not in (0, session), "a new session after the expiry")
    assert SessionState.LOST in log.states
    store.create(f"{base}/after-expiry", b"x")  # and the store works on the new one


def test_second_client_sees_ephemeral_throughout(zk_ensemble: ZooKeeperEnsemble,
                                                 stores: Callable[[], ZooKeeperStore], base: str) -> None:
    """While the leader is killed, another client polling and watching the owner's
    ephemeral node never sees it missing; it sees it go when the owner closes."""
    owner = stores()
    owner_log = StateLog()
    owner.add_session_listener(owner_log)
    session = owner.session_id
    eph = owner.create(f"{base}/owner", b"", ephemeral=True)

    observer = stores()
    watched: list[Stat | None] = []
    watch_lock = threading.Lock()

    def on_data(data: bytes | None, stat: Stat | None) -> None:
        with watch_lock:
            watched.append(stat)

    observer.watch_data(eph, on_data)
    polls: list[tuple[float, Stat | None]] = []
    poll_errors: list[BaseException] = []
    stop = threading.Event()

    def poll() -> None:
        try:
            while not stop.is_set():
                polls.append((time.monotonic(), observer.exists(eph)))
                stop.wait(0.01)
        except BaseException as exc:
            poll_errors.append(exc)

    poller = threading.Thread(target=poll, name="zk-poller", daemon=True)
    poller.start()
    try:
        wait_until(lambda: len(polls) >= 5, "the observer's first polls")
        zk_ensemble.kill(zk_ensemble.leader())
        zk_ensemble.leader()  # a new one is elected
        owner.set(eph, b"after failover")  # the owner writes again: it is reconnected
        served = time.monotonic()
        wait_until(lambda: sum(1 for t, _ in polls if t > served) >= 5 or bool(poll_errors),
                   "the observer's polls after the failover")
    finally:
        stop.set()
        poller.join(DEADLINE + 35)
    assert not poller.is_alive()
    assert not poll_errors, f"observer failed: {poll_errors!r}"
    missing = [t for t, s in polls if s is None or s.ephemeral_owner != session]
    assert not missing, f"observer saw the ephemeral node missing or foreign {len(missing)} times"
    with watch_lock:
        assert watched and all(s is not None and s.ephemeral_owner == session for s in watched)
    assert owner.session_id == session
    assert SessionState.LOST not in owner_log.states

    owner.close()  # positive control: the observer's view is live
    def gone() -> bool:
        with watch_lock:
            return watched[-1] is None
    wait_until(gone, "the observer's watch to see the ephemeral node go")
    assert observer.exists(eph) is None
