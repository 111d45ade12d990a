"""Journal file format: header block and frames (see docs/format.md, "Journal").

A journal file ``<id:016x>.txn`` starts with one alignment-sized header block, then
holds frames back to back. Every flush starts on an alignment boundary and ends with a
PADDING frame up to the next boundary, so O_DIRECT writes are whole blocks and each
flush's first frame carries ``FLAG_FLUSH_START``. Frame type 0 is invalid, so the zeroed
(preallocated) space after the last flush is never mistaken for data.

Frame: ``crc32c u32 | type u8 | flags u8 | reserved u16 | length u32 | body``; the CRC,
seeded with the CRC32C of the file's journal id, covers everything after itself (type ..
end of body). All integers little-endian. A recycled file (an old journal reused for a
new id, so appends overwrite written blocks instead of converting fresh extents) keeps
its earlier life's bytes after the new tail; the seed makes those frames invalid now.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass

from crc32c import crc32c

from walkit.errors import FormatError, FormatVersionError

__all__ = [
    "MAGIC",
    "VERSION",
    "MIN_ALIGNMENT",
    "FrameType",
    "FLAG_FLUSH_START",
    "FRAME_HEADER",
    "MAX_FRAME_BODY",
    "JournalHeader",
    "journal_name",
    "parse_journal_name",
    "frame_crc",
    "frame_seed",
    "parse_frame",
    "padding_size",
    "ENTRY_PREFIX",
    "LEDGER_PREFIX",
    "LAC_BODY",
]

MAGIC = b"WKJOURNL"
VERSION = 1  # 1: first format (header block, id-seeded CRC32C frames, padding at each flush)
#: Every alignment the format allows is a power of two at least this (a sector), so a
#: multiple of it: where to look for flush starts when a file's header cannot be read.
MIN_ALIGNMENT = 512

_HEADER = struct.Struct("<8sHHIQQI")  # magic, version, reserved, alignment, journal id, previous id, crc
FRAME_HEADER = struct.Struct("<IBBHI")  # crc, type, flags, reserved, length
_ID = struct.Struct("<Q")
_FRAME_TAIL = struct.Struct("<BBHI")  # the part of the frame header the CRC covers
ENTRY_PREFIX = struct.Struct("<Qq")  # ledger id, entry id
LEDGER_PREFIX = struct.Struct("<Q")  # ledger id (master key, fence frames)
LAC_BODY = struct.Struct("<Qq")  # ledger id, explicit LAC

#: Bound checked before any allocation while reading (an entry is at most 5 MiB on the
#: wire; a frame body adds 16 bytes of ids).
MAX_FRAME_BODY = 64 << 20

FLAG_FLUSH_START = 0x01
_SUFFIX = ".txn"


class FrameType(enum.IntEnum):
    INVALID = 0
    ENTRY = 1
    MASTER_KEY = 2
    FENCE = 3
    LAC = 4
    PADDING = 5


@dataclass(frozen=True)
class JournalHeader:
    journal_id: int
    alignment: int
    #: The id this file had before it was recycled (0: a new file). Frames of that
    #: earlier life may follow this one's last frame; their CRC seed tells them apart.
    previous_id: int = 0
    version: int = VERSION

    def encode(self) -> bytes:
        """The full header block (``alignment`` bytes)."""
        raw = _HEADER.pack(MAGIC, self.version, 0, self.alignment, self.journal_id, self.previous_id, 0)
        crc = crc32c(raw[: _HEADER.size - 4])
        raw = raw[: _HEADER.size - 4] + struct.pack("<I", crc)
        return raw + bytes(self.alignment - len(raw))

    @classmethod
    def decode(cls, raw: bytes, *, path: str = "") -> JournalHeader:
        """The header; FormatError when it is damaged, FormatVersionError when it is
        intact (magic and checksum hold) but of a version this code does not read."""
        if len(raw) < _HEADER.size:
            raise FormatError("journal header is short", path=path, size=len(raw))
        magic, version, _, _, _, _, crc = _HEADER.unpack_from(raw)
        if magic != MAGIC:
            raise FormatError("not a walkit journal (bad magic)", path=path)
        if crc32c(raw[: _HEADER.size - 4]) != crc:
            raise FormatError("journal header checksum mismatch", path=path)
        return FormatVersionError.reader(_HEADER_READERS, version, "journal", path=path)(raw, path)


def _decode_header_v1(raw: bytes, path: str) -> JournalHeader:
    _, version, _, alignment, journal_id, previous_id, _ = _HEADER.unpack_from(raw)
    if alignment < MIN_ALIGNMENT or alignment & (alignment - 1):
        raise FormatError("bad journal alignment", path=path, alignment=alignment)
    return JournalHeader(journal_id=journal_id, alignment=alignment, previous_id=previous_id, version=version)


#: Journal version -> the decoder of an intact header (magic and checksum checked).
_HEADER_READERS: dict[int, Callable[[bytes, str], JournalHeader]] = {1: _decode_header_v1}


def journal_name(journal_id: int) -> str:
    return f"{journal_id:016x}{_SUFFIX}"


def parse_journal_name(name: str) -> int | None:
    """The journal id of a file name, or None when it is not a journal file."""
    stem, dot, suffix = name.partition(".")
    if "." + suffix != _SUFFIX or len(stem) != 16:
        return None
    try:
        return int(stem, 16)
    except ValueError:
        return None


def frame_seed(journal_id: int) -> int:
    """The CRC seed of a file's frames: the CRC32C of its journal id (8 bytes, LE).
    Frames of a recycled file's earlier life fail the CRC of its new life."""
    return crc32c(_ID.pack(journal_id))


def frame_crc(ftype: int, flags: int, length: int, body: bytes | memoryview, seed: int) -> int:
    """The CRC a frame must carry (the rule; the writer computes it in place)."""
    return crc32c(body, crc32c(_FRAME_TAIL.pack(ftype, flags, 0, length), seed))


def parse_frame(view: memoryview, pos: int, limit: int, seed: int) -> tuple[int, int, int] | None:
    """Validate the frame at ``pos`` (ending at or before ``limit``) with the file's CRC
    ``seed`` and return ``(type, flags, body_length)``, or None when it is not one."""
    if limit - pos < FRAME_HEADER.size:
        return None
    crc, ftype, flags, reserved, length = FRAME_HEADER.unpack_from(view, pos)
    if ftype == 0 or ftype > FrameType.PADDING or reserved or length > MAX_FRAME_BODY:
        return None
    end = pos + FRAME_HEADER.size + length
    if end > limit or crc32c(view[pos + 4 : end], seed) != crc:
        return None
    return ftype, flags, length


def padding_size(fill: int, alignment: int) -> int:
    """Bytes of PADDING frame (header included) that bring ``fill`` to a boundary;
    0 when already aligned. Never less than a frame header."""
    pad = -fill % alignment
    if pad and pad < FRAME_HEADER.size:
        pad += alignment
    return pad
