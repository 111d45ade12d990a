"""``walkit bench scale``: what the data already stored costs - add throughput, bookie
memory, restart, ledger recovery and WAL failover, each as a curve against the number of
ledgers, entries, bytes or segments (issue "Performance, second round", "Cost as the
data grows").

What it measures
----------------
Clusters of three bookie processes (:class:`~walkit.LocalCluster`, one after the other,
each under a temporary directory of its own), ledgers of E=3 Qw=3 Qa=2, so every bookie
holds everything. The bookies checkpoint every ``checkpoint_interval`` s (default 10 s,
BookKeeper's ``flushInterval``; walkit's own default is 60 s) so that a throughput window
spans checkpoints - whose index writes are per ledger -, a memory sample waits little
for one, and a crash leaves at most that much journal to replay. One row per size:

* **memory** (cluster ``ledgers``): each bookie's RSS (``VmRSS`` in
  ``/proc/<pid>/status``) empty, then holding N ledgers and M entries of 100 B in all, N
  and M at 1/100, 1/10 and all of ``ledgers`` and ``entries`` (the entries round-robin
  over the ledgers, a window of adds in flight). A sample is taken after the second
  checkpoint that followed the last add (that one surely began after it: the entries
  are in the index files, none in the pending map). Per row: the mean RSS, and bytes of
  RSS per ledger above the empty bookie's, overall and since the row before (marginal).
  The index is on disk: what may grow per ledger is the ledger's in-memory state. (The
  case's time includes creating the ledgers.)
* **throughput** (the same cluster, afterwards, so on a store that holds those ledgers):
  1 KiB adds round-robin over the first 1, 100, 1,000, 10,000 (up to ``concurrent``) of
  its ledgers, ``in_flight`` outstanding as in ``walkit bench ledger``'s pipelined case,
  ``seconds`` counted after 1 s of warm-up: entries/s, and its ratio to the one-ledger
  rate (target: >= 0.8 at 10,000 ledgers). Rows of 20 s by default: long enough for the
  bookies' checkpoints (every ``flushEntriesThreshold`` entries) to be part of each row -
  shorter rows measure the start of a run (over 5 s rows, 10,000 ledgers ran at 0.50 of
  one; over 20 s, at 0.30-0.39).
* **checkpoint** (no cluster; :mod:`walkit.bench._checkpoint`): one checkpoint of a
  bookie's ledger storage against the ledgers it touches, 1 up to ``concurrent`` by
  decades, ``10 * concurrent`` entries of 100 B each: wall and CPU time, with the index
  file of every touched ledger written, and with the slot log (one record per ledger in
  one file; the merge that empties it now and then is timed on its own).
* **restart** (cluster ``restart``): bookie 0 restarted with 0, 1/100, 1/10 and all of
  ``gib`` GiB stored (1 MiB entries, each step in a ledger of its own, closed). First a
  crash: SIGKILL right after the step's last add, so the start replays the journal from
  the last checkpoint; once the killed bookie's registration has expired (reported on
  its own: that is ``session_timeout``, not the bookie) it is started again, timed from
  the launch until it serves (its log says so). Then graceful: SIGTERM (the stop
  checkpoints; timed) and a start that replays nothing. Entries replayed come from the
  bookie's log. Target: bounded by the checkpoint, not by the data stored.
* **recovery** (cluster ``open``): a ledger of L entries of 100 B left open by its
  writer, for L from 1,000 by tens to ``max_ledger_entries``: the LAC the bookies know
  (an open without recovery), then ``open_ledger(id, recovery=True)`` timed; the
  unconfirmed tail it read back and closed is its last entry minus that LAC. The writer
  adds all but the last 100 entries and waits for them, then sends those 100 together
  (none carries another's LAC, unless an acknowledgement overtakes the sending: the
  tail is measured), so the tail is the same at every length; then, at the
  shortest length, tails of 1, 10, 100 and 1,000 are recovered the same way. Target:
  flat in L, linear only in the tail.
* **WAL failover** (the same cluster): a log whose every append rolls a segment
  (``roll_bytes=1``), grown to 1, 10, 100, ... ``segments`` segments; at each size
  another client opens it for writing while the previous writer is still open (claim
  the epoch, fence and recover the last two segments, start a segment): the median,
  min and max of ``_OPENS`` such opens. Then the same against 0, 1, 10, ...
  ``snapshots`` snapshots taken (a log keeps its latest one only).

Creating a ledger derives its password's hash (PBKDF2; so does every open) - slow
enough that ledgers are created by ``_CREATORS`` threads; the creation rate seen is
reported beside the curves, and so is the WAL's roll rate. Every row and every case
carries its wall time and the CPU of this process, of the bookies (followed across
restarts: the reaped ones count through ``RUSAGE_CHILDREN``) and of the rest of the
machine (:class:`~walkit.bench._common.Meter`).

Full size (issue): ``ledgers=100_000, entries=10_000_000, concurrent=10_000, gib=10,
max_ledger_entries=10_000_000, segments=1000``; the defaults are a tenth or less of the
stored sizes so that a run takes about ten minutes on two cores. The full 10 GiB needs
up to about 70 GB of disk (three copies, and each bookie keeps ``journalMaxBackups``
journal files of up to 2 GiB behind its checkpoint). ``cases`` runs some of the cases
only. Everything is removed at the end, also after an error or Ctrl-C.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import itertools
import os
import re
import resource
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bookie.journal import MARK_FILE  # written anew (tmp, rename) by every checkpoint
from walkit._local_cluster import LocalCluster
from walkit.bench._checkpoint import checkpoint_rows
from walkit.bench._common import (
    Meter,
    bench_cluster,
    cpu_seconds,
    create_ledger_waiting,
    latency_percentiles,
    window_loop,
)
from walkit.bench._scale_tables import (
    checkpoint_table,
    memory_table,
    recovery_table,
    restart_table,
    throughput_table,
    wal_table,
)
from walkit.client import BookKeeper, LedgerHandle
from walkit.errors import InvalidArgumentError, WalkitError
from walkit.metadata import Cluster, connect
from walkit.wal import WriteAheadLog

__all__ = ["run_scale_bench", "format_markdown", "create_ledgers", "CASES", "TARGETS"]

BOOKIES, ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 3, 2
CASES = ("memory", "throughput", "checkpoint", "restart", "recovery", "wal")
TARGETS = {"throughput_ratio_at_10000_ledgers": 0.8}
SMALL, THROUGHPUT_SIZE, LARGE = 100, 1024, 1 << 20  # entry bytes: counted cases, throughput, stored bytes
_SMALL_WINDOW, _LARGE_WINDOW = 2000, 16  # adds in flight while filling
_CREATORS = 8  # threads creating ledgers (the client runs 4 metadata calls at a time)
_OPENS = 3  # WAL failovers per row
_TAIL = 100  # unconfirmed entries at the end of the ledgers recovered against their length
_WARMUP = 1.0  # seconds of each throughput row not counted
_REPLAYED = re.compile(r"replayed (\d+) records \((\d+) entries\)")
_POLL = 0.1
_TIMEOUT = 600.0  # a checkpoint, a registration expiry or a bookie start not seen by then fails the run


# --- sizes ------------------------------------------------------------------------------
def _decades(top: int, lowest: int) -> list[int]:
    """``top``, a tenth of it, a hundredth... down to ``lowest`` (at least 1), ascending."""
    points = {top // 10**k for k in range(12) if top // 10**k >= max(lowest, 1)}
    return sorted(points or {top})


def _concurrency_points(top: int) -> list[int]:
    return sorted({n for n in (1, 100, 1000, 10_000) if n < top} | {top})


def _memory_points(ledgers: int, entries: int) -> list[tuple[int, int]]:
    """(N, M) at 1/100, 1/10 and all of the sizes; M at least N (an entry per ledger)."""
    points = {(max(1, ledgers // d), max(1, ledgers // d, entries // d)) for d in (100, 10, 1)}
    return sorted(points)


# --- measuring ----------------------------------------------------------------------------
class _ClusterMeter(Meter):
    """A :class:`Meter` over a cluster's bookies that follows them across restarts: the
    running ones' CPU from ``/proc``, plus what the reaped ones used (they are this
    process's children, and the only ones it has)."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__([])
        self._cluster = cluster

    def _bookies(self) -> float:
        running = [self._cluster.bookie_pid(i) for i in range(len(self._cluster.bookie_ids))
                   if self._cluster.is_running(i)]
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        return sum(cpu_seconds(pid) for pid in running) + reaped.ru_utime + reaped.ru_stime


def _cpu(report: dict[str, Any]) -> dict[str, Any]:
    """A meter's report as wall seconds and CPU seconds (for operations, not entries)."""
    seconds = report["seconds"]
    return {"seconds": seconds, "client_cpu_s": round(report["client_cpu_cores"] * seconds, 2),
            "bookie_cpu_s": round(report["bookie_cpu_cores"] * seconds, 2),
            "other_cpu_cores": report["other_cpu_cores"], "steal_cores": report["steal_cores"]}


@contextlib.contextmanager
def _case(meter: Meter, out: dict[str, Any], name: str) -> Iterator[dict[str, Any]]:
    """The case's dict in ``out``, and its wall time and CPU under ``total`` once done."""
    case: dict[str, Any] = {}
    meter.start()
    yield case
    out[name] = case | {"total": _cpu(meter.stop(0))}


def _rss(pid: int) -> int:
    """Resident bytes of process ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise WalkitError("no VmRSS in /proc status", pid=pid)


def _wait(condition: Callable[[], bool], what: str, **context: object) -> None:
    deadline = time.monotonic() + _TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise WalkitError(f"timed out waiting for {what}", **context)
        time.sleep(_POLL)


def _await_checkpoints(cluster: LocalCluster, count: int = 2) -> None:
    """Until every bookie has written its mark ``count`` more times."""
    marks = [cluster.data_dir / f"bookie-{i}" / "ledgers" / MARK_FILE for i in range(BOOKIES)]

    def stamp(path: Path) -> tuple[int, int] | None:
        with contextlib.suppress(FileNotFoundError):
            st = path.stat()
            return st.st_ino, st.st_mtime_ns
        return None

    seen, changes = [stamp(p) for p in marks], [0] * len(marks)

    def done() -> bool:
        for i, path in enumerate(marks):
            now = stamp(path)
            if now != seen[i]:
                seen[i], changes[i] = now, changes[i] + 1
        return min(changes) >= count

    _wait(done, "the bookies' checkpoints", count=count)


# --- writing ------------------------------------------------------------------------------
def create_ledgers(bk: BookKeeper, count: int) -> list[LedgerHandle]:
    """``count`` ledgers created by ``_CREATORS`` threads (queued ones dropped on an error)."""
    pool = ThreadPoolExecutor(_CREATORS, thread_name_prefix="bench-create")
    try:
        futures = [pool.submit(_create_one, bk) for _ in range(count)]
        return [fut.result() for fut in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _create_one(bk: BookKeeper) -> LedgerHandle:
    return create_ledger_waiting(bk, ENSEMBLE, WRITE_QUORUM, ACK_QUORUM)


def _fill(handles: Sequence[LedgerHandle], count: int, payload: bytes, window: int) -> None:
    """``count`` adds of ``payload`` round-robin over ``handles``, ``window`` in flight."""
    pending: collections.deque[Future[int]] = collections.deque()
    adds = itertools.cycle([h.add_entry_async for h in handles])
    for _ in range(count):
        if len(pending) >= window:
            pending.popleft().result()
        pending.append(next(adds)(payload))
    for fut in pending:
        fut.result()


def _timed_fill(meter: Meter, handles: Sequence[LedgerHandle], count: int, payload: bytes,
                window: int) -> dict[str, Any] | None:
    """:func:`_fill`, timed (None when there is nothing to add)."""
    if count <= 0:
        return None
    meter.start()
    _fill(handles, count, payload, window)
    report = meter.stop(count)
    return _cpu(report) | {"entries": count, "entries_per_s": report["entries_per_s"],
                           "mb_per_s": round(count * len(payload) / 1e6 / max(report["seconds"], 0.01), 1)}


# --- memory and throughput -------------------------------------------------------------------
class _Ledgers:
    """The ledgers of the memory and throughput cases, created as they are needed."""

    def __init__(self, bk: BookKeeper) -> None:
        self.bk = bk
        self.handles: list[LedgerHandle] = []
        self.created_seconds = 0.0

    def at_least(self, count: int) -> list[LedgerHandle]:
        missing = count - len(self.handles)
        if missing > 0:
            started = time.perf_counter()
            self.handles += create_ledgers(self.bk, missing)
            self.created_seconds += time.perf_counter() - started
        return self.handles[:count]

    def creation(self) -> dict[str, Any]:
        n, took = len(self.handles), self.created_seconds
        return {"ledgers": n, "seconds": round(took, 2), "per_s": round(n / took, 1) if took else 0.0,
                "threads": _CREATORS}


def _bookie_rss(cluster: LocalCluster) -> list[int]:
    return [_rss(cluster.bookie_pid(i)) for i in range(BOOKIES)]


def _memory(cluster: LocalCluster, ledgers: _Ledgers, meter: Meter, points: list[tuple[int, int]]) -> dict[str, Any]:
    empty = statistics.mean(_bookie_rss(cluster))
    rows: list[dict[str, Any]] = []
    payload, stored, before = os.urandom(SMALL), 0, (0, empty)
    for n, m in points:
        handles = ledgers.at_least(n)
        fill = _timed_fill(meter, handles, m - stored, payload, _SMALL_WINDOW)
        stored = m
        _await_checkpoints(cluster)
        rss = _bookie_rss(cluster)
        mean = statistics.mean(rss)
        marginal = round((mean - before[1]) / (n - before[0])) if n > before[0] else None
        rows.append({"ledgers": n, "entries": m, "rss_mib": round(mean / 2**20, 1),
                     "rss_max_mib": round(max(rss) / 2**20, 1), "bytes_per_ledger": round((mean - empty) / n),
                     "marginal_bytes_per_ledger": marginal, "fill": fill})
        before = (n, mean)
    return {"entry_size": SMALL, "empty_rss_mib": round(empty / 2**20, 1), "rows": rows}


def _throughput(ledgers: _Ledgers, meter: Meter, counts: list[int], seconds: float, in_flight: int) -> dict[str, Any]:
    payload, rows = os.urandom(THROUGHPUT_SIZE), list[dict[str, Any]]()
    for count in counts:
        adds = itertools.cycle([h.add_entry_async for h in ledgers.at_least(count)])
        report, latencies = window_loop(lambda: next(adds)(payload), meter, _WARMUP, seconds, in_flight)
        rows.append({"ledgers": count} | report | latency_percentiles(latencies))
    for row in rows:
        row["ratio"] = round(row["entries_per_s"] / max(rows[0]["entries_per_s"], 1), 3)
    return {"entry_size": THROUGHPUT_SIZE, "in_flight": in_flight, "seconds": seconds, "rows": rows}


def _ledger_cases(directory: str | None, out: dict[str, Any], cases: Sequence[str], sizes: dict[str, Any]) -> None:
    """Memory, then throughput, on one cluster: the ledgers are created once."""
    with bench_cluster(directory, "scale-ledgers", BOOKIES, _bookie_options(sizes)) as (cluster, _):
        meter = _ClusterMeter(cluster)
        with cluster.client(max_pending_adds=max(sizes["in_flight"], _SMALL_WINDOW)) as bk:
            ledgers = _Ledgers(bk)
            if "memory" in cases:
                with _case(meter, out, "memory") as case:
                    case.update(_memory(cluster, ledgers, _ClusterMeter(cluster),
                                        _memory_points(sizes["ledgers"], sizes["entries"])))
            if "throughput" in cases:
                with _case(meter, out, "throughput") as case:
                    case.update(_throughput(ledgers, _ClusterMeter(cluster), _concurrency_points(sizes["concurrent"]),
                                            sizes["seconds"], sizes["in_flight"]))
            out["creation"] = ledgers.creation()


# --- restart ------------------------------------------------------------------------------------
def _replayed(cluster: LocalCluster, i: int) -> int:
    """Entries bookie ``i`` replayed from its journal at its latest start (its log)."""
    found = _REPLAYED.findall((cluster.data_dir / f"bookie-{i}" / "bookie.log").read_text(errors="replace"))
    return int(found[-1][1]) if found else -1


def _registered(md: Cluster, bookie: str) -> bool:
    bookies = md.bookies()
    return bookie in bookies.writable or bookie in bookies.readonly


def _crash_restart(cluster: LocalCluster, md: Cluster, meter: Meter) -> dict[str, Any]:
    """SIGKILL bookie 0, wait for its registration to expire, start it again."""
    bookie = cluster.bookie_ids[0]
    cluster.kill_bookie(0)
    killed = time.perf_counter()
    _wait(lambda: not _registered(md, bookie), "the killed bookie's registration to expire", bookie=bookie)
    expiry = time.perf_counter() - killed
    meter.start()
    cluster.restart_bookie(0)
    return _cpu(meter.stop(0)) | {"replayed_entries": _replayed(cluster, 0), "expiry_s": round(expiry, 2)}


def _graceful_restart(cluster: LocalCluster, meter: Meter) -> dict[str, Any]:
    meter.start()
    cluster.stop_bookie(0)
    stop = time.perf_counter()
    cluster.restart_bookie(0)
    start = time.perf_counter() - stop
    report = _cpu(meter.stop(0))
    return report | {"stop_seconds": round(report["seconds"] - start, 2), "seconds": round(start, 2),
                     "replayed_entries": _replayed(cluster, 0)}


def _stored_step(bk: BookKeeper, meter: Meter, count: int, payload: bytes) -> dict[str, Any]:
    """A closed ledger of ``count`` entries: how fast it was written, and its ensemble
    changes (0: bookie 0, restarted before, took every entry)."""
    handle = _create_one(bk)
    fill = _timed_fill(meter, [handle], count, payload, _LARGE_WINDOW) or {}
    handle.close()
    return fill | {"ensemble_changes": handle.ensemble_changes}


def _restart(cluster: LocalCluster, gib: float) -> dict[str, Any]:
    meter, payload, stored, rows = _ClusterMeter(cluster), os.urandom(LARGE), 0, []
    top = max(1, round(gib * 2**30 / LARGE))
    with cluster.client(max_pending_adds=_LARGE_WINDOW) as bk, connect(cluster.metadata_uri) as md:
        for target in sorted({round(top * f) for f in (0, 0.01, 0.1, 1)}):
            fill = _stored_step(bk, meter, target - stored, payload) if target > stored else None
            stored = target
            rows.append({"gib": round(stored * LARGE / 2**30, 3), "entries": stored, "fill": fill,
                         "crash": _crash_restart(cluster, md, meter), "graceful": _graceful_restart(cluster, meter)})
    return {"entry_size": LARGE, "rows": rows}


# --- recovery and WAL failover ------------------------------------------------------------------
def _left_open(writer: BookKeeper, length: int, tail: int, payload: bytes) -> tuple[LedgerHandle, dict[str, Any]]:
    """A ledger of ``length`` entries, not closed: all but the last ``tail`` added and
    acknowledged first, then those sent together - none of them carries the LAC of
    another (unless an acknowledgement overtook the sending: the tail is measured)."""
    handle = _create_one(writer)
    started = time.perf_counter()
    _fill([handle], length - tail, payload, _SMALL_WINDOW)
    _fill([handle], tail, payload, tail)
    took = time.perf_counter() - started
    return handle, {"entries": length, "seconds": round(took, 2), "entries_per_s": round(length / took)}


def _recover(reader: BookKeeper, meter: Meter, ledger_id: int) -> dict[str, Any]:
    """The LAC the bookies know (an open without recovery), then a timed recovery."""
    with reader.open_ledger(ledger_id, recovery=False) as peek:
        lac = peek.last_add_confirmed
    meter.start()
    with reader.open_ledger(ledger_id, recovery=True) as recovered:
        report = _cpu(meter.stop(0))
        last = recovered.last_add_confirmed
    return {"lac_before": lac, "last_entry": last, "tail": last - lac} | report


def _recovery(cluster: LocalCluster, meter: Meter, top: int) -> dict[str, Any]:
    """Against the length, the tail the same; against the tail, the length the same."""
    payload = os.urandom(SMALL)
    lengths = _decades(top, min(1000, top // 100))
    tails = [t for t in (1, 10, 100, 1000) if t <= lengths[0]]
    rows, tail_rows = [], []
    # (no idle LAC: the writer leaves its tail unconfirmed, as a writer that crashed does)
    with cluster.client(max_pending_adds=_SMALL_WINDOW, idle_lac=False) as writer, cluster.client() as reader:
        for length in lengths:
            handle, fill = _left_open(writer, length, min(_TAIL, length), payload)
            rows.append({"entries": length, "fill": fill} | _recover(reader, meter, handle.ledger_id))
        for tail in tails:
            handle, fill = _left_open(writer, lengths[0], tail, payload)
            tail_rows.append({"entries": lengths[0], "fill": fill} | _recover(reader, meter, handle.ledger_id))
    return {"entry_size": SMALL, "rows": rows, "tail_rows": tail_rows}


class _Writer:
    """The writer of a log on a client of its own, and how long its open took."""

    def __init__(self, cluster: LocalCluster, name: str, **settings: Any) -> None:
        self.bk = cluster.client()
        try:
            started = time.perf_counter()
            self.wal = WriteAheadLog.open(self.bk, name, ensemble_size=ENSEMBLE, write_quorum=WRITE_QUORUM,
                                          ack_quorum=ACK_QUORUM, **settings)
            self.open_seconds = time.perf_counter() - started
        except BaseException:
            self.bk.close()
            raise

    def close(self) -> None:
        """Close the client (a fenced writer's segment is its successor's to close)."""
        self.bk.close()


def _failovers(cluster: LocalCluster, meter: Meter, name: str, writer: _Writer) -> tuple[dict[str, Any], _Writer]:
    """``_OPENS`` opens for writing, each while the previous writer is still open; the
    row (the CPU is the whole row's: the clients' connections too), and the last writer."""
    times = []
    meter.start()
    for _ in range(_OPENS):
        successor = _Writer(cluster, name)
        times.append(successor.open_seconds)
        writer.close()
        writer = successor
    report = _cpu(meter.stop(0))
    return report | {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3),
                     "max_s": round(max(times), 3)}, writer


def _wal_segments(cluster: LocalCluster, meter: Meter, top: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    writer, rows, rolls, rolling = _Writer(cluster, "scale-segments", roll_bytes=1), [], 0, 0.0
    try:
        for target in _decades(top, 1):
            started = time.perf_counter()
            for _ in range(target - len(writer.wal.metadata().segments)):
                writer.wal.append(b"r")
                writer.wal.flush()  # the roll this append started is done
                rolls += 1
            rolling += time.perf_counter() - started
            segments = len(writer.wal.metadata().segments)
            row, writer = _failovers(cluster, meter, "scale-segments", writer)
            rows.append({"segments": segments} | row)
    finally:
        writer.close()
    return rows, {"rolls": rolls, "seconds": round(rolling, 2), "per_s": round(rolls / rolling, 1) if rolling else 0.0}


def _wal_snapshots(cluster: LocalCluster, meter: Meter, top: int) -> list[dict[str, Any]]:
    writer, rows, taken = _Writer(cluster, "scale-snapshots"), [], 0
    try:
        for target in [0, *_decades(top, 1)] if top else [0]:
            for _ in range(target - taken):
                writer.wal.snapshot(b"state" * 200, writer.wal.append(b"r"))
                taken += 1
            row, writer = _failovers(cluster, meter, "scale-snapshots", writer)
            rows.append({"snapshots": taken} | row)
    finally:
        writer.close()
    return rows


def _open_cases(directory: str | None, out: dict[str, Any], cases: Sequence[str], sizes: dict[str, Any]) -> None:
    with bench_cluster(directory, "scale-open", BOOKIES, _bookie_options(sizes)) as (cluster, _):
        meter = _ClusterMeter(cluster)
        if "recovery" in cases:
            with _case(meter, out, "recovery") as case:
                case.update(_recovery(cluster, _ClusterMeter(cluster), sizes["max_ledger_entries"]))
        if "wal" in cases:
            with _case(meter, out, "wal") as case:
                rows, rolls = _wal_segments(cluster, _ClusterMeter(cluster), sizes["segments"])
                case.update(segments=rows, rolls=rolls,
                            snapshots=_wal_snapshots(cluster, _ClusterMeter(cluster), sizes["snapshots"]))


# --- the run ------------------------------------------------------------------------------------
def _bookie_options(sizes: dict[str, Any]) -> dict[str, Any]:
    return {"flush_interval": round(sizes["checkpoint_interval"] * 1000)}


def _check(cases: Sequence[str], sizes: dict[str, Any]) -> None:
    ints = ("ledgers", "entries", "concurrent", "max_ledger_entries", "segments", "in_flight")
    if (any(not isinstance(sizes[k], int) or sizes[k] < 1 for k in ints) or not sizes["gib"] > 0
            or min(sizes["seconds"], sizes["session_timeout"], sizes["checkpoint_interval"]) <= 0
            or sizes["snapshots"] < 0 or not cases or set(cases) - set(CASES)):
        raise InvalidArgumentError(f"need {', '.join(ints)} >= 1, gib, seconds, session_timeout and "
                                   "checkpoint_interval > 0, "
                                   f"snapshots >= 0, cases among {', '.join(CASES)}",
                                   cases=",".join(cases), **sizes)


def _checks(out: dict[str, Any]) -> dict[str, bool | None]:
    """The throughput target, when 10,000 ledgers (or more) were measured."""
    rows = out.get("throughput", {}).get("rows", [])
    at = [row for row in rows if row["ledgers"] >= 10_000]
    met = at[0]["ratio"] >= TARGETS["throughput_ratio_at_10000_ledgers"] if at else None
    return {"throughput_ratio_met": met}


def run_scale_bench(directory: str | None = None, *, ledgers: int = 10_000, entries: int = 1_000_000,
                    concurrent: int = 10_000, seconds: float = 20.0, in_flight: int = 1000, gib: float = 1.0,
                    max_ledger_entries: int = 100_000, segments: int = 100, snapshots: int = 10,
                    checkpoint_interval: float = 10.0, session_timeout: float = 10.0,
                    cases: Sequence[str] = CASES) -> dict[str, Any]:
    """The cases asked for, on fresh clusters of three bookie processes (checkpoints every
    ``checkpoint_interval`` s, metadata sessions of ``session_timeout`` s); the report (a dict)."""
    sizes = {"ledgers": ledgers, "entries": entries, "concurrent": concurrent, "seconds": seconds,
             "in_flight": in_flight, "gib": gib, "max_ledger_entries": max_ledger_entries, "segments": segments,
             "snapshots": snapshots, "checkpoint_interval": checkpoint_interval, "session_timeout": session_timeout}
    _check(list(cases), sizes)
    cases = [c for c in CASES if c in cases]  # in their order
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    load_before, out = os.getloadavg(), dict[str, Any]()
    if {"memory", "throughput"} & set(cases):
        _ledger_cases(directory, out, cases, sizes)
    if "checkpoint" in cases:
        with _case(Meter([]), out, "checkpoint") as case:
            top = int(sizes["concurrent"])
            case["rows"] = checkpoint_rows(directory, _concurrency_points(top), 10 * top)
            case["entry_size"] = SMALL
    if "restart" in cases:
        with bench_cluster(directory, "scale-restart", BOOKIES, _bookie_options(sizes),
                           sizes["session_timeout"]) as (cluster, _):
            with _case(_ClusterMeter(cluster), out, "restart") as case:
                case.update(_restart(cluster, gib))
    if {"recovery", "wal"} & set(cases):
        _open_cases(directory, out, cases, sizes)
    return {"started": started, "cpus": os.cpu_count(), "loadavg_before": [round(v, 2) for v in load_before],
            "loadavg_after": [round(v, 2) for v in os.getloadavg()], "bookies": BOOKIES, "ensemble": ENSEMBLE,
            "write_quorum": WRITE_QUORUM, "ack_quorum": ACK_QUORUM, "sizes": sizes, "cases": cases, **out,
            "targets": TARGETS, "checks": _checks(out)}


# --- the report as Markdown --------------------------------------------------------------------
def format_markdown(report: dict[str, Any]) -> str:
    lines = [f"{report['started']}; {report['bookies']} bookie processes, E={report['ensemble']} "
             f"Qw={report['write_quorum']} Qa={report['ack_quorum']}, checkpoint every "
             f"{report['sizes']['checkpoint_interval']:g} s, {report['cpus']} CPUs, load average "
             f"{report['loadavg_before'][0]} before / {report['loadavg_after'][0]} after"]
    if "creation" in report:
        c = report["creation"]
        lines.append(f"ledgers created: {c['ledgers']:,} in {c['seconds']} s ({c['per_s']}/s, {c['threads']} threads)")
    met = report["checks"]["throughput_ratio_met"]
    ratio = TARGETS["throughput_ratio_at_10000_ledgers"]
    tables: dict[str, Callable[[dict[str, Any]], list[str]]] = {
        "memory": memory_table, "throughput": lambda case: throughput_table(case, met, ratio),
        "checkpoint": checkpoint_table, "restart": restart_table, "recovery": recovery_table,
        "wal": lambda case: wal_table(case, _OPENS)}
    for name in report["cases"]:
        lines += ["", *tables[name](report[name])]
    lines += ["", "| case | wall s | this process CPU s | bookies CPU s | other cores | steal cores |",
              "|---|---:|---:|---:|---:|---:|"]
    for name in report["cases"]:
        t = report[name]["total"]
        lines.append(f"| {name} | {t['seconds']} | {t['client_cpu_s']} | {t['bookie_cpu_s']} | {t['other_cpu_cores']} "
                     f"| {t['steal_cores']} |")
    return "\n".join(lines)
