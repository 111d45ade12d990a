"""Entry-log usage: how many record bytes each ledger has in each entry log.

Theory of operation
-------------------
Garbage collection must know, without reading an entry log, which ledgers still own
bytes in it (a log whose ledgers are all deleted is removed outright) and what fraction
of it is live (compaction rewrites the sparse ones). So every entry log carries a
:class:`LogUsage`: ``ledger id -> record bytes``. The active log's usage grows with each
append (one dict update, under the storage's lock); when a log is *sealed* - synced by
the flush after it rolled, or closed at shutdown - its usage is written once to a side
file ``<log id:016x>.use`` next to it (format in ``docs/format.md``, "Entry-log usage
file"): built as ``.use.tmp``, synced, renamed, directory fsynced.

Deleting a ledger drops it from every usage in RAM (``live`` falls); the side files are
not rewritten: at open, the ledgers a file names that the storage no longer has are
dropped again. A log without a valid side file (the log that was active at a crash, or a
crash before its file was renamed) has its usage rebuilt by reading it from the start
until the first record that is not intact (a torn tail) - every record an index slot can
point at lies before that, because slots are written only after their log was synced.

The usage also keeps where the log's intact records end (``end``). For a sealed log that
is its size; for the log that was being written at a crash it may be less: the tail
after its last sync is torn, and since index slots are written only after their log was
synced, nothing points there - garbage, ignored by compaction. (Damage to synced bytes
of that log, before the crash, would look the same to the scan that rebuilds it: such
damage is detected only in logs sealed by a flush, whose ``end`` was recorded then.)

Guarantees: usage is an accounting aid, never the judge of what is live. It may count
bytes that are dead (an entry added twice, a record of the torn tail); it never misses a
ledger that has a record in the log, so "no ledger left" really means the log holds
nothing anybody can read. Compaction decides record by record from the index.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from crc32c import crc32c

from bookie.fs import File, FileSystem, read_all
from bookie.storage._format import LOG_HEADER_SIZE, RECORD_HEADER, check_record, record_length
from walkit.errors import CorruptionError, FormatError, FormatVersionError

__all__ = [
    "LogUsage", "encode_usage", "decode_usage", "scan_records", "rebuild_usage", "read_usage_file",
    "write_usage_file",
]

USAGE_MAGIC = b"WKLOGUSE"
USAGE_VERSION = 1  # 1: first format
#: magic, version, reserved, log id, ledger count, total record bytes, end of intact records
_USAGE_HEAD = struct.Struct("<8sHHQQQQ")
_PAIR = struct.Struct("<QQ")
_CRC = struct.Struct("<I")
_SCAN_CHUNK = 1 << 20  # bytes read per step when scanning a log


@dataclass
class LogUsage:
    """Record bytes per ledger in one entry log; ``live`` counts the ledgers still held."""

    log_id: int
    ledgers: dict[int, int] = field(default_factory=dict)
    #: Record bytes ever appended (live or not): the denominator of the live fraction.
    total: int = 0
    live: int = 0
    #: Where the log's intact records end: its size, or less for the log that was being
    #: written at a crash (its torn tail: records never synced, so never indexed).
    end: int = LOG_HEADER_SIZE

    def add(self, ledger_id: int, size: int) -> None:
        self.ledgers[ledger_id] = self.ledgers.get(ledger_id, 0) + size
        self.total += size
        self.live += size
        self.end += size

    def drop(self, ledger_id: int) -> None:
        """The ledger was deleted: its bytes are dead."""
        size = self.ledgers.pop(ledger_id, 0)
        self.live -= size

    def keep_only(self, exists: Mapping[int, object]) -> None:
        """Drop every ledger not in ``exists`` (at open: deleted before a restart)."""
        for ledger_id in [lid for lid in self.ledgers if lid not in exists]:
            self.drop(ledger_id)

    @property
    def live_fraction(self) -> float:
        return self.live / self.total if self.total else 0.0


def encode_usage(usage: LogUsage) -> bytes:
    pairs = sorted(usage.ledgers.items())
    head = _USAGE_HEAD.pack(USAGE_MAGIC, USAGE_VERSION, 0, usage.log_id, len(pairs), usage.total, usage.end)
    body = head + b"".join(_PAIR.pack(lid, size) for lid, size in pairs)
    return body + _CRC.pack(crc32c(body))


def decode_usage(raw: bytes, log_id: int, path: str) -> LogUsage:
    """The usage in a side file; CorruptionError or FormatError when it is not valid
    (FormatVersionError: intact, but of a version this code does not read)."""
    if len(raw) < _USAGE_HEAD.size + _CRC.size:
        raise CorruptionError("entry-log usage file truncated", path=path, size=len(raw))
    magic, version, _, _, count, _, _ = _USAGE_HEAD.unpack_from(raw)
    if magic != USAGE_MAGIC:
        raise FormatError("not an entry-log usage file", path=path, magic=magic.hex())
    size = _USAGE_HEAD.size + count * _PAIR.size
    if len(raw) != size + _CRC.size or _CRC.unpack_from(raw, size)[0] != crc32c(raw[:size]):
        raise CorruptionError("entry-log usage file damaged", path=path, size=len(raw), count=count)
    return FormatVersionError.reader(_USAGE_READERS, version, "entry-log usage file", path=path)(raw, log_id, path)


def _decode_usage_v1(raw: bytes, log_id: int, path: str) -> LogUsage:
    _, _, _, found, count, total, end = _USAGE_HEAD.unpack_from(raw)
    size = _USAGE_HEAD.size + count * _PAIR.size
    if found != log_id:
        raise CorruptionError("entry-log usage file names another log", path=path, found=found)
    ledgers = dict(_PAIR.iter_unpack(raw[_USAGE_HEAD.size:size]))
    if end < LOG_HEADER_SIZE:
        raise CorruptionError("entry-log usage file has an impossible end", path=path, end=end)
    return LogUsage(log_id, ledgers, total, sum(ledgers.values()), end)


#: Usage-file version -> the decoder of an intact file (magic, length and CRC checked).
_USAGE_READERS: dict[int, Callable[[bytes, int, str], LogUsage]] = {1: _decode_usage_v1}


def write_usage_file(fs: FileSystem, path: str, usage: LogUsage) -> None:
    """Write ``path`` as ``path.tmp``, sync, rename (the caller fsyncs the directory)."""
    tmp = path + ".tmp"
    f = fs.open(tmp, create=True)
    try:
        f.truncate(0)
        f.pwrite(encode_usage(usage), 0)
        f.sync()
    finally:
        f.close()
    fs.rename(tmp, path)


def read_usage_file(fs: FileSystem, path: str, log_id: int) -> LogUsage:
    return decode_usage(read_all(fs, path), log_id, path)


def scan_records(f: File, log_id: int) -> Iterator[tuple[int, int, int, bytes]]:
    """``(offset, ledger id, entry id, data)`` of each intact record, in order, until
    the end of the file or the first record that is not intact (zeroed, torn, bad CRC):
    each record's CRC and bounds are checked before it is yielded."""
    size = f.size()
    offset = LOG_HEADER_SIZE
    buf, buf_at = b"", offset
    while offset + RECORD_HEADER.size <= size:
        rel = offset - buf_at
        if rel + RECORD_HEADER.size > len(buf):
            buf, buf_at, rel = f.pread(_SCAN_CHUNK, offset), offset, 0
        where: dict[str, object] = {"log": log_id, "offset": offset}
        try:
            total = record_length(buf[rel:rel + RECORD_HEADER.size], where)
            if offset + total > size:
                return
            if rel + total > len(buf):
                buf, buf_at, rel = f.pread(max(_SCAN_CHUNK, total), offset), offset, 0
            _, _, ledger_id, entry_id = RECORD_HEADER.unpack_from(buf, rel)
            data = check_record(buf[rel:rel + total], ledger_id, entry_id, where)
        except CorruptionError:
            return
        yield offset, ledger_id, entry_id, data
        offset += total


def rebuild_usage(f: File, log_id: int) -> LogUsage:
    """The usage of a log read record by record; its ``end`` is where the intact
    records end (the file's size unless its tail is torn)."""
    usage = LogUsage(log_id)
    for _, ledger_id, _, data in scan_records(f, log_id):
        usage.add(ledger_id, RECORD_HEADER.size + len(data))
    return usage
