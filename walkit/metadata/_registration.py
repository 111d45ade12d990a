"""Bookie registration: who is up, who is read-only, and the bookies' cookies.

Theory of operation
-------------------
A bookie is up while its ephemeral node exists: ``<root>/available/<id>`` when it takes
writes, ``<root>/available/readonly/<id>`` when it only serves reads (disk full, or
told so). The node belongs to the bookie's store session, so a bookie that dies or
loses its session disappears from both lists by itself; clients list and watch them
(:func:`list_bookies`, :func:`watch_bookies`).

:class:`BookieRegistration` keeps one bookie registered:

* ``register()`` creates the node. A node of the same id held by *another* live
  session means a second bookie with this id is running: after waiting up to
  ``wait_existing`` seconds for it to go (a restarted bookie's previous session may
  take a session timeout to expire), registration is refused with
  :class:`~walkit.errors.BookieIdInUseError`. A node held by our own session is ours
  (a create retried across a connection loss may find it made).
* Switching between writable and read-only is one transaction: create the new node and
  delete the old one, so a reader of the store never sees the bookie in both lists or in
  neither. A switch that failed may still land later (MetadataUnavailableError: its
  request may be on its way), so after any failure the mode is no longer known
  (:meth:`BookieRegistration.registered_as` says False for both) until a ``register()``
  succeeds: the owner makes it again, whichever mode it wants by then, and that call
  reads the nodes as they are once the store answers.
* A connection loss (SUSPENDED) needs nothing: the session, and with it the node,
  survives. A session expiry (LOST) removes the node; when the store's new session is
  CONNECTED a background thread registers again in the last wanted mode, retrying
  transient failures with tenacity (exponential backoff, bounded by
  ``retry_deadline``). If it cannot, ``on_lost`` is called with the error so that the
  bookie can stop rather than serve while invisible.

What a registration node holds is the bookie's service info, opaque here: walkit's JSON
or, in a BookKeeper-format cluster, BookKeeper's ``BookieServiceInfo``
(:mod:`walkit.metadata._service_info`). The paths are the same in both formats: they are
BookKeeper's.

Cookies (``<root>/cookies/<id>``) are persistent and versioned; :func:`read_cookie` and
:func:`write_cookie` give the bookie the compare-and-set it needs to check and claim
its disks (the bytes are :class:`bookie.cookie.Cookie`'s encoding, or BookKeeper's text
cookie in a BookKeeper-format cluster: ``bookie.server._startup``).
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import tenacity

from walkit.errors import (
    BookieIdInUseError,
    InvalidArgumentError,
    MetadataError,
    MetadataUnavailableError,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from walkit.metadata._cluster import ClusterInfo, cluster_path
from walkit.metadata._store import Create, Delete, MetadataStore, SessionState, Watch

__all__ = [
    "BookieRegistration",
    "BookieSet",
    "list_bookies",
    "watch_bookies",
    "read_cookie",
    "write_cookie",
]

_log = logging.getLogger(__name__)

READONLY = "readonly"
_POLL = 0.1  # seconds between looks at a node another live session holds (jittered below it)
_RACES = 100  # registration transactions that lost a race in a row (no foreign node seen between) at most


def check_bookie_id(bookie_id: str) -> str:
    """A bookie id is a non-empty node name other than "readonly" (e.g. host:port)."""
    if (not isinstance(bookie_id, str) or not bookie_id or "/" in bookie_id or "\x00" in bookie_id
            or bookie_id in (".", "..", READONLY) or len(bookie_id) > 255):
        raise InvalidArgumentError("invalid bookie id", bookie=bookie_id)
    return bookie_id


def _paths(cluster: ClusterInfo, bookie_id: str) -> tuple[str, str]:
    available = cluster_path(cluster.root, "available")
    return f"{available}/{bookie_id}", f"{available}/{READONLY}/{bookie_id}"


@dataclass(frozen=True)
class BookieSet:
    writable: frozenset[str]
    readonly: frozenset[str]


def read_registration(store: MetadataStore, cluster: ClusterInfo, bookie_id: str) -> bytes | None:
    """What ``bookie_id`` registered (writable or read-only), or None when it is not registered."""
    available = cluster_path(cluster.root, "available")
    for path in (f"{available}/{bookie_id}", f"{available}/{READONLY}/{bookie_id}"):
        try:
            data, _ = store.get(path)
        except NoNodeError:
            continue
        return data
    return None


def list_bookies(store: MetadataStore, cluster: ClusterInfo) -> BookieSet:
    """The registered bookies. ``available/readonly`` may be missing (BookKeeper makes it
    when a first bookie turns read-only): then none is read-only."""
    available = cluster_path(cluster.root, "available")
    writable = frozenset(n for n in store.children(available) if n != READONLY)
    try:
        readonly = frozenset(store.children(f"{available}/{READONLY}"))
    except NoNodeError:
        readonly = frozenset()
    return BookieSet(writable, readonly)


class _BookieWatch:
    def __init__(self) -> None:
        self.parts: list[Watch] = []

    def cancel(self) -> None:
        for part in self.parts:
            part.cancel()


def watch_bookies(store: MetadataStore, cluster: ClusterInfo, callback: Callable[[BookieSet], None]) -> Watch:
    """Call back now and after changes of either list (on a store thread).

    The two lists are two watches: between their events a switching bookie can be seen
    in neither list for a moment (never in both: read-only wins). Several changes may be
    reported once, with the latest state, as store watches are."""
    available = cluster_path(cluster.root, "available")
    lock = threading.Lock()
    state: dict[str, frozenset[str] | None] = {"writable": None, "readonly": None}

    def update(which: str, names: list[str] | None) -> None:
        with lock:
            state[which] = frozenset(n for n in names or () if n != READONLY)
            writable, readonly = state["writable"], state["readonly"]
            if writable is not None and readonly is not None:
                callback(BookieSet(writable - readonly, readonly))

    watch = _BookieWatch()
    try:
        watch.parts.append(store.watch_children(available, lambda names: update("writable", names)))
        watch.parts.append(store.watch_children(f"{available}/{READONLY}", lambda names: update("readonly", names)))
    except BaseException:
        watch.cancel()  # the half already made
        raise
    return watch


def read_cookie(store: MetadataStore, cluster: ClusterInfo, bookie_id: str) -> tuple[bytes, int] | None:
    """The bookie's cookie and its version, or None."""
    try:
        data, stat = store.get(cluster_path(cluster.root, f"cookies/{check_bookie_id(bookie_id)}"))
    except NoNodeError:
        return None
    return data, stat.version


def write_cookie(store: MetadataStore, cluster: ClusterInfo, bookie_id: str, data: bytes,
                 version: int | None) -> int:
    """Create the cookie (``version`` None: NodeExistsError if there is one) or replace
    it at ``version`` (MetadataVersionError on a conflict); returns the new version.
    ``cookies/`` is made if missing (BookKeeper's ``init`` does not make it)."""
    path = cluster_path(cluster.root, f"cookies/{check_bookie_id(bookie_id)}")
    if version is None:
        store.create(path, data, make_parents=True)
        return 0
    return store.set(path, data, version).version


def delete_cookie(store: MetadataStore, cluster: ClusterInfo, bookie_id: str, version: int) -> None:
    """Remove the bookie's cookie at ``version`` (an operator's act, once what the bookie
    held is re-replicated: its id may then start on empty disks)."""
    store.delete(cluster_path(cluster.root, f"cookies/{check_bookie_id(bookie_id)}"), version)


_claims_lock = threading.Lock()
_claims: weakref.WeakKeyDictionary[MetadataStore, dict[str, BookieRegistration]] = weakref.WeakKeyDictionary()


class BookieRegistration:
    """Keeps ``bookie_id`` registered in ``cluster`` through ``store``'s session.

    Two locks: ``_ops`` serializes the operations that call the store (register,
    unregister, re-register); ``_state`` guards the flags and is never held across a
    store call, so the session listener (on the store's thread) only ever takes
    ``_state`` and can never wait for a store call that waits for that very thread."""

    def __init__(self, store: MetadataStore, cluster: ClusterInfo, bookie_id: str, *, data: bytes = b"",
                 wait_existing: float = 0.0, retry_deadline: float = 60.0,
                 on_lost: Callable[[BaseException], None] | None = None) -> None:
        self._store = store
        self.bookie_id = check_bookie_id(bookie_id)
        self._writable_path, self._readonly_path = _paths(cluster, bookie_id)
        self._data = data
        self._wait_existing = wait_existing
        self._retry_deadline = retry_deadline
        self._on_lost = on_lost
        self._ops = threading.RLock()
        self._state = threading.Lock()
        self._wanted: bool | None = None  # None: not registered; else readonly?
        self._settled = True  # False after a failed change (it may land later), until one succeeds
        self._closed = False
        self._lost = False  # the session that held our node expired; not restored yet
        self._reregistering = False
        self._reported = False
        self._watchdog: threading.Timer | None = None
        store.add_session_listener(self._on_session)

    @property
    def registered(self) -> bool:
        """True while our node exists as far as we know."""
        with self._state:
            return self._wanted is not None and not self._lost

    @property
    def readonly(self) -> bool:
        with self._state:
            return bool(self._wanted)

    def registered_as(self, readonly: bool) -> bool:
        """Whether the bookie is known to be registered in this mode: the last change
        succeeded (one that failed may still land) and asked for this mode."""
        with self._state:
            return self._settled and self._wanted is not None and self._wanted == readonly

    def register(self, readonly: bool = False) -> None:
        """Register (or switch to) writable / read-only. BookieIdInUseError when another
        live bookie holds this id (waiting up to ``wait_existing`` for it to go), or when
        another registration on this very store has claimed it."""
        with self._ops:
            with self._state:
                if self._closed:
                    raise InvalidArgumentError("registration is closed", bookie=self.bookie_id)
            self._claim()
            try:
                self._apply(readonly, self._wait_existing)
            except BaseException:
                with self._state:
                    unclaim = self._wanted is None
                    self._settled = False
                if unclaim:
                    self._release()
                raise
            with self._state:
                self._wanted = readonly
                self._settled = True
                self._lost = False
                self._reported = False
                self._stop_watchdog()

    def set_readonly(self, readonly: bool) -> None:
        self.register(readonly)

    def unregister(self) -> None:
        """Remove our node (a no-op when we hold none)."""
        with self._ops:
            with self._state:
                self._wanted = None
                self._stop_watchdog()
            if not self._holds_claim():
                return  # never registered (or refused): the nodes are not ours to remove
            try:
                for path in (self._writable_path, self._readonly_path):
                    stat = self._store.exists(path)
                    if stat is not None and stat.ephemeral_owner == self._store.session_id:
                        with contextlib.suppress(NoNodeError):  # gone already (an expiry)
                            self._store.delete(path, stat.version)
            finally:
                self._release()

    def close(self) -> None:
        """Unregister and stop re-registering (the store stays open)."""
        with self._state:
            if self._closed:
                return
            self._closed = True
        self._store.remove_session_listener(self._on_session)
        try:
            self.unregister()
        except MetadataError:
            _log.warning("unregister failed bookie=%s", self.bookie_id, exc_info=True)

    # -- one registration per id and store ---------------------------------------------

    def _claim(self) -> None:
        with _claims_lock:
            mine = _claims.setdefault(self._store, {})
            holder = mine.get(self.bookie_id)
            if holder is not None and holder is not self:
                raise BookieIdInUseError("this store already registers a bookie with this id", bookie=self.bookie_id)
            mine[self.bookie_id] = self

    def _holds_claim(self) -> bool:
        with _claims_lock:
            return _claims.get(self._store, {}).get(self.bookie_id) is self

    def _release(self) -> None:
        with _claims_lock:
            mine = _claims.get(self._store, {})
            if mine.get(self.bookie_id) is self:
                del mine[self.bookie_id]

    # -- the node ----------------------------------------------------------------------

    def _apply(self, readonly: bool, wait: float) -> None:
        """Make the node of ``readonly``'s list ours and drop the other, in one
        transaction. A transaction that lost a race (with another registration, or an
        expiry) looks again at once, :data:`_RACES` times at most; a node another live
        session holds is looked at again every :data:`_POLL` seconds (jittered) for
        ``wait`` seconds, then BookieIdInUseError (tenacity, as every metadata retry:
        :mod:`walkit.metadata._retry`)."""
        target, other = ((self._readonly_path, self._writable_path) if readonly
                         else (self._writable_path, self._readonly_path))
        if readonly:
            self._ensure_parent(target)
        deadline = time.monotonic() + wait
        races = [0]  # transactions that lost a race since the last look at a foreign node

        def attempt() -> None:
            session = self._store.session_id
            mine_target, foreign = self._owner(target, session)
            mine_other, foreign_other = self._owner(other, session)
            foreign = foreign or foreign_other
            if foreign is not None:
                races[0] = 0
                raise BookieIdInUseError("another live bookie is registered with this id", bookie=self.bookie_id,
                                         path=foreign, waited=wait)
            ops: list[Create | Delete] = [] if mine_target else [Create(target, self._data, ephemeral=True)]
            if mine_other:
                ops.append(Delete(other))
            if ops:
                try:
                    self._store.transaction(ops)
                except (NodeExistsError, NoNodeError):  # raced with another registration or an expiry
                    races[0] += 1
                    raise

        def give_up(state: tenacity.RetryCallState) -> bool:
            failed = state.outcome.exception() if state.outcome is not None else None
            if isinstance(failed, BookieIdInUseError):
                return time.monotonic() >= deadline
            return races[0] >= _RACES

        def pause(state: tenacity.RetryCallState) -> float:
            failed = state.outcome.exception() if state.outcome is not None else None
            if not isinstance(failed, BookieIdInUseError):
                return 0.0  # a race: look again at once
            return min(random.uniform(_POLL / 2, _POLL), max(0.0, deadline - time.monotonic()))

        tenacity.Retrying(retry=tenacity.retry_if_exception_type((BookieIdInUseError, NodeExistsError, NoNodeError)),
                          stop=give_up, wait=pause, reraise=True)(attempt)

    def _ensure_parent(self, path: str) -> None:
        """``available/readonly`` exists (BookKeeper's bookies make it on demand, so a
        cluster one of its older versions made may lack it)."""
        parent = path.rpartition("/")[0]
        if self._store.exists(parent) is None:
            with contextlib.suppress(NodeExistsError):
                self._store.create(parent, make_parents=True)

    def _owner(self, path: str, session: int) -> tuple[bool, str | None]:
        """(we hold ``path``, ``path`` if another session holds it)."""
        stat = self._store.exists(path)
        if stat is None:
            return False, None
        if stat.ephemeral_owner == session:
            return True, None
        return False, path

    # -- session expiry ---------------------------------------------------------------

    def _on_session(self, state: SessionState) -> None:
        # On the store's thread: takes only ``_state``, never calls the store.
        with self._state:
            if self._closed or self._wanted is None:
                return
            if state is SessionState.LOST:
                self._lost = True
                if self._watchdog is None:  # restored within the deadline, or reported
                    self._watchdog = threading.Timer(self._retry_deadline, self._give_up)
                    self._watchdog.daemon = True
                    self._watchdog.start()
            elif state is SessionState.CONNECTED and self._lost and not self._reregistering:
                self._reregistering = True
                threading.Thread(target=self._reregister, name=f"walkit-reregister-{self.bookie_id}",
                                 daemon=True).start()

    def _stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def _reregister(self) -> None:
        retry = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type((MetadataUnavailableError, SessionExpiredError, BookieIdInUseError)),
            wait=tenacity.wait_exponential(multiplier=0.05, max=2.0),
            stop=tenacity.stop_after_delay(self._retry_deadline),
            reraise=True,
        )
        try:
            for attempt in retry:
                with attempt, self._ops:
                    with self._state:
                        wanted = self._wanted
                        if self._closed or wanted is None or not self._lost:
                            return
                    self._apply(wanted, 0.0)
                    with self._state:
                        self._lost = False
                        self._settled = True  # on the new session: nothing of the old one can land
                        self._stop_watchdog()
                    _log.info("bookie re-registered after session expiry bookie=%s readonly=%s", self.bookie_id,
                              wanted)
        except MetadataError as exc:
            self._report(exc)
        finally:
            with self._state:
                self._reregistering = False

    def _give_up(self) -> None:
        with self._state:
            self._watchdog = None
        self._report(SessionExpiredError("registration lost and not restored in time", bookie=self.bookie_id,
                                         deadline=self._retry_deadline))

    def _report(self, exc: MetadataError) -> None:
        """Tell the owner, once per loss, unless it closed or we recovered meanwhile."""
        with self._state:
            if self._closed or self._reported or not self._lost:
                return
            self._reported = True
        _log.error("bookie could not re-register bookie=%s: %s", self.bookie_id, exc)
        if self._on_lost is not None:
            self._on_lost(exc)
