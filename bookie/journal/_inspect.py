"""Reading one journal file for an operator (``walkit bookie readjournal``).

Unlike replay, this never changes the file and never needs its directory: it reads the
file's own header (so a copy such as ``FILE.broken`` reads too), walks its frames with
the same reader replay uses, and says where and why it stopped (see the verdicts of
:mod:`bookie.journal._replay`): ``end`` (only zeros follow, or the end of the file),
``recycled-end`` (a recycled file's terminator: its earlier life follows), ``torn`` (other
bytes follow but no valid flush: the last flush did not reach the disk whole) or
``corrupt`` (a valid flush follows: synced bytes were damaged).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from bookie.fs import FileSystem
from bookie.journal._format import (
    ENTRY_PREFIX,
    FRAME_HEADER,
    LAC_BODY,
    LEDGER_PREFIX,
    FrameType,
    JournalHeader,
    frame_seed,
)
from bookie.journal._replay import _all_zero, _frames, _Reader, _Stop, _valid_flush_after

__all__ = ["JournalRecord", "JournalStop", "JournalFile"]


@dataclass(frozen=True)
class JournalRecord:
    """One frame: ``arg`` is the entry id (ENTRY) or the LAC (LAC), else None; ``size``
    the bytes of its payload (entry data, master key; 0 for fence and LAC)."""

    offset: int
    type: FrameType
    flags: int
    ledger_id: int | None
    arg: int | None
    size: int


@dataclass(frozen=True)
class JournalStop:
    """Where the walk of the frames stopped, and what lies there (module docstring)."""

    offset: int
    file_size: int
    verdict: str
    valid_data_at: int | None = None


class JournalFile:
    """The records of one journal file. Iterate :meth:`records` to the end before
    reading :attr:`stop`. Raises FormatError (a damaged header; FormatVersionError: an
    intact one of a version this code does not read) and NativeIOError."""

    def __init__(self, fs: FileSystem, path: str) -> None:
        self.path = path
        self._file = fs.open(path)
        try:
            self.header = JournalHeader.decode(self._file.pread(64, 0), path=path)
        except BaseException:
            self._file.close()
            raise
        self.stop: JournalStop | None = None

    def records(self) -> Iterator[JournalRecord]:
        reader = _Reader(self._file)
        seed = frame_seed(self.header.journal_id)
        stops: list[_Stop] = []
        offset = self.header.alignment
        for ftype, flags, body in _frames(reader, offset, stops, seed):
            yield _record(offset, ftype, flags, body)
            offset += FRAME_HEADER.size + len(body)
        self.stop = self._judge(reader, stops[0], seed)

    def _judge(self, reader: _Reader, stop: _Stop, seed: int) -> JournalStop:
        alignment = self.header.alignment  # decode refuses a header without a valid one
        if stop.offset >= stop.size or _all_zero(reader, stop.offset):
            return JournalStop(stop.offset, stop.size, "end")
        if self.header.previous_id and _all_zero(reader, stop.offset, stop.offset + alignment):
            return JournalStop(stop.offset, stop.size, "recycled-end")
        follows = _valid_flush_after(reader, stop.offset, alignment, seed)
        if follows is not None:
            return JournalStop(stop.offset, stop.size, "corrupt", follows)
        return JournalStop(stop.offset, stop.size, "torn")

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> JournalFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _record(offset: int, ftype: int, flags: int, body: memoryview) -> JournalRecord:
    kind = FrameType(ftype)
    if kind in (FrameType.ENTRY, FrameType.LAC):
        ledger_id, arg = (ENTRY_PREFIX if kind is FrameType.ENTRY else LAC_BODY).unpack_from(body)
        size = len(body) - ENTRY_PREFIX.size if kind is FrameType.ENTRY else 0
        return JournalRecord(offset, kind, flags, ledger_id, arg, size)
    if kind in (FrameType.MASTER_KEY, FrameType.FENCE):
        (ledger_id,) = LEDGER_PREFIX.unpack_from(body)
        return JournalRecord(offset, kind, flags, ledger_id, None, len(body) - LEDGER_PREFIX.size)
    return JournalRecord(offset, kind, flags, None, None, len(body))  # PADDING
