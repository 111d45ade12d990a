"""The bookie's network server: walkit's wire protocol over asyncio, on top of :class:`Bookie`.

Theory of operation
-------------------
One event loop thread owns every connection. A connection (:class:`_Connection`, an
``asyncio.Protocol``) feeds the bytes it receives to its sans-IO
:class:`~walkit.protocol.ServerConnection`, which yields requests (or ready-made error
responses for frames it could not accept) and dispatches each:

* ADD_ENTRY goes straight to the core: the consecutive adds that one pass of
  :meth:`_Connection._pump` may dispatch (limits and stopping / read-only / busy checks
  per add, as for a single add) are handed over in one :meth:`Bookie.add_batch_cb`
  call, which still checks each add on its own; any other request (or a refused add)
  first submits the adds collected before it, so submission order is arrival order.
  The adds the core admitted are framed into one journal batch with **one callback**
  for the group, called once their fdatasync returned (a refused add is called back on
  its own, at once). The journal is not woken per chunk: at the end of the loop
  iteration (:meth:`BookieServer._kick_journal`, once, after every connection with
  bytes was read) an idle journal writes, syncs and calls back on the loop's own thread
  (``journalInlineFlush``; no thread switch between a lone add and its answer, which
  the kick drains and writes at once, in the same loop iteration), while a busy one
  groups them into its next batch, written by its sync thread
  (:meth:`bookie.journal.Journal.kick`). Callbacks are queued (a deque,
  thread-safe) and the loop is woken once per journal flush (``call_soon_threadsafe``
  only when no drain is scheduled yet - a callback that sees the flag set does not even
  take the drain lock), so a group commit of a thousand entries costs a few queue
  items and one wake-up. The answers of a group are encoded straight from the requests
  and joined once (:meth:`~walkit.protocol.ServerConnection.send_added_many`, the bytes
  of an AddEntryResponse each).
* Reads (READ_ENTRY, READ_RANGE, READ_LAC, GET_BOOKIE_INFO) may touch the disk: they run
  on a small thread pool and answer through the loop, as do ADMIN requests
  (:mod:`bookie._admin`: the garbage collector's ``gc.status`` and ``gc.run``, recovery's
  ``ledger.replicate``).
* A READ_RANGE is answered with the consecutive entries the bookie stores from the first
  one asked for (:meth:`bookie.storage.LedgerStorage.get_entries`: a few preads for the
  whole range), within the request's byte limit and ``nettyMaxFrameSizeBytes`` for the
  whole answer; the first entry is always sent (EIO when it alone does not fit a frame,
  as READ_ENTRY answers an entry too big to return).
* A fencing READ_ENTRY first fences (the FENCE record is journaled and synced), then
  reads: once the reader hears the answer, the fence is durable and later normal adds
  are refused with EFENCED; RECOVERY_ADD still passes.
* WRITE_LAC for a ledger whose key is durable here is published at once (storage, long
  polls, the answer) and its record rides on the next flush: an explicit LAC needs no
  fsync (:meth:`bookie.Bookie.publish_lac`). For a ledger new to this bookie it is
  journaled like an add, after the ledger's key.
* A long-poll READ_ENTRY (previous LAC + timeout) waits until the ledger's LAC passes
  the previous one (an add whose entry carries a higher LAC, or a WRITE_LAC) or the
  timeout ends (then ENOENTRY). Its answer carries the entry the poller named when
  this bookie holds it (a follower names the next one it needs), else the last entry.

Responses are appended to the connection's output list; one ``transport.write`` per
connection per loop iteration carries all of them (coalescing), in completion order -
request ids let the client match them (pipelining, out of order).

Back-pressure and memory: a connection stops reading once it has
``maxPendingRequestsPerConnection`` requests in flight, or when its transport's write
buffer is over the high-water mark (``pause_writing``), and reads again below half of
it; so a connection holds at most that many requests plus one read chunk. Adds beyond
``maxPendingAddRequests`` in flight across all connections are answered
ETOOMANYREQUESTS at once.

Read-only mode: every ``diskCheckInterval`` the fullest ledger disk (blocks or inodes)
is compared with ``diskUsageThreshold``; above it the
bookie re-registers under ``available/readonly``, answers adds with EREADONLY (recovery
adds still pass: they complete a recovery that other bookies depend on) and keeps
serving reads; it turns writable again once every disk is below
``diskUsageLwmThreshold`` - checked at once whenever garbage collection gave space
back, so a bookie that GC saves from a full disk comes back. A write that meets a full
disk (ENOSPC) before the check noticed makes the bookie read-only at once, and that
directory (the journal's too) is checked with the ledger disks until it is below
``diskUsageLwmThreshold``.
A bookie whose journal or storage met an I/O error (:attr:`Bookie.failure`: a failed
write or fsync) turns read-only for good: registered under ``readonly`` so clients stop
choosing it, reads still served, ``failed`` in ``/api/v1/bookie/info`` and
``walkit_bookie_failed`` in the metrics, until it is restarted.

Lifecycle: :meth:`BookieServer.start` binds the socket (so the port, and with it the
default bookie id, is known), connects to the metadata store and refuses a cluster it
cannot use, starts the core (cookies, journal replay), checks the bookie's cookie
against the one in metadata (or stores it), registers, then starts serving.
:meth:`BookieServer.stop` stops accepting, deregisters, stops reading, waits for every
add in flight to be answered, and shuts the core down (checkpoint). If registration is
lost for good (``on_lost``), the server stops rather than serve while invisible.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import fcntl
import functools
import itertools
import json
import logging
import os
import shutil
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sortedcontainers import SortedKeyList

from bookie._admin import run_command
from bookie._metrics import ServerStats, bookie_registry
from bookie._bookie import LAST_ENTRY, Bookie, BookieFailure
from bookie._config import BookieConfig, os_reason
from bookie.cookie import Cookie
from bookie.cookie import read_cookie as read_disk_cookie
from bookie.fs import FileSystem
from bookie.fs.faulty import FaultyFS
from bookie.fs.real import RealFS, disk_usage
from walkit.errors import (
    BookieBusyError,
    BookieError,
    BookieReadOnlyError,
    BookieShutdownError,
    ConfigError,
    CookieError,
    NoSuchEntryError,
    WalkitError,
)
from walkit.logs import context
from walkit.protocol import (
    AddEntry,
    AddEntryResponse,
    AdminRequest,
    AdminResponse,
    BookieInfoResponse,
    ErrorResponse,
    GetBookieInfo,
    Op,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadLacResponse,
    ReadRange,
    ReadRangeResponse,
    Request,
    Response,
    ServerConnection,
    WriteLac,
    WriteLacResponse,
    parse_entry_header,
    range_response_size,
    status_for,
)

__all__ = ["BookieServer", "server_ssl_context", "disk_usage"]

log = logging.getLogger("bookie.server")

_ADD_DONE = 0
_LAC_WRITTEN = 1


def server_ssl_context(config: BookieConfig) -> ssl.SSLContext:
    """TLS for the server from the PEM files of the configuration."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(config.tls_certificate_path, config.tls_key_store)
    if config.tls_trust_store:
        ctx.load_verify_locations(config.tls_trust_store)
    ctx.verify_mode = ssl.CERT_REQUIRED if config.tls_client_authentication else ssl.CERT_NONE
    return ctx


_BAD_FRAMES = 16  # malformed frames a connection may send before it is closed
_READS_IN_FLIGHT = 32  # reads one connection may have in flight (each may answer a big entry)


_READ_CHUNK = 256 * 1024  # bytes one socket read may bring (asyncio's own read size)


class _Connection(asyncio.BufferedProtocol):
    """One client connection (see the module docstring).

    The socket is read into the server's one read buffer (:meth:`get_buffer`; the loop
    reads one connection at a time and :meth:`buffer_updated` copies out what came), not
    into a fresh 256 KiB ``bytes`` per read, which malloc serves with mmap + mremap +
    munmap and page faults: three system calls more per request of a lone writer.

    Decoded requests wait in ``backlog`` until :meth:`_pump` dispatches them: at most
    ``maxPendingRequestsPerConnection`` requests and ``_READS_IN_FLIGHT`` reads in
    flight, and only while the answers not yet sent (queued plus the transport's
    buffer) stay under the byte budget. Reading pauses whenever the backlog is not
    empty, so a connection holds at most one read chunk of requests it has not
    dispatched, and a client that does not read its answers stops being served."""

    def __init__(self, server: BookieServer) -> None:
        self.server = server
        self.wire = ServerConnection(server.config.netty_max_frame_size_bytes)
        self.transport: asyncio.Transport | None = None
        self.backlog: collections.deque[Request] = collections.deque()
        self.in_flight = 0
        self.reads_in_flight = 0
        self.bad_frames = 0
        self.out: list[bytes] = []
        self.out_bytes = 0
        self.flush_scheduled = False
        self.reading_paused = False
        self.pumping = False  # inside _pump: answers given meanwhile do not pump again
        self.closed = False
        self.eof = False
        self.peer = "?"
        self.waiters: set[_LongPoll] = set()
        #: The core's callback for this connection's adds (``cb(err, adds)``).
        self.on_added: Callable[[BaseException | None, list[AddEntry]], None] = functools.partial(
            server._on_added, self)

    # -- asyncio callbacks -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peer = str(transport.get_extra_info("peername"))
        server = self.server
        if server._stopping or len(server._connections) >= server.config.max_connections:
            log.warning("refusing connection from %s (%s)", self.peer,
                        "stopping" if server._stopping else "too many connections",
                        extra=context(bookie=server.bookie_id))
            transport.abort()
            return
        server._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.backlog.clear()
        self.server._connections.discard(self)
        self.server._forget_waiters(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.server._read_view

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.server._read_view[:nbytes].tobytes())

    def data_received(self, data: bytes) -> None:
        self.server.stats.bytes_in += len(data)
        for item in self.wire.receive(data):
            if isinstance(item, ErrorResponse):
                self.bad_frames += 1
                if self.bad_frames == 1:
                    log.info("bad request from %s: %s", self.peer, item.message)
                self._queue(item)
            else:
                self.backlog.append(item)
        if self.wire.closing or self.bad_frames > _BAD_FRAMES:
            self._close_after_flush()
            return
        self._pump()

    def eof_received(self) -> bool:
        """The client half-closed (or closed): answer what it sent, then close (plaintext
        only; TLS cannot half-close and closes at once)."""
        self.eof = True
        for waiter in list(self.waiters):  # parked polls end now (as if timed out): a
            self.server._poll_expired(waiter)  # client that closed is not waiting for them
        if self.in_flight == 0 and not self.backlog:
            self._flush()
            return False
        return True

    def pause_writing(self) -> None:
        self._pump()

    def resume_writing(self) -> None:
        self._pump()

    # -- dispatch and flow control -------------------------------------------------------
    def _unsent(self) -> int:
        buffered = self.transport.get_write_buffer_size() if self.transport is not None else 0
        return self.out_bytes + buffered

    def _pump(self) -> None:
        """Dispatch what the limits allow; pause reading while anything must wait.
        Consecutive adds are admitted here (the server's checks, inlined: this loop runs
        once per add) and handed to the core together; anything else - another request,
        a refused add - first submits the adds collected before it, so submission order
        is arrival order. Not re-entered: a request answered while it is dispatched (a
        refused add, a published WRITE_LAC) leaves the rest of the backlog to this loop,
        which sees the answer's freed slot - a nested pump per answer would recurse once
        per such request in the backlog."""
        if self.pumping:
            return
        self.pumping = True
        try:
            self._pump_backlog()
        finally:
            self.pumping = False

    def _pump_backlog(self) -> None:
        server = self.server
        c = server.config
        limit, budget = c.max_pending_requests_per_connection, 2 * c.netty_max_frame_size_bytes
        max_adds, max_bytes = c.max_pending_add_requests, c.max_pending_add_bytes
        backlog = self.backlog
        adds: list[AddEntry] = []  # consecutive adds admitted so far: submitted in one call
        unsent = self._unsent()  # changes only when this loop answers something
        while backlog and not self.closed:
            req = backlog[0]
            if self.in_flight >= limit or unsent >= budget:
                break
            if isinstance(req, AddEntry):
                backlog.popleft()
                self.in_flight += 1
                if not (server._stopping or (server.readonly and not req.recovery)
                        or server._pending_adds >= max_adds or server._pending_add_bytes >= max_bytes):
                    server._pending_adds += 1
                    server._pending_add_bytes += len(req.data)
                    adds.append(req)
                    continue
                if adds:  # keep the order: what came before goes first
                    server._submit_adds(self, adds)
                    adds = []
                self.respond(server._add_refusal(req))
                unsent = self._unsent()
                continue
            is_read = not isinstance(req, WriteLac)
            if is_read and self.reads_in_flight >= _READS_IN_FLIGHT:
                break
            backlog.popleft()
            self.in_flight += 1
            if adds:
                server._submit_adds(self, adds)
                adds = []
            if is_read:
                self.reads_in_flight += 1
            server._dispatch(self, req)
            unsent = self._unsent()
        if adds:
            server._submit_adds(self, adds)
        want_pause = bool(backlog) or server._stopping
        if want_pause != self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = want_pause
            if want_pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def stop_reading(self) -> None:
        """Shutdown: no more requests from this connection (those waiting are dropped)."""
        self.backlog.clear()
        self._pump()

    # -- responses ---------------------------------------------------------------------
    def respond(self, response: Response) -> None:
        """Answer one dispatched request (dropped if the connection is gone)."""
        self.in_flight -= 1
        if not _answers_write(response):
            self.reads_in_flight -= 1
        self.server.stats.answered(response)
        if self.closed:
            return
        self._queue_frame(self.wire.send(response))
        self._answered()

    def respond_added(self, reqs: list[AddEntry]) -> None:
        """``respond(AddEntryResponse(...))`` for each of several durable adds, without
        building the response objects: their frames (the same bytes) joined once."""
        self.in_flight -= len(reqs)
        self.server.stats.adds_ok += len(reqs)
        if self.closed:
            return
        self._queue_frame(self.wire.send_added_many(reqs))
        self._answered()

    def _answered(self) -> None:
        """After an answer was queued: close once the last one is out after EOF, or
        dispatch what waited for it."""
        if self.eof and self.in_flight == 0 and not self.backlog:
            self.server._loop.call_soon(self._close_after_flush)
        elif self.backlog or self.reading_paused:
            self._pump()

    def _close_after_flush(self) -> None:
        self._flush()
        if self.transport is not None:
            self.transport.close()

    def _queue(self, response: Response) -> None:
        self._queue_frame(self.wire.send(response))

    def _queue_frame(self, frame: bytes) -> None:
        self.out.append(frame)
        self.out_bytes += len(frame)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            server = self.server
            if server._kicking:  # written at the end of the kick, in this loop iteration
                server._unflushed.append(self)
            else:
                server._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        out, self.out, self.out_bytes = self.out, [], 0
        if out and self.transport is not None and not self.closed:
            data = b"".join(out) if len(out) > 1 else out[0]
            self.server.stats.bytes_out += len(data)
            self.transport.write(data)
        if self.backlog:
            self._pump()


_WRITE_OPS = frozenset({Op.ADD_ENTRY, Op.WRITE_LAC})


def _answers_write(response: Response) -> bool:
    if isinstance(response, ErrorResponse):
        return response.op in _WRITE_OPS
    return isinstance(response, (AddEntryResponse, WriteLacResponse))


class _LongPoll:
    """A parked long-poll read. ``done`` is set by whoever answers it first (an LAC
    advance, its first check, its timeout, shutdown, the connection going)."""

    __slots__ = ("conn", "req", "previous", "seq", "timer", "done")

    def __init__(self, conn: _Connection, req: ReadEntry, seq: int) -> None:
        self.conn = conn
        self.req = req
        self.previous = -1 if req.previous_lac is None else req.previous_lac
        self.seq = seq
        self.timer: asyncio.TimerHandle | None = None
        self.done = False


MAX_POLL_TIMEOUT_MS = 600_000  # a long poll waits at most 10 minutes


def _on_disk(fs: FileSystem | None) -> bool:
    """Whether ``fs`` keeps its files in the configured directories (the real disk, or a
    fault-injecting wrapper of it), so that they are locked against a second process."""
    if isinstance(fs, FaultyFS):
        return _on_disk(fs.inner)
    return fs is None or isinstance(fs, RealFS)


def _open_lock_file(key: str, directory: str) -> int:
    """``<directory>/LOCK``, open, with the directory made if missing; a ConfigError
    naming configuration key ``key`` and the path when the directory cannot be used (a
    file is there, no permission...), instead of a bare ``[Errno 17] File exists``."""
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError as exc:
        raise ConfigError(f"{key} is a file, not a directory", key=key, path=directory) from exc
    except OSError as exc:
        raise ConfigError(f"{key} cannot be created: {os_reason(exc)}", key=key, path=directory) from exc
    try:
        return os.open(os.path.join(directory, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError(f"{key} cannot be used: {os_reason(exc)}", key=key, path=directory) from exc


class BookieServer:
    """A bookie serving the wire protocol. Use inside a running event loop:
    ``await server.start()`` ... ``await server.stop()``."""

    def __init__(self, config: BookieConfig, *, fs: FileSystem | None = None,
                 disk_usage: Callable[[str], float] = disk_usage, ssl_context: ssl.SSLContext | None = None) -> None:
        self.config = config
        self._fs = fs
        self._disk_usage = disk_usage
        self._ssl = ssl_context if ssl_context is not None else (
            server_ssl_context(config) if config.tls_certificate_path else None)
        self.bookie: Bookie | None = None
        self.bookie_id = ""
        self.port = 0
        self._picked_port = False  # bookiePort = 0 without a bookieId: the id names the port bound
        self.readonly = False
        #: Read-only on the operator's word (``walkit decommission``), whatever the disks say.
        self.forced_readonly = False
        #: Directories a write found full (ENOSPC), watched until below diskUsageLwmThreshold.
        self._full_dirs: set[str] = set()
        self._cluster: Any = None  # walkit.metadata.Cluster when metadata is configured
        self._registration: Any = None
        self._autorecovery: Any = None  # walkit.recovery.AutoRecovery with autoRecoveryDaemonEnabled
        self._connections: set[_Connection] = set()
        self.stats = ServerStats()  # what /metrics reports (bookie/_metrics.py)
        self._http: Any = None  # bookie._http.AdminEndpoint with httpServerEnabled
        self._pending_adds = 0
        #: Completions (kind, connection, adds or request, error), from the sync thread.
        self._done: collections.deque[tuple[int, _Connection, Any, BaseException | None]] = collections.deque()
        self._drain_lock = threading.Lock()
        self._drain_scheduled = False
        self._kick_scheduled = False  # a journal kick is due at the end of this loop iteration
        self._kicking = False  # inside _kick_journal: answers are drained and written by it
        self._unflushed: list[_Connection] = []  # connections with answers queued during a kick
        self._read_view = memoryview(bytearray(_READ_CHUNK))  # every connection's reads (_Connection.get_buffer)
        self._loop_thread = 0  # the loop's thread id (a callback there needs no self-pipe wake-up)
        self._pending_add_bytes = 0
        self._waiters: dict[int, SortedKeyList] = {}  # ledger -> parked polls by (previous LAC, seq)
        self._poll_seq = itertools.count()
        self._poll_count = 0
        self._locks: list[int] = []  # flock'ed descriptors of our directories
        self._reads = ThreadPoolExecutor(config.num_read_worker_threads, thread_name_prefix="bookie-read")
        self._server: asyncio.Server | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._stopping = False
        self._stopped = asyncio.Event()
        self.stop_error: BaseException | None = None
        self.lost_registration = False
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by start()
        # Test hooks (None in production; walkit.testing sets them on in-process bookies):
        #: ``endpoint_hook(port)``: the "host:port" registered for clients instead of
        #: ``<advertised host>:<port>`` - a proxy in front of the bookie. Set before start().
        self.endpoint_hook: Callable[[int], str] | None = None
        #: ``read_hook(ledger, entry, data)``: the bytes a READ_ENTRY (and each entry of a
        #: READ_RANGE) is answered with instead of ``data`` (what the bookie stored) - a
        #: corrupted replica.
        self.read_hook: Callable[[int, int, bytes], bytes] | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop serving this bookie (set by :meth:`start`)."""
        return self._loop

    @property
    def tls(self) -> bool:
        return self._ssl is not None

    @property
    def autorecovery(self) -> Any:
        """This bookie's autorecovery daemon (``walkit.recovery.AutoRecovery``), or None."""
        return self._autorecovery

    @property
    def http_port(self) -> int:
        """The admin endpoint's port (0: not enabled)."""
        return self._http.port if self._http is not None else 0

    @property
    def read_executor(self) -> ThreadPoolExecutor:
        """The read pool: reads, ADMIN commands, the admin endpoint's blocking work."""
        return self._reads

    def disk_usage_of(self, directory: str) -> float:
        """The fraction of ``directory``'s file system in use (as read-only mode sees it)."""
        return self._disk_usage(directory)

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        c = self.config
        self._server = await self._loop.create_server(
            lambda: _Connection(self), host=c.bind_address, port=c.bookie_port, ssl=self._ssl,
            start_serving=False, reuse_address=True,
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        self.bookie_id = c.bookie_id or f"{c.advertised_host}:{self.port}"
        self._picked_port = not c.bookie_id and not c.bookie_port
        self.config = dataclasses.replace(c, bookie_id=self.bookie_id, bookie_port=self.port)
        try:
            await self._loop.run_in_executor(None, self._start_core)
        except BaseException:
            self._server.close()
            await self._loop.run_in_executor(None, self._close_core)
            raise
        self._monitor = self._loop.create_task(self._watch_disks())
        if c.http_server_enabled:
            from bookie._http import AdminEndpoint

            self._http = AdminEndpoint(self, bookie_registry(self), functools.partial(run_command, self))
            try:
                await self._http.start()
            except OSError as exc:
                self._server.close()
                self._monitor.cancel()
                await self._loop.run_in_executor(None, self._close_core)
                raise BookieError("cannot listen for the admin endpoint", address=c.http_server_address,
                                  port=c.http_server_port, reason=str(exc)) from exc
        await self._server.start_serving()
        log.info("bookie %s serving on %s:%d (tls: %s, readonly: %s)", self.bookie_id, c.bind_address, self.port,
                 self._ssl is not None, self.readonly, extra=context(bookie=self.bookie_id))

    def _start_core(self) -> None:
        """Blocking part of start: metadata, core, cookie, registration."""
        c = self.config
        if _on_disk(self._fs):
            self._lock_directories()
        instance_id = None
        if c.metadata_service_uri:
            from walkit.metadata import connect

            self._cluster = connect(c.metadata_service_uri, session_timeout=c.zk_timeout / 1000.0,
                                    retry_deadline=c.metadata_retry_deadline_ms / 1000.0)
            instance_id = self._cluster.info.instance_id
        else:
            log.warning("bookie %s runs without metadata (metadataServiceUri unset): not registered", self.bookie_id,
                        extra=context(bookie=self.bookie_id))
        marked = None
        if self._cluster is not None:
            from walkit.metadata import UnderReplication

            marked = UnderReplication(self._cluster.store, self._cluster.info).is_marked
        self.bookie = Bookie(c, fs=self._fs, instance_id=instance_id, disk_usage=self._disk_usage,
                             metadata=self._cluster.ledgers if self._cluster is not None else None, marked=marked)
        if self._picked_port:
            self._check_picked_port(self.bookie.fs)
        self.bookie.on_space_freed = self._space_freed
        if self._cluster is not None:
            self.bookie.before_stamp = self._refuse_a_known_id
        self.bookie.on_failed = self._bookie_failed
        self.bookie.on_no_space = self._no_space
        self.bookie.start()
        self.readonly = self._disks_full(self.readonly)
        if self._cluster is not None:
            self._check_cookie()
            endpoint = self.endpoint_hook(self.port) if self.endpoint_hook else f"{c.advertised_host}:{self.port}"
            info = json.dumps({"endpoint": endpoint, "tls": self._ssl is not None, "protocol": 1}).encode()
            # waits out the session of a previous incarnation (kill -9, restart) first
            self._registration = self._cluster.register_bookie(
                self.bookie_id, readonly=self.readonly, data=info, on_lost=self._registration_lost)
            if c.auto_recovery_daemon_enabled:
                self._start_autorecovery()

    def _start_autorecovery(self) -> None:
        """The auditor candidate and replication worker of this bookie (walkit/recovery)."""
        from walkit.recovery import AutoRecovery, AutoRecoveryConfig

        c = self.config
        config = AutoRecoveryConfig(
            lost_bookie_recovery_delay=c.lost_bookie_recovery_delay,
            auditor_periodic_check_interval=c.auditor_periodic_check_interval,
            auditor_periodic_bookie_check_interval=c.auditor_periodic_bookie_check_interval,
            open_ledger_rereplication_grace_period=c.open_ledger_rereplication_grace_period / 1000.0)
        self._autorecovery = AutoRecovery(c.metadata_service_uri, self.bookie_id, config,
                                          session_timeout=c.zk_timeout / 1000.0,
                                          retry_deadline=c.metadata_retry_deadline_ms / 1000.0,
                                          tls_ca=c.tls_trust_store)
        self._autorecovery.start()

    def _lock_directories(self) -> None:
        """An exclusive lock on each directory (``<dir>/LOCK``, released when the process
        ends, even by kill -9): a second process started on the same disks by mistake
        stops here, before it touches the journal."""
        c = self.config
        keyed = [("journalDirectory", c.journal_directory)] + [("ledgerDirectories", d) for d in c.ledger_directories]
        for key, d in keyed:
            fd = _open_lock_file(key, d)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                os.close(fd)
                raise BookieError("directory in use by another bookie process", dir=d) from exc
            self._locks.append(fd)

    def _check_picked_port(self, fs: FileSystem) -> None:
        """``bookiePort = 0`` without a bookieId: the id names the port this start got,
        another at every start. Disks an earlier start stamped are refused here, with
        the port (or id) to give, rather than as a cookie mismatch. (Not refused on new
        disks: LocalCluster starts a bookie so, then gives the port it got every time.)"""
        stamped = read_disk_cookie(fs, self.config.journal_directory)
        if stamped is None:
            log.info("bookie id %s names a port chosen at this start (bookiePort = 0, no bookieId): later starts "
                     "must set bookiePort = %d (or this bookieId)", self.bookie_id, self.port,
                     extra=context(bookie=self.bookie_id))
        elif stamped.bookie_id != self.bookie_id:
            port = stamped.bookie_id.rpartition(":")[2]
            fix = f"bookiePort = {port}, or " if port.isdigit() else ""
            raise ConfigError(f"bookiePort must not be 0 here (without a bookieId): the bookie id names the port, "
                              f"and would change at every start; these disks are bookie {stamped.bookie_id}'s: "
                              f"set {fix}bookieId = \"{stamped.bookie_id}\" (then any port will do)",
                              key="bookiePort", bookie=self.bookie_id, disks=stamped.bookie_id)

    def _refuse_a_known_id(self) -> None:
        """Before empty disks become this bookie's: the cluster must not know its id yet."""
        from walkit.metadata import read_cookie

        if read_cookie(self._cluster.store, self._cluster.info, self.bookie_id) is not None:
            raise CookieError(
                "this bookie's disks are empty but the cluster knows its id: its data was wiped or its disks "
                "replaced, and an empty bookie answering \"no such entry\" for what it acknowledged could let "
                "a recovery lose data; re-replicate what it held (`walkit recover --bookie ID`), then either "
                "start it under a new bookieId or drop its old cookie (`walkit bookie cookie delete --bookie "
                "ID --metadata URI`)", bookie=self.bookie_id)

    def _check_cookie(self) -> None:
        """The disks' cookie must be the one in metadata; a new bookie stores its own."""
        from walkit.metadata import read_cookie, write_cookie

        assert self.bookie is not None and self.bookie.cookie is not None
        mine = self.bookie.cookie
        stored = read_cookie(self._cluster.store, self._cluster.info, self.bookie_id)
        if stored is None:
            write_cookie(self._cluster.store, self._cluster.info, self.bookie_id, mine.encode(), None)
            return

        try:
            theirs = Cookie.decode(stored[0], path=f"metadata cookies/{self.bookie_id}")
        except WalkitError as exc:
            raise CookieError("unreadable cookie in metadata", bookie=self.bookie_id) from exc
        mine.verify_matches(theirs, where="metadata")

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
            while self._pending_adds and self._loop.time() < deadline:
                await asyncio.sleep(0.01)
            if self._pending_adds:
                log.warning("bookie %s stopping with %d adds unanswered", self.bookie_id, self._pending_adds,
                            extra=context(bookie=self.bookie_id))
            for waiters in list(self._waiters.values()):
                for waiter in list(waiters):
                    self._unpark(waiter)
                    self._answer_expired(waiter)
            await self._loop.run_in_executor(None, self._reads.shutdown, True)  # reads end before storage closes
            await asyncio.sleep(0)  # let the last answers be queued
            for conn in list(self._connections):
                conn._close_after_flush()
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

    def _disks_full(self, readonly: bool) -> bool:
        """Whether the bookie should be read-only now (hysteresis between the marks), by
        the fullest of its ledger disks - and of any other directory whose disk was found
        full by a write (the journal's), until that one is below the low-water mark."""
        c = self.config
        for d in list(self._full_dirs):
            if self._disk_usage(d) < c.disk_usage_lwm_threshold:
                self._full_dirs.discard(d)
        usage, fullest = max((self._disk_usage(d), d) for d in {*c.ledger_directories, *self._full_dirs})
        if not readonly and usage >= c.disk_usage_threshold:
            log.warning("bookie %s: disk of %s is %.1f%% full (threshold %.1f%%): read-only", self.bookie_id,
                        fullest, usage * 100, c.disk_usage_threshold * 100,
                        extra=context(bookie=self.bookie_id, directory=fullest))
            return True
        if readonly and usage < c.disk_usage_lwm_threshold:
            if self.failure is None:
                log.info("bookie %s: disks at most %.1f%% full: writable again", self.bookie_id, usage * 100,
                         extra=context(bookie=self.bookie_id))
            return False
        return readonly

    def _bookie_failed(self, failure: BookieFailure) -> None:
        """The core met an I/O error (any thread; the core logged it): read-only for good."""
        self.readonly = True  # adds are refused from now on; the registration follows
        self._check_soon()

    def _no_space(self, directory: str, exc: BaseException) -> None:
        """A write found ``directory``'s disk full before the disk check did (any thread):
        read-only now; the disk check makes it writable again once there is room."""
        self._full_dirs.add(directory)  # checked by the disk check until below the low-water mark
        if self.readonly:
            return
        self.readonly = True
        log.warning("bookie %s: no space left in %s (%s): read-only until its disk is below %.0f%%", self.bookie_id,
                    directory, exc, self.config.disk_usage_lwm_threshold * 100,
                    extra=context(bookie=self.bookie_id, directory=directory))
        self._check_soon()

    def _check_soon(self) -> None:
        """Run :meth:`check_disks` on the loop (from any thread), unless stopping."""
        loop = self._loop
        if loop is None or self._stopping or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(lambda: loop.create_task(self.check_disks()))
        except RuntimeError:  # the loop closed meanwhile
            pass

    async def _watch_disks(self) -> None:
        while True:
            await asyncio.sleep(self.config.disk_check_interval / 1000.0)
            await self.check_disks()

    def _space_freed(self) -> None:
        """GC gave space back (its thread): check the disks now, not at the next interval."""
        self._check_soon()

    async def check_disks(self) -> None:
        """Check disk usage now and switch mode if needed (also run periodically).
        Going read-only takes effect at once, before the registration follows (which
        may wait for the metadata store); going writable only once it is registered
        so. A registration that failed is retried at the next check."""
        try:
            want = await self._loop.run_in_executor(None, self._disks_full, self.readonly) or self.forced_readonly
            want = want or self.failure is not None
            if want:
                self.readonly = True
            if self._registration is not None and not self._registration.registered_as(want):
                await self._loop.run_in_executor(None, self._registration.set_readonly, want)
            self.readonly = want
        except Exception:
            log.exception("bookie %s: disk check failed", self.bookie_id, extra=context(bookie=self.bookie_id))

    # -- requests ----------------------------------------------------------------------
    def _dispatch(self, conn: _Connection,
                  req: ReadEntry | ReadRange | ReadLac | WriteLac | GetBookieInfo | AdminRequest) -> None:
        """Every request but ADD_ENTRY (adds are admitted by :meth:`_Connection._pump`
        and go through :meth:`_submit_adds`, a chunk at a time)."""
        published = False
        try:
            if self._stopping:
                raise BookieShutdownError("bookie is stopping", bookie=self.bookie_id)
            if isinstance(req, ReadEntry):
                self._read_entry(conn, req)
            elif isinstance(req, ReadRange):
                self._in_pool(conn, req, self._do_read_range, req)
            elif isinstance(req, ReadLac):
                self._in_pool(conn, req, self._do_read_lac, req)
            elif isinstance(req, WriteLac):
                if self.readonly:
                    raise BookieReadOnlyError("bookie is read-only", bookie=self.bookie_id)
                assert self.bookie is not None
                published = self.bookie.publish_lac(req.ledger_id, req.master_key, req.lac)
                if not published:  # a ledger new to this bookie: its key is journaled first
                    self.bookie.write_lac_cb(req.ledger_id, req.master_key, req.lac, self._on_done,
                                             (_LAC_WRITTEN, conn, req))
            elif isinstance(req, AdminRequest):
                self._in_pool(conn, req, self._do_admin, req)
            else:
                self._in_pool(conn, req, self._do_bookie_info, req)
        except Exception as exc:  # answered, never lost: the connection keeps its count
            conn.respond(_error(_op_of(req), getattr(req, "ledger_id", 0), getattr(req, "entry_id", -1),
                                req.request_id, exc))
            return
        if published:  # no fsync to wait for: answered now (outside the try: answered once)
            assert isinstance(req, WriteLac)
            self._lac_written(conn, req, None)

    def _add_refusal(self, req: AddEntry) -> ErrorResponse:
        """The answer to an add the server's checks refuse (stopping, read-only, adds in
        flight; :meth:`_Connection._pump` makes those checks)."""
        c = self.config
        if self._stopping:
            exc: WalkitError = BookieShutdownError("bookie is stopping", bookie=self.bookie_id)
            self.stats.refused["stopping"] += 1
        elif self.readonly and not req.recovery:
            exc = BookieReadOnlyError("bookie is read-only", bookie=self.bookie_id)
            self.stats.refused["readonly"] += 1
        else:
            exc = BookieBusyError("too many adds in flight", limit=c.max_pending_add_requests,
                                  bytes_limit=c.max_pending_add_bytes)
            self.stats.refused["busy"] += 1
        return _error(Op.ADD_ENTRY, req.ledger_id, req.entry_id, req.request_id, exc)

    def _submit_adds(self, conn: _Connection, adds: list[AddEntry]) -> None:
        """Hand admitted adds to the core in one call; they are answered via
        :meth:`_on_added` (once for those durable together, once per refusal). The
        journal is not woken now: :meth:`_kick_journal` runs once at the end of this
        loop iteration, after every connection that had bytes was read, so the adds of
        all of them share one flush."""
        assert self.bookie is not None
        self.bookie.add_batch_cb(adds, conn.on_added, defer=True)
        if not self._kick_scheduled:
            self._kick_scheduled = True
            self._loop.call_soon(self._kick_journal)

    def _kick_journal(self) -> None:
        """The end of a loop iteration that submitted adds: an idle journal flushes them
        here, on the loop's thread (``journalInlineFlush``; or hands them to its sync
        thread), and what completed is answered at once; a busy journal groups them into
        its next batch (:meth:`bookie.journal.Journal.kick`)."""
        self._kick_scheduled = False
        if self.bookie is None:
            return
        self._kicking = True  # an inline flush's answers: drained and written below, not scheduled
        try:
            self.bookie.kick_journal(self.config.journal_inline_flush)
        finally:
            if self._done:
                self._drain()  # never raises (each completion's failure is logged)
            self._kicking = False
            unflushed, self._unflushed = self._unflushed, []
            for conn in unflushed:
                try:
                    conn._flush()
                except Exception:  # one connection's failure must not keep the others' answers
                    log.exception("writing answers to %s failed", conn.peer, extra=context(bookie=self.bookie_id))

    def _on_added(self, conn: _Connection, err: BaseException | None, reqs: list[AddEntry]) -> None:
        """Journal callback for a group of adds (sync thread, or this thread on a refusal)."""
        self._done.append((_ADD_DONE, conn, reqs, err))
        self._wake_drain()

    def _on_done(self, err: BaseException | None, ctx: Any) -> None:
        """Journal callback of one WRITE_LAC: ``ctx`` is ``(_LAC_WRITTEN, conn, req)``."""
        kind, conn, req = ctx
        self._done.append((kind, conn, req, err))
        self._wake_drain()

    def _wake_drain(self) -> None:
        if self._kicking and threading.get_ident() == self._loop_thread:
            return  # a kick's inline flush: the kick drains at once
        if self._drain_scheduled:  # read without the lock: the drain, which clears the
            return  # flag before it empties the queue, will find this completion
        with self._drain_lock:
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        if threading.get_ident() == self._loop_thread:  # an inline flush, a refusal: no self-pipe
            self._loop.call_soon(self._drain)
        else:
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._drain_lock:
            self._drain_scheduled = False
        done = self._done
        while done:
            kind, conn, req, err = done.popleft()
            try:
                if kind == _ADD_DONE:
                    self._added(conn, req, err)
                else:
                    self._lac_written(conn, req, err)
            except Exception:  # one bad completion must not strand the others
                log.exception("answering a completed request failed")

    def _added(self, conn: _Connection, reqs: list[AddEntry], err: BaseException | None) -> None:
        self._pending_adds -= len(reqs)
        self._pending_add_bytes -= sum([len(req.data) for req in reqs])
        if err is None:
            conn.respond_added(reqs)
            if self._waiters:
                for req in reqs:
                    if req.ledger_id in self._waiters:
                        self._lac_advanced(req.ledger_id, parse_entry_header(req.data).lac)
        else:
            for req in reqs:
                conn.respond(_error(Op.ADD_ENTRY, req.ledger_id, req.entry_id, req.request_id, err))

    def _lac_written(self, conn: _Connection, req: WriteLac, err: BaseException | None) -> None:
        if err is None:
            conn.respond(WriteLacResponse(req.ledger_id, req.request_id))
            if req.ledger_id in self._waiters:
                try:
                    self._lac_advanced(req.ledger_id, req.lac)
                except Exception:  # the WRITE_LAC is answered; a poll left parked times out
                    log.exception("bookie %s: waking the long polls of ledger %d failed", self.bookie_id,
                                  req.ledger_id, extra=context(bookie=self.bookie_id, ledger=req.ledger_id))
        else:
            conn.respond(_error(Op.WRITE_LAC, req.ledger_id, -1, req.request_id, err))

    def _in_pool(self, conn: _Connection, req: Request, fn: Callable[[Any], Response], arg: Any) -> None:
        """Run ``fn(arg)`` on the read pool; its response (or error) goes to ``conn``."""

        def done(fut: Any) -> None:
            try:
                response = fut.result()
            except BaseException as exc:  # every failure becomes an error response
                response = _error(_op_of(req), getattr(req, "ledger_id", 0), getattr(req, "entry_id", -1),
                                  req.request_id, exc)
            self._loop.call_soon_threadsafe(conn.respond, response)

        try:
            self._reads.submit(fn, arg).add_done_callback(done)
        except RuntimeError as exc:  # the pool is shut down: we are stopping
            conn.respond(_error(_op_of(req), 0, -1, req.request_id, exc))

    def _do_read_lac(self, req: ReadLac) -> Response:
        assert self.bookie is not None
        return ReadLacResponse(req.ledger_id, self.bookie.read_lac(req.ledger_id), req.request_id)

    def _do_bookie_info(self, req: GetBookieInfo) -> Response:
        free = total = 0
        seen: set[int] = set()
        for d in self.config.ledger_directories:
            dev = os.stat(d).st_dev
            if dev in seen:
                continue
            seen.add(dev)
            usage = shutil.disk_usage(d)
            free += usage.free
            total += usage.total
        return BookieInfoResponse(free, total, self.readonly, req.request_id)

    def _do_admin(self, req: AdminRequest) -> Response:
        """An operator command (:mod:`bookie._admin`)."""
        assert self.bookie is not None
        result = run_command(self, req.command, req.args)
        return AdminResponse(json.dumps(result).encode(), req.request_id)

    def _do_read_entry(self, req: ReadEntry) -> Response:
        assert self.bookie is not None
        data = self.bookie.read_entry(req.ledger_id, req.entry_id)
        entry_id = parse_entry_header(data).entry_id if req.entry_id < 0 else req.entry_id
        if self.read_hook is not None:
            data = self.read_hook(req.ledger_id, entry_id, data)
        return ReadEntryResponse(req.ledger_id, entry_id, self.bookie.read_lac(req.ledger_id), data, req.request_id)

    def _do_read_range(self, req: ReadRange) -> Response:
        """The stored entries from ``req.first_entry`` on, consecutive: at most ``req.count``
        and ``req.max_bytes`` of entries, in a frame of at most nettyMaxFrameSizeBytes (the
        first entry always: alone too big for a frame, it is answered EIO by
        :meth:`~walkit.protocol.ServerConnection.send`, as a READ_ENTRY of it would be)."""
        assert self.bookie is not None
        max_frame = self.config.netty_max_frame_size_bytes
        entries = self.bookie.read_entries(req.ledger_id, req.first_entry, req.count,
                                           min(req.max_bytes, max_frame - range_response_size(0, 1)))
        if self.read_hook is not None:
            entries = [self.read_hook(req.ledger_id, req.first_entry + i, data) for i, data in enumerate(entries)]
        return ReadRangeResponse(req.ledger_id, req.first_entry, self.bookie.read_lac(req.ledger_id),
                                 _within_frame(entries, max_frame), req.request_id)

    def _read_entry(self, conn: _Connection, req: ReadEntry) -> None:
        if req.fence:
            assert self.bookie is not None

            def fenced(err: BaseException | None, _: Any) -> None:  # sync thread
                if err is None:
                    self._loop.call_soon_threadsafe(self._in_pool, conn, req, self._do_read_entry, req)
                else:
                    self._loop.call_soon_threadsafe(
                        conn.respond, _error(Op.READ_ENTRY, req.ledger_id, req.entry_id, req.request_id, err))

            self.bookie.fence_cb(req.ledger_id, req.master_key, fenced, None)
        elif req.previous_lac is not None:
            self._long_poll(conn, req)
        else:
            response = self._read_from_memory(req)
            if response is not None:
                conn.respond(response)
            else:
                self._in_pool(conn, req, self._do_read_entry, req)

    def _read_from_memory(self, req: ReadEntry) -> Response | None:
        """A READ_ENTRY answered on the loop when memory holds all it needs (an entry read
        ahead or still in its log's buffer: :meth:`~bookie.Bookie.read_memory`); None:
        the read pool answers it."""
        if self.read_hook is not None or req.entry_id < 0 or self.bookie is None:
            return None
        found = self.bookie.read_memory(req.ledger_id, req.entry_id)
        if found is None:
            return None
        return ReadEntryResponse(req.ledger_id, req.entry_id, found[1], found[0], req.request_id)

    # -- long poll ---------------------------------------------------------------------
    # The waiter is registered (on the loop) before the LAC is first read (on the pool),
    # so an advance between the two is never missed; whoever takes the waiter out of
    # ``_waiters`` first (advance, first check, timeout, stop) answers it.

    def _long_poll(self, conn: _Connection, req: ReadEntry) -> None:
        if self._poll_count >= self.config.max_long_polls:
            conn.respond(_error(Op.READ_ENTRY, req.ledger_id, req.entry_id, req.request_id,
                                BookieBusyError("too many long polls", limit=self.config.max_long_polls)))
            return
        waiter = _LongPoll(conn, req, next(self._poll_seq))
        waiters = self._waiters.get(req.ledger_id)
        if waiters is None:
            waiters = self._waiters[req.ledger_id] = SortedKeyList(key=_poll_order)
        waiters.add(waiter)
        conn.waiters.add(waiter)
        self._poll_count += 1

        def checked(fut: Any) -> None:  # pool thread
            try:
                lac = fut.result()
            except WalkitError:
                lac = -1  # a ledger this bookie has not seen yet: wait for its first entry
            self._loop.call_soon_threadsafe(self._first_check, waiter, lac)

        assert self.bookie is not None
        try:
            self._reads.submit(self.bookie.read_lac, req.ledger_id).add_done_callback(checked)
        except RuntimeError:  # the read pool is shut down (stopping): answer as a timeout
            self._poll_expired(waiter)

    def _first_check(self, waiter: _LongPoll, lac: int) -> None:
        """The LAC when the poll arrived: answer now, or start the timeout. (Registered
        before this check, the waiter has not missed an advance in between.)"""
        if waiter.done:
            return
        if lac > waiter.previous:
            self._answer_poll(waiter)
        else:
            timeout = min(waiter.req.timeout_ms, MAX_POLL_TIMEOUT_MS) / 1000.0
            waiter.timer = self._loop.call_later(timeout, self._poll_expired, waiter)

    def _unpark(self, waiter: _LongPoll) -> None:
        waiter.done = True
        if waiter.timer is not None:
            waiter.timer.cancel()
        waiters = self._waiters.get(waiter.req.ledger_id)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[waiter.req.ledger_id]
        waiter.conn.waiters.discard(waiter)
        self._poll_count -= 1

    def _answer_poll(self, waiter: _LongPoll) -> None:
        """Answer a poll whose LAC moved: here when the entry is still in memory (a
        tailing reader's is: just written), else from the read pool."""
        self._unpark(waiter)
        req = waiter.req
        assert self.bookie is not None
        try:
            recent = self.bookie.read_recent(req.ledger_id, req.entry_id)
            if recent is not None:
                entry_id, data, lac = recent
                if self.read_hook is not None:
                    data = self.read_hook(req.ledger_id, entry_id, data)
                answer = ReadEntryResponse(req.ledger_id, entry_id, lac, data, req.request_id)
        except Exception:  # the pool's path answers it, errors included
            recent = None
        if recent is None:
            self._in_pool(waiter.conn, req, self._do_poll_read, req)
            return
        waiter.conn.respond(answer)

    def _do_poll_read(self, req: ReadEntry) -> Response:
        """A long poll's answer once the LAC passed the previous one: the entry the
        poller named (a follower names the one after its previous LAC: the entry it reads
        next, spared a second round trip) when this bookie holds it, else the last entry
        it stores - the LAC is what the poller waits for."""
        if req.entry_id != LAST_ENTRY:
            try:
                return self._do_read_entry(req)
            except NoSuchEntryError:
                pass
        return self._do_read_entry(dataclasses.replace(req, entry_id=LAST_ENTRY))

    def _lac_advanced(self, ledger_id: int, lac: int) -> None:
        """Answer the waiters whose previous LAC is below ``lac`` (the lowest first:
        O(answered · log n))."""
        waiters = self._waiters.get(ledger_id)
        while waiters and waiters[0].previous < lac:
            self._answer_poll(waiters[0])
            waiters = self._waiters.get(ledger_id)

    def _poll_expired(self, waiter: _LongPoll) -> None:
        if not waiter.done:
            self._unpark(waiter)
            self._answer_expired(waiter)

    def _answer_expired(self, waiter: _LongPoll) -> None:
        req = waiter.req
        waiter.conn.respond(_error(Op.READ_ENTRY, req.ledger_id, req.entry_id, req.request_id,
                                   NoSuchEntryError("long poll timed out: the LAC did not pass the previous one",
                                                    ledger=req.ledger_id, previous_lac=req.previous_lac)))

    def _forget_waiters(self, conn: _Connection) -> None:
        for waiter in list(conn.waiters):
            self._unpark(waiter)


def _poll_order(waiter: _LongPoll) -> tuple[int, int]:
    return waiter.previous, waiter.seq


def _op_of(req: Request) -> Op:
    return {AddEntry: Op.ADD_ENTRY, ReadEntry: Op.READ_ENTRY, ReadLac: Op.READ_LAC, WriteLac: Op.WRITE_LAC,
            GetBookieInfo: Op.GET_BOOKIE_INFO, AdminRequest: Op.ADMIN, ReadRange: Op.READ_RANGE}[type(req)]


def _within_frame(entries: list[bytes], max_frame: int) -> tuple[bytes, ...]:
    """The longest prefix of ``entries`` whose READ_RANGE answer fits ``max_frame`` bytes
    (the first entry always)."""
    size = len(entries[0])
    for n in range(1, len(entries)):
        size += len(entries[n])
        if range_response_size(size, n + 1) > max_frame:
            return tuple(entries[:n])
    return tuple(entries)


def _error(op: Op, ledger_id: int, entry_id: int, request_id: int, exc: BaseException) -> ErrorResponse:
    return ErrorResponse(op, status_for(exc), ledger_id, entry_id, str(exc)[:1024], request_id)
