"""``walkit export``: archive a log to Parquet with Spark, resumably.

Theory of operation
-------------------
The export directory holds Parquet files partitioned by segment
(``DIR/segment=<seq>/part-*.parquet``, columns as the ``walkit`` format minus
``segment``) and one small state file, ``DIR/_walkit_export.json``::

    {"format": 1, "namespace": "default", "log": "orders", "last_lsn": "5/812/40", "records": 1000000}

(Spark and Parquet readers skip names that start with ``_``.) A run reads the state,
fixes its end - the last record durable now, ``until`` - and writes the records after
``last_lsn`` (or ``--after``) up to it in one Spark job (append mode). Only after that
job has committed is the state file replaced (temporary file, fsync, rename, directory
fsync), so a run that fails leaves the previous state and the next run writes the same
range again. Spark's commit moves task files into place one by one: a crash inside that
final step can leave part of a range that the next run writes again - every row carries
its ``lsn``, so such duplicates can be told apart (``dropDuplicates(["lsn"])``).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from walkit._files import write_atomic
from walkit.errors import InvalidArgumentError
from walkit.wal import LSN
from walkit.spark._plan import ReadOptions
from walkit.spark._read import last_record, reader_client

__all__ = ["STATE_FILE", "ExportResult", "export_log", "read_state"]

STATE_FILE = "_walkit_export.json"
STATE_FORMAT = 1
_POLL = 0.5  # seconds between looks at the job's progress


@dataclass(frozen=True)
class ExportResult:
    namespace: str
    log: str
    directory: str
    after: str | None  # exclusive start of this run
    last: str | None  # the last record exported so far (this run or before)
    records: int  # exported by this run
    total_records: int  # in the directory, by every run
    files: int
    bytes: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_state(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The export state of ``directory`` (None before the first run)."""
    path = Path(directory) / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError("unreadable export state", path=str(path), reason=str(exc)[:120]) from exc
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise InvalidArgumentError("not a walkit export state", path=str(path))
    return state


def _write_state(directory: Path, state: dict[str, Any]) -> None:
    write_atomic(directory / STATE_FILE, json.dumps(state, sort_keys=True) + "\n")


def _parquet_files(directory: Path) -> set[Path]:
    return {p for p in directory.rglob("*.parquet") if not any(part.startswith((".", "_")) for part in
                                                             p.relative_to(directory).parts)}


@contextmanager
def _progress(spark: SparkSession, group: str, show: bool) -> Iterator[None]:
    """A tqdm bar of the job group's finished tasks while the body runs (stderr)."""
    if not show:
        yield
        return
    from tqdm import tqdm

    tracker = spark.sparkContext.statusTracker()
    done = threading.Event()

    def tasks() -> tuple[int, int]:
        total = finished = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else []:
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    total += stage.numTasks
                    finished += stage.numCompletedTasks
        return finished, total

    def watch() -> None:
        with tqdm(desc="export", unit="task", total=0, leave=True) as bar:
            while True:
                stop = done.wait(_POLL)
                finished, total = tasks()
                bar.total = max(total, finished)
                bar.n = finished
                bar.refresh()
                if stop:
                    return

    thread = threading.Thread(target=watch, name="walkit-export-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def export_log(spark: SparkSession, metadata_uri: str, log: str, directory: str | os.PathLike[str], *,
               namespace: str = "default", password: bytes = b"", after: LSN | None = None,
               progress: bool = True) -> ExportResult:
    """Write the log's records after ``after`` (default: where the last export of
    ``directory`` stopped; everything the first time) to Parquet under ``directory``,
    partitioned by segment, then record the last one in the state file."""
    started = time.monotonic()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    state = read_state(out) or {"format": STATE_FORMAT, "namespace": namespace, "log": log, "last_lsn": None,
                                "records": 0}
    if (state["namespace"], state["log"]) != (namespace, log):
        raise InvalidArgumentError("the directory holds another log's export", directory=str(out),
                                   namespace=state["namespace"], log=state["log"])
    start = after if after is not None else (LSN.parse(state["last_lsn"]) if state["last_lsn"] else None)
    opts = ReadOptions(metadata=metadata_uri, namespace=namespace, log=log, password=password)
    with reader_client(metadata_uri) as bk:
        end = last_record(bk, opts)
    if end is None or (start is not None and end <= start):
        return ExportResult(namespace, log, str(out), None if start is None else str(start), state["last_lsn"], 0,
                            int(state["records"]), 0, 0, time.monotonic() - started)
    reader = (spark.read.format("walkit").option("metadata", metadata_uri).option("namespace", namespace)
              .option("log", log).option("password", password.decode("utf-8")).option("until", str(end)))
    if start is not None:
        reader = reader.option("after", str(start))
    before = _parquet_files(out)
    group = f"walkit-export-{uuid.uuid4().hex[:12]}"
    spark.sparkContext.setJobGroup(group, f"walkit export {namespace}/{log} ({start}, {end}]")
    with _progress(spark, group, progress):
        reader.load().write.mode("append").partitionBy("segment").parquet(str(out))
    new = sorted(_parquet_files(out) - before)
    records = sum(pq.ParquetFile(path).metadata.num_rows for path in new)
    state = {**state, "last_lsn": str(end), "records": int(state["records"]) + records}
    _write_state(out, state)
    return ExportResult(namespace, log, str(out), None if start is None else str(start), str(end), records,
                        state["records"], len(new), sum(p.stat().st_size for p in new), time.monotonic() - started)
