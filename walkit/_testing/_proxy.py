"""A loopback TCP proxy in front of one bookie, which a test can partition and heal.

Theory of operation
-------------------
The bookie registers the proxy's address as its endpoint (``ServerHooks.endpoint``,
:mod:`bookie.server`), so every client connection to it goes through the proxy: one accepted connection
(downstream, the client's side) and one connection to the bookie (upstream) per link,
and bytes copied both ways.

:meth:`PartitionableProxy.partition` makes the network between the clients and the
bookie silent, as a partition that drops packets would: every link stops reading on both
sides, so nothing more is delivered either way and no connection is closed (no RST, no
FIN: a peer learns nothing but silence, and its timeouts fire). New connections are still
accepted by the kernel (the client's connect succeeds) but are not connected to the
bookie and carry nothing: requests on them hang too. :meth:`~PartitionableProxy.heal`
resumes reading, so what was sent meanwhile is delivered late, as TCP retransmission
would deliver it (the byte stream is never cut, so the protocol framing stays intact),
and held connections are connected to the bookie. A side that closed during the
partition is noticed then, and the close is passed on.

Flow control: a side whose peer's write buffer is full stops being read until it drains
(``pause_writing`` / ``resume_writing``), so the proxy holds at most one buffer per
direction. Everything runs on one event loop (the caller's :class:`asyncio` loop);
methods must be called on it.

uvloop (issue 38): its transports start reading once ``connection_made`` has returned,
undoing a ``pause_reading`` made in it (asyncio's honour it). So a client side may read
a chunk before its bookie side is up: those bytes are held (``_Side.held``) and written
to the bookie side first when it connects, and the side's reading state is applied again
in the loop's next iteration (``connection_made``), so at most a chunk or two is held.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

__all__ = ["PartitionableProxy"]

log = logging.getLogger("walkit.testing")

HOST = "127.0.0.1"


class _Side(asyncio.Protocol):
    """One TCP connection of a link (the client's or the bookie's)."""

    def __init__(self, link: _Link) -> None:
        self.link = link
        self.transport: asyncio.Transport | None = None
        self.peer_full = False  # the other side's write buffer is over its high-water mark
        self.held: list[bytes] = []  # (the client's side) bytes read before the bookie's side was up

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (cast, not isinstance: uvloop's are not asyncio.Transport subclasses)
        self.transport = cast(asyncio.Transport, transport)
        self.link.made(self)
        # again once the transport reads: uvloop's starts reading after this returns
        self.link.proxy.loop.call_soon(self.update_reading)

    def data_received(self, data: bytes) -> None:
        peer = self.link.peer_of(self)
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        else:  # no bookie side yet (uvloop read before the pause took): for when it connects
            self.held.append(data)

    def eof_received(self) -> bool | None:
        return None  # close this side; connection_lost passes the close on

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.lost(self)

    def pause_writing(self) -> None:
        peer = self.link.peer_of(self)
        if peer is not None:
            peer.peer_full = True
            peer.update_reading()

    def resume_writing(self) -> None:
        peer = self.link.peer_of(self)
        if peer is not None:
            peer.peer_full = False
            peer.update_reading()

    def update_reading(self) -> None:
        """Read while the link is open for traffic and the peer can take more."""
        want = self.link.flowing and not self.peer_full
        if self.transport is None or self.transport.is_closing() or want == self.transport.is_reading():
            return
        if want:
            self.transport.resume_reading()
        else:
            self.transport.pause_reading()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # after what is buffered for it is written


class _Link:
    """A client connection and, once connected, its bookie connection."""

    def __init__(self, proxy: PartitionableProxy) -> None:
        self.proxy = proxy
        self.down = _Side(self)
        self.up: _Side | None = None
        self.connecting = False
        self.closed = False

    @property
    def flowing(self) -> bool:
        return not self.proxy.partitioned and self.up is not None and self.up.transport is not None

    def peer_of(self, side: _Side) -> _Side | None:
        return self.up if side is self.down else self.down

    def made(self, side: _Side) -> None:
        if self.closed:  # the bookie side came up after the client left
            side.close()
        elif side is self.down:
            self.down.update_reading()  # nothing to forward to yet: hold the client's bytes
            if not self.proxy.partitioned:
                self.connect()
        else:
            assert side.transport is not None
            for data in self.down.held:  # what the client sent before this side was up, first
                side.transport.write(data)
            self.down.held.clear()
            self.update()

    def connect(self) -> None:
        """Open the bookie side (once; not while partitioned)."""
        if self.connecting or self.up is not None or self.closed:
            return
        self.connecting = True
        self.proxy.loop.create_task(self._connect())

    async def _connect(self) -> None:
        up = _Side(self)
        self.up = up
        try:
            await self.proxy.loop.create_connection(lambda: up, HOST, self.proxy.target_port)
        except OSError as exc:  # the bookie is down: the client sees its connection close
            log.debug("proxy :%d -> :%d: %s", self.proxy.port, self.proxy.target_port, exc)
            self.up = None
            self.lost(self.down)
        finally:
            self.connecting = False

    def update(self) -> None:
        """Apply the proxy's state: connect a held link, pause or resume both sides."""
        if self.closed:
            return
        if not self.proxy.partitioned:
            self.connect()
        self.down.update_reading()
        if self.up is not None:
            self.up.update_reading()

    def lost(self, side: _Side) -> None:
        """One side closed: close the other (after its buffered bytes) and forget the link."""
        self.closed = True
        self.down.close()
        if self.up is not None:
            self.up.close()
        self.proxy.links.discard(self)


class PartitionableProxy:
    """Forwards ``127.0.0.1:<port>`` to ``127.0.0.1:<target_port>`` until partitioned.

    Create and use it on one event loop: ``await start()``, then :meth:`partition`,
    :meth:`heal`, and ``await close()``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.partitioned = False
        self.links: set[_Link] = set()
        self.loop = asyncio.get_running_loop()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await self.loop.create_server(self._accept, HOST, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def _accept(self) -> _Side:
        link = _Link(self)
        self.links.add(link)
        return link.down

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def partition(self) -> None:
        self.partitioned = True
        self._update()

    def heal(self) -> None:
        self.partitioned = False
        self._update()

    def _update(self) -> None:
        for link in list(self.links):
            link.update()

    async def close(self) -> None:
        """Stop accepting and abort every link."""
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            for side in (link.down, link.up):
                if side is not None and side.transport is not None:
                    side.transport.abort()
        self.links.clear()
        if self._server is not None:
            await self._server.wait_closed()
