"""The LastLogMark: how far the journal is covered by durable ledger storage.

A checkpoint flushes and syncs the ledger storage, then writes the mark - the journal
position every entry before which is now safe in ledger storage - into a ``lastMark``
file in every ledger directory (tmp, rename, fsync of the directory). Restart replays
the journals from the highest valid mark; journal files wholly before it may go.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass

from crc32c import crc32c

from bookie.fs import FileSystem, read_all, write_atomic
from walkit.errors import FormatError, FormatVersionError

__all__ = ["LogMark", "MARK_FILE", "write_mark", "read_marks", "highest_mark"]

log = logging.getLogger("bookie.journal")

MARK_FILE = "lastMark"
_MAGIC = b"WKLMARK\x00"
_VERSION = 1  # 1: first format
_MARK = struct.Struct("<8sHHIQQ")  # magic, version, reserved, reserved, journal id, offset
_CRC = struct.Struct("<I")


@dataclass(frozen=True, order=True)
class LogMark:
    """A position in the journal: file id, then byte offset inside it."""

    journal_id: int
    offset: int

    def encode(self) -> bytes:
        raw = _MARK.pack(_MAGIC, _VERSION, 0, 0, self.journal_id, self.offset)
        return raw + _CRC.pack(crc32c(raw))

    @classmethod
    def decode(cls, raw: bytes, *, path: str = "") -> LogMark:
        """The mark; FormatError when it is damaged, FormatVersionError when it is
        intact (magic and checksum hold) but of a version this code does not read."""
        if len(raw) != _MARK.size + _CRC.size:
            raise FormatError("lastMark has the wrong size", path=path, size=len(raw))
        magic, version, _, _, _, _ = _MARK.unpack_from(raw)
        (crc,) = _CRC.unpack_from(raw, _MARK.size)
        if magic != _MAGIC or crc32c(raw[: _MARK.size]) != crc:
            raise FormatError("lastMark is damaged", path=path)
        return FormatVersionError.reader(_READERS, version, "lastMark", path=path)(raw)


def _decode_v1(raw: bytes) -> LogMark:
    _, _, _, _, journal_id, offset = _MARK.unpack_from(raw)
    return LogMark(journal_id, offset)


#: lastMark version -> the decoder of an intact mark (size, magic and checksum checked).
_READERS: dict[int, Callable[[bytes], LogMark]] = {1: _decode_v1}


def write_mark(fs: FileSystem, ledger_dirs: list[str], mark: LogMark) -> None:
    """Persist ``mark`` atomically in every ledger directory."""
    data = mark.encode()
    for d in ledger_dirs:
        write_atomic(fs, f"{d}/{MARK_FILE}", data)


def read_marks(fs: FileSystem, ledger_dirs: list[str]) -> list[LogMark]:
    """Every valid mark found; damaged ones are reported and skipped (another
    directory, or replaying more journal, covers for them). A mark of a version this
    code does not read raises FormatVersionError: another walkit's disk, not damage."""
    marks = []
    for d in ledger_dirs:
        path = f"{d}/{MARK_FILE}"
        if not fs.exists(path):
            continue
        try:
            marks.append(LogMark.decode(read_all(fs, path), path=path))
        except FormatVersionError:
            raise
        except FormatError as exc:
            log.warning("ignoring damaged mark: %s", exc)
    return marks


def highest_mark(fs: FileSystem, ledger_dirs: list[str]) -> LogMark | None:
    marks = read_marks(fs, ledger_dirs)
    return max(marks) if marks else None
