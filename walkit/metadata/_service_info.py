"""What a bookie's registration node holds, in either cluster format: its service info.

Theory of operation
-------------------
A registration node (``<root>/available[/readonly]/<bookie id>``, :mod:`._registration`)
carries the bookie's service info, which the metadata layer stores without reading it.
Its bytes depend on the cluster's format (:attr:`ClusterInfo.format`):

* ``walkit``: UTF-8 JSON ``{"endpoint": "<host>:<port>", "tls": <bool>, "protocol":
  <wire version>}`` (docs/format.md, "The metadata tree"); an optional ``"kind":
  "bookkeeper"`` names an Apache BookKeeper bookie (walkit bookies never write it);
* ``bookkeeper``: BookKeeper 4.18's binary ``BookieServiceInfoFormat``
  (:class:`~walkit.metadata._bk_records.BookieServiceInfo`), as a Java bookie writes it:
  endpoint ``bookie`` (protocol ``bookie-rpc``: the data port, which BookKeeper's client
  resolves a bookie id to), endpoint ``httpserver`` (protocol ``http``) when the admin
  endpoint is on, and properties. A bookie serving TLS lists the extension ``tls`` on its
  ``bookie-rpc`` endpoint, as BookKeeper's ``BookieService`` does (its clients decide
  TLS by their own configuration; the extension tells a reader). A walkit bookie adds
  :data:`WALKIT_PROTOCOL` (its wire version) and :data:`WALKIT_TLS` ("true"/"false":
  walkit's clients start TLS with the connection; BookKeeper's clients reach the same
  port by START_TLS); Java clients ignore properties, walkit clients read the first one
  as "this bookie speaks walkit's protocol". Empty data is what bookies before 4.12
  wrote: the id is the address.

:func:`encode_service_info` makes the bytes a bookie registers; :func:`decode_service_info`
reads any of them back into a :class:`ServiceInfo` (host, port, TLS, walkit or not).
Decoding raises :class:`~walkit.errors.FormatError` with context; nothing here does I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from walkit.errors import FormatError, InvalidArgumentError
from walkit.metadata._bk_records import BookieServiceInfo
from walkit.metadata._bk_records import Endpoint as BkEndpoint
from walkit.metadata._cluster import ClusterFormat

__all__ = ["ServiceInfo", "WALKIT_PROTOCOL", "WALKIT_TLS", "encode_service_info", "decode_service_info",
           "split_address"]

#: The property that marks a walkit bookie in a BookKeeper-format registration (value:
#: its wire protocol version).
WALKIT_PROTOCOL = "walkit.protocol"
#: "true" when the walkit bookie's port speaks TLS from the first byte.
WALKIT_TLS = "walkit.tls"
RPC_ENDPOINT_ID, RPC_PROTOCOL = "bookie", "bookie-rpc"
#: The ``bookie-rpc`` endpoint's extension of a bookie serving TLS (BookieService.publishInfo).
TLS_EXTENSION = "tls"
HTTP_ENDPOINT_ID, HTTP_PROTOCOL = "httpserver", "http"


@dataclass(frozen=True)
class ServiceInfo:
    """Where a bookie takes requests, and what it speaks there (``walkit``: walkit's own
    protocol, besides BookKeeper's dialects; False: an Apache BookKeeper bookie; ``tls``:
    it serves TLS - from the first byte for walkit's protocol, by START_TLS for BookKeeper's)."""

    host: str
    port: int
    tls: bool = False
    walkit: bool = True


def split_address(address: str, **context: object) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port); FormatError if it is not one."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise FormatError("not a host:port address", address=address[:100], **context)
    return host.strip("[]"), int(port)


def encode_service_info(cluster_format: ClusterFormat, endpoint: str, *, tls: bool, protocol: int,
                        http: tuple[str, int] | None = None) -> bytes:
    """The registration bytes of a walkit bookie serving at ``endpoint`` (``host:port``),
    with its admin endpoint at ``http`` (host, port; BookKeeper format only)."""
    if cluster_format == "walkit":
        return json.dumps({"endpoint": endpoint, "tls": tls, "protocol": protocol}).encode()
    if cluster_format != "bookkeeper":
        raise InvalidArgumentError("unknown cluster format", format=cluster_format)
    try:
        host, port = split_address(endpoint)
    except FormatError as exc:
        raise InvalidArgumentError("a bookie's endpoint must be host:port", endpoint=endpoint) from exc
    endpoints = [BkEndpoint(RPC_ENDPOINT_ID, port, host, RPC_PROTOCOL, extensions=(TLS_EXTENSION,) if tls else ())]
    if http is not None:
        endpoints.append(BkEndpoint(HTTP_ENDPOINT_ID, http[1], http[0], HTTP_PROTOCOL))
    properties = ((WALKIT_PROTOCOL, str(protocol)), (WALKIT_TLS, "true" if tls else "false"))
    return BookieServiceInfo(tuple(endpoints), properties).encode()


def decode_service_info(cluster_format: ClusterFormat, bookie_id: str, data: bytes | None) -> ServiceInfo:
    """Where ``bookie_id`` takes requests, from its registration ``data`` (None or empty:
    the id is ``host:port``). FormatError when the data cannot be read or names no address."""
    if cluster_format == "bookkeeper":
        return _decode_bookkeeper(bookie_id, data or b"")
    if not data:
        return ServiceInfo(*split_address(bookie_id, bookie=bookie_id, why="no registration data"))
    try:
        info = json.loads(data)
        address, tls = str(info["endpoint"]), bool(info.get("tls", False))
        kind = info.get("kind", "walkit")  # "bookkeeper": an Apache BookKeeper bookie listed by hand
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FormatError("unreadable walkit bookie registration", bookie=bookie_id) from exc
    if kind not in ("walkit", "bookkeeper"):
        raise FormatError("bookie registration names an unknown kind", bookie=bookie_id, kind=str(kind)[:40])
    return ServiceInfo(*split_address(address, bookie=bookie_id), tls=tls, walkit=kind == "walkit")


def _decode_bookkeeper(bookie_id: str, data: bytes) -> ServiceInfo:
    if not data:  # a bookie before 4.12: BookKeeper reads the id as the address
        return ServiceInfo(*split_address(bookie_id, bookie=bookie_id, why="legacy registration"), walkit=False)
    info = BookieServiceInfo.decode(data)
    rpc = next((e for e in info.endpoints if e.protocol == RPC_PROTOCOL), None)
    if rpc is None:  # as BookKeeper's own client: such a bookie cannot be reached
        raise FormatError("BookKeeper registration has no bookie-rpc endpoint", bookie=bookie_id,
                          endpoints=",".join(e.protocol for e in info.endpoints))
    if not rpc.host or not 0 < rpc.port < 65536:
        raise FormatError("BookKeeper registration: bad bookie-rpc endpoint", bookie=bookie_id, host=rpc.host,
                          port=rpc.port)
    properties = dict(info.properties)
    walkit = WALKIT_PROTOCOL in properties
    tls = properties.get(WALKIT_TLS) == "true" if walkit else TLS_EXTENSION in rpc.extensions
    return ServiceInfo(rpc.host.strip("[]"), rpc.port, tls=tls, walkit=walkit)
