"""What the benchmarks of bookie processes share: a cluster of them in a directory of its
own, CPU time from ``/proc`` (this process, the bookies, the rest of the machine), the
in-flight window loop and latency percentiles."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import socket
import sqlite3
import struct
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from walkit._local_cluster import LocalCluster
from walkit._stats import percentile
from walkit.client import BookKeeper, LedgerHandle
from walkit.errors import NotEnoughBookiesError
from walkit.eventloop import describe

T = TypeVar("T")

_SERVING_LOOP = re.compile(r" serving on .*event loop: ([^)]+)\)")

__all__ = ["Meter", "bench_cluster", "cpu_seconds", "event_loops", "free_port", "journals_o_direct", "latency_percentiles", "mib",
           "window_loop"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a process that binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
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


def mib(n: float) -> float:
    """``n`` bytes in MiB, to 2 decimals (a report's figure)."""
    return round(n / (1 << 20), 2)


def figure(seconds: float) -> float:
    """``seconds`` to three significant digits: a phase of a few milliseconds does not read as 0."""
    return float(f"{seconds:.3g}")


class Meter:
    """Wall clock and CPU time (this process, the bookies, the machine) over one phase."""

    def __init__(self, bookie_pids: list[int]) -> None:
        self._pids = bookie_pids
        self._t0 = self._client0 = self._bookies0 = self._busy0 = self._steal0 = 0.0

    def _bookies(self) -> float:
        return sum(cpu_seconds(pid) for pid in self._pids)

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
            "seconds": figure(elapsed), "entries": entries, "entries_per_s": round(entries / elapsed),
            "client_cpu_us_per_entry": round(client / per * 1e6, 1), "client_cpu_cores": round(client / elapsed, 2),
            "bookie_cpu_us_per_entry": round(bookies / per * 1e6, 1), "bookie_cpu_cores": round(bookies / elapsed, 2),
            # everything else that ran on the machine meanwhile (other work, kernel threads), and steal
            "other_cpu_cores": round(max(0.0, busy - client - bookies) / elapsed, 2),
            "steal_cores": round(steal / elapsed, 2),
        }


def create_ledger_waiting(bk: BookKeeper, ensemble: int, write_quorum: int, ack_quorum: int,
                          timeout: float = 60.0) -> LedgerHandle:
    """A new ledger, waiting up to ``timeout`` seconds for enough writable bookies (one
    of a benchmark's bookies may be restarting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return bk.create_ledger(ensemble, write_quorum, ack_quorum)
        except NotEnoughBookiesError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def framed_record(payload: bytes) -> bytes:
    """A record as the local-file baselines keep it: its length (4 bytes, big-endian), then it."""
    return struct.pack(">I", len(payload)) + payload


def sqlite_log(path: Path) -> sqlite3.Connection:
    """The SQLite baselines' database: WAL mode, ``synchronous=FULL``, a table ``log``
    (``seq`` integer key, ``record`` blob), autocommit (``BEGIN`` / ``COMMIT`` by hand)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE log (seq INTEGER PRIMARY KEY, record BLOB NOT NULL)")
    return db


def latency_percentiles(samples_ns: list[int], digits: int = 3) -> dict[str, float]:
    """p50, p99 and p99.9 of latencies in nanoseconds, as milliseconds rounded to ``digits``
    (:func:`walkit._stats.percentile`); all 0.0 when nothing was measured."""
    samples = sorted(samples_ns)  # once: percentile()'s own sort of sorted samples is linear

    def pct(q: float) -> float:
        return round(percentile(samples, q) / 1e6, digits) if samples else 0.0

    return {"p50_ms": pct(0.5), "p99_ms": pct(0.99), "p999_ms": pct(0.999)}


def window_loop(submit: Callable[[], Future[T]], meter: Meter, warmup: float, seconds: float, in_flight: int,
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


def event_loops(cluster: LocalCluster, bookies: int, client: BookKeeper) -> dict[str, Any]:
    """The event loops the client and the bookie processes ran (``WALKIT_EVENT_LOOP``;
    a bookie names its loop in its "serving on" line)."""
    logs = (cluster.data_dir / f"bookie-{i}" / "bookie.log" for i in range(bookies))
    found = (_SERVING_LOOP.findall(path.read_text(errors="replace")) for path in logs)
    return {"client": describe(client.client.loop.loop), "bookies": sorted({seen[-1] if seen else "?" for seen in found})}


def journals_o_direct(cluster: LocalCluster, bookies: int) -> bool:
    """Every bookie's journal on O_DIRECT (a bookie logs when it cannot be)."""
    logs = (cluster.data_dir / f"bookie-{i}" / "bookie.log" for i in range(bookies))
    return all("O_DIRECT is not available" not in path.read_text(errors="replace") for path in logs)


@contextlib.contextmanager
def bench_cluster(directory: str | None, name: str, bookies: int, bookie_options: Mapping[str, Any] | None = None,
                  session_timeout: float = 10.0) -> Iterator[tuple[LocalCluster, Path]]:
    """``bookies`` bookie processes (``bookie_options``, ``session_timeout``: LocalCluster's,
    with its default) in a fresh ``walkit-bench-<name>-*`` directory under
    ``directory`` (created if missing; default: here), and that directory; both go away
    at the end, also on an error or Ctrl-C."""
    if directory is not None:
        Path(directory).mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix=f"walkit-bench-{name}-", dir=directory or "."))
    try:
        cluster = LocalCluster(base / "cluster", bookies, processes=True, bookie_options=bookie_options,
                               session_timeout=session_timeout)
        try:
            yield cluster, base
        finally:
            with contextlib.suppress(Exception):  # a bookie hit by the same Ctrl-C exits on its own
                cluster.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
