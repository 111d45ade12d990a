"""One connection to an Apache BookKeeper bookie, in BookKeeper's v3 or v2 dialect (asyncio).

Theory of operation. :class:`BkBookieClient` is the second implementation of what
:class:`~walkit.client.BookieClient` offers the pool (``request_cb``,
``try_request_cb``, ``flush``, ``failed``, ``close`` and the awaitable request
methods): the pool picks it for a bookie whose registration says ``kind
"bookkeeper"`` (:class:`~walkit.client._pool.Endpoint`), in the dialect the client's
``use_v2_wire_protocol`` names (v3 by default, as BookKeeper's
``useV2WireProtocol``). It keeps the walkit connection's socket handling, pipelining
and failure rules (a lost connection fails every request in flight with
BookieUnavailableError; bytes that are not the dialect fail them with the
ProtocolError and close it) and swaps only the wire: requests are spelled and answers
matched by the sans-IO :class:`~walkit.protocol._bk_client.BkClientConnection`, and an
error status becomes the walkit error the walkit connection gives for it
(:func:`walkit.protocol.error_for`). The layers above cannot tell the two apart.

Opening. BookKeeper's Java client, with authentication off (its default,
``AuthDisabledPlugin``), counts a connection as authenticated as soon as it is open and
sends no AUTH request; so does this one (a bookie that wants authentication answers
EUA: UnauthorizedError). With TLS (an ``ssl_context``: the client's ``tls_ca_file``,
and its certificate if it has one) the connection opens in the clear, as BookKeeper's
does, and its first request is START_TLS, in v3 whatever the dialect (BookKeeper's v2
clients send it so too); on the bookie's EOK the same connection runs the TLS handshake
(``loop.start_tls``, the bookie as TLS server, its certificate checked against the CA
and the host name) and then speaks the dialect inside TLS. A bookie that refuses
START_TLS, a handshake that fails (a certificate the CA did not sign, a client without
the certificate the bookie requires) or takes longer than the connect timeout is
BookieUnavailableError naming TLS, with the cause; nothing else is sent before it.

What v2 lacks. v2 has no long poll: a long-poll read is served here by polling - a read
of the bookie's last entry (entry -1) every :data:`V2_POLL_INTERVAL` seconds until its
LAC passes the poll's ``previous_lac`` or the poll's time is up - and answered as a long
poll is (the LAC, and the entry when it is the one asked for). WRITE_LAC, READ_LAC,
GET_BOOKIE_INFO (v3-only in BookKeeper) are refused without being sent, each with a
ProtocolError that names the dialect; a READ_LAC is read as BookKeeper's v2 clients read
the LAC (the last entry's header, its digest checked by the reader's entry codec), and a
refused WRITE_LAC only means the LAC rides on the next entry. A READ_RANGE is v2's
BATCH_READ_ENTRY; in v3, which has no batch read, it is refused, and so are walkit's admin
commands in both (a refused READ_RANGE makes the reader read entry by entry).

Which entries the bookie stores. :meth:`BkBookieClient.entries_of` asks BookKeeper's
GET_LIST_OF_ENTRIES_OF_LEDGER (v3 only, as BookKeeper; re-replication's ``present``)
and reads the AvailabilityOfEntriesOfLedger bytes of the answer
(:func:`walkit.protocol.decode_availability`; bytes that are none: ProtocolError).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any, cast

from walkit.client._bookie_client import BookieClient, ResponseCallback
from walkit.errors import (
    BookieUnavailableError,
    InvalidArgumentError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ProtocolError,
    WalkitError,
)
from walkit.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    AddEntryResponse,
    BkClientConnection,
    Dialect,
    GetListOfEntries,
    ListOfEntriesResponse,
    decode_availability,
    ReadEntry,
    ReadEntryResponse,
    Request,
    Response,
)

__all__ = ["BkBookieClient", "V2_POLL_INTERVAL"]

_log = logging.getLogger(__name__)

#: seconds between two reads of a bookie's last entry while a long poll waits in v2
V2_POLL_INTERVAL = 0.02


class BkBookieClient(BookieClient):
    """Use :meth:`connect` (with the dialect); then as a :class:`BookieClient`."""

    def __init__(self, address: str, max_frame_size: int, dialect: Dialect = Dialect.BK_V3) -> None:
        super().__init__(address, max_frame_size)
        self._bk = BkClientConnection(dialect, max_frame_size)
        self._polls: set[asyncio.Task[None]] = set()
        self._tls_answer: asyncio.Future[None] | None = None  # START_TLS sent, EOK awaited

    @classmethod
    async def connect(cls, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                      server_hostname: str | None = None, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                      timeout: float = 10.0, dialect: Dialect = Dialect.BK_V3) -> BkBookieClient:
        client = cls(f"{host}:{port}", max_frame_size, dialect)
        await client._open(host, port, ssl_context, server_hostname, timeout)
        return client

    async def _open(self, host: str, port: int, ssl_context: ssl.SSLContext | None, server_hostname: str | None,
                    timeout: float) -> None:
        await super()._open(host, port, None, None, timeout)  # TLS, if any, starts inside (START_TLS)
        if ssl_context is not None:
            try:
                await self._start_tls(ssl_context, server_hostname or host, timeout)
            except BaseException:
                await super().close()
                raise

    async def _start_tls(self, context: ssl.SSLContext, hostname: str, timeout: float) -> None:
        """START_TLS, its EOK, the handshake; BookieUnavailableError naming TLS otherwise."""
        plain = self._transport
        assert plain is not None
        self._tls_answer = self._loop.create_future()
        plain.write(self._bk.start_tls())
        try:
            await asyncio.wait_for(self._tls_answer, timeout)
            tls = await self._loop.start_tls(plain, plain.get_protocol(), context, server_hostname=hostname,
                                             ssl_handshake_timeout=timeout)
        except (WalkitError, OSError, ssl.SSLError, asyncio.TimeoutError) as exc:
            raise BookieUnavailableError("TLS with the bookie failed (START_TLS)", bookie=self.address,
                                         reason=str(exc) or type(exc).__name__) from exc
        finally:
            self._tls_answer = None
        if tls is None:
            raise BookieUnavailableError("TLS with the bookie failed (START_TLS): connection closed",
                                         bookie=self.address)
        self._transport = tls  # typed, not asserted: uvloop's transports are not asyncio.Transport's subclasses

    def _lost(self, exc: WalkitError) -> None:
        if self._tls_answer is not None and not self._tls_answer.done():
            self._tls_answer.set_exception(exc)
        super()._lost(exc)

    @property
    def dialect(self) -> Dialect:
        return self._bk.dialect

    async def entries_of(self, ledger_id: int) -> list[int]:
        """The ids of the entries of ``ledger_id`` the bookie stores, ascending
        (NoSuchLedgerError: it has none of the ledger)."""
        # the one request (and answer) outside walkit's Request/Response unions: it goes
        # through the same pipeline, and only this method sends it and reads its answer
        response: object = await self._call(cast(Request, GetListOfEntries(ledger_id)))
        assert isinstance(response, ListOfEntriesResponse)
        try:
            return sorted(decode_availability(response.availability))
        except InvalidArgumentError as exc:
            raise ProtocolError("unreadable list of entries", bookie=self.address, ledger=ledger_id) from exc

    # -- requests out ------------------------------------------------------------------
    def _queue(self, request: Request, cb: ResponseCallback, ctx: Any) -> None:
        if self._bk.v2 and type(request) is ReadEntry and request.previous_lac is not None:
            task = self._loop.create_task(self._poll(request, cb, ctx))
            self._polls.add(task)
            task.add_done_callback(self._polls.discard)
            return
        request_id, frame = self._bk.send(request)  # a refusal raises: that request's answer
        self._out.append(frame)
        self._pending[request_id] = cb
        self._contexts[request_id] = ctx
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    async def _poll(self, poll: ReadEntry, cb: ResponseCallback, ctx: Any) -> None:
        """A v2 long poll, by polling the bookie's last entry (module docstring);
        ``cb`` exactly once."""
        deadline = self._loop.time() + poll.timeout_ms / 1000
        previous = poll.previous_lac if poll.previous_lac is not None else -1
        response: Response | None = None
        error: WalkitError | None = None
        try:
            while True:
                response, error = None, None
                try:
                    response = await self._send(ReadEntry(poll.ledger_id, -1))
                except WalkitError as exc:
                    error = exc
                if isinstance(response, ReadEntryResponse) and response.lac > previous:
                    break
                absent = isinstance(error, (NoSuchEntryError, NoSuchLedgerError))
                if (error is not None and not absent) or self._loop.time() >= deadline:
                    break
                await asyncio.sleep(min(V2_POLL_INTERVAL, max(0.0, deadline - self._loop.time())))
        except asyncio.CancelledError:
            response, error = None, BookieUnavailableError("client closed", bookie=self.address)
        if isinstance(response, ReadEntryResponse) and response.entry_id != poll.entry_id:
            response = ReadEntryResponse(response.ledger_id, response.entry_id, response.lac, b"", response.request_id)
        try:
            cb(response, error, ctx)
        except Exception:
            _log.exception("response callback failed")

    # -- answers in --------------------------------------------------------------------
    def _received(self, data: bytes) -> None:
        if self._tls_answer is not None:
            self._tls_received(data)
            return
        try:
            answers = self._bk.receive(data)
        except ProtocolError as exc:
            self._broken(exc)
            return
        for request_id, response in answers:  # durable is all an add's answer says
            self._deliver(request_id, None if isinstance(response, AddEntryResponse) else cast(Response, response))

    def _tls_received(self, data: bytes) -> None:
        """Bytes while START_TLS waits for its EOK (:meth:`_start_tls`)."""
        assert self._tls_answer is not None
        if self._tls_answer.done():
            return
        try:
            if self._bk.tls_started(data):
                self._tls_answer.set_result(None)
        except ProtocolError as exc:
            self._tls_answer.set_exception(exc)

    async def close(self) -> None:
        polls = list(self._polls)
        for task in polls:
            task.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
        await super().close()
