"""``BookieServer``: a bookie serving walkit's wire protocol over asyncio, on top of
:class:`Bookie` - its lifecycle and its read-only transitions; the parts it is made of
live beside it in :mod:`bookie.server`.

Theory of operation
-------------------
One event loop thread owns every connection (:mod:`bookie.server._connection`); adds
and WRITE_LACs go to the journal and are answered back on the loop
(:mod:`bookie.server._writes`), reads run on a small thread pool
(:mod:`bookie.server._reads`), long polls park until the LAC moves
(:mod:`bookie.server._long_poll`), and the disk watch (:mod:`bookie.server._disk_watch`)
says when the bookie must turn read-only. The server owns what they share: the
configuration, the core, the read pool, the connections and the read-only flag.

Lifecycle: :meth:`BookieServer.start` binds the socket (so the port, and with it the
default bookie id, is known), connects to the metadata store and refuses a cluster it
cannot use, starts the core (cookies, journal replay), checks the bookie's cookie
against the one in metadata (or stores it: :mod:`bookie.server._startup`), registers,
then starts serving. :meth:`BookieServer.stop` stops accepting, deregisters, stops
reading, waits for every add in flight to be answered, answers the parked long polls,
lets the reads end, and shuts the core down (checkpoint). If registration is lost for
good (``on_lost``), the server stops rather than serve while invisible.

Read-only mode: above ``diskUsageThreshold`` (or on ENOSPC) the bookie re-registers
under ``available/readonly``, answers adds with EREADONLY (recovery adds still pass:
they complete a recovery that other bookies depend on) and keeps serving reads; it turns
writable again once every disk is below ``diskUsageLwmThreshold``. The operator may
force it (``forced_readonly``: ``walkit decommission``). A bookie whose journal or
storage met an I/O error (:attr:`Bookie.failure`: a failed write or fsync) turns
read-only for good: registered under ``readonly`` so clients stop choosing it, reads
still served, ``failed`` in ``/api/v1/bookie/info`` and ``walkit_bookie_failed`` in the
metrics, until it is restarted. :meth:`BookieServer.check_disks` makes the transition:
going read-only takes effect at once, before the registration follows; going writable
only once it is registered so.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import os
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bookie._bookie import Bookie, BookieFailure
from bookie._config import BookieConfig
from bookie._admin import run_command
from bookie._metrics import ServerStats, bookie_registry
from bookie.fs import FileSystem
from bookie.fs.real import RealFS, disk_usage
from bookie.server._connection import READ_CHUNK, Connection
from bookie.server._disk_watch import DiskWatch
from bookie.server._hooks import ServerHooks
from bookie.server._long_poll import LongPolls
from bookie.server._reads import ReadPool
from bookie.server._startup import (
    autorecovery_for,
    check_bookkeeper_id,
    check_cookie,
    check_picked_port,
    lock_directories,
    marked_under_replicated,
    refuse_known_id,
    server_ssl_context,
    service_info,
)
from bookie.server._tls import TlsListener
from bookie.server._writes import Writes
from walkit.errors import BookieError, WalkitError
from walkit.eventloop import describe
from walkit.logs import context

__all__ = ["BookieServer"]

log = logging.getLogger("bookie.server")


class BookieServer:
    """A bookie serving the wire protocol. Use inside a running event loop:
    ``await server.start()`` ... ``await server.stop()``.

    ``fs`` is the bookie's file system (None: the real disk; another keeps no files in
    the configured directories, which are then not locked), ``disk_usage`` what the disk
    watch reads, ``hooks`` where a harness stands in (:class:`ServerHooks`; set before
    :meth:`start`)."""

    def __init__(self, config: BookieConfig, *, fs: FileSystem | None = None,
                 disk_usage: Callable[[str], float] = disk_usage, ssl_context: ssl.SSLContext | None = None,
                 hooks: ServerHooks | None = None) -> None:
        self.config = config
        self._fs = fs
        self._disk_usage = disk_usage
        self.hooks = hooks if hooks is not None else ServerHooks()
        self._ssl = ssl_context if ssl_context is not None else (
            server_ssl_context(config) if config.tls_certificate_path else None)
        self.bookie: Bookie | None = None
        self.bookie_id = ""
        self.port = 0
        self._picked_port = False  # bookiePort = 0 without a bookieId: the id names the port bound
        self.readonly = False
        #: Read-only on the operator's word (``walkit decommission``), whatever the disks say.
        self.forced_readonly = False
        self._cluster: Any = None  # walkit.metadata.Cluster when metadata is configured
        self._registration: Any = None
        self._autorecovery: Any = None  # walkit.recovery.AutoRecovery with autoRecoveryDaemonEnabled
        self._connections: set[Connection] = set()
        self.stats = ServerStats()  # what /metrics reports (bookie/_metrics.py)
        self._http: Any = None  # bookie._http.AdminEndpoint with httpServerEnabled
        self._read_view = memoryview(bytearray(READ_CHUNK))  # every connection's reads (Connection.get_buffer)
        self._locks: list[int] = []  # flock'ed descriptors of our directories
        #: The pool that runs whatever may block: reads, ADMIN commands, the admin endpoint's work.
        self.read_executor = ThreadPoolExecutor(config.num_read_worker_threads, thread_name_prefix="bookie-read")
        self.reads = ReadPool(self)
        self.polls = LongPolls(self, self.reads)
        self.writes = Writes(self, self.polls, self.reads.lac_bodies)
        self._disks = DiskWatch(self)
        self._server: asyncio.Server | TlsListener | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._stopping = False
        self._stopped = asyncio.Event()
        self.stop_error: BaseException | None = None
        self.lost_registration = False
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop serving this bookie (set by :meth:`start`)."""
        return self._loop

    @property
    def stopping(self) -> bool:
        """:meth:`stop` has begun: no new connection, request or add is taken on."""
        return self._stopping

    @property
    def tls(self) -> bool:
        return self._ssl is not None

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The bookie's TLS (None: not configured): what a connection's START_TLS upgrades with."""
        return self._ssl

    @property
    def autorecovery(self) -> Any:
        """This bookie's autorecovery daemon (``walkit.recovery.AutoRecovery``), or None."""
        return self._autorecovery

    @property
    def http_port(self) -> int:
        """The admin endpoint's port (0: not enabled)."""
        return self._http.port if self._http is not None else 0

    @property
    def registered(self) -> bool:
        """The bookie's node is in the metadata store as far as it knows (False without
        metadata, and from a session expiry until it has registered again)."""
        return self._registration is not None and self._registration.registered

    def disk_usage_of(self, directory: str) -> float:
        """The fraction of ``directory``'s file system in use (as read-only mode sees it)."""
        return self._disk_usage(directory)

    # -- what /metrics reads (bookie._metrics.MetricsSource) --------------------------------
    @property
    def connection_count(self) -> int:
        """Client connections open."""
        return len(self._connections)

    @property
    def requests_in_flight(self) -> int:
        """Requests dispatched and not yet answered, over every connection."""
        return sum(c.in_flight for c in list(self._connections))

    @property
    def adds_in_flight(self) -> int:
        """Adds admitted and not yet durable."""
        return self.writes.in_flight.count

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.writes.loop_thread = threading.get_ident()
        c = self.config
        factory = functools.partial(Connection, self, self._connections, self._read_view)
        if self._ssl is None:
            self._server = await self._loop.create_server(factory, host=c.bind_address, port=c.bookie_port,
                                                          start_serving=False, reuse_address=True)
        else:  # TLS from the first byte (walkit) or by START_TLS (BookKeeper): bookie.server._tls
            self._server = await TlsListener.open(factory, c.bind_address, c.bookie_port, self._ssl)
        self.port = int(self._server.sockets[0].getsockname()[1])
        self.bookie_id = c.bookie_id or f"{c.advertised_host}:{self.port}"
        self._picked_port = not c.bookie_id and not c.bookie_port
        self.config = dataclasses.replace(c, bookie_id=self.bookie_id, bookie_port=self.port)
        try:
            await self._loop.run_in_executor(None, self._start_core)
            self._monitor = self._loop.create_task(self._disks.watch())
            if c.http_server_enabled:
                await self._start_http()
            if self._cluster is not None:  # after the admin endpoint: its port is in the registration
                await self._loop.run_in_executor(None, self._register)
        except BaseException:
            self._server.close()
            if self._monitor is not None:
                self._monitor.cancel()
            if self._http is not None:
                await self._http.stop()
            await self._loop.run_in_executor(None, self._close_core)
            raise
        await self._server.start_serving()
        log.info("bookie %s serving on %s:%d (tls: %s, readonly: %s, event loop: %s)", self.bookie_id,
                 c.bind_address, self.port, self._ssl is not None, self.readonly, describe(self._loop),
                 extra=context(bookie=self.bookie_id))

    async def _start_http(self) -> None:
        from bookie._http import AdminEndpoint

        c = self.config
        self._http = AdminEndpoint(self, bookie_registry(self), functools.partial(run_command, self))
        try:
            await self._http.start()
        except OSError as exc:
            self._http = None
            raise BookieError("cannot listen for the admin endpoint", address=c.http_server_address,
                              port=c.http_server_port, reason=str(exc)) from exc

    def _start_core(self) -> None:
        """Blocking part of start: metadata and core (cookie and registration: :meth:`_register`)."""
        c = self.config
        fs = self.hooks.disk if self.hooks.disk is not None else self._fs
        if self.hooks.disk is not None or self._fs is None or isinstance(self._fs, RealFS):
            self._locks = lock_directories(c)  # the files are in the configured directories
        instance_id = None
        if c.metadata_service_uri:
            from walkit.metadata import connect

            self._cluster = connect(c.metadata_service_uri, session_timeout=c.zk_timeout / 1000.0,
                                    retry_deadline=c.metadata_retry_deadline_ms / 1000.0)
            instance_id = self._cluster.info.instance_id
            check_bookkeeper_id(self._cluster, self.bookie_id)  # before the disks are stamped with it
        else:
            log.warning("bookie %s runs without metadata (metadataServiceUri unset): not registered", self.bookie_id,
                        extra=context(bookie=self.bookie_id))
        marked = None
        if self._cluster is not None:
            marked = marked_under_replicated(self._cluster)
        self.bookie = Bookie(c, fs=fs, instance_id=instance_id, disk_usage=self._disk_usage,
                             metadata=self._cluster.ledgers if self._cluster is not None else None, marked=marked)
        if self._picked_port:
            check_picked_port(self.bookie.fs, c, self.bookie_id, self.port)
        self.bookie.on_space_freed = self._disks.space_freed
        if self._cluster is not None:
            self.bookie.before_stamp = lambda: refuse_known_id(self._cluster, self.bookie_id)
        self.bookie.on_failed = self._disks.bookie_failed
        self.bookie.on_no_space = self._disks.no_space
        self.bookie.start()
        self.readonly = self._disks.disks_full(self.readonly)

    def _register(self) -> None:
        """Check the cookie against metadata, register, start autorecovery if configured."""
        c = self.config
        assert self.bookie is not None and self.bookie.cookie is not None
        check_cookie(self._cluster, self.bookie.cookie, self.bookie_id)
        endpoint = self.hooks.endpoint(self.port) if self.hooks.endpoint else f"{c.advertised_host}:{self.port}"
        info = service_info(self._cluster, c, endpoint, self._ssl is not None, self.http_port)
        # waits out the session of a previous incarnation (kill -9, restart) first
        self._registration = self._cluster.register_bookie(
            self.bookie_id, readonly=self.readonly, data=info, on_lost=self._registration_lost)
        if c.auto_recovery_daemon_enabled:
            self._autorecovery = autorecovery_for(c, self.bookie_id)
            self._autorecovery.start()

    def _registration_lost(self, exc: BaseException) -> None:
        self.lost_registration = True
        log.error("bookie %s lost its registration for good, stopping: %s", self.bookie_id, exc,
                  extra=context(bookie=self.bookie_id))
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self.stop()))

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self, timeout: float = 30.0) -> None:
        """Graceful: stop accepting and reading, deregister, answer every add in flight,
        shut down. Always ends (``wait_stopped`` returns), even if a step fails; the
        first failure is kept in ``stop_error``."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        try:
            if self._server is not None:
                self._server.close()
            if self._monitor is not None:
                self._monitor.cancel()
            if self._http is not None:
                await self._http.stop()
            for conn in list(self._connections):
                conn.stop_reading()
            await self._loop.run_in_executor(None, self._deregister)
            deadline = self._loop.time() + timeout
            while self.adds_in_flight and self._loop.time() < deadline:
                await asyncio.sleep(0.01)
            if self.adds_in_flight:
                log.warning("bookie %s stopping with %d adds unanswered", self.bookie_id, self.adds_in_flight,
                            extra=context(bookie=self.bookie_id))
            self.polls.expire_all()
            await self._loop.run_in_executor(None, self.read_executor.shutdown, True)  # reads end before storage closes
            await asyncio.sleep(0)  # let the last answers be queued
            for conn in list(self._connections):
                conn.close_after_flush()
            await self._loop.run_in_executor(None, self._close_core)
            log.info("bookie %s stopped", self.bookie_id, extra=context(bookie=self.bookie_id))
        except BaseException as exc:
            self.stop_error = exc
            log.exception("bookie %s: stopping failed", self.bookie_id, extra=context(bookie=self.bookie_id))
        finally:
            self._stopped.set()

    def _deregister(self) -> None:
        if self._registration is not None:
            try:
                self._registration.close()
            except WalkitError:
                log.warning("deregistration failed", exc_info=True, extra=context(bookie=self.bookie_id))

    def _close_core(self) -> None:
        if self._autorecovery is not None:
            self._autorecovery.stop()
        try:
            if self.bookie is not None:
                self.bookie.shutdown()
        finally:
            if self._cluster is not None:
                self._cluster.close()
            for fd in self._locks:
                os.close(fd)
            self._locks.clear()

    # -- read-only mode ----------------------------------------------------------------
    @property
    def failure(self) -> BookieFailure | None:
        """The :class:`~bookie._bookie.BookieFailure` that made this bookie read-only for
        good (None: not failed)."""
        return self.bookie.failure if self.bookie is not None else None

    async def check_disks(self) -> None:
        """Check disk usage now and switch mode if needed (also run periodically).
        Going read-only takes effect at once, before the registration follows (which
        may wait for the metadata store); going writable only once it is registered
        so. A registration that failed is retried at the next check."""
        try:
            want = await self._loop.run_in_executor(None, self._disks.disks_full, self.readonly) or self.forced_readonly
            want = want or self.failure is not None
            if want:
                self.readonly = True
            if self._registration is not None and not self._registration.registered_as(want):
                await self._loop.run_in_executor(None, self._registration.set_readonly, want)
            self.readonly = want
        except Exception:
            log.exception("bookie %s: disk check failed", self.bookie_id, extra=context(bookie=self.bookie_id))
