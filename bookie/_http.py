"""The bookie's admin endpoint: HTTP/1.1 (parsed by h11) on the bookie's own event loop.

Theory of operation
-------------------
With ``httpServerEnabled`` the server (:class:`~bookie.server.BookieServer`) listens on
``httpServerAddress:httpServerPort`` (loopback and 8000 by default) with
:func:`asyncio.start_server`: one coroutine per connection on the loop that serves the
bookie, no thread per request. A request is read whole (request line, headers, a body
of at most 64 KiB by ``Content-Length``), answered, and the connection kept for the
next one (``Connection: close`` or HTTP/1.0 ends it). Whatever may block - the metrics
scrape (walks the ledger directories), the ADMIN commands reused here
(:mod:`bookie._admin`: garbage collection, forced read-only) - runs on the server's read
pool (:attr:`AdminView.read_executor`).

The endpoint sees the server through :class:`AdminView`, the few members its routes read
(it never imports :mod:`bookie.server`); the registry ``/metrics`` serves and the ADMIN
command runner are handed to it by the server (:class:`AdminEndpoint`'s arguments).

=======  =============================  ==================================================
method   path                           answer
=======  =============================  ==================================================
GET      /heartbeat                     200 ``OK``
GET      /metrics                       Prometheus text (:mod:`bookie._metrics`)
GET      /api/v1/bookie/info            id, state, failure, disks, journal mark, version (JSON)
GET|PUT  /api/v1/bookie/state/readonly  ``{"readonly": bool, "forced": bool}``; PUT
                                        ``{"readonly": bool}`` (the operator's word)
GET|PUT  /api/v1/bookie/gc              the collector's status; PUT ``{"compact": null |
                                        "minor" | "major"}`` asks for a pass
GET      /api/v1/autorecovery/status    this bookie's autorecovery daemon (or 404)
=======  =============================  ==================================================

HEAD is answered as GET without the body. Errors are JSON (``{"error": ..., "status":
...}``): 404 for an unknown path, 405 (with ``Allow``) for a wrong method, 400 for a
malformed request or body, 413 for a body too large, 500 with the error's message for a
failure (logged) - never a traceback on the wire.

Transport and its limits
------------------------
The bytes are parsed by h11 (sans-IO: :class:`_Exchange` reads and writes the socket, h11
says what the bytes mean and what may be sent), one request at a time per connection:

* request line and headers: at most ``_MAX_HEAD`` bytes in all (h11's
  ``max_incomplete_event_size``; a client cannot make us buffer more) and ``_MAX_HEADERS``
  lines, else 431. Malformed (h11 refuses it), a version other than 1.0/1.1, a target not
  starting with ``/`` or an HTTP/1.1 request without ``Host``: 400.
* body: by ``Content-Length`` only (``Transfer-Encoding``: 400), at most ``_MAX_BODY``
  bytes, else 413 as soon as the headers say so (the body is not read).
* time: a kept connection waits ``_IDLE`` seconds for the first byte of its next
  request, then is closed without a word. From that first byte the WHOLE request
  (headers and body) must be in within ``_REQUEST_DEADLINE``, however it trickles in,
  else 408: a client dribbling a byte at a time holds a connection that long at most.
  An answer must be taken by the client within ``_SEND_DEADLINE``, else the connection is
  dropped (aborted, whatever was buffered discarded).
* pipelining: requests sent back to back are answered in order, one at a time (h11
  keeps what follows a request for the next cycle; the next request's deadline starts
  when its bytes are already there).
* ``Expect: 100-continue``: ``100 Continue`` is sent when the body is about to be read;
  a request refused before (413, 404...) is answered and the connection closed.
* HTTP/1.0: answered and closed (h11 says so: ``Connection: close``).

Every refusal of the transport is answered (a JSON error and ``Connection: close``), the
connection closed and ONE info line logged - never a traceback. A client gone
mid-request or mid-answer ends its connection quietly (a debug line).

Invariants: each connection is one task that always ends - every wait on the client
has a deadline, and every way out closes the socket and leaves ``_connections`` (what
:meth:`AdminEndpoint.stop` cancels); nothing of a request is acted on before it is
whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from importlib import metadata
from typing import TYPE_CHECKING, Any, Protocol

import h11
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from walkit.errors import InvalidArgumentError, WalkitError

if TYPE_CHECKING:
    from bookie._bookie import Bookie, BookieFailure
    from bookie._config import BookieConfig

__all__ = ["AdminCommands", "AdminEndpoint", "AdminView", "RecoveryDaemon"]

log = logging.getLogger("bookie.http")

_MAX_BODY = 64 << 10
_MAX_HEAD = 16 << 10  # the request line and all the headers, in bytes
_MAX_HEADERS = 100
_READ = 16 << 10  # bytes asked of the socket at a time
_IDLE = 60.0  # seconds a kept connection may wait for the first byte of its next request
_REQUEST_DEADLINE = 15.0  # seconds from a request's first byte to its last
_SEND_DEADLINE = 30.0  # seconds for the client to take an answer
_LINGER = 2.0  # seconds a refused client's last bytes are read (and dropped) before closing
_REASONS = {100: "Continue", 200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 413: "Payload Too Large", 431: "Request Header Fields Too Large",
            500: "Internal Server Error"}


class RecoveryDaemon(Protocol):
    """What ``/api/v1/autorecovery/status`` shows of the bookie's autorecovery daemon
    (:class:`walkit.recovery.AutoRecovery`)."""

    @property
    def owner(self) -> str: ...
    @property
    def marked(self) -> int: ...
    @property
    def repaired(self) -> int: ...
    @property
    def dropped(self) -> int: ...
    @property
    def audits(self) -> int: ...
    @property
    def error(self) -> BaseException | None: ...


class AdminView(Protocol):
    """The server as the admin endpoint's routes see it (:class:`bookie.server.BookieServer`
    is one): its configuration and state, read on the loop or on the read pool."""

    config: BookieConfig

    @property
    def bookie(self) -> Bookie | None:
        """The storage (None before it is open)."""

    @property
    def bookie_id(self) -> str: ...
    @property
    def port(self) -> int:
        """The port bookie clients reach."""

    @property
    def tls(self) -> bool: ...
    @property
    def readonly(self) -> bool:
        """Read-only now (disks full or failed, or on the operator's word)."""

    #: Read-only on the operator's word (the ``bookie.readonly`` ADMIN command sets it).
    forced_readonly: bool

    @property
    def autorecovery(self) -> RecoveryDaemon | None: ...
    @property
    def failure(self) -> BookieFailure | None:
        """The I/O error that made the bookie read-only until restarted, if one did."""

    @property
    def read_executor(self) -> Executor:
        """The pool for work that may block (the bookie's read pool)."""

    def disk_usage_of(self, directory: str) -> float:
        """The fraction of ``directory``'s file system in use."""


#: Runs one ADMIN command (:func:`bookie._admin.run_command` bound to the server): name and
#: JSON arguments in, the JSON-able answer out; blocking (called on the read pool); raises
#: InvalidArgumentError for bad arguments.
AdminCommands = Callable[[str, bytes], dict[str, Any]]


class _HttpError(Exception):
    """An answer other than 200 (``close``: the connection ends after it)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, *,
                 close: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.headers, self.close = status, message, headers or {}, close


class _Gone(Exception):
    """The client closed its side (or reset) before a request was whole or its answer sent."""


_Reply = tuple[int, str, bytes]  # status, content type, body
_Handler = Callable[["AdminEndpoint", bytes], Awaitable[_Reply]]


class AdminEndpoint:
    """The admin endpoint of one server: ``registry`` is what ``/metrics`` serves
    (:func:`bookie._metrics.bookie_registry`), ``commands`` runs the ADMIN commands
    ``/api/v1/bookie/gc`` and ``.../state/readonly`` reuse."""

    def __init__(self, server: AdminView, registry: CollectorRegistry, commands: AdminCommands) -> None:
        self.server = server
        self.registry = registry
        self._commands = commands
        self._listener: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def open_connections(self) -> int:
        """Connections being served now (each one task)."""
        return len(self._connections)

    async def start(self) -> None:
        c = self.server.config
        self._listener = await asyncio.start_server(self._serve, c.http_server_address, c.http_server_port,
                                                    reuse_address=True, limit=_READ)
        self.port = int(self._listener.sockets[0].getsockname()[1])
        log.info("bookie %s admin endpoint on http://%s:%d/", self.server.bookie_id, c.http_server_address, self.port)

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._listener.wait_closed()
            self._listener = None

    # --- connections --------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        exchange = _Exchange(reader, writer)
        try:
            while await self._one(exchange):
                exchange.next_cycle()
        except _Gone as exc:
            log.debug("admin endpoint: %s gone: %s", exchange.peer, exc)
        except asyncio.CancelledError:
            pass
        except Exception:  # a bug here: the connection ends, the endpoint goes on
            log.exception("admin endpoint: connection from %s failed", exchange.peer)
        finally:
            self._connections.discard(task)
            exchange.close()

    async def _one(self, exchange: _Exchange) -> bool:
        """Read one request and answer it; False when the connection is to end."""
        try:
            request = await exchange.receive()
        except _HttpError as exc:  # the transport's refusal: answered, then the connection ends
            log.info("admin endpoint: %s refused (%d): %s", exchange.peer, exc.status, exc.message)
            await exchange.send(exc.status, *_json_error(exc.status, exc.message), {**exc.headers,
                                                                                     "Connection": "close"})
            await exchange.linger()
            return False
        if request is None:
            return False
        method, path, body = request
        try:
            status, content_type, payload = await self._route(method, path, body)
            extra: dict[str, str] = {}
        except _HttpError as exc:
            status, (content_type, payload), extra = exc.status, _json_error(exc.status, exc.message), exc.headers
        except Exception as exc:  # noqa: BLE001 - an answer, never a traceback on the wire
            if not isinstance(exc, WalkitError):
                log.exception("admin endpoint: request failed")
            status, (content_type, payload), extra = 500, _json_error(500, str(exc)), {}
        if status in (400, 413):  # as before h11: a bad request or body ends the connection
            extra = {**extra, "Connection": "close"}
        await exchange.send(status, content_type, payload, extra)
        return exchange.keep_alive

    # --- routes -------------------------------------------------------------------------
    async def _route(self, method: str, path: str, body: bytes) -> _Reply:
        path = path.split("?", 1)[0].rstrip("/") or "/"
        routes = _ROUTES.get(path)
        if routes is None:
            raise _HttpError(404, f"no such path: {path}")
        handler = routes.get("GET" if method == "HEAD" else method)
        if handler is None:
            allowed = ", ".join(sorted(routes))
            raise _HttpError(405, f"{method} not allowed on {path} (allowed: {allowed})", {"Allow": allowed})
        return await handler(self, body)

    async def _off(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.server.read_executor, fn, *args)

    async def _admin(self, command: str, args: dict[str, Any]) -> Any:
        try:
            return await self._off(self._commands, command, json.dumps(args).encode())
        except InvalidArgumentError as exc:
            raise _HttpError(400, str(exc)) from None

    async def heartbeat(self, body: bytes) -> _Reply:
        return 200, "text/plain; charset=utf-8", b"OK\n"

    async def metrics(self, body: bytes) -> _Reply:
        return 200, CONTENT_TYPE_LATEST, await self._off(generate_latest, self.registry)

    async def info(self, body: bytes) -> _Reply:
        return _json(200, await self._off(self._info))

    def _info(self) -> dict[str, Any]:
        server = self.server
        c = server.config
        bookie = server.bookie
        disks = []
        for directory in c.ledger_directories:
            try:
                usage = shutil.disk_usage(directory)
                total, free = usage.total, usage.free
            except OSError:
                total = free = 0
            disks.append({"directory": directory, "usage": round(server.disk_usage_of(directory), 4),
                          "total_bytes": total, "free_bytes": free})
        mark = bookie.journal.last_mark() if bookie is not None else None
        failure = server.failure
        return {
            "id": server.bookie_id,
            "state": "readonly" if server.readonly else "writable",
            "forced_readonly": server.forced_readonly,
            # an I/O error made it read-only until restarted: directory, error, errno, since
            "failed": None if failure is None else failure.describe(),
            "port": server.port,
            "tls": server.tls,
            "ledger_directories": disks,
            "journal": {"directory": c.journal_directory, "usage": round(server.disk_usage_of(c.journal_directory), 4),
                        "mark": None if mark is None else {"journal_id": mark.journal_id, "offset": mark.offset}},
            "autorecovery": server.autorecovery is not None,
            "version": _version(),
        }

    async def readonly(self, body: bytes) -> _Reply:
        if body:  # PUT
            wanted = _json_body(body).get("readonly")
            if type(wanted) is not bool:
                raise _HttpError(400, 'the body must be {"readonly": true} or {"readonly": false}')
            return _json(200, await self._admin("bookie.readonly", {"readonly": wanted}))
        return _json(200, {"readonly": self.server.readonly, "forced": self.server.forced_readonly})

    async def readonly_put(self, body: bytes) -> _Reply:
        if not body:
            raise _HttpError(400, 'the body must be {"readonly": true} or {"readonly": false}')
        return await self.readonly(body)

    async def gc_status(self, body: bytes) -> _Reply:
        return _json(200, await self._admin("gc.status", {}))

    async def gc_run(self, body: bytes) -> _Reply:
        args = _json_body(body) if body else {}
        unknown = set(args) - {"compact"}
        if unknown:
            raise _HttpError(400, f"unknown fields: {', '.join(sorted(unknown))} (known: compact)")
        return _json(200, await self._admin("gc.run", {"compact": args.get("compact")}))

    async def autorecovery(self, body: bytes) -> _Reply:
        daemon = self.server.autorecovery
        if daemon is None:
            raise _HttpError(404, "autorecovery is not running in this bookie (autoRecoveryDaemonEnabled)")
        return _json(200, {"owner": daemon.owner, "marked": daemon.marked, "repaired": daemon.repaired,
                           "dropped": daemon.dropped, "audits": daemon.audits,
                           "error": None if daemon.error is None else str(daemon.error)})


_ROUTES: dict[str, dict[str, _Handler]] = {
    "/heartbeat": {"GET": AdminEndpoint.heartbeat},
    "/metrics": {"GET": AdminEndpoint.metrics},
    "/api/v1/bookie/info": {"GET": AdminEndpoint.info},
    "/api/v1/bookie/state/readonly": {"GET": AdminEndpoint.readonly, "PUT": AdminEndpoint.readonly_put},
    "/api/v1/bookie/gc": {"GET": AdminEndpoint.gc_status, "PUT": AdminEndpoint.gc_run},
    "/api/v1/autorecovery/status": {"GET": AdminEndpoint.autorecovery},
}


# --- HTTP/1.1 on h11: one connection's requests and answers, within the limits ---------------
# h11's refusals, in the words the endpoint has always used (and without echoing the bytes)
_H11_WORDS = (("illegal request line", "malformed request line"), ("no request line", "malformed request line"),
              ("illegal header line", "malformed header"), ("Receive buffer too long",
                                                             f"request line and headers over {_MAX_HEAD} bytes"),
              ("Only Transfer-Encoding", "chunked bodies are not accepted: send Content-Length"),
              ("multiple Transfer-Encoding", "chunked bodies are not accepted: send Content-Length"))


class _Exchange:
    """One client connection: the socket, h11's state of it, the deadlines.

    :meth:`receive` returns whole requests or raises :class:`_HttpError` (answer it with
    :meth:`send`, then close) or :class:`_Gone`; :meth:`send` writes one answer.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD)
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
        deadline = loop.time() + _REQUEST_DEADLINE if self.h11.trailing_data[0] else None
        request: tuple[str, str] | None = None
        body = bytearray()
        while True:
            event = self._next_event()
            if event is h11.NEED_DATA:
                if request is not None and self.h11.they_are_waiting_for_100_continue:
                    await self._write(self.h11.send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")))
                data = await self._read(deadline)
                if data is None:
                    return None  # idle between requests: closed without a word
                if deadline is None:
                    deadline = loop.time() + _REQUEST_DEADLINE
                self._eof = not data
                self.h11.receive_data(data)
            elif isinstance(event, h11.Request):
                self._head = event.method == b"HEAD"
                request = _accept(event)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > _MAX_BODY:  # more than its Content-Length said: h11 would refuse it first
                    raise _HttpError(413, f"body over {_MAX_BODY} bytes")
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                return request[0], request[1], bytes(body)
            else:  # ConnectionClosed between requests
                return None

    def _next_event(self) -> Any:
        try:
            return self.h11.next_event()
        except h11.RemoteProtocolError as exc:
            if self._eof:
                raise _Gone(str(exc)) from None
            said = str(exc)
            message = next((ours for theirs, ours in _H11_WORDS if said.startswith(theirs)), said)
            status = 400 if exc.error_status_hint == 501 else exc.error_status_hint
            raise _HttpError(status, message) from None

    async def _read(self, deadline: float | None) -> bytes | None:
        """Bytes from the client (b"" at its end); None when idle past ``_IDLE`` with no
        request begun. Past the request's deadline: 408."""
        timeout = _IDLE if deadline is None else deadline - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(timeout):
                return await self.reader.read(_READ)
        except TimeoutError:
            if deadline is None:
                return None
            raise _HttpError(408, f"request not whole within {_REQUEST_DEADLINE:g} s") from None
        except ConnectionError as exc:
            raise _Gone(str(exc)) from None

    async def send(self, status: int, content_type: str, body: bytes, headers: dict[str, str]) -> None:
        """Answer the request (``headers`` beyond Content-Type and Content-Length; with
        ``Connection: close`` the connection ends after)."""
        if self._eof or self.h11.our_state is not h11.SEND_RESPONSE and self.h11.our_state is not h11.IDLE:
            return  # nobody to answer, or h11 will not let us (the client broke off)
        fields = [("Content-Type", content_type), ("Content-Length", str(len(body))), *headers.items()]
        data = self.h11.send(h11.Response(status_code=status, headers=fields,
                                          reason=_REASONS.get(status, "Error").encode()))
        if not self._head:
            data += self.h11.send(h11.Data(data=body))
        end = self.h11.send(h11.EndOfMessage())
        await self._write(data + (end or b""))

    async def _write(self, data: bytes) -> None:
        self.writer.write(data)
        try:
            async with asyncio.timeout(_SEND_DEADLINE):
                await self.writer.drain()
        except TimeoutError:
            self.writer.transport.abort()
            raise _Gone(f"answer not taken within {_SEND_DEADLINE:g} s") from None
        except ConnectionError as exc:
            raise _Gone(str(exc)) from None

    async def linger(self) -> None:
        """After a refusal: end our side and read (and drop) what the client still sends -
        at most ``_LINGER`` seconds and ``4 * _MAX_BODY`` bytes - so that closing on unread
        bytes does not reset the connection before the client has read the answer."""
        left = 4 * _MAX_BODY
        try:
            if self.writer.can_write_eof():
                self.writer.write_eof()
            async with asyncio.timeout(_LINGER):
                while not self._eof and left > 0:
                    data = await self.reader.read(_READ)
                    self._eof, left = not data, left - len(data)
        except (TimeoutError, ConnectionError, OSError):
            pass

    def close(self) -> None:
        self.writer.close()


def _accept(request: h11.Request) -> tuple[str, str]:
    """(method, target) of a request the endpoint will read the body of; else 400/413/431."""
    method, target = request.method.decode("ascii", "replace"), request.target.decode("ascii", "replace")
    if request.http_version not in (b"1.0", b"1.1") or not target.startswith("/"):
        raise _HttpError(400, "malformed request line")
    if len(request.headers) > _MAX_HEADERS:
        raise _HttpError(431, f"over {_MAX_HEADERS} headers")
    # h11 checks the cap only while the head is incomplete (it bounds what is buffered); a
    # head that came whole in one read is measured here (its lines without the CRLFs and ": ")
    if len(request.method) + len(request.target) + sum(len(n) + len(v) for n, v in request.headers) > _MAX_HEAD:
        raise _HttpError(431, f"request line and headers over {_MAX_HEAD} bytes")
    for name, value in request.headers:
        if name == b"transfer-encoding":
            raise _HttpError(400, "chunked bodies are not accepted: send Content-Length")
        if name == b"content-length" and int(value) > _MAX_BODY:
            raise _HttpError(413, f"body over {_MAX_BODY} bytes")
    return method, target


def _json_body(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        raise _HttpError(400, "the body is not JSON") from None
    if not isinstance(value, dict):
        raise _HttpError(400, "the body must be a JSON object")
    return value


def _json(status: int, value: Any) -> _Reply:
    return status, "application/json", json.dumps(value, indent=2, sort_keys=True).encode() + b"\n"


def _json_error(status: int, message: str) -> tuple[str, bytes]:
    _, content_type, body = _json(status, {"error": message, "status": status})
    return content_type, body


def _version() -> str:
    try:
        return metadata.version("walkit")
    except metadata.PackageNotFoundError:
        return "unknown"
