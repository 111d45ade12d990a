"""Write the golden files of tests/unit/golden/ (run once per new format version; see README.md).

    .venv/bin/python tests/unit/golden/make_golden.py [--out DIR]

Every sample is written by walkit's own writers (journal, ledger storage, cookie,
lastMark, ledger metadata, log metadata, record batches, wire codecs, entry codec) from
the fixed values below, so each file is what this version puts on a disk or a wire. The
exception is the version-1 record batch: no writer of it is left, so it is packed here as
the writer of commit 155cb3a^ (walkit/wal/_format.py, ``pack_records``) packed it.

Existing files are never overwritten (golden files are history): ``--out DIR`` writes a
fresh set elsewhere, e.g. to compare with the checked-in one. A new format version gets
new files beside the old ones (docs/format.md, "Format versions").
tests/unit/test_golden.py reads the files; it never runs this script.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bookie.cookie import COOKIE_FILE, Cookie  # noqa: E402
from bookie.fs.real import RealFS  # noqa: E402
from bookie.journal import ENTRY, FENCE_RECORD, KEY_RECORD, LAC_RECORD, Journal, JournalConfig, LogMark  # noqa: E402
from bookie.journal import write_mark  # noqa: E402
from bookie.storage import LedgerStorage  # noqa: E402
from walkit.metadata import LedgerMetadata, LedgerState, LocalMetadataStore, init_cluster  # noqa: E402
from walkit.protocol import (  # noqa: E402
    AddEntry,
    AddEntryResponse,
    AdminRequest,
    AdminResponse,
    BkDigestType,
    BookieInfoResponse,
    ErrorResponse,
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
    bk_encode_lac,
    encode_entry,
    encode_request,
    encode_response,
    master_key,
)
from walkit.wal import LSN, LogMetadata, LogSettings, Segment, SnapshotRef  # noqa: E402
from walkit.wal._format import fragment_count, pack_fragment, pack_records  # noqa: E402

# --- the values (README.md lists them; tests/unit/test_golden.py hard-codes them) -------------
KEY_7 = master_key(b"ledger-7-password")
KEY_9 = master_key(b"ledger-9-password")
E7_0 = encode_entry(7, 0, -1, 5, b"hello")  # crc32c digest
E7_1 = encode_entry(7, 1, 0, 11, b"world!")
E9_0 = encode_entry(9, 0, -1, 6, b"golden", digest="mac", key=KEY_9)
E9_1 = encode_entry(9, 1, 0, 12, b"sample", digest="mac", key=KEY_9)
E11_0 = encode_entry(11, 0, -1, 4, b"none", digest="none")

#: The journal's three flushes (one log_records call each, so one batch each).
FLUSHES: list[list[tuple[int, int, int, bytes]]] = [
    [(KEY_RECORD, 7, 0, KEY_7), (ENTRY, 7, 0, E7_0), (KEY_RECORD, 9, 0, KEY_9), (ENTRY, 9, 0, E9_0),
     (ENTRY, 7, 1, E7_1)],
    [(LAC_RECORD, 7, 1, b""), (FENCE_RECORD, 7, 0, b"")],
    [(ENTRY, 9, 1, E9_1)],
]
JOURNAL_ALIGNMENT = 512
MARK = LogMark(1, 1536)  # the start of the third flush: the first two are in the ledger dir

RECORDS = [b"first", b"", b"third record"]
FRAGMENTED = b"one record in three entries"  # 27 bytes: fragments of 10, 10 and 7
FRAGMENT_ROOM = 10
COOKIE = Cookie("bk1:3181", "/data/journal", ("/data/l0", "/data/l1"), "3f1c1a8e-5d2b-4c7e-9a10-1b2c3d4e5f60")
SALT_7 = bytes(range(16))
SALT_LONG = bytes(range(16, 32))
LONG_ID = 2**31 + 5  # past Integer.MAX_VALUE: the 19-digit hierarchical path
CTIME = 1764028800000  # 2025-11-25T00:00:00Z


def write_journal(out: Path) -> None:
    """journal/v1/0000000000000001.txn: three flushes of the real journal (512-byte
    alignment, buffered, preallocated in 512-byte steps so the file ends at its last flush)."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = f"{tmp}/journal"
        config = JournalConfig(directory=directory, alignment=JOURNAL_ALIGNMENT, prealloc_size=JOURNAL_ALIGNMENT,
                               direct_io=False, buffer_size=64 << 10)
        run_journal(RealFS(), config, FLUSHES)
        copy_file(Path(directory, "0000000000000001.txn"), out / "journal/v1/0000000000000001.txn")


def run_journal(fs: Any, config: JournalConfig, flushes: Sequence[Sequence[tuple[int, int, int, bytes]]]) -> None:
    """Each flush is one batch: its records are handed over together, then we wait for its sync."""
    journal = Journal(fs, config)
    journal.start()
    try:
        for records in flushes:
            done = threading.Event()
            errors: list[BaseException] = []

            def callback(error: BaseException | None, _ctx: Any, done: threading.Event = done) -> None:
                if error is not None:
                    errors.append(error)
                done.set()

            batch = [(t, lid, arg, data, None, None) for t, lid, arg, data in records[:-1]]
            t, lid, arg, data = records[-1]
            journal.log_records([*batch, (t, lid, arg, data, callback, None)])
            if not done.wait(10) or errors:
                raise RuntimeError(f"journal flush failed: {errors}")
    finally:
        journal.shutdown()


def write_mark_file(out: Path) -> None:
    """lastmark/v1/lastMark, by write_mark (tmp, sync, rename)."""
    with tempfile.TemporaryDirectory() as tmp:
        write_mark(RealFS(), [tmp], MARK)
        copy_file(Path(tmp, "lastMark"), out / "lastmark/v1/lastMark")


def write_ledger_dir(out: Path) -> None:
    """ledger-dir/v1/: the storage a checkpoint after the journal's second flush leaves."""
    target = out / "ledger-dir/v1"
    if target.exists():
        raise SystemExit(f"{target} exists: golden files are never rewritten (--out DIR for a fresh set)")
    with tempfile.TemporaryDirectory() as tmp:
        fill_storage(RealFS(), f"{tmp}/ledgers")
        shutil.copytree(f"{tmp}/ledgers", target)


def write_ledger_dir_slots(out: Path) -> None:
    """ledger-dir/v1-slots/: a ledger dir whose slot log holds runs and a deletion (the slot
    log, added 2026-11-28), copied before ``close()``, as a crash would leave it."""
    target = out / "ledger-dir/v1-slots"
    if target.exists():
        raise SystemExit(f"{target} exists: golden files are never rewritten (--out DIR for a fresh set)")
    from bookie.storage import _storage

    with tempfile.TemporaryDirectory() as tmp:
        _storage.SLOT_LOG_LEDGERS = 1  # every flush that can defers (the default wants 8 ledgers)
        storage = LedgerStorage(RealFS(), [f"{tmp}/ledgers"])
        storage.open()
        try:
            storage.set_master_key(7, KEY_7)
            storage.add_entry(7, 0, E7_0)
            storage.set_master_key(9, KEY_9)
            storage.add_entry(9, 0, E9_0)
            storage.flush()  # index files of ledgers 7 and 9 (entry 0 of each)
            storage.add_entry(7, 1, E7_1)
            storage.add_entry(9, 1, E9_1)
            storage.flush()  # a run record each in slots.log
            storage.delete_ledger(9)
            storage.flush()  # the deleted record of ledger 9
            shutil.copytree(f"{tmp}/ledgers", target)  # as a crash leaves it: close() would drain the slot log
        finally:
            storage.close()


def fill_storage(fs: Any, directory: str) -> None:
    storage = LedgerStorage(fs, [directory])
    storage.open()
    try:
        storage.set_master_key(7, KEY_7)
        storage.add_entry(7, 0, E7_0)
        storage.set_master_key(9, KEY_9)
        storage.add_entry(9, 0, E9_0)
        storage.add_entry(7, 1, E7_1)
        storage.flush()  # index headers seq 1 (copy 1) of ledgers 7 and 9, their slots
        storage.set_explicit_lac(7, 1)
        storage.set_fenced(7)
        storage.flush()  # ledger 7's header seq 2 (copy 0)
    finally:
        storage.close()  # seals entry log 1: writes its usage file


def write_cookie(out: Path) -> None:
    """cookie/v1/COOKIE, by Cookie.encode (what check_or_write_cookies writes)."""
    write_new(out / "cookie/v1" / COOKIE_FILE, COOKIE.encode())


def write_wal(out: Path) -> None:
    write_new(out / "wal/batch-v2.bin", pack_records(RECORDS))
    write_new(out / "wal/batch-v1.bin", pack_records_v1(RECORDS))
    meta = LogMetadata(
        epoch=2, segments=(Segment(1, 17), Segment(2, 23)), snapshots=(SnapshotRef(LSN(1, 49, 0), 21, 10000),),
        truncated=LSN(1, 7, 0),
        settings=LogSettings(ensemble_size=3, write_quorum=3, ack_quorum=2, roll_bytes=1 << 28, roll_seconds=3600.0),
    )
    write_new(out / "wal/log-metadata-v1.json", meta.encode())


def write_wal_fragments(out: Path) -> None:
    """wal/fragment-v1-{0,1,2}.bin: a record larger than an entry, as its three entries
    (record fragments, added 2026-11-27; the writer cuts at max_entry_bytes - 21 bytes)."""
    count = fragment_count(len(FRAGMENTED), FRAGMENT_ROOM)
    for index in range(count):
        part = FRAGMENTED[index * FRAGMENT_ROOM:(index + 1) * FRAGMENT_ROOM]
        write_new(out / f"wal/fragment-v1-{index}.bin", pack_fragment(len(FRAGMENTED), index, count, part))


def pack_records_v1(records: Sequence[bytes]) -> bytes:
    """Version 1 as the writer of commit 155cb3a^ packed it (each record after its length)."""
    parts = [struct.pack(">4sBI", b"WKRB", 1, len(records))]
    for record in records:
        parts.append(struct.pack(">I", len(record)))
        parts.append(record)
    return b"".join(parts)


def closed_ledger_7(version: int) -> LedgerMetadata:
    """Ledger 7, closed after an ensemble change, as ledger metadata ``version``."""
    return LedgerMetadata(
        ledger_id=7, ensemble_size=3, write_quorum=2, ack_quorum=2, digest="crc32c", password_salt=SALT_7,
        password_hash=LedgerMetadata.hash_password(b"ledger-7-password", SALT_7, version), state=LedgerState.OPEN,
        last_entry_id=-1, length=0, ensembles=((0, ("bk1:3181", "bk2:3181", "bk3:3181")),), ctime=CTIME,
        custom_metadata=(("walkit.log", b"orders/main"),), format_version=version,
    ).with_ensemble(1, ("bk1:3181", "bk2:3181", "bk4:3181")).closed(1, 11)


def write_metadata(out: Path) -> None:
    write_new(out / "metadata/ledger-v1-closed.bin", closed_ledger_7(1).encode())
    write_new(out / "metadata/ledger-v2-closed.bin", closed_ledger_7(2).encode())
    long_open = LedgerMetadata(
        ledger_id=LONG_ID, ensemble_size=1, write_quorum=1, ack_quorum=1, digest="mac", password_salt=SALT_LONG,
        password_hash=LedgerMetadata.hash_password(b"long-id-password", SALT_LONG, 1), state=LedgerState.OPEN,
        last_entry_id=-1, length=0, ensembles=((0, ("bk1:3181",)),), ctime=CTIME + 1, format_version=1,
    )
    write_new(out / "metadata/ledger-v1-open-long-id.bin", long_open.encode())
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalMetadataStore(tmp, create=True)
        try:
            for layout in ("hierarchical", "flat"):
                init_cluster(store, f"/{layout}", layout)
                write_new(out / f"metadata/LAYOUT-v1-{layout}", store.get(f"/{layout}/LAYOUT")[0])
            write_new(out / "metadata/INSTANCEID", store.get("/hierarchical/INSTANCEID")[0])  # a random UUID
        finally:
            store.close()


def write_wire(out: Path) -> None:
    requests: list[Request] = [
        AddEntry(7, 0, KEY_7, E7_0, request_id=1),
        ReadEntry(7, -1, fence=True, master_key=KEY_7, previous_lac=0, timeout_ms=1000, request_id=2),
        ReadEntry(9, 0, request_id=3),
        ReadLac(7, request_id=4),
        WriteLac(7, 1, KEY_7, request_id=5),
        GetBookieInfo(request_id=6),
        AdminRequest("gc.run", b'{"compact":"minor"}', request_id=7),
    ]
    responses: list[Response] = [
        AddEntryResponse(7, 0, request_id=1),
        ReadEntryResponse(7, 1, 1, E7_1, request_id=2),
        ErrorResponse(Op.READ_ENTRY, Status.ENOLEDGER, 9, 0, "no ledger 9", request_id=3),
        ReadLacResponse(7, 1, request_id=4),
        WriteLacResponse(7, request_id=5),
        BookieInfoResponse(1 << 30, 1 << 34, False, request_id=6),
        AdminResponse(b'{"pass":3}', request_id=7),
        ErrorResponse(Op.ADD_ENTRY, Status.EFENCED, 7, 2, "fenc\u00e9", request_id=8),
    ]
    write_new(out / "wire/v1/requests.bin", b"".join(encode_request(r) for r in requests))
    write_new(out / "wire/v1/responses.bin", b"".join(encode_response(r) for r in responses))


def write_wire_range(out: Path) -> None:
    """READ_RANGE (op 7, added to version 1 on 2026-11-27): a client's requests, then the
    bookie's answers, in one stream."""
    requests: list[Request] = [
        ReadRange(7, 0, 100, 1 << 20, request_id=1),
        ReadRange(9, 1, 65536, request_id=2),  # max bytes: the default, 2^32 - 1
        ReadRange(7, 5, 1, 1, request_id=3),
    ]
    responses: list[Response] = [
        ReadRangeResponse(7, 0, 1, (E7_0, E7_1), request_id=1),
        ReadRangeResponse(9, 1, 0, (E9_1,), request_id=2),
        ErrorResponse(Op.READ_RANGE, Status.ENOENTRY, 7, 5, "no entry 5", request_id=3),
    ]
    write_new(out / "wire/v1/read-range.bin",
              b"".join([encode_request(r) for r in requests] + [encode_response(r) for r in responses]))


def write_wire_lac_body(out: Path) -> None:
    """WRITE_LAC with BookKeeper's LAC body (flag LAC_BODY, added to version 1 on
    2026-12-06): a client's requests, then the bookie's answers, in one stream."""
    requests: list[Request] = [
        WriteLac(7, 1, KEY_7, request_id=1, body=bk_encode_lac(7, 1, digest=BkDigestType.CRC32C)),
        WriteLac(9, 0, KEY_9, request_id=2, body=bk_encode_lac(9, 0, digest=BkDigestType.HMAC,
                                                                password=b"ledger-9-password")),
    ]
    responses: list[Response] = [WriteLacResponse(7, request_id=1), WriteLacResponse(9, request_id=2)]
    write_new(out / "wire/v1/write-lac-body.bin",
              b"".join([encode_request(r) for r in requests] + [encode_response(r) for r in responses]))


def write_entries(out: Path) -> None:
    write_new(out / "entry/crc32c.bin", E7_0)
    write_new(out / "entry/mac.bin", E9_0)
    write_new(out / "entry/none.bin", E11_0)


# --- files ---------------------------------------------------------------------------------
def write_new(path: Path, data: bytes) -> None:
    if path.exists():
        raise SystemExit(f"{path} exists: golden files are never rewritten (--out DIR for a fresh set)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def copy_file(src: Path, dst: Path) -> None:
    write_new(dst, src.read_bytes())


WRITERS: list[Callable[[Path], None]] = [
    write_entries, write_journal, write_mark_file, write_ledger_dir, write_cookie, write_wal, write_metadata,
    write_wire, write_wire_range, write_wal_fragments, write_ledger_dir_slots, write_wire_lac_body,
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for writer in WRITERS:
        writer(args.out)
    for path in sorted(p for p in args.out.rglob("*") if p.is_file() and p.suffix not in (".py", ".md") and p.name != ".gitattributes"):
        print(f"{path.stat().st_size:6d}  {path.relative_to(args.out)}")


if __name__ == "__main__":
    main()
