"""``FaultyCluster``: a :class:`walkit.LocalCluster` whose bookies a test can hurt.

Theory of operation
-------------------
The bookies run in-process (``LocalCluster(processes=False)``); the cluster's
``on_server`` seam hands every new :class:`~bookie.server.BookieServer` to
:meth:`FaultyCluster._prepare` before it starts, which plugs this harness into the
server's seam (:class:`bookie.server.ServerHooks`; production code, no test logic):

* ``disk``: the bookie's file system is a :class:`bookie.fs.faulty.FaultyFS` over the
  real disk (one per bookie number, kept across restarts), for :meth:`~FaultyCluster.fail_sync`.
* ``endpoint``: the bookie registers the address of a :class:`PartitionableProxy`
  (one per bookie number, on the proxies' own event loop thread, created at the bookie's
  first registration and kept across restarts) instead of its own. Clients resolve
  bookie ids through the registration, so all their traffic to bookie ``i`` crosses its
  proxy, and :meth:`~FaultyCluster.partition` / :meth:`~FaultyCluster.heal` switch that
  traffic off and on while the bookie itself runs on. (A client that connects to the
  bookie id's own ``host:port`` bypasses the proxy: the walkit client never does.)
* ``read``: entries named by :meth:`~FaultyCluster.corrupt_entry` are answered
  with their last byte flipped, so a reader's digest check fails on that replica
  (with ``digest="none"`` nothing can notice).

:meth:`~FaultyCluster.slow_disk` sets the bookie's ``Journal.sync_delay`` (its sync
thread sleeps before each batch's write + fdatasync, so adds are acknowledged that much
later; reads do not touch the journal). Faults are remembered per bookie number and
outlive a :meth:`~FaultyCluster.restart_bookie`, as a slow disk, a corrupted file or a
broken network would; ``slow_disk(i, 0)`` and ``heal(i)`` lift them.
:meth:`~FaultyCluster.fail_sync` makes the next fsyncs of a bookie's journal or ledger
directory fail with EIO (through its FaultyFS).
:meth:`~FaultyCluster.expire_session` ends a bookie's or a client's metadata session
through the store's ``expire_session()`` test hook (ZooKeeper's own recipe on
``zk://``; the lease on ``local://``) and waits until the session is replaced (and, for
a bookie, until it is registered again under the new one).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from walkit._local_cluster import LocalCluster
from walkit._local_inprocess import run_on
from walkit._testing._proxy import PartitionableProxy
from walkit.client import LoopThread
from walkit.errors import InvalidArgumentError, MetadataUnavailableError, UsageError, WalkitError

if TYPE_CHECKING:
    from bookie._config import BookieConfig
    from bookie.fs.faulty import FaultyFS
    from bookie.server import BookieServer
    from walkit.client import BookKeeper
    from walkit.metadata import Cluster

__all__ = ["FaultyCluster"]

_PROXY_TIMEOUT = 10.0  # seconds for a proxy to start, switch or close (it is all on loopback)
#: Bookies of a cluster by default: one more than the default ensemble (E=3, a ledger's and
#: a WriteAheadLog's), so that the first kill_bookie does not stop writes (an ensemble
#: change needs a writable bookie outside the ensemble).
DEFAULT_BOOKIES = 4


class FaultyCluster:
    """``bookies`` in-process bookies under ``data_dir`` with fault injection; started by
    the constructor, stopped by :meth:`stop` (or a ``with`` block).

    ``metadata_uri``, ``bookie_options`` and ``session_timeout`` are
    :class:`~walkit.LocalCluster`'s (the session timeout is short by default, so that a
    killed or expired bookie leaves the registered set quickly). Bookie numbers ``i`` are
    0-based, as in LocalCluster. :data:`DEFAULT_BOOKIES` is 4 so that a ledger of the
    default ensemble (3) can lose a bookie and keep writing."""

    def __init__(self, data_dir: str | os.PathLike[str], bookies: int = DEFAULT_BOOKIES, *,
                 metadata_uri: str | None = None, bookie_options: Mapping[str, Any] | None = None,
                 session_timeout: float = 2.0) -> None:
        self._lock = threading.Lock()
        self._proxy_loop = LoopThread("walkit-local-cluster", stop_at_exit=False)
        self._proxies: dict[int, PartitionableProxy] = {}
        self._slow: dict[int, float] = {}
        self._corrupt: dict[int, frozenset[tuple[int, int]]] = {}
        self._disks: dict[int, FaultyFS] = {}
        self._configs: dict[int, BookieConfig] = {}
        self._clients: list[BookKeeper] = []
        self._stopped = False
        self._session_timeout = session_timeout
        try:
            self._local = LocalCluster(data_dir, bookies, metadata_uri=metadata_uri, bookie_options=bookie_options,
                                       session_timeout=session_timeout, on_server=self._prepare)
        except BaseException:
            self._close_proxies()
            raise

    # -- what the cluster is -------------------------------------------------------------
    @property
    def local(self) -> LocalCluster:
        """The underlying LocalCluster (prefer this class's methods for bookie faults:
        they keep the faults across restarts)."""
        return self._local

    @property
    def metadata_uri(self) -> str:
        return self._local.metadata_uri

    @property
    def data_dir(self) -> Path:
        return self._local.data_dir

    @property
    def bookie_ids(self) -> list[str]:
        return self._local.bookie_ids

    def index_of(self, bookie_id: str) -> int:
        """The number of the bookie with this id (as ledger metadata names bookies)."""
        try:
            return self._local.bookie_ids.index(bookie_id)
        except ValueError:
            raise InvalidArgumentError("no such bookie in this cluster", bookie=bookie_id) from None

    def endpoint(self, i: int) -> str:
        """The "host:port" bookie ``i`` registers and clients reach: its proxy."""
        proxy = self._proxies.get(self._index(i))
        if proxy is None:
            raise UsageError("bookie has not registered yet", bookie=i)
        return proxy.address

    def is_running(self, i: int) -> bool:
        return self._local.is_running(i)

    def server(self, i: int) -> BookieServer:
        """The in-process server of running bookie ``i``."""
        return self._local.server(i)

    def client(self, **options: Any) -> BookKeeper:
        """A ``walkit.BookKeeper`` of this cluster (``options``: ClientConfig fields); closed
        by :meth:`stop` if the test has not closed it."""
        bk = self._local.client(**options)
        with self._lock:
            self._clients.append(bk)
        return bk

    # -- bookie lifecycle (LocalCluster's) -------------------------------------------------
    def kill_bookie(self, i: int) -> None:
        """Crash bookie ``i``: every connection dropped unanswered (see LocalCluster)."""
        self._local.kill_bookie(i)

    def stop_bookie(self, i: int) -> None:
        self._local.stop_bookie(i)

    def restart_bookie(self, i: int) -> None:
        """Start bookie ``i`` again on its data, port and id; its faults stay."""
        self._local.restart_bookie(i)
        self._apply_slow_disk(i)

    def add_bookie(self) -> int:
        """One more bookie (behind a proxy of its own); its number."""
        return self._local.add_bookie()

    def set_read_only(self, i: int, readonly: bool = True) -> None:
        """Bookie ``i``'s disks look full (read-only: adds refused, reads served) or not."""
        self._local.set_read_only(i, readonly)

    # -- faults ----------------------------------------------------------------------------
    def partition(self, i: int) -> None:
        """Cut the network between every client and bookie ``i`` (the bookie runs on):
        nothing is delivered either way and no connection is closed, so the clients'
        timeouts fire; new connections are accepted but carry nothing."""
        self._switch(i, partitioned=True)

    def heal(self, i: int) -> None:
        """End bookie ``i``'s partition: held bytes and connections go through."""
        self._switch(i, partitioned=False)

    def is_partitioned(self, i: int) -> bool:
        proxy = self._proxies.get(self._index(i))
        return proxy is not None and proxy.partitioned

    def slow_disk(self, i: int, delay: float) -> None:
        """Each journal sync of bookie ``i`` takes ``delay`` seconds longer (0: normal)."""
        if not delay >= 0:
            raise InvalidArgumentError("delay is seconds >= 0", delay=delay)
        with self._lock:
            if delay:
                self._slow[self._index(i)] = float(delay)
            else:
                self._slow.pop(self._index(i), None)
        if self._local.is_running(i):
            self._apply_slow_disk(i)

    def fail_sync(self, i: int, directory: str = "journal", count: int = 1) -> None:
        """The next ``count`` fsyncs of running bookie ``i``'s ``directory`` ("journal" or
        "ledgers": its entry logs and index, synced at checkpoints) fail with EIO, as a
        failing disk's would (:class:`bookie.fs.faulty.FaultyFS`: a journal batch whose
        write + sync fails never reaches the file). The bookie acknowledges nothing it
        could not sync and turns read-only until restarted. ``count`` 0 disarms what
        is armed and not yet spent."""
        if directory not in ("journal", "ledgers"):
            raise InvalidArgumentError("directory is 'journal' or 'ledgers'", directory=directory)
        if not isinstance(count, int) or count < 0:
            raise InvalidArgumentError("count is a number of syncs >= 0", count=count)
        with self._lock:  # known from the bookie's first start: it may be down now
            c, fs = self._configs[self._index(i)], self._disks[i]
        for path in [c.journal_directory] if directory == "journal" else c.ledger_directories:
            fs.fail_syncs(path, count)

    def corrupt_entry(self, ledger_id: int, entry_id: int, *, bookie: int) -> None:
        """From now on bookie ``bookie`` answers reads of the entry with a flipped byte."""
        i = self._index(bookie)
        with self._lock:
            self._corrupt[i] = self._corrupt.get(i, frozenset()) | {(ledger_id, entry_id)}

    def expire_session(self, bookie: int | None = None, *, client: BookKeeper | None = None,
                       timeout: float | None = None) -> None:
        """Expire the metadata session of running bookie ``bookie`` or of ``client`` (one
        of them), as ZooKeeper expires a session whose owner went silent; return once the
        store has a new session and (for a bookie) its registration is back under it."""
        if (bookie is None) == (client is None):
            raise InvalidArgumentError("name either a bookie number or a client")
        timeout = timeout if timeout is not None else 30.0 + 3 * self._session_timeout
        if bookie is not None:
            server = self._local.server(bookie)
            cluster = _cluster_of_server(server)
            old = cluster.store.session_id
            _expire(cluster)
            # Back under the new session in the store, and in the bookie's own view too: the
            # node exists a moment before the registration notes it is restored.
            _wait(lambda: _registered(cluster, server.bookie_id, old) and server.registered, timeout,
                  "bookie re-registration", bookie=bookie, id=server.bookie_id)
        else:
            assert client is not None
            cluster = client.client.cluster
            old = cluster.store.session_id
            _expire(cluster)
            _wait(lambda: cluster.store.session_id not in (0, old), timeout, "client's new session")

    # -- lifecycle -------------------------------------------------------------------------
    def stop(self) -> None:
        """Close the clients made by :meth:`client`, stop the bookies, close the proxies
        (idempotent)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            clients, self._clients = self._clients, []
        try:
            for bk in clients:
                bk.close()
            self._local.stop()
        finally:
            self._close_proxies()

    def __enter__(self) -> FaultyCluster:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"FaultyCluster({self._local!r})"

    # -- hooks (called by the bookies) ----------------------------------------------------------
    def _prepare(self, i: int, server: BookieServer) -> None:
        """LocalCluster's on_server, on its loop thread: plug into the server's hooks."""
        from bookie.fs.faulty import FaultyFS
        from bookie.fs.real import RealFS
        from bookie.server import ServerHooks

        with self._lock:  # one FaultyFS per bookie number: armed faults outlive a restart
            disk = self._disks.setdefault(i, FaultyFS(RealFS()))
            self._configs[i] = server.config
        server.hooks = ServerHooks(disk=disk, endpoint=lambda port: self._endpoint_for(i, port),
                                   read=lambda ledger_id, entry_id, data: self._read(i, ledger_id, entry_id, data))

    def _endpoint_for(self, i: int, port: int) -> str:
        """The proxy in front of bookie ``i`` (bound to ``port``), made on first use."""
        with self._lock:
            proxy = self._proxies.get(i)
            if proxy is None:
                proxy = run_on(self._proxy_loop, _start_proxy(port), _PROXY_TIMEOUT, "starting a proxy", bookie=i)
                self._proxies[i] = proxy
            proxy.target_port = port  # the same port on every restart; read on the proxies' loop
            return proxy.address

    def _read(self, i: int, ledger_id: int, entry_id: int, data: bytes) -> bytes:
        """A bookie read thread: the bytes to answer with."""
        if (ledger_id, entry_id) not in self._corrupt.get(i, frozenset()):
            return data
        return data[:-1] + bytes([data[-1] ^ 0xFF]) if data else data

    # -- internals ------------------------------------------------------------------------------
    def _index(self, i: int) -> int:
        if not isinstance(i, int) or not 0 <= i < len(self._local.bookie_ids):
            raise InvalidArgumentError("no such bookie", bookie=i, bookies=len(self._local.bookie_ids))
        return i

    def _apply_slow_disk(self, i: int) -> None:
        bookie = self._local.server(i).bookie
        if bookie is not None:
            bookie.journal.sync_delay = self._slow.get(i, 0.0)

    def _switch(self, i: int, *, partitioned: bool) -> None:
        proxy = self._proxies.get(self._index(i))
        if proxy is None:
            raise UsageError("bookie has not registered yet: nothing to partition", bookie=i)
        run_on(self._proxy_loop, _set_partitioned(proxy, partitioned), _PROXY_TIMEOUT, "switching a proxy", bookie=i)

    def _close_proxies(self) -> None:
        proxies, self._proxies = list(self._proxies.values()), {}
        try:
            for proxy in proxies:
                run_on(self._proxy_loop, proxy.close(), _PROXY_TIMEOUT, "closing a proxy")
        finally:
            self._proxy_loop.stop()


async def _start_proxy(port: int) -> PartitionableProxy:
    proxy = PartitionableProxy(port)
    await proxy.start()
    return proxy


async def _set_partitioned(proxy: PartitionableProxy, partitioned: bool) -> None:
    if partitioned:
        proxy.partition()
    else:
        proxy.heal()


# The metadata session of a server is private to it; this harness
# reaches in (as LocalCluster's kill does) rather than widen their public API.
def _cluster_of_server(server: BookieServer) -> Cluster:
    cluster: Cluster | None = server._cluster
    if cluster is None:
        raise UsageError("the bookie has no metadata session", id=server.bookie_id)
    return cluster


def _expire(cluster: Cluster) -> None:
    expire = getattr(cluster.store, "expire_session", None)
    if expire is None:
        raise UsageError("this metadata store cannot expire sessions", store=type(cluster.store).__name__)
    expire()


def _registered(cluster: Cluster, bookie_id: str, old_session: int) -> bool:
    """Whether ``bookie_id``'s registration node is owned by the store's session, a new one."""
    from walkit.metadata import READONLY, cluster_path

    available = cluster_path(cluster.info.root, "available")
    try:
        session = cluster.store.session_id
        if session in (0, old_session):
            return False
        for path in (f"{available}/{bookie_id}", f"{available}/{READONLY}/{bookie_id}"):
            stat = cluster.store.exists(path)
            if stat is not None and stat.ephemeral_owner == session:
                return True
    except WalkitError:  # the store is reconnecting
        return False
    return False


def _wait(done: Callable[[], bool], timeout: float, what: str, **context: object) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise MetadataUnavailableError(f"{what} did not happen in time", timeout=timeout, **context)
        time.sleep(0.02)
