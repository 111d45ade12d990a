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

The HTTP/1.1 transport - h11, one request at a time per connection, the limits against
malformed, oversized, slow and pipelined requests - is :mod:`bookie._http_connection`.
Each connection is one task in ``_connections`` (what :meth:`AdminEndpoint.stop`
cancels), which always ends: the transport's every wait on the client has a deadline,
and every way out of :meth:`AdminEndpoint._serve` closes the socket and leaves the set.
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

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from bookie import _http_connection as limits
from bookie._http_connection import READ_SIZE, ClientGone, HttpConnection, HttpError
from walkit.errors import InvalidArgumentError, WalkitError

if TYPE_CHECKING:
    from bookie._bookie import Bookie, BookieFailure
    from bookie._config import BookieConfig

__all__ = ["AdminCommands", "AdminEndpoint", "AdminView", "RecoveryDaemon"]

log = logging.getLogger("bookie.http")


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
                                                    reuse_address=True, limit=READ_SIZE)
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
        connection = HttpConnection(reader, writer)
        crowded = len(self._connections) >= limits.MAX_CONNECTIONS
        self._connections.add(task)  # a turned-away one too: stop() ends it like the others
        try:
            if crowded:
                log.info("admin endpoint: %s turned away: %d connections open", connection.peer, limits.MAX_CONNECTIONS)
                await connection.turn_away(503, *_json_error(503, f"over {limits.MAX_CONNECTIONS} connections open"))
                return
            while await self._one(connection):
                connection.next_cycle()
        except ClientGone as exc:
            log.debug("admin endpoint: %s gone: %s", connection.peer, exc)
        except asyncio.CancelledError:
            pass
        except Exception:  # a bug here: this connection ends, the endpoint goes on
            log.exception("admin endpoint: connection from %s failed", connection.peer)
        finally:
            self._connections.discard(task)
            connection.close()

    async def _one(self, connection: HttpConnection) -> bool:
        """Read one request and answer it; False when the connection is to end."""
        try:
            request = await connection.receive()
        except HttpError as exc:  # the transport's refusal: answered, then the connection ends
            log.info("admin endpoint: %s refused (%d): %s", connection.peer, exc.status, exc.message)
            closing = {**exc.headers, "Connection": "close"}
            await connection.send(exc.status, *_json_error(exc.status, exc.message), closing)
            await connection.linger()
            return False
        if request is None:
            return False
        method, path, body = request
        try:
            status, content_type, payload = await self._route(method, path, body)
            extra: dict[str, str] = {}
        except HttpError as exc:
            status, (content_type, payload), extra = exc.status, _json_error(exc.status, exc.message), exc.headers
        except Exception as exc:  # noqa: BLE001 - an answer, never a traceback on the wire
            if not isinstance(exc, WalkitError):
                log.exception("admin endpoint: request failed")
            status, (content_type, payload), extra = 500, _json_error(500, str(exc)), {}
        if status in (400, 413):  # as before h11: a bad request or body ends the connection
            extra = {**extra, "Connection": "close"}
        await connection.send(status, content_type, payload, extra)
        return connection.keep_alive

    # --- routes -------------------------------------------------------------------------
    async def _route(self, method: str, path: str, body: bytes) -> _Reply:
        path = path.split("?", 1)[0].rstrip("/") or "/"
        routes = _ROUTES.get(path)
        if routes is None:
            raise HttpError(404, f"no such path: {path}")
        handler = routes.get("GET" if method == "HEAD" else method)
        if handler is None:
            allowed = ", ".join(sorted(routes))
            raise HttpError(405, f"{method} not allowed on {path} (allowed: {allowed})", {"Allow": allowed})
        return await handler(self, body)

    async def _off(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.server.read_executor, fn, *args)

    async def _admin(self, command: str, args: dict[str, Any]) -> Any:
        try:
            return await self._off(self._commands, command, json.dumps(args).encode())
        except InvalidArgumentError as exc:
            raise HttpError(400, str(exc)) from None

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
                raise HttpError(400, 'the body must be {"readonly": true} or {"readonly": false}')
            return _json(200, await self._admin("bookie.readonly", {"readonly": wanted}))
        return _json(200, {"readonly": self.server.readonly, "forced": self.server.forced_readonly})

    async def readonly_put(self, body: bytes) -> _Reply:
        if not body:
            raise HttpError(400, 'the body must be {"readonly": true} or {"readonly": false}')
        return await self.readonly(body)

    async def gc_status(self, body: bytes) -> _Reply:
        return _json(200, await self._admin("gc.status", {}))

    async def gc_run(self, body: bytes) -> _Reply:
        args = _json_body(body) if body else {}
        unknown = set(args) - {"compact"}
        if unknown:
            raise HttpError(400, f"unknown fields: {', '.join(sorted(unknown))} (known: compact)")
        return _json(200, await self._admin("gc.run", {"compact": args.get("compact")}))

    async def autorecovery(self, body: bytes) -> _Reply:
        daemon = self.server.autorecovery
        if daemon is None:
            raise HttpError(404, "autorecovery is not running in this bookie (autoRecoveryDaemonEnabled)")
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


def _json_body(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        raise HttpError(400, "the body is not JSON") from None
    if not isinstance(value, dict):
        raise HttpError(400, "the body must be a JSON object")
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
