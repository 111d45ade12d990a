"""Cutting a byte stream into the wire protocol's frames, incrementally and sans-IO.

Theory of operation. Every frame starts with a big-endian u32 ``length`` counting the
bytes after it (docs/format.md, "Wire protocol"); nothing else of a frame is read here.
:class:`FrameDecoder` is fed whatever a socket read returned and hands back each
complete frame *without* its length prefix, holding back at most one partial frame.

Invariants: a length below the 12 header bytes or past ``max_frame_size - 4`` is an
error at once (before its body arrives), and again on every later feed - the stream
cannot be resynchronized, so the connection must close. Each received byte is copied
into the held-back buffer at most once (:meth:`FrameDecoder.join` only gathers while a
frame of known length is incomplete), so a large frame arriving in many reads costs
linear, not quadratic, time. The connections (:mod:`walkit.protocol._connection`) cut
frames themselves on their hot paths, with :meth:`~FrameDecoder.join`,
:meth:`~FrameDecoder.keep`, :meth:`~FrameDecoder.refuse` and :attr:`~FrameDecoder.limit`
keeping the same invariants.
"""

from __future__ import annotations

import struct
from typing import TypeAlias

from walkit.errors import FrameTooLargeError, ProtocolError
from walkit.protocol._codes import DEFAULT_MAX_FRAME_SIZE, HEADER_SIZE, MIN_MAX_FRAME_SIZE
from walkit.protocol._messages import _U32, _int

__all__ = ["Buffer", "FrameDecoder"]

Buffer: TypeAlias = bytes | bytearray | memoryview
_LENGTH = struct.Struct(">I")  # the length prefix


class FrameDecoder:
    """Cuts a byte stream into frames (returned without their length prefix).

    Holds at most one partial frame. A length prefix below 12 or past the maximum is
    raised at once (before its body arrives) and again on every later feed: the stream
    cannot be resynchronized, the connection must close.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        _int("max_frame_size", max_frame_size, MIN_MAX_FRAME_SIZE, _U32)
        self.max_frame_size = max_frame_size
        self._limit = max_frame_size - 4  # the largest length field
        self._buf = bytearray()
        self._error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held back."""
        return len(self._buf)

    def feed(self, data: Buffer) -> list[bytes]:
        """Complete frames in ``data`` (and what was buffered before it). On a bad length
        the frames before it in the same call are dropped with the raise (see split())."""
        frames, error = self.split(data)
        if error is not None:
            raise error
        return frames

    def split(self, data: Buffer) -> tuple[list[bytes], ProtocolError | None]:
        """Like :meth:`feed`, but hands back the frames before a bad length with the error."""
        if self._error is not None:
            return [], self._error
        buf = self._buf
        if buf:
            buf += data
            frames, end = self._scan(buf)
            del buf[:end]  # moves only the partial frame's bytes, each at most once
        else:
            frames, end = self._scan(data)
            if end < len(data):
                buf += memoryview(data)[end:]
        return frames, self._error

    def join(self, data: Buffer) -> bytes:
        """The bytes held back followed by ``data``, as one ``bytes`` (no copy when
        nothing was held back and ``data`` is bytes); the buffer is emptied. For a
        reader that cuts frames itself: it hands back what it did not use with
        :meth:`keep` and a bad length prefix with :meth:`refuse`. While the frame held
        back is still incomplete with ``data``, ``data`` is held back too and the result
        is empty (nothing to cut yet)."""
        buf = self._buf
        if not buf:
            return data if type(data) is bytes else bytes(data)
        if len(buf) >= 4:  # a frame of a known length is held back: until it is whole, only gather
            (length,) = _LENGTH.unpack_from(buf)
            if HEADER_SIZE <= length <= self._limit and len(buf) + len(data) < 4 + length:
                buf += data  # a large answer comes in many reads: each is copied once, not the
                return b""  # whole frame again on every read (that was quadratic in its size)
        src = b"".join((buf, data))  # one copy: ``buf += data; bytes(buf)`` copied ``data`` twice, into a
        buf.clear()  # bytearray grown from the held-back bytes (a fresh mmap'd block per read: ~40x slower)
        return src

    def keep(self, src: bytes, end: int) -> None:
        """Hold back ``src[end:]`` (an incomplete frame) for the next call."""
        if end < len(src):
            self._buf += memoryview(src)[end:]

    def refuse(self, length: int) -> ProtocolError:
        """The error for a bad length prefix, kept: later calls get it again."""
        self._error = self._length_error(length)
        return self._error

    @property
    def limit(self) -> int:
        """The largest length prefix accepted."""
        return self._limit

    def _scan(self, src: Buffer) -> tuple[list[bytes], int]:
        if type(src) is bytes:
            return self._cut(src, src)
        with memoryview(src) as view:
            return self._cut(src, view)

    def _cut(self, src: Buffer, view: bytes | memoryview) -> tuple[list[bytes], int]:
        frames: list[bytes] = []
        n, off, limit, unpack = len(src), 0, self._limit, _LENGTH.unpack_from
        while n - off >= 4:
            (length,) = unpack(src, off)
            if not HEADER_SIZE <= length <= limit:
                self._error = self._length_error(length)
                break
            end = off + 4 + length
            if end > n:
                break
            frames.append(bytes(view[off + 4 : end]))
            off = end
        return frames, off

    def _length_error(self, length: int) -> ProtocolError:
        if length < HEADER_SIZE:
            return ProtocolError("frame length below the header size", length=length, reason="bad length prefix")
        return FrameTooLargeError(
            "frame over the maximum frame size", frame_size=length + 4, max_frame_size=self.max_frame_size
        )
