"""The bookie's admin endpoint: HTTP/1.1 on the bookie's own event loop.

Theory of operation
-------------------
With ``httpServerEnabled`` the server (:class:`~bookie.server.BookieServer`) listens on
``httpServerAddress:httpServerPort`` (loopback and 8000 by default) with
:func:`asyncio.start_server`: one coroutine per connection on the loop that serves the
bookie, no thread per request. A request is read whole (request line, headers, a body
of at most 64 KiB by ``Content-Length``), answered, and the connection kept for the
next one (``Connection: close`` ends it). Whatever may block - the metrics scrape
(walks the ledger directories), the ADMIN commands reused here (:mod:`bookie._admin`:
garbage collection, forced read-only) - runs on the server's read pool.

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

Errors are JSON (``{"error": ..., "status": ...}``): 404 for an unknown path, 405 (with
``Allow``) for a wrong method, 400 for a malformed request or body, 413 for a body too
large, 500 with the error's message for a failure (logged) - never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from bookie._admin import run_command
from bookie._metrics import bookie_registry
from walkit.errors import InvalidArgumentError, WalkitError

if TYPE_CHECKING:
    from bookie.server import BookieServer

__all__ = ["AdminEndpoint"]

log = logging.getLogger("bookie.http")

_MAX_BODY = 64 << 10
_MAX_HEADERS = 100
_LINE = 8192
_IDLE = 60.0  # seconds a kept connection may wait for its next request
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
            413: "Payload Too Large", 500: "Internal Server Error"}


class _HttpError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


_Reply = tuple[int, str, bytes]  # status, content type, body
_Handler = Callable[["AdminEndpoint", bytes], Awaitable[_Reply]]


class AdminEndpoint:
    def __init__(self, server: BookieServer) -> None:
        self.server = server
        self.registry = bookie_registry(server)
        self._listener: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> None:
        c = self.server.config
        self._listener = await asyncio.start_server(self._serve, c.http_server_address, c.http_server_port,
                                                    reuse_address=True, limit=_LINE)
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
        try:
            while True:
                keep = await self._one(reader, writer)
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request and answer it; False when the connection is to end."""
        try:
            line = await asyncio.wait_for(reader.readline(), _IDLE)
        except asyncio.TimeoutError:
            return False
        except ValueError:  # a line past the limit
            await _send(writer, 400, *_json_error(400, "request line too long"), close=True)
            return False
        if not line:
            return False
        keep = True
        try:
            method, path, version = _request_line(line)
            headers = await _headers(reader)
            keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
            body = await _body(reader, headers)
            status, content_type, payload = await self._route(method, path, body)
            extra: dict[str, str] = {}
        except _HttpError as exc:
            status, (content_type, payload), extra = exc.status, _json_error(exc.status, exc.message), exc.headers
            keep = keep and exc.status not in (400, 413)
        except Exception as exc:  # noqa: BLE001 - an answer, never a traceback on the wire
            if not isinstance(exc, WalkitError):
                log.exception("admin endpoint: request failed")
            status, (content_type, payload), extra = 500, _json_error(500, str(exc)), {}
        await _send(writer, status, content_type, payload, close=not keep, headers=extra,
                    head_only=line.startswith(b"HEAD "))
        return keep

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
        return await asyncio.get_running_loop().run_in_executor(self.server._reads, fn, *args)

    async def _admin(self, command: str, args: dict[str, Any]) -> Any:
        try:
            return await self._off(run_command, self.server, command, json.dumps(args).encode())
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


# --- HTTP/1.1, the little of it an admin endpoint needs --------------------------------------
def _request_line(line: bytes) -> tuple[str, str, str]:
    try:
        method, path, version = line.decode("ascii").rstrip("\r\n").split(" ")
    except (UnicodeDecodeError, ValueError):
        raise _HttpError(400, "malformed request line") from None
    if version not in ("HTTP/1.0", "HTTP/1.1") or not path.startswith("/"):
        raise _HttpError(400, "malformed request line")
    return method, path, version


async def _headers(reader: asyncio.StreamReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADERS):
        try:
            line = await asyncio.wait_for(reader.readline(), _IDLE)
        except ValueError:
            raise _HttpError(400, "header line too long") from None
        if line in (b"\r\n", b"\n", b""):
            return headers
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep or not name.strip():
            raise _HttpError(400, "malformed header")
        headers[name.strip().lower()] = value.strip()
    raise _HttpError(400, "too many headers")


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "transfer-encoding" in headers:
        raise _HttpError(400, "chunked bodies are not accepted: send Content-Length")
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise _HttpError(400, "bad Content-Length") from None
    if length < 0:
        raise _HttpError(400, "bad Content-Length")
    if length > _MAX_BODY:
        raise _HttpError(413, f"body over {_MAX_BODY} bytes")
    return await asyncio.wait_for(reader.readexactly(length), _IDLE) if length else b""


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


async def _send(writer: asyncio.StreamWriter, status: int, content_type: str, body: bytes, *, close: bool,
                headers: dict[str, str] | None = None, head_only: bool = False) -> None:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}", f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if close:
        lines.append("Connection: close")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else body))
    await writer.drain()


def _version() -> str:
    try:
        return metadata.version("walkit")
    except metadata.PackageNotFoundError:
        return "unknown"
