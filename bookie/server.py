"""The bookie's network server: walkit's wire protocol over asyncio, on top of :class:`Bookie`.

Theory of operation
-------------------
One event loop thread owns every connection. A connection (:class:`_Connection`, an
``asyncio.Protocol``) feeds the bytes it receives to its sans-IO
:class:`~walkit.protocol.ServerConnection`, which yields requests (or ready-made error
responses for frames it could not accept) and dispatches each:

* ADD_ENTRY goes straight to :meth:`Bookie.add_entry_cb`. The journal's sync thread
  calls back once the entry is durable; callbacks are queued (a deque, thread-safe) and
  the loop is woken once per batch (``call_soon_threadsafe`` only when no drain is
  scheduled yet), so a group commit of a thousand entries costs one wake-up.
* Reads (READ_ENTRY, READ_LAC, GET_BOOKIE_INFO) may touch the disk: they run on a small
  thread pool and answer through the loop.
* A fencing READ_ENTRY first fences (the FENCE record is journaled and synced), then
  reads: once the reader hears the answer, the fence is durable and later normal adds
  are refused with EFENCED; RECOVERY_ADD still passes. WRITE_LAC is journaled like an add.
* A long-poll READ_ENTRY (previous LAC + timeout) waits until the ledger's LAC passes
  the previous one (an add whose entry carries a higher LAC, or a WRITE_LAC) or the
  timeout ends (then ENOENTRY).

Responses are appended to the connection's output list; one ``transport.write`` per
connection per loop iteration carries all of them (coalescing), in completion order -
request ids let the client match them (pipelining, out of order).

Back-pressure and memory: a connection stops reading once it has
``maxPendingRequestsPerConnection`` requests in flight, or when its transport's write
buffer is over the high-water mark (``pause_writing``), and reads again below half of
it; so a connection holds at most that many requests plus one read chunk. Adds beyond
``maxPendingAddRequests`` in flight across all connections are answered
ETOOMANYREQUESTS at once.

Read-only mode: every ``diskCheckInterval`` the fullest ledger disk is compared with
``diskUsageThreshold``; above it the bookie re-registers under ``available/readonly``,
answers adds with EREADONLY (recovery adds still pass: they complete a recovery that
other bookies depend on) and keeps serving reads; it turns writable again once every
ledger disk is below ``diskUsageLwmThreshold``.

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
import json
import logging
import os
import shutil
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bookie._bookie import Bookie
from bookie._config import BookieConfig
from bookie.cookie import Cookie
from bookie.fs import FileSystem
from walkit.errors import (
    BookieBusyError,
    BookieError,
    BookieReadOnlyError,
    CookieError,
    NoSuchEntryError,
    WalkitError,
)
from walkit.protocol import (
    AddEntry,
    AddEntryResponse,
    BookieInfoResponse,
    ErrorResponse,
    GetBookieInfo,
    Op,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadLacResponse,
    Request,
    Response,
    ServerConnection,
    WriteLac,
    WriteLacResponse,
    parse_entry_header,
    status_for,
)

__all__ = ["BookieServer", "server_ssl_context", "disk_usage"]

log = logging.getLogger("bookie.server")

_ADD_DONE = 0
_LAC_WRITTEN = 1


def disk_usage(path: str) -> float:
    """The fraction of the file system of ``path`` in use (0..1)."""
    usage = shutil.disk_usage(path)
    return 1.0 - usage.free / usage.total if usage.total else 1.0


def server_ssl_context(config: BookieConfig) -> ssl.SSLContext:
    """TLS for the server from the PEM files of the configuration."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(config.tls_certificate_path, config.tls_key_store)
    if config.tls_trust_store:
        ctx.load_verify_locations(config.tls_trust_store)
    ctx.verify_mode = ssl.CERT_REQUIRED if config.tls_client_authentication else ssl.CERT_NONE
    return ctx


class _Connection(asyncio.Protocol):
    """One client connection (see the module docstring)."""

    def __init__(self, server: BookieServer) -> None:
        self.server = server
        self.wire = ServerConnection(server.config.netty_max_frame_size_bytes)
        self.transport: asyncio.Transport | None = None
        self.in_flight = 0
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.reading_paused = False
        self.writing_paused = False
        self.closed = False
        self.eof = False
        self.peer = "?"

    # -- asyncio callbacks -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peer = str(transport.get_extra_info("peername"))
        self.server._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server._connections.discard(self)
        self.server._forget_waiters(self)

    def data_received(self, data: bytes) -> None:
        server = self.server
        for item in self.wire.receive(data):
            if isinstance(item, ErrorResponse):
                log.info("bad request from %s: %s", self.peer, item.message)
                self._queue(item)
            else:
                self.in_flight += 1
                server._dispatch(self, item)
        if self.wire.closing:
            self._flush()
            if self.transport is not None:
                self.transport.close()
            return
        if self.in_flight >= server.config.max_pending_requests_per_connection:
            self._pause()

    def eof_received(self) -> bool:
        """The client half-closed: answer what it sent, then close (plaintext only; TLS
        cannot half-close and closes at once)."""
        self.eof = True
        if self.in_flight == 0:
            self._flush()
            return False
        return True

    def pause_writing(self) -> None:
        self.writing_paused = True
        self._pause()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._maybe_resume()

    # -- responses ---------------------------------------------------------------------
    def respond(self, response: Response) -> None:
        """Answer one request (dropped if the connection is gone)."""
        self.in_flight -= 1
        if self.closed:
            return
        self._queue(response)
        if self.eof and self.in_flight == 0:
            self.server._loop.call_soon(self._close_after_flush)
        elif self.reading_paused:
            self._maybe_resume()

    def _close_after_flush(self) -> None:
        self._flush()
        if self.transport is not None:
            self.transport.close()

    def _queue(self, response: Response) -> None:
        self.out.append(self.wire.send(response))
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.server._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.out and self.transport is not None and not self.closed:
            out, self.out = self.out, []
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])
        self.out.clear()

    # -- flow control ------------------------------------------------------------------
    def _pause(self) -> None:
        if not self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()

    def _maybe_resume(self) -> None:
        limit = self.server.config.max_pending_requests_per_connection
        if (self.reading_paused and not self.writing_paused and not self.server._stopping
                and self.in_flight <= limit // 2 and self.transport is not None and not self.closed):
            self.reading_paused = False
            self.transport.resume_reading()

    def stop_reading(self) -> None:
        self._pause()


class _LongPoll:
    __slots__ = ("conn", "req", "timer")

    def __init__(self, conn: _Connection, req: ReadEntry, timer: asyncio.TimerHandle) -> None:
        self.conn = conn
        self.req = req
        self.timer = timer


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
        self.readonly = False
        self._cluster: Any = None  # walkit.metadata.Cluster when metadata is configured
        self._registration: Any = None
        self._connections: set[_Connection] = set()
        self._pending_adds = 0
        self._done: collections.deque[tuple[tuple[int, _Connection, Any], BaseException | None]] = collections.deque()
        self._drain_lock = threading.Lock()
        self._drain_scheduled = False
        self._waiters: dict[int, list[_LongPoll]] = {}
        self._locks: list[int] = []  # flock'ed descriptors of our directories
        self._reads = ThreadPoolExecutor(config.num_read_worker_threads, thread_name_prefix="bookie-read")
        self._server: asyncio.Server | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._stopping = False
        self._stopped = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by start()

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        c = self.config
        self._server = await self._loop.create_server(
            lambda: _Connection(self), host=c.bind_address, port=c.bookie_port, ssl=self._ssl,
            start_serving=False, reuse_address=True,
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        self.bookie_id = c.bookie_id or f"{c.bind_address}:{self.port}"
        self.config = dataclasses.replace(c, bookie_id=self.bookie_id, bookie_port=self.port)
        try:
            await self._loop.run_in_executor(None, self._start_core)
        except BaseException:
            self._server.close()
            await self._loop.run_in_executor(None, self._close_core)
            raise
        self._monitor = self._loop.create_task(self._watch_disks())
        await self._server.start_serving()
        log.info("bookie %s serving on %s:%d (tls: %s, readonly: %s)", self.bookie_id, c.bind_address, self.port,
                 self._ssl is not None, self.readonly)

    def _start_core(self) -> None:
        """Blocking part of start: metadata, core, cookie, registration."""
        c = self.config
        instance_id = None
        if c.metadata_service_uri:
            from walkit.metadata import connect

            self._cluster = connect(c.metadata_service_uri, session_timeout=c.zk_timeout / 1000.0)
            instance_id = self._cluster.info.instance_id
        else:
            log.warning("bookie %s runs without metadata (metadataServiceUri unset): not registered", self.bookie_id)
        if self._fs is None:
            self._lock_directories()
        self.bookie = Bookie(c, fs=self._fs, instance_id=instance_id)
        self.bookie.start()
        self.readonly = self._disks_full(self.readonly)
        if self._cluster is not None:
            self._check_cookie()
            info = json.dumps({"endpoint": f"{c.bind_address}:{self.port}", "tls": self._ssl is not None,
                               "protocol": 1}).encode()
            # waits out the session of a previous incarnation (kill -9, restart) first
            self._registration = self._cluster.register_bookie(
                self.bookie_id, readonly=self.readonly, data=info, on_lost=self._registration_lost)

    def _lock_directories(self) -> None:
        """An exclusive lock on each directory (``<dir>/LOCK``, released when the process
        ends, even by kill -9): a second process started on the same disks by mistake
        stops here, before it touches the journal."""
        c = self.config
        for d in [c.journal_directory, *c.ledger_directories]:
            os.makedirs(d, exist_ok=True)
            fd = os.open(os.path.join(d, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                os.close(fd)
                raise BookieError("directory in use by another bookie process", dir=d) from exc
            self._locks.append(fd)

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
        log.error("bookie %s lost its registration for good, stopping: %s", self.bookie_id, exc)
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self.stop()))

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self, timeout: float = 30.0) -> None:
        """Graceful: stop accepting, deregister, answer every add in flight, shut down."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        if self._server is not None:
            self._server.close()
        if self._monitor is not None:
            self._monitor.cancel()
        for conn in list(self._connections):
            conn.stop_reading()
        await self._loop.run_in_executor(None, self._deregister)
        deadline = self._loop.time() + timeout
        while self._pending_adds and self._loop.time() < deadline:
            await asyncio.sleep(0.01)
        if self._pending_adds:
            log.warning("bookie %s stopping with %d adds unanswered", self.bookie_id, self._pending_adds)
        for ledger_id in list(self._waiters):
            for waiter in self._take(ledger_id, lambda w: True):
                self._answer_expired(waiter)
        await asyncio.sleep(0)  # let the last flushes run
        for conn in list(self._connections):
            conn._flush()
            if conn.transport is not None:
                conn.transport.close()
        await self._loop.run_in_executor(None, self._close_core)
        self._reads.shutdown(wait=True)
        log.info("bookie %s stopped", self.bookie_id)
        self._stopped.set()

    def _deregister(self) -> None:
        if self._registration is not None:
            try:
                self._registration.close()
            except WalkitError:
                log.warning("deregistration failed", exc_info=True)

    def _close_core(self) -> None:
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
    def _disks_full(self, readonly: bool) -> bool:
        """Whether the bookie should be read-only now (hysteresis between the marks)."""
        c = self.config
        usage = max(self._disk_usage(d) for d in c.ledger_directories)
        if not readonly and usage >= c.disk_usage_threshold:
            log.warning("bookie %s: a ledger disk is %.1f%% full (threshold %.1f%%): read-only", self.bookie_id,
                        usage * 100, c.disk_usage_threshold * 100)
            return True
        if readonly and usage < c.disk_usage_lwm_threshold:
            log.info("bookie %s: ledger disks at most %.1f%% full: writable again", self.bookie_id, usage * 100)
            return False
        return readonly

    async def _watch_disks(self) -> None:
        while True:
            await asyncio.sleep(self.config.disk_check_interval / 1000.0)
            await self.check_disks()

    async def check_disks(self) -> None:
        """Check disk usage now and switch mode if needed (also run periodically)."""
        try:
            want = await self._loop.run_in_executor(None, self._disks_full, self.readonly)
            if want != self.readonly:
                if self._registration is not None:
                    await self._loop.run_in_executor(None, self._registration.set_readonly, want)
                self.readonly = want
        except (WalkitError, OSError):
            log.exception("bookie %s: disk check failed", self.bookie_id)

    # -- requests ----------------------------------------------------------------------
    def _dispatch(self, conn: _Connection, req: Request) -> None:
        if isinstance(req, AddEntry):
            self._add(conn, req)
        elif isinstance(req, ReadEntry):
            self._read_entry(conn, req)
        elif isinstance(req, ReadLac):
            self._in_pool(conn, req, self._do_read_lac, req)
        elif isinstance(req, WriteLac):
            assert self.bookie is not None
            self.bookie.write_lac_cb(req.ledger_id, req.master_key, req.lac, self._on_done, (_LAC_WRITTEN, conn, req))
        else:
            self._in_pool(conn, req, self._do_bookie_info, req)

    def _add(self, conn: _Connection, req: AddEntry) -> None:
        if self.readonly and not req.recovery:
            conn.respond(_error(Op.ADD_ENTRY, req.ledger_id, req.entry_id, req.request_id,
                                BookieReadOnlyError("bookie is read-only", bookie=self.bookie_id)))
            return
        if self._pending_adds >= self.config.max_pending_add_requests:
            conn.respond(_error(Op.ADD_ENTRY, req.ledger_id, req.entry_id, req.request_id,
                                BookieBusyError("too many adds in flight", limit=self.config.max_pending_add_requests)))
            return
        assert self.bookie is not None
        self._pending_adds += 1
        self.bookie.add_entry_cb(req.ledger_id, req.entry_id, req.master_key, req.data, req.recovery,
                                 self._on_done, (_ADD_DONE, conn, req))

    def _on_done(self, err: BaseException | None, ctx: Any) -> None:
        """Journal callback (sync thread, or this thread on a refusal)."""
        self._done.append((ctx, err))
        with self._drain_lock:
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._drain_lock:
            self._drain_scheduled = False
        done = self._done
        while done:
            (kind, conn, req), err = done.popleft()
            if kind == _ADD_DONE:
                self._pending_adds -= 1
                if err is None:
                    conn.respond(AddEntryResponse(req.ledger_id, req.entry_id, req.request_id))
                    if self._waiters and req.ledger_id in self._waiters:
                        self._lac_advanced(req.ledger_id, parse_entry_header(req.data).lac)
                else:
                    conn.respond(_error(Op.ADD_ENTRY, req.ledger_id, req.entry_id, req.request_id, err))
            elif err is None:
                conn.respond(WriteLacResponse(req.ledger_id, req.request_id))
                if req.ledger_id in self._waiters:
                    self._lac_advanced(req.ledger_id, req.lac)
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

    def _do_read_entry(self, req: ReadEntry) -> Response:
        assert self.bookie is not None
        data = self.bookie.read_entry(req.ledger_id, req.entry_id)
        entry_id = parse_entry_header(data).entry_id if req.entry_id < 0 else req.entry_id
        return ReadEntryResponse(req.ledger_id, entry_id, self.bookie.read_lac(req.ledger_id), data, req.request_id)

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
            self._in_pool(conn, req, self._do_read_entry, req)

    # -- long poll ---------------------------------------------------------------------
    # The waiter is registered (on the loop) before the LAC is first read (on the pool),
    # so an advance between the two is never missed; whoever takes the waiter out of
    # ``_waiters`` first (advance, first check, timeout, stop) answers it.

    def _long_poll(self, conn: _Connection, req: ReadEntry) -> None:
        timer = self._loop.call_later(req.timeout_ms / 1000.0, self._poll_expired, conn, req)
        waiter = _LongPoll(conn, req, timer)
        self._waiters.setdefault(req.ledger_id, []).append(waiter)

        def checked(fut: Any) -> None:
            try:
                lac = fut.result()
            except WalkitError:
                return  # a ledger this bookie has not seen yet: wait for its first entry
            self._loop.call_soon_threadsafe(self._lac_advanced, req.ledger_id, lac, waiter)

        assert self.bookie is not None
        try:
            self._reads.submit(self.bookie.read_lac, req.ledger_id).add_done_callback(checked)
        except RuntimeError:
            pass  # stopping: stop() answers every waiter

    def _take(self, ledger_id: int, pick: Callable[[_LongPoll], bool]) -> list[_LongPoll]:
        """Remove and return the waiters of ``ledger_id`` that ``pick`` selects."""
        waiters = self._waiters.get(ledger_id)
        if not waiters:
            return []
        taken = [w for w in waiters if pick(w)]
        if taken:
            kept = [w for w in waiters if not pick(w)]
            if kept:
                self._waiters[ledger_id] = kept
            else:
                del self._waiters[ledger_id]
        for waiter in taken:
            waiter.timer.cancel()
        return taken

    def _lac_advanced(self, ledger_id: int, lac: int, only: _LongPoll | None = None) -> None:
        def ready(w: _LongPoll) -> bool:
            previous = w.req.previous_lac
            return (only is None or w is only) and previous is not None and lac > previous

        for waiter in self._take(ledger_id, ready):
            self._in_pool(waiter.conn, waiter.req, self._do_read_entry, waiter.req)

    def _poll_expired(self, conn: _Connection, req: ReadEntry) -> None:
        for waiter in self._take(req.ledger_id, lambda w: w.req is req):
            self._answer_expired(waiter)

    def _answer_expired(self, waiter: _LongPoll) -> None:
        req = waiter.req
        waiter.conn.respond(_error(Op.READ_ENTRY, req.ledger_id, req.entry_id, req.request_id,
                                   NoSuchEntryError("long poll timed out: the LAC did not pass the previous one",
                                                    ledger=req.ledger_id, previous_lac=req.previous_lac)))

    def _forget_waiters(self, conn: _Connection) -> None:
        for ledger_id in list(self._waiters):
            self._take(ledger_id, lambda w: w.conn is conn)


def _op_of(req: Request) -> Op:
    return {AddEntry: Op.ADD_ENTRY, ReadEntry: Op.READ_ENTRY, ReadLac: Op.READ_LAC, WriteLac: Op.WRITE_LAC,
            GetBookieInfo: Op.GET_BOOKIE_INFO}[type(req)]


def _error(op: Op, ledger_id: int, entry_id: int, request_id: int, exc: BaseException) -> ErrorResponse:
    return ErrorResponse(op, status_for(exc), ledger_id, entry_id, str(exc)[:1024], request_id)
