"""``walkit bench journal``: the journal against the disk's own floor, in one run.

Measured, in this order, on one directory of the real disk:

* **floor**: one 4 KiB O_DIRECT write + fdatasync per entry into a zero-filled file
  (what a journal without group commit could do at best);
* **raw sequential**: 1 MiB O_DIRECT writes, one fdatasync per write, into a zero-filled
  file (the bandwidth a journal of large batches could reach at best), and the same into
  fallocated space (what appending to new space costs: ext4 converts unwritten extents
  at each fdatasync);
* for each entry size: the journal with **one writer** waiting for each acknowledgement,
  then with **256 entries in flight** (a producer thread that refills as batches are
  acknowledged, woken once per batch): one ``log_entry`` call and callback per entry
  (BookKeeper's ``bkperf journal append``), then **16 entries a call** (``log_entries``,
  one callback per call: how the bookie hands over the adds of a received chunk). The
  journal runs in steady state: it appends into recycled files (64 MiB each, a
  checkpoint after every roll), as a bookie that has been up for a while does.

In CPython the producer holds the interpreter while it refills the window, so a batch's
write + fdatasync does not overlap the framing of the next one: the rate is the window
over (framing + flush), and framing is what the ``bookie._frames`` C code cuts
(``c_framing`` in the report: whether it packed the frames).

Latencies are from submission to acknowledgement. The figures are medians of the run,
so compare them with each other (ratios), not with another day's run.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from bookie.fs import FileSystem
from bookie.fs.real import RealFS
from bookie.journal import C_FRAMING, GroupCommitPolicy, Journal, JournalConfig, LogMark
from walkit.bench._common import latency_percentiles

__all__ = ["BenchResult", "run_journal_bench", "format_markdown"]

SIZES = (100, 1024, 64 * 1024)
IN_FLIGHT = 256
CHUNK = 16  # entries a call in the "as the bookie hands them over" case
BK_DEFAULTS = " (BookKeeper defaults: 2 ms group wait)"
_BENCH_FILE = 64 << 20  # journal file size in the bench: recycling starts early
RAW_NEW_SPACE = "raw sequential into fallocated space (as a journal appends)"


@dataclass
class BenchResult:
    name: str
    entry_size: int
    entries: int
    seconds: float
    entries_per_s: float
    mb_per_s: float
    p50_ms: float
    p99_ms: float
    p999_ms: float


def _result(name: str, size: int, lat_ns: list[int], seconds: float) -> BenchResult:
    n = len(lat_ns)
    return BenchResult(
        name, size, n, round(seconds, 3), round(n / seconds, 1), round(n * size / seconds / 1e6, 2),
        **latency_percentiles(lat_ns),
    )


def _raw_writes(
    fs: FileSystem, directory: str, name: str, block: int, seconds: float, *, zero_filled: bool = True
) -> BenchResult:
    """O_DIRECT writes of ``block`` bytes + fdatasync each, into a zero-filled file (or,
    with ``zero_filled=False``, into fallocated space, as a journal appends)."""
    path = f"{directory}/raw.data"
    f = fs.open(path, create=True, direct=True)
    buf = fs.alloc_buffer(max(block, 1 << 20))
    total = 256 << 20
    try:
        if zero_filled:
            for off in range(0, total, len(buf)):
                f.pwrite(buf.view, off)
        else:
            f.allocate(0, total)
        f.sync()
        buf.view[:block] = os.urandom(block)
        lat: list[int] = []
        pos, start = 0, time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline and pos + block <= total:
            t0 = time.perf_counter_ns()
            f.pwrite(buf.view[:block], pos)
            f.sync()
            lat.append(time.perf_counter_ns() - t0)
            pos += block
        return _result(name, block, lat, time.perf_counter() - start)
    finally:
        buf.close()
        f.close()
        fs.remove(path)


def _journal(fs: FileSystem, directory: str, policy: GroupCommitPolicy | None = None) -> Journal:
    """A journal in steady state: files roll every 64 MiB and each roll is followed by a
    checkpoint (gc with no backups), so the journal appends into recycled files, as a
    bookie that has been running for a while does. Two free files are made first."""
    cfg = JournalConfig(
        directory=directory, policy=policy or GroupCommitPolicy(), max_size=_BENCH_FILE, max_backups=0, recycle_files=2
    )
    _warm_up(fs, cfg)
    j = Journal(fs, cfg)
    j.start()
    rolled = [j.current_journal_id]

    def checkpoint_after_roll(mark: LogMark) -> None:
        if mark.journal_id != rolled[0]:
            rolled[0] = mark.journal_id
            j.gc(mark)

    j.flush_listeners.append(checkpoint_after_roll)
    return j


def _warm_up(fs: FileSystem, cfg: JournalConfig) -> None:
    """Fill and retire enough journal files to leave ``recycle_files`` free ones."""
    j = Journal(fs, cfg)
    j.start()
    chunk = bytes(1 << 20)
    for i in range((cfg.recycle_files + 1) * (cfg.max_size >> 20) + 1):
        j.log_entry(0, i, chunk)
    j.shutdown()
    j.gc(LogMark(j.current_journal_id + 1, 0))


def _one_writer(
    fs: FileSystem, directory: str, size: int, seconds: float, policy: GroupCommitPolicy | None = None, label: str = ""
) -> BenchResult:
    j = _journal(fs, directory, policy)
    payload = os.urandom(size)
    done = threading.Event()
    lat: list[int] = []

    def ack(err: BaseException | None, t0: int) -> None:
        lat.append(time.perf_counter_ns() - t0)
        done.set()

    try:
        start = time.perf_counter()
        deadline = start + seconds
        entry = 0
        while time.perf_counter() < deadline:
            done.clear()
            j.log_entry(1, entry, payload, ack, time.perf_counter_ns())
            done.wait()
            entry += 1
        return _result(f"journal, 1 writer{label}", size, lat, time.perf_counter() - start)
    finally:
        j.shutdown()


def _in_flight(
    fs: FileSystem, directory: str, size: int, seconds: float, policy: GroupCommitPolicy | None = None, label: str = "",
    chunk: int = 1,
) -> BenchResult:
    """``IN_FLIGHT`` entries kept in flight by a producer thread, woken once per batch.
    ``chunk`` 1: one :meth:`Journal.log_entry` per entry, a callback each (BookKeeper's
    ``bkperf journal append``); more: the free slots are handed over ``chunk`` entries at
    a time with :meth:`Journal.log_entries`, one callback per call - what the bookie
    does with the adds of one received chunk. Latency: from the call to its callback."""
    window = IN_FLIGHT
    j = _journal(fs, directory, policy)
    payload = os.urandom(size)
    lat: list[int] = []
    batch_done = threading.Event()
    j.flush_listeners.append(lambda _mark: batch_done.set())
    append, extend, clock = lat.append, lat.extend, time.perf_counter_ns

    def ack(err: BaseException | None, t0: int) -> None:
        append(clock() - t0)

    def ack_chunk(err: BaseException | None, ctx: tuple[int, int]) -> None:
        t0, n = ctx
        extend([clock() - t0] * n)

    try:
        start = time.perf_counter()
        deadline = start + seconds
        submitted = 0
        log_entry, log_entries = j.log_entry, j.log_entries
        while True:
            while submitted - len(lat) >= window:
                batch_done.wait()
                batch_done.clear()
            if submitted % 256 == 0 and time.perf_counter() >= deadline:
                break
            if chunk == 1:
                log_entry(1, submitted, payload, ack, clock())
                submitted += 1
                continue
            n = min(chunk, window - (submitted - len(lat)), 256 - submitted % 256)
            log_entries([(1, e, payload) for e in range(submitted, submitted + n)], ack_chunk, (clock(), n))
            submitted += n
        while len(lat) < submitted:
            batch_done.wait(0.1)
            batch_done.clear()
        name = f"journal, {window} in flight" + (f", {chunk} entries a call" if chunk > 1 else "")
        return _result(name + label, size, lat, time.perf_counter() - start)
    finally:
        j.shutdown()


def _fresh(base: str, name: str) -> str:
    path = os.path.join(base, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def run_journal_bench(directory: str | None = None, seconds: float = 3.0, sizes: tuple[int, ...] = SIZES) -> dict[str, Any]:
    base = directory or tempfile.mkdtemp(prefix="walkit-bench-", dir=os.getcwd())
    os.makedirs(base, exist_ok=True)
    fs = RealFS()
    results: list[BenchResult] = []
    try:
        raw_dir = _fresh(base, "raw")
        results.append(_raw_writes(fs, raw_dir, "floor: 4 KiB O_DIRECT write + fdatasync", 4096, seconds))
        results.append(_raw_writes(fs, raw_dir, "raw sequential: 1 MiB O_DIRECT write + fdatasync", 1 << 20, seconds))
        results.append(
            _raw_writes(fs, raw_dir, RAW_NEW_SPACE, 1 << 20, seconds, zero_filled=False)
        )
        probe = _journal(fs, _fresh(base, "probe"))
        direct = probe.direct
        probe.shutdown()
        for size in sizes:
            results.append(_one_writer(fs, _fresh(base, f"one-{size}"), size, seconds))
            results.append(_in_flight(fs, _fresh(base, f"flight-{size}"), size, seconds))
            results.append(_in_flight(fs, _fresh(base, f"chunks-{size}"), size, seconds, chunk=CHUNK))
        # For comparison: BookKeeper's own default, which waits up to 2 ms to group
        # even when the disk is idle (journalFlushWhenQueueEmpty=false).
        bk = GroupCommitPolicy(flush_when_queue_empty=False)
        results.append(_one_writer(fs, _fresh(base, "bk-one"), 1024, seconds, bk, BK_DEFAULTS))
        results.append(_in_flight(fs, _fresh(base, "bk-flight"), 1024, seconds, bk, BK_DEFAULTS))
    finally:
        if directory is None:
            shutil.rmtree(base, ignore_errors=True)
    return {
        "backend": _backend_name(),
        "o_direct": direct,
        "c_framing": C_FRAMING is not None,
        "seconds_per_case": seconds,
        "results": [asdict(r) for r in results],
        "checks": _checks(results),
    }


def _backend_name() -> str:
    from bookie import native

    return native.BACKEND


def _checks(results: list[BenchResult]) -> dict[str, Any]:
    """The issue's targets, computed from this run's own figures."""
    by = {(r.name, r.entry_size): r for r in results}
    floor = next(r for r in results if r.name.startswith("floor"))
    raw = next(r for r in results if r.name.startswith("raw sequential: "))
    raw_new = next((r for r in results if r.name == RAW_NEW_SPACE), None)
    flight_1k = by.get((f"journal, {IN_FLIGHT} in flight", 1024))
    flight_64k = by.get((f"journal, {IN_FLIGHT} in flight", 64 * 1024))
    chunks_1k = by.get((f"journal, {IN_FLIGHT} in flight, {CHUNK} entries a call", 1024))
    out: dict[str, Any] = {}
    if flight_1k:
        out["1KiB_in_flight_entries_per_s"] = flight_1k.entries_per_s
        out["1KiB_ratio_to_floor"] = round(flight_1k.entries_per_s / floor.entries_per_s, 2)
        out["1KiB_p99_ms"] = flight_1k.p99_ms
        out["1KiB_target_met"] = (
            flight_1k.entries_per_s >= 100_000
            and flight_1k.entries_per_s >= 10 * floor.entries_per_s
            and flight_1k.p99_ms <= 5.0
        )
    # Issue 19: >= 600,000 1 KiB entries/s with 256 in flight (BookKeeper's published raw
    # journal append with fsync): one call per entry, and as the bookie hands entries over.
    if flight_1k:
        out["1KiB_600k_met_one_call_an_entry"] = flight_1k.entries_per_s >= 600_000
    if chunks_1k:
        out[f"1KiB_in_flight_{CHUNK}_a_call_entries_per_s"] = chunks_1k.entries_per_s
        out[f"1KiB_600k_met_{CHUNK}_a_call"] = chunks_1k.entries_per_s >= 600_000
    if flight_64k:
        out["64KiB_fraction_of_raw_bandwidth"] = round(flight_64k.mb_per_s / raw.mb_per_s, 2)
        if raw_new is not None:
            out["64KiB_fraction_of_raw_into_fallocated_space"] = round(flight_64k.mb_per_s / raw_new.mb_per_s, 2)
        out["64KiB_target_met"] = flight_64k.mb_per_s >= 0.6 * raw.mb_per_s
    return out


def format_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"backend: {report['backend']}, O_DIRECT: {report['o_direct']}, frames packed in C: {report['c_framing']}, "
        f"{report['seconds_per_case']} s per case",
        "",
        "| case | entry | entries/s | MB/s | p50 ms | p99 ms | p99.9 ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['name']} | {r['entry_size']} B | {r['entries_per_s']:,.0f} | {r['mb_per_s']:,.1f} | "
            f"{r['p50_ms']} | {r['p99_ms']} | {r['p999_ms']} |"
        )
    lines += ["", "checks: " + json.dumps(report["checks"])]
    return "\n".join(lines)
