"""The slot log (bookie/storage/_slotlog.py): a checkpoint of many ledgers appends their
slots to one file per ledger dir instead of writing an index file per ledger.

Crash safety with the slot log in use runs in tests/crash/test_storage.py (``test_crash_safety``,
odd blocks: two power cuts per seed, the second after a replay) and tests/crash/test_gc_crash.py
(odd blocks: compaction's copies through it)."""

from __future__ import annotations

import errno
import random
import struct
from typing import Any

import pytest
from crc32c import crc32c

from bookie.fs import FileSystem, read_all
from bookie.fs.mem import MemFS
from bookie.fs.real import RealFS
from bookie.storage import LedgerStorage
from bookie.storage import _storage as storage_module
from bookie.storage._format import INDEX_HEADER_SIZE, SLOT
from bookie.storage._slotlog import (
    KIND_DELETED,
    KIND_RUN,
    RECORD,
    SLOT_LOG_HEADER_SIZE,
    SlotLog,
    encode_deleted,
    encode_run,
    encode_slot_log_header,
    parse_records,
)
from walkit.errors import CorruptionError, FormatError, FormatVersionError, NoSuchEntryError, NoSuchLedgerError

LEDGERS = 2 * storage_module.SLOT_LOG_LEDGERS  # SLOT_LOG_LEDGERS in each of two dirs


@pytest.fixture(params=["mem", "real"])
def fs_root(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[FileSystem, str]:
    return (MemFS(), "/s") if request.param == "mem" else (RealFS(), str(tmp_path))


def _open(fs: FileSystem, root: str, **kw: int) -> LedgerStorage:
    s = LedgerStorage(fs, [f"{root}/d0", f"{root}/d1"], **kw)
    s.open()
    return s


def _crash(s: LedgerStorage, fs: FileSystem) -> None:
    """Stop ``s`` as a power cut would (after its last flush everything it holds is
    synced): the slot log stays for the next open to replay."""
    if isinstance(fs, MemFS):
        fs.crash()
    else:  # the real disk: drop the handles, write nothing
        s._close_dirs()
        s._files.index.close_all()
        s._files.logs.close_all()


def _data(ledger: int, entry: int) -> bytes:
    return b"%d/%d." % (ledger, entry) * (1 + entry % 7)


def _add(s: LedgerStorage, entries: range, ledgers: range = range(LEDGERS)) -> None:
    for entry in entries:
        for ledger in ledgers:
            s.add_entry(ledger, entry, _data(ledger, entry))


def _logged(s: LedgerStorage, last: int) -> None:
    """Entry 0 of every ledger checkpointed (its index file made), then entries 1..``last``
    checkpointed again: in the slot log only."""
    _add(s, range(1))
    s.flush()
    _add(s, range(1, last + 1))
    s.flush()


def _index_writes(s: LedgerStorage) -> list[int]:
    """Ledgers whose index file is opened from now on (each open of one: its id)."""
    opened: list[int] = []
    opener = s._files.index._opener

    def counting(key: int, create: bool) -> Any:
        opened.append(key)
        return opener(key, create)

    s._files.index._opener = counting  # type: ignore[method-assign]
    s._files.index.close_all()
    return opened


def _check_all(s: LedgerStorage, last: int, ledgers: range = range(LEDGERS)) -> None:
    for ledger in ledgers:
        assert s.last_entry_id(ledger) == last
        assert [s.get_entry(ledger, e) for e in range(last + 1)] == [_data(ledger, e) for e in range(last + 1)]
        assert s.get_entries(ledger, 0, last + 1, 1 << 30) == [_data(ledger, e) for e in range(last + 1)]
        assert s.stored_entries(ledger, 0, last + 5) == list(range(last + 1))


def test_a_checkpoint_of_many_ledgers_appends_their_slots_and_writes_no_index_file(fs_root: tuple[FileSystem, str]) -> None:
    """The first flush makes every index file; later ones append one record per ledger
    to its dir's slot log and open no index file; reads, and a reopen, find every entry."""
    fs, root = fs_root
    s = _open(fs, root)
    _add(s, range(2))
    s.flush()  # new ledgers: index files with their headers
    opened = _index_writes(s)
    ends = [d.slot_log.end for d in s._dirs]
    _add(s, range(2, 5))
    s.flush()
    _add(s, range(5, 6))
    s.flush()
    assert opened == []
    per_dir = LEDGERS // 2
    assert [d.slot_log.end - e for d, e in zip(s._dirs, ends)] == [per_dir * (2 * RECORD.size + 4 * SLOT.size)] * 2
    assert all(d.slot_log.runs.keys() == {lid for lid in range(LEDGERS) if lid % 2 == d.number} for d in s._dirs)
    assert all(d.slot_log.runs[lid] == [(2, d.slot_log.runs[lid][0][1])] and len(d.slot_log.runs[lid][0][1]) == 4
               for d in s._dirs for lid in d.slot_log.runs)  # consecutive runs joined in memory
    _check_all(s, 5)
    _crash(s, fs)
    s = _open(fs, root)  # the runs are replayed from the file
    assert sum(d.slot_log.slots for d in s._dirs) == LEDGERS * 4
    _check_all(s, 5)
    for ledger in range(LEDGERS):  # the index files hold entries 0 and 1 only
        with s._files.index.use(ledger) as f:
            assert f.size() == INDEX_HEADER_SIZE + 2 * SLOT.size
    paths = [d.slot_log.path for d in s._dirs]
    assert all(p.endswith("/current/index/slots.log") and fs.exists(p) for p in paths)
    s.close()  # a clean stop: every run into its index file, the slot logs removed
    assert not any(fs.exists(p) for p in paths)
    s = _open(fs, root)
    assert sum(d.slot_log.slots for d in s._dirs) == 0
    _check_all(s, 5)
    for ledger in range(LEDGERS):
        with s._files.index.use(ledger) as f:
            assert f.size() == INDEX_HEADER_SIZE + 6 * SLOT.size
    s.close()


def test_few_ledgers_or_no_slot_log_write_the_index_files(fs_root: tuple[FileSystem, str]) -> None:
    fs, root = fs_root
    s = _open(fs, root)
    _add(s, range(1))
    s.flush()
    opened = _index_writes(s)
    _add(s, range(1, 2), range(3))  # 3 ledgers: below SLOT_LOG_LEDGERS in each dir
    s.flush()
    assert sorted(opened) == [0, 1, 2] and all(d.slot_log.file is None for d in s._dirs)  # never made
    s.close()
    s = _open(fs, root, slot_log_bytes=0)  # off: every flush writes the index files
    opened = _index_writes(s)
    _add(s, range(2, 3), range(LEDGERS))
    _add(s, range(1, 3), range(3, LEDGERS))
    s.flush()
    assert sorted(set(opened)) == list(range(LEDGERS)) and all(d.slot_log.file is None for d in s._dirs)
    _check_all(s, 2)
    s.close()


def test_a_full_slot_log_merges_into_the_index_files(fs_root: tuple[FileSystem, str]) -> None:
    """Past its bound the flush writes every run and its own slots to the index files,
    syncs them, and only then empties the log; everything reads back, also reopened."""
    fs, root = fs_root
    per_flush = (LEDGERS // 2) * (RECORD.size + SLOT.size)  # one entry per ledger: a record each
    bound = SLOT_LOG_HEADER_SIZE + 3 * per_flush
    s = _open(fs, root, slot_log_bytes=bound)
    _add(s, range(1))
    s.flush()
    ends = []
    for entry in range(1, 6):
        _add(s, range(entry, entry + 1))
        s.flush()
        ends.append(s._dirs[0].slot_log.end)
    assert ends == [SLOT_LOG_HEADER_SIZE + k * per_flush for k in (1, 2, 3)] + [SLOT_LOG_HEADER_SIZE,
                                                                              SLOT_LOG_HEADER_SIZE + per_flush]
    _check_all(s, 5)
    _crash(s, fs)
    s = _open(fs, root, slot_log_bytes=bound)
    _check_all(s, 5)
    for ledger in range(LEDGERS):  # entries 0..4 in the index file, 5 in the log
        with s._files.index.use(ledger) as f:
            assert f.size() == INDEX_HEADER_SIZE + 5 * SLOT.size
    s.close()


def test_slots_that_are_not_one_run_go_to_the_index_file_and_to_the_log(fs_root: tuple[FileSystem, str]) -> None:
    """A ledger with runs in the log whose next slots are not consecutive (an entry added
    again, a gap) gets its index file written - runs first, then the new slots - and its
    new slots logged too, so that a replay ends with the newest location."""
    fs, root = fs_root
    s = _open(fs, root)
    _add(s, range(2))
    s.flush()
    _add(s, range(2, 4))
    s.flush()  # entries 2, 3 of every ledger in the log
    opened = _index_writes(s)
    _add(s, range(4, 5), range(1, LEDGERS))
    s.add_entry(0, 3, b"again")  # ledger 0: entries 3 and 5, not one run
    s.add_entry(0, 5, b"five")
    s.flush()
    assert opened == [0]
    assert 0 not in s._dirs[0].slot_log.runs and 0 in s._dirs[0].slot_log.logged
    expected = [_data(0, 0), _data(0, 1), _data(0, 2), b"again"]
    assert [s.get_entry(0, e) for e in range(4)] == expected and s.get_entry(0, 5) == b"five"
    with pytest.raises(NoSuchEntryError):
        s.get_entry(0, 4)
    _crash(s, fs)
    s = _open(fs, root)
    assert [s.get_entry(0, e) for e in range(4)] == expected and s.get_entry(0, 5) == b"five"
    assert s.stored_entries(0, 0, 9) == [0, 1, 2, 3, 5]
    _check_all(s, 4, range(1, LEDGERS))
    s.close()


def test_a_deleted_ledger_made_again_never_reads_its_predecessors_slots() -> None:
    """A ledger deleted while the log holds its runs, then made again under the same id:
    neither at once, nor after a power cut before the next flush (its records are void:
    no index file), nor after the flush that made it again (a deleted record), nor after
    a merge, does it read one of its predecessor's entries."""
    for cut in ("before the flush", "after the flush", "after a merge"):
        fs = MemFS()
        bound = 1 << 20 if cut != "after a merge" else SLOT_LOG_HEADER_SIZE + 1
        s = _open(fs, "/s", slot_log_bytes=1 << 20)
        _add(s, range(2))
        s.flush()
        _add(s, range(2, 6))
        s.flush()  # ledger 4: entries 2..5 in the log only
        s.delete_ledger(4)
        assert 4 in s._dirs[0].slot_log.voided
        if cut == "before the flush":
            fs.crash()  # nothing unsynced: the delete is durable, its deleted record is not
            s = _open(fs, "/s")
            assert not s.has_ledger(4) and 4 in s._dirs[0].slot_log.voided
        else:
            fs.crash()
            s = _open(fs, "/s", slot_log_bytes=bound)
        s.add_entry(4, 0, b"new")
        _add(s, range(6, 7), range(5, LEDGERS))  # enough ledgers in each dir for the log
        s.flush()
        assert not s._dirs[0].slot_log.voided
        for reopen in (False, True):
            if reopen:
                fs.crash()
                s = _open(fs, "/s")
            assert s.last_entry_id(4) == 0 and s.get_entry(4, 0) == b"new", cut
            for entry in range(1, 6):
                with pytest.raises(NoSuchEntryError):
                    s.get_entry(4, entry)
            assert s.stored_entries(4, 0, 10) == [0]
        s.close()


def test_a_torn_tail_is_cut_at_open(fs_root: tuple[FileSystem, str]) -> None:
    """Bytes after the last intact record (a flush that never completed: a partial
    record, a record whose CRC does not hold) are cut at open; appends go on after it."""
    fs, root = fs_root
    s = _open(fs, root)
    _logged(s, 1)
    path, end = s._dirs[0].slot_log.path, s._dirs[0].slot_log.end
    _crash(s, fs)
    partial = encode_run(0, 2, _locations(1, 2, 3))[:-5]
    damaged = bytearray(encode_run(2, 2, _locations(7)))
    damaged[-1] ^= 0xFF
    for tail in (partial, bytes(damaged), b"\0" * 100):
        f = fs.open(path)
        f.pwrite(tail, end)
        f.sync()
        f.close()
        s = _open(fs, root)
        assert s._dirs[0].slot_log.end == end and len(read_all(fs, path)) == end
        _check_all(s, 1)
        _crash(s, fs)
    s = _open(fs, root)
    _add(s, range(2, 3))
    s.flush()
    _crash(s, fs)
    s = _open(fs, root)
    _check_all(s, 2)
    s.close()


def _locations(*offsets: int) -> Any:
    from array import array

    return array("Q", [(1 << 32) | o for o in offsets])


def test_a_flush_undone_for_lack_of_space_cuts_what_it_appended(monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills while the flush appends to the slot log (part of its records
    written): the flush raises ENOSPC and takes nothing; the next one cuts those bytes
    and appends again; a reopen replays exactly one copy."""
    fs = MemFS()
    s = _open(fs, "/s")
    _add(s, range(1))
    s.flush()
    _add(s, range(1, 3))
    original = SlotLog.append
    calls = [0]

    def half_then_full(self: SlotLog, data: bytes) -> None:
        calls[0] += 1
        if calls[0] == 1:
            original(self, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        original(self, data)

    monkeypatch.setattr(SlotLog, "append", half_then_full)
    with pytest.raises(OSError) as caught:
        s.flush()
    assert caught.value.errno == errno.ENOSPC and s.failure is None
    _check_all(s, 2)
    s.flush()
    ends = [d.slot_log.end for d in s._dirs]
    assert [len(read_all(fs, d.slot_log.path)) for d in s._dirs] == ends
    fs.crash()
    s = _open(fs, "/s")
    assert sum(d.slot_log.slots for d in s._dirs) == 2 * LEDGERS
    _check_all(s, 2)
    s.close()


def test_a_slot_log_of_another_version_is_refused_and_a_damaged_header_is_damage() -> None:
    """An intact header of another version stops the open (FormatVersionError: another
    walkit's file, never rewritten); a foreign magic is a FormatError; a CRC that does
    not hold is damage (CorruptionError)."""
    fs = MemFS()
    s = _open(fs, "/s")
    _logged(s, 1)
    path = s._dirs[0].slot_log.path
    fs.crash()

    def header(version: int = 1, magic: bytes = b"WKSLOTLG", crc_ok: bool = True) -> bytes:
        raw = bytearray(encode_slot_log_header())
        raw[0:8] = magic
        struct.pack_into("<H", raw, 8, version)
        if crc_ok:
            struct.pack_into("<I", raw, 12, crc32c(bytes(raw[:12])))
        return bytes(raw)

    for raw, error, match in ((header(version=2), FormatVersionError, "slot log version 2"),
                              (header(magic=b"NOTMINE!"), FormatError, "not a slot log"),
                              (header(version=3, crc_ok=False), CorruptionError, "CRC")):
        f = fs.open(path)
        f.pwrite(raw, 0)
        f.close()
        with pytest.raises(error, match=match):
            _open(fs, "/s")
        assert read_all(fs, path)[:SLOT_LOG_HEADER_SIZE] == raw  # left as found


def test_records_round_trip_and_stop_at_damage() -> None:
    run = encode_run(7, 3, _locations(512, 577))
    deleted = encode_deleted(9)
    assert len(run) == RECORD.size + 16 and len(deleted) == RECORD.size
    records, end = parse_records(run + deleted)
    assert end == len(run) + len(deleted)
    assert [(k, lid, first, list(a)) for k, lid, first, a in records] == [
        (KIND_RUN, 7, 3, [(1 << 32) | 512, (1 << 32) | 577]), (KIND_DELETED, 9, 0, [])]
    rng = random.Random(5)
    for _ in range(300):  # a flipped bit ends the records before the one it hit, never raises
        raw = bytearray(run + deleted)
        at = rng.randrange(len(raw))
        raw[at] ^= 1 << rng.randrange(8)
        found, stop = parse_records(bytes(raw))
        kept = 0 if at < len(run) else 1
        assert found == records[:kept] and stop == (0, len(run))[kept]


def test_a_delete_of_a_ledger_the_log_holds_needs_no_write(fs_root: tuple[FileSystem, str]) -> None:
    """Deleting removes the index file as before; the void record waits for the next
    flush (a delete on a full disk needs no room)."""
    fs, root = fs_root
    s = _open(fs, root)
    _logged(s, 1)
    end = s._dirs[0].slot_log.end
    s.delete_ledger(0)
    assert s._dirs[0].slot_log.end == end and not s.has_ledger(0)
    with pytest.raises(NoSuchLedgerError):
        s.get_entry(0, 1)
    s.flush()
    assert s._dirs[0].slot_log.end == end + RECORD.size
    s.close()


def test_a_range_read_sees_the_runs_beside_a_pending_and_a_flushing_map() -> None:
    """While a flush syncs (its slots in the flushing map) and adds written straight to
    the logs wait in the pending map, a range read still finds the entries only the slot
    log's runs locate."""
    import threading

    fs = MemFS()
    s = _open(fs, "/s", write_cache_bytes=0)  # every add written through: a pending map
    _add(s, range(2))
    s.flush()
    _add(s, range(2, 6))
    s.flush()  # entries 2..5 of every ledger in the runs only
    s.add_entry(0, 6, _data(0, 6))
    syncing, release = threading.Event(), threading.Event()
    original = s._flusher.sync_logs

    def slow_sync(plan: Any) -> None:
        syncing.set()
        release.wait(10)
        original(plan)

    s._flusher.sync_logs = slow_sync  # type: ignore[method-assign]
    flushing = threading.Thread(target=s.flush)
    flushing.start()
    try:
        assert syncing.wait(10)
        s.add_entry(0, 7, _data(0, 7))
        assert s._shared.pending.get(0) and s._shared.flushing.get(0) and s._dirs[0].slot_log.runs.get(0)
        assert s.get_entries(0, 0, 100, 1 << 20) == [_data(0, e) for e in range(8)]
        assert s.get_entries(0, 3, 100, 1 << 20) == [_data(0, e) for e in range(3, 8)]
        assert s.stored_entries(0, 0, 20) == list(range(8))
    finally:
        release.set()
        flushing.join()
    s.close()


def test_an_undone_flush_leaves_no_records_behind_in_a_log_it_synced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills in the second dir after the first dir's slot log was appended and
    synced: the undone flush cuts those records at once. Later flushes that append
    nothing there, or less, never let them come back at a replay over newer slots."""
    fs = MemFS()
    s = _open(fs, "/s")
    _add(s, range(1))
    s.flush()
    for ledger in range(LEDGERS):
        s.add_entry(ledger, 1, b"v1 %d" % ledger)
    original = SlotLog.append
    calls = [0]

    def second_dir_full(self: SlotLog, data: bytes) -> None:
        calls[0] += 1
        if calls[0] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        original(self, data)

    monkeypatch.setattr(SlotLog, "append", second_dir_full)
    with pytest.raises(OSError):
        s.flush()
    monkeypatch.setattr(SlotLog, "append", original)
    d0 = s._dirs[0].slot_log
    assert d0.file is not None and d0.file.size() == d0.end == SLOT_LOG_HEADER_SIZE  # cut and synced
    for ledger in range(0, LEDGERS, 2):  # dir 0's ledgers: a header change sends them to their index files
        s.set_explicit_lac(ledger, 0)
    s.flush()
    for ledger in range(0, LEDGERS, 2):
        s.add_entry(ledger, 1, b"v2 %d" % ledger)  # newer locations, into the index files too
        s.set_explicit_lac(ledger, 1)
    s.flush()
    fs.crash()
    s = _open(fs, "/s")
    assert [s.get_entry(ledger, 1) for ledger in range(LEDGERS)] == [
        b"v2 %d" % ledger if ledger % 2 == 0 else b"v1 %d" % ledger for ledger in range(LEDGERS)]
    s.close()


def test_a_clean_stop_leaves_no_slot_log_and_a_crash_leaves_it_in_the_index_directory() -> None:
    """An older walkit refuses an unknown name in ``index/``: a slot log left by a crash
    stops it (nothing misread); after a clean stop there is none. ``bookie info``'s
    summary counts it as the slot log, not as a foreign file."""
    from bookie.storage import ledger_dir_summary

    fs = MemFS()
    s = _open(fs, "/s")
    _logged(s, 2)
    fs.crash()
    assert "slots.log" in fs.listdir("/s/d0/current/index")
    summary = ledger_dir_summary(fs, "/s/d0")
    assert summary.foreign == 0 and summary.slot_log_bytes == s._dirs[0].slot_log.end > SLOT_LOG_HEADER_SIZE
    s = _open(fs, "/s")
    _check_all(s, 2)
    s.close()
    assert "slots.log" not in fs.listdir("/s/d0/current/index")
    assert ledger_dir_summary(fs, "/s/d0").slot_log_bytes == 0
    s = _open(fs, "/s")
    _check_all(s, 2)
    s.close()


def test_a_clean_stop_right_after_adds_keeps_them_in_the_index_files(fs_root: tuple[FileSystem, str]) -> None:
    """``close()``'s own flush is the drain: it never defers to a log it then removes,
    also when that flush would have been the first to make the log."""
    fs, root = fs_root
    s = _open(fs, root)
    _add(s, range(1))
    s.flush()
    assert all(d.slot_log.file is None for d in s._dirs)
    _add(s, range(1, 3))  # no flush: close() takes them
    s.close()
    assert not any(fs.exists(d.slot_log.path) for d in s._dirs)
    s = _open(fs, root)
    _check_all(s, 2)
    s.close()
