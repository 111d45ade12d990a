"""Ledgers with BookKeeper's digests (bk-*) on walkit bookies: the client's entry codec
writes BookKeeper's entries and master key, and reads, recovery and LAC reads check them."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

import walkit

from support.client import client, local_cluster
from support.metadata import Driver, driver  # noqa: F401  (fixture)
from walkit.errors import InvalidArgumentError, UnauthorizedError
from walkit.metadata import LedgerState
from walkit.protocol import decode_entry, master_key
from walkit.protocol._bk_digest import BkDigestType, bk_decode_entry, bk_decode_lac, bk_encode_lac, bk_master_key


@pytest.mark.parametrize("digest", ["bk-crc32", "bk-crc32c", "bk-hmac", "bk-dummy"])
def test_bk_digest_ledger_round_trip(tmp_path: Path, driver: Driver, digest: str) -> None:
    kind = {"bk-crc32": BkDigestType.CRC32, "bk-crc32c": BkDigestType.CRC32C, "bk-hmac": BkDigestType.HMAC,
            "bk-dummy": BkDigestType.DUMMY}[digest]
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        lh = bk.create_ledger(3, 3, 2, digest=digest, password=b"pw")
        assert bk.ledger_metadata(lh.ledger_id).digest == digest
        for i in range(50):
            lh.add_entry(b"e%d" % i)
        tail = bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        assert tail.last_add_confirmed >= 48
        # what a bookie stored is BookKeeper's entry, with BookKeeper's 20-byte master key
        server = cluster.server(0)
        assert server.bookie is not None
        stored = server.bookie.read_entry(lh.ledger_id, 7)
        fields, payload = bk_decode_entry(bytes(stored), digest=kind, password=b"pw")
        assert fields[:2] == (lh.ledger_id, 7) and payload == b"e7"
        assert server.bookie.storage.master_key(lh.ledger_id) == bk_master_key(b"pw")
        rh = bk.open_ledger(lh.ledger_id, password=b"pw")  # recovery: fences, checks digests, closes
        assert rh.is_closed and rh.last_add_confirmed == 49
        assert [e.data for e in rh.read(0, 49)] == [b"e%d" % i for i in range(50)]
        assert bk.ledger_metadata(lh.ledger_id).state is LedgerState.CLOSED
        with pytest.raises(UnauthorizedError):
            bk.open_ledger(lh.ledger_id, password=b"wrong")


@pytest.mark.parametrize("digest", ["bk-crc32c", "bk-hmac"])
def test_an_idle_writers_lac_body_is_kept_by_walkit_bookies(tmp_path: Path, driver: Driver, digest: str) -> None:
    """A bk-* writer gone idle sends its LAC with BookKeeper's LAC body in walkit's own
    dialect (flag LAC_BODY): every bookie that acknowledged the entry keeps that body, the
    one a Java reader's READ_LAC is answered with (lacBody), its digest the ledger's."""
    kind = {"bk-crc32c": BkDigestType.CRC32C, "bk-hmac": BkDigestType.HMAC}[digest]
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster, idle_lac=True) as bk:
        lh = bk.create_ledger(3, 3, 3, digest=digest, password=b"pw")
        for i in range(5):
            lh.add_entry(b"i%d" % i)  # each one alone: the writer goes idle after each
        deadline = time.monotonic() + 10
        bodies = [cluster.server(i).reads.lac_bodies.get(lh.ledger_id) for i in range(3)]
        while any(b is None or bk_decode_lac(b, digest=kind, password=b"pw") < 4 for b in bodies) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
            bodies = [cluster.server(i).reads.lac_bodies.get(lh.ledger_id) for i in range(3)]
        assert bodies == [bk_encode_lac(lh.ledger_id, 4, digest=kind, password=b"pw")] * 3
        lh.close()


def test_unknown_digest_is_refused_at_create(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        with pytest.raises(InvalidArgumentError):
            bk.create_ledger(digest="bk-md5")
        lh = bk.create_ledger(3, 3, 3, digest="mac", password=b"pw")  # walkit's own: walkit's bytes, as before
        lh.add_entry(b"x")
        server = cluster.server(0)
        assert server.bookie is not None
        stored = bytes(server.bookie.read_entry(lh.ledger_id, 0))
        assert decode_entry(stored, digest="mac", key=master_key(b"pw"))[1] == b"x"
        assert server.bookie.storage.master_key(lh.ledger_id) == master_key(b"pw")


@pytest.mark.parametrize("dialect", ["v3", "v2"])
def test_the_client_speaks_bookkeepers_dialects_to_bookies_of_kind_bookkeeper(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dialect: str) -> None:
    """Walkit bookies also serve BookKeeper's v3 and v2: with every bookie's registration
    read as kind "bookkeeper", the whole client (pipelined adds, reads, LAC reads, tails,
    recovery) runs over BkBookieClient in the dialect the configuration names."""
    from walkit.client import _core
    from walkit.client._bk_bookie_client import BkBookieClient
    from walkit.protocol._dialect import Dialect

    read = _core.ClientCore._registration_of
    monkeypatch.setattr(_core.ClientCore, "_registration_of",
                        lambda self, bookie: dataclasses.replace(read(self, bookie), kind="bookkeeper"))
    with walkit.LocalCluster(tmp_path / "cluster", bookies=3) as cluster, \
            client(cluster, use_v2_wire_protocol=dialect == "v2") as bk:
        lh = bk.create_ledger(3, 3, 2, digest="bk-hmac", password=b"pw")
        futures = [lh.add_entry_async(b"e%d" % i) for i in range(990)]
        assert [f.result(60) for f in futures] == list(range(990))
        assert [lh.add_entry(b"e%d" % i) for i in range(990, 1000)] == list(range(990, 1000))  # LACs piggybacked
        tail = bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        assert tail.read_last_add_confirmed() >= 998
        assert tail.wait_for_lac(998, 2.0) >= 998
        rh = bk.open_ledger(lh.ledger_id, password=b"pw")
        assert rh.is_closed and rh.last_add_confirmed == 999
        assert [e.data for e in rh.read(0, 999)] == [b"e%d" % i for i in range(1000)]
        ranges = bk.client._core.stats.range_reads
        assert ranges > 0 if dialect == "v2" else ranges == 0  # v2: BATCH_READ_ENTRY; v3 has no batch read
        clients = list(bk.client._core.pool._clients.values())
        assert clients and all(isinstance(c, BkBookieClient) for c in clients)
        assert {c.dialect for c in clients} == {Dialect.BK_V2 if dialect == "v2" else Dialect.BK_V3}


def test_registrations_name_their_kind() -> None:
    from walkit.client._pool import Endpoint, parse_endpoint
    from walkit.errors import BookieUnavailableError

    assert parse_endpoint("b1", b'{"endpoint": "127.0.0.1:5000"}') == Endpoint("127.0.0.1", 5000)
    assert parse_endpoint("b1", b'{"endpoint": "127.0.0.1:5000", "kind": "bookkeeper"}') == \
        Endpoint("127.0.0.1", 5000, False, "bookkeeper")
    with pytest.raises(BookieUnavailableError):
        parse_endpoint("b1", b'{"endpoint": "127.0.0.1:5000", "kind": "cassandra"}')
