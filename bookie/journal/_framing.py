"""Packing journal records into an aligned buffer (the journal thread's inner loop).

A :class:`FrameBuffer` owns the fill position of the batch being built. Records become
frames (docs/format.md, "Journal"); the first frame of a flush carries
``FLAG_FLUSH_START``; :meth:`FrameBuffer.pad` closes a batch on an aligned boundary.
Two alignment units of room are always kept free for that padding. A frame that does
not fit is written in pieces: whole aligned blocks go out through the ``spill`` function
the writer gives (a write without sync, covered by the batch's fdatasync later).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from crc32c import crc32c

from bookie.fs import AlignedBuffer
from bookie.journal._format import (
    ENTRY_PREFIX,
    FLAG_FLUSH_START,
    FRAME_HEADER,
    LAC_BODY,
    LEDGER_PREFIX,
    FrameType,
    frame_crc,
    padding_size,
)

__all__ = ["FrameBuffer", "ENTRY", "frame_size"]

_ENTRY_HEAD = struct.Struct("<IBBHIQq")  # frame header + ledger id + entry id, in one pack
_U32 = struct.Struct("<I")
ENTRY = int(FrameType.ENTRY)


def frame_size(rec: tuple[Any, ...]) -> int:
    """An upper bound of the bytes a queued record takes as a frame."""
    return FRAME_HEADER.size + ENTRY_PREFIX.size + len(rec[3])


class FrameBuffer:
    """The batch being built. ``spill(view)`` must write ``view`` (whole aligned blocks)
    at the file position right after what was written before."""

    def __init__(self, buf: AlignedBuffer, alignment: int, spill: Callable[[memoryview], None]) -> None:
        self._alignment = alignment
        self._spill_out = spill
        self._zeros = bytes(2 * alignment)
        self.use(buf)

    def use(self, buf: AlignedBuffer) -> None:
        """Start an empty batch in ``buf``."""
        self.buf = buf
        self._view = buf.view
        self._limit = len(buf) - 2 * self._alignment  # room kept for the padding frame
        self.fill = 0
        self._mid_batch = False  # a spill emptied the buffer in the middle of a batch

    def fits(self, nbytes: int) -> bool:
        return self.fill + nbytes <= self._limit

    def append(self, rec: tuple[Any, ...]) -> None:
        """Frame one queued record: (type, ledger id, entry id or LAC, data, ...)."""
        ftype, ledger_id, arg, data = rec[0], rec[1], rec[2], rec[3]
        if ftype == ENTRY:
            pos = self.fill
            end = pos + _ENTRY_HEAD.size + len(data)
            if end > self._limit:
                self._append_frame(ftype, ENTRY_PREFIX.pack(ledger_id, arg), data)
                return
            # The fast path: one header pack, one copy, one CRC, one CRC pack.
            flags = 0 if pos or self._mid_batch else FLAG_FLUSH_START
            view = self._view
            _ENTRY_HEAD.pack_into(view, pos, 0, ftype, flags, 0, len(data) + ENTRY_PREFIX.size, ledger_id, arg)
            view[pos + _ENTRY_HEAD.size : end] = data
            _U32.pack_into(view, pos, crc32c(view[pos + 4 : end]))
            self.fill = end
        elif ftype == FrameType.MASTER_KEY:
            self._append_frame(ftype, LEDGER_PREFIX.pack(ledger_id), data)
        elif ftype == FrameType.FENCE:
            self._append_frame(ftype, LEDGER_PREFIX.pack(ledger_id), b"")
        else:
            self._append_frame(ftype, LAC_BODY.pack(ledger_id, arg), b"")

    def pad(self) -> None:
        """Close the batch with a PADDING frame up to the next aligned offset."""
        pad = padding_size(self.fill, self._alignment)
        if not pad:
            return
        pos, view = self.fill, self._view
        view[pos : pos + pad] = self._zeros[:pad]
        FRAME_HEADER.pack_into(view, pos, 0, FrameType.PADDING, 0, 0, pad - FRAME_HEADER.size)
        _U32.pack_into(view, pos, crc32c(view[pos + 4 : pos + pad]))
        self.fill = pos + pad

    def _append_frame(self, ftype: int, prefix: bytes, data: bytes) -> None:
        flags = FLAG_FLUSH_START if self.fill == 0 and not self._mid_batch else 0
        length = len(prefix) + len(data)
        crc = frame_crc(ftype, flags, length, prefix, data)
        self._append_bytes(FRAME_HEADER.pack(crc, ftype, flags, 0, length) + prefix)
        self._append_bytes(data)

    def _append_bytes(self, data: bytes | memoryview) -> None:
        mv = memoryview(data)
        while mv:
            room = self._limit - self.fill
            if room <= 0:
                self._spill()
                continue
            chunk = mv[:room]
            self._view[self.fill : self.fill + len(chunk)] = chunk
            self.fill += len(chunk)
            mv = mv[len(chunk) :]

    def _spill(self) -> None:
        """Hand the whole aligned blocks to ``spill`` and keep the remainder."""
        aligned = self.fill - self.fill % self._alignment
        self._spill_out(self._view[:aligned])
        rest = self.fill - aligned
        self._view[:rest] = self._view[aligned : self.fill]
        self.fill = rest
        self._mid_batch = True
