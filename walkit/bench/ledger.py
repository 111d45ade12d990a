"""``walkit bench ledger``: the ledger client's add path, end to end, on one machine.

What it measures
----------------
A :class:`~walkit.LocalCluster` of ``bookies`` bookie processes (``python -m bookie``,
journals on O_DIRECT as the bookie default) under a temporary directory, and one
:class:`~walkit.BookKeeper` client in this process writing ``size``-byte entries to a
ledger of E=3, Qw=3, Qa=2 (every entry goes to the three bookies and completes on the
second acknowledgement). Two phases, each on a ledger of its own, each after a warm-up
of ``warmup`` seconds in the same mode that is not counted:

* **sequential**: one ``add_entry`` at a time - the latency an application waiting for
  each add sees (p50 / p99 / p99.9) and the adds per second that gives;
* **pipelined**: ``add_entry_async`` keeping ``in_flight`` futures outstanding. Futures
  complete in entry order, so the producer waits on the oldest, then collects every
  later one already done and refills the window. Latency is from submission until the
  producer sees the future done.

For both phases the report has the CPU time of this process (``time.process_time``:
the producer, the client's loop thread, its metadata thread) and of the bookie
processes (user + system from ``/proc/<pid>/stat``, summed over the bookies), per
entry and in cores, and what else kept the machine busy meanwhile (``/proc/stat``:
other processes' cores, and the hypervisor's steal), since the machines this runs on
are often shared. Targets (issue: ledger client): sequential p50 <= 1 ms and
p99 <= 3 ms; pipelined >= 25,000 entries/s.

The cluster and its directory are removed at the end, also after an error or Ctrl-C.
"""

from __future__ import annotations

import datetime
import functools
import os
import time
from collections.abc import Callable
from typing import Any

from walkit._local_cluster import LocalCluster
from walkit.bench._common import (Meter, bench_cluster, event_loops, journals_o_direct, latency_percentiles,
                                  window_loop)
from walkit.client import BookKeeper, LedgerHandle
from walkit.errors import InvalidArgumentError

__all__ = ["run_ledger_bench", "format_markdown", "pipelined", "sequential", "TARGETS"]

ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 2
TARGETS = {"sequential_p50_ms": 1.0, "sequential_p99_ms": 3.0, "pipelined_entries_per_s": 25_000}


def sequential(handle: LedgerHandle, payload: bytes, meter: Meter, warmup: float, seconds: float) -> dict[str, Any]:
    """One add at a time: ``warmup`` seconds uncounted, then ``seconds`` counted."""
    clock, add = time.perf_counter_ns, handle.add_entry
    counting_at = clock() + int(warmup * 1e9)
    while clock() < counting_at:
        add(payload)
    latencies: list[int] = []
    meter.start()
    until = clock() + int(seconds * 1e9)
    while (start := clock()) < until:
        add(payload)
        latencies.append(clock() - start)
    return meter.stop(len(latencies)) | latency_percentiles(latencies)


def pipelined(handle: LedgerHandle, payload: bytes, meter: Meter, warmup: float, seconds: float,
               in_flight: int) -> dict[str, Any]:
    report, latencies = window_loop(functools.partial(handle.add_entry_async, payload), meter, warmup, seconds,
                                    in_flight)
    return report | latency_percentiles(latencies) | {"in_flight": in_flight}


def _phase(bk: BookKeeper, run: Callable[[LedgerHandle], dict[str, Any]]) -> dict[str, Any]:
    """``run`` on a ledger of its own, closed afterwards (after an error the client's
    close drops it: waiting for its adds could outlast the bookies)."""
    handle = bk.create_ledger(ENSEMBLE, WRITE_QUORUM, ACK_QUORUM)
    result = run(handle)
    handle.close()
    return result


def _checks(sequential: dict[str, Any], pipelined: dict[str, Any]) -> dict[str, bool]:
    return {
        "sequential_p50_met": sequential["p50_ms"] <= TARGETS["sequential_p50_ms"],
        "sequential_p99_met": sequential["p99_ms"] <= TARGETS["sequential_p99_ms"],
        "pipelined_rate_met": pipelined["entries_per_s"] >= TARGETS["pipelined_entries_per_s"],
    }


def _measure(cluster: LocalCluster, bookies: int, seconds: float, in_flight: int, size: int,
             warmup: float) -> dict[str, Any]:
    meter = Meter([cluster.bookie_pid(i) for i in range(bookies)])
    payload = os.urandom(size)
    bk: BookKeeper = cluster.client(max_pending_adds=max(in_flight, 1))
    with bk:
        one_at_a_time = _phase(bk, lambda h: sequential(h, payload, meter, warmup, seconds))
        windowed = _phase(bk, lambda h: pipelined(h, payload, meter, warmup, seconds, in_flight))
        loops = event_loops(cluster, bookies, bk)
    return {"sequential": one_at_a_time, "pipelined": windowed, "event_loop": loops}


def run_ledger_bench(directory: str | None = None, seconds: float = 5.0, in_flight: int = 1000, size: int = 1024,
                     bookies: int = 3, warmup: float = 1.0) -> dict[str, Any]:
    """Both phases on a fresh cluster of ``bookies`` bookie processes; the report (a dict)."""
    if bookies < ENSEMBLE or in_flight < 1 or size < 0 or seconds <= 0:
        raise InvalidArgumentError(f"need bookies >= {ENSEMBLE}, in_flight >= 1, size >= 0, seconds > 0",
                                   bookies=bookies, in_flight=in_flight, size=size, seconds=seconds)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    with bench_cluster(directory, "ledger", bookies) as (cluster, _):
        result = _measure(cluster, bookies, seconds, in_flight, size, warmup)
        o_direct = journals_o_direct(cluster, bookies)
    return {
        "started": started, "cpus": os.cpu_count(), "bookies": bookies, "ensemble": ENSEMBLE,
        "write_quorum": WRITE_QUORUM, "ack_quorum": ACK_QUORUM, "entry_size": size, "journal_o_direct": o_direct,
        **result, "targets": TARGETS, "checks": _checks(result["sequential"], result["pipelined"]),
    }


def _row(name: str, r: dict[str, Any], size: int, target: str) -> str:
    return (f"| {name} | {r['entries']:,} | {r['entries_per_s']:,} | {r['entries_per_s'] * size / 1e6:.1f} "
            f"| {r['p50_ms']} | {r['p99_ms']} | {r['p999_ms']} | {r['client_cpu_us_per_entry']} "
            f"| {r['client_cpu_cores']} | {r['bookie_cpu_us_per_entry']} | {r['bookie_cpu_cores']} "
            f"| {r['other_cpu_cores']} | {r['steal_cores']} | {target} |")


def format_markdown(report: dict[str, Any]) -> str:
    seq, pipe, checks, size = report["sequential"], report["pipelined"], report["checks"], report["entry_size"]

    def met(ok: bool) -> str:
        return "met" if ok else "**missed**"

    seq_target = (f"p50 <= {TARGETS['sequential_p50_ms']} ms: {met(checks['sequential_p50_met'])}; "
                  f"p99 <= {TARGETS['sequential_p99_ms']} ms: {met(checks['sequential_p99_met'])}")
    pipe_target = f">= {TARGETS['pipelined_entries_per_s']:,} entries/s: {met(checks['pipelined_rate_met'])}"
    return "\n".join([
        f"{report['started']}; {report['bookies']} bookie processes, E={report['ensemble']} "
        f"Qw={report['write_quorum']} Qa={report['ack_quorum']}, {size} B entries, journal O_DIRECT: "
        f"{report['journal_o_direct']}, event loops: client {report['event_loop']['client']}, bookies "
        f"{'/'.join(report['event_loop']['bookies'])}, {report['cpus']} CPUs",
        "",
        "| phase | entries | entries/s | MB/s | p50 ms | p99 ms | p99.9 ms | client CPU µs/entry | client cores "
        "| bookies CPU µs/entry | bookies cores | other cores | steal cores | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        _row("sequential (1 add at a time)", seq, size, seq_target),
        _row(f"pipelined ({pipe['in_flight']:,} in flight)", pipe, size, pipe_target),
    ])
