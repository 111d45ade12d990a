"""The ``walkit`` format for Spark: a Python data source (``pyspark.sql.datasource``).

Theory of operation
-------------------
Planning runs in a Python process of the driver: it opens a client, reads the log's
metadata and each wanted segment's extent (closed ledgers to their last entry, the open
one to its LAC, all without fencing), then cuts the segments into entry ranges
(``_plan.plan_log``). Each range is one Spark task; a task is ids and numbers only, and
the executor that runs it opens a client of its own and reads the range straight from
the bookies into Arrow batches (``_read``). The ranges are fixed at planning, so one
query sees one consistent prefix of the log even while the writer appends.

Streaming offsets are LSN positions, ``{"segment", "entry", "slot"}``: a micro-batch
``(start, end]`` holds the records after ``start`` up to ``end``. The latest offset is
``(last non-empty segment, its LAC, END_SLOT)`` - every record durable now. Closed
segments never change and the open one is cut at ``end.entry``, so planning the same
``(start, end)`` again (a restart from the checkpoint) yields the same records: Spark's
offset log then gives exactly-once delivery to sinks that support it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from walkit.client import BookKeeper
from walkit.errors import InvalidArgumentError
from walkit.wal import LSN
from walkit.spark._plan import (
    LedgerRange,
    LogRange,
    ReadOptions,
    lsn_of_offset,
    offset_of_lsn,
    plan_ledger,
    plan_log,
)
from walkit.spark._read import (
    last_position, ledger_batches, ledger_extent, log_batches, log_extents, reader_client,
)

__all__ = ["LEDGER_SCHEMA", "LOG_SCHEMA", "WalkitDataSource"]

LOG_SCHEMA = StructType([
    StructField("namespace", StringType()), StructField("log", StringType()),
    StructField("lsn", StringType()),  # "segment/entry/slot", as str(LSN) and LSN.parse
    StructField("lsn_key", StringType()),  # sortable: zero-padded "%019d/%019d/%010d"
    StructField("segment", LongType()), StructField("entry_id", LongType()), StructField("slot", IntegerType()),
    StructField("record", BinaryType()),
])
LEDGER_SCHEMA = StructType([
    StructField("ledger_id", LongType()), StructField("entry_id", LongType()), StructField("payload", BinaryType()),
])
_ORIGIN = LSN(0, 0, 0)  # before every record: segments count from 1


class WalkitDataSource(DataSource):
    """``spark.read.format("walkit")`` / ``spark.readStream.format("walkit")``.

    Options: ``metadata`` (URI, required), ``log`` or ``ledgers`` ("1,2,3"),
    ``namespace`` (default "default"), ``password``, ``after`` (exclusive) and ``until``
    (inclusive) LSNs, ``partitionBytes`` (about this much per task, default 64 MiB) or
    ``entriesPerPartition``, ``maxRecordBytes`` (a larger record is refused; default 64 MiB)."""

    @classmethod
    def name(cls) -> str:
        return "walkit"

    def _options(self) -> ReadOptions:
        return ReadOptions.parse(self.options)

    def schema(self) -> StructType:
        return LEDGER_SCHEMA if self._options().ledgers is not None else LOG_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(self._options())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = self._options()
        if opts.log is None:
            raise InvalidArgumentError("streaming reads follow a log: give .option('log', NAME)")
        return _StreamReader(opts)


def _read(opts: ReadOptions, partition: InputPartition) -> Iterator[Any]:
    task = partition.value
    if isinstance(task, LogRange):
        assert opts.log is not None
        return log_batches(opts.metadata, opts.password, opts.namespace, opts.log, task, opts.max_record_bytes)
    if isinstance(task, LedgerRange):
        return ledger_batches(opts.metadata, opts.password, task)
    return iter(())  # Spark's stand-in partition when there is nothing to read


class _BatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        with reader_client(opts.metadata) as bk:
            if opts.ledgers is not None:
                tasks: list[LogRange | LedgerRange] = []
                for ledger_id in opts.ledgers:
                    last, length = ledger_extent(bk, ledger_id, opts.password)
                    tasks += plan_ledger(ledger_id, last, length, partition_bytes=opts.partition_bytes,
                                         entries_per_partition=opts.entries_per_partition)
            else:
                extents = log_extents(bk, opts, opts.after, opts.until)
                tasks = list(plan_log(extents, after=opts.after, until=opts.until,
                                      partition_bytes=opts.partition_bytes,
                                      entries_per_partition=opts.entries_per_partition))
        return [InputPartition(task) for task in tasks]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.opts, partition)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Lives in one Python process for the whole query (Spark's streaming source
    runner), which keeps one client; tasks get a fresh copy without it."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._bk: BookKeeper | None = None
        self._target: LSN | None = None  # Trigger.AvailableNow: nothing past what was there at the start

    def _client(self) -> BookKeeper:
        if self._bk is None:
            self._bk = reader_client(self.opts.metadata)
        return self._bk

    def _latest(self) -> LSN | None:
        latest = last_position(self._client(), self.opts)
        for cap in (self.opts.until, self._target):
            if latest is not None and cap is not None:
                latest = min(latest, cap)
        return latest

    def initialOffset(self) -> dict[str, int]:
        return offset_of_lsn(self.opts.after or _ORIGIN)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        if not isinstance(limit, ReadAllAvailable):
            raise InvalidArgumentError("the walkit source reads all that is available", limit=repr(limit))
        begin = lsn_of_offset(start)
        latest = self._latest()
        return offset_of_lsn(latest if latest is not None and latest > begin else begin)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = last_position(self._client(), self.opts) or _ORIGIN

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = lsn_of_offset(start), lsn_of_offset(end)
        if stop <= begin:
            return []
        extents = log_extents(self._client(), self.opts, begin, stop)
        tasks = plan_log(extents, after=begin, until=stop, partition_bytes=self.opts.partition_bytes,
                         entries_per_partition=self.opts.entries_per_partition)
        return [InputPartition(task) for task in tasks]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the log keeps its records until the writer truncates."""

    def stop(self) -> None:
        if self._bk is not None:
            self._bk.close()
            self._bk = None

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "_bk": None, "_target": self._target}
