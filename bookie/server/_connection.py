"""One client connection: bytes in, requests dispatched under flow control, answers out.

Theory of operation
-------------------
One event loop thread owns every connection. A connection (:class:`Connection`, an
``asyncio.BufferedProtocol``) feeds the bytes it receives to its sans-IO side, which
yields requests (or ready-made error responses for frames it could not accept) and
dispatches each. The sans-IO side starts as a :class:`~walkit.protocol.DialectSniffer`:
the first frame picks the dialect and puts the right object in ``wire``, once -
walkit's :class:`~walkit.protocol.ServerConnection`, or a
:class:`~walkit.protocol.BkServerConnection` for BookKeeper's v3 and v2 (issue 37) -
so every later chunk goes straight to it. Whatever the dialect, the requests are the
same messages and take the same path below; BookKeeper's own ops are answered at once
(FORCE_LEDGER, AUTH: :func:`~bookie.server._answers.answer_at_once`) or read on the
pool (GET_LIST_OF_ENTRIES_OF_LEDGER). The dispatch:

* ADD_ENTRY goes straight to the core: the consecutive adds that one pass of
  :meth:`Connection._pump` admits (:func:`~bookie.server._admission.refusal`, per add)
  are handed over together (:meth:`~bookie.server._writes.Writes.submit_adds`); any other
  request (or a refused add) first submits the adds collected before it, so submission
  order is arrival order.
* WRITE_LAC is published or journaled (:mod:`bookie.server._writes`); a long-poll
  READ_ENTRY is parked (:mod:`bookie.server._long_poll`); every other request is a read
  (:mod:`bookie.server._reads`).

TLS (:mod:`bookie.server._tls`): on a bookie with TLS configured a connection is TLS
from its first byte (walkit's clients) or plain. A plain one may only AUTH and ask for
START_TLS (BookKeeper's clients): the bookie answers EOK, writes it, and upgrades the
connection (:meth:`Connection._start_tls`); the first frame after the handshake picks the
dialect again, since BookKeeper's v2 clients send their START_TLS in v3 and go on in v2.
Any other request on a plain connection is answered EUA (UnauthorizedError) and the
connection closed: configured with TLS, the bookie serves nothing in the clear, client
certificates included when ``tlsClientAuthentication`` asks for them. Without TLS
configured, START_TLS is answered EBADREQ, as BookKeeper's bookie answers it.

Responses are appended to the connection's output list; one ``transport.write`` per
connection per loop iteration carries all of them (coalescing), in completion order -
request ids let the client match them (pipelining, out of order).

Back-pressure and memory: a connection stops reading once it has
``maxPendingRequestsPerConnection`` requests in flight, or when its transport's write
buffer is over the high-water mark (``pause_writing``), and reads again below half of
it; so a connection holds at most that many requests plus one read chunk. Decoded
requests wait in ``backlog`` until :meth:`Connection._pump` dispatches them: at most
``maxPendingRequestsPerConnection`` requests and ``_READS_IN_FLIGHT`` reads in flight,
and only while the answers not yet sent (queued plus the transport's buffer) stay under
the byte budget. Reading pauses whenever the backlog is not empty, so a client that
does not read its answers stops being served. ``in_flight`` counts every request
dispatched and not yet answered: each is answered exactly once (errors included),
which is what keeps the count exact.
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import logging
import ssl
from itertools import islice, repeat
from operator import attrgetter
from typing import Any, Protocol, cast

from bookie import native
from bookie._config import BookieConfig
from bookie._metrics import ServerStats
from bookie.server._admission import AddsInFlight, refusal, refusal_error
from bookie.server._answers import answer_at_once, error_response, failed
from bookie.server._long_poll import LongPoll, LongPolls
from bookie.server._reads import ReadPool
from bookie.server._tls import upgrade
from bookie.server._writes import Writes
from walkit.errors import BookieReadOnlyError, BookieShutdownError, UnauthorizedError
from walkit.logs import context
from walkit.protocol import (
    AddEntry,
    AddEntryResponse,
    AdminRequest,
    AuthMessage,
    BkErrorResponse,
    BkRequest,
    BkResponse,
    DialectSniffer,
    ErrorResponse,
    ForceLedger,
    GetBookieInfo,
    GetListOfEntries,
    Op,
    ReadEntry,
    ReadLac,
    ReadRange,
    Request,
    Response,
    ServerWire,
    StartTls,
    StartTlsResponse,
    WriteLac,
    WireCodec,
    WriteLacResponse,
)

__all__ = ["READ_CHUNK", "Connection", "ConnectionHost"]

log = logging.getLogger("bookie.server")

_BAD_FRAMES = 16  # malformed frames a connection may send before it is closed
_RUN_MIN = 16  # adds in the backlog from which _admitted_run's C loops pay (fewer: the loop is cheaper)
_DATA = attrgetter("data")
_READS_IN_FLIGHT = 32  # reads one connection may have in flight (each may answer a big entry)
READ_CHUNK = 256 * 1024  # bytes one socket read may bring (asyncio's own read size)


def _load_c_wire() -> WireCodec | None:
    """``bookie._frames`` when it has the add hot path in C (``native/walkit_wire.c``),
    else None: not built, an older build, or ``WALKIT_NATIVE=off`` - then every frame is
    cut, and every answer packed, by :class:`~walkit.protocol.ServerConnection`'s Python
    loop, the reference. ``WALKIT_NATIVE=require`` makes a missing extension an error."""
    if native.MODE == "off":
        return None
    try:
        mod = importlib.import_module("bookie._frames")
    except ImportError as exc:
        if native.MODE == "require":
            raise ImportError(f"bookie._frames (walkit's C frame code) is not built: {exc}. Build it with "
                              f"`pip install -e .` (needs a C compiler), or set {native.ENV_VAR}=auto or off") from exc
        return None
    return cast(WireCodec, mod) if hasattr(mod, "cut_adds") and hasattr(mod, "pack_added") else None


#: The C hot path of every walkit-dialect connection (None: Python only).
C_WIRE: WireCodec | None = _load_c_wire()


class ConnectionHost(Protocol):
    """What a connection needs of the server: its settings and the parts that answer."""

    @property
    def config(self) -> BookieConfig: ...

    @property
    def bookie_id(self) -> str: ...

    @property
    def stats(self) -> ServerStats: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def readonly(self) -> bool: ...

    @property
    def loop(self) -> Any: ...

    @property
    def reads(self) -> ReadPool: ...

    @property
    def polls(self) -> LongPolls: ...

    @property
    def writes(self) -> Writes: ...

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The bookie's TLS (None: not configured)."""
        ...


class Connection(asyncio.BufferedProtocol):
    """One client connection (see the module docstring).

    The socket is read into the server's one read buffer (``read_buffer``, shared: the
    loop reads one connection at a time and :meth:`buffer_updated` copies out what came),
    not into a fresh 256 KiB ``bytes`` per read, which malloc serves with mmap + mremap +
    munmap and page faults: three system calls more per request of a lone writer.
    ``open_connections`` is the server's set of them: a connection joins it when made
    (unless the server is stopping or at ``maxConnections``) and leaves it when lost."""

    def __init__(self, host: ConnectionHost, open_connections: set[Connection], read_buffer: memoryview) -> None:
        self.server = host
        self._open = open_connections
        self._read_buffer = read_buffer
        #: the sans-IO side: a DialectSniffer until the first frame puts its dialect's here
        self.wire: ServerWire = DialectSniffer(self._chosen, host.config.netty_max_frame_size_bytes, C_WIRE)
        self.transport: asyncio.Transport | None = None
        self.backlog: collections.deque[Request | BkRequest] = collections.deque()
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
        self.waiters: set[LongPoll] = set()
        #: TLS is configured and this connection is still plain: only AUTH and START_TLS
        self.needs_tls = False
        self.upgrading = False  # START_TLS answered, handshake under way
        self._early: list[bytes] = []  # bytes that came while upgrading (served once upgraded)
        #: The core's callback for this connection's adds (``cb(err, adds)``).
        self.on_added = host.writes.callback_for(self)

    def _chosen(self, wire: ServerWire) -> None:
        """The first frame chose the dialect: ``wire`` serves the connection from now on."""
        self.wire = wire

    # -- asyncio callbacks -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (cast, not isinstance: uvloop's are not asyncio.Transport subclasses)
        self.transport = transport = cast(asyncio.Transport, transport)
        self.peer = str(transport.get_extra_info("peername"))
        server = self.server
        if server.stopping or len(self._open) >= server.config.max_connections:
            log.warning("refusing connection from %s (%s)", self.peer,
                        "stopping" if server.stopping else "too many connections",
                        extra=context(bookie=server.bookie_id))
            transport.abort()
            return
        self.needs_tls = server.ssl_context is not None and transport.get_extra_info("ssl_object") is None
        self._open.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.backlog.clear()
        self._open.discard(self)
        self.server.polls.forget(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        """The loop's read callback: the adds these bytes bring are kicked to the journal,
        and the answers given meanwhile written, at its end when nothing else is ready
        (:meth:`~bookie.server._writes.Writes.read_done`)."""
        writes = self.server.writes
        writes.reading()
        try:
            self.data_received(self._read_buffer[:nbytes].tobytes())
        finally:
            writes.read_done()

    def data_received(self, data: bytes) -> None:
        if self.upgrading:  # the handshake's end brought them: served on the TLS transport
            self._early.append(data)
            return
        self.server.stats.bytes_in += len(data)
        items = self.wire.receive(data)
        if not self.needs_tls and not any(map(isinstance, items, repeat(ErrorResponse))):
            self.backlog.extend(items)  # the usual chunk: requests only (one C loop, not one turn each)
            items = []
        for item in items:
            if self.needs_tls and not isinstance(item, (ErrorResponse, AuthMessage, StartTls)):
                self._refuse_plain(item)
                return
            if isinstance(item, ErrorResponse):
                if type(item) is BkErrorResponse:  # a v3 op not served: BookKeeper answers, never closes
                    self._queue(item)
                    continue
                self.bad_frames += 1
                if self.bad_frames == 1:
                    log.info("bad request from %s: %s", self.peer, item.message)
                self._queue(item)
            else:
                self.backlog.append(item)
        if self.wire.closing or self.bad_frames > _BAD_FRAMES:
            error = getattr(self.wire, "error", None)
            if error is not None:  # a BookKeeper dialect closes on a bad frame, unanswered
                log.info("bad frame from %s, closing: %s", self.peer, error)
            self.close_after_flush()
            return
        self._pump()

    def eof_received(self) -> bool:
        """The client half-closed (or closed): answer what it sent, then close (plaintext
        only; TLS cannot half-close and closes at once)."""
        self.eof = True
        for waiter in list(self.waiters):  # parked polls end now (as if timed out): a
            self.server.polls.expired(waiter)  # client that closed is not waiting for them
        if self.in_flight == 0 and not self.backlog:
            self.flush()
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
        Consecutive adds are admitted here (:func:`~bookie.server._admission.refusal`,
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
        backlog = self.backlog
        unsent = self._unsent()  # changes only when this loop answers something
        while backlog and not self.closed:
            req = backlog[0]
            if self.in_flight >= limit or unsent >= budget:
                break
            if isinstance(req, AddEntry):
                if self._pump_adds(limit):  # a refused add was answered
                    unsent = self._unsent()
                continue
            is_read = not isinstance(req, WriteLac)
            if is_read and self.reads_in_flight >= _READS_IN_FLIGHT:
                break
            backlog.popleft()
            self.in_flight += 1
            if is_read:
                self.reads_in_flight += 1
            self._dispatch(req)
            unsent = self._unsent()
        want_pause = bool(backlog) or server.stopping
        if want_pause != self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = want_pause
            if want_pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def _pump_adds(self, limit: int) -> bool:
        """The run of adds at the head of the backlog, as many as ``limit`` (requests in
        flight) lets in: each admitted or refused as :func:`~bookie.server._admission.refusal`
        decides (its usual verdict - server open, room in flight - tested inline, the
        server's state read once per run: only the loop changes it, and not meanwhile),
        the admitted ones handed to the core in one call. A refused add ends the run: the
        adds before it are submitted first (submission order is arrival order), then it
        is answered; True then (the caller's unsent bytes changed). A pipelined writer's
        usual backlog - a run of adds all admitted - is taken at once
        (:func:`_admitted_run`), with the outcome of this loop."""
        server, backlog = self.server, self.backlog
        c, writes = server.config, server.writes
        max_adds, max_bytes, counts = c.max_pending_add_requests, c.max_pending_add_bytes, writes.in_flight
        stopping, readonly = server.stopping, server.readonly
        open_ = not stopping and not readonly
        room = limit - self.in_flight
        if open_ and len(backlog) >= _RUN_MIN:
            run = _admitted_run(backlog, room, counts, max_adds, max_bytes)
            if run is not None:
                self.in_flight += len(run)
                writes.submit_adds(run, self.on_added)
                return False
        popleft = backlog.popleft
        adds: list[AddEntry] = []
        taken = 0
        reason: str | None = None
        req: Any = None
        while taken < room and backlog and isinstance(backlog[0], AddEntry):
            req = popleft()
            taken += 1
            if not (open_ and counts.count < max_adds and counts.bytes < max_bytes):  # else refusal() is None
                reason = refusal(stopping, readonly, req.recovery, counts, max_adds, max_bytes)
                if reason is not None:
                    break
            counts.count += 1
            counts.bytes += len(req.data)
            adds.append(req)
        self.in_flight += taken
        if adds:
            writes.submit_adds(adds, self.on_added)
        if reason is None:
            return False
        server.stats.refused[reason] += 1
        self.respond(error_response(Op.ADD_ENTRY, req.ledger_id, req.entry_id, req.request_id,
                                    refusal_error(reason, server.bookie_id, c)))
        return True

    def _dispatch(self, req: ReadEntry | ReadRange | ReadLac | WriteLac | GetBookieInfo | AdminRequest
                  | BkRequest) -> None:
        """Every request but ADD_ENTRY (adds are admitted by :meth:`_pump` and go through
        :meth:`~bookie.server._writes.Writes.submit_adds`, a chunk at a time)."""
        server = self.server
        reads = server.reads
        published = False
        try:
            if server.stopping:
                raise BookieShutdownError("bookie is stopping", bookie=server.bookie_id)
            if isinstance(req, ReadEntry):
                if req.fence:
                    reads.fenced_read(self, req)
                elif req.previous_lac is not None:
                    server.polls.park(self, req)
                else:
                    response = reads.from_memory(req)
                    if response is not None:
                        self.respond(response)
                    else:
                        reads.in_pool(self, req, reads.read_entry, req)
            elif isinstance(req, ReadRange):
                reads.in_pool(self, req, reads.read_range, req)
            elif isinstance(req, ReadLac):
                reads.in_pool(self, req, reads.read_lac, req)
            elif isinstance(req, WriteLac):
                if server.readonly:
                    raise BookieReadOnlyError("bookie is read-only", bookie=server.bookie_id)
                published = server.writes.write_lac(self, req)
            elif isinstance(req, AdminRequest):
                reads.in_pool(self, req, reads.admin, req)
            elif isinstance(req, GetBookieInfo):
                reads.in_pool(self, req, reads.bookie_info, req)
            elif isinstance(req, GetListOfEntries):
                reads.in_pool(self, req, reads.entries_of, req)
            elif isinstance(req, StartTls):
                self._start_tls(req)
            elif isinstance(req, (ForceLedger, AuthMessage)):
                self.respond(answer_at_once(req))
            else:
                raise AssertionError(f"no dispatch for {type(req).__name__}")
        except Exception as exc:  # answered, never lost: the connection keeps its count
            self.respond(failed(req, exc))
            return
        if published:  # no fsync to wait for: answered now (outside the try: answered once)
            assert isinstance(req, WriteLac)
            server.writes.lac_published(self, req)

    # -- TLS ---------------------------------------------------------------------------
    def _refuse_plain(self, req: Request | BkRequest) -> None:
        """A request other than AUTH or START_TLS in the clear on a bookie with TLS:
        EUA, and the connection closes."""
        log.info("plain request from %s refused: this bookie serves TLS only", self.peer)
        self._queue(failed(req, UnauthorizedError("this bookie serves TLS only: connect with TLS, or START_TLS "
                                                  "first", bookie=self.server.bookie_id)))
        self.close_after_flush()

    def _start_tls(self, req: StartTls) -> None:
        """EOK, written in the clear, then the handshake on this connection (the module
        docstring); EBADREQ without TLS configured, on a connection already TLS, or with
        other requests in flight (their answers would cross the switch)."""
        tls_context = self.server.ssl_context
        if tls_context is None or not self.needs_tls or self.in_flight > 1 or self.backlog:
            self.respond(answer_at_once(req))
            return
        self.respond(StartTlsResponse(req.request_id))
        self.flush()
        self.upgrading = True
        self.server.loop.create_task(self._upgrade(tls_context))

    async def _upgrade(self, tls_context: ssl.SSLContext) -> None:
        plain = self.transport
        assert plain is not None
        try:
            tls = await upgrade(plain, self, tls_context)
        except (OSError, ssl.SSLError, asyncio.TimeoutError) as exc:
            log.info("TLS handshake (START_TLS) with %s failed: %s", self.peer, exc,
                     extra=context(bookie=self.server.bookie_id))
            self.upgrading = False
            plain.abort()
            if not self.closed:
                self.connection_lost(exc)
            return
        self.transport, self.needs_tls, self.upgrading = tls, False, False
        # BookKeeper's v2 clients go on in v2: the first frame in TLS picks the dialect again
        self.wire = DialectSniffer(self._chosen, self.server.config.netty_max_frame_size_bytes, C_WIRE)
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)
        self.flush()

    def stop_reading(self) -> None:
        """Shutdown: no more requests from this connection (those waiting are dropped)."""
        self.backlog.clear()
        self._pump()

    # -- responses ---------------------------------------------------------------------
    def respond(self, response: Response | BkResponse) -> None:
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
            self.server.loop.call_soon(self.close_after_flush)
        elif self.backlog or self.reading_paused:
            self._pump()

    def close_after_flush(self) -> None:
        """Write what is queued, then close."""
        self.flush()
        if self.transport is not None:
            self.transport.close()

    def _queue(self, response: Response | BkResponse) -> None:
        self._queue_frame(self.wire.send(response))

    def _queue_frame(self, frame: bytes) -> None:
        self.out.append(frame)
        self.out_bytes += len(frame)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            if not self.server.writes.write_later(self):  # else: at the end of the kick or read under way
                self.server.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write every answer queued, in one ``transport.write`` (kept while a START_TLS
        handshake is under way: written in TLS once it is done)."""
        self.flush_scheduled = False
        if self.upgrading:
            return
        out, self.out, self.out_bytes = self.out, [], 0
        if out and self.transport is not None and not self.closed:
            data = b"".join(out) if len(out) > 1 else out[0]
            self.server.stats.bytes_out += len(data)
            self.transport.write(data)
        if self.backlog:
            self._pump()


def _admitted_run(backlog: collections.deque[Any], room: int, counts: AddsInFlight, max_adds: int,
                  max_bytes: int) -> list[AddEntry] | None:
    """(The server open) The adds at the head of ``backlog``, at most ``room``, taken
    off it and counted in flight, when :meth:`Connection._pump_adds`'s loop would admit
    every one of them - each finds fewer than ``max_adds`` adds and ``max_bytes`` bytes
    in flight before it - with C loops (no turn per add); else None, nothing taken."""
    head = list(islice(backlog, max(room, 0)))
    is_add = list(map(isinstance, head, repeat(AddEntry)))
    if not all(is_add):
        head = head[: is_add.index(False)]
    n = len(head)
    if n == 0:
        return None
    sizes = list(map(len, map(_DATA, head)))
    last = sizes.pop()  # an add's own bytes do not count for it: those before it do
    before = sum(sizes)
    if counts.count + n - 1 >= max_adds or counts.bytes + before >= max_bytes:
        return None  # one of them is refused: the loop finds which
    counts.count += n
    counts.bytes += before + last
    if n == len(backlog):
        backlog.clear()
    else:
        popleft = backlog.popleft
        for _ in repeat(None, n):
            popleft()
    return head


_WRITE_OPS = frozenset({Op.ADD_ENTRY, Op.WRITE_LAC})


def _answers_write(response: Response | BkResponse) -> bool:
    if isinstance(response, ErrorResponse):
        return response.op in _WRITE_OPS
    return isinstance(response, (AddEntryResponse, WriteLacResponse))
