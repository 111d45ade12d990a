"""The Spark data source (walkit.spark) on local[2] against a LocalCluster of in-process
bookies: batch reads of logs and raw ledgers equal what the WAL itself replays, LSN
bounds, a streaming query that follows a log and resumes from its checkpoint, the
resumable Parquet export, and the benchmark's plumbing.

One SparkSession for the whole file (Spark starts in ~10 s and its first Python data
source read takes as long again); ``-m 'not spark'`` leaves these tests out.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI"):
    import pyspark  # noqa: F401  (CI installs walkit[spark] through ./dev test: missing is a failure)
else:
    pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]' (./dev test does)")

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

import walkit
from walkit.bench.spark import format_markdown, run_spark_bench, write_records
from walkit.errors import InvalidArgumentError
from walkit.spark import LEDGER_SCHEMA, LOG_SCHEMA, STATE_FILE, export_log, lsn_key, read_state, spark_session
from walkit.spark._plan import END_SLOT, ReadOptions, SegmentExtent, lsn_of_offset, offset_of_lsn, plan_ledger, \
    plan_log
from walkit.spark._read import LEDGER_ARROW_SCHEMA, LOG_ARROW_SCHEMA
from walkit.wal import LSN, WriteAheadLog

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

BIG = 1_000_000
WAIT = 90.0  # seconds: bound on any wait for a streaming query


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = spark_session("local[2]", "walkit-tests", driver_memory="1g",
                            conf={"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                                  "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                  "spark.python.worker.reuse": "true"})
    try:
        yield session
    finally:
        session.stop()
        # py4j's connections log "Closing down clientserver connection" from __del__, which
        # may run at interpreter exit, after pytest has closed the streams its handlers
        # write to ("--- Logging error --- ValueError: I/O operation on closed file" after
        # the summary, one run in four). Spark is stopped: nothing py4j says from here on
        # matters to a test. Its loggers are children of "py4j" ("py4j.clientserver"), and
        # ``disabled`` does not pass to children: stop their records at "py4j" instead.
        quiet = logging.getLogger("py4j")
        quiet.setLevel(logging.CRITICAL)
        quiet.addHandler(logging.NullHandler())
        quiet.propagate = False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[walkit.LocalCluster]:
    with walkit.LocalCluster(tmp_path_factory.mktemp("spark-cluster"), bookies=3) as c:
        yield c


@pytest.fixture(scope="module")
def big_log(cluster: walkit.LocalCluster) -> list[tuple[LSN, bytes]]:
    """1,000,000 records of 16 bytes in >= 4 segments; the WAL's own replay of them."""
    with WriteAheadLog.open(cluster.metadata_uri, "orders", roll_bytes=4 << 20) as wal:
        write_records(wal, BIG)
    with WriteAheadLog.reader(cluster.metadata_uri, "orders") as reader:
        replayed = list(reader.replay())
        assert len(reader.metadata().segments) >= 4
    assert len(replayed) == BIG
    return replayed


def _log(spark: SparkSession, uri: str, log: str, **options: str) -> DataFrame:
    reader = spark.read.format("walkit").option("metadata", uri).option("log", log)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _sums(records: list[tuple[LSN, bytes]]) -> tuple[int, int]:
    return len(records), sum(zlib.crc32(r) for _, r in records)


def _spark_sums(df: DataFrame) -> tuple[int, int]:
    row = df.agg(F.count("*").alias("n"), F.sum(F.crc32("record")).alias("crc")).collect()[0]
    return int(row["n"]), int(row["crc"] or 0)


def _wait(what: str, done: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def _readable(uri: str, log: str, count: int) -> None:
    """Wait until readers see ``count`` records: the open segment is read to its LAC,
    which reaches the writer's last entry with its next explicit LAC write (0.1 s)."""
    with WriteAheadLog.reader(uri, log) as reader:
        _wait(f"{count} readable records", lambda: sum(1 for _ in reader.replay()) >= count, timeout=10)


# -- pure planning -------------------------------------------------------------------------------
def test_lsn_key_sorts_as_lsns_and_parses_back() -> None:
    lsns = [LSN(2, 0, 0), LSN(10, 0, 0), LSN(2, 10, 3), LSN(2, 9, 11), LSN(1, 123456789, END_SLOT)]
    assert sorted(lsns, key=lsn_key) == sorted(lsns)
    assert sorted(str(x) for x in lsns) != [str(x) for x in sorted(lsns)]  # why lsn_key exists
    for lsn in lsns:
        assert LSN.parse(lsn_key(lsn)) == lsn
        assert lsn_of_offset(json.loads(json.dumps(offset_of_lsn(lsn)))) == lsn
    with pytest.raises(InvalidArgumentError):
        lsn_of_offset({"segment": 1, "entry": "x", "slot": 0})


def test_plan_splits_segments_and_honours_bounds() -> None:
    extents = [SegmentExtent(1, 11, 99, 100 * 1000), SegmentExtent(2, 12, -1, 0), SegmentExtent(3, 13, 49, None)]
    tasks = plan_log(extents, partition_bytes=25_000)  # 25 entries of 1,000 bytes per task
    assert [(t.seq, t.first, t.last) for t in tasks] == [
        (1, 0, 24), (1, 25, 49), (1, 50, 74), (1, 75, 99), (3, 0, 24), (3, 25, 49)]  # open: estimated alike
    assert [(t.seq, t.first, t.last) for t in plan_log(extents, entries_per_partition=60)] == [
        (1, 0, 49), (1, 50, 99), (3, 0, 49)]  # even halves rather than 60 + 40
    bounded = plan_log(extents, after=LSN(1, 80, 2), until=LSN(3, 10, 0), entries_per_partition=1000)
    assert [(t.seq, t.first, t.last) for t in bounded] == [(1, 80, 99), (3, 0, 10)]
    assert not bounded[0].wants(LSN(1, 80, 2)) and bounded[0].wants(LSN(1, 80, 3))
    assert bounded[1].wants(LSN(3, 10, 0)) and not bounded[1].wants(LSN(3, 10, 1))
    after_entry = plan_log(extents, after=LSN(1, 99, END_SLOT), entries_per_partition=1000)
    assert [(t.seq, t.first, t.last) for t in after_entry] == [(3, 0, 49)]  # an offset at an entry's end
    assert plan_ledger(7, -1, None) == []
    assert [(t.first, t.last) for t in plan_ledger(7, 9, None, entries_per_partition=4)] == [(0, 3), (4, 7), (8, 9)]


def test_options_are_checked() -> None:
    opts = ReadOptions.parse({"metadata": "local:///x", "log": "orders", "After": "1/2/3", "entriesPerPartition": "8"})
    assert (opts.after, opts.entries_per_partition, opts.namespace) == (LSN(1, 2, 3), 8, "default")
    assert ReadOptions.parse({"metadata": "m", "ledgers": "3, 1,2"}).ledgers == (3, 1, 2)
    for bad in ({"log": "x"}, {"metadata": "m"}, {"metadata": "m", "log": "x", "ledgers": "1"},
                {"metadata": "m", "log": "x", "after": "1/2"}, {"metadata": "m", "ledgers": "1,a"},
                {"metadata": "m", "log": "x", "partitionBytes": "0"}, {"metadata": "m", "log": "x", "colour": "red"},
                {"metadata": "m", "ledgers": "1", "until": "1/0/0"}):
        with pytest.raises(InvalidArgumentError):
            ReadOptions.parse(bad)


def test_arrow_batches_have_the_spark_schemas() -> None:
    assert to_arrow_schema(LOG_SCHEMA).equals(LOG_ARROW_SCHEMA)
    assert to_arrow_schema(LEDGER_SCHEMA).equals(LEDGER_ARROW_SCHEMA)


# -- batch reads ---------------------------------------------------------------------------------
def test_a_million_records_read_by_spark_equal_the_replay(spark: SparkSession, cluster: walkit.LocalCluster,
                                                          big_log: list[tuple[LSN, bytes]]) -> None:
    uri = cluster.metadata_uri
    df = _log(spark, uri, "orders")
    assert df.columns == ["namespace", "log", "lsn", "lsn_key", "segment", "entry_id", "slot", "record"]
    assert df.rdd.getNumPartitions() >= 4  # one per segment at least
    # one read, brought back as Arrow and ordered by the sortable key there
    table = df.select("lsn_key", "lsn", "record").toArrow().sort_by("lsn_key")
    records = table.column("record").to_pylist()
    assert table.num_rows == BIG
    assert table.column("lsn").to_pylist() == [str(lsn) for lsn, _ in big_log]  # same records, same LSN order
    assert records == [record for _, record in big_log]
    assert (len(records), sum(map(zlib.crc32, records))) == _sums(big_log)
    # ranges of entries rather than whole segments: more tasks, the same count and checksum (computed by Spark);
    # the range is half the largest segment's entries (how many records share an entry depends on the writer's pace)
    largest = max(lsn.entry for lsn, _ in big_log) + 1
    split = _log(spark, uri, "orders", entriesPerPartition=str(max(1, largest // 2)))
    assert split.rdd.getNumPartitions() > df.rdd.getNumPartitions()
    assert _spark_sums(split) == _sums(big_log)


def test_after_and_until_bound_the_read(spark: SparkSession, cluster: walkit.LocalCluster,
                                        big_log: list[tuple[LSN, bytes]]) -> None:
    lo, hi = 123_456, 876_543
    df = _log(spark, cluster.metadata_uri, "orders", after=str(big_log[lo][0]), until=str(big_log[hi][0]))
    want = big_log[lo + 1:hi + 1]
    row = df.agg(F.count("*").alias("n"), F.sum(F.crc32("record")).alias("crc"), F.min("lsn_key").alias("first"),
                 F.max("lsn_key").alias("last")).collect()[0]
    assert (row["n"], row["crc"]) == _sums(want)
    assert (row["first"], row["last"]) == (lsn_key(want[0][0]), lsn_key(want[-1][0]))
    assert _log(spark, cluster.metadata_uri, "orders", after=str(big_log[-1][0])).count() == 0


def test_raw_ledgers_read_to_the_lac_without_fencing(spark: SparkSession, cluster: walkit.LocalCluster) -> None:
    with cluster.client() as bk:
        closed = bk.create_ledger(password=b"pw")
        for i in range(300):
            closed.add_entry(b"c%d" % i)
        closed.close()
        open_ = bk.create_ledger(password=b"pw")
        for i in range(50):
            open_.add_entry(b"o%d" % i)
        df = (spark.read.format("walkit").option("metadata", cluster.metadata_uri).option("password", "pw")
              .option("ledgers", f"{closed.ledger_id},{open_.ledger_id}").option("entriesPerPartition", "64").load())
        assert df.columns == ["ledger_id", "entry_id", "payload"]
        rows = sorted(df.collect())
        want = sorted([(closed.ledger_id, i, b"c%d" % i) for i in range(300)]
                      + [(open_.ledger_id, i, b"o%d" % i) for i in range(50)])
        # the open ledger is read to its LAC: its last entry shows once a later add (or close) confirms it
        assert [tuple(r) for r in rows] in (want, want[:-1])
        assert open_.add_entry(b"after the read") == 50  # not fenced: the writer goes on
        open_.close()


# -- streaming -------------------------------------------------------------------------------------
class _Collector:
    """foreachBatch target: what each micro-batch delivered (lsn, record)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        rows = [(r["lsn"], bytes(r["record"])) for r in df.select("lsn", "record").collect()]
        with self.lock:
            self.rows += rows

    def count(self) -> int:
        with self.lock:
            return len(self.rows)


def _stream(spark: SparkSession, uri: str, log: str, checkpoint: Path, sink: _Collector, **trigger: Any) -> Any:
    df = spark.readStream.format("walkit").option("metadata", uri).option("log", log).load()
    return (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
            .trigger(**(trigger or {"processingTime": "500 milliseconds"})).start())


def test_streaming_follows_the_log_and_resumes_from_its_checkpoint(spark: SparkSession,
                                                                   cluster: walkit.LocalCluster,
                                                                   tmp_path: Path) -> None:
    uri = cluster.metadata_uri
    with WriteAheadLog.open(uri, "events", roll_bytes=64 << 10) as wal:
        appended = [b"e%06d" % i for i in range(40_000)]
        for r in appended[:10_000]:
            wal.append_async(r)
        wal.flush()
        first = _Collector()
        query = _stream(spark, uri, "events", tmp_path / "ckpt", first)
        try:
            _wait("the records there at the start", lambda: first.count() >= 10_000)
            for r in appended[10_000:25_000]:  # appended while the query runs, rolling segments
                wal.append_async(r)
            wal.flush()
            _wait("the records appended after the start", lambda: first.count() >= 25_000)
            query.processAllAvailable()
        finally:
            query.stop()
        assert [r for _, r in first.rows] == appended[:25_000]
        for r in appended[25_000:]:  # while no query runs
            wal.append_async(r)
        wal.flush()
        second = _Collector()
        query = _stream(spark, uri, "events", tmp_path / "ckpt", second)
        try:
            _wait("the records not yet processed", lambda: second.count() >= 15_000)
            query.processAllAvailable()
        finally:
            query.stop()
        assert [r for _, r in second.rows] == appended[25_000:]  # exactly those: none again, none lost
        with WriteAheadLog.reader(uri, "events") as reader:
            assert [str(lsn) for lsn, _ in reader.replay()] == [lsn for lsn, _ in first.rows + second.rows]
            assert len(reader.metadata().segments) >= 3
        once = _Collector()
        query = _stream(spark, uri, "events", tmp_path / "ckpt-now", once, availableNow=True)
        assert query.awaitTermination(WAIT)
        assert [r for _, r in once.rows] == appended


# -- export --------------------------------------------------------------------------------------
def test_export_is_resumable(spark: SparkSession, cluster: walkit.LocalCluster, tmp_path: Path) -> None:
    uri, out = cluster.metadata_uri, tmp_path / "archive"
    with WriteAheadLog.open(uri, "archive", roll_bytes=32 << 10) as wal:
        for i in range(6_000):
            wal.append_async(b"a%06d" % i)
        wal.flush()
        _readable(uri, "archive", 6_000)
        first = export_log(spark, uri, "archive", out, progress=False)
        assert first.records == 6_000 and first.after is None
        assert read_state(out) == {"format": 1, "namespace": "default", "log": "archive", "last_lsn": first.last,
                                   "records": 6_000}
        for i in range(6_000, 10_000):
            wal.append_async(b"a%06d" % i)
        wal.flush()
        _readable(uri, "archive", 10_000)
        second = export_log(spark, uri, "archive", out, progress=True)
        assert (second.records, second.after, second.total_records) == (4_000, first.last, 10_000)
        assert export_log(spark, uri, "archive", out, progress=False).records == 0  # nothing new
    with WriteAheadLog.reader(uri, "archive") as reader:
        replayed = list(reader.replay())
    assert second.last == str(replayed[-1][0])
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(
        {f"segment={lsn.segment}" for lsn, _ in replayed})
    assert (out / STATE_FILE).exists()
    exported = spark.read.parquet(str(out)).orderBy("lsn_key").select("lsn", "record", "segment").collect()
    assert [(r["lsn"], bytes(r["record"])) for r in exported] == [(str(lsn), rec) for lsn, rec in replayed]
    assert all(LSN.parse(r["lsn"]).segment == r["segment"] for r in exported)
    with pytest.raises(InvalidArgumentError):
        export_log(spark, uri, "orders", out, progress=False)  # another log's directory


def test_export_command_needs_a_metadata_uri(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from walkit.cli import main

    monkeypatch.delenv("WALKIT_METADATA", raising=False)
    with pytest.raises(SystemExit) as exc:  # argparse's usage error, as for every command that needs a cluster
        main(["export", "--log", "orders", "--to", str(tmp_path)])
    assert exc.value.code == 2
    assert "give --metadata URI or set WALKIT_METADATA" in capsys.readouterr().err


# -- benchmark -------------------------------------------------------------------------------------
def test_bench_spark_reports_matching_checksums(spark: SparkSession, tmp_path: Path) -> None:
    report = run_spark_bench(str(tmp_path), records=30_000, roll_bytes=128 << 10, repeats=1, spark=spark)
    assert report["checksums_match"] and report["segments"] >= 2
    assert report["replay"]["count"] == report["spark"]["count"] == 30_000
    assert "records/s" in format_markdown(report)
    assert spark.range(3).count() == 3  # the shared session was left running
