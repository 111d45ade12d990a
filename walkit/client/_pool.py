"""One pooled, pipelined connection per bookie, with reconnect (client loop only).

A bookie is named by its id; :class:`BookiePool` resolves the id to the endpoint the
bookie registered (``available/<id>`` or ``available/readonly/<id>``: JSON
``{"endpoint": "host:port", "tls": bool}`` in a walkit cluster, BookKeeper's service info
in a BookKeeper one, :func:`parse_endpoint`), connects once - in walkit's protocol, or to an
Apache BookKeeper bookie (kind "bookkeeper") in BookKeeper's dialect
(:class:`~walkit.client._bk_bookie_client.BkBookieClient`) - and sends every request for
that bookie down the same connection (:meth:`BookiePool.request_each`: to several at
once, as a writer sends an entry to its write set). Requests made while the connection
is being opened wait for it; a failed connect fails them with
:class:`~walkit.errors.BookieUnavailableError`. A lost connection is dropped from the
pool, so the next request opens a new one (the endpoint is resolved again: a restarted
bookie may have moved). TLS: to a walkit bookie that registered with TLS, from the first
byte; to an Apache BookKeeper bookie, START_TLS first whenever the client has a CA
(``tls_ca_file``), as BookKeeper's client decides by its own configuration
(:func:`uses_tls`).
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from walkit.client._bk_bookie_client import BkBookieClient
from walkit.client._bookie_client import BookieClient, ResponseCallback, client_ssl_context
from walkit.client._config import ClientConfig
from walkit.errors import BookieUnavailableError, FormatError, WalkitError
from walkit.metadata import ClusterFormat, decode_service_info
from walkit.protocol import DEFAULT_MAX_FRAME_SIZE, Dialect, Request, Response

__all__ = ["Answered", "BookiePool", "BookieKind", "BOOKIE_KINDS", "Endpoint", "connect_endpoint", "parse_endpoint", "uses_tls"]


class Answered(Protocol):
    """What :meth:`BookiePool.request_each` tells of each bookie's answer."""

    def answered(self, bookie: str, response: Response | None, error: WalkitError | None) -> None: ...


def _relay(bookie: str, response: Response | None, error: WalkitError | None, target: Answered) -> None:
    target.answered(bookie, response, error)


# What a bookie speaks: walkit's own protocol (a walkit bookie, which also serves
# BookKeeper's dialects), or only BookKeeper's (an Apache BookKeeper bookie: the client
# speaks the BookKeeper dialect its configuration names, v3 by default).
BookieKind = Literal["walkit", "bookkeeper"]
BOOKIE_KINDS: tuple[BookieKind, ...] = ("walkit", "bookkeeper")


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    tls: bool = False
    kind: BookieKind = "walkit"


def parse_endpoint(bookie_id: str, registration: bytes | None, cluster_format: ClusterFormat = "walkit") -> Endpoint:
    """The endpoint a bookie registered in a cluster of ``cluster_format``
    (:mod:`walkit.metadata._service_info`): in a walkit cluster, JSON; in a BookKeeper
    one, BookKeeper's service info, whose ``bookie-rpc`` endpoint is the address and
    whose ``walkit.protocol`` property makes the bookie a walkit one (kind "walkit"; kind
    "bookkeeper" without it: a Java bookie). Without a registration, the id read as
    ``host:port`` (the default id; a BookKeeper legacy bookie). BookieUnavailableError
    when neither works."""
    try:
        info = decode_service_info(cluster_format, bookie_id, registration)
    except FormatError as exc:
        if registration:
            raise BookieUnavailableError("unreadable bookie registration", bookie=bookie_id,
                                         format=cluster_format) from exc
        raise BookieUnavailableError("bookie is not registered and its id is not host:port", bookie=bookie_id) from exc
    return Endpoint(info.host, info.port, info.tls, "walkit" if info.walkit else "bookkeeper")


def uses_tls(endpoint: Endpoint, have_ca: bool) -> bool:
    """Whether a connection to ``endpoint`` is TLS: a walkit bookie's registration says so
    (TLS from the first byte); toward an Apache BookKeeper bookie the client's own
    configuration does, as BookKeeper's client decides (a CA file given: START_TLS first,
    whatever the registration's ``tls`` extension says). The one rule for every
    connection walkit opens to a bookie (the client's pool, re-replication)."""
    if endpoint.kind == "walkit":
        return endpoint.tls
    return have_ca


async def connect_endpoint(endpoint: Endpoint, ssl_context: ssl.SSLContext | None = None, *,
                           max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, timeout: float = 10.0,
                           v2: bool = False) -> BookieClient:
    """A connection to ``endpoint`` in what it speaks: walkit's protocol, or BookKeeper's
    dialect (v3, or v2 with ``v2``: ``use_v2_wire_protocol``) for kind "bookkeeper"; TLS
    with ``ssl_context`` (which :func:`uses_tls` decides), the host name checked. The one
    way every part of walkit (the client's pool, re-replication) opens one."""
    hostname = endpoint.host if ssl_context else None
    if endpoint.kind == "bookkeeper":
        return await BkBookieClient.connect(endpoint.host, endpoint.port, ssl_context=ssl_context,
                                            server_hostname=hostname, max_frame_size=max_frame_size, timeout=timeout,
                                            dialect=Dialect.BK_V2 if v2 else Dialect.BK_V3)
    return await BookieClient.connect(endpoint.host, endpoint.port, ssl_context=ssl_context,
                                      server_hostname=hostname, max_frame_size=max_frame_size, timeout=timeout)


Resolver = Callable[[str], Awaitable[Endpoint]]


class BookiePool:
    def __init__(self, config: ClientConfig, resolve: Resolver) -> None:
        self._config = config
        self._resolve = resolve
        self._clients: dict[str, BookieClient] = {}
        self._connecting: dict[str, list[tuple[Request, ResponseCallback, Any]]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._relays: dict[str, ResponseCallback] = {}  # bookie -> its answers' relay to request_each's target

    @property
    def connecting(self) -> bool:
        """Whether a connection to some bookie is being made."""
        return bool(self._connecting)

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            c = self._config
            self._ssl = client_ssl_context(c.tls_ca_file, certificate=c.tls_certificate, key=c.tls_key)
        return self._ssl

    def request_cb(self, bookie: str, request: Request, cb: ResponseCallback, ctx: Any) -> None:
        """Send ``request`` to ``bookie``; ``cb(response, error, ctx)`` exactly once."""
        client = self._clients.get(bookie)
        if client is not None and not client.failed:
            client.request_cb(request, cb, ctx)
            return
        waiting = self._connecting.get(bookie)
        if waiting is not None:
            waiting.append((request, cb, ctx))
            return
        if self._closed:
            asyncio.get_running_loop().call_soon(cb, None, BookieUnavailableError("client closed", bookie=bookie), ctx)
            return
        self._clients.pop(bookie, None)
        self._connecting[bookie] = [(request, cb, ctx)]
        task = asyncio.get_running_loop().create_task(self._connect(bookie))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def request_each(self, bookies: Iterable[str], request: Request, target: Answered) -> None:
        """:meth:`request_cb` to each of ``bookies``; each answer (or failure) is
        ``target.answered(bookie, response, error)``, once per bookie. A writer's path:
        one call per entry, an ADD_ENTRY frame per bookie that only differs in its
        header, and nothing made per request (the relay to the target is the bookie's own)."""
        clients, relays = self._clients, self._relays
        for bookie in bookies:
            relay = relays.get(bookie)
            if relay is None:
                relay = relays[bookie] = functools.partial(_relay, bookie)
            client = clients.get(bookie)
            if client is None or not client.try_request_cb(request, relay, target):
                self.request_cb(bookie, request, relay, target)  # connects (again)

    def ready(self, bookies: Iterable[str]) -> list[BookieClient] | None:
        """The open connections to ``bookies``, in their order, when each is a usable
        connection in walkit's protocol (:meth:`BookieClient.queue_adds` takes a writer's
        batch); None otherwise (one not connected yet, lost, or an Apache BookKeeper
        bookie's): then requests go one by one (:meth:`request_each`), which connects."""
        clients = self._clients
        ready: list[BookieClient] = []
        for bookie in bookies:
            client = clients.get(bookie)
            if client is None or client.__class__ is not BookieClient or client.failed:
                return None
            ready.append(client)
        return ready

    def flush(self, bookies: Iterable[str]) -> None:
        """Write what is queued for ``bookies`` now (see :meth:`BookieClient.flush`)."""
        clients = self._clients
        for bookie in bookies:
            client = clients.get(bookie)
            if client is not None:
                client.flush()

    async def _open(self, endpoint: Endpoint, ctx: ssl.SSLContext | None) -> BookieClient:
        c = self._config
        return await connect_endpoint(endpoint, ctx, max_frame_size=c.max_frame_size, timeout=c.connect_timeout,
                                      v2=c.use_v2_wire_protocol)

    async def _connect(self, bookie: str) -> None:
        error: WalkitError | None = None
        client: BookieClient | None = None
        try:
            endpoint = await self._resolve(bookie)
            ctx = self._ssl_context() if uses_tls(endpoint, bool(self._config.tls_ca_file)) else None
            client = await self._open(endpoint, ctx)
        except WalkitError as exc:
            error = exc
        except (OSError, ssl.SSLError) as exc:
            error = BookieUnavailableError("cannot connect to bookie", bookie=bookie, reason=str(exc))
        except BaseException:  # cancelled (client closing) or a bug: the waiters still hear back
            for _, cb, ctx_ in self._connecting.pop(bookie, []):
                cb(None, BookieUnavailableError("connection attempt abandoned", bookie=bookie), ctx_)
            raise
        waiting = self._connecting.pop(bookie, [])
        if client is not None and self._closed:
            await client.close()
            client, error = None, BookieUnavailableError("client closed", bookie=bookie)
        if client is not None:
            self._clients[bookie] = client
            for request, cb, ctx_ in waiting:
                client.request_cb(request, cb, ctx_)
            return
        assert error is not None
        for _, cb, ctx_ in waiting:
            cb(None, error, ctx_)

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()
