"""Bookie registration, cookies and connect() on every driver."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from support.metadata import (
    SESSION_TIMEOUT, Driver, ExpirableStore, LandsLater, StoreSpec, cluster_uri, driver, open_store, ready_child,
    store, wait_for,
)
from walkit.errors import (
    BookieIdInUseError,
    ClusterLayoutError,
    InvalidArgumentError,
    MetadataUnavailableError,
    MetadataVersionError,
    NodeExistsError,
    SessionExpiredError,
)
from walkit.metadata import (
    BookieRegistration,
    BookieSet,
    ClusterInfo,
    connect,
    init_cluster,
    list_bookies,
    open_metadata_store,
    parse_metadata_uri,
    read_cookie,
    watch_bookies,
    write_cookie,
)
from walkit.metadata._store import SessionState

__all__ = ["driver", "store"]  # fixtures used by name

ROOT = "/ledgers"


def cluster(store: ExpirableStore) -> ClusterInfo:
    return init_cluster(store, ROOT)


def node_owner(store: ExpirableStore, path: str) -> int | None:
    stat = store.exists(path)
    return None if stat is None else stat.ephemeral_owner


def test_register_switch_and_unregister(driver: Driver) -> None:
    store, observer = driver.make_store(), driver.make_store()
    info = cluster(store)
    seen: list[BookieSet] = []
    watch = watch_bookies(observer, info, seen.append)
    reg = BookieRegistration(store, info, "bookie-1:3181", data=b"endpoints")
    writable = BookieSet(frozenset({"bookie-1:3181"}), frozenset())
    readonly = BookieSet(frozenset(), frozenset({"bookie-1:3181"}))
    reg.register()
    assert reg.registered and not reg.readonly
    assert list_bookies(observer, info) == writable
    assert observer.get(f"{ROOT}/available/bookie-1:3181")[0] == b"endpoints"
    wait_for(lambda: seen[-1] == writable)
    reg.set_readonly(True)
    assert reg.readonly and list_bookies(observer, info) == readonly
    wait_for(lambda: seen[-1] == readonly)
    reg.set_readonly(True)  # again: nothing changes
    reg.set_readonly(False)
    assert list_bookies(observer, info) == writable
    wait_for(lambda: seen[-1] == writable)
    reg.unregister()
    assert not reg.registered
    wait_for(lambda: seen[-1] == BookieSet(frozenset(), frozenset()))
    watch.cancel()
    assert seen[0] == BookieSet(frozenset(), frozenset())


def test_a_switch_whose_outcome_is_unknown_leaves_no_mode_known(driver: Driver) -> None:
    """A switch to read-only gives up while its transaction is still on its way (it
    lands before the store's next call): the registration no longer claims either mode,
    so its owner switches again to whatever it wants by then - writable, the mode it was
    in before - and that switch, reading the nodes as they are, puts the bookie back in
    the writable list. (It used to say "writable": an owner wanting writable again did
    nothing, and the late switch left the bookie listed read-only while taking writes.)"""
    store, observer = driver.make_store(), driver.make_store()
    info = cluster(store)
    flaky = LandsLater(store)
    reg = BookieRegistration(flaky, info, "b1")  # type: ignore[arg-type]
    reg.register()
    assert reg.registered_as(False) and not reg.registered_as(True)
    flaky.give_up_next = True
    with pytest.raises(MetadataUnavailableError):
        reg.set_readonly(True)
    assert not reg.registered_as(False) and not reg.registered_as(True)
    reg.set_readonly(False)  # what the owner does for a mode not known to be registered
    assert reg.registered_as(False)
    assert list_bookies(observer, info) == BookieSet(frozenset({"b1"}), frozenset())
    flaky.give_up_next = True
    with pytest.raises(MetadataUnavailableError):
        reg.set_readonly(True)
    flaky.land()  # the store answers again: this switch landed too
    reg.set_readonly(True)  # wanted after all: found made, nothing to do
    assert reg.registered_as(True) and list_bookies(observer, info) == BookieSet(frozenset(), frozenset({"b1"}))
    reg.close()


@pytest.mark.parametrize("bad", ["", "readonly", "a/b", "..", "x" * 256])
def test_bad_bookie_ids_are_refused(store: ExpirableStore, bad: str) -> None:
    with pytest.raises(InvalidArgumentError):
        BookieRegistration(store, cluster(store), bad)


@pytest.mark.parametrize("first_readonly", [False, True])
def test_second_live_bookie_with_the_same_id_is_refused(driver: Driver, first_readonly: bool) -> None:
    first, second = driver.make_store(), driver.make_store()
    info = cluster(first)
    BookieRegistration(first, info, "b1").register(first_readonly)
    for readonly in (False, True):
        other = BookieRegistration(second, info, "b1", wait_existing=0.2)
        with pytest.raises(BookieIdInUseError) as err:
            other.register(readonly)
        assert err.value.context["bookie"] == "b1" and not other.registered
    assert node_owner(second, f"{ROOT}/available/{'readonly/' if first_readonly else ''}b1") == first.session_id


def test_registration_waits_for_a_previous_incarnation_to_go(driver: Driver) -> None:
    first, second = driver.make_store(), driver.make_store()
    info = cluster(first)
    BookieRegistration(first, info, "b1").register()
    threading.Timer(0.3, first.close).start()  # the old process's session ends a little later
    started = time.monotonic()
    BookieRegistration(second, info, "b1", wait_existing=10.0).register()
    assert 0.2 < time.monotonic() - started < 8.0
    assert node_owner(second, f"{ROOT}/available/b1") == second.session_id


def test_reregisters_after_session_expiry(driver: Driver) -> None:
    store, observer = driver.make_store(), driver.make_store()
    info = cluster(store)
    reg = BookieRegistration(store, info, "b1")
    reg.register(readonly=True)
    old_session = store.session_id
    store.expire_session()
    path = f"{ROOT}/available/readonly/b1"
    wait_for(lambda: node_owner(observer, path) not in (None, old_session) and reg.registered, timeout=15)
    assert node_owner(observer, path) == store.session_id != old_session
    assert observer.exists(f"{ROOT}/available/b1") is None, "the mode wanted last is kept"


def test_reregistration_that_cannot_succeed_is_reported(driver: Driver) -> None:
    """After an expiry another bookie takes the id: re-registration retries (bounded),
    then calls on_lost so the bookie can stop instead of serving while invisible."""
    store, usurper = driver.make_store(), driver.make_store()
    info = cluster(store)
    lost, usurped, reported = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold(state: SessionState) -> None:  # registered before the registration's listener
        if state is SessionState.LOST:
            lost.set()
        elif state is SessionState.CONNECTED and lost.is_set():
            usurped.wait(10)  # let the usurper in before re-registration starts

    def on_lost(exc: BaseException) -> None:
        errors.append(exc)
        reported.set()

    store.add_session_listener(hold)
    reg = BookieRegistration(store, info, "b1", retry_deadline=0.5, on_lost=on_lost)
    reg.register()
    threading.Thread(target=store.expire_session, daemon=True).start()
    assert lost.wait(15)
    wait_for(lambda: usurper.exists(f"{ROOT}/available/b1") is None, timeout=15)
    BookieRegistration(usurper, info, "b1").register()
    usurped.set()
    assert reported.wait(15)
    time.sleep(1.0)  # the watchdog and the last retry both end about now: one report
    assert len(errors) == 1 and isinstance(errors[0], (BookieIdInUseError, SessionExpiredError))
    assert not reg.registered
    assert node_owner(usurper, f"{ROOT}/available/b1") == usurper.session_id


def bookie_worker(spec: StoreSpec, out: Any) -> None:
    store = open_store(spec)
    BookieRegistration(store, init_cluster(store, ROOT), "doomed").register()
    out.put("ready")
    time.sleep(60)


def test_killed_bookie_process_disappears_from_the_list(driver: Driver) -> None:
    observer = driver.make_store()
    info = cluster(observer)
    seen: list[BookieSet] = []
    watch_bookies(observer, info, seen.append)
    with ready_child(bookie_worker, driver.spec) as kill:
        wait_for(lambda: "doomed" in seen[-1].writable)
        kill()
        wait_for(lambda: "doomed" not in seen[-1].writable, timeout=SESSION_TIMEOUT * 4)


def test_close_unregisters(driver: Driver) -> None:
    store = driver.make_store()
    info = cluster(store)
    reg = BookieRegistration(store, info, "b1")
    reg.register()
    reg.close()
    assert store.exists(f"{ROOT}/available/b1") is None
    with pytest.raises(InvalidArgumentError):
        reg.register()
    BookieRegistration(store, info, "b1").register()  # the id is free again on this store


def test_close_during_reregistration_stops_it(driver: Driver) -> None:
    """Closed while re-registration backs off (an usurper holds the id): once the usurper
    goes, nothing registers again and nobody is told of a loss."""
    store, usurper = driver.make_store(), driver.make_store()
    info = cluster(store)
    lost, usurped = threading.Event(), threading.Event()
    reported: list[BaseException] = []

    def hold(state: SessionState) -> None:
        if state is SessionState.LOST:
            lost.set()
        elif state is SessionState.CONNECTED and lost.is_set():
            usurped.wait(10)

    store.add_session_listener(hold)
    reg = BookieRegistration(store, info, "b1", retry_deadline=30.0, on_lost=reported.append)
    reg.register()
    threading.Thread(target=store.expire_session, daemon=True).start()
    assert lost.wait(15)
    wait_for(lambda: usurper.exists(f"{ROOT}/available/b1") is None, timeout=15)
    taken = BookieRegistration(usurper, info, "b1")
    taken.register()
    usurped.set()
    time.sleep(0.3)  # re-registration is backing off now
    reg.close()
    taken.close()
    time.sleep(2.5)  # longer than the backoff between attempts
    assert usurper.exists(f"{ROOT}/available/b1") is None and not reg.registered and reported == []


def test_a_second_registration_of_one_id_on_one_store_is_refused(store: ExpirableStore) -> None:
    info = cluster(store)
    first = BookieRegistration(store, info, "b1")
    first.register()
    second = BookieRegistration(store, info, "b1")
    with pytest.raises(BookieIdInUseError, match="this store"):
        second.register(readonly=True)
    second.unregister()  # must not take the first one's node
    assert first.registered and list_bookies(store, info).writable == {"b1"}


def test_session_events_never_wait_for_a_registration_in_progress(driver: Driver) -> None:
    """register() may wait seconds for an id to be freed; the store's session thread must
    not wait behind it (it may be the thread that completes the store calls)."""
    store, holder = driver.make_store(), driver.make_store()
    info = cluster(store)
    BookieRegistration(holder, info, "b1").register()
    waiting = BookieRegistration(store, info, "b1", wait_existing=3.0)
    attempt = threading.Thread(target=lambda: pytest.raises(BookieIdInUseError, waiting.register), daemon=True)
    attempt.start()
    time.sleep(0.3)  # register() is inside its wait, holding its operation lock
    started = time.monotonic()
    waiting._on_session(SessionState.SUSPENDED)
    waiting._on_session(SessionState.CONNECTED)
    assert time.monotonic() - started < 0.5
    attempt.join(10)


def test_loss_without_reconnection_is_reported_after_the_deadline(store: ExpirableStore) -> None:
    """LOST and then no new session within retry_deadline: on_lost, once."""
    info = cluster(store)
    reported: list[BaseException] = []
    reg = BookieRegistration(store, info, "b1", retry_deadline=0.3, on_lost=reported.append)
    reg.register()
    reg._on_session(SessionState.LOST)  # what the store says when the session expired
    assert not reg.registered
    wait_for(lambda: len(reported) == 1, timeout=5)
    time.sleep(0.5)
    assert len(reported) == 1 and isinstance(reported[0], SessionExpiredError)


def test_cookies_are_created_once_and_changed_by_cas(store: ExpirableStore) -> None:
    info = cluster(store)
    assert read_cookie(store, info, "b1") is None
    assert write_cookie(store, info, "b1", b"v0", None) == 0
    with pytest.raises(NodeExistsError):
        write_cookie(store, info, "b1", b"other", None)
    assert write_cookie(store, info, "b1", b"v1", 0) == 1
    with pytest.raises(MetadataVersionError):
        write_cookie(store, info, "b1", b"stale", 0)
    assert read_cookie(store, info, "b1") == (b"v1", 1)


# -- connect(): a client or bookie refuses a cluster it cannot use -------------------------


def _init(uri: str, layout: str | None = None) -> ClusterInfo:
    parsed = parse_metadata_uri(uri)
    admin = open_metadata_store(parsed, create=True)
    try:
        return init_cluster(admin, parsed.root, layout)  # type: ignore[arg-type]
    finally:
        admin.close()


def test_connect_uses_the_clusters_layout(driver: Driver) -> None:
    info = _init(cluster_uri(driver), "flat")
    with connect(cluster_uri(driver)) as c:
        assert c.info == info and c.info.layout == "flat"
        ledger_id = c.ledgers.new_ledger_id()
        assert c.ledgers.path(ledger_id) == f"{c.info.root}/L{ledger_id:010d}"
        reg = c.register_bookie("b1")
        assert c.bookies().writable == {"b1"} and reg.registered
    with connect(cluster_uri(driver, "flat"), instance_id=info.instance_id) as c:
        assert c.bookies().writable == frozenset(), "closing the session took the registration"


def test_connect_refuses_clusters_it_cannot_use(driver: Driver) -> None:
    with pytest.raises(ClusterLayoutError, match="walkit init"):
        connect(cluster_uri(driver))
    info = _init(cluster_uri(driver))
    with pytest.raises(ClusterLayoutError) as err:
        connect(cluster_uri(driver, "flat"))
    assert err.value.context["cluster"] == "hierarchical"
    with pytest.raises(ClusterLayoutError, match="another cluster") as err:
        connect(cluster_uri(driver), instance_id="00000000-0000-0000-0000-000000000000")
    assert err.value.context["found"] == info.instance_id
