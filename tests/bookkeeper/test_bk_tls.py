"""TLS between walkit and Apache BookKeeper 4.18.2, both ways (issue 37).

BookKeeper's TLS starts inside a plain connection: the client sends START_TLS (v3, in
v2 too), the bookie answers EOK, and both upgrade the same connection, the bookie as the
TLS server. Here, with PEM files (BookKeeper's ``tlsKeyStoreType=PEM``) a test CA signed,
and client certificates required on both kinds of bookie:

* BookKeeper's Java client with TLS on three walkit bookies serving TLS, in a cluster
  BookKeeper's ``initnewcluster`` made: create, add, read, close, recovery open - over
  TLS (the walkit bookies' connections are TLS ones); a client that does not trust the
  bookies' CA, or brings no certificate, gets nowhere (and no hang);
* walkit's client with TLS on three Java bookies with TLS (registered for it in a
  walkit-format store, ``WalkitRegistry``): the same, and a recovery open of a writer
  abandoned; a wrong CA or a missing certificate is a BookieUnavailableError naming TLS.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

import walkit
from support.bookkeeper import NO_GC, JavaCluster, JavaPeer, PeerError, WalkitRegistry, payload
from support.zk import ZooKeeperServer
from test_java_client_on_walkit import WalkitBookies
from walkit.client import client_ssl_context
from walkit.client._bk_bookie_client import BkBookieClient
from walkit.errors import BookieUnavailableError, NoSuchEntryError, NoSuchLedgerError
from walkit.protocol import Dialect

pytestmark = pytest.mark.bookkeeper

FAST = {"add_timeout": 5.0, "read_timeout": 5.0, "speculative_read_timeout": 0.5, "connect_timeout": 5.0,
        "session_timeout": 5.0}
TLS_FACTORY = "org.apache.bookkeeper.tls.TLSContextFactory"


def _pkcs8(pem: bytes) -> bytes:
    """A PEM private key as Netty's PEM reader takes it (PKCS#8)."""
    key = serialization.load_pem_private_key(pem, None)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, a bookie certificate for 127.0.0.1 and a client certificate it signed (each
    certificate and key in files of their own), and a stranger CA that signed nothing here."""
    import trustme

    d = tmp_path_factory.mktemp("tls")
    ca, stranger = trustme.CA(), trustme.CA()
    files: dict[str, bytes] = {"ca.pem": ca.cert_pem.bytes(), "stranger.pem": stranger.cert_pem.bytes()}
    for name, cert in (("bookie", ca.issue_cert("127.0.0.1", "localhost")),
                       ("client", ca.issue_cert("client.walkit.test"))):
        files[f"{name}.pem"] = b"".join(c.bytes() for c in cert.cert_chain_pems)
        files[f"{name}.key"] = _pkcs8(cert.private_key_pem.bytes())
    for name, data in files.items():
        (d / name).write_bytes(data)
    return {name.replace(".pem", "").replace(".key", "_key"): str(d / name) for name in files}


def java_bookie_tls(certs: dict[str, str]) -> dict[str, str]:
    """A Java bookie's TLS (bk_server.conf keys of 4.18), client certificates required."""
    return {"tlsProviderFactoryClass": TLS_FACTORY, "tlsProvider": "JDK", "tlsKeyStoreType": "PEM",
            "tlsKeyStore": certs["bookie_key"], "tlsCertificatePath": certs["bookie"], "tlsTrustStoreType": "PEM",
            "tlsTrustStore": certs["ca"], "tlsClientAuthentication": "true"}


def java_client_tls(certs: dict[str, str], *, ca: str = "ca", certificate: bool = True) -> dict[str, str]:
    """The Java client's TLS (ClientConfiguration keys of 4.18): trust ``ca``, and show
    the client certificate when ``certificate``."""
    conf = {"tlsProviderFactoryClass": TLS_FACTORY, "tlsProvider": "JDK", "tlsTrustStoreType": "PEM",
            "tlsTrustStore": certs[ca]}
    if certificate:
        conf.update(tlsClientAuthentication="true", tlsKeyStoreType="PEM", tlsKeyStore=certs["client_key"],
                    tlsCertificatePath=certs["client"])
    return conf


# -- BookKeeper's Java client on walkit bookies ----------------------------------------------
@pytest.fixture(scope="module")
def bk_tree(bk_classpath: str, zk_server: ZooKeeperServer) -> Iterator[JavaCluster]:
    """BookKeeper's ``initnewcluster`` tree, no Java bookie."""
    cluster = JavaCluster(bk_classpath, zk_server.hosts, bookies=0)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def walkit_tls_bookies(bk_tree: JavaCluster, certs: dict[str, str],
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[WalkitBookies]:
    bookies = WalkitBookies(tmp_path_factory.mktemp("walkit-tls"), 3, bk_tree.metadata_uri,
                            tls_certificate_path=certs["bookie"], tls_key_store=certs["bookie_key"],
                            tls_trust_store=certs["ca"], tls_client_authentication=True)
    try:
        yield bookies
    finally:
        bookies.stop()


def _tls_connections(bookies: WalkitBookies) -> tuple[int, int]:
    """(TLS connections, plain ones) open on the walkit bookies now."""
    async def count() -> tuple[int, int]:
        conns = [c for s in bookies.servers for c in list(s._connections)]
        tls = sum(1 for c in conns if c.transport is not None and c.transport.get_extra_info("ssl_object"))
        return tls, len(conns) - tls
    return bookies.run(count())


@pytest.mark.parametrize("v2", [False, True], ids=["v3", "v2"])
def test_the_java_client_with_tls_on_walkit_bookies(bk_tree: JavaCluster, walkit_tls_bookies: WalkitBookies,
                                                    certs: dict[str, str], v2: bool) -> None:
    peer = bk_tree.peer(v2=v2, conf=java_client_tls(certs))
    try:
        ledger = peer.create(3, 3, 2)
        assert peer.add(ledger, count=50, seed=3) == list(range(50))
        assert peer.read(ledger, 0, 49) == [payload(3, i) for i in range(50)]
        tls, plain = _tls_connections(walkit_tls_bookies)
        assert tls >= 3 and plain == 0  # each bookie is spoken to over TLS, nothing in the clear
        peer.close_ledger(ledger)
        info = peer.open(ledger, recovery=True)
        assert (info["closed"], info["lac"]) == (True, 49)
        assert peer.read(ledger, 0, 49)[-1] == payload(3, 49)
    finally:
        peer.close()


@pytest.mark.parametrize("refused", ["stranger CA", "no certificate"])
def test_a_java_client_the_walkit_bookies_refuse_gets_nowhere(bk_tree: JavaCluster,
                                                              walkit_tls_bookies: WalkitBookies,
                                                              certs: dict[str, str], refused: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    conf = java_client_tls(certs, ca="stranger") if refused == "stranger CA" else java_client_tls(
        certs, certificate=False)
    peer = bk_tree.peer(conf=conf)
    try:
        ledger = peer.create(3, 3, 2)  # metadata only: no bookie spoken to yet
        with caplog.at_level(logging.INFO, logger="bookie.server"), pytest.raises(PeerError) as err:
            peer.add(ledger, count=1, timeout=60)
        assert err.value.code.startswith("NotEnoughBookies")  # no bookie it could speak to
        assert "TLS handshake (START_TLS)" in caplog.text and "failed" in caplog.text  # the bookies say why
    finally:
        peer.close()


# -- walkit's client on Java bookies ---------------------------------------------------------
@pytest.fixture(scope="module")
def java_tls(bk_classpath: str, zk_server: ZooKeeperServer, certs: dict[str, str]) -> Iterator[JavaCluster]:
    cluster = JavaCluster(bk_classpath, zk_server.hosts, bookies=3, conf={**NO_GC, **java_bookie_tls(certs)})
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def registry(java_tls: JavaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WalkitRegistry]:
    reg = WalkitRegistry(tmp_path_factory.mktemp("walkit-md"), java_tls.bookies)
    try:
        yield reg
    finally:
        reg.close()


def walkit_client(registry: WalkitRegistry, certs: dict[str, str], v2: bool, **options: Any) -> walkit.BookKeeper:
    return walkit.BookKeeper(registry.uri, **{**FAST, "use_v2_wire_protocol": v2, "tls_ca_file": certs["ca"],
                                              "tls_certificate": certs["client"], "tls_key": certs["client_key"],
                                              **options})


@pytest.mark.parametrize("v2", [False, True], ids=["v3", "v2"])
def test_the_walkit_client_with_tls_on_java_bookies(registry: WalkitRegistry, certs: dict[str, str],
                                                    v2: bool) -> None:
    with walkit_client(registry, certs, v2) as bk:
        lh = bk.create_ledger(3, 3, 2, digest="bk-crc32c", password=b"pw")
        assert [lh.add_entry(b"tls %d" % i) for i in range(200)] == list(range(200))
        assert [e.data for e in lh.read(0, 199)] == [b"tls %d" % i for i in range(200)]
        lh.close()
        rh = bk.open_ledger(lh.ledger_id, password=b"pw")
        assert rh.is_closed and rh.last_add_confirmed == 199
    # a writer abandoned mid-stream: a recovery open over TLS closes the ledger
    writer = walkit_client(registry, certs, v2)
    lh = writer.create_ledger(3, 3, 2, digest="bk-crc32c", password=b"pw")
    futures = [lh.add_entry_async(b"r%d" % i) for i in range(500)]
    futures[250].result(60)
    writer.close()
    acked = [i for i, f in enumerate(futures) if f.done() and f.exception() is None]
    with walkit_client(registry, certs, v2) as bk:
        rh = bk.open_ledger(lh.ledger_id, password=b"pw")
        assert rh.is_closed and rh.last_add_confirmed >= acked[-1]
        assert [e.data for e in rh.read(0, rh.last_add_confirmed)] == [
            b"r%d" % i for i in range(rh.last_add_confirmed + 1)]


@pytest.mark.parametrize("dialect", [Dialect.BK_V3, Dialect.BK_V2])
def test_a_java_bookie_refuses_a_wrong_ca_and_a_client_without_certificate(java_tls: JavaCluster,
                                                                           certs: dict[str, str],
                                                                           dialect: Dialect) -> None:
    port = java_tls.bookies[0].port

    async def go() -> None:
        with pytest.raises(BookieUnavailableError, match="TLS") as err:  # the client does not trust the bookie
            await BkBookieClient.connect("127.0.0.1", port, dialect=dialect, timeout=10,
                                         ssl_context=client_ssl_context(certs["stranger"], certificate=certs["client"],
                                                                        key=certs["client_key"]))
        assert isinstance(err.value.__cause__, ssl.SSLCertVerificationError)
        anonymous = None
        with pytest.raises(BookieUnavailableError):  # the bookie requires a certificate
            anonymous = await BkBookieClient.connect("127.0.0.1", port, dialect=dialect, timeout=10,
                                                     ssl_context=client_ssl_context(certs["ca"]))
            await asyncio.wait_for(anonymous.read_entry(987_654_321, 0), 20)
        if anonymous is not None:
            await anonymous.close()
        good = await BkBookieClient.connect("127.0.0.1", port, dialect=dialect, timeout=10,
                                            ssl_context=client_ssl_context(certs["ca"], certificate=certs["client"],
                                                                           key=certs["client_key"]))
        assert good._transport is not None and good._transport.get_extra_info("ssl_object") is not None
        with pytest.raises((NoSuchLedgerError, NoSuchEntryError)):  # answered, in TLS
            await good.read_entry(987_654_321, 0)
        await good.close()

    asyncio.run(asyncio.wait_for(go(), 60))
