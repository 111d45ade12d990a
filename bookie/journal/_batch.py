"""What a journal batch is made of: records, the batch being built
(:class:`OpenBatch`), the closed :class:`Batch` handed to the flush, and the
:class:`BufferPool` of aligned buffers batches are framed into.

Theory of operation. Producers hand the journal *records* - ``(type, ledger id, arg,
data, callback, ctx)`` - checked here in the caller's thread (:func:`check_record`), so
that nothing the journal thread frames can fail on a bad value. Records are framed
straight into aligned buffers (:class:`~bookie.journal._framing.FrameBuffer`, one or more
*segments*) of the :class:`OpenBatch`, which also holds the records' callbacks, how
many records it holds and when the oldest came, all under the journal's producer lock;
closing it (by the thread holding the flush claim, :mod:`bookie.journal._claim`) turns those segments and the records'
callbacks into a :class:`Batch`: where it goes (the open file, its offset and id), what
it carries (segments, callbacks, how many records) and why it went (the policy's
:class:`~bookie.journal._policy.FlushReason`). A batch is owned by exactly one thread
at a time - the one holding the flush claim (:mod:`bookie.journal._claim`) - so its
fields need no lock. Its callbacks run once, in submission order (:func:`call_back`):
with ``None`` after the fdatasync that covers the batch, or with the error that failed
or refused it.

The :class:`BufferPool` keeps up to :data:`POOL` spare standard buffers so that a busy
journal frames into recycled memory (aligned for O_DIRECT) instead of allocating a
buffer per batch. It has no lock of its own: every call is made with the journal's
producer lock held, the lock the frame buffer is used under.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

from bookie.fs import AlignedBuffer, FileSystem
from bookie.journal._config import JournalConfig
from bookie.journal._files import OpenJournal
from bookie.journal._format import FrameType
from bookie.journal._framing import ENTRY, FrameBuffer, Segment
from bookie.journal._policy import FlushReason, flush_reason
from walkit.errors import InvalidArgumentError

__all__ = ["Callback", "Record", "ENTRY", "KEY_RECORD", "FENCE_RECORD", "LAC_RECORD", "Batch", "BufferPool",
           "OpenBatch", "call_back", "check_record", "check_records"]

#: ``callback(error, ctx)``: error is None once the record is durable.
Callback = Callable[[BaseException | None, Any], None]
#: ``(type, ledger id, arg, data, callback or None, ctx)``: one record for :meth:`Journal.log_records`.
Record = tuple[int, int, int, Any, "Callback | None", Any]
KEY_RECORD, FENCE_RECORD, LAC_RECORD = int(FrameType.MASTER_KEY), int(FrameType.FENCE), int(FrameType.LAC)
_RECORD_TYPES = frozenset({ENTRY, KEY_RECORD, FENCE_RECORD, LAC_RECORD})

_U64_MAX = (1 << 64) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_SIZE = itemgetter(1)  # a segment's bytes
POOL = 16  # spare buffers kept: 16 x buffer_size of memory at most when idle


def _check_ids(ledger_id: int, value: int) -> None:
    """Refuse, in the caller's thread, what the journal thread could not frame."""
    if not (type(ledger_id) is int and type(value) is int and 0 <= ledger_id <= _U64_MAX and _I64_MIN <= value <= _I64_MAX):
        raise InvalidArgumentError("journal record ids out of range", ledger=ledger_id, value=value)


def _check_bytes(data: Any) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError("journal record data must be bytes", type=type(data).__name__)
    return data  # type: ignore[return-value]


def check_record(ftype: int, ledger_id: int, arg: int, data: Any) -> None:
    """Refuse a record the journal could not frame (one combined test)."""
    if (
        type(ledger_id) is not int or type(arg) is not int or not 0 <= ledger_id <= _U64_MAX
        or not _I64_MIN <= arg <= _I64_MAX or not isinstance(data, (bytes, bytearray, memoryview))
        or ftype not in _RECORD_TYPES
    ):
        _check_ids(ledger_id, arg)
        _check_bytes(data)
        raise InvalidArgumentError("unknown journal record type", type=ftype)


def check_records(records: list[Record]) -> None:
    for ftype, ledger_id, arg, data, _, _ in records:
        check_record(ftype, ledger_id, arg, data)


def call_back(records: list[tuple[Callback, Any]], error: BaseException | None) -> None:
    """Run a batch's callbacks, in submission order."""
    for cb, ctx in records:
        cb(error, ctx)


class Batch:
    """A closed batch, on its way from the thread that closed it to the disk."""

    __slots__ = ("segments", "length", "offset", "journal_id", "target", "records", "count", "reason", "terminator",
                 "oldest")

    def __init__(self, segments: list[Segment], target: OpenJournal, offset: int, journal_id: int,
                 records: list[tuple[Callback, Any]], count: int, reason: FlushReason, oldest: float | None) -> None:
        self.segments, self.target, self.offset, self.journal_id = segments, target, offset, journal_id
        self.oldest = oldest  # when its oldest record was queued (the journal's clock)
        self.length = sum(map(_SIZE, segments))  # a C loop: no generator per batch
        self.records, self.reason = records, reason  # records: the callbacks only
        self.count = count  # every framed record, with a callback or not
        #: a zero block written after the batch (recycled files: marks the end of this life)
        self.terminator: memoryview | None = None


class BufferPool:
    """Standard-size aligned buffers for the frame buffer, kept for reuse (producer lock held)."""

    def __init__(self, fs: FileSystem, config: JournalConfig) -> None:
        a = self._alignment = config.alignment
        self._fs = fs
        #: one segment: at least what the policy lets a batch grow to, plus its padding
        self.buffer_size = -(-max(config.buffer_size, config.policy.buffered_writes_threshold + 2 * a) // a) * a
        self._spare: list[AlignedBuffer] = []
        self._retired = False

    def get(self, min_size: int) -> AlignedBuffer:
        """A standard buffer from the pool, or a new one; a larger one when asked."""
        if min_size <= self.buffer_size:
            return self._spare.pop() if self._spare else self._fs.alloc_buffer(self.buffer_size)
        a = self._alignment
        return self._fs.alloc_buffer(-(-min_size // a) * a)

    def put(self, buf: AlignedBuffer) -> None:
        if len(buf) == self.buffer_size and len(self._spare) < POOL and not self._retired:
            self._spare.append(buf)
        else:
            buf.close()

    def put_segments(self, segments: list[Segment]) -> None:
        for buf, _ in segments:
            self.put(buf)

    def retire(self) -> None:
        """The journal is shutting down: buffers given back from now on are closed."""
        self._retired = True

    def close(self) -> None:
        """Free the spare buffers (the journal's threads have stopped)."""
        for buf in self._spare:
            buf.close()
        self._spare.clear()


class OpenBatch:
    """The batch being built: its frames, its records' callbacks, how many records and
    when the oldest came. Every use is made with the journal's producer lock held."""

    __slots__ = ("pool", "frames", "records", "entries", "oldest")

    def __init__(self, fs: FileSystem, config: JournalConfig) -> None:
        self.pool = BufferPool(fs, config)
        self.frames = FrameBuffer(config.alignment, self.pool.get, self.pool.put)
        self.records: list[tuple[Callback, Any]] = []  # callbacks of the batch being built
        self.entries = 0  # records framed (with a callback or not)
        self.oldest: float | None = None  # when the first of them was framed (the journal's clock)

    def reason(self, config: JournalConfig, now: float) -> FlushReason | None:
        """The group-commit policy's verdict on this batch at ``now``."""
        return flush_reason(config.policy, now, self.oldest, self.frames.size, self.entries)

    def close(self, reason: FlushReason, target: OpenJournal, offset: int, journal_id: int,
              terminator: memoryview | None) -> Batch:
        """The batch, closed (padded), to be written at ``offset`` of ``target``; a new
        one is begun."""
        segments, records, count, oldest = self.frames.take(), self.records, self.entries, self.oldest
        self.records, self.entries, self.oldest = [], 0, None
        batch = Batch(segments, target, offset, journal_id, records, count, reason, oldest)
        batch.terminator = terminator
        return batch

    def drop(self) -> list[tuple[Callback, Any]]:
        """Take the records framed so far out: their buffers go back to the pool, their
        callbacks are returned (for the caller to fail)."""
        segments, records = self.frames.take(), self.records
        self.records, self.entries, self.oldest = [], 0, None
        self.pool.put_segments(segments)
        return records
