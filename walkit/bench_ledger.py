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

import collections
import functools
import contextlib
import datetime
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from walkit._local_cluster import LocalCluster
from walkit.client import BookKeeper, LedgerHandle
from walkit.errors import InvalidArgumentError

T = TypeVar("T")

__all__ = ["run_ledger_bench", "format_markdown", "TARGETS"]

ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 2
TARGETS = {"sequential_p50_ms": 1.0, "sequential_p99_ms": 3.0, "pipelined_entries_per_s": 25_000}


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_seconds() -> tuple[float, float]:
    """CPU seconds the whole machine was busy (user, nice, system, irq, softirq) and
    stolen by the hypervisor, from ``/proc/stat``: how much else ran meanwhile."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


class _Meter:
    """Wall clock and CPU time (this process, the bookies, the machine) over one phase."""

    def __init__(self, bookie_pids: list[int]) -> None:
        self._pids = bookie_pids
        self._t0 = self._client0 = self._bookies0 = self._busy0 = self._steal0 = 0.0

    def _bookies(self) -> float:
        return sum(_cpu_seconds(pid) for pid in self._pids)

    def start(self) -> None:
        self._busy0, self._steal0 = _machine_seconds()
        self._t0, self._client0, self._bookies0 = time.perf_counter(), time.process_time(), self._bookies()

    def stop(self, entries: int) -> dict[str, Any]:
        elapsed = time.perf_counter() - self._t0
        client, bookies = time.process_time() - self._client0, self._bookies() - self._bookies0
        busy, steal = _machine_seconds()
        busy, steal = busy - self._busy0, steal - self._steal0
        per = max(entries, 1)
        return {
            "seconds": round(elapsed, 2), "entries": entries, "entries_per_s": round(entries / elapsed),
            "client_cpu_us_per_entry": round(client / per * 1e6, 1), "client_cpu_cores": round(client / elapsed, 2),
            "bookie_cpu_us_per_entry": round(bookies / per * 1e6, 1), "bookie_cpu_cores": round(bookies / elapsed, 2),
            # everything else that ran on the machine meanwhile (other work, kernel threads), and steal
            "other_cpu_cores": round(max(0.0, busy - client - bookies) / elapsed, 2),
            "steal_cores": round(steal / elapsed, 2),
        }


def _latencies(samples_ns: list[int]) -> dict[str, float]:
    samples = sorted(samples_ns)

    def pct(q: float) -> float:
        return samples[min(len(samples) - 1, int(q * len(samples)))] / 1e6 if samples else 0.0

    return {"p50_ms": round(pct(0.5), 3), "p99_ms": round(pct(0.99), 3), "p999_ms": round(pct(0.999), 3)}


def _sequential(handle: LedgerHandle, payload: bytes, meter: _Meter, warmup: float, seconds: float) -> dict[str, Any]:
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
    return meter.stop(len(latencies)) | _latencies(latencies)


def window_loop(submit: Callable[[], Future[T]], meter: _Meter, warmup: float, seconds: float, in_flight: int,
                on_result: Callable[[T], None] | None = None) -> tuple[dict[str, Any], list[int]]:
    """Keep ``in_flight`` operations outstanding (``submit()`` starts one); the window
    carries over from the warm-up into the counted interval (steady state), and what is
    in flight at its end is drained uncounted. The meter's report and the latencies (ns)
    of the counted operations; ``on_result`` sees each counted result."""
    clock = time.perf_counter_ns
    window: collections.deque[Future[T]] = collections.deque()
    sent_at: collections.deque[int] = collections.deque()  # beside the window: no tuple per operation
    latencies: list[int] = []
    counting_at = clock() + int(warmup * 1e9)
    until, counting = counting_at + int(seconds * 1e9), False
    while (now := clock()) < until:
        if not counting and now >= counting_at:
            counting = True
            meter.start()
        while len(window) < in_flight:
            sent_at.append(clock())
            window.append(submit())
        window[0].result()
        done = clock()
        while window and window[0].done():
            result = window.popleft().result()  # the writer's error, if any
            sent = sent_at.popleft()
            if counting:
                latencies.append(done - sent)
                if on_result is not None:
                    on_result(result)
    report = meter.stop(len(latencies))
    for fut in window:
        fut.result()
    return report, latencies


def _pipelined(handle: LedgerHandle, payload: bytes, meter: _Meter, warmup: float, seconds: float,
               in_flight: int) -> dict[str, Any]:
    report, latencies = window_loop(functools.partial(handle.add_entry_async, payload), meter, warmup, seconds,
                                    in_flight)
    return report | _latencies(latencies) | {"in_flight": in_flight}


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


def _o_direct(cluster: LocalCluster, bookies: int) -> bool:
    """Every bookie's journal on O_DIRECT (a bookie logs when it cannot be)."""
    logs = (cluster.data_dir / f"bookie-{i}" / "bookie.log" for i in range(bookies))
    return all("O_DIRECT is not available" not in path.read_text(errors="replace") for path in logs)


def _measure(cluster: LocalCluster, bookies: int, seconds: float, in_flight: int, size: int,
             warmup: float) -> dict[str, Any]:
    meter = _Meter([cluster.bookie_pid(i) for i in range(bookies)])
    payload = os.urandom(size)
    bk: BookKeeper = cluster.client(max_pending_adds=max(in_flight, 1))
    with bk:
        sequential = _phase(bk, lambda h: _sequential(h, payload, meter, warmup, seconds))
        pipelined = _phase(bk, lambda h: _pipelined(h, payload, meter, warmup, seconds, in_flight))
    return {"sequential": sequential, "pipelined": pipelined}


@contextlib.contextmanager
def bench_cluster(directory: str | None, name: str, bookies: int) -> Iterator[tuple[LocalCluster, Path]]:
    """``bookies`` bookie processes in a fresh ``walkit-bench-<name>-*`` directory under
    ``directory`` (created if missing; default: here), and that directory; both go away
    at the end, also on an error or Ctrl-C."""
    if directory is not None:
        Path(directory).mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix=f"walkit-bench-{name}-", dir=directory or "."))
    try:
        cluster = LocalCluster(base / "cluster", bookies, processes=True)
        try:
            yield cluster, base
        finally:
            with contextlib.suppress(Exception):  # a bookie hit by the same Ctrl-C exits on its own
                cluster.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_ledger_bench(directory: str | None = None, seconds: float = 5.0, in_flight: int = 1000, size: int = 1024,
                     bookies: int = 3, warmup: float = 1.0) -> dict[str, Any]:
    """Both phases on a fresh cluster of ``bookies`` bookie processes; the report (a dict)."""
    if bookies < ENSEMBLE or in_flight < 1 or size < 0 or seconds <= 0:
        raise InvalidArgumentError(f"need bookies >= {ENSEMBLE}, in_flight >= 1, size >= 0, seconds > 0",
                                   bookies=bookies, in_flight=in_flight, size=size, seconds=seconds)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    with bench_cluster(directory, "ledger", bookies) as (cluster, _):
        result = _measure(cluster, bookies, seconds, in_flight, size, warmup)
        o_direct = _o_direct(cluster, bookies)
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
        f"{report['journal_o_direct']}, {report['cpus']} CPUs",
        "",
        "| phase | entries | entries/s | MB/s | p50 ms | p99 ms | p99.9 ms | client CPU µs/entry | client cores "
        "| bookies CPU µs/entry | bookies cores | other cores | steal cores | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        _row("sequential (1 add at a time)", seq, size, seq_target),
        _row(f"pipelined ({pipe['in_flight']:,} in flight)", pipe, size, pipe_target),
    ])
