"""A walkit bookie with TLS serving BookKeeper's START_TLS on its one port (issue 37):
EOK, then the same connection upgraded (the bookie as TLS server) and served in v3 - or
in v2, as BookKeeper's v2 clients go on after their v3 START_TLS; walkit's own clients,
TLS from the first byte, on the same port; nothing served in the clear; a handshake the
bookie refuses closes the connection. Real bookies in this process, raw sockets
(asyncio streams upgraded with ``start_tls``) and the BookKeeper codecs' client side."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest

from bookie.server import BookieServer
from support.bookie import KEY, client_of, config, entry, in_process, make_certificates, run
from test_bk_dialects import BK_KEY, BkPeer, bk_entry
from walkit.client import client_ssl_context
from walkit.client._bk_bookie_client import BkBookieClient
from walkit.errors import BookieUnavailableError
from walkit.protocol import (
    AddEntry,
    AddEntryResponse,
    AuthMessage,
    Dialect,
    ErrorResponse,
    ReadEntry,
    ReadEntryResponse,
    StartTls,
    StartTlsResponse,
    Status,
    codec_for,
)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_certificates(tmp_path_factory.mktemp("tls"))


def tls_config(tmp_path: Path, certs: dict[str, str], **overrides: Any) -> Any:
    return config(tmp_path, tls_certificate_path=certs["cert"], tls_key_store=certs["key"],
                  tls_trust_store=certs["ca"], **overrides)


async def start_tls(peer: BkPeer, context: ssl.SSLContext) -> None:
    """START_TLS in v3 (whatever the peer's dialect, as BookKeeper's client sends it),
    EOK, then the handshake on the same connection."""
    v3 = codec_for(Dialect.BK_V3)
    peer.txn += 1
    await peer.send_raw(bytes(v3.encode_request(StartTls(peer.txn))))
    assert v3.decode_response(await peer.recv_frame()) == StartTlsResponse(peer.txn)
    await asyncio.wait_for(peer.writer.start_tls(context, server_hostname="127.0.0.1"), 10)


@pytest.mark.parametrize("dialect", [Dialect.BK_V3, Dialect.BK_V2])
def test_start_tls_upgrades_the_connection_and_serves_it(tmp_path: Path, certificates: dict[str, str],
                                                         dialect: Dialect) -> None:
    async def body() -> None:
        async with in_process(tls_config(tmp_path, certificates)) as server:
            peer = await BkPeer.open(server.port, dialect)
            if dialect is Dialect.BK_V3:  # AUTH may come before TLS (it carries no data)
                assert isinstance(await peer.ask(AuthMessage("BookKeeperClientAuth", b"")), AuthMessage)
            await start_tls(peer, client_ssl_context(certificates["ca"]))
            assert peer.writer.get_extra_info("ssl_object") is not None
            for e in range(3):
                assert await peer.ask(AddEntry(9, e, BK_KEY, bk_entry(9, e))) == AddEntryResponse(
                    9, e, peer.txn if dialect is Dialect.BK_V3 else 0)
            read = await peer.ask(ReadEntry(9, 1))
            assert isinstance(read, ReadEntryResponse) and read.data == bk_entry(9, 1)
            again = await peer.ask(StartTls()) if dialect is Dialect.BK_V3 else None  # TLS already: nothing to start
            assert again is None or (isinstance(again, ErrorResponse) and again.status is Status.EBADREQ)
            await peer.close()

    run(body)


def test_walkit_clients_keep_tls_from_the_first_byte_on_the_same_port(tmp_path: Path,
                                                                       certificates: dict[str, str]) -> None:
    async def body() -> None:
        async with in_process(tls_config(tmp_path, certificates)) as server:
            client = await client_of(server, ssl_context=client_ssl_context(certificates["ca"]),
                                     server_hostname="127.0.0.1")
            await client.add_entry(4, 0, KEY, entry(4, 0))
            peer = await BkPeer.open(server.port, Dialect.BK_V3)  # a BookKeeper client beside it
            await start_tls(peer, client_ssl_context(certificates["ca"]))
            read = await peer.ask(ReadEntry(4, 0))
            assert isinstance(read, ReadEntryResponse) and read.data == entry(4, 0)
            assert (await client.read_entry(4, 0)).data == entry(4, 0)
            await client.close()
            await peer.close()

    run(body)


@pytest.mark.parametrize("dialect", [Dialect.BK_V3, Dialect.BK_V2])
def test_nothing_is_served_in_the_clear_on_a_tls_bookie(tmp_path: Path, certificates: dict[str, str],
                                                       dialect: Dialect) -> None:
    async def body() -> None:
        async with in_process(tls_config(tmp_path, certificates)) as server:
            peer = await BkPeer.open(server.port, dialect)
            refused = await peer.ask(AddEntry(9, 0, BK_KEY, bk_entry(9, 0)))
            assert isinstance(refused, ErrorResponse) and refused.status is Status.EUA
            assert await peer.closed_by_bookie()
            await peer.close()
            tls = await BkPeer.open(server.port, Dialect.BK_V3)  # nothing was taken in: the entry is not there
            await start_tls(tls, client_ssl_context(certificates["ca"]))
            absent = await tls.ask(ReadEntry(9, 0))
            assert isinstance(absent, ErrorResponse) and absent.status in (Status.ENOLEDGER, Status.ENOENTRY)
            await tls.close()

    run(body)


def test_a_handshake_the_bookie_refuses_closes_the_connection(tmp_path: Path, certificates: dict[str, str]) -> None:
    """tlsClientAuthentication: a client without a certificate is refused; a client that
    does not trust the bookie's CA gives up; neither hangs, and the bookie serves on."""
    async def body() -> None:
        async with in_process(tls_config(tmp_path, certificates, tls_client_authentication=True)) as server:
            anonymous = await BkPeer.open(server.port, Dialect.BK_V3)
            await start_tls(anonymous, client_ssl_context(certificates["ca"]))  # TLS 1.3: refused after the handshake
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                await anonymous.ask(ReadEntry(9, 0))
            await anonymous.close()
            stranger = await BkPeer.open(server.port, Dialect.BK_V3)
            with pytest.raises(ssl.SSLCertVerificationError):
                await start_tls(stranger, client_ssl_context(certificates["stranger"],
                                                             certificate=certificates["client"]))
            stranger.writer.transport.abort()
            known = await BkPeer.open(server.port, Dialect.BK_V3)
            await start_tls(known, client_ssl_context(certificates["ca"], certificate=certificates["client"]))
            assert await known.ask(AddEntry(9, 0, BK_KEY, bk_entry(9, 0))) == AddEntryResponse(9, 0, known.txn)
            await known.close()

    run(body)


def test_without_tls_configured_start_tls_is_ebadreq_and_the_connection_goes_on(tmp_path: Path) -> None:
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            peer = await BkPeer.open(server.port, Dialect.BK_V3)
            refused = await peer.ask(StartTls())
            assert isinstance(refused, ErrorResponse) and refused.status is Status.EBADREQ
            assert await peer.ask(AddEntry(9, 0, BK_KEY, bk_entry(9, 0))) == AddEntryResponse(9, 0, peer.txn)
            await peer.close()

    run(body)



@pytest.mark.parametrize("dialect", [Dialect.BK_V3, Dialect.BK_V2])
def test_the_walkit_bookkeeper_client_starts_tls_in_band(tmp_path: Path, certificates: dict[str, str],
                                                         dialect: Dialect) -> None:
    """BkBookieClient with an SSL context: START_TLS, EOK, handshake, then its dialect in
    TLS (against a walkit bookie here; against BookKeeper's in tests/bookkeeper/test_bk_tls.py)."""
    async def body() -> None:
        async with in_process(tls_config(tmp_path, certificates, tls_client_authentication=True)) as server:
            good = client_ssl_context(certificates["ca"], certificate=certificates["client"])
            client = await BkBookieClient.connect("127.0.0.1", server.port, ssl_context=good, dialect=dialect)
            assert client._transport is not None and client._transport.get_extra_info("ssl_object") is not None
            await client.add_entry(3, 0, BK_KEY, bk_entry(3, 0))
            assert (await client.read_entry(3, 0)).data == bk_entry(3, 0)
            await client.close()
            with pytest.raises(BookieUnavailableError, match="TLS") as err:  # a CA that did not sign the bookie
                await BkBookieClient.connect("127.0.0.1", server.port, dialect=dialect, timeout=5,
                                             ssl_context=client_ssl_context(certificates["stranger"],
                                                                            certificate=certificates["client"]))
            assert isinstance(err.value.__cause__, ssl.SSLCertVerificationError)
            anonymous = None
            with pytest.raises(BookieUnavailableError):  # no certificate where the bookie requires one
                anonymous = await BkBookieClient.connect("127.0.0.1", server.port, dialect=dialect, timeout=5,
                                                         ssl_context=client_ssl_context(certificates["ca"]))
                await asyncio.wait_for(anonymous.read_entry(3, 0), 10)
            if anonymous is not None:
                await anonymous.close()

    run(body)


def test_clients_that_vanish_or_never_speak_hold_nothing_up(tmp_path: Path, certificates: dict[str, str]) -> None:
    """The TLS listener waits for a client's first byte: one that closes first, or never
    speaks, costs nothing served, and a stop does not wait for it (its socket is closed)."""
    async def body() -> None:
        server = BookieServer(tls_config(tmp_path, certificates))
        await server.start()
        try:
            _, gone = await asyncio.open_connection("127.0.0.1", server.port)
            gone.close()
            silent_reader, silent = await asyncio.open_connection("127.0.0.1", server.port)
            client = await client_of(server, ssl_context=client_ssl_context(certificates["ca"]),
                                     server_hostname="127.0.0.1")
            await client.add_entry(5, 0, KEY, entry(5, 0))  # served beside them
            await client.close()
        finally:
            await asyncio.wait_for(server.stop(), 10)
        assert await asyncio.wait_for(silent_reader.read(), 10) == b""  # closed by the stop
        silent.close()

    run(body)
