"""``walkit recover`` of ledgers with BookKeeper's digests on walkit bookies only (issue 37):
the surviving walkit bookies check ``bk-crc32``, ``bk-crc32c`` and ``bk-dummy`` copies with
what they hold and push them (the bookie-side path, bookie/_replicate.py), a damaged
replica is passed over for another, and a ``bk-hmac`` ledger - whose digest only the
password opens, which a walkit-format cluster does not keep - fails with the reason and
is left as it was. Real bookie processes, both metadata drivers."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import walkit
from support.client import client, index_of, local_cluster
from support.metadata import Driver, driver  # noqa: F401  (fixture)
from walkit.client import BkBookieClient, BookieClient, EntryCodec
from walkit.errors import NoSuchLedgerError, ProtocolError, WalkitError
from walkit.metadata import LedgerMetadata, connect
from walkit.recovery import count_held, lost_fragments, recover
from walkit.recovery._replicator import Replicator

pytestmark = pytest.mark.timeout(180)

DIGESTS = ("bk-crc32", "bk-crc32c", "bk-dummy")
ENTRIES = 40


def _lose(cluster: walkit.LocalCluster, bookie: str) -> None:
    """SIGKILL the bookie and wipe its directories: gone for good."""
    i = index_of(cluster, bookie)
    cluster.kill_bookie(i)
    shutil.rmtree(cluster.data_dir / f"bookie-{i}")


def _meta(uri: str, ledger_id: int) -> LedgerMetadata:
    with connect(uri) as cluster:
        return cluster.ledgers.read(ledger_id)[0]


def _stored(cluster: walkit.LocalCluster, bookie: str, ledger_id: int, entries: range) -> dict[int, bytes]:
    """The entries of ``entries`` ``bookie`` stores, as stored (the bytes a read returns)."""
    async def go() -> dict[int, bytes]:
        c = await BookieClient.connect(*cluster.bookie_address(index_of(cluster, bookie)))
        held: dict[int, bytes] = {}
        try:
            for e in entries:
                try:
                    held[e] = bytes((await c.read_entry(ledger_id, e)).data)
                except WalkitError:
                    pass
        finally:
            await c.close()
        return held

    return asyncio.run(go())


def test_bk_digest_ledgers_are_pushed_by_walkit_bookies(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=4, processes=True) as cluster, client(cluster) as bk:
        ledgers = [bk.create_ledger(3, 2, 2, digest=d, password=b"pw-%d" % i) for i, d in enumerate(DIGESTS)]
        for lh in ledgers:
            for e in range(ENTRIES):
                lh.add_entry(b"%s-%d" % (lh.metadata.digest.encode(), e))
            lh.close()
        metas = [_meta(cluster.metadata_uri, lh.ledger_id) for lh in ledgers]
        # three 3-of-4 ensembles always share a bookie: lose it
        lost = sorted(set.intersection(*(set(m.ensembles[0][1]) for m in metas)))[0]
        _lose(cluster, lost)
        report = recover(cluster.metadata_uri, lost)
        assert report.failures == [] and report.fragments_replaced == 3
        assert report.copy_paths == {"push": 3}
        assert report.entries_copied == sum(count_held(w) for m in metas for w in lost_fragments(m, lost))
        for i, (lh, old) in enumerate(zip(ledgers, metas)):
            meta = _meta(cluster.metadata_uri, lh.ledger_id)
            [target] = set(meta.ensembles[0][1]) - set(old.ensembles[0][1])
            assert meta.ensembles[0][1] == tuple(target if b == lost else b for b in old.ensembles[0][1])
            codec = EntryCodec.of(meta.digest, b"pw-%d" % i)
            held = _stored(cluster, target, lh.ledger_id, range(ENTRIES))
            assert sorted(held) == [e for e in range(ENTRIES) if target in meta.write_set(e)]
            for e, data in held.items():  # BookKeeper's bytes, unchanged: the digest checks
                assert codec.decode(data)[1] == b"%s-%d" % (meta.digest.encode(), e)
        # one more bookie lost: every entry (Qw 2 of the 3 left) still reads back
        _lose(cluster, next(b for b in cluster.bookie_ids if b != lost))
        for i, lh in enumerate(ledgers):
            rh = bk.open_ledger(lh.ledger_id, password=b"pw-%d" % i)
            assert [x.data for x in rh.read(0, ENTRIES - 1)] == [b"%s-%d" % (lh.metadata.digest.encode(), e)
                                                               for e in range(ENTRIES)]


def test_a_damaged_bk_crc32_replica_is_passed_over_for_another(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=4, processes=True) as cluster, client(cluster) as bk:
        lh = bk.create_ledger(3, 3, 2, digest="bk-crc32", password=b"secret")
        values = [b"value-%d" % e for e in range(20)]
        for v in values:
            lh.add_entry(v)
        lh.close()
        meta = lh.metadata
        lost, first_source = meta.ensembles[0][1][0], meta.ensembles[0][1][1]
        codec = EntryCodec.of("bk-crc32", b"secret")
        good = codec.encode(meta.ledger_id, 0, -1, len(values[0]), values[0])
        damaged = good[:-1] + bytes([good[-1] ^ 0xFF])  # the payload's last byte: the CRC32 fails

        async def damage() -> None:
            c = await BookieClient.connect(*cluster.bookie_address(index_of(cluster, first_source)))
            try:
                await c.add_entry(meta.ledger_id, 0, codec.master_key, damaged, recovery=True)
            finally:
                await c.close()

        asyncio.run(damage())
        assert _stored(cluster, first_source, meta.ledger_id, range(1))[0] == damaged
        _lose(cluster, lost)
        done = subprocess.run([sys.executable, "-m", "walkit.cli", "recover", "--metadata", cluster.metadata_uri,
                               "--bookie", lost], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "copied 20 entries; 1 fragments" in done.stdout and "copied by a walkit bookie: 1 fragments" in done.stdout
        [target] = set(_meta(cluster.metadata_uri, meta.ledger_id).ensembles[0][1]) - set(meta.ensembles[0][1])
        assert _stored(cluster, target, meta.ledger_id, range(1))[0] == good  # the intact copy, not the damaged


def test_a_bk_hmac_ledger_without_its_password_in_metadata_fails_with_the_reason(tmp_path: Path,
                                                                                  driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=4, processes=True) as cluster, client(cluster) as bk:
        lh = bk.create_ledger(3, 3, 2, digest="bk-hmac", password=b"pw")
        for e in range(10):
            lh.add_entry(b"e%d" % e)
        lh.close()
        lost = lh.metadata.ensembles[0][1][0]
        _lose(cluster, lost)
        report = recover(cluster.metadata_uri, lost)
        assert report.fragments_replaced == 0 and report.copy_paths == {}
        [failure] = report.failures
        assert failure["ledger"] == lh.ledger_id and "password" in failure["error"]
        assert lost in _meta(cluster.metadata_uri, lh.ledger_id).ensembles[0][1]  # left as it was
        rh = bk.open_ledger(lh.ledger_id, password=b"pw")  # still read through the others
        assert [x.data for x in rh.read(0, 9)] == [b"e%d" % e for e in range(10)]


def test_a_bookie_refuses_to_push_a_digest_it_cannot_check(tmp_path: Path, driver: Driver) -> None:
    """ADMIN ``ledger.replicate`` of a bk-hmac ledger: the bookie holds only the master key,
    which does not give HMAC's key, so it refuses rather than push an unchecked copy."""
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        lh = bk.create_ledger(3, 3, 2, digest="bk-hmac", password=b"pw")
        lh.add_entry(b"x")
        lh.close()
        source, target = cluster.bookie_ids[0], cluster.bookie_ids[1]

        async def ask(digest: str) -> object:
            c = await BookieClient.connect(*cluster.bookie_address(index_of(cluster, source)))
            try:
                return await c.admin("ledger.replicate", {"ledger": lh.ledger_id, "entries": [0], "digest": digest,
                                                          "target": "%s:%d" % cluster.bookie_address(1),
                                                          "tls": False})
            finally:
                await c.close()

        with pytest.raises(ProtocolError, match="cannot check"):  # EBADREQ, with the reason
            asyncio.run(ask("bk-hmac"))
        assert target != source
        answer = asyncio.run(ask("bk-crc32c"))  # a digest it checks, but not this ledger's: its copy fails the check
        assert answer == {"copied": [], "missing": [], "bad": [0], "failed": {}}


def test_the_list_of_entries_in_bookkeepers_v3_dialect(tmp_path: Path, driver: Driver) -> None:
    """GET_LIST_OF_ENTRIES_OF_LEDGER as re-replication asks a Java bookie that serves it
    (InterleavedLedgerStorage, SortedLedgerStorage), here of walkit bookies, which serve
    it in BookKeeper's v3 dialect: each bookie's share of the ledger, a range of it, and
    nothing of a ledger it does not have."""
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        lh = bk.create_ledger(3, 2, 2, digest="bk-crc32c", password=b"pw")
        for e in range(10):
            lh.add_entry(b"e%d" % e)
        lh.close()
        meta = lh.metadata

        async def go() -> None:
            with connect(cluster.metadata_uri) as store:
                replicator = Replicator(store)
                try:
                    for i, bookie in enumerate(cluster.bookie_ids):
                        c = await BkBookieClient.connect(*cluster.bookie_address(i))
                        try:
                            share = [e for e in range(10) if bookie in meta.write_set(e)]
                            assert await c.entries_of(lh.ledger_id) == share
                            assert await replicator._present_java(bookie, c, lh.ledger_id, 2, 6) == \
                                {e for e in share if 2 <= e <= 6}
                            assert await replicator._present_java(bookie, c, lh.ledger_id + 1000, 0, 9) == set()
                            with pytest.raises(NoSuchLedgerError):
                                await c.entries_of(lh.ledger_id + 1000)
                        finally:
                            await c.close()
                finally:
                    await replicator.close()

        asyncio.run(go())
