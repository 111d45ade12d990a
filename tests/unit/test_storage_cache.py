"""The ledger storage's read caches (bookie/storage/_cache.py): single reads that go to an
entry log read ahead and later ones are answered from memory; copies never outlive an
overwrite, a delete or a re-created ledger; damage further on does not fail the read;
both caches stay within their bounds under a reader far behind the writer; log buffers
written lately answer preads, short at the log's end as the file would be."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest

from bookie.fs import read_all
from bookie.fs.mem import MemFS
from bookie.storage import LedgerStorage
from bookie.storage._cache import KeptFirst, ReadAheadCache, RecentWrites
from bookie.storage._format import INDEX_HEADER_SIZE, LOG_HEADER_SIZE, RECORD_HEADER, SLOT
from support.storage import Env, env, preads  # noqa: F401  (env, preads: fixtures)
from walkit.errors import CorruptionError, InvalidArgumentError, NoSuchEntryError, NoSuchLedgerError


def payload(ledger: int, entry: int, size: int = 300) -> bytes:
    return random.Random(ledger * 7919 + entry).randbytes(size)


def flushed(s: LedgerStorage, ledgers: list[int], entries: int, size: int = 300) -> None:
    for e in range(entries):
        for ledger in ledgers:
            s.add_entry(ledger, e, payload(ledger, e, size))
    s.flush()


# --- read-ahead ------------------------------------------------------------------------------------
def test_entry_by_entry_reads_go_to_the_disk_once_a_batch(preads: list[tuple[str, int]]) -> None:
    s = LedgerStorage(MemFS(), ["/d"], read_ahead_batch=100, recent_writes_bytes=0)
    s.open()
    flushed(s, [1, 2], 300)  # two ledgers interleaved in one log
    s.close()
    s.open()  # nothing in memory
    preads.clear()
    assert [s.get_entry(1, e) for e in range(300)] == [payload(1, e) for e in range(300)]
    index = [n for p, n in preads if p.endswith(".idx")]
    logs = [n for p, n in preads if p.endswith(".log")]
    assert len(index) == 3 and len(logs) == 1 + 3  # a header when the log is opened, then a span a batch
    stats = s.cache_stats()["read_ahead"]
    assert (stats["hits"], stats["misses"], stats["filled"]) == (297, 3, 297)
    assert stats["hit_rate"] == 0.99 and 0 < stats["bytes"] <= 297 * 300
    s.close()


def test_the_last_entry_is_read_alone(preads: list[tuple[str, int]]) -> None:
    s = LedgerStorage(MemFS(), ["/d"], recent_writes_bytes=0)
    s.open()
    flushed(s, [1], 10)
    preads.clear()
    assert s.get_entry(1, 9) == payload(1, 9)
    assert s.cache_stats()["read_ahead"]["filled"] == 0
    assert [n for p, n in preads if p.endswith(".idx")] == [SLOT.size]  # its one slot, not a batch
    s.close()


def test_a_read_ahead_stays_within_its_batch_bytes() -> None:
    s = LedgerStorage(MemFS(), ["/d"], read_ahead_batch=100, read_ahead_batch_bytes=10 * 300)
    s.open()
    flushed(s, [1], 50)
    s.get_entry(1, 0)
    assert s.cache_stats()["read_ahead"]["filled"] == 9  # ten entries' bytes: the one asked for and nine
    s.close()


def test_an_add_over_a_copy_read_ahead_replaces_it(env: Env) -> None:
    s = env.storage()
    flushed(s, [0], 20)
    assert s.get_entry(0, 0) == payload(0, 0)
    assert s.memory_entry(0, 5) == payload(0, 5)  # read ahead
    s.add_entry(0, 5, b"rewritten")
    assert s.get_entry(0, 5) == b"rewritten" and s.memory_entry(0, 5) == b"rewritten"
    s.flush()
    assert s.get_entry(0, 5) == b"rewritten"
    assert s.get_entry(0, 6) == payload(0, 6)  # the other copies stay
    assert s.cache_stats()["read_ahead"]["hits"] >= 2


def test_a_deleted_ledger_is_not_answered_from_its_copies(env: Env) -> None:
    s = env.storage()
    flushed(s, [0], 20)
    s.get_entry(0, 0)
    s.delete_ledger(0)
    assert s.cache_stats()["read_ahead"]["bytes"] == 0
    with pytest.raises(NoSuchLedgerError):
        s.get_entry(0, 1)
    with pytest.raises(NoSuchLedgerError):
        s.memory_entry(0, 1)
    s.add_entry(0, 1, b"the new ledger 0")  # made again under the same id
    assert s.get_entry(0, 1) == b"the new ledger 0"
    with pytest.raises(NoSuchEntryError):
        s.get_entry(0, 2)


def test_a_read_ahead_that_raced_a_delete_and_a_new_ledger_is_never_served(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    s = env.storage()
    flushed(s, [0], 20)
    original = s._reads.get_entries

    def deleted_meanwhile(ledger_id: int, first: int, count: int, max_bytes: int) -> list[bytes]:
        got = original(ledger_id, first, count, max_bytes)  # the old ledger's bytes, read from its log
        s.delete_ledger(0)
        for e in range(20):
            s.add_entry(0, e, b"new %d" % e)
        return got

    monkeypatch.setattr(s._reads, "get_entries", deleted_meanwhile)
    assert s.get_entry(0, 0) == payload(0, 0)  # what was stored when the read began
    assert s.cache_stats()["read_ahead"]["bytes"] == 0  # the old ledger's entries were not kept
    monkeypatch.undo()
    assert s.memory_entry(0, 1) == b"new 1"  # the write buffer's, not a copy of the old ledger's
    s.flush()
    assert s.get_entry(0, 1) == b"new 1" and s.get_entry(0, 2) == b"new 2"
    assert s.cache_stats()["read_ahead"]["filled"] > 0  # the later read ahead fills for the new ledger


def test_reads_that_miss_together_share_one_read_ahead(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    s = env.storage()
    flushed(s, [0], 50)
    calls: list[int] = []
    original = s._reads.get_entries

    def slow(ledger_id: int, first: int, count: int, max_bytes: int) -> list[bytes]:
        calls.append(first)
        time.sleep(0.5)  # the other reads arrive meanwhile (any that come later find the copies: the same)
        return original(ledger_id, first, count, max_bytes)

    monkeypatch.setattr(s._reads, "get_entries", slow)
    got: dict[int, bytes] = {}
    threads = [threading.Thread(target=lambda e=e: got.__setitem__(e, s.get_entry(0, e))) for e in range(8)]
    threads[0].start()
    wait_until(lambda: calls == [0])  # entry 0's read-ahead is on its way
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join()
    assert got == {e: payload(0, e) for e in range(8)}
    assert calls == [0]  # the first read's read-ahead answered the seven others
    assert s.cache_stats()["read_ahead"]["hits"] == 7


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def test_an_add_while_a_read_ahead_is_on_the_disk_is_not_undone_by_it(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    s = env.storage()
    flushed(s, [0], 20)
    original = s._reads.get_entries

    def added_meanwhile(ledger_id: int, first: int, count: int, max_bytes: int) -> list[bytes]:
        got = original(ledger_id, first, count, max_bytes)  # entry 5's old bytes among them
        s.add_entry(0, 5, b"rewritten")
        return got

    monkeypatch.setattr(s._reads, "get_entries", added_meanwhile)
    assert s.get_entry(0, 0) == payload(0, 0)
    monkeypatch.undo()
    assert s.memory_entry(0, 6) == payload(0, 6)  # the others were kept
    s.flush()  # out of the write buffer: only the index (or a stale copy) could answer now
    assert s.get_entry(0, 5) == b"rewritten" and s.memory_entry(0, 5) is None


def test_a_read_ahead_that_finds_nothing_more_keeps_nothing(env: Env) -> None:
    s = env.storage()
    for e in (0, 2, 4, 6):  # a bookie holding every other entry (a striped ledger)
        s.add_entry(0, e, payload(0, e))
    s.add_entry(1, 0, payload(1, 0))
    s.flush()
    assert [s.get_entry(0, e) for e in (0, 2, 4)] == [payload(0, e) for e in (0, 2, 4)]
    stats = s.cache_stats()["read_ahead"]
    assert stats["filled"] == 0 and stats["bytes"] == 0 and s._shared.read_ahead.ledger_ids == {}


def _slot(env: Env, ledger: int, entry: int) -> tuple[str, int]:
    raw = read_all(env.fs, env.index_path(ledger))
    slot = SLOT.unpack_from(raw, INDEX_HEADER_SIZE + SLOT.size * entry)[0]
    return env.log_path(slot >> 32, ledger % env.ndirs), slot & 0xFFFFFFFF


def test_damage_further_on_does_not_fail_the_read_it_was_read_ahead_for(env: Env) -> None:
    s = env.storage()
    flushed(s, [0], 20)
    s.close()
    path, offset = _slot(env, 0, 5)
    f = env.fs.open(path)
    try:
        at = offset + RECORD_HEADER.size + 3
        f.pwrite(bytes([f.pread(1, at)[0] ^ 0x40]), at)
        f.sync()
    finally:
        f.close()
    s = env.storage()
    assert [s.get_entry(0, e) for e in range(5)] == [payload(0, e) for e in range(5)]
    with pytest.raises(CorruptionError, match=r"ledger=0 entry=5"):
        s.get_entry(0, 5)
    assert s.get_entry(0, 6) == payload(0, 6)


def test_the_cache_stays_within_its_bound_under_a_reader_far_behind_the_writer(env: Env) -> None:
    bound = 64 << 10
    s = env.storage(read_ahead_cache_bytes=bound, read_ahead_batch=50, recent_writes_bytes=bound,
                    write_buffer_size=8192)
    rng = random.Random(7)
    written = 0
    for _ in range(40):
        for e in range(written, written + 100):
            s.add_entry(0, e, payload(0, e, 1000))
        written += 100
        if rng.random() < 0.3:
            s.flush()
        for e in rng.sample(range(written), 20):  # anywhere behind the writer
            assert s.get_entry(0, e) == payload(0, e, 1000)
        caches = s.cache_stats()
        assert caches["read_ahead"]["bytes"] <= bound and caches["recent_writes"]["bytes"] <= bound, caches
    caches = s.cache_stats()
    assert caches["read_ahead"]["evicted"] > 0 and caches["recent_writes"]["evicted"] > 0, caches
    assert caches["read_ahead"]["hits"] > 0 and caches["recent_writes"]["hits"] > 0, caches


def test_caches_off() -> None:
    s = LedgerStorage(MemFS(), ["/d"], read_ahead_cache_bytes=0, recent_writes_bytes=0)
    s.open()
    flushed(s, [1], 30)
    assert [s.get_entry(1, e) for e in range(30)] == [payload(1, e) for e in range(30)]
    assert s.get_entries(1, 0, 30, 1 << 30) == [payload(1, e) for e in range(30)]
    caches = s.cache_stats()
    assert caches["read_ahead"]["filled"] == caches["recent_writes"]["filled"] == 0
    assert caches["read_ahead"]["hits"] == caches["recent_writes"]["hits"] == 0
    s.close()


@pytest.mark.parametrize("kw", [{"read_ahead_cache_bytes": -1}, {"read_ahead_batch": 0},
                                {"read_ahead_batch_bytes": -1}, {"recent_writes_bytes": -1}])
def test_bad_cache_bounds_are_refused(kw: dict[str, int]) -> None:
    with pytest.raises(InvalidArgumentError, match="cache bounds"):
        LedgerStorage(MemFS(), ["/d"], **kw)


# --- recent writes ---------------------------------------------------------------------------------
def test_buffers_written_out_lately_answer_reads_without_the_file(preads: list[tuple[str, int]]) -> None:
    s = LedgerStorage(MemFS(), ["/d"], write_buffer_size=4096, read_ahead_cache_bytes=0)
    s.open()
    flushed(s, [1, 2], 100)  # ~60 KiB: 15 buffers written out, all kept
    preads.clear()
    assert s.get_entries(1, 0, 100, 1 << 30) == [payload(1, e) for e in range(100)]
    assert [s.get_entry(2, e) for e in range(100)] == [payload(2, e) for e in range(100)]
    assert [n for p, n in preads if p.endswith(".log")] == [LOG_HEADER_SIZE]  # checked at open; then index slots
    assert s.cache_stats()["recent_writes"]["misses"] == 0
    s.close()


def test_reads_older_than_what_is_kept_go_to_the_file(preads: list[tuple[str, int]]) -> None:
    s = LedgerStorage(MemFS(), ["/d"], write_buffer_size=4096, read_ahead_cache_bytes=0, recent_writes_bytes=16 << 10)
    s.open()
    flushed(s, [1], 400)  # ~120 KiB written; the last 16 KiB kept
    preads.clear()
    assert s.get_entry(1, 0) == payload(1, 0)
    assert s.get_entry(1, 399) == payload(1, 399)
    log_reads = [n for p, n in preads if p.endswith(".log")]
    assert len(log_reads) == 2  # the log's header when it is opened, then entry 0; entry 399 from memory
    stats = s.cache_stats()["recent_writes"]
    assert stats["hits"] == 1 and stats["misses"] == 1 and stats["bytes"] <= 16 << 10
    s.close()


def test_a_log_removed_by_garbage_collection_leaves_the_cache() -> None:
    s = LedgerStorage(MemFS(), ["/d"], entry_log_size_limit=16 << 10, write_buffer_size=4096)
    s.open()
    flushed(s, [1], 120)  # rolls: sealed logs behind the active one
    s.delete_ledger(1)
    before = s.cache_stats()["recent_writes"]["bytes"]
    sealed = [info.log_id for info in s.entry_logs()]
    assert sealed and before > 0
    for log_id in sealed:
        s.remove_log(0, log_id)
    assert s.cache_stats()["recent_writes"]["bytes"] < before
    s.close()


def test_recent_writes_keep_the_newest_contiguous_bytes_of_each_log() -> None:
    r = RecentWrites(10)
    r.keep(0, 1, 0, b"abcd")
    r.keep(0, 1, 4, b"efgh")
    r.keep(0, 2, 0, b"XY")
    assert r.pread(0, 1, 5, 2) == b"cdefg"  # across two buffers
    assert r.pread(0, 1, 100, 6) == b"gh"  # short at the log's end, as a file's pread
    assert r.pread(0, 2, 2, 0) == b"XY" and r.pread(0, 3, 1, 0) is None and r.pread(1, 1, 1, 0) is None
    r.keep(0, 1, 8, b"ijk")  # 13 bytes: the oldest buffer goes
    assert r.pread(0, 1, 2, 0) is None and r.pread(0, 1, 7, 4) == b"efghijk" and r.stats.bytes == 9
    r.keep(0, 1, 11, b"0123456789A")  # larger than the bound: the log's older buffers go too
    assert r.pread(0, 1, 1, 8) is None and r.pread(0, 2, 2, 0) == b"XY" and r.stats.bytes == 2
    r.drop_log(0, 2)
    assert r.pread(0, 2, 2, 0) is None and r.stats.bytes == 0


def test_kept_first_reads_the_file_for_what_memory_lacks() -> None:
    fs = MemFS()
    f = fs.open("/log", create=True)
    f.pwrite(b"0123456789", 0)
    r = RecentWrites(100)
    r.keep(0, 1, 6, b"6789")
    kept = KeptFirst(f, r, 0, 1)
    assert kept.pread(3, 7) == b"789" and kept.pread(4, 2) == b"2345"
    assert (r.stats.hits, r.stats.misses) == (1, 1)


def test_read_ahead_cache_evicts_the_oldest_first() -> None:
    c = ReadAheadCache(10, batch=4, batch_bytes=100)
    state, other = object(), object()
    c.fill(1, 0, [b"aaaa", b"bbbb"], state)
    c.fill(2, 0, [b"cccc"], state)  # 12 bytes: ledger 1's entry 0 goes
    assert c.get(1, 0, state) is None and c.get(1, 1, state) == b"bbbb" and c.get(2, 0, state) == b"cccc"
    assert c.get(2, 0, other) is None  # another ledger under the same id
    assert set(c.ledger_ids) == {1, 2} and c.stats.evicted == 1
    c.drop(1, 1)
    c.drop_ledger(2)
    assert c.ledger_ids == {} and c.stats.bytes == 0
