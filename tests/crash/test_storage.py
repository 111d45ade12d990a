"""Ledger storage: behaviour on MemFS and RealFS, corruption table, crash safety on MemFS."""

from __future__ import annotations

import errno
import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from bookie.fs import FileSystem, is_no_space, read_all
from bookie.fs.faulty import FaultyFS
from bookie.fs.mem import MemFS, PowerLoss, _MemFile
from bookie.storage import LedgerStorage
from bookie.storage import _storage as storage_module
from bookie.storage._format import INDEX_HEADER_SIZE, LOG_HEADER_SIZE, RECORD_HEADER, SLOT
from bookie.storage._entrylog import open_log_for_read
from bookie.storage._handles import HandleCache
from bookie.storage._ledgerdir import LedgerDir
from bookie.storage._usage import scan_records
from support.storage import Env, TearingFS, env, patch  # noqa: F401  (env: a fixture)
from walkit.errors import (
    CorruptionError,
    FormatError,
    InvalidArgumentError,
    NoSuchEntryError,
    NoSuchLedgerError,
    StorageError,
)


def _flip(fs: FileSystem, path: str, offset: int) -> None:
    byte = read_all(fs, path)[offset]
    patch(fs, path, offset, bytes([byte ^ 0x40]))


# --- behaviour ----------------------------------------------------------------------------
def test_add_get_overwrite(env: Env) -> None:
    s = env.storage()
    s.add_entry(7, 0, b"zero")
    s.add_entry(7, 1, b"")
    s.add_entry(7, 0, b"ZERO")
    assert s.get_entry(7, 0) == b"ZERO" and s.get_entry(7, 1) == b""
    s.flush()
    s.add_entry(7, 1, b"one")
    assert s.get_entry(7, 1) == b"one"
    s.flush()
    assert s.get_entry(7, 0) == b"ZERO" and s.get_entry(7, 1) == b"one"


def test_last_entry_and_ledgers(env: Env) -> None:
    s = env.storage()
    s.set_master_key(5, b"k")
    assert s.last_entry_id(5) == -1
    for e in (0, 1, 4):
        s.add_entry(3, e, b"x")
    assert s.last_entry_id(3) == 4 and s.ledgers() == [3, 5]
    s.flush()
    s.add_entry(3, 9, b"y")
    assert s.last_entry_id(3) == 9
    with pytest.raises(NoSuchEntryError):
        s.get_entry(3, 2)
    assert s.has_ledger(3) and not s.has_ledger(4)


def test_no_such_ledger_or_entry(env: Env) -> None:
    s = env.storage()
    with pytest.raises(NoSuchLedgerError):
        s.get_entry(1, 0)
    with pytest.raises(NoSuchLedgerError):
        s.last_entry_id(1)
    s.add_entry(1, 0, b"a")
    s.flush()
    for entry in (1, 10_000, -1):
        with pytest.raises(NoSuchEntryError):
            s.get_entry(1, entry)
    assert s.master_key(2) is None and not s.is_fenced(2) and s.explicit_lac(2) is None


def test_invalid_arguments(env: Env) -> None:
    s = env.storage()
    with pytest.raises(InvalidArgumentError):
        s.set_master_key(1, bytes(65))
    with pytest.raises(InvalidArgumentError):
        s.add_entry(1, -1, b"")
    with pytest.raises(InvalidArgumentError):
        s.add_entry(-1, 0, b"")
    with pytest.raises(InvalidArgumentError):
        s.set_explicit_lac(1, -2)
    with pytest.raises(InvalidArgumentError):
        LedgerStorage(env.fs, [], entry_log_size_limit=1 << 20)


def test_ledger_state_and_reopen(env: Env) -> None:
    s = env.storage()
    s.set_master_key(1, b"key-1")
    assert s.set_fenced(1) and not s.set_fenced(1)
    s.set_explicit_lac(1, 41)
    s.set_explicit_lac(2, 0)
    s.set_master_key(3, b"")
    for e in range(20):
        s.add_entry(1, e, f"entry-{e}".encode())
    s.close()
    for lac in (0, 5, 10):  # each round writes the next header sequence into the other copy
        s = env.storage()
        assert s.ledgers() == [1, 2, 3]
        assert (s.master_key(1), s.is_fenced(1), s.explicit_lac(1)) == (b"key-1", True, 41)
        assert (s.master_key(2), s.is_fenced(2), s.explicit_lac(2)) == (None, False, lac)
        assert s.master_key(3) == b""
        assert s.last_entry_id(1) == 19 and s.get_entry(1, 13) == b"entry-13"
        s.set_explicit_lac(2, lac + 5)
        s.close()


def test_delete_ledger(env: Env) -> None:
    s = env.storage()
    for ledger in (1, 2):
        s.set_master_key(ledger, b"k")
        s.add_entry(ledger, 0, b"flushed")
    s.flush()
    s.add_entry(1, 1, b"pending")
    s.delete_ledger(1)
    assert s.ledgers() == [2] and not env.fs.exists(env.index_path(1))
    with pytest.raises(NoSuchLedgerError):
        s.get_entry(1, 0)
    with pytest.raises(NoSuchLedgerError):
        s.delete_ledger(1)
    s.add_entry(1, 5, b"reborn")
    s.close()
    s = env.storage()
    assert s.ledgers() == [1, 2] and s.master_key(1) is None and s.last_entry_id(1) == 5
    with pytest.raises(NoSuchEntryError):
        s.get_entry(1, 0)


def test_ledgers_spread_over_dirs(env: Env) -> None:
    env.ndirs = 3
    s = env.storage()
    for ledger in range(9):
        s.add_entry(ledger, 0, bytes([ledger]) * 10)
    s.flush()
    for ledger in range(9):
        assert env.fs.exists(env.index_path(ledger))
        assert s.get_entry(ledger, 0) == bytes([ledger]) * 10
    assert all(env.logs(d) for d in range(3))


def test_entry_log_rolls(env: Env) -> None:
    s = env.storage(entry_log_size_limit=2048, write_buffer_size=700)
    data = {(l, e): random.Random(l * 100 + e).randbytes(150) for l in (0, 2) for e in range(40)}
    for (l, e), payload in data.items():
        s.add_entry(l, e, payload)
        if e % 13 == 0:
            s.flush()
    logs = env.logs(0)
    assert len(logs) > 5
    assert all(env.fs.open(p).size() <= 2048 for p in logs[:-1])
    assert all(s.get_entry(l, e) == v for (l, e), v in data.items())
    s.close()
    s = env.storage()
    assert all(s.get_entry(l, e) == v for (l, e), v in data.items())
    assert len(env.logs(0)) == len(logs)  # opening starts no log until something is added


def test_unflushed_entries_are_read_from_memory(env: Env) -> None:
    s = env.storage()
    s.add_entry(0, 0, b"buffered")
    s.add_entry(0, 1, b"x" * 1000)
    assert s.get_entry(0, 0) == b"buffered" and s.get_entry(0, 1) == b"x" * 1000
    assert env.logs(0) == []  # nothing written yet: the entries wait in the write cache
    assert s.pending_index_entries() == 2
    s.flush()
    assert s.pending_index_entries() == 0 and s.get_entry(0, 0) == b"buffered"


def test_a_flush_places_each_ledgers_entries_together(env: Env) -> None:
    """Entries of ledgers 0, 2 and 4 (one dir's) added interleaved are placed by the
    flush ledger by ledger, entry by entry: each ledger's records lie one after another,
    in entry order, whatever order they came in."""
    s = env.storage()
    order = [(ledger, e) for e in range(30) for ledger in (4, 0, 2)]
    random.Random(3).shuffle(order)
    for ledger, e in order:
        s.add_entry(ledger, e, b"L%dE%d" % (ledger, e) * 10)
    s.flush()
    f = open_log_for_read(env.fs, env.log_path(1, 0), 1)
    try:
        records = [(ledger, entry_id) for _, ledger, entry_id, _ in scan_records(f, 1)]
    finally:
        f.close()
    assert records == [(ledger, e) for ledger in (0, 2, 4) for e in range(30)]
    s.close()
    s = env.storage()
    assert all(s.get_entry(ledger, e) == b"L%dE%d" % (ledger, e) * 10 for ledger, e in order)


def test_adds_are_not_starved_by_a_placing_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush places the cache a batch per hold of the storage lock and lets a waiting
    add take the lock between batches: an add made while a placement runs waits for the
    batch under way, not for many (a lock released and retaken at once starved adds for
    a whole checkpoint: add p99 ~90 ms in ``walkit bench bookie``). Slow appends (0.5 ms
    an entry, 10 a batch) make the batches long enough to count."""
    monkeypatch.setattr(storage_module, "PLACE_BATCH", 10)
    append = LedgerDir.append
    appended = [0]

    def slow_run(self: LedgerDir, ledger_id: int, entry_ids: list[int], slots: dict[int, bytes],
                 table: dict[int, int]) -> int:  # the placement's run, an append at a time
        self.run_placed = 0
        for entry_id in entry_ids:
            time.sleep(0.0005)
            appended[0] += 1
            table[entry_id] = append(self, ledger_id, entry_id, slots[entry_id])
            self.run_placed += 1
        return self.run_placed

    monkeypatch.setattr(LedgerDir, "append_run", slow_run)
    trials, waited_a_batch = 30, 0
    for _ in range(trials):
        s = LedgerStorage(MemFS(), ["/d"])
        s.open()
        for e in range(100):
            s.add_entry(1, e, b"x" * 100)
        appended[0] = 0
        flusher = threading.Thread(target=s.flush)
        flusher.start()
        deadline = time.monotonic() + 30
        while appended[0] < 25:  # the placement is under way, mid-batch
            assert flusher.is_alive() and time.monotonic() < deadline, "the placement did not get under way"
            time.sleep(0.0002)
        before = appended[0]
        s.add_entry(2, 0, b"y")
        waited_a_batch += appended[0] - before >= 10
        flusher.join()
        assert s.get_entry(1, 99) == b"x" * 100 and s.get_entry(2, 0) == b"y"
        s.close()
    assert waited_a_batch <= trials // 3, f"{waited_a_batch} of {trials} adds waited for a whole batch or more"


@pytest.mark.parametrize("every", [64 << 10, 0])
def test_a_flush_syncs_its_logs_as_it_places_them(monkeypatch: pytest.MonkeyPatch, every: int) -> None:
    """With ``placement_sync_bytes`` (flushEntrylogBytes), a flush syncs a dir's log each
    time that much more of it was written out - checked after each batch it places
    (``PLACE_BATCH_BYTES``) - outside the storage lock, before the index is written: the
    writeback goes out in small syncs, each with new data, not one large one a journal on
    the same disk would wait behind. With 0, the log is synced once, after the placement."""
    s = LedgerStorage(MemFS(), ["/d"], placement_sync_bytes=every)  # log buffers of 256 KiB
    s.open()
    for e in range(6300):
        s.add_entry(e % 7, e // 7, b"x" * 1000)  # ~6.3 MB, 7 ledgers interleaved
    synced: list[int] = []  # the log's length at each of its syncs
    sync = _MemFile.sync

    def spy(self: _MemFile) -> None:
        if self.path.endswith(".log"):
            assert not s._shared.lock.locked(), "a log synced under the storage lock"
            synced.append(len(self._inode.data))
        sync(self)

    monkeypatch.setattr(_MemFile, "sync", spy)
    s.flush()
    if every:
        assert len(synced) >= 6  # about one a batch placed (~6 of them), and the flush's own
        assert synced[0] > 0 and all(a < b for a, b in zip(synced, synced[1:])), synced  # each found new data
        gaps = [b - a for a, b in zip([0] + synced, synced)]
        assert max(gaps) <= storage_module.PLACE_BATCH_BYTES + (256 << 10) + 8192, gaps  # a batch and a buffer
    else:
        assert len(synced) == 1 and synced[0] > 6_300_000  # once, everything placed
    monkeypatch.undo()
    assert all(s.get_entry(e % 7, e // 7) == b"x" * 1000 for e in range(6300))
    s.close()


def test_a_placement_yields_by_the_entries_placed_not_by_the_ledgers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The placement holds the lock once per ``PLACE_BATCH`` entries (or
    ``PLACE_BATCH_BYTES``) placed, across ledgers, and yields (``time.sleep(0)``) after
    each full batch: a cache of 3,000 ledgers of one entry each is placed in 3 holds of
    the lock and 2 yields, not 3,000 (each yield may wait a switch interval, 5 ms, for a
    busy thread to give the interpreter back)."""
    s = LedgerStorage(MemFS(), ["/d"])
    s.open()
    for ledger in range(3000):
        s.add_entry(ledger, 0, b"e%d" % ledger)
    yields: list[float] = []
    me, sleep = threading.current_thread(), time.sleep  # time.sleep is every thread's: count only ours
    monkeypatch.setattr(time, "sleep",
                        lambda seconds: yields.append(seconds) if threading.current_thread() is me else sleep(seconds))
    batches = []
    place_batch = s._placement._place_batch
    monkeypatch.setattr(s._placement, "_place_batch", lambda batch, synced: (batches.append(len(batch)), place_batch(batch, synced)))
    s.flush()
    monkeypatch.undo()
    assert yields == [0] * (3000 // storage_module.PLACE_BATCH)
    assert batches == [1024, 1024, 952]  # ledgers a hold of the lock: one batch each
    assert all(s.get_entry(ledger, 0) == b"e%d" % ledger for ledger in range(0, 3000, 7))
    s.close()


def test_the_write_cache_is_read_like_the_storage(env: Env) -> None:
    """Entries waiting in the write cache are read, listed, re-added, deleted and read in
    runs as placed ones are; a re-add replaces the cached copy, also of an entry already
    placed; a flush leaves nothing cached."""
    s = env.storage()
    for e in range(5):
        s.add_entry(0, e, b"old%d" % e)
    s.flush()  # entries 0-4 placed and indexed
    s.add_entry(0, 3, b"new3")  # cached, newer than the placed copy
    for e in range(5, 8):
        s.add_entry(0, e, b"c%d" % e)
    assert s.get_entry(0, 3) == b"new3" and s.memory_entry(0, 3) == b"new3" and s.get_entry(0, 6) == b"c6"
    assert s.get_entries(0, 2, 100, 1 << 20) == [b"old2", b"new3", b"old4", b"c5", b"c6", b"c7"]
    assert s.get_entries(0, 5, 100, 4) == [b"c5", b"c6"] and s.get_entries(0, 5, 100, 1) == [b"c5"]  # the budget
    assert s.stored_entries(0, 0, 10) == list(range(8)) and s.pending_index_entries() == 4
    s.add_entry(2, 0, b"two")
    s.delete_ledger(2)  # its cached entry goes with it
    with pytest.raises(NoSuchLedgerError):
        s.get_entry(2, 0)
    s.flush()
    assert s.pending_index_entries() == 0 and s.cached_bytes() == 0
    s.close()
    s = env.storage()
    assert [s.get_entry(0, e) for e in range(8)] == [b"old0", b"old1", b"old2", b"new3", b"old4", b"c5", b"c6", b"c7"]
    assert not s.has_ledger(2)


def test_a_full_write_cache_writes_adds_through(env: Env) -> None:
    """The write cache never holds more than twice its bound: past it (adds outrunning the
    flushes) an add is written straight to its log, as before the cache - unless the
    cache holds a copy of that entry, which the newer one then replaces there (newest
    wins, also after the flush). Deleting a ledger gives its cached bytes back."""
    s = env.storage(write_cache_bytes=4 << 10)  # through past 8 KiB
    for e in range(20):
        s.add_entry(0, e, bytes([e]) * 1024)
    assert 8 << 10 <= s.cached_bytes() < 9 << 10 and s.pending_index_entries() == 20
    assert env.logs(0), "the adds past the bound went to a log"
    s.add_entry(0, 3, b"newer")  # 3 is cached: the newer copy replaces it in the cache
    assert s.get_entry(0, 3) == b"newer" and [s.get_entry(0, e) for e in (0, 12, 19)] == [
        bytes([0]) * 1024, bytes([12]) * 1024, bytes([19]) * 1024]
    s.add_entry(2, 0, b"x" * 100)
    s.delete_ledger(0)
    assert s.cached_bytes() == 100  # ledger 2's add (cached: 3's shorter copy made room); nothing of 0's
    for e in range(20):
        s.add_entry(4, e, bytes([e]) * 1024)
    s.add_entry(4, 19, b"last")
    s.flush()
    assert s.cached_bytes() == 0 and s.pending_index_entries() == 0
    s.close()
    s = env.storage(write_cache_bytes=4 << 10)
    assert [s.get_entry(4, e) for e in range(19)] == [bytes([e]) * 1024 for e in range(19)]
    assert s.get_entry(4, 19) == b"last" and s.get_entry(2, 0) == b"x" * 100 and not s.has_ledger(0)


def test_many_index_files_through_a_small_handle_cache(env: Env) -> None:
    s = env.storage(open_index_files=3)
    for ledger in range(20):
        s.add_entry(ledger, 0, str(ledger).encode())
    s.flush()
    for ledger in list(range(20)) * 2:
        assert s.get_entry(ledger, 0) == str(ledger).encode()
    assert len(s._files.index) <= 3


class _Counted:
    """A file or a syncer whose syncs are counted in ``counts[name]``."""

    def __init__(self, inner: Any, counts: dict[str, int], name: str) -> None:
        self._inner, self._counts, self._name = inner, counts, name

    def sync(self) -> None:
        self._counts[self._name] = self._counts.get(self._name, 0) + 1
        self._inner.sync()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _count_index_syncs(s: LedgerStorage) -> dict[str, int]:
    """Counts of ``s``'s index file syncs ("file") and syncfs calls ("syncfs")."""
    counts: dict[str, int] = {}
    for d in s._dirs:
        if d.syncer is not None:
            d.syncer = _Counted(d.syncer, counts, "syncfs")  # type: ignore[assignment]
    opener = s._files.index._opener
    s._files.index._opener = lambda key, create: _Counted(opener(key, create), counts, "file")  # type: ignore[assignment,misc]
    return counts


def test_a_flush_of_many_index_files_syncs_them_with_one_syncfs(env: Env) -> None:
    """A flush that writes ``SYNCFS_FILES`` index files of a dir or more syncs them with
    one syncfs of that dir's file system, and the new names with a second one - no sync
    per file, no fsync per bucket; a dir with fewer files syncs each. All read back after
    a reopen (on the real disk and on MemFS)."""
    ledgers = 2 * storage_module.SYNCFS_FILES  # SYNCFS_FILES in each of the two dirs
    s = env.storage(slot_log_bytes=0)  # no slot log: every flush writes the index files
    if s._dirs[0].syncer is None:
        pytest.skip("no syncfs here (the pure-Python backend, or Linux before 5.8)")
    counts = _count_index_syncs(s)
    for ledger in range(ledgers):
        s.add_entry(ledger, 0, b"a%d" % ledger)
    s.flush()
    assert counts == {"syncfs": 4}  # data, then names, in each dir
    counts.clear()
    for ledger in range(ledgers):
        s.add_entry(ledger, 1, b"b%d" % ledger)
    s.flush()
    assert counts == {"syncfs": 2}  # no new name
    counts.clear()
    for ledger in (0, 1, 2):
        s.add_entry(ledger, 2, b"c%d" % ledger)
    s.flush()
    assert counts == {"file": 3}  # too few: each on its own
    s.close()
    s = env.storage()
    for ledger in range(ledgers):
        assert s.get_entries(ledger, 0, 10, 1 << 20)[:2] == [b"a%d" % ledger, b"b%d" % ledger]


def test_index_files_are_synced_one_by_one_without_a_syncer() -> None:
    """On a file system without syncfs every index file is synced on its own."""
    s = LedgerStorage(MemFS(syncfs=False), ["/d"])
    s.open()
    counts = _count_index_syncs(s)
    for ledger in range(3 * storage_module.SYNCFS_FILES):
        s.add_entry(ledger, 0, b"x")
    s.flush()
    assert counts == {"file": 3 * storage_module.SYNCFS_FILES}
    s.close()


def test_a_failure_from_before_the_opening_is_taken_at_open(caplog: pytest.LogCaptureFixture) -> None:
    """syncfs reports a background write failure that nobody was told of, also one from
    before its descriptor was opened: the storage takes it with a first syncfs at open
    (logged, not this opening's data), so its first checkpoint does not fail for it."""
    fs = FaultyFS(MemFS())
    fs.fail_syncs("/d/current/index")  # a failure nobody heard of yet, under the syncer's directory
    s = LedgerStorage(fs, ["/d"])
    with caplog.at_level("WARNING", logger="bookie.storage"):
        s.open()
    assert any("failed before the storage opened" in r.getMessage() for r in caplog.records)
    for ledger in range(storage_module.SYNCFS_FILES):
        s.add_entry(ledger, 0, b"x")
    s.flush()
    assert s.failure is None and fs.failed == 1
    s.close()


def test_a_failed_syncfs_fails_the_storage() -> None:
    """A syncfs that fails (a background writeback of the file system failed) fails the
    flush and the storage, as a failed fdatasync does; a reopen starts from what the
    previous flush made durable."""
    fs = FaultyFS(MemFS())
    s = LedgerStorage(fs, ["/d"], slot_log_bytes=0)  # the second flush writes the index files too
    s.open()
    for ledger in range(storage_module.SYNCFS_FILES):
        s.add_entry(ledger, 0, b"first")
    s.flush()
    for ledger in range(storage_module.SYNCFS_FILES):
        s.add_entry(ledger, 1, b"second")
    fs.fail_syncs("/d/current/index/00")  # a directory under the syncer's: its writeback failed
    with pytest.raises(OSError) as caught:
        s.flush()
    assert caught.value.errno == errno.EIO and fs.failed == 1
    with pytest.raises(StorageError):
        s.add_entry(0, 2, b"third")
    s.close()
    s.open()
    assert [s.get_entry(ledger, 0) for ledger in range(storage_module.SYNCFS_FILES)] == [b"first"] * storage_module.SYNCFS_FILES
    s.close()


def test_storage_fails_after_io_error() -> None:
    fs = MemFS()
    s = LedgerStorage(fs, ["/d"])
    s.open()
    s.add_entry(1, 0, b"a")
    fs.fail_next_sync()
    with pytest.raises(OSError):
        s.flush()
    with pytest.raises(StorageError):
        s.add_entry(1, 1, b"b")
    with pytest.raises(StorageError):
        s.flush()
    assert s.get_entry(1, 0) == b"a"  # reads keep working
    s.close()
    s.open()  # a reopen starts from what is on disk
    s.add_entry(1, 1, b"b")
    s.flush()


def test_concurrent_adds_reads_and_flushes() -> None:
    fs = MemFS()
    s = LedgerStorage(fs, ["/d0", "/d1"], entry_log_size_limit=64 << 10, write_buffer_size=4096)
    s.open()
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(ledger: int) -> None:
        try:
            for e in range(400):
                s.add_entry(ledger, e, f"{ledger}:{e}".encode() * 5)
                assert s.get_entry(ledger, e // 2) == f"{ledger}:{e // 2}".encode() * 5
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def flusher() -> None:
        while not stop.is_set():
            s.flush()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    checkpoint = threading.Thread(target=flusher)
    checkpoint.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    checkpoint.join()
    assert not errors
    s.close()
    fs.crash(random.Random(1))
    s.open()
    for ledger in range(4):
        assert all(s.get_entry(ledger, e) == f"{ledger}:{e}".encode() * 5 for e in range(400))


def test_pending_index_is_empty_after_flush() -> None:
    s = LedgerStorage(MemFS(), ["/d0", "/d1"])
    s.open()
    payload = b"p" * 16
    for i in range(100_000):
        s.add_entry(i % 50, i // 50, payload)
    assert s.pending_index_entries() == 100_000
    s.flush()
    assert s.pending_index_entries() == 0
    assert not s._shared.pending and not s._shared.flushing
    assert s.get_entry(49, 1999) == payload and s.last_entry_id(0) == 1999


def test_handle_cache_never_closes_a_pinned_handle() -> None:
    fs = MemFS()
    fs.makedirs("/h")
    cache: HandleCache[str] = HandleCache(lambda k, create: fs.open(f"/h/{k}", create=True), 1)
    with cache.use("a") as a:
        with cache.use("b") as b:
            b.pwrite(b"b", 0)
        a.pwrite(b"a", 0)  # "a" stayed open although the cache holds one handle
        cache.discard("a")
        a.pwrite(b"A", 0)
    assert read_all(fs, "/h/a") == b"A" and len(cache) == 1


# --- corruption: one driver, many corruptors ------------------------------------------------
def _record_offset(env: Env, entry: int) -> tuple[str, int]:
    raw = read_all(env.fs, env.index_path(0))
    slot = SLOT.unpack_from(raw, INDEX_HEADER_SIZE + SLOT.size * entry)[0]
    return env.logs(0)[(slot >> 32) - 1], slot & 0xFFFFFFFF


def _flip_data(env: Env) -> None:
    path, off = _record_offset(env, 1)
    _flip(env.fs, path, off + RECORD_HEADER.size + 3)


def _flip_crc(env: Env) -> None:
    path, off = _record_offset(env, 1)
    _flip(env.fs, path, off + 5)


def _zero_length(env: Env) -> None:
    path, off = _record_offset(env, 1)
    patch(env.fs, path, off, bytes(4))


def _huge_length(env: Env) -> None:
    path, off = _record_offset(env, 1)
    patch(env.fs, path, off, b"\xff\xff\xff\x7f")


def _slot_points_at_other_entry(env: Env) -> None:
    raw = read_all(env.fs, env.index_path(0))
    other = raw[INDEX_HEADER_SIZE + 16 : INDEX_HEADER_SIZE + 24]
    patch(env.fs, env.index_path(0), INDEX_HEADER_SIZE + 8, other)


def _slot_points_at_missing_log(env: Env) -> None:
    patch(env.fs, env.index_path(0), INDEX_HEADER_SIZE + 8, SLOT.pack((99 << 32) | 600))


def _slot_points_past_the_end(env: Env) -> None:
    patch(env.fs, env.index_path(0), INDEX_HEADER_SIZE + 8, SLOT.pack((1 << 32) | 1 << 20))


def _log_header_damaged(env: Env) -> None:
    _flip(env.fs, env.logs(0)[0], 20)


CORRUPTORS: list[Callable[[Env], None]] = [
    _flip_data, _flip_crc, _zero_length, _huge_length, _slot_points_at_other_entry,
    _slot_points_at_missing_log, _slot_points_past_the_end, _log_header_damaged,
]


@pytest.mark.parametrize("corrupt", CORRUPTORS, ids=lambda c: c.__name__.strip("_"))
def test_damaged_record_raises_corruption(env: Env, corrupt: Callable[[Env], None]) -> None:
    s = env.storage()
    for e in range(3):
        s.add_entry(0, e, f"payload-{e}".encode() * 4)
    s.close()
    corrupt(env)
    s = env.storage()
    with pytest.raises(CorruptionError, match=r"ledger=0 entry=1|path=\S*\.log"):
        s.get_entry(0, 1)


def test_torn_header_copy_keeps_the_other(env: Env) -> None:
    s = env.storage()
    s.set_master_key(0, b"first")
    s.flush()  # header seq 1 -> copy 1
    s.set_fenced(0)
    s.close()  # header seq 2 -> copy 0
    _flip(env.fs, env.index_path(0), 40)  # tear the newest copy
    s = env.storage()
    assert s.master_key(0) == b"first" and not s.is_fenced(0)
    s.close()
    _flip(env.fs, env.index_path(0), 512 + 40)  # and now the other one
    with pytest.raises(CorruptionError, match="both index header copies"):
        env.storage()


def test_foreign_file_in_logs_dir_is_refused(env: Env) -> None:
    env.storage().close()
    f = env.fs.open(f"{env.dirs[0]}/current/logs/notes.txt", create=True)
    f.close()
    with pytest.raises(FormatError, match="notes.txt"):
        env.storage()


def test_index_file_leftovers(env: Env) -> None:
    s = env.storage()
    s.add_entry(2, 0, b"x")
    s.close()
    leftover = env.index_path(4) + ".tmp"
    env.fs.makedirs(leftover.rsplit("/", 1)[0])
    f = env.fs.open(leftover, create=True)
    f.pwrite(bytes(INDEX_HEADER_SIZE) + SLOT.pack((1 << 32) | LOG_HEADER_SIZE), 0)
    f.close()
    s = env.storage()
    assert not s.has_ledger(4) and not env.fs.exists(leftover)
    s.close()
    patch(env.fs, env.index_path(2), 0, bytes(INDEX_HEADER_SIZE))  # a zeroed header is damage
    with pytest.raises(CorruptionError, match="both index header copies"):
        env.storage()


# --- crash safety (MemFS) -------------------------------------------------------------------
@dataclass
class Model:
    """What must survive a crash (``durable``) and what may (``maybe``)."""

    durable: dict[tuple[int, int], bytes] = field(default_factory=dict)
    maybe: dict[tuple[int, int], set[bytes]] = field(default_factory=dict)
    keys: dict[int, bytes] = field(default_factory=dict)
    maybe_keys: dict[int, set[bytes]] = field(default_factory=dict)
    fenced: set[int] = field(default_factory=set)
    lacs: dict[int, int] = field(default_factory=dict)
    maybe_lacs: dict[int, set[int]] = field(default_factory=dict)
    current: dict[tuple[int, int], bytes] = field(default_factory=dict)
    state: dict[int, tuple[bytes | None, bool, int | None]] = field(default_factory=dict)

    def flushed(self) -> None:
        self.durable = dict(self.current)
        self.maybe = {k: set() for k in self.current}
        self.keys = {l: k for l, (k, _, _) in self.state.items() if k is not None}
        self.fenced = {l for l, (_, f, _) in self.state.items() if f}
        self.lacs = {l: lac for l, (_, _, lac) in self.state.items() if lac is not None}
        self.maybe_keys, self.maybe_lacs = {}, {}

    def deleted(self, ledger: int) -> None:
        for table in (self.durable, self.maybe, self.current):
            for k in [k for k in table if k[0] == ledger]:
                del table[k]
        for table2 in (self.keys, self.maybe_keys, self.lacs, self.maybe_lacs, self.state):
            table2.pop(ledger, None)
        self.fenced.discard(ledger)


def _step(s: LedgerStorage, m: Model, rng: random.Random) -> None:
    ledger = rng.randrange(6)
    key, fenced, lac = m.state.get(ledger, (None, False, None))
    r = rng.random()
    if r < 0.7:
        entry = rng.randint(0, max([e for l, e in m.current if l == ledger], default=-1) + 1)
        data = rng.randbytes(rng.choice([0, 7, 100, 600, 1500]))
        m.maybe.setdefault((ledger, entry), set()).add(data)
        s.add_entry(ledger, entry, data)
        m.current[(ledger, entry)] = data
        m.state[ledger] = (key, fenced, lac)
    elif r < 0.78:
        key = rng.randbytes(rng.randint(0, 64))
        m.maybe_keys.setdefault(ledger, set()).add(key)
        s.set_master_key(ledger, key)
        m.state[ledger] = (key, fenced, lac)
    elif r < 0.83:
        s.set_fenced(ledger)
        m.state[ledger] = (key, True, lac)
    elif r < 0.88:
        lac = rng.randint(-1, 10**6)
        m.maybe_lacs.setdefault(ledger, set()).add(lac)
        s.set_explicit_lac(ledger, lac)
        m.state[ledger] = (key, fenced, lac)
    elif r < 0.9 and s.has_ledger(ledger):
        s.delete_ledger(ledger)
        m.deleted(ledger)
    elif r >= 0.9:
        _flush(s, m)


def _flush(s: LedgerStorage, m: Model) -> None:
    try:
        s.flush()
    except OSError as exc:
        if not is_no_space(exc):
            raise
        return  # a full disk: the flush was undone, nothing more is durable
    m.flushed()


def _check(s: LedgerStorage, m: Model) -> None:
    for (l, e), values in m.maybe.items():
        allowed = values | ({m.durable[(l, e)]} if (l, e) in m.durable else set())
        try:
            got = s.get_entry(l, e)
        except (NoSuchLedgerError, NoSuchEntryError):
            assert (l, e) not in m.durable, f"lost durable entry ledger={l} entry={e}"
            continue
        assert got in allowed, f"garbage for ledger={l} entry={e}"
    for l, k in m.keys.items():
        assert s.master_key(l) in {k} | m.maybe_keys.get(l, set())
    for l, lac in m.lacs.items():
        assert s.explicit_lac(l) in {lac} | m.maybe_lacs.get(l, set())
    assert all(s.is_fenced(l) for l in m.fenced)
    for l in s.ledgers():  # nothing the model never added (another incarnation's, a stale slot)
        last = s.last_entry_id(l)
        stored = s.stored_entries(l, 0, last + 5)
        assert all((l, e) in m.maybe for e in stored), f"unknown entries of ledger={l}: {stored}"
        assert last == -1 or last in stored, f"ledger={l}: last entry {last} not stored ({stored})"
        prefix = [s.get_entry(l, e) for e in itertools.takewhile(lambda e: e in stored, range(last + 1))]
        if prefix:
            assert s.get_entries(l, 0, last + 1, 1 << 30) == prefix, f"ledger={l}: a range read differs"


def _observed(s: LedgerStorage, m: Model) -> Model:
    """A model of what ``s`` holds after a crash (everything in it is durable now)."""
    seen = Model()
    for (l, e) in m.maybe:
        try:
            seen.current[(l, e)] = s.get_entry(l, e)
        except (NoSuchLedgerError, NoSuchEntryError):
            continue
    for l in s.ledgers():
        seen.state[l] = (s.master_key(l), s.is_fenced(l), s.explicit_lac(l))
    seen.flushed()
    return seen


def _crash_run(seed: int, syncfs: bool, rounds: int = 1) -> None:
    """``rounds`` times: random operations with a power cut somewhere, then a reopen that
    must hold everything durable (later rounds start from what the reopen holds)."""
    rng = random.Random(seed)
    fs = TearingFS(syncfs=syncfs)
    limits = {"entry_log_size_limit": rng.choice([2048, 8192, 1 << 20]),
              "write_buffer_size": rng.choice([512, 4096, 1 << 16]),
              "slot_log_bytes": rng.choice([0, 200, 2048, 1 << 20])}
    s = LedgerStorage(fs, ["/d0", "/d1"], **limits)
    s.open()
    m = Model()
    for round_ in range(rounds):
        ops = rng.randint(5, 60)
        arm_at = rng.randint(0, ops) if rng.random() < 0.7 else None
        full_at = rng.randint(0, ops) if rng.random() < 0.3 else None  # the disk fills there, for a while
        free_at = None if full_at is None else full_at + rng.randint(1, 20)
        try:
            for i in range(ops):
                if i == full_at:
                    fs.capacity = fs.used_bytes() + rng.randint(0, 3000)
                if i == free_at:
                    fs.capacity = None
                if i == arm_at:
                    fs.arm_crash(after_ops=rng.randint(1, 30))
                if i == arm_at and rng.random() < 0.5:
                    _flush(s, m)
                _step(s, m, rng)
            if rng.random() < 0.2:  # a clean stop (it drains the slot logs), the power cut in it
                fs.capacity = None
                fs.arm_crash(after_ops=rng.randint(1, 40))
                s.close()
                m.flushed()
        except PowerLoss:
            pass
        fs.capacity = None
        fs.crash(random.Random(seed * 7919 + round_))
        s = LedgerStorage(fs, ["/d0", "/d1"], **limits)
        s.open()
        _check(s, m)
        m = _observed(s, m)
    s.close()


@pytest.mark.parametrize("block", range(8))
def test_crash_safety(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Half the blocks sync the index files of every flush with one syncfs (a syncer,
    from the first file on), half file by file (a file system without a syncer); in odd
    blocks every flush may use the slot log (of a random bound, 0: none, or small enough
    to merge often), and each seed crashes twice (the second time after a replay)."""
    syncfs = block < 4
    monkeypatch.setattr(storage_module, "SYNCFS_FILES", 1)
    if block % 2:
        monkeypatch.setattr(storage_module, "SLOT_LOG_LEDGERS", 1)
    for seed in range(block * 50, block * 50 + 50):
        _crash_run(seed, syncfs, rounds=1 + block % 2)


def test_torn_header_never_loses_key_or_fence() -> None:
    for seed in range(150):
        rng = random.Random(seed)
        fs = TearingFS()
        s = LedgerStorage(fs, ["/d"])
        s.open()
        for ledger in range(4):
            s.set_master_key(ledger, b"old-%d" % ledger)
            s.add_entry(ledger, 0, b"e")
        s.set_fenced(0)
        s.flush()
        s.set_fenced(1)
        s.set_master_key(2, b"new")
        s.set_explicit_lac(3, 7)
        fs.arm_crash(after_ops=rng.randint(1, 12))
        try:
            s.flush()
        except PowerLoss:
            pass
        fs.crash(rng)
        s = LedgerStorage(fs, ["/d"])
        s.open()
        assert s.is_fenced(0) and s.master_key(0) == b"old-0"
        assert s.master_key(1) == b"old-1" and s.master_key(2) in (b"old-2", b"new")
        assert s.explicit_lac(3) in (None, 7) and s.get_entry(3, 0) == b"e"
