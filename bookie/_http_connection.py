"""One client connection of the bookie's admin endpoint: HTTP/1.1, parsed by h11, within limits.

Theory of operation
-------------------
:class:`HttpConnection` reads whole requests from one client and writes their answers;
the bytes are parsed by h11 (sans-IO: this module reads and writes the socket, h11 says
what the bytes mean and what may be sent). :class:`bookie._http.AdminEndpoint` runs one
per connection: ``receive`` a request, route it, ``send`` the answer, ``next_cycle``,
until ``keep_alive`` is False. One request at a time; the limits, each answered or closed:

* request line and headers: at most ``MAX_HEAD`` bytes in all (h11's
  ``max_incomplete_event_size``; a client cannot make us buffer more) and ``MAX_HEADERS``
  lines, else 431. Malformed (h11 refuses it), a version other than 1.0/1.1, a target not
  starting with ``/`` or an HTTP/1.1 request without ``Host``: 400.
* body: by ``Content-Length`` only (``Transfer-Encoding``: 400), at most ``MAX_BODY``
  bytes, else 413 as soon as the headers say so (the body is not read).
* time: a kept connection waits ``IDLE`` seconds for the first byte of its next
  request, then is closed without a word. From that first byte the WHOLE request
  (headers and body) must be in within ``REQUEST_DEADLINE``, however it trickles in,
  else 408: a client dribbling a byte at a time holds a connection that long at most.
  An answer must be taken by the client within ``SEND_DEADLINE``, else the connection is
  dropped (aborted, whatever was buffered discarded).
* pipelining: requests sent back to back are answered in order, one at a time (h11
  keeps what follows a request for the next cycle; the next request's deadline starts
  when its bytes are already there).
* connections: at most ``MAX_CONNECTIONS`` served at once; one more is answered 503 at
  once (before any of its bytes is read) and closed, so idle or dribbling clients cannot
  pile up descriptors and tasks (:meth:`HttpConnection.turn_away`).
* ``Expect: 100-continue``: ``100 Continue`` is sent when the body is about to be read;
  a request refused on its headers (413, 431...) is answered and the connection closed.
* HTTP/1.0: answered and closed (h11 says so: ``Connection: close``).

A refusal is an :class:`HttpError` from :meth:`HttpConnection.receive`: the endpoint
answers it (a JSON error and ``Connection: close``), lingers (:meth:`~HttpConnection.linger`:
closing on bytes the client still sends would reset the answer away) and closes,
logging ONE info line - never a traceback. A client gone mid-request or
mid-answer is a :class:`ClientGone`: nobody to answer, the connection just ends.

Invariants: every wait on the client has a deadline (``IDLE``, ``REQUEST_DEADLINE``,
``SEND_DEADLINE``, ``LINGER``), so the task serving a connection always ends; at most
``MAX_HEAD`` + ``READ_SIZE`` bytes of a request head and ``MAX_BODY`` of a body are held;
nothing of a request is handed on before it is whole, and after a refusal nothing more
is read as a request (the connection ends).
"""

from __future__ import annotations

import asyncio
import h11

__all__ = ["ClientGone", "HttpConnection", "HttpError", "IDLE", "LINGER", "MAX_BODY", "MAX_CONNECTIONS", "MAX_HEAD",
           "MAX_HEADERS",
           "READ_SIZE", "REASONS", "REQUEST_DEADLINE", "SEND_DEADLINE"]

MAX_BODY = 64 << 10
MAX_HEAD = 16 << 10  # the request line and all the headers, in bytes
MAX_HEADERS = 100
MAX_CONNECTIONS = 64  # served at once; more are answered 503 and closed
READ_SIZE = 16 << 10  # bytes asked of the socket at a time
IDLE = 60.0  # seconds a kept connection may wait for the first byte of its next request
REQUEST_DEADLINE = 15.0  # seconds from a request's first byte to its last
SEND_DEADLINE = 30.0  # seconds for the client to take an answer
LINGER = 2.0  # seconds a refused client's last bytes are read (and dropped) before closing
REASONS = {100: "Continue", 200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 413: "Payload Too Large", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 503: "Service Unavailable"}


class HttpError(Exception):
    """An answer other than 200: a refusal of the transport, or of a route (with extra
    ``headers``, e.g. ``Allow``)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


class ClientGone(Exception):
    """The client closed its side (or reset) before a request was whole or its answer sent."""


# h11's refusals, in the words the endpoint has always used (and without echoing the bytes)
_H11_WORDS = (("illegal request line", "malformed request line"), ("no request line", "malformed request line"),
              ("illegal header line", "malformed header"), ("Receive buffer too long",
                                                             f"request line and headers over {MAX_HEAD} bytes"),
              ("Only Transfer-Encoding", "chunked bodies are not accepted: send Content-Length"),
              ("multiple Transfer-Encoding", "chunked bodies are not accepted: send Content-Length"))


class HttpConnection:
    """One client connection: the socket, h11's state of it, the deadlines.

    :meth:`receive` returns whole requests or raises :class:`HttpError` (answer it with
    :meth:`send`, then close) or :class:`ClientGone`; :meth:`send` writes one answer.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._eof = False
        self._head = False  # the request being answered is a HEAD: no body in the answer

    @property
    def keep_alive(self) -> bool:
        """Whether the connection may carry another request (h11's word, after an answer)."""
        return self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE

    def next_cycle(self) -> None:
        self.h11.start_next_cycle()
        self._head = False

    async def receive(self) -> tuple[str, str, bytes] | None:
        """The next request (method, target, body), whole; None when the client closed or
        stayed idle between requests."""
        loop = asyncio.get_running_loop()
        # bytes of a pipelined request already in: its deadline runs from now
        deadline = loop.time() + REQUEST_DEADLINE if self.h11.trailing_data[0] else None
        request: tuple[str, str] | None = None
        body = bytearray()
        while True:
            event = self._next_event()
            if event is h11.NEED_DATA:
                if request is not None and self.h11.they_are_waiting_for_100_continue:
                    go_on = h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")
                    await self._write(self.h11.send(go_on))
                data = await self._read(deadline)
                if data is None:
                    return None  # idle between requests: closed without a word
                if deadline is None:
                    deadline = loop.time() + REQUEST_DEADLINE
                self._eof = not data
                self.h11.receive_data(data)
            elif isinstance(event, h11.Request):
                self._head = event.method == b"HEAD"
                request = _accept(event)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:  # more than its Content-Length said: h11 would refuse it first
                    raise HttpError(413, f"body over {MAX_BODY} bytes")
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                return request[0], request[1], bytes(body)
            else:  # ConnectionClosed between requests (PAUSED cannot come: each cycle ends at EndOfMessage)
                return None

    def _next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        """h11's next event; its refusal an HttpError (ClientGone when the client has
        closed its side: nobody to answer)."""
        try:
            return self.h11.next_event()
        except h11.RemoteProtocolError as exc:
            if self._eof:
                raise ClientGone(str(exc)) from None
            said = str(exc)
            message = next((ours for theirs, ours in _H11_WORDS if said.startswith(theirs)), said)
            status = 400 if exc.error_status_hint == 501 else exc.error_status_hint
            raise HttpError(status, message) from None

    async def _read(self, deadline: float | None) -> bytes | None:
        """Bytes from the client (b"" at its end); None when idle past ``IDLE`` with no
        request begun. Past the request's deadline: 408."""
        timeout = IDLE if deadline is None else deadline - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(timeout):
                return await self.reader.read(READ_SIZE)
        except TimeoutError:
            if deadline is None:
                return None
            raise HttpError(408, f"request not whole within {REQUEST_DEADLINE:g} s") from None
        except ConnectionError as exc:
            raise ClientGone(str(exc)) from None

    async def send(self, status: int, content_type: str, body: bytes, headers: dict[str, str]) -> None:
        """Answer the request (``headers`` beyond Content-Type and Content-Length; with
        ``Connection: close`` the connection ends after)."""
        if self._eof or self.h11.our_state is not h11.SEND_RESPONSE and self.h11.our_state is not h11.IDLE:
            return  # nobody to answer, or h11 will not let us (the client broke off)
        fields = [("Content-Type", content_type), ("Content-Length", str(len(body))), *headers.items()]
        data = self.h11.send(h11.Response(status_code=status, headers=fields,
                                          reason=REASONS.get(status, "Error").encode()))
        if not self._head:
            data += self.h11.send(h11.Data(data=body))
        end = self.h11.send(h11.EndOfMessage())
        await self._write(data + (end or b""))

    async def _write(self, data: bytes) -> None:
        self.writer.write(data)
        try:
            async with asyncio.timeout(SEND_DEADLINE):
                await self.writer.drain()
        except TimeoutError:
            self.writer.transport.abort()
            raise ClientGone(f"answer not taken within {SEND_DEADLINE:g} s") from None
        except ConnectionError as exc:
            raise ClientGone(str(exc)) from None

    async def turn_away(self, status: int, content_type: str, body: bytes) -> None:
        """Answer ``status`` before reading anything (h11 answers only a request it has
        read, so this one response is written whole here), then linger and end."""
        head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("ascii")
        try:
            await self._write(head + body)
        except ClientGone:
            return
        await self.linger()

    async def linger(self) -> None:
        """After a refusal: end our side and read (and drop) what the client still sends -
        at most ``LINGER`` seconds and ``4 * MAX_BODY`` bytes - so that closing on unread
        bytes does not reset the connection before the client has read the answer."""
        left = 4 * MAX_BODY
        try:
            if self.writer.can_write_eof():
                self.writer.write_eof()
            async with asyncio.timeout(LINGER):
                while not self._eof and left > 0:
                    data = await self.reader.read(READ_SIZE)
                    self._eof, left = not data, left - len(data)
        except (TimeoutError, ConnectionError, OSError):
            pass

    def close(self) -> None:
        self.writer.close()


def _accept(request: h11.Request) -> tuple[str, str]:
    """(method, target) of a request the endpoint will read the body of; else 400/413/431."""
    method, target = request.method.decode("ascii", "replace"), request.target.decode("ascii", "replace")
    if request.http_version not in (b"1.0", b"1.1") or not target.startswith("/"):
        raise HttpError(400, "malformed request line")
    if len(request.headers) > MAX_HEADERS:
        raise HttpError(431, f"over {MAX_HEADERS} headers")
    # h11 checks the cap only while the head is incomplete (it bounds what is buffered); a
    # head that came whole in one read is measured here (its lines without the CRLFs and ": ")
    if len(request.method) + len(request.target) + sum(len(n) + len(v) for n, v in request.headers) > MAX_HEAD:
        raise HttpError(431, f"request line and headers over {MAX_HEAD} bytes")
    for name, value in request.headers:
        if name == b"transfer-encoding":
            raise HttpError(400, "chunked bodies are not accepted: send Content-Length")
        if name == b"content-length" and int(value) > MAX_BODY:
            raise HttpError(413, f"body over {MAX_BODY} bytes")
    return method, target
