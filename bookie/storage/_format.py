"""Byte formats of the ledger storage: entry-log header and records, index headers, names.

Pure code, no I/O (see ``docs/format.md``, "Entry log" and "Index file"). All integers
are little-endian, like the journal's. Every decoder checks magic, version, lengths
(before anything is allocated) and CRC32C, and says what it found with key=value
context. A zero length, a zero slot or an all-zero header copy is never valid data, so
zeroed or preallocated space always reads as "nothing here".

Each format has its own version (:data:`LOG_VERSION`, :data:`INDEX_VERSION`) and a table
``version -> decoder``: a header whose magic and CRC hold is handed to the decoder of the
version it names, and a version with no decoder is a
:class:`~walkit.errors.FormatVersionError` (another walkit's file: refused, never taken
for damage).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

from crc32c import crc32c

from walkit.errors import CorruptionError, FormatError, FormatVersionError, InvalidArgumentError

__all__ = [
    "LOG_VERSION",
    "INDEX_VERSION",
    "LOG_HEADER_SIZE",
    "RECORD_HEADER",
    "RECORD_CRC_HEAD",
    "MAX_ENTRY_SIZE",
    "MAX_ENTRY_ID",
    "MAX_LEDGER_ID",
    "MAX_MASTER_KEY",
    "INDEX_COPY_SIZE",
    "INDEX_HEADER_SIZE",
    "SLOT",
    "IndexHeader",
    "encode_log_header",
    "check_log_header",
    "record_prefix",
    "record_length",
    "check_record",
    "encode_index_copy",
    "decode_index_copy",
    "pack_location",
    "unpack_location",
    "log_name",
    "parse_log_name",
    "parse_logs_dir_name",
    "index_name",
    "parse_index_name",
    "check_entry_ids",
    "check_limits",
]

LOG_MAGIC = b"WKENTLOG"
INDEX_MAGIC = b"WKLEDIDX"
LOG_VERSION = 1  # 1: first format (512-byte header, CRC32C records)
INDEX_VERSION = 1  # 1: first format (two header copies, 8-byte slots)

LOG_HEADER_SIZE = 512  # one sector; records start right after it
_LOG_HEADER = struct.Struct("<8sHHQI")  # magic, version, header size, log id, crc
#: length (of everything after the CRC), crc32c, ledger id, entry id; then the data.
RECORD_HEADER = struct.Struct("<IIQQ")
_RECORD_IDS = struct.Struct("<QQ")  # the part of the header counted in ``length``
RECORD_CRC_HEAD = struct.Struct("<IQQ")  # length and ids: what the CRC covers before the data
_U32 = struct.Struct("<I")

MAX_ENTRY_SIZE = 64 << 20  # bound checked before allocating a record's data
MAX_ENTRY_ID = (1 << 40) - 1  # slot e lives at 1024 + 8e: bounds a sparse index file
MAX_LEDGER_ID = (1 << 63) - 1
MAX_MASTER_KEY = 64

INDEX_COPY_SIZE = 512  # each header copy owns a whole sector
INDEX_HEADER_SIZE = 2 * INDEX_COPY_SIZE  # slot e is at INDEX_HEADER_SIZE + 8 * e
#: magic, version, copy number, ledger id, sequence, flags, key length, reserved,
#: explicit LAC, master key (zero padded); then the crc32c of all of it.
_INDEX_COPY = struct.Struct("<8sHHQQIHHq64s")
SLOT = struct.Struct("<Q")  # (entry log id << 32) | offset; 0 = absent
_MAGIC_VERSION = struct.Struct("<8sH")  # where every version of both files keeps them

_FLAG_FENCED = 0x1
_FLAG_HAS_LAC = 0x2
_FLAG_HAS_KEY = 0x4
_KNOWN_FLAGS = _FLAG_FENCED | _FLAG_HAS_LAC | _FLAG_HAS_KEY

_LOG_NAME = re.compile(r"^([0-9a-f]{16})\.log$")
#: Files of the logs directory: an entry log, its usage file (or one being written),
#: its compaction marker.
_LOGS_DIR_NAME = re.compile(r"^([0-9a-f]{16})\.(log|use|use\.tmp|compact)$")
_INDEX_NAME = re.compile(r"^([0-9a-f]{16})\.idx(\.tmp)?$")


# --- entry log ----------------------------------------------------------------------
def encode_log_header(log_id: int) -> bytes:
    raw = _LOG_HEADER.pack(LOG_MAGIC, LOG_VERSION, LOG_HEADER_SIZE, log_id, 0)[:-4]
    raw += _U32.pack(crc32c(raw))
    return raw + bytes(LOG_HEADER_SIZE - len(raw))


def check_log_header(raw: bytes, log_id: int, path: str) -> None:
    """Raise unless ``raw`` starts with a valid header of entry log ``log_id``: a
    CorruptionError when it is damaged, a FormatVersionError when it is intact but of a
    version this code does not read."""
    if len(raw) < _LOG_HEADER.size:
        raise CorruptionError("entry log header truncated", path=path, size=len(raw))
    magic, version, _, _, crc = _LOG_HEADER.unpack_from(raw)
    if magic != LOG_MAGIC:
        raise FormatError("not an entry log", path=path, magic=magic.hex())
    if crc != crc32c(raw[: _LOG_HEADER.size - 4]):
        raise CorruptionError("entry log header CRC mismatch", path=path)
    FormatVersionError.reader(_LOG_HEADER_READERS, version, "entry log", path=path)(raw, log_id, path)


def _check_log_header_v1(raw: bytes, log_id: int, path: str) -> None:
    _, _, size, found_id, _ = _LOG_HEADER.unpack_from(raw)
    if size != LOG_HEADER_SIZE:
        raise FormatError("entry log header size invalid", path=path, size=size)
    if found_id != log_id:
        raise CorruptionError("entry log id differs from its name", path=path, found=found_id)


#: Entry-log version -> the check of the rest of its header (records follow at 512).
_LOG_HEADER_READERS: dict[int, Callable[[bytes, int, str], None]] = {1: _check_log_header_v1}


def record_prefix(ledger_id: int, entry_id: int, data: bytes) -> bytes:
    """The 24-byte record header; the record is this followed by ``data``."""
    length = _RECORD_IDS.size + len(data)
    crc = crc32c(data, crc32c(RECORD_CRC_HEAD.pack(length, ledger_id, entry_id)))
    return RECORD_HEADER.pack(length, crc, ledger_id, entry_id)


def record_length(head: bytes, where: dict[str, object]) -> int:
    """Total size of the record whose first bytes are ``head`` (bounded, never 0)."""
    if len(head) < RECORD_HEADER.size:
        raise CorruptionError("entry record truncated", size=len(head), **where)
    length: int = _U32.unpack_from(head)[0]
    if not _RECORD_IDS.size <= length <= _RECORD_IDS.size + MAX_ENTRY_SIZE:
        raise CorruptionError("entry record length out of bounds", length=length, **where)
    return 8 + length


def check_record(raw: bytes, ledger_id: int, entry_id: int, where: dict[str, object]) -> bytes:
    """Verify a whole record (CRC and ids) and return its data."""
    total = record_length(raw, where)
    if len(raw) < total:
        raise CorruptionError("entry record truncated", size=len(raw), want=total, **where)
    length, crc, found_ledger, found_entry = RECORD_HEADER.unpack_from(raw)
    body = memoryview(raw)[8:total]
    if crc != crc32c(body, value=crc32c(raw[:4])):
        raise CorruptionError("entry record CRC mismatch", **where)
    if (found_ledger, found_entry) != (ledger_id, entry_id):
        raise CorruptionError(
            "entry record holds another entry",
            found_ledger=found_ledger,
            found_entry=found_entry,
            **where,
        )
    return bytes(body[_RECORD_IDS.size :])


# --- index file ---------------------------------------------------------------------
@dataclass(frozen=True)
class IndexHeader:
    """One copy of an index file header: the durable per-ledger state."""

    ledger_id: int
    seq: int
    fenced: bool = False
    explicit_lac: int | None = None
    master_key: bytes | None = None


def encode_index_copy(h: IndexHeader) -> bytes:
    """The 512-byte sector of header copy number ``h.seq % 2``."""
    key = h.master_key or b""
    flags = (_FLAG_FENCED if h.fenced else 0) | (_FLAG_HAS_LAC if h.explicit_lac is not None else 0)
    flags |= _FLAG_HAS_KEY if h.master_key is not None else 0
    lac = -1 if h.explicit_lac is None else h.explicit_lac
    raw = _INDEX_COPY.pack(
        INDEX_MAGIC, INDEX_VERSION, h.seq % 2, h.ledger_id, h.seq, flags, len(key), 0, lac, key
    )
    raw += _U32.pack(crc32c(raw))
    return raw + bytes(INDEX_COPY_SIZE - len(raw))


def decode_index_copy(raw: bytes, copy: int, ledger_id: int, path: str) -> IndexHeader | None:
    """The header in sector ``copy``, or None when that copy is torn, zero or foreign;
    FormatVersionError when it is intact but of a version this code does not read."""
    end = _INDEX_COPY.size
    if len(raw) < end + 4 or _U32.unpack_from(raw, end)[0] != crc32c(raw[:end]):
        return None
    magic, version = _MAGIC_VERSION.unpack_from(raw)
    if magic != INDEX_MAGIC:
        return None
    return FormatVersionError.reader(_INDEX_COPY_READERS, version, "index file", path=path)(raw, copy, ledger_id, path)


def _decode_index_copy_v1(raw: bytes, copy: int, ledger_id: int, path: str) -> IndexHeader:
    _, _, found_copy, lid, seq, flags, keylen, _, lac, key = _INDEX_COPY.unpack_from(raw)
    if lid != ledger_id or found_copy != copy or seq % 2 != copy or seq == 0:
        raise CorruptionError("index header belongs elsewhere", path=path, ledger=lid, seq=seq)
    if flags & ~_KNOWN_FLAGS or keylen > MAX_MASTER_KEY:
        raise CorruptionError("index header fields invalid", path=path, flags=flags, keylen=keylen)
    return IndexHeader(
        ledger_id=lid,
        seq=seq,
        fenced=bool(flags & _FLAG_FENCED),
        explicit_lac=lac if flags & _FLAG_HAS_LAC else None,
        master_key=key[:keylen] if flags & _FLAG_HAS_KEY else None,
    )


#: Index-file version -> the decoder of an intact header copy.
_INDEX_COPY_READERS: dict[int, Callable[[bytes, int, int, str], IndexHeader]] = {1: _decode_index_copy_v1}


def pack_location(log_id: int, offset: int) -> int:
    return (log_id << 32) | offset


def unpack_location(slot: int) -> tuple[int, int]:
    return slot >> 32, slot & 0xFFFFFFFF


# --- names --------------------------------------------------------------------------
def log_name(log_id: int) -> str:
    return f"{log_id:016x}.log"


def parse_log_name(name: str) -> int | None:
    m = _LOG_NAME.match(name)
    return int(m.group(1), 16) if m else None


def parse_logs_dir_name(name: str) -> tuple[int, str] | None:
    """``(log id, kind)`` of a name in the logs directory - kind ``log``, ``use``,
    ``use.tmp`` or ``compact`` - or None for a foreign name."""
    m = _LOGS_DIR_NAME.match(name)
    return (int(m.group(1), 16), m.group(2)) if m else None


def index_name(ledger_id: int) -> str:
    return f"{ledger_id:016x}.idx"


def parse_index_name(name: str) -> tuple[int, bool] | None:
    """``(ledger id, is a .tmp leftover)`` or None for a foreign name."""
    m = _INDEX_NAME.match(name)
    return (int(m.group(1), 16), m.group(2) is not None) if m else None


# --- limits -------------------------------------------------------------------------
def check_entry_ids(ledger_id: int, entry_id: int) -> None:
    if not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise InvalidArgumentError("ledger id out of range", ledger=ledger_id)
    if not 0 <= entry_id <= MAX_ENTRY_ID:
        raise InvalidArgumentError("entry id out of range", ledger=ledger_id, entry=entry_id)


def check_limits(dirs: list[str], log_limit: int, open_files: int, buffer: int) -> None:
    """Storage settings: distinct dirs, a log size whose offsets fit a slot, etc."""
    if not dirs or len(set(dirs)) != len(dirs):
        raise InvalidArgumentError("ledger dirs must be non-empty and distinct", dirs=dirs)
    if not LOG_HEADER_SIZE + RECORD_HEADER.size <= log_limit <= 1 << 32:
        raise InvalidArgumentError("entry log size limit out of range", limit=log_limit)
    if open_files < 1 or buffer < 1:
        raise InvalidArgumentError("limits must be positive", open_index_files=open_files, buffer=buffer)

