"""Golden files: today's code reads, byte for byte, what this version wrote (issue 18).

Each file under ``tests/unit/golden/`` was written once by ``tests/unit/golden/make_golden.py``
(never by this module) and is described in ``tests/unit/golden/README.md``. Each test decodes
its files with the real readers - journal replay and the journal inspector, a
``LedgerStorage`` opened on a copy of the golden ledger directory, the cookie and
lastMark readers, the metadata and wire decoders - and compares every field with the
values hard-coded here, which are the values the README says were written. Where the
writer is deterministic, encoding the same values must also give the same bytes.

A failure here means a format changed. Bump that format's version, keep reading the old
version, and put new golden files beside these ones (docs/format.md, "Format versions"):
never regenerate or edit a golden file to make this test pass.
"""

from __future__ import annotations

import dataclasses
from array import array
import shutil
import struct
import threading
from pathlib import Path
from typing import Any

import pytest

from bookie.cookie import Cookie, read_cookie
from bookie.fs.real import RealFS
from bookie.journal import (
    ENTRY,
    FENCE_RECORD,
    KEY_RECORD,
    LAC_RECORD,
    FrameType,
    Journal,
    JournalConfig,
    JournalFile,
    JournalHeader,
    JournalRecord,
    LogMark,
    highest_mark,
    read_marks,
    replay,
)
from bookie.storage import EntryLogFile, EntryLogInfo, EntryLogRecord, LedgerStorage
from bookie.storage._format import IndexHeader, decode_index_copy, encode_index_copy, encode_log_header
from bookie.storage._slotlog import (
    KIND_DELETED,
    KIND_RUN,
    SLOT_LOG_HEADER_SIZE,
    encode_deleted,
    encode_run,
    encode_slot_log_header,
    parse_records,
)
from bookie.storage._usage import LogUsage, decode_usage, encode_usage
from support.journal import Recorder
from walkit.client import Entry
from walkit.errors import FormatError
from walkit.metadata import ClusterInfo, LedgerMetadata, LedgerState, ledger_path, parse_ledger_path, read_cluster
from walkit.protocol import (
    AddEntry,
    AddEntryResponse,
    AdminRequest,
    AdminResponse,
    BkDigestType,
    BookieInfoResponse,
    ErrorResponse,
    FrameDecoder,
    GetBookieInfo,
    Op,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadLacResponse,
    ReadRange,
    ReadRangeResponse,
    Request,
    Response,
    Status,
    WriteLac,
    WriteLacResponse,
    bk_decode_lac,
    decode_entry,
    decode_request,
    decode_response,
    encode_entry,
    encode_request,
    encode_response,
    master_key,
    parse_entry_header,
)
from walkit.wal import LSN, LogMetadata, LogSettings, Segment, SnapshotRef
from walkit.wal._format import pack_fragment, pack_records, unpack_fragment, unpack_records
from walkit.wal._records import RecordReader
from walkit.wal._stats import LogStats

GOLDEN = Path(__file__).resolve().parent / "golden"

# --- what the README says was written ------------------------------------------------------
KEY_7 = bytes.fromhex("bcf1d3b0d6800cb037ee22f2c51a3cf188f793f9b30c1cb19e913847584b2caa")  # master_key(b"ledger-7-password")
KEY_9 = bytes.fromhex("52deb8c206e979a904b84e61648e222edaecd00a436fc6c36a3e85822cf7d43d")  # master_key(b"ledger-9-password")
#: (ledger, entry) -> the entry as the client encoded it (header, digest, payload).
E7_0 = bytes.fromhex("00000000000000070000000000000000ffffffffffffffff00000000000000059e3e717b68656c6c6f")
E7_1 = bytes.fromhex("000000000000000700000000000000010000000000000000000000000000000b3cf91e2d776f726c6421")
E9_0 = bytes.fromhex("00000000000000090000000000000000ffffffffffffffff000000000000000655d7b6e379e561e165ea0724155cbb162fb2490f907cf2184b58110720ebfbd7676f6c64656e")
E9_1 = bytes.fromhex("000000000000000900000000000000010000000000000000000000000000000c6566e055111f4d2f23dec683ccf4d482df4a08e26db4e85e92e5f8aecd84e0b173616d706c65")
E11_0 = bytes.fromhex("000000000000000b0000000000000000ffffffffffffffff00000000000000046e6f6e65")

#: Every golden file and its size: a file added, removed or resized without this test changing fails.
FILES = {
    "entry/crc32c.bin": 41,
    "entry/mac.bin": 70,
    "entry/none.bin": 36,
    "journal/v1/0000000000000001.txn": 2048,
    "lastmark/v1/lastMark": 36,
    "ledger-dir/v1/current/logs/0000000000000001.log": 737,
    "ledger-dir/v1/current/logs/0000000000000001.use": 80,
    "ledger-dir/v1/current/index/07/0000000000000007.idx": 1040,
    "ledger-dir/v1/current/index/09/0000000000000009.idx": 1032,
    "ledger-dir/v1-slots/current/index/slots.log": 612,
    "ledger-dir/v1-slots/current/logs/0000000000000001.log": 831,
    "ledger-dir/v1-slots/current/index/07/0000000000000007.idx": 1032,
    "cookie/v1/COOKIE": 165,
    "wal/batch-v1.bin": 38,
    "wal/batch-v2.bin": 38,
    "wal/fragment-v1-0.bin": 31,
    "wal/fragment-v1-1.bin": 31,
    "wal/fragment-v1-2.bin": 28,
    "wal/log-metadata-v1.json": 211,
    "metadata/ledger-v1-closed.bin": 420,
    "metadata/ledger-v2-closed.bin": 420,
    "metadata/ledger-v1-open-long-id.bin": 332,
    "metadata/LAYOUT-v1-hierarchical": 37,
    "metadata/LAYOUT-v1-flat": 29,
    "metadata/INSTANCEID": 36,
    "wire/v1/requests.bin": 363,
    "wire/v1/responses.bin": 310,
    "wire/v1/read-range.bin": 415,
    "wire/v1/write-lac-body.bin": 236,
}


def golden(name: str) -> bytes:
    return (GOLDEN / name).read_bytes()


def copy_of(name: str, tmp_path: Path) -> str:
    """A copy of a golden file's directory (readers may open read-write or repair)."""
    src = GOLDEN / name
    dst = tmp_path / name
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    return str(dst)


def test_the_golden_files_are_all_here_and_no_others() -> None:
    found = {
        str(p.relative_to(GOLDEN)): p.stat().st_size
        for p in GOLDEN.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".md") and p.name != ".gitattributes" and "__pycache__" not in p.parts
        and p.relative_to(GOLDEN).parts[0] != "bookkeeper"  # BookKeeper's own bytes: test_bk_metadata_format.py
    }
    assert found == FILES


# --- entry (walkit/protocol/_entry.py) -----------------------------------------------------
@pytest.mark.parametrize(
    "name, digest, key, header, payload, digest_hex",
    [
        ("entry/crc32c.bin", "crc32c", b"", (7, 0, -1, 5), b"hello", "9e3e717b"),
        ("entry/mac.bin", "mac", KEY_9, (9, 0, -1, 6), b"golden", "55d7b6e379e561e165ea0724155cbb162fb2490f907cf2184b58110720ebfbd7"),
        ("entry/none.bin", "none", b"", (11, 0, -1, 4), b"none", ""),
    ],
)
def test_entries(name: str, digest: str, key: bytes, header: tuple[int, int, int, int], payload: bytes,
                 digest_hex: str) -> None:
    data = golden(name)
    assert tuple(parse_entry_header(data)) == header
    decoded_header, decoded_payload = decode_entry(data, digest=digest, key=key)
    assert tuple(decoded_header) == header and decoded_payload == payload
    assert data[32 : len(data) - len(payload)].hex() == digest_hex
    assert encode_entry(*header, payload, digest=digest, key=key) == data


def test_master_keys_and_the_other_entries() -> None:
    assert master_key(b"ledger-7-password") == KEY_7
    assert master_key(b"ledger-9-password") == KEY_9
    assert golden("entry/crc32c.bin") == E7_0 and golden("entry/mac.bin") == E9_0 and golden("entry/none.bin") == E11_0
    assert encode_entry(7, 1, 0, 11, b"world!") == E7_1
    assert encode_entry(9, 1, 0, 12, b"sample", digest="mac", key=KEY_9) == E9_1


# --- journal (bookie/journal) --------------------------------------------------------------
JOURNAL = "journal/v1/0000000000000001.txn"
ALL_JOURNAL_RECORDS = [
    ("master_key", 7, KEY_7), ("entry", 7, 0, E7_0), ("master_key", 9, KEY_9), ("entry", 9, 0, E9_0),
    ("entry", 7, 1, E7_1), ("lac", 7, 1), ("fence", 7), ("entry", 9, 1, E9_1),
]
_P, _K, _E, _L, _F = FrameType.PADDING, FrameType.MASTER_KEY, FrameType.ENTRY, FrameType.LAC, FrameType.FENCE
JOURNAL_FRAMES = [  # offset, type, flags (1: FLUSH_START), ledger, entry id or LAC, payload size
    JournalRecord(512, _K, 1, 7, None, 32),
    JournalRecord(564, _E, 0, 7, 0, 41),
    JournalRecord(633, _K, 0, 9, None, 32),
    JournalRecord(685, _E, 0, 9, 0, 70),
    JournalRecord(783, _E, 0, 7, 1, 42),
    JournalRecord(853, _P, 0, None, None, 159),
    JournalRecord(1024, _L, 1, 7, 1, 0),
    JournalRecord(1052, _F, 0, 7, None, 0),
    JournalRecord(1072, _P, 0, None, None, 452),
    JournalRecord(1536, _E, 1, 9, 1, 70),
    JournalRecord(1634, _P, 0, None, None, 402),
]


def test_journal_replays_every_record(tmp_path: Path) -> None:
    path = copy_of(JOURNAL, tmp_path)
    directory = str(Path(path).parent)
    recorder = Recorder()
    report = replay(RealFS(), directory, None, recorder)
    assert recorder.records == ALL_JOURNAL_RECORDS
    assert (report.files, report.records, report.entries, report.torn) == ([1], 8, 4, [])
    assert Path(path).read_bytes() == golden(JOURNAL)  # a clean end: nothing truncated


def test_journal_replays_from_the_golden_mark(tmp_path: Path) -> None:
    directory = str(Path(copy_of(JOURNAL, tmp_path)).parent)
    mark = LogMark.decode(golden("lastmark/v1/lastMark"))
    recorder = Recorder()
    report = replay(RealFS(), directory, mark, recorder)
    assert recorder.records == [("entry", 9, 1, E9_1)]
    assert (report.records, report.entries, report.torn) == (1, 1, [])


def test_journal_frames_and_header(tmp_path: Path) -> None:
    with JournalFile(RealFS(), copy_of(JOURNAL, tmp_path)) as journal:
        assert journal.header == JournalHeader(journal_id=1, alignment=512, previous_id=0, version=1)
        assert list(journal.records()) == JOURNAL_FRAMES
        assert journal.stop is not None
        assert (journal.stop.offset, journal.stop.file_size, journal.stop.verdict) == (2048, 2048, "end")
    raw = golden(JOURNAL)
    assert raw[:8] == b"WKJOURNL" and raw[8:10] == b"\x01\x00"
    assert JournalHeader(journal_id=1, alignment=512).encode() == raw[:512]


def test_journal_writer_writes_the_same_bytes(tmp_path: Path) -> None:
    directory = str(tmp_path / "journal")
    config = JournalConfig(directory=directory, alignment=512, prealloc_size=512, direct_io=False,
                           buffer_size=64 << 10)
    flushes = [
        [(KEY_RECORD, 7, 0, KEY_7), (ENTRY, 7, 0, E7_0), (KEY_RECORD, 9, 0, KEY_9), (ENTRY, 9, 0, E9_0),
         (ENTRY, 7, 1, E7_1)],
        [(LAC_RECORD, 7, 1, b""), (FENCE_RECORD, 7, 0, b"")],
        [(ENTRY, 9, 1, E9_1)],
    ]
    journal = Journal(RealFS(), config)
    journal.start()
    try:
        for records in flushes:  # one batch each: handed over together, then synced
            done = threading.Event()

            def synced(error: BaseException | None, ctx: Any, done: threading.Event = done) -> None:
                done.set()

            batch: list[Any] = [(*r, None, None) for r in records[:-1]]
            journal.log_records([*batch, (*records[-1], synced, None)])
            assert done.wait(10)
    finally:
        journal.shutdown()
    assert (tmp_path / "journal/0000000000000001.txn").read_bytes() == golden(JOURNAL)


# --- lastMark ------------------------------------------------------------------------------
def test_last_mark(tmp_path: Path) -> None:
    raw = golden("lastmark/v1/lastMark")
    assert LogMark.decode(raw) == LogMark(1, 1536)
    assert LogMark(1, 1536).encode() == raw
    directory = str(Path(copy_of("lastmark/v1/lastMark", tmp_path)).parent)
    assert read_marks(RealFS(), [directory]) == [LogMark(1, 1536)]
    assert highest_mark(RealFS(), [directory]) == LogMark(1, 1536)


# --- cookie --------------------------------------------------------------------------------
COOKIE = Cookie("bk1:3181", "/data/journal", ("/data/l0", "/data/l1"), "3f1c1a8e-5d2b-4c7e-9a10-1b2c3d4e5f60")


def test_cookie(tmp_path: Path) -> None:
    directory = str(Path(copy_of("cookie/v1/COOKIE", tmp_path)).parent)
    cookie = read_cookie(RealFS(), directory)
    assert cookie == COOKIE
    assert cookie is not None
    assert (cookie.bookie_id, cookie.journal_dir, cookie.ledger_dirs, cookie.instance_id) == (
        "bk1:3181", "/data/journal", ("/data/l0", "/data/l1"), "3f1c1a8e-5d2b-4c7e-9a10-1b2c3d4e5f60")
    COOKIE.verify_matches(cookie)
    raw = golden("cookie/v1/COOKIE")
    assert raw[:8] == b"WKCOOKIE" and Cookie.decode(raw) == COOKIE
    assert COOKIE.encode() == raw


# --- ledger storage: entry log, usage file, index files -----------------------------------
LEDGER_DIR = "ledger-dir/v1"
LOG = f"{LEDGER_DIR}/current/logs/0000000000000001.log"
USE = f"{LEDGER_DIR}/current/logs/0000000000000001.use"
IDX_7 = f"{LEDGER_DIR}/current/index/07/0000000000000007.idx"
IDX_9 = f"{LEDGER_DIR}/current/index/09/0000000000000009.idx"
SLOTS = "ledger-dir/v1-slots/current/index/slots.log"


def test_ledger_storage_opens_the_golden_dir(tmp_path: Path) -> None:
    storage = LedgerStorage(RealFS(), [copy_of(LEDGER_DIR, tmp_path)])
    storage.open()
    try:
        assert storage.ledgers() == [7, 9]
        assert (storage.master_key(7), storage.is_fenced(7), storage.explicit_lac(7), storage.last_entry_id(7)) == (
            KEY_7, True, 1, 1)
        assert (storage.master_key(9), storage.is_fenced(9), storage.explicit_lac(9), storage.last_entry_id(9)) == (
            KEY_9, False, None, 0)
        assert [storage.get_entry(7, 0), storage.get_entry(7, 1), storage.get_entry(9, 0)] == [E7_0, E7_1, E9_0]
        assert storage.entry_logs() == [EntryLogInfo(dir=0, log_id=1, total_bytes=225, live_bytes=225, ledgers=2,
                                                     compacting=False, end=737)]
    finally:
        storage.close()


def test_ledger_storage_opens_the_golden_dir_with_a_slot_log(tmp_path: Path) -> None:
    """Ledger 7's entry 1 is found through the slot log only; ledger 9's records there
    are void (deleted); the records decode to what was written."""
    raw = golden(SLOTS)
    assert raw[:SLOT_LOG_HEADER_SIZE] == encode_slot_log_header()
    records, end = parse_records(raw[SLOT_LOG_HEADER_SIZE:])
    assert end == len(raw) - SLOT_LOG_HEADER_SIZE
    assert [(kind, ledger, first, list(locations)) for kind, ledger, first, locations in records] == [
        (KIND_RUN, 7, 1, [(1 << 32) | 671]), (KIND_RUN, 9, 1, [(1 << 32) | 737]), (KIND_DELETED, 9, 0, [])]
    assert raw[SLOT_LOG_HEADER_SIZE:] == b"".join([encode_run(7, 1, array("Q", [(1 << 32) | 671])),
                                                     encode_run(9, 1, array("Q", [(1 << 32) | 737])),
                                                     encode_deleted(9)])
    storage = LedgerStorage(RealFS(), [copy_of("ledger-dir/v1-slots", tmp_path)])
    storage.open()
    try:
        assert storage.ledgers() == [7] and storage.last_entry_id(7) == 1
        assert [storage.get_entry(7, 0), storage.get_entry(7, 1)] == [E7_0, E7_1]
        assert storage.get_entries(7, 0, 10, 1 << 20) == [E7_0, E7_1]
    finally:
        storage.close()


def test_entry_log(tmp_path: Path) -> None:
    raw = golden(LOG)
    assert raw[:512] == encode_log_header(1)
    with EntryLogFile(RealFS(), copy_of(LOG, tmp_path)) as log:
        assert log.log_id == 1 and log.size == 737
        assert list(log.records()) == [
            EntryLogRecord(512, 7, 0, 41), EntryLogRecord(577, 9, 0, 70), EntryLogRecord(671, 7, 1, 42)]
        assert log.end == 737
    # record: length u32 | crc32c u32 | ledger u64 | entry u64 | data (little-endian)
    assert struct.unpack_from("<IIQQ", raw, 512)[0::2] == (16 + 41, 7)
    assert raw[536:577] == E7_0 and raw[601:671] == E9_0 and raw[695:737] == E7_1


def test_usage_file() -> None:
    raw = golden(USE)
    usage = decode_usage(raw, 1, USE)
    assert usage == LogUsage(log_id=1, ledgers={7: 131, 9: 94}, total=225, live=225, end=737)
    assert encode_usage(usage) == raw


def test_index_files() -> None:
    raw7, raw9 = golden(IDX_7), golden(IDX_9)
    newest_7 = IndexHeader(ledger_id=7, seq=2, fenced=True, explicit_lac=1, master_key=KEY_7)
    older_7 = IndexHeader(ledger_id=7, seq=1, fenced=False, explicit_lac=None, master_key=KEY_7)
    only_9 = IndexHeader(ledger_id=9, seq=1, fenced=False, explicit_lac=None, master_key=KEY_9)
    assert decode_index_copy(raw7[:512], 0, 7, IDX_7) == newest_7
    assert decode_index_copy(raw7[512:1024], 1, 7, IDX_7) == older_7
    assert decode_index_copy(raw9[:512], 0, 9, IDX_9) is None and raw9[:512] == bytes(512)  # never written
    assert decode_index_copy(raw9[512:1024], 1, 9, IDX_9) == only_9
    assert encode_index_copy(newest_7) == raw7[:512] and encode_index_copy(older_7) == raw7[512:1024]
    assert encode_index_copy(only_9) == raw9[512:1024]
    # slots: u64 (log id << 32) | offset of the record
    assert struct.unpack_from("<2Q", raw7, 1024) == ((1 << 32) | 512, (1 << 32) | 671)
    assert struct.unpack_from("<Q", raw9, 1024) == ((1 << 32) | 577,)


def test_ledger_storage_writes_the_same_bytes(tmp_path: Path) -> None:
    storage = LedgerStorage(RealFS(), [str(tmp_path / "ledgers")])
    storage.open()
    try:
        # a flush after each add: the records lie in the order they were added, as in the
        # golden files (written before the write cache; one flush would place 7/1 before 9/0)
        storage.set_master_key(7, KEY_7)
        storage.add_entry(7, 0, E7_0)
        storage.flush()
        storage.set_master_key(9, KEY_9)
        storage.add_entry(9, 0, E9_0)
        storage.flush()
        storage.add_entry(7, 1, E7_1)
        storage.flush()
        storage.set_explicit_lac(7, 1)
        storage.set_fenced(7)
        storage.flush()
    finally:
        storage.close()
    written = {str(p.relative_to(tmp_path / "ledgers")): p.read_bytes()
               for p in (tmp_path / "ledgers").rglob("*") if p.is_file()}
    expected = {str(p.relative_to(GOLDEN / LEDGER_DIR)): p.read_bytes()
                for p in (GOLDEN / LEDGER_DIR).rglob("*") if p.is_file()}
    assert written == expected


# --- write-ahead log (walkit/wal/_format.py) ----------------------------------------------
RECORDS = [b"first", b"", b"third record"]


@pytest.mark.parametrize("version", [1, 2])
def test_record_batches(version: int) -> None:
    raw = golden(f"wal/batch-v{version}.bin")
    assert raw[:5] == b"WKRB" + bytes([version]) and struct.unpack_from(">I", raw, 5) == (3,)
    assert unpack_records(raw) == RECORDS
    if version == 2:
        assert pack_records(RECORDS) == raw  # version 2 is what is written today


FRAGMENTED = b"one record in three entries"


def test_record_fragments() -> None:
    """A record larger than an entry, as the three entries it was written in."""
    raws = [golden(f"wal/fragment-v1-{i}.bin") for i in range(3)]
    for i, raw in enumerate(raws):
        assert raw[:5] == b"WKRF\x01" and struct.unpack_from(">QII", raw, 5) == (27, i, 3)
        assert unpack_fragment(raw) == (27, i, 3, FRAGMENTED[10 * i:10 * i + 10])
        assert pack_fragment(27, i, 3, FRAGMENTED[10 * i:10 * i + 10]) == raw  # version 1 is what is written today
        with pytest.raises(FormatError):
            unpack_records(raw)  # a fragment is no record batch
    reader = RecordReader("golden", LogStats())
    got = [pair for i, raw in enumerate(raws) for pair in reader.records(Segment(2, 23), Entry(23, 5 + i, raw), None)]
    assert got == [(LSN(2, 7, 0), FRAGMENTED)]


def test_log_metadata() -> None:
    raw = golden("wal/log-metadata-v1.json")
    meta = LogMetadata.decode(raw, "/ledgers/logs/ns/orders")
    assert meta == LogMetadata(
        epoch=2, segments=(Segment(1, 17), Segment(2, 23)), snapshots=(SnapshotRef(LSN(1, 49, 0), 21, 10000),),
        truncated=LSN(1, 7, 0),
        settings=LogSettings(ensemble_size=3, write_quorum=3, ack_quorum=2, roll_bytes=1 << 28, roll_seconds=3600.0),
    )
    assert meta.encode() == raw


# --- ledger metadata (walkit/metadata) -----------------------------------------------------
SALT_7 = bytes(range(16))
SALT_LONG = bytes(range(16, 32))
LONG_ID = 2**31 + 5
CTIME = 1764028800000


def test_closed_ledger_metadata() -> None:
    raw = golden("metadata/ledger-v1-closed.bin")
    assert raw[:10] == b"WKLEDGER\x01\x00"
    meta = LedgerMetadata.decode(raw)
    assert meta == LedgerMetadata(
        ledger_id=7, ensemble_size=3, write_quorum=2, ack_quorum=2, digest="crc32c", password_salt=SALT_7,
        password_hash=bytes.fromhex("01e16ac953ed5dcb6790085a542b8658cdefaebd1000c8f7672a88200bf0a20a"), state=LedgerState.CLOSED, last_entry_id=1, length=11,
        ensembles=((0, ("bk1:3181", "bk2:3181", "bk3:3181")), (1, ("bk1:3181", "bk2:3181", "bk4:3181"))),
        ctime=CTIME, custom_metadata=(("walkit.log", b"orders/main"),), format_version=1,
    )
    assert meta.check_password(b"ledger-7-password")  # salt + PBKDF2 parameters unchanged
    assert meta.encode() == raw


def test_closed_ledger_metadata_version_2() -> None:
    """The same ledger as version 2 writes it: only the version and the password
    verifier (HMAC-SHA256 keyed with the password over a context and the salt) differ."""
    raw = golden("metadata/ledger-v2-closed.bin")
    assert raw[:10] == b"WKLEDGER\x02\x00"
    meta = LedgerMetadata.decode(raw)
    v1 = LedgerMetadata.decode(golden("metadata/ledger-v1-closed.bin"))
    assert meta == dataclasses.replace(
        v1, password_hash=bytes.fromhex("e49e81a9583670c24642b21e36e6721ded94f438b3feefc83eb4fdf558dc3396"),
        format_version=2)
    assert meta.check_password(b"ledger-7-password") and not meta.check_password(b"ledger-7-passwore")
    assert meta.encode() == raw


def test_open_ledger_metadata_with_a_long_id() -> None:
    raw = golden("metadata/ledger-v1-open-long-id.bin")
    meta = LedgerMetadata.decode(raw)
    assert meta == LedgerMetadata(
        ledger_id=LONG_ID, ensemble_size=1, write_quorum=1, ack_quorum=1, digest="mac", password_salt=SALT_LONG,
        password_hash=bytes.fromhex("33b413ddaef3a8c9895cd11226d0968a44df68aad82924446e77d5677cf112b0"), state=LedgerState.OPEN, last_entry_id=-1, length=0,
        ensembles=((0, ("bk1:3181",)),), ctime=CTIME + 1, format_version=1,
    )
    assert meta.check_password(b"long-id-password")
    assert meta.encode() == raw


@pytest.mark.parametrize("ledger_id, layout, path", [
    (7, "hierarchical", "/ledgers/00/0000/L0007"),
    (LONG_ID, "hierarchical", "/ledgers/000/0000/0021/4748/L3653"),
    (7, "flat", "/ledgers/L0000000007"),
    (LONG_ID, "flat", "/ledgers/L2147483653"),
])
def test_ledger_paths(ledger_id: int, layout: Any, path: str) -> None:
    assert ledger_path("/ledgers", ledger_id, layout) == path
    assert parse_ledger_path("/ledgers", path, layout) == ledger_id


class _Nodes:
    """Just enough of a MetadataStore for read_cluster: ``get`` of stored bytes."""

    def __init__(self, nodes: dict[str, bytes]) -> None:
        self.nodes = nodes

    def get(self, path: str) -> tuple[bytes, None]:
        return self.nodes[path], None


@pytest.mark.parametrize("layout", ["hierarchical", "flat"])
def test_cluster_layout_nodes(layout: str) -> None:
    raw = golden(f"metadata/LAYOUT-v1-{layout}")
    assert raw == f"walkit-layout 1\nledgers {layout}\n".encode()
    nodes = _Nodes({"/ledgers/INSTANCEID": golden("metadata/INSTANCEID"), "/ledgers/LAYOUT": raw})
    info = read_cluster(nodes, "/ledgers")  # type: ignore[arg-type]
    assert info == ClusterInfo("/ledgers", "2bf6f3fe-64ae-4a9a-bfd6-5178a7ace783", layout)  # type: ignore[arg-type]


# --- wire protocol (walkit/protocol/_codec.py) --------------------------------------------
REQUESTS: list[Request] = [
    AddEntry(7, 0, KEY_7, E7_0, request_id=1),
    ReadEntry(7, -1, fence=True, master_key=KEY_7, previous_lac=0, timeout_ms=1000, request_id=2),
    ReadEntry(9, 0, request_id=3),
    ReadLac(7, request_id=4),
    WriteLac(7, 1, KEY_7, request_id=5),
    GetBookieInfo(request_id=6),
    AdminRequest("gc.run", b'{"compact":"minor"}', request_id=7),
]
RESPONSES: list[Response] = [
    AddEntryResponse(7, 0, request_id=1),
    ReadEntryResponse(7, 1, 1, E7_1, request_id=2),
    ErrorResponse(Op.READ_ENTRY, Status.ENOLEDGER, 9, 0, "no ledger 9", request_id=3),
    ReadLacResponse(7, 1, request_id=4),
    WriteLacResponse(7, request_id=5),
    BookieInfoResponse(1 << 30, 1 << 34, False, request_id=6),
    AdminResponse(b'{"pass":3}', request_id=7),
    ErrorResponse(Op.ADD_ENTRY, Status.EFENCED, 7, 2, "fenc\u00e9", request_id=8),
]
#: (length field, version, kind, flags or status, request id) of every frame, in order.
REQUEST_HEADS = [(102, 1, 1, 0, 1), (73, 1, 2, 6, 2), (29, 1, 2, 0, 3), (20, 1, 3, 0, 4), (61, 1, 4, 0, 5), (12, 1, 5, 0, 6), (38, 1, 6, 0, 7)]
RESPONSE_HEADS = [(28, 1, 0x81, 0, 1), (78, 1, 0x82, 0, 2), (39, 1, 0x82, 1, 3), (28, 1, 0x83, 0, 4), (20, 1, 0x84, 0, 5),
                  (29, 1, 0x85, 0, 6), (22, 1, 0x86, 0, 7), (34, 1, 0x81, 7, 8)]


@pytest.mark.parametrize("name, messages, heads, decode, encode", [
    ("wire/v1/requests.bin", REQUESTS, REQUEST_HEADS, decode_request, encode_request),
    ("wire/v1/responses.bin", RESPONSES, RESPONSE_HEADS, decode_response, encode_response),
])
def test_wire_frames(name: str, messages: list[Any], heads: list[tuple[int, ...]], decode: Any, encode: Any) -> None:
    stream = golden(name)
    assert frame_heads(stream) == heads
    frames = FrameDecoder().feed(stream)
    assert [decode(f) for f in frames] == messages
    assert b"".join(encode(m) for m in messages) == stream


def frame_heads(stream: bytes) -> list[tuple[int, ...]]:
    """(length field, version, kind, flags or status, request id) of every frame of ``stream``."""
    pos, found = 0, []
    while pos < len(stream):
        found.append(struct.unpack_from(">IBBHQ", stream, pos))
        pos += 4 + found[-1][0]
    return found


#: READ_RANGE (op 7, added to version 1): the requests, then the answers, in one stream.
RANGE_REQUESTS: list[Request] = [
    ReadRange(7, 0, 100, 1 << 20, request_id=1),
    ReadRange(9, 1, 65536, 2**32 - 1, request_id=2),
    ReadRange(7, 5, 1, 1, request_id=3),
]
RANGE_RESPONSES: list[Response] = [
    ReadRangeResponse(7, 0, 1, (E7_0, E7_1), request_id=1),
    ReadRangeResponse(9, 1, 0, (E9_1,), request_id=2),
    ErrorResponse(Op.READ_RANGE, Status.ENOENTRY, 7, 5, "no entry 5", request_id=3),
]
RANGE_HEADS = [(36, 1, 7, 0, 1), (36, 1, 7, 0, 2), (36, 1, 7, 0, 3), (131, 1, 0x87, 0, 1), (114, 1, 0x87, 0, 2),
               (38, 1, 0x87, 2, 3)]


def test_wire_read_range_frames() -> None:
    stream = golden("wire/v1/read-range.bin")
    assert frame_heads(stream) == RANGE_HEADS
    frames = FrameDecoder().feed(stream)
    assert [decode_request(f) for f in frames[:3]] == RANGE_REQUESTS
    assert [decode_response(f) for f in frames[3:]] == RANGE_RESPONSES
    assert b"".join([encode_request(m) for m in RANGE_REQUESTS] + [encode_response(m) for m in RANGE_RESPONSES]) \
        == stream


#: WRITE_LAC with BookKeeper's LAC body (flag LAC_BODY, added to version 1): two requests, then the answers.
LAC_BODY_7 = bytes.fromhex("0000000000000007" "0000000000000001" "777bd7f3")  # CRC32C
LAC_BODY_9 = bytes.fromhex("0000000000000009" "0000000000000000" "5c3e5d0e8738a435d050291f28f76b022987c479")  # HMAC
LAC_BODY_REQUESTS: list[Request] = [WriteLac(7, 1, KEY_7, 1, LAC_BODY_7), WriteLac(9, 0, KEY_9, 2, LAC_BODY_9)]
LAC_BODY_RESPONSES: list[Response] = [WriteLacResponse(7, request_id=1), WriteLacResponse(9, request_id=2)]
LAC_BODY_HEADS = [(82, 1, 4, 8, 1), (98, 1, 4, 8, 2), (20, 1, 0x84, 0, 1), (20, 1, 0x84, 0, 2)]


def test_wire_write_lac_body_frames() -> None:
    stream = golden("wire/v1/write-lac-body.bin")
    assert frame_heads(stream) == LAC_BODY_HEADS
    frames = FrameDecoder().feed(stream)
    assert [vars(decode_request(f)) for f in frames[:2]] == [vars(r) for r in LAC_BODY_REQUESTS]
    assert [decode_response(f) for f in frames[2:]] == LAC_BODY_RESPONSES
    assert bk_decode_lac(LAC_BODY_7, digest=BkDigestType.CRC32C) == 1
    assert bk_decode_lac(LAC_BODY_9, digest=BkDigestType.HMAC, password=b"ledger-9-password") == 0
    assert b"".join([encode_request(m) for m in LAC_BODY_REQUESTS] + [encode_response(m) for m in LAC_BODY_RESPONSES]) \
        == stream
