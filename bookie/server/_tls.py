"""TLS on a bookie's port, both ways it starts: from the first byte (walkit's clients)
or inside a plain connection (BookKeeper's START_TLS, issue 37).

Theory of operation
-------------------
A bookie configured with TLS (``tlsCertificatePath``) hears two kinds of client on one
port. walkit's clients start TLS with the connection: their first byte is a TLS
handshake record's type, 0x16. BookKeeper's clients connect in the clear and send a v3
START_TLS request; the bookie answers EOK and both sides then run the TLS handshake on
the same TCP connection, the bookie as the TLS server (docs/format.md, "TLS: from the
first byte, or inside the connection").
Every plain frame - walkit's or either of BookKeeper's dialects - starts with its
4-byte big-endian length, whose first byte is 0x16 only for a frame of 0x16000000 bytes
(352 MiB) or more, which a bookie with TLS never accepts (``nettyMaxFrameSizeBytes``
must stay below it then: :mod:`bookie._config`). So the first byte alone tells them
apart.

:class:`TlsListener` is the listening socket of a bookie with TLS: it accepts each
connection itself, waits until the client's first byte is there, peeks at it
(``MSG_PEEK``: nothing is consumed) and hands the socket to asyncio - wrapped in TLS
from the first byte for 0x16, plain otherwise (the connection then serves START_TLS:
:func:`upgrade`). A client that connects and sends nothing ties up one small task until
it closes or the bookie stops (as a plain connection that never speaks would). Without
TLS configured the bookie listens with ``loop.create_server`` as before and never peeks.

:func:`upgrade` turns a plain server connection into TLS after its START_TLS was
answered: ``loop.start_tls`` on the server side with the bookie's context (client
certificates required when ``tlsClientAuthentication`` is on). A failed handshake (the
client does not trust the bookie's certificate, or brings none where one is required)
closes the connection; the bookie logs it naming TLS.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable

from walkit.errors import BookieError

__all__ = ["HANDSHAKE_TIMEOUT", "TLS_HANDSHAKE_RECORD", "TlsListener", "first_is_tls", "upgrade"]

log = logging.getLogger("bookie.server")

#: The first byte of a TLS connection: the record type of its ClientHello (handshake).
TLS_HANDSHAKE_RECORD = 0x16
#: Seconds a TLS handshake may take (BookKeeper's client waits ``startTLSTimeout``, 10 s).
HANDSHAKE_TIMEOUT = 10.0


def first_is_tls(first: bytes) -> bool:
    """True when a connection whose first bytes are ``first`` starts with TLS."""
    return bool(first) and first[0] == TLS_HANDSHAKE_RECORD


class TlsListener:
    """A listening socket that accepts plain and TLS-from-the-first-byte connections (the
    module docstring). The parts of ``asyncio.Server`` the bookie uses: ``sockets``,
    :meth:`start_serving`, :meth:`close`."""

    def __init__(self, sock: socket.socket, factory: Callable[[], asyncio.BaseProtocol],
                 context: ssl.SSLContext) -> None:
        self.sockets = [sock]
        self._factory = factory
        self._ssl = context
        self._loop = asyncio.get_running_loop()
        self._accepting: asyncio.Task[None] | None = None
        self._starting: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(cls, factory: Callable[[], asyncio.BaseProtocol], host: str, port: int,
                   context: ssl.SSLContext) -> TlsListener:
        """Bind ``host:port`` (as ``loop.create_server`` does, with SO_REUSEADDR)."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        if not infos:
            raise BookieError("cannot resolve the bind address", address=host, port=port)
        family, _, _, _, address = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(socket.SOMAXCONN)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return cls(sock, factory, context)

    async def start_serving(self) -> None:
        self._accepting = self._loop.create_task(self._accept())

    def close(self) -> None:
        """Stop accepting; connections not yet handed over are closed. The listening
        socket closes once the accept has let go of it (its descriptor leaves the loop
        first: a number closed while still watched could be watched again as another's)."""
        listening = self.sockets[0]
        for task in list(self._starting):
            task.cancel()
        if self._accepting is None or self._accepting.done():
            listening.close()
            return
        self._accepting.add_done_callback(lambda _: listening.close())
        self._accepting.cancel()

    async def _accept(self) -> None:
        listening = self.sockets[0]
        while True:
            try:
                sock, _ = await self._loop.sock_accept(listening)
            except OSError as exc:  # out of descriptors, or the socket closed under us
                if listening.fileno() < 0:
                    return
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            task = self._loop.create_task(self._start(sock))
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _start(self, sock: socket.socket) -> None:
        """Wait for the first byte, then hand ``sock`` over, TLS or plain."""
        try:
            first = await self._peek(sock)
            if not first:
                sock.close()  # closed before it said anything
                return
            tls = first_is_tls(first)
            await self._loop.connect_accepted_socket(self._factory, sock, ssl=self._ssl if tls else None,
                                                     ssl_handshake_timeout=HANDSHAKE_TIMEOUT if tls else None)
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError) as exc:
            log.info("a connection failed before it was served (TLS handshake, or reset): %s", exc)
            sock.close()
        except asyncio.CancelledError:
            sock.close()
            raise

    async def _peek(self, sock: socket.socket) -> bytes:
        """The client's first byte, left unread (b"" when it closed first)."""
        ready: asyncio.Future[None] = self._loop.create_future()
        fd = sock.fileno()
        self._loop.add_reader(fd, _wake, ready)
        try:
            await ready
        finally:
            self._loop.remove_reader(fd)
        return sock.recv(1, socket.MSG_PEEK)


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


async def upgrade(transport: asyncio.Transport, protocol: asyncio.BaseProtocol,
                  context: ssl.SSLContext) -> asyncio.Transport:
    """The TLS transport of a plain server connection whose START_TLS was answered
    (the module docstring); ssl.SSLError, OSError or TimeoutError when the handshake fails."""
    loop = asyncio.get_running_loop()
    tls = await loop.start_tls(transport, protocol, context, server_side=True,
                               ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
    if tls is None:
        raise ConnectionError("the connection closed during the TLS handshake")
    return tls
