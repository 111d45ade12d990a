"""``walkit bench spark``: records/s read by Spark against the WAL's own replay.

What it measures
----------------
A :class:`~walkit.LocalCluster` of three bookie processes in a temporary directory and
one log of ``records`` records of ``size`` bytes, written with ``append_async`` in
windows and rolled every ``roll_bytes`` into several segments. Then, ``repeats`` times
each, the best run counted:

* **replay**: ``LogReader.replay()`` in this process, counting records and summing
  their CRC-32s - one client, one thread, the WAL's own reader;
* **Spark**: ``spark.read.format("walkit")`` on ``master`` (``local[2]``), the same
  count and sum of ``crc32(record)`` as one aggregation (the ranges are read by the
  Python workers, each with a client of its own, in parallel). A first, untimed query
  reads one entry: the Python workers' start and the data source's first planning are
  paid once per session, not per query.

The two checksums must agree. The cluster and its directory are removed at the end.
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from walkit.spark import spark_session  # before pyspark: without walkit[spark], it says how to get it

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from walkit._local_cluster import LocalCluster
from walkit.wal import WriteAheadLog

__all__ = ["format_markdown", "run_spark_bench", "write_records"]

WINDOW = 50_000  # appends in flight while filling the log


def write_records(wal: WriteAheadLog, count: int, size: int = 16, window: int = WINDOW) -> None:
    """Append ``count`` records (record i: i in decimal, zero-padded to ``size`` bytes,
    then cut to ``size``) in windows of ``window``, and wait until all are durable."""
    for start in range(0, count, window):
        futures = [wal.append_async(b"%0*d" % (size, i)) for i in range(start, min(count, start + window))]
        futures[-1].result()  # futures complete in order: the last one done means all are
    wal.flush()


def _replay(uri: str, log: str) -> tuple[int, int]:
    count = checksum = 0
    with WriteAheadLog.reader(uri, log) as reader:
        for _lsn, record in reader.replay():
            count += 1
            checksum += zlib.crc32(record)
    return count, checksum


def _spark_read(spark: SparkSession, uri: str, log: str) -> tuple[int, int, int]:
    df = spark.read.format("walkit").option("metadata", uri).option("log", log).load()
    row = df.agg(F.count("*").alias("n"), F.sum(F.crc32("record")).alias("crc")).collect()[0]
    return int(row["n"]), int(row["crc"] or 0), df.rdd.getNumPartitions()


def _best(fn: Any, repeats: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def run_spark_bench(directory: str | None = None, *, records: int = 1_000_000, size: int = 16,
                    master: str = "local[2]", roll_bytes: int = 4 << 20, repeats: int = 2,
                    spark: SparkSession | None = None) -> dict[str, Any]:
    """Write the log, then time replay and Spark reading it (see the module docstring).
    ``spark``: a session to use (then left running); by default one is started on
    ``master`` and stopped at the end."""
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    root = Path(tempfile.mkdtemp(prefix="walkit-bench-spark-", dir=directory))
    own = spark is None
    try:
        with LocalCluster(root / "cluster", bookies=3, processes=True) as cluster:
            uri = cluster.metadata_uri
            t0 = time.perf_counter()
            with WriteAheadLog.open(uri, "bench", roll_bytes=roll_bytes) as wal:
                write_records(wal, records, size)
                segments = wal.metadata().segments
            write_s = time.perf_counter() - t0
            replay_s, (replay_n, replay_crc) = _best(lambda: _replay(uri, "bench"), repeats)
            session = spark if spark is not None else spark_session(master, "walkit-bench", driver_memory="1g")
            try:
                warm = time.perf_counter()
                session.read.format("walkit").option("metadata", uri).option("log", "bench") \
                    .option("until", f"{segments[0].seq}/0/0").load().count()
                warm_s = time.perf_counter() - warm
                spark_s, (spark_n, spark_crc, partitions) = _best(lambda: _spark_read(session, uri, "bench"), repeats)
            finally:
                if own:
                    session.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "started": started, "records": records, "record_bytes": size, "segments": len(segments),
        "master": master if own else session.sparkContext.master, "cpus": os.cpu_count(), "repeats": repeats,
        "write_s": round(write_s, 2), "first_query_s": round(warm_s, 2), "partitions": partitions,
        "replay": {"seconds": round(replay_s, 3), "records_per_s": round(replay_n / replay_s), "count": replay_n},
        "spark": {"seconds": round(spark_s, 3), "records_per_s": round(spark_n / spark_s), "count": spark_n},
        "speedup": round(replay_s / spark_s, 2),
        "checksums_match": (replay_n, replay_crc) == (spark_n, spark_crc) == (records, replay_crc),
    }


def format_markdown(report: dict[str, Any]) -> str:
    r, s = report["replay"], report["spark"]
    return "\n".join([
        f"{report['started']}; {report['records']:,} records of {report['record_bytes']} B in "
        f"{report['segments']} segments; 3 bookie processes; {report['cpus']} CPUs; best of {report['repeats']}",
        "",
        "| reader | records | seconds | records/s |",
        "|---|---:|---:|---:|",
        f"| WAL replay() (one process) | {r['count']:,} | {r['seconds']} | {r['records_per_s']:,} |",
        f"| Spark {report['master']} ({report['partitions']} partitions) | {s['count']:,} | {s['seconds']} "
        f"| {s['records_per_s']:,} |",
        "",
        f"Spark / replay: {report['speedup']}x; checksums match: {report['checksums_match']}; "
        f"writing the log took {report['write_s']} s, Spark's first query {report['first_query_s']} s",
    ])
