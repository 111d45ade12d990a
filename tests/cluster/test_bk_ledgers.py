"""The ledger manager of a BookKeeper-format cluster, on both drivers: BookKeeper's
records at its paths, its id generators (31-bit ``idgen``, then ``idgen-long`` HOBs),
listing that skips its special nodes, CAS, watches and deletes
(walkit/metadata/_ledgers.py, _bk_ledgers.py)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from support.metadata import Driver, ExpirableStore, driver, store, wait_for
from walkit.errors import InvalidArgumentError, LedgerExistsError, MetadataError, MetadataVersionError, NoSuchLedgerError
from walkit.metadata import LedgerManager, LedgerMetadata, LedgerState, init_cluster, walkit_path
from walkit.metadata._bk_ledger import decode_ledger_metadata
from walkit.metadata._bk_paths import INT_MAX

__all__ = ["driver", "store"]  # fixtures used by name

ROOT = "/ledgers"
GOLDEN = Path(__file__).parents[1] / "unit" / "golden" / "bookkeeper"
BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")


def bk_manager(store: ExpirableStore, layout: str = "hierarchical", **kwargs: int) -> LedgerManager:
    return LedgerManager(store, init_cluster(store, ROOT, layout, format="bookkeeper"),  # type: ignore[arg-type]
                         **kwargs)


def meta(ledger_id: int, digest: str = "bk-crc32c", password: bytes = b"pw") -> LedgerMetadata:
    return LedgerMetadata.create(ledger_id, BOOKIES, write_quorum=2, ack_quorum=2, password=password,
                                 ctime=1_700_000_000_000, digest=digest, custom={"app": b"x"})


@pytest.mark.parametrize("layout", ["hierarchical", "flat", "longhierarchical"])
def test_records_are_bookkeepers_at_its_paths(store: ExpirableStore, layout: str) -> None:
    m = bk_manager(store, layout)
    for lid, path in ((7, {"hierarchical": "/ledgers/00/0000/L0007", "flat": "/ledgers/L0000000007",
                           "longhierarchical": "/ledgers/000/0000/0000/0000/L0007"}[layout]),
                      (2**40 + 3, {"hierarchical": "/ledgers/000/0001/0995/1162/L7779",
                                   "flat": "/ledgers/L1099511627779",
                                   "longhierarchical": "/ledgers/000/0001/0995/1162/L7779"}[layout])):
        created = meta(lid, "bk-hmac", b"s3cret")
        assert m.path(lid) == path and m.create(created) == 0
        data, _ = store.get(path)
        assert data.startswith(b"BookieMetadataFormatVersion\t3\n")
        record = decode_ledger_metadata(data)
        assert (record.digest, record.password, record.ensemble_size, record.write_quorum, record.ack_quorum) == (
            "HMAC", b"s3cret", 3, 2, 2)
        assert record.custom == (("app", b"x"),) and record.ctime == created.ctime and record.ctoken is not None
        read, version = m.read(lid)
        assert read == created and version == 0 and read.bk_password == b"s3cret"
    assert list(m.ledger_ids()) == [7, 2**40 + 3]


def test_update_watch_and_delete(store: ExpirableStore) -> None:
    m = bk_manager(store)
    lid = m.new_ledger_id()
    m.create(meta(lid))
    seen: list[tuple[LedgerState | None, int]] = []
    watch = m.watch(lid, lambda md, v: seen.append((None if md is None else md.state, v)))
    wait_for(lambda: (LedgerState.OPEN, 0) in seen)
    closed, version = m.update(lid, lambda md: md.closed(9, 1000))
    assert version == 1 and m.read(lid) == (closed, 1)
    wait_for(lambda: (LedgerState.CLOSED, 1) in seen)
    record = decode_ledger_metadata(store.get(m.path(lid))[0])
    assert (record.state, record.last_entry_id, record.length, record.password) == (LedgerState.CLOSED, 9, 1000,
                                                                                    b"pw")
    with pytest.raises(MetadataVersionError):
        m.write(closed, 0)
    with pytest.raises(LedgerExistsError):
        m.create(meta(lid))
    m.delete(lid, 1)
    with pytest.raises(NoSuchLedgerError):
        m.read(lid)
    wait_for(lambda: seen[-1:] == [(None, -1)])
    watch.cancel()
    assert (LedgerState.OPEN, 0) in seen and (LedgerState.CLOSED, 1) in seen


@pytest.mark.parametrize("digest", ["crc32c", "mac", "none"])
def test_a_walkit_digest_is_refused_and_nothing_written(store: ExpirableStore, digest: str) -> None:
    m = bk_manager(store)
    with pytest.raises(InvalidArgumentError, match="bk-") as info:
        m.create(meta(5, digest))
    assert info.value.context["digest"] == digest and not m.exists(5)


def test_records_bookkeeper_wrote_in_formats_1_2_and_3_are_read(store: ExpirableStore) -> None:
    m = bk_manager(store)
    store.create(m.path(1), (GOLDEN / "ledger-hmac").read_bytes(), make_parents=True)
    v2 = (b"BookieMetadataFormatVersion\t2\nquorumSize: 2\nensembleSize: 2\nlength: 10\nlastEntryId: 4\n"
          b"state: CLOSED\nsegment {\n  ensembleMember: \"h1:3181\"\n  ensembleMember: \"h2:3181\"\n"
          b"  firstEntryId: 0\n}\ndigestType: CRC32\npassword: \"pw\"\nackQuorumSize: 2\n")
    store.create(m.path(2), v2, make_parents=True)
    store.create(m.path(3), b"BookieMetadataFormatVersion\t1\n1\n1\n7\n0\th1:3181\n0\tCLOSED", make_parents=True)
    hmac, _ = m.read(1)
    assert (hmac.digest, hmac.bk_password, hmac.ensemble_size, hmac.ack_quorum) == ("bk-hmac", b"s3cret", 2, 1)
    assert hmac.ctime > 0  # none in the record: the znode's creation time, as BookKeeper
    two, _ = m.read(2)
    assert (two.digest, two.state, two.last_entry_id, two.length, two.bk_password) == (
        "bk-crc32", LedgerState.CLOSED, 4, 10, b"pw")
    one, _ = m.read(3)
    assert one.digest == "bk-crc32" and one.bk_password is None and one.check_password(b"")
    # written back as format 3, still without a password or digest type (BookKeeper takes the reader's)
    m.update(3, lambda md: md.replace_bookie(0, "h1:3181", "h9:3181"))
    rewritten = decode_ledger_metadata(store.get(m.path(3))[0])
    assert rewritten.format_version == 3 and rewritten.password is None and rewritten.digest is None
    assert rewritten.segments == ((0, ("h9:3181",)),) and rewritten.last_entry_id == 0
    _, version = m.update(2, lambda md: md.replace_bookie(0, "h1:3181", "h3:3181"))
    record = decode_ledger_metadata(store.get(m.path(2))[0])
    assert version == 1 and record.format_version == 3 and record.segments[0][1] == ("h3:3181", "h2:3181")


def test_ids_come_from_bookkeepers_31_bit_generator(store: ExpirableStore) -> None:
    m = bk_manager(store, id_range=4)
    ids = [m.new_ledger_id() for _ in range(6)]
    assert ids[:4] == [0, 1, 2, 3] and ids == sorted(set(ids)) and ids[-1] < INT_MAX
    assert store.exists(f"{ROOT}/idgen") is not None and store.exists(f"{ROOT}/idgen-long") is None
    # the drawn ID- nodes of the last range stay until the next draw (ephemeral)
    assert all(name.startswith("ID-") for name in store.children(f"{ROOT}/idgen"))


def test_flat_draws_below_the_root(store: ExpirableStore) -> None:
    m = bk_manager(store, "flat", id_range=2)
    ids = [m.new_ledger_id() for _ in range(3)]
    assert ids == sorted(set(ids)) and ids[-1] < INT_MAX and ids[1] == ids[0] + 1
    assert store.exists(f"{ROOT}/idgen") is None
    assert any(name.startswith("ID-") for name in store.children(ROOT))


def test_once_idgen_long_exists_ids_are_long(store: ExpirableStore) -> None:
    """A Java client past the 31-bit ids made idgen-long: every generator then draws from
    the highest HOB (HOB-0000000001 made when there is none)."""
    bk_manager(store)
    store.create(f"{ROOT}/idgen-long")
    m = bk_manager(store, id_range=2)
    ids = [m.new_ledger_id() for _ in range(3)]
    assert ids[:2] == [(1 << 32) | 0, (1 << 32) | 1] and ids == sorted(set(ids)) and ids[-1] >> 32 == 1
    store.create(f"{ROOT}/idgen-long/HOB-0000000007")
    other = bk_manager(store, id_range=1)
    assert other.new_ledger_id() == 7 << 32


def test_ids_are_unique_across_managers_and_threads(store: ExpirableStore, driver: Driver) -> None:
    managers = [bk_manager(driver.make_store(), id_range=r) for r in (1, 8, 64)]
    ids: list[int] = []
    lock = threading.Lock()

    def work(m: LedgerManager) -> None:
        got = [m.new_ledger_id() for _ in range(40)]
        with lock:
            ids.extend(got)

    threads = [threading.Thread(target=work, args=(managers[i % 3],)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 240 and len(set(ids)) == 240 and max(ids) < INT_MAX


def test_listing_skips_bookkeepers_special_nodes_and_walkits_own(store: ExpirableStore) -> None:
    m = bk_manager(store)
    wanted = [3, 12_345, INT_MAX - 1, INT_MAX, 2**40]
    for lid in wanted:
        m.create(meta(lid))
    info = m.cluster
    for path in (f"{ROOT}/cookies/127.0.0.1:3181", f"{ROOT}/underreplication/ledgers", f"{ROOT}/idgen-long/HOB-0000000001",
                 walkit_path(info, "logs/ns/log"), f"{ROOT}/available/127.0.0.1:3181"):
        store.create(path, b"x", make_parents=True)
    m.new_ledger_id()  # ID- nodes under idgen
    assert list(m.ledger_ids()) == wanted
    assert [i for _, _, ids in m.ledger_ranges() for i in ids] == wanted


def test_long_hierarchical_listing(store: ExpirableStore) -> None:
    m = bk_manager(store, "longhierarchical")
    wanted = [0, 9_999, 10_000, INT_MAX, 2**63 - 1]
    for lid in wanted:
        m.create(meta(lid))
    store.create(f"{ROOT}/00/0000/L0001", b"not a long ledger path", make_parents=True)
    assert list(m.ledger_ids()) == wanted
    ranges = list(m.ledger_ranges())
    assert ranges[0] == (0, 9_999, [0, 9_999]) and ranges[1] == (10_000, 19_999, [10_000])
    assert ranges[-1][1] == 2**63 - 1 and ranges[-1][2] == [2**63 - 1]


def _set_counter(directory: str, path: str, counter: int) -> None:
    """The local store's sequence counter of ``path``: the next sequential child's number."""
    with sqlite3.connect(Path(directory) / "metadata.sqlite") as db:
        assert db.execute("UPDATE nodes SET cversion = ? WHERE path = ?", (counter, path)).rowcount == 1


def test_ids_cross_from_31_bits_to_long_as_bookkeeper(driver: Driver) -> None:
    """The sequence state is made just below Integer.MAX_VALUE (the local store's counter
    is its parent's cversion): the last 31-bit ids, then idgen-long, HOB-0000000001, and
    a full HOB moves on to the next."""
    if driver.spec.driver != "local":
        pytest.skip("ZooKeeper's sequence counter cannot be set from outside")
    store = driver.make_store()
    assert bk_manager(store, id_range=1).new_ledger_id() == 0  # makes idgen
    _set_counter(driver.spec.location, f"{ROOT}/idgen", INT_MAX - 2)
    m = bk_manager(store, id_range=4)
    assert [m.new_ledger_id() for _ in range(2)] == [INT_MAX - 2, INT_MAX - 1]  # the range's rest overflowed
    assert store.exists(f"{ROOT}/idgen-long") is None
    assert m.new_ledger_id() == 1 << 32  # now on idgen-long/HOB-0000000001
    assert store.exists(f"{ROOT}/idgen-long/HOB-0000000001") is not None
    ids = [m.new_ledger_id() for _ in range(3)]
    assert ids == sorted(set(ids)) and all(i >> 32 == 1 for i in ids) and ids[0] == (1 << 32) | 1
    other = bk_manager(store, id_range=1)  # a new generator sees idgen-long: long at once
    assert other.new_ledger_id() >> 32 == 1
    _set_counter(driver.spec.location, f"{ROOT}/idgen-long/HOB-0000000001", INT_MAX - 1)
    last = bk_manager(store, id_range=1)
    assert last.new_ledger_id() == (1 << 32) | (INT_MAX - 1)
    assert last.new_ledger_id() == 2 << 32  # HOB-0000000001 full: HOB-0000000002
    assert sorted(store.children(f"{ROOT}/idgen-long")) == ["HOB-0000000001", "HOB-0000000002"]


def test_flat_ids_end_at_31_bits(driver: Driver) -> None:
    if driver.spec.driver != "local":
        pytest.skip("ZooKeeper's sequence counter cannot be set from outside")
    store = driver.make_store()
    bk_manager(store, "flat")
    _set_counter(driver.spec.location, ROOT, INT_MAX - 1)
    m = bk_manager(store, "flat", id_range=2)
    assert m.new_ledger_id() == INT_MAX - 1
    with pytest.raises(MetadataError, match="exhausted"):
        m.new_ledger_id()


@pytest.mark.parametrize("layout", ["hierarchical", "longhierarchical"])
def test_delete_removes_the_directories_it_leaves_empty_as_bookkeeper(store: ExpirableStore, layout: str) -> None:
    m = bk_manager(store, layout)
    for lid in (7, 8, 2**40 + 3):
        m.create(meta(lid))
    before = sorted(store.children(ROOT))
    m.delete(7)
    assert store.exists(m.path(8)) is not None  # its directory still holds 8
    m.delete(2**40 + 3)
    top = m.path(2**40 + 3).split("/")[2]
    assert store.exists(f"{ROOT}/{top}") is None or top == m.path(8).split("/")[2]
    m.delete(8)
    assert sorted(store.children(ROOT)) == [n for n in before if not n.isdigit()]  # every ledger directory gone
    assert list(m.ledger_ids()) == []
    m.create(meta(8))  # and made again by the next create
    assert list(m.ledger_ids()) == [8]
