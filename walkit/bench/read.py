"""``walkit bench read``: how fast a log written beforehand reads back, and how soon a
tailing reader sees a new record.

What it measures
----------------
A :class:`~walkit.LocalCluster` of three bookie processes under a temporary directory;
logs on ledgers of E=3, Qw=3, Qa=2.

* **replay, batched**: per record size (100 B and 1 KiB), a log of ``gib`` GiB written
  beforehand with ``append_many`` (1,000 records a call, so a busy writer's entries: many
  records each), then ``WriteAheadLog.reader(...).replay()`` from its start in this
  process, counting records and bytes: **cold** first (every file of every bookie
  written back with ``sync`` and dropped from the page cache with
  ``posix_fadvise(DONTNEED)`` after the bookies checkpointed, so the entries come from the
  disk), then **hot** (the same replay again: the page cache holds them);
* **replay, one record per entry**: ``one_per_entry`` records of 1 KiB, one per entry (the
  log of a database that logs each change, one append at a time; written here pipelined,
  by a writer whose ``max_entry_bytes`` leaves room for one record an entry, so that a log
  long enough to time is written in seconds: the same entries), replayed cold, hot, and hot again
  by a client reading entry by entry (``range_reads=False``: READ_ENTRY, as before runs
  existed) - the case where a reader pays per entry, not per record;
* **ledger read**: a closed ledger of ``ledger_entries`` entries of 1 KiB (written
  pipelined), read with ``ReadHandle.read`` from its first entry to its last: cold, hot,
  and hot entry by entry - entries/s and CPU per entry of the client and the bookies;
* **ledger read, written among others**: ``AMONG`` ledgers of ``ledger_entries // 2``
  entries of 1 KiB written at once, their adds interleaved (as a bookie serving many
  logs receives them: each ledger's records lie among the others' in the entry logs),
  then the first one read as above, cold and hot - what a layout that is not sorted by
  ledger costs a reader;
* **ledger read, still being written** (tailing catch-up): a ledger of ``ledger_entries``
  entries of 1 KiB written pipelined and left open; while its writer goes on adding
  ``CATCH_UP_WRITES`` entries a second, a reader on another client opens it without
  recovery and follows it (``ReadHandle.follow``) from entry 0 until it has read them all -
  a standby or a read replica starting behind a live log (reads bounded by the LAC, not by
  a close);
* **local baselines** (no replication, no network), in the same run and directory: the
  naive local log (length-prefixed records in one file, fsynced, read back in 1 MiB blocks
  with each record cut out) and an SQLite table (an integer key and a blob, ``SELECT`` in
  key order), of 100 B records (as many as the batched log, at most
  ``BASELINE_MAX_RECORDS``) and of 1 KiB (``one_per_entry`` of them), cold and hot; walkit's
  hot replays are reported as ratios to them;
* **tail visibility**: a writer appends on one client; a reader on another client (in
  this process: one clock) follows the log with ``tail()``; the time from ``append``
  returning (durable on a quorum) to the tail handing the record over, with appends back
  to back, one every 20 ms and one every 250 ms (``samples`` records each, fewer for the
  slower rates so that a case stays under ~15 s), and one every 20 ms on a log that rolls
  to a new segment every 20 records (the tail learns of each from the log node's watch),
  counted once the reader is open and following (a first record it saw): its open is
  not the steady state measured. The targets are the steady cases'; the rolling case
  shows what a roll adds (the tail opens each new segment's ledger).

Reported beside them: the write rate of each log (so a replay rate is read against it),
CPU per record of this process and of the bookies, as the other benchmarks report it,
and the bookies' read caches' hit rates during each read (``storage.caches``: the
read-ahead cache answers single reads, the recent-writes cache entry-log preads).
Targets (issue: performance, second round): replay >= 1,000,000 records/s of 100 B and
>= 300 MB/s of 1 KiB from three bookies; tail visibility p50 <= 1 ms (issue: reads as fast as
writes: p99 <= 5 ms; a ledger read >= 150,000 entries/s of 1 KiB, >= 100,000 while it is
still being written; a log written one record per entry replayed at >= 150,000 records/s).

Everything is removed at the end, also after an error or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import itertools
import os
import shutil
import sqlite3
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from walkit.bench._common import Meter, bench_cluster, framed_record, latency_percentiles, sqlite_log
from walkit.bench._visibility import visibility
from walkit.client import BookieClient, BookKeeper, LedgerHandle
from walkit.errors import InvalidArgumentError
from walkit.wal import LSN, WriteAheadLog

__all__ = ["run_read_bench", "format_markdown", "ratios", "write_ledger", "TARGETS"]

BOOKIES, ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 3, 2
SIZES = (100, 1024)
BATCH = 1000  # records per append_many call while writing the batched logs
WINDOW = 8  # append_many calls in flight while writing
INTERVALS = (0.0, 0.020, 0.250)  # seconds between appends in the tail-visibility cases
ROLL_INTERVAL, ROLL_RECORDS = 0.020, 20  # and a case whose log rolls every 20 records (one every 20 ms)
TARGETS = {"replay_100B_records_per_s": 1_000_000, "replay_1KiB_mb_per_s": 300, "tail_p50_ms": 1.0,
           "tail_p99_ms": 5.0, "ledger_entries_per_s": 150_000, "catch_up_entries_per_s": 100_000, "one_per_entry_records_per_s": 150_000}
LEDGER_WINDOW = 1000  # adds in flight while writing the ledger read back
AMONG = 8  # ledgers written at once, interleaved, for the "written among others" read
ONE_WINDOW, ONE_INFLIGHT = 1000, 64  # appends and entries in flight writing the one-per-entry log
CATCH_UP_WRITES = 1000  # entries a second the writer goes on adding while a follower catches up
FILE_BLOCK = 1 << 20  # the local-file baseline's reads
BASELINE_MAX_RECORDS = 2_000_000  # of 100 B: the baselines' logs hold as many records as the batched one, at most this
ONE_ROOM = 64  # an entry's room beyond one record: less than a second record needs
BOOKIE_OPTIONS = {"flush_interval": 1000}  # checkpoints every second: written entries reach the entry logs soon


def _write_batched(wal: WriteAheadLog, size: int, total: int) -> int:
    """Append records of ``size`` bytes until ``total`` bytes, ``BATCH`` a call, ``WINDOW``
    calls in flight; the records written."""
    batch = [os.urandom(size)] * BATCH
    calls = max(1, total // (size * BATCH))
    pending = []
    for _ in range(calls):
        pending.append(wal.append_many(batch))
        if len(pending) >= WINDOW:
            pending.pop(0).result()
    for fut in pending:
        fut.result()
    wal.flush()
    return calls * BATCH


def _write_one_per_entry(bk: BookKeeper, name: str, size: int, count: int) -> int:
    """``count`` records of ``size`` bytes, an entry each: appended ``ONE_WINDOW`` at a time
    by a writer whose entries have room for one record only; the records written."""
    record = os.urandom(size)
    room = max(1024, size + ONE_ROOM)
    with WriteAheadLog.open(bk, name, ensemble_size=ENSEMBLE, write_quorum=WRITE_QUORUM, ack_quorum=ACK_QUORUM,
                            max_entry_bytes=room, max_inflight_entries=ONE_INFLIGHT,
                            roll_bytes=max(256 << 20, 2 * count * room)) as wal:  # one segment
        pending: collections.deque[Future[LSN]] = collections.deque()
        for _ in range(count):
            pending.append(wal.append_async(record))
            if len(pending) >= ONE_WINDOW:
                pending.popleft().result()
        for fut in pending:
            fut.result()
        last = wal.flush()
    if last != LSN(1, count - 1, 0):  # one segment, an entry a record
        raise RuntimeError(f"the one-per-entry log ends at {last}, not 1/{count - 1}/0")
    return count


def _drop_page_cache(root: Path) -> int:
    """Write back and drop from the page cache every file under ``root``; the files."""
    os.sync()
    dropped = 0
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    dropped += 1
                finally:
                    os.close(fd)
    return dropped


class CacheMeter:
    """The bookies' read-cache hits and misses over one phase (ADMIN ``storage.caches``)."""

    CACHES = ("read_ahead", "recent_writes")

    def __init__(self, ports: list[int]) -> None:
        self._ports = ports
        self._before: dict[tuple[str, str], int] = {}

    async def _ask(self) -> dict[tuple[str, str], int]:
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(await BookieClient.connect("127.0.0.1", p)) for p in self._ports]
            stats = [await c.admin("storage.caches") for c in clients]
        return {(cache, k): sum(s[cache][k] for s in stats) for cache in self.CACHES for k in ("hits", "misses")}

    def start(self) -> None:
        self._before = asyncio.run(self._ask())

    def stop(self) -> dict[str, float | None]:
        """Each cache's hit rate over the phase (None: it was not asked)."""
        now = asyncio.run(self._ask())
        rates: dict[str, float | None] = {}
        for cache in self.CACHES:
            hits, misses = (now[(cache, k)] - self._before[(cache, k)] for k in ("hits", "misses"))
            rates[cache] = round(hits / (hits + misses), 3) if hits + misses else None
        return rates


def _replay(bk: BookKeeper, name: str, meter: Meter, caches: CacheMeter) -> dict[str, Any]:
    records = size = 0
    caches.start()
    meter.start()
    with WriteAheadLog.reader(bk, name) as reader:
        for _lsn, record in reader.replay():
            records += 1
            size += len(record)
    return _read_report(meter, caches, records, size)


def _read_report(meter: Meter, caches: CacheMeter | None, records: int, size: int) -> dict[str, Any]:
    """A read's row: ``records`` of ``size`` bytes in all, since ``meter.start()`` (and
    ``caches.start()``; None: a baseline, no bookie read)."""
    report = meter.stop(records)
    return {"caches": caches.stop() if caches is not None else dict.fromkeys(CacheMeter.CACHES), "records": records, "seconds": report["seconds"], "records_per_s": report["entries_per_s"],
            # from the rate, not the seconds (rounded: a short read's round to 0)
            "mb_per_s": round(report["entries_per_s"] * size / records / 1e6, 1) if records else 0.0,
            "client_cpu_us_per_record": report["client_cpu_us_per_entry"],
            "bookie_cpu_us_per_record": report["bookie_cpu_us_per_entry"],
            "other_cpu_cores": report["other_cpu_cores"], "steal_cores": report["steal_cores"]}


def write_ledger(bk: BookKeeper, count: int, size: int, *,
                  close: bool = True) -> tuple[LedgerHandle, dict[str, Any]]:
    """A ledger of ``count`` entries of ``size`` bytes added pipelined (closed unless
    ``close`` is False); its handle and write rate."""
    data = os.urandom(size)
    started = time.perf_counter()
    lh = bk.create_ledger(ENSEMBLE, WRITE_QUORUM, ACK_QUORUM)
    pending: collections.deque[Future[int]] = collections.deque()
    for _ in range(count):
        pending.append(lh.add_entry_async(data))
        if len(pending) >= LEDGER_WINDOW:
            pending.popleft().result()
    for fut in pending:
        fut.result()
    if close:
        lh.close()
    return lh, _written(count, started, size)


def _read_ledger(bk: BookKeeper, ledger_id: int, meter: Meter, caches: CacheMeter) -> dict[str, Any]:
    entries = size = 0
    caches.start()
    meter.start()
    rh = bk.open_ledger(ledger_id, recovery=False)
    for entry in rh.read(0, rh.last_add_confirmed):
        entries += 1
        size += len(entry.data)
    return _read_report(meter, caches, entries, size)


def _catch_up(bk: BookKeeper, reader_bk: BookKeeper, count: int, size: int, meter: Meter,
              caches: CacheMeter) -> dict[str, Any]:
    """A ledger still being written, read by a follower that starts ``count`` entries behind.

    ``count`` entries of ``size`` bytes are added pipelined (the backlog; one more, whose
    add tells the bookies the backlog's last entry is confirmed, so the follower can read
    to it whatever the writer does next); then, while the writer goes on adding
    ``CATCH_UP_WRITES`` entries a second, a reader on another client opens the ledger
    without recovery and follows it (``ReadHandle.follow``) from entry 0 until it has read
    the backlog. The catch-up's row, and the backlog's write rate."""
    lh, written = write_ledger(bk, count, size, close=False)
    data = os.urandom(size)
    try:
        lh.add_entry(data)
        stop = threading.Event()
        added: list[Future[int]] = []
        failed: list[BaseException] = []

        def keep_writing() -> None:  # CATCH_UP_WRITES a second, in bursts of a tenth of them
            burst = max(1, CATCH_UP_WRITES // 10)
            try:
                while True:
                    added.extend(lh.add_entry_async(data) for _ in range(burst))
                    if stop.wait(0.1):
                        return
            except BaseException as exc:  # noqa: BLE001 - raised again by the benchmark's thread
                failed.append(exc)

        writer = threading.Thread(target=keep_writing, name="catch-up-writer", daemon=True)
        writer.start()
        try:
            entries = read = 0
            caches.start()
            meter.start()
            with reader_bk.open_ledger(lh.ledger_id, recovery=False) as rh:
                for entry in rh.follow(0):
                    entries += 1
                    read += len(entry.data)
                    if entry.entry_id >= count - 1:
                        break
            report = _read_report(meter, caches, entries, read)
        finally:
            stop.set()
            writer.join()
        if failed:
            raise failed[0]
        for fut in added:
            fut.result()  # the writer's adds all succeeded: the ledger was being written throughout
    finally:
        lh.close()
    if entries != count:
        raise RuntimeError(f"the catch-up read {entries:,} entries, not {count:,}")
    return {"written": written, "catching up": report | {"written_meanwhile": len(added)}}


def _file_baseline(path: Path, size: int, count: int, meter: Meter) -> dict[str, Any]:
    """The naive local log read back: ``count`` length-prefixed records of ``size`` bytes
    in one file (written, fsynced), read from its start in blocks of ``FILE_BLOCK`` bytes,
    each record cut out (a copy, as a reader hands it on): cold, then hot."""
    framed = framed_record(os.urandom(size))
    started = time.perf_counter()
    with open(path, "wb") as f:
        per_block = max(1, FILE_BLOCK // len(framed))
        for done in range(0, count, per_block):
            f.write(framed * min(per_block, count - done))
        f.flush()
        os.fsync(f.fileno())
    written = _written(count, started, size)

    def read() -> dict[str, Any]:
        records = total = 0
        meter.start()
        unpack = struct.Struct(">I").unpack_from
        with open(path, "rb", buffering=0) as f:
            left = b""
            while block := f.read(FILE_BLOCK):
                buf = left + block if left else block
                at, end = 0, len(buf)
                while at + 4 <= end:
                    (n,) = unpack(buf, at)
                    if at + 4 + n > end:
                        break
                    rec = buf[at + 4:at + 4 + n]
                    records += 1
                    total += len(rec)
                    at += 4 + n
                left = buf[at:]
        if records != count:
            raise RuntimeError(f"the local file gave back {records:,} records, not {count:,}")
        return _read_report(meter, None, records, total)

    _drop_page_cache(path.parent)
    return {"written": written, "cold": read(), "hot": read()}


def _sqlite_baseline(path: Path, size: int, count: int, meter: Meter) -> dict[str, Any]:
    """A local SQLite table read back: ``count`` rows (an integer key, a blob of ``size``
    bytes) inserted in one transaction, then ``SELECT`` in key order: cold, then hot."""
    record = os.urandom(size)
    started = time.perf_counter()
    db = sqlite_log(path)
    try:
        db.execute("BEGIN")
        db.executemany("INSERT INTO log (record) VALUES (?)", itertools.repeat((record,), count))
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()
    written = _written(count, started, size)

    def read() -> dict[str, Any]:
        records = total = 0
        meter.start()
        db = sqlite3.connect(path, isolation_level=None)
        try:
            for _seq, rec in db.execute("SELECT seq, record FROM log ORDER BY seq"):
                records += 1
                total += len(rec)
        finally:
            db.close()
        if records != count:
            raise RuntimeError(f"SQLite gave back {records:,} rows, not {count:,}")
        return _read_report(meter, None, records, total)

    _drop_page_cache(path.parent)
    return {"written": written, "cold": read(), "hot": read()}


def _write_among(bk: BookKeeper, count: int, size: int) -> tuple[int, dict[str, Any]]:
    """``AMONG`` closed ledgers of ``count`` entries of ``size`` bytes, written at once, an
    add to each in turn; the first one's id and the write rate of all."""
    data = os.urandom(size)
    started = time.perf_counter()
    handles = [bk.create_ledger(ENSEMBLE, WRITE_QUORUM, ACK_QUORUM) for _ in range(AMONG)]
    pending: collections.deque[Future[int]] = collections.deque()
    for _ in range(count):
        for lh in handles:
            pending.append(lh.add_entry_async(data))
        while len(pending) >= LEDGER_WINDOW:
            pending.popleft().result()
    for fut in pending:
        fut.result()
    for lh in handles:
        lh.close()
    return handles[0].ledger_id, _written(count * AMONG, started, size)


def _written(records: int, started: float, size: int) -> dict[str, Any]:
    took = time.perf_counter() - started
    return {"records": records, "seconds": round(took, 2), "records_per_s": round(records / took),
            "mb_per_s": round(records * size / 1e6 / took, 1)}


def _baselines(directory: Path, meter: Meter, records_100: int, records_1024: int) -> dict[str, Any]:
    """The local-only read baselines, in a directory of their own (its page cache dropped
    before each cold read)."""
    out: dict[str, Any] = {}
    for size, count in ((100, min(records_100, BASELINE_MAX_RECORDS)), (1024, records_1024)):
        where = directory / f"baseline-{size}"
        where.mkdir()
        out[f"file-{size}"] = _file_baseline(where / "log", size, count, meter)
        out[f"sqlite-{size}"] = _sqlite_baseline(where / "log.db", size, count, meter)
        shutil.rmtree(where)
    return out


def _measure(bk: BookKeeper, reader_bk: BookKeeper, each_bk: BookKeeper, data: Path, base: Path, meter: Meter,
             caches: CacheMeter, gib: float, one_per_entry: int, ledger_entries: int, samples: int) -> dict[str, Any]:
    out: dict[str, Any] = {"replay": {}, "tail": []}
    for size in SIZES:
        name = f"batched-{size}"
        with WriteAheadLog.open(bk, name, ensemble_size=ENSEMBLE, write_quorum=WRITE_QUORUM,
                                ack_quorum=ACK_QUORUM) as wal:
            started = time.perf_counter()
            written = _written(_write_batched(wal, size, int(gib * (1 << 30))), started, size)
        time.sleep(2 * BOOKIE_OPTIONS["flush_interval"] / 1000)  # a checkpoint: entries in entry logs, synced
        dropped = _drop_page_cache(data)
        cold = _replay(reader_bk, name, meter, caches)
        hot = _replay(reader_bk, name, meter, caches)
        out["replay"][f"{size}"] = {"written": written, "cold": cold | {"files_dropped": dropped}, "hot": hot}
    started = time.perf_counter()
    written = _written(_write_one_per_entry(bk, "one-per-entry", 1024, one_per_entry), started, 1024)
    time.sleep(2 * BOOKIE_OPTIONS["flush_interval"] / 1000)
    dropped = _drop_page_cache(data)
    out["replay"]["1024-one-per-entry"] = {
        "written": written, "cold": _replay(reader_bk, "one-per-entry", meter, caches) | {"files_dropped": dropped},
        "hot": _replay(reader_bk, "one-per-entry", meter, caches),
        "hot, entry by entry": _replay(each_bk, "one-per-entry", meter, caches)}
    lh, written = write_ledger(bk, ledger_entries, 1024)
    ledger_id = lh.ledger_id
    time.sleep(2 * BOOKIE_OPTIONS["flush_interval"] / 1000)
    dropped = _drop_page_cache(data)
    out["replay"]["ledger-1024"] = {
        "written": written, "cold": _read_ledger(reader_bk, ledger_id, meter, caches) | {"files_dropped": dropped},
        "hot": _read_ledger(reader_bk, ledger_id, meter, caches),
        "hot, entry by entry": _read_ledger(each_bk, ledger_id, meter, caches)}
    out["baseline"] = _baselines(base, meter, out["replay"]["100"]["written"]["records"], one_per_entry)
    out["replay"]["ledger-1024-catch-up"] = _catch_up(bk, reader_bk, ledger_entries, 1024, meter, caches)
    ledger_id, written = _write_among(bk, max(1, ledger_entries // 2), 1024)
    time.sleep(2 * BOOKIE_OPTIONS["flush_interval"] / 1000)
    dropped = _drop_page_cache(data)
    out["replay"]["ledger-1024-among"] = {
        "written": written, "cold": _read_ledger(reader_bk, ledger_id, meter, caches) | {"files_dropped": dropped},
        "hot": _read_ledger(reader_bk, ledger_id, meter, caches)}
    for interval in INTERVALS:
        out["tail"].append(visibility(bk, reader_bk, f"tail-{int(interval * 1000)}ms", interval, samples))
    out["tail"].append(visibility(bk, reader_bk, "tail-rolling", ROLL_INTERVAL, samples, ROLL_RECORDS))
    return out


def _checks(results: dict[str, Any]) -> dict[str, bool]:
    replay = results["replay"]
    steady = [case for case in results["tail"] if not case["roll_records"]]
    return {
        "replay_100B_rate_met": replay["100"]["hot"]["records_per_s"] >= TARGETS["replay_100B_records_per_s"],
        "replay_1KiB_mb_met": replay["1024"]["hot"]["mb_per_s"] >= TARGETS["replay_1KiB_mb_per_s"],
        "tail_p50_met": all(case["p50_ms"] <= TARGETS["tail_p50_ms"] for case in steady),
        "tail_p99_met": all(case["p99_ms"] <= TARGETS["tail_p99_ms"] for case in steady),
        "ledger_rate_met": replay["ledger-1024"]["hot"]["records_per_s"] >= TARGETS["ledger_entries_per_s"],
        "catch_up_rate_met": replay["ledger-1024-catch-up"]["catching up"]["records_per_s"]
        >= TARGETS["catch_up_entries_per_s"],
        "one_per_entry_rate_met": replay["1024-one-per-entry"]["hot"]["records_per_s"]
        >= TARGETS["one_per_entry_records_per_s"],
    }


def run_read_bench(directory: str | None = None, *, gib: float = 1.0, one_per_entry: int = 100_000,
                   ledger_entries: int = 100_000, samples: int = 2000) -> dict[str, Any]:
    """Every case on a fresh cluster of three bookie processes; the report (a dict)."""
    if not gib > 0 or one_per_entry < 1 or ledger_entries < 1 or samples < 10:
        raise InvalidArgumentError("need gib > 0, one_per_entry >= 1, ledger_entries >= 1, samples >= 10", gib=gib,
                                   one_per_entry=one_per_entry, ledger_entries=ledger_entries, samples=samples)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    with bench_cluster(directory, "read", BOOKIES, bookie_options=BOOKIE_OPTIONS) as (cluster, base):
        meter = Meter([cluster.bookie_pid(i) for i in range(BOOKIES)])
        caches = CacheMeter([cluster.bookie_address(i)[1] for i in range(BOOKIES)])
        with cluster.client() as bk, cluster.client() as reader_bk, cluster.client(range_reads=False) as each_bk:
            results = _measure(bk, reader_bk, each_bk, cluster.data_dir, base, meter, caches, gib, one_per_entry,
                               ledger_entries, samples)
    return {"started": started, "cpus": os.cpu_count(), "bookies": BOOKIES, "ensemble": ENSEMBLE,
            "write_quorum": WRITE_QUORUM, "ack_quorum": ACK_QUORUM, "gib": gib, "one_per_entry": one_per_entry,
            "ledger_entries": ledger_entries, **results, "targets": TARGETS, "checks": _checks(results)}


_LABELS = {"100": "100 B records, batched", "1024": "1 KiB records, batched",
           "1024-one-per-entry": "1 KiB records, one per entry", "ledger-1024": "ledger of 1 KiB entries (records = entries)",
           "ledger-1024-catch-up": "ledger of 1 KiB entries still being written, a follower",
           "ledger-1024-among": f"ledger of 1 KiB entries written among {AMONG - 1} others"}


_BASELINE_LABELS = {"file-100": "baseline: local file, 100 B records", "sqlite-100": "baseline: SQLite table, 100 B rows",
                    "file-1024": "baseline: local file, 1 KiB records", "sqlite-1024": "baseline: SQLite table, 1 KiB rows"}
# walkit's hot read / each baseline's hot read of records of the same size: (label, walkit case, baseline size, figure)
_RATIOS = (("100 B records, batched log (records/s)", "100", "100", "records_per_s"),
           ("1 KiB records, batched log (MB/s)", "1024", "1024", "mb_per_s"),
           ("1 KiB records, one per entry (records/s)", "1024-one-per-entry", "1024", "records_per_s"))


def ratios(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """walkit's hot replays / the local baselines' hot reads, by case."""
    out = {}
    for label, case, size, figure in _RATIOS:
        ours = report["replay"][case]["hot"][figure]
        out[label] = {kind: round(ours / report["baseline"][f"{kind}-{size}"]["hot"][figure], 2)
                      for kind in ("file", "sqlite")}
    return out


def _rows(report: dict[str, Any]) -> Iterator[str]:
    labels = _LABELS | _BASELINE_LABELS
    for key, case in [*report["replay"].items(), *report["baseline"].items()]:
        w = case["written"]
        for phase in ("cold", "hot", "hot, entry by entry", "catching up"):
            if phase in case:
                r = case[phase]
                hits = " | ".join("-" if r["caches"][c] is None else f"{r['caches'][c]:.0%}" for c in CacheMeter.CACHES)
                yield (f"| {labels[key]}, {phase} | {r['records']:,} | {r['records_per_s']:,} | {r['mb_per_s']} "
                       f"| {w['records_per_s']:,} | {r['client_cpu_us_per_record']} | {r['bookie_cpu_us_per_record']} "
                       f"| {hits} | {r['other_cpu_cores']} | {r['steal_cores']} |")


def format_markdown(report: dict[str, Any]) -> str:
    def met(ok: bool) -> str:
        return "met" if ok else "**missed**"

    checks = report["checks"]
    lines = [f"{report['started']}; {report['bookies']} bookie processes, E={report['ensemble']} "
             f"Qw={report['write_quorum']} Qa={report['ack_quorum']}, {report['cpus']} CPUs; batched logs of "
             f"{report['gib']:g} GiB, {report['one_per_entry']:,} records one per entry, a ledger of "
             f"{report['ledger_entries']:,} entries", "",
             "| replay | records | records/s | MB/s | written records/s | client CPU µs/record "
             "| bookies CPU µs/record | read-ahead hits | recent-writes hits | other cores | steal cores |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *_rows(report), "",
             "| hot read, walkit / local baseline | / local file | / SQLite |", "|---|---:|---:|",
             *(f"| {label} | {r['file']} | {r['sqlite']} |" for label, r in ratios(report).items()), "",
             "| tail visibility | samples | p50 ms | p99 ms | p99.9 ms |", "|---|---:|---:|---:|---:|"]
    for case in report["tail"]:
        label = "back to back" if not case["interval_ms"] else f"one every {case['interval_ms']:g} ms"
        if case["roll_records"]:
            label += f", a new segment every {case['roll_records']} ({case['segments']} segments)"
        lines.append(f"| {label} | {case['samples']:,} | {case['p50_ms']} | {case['p99_ms']} | {case['p999_ms']} |")
    lines += ["", f"targets: replay 100 B >= {TARGETS['replay_100B_records_per_s']:,} records/s: "
                  f"{met(checks['replay_100B_rate_met'])}; replay 1 KiB >= {TARGETS['replay_1KiB_mb_per_s']} MB/s: "
                  f"{met(checks['replay_1KiB_mb_met'])}; tail visibility p50 <= {TARGETS['tail_p50_ms']} ms: "
                  f"{met(checks['tail_p50_met'])}, p99 <= {TARGETS['tail_p99_ms']} ms: {met(checks['tail_p99_met'])}; "
                  f"ledger read >= {TARGETS['ledger_entries_per_s']:,} entries/s: {met(checks['ledger_rate_met'])}, "
                  f"catching up on a ledger being written >= {TARGETS['catch_up_entries_per_s']:,}: "
                  f"{met(checks['catch_up_rate_met'])}; "
                  f"one record per entry >= {TARGETS['one_per_entry_records_per_s']:,} records/s: "
                  f"{met(checks['one_per_entry_rate_met'])}"]
    return "\n".join(lines)
