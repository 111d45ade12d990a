"""Packing journal records into an aligned buffer.

A :class:`FrameBuffer` is the batch being built: records become frames (docs/format.md,
"Journal"); only the first frame of a batch carries ``FLAG_FLUSH_START``. A batch is one
or more aligned buffers ("segments"): when a frame does not fit, the current buffer is
closed with a PADDING frame (two alignment units are always kept free for it) and the
batch goes on in another buffer; :meth:`FrameBuffer.take` closes the last one the same
way. The journal writes a batch's segments with one ``pwritev`` and one fdatasync.
Appending never blocks and never writes, so it is safe from any thread, a journal
callback included.

ENTRY frames - the journal's hot path - are packed by ``bookie._frames``
(``native/walkit_frames.c``) when it is built and the CPU has a CRC32C instruction: the
same bytes, one C call per record or per received chunk instead of a struct pack, a
slice assignment and a CRC call in Python (about 0.8 us of interpreter time per 1 KiB
entry, most of a journal producer's cost). The Python code below is the reference: a
record the C code does not frame (an id out of range, a payload that is not a flat byte
buffer) is framed, or refused with the same error, by it. ``WALKIT_NATIVE=off`` keeps
the C code out, as it keeps the I/O shim out (:mod:`bookie.native`).
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Callable
from typing import Any

from crc32c import crc32c

from bookie import native
from bookie.fs import AlignedBuffer
from bookie.journal._format import FLAG_FLUSH_START, FRAME_HEADER, FrameType, padding_size

__all__ = ["FrameBuffer", "ENTRY", "Segment"]

_ENTRY_HEAD = struct.Struct("<IBBHIQq")  # frame header + ledger id + entry id (or LAC), one pack
_LEDGER_HEAD = struct.Struct("<IBBHIQ")  # frame header + ledger id (master key, fence)
_U32 = struct.Struct("<I")
ENTRY = int(FrameType.ENTRY)
_KEY, _FENCE, _LAC = int(FrameType.MASTER_KEY), int(FrameType.FENCE), int(FrameType.LAC)


Segment = tuple[AlignedBuffer, int]  # a buffer and how many of its bytes are frames


def _load_c_framing() -> Any:
    """``bookie._frames`` when it can frame here, else None (not built, no CRC32C
    instruction, or ``WALKIT_NATIVE=off``). ``WALKIT_NATIVE=require`` makes a missing
    extension an ImportError, as it does for the I/O shim."""
    if native.MODE == "off":
        return None
    try:
        mod = importlib.import_module("bookie._frames")
    except ImportError as exc:
        if native.MODE == "require":
            raise ImportError(f"bookie._frames (walkit's C frame packing) is not built: {exc}. Build it with "
                              f"`pip install -e .` (needs a C compiler), or set {native.ENV_VAR}=auto or off") from exc
        return None
    if not (mod.HARDWARE_CRC and mod.ENTRY_TYPE == ENTRY and mod.ENTRY_HEAD == _ENTRY_HEAD.size
            and mod.FLAG_FLUSH_START == FLAG_FLUSH_START):
        return None
    return mod


#: The C framing module in use (None: every frame is packed in Python).
C_FRAMING: Any = _load_c_framing()
_NO_ROOM = 1  # frame_entries' status for "no room" (2: "not here", framed in Python)


class FrameBuffer:
    """The batch being built: full, padded segments plus the current buffer. Buffers
    come from ``get_buffer(min_size)`` and go back through ``put_buffer``."""

    def __init__(
        self, alignment: int, get_buffer: Callable[[int], AlignedBuffer], put_buffer: Callable[[AlignedBuffer], None],
        *, c_framing: bool = True,
    ) -> None:
        self._alignment = alignment
        self._get = get_buffer
        self._put = put_buffer
        self._zeros = memoryview(bytes(2 * alignment))  # sliced without a copy
        #: CRCs of the PADDING frames already made for seed ``_pad_seed``, by length.
        self._pad_crcs: dict[int, int] = {}
        self._pad_seed = 0
        #: CRC seed of the file this batch will be written to (``frame_seed``).
        self.seed = 0
        self.segments: list[Segment] = []
        self._sealed = 0
        self.fill = 0
        #: How many entries the last :meth:`append_entries` framed (all, unless it raised).
        self.framed = 0
        #: ``bookie._frames``, or None: every frame packed in Python (``c_framing=False``).
        self._c: Any = C_FRAMING if c_framing else None
        self._use(get_buffer(0))

    @property
    def size(self) -> int:
        """Bytes of frames in the batch so far."""
        return self._sealed + self.fill

    def append(self, ftype: int, ledger_id: int, arg: int, data: bytes | bytearray | memoryview) -> None:
        """Frame one record: an entry (``arg`` = entry id), a master key (``data``), a
        fence, or an explicit LAC (``arg`` = LAC)."""
        if ftype != ENTRY or not self.append_entry(ledger_id, arg, data):
            self._append_py(ftype, ledger_id, arg, data)

    def append_entry(self, ledger_id: int, entry_id: int, data: Any) -> bool:
        """Frame one ENTRY record in C (one call: :meth:`Journal.log_entry`'s hot path).
        False, with nothing framed and none of the values' own code run, when there is
        no C framing or the values are not plain ones - ids not of type ``int``, a
        payload not ``bytes``, ``bytearray`` or ``memoryview`` - or not ones C frames
        (out of range, not a flat byte buffer): the caller checks and frames those with
        :meth:`append`, the reference."""
        c = self._c
        if c is None:
            return False
        while True:
            end = c.frame_entry(self._view, self.fill, self._limit, self.seed, not self.segments,
                                ledger_id, entry_id, data)
            if end > 0:
                self.fill = end
                return True
            if not end:
                return False
            self._make_room(-end)  # no room: a buffer for a frame of -end bytes

    def _append_py(self, ftype: int, ledger_id: int, arg: int, data: bytes | bytearray | memoryview) -> None:
        if ftype == ENTRY or ftype == _LAC:
            head = _ENTRY_HEAD
        else:
            head, data = _LEDGER_HEAD, (data if ftype == _KEY else b"")
        pos = self.fill
        end = pos + head.size + len(data)
        if end > self._limit:
            self._make_room(end - pos)
            pos, end = 0, end - pos
        view = self._view
        flags = 0 if pos or self.segments else FLAG_FLUSH_START  # only a batch's first frame
        length = head.size - FRAME_HEADER.size + len(data)
        if head is _ENTRY_HEAD:
            head.pack_into(view, pos, 0, ftype, flags, 0, length, ledger_id, arg)
        else:
            head.pack_into(view, pos, 0, ftype, flags, 0, length, ledger_id)
        view[pos + head.size : end] = data
        _U32.pack_into(view, pos, crc32c(view[pos + 4 : end], self.seed))
        self.fill = end

    def append_entries(self, entries: list[tuple[int, int, bytes]]) -> None:
        """Frame ENTRY records ``(ledger id, entry id, payload)``, in order: :meth:`append`
        for each, with the loop's state in locals (the hot path: one call per received
        chunk). Values that cannot be framed raise (``struct.error``, ``TypeError``);
        the entries before stay framed and :attr:`framed` says how many that is."""
        if self._c is not None and type(entries) is list:
            self._append_entries_c(entries)
            return
        pos, view, limit, seed = self.fill, self._view, self._limit, self.seed
        pack, put_crc, entry_type = _ENTRY_HEAD.pack_into, _U32.pack_into, ENTRY
        head = _ENTRY_HEAD.size
        body = head - FRAME_HEADER.size  # the ids: counted in a frame's length
        count = 0
        try:
            for ledger_id, entry_id, data in entries:
                end = pos + head + len(data)
                if end > limit:
                    self.fill = pos
                    self._make_room(end - pos)
                    pos, end, view, limit = 0, end - pos, self._view, self._limit
                flags = 0 if pos or self.segments else FLAG_FLUSH_START  # only a batch's first frame
                pack(view, pos, 0, entry_type, flags, 0, body + len(data), ledger_id, entry_id)
                view[pos + head : end] = data
                put_crc(view, pos, crc32c(view[pos + 4 : end], seed))
                pos = end
                count += 1
        finally:
            self.fill = pos
            self.framed = count

    def _append_entries_c(self, entries: list[tuple[int, int, bytes]]) -> None:
        """:meth:`append_entries` through ``bookie._frames``: a call per buffer filled."""
        frame, done = self._c.frame_entries, 0
        try:
            while True:
                self.fill, done, status, need = frame(self._view, self.fill, self._limit, self.seed,
                                                      not self.segments, entries, done)
                if not status:
                    return
                if status == _NO_ROOM:
                    self._make_room(need)
                else:  # framed in Python, or refused with Python's error
                    ledger_id, entry_id, data = entries[done]
                    self._append_py(ENTRY, ledger_id, entry_id, data)
                    done += 1
        finally:
            self.framed = done

    def take(self) -> list[Segment]:
        """Close the batch (padded to the alignment) and start an empty one."""
        self._pad()
        batch = list(self.segments)
        current = self.buf
        if self.fill:
            batch.append((current, self.fill))
            current = self._get(0)
        self.segments, self._sealed = [], 0
        self._use(current)
        return batch

    def _use(self, buf: AlignedBuffer) -> None:
        self.buf = buf
        self._view = buf.view
        self._limit = len(buf) - 2 * self._alignment  # room kept for the padding frame
        self.fill = 0

    def _make_room(self, frame: int) -> None:
        """Seal the current buffer as a segment of the batch; go on in another one."""
        if self.fill:
            self._pad()
            self.segments.append((self.buf, self.fill))
            self._sealed += self.fill
        else:
            self._put(self.buf)
        self._use(self._get(frame + 2 * self._alignment))

    def _pad(self) -> None:
        """End the current buffer's frames with a PADDING frame up to the alignment."""
        pad = padding_size(self.fill, self._alignment)
        if not pad:
            return
        pos, view = self.fill, self._view
        view[pos : pos + pad] = self._zeros[:pad]
        FRAME_HEADER.pack_into(view, pos, self._pad_crc(pad), FrameType.PADDING, 0, 0, pad - FRAME_HEADER.size)
        self.fill = pos + pad

    def _pad_crc(self, pad: int) -> int:
        """The CRC of a PADDING frame of ``pad`` bytes. Such a frame is the same bytes for
        a given length and seed (a header, then zeros), so its CRC is computed once per
        length and seed - not over ~3 KB of zeros at every lone add's flush."""
        if self._pad_seed != self.seed:  # a new file: the cached CRCs were for another seed
            self._pad_crcs.clear()
            self._pad_seed = self.seed
        crc = self._pad_crcs.get(pad)
        if crc is None:
            frame = bytearray(pad)
            FRAME_HEADER.pack_into(frame, 0, 0, FrameType.PADDING, 0, 0, pad - FRAME_HEADER.size)
            crc = self._pad_crcs[pad] = crc32c(memoryview(frame)[4:], self.seed)
        return crc
