"""Ledgers with BookKeeper's digests (bk-*) on walkit bookies: the client's entry codec
writes BookKeeper's entries and master key, and reads, recovery and LAC reads check them."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.client import client, local_cluster
from support.metadata import Driver, driver  # noqa: F401  (fixture)
from walkit.errors import InvalidArgumentError, UnauthorizedError
from walkit.metadata import LedgerState
from walkit.protocol import decode_entry, master_key
from walkit.protocol._bk_digest import BkDigestType, bk_decode_entry, bk_master_key


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
