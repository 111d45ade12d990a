"""The compaction part of ``walkit bench gc``: a three-bookie cluster whose entry logs are
filled at a given live fraction, a forced compaction pass under a steady writer, and the
pass's MB/s and the writer's add latency around it (the theory of operation is in
:mod:`walkit.bench.gc`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from walkit._local_cluster import LocalCluster
from walkit.bench._common import Meter, figure, latency_percentiles, mib
from walkit.client import BookieClient, BookKeeper, LedgerHandle

__all__ = ["RATES", "compaction_table", "run_compaction"]

MiB = 1 << 20

# --- compaction
RATES = {"default": 1000, "unthrottled": 1_000_000_000}  # compactionRateByEntries
LEDGERS_PER_CASE = 10
ENTRY_SIZE = 1024
FILL_IN_FLIGHT = 1000
PASS_TIMEOUT = 600.0  # seconds a forced pass may take before the benchmark gives up
_POLL = 0.05


async def _admin_all(ports: list[int], command: str, args: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(await BookieClient.connect("127.0.0.1", p)) for p in ports]
        return [await c.admin(command, args) for c in clients]


async def _force_pass(ports: list[int], compact: str | None) -> list[dict[str, Any]]:
    """A forced pass on every bookie at once; their statuses once all have ended."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(await BookieClient.connect("127.0.0.1", p)) for p in ports]
        numbers = [(await c.admin("gc.run", {"compact": compact}))["pass"] for c in clients]
        deadline = time.monotonic() + PASS_TIMEOUT
        while True:
            statuses = [await c.admin("gc.status") for c in clients]
            if all(st["passes"] >= n for st, n in zip(statuses, numbers)):
                return statuses
            if time.monotonic() > deadline:
                raise TimeoutError(f"forced GC passes did not end within {PASS_TIMEOUT} s")
            await asyncio.sleep(_POLL)


def _wait_sealed(ports: list[int], logs: int, timeout: float = 60.0) -> None:
    """Until every bookie has ``logs`` sealed entry logs (a checkpoint after the roll)."""
    deadline = time.monotonic() + timeout
    while min(st["entry_logs"]["count"] for st in asyncio.run(_admin_all(ports, "gc.status"))) < logs:
        if time.monotonic() > deadline:
            raise TimeoutError(f"bookies did not seal {logs} entry logs within {timeout} s")
        time.sleep(0.2)


def _fill(handles: list[LedgerHandle], payload: bytes, entries: int) -> None:
    """``entries`` adds round robin over ``handles``, FILL_IN_FLIGHT in flight."""
    window: deque[Future[int]] = deque()
    for i in range(entries):
        if len(window) >= FILL_IN_FLIGHT:
            window.popleft().result()
        window.append(handles[i % len(handles)].add_entry_async(payload))
    for fut in window:
        fut.result()


class _Writer(threading.Thread):
    """Sequential adds on one ledger until stopped: (start ns, latency ns) of each."""

    def __init__(self, handle: LedgerHandle, payload: bytes) -> None:
        super().__init__(name="bench-gc-writer", daemon=True)
        self._handle, self._payload = handle, payload
        self._stop_event = threading.Event()
        self.samples: list[tuple[int, int]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        clock, add, samples = time.perf_counter_ns, self._handle.add_entry, self.samples
        try:
            while not self._stop_event.is_set():
                t0 = clock()
                add(self._payload)
                samples.append((t0, clock() - t0))
        except BaseException as exc:  # noqa: BLE001 - re-raised by finish()
            self.error = exc

    def finish(self) -> None:
        self._stop_event.set()
        self.join()
        if self.error is not None:
            raise self.error

    def latencies(self, start: int, end: int) -> list[int]:
        return [lat for t0, lat in self.samples if start <= t0 < end]


# ============================================================= compaction: one case ==
@dataclass(frozen=True)
class _Case:
    rate: str
    live: float
    volume_mib: int
    log_mib: int


def _cluster_options(case: _Case) -> dict[str, Any]:
    return {
        "entry_log_size_limit": case.log_mib * MiB, "flush_interval": 1000,  # seal rolled logs within a second
        "gc_wait_time": 24 * 3600 * 1000,  # no pass but the ones asked for
        "compaction_rate_by_entries": RATES[case.rate],
    }


def _prepare(bk: BookKeeper, ports: list[int], case: _Case, payload: bytes) -> dict[str, Any]:
    """Write the case's data, delete the dead share, seal, collect; the bookies' status."""
    handles = [bk.create_ledger(3, 3, 2) for _ in range(LEDGERS_PER_CASE)]
    entries = case.volume_mib * MiB // ENTRY_SIZE
    t0 = time.perf_counter()
    _fill(handles, payload, entries)
    fill_seconds = time.perf_counter() - t0
    for h in handles:
        h.close()
    keep = max(1, round(case.live * LEDGERS_PER_CASE))
    for h in handles[keep:]:
        bk.delete_ledger(h.ledger_id)
    _wait_sealed(ports, max(1, case.volume_mib // case.log_mib))
    statuses = asyncio.run(_force_pass(ports, None))
    logs = [st["entry_logs"] for st in statuses]
    return {"fill_entries_per_s": round(entries / fill_seconds),
            "ledgers_removed": [st["last_pass"]["ledgers_removed"] for st in statuses],
            "sealed_mib": statistics.median(mib(lg["total_bytes"]) for lg in logs),
            "live_fraction": statistics.median(lg["live_fraction"] or 0.0 for lg in logs)}


def _window(writer: _Writer, meter_report: dict[str, Any], start: int, end: int) -> dict[str, Any]:
    lat = writer.latencies(start, end)
    return {"adds": len(lat), "seconds": round((end - start) / 1e9, 2), **latency_percentiles(lat),
            "bookie_cpu_cores": meter_report["bookie_cpu_cores"], "steal_cores": meter_report["steal_cores"],
            "other_cpu_cores": meter_report["other_cpu_cores"]}


def _measure_case(cluster: LocalCluster, case: _Case, seconds: float, warmup: float) -> dict[str, Any]:
    ports = [cluster.bookie_address(i)[1] for i in range(3)]
    payload = os.urandom(ENTRY_SIZE)
    meter = Meter([cluster.bookie_pid(i) for i in range(3)])
    with cluster.client(max_pending_adds=FILL_IN_FLIGHT) as bk:
        prepared = _prepare(bk, ports, case, payload)
        writer = _Writer(bk.create_ledger(3, 3, 2), payload)
        writer.start()
        try:
            time.sleep(warmup)
            idle_start = time.perf_counter_ns()
            meter.start()
            time.sleep(seconds)
            idle = meter.stop(0)
            before = asyncio.run(_admin_all(ports, "gc.status"))
            busy_start = time.perf_counter_ns()
            meter.start()
            statuses = asyncio.run(_force_pass(ports, "major"))
            busy = meter.stop(0)
            busy_end = time.perf_counter_ns()
        finally:
            writer.finish()
    passes = [st["last_pass"] for st in statuses]
    return {
        "rate": case.rate, "compaction_rate_by_entries": RATES[case.rate], "live_target": case.live,
        "volume_mib": case.volume_mib, **prepared,
        # the writer's own entries may have sealed one more log (part dead case data, part live writes)
        "live_fraction_at_start": statistics.median(st["entry_logs"]["live_fraction"] or 0.0 for st in before),
        "compaction": _compaction_figures(passes),
        "idle": _window(writer, idle, idle_start, busy_start),
        "compacting": _window(writer, busy, busy_start, busy_end),
    }


def _compaction_figures(passes: list[dict[str, Any]]) -> dict[str, Any]:
    def rate(key: str) -> list[float]:
        return [p[key] / p["seconds"] / 1e6 if p["seconds"] > 0 else 0.0 for p in passes]

    per_bookie = rate("bytes_copied")
    return {
        "mb_per_s_per_bookie": round(statistics.median(per_bookie), 1),
        "mb_per_s_each": [round(v, 1) for v in per_bookie],
        # entry-log bytes the pass got through (read, live part copied, file removed) per second
        "log_mb_per_s_per_bookie": round(statistics.median(rate("bytes_reclaimed")), 1),
        "pass_seconds": figure(statistics.median(p["seconds"] for p in passes)),
        "copied_mib": round(sum(p["bytes_copied"] for p in passes) / MiB, 1),
        "reclaimed_mib": round(sum(p["bytes_reclaimed"] for p in passes) / MiB, 1),
        "logs_compacted": sum(p["entry_logs_compacted"] for p in passes),
        "cut_short": sorted({r for p in passes for r in p["cut_short"]}),
        "errors": [p["error"] for p in passes if p["error"]],
    }


def run_compaction(base: Path, rates: tuple[str, ...], fractions: tuple[float, ...], volumes: dict[str, int],
                    log_mib: int, seconds: float, warmup: float) -> dict[str, Any]:
    results = []
    for rate in rates:
        for live in fractions:
            case = _Case(rate, live, volumes[rate], log_mib)
            where = base / f"compaction-{rate}-{int(live * 100)}"
            cluster = LocalCluster(where, 3, processes=True, bookie_options=_cluster_options(case))
            try:
                results.append(_measure_case(cluster, case, seconds, warmup))
            finally:
                with contextlib.suppress(Exception):
                    cluster.stop()
                shutil.rmtree(where, ignore_errors=True)
    return {"bookies": 3, "entry_size": ENTRY_SIZE, "entry_log_mib": log_mib, "volume_mib_per_bookie": volumes,
            "ledgers_per_case": LEDGERS_PER_CASE, "idle_seconds": seconds, "cases": results}


# ======================================================================== the run ==


def compaction_table(comp: dict[str, Any]) -> list[str]:
    lines = [
        f"Compaction: {comp['bookies']} bookie processes, {comp['entry_log_mib']} MiB entry logs, "
        f"{comp['entry_size']} B entries, forced major compaction; writer: sequential adds (E=Qw=3, Qa=2), "
        f"idle window {comp['idle_seconds']} s",
        "",
        "| compactionRateByEntries | MiB written per bookie | live: target / after deletes / at start "
        "| MB/s rewritten per bookie | log MB/s per bookie | logs compacted (3 bookies) | MiB copied (3 bookies) "
        "| pass s | adds idle / compacting | p50 ms idle / compacting | p99 ms idle / compacting "
        "| p99.9 ms idle / compacting | bookie cores idle / compacting | other cores idle / compacting "
        "| steal cores idle / compacting |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in comp["cases"]:
        i, b, f = c["idle"], c["compacting"], c["compaction"]
        rate = f"{c['compaction_rate_by_entries']:,}/s ({c['rate']})"
        lines.append(
            f"| {rate} | {c['volume_mib']} | {c['live_target']:.0%} / {c['live_fraction']:.0%} / "
            f"{c['live_fraction_at_start']:.0%} | {f['mb_per_s_per_bookie']} | {f['log_mb_per_s_per_bookie']} "
            f"| {f['logs_compacted']} "
            f"| {f['copied_mib']} | {f['pass_seconds']} | {i['adds']:,} / {b['adds']:,} "
            f"| {i['p50_ms']} / {b['p50_ms']} | {i['p99_ms']} / {b['p99_ms']} | {i['p999_ms']} / {b['p999_ms']} "
            f"| {i['bookie_cpu_cores']} / {b['bookie_cpu_cores']} | {i['other_cpu_cores']} / {b['other_cpu_cores']} "
            f"| {i['steal_cores']} / {b['steal_cores']} |")
    notes = [f"{c['rate']} {c['live_target']:.0%}: {'; '.join(why)}" for c in comp["cases"]
             if (why := c["compaction"]["cut_short"] + c["compaction"]["errors"])]
    return lines + ([""] + [f"- {n}" for n in notes] if notes else [])
