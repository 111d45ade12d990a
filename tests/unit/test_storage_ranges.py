"""Batched reads of ledger storage (LedgerStorage.get_entries, bookie/storage/_ranges.py):
the same bytes as get_entry entry by entry, consecutive, within count and max bytes, from
write buffers, written-out logs, the index, several logs and interleaved ledgers; damage
detected; a log removed by compaction mid-read; and the preads it takes."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest

import bookie.storage._reads as reads_module
from bookie.fs import File, FileSystem, read_all
from bookie.fs.mem import MemFS
from bookie.storage import LedgerStorage
from bookie.storage._format import INDEX_HEADER_SIZE, RECORD_HEADER, SLOT
from bookie.storage._index import read_slots
from bookie.storage._ledgerdir import LedgerDir
from support.storage import Env, env, preads  # noqa: F401  (env, preads: fixtures)
from walkit.errors import CorruptionError, InvalidArgumentError, NoSuchEntryError, NoSuchLedgerError

BIG = 1 << 30  # a byte limit nothing here reaches


def log_reads(calls: list[tuple[str, int]]) -> list[int]:
    return [size for path, size in calls if path.endswith(".log")]


def index_reads(calls: list[tuple[str, int]]) -> list[int]:
    return [size for path, size in calls if path.endswith(".idx")]


def payload(ledger: int, entry: int) -> bytes:
    """Sizes from empty to past the first read of a record (4 KiB)."""
    rng = random.Random(ledger * 7919 + entry)
    return rng.randbytes(rng.choice([0, 1, 37, 300, 4090, 4100, 9000]))


def fill(s: LedgerStorage, ledgers: list[int], entries: int) -> dict[tuple[int, int], bytes]:
    """``entries`` entries of each ledger, the ledgers' adds interleaved (one log per dir)."""
    data: dict[tuple[int, int], bytes] = {}
    for e in range(entries):
        for ledger in ledgers:
            data[(ledger, e)] = payload(ledger, e)
            s.add_entry(ledger, e, data[(ledger, e)])
    return data


def expected(data: dict[tuple[int, int], bytes], ledger: int, first: int, count: int) -> list[bytes]:
    out = []
    for e in range(first, first + count):
        if (ledger, e) not in data:
            break
        out.append(data[(ledger, e)])
    return out


# --- where the entries are -------------------------------------------------------------------
SETUPS: dict[str, Callable[[Env], tuple[LedgerStorage, dict[tuple[int, int], bytes]]]] = {}


def setup(fn: Callable[[Env], tuple[LedgerStorage, dict[tuple[int, int], bytes]]]) -> None:
    SETUPS[fn.__name__] = fn


@setup
def in_the_write_buffer(env: Env) -> tuple[LedgerStorage, dict[tuple[int, int], bytes]]:
    s = env.storage(write_buffer_size=1 << 20)
    return s, fill(s, [0], 60)


@setup
def written_out_not_flushed(env: Env) -> tuple[LedgerStorage, dict[tuple[int, int], bytes]]:
    s = env.storage(write_buffer_size=2000)  # locations in the pending map, bytes in the file
    return s, fill(s, [0], 60)


@setup
def flushed(env: Env) -> tuple[LedgerStorage, dict[tuple[int, int], bytes]]:
    s = env.storage()
    data = fill(s, [0], 60)
    s.flush()
    return s, data


@setup
def reopened(env: Env) -> tuple[LedgerStorage, dict[tuple[int, int], bytes]]:
    s = env.storage()
    data = fill(s, [0], 60)
    s.close()
    return env.storage(), data


@setup
def mixed_with_overwrites(env: Env) -> tuple[LedgerStorage, dict[tuple[int, int], bytes]]:
    s = env.storage(write_buffer_size=20000)
    data = fill(s, [0], 40)
    s.flush()
    for e in list(range(40, 60)) + [3, 17]:  # re-added entries: the newer copy wins over the index
        data[(0, e)] = payload(0, e + 1000)
        s.add_entry(0, e, data[(0, e)])
    return s, data


@pytest.mark.parametrize("where", list(SETUPS))
def test_ranges_return_what_get_entry_returns(env: Env, where: str) -> None:
    s, data = SETUPS[where](env)
    assert [s.get_entry(0, e) for e in range(60)] == expected(data, 0, 0, 60)
    for first, count in [(0, 60), (0, 1000), (0, 1), (13, 20), (59, 1), (59, 65536), (30, 29)]:
        assert s.get_entries(0, first, count, BIG) == expected(data, 0, first, count), (first, count)


@pytest.mark.parametrize("flush", [False, True])
def test_a_range_stops_before_a_missing_entry(env: Env, flush: bool) -> None:
    s = env.storage()
    data = {(0, e): payload(0, e) for e in list(range(5)) + list(range(6, 10)) + [12]}
    for (ledger, e), value in data.items():
        s.add_entry(ledger, e, value)
    if flush:
        s.flush()
    assert s.get_entries(0, 0, 100, BIG) == expected(data, 0, 0, 5)
    assert s.get_entries(0, 6, 100, BIG) == expected(data, 0, 6, 4)
    assert s.get_entries(0, 12, 100, BIG) == [data[(0, 12)]]
    for first in (5, 10, 11, 13, 10**6, -1):
        with pytest.raises(NoSuchEntryError, match=f"ledger=0 entry={first}"):
            s.get_entries(0, first, 100, BIG)


@pytest.mark.parametrize("flush", [False, True])
def test_a_range_stops_at_count_and_max_bytes_but_always_sends_the_first(env: Env, flush: bool) -> None:
    s = env.storage()
    data = {(0, e): bytes([e]) * 100 for e in range(10)}
    for (ledger, e), value in data.items():
        s.add_entry(ledger, e, value)
    if flush:
        s.flush()
    assert len(s.get_entries(0, 0, 3, BIG)) == 3
    assert s.get_entries(0, 2, 3, 250) == expected(data, 0, 2, 2)  # a third would make 300
    assert s.get_entries(0, 2, 10, 300) == expected(data, 0, 2, 3)  # exactly the limit
    assert s.get_entries(0, 2, 10, 299) == expected(data, 0, 2, 2)
    assert s.get_entries(0, 4, 10, 50) == [data[(0, 4)]]  # the first alone is over the limit
    assert s.get_entries(0, 4, 10, 0) == [data[(0, 4)]]
    with pytest.raises(InvalidArgumentError):
        s.get_entries(0, 0, 0, BIG)
    with pytest.raises(InvalidArgumentError):
        s.get_entries(0, 0, 1, -1)


@pytest.mark.parametrize("flush", [False, True])
def test_interleaved_ledgers_in_one_log(env: Env, flush: bool) -> None:
    s = env.storage(write_buffer_size=3000)
    data = fill(s, [0, 2, 4], 50)  # even ledgers: one dir, one log, their records interleaved
    if flush:
        s.flush()
    for ledger in (0, 2, 4):
        assert s.get_entries(ledger, 0, 50, BIG) == expected(data, ledger, 0, 50)
        assert s.get_entries(ledger, 7, 11, BIG) == expected(data, ledger, 7, 11)


def test_a_range_across_entry_logs(env: Env) -> None:
    s = env.storage(entry_log_size_limit=16 << 10, write_buffer_size=3000)
    data = fill(s, [0, 2], 80)
    for e in range(0, 80, 30):  # some logs sealed, some entries still pending
        s.add_entry(0, e, data[(0, e)])
    s.flush()
    s.add_entry(0, 80, b"last")
    data[(0, 80)] = b"last"
    logs = [n for n in env.fs.listdir(f"{env.dirs[0]}/current/logs") if n.endswith(".log")]
    assert len(logs) > 5
    assert s.get_entries(0, 0, 100, BIG) == expected(data, 0, 0, 81)
    assert s.get_entries(2, 5, 60, BIG) == expected(data, 2, 5, 60)


def test_unknown_and_deleted_ledgers(env: Env) -> None:
    s = env.storage()
    with pytest.raises(NoSuchLedgerError):
        s.get_entries(1, 0, 10, BIG)
    s.set_master_key(3, b"k")  # a ledger without entries
    with pytest.raises(NoSuchEntryError):
        s.get_entries(3, 0, 10, BIG)
    s.add_entry(5, 0, b"x")
    s.flush()
    s.delete_ledger(5)
    with pytest.raises(NoSuchLedgerError):
        s.get_entries(5, 0, 10, BIG)


def test_ranges_while_adds_and_flushes_go_on() -> None:
    """Every answer is a consecutive run of the entries as added, however the adds, the
    buffer write-outs, the log rolls and the flushes interleave with it."""
    s = LedgerStorage(MemFS(), ["/d0", "/d1"], entry_log_size_limit=32 << 10, write_buffer_size=2048)
    s.open()
    added = [0]
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for e in range(1500):
                s.add_entry(1, e, payload(1, e)[:500])
                s.add_entry(3, e, b"other")
                added[0] = e + 1
                if e % 97 == 0:
                    s.flush()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            stop.set()

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set() or rng.random() < 0.2:
                if not added[0]:
                    continue
                first = rng.randrange(added[0])
                got = s.get_entries(1, first, rng.randint(1, 300), rng.choice([BIG, 2000]))
                assert got and got == [payload(1, e)[:500] for e in range(first, first + len(got))]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert s.get_entries(1, 0, 2000, BIG) == [payload(1, e)[:500] for e in range(1500)]
    s.close()


# --- the preads it takes (MemFS) --------------------------------------------------------------
def test_a_ledger_written_in_order_is_read_with_one_index_and_one_log_pread(preads: list[tuple[str, int]]) -> None:
    s = LedgerStorage(MemFS(), ["/d"], read_ahead_cache_bytes=0, recent_writes_bytes=0)  # no cache
    s.open()
    data = fill(s, [0, 1, 2], 300)  # three ledgers interleaved in the one log
    s.close()
    s.open()  # no handle cached, nothing in memory
    preads.clear()
    assert s.get_entries(1, 0, 300, BIG) == expected(data, 1, 0, 300)
    assert len(index_reads(preads)) == 1
    assert len(log_reads(preads)) == 2  # the log header when it is opened, then the one span
    preads.clear()
    assert [s.get_entry(1, e) for e in range(300)] == expected(data, 1, 0, 300)
    assert len(index_reads(preads)) == 300 and len(log_reads(preads)) >= 300  # what the range saves
    s.close()


def test_reading_stops_where_max_bytes_stops_the_range(preads: list[tuple[str, int]]) -> None:
    s = LedgerStorage(MemFS(), ["/d"], recent_writes_bytes=0)  # every read from the file
    s.open()
    for e in range(200):
        s.add_entry(0, e, bytes([e]) * 10_000)
    s.flush()
    s.get_entries(0, 0, 1, BIG)  # opens the log (its header read)
    preads.clear()
    got = s.get_entries(0, 0, 200, 35_000)
    assert got == [bytes([e]) * 10_000 for e in range(3)]
    assert sum(log_reads(preads)) < 4 * (10_000 + RECORD_HEADER.size) + 4096
    preads.clear()
    assert s.get_entries(0, 50, 200, 0) == [bytes([50]) * 10_000]
    assert sum(log_reads(preads)) <= 10_000 + 2 * RECORD_HEADER.size  # its record, the next one's header
    s.close()


def test_a_span_never_reads_more_than_the_span_limit_at_once(preads: list[tuple[str, int]]) -> None:
    s = LedgerStorage(MemFS(), ["/d"], recent_writes_bytes=0)  # every read from the file
    s.open()
    for e in range(12):
        s.add_entry(0, e, bytes([e]) * (700 << 10))
    s.flush()
    s.get_entries(0, 0, 1, BIG)
    preads.clear()
    assert s.get_entries(0, 0, 12, BIG) == [bytes([e]) * (700 << 10) for e in range(12)]
    reads = log_reads(preads)
    assert max(reads) <= 4 << 20, reads  # 4 MiB: bookie.storage._ranges._MAX_SPAN
    # records farther apart than _MAX_GAP are read one by one, each in one pread once the
    # first told their size (the first: its header, then the rest)
    assert len(reads) == 13 and sum(reads) <= 12 * ((700 << 10) + RECORD_HEADER.size) + 4096, reads
    s.close()


def test_a_ledger_written_among_others_is_read_without_their_bytes(preads: list[tuple[str, int]]) -> None:
    s = LedgerStorage(MemFS(), ["/d"], recent_writes_bytes=0)  # every read from the file
    s.open()
    for e in range(50):  # ledger 0's small entries between ledger 2's large ones, in one log
        s.add_entry(0, e, bytes([e]) * 1000)
        s.add_entry(2, e, bytes([e]) * (200 << 10))
        s.flush()  # each pair placed by its own flush: interleaved (one flush would sort them)
    s.get_entries(0, 0, 1, BIG)  # opens the log (its header read)
    preads.clear()
    assert s.get_entries(0, 0, 50, BIG) == [bytes([e]) * 1000 for e in range(50)]
    assert sum(log_reads(preads)) <= 50 * 4096, "ledger 2's 10 MB are not read to answer ledger 0"
    preads.clear()
    assert s.get_entries(2, 0, 50, BIG) == [bytes([e]) * (200 << 10) for e in range(50)]
    assert len(log_reads(preads)) <= 51 and sum(log_reads(preads)) <= 50 * ((200 << 10) + 1100) + 4096
    s.close()


def test_entries_in_memory_are_taken_only_as_far_as_max_bytes_can_take_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries in the write cache, and entries placed in a log buffer that waits for room
    on a full disk: a run takes them up to its byte budget, and copies out of the buffer
    only what it takes (the lock is held meanwhile)."""
    fs = MemFS()
    s = LedgerStorage(fs, ["/d"], write_buffer_size=4 << 20, recent_writes_bytes=0)
    s.open()
    for e in range(1000):
        s.add_entry(0, e, bytes([e % 256]) * 1000)
    assert s.get_entries(0, 10, 1000, 3500) == [bytes([e]) * 1000 for e in range(10, 13)]  # from the cache
    fs.capacity = fs.used_bytes()  # the flush places them, then finds no room for the buffer
    with pytest.raises(OSError, match="No space left"):
        s.flush()
    assert s.pending_index_entries() == 1000
    copied: list[int] = []
    read_buffered = LedgerDir.read_buffered

    def counting(self: LedgerDir, location: int, ledger_id: int, entry_id: int) -> bytes | None:
        copied.append(entry_id)
        return read_buffered(self, location, ledger_id, entry_id)

    monkeypatch.setattr(LedgerDir, "read_buffered", counting)
    assert s.get_entries(0, 10, 1000, 3500) == [bytes([e]) * 1000 for e in range(10, 13)]
    assert copied == list(range(10, 14))  # under the storage lock: the fourth one shows the limit passed
    fs.capacity = None
    s.close()


# --- damage: detected as get_entry detects it ---------------------------------------------------
def _slot(env: Env, entry: int) -> tuple[str, int]:
    raw = read_all(env.fs, env.index_path(0))
    slot = SLOT.unpack_from(raw, INDEX_HEADER_SIZE + SLOT.size * entry)[0]
    return env.log_path(slot >> 32), slot & 0xFFFFFFFF


def _patch(env: Env, path: str, offset: int, data: bytes) -> None:
    f = env.fs.open(path)
    try:
        f.pwrite(data, offset)
        f.sync()
    finally:
        f.close()


def _flip(env: Env, path: str, offset: int) -> None:
    _patch(env, path, offset, bytes([read_all(env.fs, path)[offset] ^ 0x40]))


def _flip_data(env: Env) -> None:
    path, off = _slot(env, 1)
    _flip(env, path, off + RECORD_HEADER.size + 3)


def _flip_crc(env: Env) -> None:
    path, off = _slot(env, 1)
    _flip(env, path, off + 5)


def _huge_length(env: Env) -> None:
    path, off = _slot(env, 1)
    _patch(env, path, off, b"\xff\xff\xff\x7f")


def _slot_points_at_another_ledgers_record(env: Env) -> None:
    raw = read_all(env.fs, env.index_path(2))
    _patch(env, env.index_path(0), INDEX_HEADER_SIZE + 8, raw[INDEX_HEADER_SIZE + 8 : INDEX_HEADER_SIZE + 16])


def _slot_points_past_the_end(env: Env) -> None:
    _patch(env, env.index_path(0), INDEX_HEADER_SIZE + 8, SLOT.pack((1 << 32) | 1 << 20))


def _slot_points_at_a_missing_log(env: Env) -> None:
    _patch(env, env.index_path(0), INDEX_HEADER_SIZE + 8, SLOT.pack((99 << 32) | 600))


CORRUPTORS: list[Callable[[Env], None]] = [
    _flip_data, _flip_crc, _huge_length, _slot_points_at_another_ledgers_record, _slot_points_past_the_end,
    _slot_points_at_a_missing_log,
]


@pytest.mark.parametrize("corrupt", CORRUPTORS, ids=lambda c: c.__name__.strip("_"))
def test_a_damaged_record_in_a_range_raises_corruption(env: Env, corrupt: Callable[[Env], None]) -> None:
    s = env.storage()
    for e in range(3):
        for ledger in (0, 2):  # one dir, one log: the records interleaved
            s.add_entry(ledger, e, f"L{ledger}E{e}".encode() * 10)
    s.close()
    corrupt(env)
    s = env.storage()
    with pytest.raises(CorruptionError, match=r"ledger=0 entry=1"):
        s.get_entry(0, 1)
    with pytest.raises(CorruptionError, match=r"ledger=0 entry=1"):
        s.get_entries(0, 0, 3, BIG)
    with pytest.raises(CorruptionError, match=r"ledger=0 entry=1"):
        s.get_entries(0, 1, 3, BIG)
    assert s.get_entries(0, 0, 1, BIG) == [b"L0E0" * 10]  # the range ends before the damage
    assert s.get_entries(0, 2, 3, BIG) == [b"L0E2" * 10]


# --- compaction removes a log between the index read and the log read ----------------------
def test_a_log_compacted_away_mid_read_is_read_again_entry_by_entry(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    s = env.storage(entry_log_size_limit=16 << 10, write_buffer_size=3000)
    data = fill(s, [0], 40)
    s.flush()  # the logs that rolled are sealed now: log 1 holds the first entries
    assert any(info.log_id == 1 for info in s.entry_logs())
    assert any(slot >> 32 == 1 for slot in slots_on_disk(env, 0, 40))
    compacted: list[int] = []

    def compact_after(f: File, first: int, count: int) -> list[int]:
        slots = read_slots(f, first, count)
        if not compacted:  # the read has its locations; now log 1 goes
            moved, _ = s.relocate(0, 1, list(s.log_records(0, 1)))
            s.flush()
            s.remove_log(0, 1)
            compacted.append(moved)
        return slots

    monkeypatch.setattr(reads_module, "read_slots", compact_after)
    assert s.get_entries(0, 0, 40, BIG) == expected(data, 0, 0, 40)
    assert compacted and compacted[0] > 0 and not env.fs.exists(env.log_path(1))
    assert all(slot >> 32 != 1 for slot in slots_on_disk(env, 0, 40))  # moved, and the read found them


def slots_on_disk(env: Env, ledger: int, count: int) -> list[int]:
    raw = read_all(env.fs, env.index_path(ledger))
    return [SLOT.unpack_from(raw, INDEX_HEADER_SIZE + SLOT.size * e)[0] for e in range(count)]
