"""``walkit bench bookkeeper``: walkit against Apache BookKeeper 4.18.2 on the same machine.

What it measures
----------------
The same workloads, one after the other on the same machine, on three systems, each a
cluster of three bookie processes and one client writing ledgers of E=3 Qw=3 Qa=2:

* **walkit**: a :class:`~walkit.LocalCluster` of walkit bookie processes and the walkit
  client in this process, both in their default configuration;
* **BookKeeper, defaults**: three Java bookies (DbLedgerStorage, a journal and ledger
  directory each, journal synced on every group) under a fresh root of a standalone
  ZooKeeper (Debian's package, as the tests start it), and the Java client in a JVM of its
  own (``java/BenchPeer.java``) running the same workloads in-JVM;
* **BookKeeper, tuned** as its documentation advises for low latency: the settings in
  :data:`TUNED_BOOKIE` and :data:`TUNED_CLIENT` (their "why" beside each).

Rows: sequential adds (one at a time, 100 B and 1 KiB: p50, p99, adds/s); pipelined adds/s
(100 B and 1 KiB, ``in_flight`` outstanding); entries/s reading a closed ledger of
``read_entries`` 1 KiB entries from a freshly opened handle; tail visibility (a writer
adds an entry every ``tail_interval_ms``; a reader on a client of its own follows the ledger
with long polls; per entry, from the writer's add returning to the reader holding it); and
``ledgers`` ledgers created at once, then written at once (100 B adds round-robin over
them, ``in_flight`` outstanding). A walkit writer publishes its LAC when it goes idle
(``idle_lac``: by default a WriteAheadLog's writers, and a plain ledger's unless other
writers of its client go idle at the same time), where BookKeeper's does not by default
(``explicitLacInterval``=0): the tail is measured with walkit's default and with
``idle_lac=True``, beside BookKeeper's one tail per configuration. Beside each rate: the client's CPU per operation (this
process for walkit, ``time.process_time``; the JVM peer for BookKeeper, from
``/proc/<pid>/stat``, read by the peer at the start and end of the counted interval) and the
bookies' CPU per operation; and the ratio walkit / BookKeeper per row.

Timed phases run ``seconds`` after ``warmup`` seconds of the same work uncounted, as
``walkit bench ledger`` does (whose workload functions the walkit side runs). Each client
runs the four add phases twice and only the second pass counts: a JVM compiles a path
after thousands of runs, more than one sequential warm-up makes (BookKeeper's one-at-a-time
p50 kept falling from one 3 s phase to the next, 8.6 to 0.6 ms over five, on this
machine); before the timed read a smaller closed ledger (``READ_WARMUP`` entries) is read
once: the read path is warm, the measured ledger's entries are in no client cache. Clusters and
their directories are removed at the end, also after an error or Ctrl-C. Without ``java``,
``javac`` (or, with nothing cached, ``mvn``) on PATH it raises ConfigError naming what is
missing, before anything starts.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from walkit.bench._bookkeeper_java import PEER_SOURCE, BenchPeer, JavaBookKeeper, bookkeeper_classpath, compile_java
from walkit.bench._common import Meter, bench_cluster, latency_percentiles, window_loop
from walkit.bench.ledger import ACK_QUORUM, ENSEMBLE, WRITE_QUORUM, pipelined, sequential
from walkit.bench.read import write_ledger
from walkit.bench.scale import create_ledgers
from walkit.client import BookKeeper, LedgerHandle
from walkit.errors import InvalidArgumentError, WalkitError

__all__ = ["run_bookkeeper_bench", "format_markdown", "Workload", "TUNED_BOOKIE", "TUNED_CLIENT", "SYSTEMS"]

SIZES = (100, 1024)
READ_SIZE, LEDGERS_SIZE = 1024, 100
READ_WARMUP = 10_000  # entries of the ledger read once, uncounted, before the timed read
#: bk_server.conf changes of the tuned run
TUNED_BOOKIE = {
    "journalFlushWhenQueueEmpty": "true",  # write the journal when its queue empties, no 2 ms group wait
    "numAddWorkerThreads": "0",  # adds handled on the Netty I/O thread: no hand-off to a worker pool
}
#: Java client changes of the tuned run (BenchPeer's settings)
TUNED_CLIENT = {
    "throttle": 0,  # no per-handle rate limiter (default 5,000 operations/s)
    "v2": True,  # the v2 binary protocol for the writing client (Pulsar's choice); long polls need v3
    "explicit_lac_ms": 1,  # send the LAC every 1 ms when no later add carries it (default 0: never)
    "parallel_long_poll": True,  # a tailing reader's long polls go to every bookie of the write set
}
SYSTEMS = ("walkit", "bk_defaults", "bk_tuned")
_CLOSERS = 8  # threads closing the walkit side's many ledgers (uncounted)


@dataclass(frozen=True)
class Workload:
    """The sizes of one run (the CLI's options)."""

    seconds: float = 5.0
    warmup: float = 1.0
    in_flight: int = 1000
    read_entries: int = 100_000
    tail_samples: int = 500
    tail_interval_ms: int = 10
    ledgers: int = 1000

    def check(self) -> None:
        if (self.seconds <= 0 or self.warmup < 0 or self.in_flight < 1 or self.read_entries < 1
                or self.tail_samples < 1 or self.tail_interval_ms < 0 or self.ledgers < 1):
            raise InvalidArgumentError("need seconds > 0, warmup >= 0, in_flight, read_entries, tail_samples and "
                                       "ledgers >= 1, tail_interval_ms >= 0", **asdict(self))


# --- walkit --------------------------------------------------------------------------------
def _on_ledger(bk: BookKeeper, run: Callable[[LedgerHandle], dict[str, Any]]) -> dict[str, Any]:
    handle = bk.create_ledger(ENSEMBLE, WRITE_QUORUM, ACK_QUORUM)
    result = run(handle)
    handle.close()
    return result


def _walkit_read(reader: BookKeeper, ledger_id: int, meter: Meter) -> dict[str, Any]:
    """The closed ledger opened afresh and read from its first entry to its last."""
    entries = 0
    meter.start()
    with reader.open_ledger(ledger_id, recovery=False) as rh:
        for _entry in rh.read(0, rh.last_add_confirmed):
            entries += 1
    return meter.stop(entries)


def _walkit_tail(writer: BookKeeper, reader: BookKeeper, samples: int, interval: float) -> dict[str, Any]:
    """BenchPeer's ``tail`` on walkit: entries 1..samples added ``interval`` s apart (and
    one more, uncounted); a reader following the ledger; from add returning to it seen."""
    payload, clock = os.urandom(100), time.perf_counter_ns
    lh = writer.create_ledger(ENSEMBLE, WRITE_QUORUM, ACK_QUORUM)
    lh.add_entry(payload)  # entry 0: the reader opens once the ledger has an entry
    seen, acked, failed = [0] * samples, [0] * samples, list[BaseException]()
    rh = reader.open_ledger(lh.ledger_id, recovery=False)

    def follow() -> None:
        try:
            for entry in rh.follow(1, poll_timeout=1.0):
                seen[entry.entry_id - 1] = clock()
                if entry.entry_id == samples:
                    return
        except BaseException as exc:  # noqa: BLE001 - raised again on the benchmark's thread
            failed.append(exc)

    thread = threading.Thread(target=follow, name="bench-bk-tail", daemon=True)
    thread.start()
    for i in range(samples + 1):
        lh.add_entry(payload)
        if i < samples:
            acked[i] = clock()
        time.sleep(interval)
    thread.join(30)
    lh.close()
    rh.close()
    if failed:
        raise failed[0]
    if thread.is_alive():
        raise WalkitError("the tailing reader did not see every entry within 30 s", seen=sum(1 for t in seen if t))
    return {"entries": samples} | latency_percentiles([max(0, s - a) for s, a in zip(seen, acked)])


def _walkit_ledgers(bk: BookKeeper, meter: Meter, w: Workload) -> dict[str, Any]:
    """``w.ledgers`` ledgers created at once, then 100 B adds round-robin over them."""
    started = time.perf_counter()
    handles = create_ledgers(bk, w.ledgers)
    created = time.perf_counter() - started
    payload = os.urandom(LEDGERS_SIZE)
    adds = itertools.cycle([h.add_entry_async for h in handles])
    report, _ = window_loop(lambda: next(adds)(payload), meter, w.warmup, w.seconds, w.in_flight)
    with ThreadPoolExecutor(_CLOSERS, thread_name_prefix="bench-bk-close") as pool:
        list(pool.map(LedgerHandle.close, handles))
    return report | {"ledgers": w.ledgers, "created_per_s": round(w.ledgers / created, 1)}


def _walkit_side(directory: str | None, w: Workload) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with bench_cluster(directory, "bookkeeper", 3) as (cluster, _):
        meter = Meter([cluster.bookie_pid(i) for i in range(3)])
        with cluster.client() as bk, cluster.client() as reader:
            for _pass in range(2):  # the first pass primes the client (uncounted: overwritten)
                for size in SIZES:
                    payload = os.urandom(size)
                    out[f"sequential_{size}"] = _on_ledger(bk, lambda h: sequential(h, payload, meter, w.warmup,
                                                                                       w.seconds))
                    out[f"pipelined_{size}"] = _on_ledger(bk, lambda h: pipelined(h, payload, meter, w.warmup,
                                                                                     w.seconds, w.in_flight))
            warm, _ = write_ledger(bk, min(w.read_entries, READ_WARMUP), READ_SIZE)
            lh, _ = write_ledger(bk, w.read_entries, READ_SIZE)
            _walkit_read(reader, warm.ledger_id, Meter([]))
            out["read"] = _walkit_read(reader, lh.ledger_id, meter)
            out["tail"] = _walkit_tail(bk, reader, w.tail_samples, w.tail_interval_ms / 1000)
            with cluster.client(idle_lac=True) as idle_lac:  # the WriteAheadLog's writers' default
                out["tail_idle_lac"] = _walkit_tail(idle_lac, reader, w.tail_samples, w.tail_interval_ms / 1000)
            out["ledgers"] = _walkit_ledgers(bk, meter, w)
    return out


# --- Apache BookKeeper -----------------------------------------------------------------------
def _java_report(answer: dict[str, Any]) -> dict[str, Any]:
    """A BenchPeer answer in the shape of :class:`Meter`'s report (and latency percentiles);
    the machine's other work is counted from the peer's readings of ``/proc/stat``."""
    tick = os.sysconf("SC_CLK_TCK")
    entries, elapsed = int(answer["entries"]), answer["elapsed_ns"] / 1e9
    per = max(entries, 1)
    report = {"seconds": round(elapsed, 3), "entries": entries, "entries_per_s": round(entries / elapsed),
              "client_cpu_us_per_entry": round(answer["client_ticks"] / tick / per * 1e6, 1),
              "client_cpu_cores": round(answer["client_ticks"] / tick / elapsed, 2),
              "bookie_cpu_us_per_entry": round(answer["bookie_ticks"] / tick / per * 1e6, 1),
              "bookie_cpu_cores": round(answer["bookie_ticks"] / tick / elapsed, 2),
              # everything else that ran on the machine meanwhile, and steal (as Meter reports them)
              "other_cpu_cores": round(max(0, answer["machine_busy_ticks"] - answer["client_ticks"]
                                           - answer["bookie_ticks"]) / tick / elapsed, 2),
              "steal_cores": round(answer["steal_ticks"] / tick / elapsed, 2)}
    if "latencies_ns" in answer:
        report |= latency_percentiles(answer["latencies_ns"])
    return report


def _java_workloads(peer: BenchPeer, pids: list[int], w: Workload) -> dict[str, Any]:
    timed = {"warmup": w.warmup, "seconds": w.seconds, "pids": pids}
    out: dict[str, Any] = {}
    for _pass in range(2):  # the first pass primes the JVM (uncounted: overwritten)
        for size in SIZES:
            out[f"sequential_{size}"] = _java_report(peer.call("sequential", size=size, **timed))
            out[f"pipelined_{size}"] = _java_report(peer.call("pipelined", size=size, in_flight=w.in_flight,
                                                              **timed))
    warm = peer.call("write", size=READ_SIZE, entries=min(w.read_entries, READ_WARMUP))
    written = peer.call("write", size=READ_SIZE, entries=w.read_entries)
    peer.call("read", ledger=warm["ledger"], batch=1000, pids=[])
    out["read"] = _java_report(peer.call("read", ledger=written["ledger"], batch=1000, pids=pids))
    tail = peer.call("tail", samples=w.tail_samples, interval_ms=w.tail_interval_ms)
    out["tail"] = {"entries": tail["entries"]} | latency_percentiles(tail["latencies_ns"])
    answer = peer.call("ledgers", ledgers=w.ledgers, size=LEDGERS_SIZE, in_flight=w.in_flight, **timed)
    out["ledgers"] = _java_report(answer) | {"ledgers": answer["ledgers"],
                                             "created_per_s": round(answer["ledgers"] / (answer["create_ns"] / 1e9), 1)}
    return out


def _java_side(classpath: str, zk_hosts: str, base: Path, name: str, bookie: dict[str, str],
               client: dict[str, Any], w: Workload) -> dict[str, Any]:
    cluster = JavaBookKeeper(classpath, zk_hosts, base, name.replace("_", "-"), 3, bookie)
    try:
        peer = BenchPeer(classpath, cluster.metadata_uri, client, cluster.directory / "peer.log")
        try:
            return _java_workloads(peer, cluster.pids, w)
        finally:
            peer.close()
    finally:
        cluster.stop()


@contextlib.contextmanager
def _base(directory: str | None) -> Iterator[Path]:
    if directory is not None:
        Path(directory).mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="walkit-bench-bookkeeper-", dir=directory or "."))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _bookkeeper_sides(classpath: str, directory: str | None, w: Workload) -> dict[str, Any]:
    from walkit._testing import ZooKeeperServer

    out: dict[str, Any] = {}
    with _base(directory) as base:
        zk = ZooKeeperServer()
        try:
            out["bk_defaults"] = _java_side(classpath, zk.hosts, base, "bk_defaults", {}, {}, w)
            out["bk_tuned"] = _java_side(classpath, zk.hosts, base, "bk_tuned", TUNED_BOOKIE, TUNED_CLIENT, w)
        finally:
            zk.stop()
    return out


# --- the report -------------------------------------------------------------------------------
#: (walkit's workload, BookKeeper's, figure, row label, better: "higher"/"lower", CPU per
#: operation beside it)
ROWS = [
    *((f"sequential_{s}", f"sequential_{s}", f, f"sequential add {s} B: {f[:3]} ms", "lower", f == "p50_ms")
      for s in SIZES for f in ("p50_ms", "p99_ms")),
    *((f"pipelined_{s}", f"pipelined_{s}", "entries_per_s", f"pipelined adds/s, {s} B", "higher", True)
      for s in SIZES),
    ("read", "read", "entries_per_s", f"sequential read entries/s, closed ledger of {READ_SIZE} B entries", "higher",
     True),
    ("tail", "tail", "p50_ms", "tail visibility p50 ms", "lower", False),
    ("tail", "tail", "p99_ms", "tail visibility p99 ms", "lower", False),
    ("tail_idle_lac", "tail", "p50_ms", "tail visibility p50 ms, walkit writer with idle_lac=True", "lower", False),
    ("tail_idle_lac", "tail", "p99_ms", "tail visibility p99 ms, walkit writer with idle_lac=True", "lower", False),
    ("ledgers", "ledgers", "created_per_s", "ledgers created at once: ledgers/s", "higher", False),
    ("ledgers", "ledgers", "entries_per_s", f"ledgers written at once: adds/s, {LEDGERS_SIZE} B", "higher", True),
]


def _rows(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for walkit_workload, bk_workload, figure, label, better, cpu in ROWS:
        row: dict[str, Any] = {"row": label, "workload": {"walkit": walkit_workload, "bookkeeper": bk_workload},
                               "figure": figure, "better": better}
        for system in SYSTEMS:
            phase = results[system][walkit_workload if system == "walkit" else bk_workload]
            row[system] = phase[figure]
            row[f"{system}_client_cpu_us"] = phase["client_cpu_us_per_entry"] if cpu else None
        for system in SYSTEMS[1:]:
            row[f"walkit_over_{system}"] = round(row["walkit"] / row[system], 2) if row[system] else None
        rows.append(row)
    return rows


def run_bookkeeper_bench(directory: str | None = None, workload: Workload | None = None) -> dict[str, Any]:
    """walkit, then BookKeeper with its defaults, then tuned; the report (a dict)."""
    w = workload or Workload()
    w.check()
    classpath = bookkeeper_classpath()  # java/javac/mvn missing: ConfigError before anything starts
    compile_java(PEER_SOURCE, classpath)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    results = {"walkit": _walkit_side(directory, w)} | _bookkeeper_sides(classpath, directory, w)
    return {"started": started, "cpus": os.cpu_count(), "ensemble": ENSEMBLE, "write_quorum": WRITE_QUORUM,
            "ack_quorum": ACK_QUORUM, "workload": asdict(w), "tuned_bookie": TUNED_BOOKIE,
            "tuned_client": TUNED_CLIENT, "results": results, "rows": _rows(results)}


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) or value >= 100 else f"{value}"


def _other_work(results: dict[str, dict[str, Any]]) -> str:
    """The median cores other processes kept busy during each system's timed phases."""
    medians = {system: statistics.median(phase["other_cpu_cores"] for phase in results[system].values()
                                         if "other_cpu_cores" in phase) for system in SYSTEMS}
    return ", ".join(f"{system} {cores}" for system, cores in medians.items())


def format_markdown(report: dict[str, Any]) -> str:
    w = report["workload"]
    lines = [
        f"{report['started']}; 3 bookie processes per system, E={report['ensemble']} Qw={report['write_quorum']} "
        f"Qa={report['ack_quorum']}, {report['cpus']} CPUs; {w['seconds']} s per timed phase after {w['warmup']} s "
        f"warm-up, {w['in_flight']:,} in flight, read of {w['read_entries']:,} entries, {w['tail_samples']} tail "
        f"samples {w['tail_interval_ms']} ms apart, {w['ledgers']:,} ledgers",
        f"BookKeeper tuned: bookies {report['tuned_bookie']}, client {report['tuned_client']}",
        f"other work on the machine during the timed phases (cores, median): {_other_work(report['results'])}",
        "",
        "| row | better | walkit | client µs/op | BK defaults | client µs/op | walkit/BK defaults | BK tuned "
        "| client µs/op | walkit/BK tuned |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        cells = [row["row"], row["better"]]
        for system in SYSTEMS:
            cells += [_cell(row[system]), _cell(row[f"{system}_client_cpu_us"])]
            if system != "walkit":
                cells.append(_cell(row[f"walkit_over_{system}"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
