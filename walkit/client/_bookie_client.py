"""One connection to one bookie, with pipelined requests (asyncio).

Each call sends one request frame and awaits its response; many calls may be in flight
at once and their responses may come back in any order (request ids match them).
:meth:`BookieClient.request_cb` is the same without a future: the callback gets
``(response, error, ctx)`` on the loop (what the ledger client's hot paths use), and
:meth:`BookieClient.queue_adds` sends a writer's batch of adds in one call, their EOK
answers handed on in runs (:class:`AckRelay`, walkit/client/_add_batch.py).
Frames written in the same loop iteration go out in one ``transport.write`` (or earlier,
on :meth:`BookieClient.flush`); an ADD_ENTRY's key and entry are not copied into a frame
of their own, only into that write. What the connection sends of its own accord after a
read (WRITE_LACs it held back, or sends again without their LAC body to an older bookie:
:mod:`walkit.protocol._connection`) is written at once. An error
response raises the walkit error of its status (``error_for``); a lost connection fails
every request in flight with :class:`~walkit.errors.BookieUnavailableError`; bytes that
are not the protocol (or another protocol version) fail them with the
:class:`~walkit.errors.ProtocolError` and close the connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from walkit.errors import BookieUnavailableError, FrameTooLargeError, InvalidArgumentError, ProtocolError, WalkitError
from walkit.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    AddEntry,
    AdminRequest,
    AdminResponse,
    BookieInfoResponse,
    ClientConnection,
    ErrorResponse,
    GetBookieInfo,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadLacResponse,
    Request,
    Response,
    WriteLac,
    error_for,
)

__all__ = ["AckRelay", "BookieClient", "ResponseCallback", "client_ssl_context"]

_log = logging.getLogger(__name__)
R = TypeVar("R", bound=Response)
ResponseCallback = Callable[[Response | None, WalkitError | None, Any], None]
"""``(response, None, ctx)`` on success (``(None, None, ctx)`` for an ADD_ENTRY: durable is
all its answer says), ``(None, error, ctx)`` otherwise."""


def _to_future(response: Response | None, error: WalkitError | None, fut: asyncio.Future[Response | None]) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(response)


def client_ssl_context(ca_file: str, *, certificate: str = "", key: str = "") -> ssl.SSLContext:
    """TLS for a client: the bookie's certificate must chain to ``ca_file`` and name the
    host connected to; ``certificate``/``key`` identify the client when bookies ask."""
    if not ca_file:
        raise InvalidArgumentError("a TLS client needs the CA file that signed the bookies' certificates")
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if certificate:
        ctx.load_cert_chain(certificate, key or None)
    return ctx


_READ_CHUNK = 256 * 1024  # bytes one socket read may bring (asyncio's own read size)
_read_buffers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, memoryview] = weakref.WeakKeyDictionary()


def _read_buffer(loop: asyncio.AbstractEventLoop) -> memoryview:
    """The read buffer of every connection on ``loop``: a loop reads one socket at a time,
    and :meth:`_Protocol.buffer_updated` copies out what came before the next read."""
    view = _read_buffers.get(loop)
    if view is None:
        view = _read_buffers[loop] = memoryview(bytearray(_READ_CHUNK))
    return view


#: a writer's run of adds to one bookie: ``(ledger_id, key, recovery, adds)``
AddRun = tuple[int, bytes, bool, Sequence[Any]]


class AddGroups:
    """One pass of the loop over many writers (``ClientCore._send_ready``): per bookie
    connection, the relay of its adds' answers and the list of the writers' runs, for
    :meth:`BookieClient.queue_add_groups` to queue in one call (:meth:`queue`); and, per
    ensemble, the lists of its bookies' runs (None: ``BookiePool.ready`` said one is not
    usable), found once per ensemble rather than once per writer - nothing in a pass,
    which runs on the loop without yielding, changes a connection's state. ``now``: when
    the pass began (``time.monotonic()``), the send time of every add of the pass - a
    pass lasts milliseconds, an add's timeout seconds."""

    __slots__ = ("groups", "ready", "now")

    def __init__(self) -> None:
        self.groups: dict[BookieClient, tuple[AckRelay, list[AddRun]]] = {}
        self.ready: dict[tuple[str, ...], list[list[AddRun]] | None] = {}
        self.now = time.monotonic()

    def runs_of(self, client: BookieClient, relay: AckRelay) -> list[AddRun]:
        """The list gathering the runs to ``client`` (answered to ``relay``)."""
        entry = self.groups.get(client)
        if entry is None:
            entry = self.groups[client] = (relay, [])
        return entry[1]

    def queue(self) -> None:
        """Queue every connection's runs (each writer's in entry order), in one call each."""
        groups, self.groups = self.groups, {}
        self.ready.clear()
        for client, (relay, runs) in groups.items():
            if runs:
                client.queue_add_groups(runs, relay)


class AckRelay:
    """The callback of the adds of :meth:`BookieClient.queue_adds`: ``acked(adds)`` takes
    the adds a bookie acknowledged (EOK) in a row, in the order it answered, once per
    run; any other answer, or a failure, goes to ``one(response, error, add)``
    (:data:`ResponseCallback`), which calling the relay calls."""

    __slots__ = ("acked", "one")

    def __init__(self, acked: Callable[[list[Any]], None], one: ResponseCallback) -> None:
        self.acked = acked
        self.one = one

    def __call__(self, response: Response | None, error: WalkitError | None, ctx: Any) -> None:
        self.one(response, error, ctx)


def _hand_on(relay: AckRelay | None, run: list[Any]) -> list[Any]:
    """``relay.acked(run)``; a fresh list for the next run."""
    assert relay is not None  # a run has the relay of its adds
    try:
        relay.acked(run)
    except Exception:  # one failing callback must not strand the other responses
        _log.exception("response callback failed")
    return []


class _Protocol(asyncio.BufferedProtocol):
    """A connection's reads go into its loop's one read buffer, not into a fresh 256 KiB
    ``bytes`` per read (which malloc serves with mmap + mremap + munmap and page faults:
    three system calls more per answer of a lone writer)."""

    def __init__(self, client: BookieClient) -> None:
        self.client = client
        self._buffer = _read_buffer(client._loop)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (cast, not isinstance: uvloop's are not asyncio.Transport subclasses)
        self.client._transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.client._received(self._buffer[:nbytes].tobytes())

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._lost(BookieUnavailableError("connection to bookie lost", bookie=self.client.address,
                                                 reason=str(exc) if exc else "closed"))


class BookieClient:
    """Use :meth:`connect`; then the request methods; :meth:`close` at the end."""

    def __init__(self, address: str, max_frame_size: int) -> None:
        self.address = address
        self._wire = ClientConnection(max_frame_size)
        # request id -> its callback, and -> its context: two dicts, not a tuple per request
        # (three adds in flight per entry, each a tuple the cyclic GC would track)
        self._pending: dict[int, ResponseCallback] = {}
        self._contexts: dict[int, Any] = {}
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._failure: WalkitError | None = None
        self._loop = asyncio.get_running_loop()

    @classmethod
    async def connect(cls, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                      server_hostname: str | None = None, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                      timeout: float = 10.0) -> BookieClient:
        client = cls(f"{host}:{port}", max_frame_size)
        await client._open(host, port, ssl_context, server_hostname, timeout)
        return client

    async def _open(self, host: str, port: int, ssl_context: ssl.SSLContext | None, server_hostname: str | None,
                    timeout: float) -> None:
        """Open the connection (BookieUnavailableError when it cannot be)."""
        try:
            await asyncio.wait_for(
                self._loop.create_connection(lambda: _Protocol(self), host, port, ssl=ssl_context,
                                             server_hostname=server_hostname if ssl_context else None),
                timeout,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise BookieUnavailableError("cannot connect to bookie", bookie=self.address, reason=str(exc)) from exc

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    # -- requests ----------------------------------------------------------------------
    async def add_entry(self, ledger_id: int, entry_id: int, master_key: bytes, data: bytes,
                        recovery: bool = False) -> None:
        await self._call(AddEntry(ledger_id, entry_id, master_key, data, recovery))

    async def read_entry(self, ledger_id: int, entry_id: int, *, fence: bool = False, master_key: bytes = b"",
                         previous_lac: int | None = None, timeout_ms: int = 0) -> ReadEntryResponse:
        response = await self._call(ReadEntry(ledger_id, entry_id, fence, master_key, previous_lac, timeout_ms))
        assert isinstance(response, ReadEntryResponse)
        return response

    async def read_lac(self, ledger_id: int) -> int:
        response = await self._call(ReadLac(ledger_id))
        assert isinstance(response, ReadLacResponse)
        return response.lac

    async def write_lac(self, ledger_id: int, lac: int, master_key: bytes, body: bytes = b"") -> None:
        """``body``: BookKeeper's LAC body, for its readers' READ_LAC (a bookie that does
        not take one gets the LAC without it)."""
        await self._call(WriteLac(ledger_id, lac, master_key, body=body))

    async def bookie_info(self) -> BookieInfoResponse:
        response = await self._call(GetBookieInfo())
        assert isinstance(response, BookieInfoResponse)
        return response

    async def admin(self, command: str, args: dict[str, Any] | None = None) -> Any:
        """An operator command (``gc.status``, ``gc.run``): its JSON result, decoded."""
        response = await self._call(AdminRequest(command, json.dumps(args or {}).encode()))
        assert isinstance(response, AdminResponse)
        try:
            return json.loads(response.body)
        except ValueError as exc:
            raise ProtocolError("admin answer is not JSON", bookie=self.address, command=command) from exc

    def add_entry_nowait(self, ledger_id: int, entry_id: int, master_key: bytes, data: bytes,
                         recovery: bool = False) -> asyncio.Future[Response | None]:
        """Send an add and return the future of its answer: None once the entry is
        durable (no coroutine per request: what a pipelining caller wants). The future
        fails with the walkit error."""
        return self._send(AddEntry(ledger_id, entry_id, master_key, data, recovery))

    async def _call(self, request: Request) -> Response | None:
        return await self._send(request)

    def _send(self, request: Request) -> asyncio.Future[Response | None]:
        if self._failure is not None:
            raise self._failure
        if self._transport is None or self._transport.is_closing():
            raise BookieUnavailableError("connection to bookie is closed", bookie=self.address)
        fut: asyncio.Future[Response | None] = self._loop.create_future()
        self._queue(request, _to_future, fut)
        return fut

    @property
    def failed(self) -> bool:
        """True once the connection is lost, closed or broken: requests are refused."""
        return self._failure is not None or self._transport is None or self._transport.is_closing()

    def request_cb(self, request: Request, cb: ResponseCallback, ctx: Any) -> None:
        """Send ``request``; ``cb(response, error, ctx)`` later, on the loop, exactly once
        (also when the connection is already gone: then with that error)."""
        if not self.try_request_cb(request, cb, ctx):
            err = self._failure or BookieUnavailableError("connection to bookie is closed", bookie=self.address)
            self._loop.call_soon(cb, None, err, ctx)

    def try_request_cb(self, request: Request, cb: ResponseCallback, ctx: Any) -> bool:
        """:meth:`request_cb` while the connection is usable; False when it is not
        (:attr:`failed`): then nothing is sent and ``cb`` is not called (a pool
        reconnects instead)."""
        transport = self._transport
        if self._failure is not None or transport is None or transport.is_closing():
            return False
        try:
            self._queue(request, cb, ctx)
        except WalkitError as exc:  # e.g. a frame over the maximum: this request only
            self._loop.call_soon(cb, None, exc, ctx)
        return True

    def queue_adds(self, ledger_id: int, key: bytes, recovery: bool, adds: Sequence[Any], relay: AckRelay) -> None:
        """ADD_ENTRYs of ``ledger_id`` for a run of adds (each with ``entry_id`` and
        ``data``: :meth:`ClientConnection.send_adds`), in order, each answered to
        ``relay`` with the add as its context: the acknowledgements of a read in runs
        (``relay.acked``), anything else one by one (``relay(response, error, add)``).
        Only on a usable connection (not :attr:`failed`); ids and key are the caller's
        to check. What :meth:`try_request_cb` of an AddEntry per add does, in one call
        rather than a few per add and bookie."""
        self.queue_add_groups([(ledger_id, key, recovery, adds)], relay)

    def queue_add_groups(self, groups: Sequence[AddRun], relay: AckRelay) -> None:
        """:meth:`queue_adds` for the runs of several ledgers (``(ledger_id, key,
        recovery, adds)`` each, every run in order), in one call: the batches many
        writers took in one pass of the loop (walkit/client/_add_batch.py)."""
        first, refused = self._wire.send_add_groups(groups, self._out)
        adds: list[Any] = []
        for group in groups:
            adds += group[3]
        ids = range(first, first + len(adds))
        self._pending.update(dict.fromkeys(ids, relay))
        self._contexts.update(zip(ids, adds))
        for request_id in refused:  # over the frame limit: that add only fails
            del self._pending[request_id]
            error = FrameTooLargeError("frame over the maximum frame size", type="AddEntry", request_id=request_id,
                                       bookie=self.address)
            self._loop.call_soon(relay, None, error, self._contexts.pop(request_id))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _queue(self, request: Request, cb: ResponseCallback, ctx: Any) -> None:
        if type(request) is AddEntry:  # the hot path: key and entry go out as they are, not in a frame of their own
            request_id, head = self._wire.send_add(request)
            self._out += (head, request.master_key, request.data)
        else:
            request_id, frame = self._wire.send(request)
            self._out.append(frame)
        self._pending[request_id] = cb
        self._contexts[request_id] = ctx
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def flush(self) -> None:
        """Write what is queued now rather than at the loop's next iteration (a writer
        that queued a batch saves an iteration of latency)."""
        if self._out:
            self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self._transport is not None and not self._transport.is_closing():
            out, self._out = self._out, []
            self._transport.write(b"".join(out))

    # -- responses ---------------------------------------------------------------------
    def _received(self, data: bytes) -> None:
        try:
            responses = self._wire.receive_acks(data)
        except ProtocolError as exc:
            self._broken(exc)
            return
        resent = self._wire.data_to_send()  # WRITE_LACs held back or sent again without their bodies
        if resent:
            self._out.append(resent)
            self._flush()
        pending, contexts = self._pending, self._contexts
        run: list[Any] = []  # adds of queue_adds acknowledged in a row: their relay takes them at once
        relay: AckRelay | None = None
        for response in responses:
            if response.__class__ is int:  # an add made durable: nothing to hand on but that
                cb = pending.pop(response, None)
                if cb is None:
                    continue
                if cb is relay:
                    run.append(contexts.pop(response))
                    continue
                if run:
                    run = _hand_on(relay, run)
                if cb.__class__ is AckRelay:
                    relay = cb
                    run.append(contexts.pop(response))
                    continue
                relay = None
                try:
                    cb(None, None, contexts.pop(response))
                except Exception:  # one failing callback must not strand the other responses
                    _log.exception("response callback failed")
                continue
            assert not isinstance(response, int)
            if run:  # answers are handed on in the order they came
                run, relay = _hand_on(relay, run), None
            self._deliver(response.request_id, response)
        if run:
            _hand_on(relay, run)

    def _deliver(self, request_id: int, response: Response | None) -> None:
        """Hand an answer to the callback waiting for ``request_id`` (none waits: dropped):
        an ErrorResponse as its error, None as "done, nothing to tell" (a durable add)."""
        cb = self._pending.pop(request_id, None)
        if cb is None:
            return
        ctx = self._contexts.pop(request_id)
        try:
            if isinstance(response, ErrorResponse):
                cb(None, error_for(response), ctx)
            else:
                cb(response, None, ctx)
        except Exception:  # one failing callback must not strand the other responses
            _log.exception("response callback failed")

    def _lost(self, exc: WalkitError) -> None:
        if self._failure is None:
            self._failure = exc
        pending, contexts = self._pending, self._contexts
        self._pending, self._contexts = {}, {}
        for request_id, cb in pending.items():
            ctx = contexts[request_id]
            try:
                cb(None, exc, ctx)
            except Exception:
                _log.exception("response callback failed")

    def _broken(self, exc: ProtocolError) -> None:
        """The bookie sent bytes its dialect cannot decode: nothing after them can be
        trusted, so every request waiting fails and the connection is closed."""
        self._lost(exc)
        if self._transport is not None:
            self._transport.close()

    async def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._flush()
            self._transport.close()
        self._lost(BookieUnavailableError("client closed", bookie=self.address))
        await asyncio.sleep(0)

    async def __aenter__(self) -> BookieClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
