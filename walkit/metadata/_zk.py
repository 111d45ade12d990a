"""The ZooKeeper driver: :class:`~walkit.metadata._store.MetadataStore` over kazoo.

Theory of operation
-------------------
This is the only module that imports kazoo; every kazoo error is translated here into a
walkit error (``raise ... from``). kazoo reconnects by itself; after a session expiry it
opens a *new* session, and the listeners registered with
:meth:`ZooKeeperStore.add_session_listener` hear LOST then CONNECTED so that owners can
recreate their ephemeral nodes. kazoo's ``transaction().commit()`` does not raise: every
result is checked here.

Every call ends within ``retry_deadline`` (30 s by default; set through
:func:`~walkit.metadata.connect`'s ``retry_deadline``: the bookies'
``metadataRetryDeadlineMs``, the clients' ``metadata_retry_deadline``). kazoo's blocking calls wait for their reply
without a limit, and a request made while the client has no connection sits in kazoo's
queue until one is back (its KazooRetry deadline only counts between attempts), so a
call during an outage of every ZooKeeper server would wait for the whole outage. Here
each call (:meth:`ZooKeeperStore._call`) waits for a connection, sends kazoo's async
request and waits for its reply, all against one deadline; connection loss and a
session expiry met on the way are retried (on the new session: the listeners hear
LOST) until then, by the metadata layer's retry policy
(:func:`~walkit.metadata._retry.retry_until`: 50 ms doubling up to 1 s between attempts), and the deadline raises ``MetadataUnavailableError``. A request left
in kazoo's queue when its call gave up may still be sent once a server is back: like
any connection loss in flight, the caller's MetadataUnavailableError means "unknown
outcome", and CAS versions, ``_settle`` and lost-reply detection above are built for
it. The blocking reads kazoo's DataWatch and ChildrenWatch make while a watch is set up
are bounded the same way (:class:`_Client`): a watch that could not be set up in time
raises and is cancelled. One already set re-reads by itself in kazoo's threads, after
each change and once the connection is back, waiting out any outage.

Access control (optional): hosts given as ``user:password@h1:2181,h2:2181`` (the URI
``zk://user:password@h1:2181/ledgers``) make the session authenticate with ZooKeeper's
``digest`` scheme, and every node this store creates (plain, ephemeral, sequential,
parents, inside transactions) carries the ACL ``digest:user:<hash>`` with all
permissions and nothing for anyone else, so a client without those credentials can
neither read nor change walkit's nodes. Nodes that existed before are left as they
are. The credentials never appear in this store's ``hosts`` or its errors; they do sit
in the URI, so keep configuration files holding it private.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError as KzNodeExists,
    NoChildrenForEphemeralsError,
    NoNodeError as KzNoNode,
    NotEmptyError as KzNotEmpty,
    OperationTimeoutError,
    RolledBackError,
    SessionExpiredError as KzSessionExpired,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry, RetryFailedError
from kazoo.security import make_digest_acl

from walkit.errors import (
    InvalidArgumentError,
    MetadataError,
    MetadataUnavailableError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from walkit.metadata._retry import retry_until
from walkit.metadata._store import (
    ANY_VERSION, RETRY_DEADLINE, check_path, Create, Delete, Op, SessionState, SetData, Stat, Watch,
)

__all__ = ["ZooKeeperStore"]

_STATES = {
    KazooState.CONNECTED: SessionState.CONNECTED,
    KazooState.SUSPENDED: SessionState.SUSPENDED,
    KazooState.LOST: SessionState.LOST,
}


def _translate(exc: BaseException, path: str, **context: Any) -> MetadataError | InvalidArgumentError:
    """The walkit error for a kazoo failure on ``path``."""
    if isinstance(exc, BadVersionError):
        return MetadataVersionError("version mismatch", path=path, **context)
    if isinstance(exc, KzNoNode):
        return NoNodeError("no such node", path=path, **context)
    if isinstance(exc, KzNodeExists):
        return NodeExistsError("node exists", path=path, **context)
    if isinstance(exc, KzNotEmpty):
        return NotEmptyError("node has children", path=path, **context)
    if isinstance(exc, NoChildrenForEphemeralsError):
        return InvalidArgumentError("ephemeral nodes cannot have children", path=path, **context)
    if isinstance(exc, KzSessionExpired):
        return SessionExpiredError("ZooKeeper session expired", path=path, **context)
    if isinstance(exc, (ConnectionLoss, OperationTimeoutError, KazooTimeoutError, RetryFailedError)):
        return MetadataUnavailableError("ZooKeeper unreachable", path=path, **context)
    return MetadataError(f"ZooKeeper error: {type(exc).__name__}", path=path, **context)


# Retryable within a call's deadline: the request did not reach a live session.
_RETRY: tuple[type[BaseException], ...] = (ConnectionLoss, OperationTimeoutError, KzSessionExpired)
_FIRST_BACKOFF = 0.05  # after a failed attempt, before the next (doubling)
_MAX_BACKOFF = 1.0


class _Client(KazooClient):  # type: ignore[misc]  # kazoo is untyped
    """kazoo's client, whose watches' reads are bounded while a watch is set up, and
    only then.

    kazoo's DataWatch and ChildrenWatch read their node with ``get``, ``exists`` and
    ``get_children`` (ChildrenWatch through ``retry``) in two places:

    - setting a watch up reads in the caller's thread (:meth:`ZooKeeperStore._start_watch`,
      inside :meth:`setting_up`). There each read gives up after ``bound`` seconds
      (``KazooTimeoutError``: kazoo would wait for a connection for ever) and the retry
      after the store's retry deadline, so that a watch that cannot be set up fails in
      time, in the caller's hands;
    - after that the watch re-reads in kazoo's threads, after each change and each time
      the connection comes back. There nothing is bounded: a re-read waits an outage out
      (kazoo fails a request with ConnectionLoss when the connection drops, and the retry
      sends it again on the next one), as kazoo means it to. An error raised there would
      go unhandled in a thread no one joins, and leave the watch dead until the next
      reconnect. Closing the client ends such a wait (ConnectionClosedError, which
      kazoo's watches ignore).

    The store's own calls use the async requests (:meth:`ZooKeeperStore._call`)."""

    bound: float = RETRY_DEADLINE
    retry: Callable[..., Any]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._setup = threading.local()
        bounded = self.retry  # kazoo's: a fresh copy of the command retry per call
        # the same retry without its deadline or a limit on tries
        settings = {k: v for k, v in kwargs.get("command_retry", {}).items() if k != "deadline"}
        forever = KazooRetry(**{**settings, "max_tries": -1}, sleep_func=self.handler.sleep_func)

        def retry(func: Callable[..., Any], *args: Any, **kw: Any) -> Any:
            return bounded(func, *args, **kw) if self._setting_up() else forever.copy()(func, *args, **kw)

        self.retry = retry

    @contextlib.contextmanager
    def setting_up(self) -> Iterator[None]:
        """The watch reads made in this thread meanwhile are bounded."""
        depth = getattr(self._setup, "depth", 0)
        self._setup.depth = depth + 1
        try:
            yield
        finally:
            self._setup.depth = depth

    def _setting_up(self) -> bool:
        return bool(getattr(self._setup, "depth", 0))

    def _limit(self) -> float | None:
        return self.bound if self._setting_up() else None

    def get(self, path: str, watch: Any = None) -> Any:
        return self.get_async(path, watch).get(timeout=self._limit())

    def exists(self, path: str, watch: Any = None) -> Any:
        return self.exists_async(path, watch).get(timeout=self._limit())

    def get_children(self, path: str, watch: Any = None, include_data: bool = False) -> Any:
        return self.get_children_async(path, watch, include_data).get(timeout=self._limit())


def _stat(z: Any) -> Stat:
    return Stat(
        version=z.version, cversion=z.cversion, ephemeral_owner=z.ephemeralOwner,
        ctime=z.ctime / 1000.0, mtime=z.mtime / 1000.0, num_children=z.numChildren,
    )


class _Watch:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ZooKeeperStore:
    """A session on a ZooKeeper ensemble (``hosts`` like "h1:2181,h2:2181")."""

    def __init__(self, hosts: str, *, session_timeout: float = 10.0, connect_timeout: float = 15.0,
                 retry_deadline: float = RETRY_DEADLINE) -> None:
        # Calls give up after ``retry_deadline`` (an outage shorter than that is waited
        # out); the connection never does (kazoo's client would otherwise close for good
        # after an outage, and its session listeners would never hear CONNECTED again).
        if retry_deadline <= 0:
            raise InvalidArgumentError("retry_deadline must be positive", retry_deadline=retry_deadline)
        connection = {"max_tries": -1, "delay": 0.1, "max_delay": 2.0}
        command = {"max_tries": -1, "delay": 0.1, "max_delay": 2.0, "deadline": retry_deadline}  # setting watches up
        hosts, access = _split_credentials(hosts)
        self.hosts = hosts
        self.retry_deadline = retry_deadline
        self._client = _Client(hosts=hosts, timeout=session_timeout, connection_retry=connection,
                               command_retry=command, **access)
        self._client.bound = retry_deadline
        self._listeners: list[Callable[[SessionState], None]] = []
        self._lock = threading.Lock()
        self._connected = threading.Event()  # set while kazoo says CONNECTED
        self._closed = False
        self._client.add_listener(self._on_state)
        try:
            self._client.start(timeout=connect_timeout)
        except KazooTimeoutError as exc:
            self._client.close()
            raise MetadataUnavailableError("cannot connect to ZooKeeper: no server answered within the connect "
                                           "timeout", hosts=hosts, timeout=f"{connect_timeout:g}s") from exc
        if self._client.connected:  # kazoo may call listeners after start() returned
            self._connected.set()

    # --- session ------------------------------------------------------------------------
    @property
    def session_id(self) -> int:
        cid = self._client.client_id
        return int(cid[0]) if cid else 0

    def add_session_listener(self, callback: Callable[[SessionState], None]) -> None:
        with self._lock:
            self._listeners.append(callback)

    def remove_session_listener(self, callback: Callable[[SessionState], None]) -> None:
        with self._lock:
            if callback in self._listeners:
                self._listeners.remove(callback)

    def _on_state(self, state: str) -> None:
        # kazoo's event thread: listeners must not block or call ZooKeeper here.
        mapped = _STATES.get(state)
        if mapped is None:
            return
        if mapped is SessionState.CONNECTED or self._closed:
            self._connected.set()
        else:
            self._connected.clear()
        with self._lock:
            listeners = list(self._listeners)
        for cb in listeners:
            cb(mapped)
        if mapped is SessionState.LOST:
            # kazoo opens a new session by itself; say so once it is there.
            self._client.handler.spawn(self._announce_reconnect)

    def _announce_reconnect(self) -> None:
        if self._client.connected:
            with self._lock:
                listeners = list(self._listeners)
            for cb in listeners:
                cb(SessionState.CONNECTED)

    def expire_session(self, timeout: float = 30.0) -> None:
        """Test hook: make the server expire this session (ZooKeeper's own recipe: a
        second client with the same session id connects and closes). While the client is
        between servers (its node died) the session is only suspended and its id is not
        at hand: wait up to ``timeout`` for the client to be back on it."""
        deadline = time.monotonic() + timeout
        while (ident := self._client.client_id) is None:
            if time.monotonic() >= deadline:
                raise MetadataUnavailableError("no session to expire: the client is not connected",
                                               hosts=self.hosts, timeout=timeout)
            time.sleep(0.05)
        sid, passwd = ident
        other = KazooClient(hosts=self.hosts, client_id=(sid, passwd))
        try:
            other.start(timeout=15)
            other.stop()
        except KazooTimeoutError as exc:  # no server answered (e.g. nodes restarting): nothing expired
            raise MetadataUnavailableError("could not reach ZooKeeper to expire the session", hosts=self.hosts,
                                           session=hex(sid)) from exc
        finally:
            other.close()

    def close(self) -> None:
        self._closed = True
        self._connected.set()  # wake calls waiting for a connection: they fail now
        self._client.stop()
        self._client.close()

    # --- operations -----------------------------------------------------------------------
    def _deadline(self) -> float:
        return time.monotonic() + self.retry_deadline

    def _call(self, path: str, request: Callable[[], Any], deadline: float | None = None) -> Any:
        """Send ``request()`` (a kazoo ``*_async`` call) and return its reply, retrying
        connection loss and session expiry, all before ``deadline`` (monotonic; one
        retry deadline from now when None); then MetadataUnavailableError."""
        until = self._deadline() if deadline is None else deadline

        def attempt() -> Any:
            self._wait_connected(path, until)
            try:
                return request().get(timeout=max(0.0, until - time.monotonic()))
            except ConnectionClosedError as exc:  # a SessionExpiredError in kazoo: not one to retry
                raise MetadataUnavailableError("ZooKeeper client closed", path=path, hosts=self.hosts) from exc
            except _RETRY:
                raise  # retry_until's to retry
            except KazooTimeoutError as exc:
                raise self._unavailable(path) from exc
            except KazooException as exc:
                raise _translate(exc, path) from exc

        return retry_until(attempt, retry_on=_RETRY, deadline=until, first_wait=_FIRST_BACKOFF,
                           max_wait=_MAX_BACKOFF, gave_up=lambda: self._unavailable(path))

    def _wait_connected(self, path: str, deadline: float) -> None:
        if not self._closed and not self._connected.wait(max(0.0, deadline - time.monotonic())):
            raise self._unavailable(path)
        if self._closed:
            raise MetadataUnavailableError("ZooKeeper client closed", path=path, hosts=self.hosts)

    def _unavailable(self, path: str) -> MetadataUnavailableError:
        return MetadataUnavailableError("metadata unavailable: no answer from ZooKeeper within the retry deadline",
                                        path=path, hosts=self.hosts, retry_deadline=self.retry_deadline)

    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False,
               make_parents: bool = False) -> str:
        check_path(path)
        _check_data(path, data)
        return str(self._call(path, lambda: self._client.create_async(
            path, data, ephemeral=ephemeral, sequence=sequential, makepath=make_parents)))

    def get(self, path: str) -> tuple[bytes, Stat]:
        check_path(path)
        data, z = self._call(path, lambda: self._client.get_async(path))
        return bytes(data), _stat(z)

    def exists(self, path: str) -> Stat | None:
        check_path(path)
        z = self._call(path, lambda: self._client.exists_async(path))
        return None if z is None else _stat(z)

    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> Stat:
        check_path(path)
        _check_data(path, data)
        try:
            return _stat(self._call(path, lambda: self._client.set_async(path, data, version=version)))
        except MetadataVersionError as exc:
            raise self._version_error(path, version) from exc

    def delete(self, path: str, version: int = ANY_VERSION, *, recursive: bool = False) -> None:
        check_path(path)
        if recursive:  # kazoo's recursive delete makes blocking calls: ours, on one deadline
            self._delete_tree(path, self._deadline())
            return
        try:
            self._call(path, lambda: self._client.delete_async(path, version=version))
        except MetadataVersionError as exc:
            raise self._version_error(path, version) from exc

    def _delete_tree(self, path: str, deadline: float) -> None:
        """Delete ``path`` and everything below it, as kazoo's recursive delete does (no
        version check; a node already gone, ``path`` included, is no error)."""
        try:
            names = self._call(path, lambda: self._client.get_children_async(path), deadline)
        except NoNodeError:
            return
        for name in names:
            child = f"{path.rstrip('/')}/{name}"
            self._delete_tree(child, deadline)
        with contextlib.suppress(NoNodeError):
            self._call(path, lambda: self._client.delete_async(path), deadline)

    def _version_error(self, path: str, expected: int) -> MetadataVersionError:
        """A CAS failure with the versions that clashed (the actual one read after)."""
        current = self.exists(path)
        return MetadataVersionError("version mismatch", path=path, expected=expected,
                                    actual=None if current is None else current.version)

    def children(self, path: str) -> list[str]:
        check_path(path)
        return sorted(self._call(path, lambda: self._client.get_children_async(path)))

    def sync(self, path: str) -> None:
        check_path(path)
        self._call(path, lambda: self._client.sync_async(path))

    def transaction(self, ops: Sequence[Op]) -> list[str | Stat | None]:
        for op in ops:
            check_path(op.path)
            if isinstance(op, (Create, SetData)):
                _check_data(op.path, op.data)
        results = self._call(ops[0].path if ops else "/", lambda: self._commit(ops))
        for i, (op, res) in enumerate(zip(ops, results)):
            if isinstance(res, Exception) and not isinstance(res, RolledBackError):
                raise _translate(res, op.path, op_index=i) from res
        return [_result(op, res) for op, res in zip(ops, results)]

    def _commit(self, ops: Sequence[Op]) -> Any:
        """kazoo's async commit of ``ops`` (its reply: one result or exception per op)."""
        t = self._client.transaction()
        for op in ops:
            if isinstance(op, Create):
                t.create(op.path, op.data, ephemeral=op.ephemeral, sequence=op.sequential)
            elif isinstance(op, SetData):
                t.set_data(op.path, op.data, version=op.version)
            elif isinstance(op, Delete):
                t.delete(op.path, version=op.version)
            else:
                t.check(op.path, op.version)
        return t.commit_async()

    # --- watches ---------------------------------------------------------------------------
    def watch_data(self, path: str, callback: Callable[[bytes | None, Stat | None], None]) -> Watch:
        check_path(path)
        w = _Watch()

        def fire(data: bytes | None, z: Any) -> bool | None:
            if w.cancelled:
                return False
            callback(None if z is None else bytes(data or b""), None if z is None else _stat(z))
            return None

        self._start_watch(path, w, lambda: self._client.DataWatch(path, fire))
        return w

    def watch_children(self, path: str, callback: Callable[[list[str] | None], None]) -> Watch:
        """kazoo's ChildrenWatch stops silently when the node goes: a DataWatch tracks the
        node's existence, says None when it is gone, and starts a new ChildrenWatch
        whenever it (re)appears."""
        check_path(path)
        w = _Watch()
        generation = [0]
        active = [False]

        def on_children(names: list[str], gen: int) -> bool | None:
            if w.cancelled or gen != generation[0]:
                return False
            callback(sorted(names))
            return None

        def on_node(data: bytes | None, z: Any) -> bool | None:
            if w.cancelled:
                return False
            if z is None:
                generation[0] += 1
                active[0] = False
                callback(None)
            elif not active[0]:
                active[0] = True
                gen = generation[0] = generation[0] + 1
                self._client.ChildrenWatch(path, lambda names: on_children(names, gen))
            return None

        self._start_watch(path, w, lambda: self._client.DataWatch(path, on_node))
        return w

    def _start_watch(self, path: str, w: _Watch, start: Callable[[], object]) -> None:
        """Run ``start`` (a kazoo watch's first read, blocking, bounded by
        :class:`_Client`) once connected; cancel ``w`` and raise the walkit error if it
        fails (kazoo's watch would otherwise come to life on the next connection)."""
        try:
            self._wait_connected(path, self._deadline())
            with self._client.setting_up():
                start()
        except BaseException as exc:
            w.cancel()
            if isinstance(exc, KazooTimeoutError):
                raise self._unavailable(path) from exc
            if isinstance(exc, (KazooException, RetryFailedError)):
                raise _translate(exc, path) from exc
            raise


def _split_credentials(hosts: str) -> tuple[str, dict[str, Any]]:
    """``user:password@hosts`` → the hosts, and kazoo's digest auth and default ACL."""
    credentials, at, rest = hosts.rpartition("@")
    if not at:
        return hosts, {}
    user, colon, password = credentials.partition(":")
    if not user or not colon or not password or not rest:
        raise InvalidArgumentError("ZooKeeper credentials are user:password@hosts", hosts=rest or "?")
    return rest, {"auth_data": [("digest", f"{user}:{password}")],
                  "default_acl": [make_digest_acl(user, password, all=True)]}


def _result(op: Op, res: Any) -> str | Stat | None:
    if isinstance(op, Create):
        return str(res)
    if isinstance(op, SetData):
        return _stat(res)
    return None


def _check_data(path: str, data: object) -> None:
    if not isinstance(data, bytes):
        raise InvalidArgumentError("node data must be bytes", path=path, type=type(data).__name__)


