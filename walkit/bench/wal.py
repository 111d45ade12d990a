"""``walkit bench wal``: the WriteAheadLog's append path, end to end, against the local
logs it replaces.

What it measures
----------------
A :class:`~walkit.LocalCluster` of three bookie processes under a temporary directory and
one :class:`~walkit.WriteAheadLog` writer in this process (its options at their defaults;
segments on ledgers of E=3, Qw=3, Qa=2), appending 100 B and 1 KiB records. Per size, each
case after ``warmup`` uncounted seconds in the same mode, then ``seconds`` counted:

* **walkit, sequential**: one ``append`` at a time (returns once durable on a quorum);
* **walkit, N in flight**: ``append_async`` with a window of ``in_flight`` futures kept
  full (they complete in order: wait on the oldest, collect every later one done, refill).
  Records arriving while entries are in flight share one ledger entry; the LSNs tell how
  many: records per entry is records / distinct (segment, entry) pairs;
* **walkit, append_many**: ``append_many`` of ``MANY_BATCH`` records a call, with
  ``MANY_WINDOW`` calls outstanding (latency: per call, from submission to its future).

and, in the same run and the same directory, two local-only baselines (no replication):

* **file + fdatasync**: one file, ``os.write`` of a length-prefixed record and
  ``os.fdatasync`` per record - the naive local log. Its API is synchronous, so "1,000 in
  flight" is the same loop: it is compared with both walkit cases;
* **SQLite** (WAL mode, ``synchronous=FULL``): one ``INSERT`` per transaction, and
  ``SQLITE_BATCH`` inserts per transaction (latency: the transaction's, for each record).

and the **floor of replication** (``walkit/bench/_floor.py``): three minimal server
processes that receive a record over loopback, write it (O_DIRECT) + fdatasync and
answer, and a writer that waits for two of the three - what one replicated append costs
this machine with no walkit in it (its "bookies CPU" is the three servers').

Then **tail visibility** (``walkit/bench/_visibility.py``, as ``walkit bench read``
measures it): a reader on a second client tails the log while the writer appends
``samples`` 100 B records back to back, then one every 20 ms; per record, the time from
``append`` returning to the tail handing the record over (p50/p99; target, issue: reads as
fast as writes: p50 <= 1 ms, p99 <= 5 ms).

Latency is per append (sequential) or from submission until the producer sees the
future done (window; mostly queueing: in flight / rate). CPU: this process (producer,
client loop and metadata threads) and the bookies, per record, with the machine's other
load and steal, as ``walkit bench ledger`` reports them (the helpers in ``_common``). Targets (issue:
WriteAheadLog): >= 200,000 records/s of 100 B with 1,000 in flight; sequential p99 <= 3 ms; (issue:
performance, second round) >= 1,000,000 records/s of 100 B with ``append_many`` batches of 1,000.

The cluster, the baselines' files and the directory are removed at the end, also after
an error or Ctrl-C.
"""

from __future__ import annotations

import datetime
import functools
import operator
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from walkit._local_cluster import LocalCluster
from walkit.bench._common import (Meter, bench_cluster, event_loops, framed_record, journals_o_direct,
                                  latency_percentiles, sqlite_log, window_loop)
from walkit.bench._floor import ReplicatedFloor
from walkit.bench._visibility import visibility
from walkit.client import BookKeeper
from walkit.errors import InvalidArgumentError
from walkit.wal import LSN, WriteAheadLog

__all__ = ["run_wal_bench", "format_markdown", "TARGETS"]

BOOKIES, ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 3, 2
SIZES = (100, 1024)
SQLITE_BATCH = 1000
MANY_BATCH = 1000  # records per append_many call
MANY_WINDOW = 8  # append_many calls outstanding
TARGETS = {"in_flight_100B_records_per_s": 200_000, "sequential_p99_ms": 3.0, "many_100B_records_per_s": 1_000_000,
           "tail_p50_ms": 1.0, "tail_p99_ms": 5.0}
VISIBILITY_INTERVALS = (0.0, 0.020)  # seconds between appends in the tail-visibility cases
# case key -> row label
CASES = {
    "wal_sequential": "walkit, sequential (1 in flight)",
    "wal_in_flight": "walkit, {in_flight:,} in flight",
    "wal_many": f"walkit, append_many of {MANY_BATCH:,} records, {MANY_WINDOW} calls in flight",
    "file_fdatasync": "file: write + fdatasync per record (synchronous: sequential = in flight)",
    "sqlite_txn_per_record": "SQLite WAL, synchronous=FULL, 1 insert per transaction",
    "sqlite_batched": f"SQLite WAL, synchronous=FULL, {SQLITE_BATCH:,} inserts per transaction",
    "floor_replicated": "floor: 3 minimal servers (receive, O_DIRECT write + fdatasync, answer), 2 of 3 answers",
}
RATIOS = {  # walkit case / baseline case
    "sequential_vs_file": ("wal_sequential", "file_fdatasync"),
    "sequential_vs_sqlite": ("wal_sequential", "sqlite_txn_per_record"),
    "sequential_vs_floor": ("wal_sequential", "floor_replicated"),
    "in_flight_vs_file": ("wal_in_flight", "file_fdatasync"),
    "in_flight_vs_sqlite_batched": ("wal_in_flight", "sqlite_batched"),
    "many_vs_sqlite_batched": ("wal_many", "sqlite_batched"),
}


class _Entries:
    """Ledger entries the counted records went into. Every entry's first record has slot 0
    (the records here are never fragments), so the count is that of the LSNs of slot 0
    seen - taken as the results arrive, no LSN kept: millions of them kept alive would
    put the garbage collector's passes over them in what is measured (with them kept,
    ``append_many`` of 100 B ran at ~0.85x and its client spent ~1.5x the CPU a record)."""

    def __init__(self) -> None:
        self.count = 0

    def reset(self) -> None:
        self.count = 0

    def see(self, lsn: LSN) -> None:
        if lsn.slot == 0:
            self.count += 1

    def see_many(self, lsns: list[LSN]) -> None:
        self.count += operator.countOf(map(_SLOT, lsns), 0)  # in C: no object a record


_SLOT = operator.itemgetter(2)  # an LSN's slot


def _per_record(meter_report: dict[str, Any], size: int) -> dict[str, Any]:
    """``Meter.stop``'s per-entry figures, named per record, with MB/s."""
    out = {key.replace("entries", "records").replace("entry", "record"): value for key, value in meter_report.items()}
    out["mb_per_s"] = round(out["records_per_s"] * size / 1e6, 1)
    return out


def _timed(step: Callable[[], int], meter: Meter, warmup: float, seconds: float,
           on_start: Callable[[], None] = lambda: None) -> tuple[dict[str, Any], list[int]]:
    """``step`` (records it wrote) over and over: ``warmup`` seconds uncounted, then
    ``seconds`` counted; the meter's report for the counted records and each step's latency."""
    clock = time.perf_counter_ns
    counting_at = clock() + int(warmup * 1e9)
    while clock() < counting_at:
        step()
    latencies: list[int] = []
    records = 0
    on_start()
    meter.start()
    until = clock() + int(seconds * 1e9)
    while (start := clock()) < until:
        records += step()
        latencies.append(clock() - start)
    return meter.stop(records), latencies


def _wal_sequential(wal: WriteAheadLog, payload: bytes, meter: Meter, warmup: float,
                    seconds: float) -> dict[str, Any]:
    entries, append = _Entries(), wal.append

    def step() -> int:
        entries.see(append(payload))
        return 1

    report, latencies = _timed(step, meter, warmup, seconds, entries.reset)
    return _wal_report(report, latencies, entries, len(payload), 1)


def _wal_window(wal: WriteAheadLog, payload: bytes, meter: Meter, warmup: float, seconds: float,
                in_flight: int) -> dict[str, Any]:
    """``in_flight`` appends outstanding (see :func:`window_loop`)."""
    entries = _Entries()
    report, latencies = window_loop(functools.partial(wal.append_async, payload), meter, warmup, seconds, in_flight,
                                    entries.see)
    return _wal_report(report, latencies, entries, len(payload), in_flight)


def _wal_many(wal: WriteAheadLog, payload: bytes, meter: Meter, warmup: float, seconds: float) -> dict[str, Any]:
    """``append_many`` of ``MANY_BATCH`` records with ``MANY_WINDOW`` calls outstanding:
    the meter counts calls, the report records (``MANY_BATCH`` a call)."""
    entries = _Entries()
    batch = [payload] * MANY_BATCH
    calls, latencies = window_loop(functools.partial(wal.append_many, batch), meter, warmup, seconds, MANY_WINDOW,
                                   entries.see_many)
    report = calls | {"entries": calls["entries"] * MANY_BATCH, "entries_per_s": calls["entries_per_s"] * MANY_BATCH}
    report |= {key: round(value / MANY_BATCH, 3) for key, value in calls.items() if key.endswith("_per_entry")}
    return _wal_report(report, latencies, entries, len(payload), MANY_BATCH * MANY_WINDOW)


def _wal_report(report: dict[str, Any], latencies: list[int], entries: _Entries, size: int,
                in_flight: int) -> dict[str, Any]:
    out = _per_record(report, size) | latency_percentiles(latencies)
    out["entries_per_s"] = round(entries.count / report["seconds"]) if report["seconds"] else 0
    out["records_per_entry"] = round(report["entries"] / max(entries.count, 1), 2)
    return out | {"in_flight": in_flight}


def _file_fdatasync(path: Path, payload: bytes, meter: Meter, warmup: float, seconds: float) -> dict[str, Any]:
    """The naive local log: append a length-prefixed record, fdatasync, next."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    framed = framed_record(payload)
    write, sync = os.write, os.fdatasync

    def step() -> int:
        write(fd, framed)
        sync(fd)
        return 1

    try:
        report, latencies = _timed(step, meter, warmup, seconds)
    finally:
        os.close(fd)
    return _per_record(report, len(payload)) | latency_percentiles(latencies) | {"in_flight": 1}


def _sqlite(path: Path, payload: bytes, meter: Meter, warmup: float, seconds: float, batch: int) -> dict[str, Any]:
    """SQLite in WAL mode with synchronous=FULL: ``batch`` inserts per transaction."""
    db = sqlite_log(path)
    try:
        insert, rows = "INSERT INTO log (record) VALUES (?)", [(payload,)] * batch

        def one() -> int:
            db.execute(insert, rows[0])  # autocommit: a transaction of its own
            return 1

        def many() -> int:
            db.execute("BEGIN")
            db.executemany(insert, rows)
            db.execute("COMMIT")
            return batch

        report, latencies = _timed(one if batch == 1 else many, meter, warmup, seconds)
    finally:
        db.close()
    return _per_record(report, len(payload)) | latency_percentiles(latencies) | {"in_flight": batch}


def _baselines(base: Path, meter: Meter, size: int, payload: bytes, warmup: float,
               seconds: float) -> dict[str, dict[str, Any]]:
    """The local-only baselines (the idle bookies' CPU still shows: it should be ~0)."""
    out = {}
    out["file_fdatasync"] = _file_fdatasync(base / f"naive-{size}.log", payload, meter, warmup, seconds)
    out["sqlite_txn_per_record"] = _sqlite(base / f"one-{size}.db", payload, meter, warmup, seconds, 1)
    out["sqlite_batched"] = _sqlite(base / f"batched-{size}.db", payload, meter, warmup, seconds, SQLITE_BATCH)
    out["floor_replicated"] = _floor(base, payload, warmup, seconds)
    return out


def _floor(base: Path, payload: bytes, warmup: float, seconds: float) -> dict[str, Any]:
    """One replicated append at a time with nothing of walkit's (``_floor``)."""
    with ReplicatedFloor(base, len(payload)) as floor:
        report, latencies = _timed(functools.partial(floor.append, payload), Meter(floor.pids), warmup, seconds)
    return _per_record(report, len(payload)) | latency_percentiles(latencies) | {"in_flight": 1}


def _on_log(bk: BookKeeper, name: str, run: Callable[[WriteAheadLog], dict[str, Any]]) -> dict[str, Any]:
    """``run`` on a log of its own, closed afterwards (after an error the client's close
    drops it: waiting for its appends could outlast the bookies)."""
    wal = WriteAheadLog.open(bk, name, ensemble_size=ENSEMBLE, write_quorum=WRITE_QUORUM, ack_quorum=ACK_QUORUM)
    result = run(wal)
    wal.close()
    return result


def _tails(cluster: LocalCluster, samples: int) -> list[dict[str, Any]]:
    with cluster.client() as bk, cluster.client() as reader_bk:
        return [visibility(bk, reader_bk, f"tail-{int(interval * 1000)}ms", interval, samples)
                for interval in VISIBILITY_INTERVALS]


def _measure(cluster: LocalCluster, base: Path, seconds: float, in_flight: int,
             warmup: float) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Every case of every size; and the event loops the client and the bookies ran."""
    meter = Meter([cluster.bookie_pid(i) for i in range(BOOKIES)])
    results: dict[str, dict[str, Any]] = {}
    with cluster.client() as bk:
        for size in SIZES:
            payload = os.urandom(size)
            cases = {
                "wal_sequential": _on_log(bk, f"seq-{size}", lambda w: _wal_sequential(w, payload, meter, warmup,
                                                                                        seconds)),
                "wal_in_flight": _on_log(bk, f"window-{size}", lambda w: _wal_window(w, payload, meter, warmup,
                                                                                      seconds, in_flight)),
                "wal_many": _on_log(bk, f"many-{size}", lambda w: _wal_many(w, payload, meter, warmup, seconds)),
            }
            results[str(size)] = cases | _baselines(base, meter, size, payload, warmup, seconds)
        loops = event_loops(cluster, BOOKIES, bk)
    return results, loops


def _ratios(cases: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """walkit / baseline: records/s, p50 and p99 latency, client CPU per record."""
    out = {}
    for name, (ours, theirs) in RATIOS.items():
        a, b = cases[ours], cases[theirs]
        out[name] = {key: round(a[key] / b[key], 2) if b[key] else 0.0
                     for key in ("records_per_s", "p50_ms", "p99_ms", "client_cpu_us_per_record")}
    return out


def _checks(results: dict[str, dict[str, dict[str, Any]]], tails: list[dict[str, Any]]) -> dict[str, bool]:
    return {
        "tail_p50_met": all(t["p50_ms"] <= TARGETS["tail_p50_ms"] for t in tails),
        "tail_p99_met": all(t["p99_ms"] <= TARGETS["tail_p99_ms"] for t in tails),
        "in_flight_100B_rate_met":
            results["100"]["wal_in_flight"]["records_per_s"] >= TARGETS["in_flight_100B_records_per_s"],
        "many_100B_rate_met": results["100"]["wal_many"]["records_per_s"] >= TARGETS["many_100B_records_per_s"],
        **{f"sequential_{size}B_p99_met": results[size]["wal_sequential"]["p99_ms"] <= TARGETS["sequential_p99_ms"]
           for size in results},
    }


def run_wal_bench(directory: str | None = None, seconds: float = 5.0, in_flight: int = 1000,
                  warmup: float = 1.0, samples: int = 1000) -> dict[str, Any]:
    """Every case on a fresh cluster of three bookie processes; the report (a dict)."""
    if in_flight < 1 or seconds <= 0 or warmup < 0 or samples < 10:
        raise InvalidArgumentError("need in_flight >= 1, seconds > 0, warmup >= 0, samples >= 10",
                                   in_flight=in_flight, seconds=seconds, warmup=warmup, samples=samples)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    with bench_cluster(directory, "wal", BOOKIES) as (cluster, base):
        results, loops = _measure(cluster, base, seconds, in_flight, warmup)
        tails = _tails(cluster, samples)
        o_direct = journals_o_direct(cluster, BOOKIES)
    return {
        "started": started, "cpus": os.cpu_count(), "bookies": BOOKIES, "ensemble": ENSEMBLE,
        "write_quorum": WRITE_QUORUM, "ack_quorum": ACK_QUORUM, "journal_o_direct": o_direct, "event_loop": loops,
        "in_flight": in_flight, "seconds": seconds, "warmup": warmup, "sqlite_batch": SQLITE_BATCH,
        "sqlite_version": sqlite3.sqlite_version, "sizes": results,
        "ratios": {size: _ratios(cases) for size, cases in results.items()},
        "tail": tails, "targets": TARGETS, "checks": _checks(results, tails),
    }


def _fmt(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _row(label: str, r: dict[str, Any]) -> str:
    cells = [r["records"], r["records_per_s"], r["mb_per_s"], r.get("entries_per_s", "-"),
             r.get("records_per_entry", "-"), r["p50_ms"], r["p99_ms"], r["p999_ms"], r["client_cpu_us_per_record"],
             r["client_cpu_cores"], r["bookie_cpu_us_per_record"], r["other_cpu_cores"], r["steal_cores"]]
    return f"| {label} | " + " | ".join(_fmt(c) for c in cells) + " |"


def format_markdown(report: dict[str, Any]) -> str:
    def met(ok: bool) -> str:
        return "met" if ok else "**missed**"

    checks = report["checks"]
    lines = [
        f"{report['started']}; {report['bookies']} bookie processes, E={report['ensemble']} "
        f"Qw={report['write_quorum']} Qa={report['ack_quorum']}, journal O_DIRECT: {report['journal_o_direct']}, "
        f"event loops: client {report['event_loop']['client']}, bookies {'/'.join(report['event_loop']['bookies'])}, "
        f"{report['cpus']} CPUs, SQLite {report['sqlite_version']}; baselines are local only (no replication)",
        "",
        "| size / case | records | records/s | MB/s | entries/s | records/entry | p50 ms | p99 ms | p99.9 ms "
        "| client CPU µs/record | client cores | bookies CPU µs/record | other cores | steal cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size, cases in report["sizes"].items():
        for key, label in CASES.items():
            lines.append(_row(f"{size} B: " + label.format(in_flight=report["in_flight"]), cases[key]))
    lines += ["", "| size | walkit / baseline | records/s | p50 | p99 | client CPU/record |", "|---|---|---:|---:|---:|---:|"]
    for size, ratios in report["ratios"].items():
        for name, r in ratios.items():
            lines.append(f"| {size} B | {name} | {r['records_per_s']} | {r['p50_ms']} | {r['p99_ms']} "
                         f"| {r['client_cpu_us_per_record']} |")
    lines += ["", f"targets: 100 B with {report['in_flight']:,} in flight >= "
                  f"{TARGETS['in_flight_100B_records_per_s']:,} records/s: {met(checks['in_flight_100B_rate_met'])}; "
                  f"append_many 100 B >= {TARGETS['many_100B_records_per_s']:,} records/s: "
                  f"{met(checks['many_100B_rate_met'])}; sequential p99 <= {TARGETS['sequential_p99_ms']} ms: "
              + ", ".join(f"{size} B {met(checks[f'sequential_{size}B_p99_met'])}" for size in report["sizes"])]
    lines += ["", "| tail visibility (append returned -> tail has it) | samples | p50 ms | p99 ms | p99.9 ms |",
              "|---|---:|---:|---:|---:|"]
    for t in report["tail"]:
        every = "back to back" if not t["interval_ms"] else f"one every {t['interval_ms']:g} ms"
        lines.append(f"| {every} | {t['samples']:,} | {t['p50_ms']} | {t['p99_ms']} | {t['p999_ms']} |")
    lines += ["", f"targets: tail visibility p50 <= {TARGETS['tail_p50_ms']} ms: {met(checks['tail_p50_met'])}; "
                  f"p99 <= {TARGETS['tail_p99_ms']} ms: {met(checks['tail_p99_met'])}"]
    return "\n".join(lines)
