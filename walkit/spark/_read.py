"""The I/O of the Spark data source, without Spark: what the driver asks the cluster
to plan a read, and what a task does to read its range straight from the bookies into
Arrow record batches.

Every read opens ledgers with ``recovery=False``: it never fences, so a log's writer
goes on while Spark reads it, and an open segment is read up to its LAC (what is
durable on a quorum), like ``LogReader.replay``. Its clients (:func:`reader_client`)
open the metadata store read-only: nothing here changes metadata.

A record larger than an entry is in fragments, in consecutive entries of one segment
(docs/format.md), and tasks are entry ranges, so a record may straddle two tasks. It
belongs to the task holding its last fragment (its LSN is that entry's, slot 0): a task
whose first entry is a later fragment reads back to the record's first fragment, and a
task that ends inside a record drops the fragments it read. ``after`` and ``until`` are
compared with records' LSNs, so a stream offset inside a record (an LAC reached mid-record)
leaves the record to the next micro-batch whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from walkit.client import BookKeeper, ReadHandle
from walkit.errors import NoSuchEntryError, NoSuchLedgerError
from walkit.wal import (
    DEFAULT_MAX_RECORD_BYTES,
    FRAGMENT_MAGIC,
    LSN,
    Assembly,
    Segment,
    WriteAheadLog,
    unpack_fragment,
    unpack_records,
)
from walkit.wal import last_record as last_whole_record
from walkit.spark._plan import END_SLOT, LSN_KEY_WIDTHS, LedgerRange, LogRange, ReadOptions, SegmentExtent

__all__ = ["LEDGER_ARROW_SCHEMA", "LOG_ARROW_SCHEMA", "last_position", "last_record", "ledger_batches",
           "ledger_extent", "log_batches", "log_extents"]

LOG_ARROW_SCHEMA = pa.schema([
    ("namespace", pa.string()), ("log", pa.string()), ("lsn", pa.string()), ("lsn_key", pa.string()),
    ("segment", pa.int64()), ("entry_id", pa.int64()), ("slot", pa.int32()), ("record", pa.binary()),
])
LEDGER_ARROW_SCHEMA = pa.schema([("ledger_id", pa.int64()), ("entry_id", pa.int64()), ("payload", pa.binary())])
BATCH_ROWS = 1 << 16  # rows per Arrow batch handed to Spark
BATCH_BYTES = 256 << 20  # ... or fewer, once they hold this many bytes (large records: a column stays < 2 GiB)
LAC_WAIT = 10.0  # seconds a task waits for its bookies to show the LAC the driver planned with


# -- the driver: what is there to read -----------------------------------------------------
def reader_client(metadata_uri: str) -> BookKeeper:
    """A client for reading: its metadata store opened read-only (a ``local://`` store
    then needs no write access, and no session is written into it)."""
    return BookKeeper(metadata_uri, metadata_read_only=True)


def segment_extent(bk: BookKeeper, seq: int, ledger_id: int, password: bytes) -> SegmentExtent | None:
    """A segment's readable entries (None if retention deleted its ledger)."""
    try:
        handle = bk.open_ledger(ledger_id, password, recovery=False)
    except NoSuchLedgerError:
        return None
    return SegmentExtent(seq, ledger_id, handle.last_add_confirmed, handle.length if handle.is_closed else None)


def log_extents(bk: BookKeeper, opts: ReadOptions, after: LSN | None, until: LSN | None) -> list[SegmentExtent]:
    """The segments of the log that hold records after ``after`` up to ``until``."""
    extents = []
    for segment in _segments(bk, opts):
        if after is not None and segment.seq < after.segment:
            continue
        if until is not None and segment.seq > until.segment:
            break
        extent = segment_extent(bk, segment.seq, segment.ledger_id, opts.password)
        if extent is not None:
            extents.append(extent)
    return extents


def _segments(bk: BookKeeper, opts: ReadOptions) -> list[Segment]:
    assert opts.log is not None
    reader = WriteAheadLog.reader(bk, opts.log, namespace=opts.namespace, password=opts.password)
    try:
        return list(reader.metadata().segments)
    finally:
        reader.close()  # the client is the caller's


def _last_extent(bk: BookKeeper, opts: ReadOptions) -> SegmentExtent | None:
    for segment in reversed(_segments(bk, opts)):  # usually the last one, or the one before a fresh roll
        extent = segment_extent(bk, segment.seq, segment.ledger_id, opts.password)
        if extent is not None and extent.last >= 0:
            return extent
    return None


def last_position(bk: BookKeeper, opts: ReadOptions) -> LSN | None:
    """A position after every record durable now: (segment, LAC, END_SLOT) of the last
    segment with entries; None for a log without records."""
    extent = _last_extent(bk, opts)
    return None if extent is None else LSN(extent.seq, extent.last, END_SLOT)


def last_record(bk: BookKeeper, opts: ReadOptions) -> LSN | None:
    """The LSN of the last whole record durable now (reads its entry; a record whose
    last fragment is not durable yet is not one)."""
    last = _last_extent(bk, opts)
    if last is None:
        return None
    for extent in _extents_from_last(bk, opts, last):
        found = _last_record_of(bk, extent, opts.password)
        if found is not None:
            return found
    return None


def _last_record_of(bk: BookKeeper, extent: SegmentExtent, password: bytes) -> LSN | None:
    handle = bk.open_ledger(extent.ledger_id, password, recovery=False)
    return last_whole_record(extent.seq, extent.last, lambda entry_id: next(iter(handle.read(entry_id, entry_id))).data)


def _extents_from_last(bk: BookKeeper, opts: ReadOptions, last: SegmentExtent) -> Iterator[SegmentExtent]:
    """``last``, then the segments before it that have entries (a segment may hold only
    the start of a record its writer never finished)."""
    yield last
    for segment in reversed(_segments(bk, opts)):
        if segment.seq >= last.seq:
            continue
        extent = segment_extent(bk, segment.seq, segment.ledger_id, opts.password)
        if extent is not None and extent.last >= 0:
            yield extent


def ledger_extent(bk: BookKeeper, ledger_id: int, password: bytes) -> tuple[int, int | None]:
    """(last readable entry, length when closed) of a raw ledger."""
    handle = bk.open_ledger(ledger_id, password, recovery=False)
    return handle.last_add_confirmed, handle.length if handle.is_closed else None


# -- a task: read a range into Arrow batches -------------------------------------------------
def _open_for(bk: BookKeeper, ledger_id: int, password: bytes, last: int) -> ReadHandle:
    """A reader of the ledger whose LAC covers ``last`` (what the driver planned with)."""
    handle = bk.open_ledger(ledger_id, password, recovery=False)
    if handle.last_add_confirmed < last:
        handle.wait_for_lac(last - 1, LAC_WAIT)
    if handle.last_add_confirmed < last:
        raise NoSuchEntryError("entries planned for this task are not readable", ledger=ledger_id, last=last,
                               last_add_confirmed=handle.last_add_confirmed)
    return handle


def _entries(handle: ReadHandle, first: int, last: int) -> Iterator[tuple[int, bytes]]:
    """The range's entries: read in runs, in chunks bounded by bytes, the next one read
    ahead while this one becomes rows (``ReadHandle.read``), so an executor holds about
    two chunks (``walkit.client.read_ahead``)."""
    for entry in handle.read(first, last):
        yield entry.entry_id, entry.data


def _entries_from_record_start(handle: ReadHandle, first: int, last: int) -> Iterator[tuple[int, bytes]]:
    """The range's entries, preceded - when the first one is a record's fragment other
    than its first - by that record's earlier fragments (the record is this task's if it
    ends here)."""
    entries = _entries(handle, first, last)
    head = next(entries, None)
    if head is None:
        return
    if head[1][:4] == FRAGMENT_MAGIC:
        back = unpack_fragment(head[1]).part  # fragments of one record are consecutive entries
        if back:
            yield from _entries(handle, first - back, first - 1)
    yield head
    yield from entries


class _LogColumns:
    """Column builders for log rows, flushed as Arrow batches of about BATCH_ROWS. Per
    record only list extends happen here; the LSN texts are built a batch at a time by
    Arrow's kernels (casts, padding, joins)."""

    def __init__(self, namespace: str, log: str, seq: int) -> None:
        self.namespace, self.log, self.seq = namespace, log, seq
        self.clear()

    def clear(self) -> None:
        self.entry: list[int] = []
        self.slot: list[int] = []
        self.record: list[bytes] = []
        self.bytes = 0  # entry bytes the rows came from

    def add_entry(self, entry_id: int, records: list[bytes], task: LogRange) -> None:
        edge = (task.after is not None and task.after.segment == self.seq and task.after.entry == entry_id) or (
            task.until is not None and task.until.segment == self.seq and task.until.entry == entry_id)
        if edge:  # the first or last entry of a bounded read: keep the wanted slots only
            slots = [i for i in range(len(records)) if task.wants(LSN(self.seq, entry_id, i))]
            records = [records[i] for i in slots]
        else:
            slots = list(range(len(records)))
        self.entry.extend([entry_id] * len(records))
        self.slot.extend(slots)
        self.record.extend(records)

    def __len__(self) -> int:
        return len(self.record)

    def batch(self) -> Any:
        n = len(self.record)
        seq = pa.array([self.seq] * n, pa.int64())
        entry = pa.array(self.entry, pa.int64())
        slot = pa.array(self.slot, pa.int32())
        texts = [pc.cast(column, pa.string()) for column in (seq, entry, slot)]
        lsn = pc.binary_join_element_wise(*texts, "/")
        key = pc.binary_join_element_wise(*(pc.utf8_lpad(text, width=width, padding="0")
                                            for text, width in zip(texts, LSN_KEY_WIDTHS)), "/")
        batch = pa.RecordBatch.from_arrays([
            pa.array([self.namespace] * n, pa.string()), pa.array([self.log] * n, pa.string()), lsn, key, seq,
            entry, slot, pa.array(self.record, pa.binary()),
        ], schema=LOG_ARROW_SCHEMA)
        self.clear()
        return batch


def log_batches(metadata_uri: str, password: bytes, namespace: str, log: str, task: LogRange,
                max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Iterator[Any]:
    """The records of ``task`` as Arrow batches of :data:`LOG_ARROW_SCHEMA`, read with a
    client of this process's own (tasks run in executors: nothing live is shipped).
    ``max_record_bytes``: a record declared larger (in fragments) is refused, FormatError."""
    with reader_client(metadata_uri) as bk:
        handle = _open_for(bk, task.ledger_id, password, task.last)
        columns = _LogColumns(namespace, log, task.seq)
        assembly = Assembly(log, max_record_bytes)
        for entry_id, data in _entries_from_record_start(handle, task.first, task.last):
            if data[:4] == FRAGMENT_MAGIC:
                whole = assembly.add(task.seq, entry_id, data)
                if whole is None:
                    continue
                columns.add_entry(entry_id, [whole[1]], task)  # the record's LSN: (seq, its last entry, 0)
                columns.bytes += len(whole[1])
            else:
                if assembly.active:
                    assembly.drop()  # a record its writer never finished
                columns.add_entry(entry_id, unpack_records(data), task)
                columns.bytes += len(data)
            if len(columns) >= BATCH_ROWS or columns.bytes >= BATCH_BYTES:
                yield columns.batch()
        if len(columns):
            yield columns.batch()


def ledger_batches(metadata_uri: str, password: bytes, task: LedgerRange) -> Iterator[Any]:
    """The entries of ``task`` as Arrow batches of :data:`LEDGER_ARROW_SCHEMA`."""
    with reader_client(metadata_uri) as bk:
        handle = _open_for(bk, task.ledger_id, password, task.last)
        ids: list[int] = []
        payloads: list[bytes] = []
        for entry_id, data in _entries(handle, task.first, task.last):
            ids.append(entry_id)
            payloads.append(data)
            if len(ids) >= BATCH_ROWS // 16:
                yield _ledger_batch(task.ledger_id, ids, payloads)
                ids, payloads = [], []
        if ids:
            yield _ledger_batch(task.ledger_id, ids, payloads)


def _ledger_batch(ledger_id: int, ids: list[int], payloads: list[bytes]) -> Any:
    return pa.RecordBatch.from_arrays([pa.array([ledger_id] * len(ids), pa.int64()), pa.array(ids, pa.int64()),
                                       pa.array(payloads, pa.binary())], schema=LEDGER_ARROW_SCHEMA)

