"""``walkit bench recovery``: how fast a lost bookie's share is put back, with ``walkit
recover`` and with autorecovery, and what a writer sees meanwhile.

What it measures
----------------
A :class:`~walkit.LocalCluster` of five bookie processes under a temporary directory,
every one with its autorecovery daemon (``autoRecoveryDaemonEnabled``,
``lostBookieRecoveryDelay = 0``) switched off by ``underreplication/disable`` until its
phase. ``ledgers`` closed ledgers of E=3, Qw=3, Qa=2 hold ``gib`` GiB of ``entry_size``
entries in total (so each bookie holds about 3/5 of it). One writer thread then appends
1 KiB entries to a ledger of its own, one at a time, timing each, until the end; the
phases are windows of its timeline:

* **idle**: ``seconds`` with nothing else running (once before each recovery);
* **walkit recover**: a bookie outside the writer's ensemble is lost for good (SIGKILL,
  its directories deleted); once its registration has expired (the operator's view:
  the bookie is gone) ``walkit recover --json`` runs as a process of its own, as an
  operator runs it; the window is that process's run;
* **autorecovery**: a new bookie replaces the lost one (five again), the switch is turned
  on, another bookie outside the writer's ensemble is lost the same way; the window runs
  from its registration's expiry until no marker is left and no ledger names it (polled
  every ``_POLL`` s). The time from the SIGKILL (session expiry, the auditor's audit
  included) is reported too.

The lost share is counted from the metadata before each loss (entries the bookie held in
its closed fragments, :func:`walkit.recovery.lost_fragments`); MB/s is that share's bytes over the
window. ``walkit recover`` must report exactly that many entries copied; the daemons'
work is checked by the end state (nothing names the bookie) and the "repaired" lines of
the bookies' logs. Each window carries the writer's adds/s and p50/p99/p99.9/max, and the
CPU of this process, the bookies, ``walkit recover`` (its own process) and everything else
on the machine, with the hypervisor's steal (:class:`~walkit.bench._common.Meter`).

The cluster and its directory are removed at the end, also after an error or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from array import array
from typing import Any

from walkit import aio
from walkit._local_cluster import LocalCluster
from walkit.bench._common import (
    Meter,
    bench_cluster,
    create_ledger_waiting,
    figure,
    journals_o_direct,
    latency_percentiles,
)
from walkit.errors import InvalidArgumentError, NotEnoughBookiesError, WalkitError
from walkit.metadata import Cluster, connect
from walkit.recovery import UnderReplication, count_held, lost_fragments

__all__ = ["run_recovery_bench", "format_markdown"]

BOOKIES, ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 5, 3, 3, 2
WRITER_SIZE = 1024
BOOKIE_OPTIONS = {"auto_recovery_daemon_enabled": True, "lost_bookie_recovery_delay": 0}
_POLL = 0.2  # seconds between looks at markers and registrations
_SCAN_EVERY = 2.0  # seconds between full metadata scans while no marker was seen
_SETTLE = 5.0  # seconds for the auditor's pass over the ledgers when switched on
_LOADING = 16  # ledgers written at once while loading
_TIMEOUT = 3600.0  # a recovery not done by then fails the run
# A bookie starved of CPU long enough loses its session and re-registers: creating a
# ledger waits that long for three writable bookies (seen with a 2 s timeout at load 30).
_REGISTRATION_WAIT = 30.0


# --- the data -------------------------------------------------------------------------------
async def _load_async(uri: str, ledgers: int, entries: int, payload: bytes) -> None:
    slots = asyncio.Semaphore(_LOADING)

    async def create(bk: aio.AsyncBookKeeper) -> aio.AsyncLedgerHandle:
        deadline = time.monotonic() + _REGISTRATION_WAIT
        while True:
            try:
                return await bk.create_ledger(ENSEMBLE, WRITE_QUORUM, ACK_QUORUM)
            except NotEnoughBookiesError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(_POLL)

    async def one(bk: aio.AsyncBookKeeper) -> None:
        async with slots:
            lh = await create(bk)
            await asyncio.gather(*[await lh.add_entry_async(payload) for _ in range(entries)])
            await lh.close()

    async with await aio.connect(uri, max_pending_adds=_LOADING * entries) as bk:
        await asyncio.gather(*(one(bk) for _ in range(ledgers)))


def _load(uri: str, ledgers: int, entries: int, entry_size: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    asyncio.run(_load_async(uri, ledgers, entries, os.urandom(entry_size)))
    seconds = time.perf_counter() - t0
    total = ledgers * entries * entry_size
    return {"ledgers": ledgers, "entries_per_ledger": entries, "bytes": total, "seconds": figure(seconds),
            "mb_per_s": round(total / seconds / 1e6, 1)}


def _shares(md: Cluster, bookies: list[str], entry_size: int) -> dict[str, dict[str, Any]]:
    """What each of ``bookies`` holds in closed fragments: ledgers, fragments, entries, bytes."""
    shares = {b: {"ledgers": 0, "fragments": 0, "entries": 0} for b in bookies}
    for ledger_id in md.ledgers.ledger_ids():
        meta = md.ledgers.read(ledger_id)[0]
        for bookie, share in shares.items():
            works = lost_fragments(meta, bookie)
            share["ledgers"] += bool(works)
            share["fragments"] += len(works)
            share["entries"] += sum(count_held(w) for w in works)
    return {b: share | {"bytes": share["entries"] * entry_size} for b, share in shares.items()}


def _named(md: Cluster, bookie: str) -> bool:
    """Whether any ledger's ensembles name ``bookie``."""
    for ledger_id in md.ledgers.ledger_ids():
        if any(bookie in ensemble for _, ensemble in md.ledgers.read(ledger_id)[0].ensembles):
            return True
    return False


# --- the writer -----------------------------------------------------------------------------
class _Writer:
    """One thread appending ``WRITER_SIZE`` entries one at a time to a ledger of its own;
    each add's start and latency (ns), for windows of its timeline."""

    def __init__(self, cluster: LocalCluster) -> None:
        self._bk = cluster.client()
        try:
            self.handle = create_ledger_waiting(self._bk, ENSEMBLE, WRITE_QUORUM, ACK_QUORUM, _REGISTRATION_WAIT)
        except BaseException:
            self._bk.close()
            raise
        self._starts, self._latencies = array("q"), array("q")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-writer", daemon=True)
        self.error: BaseException | None = None

    @property
    def ensemble(self) -> tuple[str, ...]:
        return tuple(self.handle.metadata.ensembles[-1][1])

    def _run(self) -> None:
        payload, clock, add = os.urandom(WRITER_SIZE), time.perf_counter_ns, self.handle.add_entry
        try:
            while not self._stop.is_set():
                start = clock()
                add(payload)
                self._starts.append(start)
                self._latencies.append(clock() - start)
        except BaseException as exc:  # noqa: BLE001 - reported by window()
            self.error = exc

    def start(self) -> None:
        self._thread.start()

    def window(self, t0: int, t1: int) -> list[int]:
        """Latencies (ns) of the adds started in [t0, t1)."""
        if self.error is not None:
            raise WalkitError("the writer failed") from self.error
        n = len(self._latencies)  # appended second: the starts have as many
        return [self._latencies[i] for i in range(n) if t0 <= self._starts[i] < t1]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(60)
        with contextlib.suppress(WalkitError):
            self.handle.close()
        self._bk.close()


def _phase(writer: _Writer, meter: Meter, t0: int, t1: int, tool_cpu: float = 0.0) -> dict[str, Any]:
    """The writer's adds in [t0, t1) and the meter's report (stopped now, at t1)."""
    latencies = writer.window(t0, t1)
    report = meter.stop(len(latencies))
    elapsed = (t1 - t0) / 1e9
    report["tool_cpu_cores"] = round(tool_cpu / elapsed, 2)
    report["other_cpu_cores"] = round(max(0.0, report["other_cpu_cores"] - report["tool_cpu_cores"]), 2)
    report["max_ms"] = round(max(latencies, default=0) / 1e6, 3)
    return report | latency_percentiles(latencies)


def _meter(cluster: LocalCluster) -> Meter:
    meter = Meter([cluster.bookie_pid(i) for i in range(len(cluster.bookie_ids)) if cluster.is_running(i)])
    meter.start()
    return meter


def _idle(cluster: LocalCluster, writer: _Writer, seconds: float) -> dict[str, Any]:
    meter, t0 = _meter(cluster), time.perf_counter_ns()
    time.sleep(seconds)
    return _phase(writer, meter, t0, time.perf_counter_ns())


# --- losing a bookie ------------------------------------------------------------------------
def _victim(cluster: LocalCluster, md: Cluster, writer: _Writer, auditor: str | None,
            entry_size: int) -> tuple[int, dict[str, Any]]:
    """The running bookie outside the writer's ensemble (its adds see recovery, not an
    ensemble change) holding the most (the auditor last among equals), and its share."""
    ids = cluster.bookie_ids
    candidates = [i for i in range(len(ids)) if cluster.is_running(i) and ids[i] not in writer.ensemble]
    shares = _shares(md, [ids[i] for i in candidates], entry_size)
    i = max(candidates, key=lambda i: (shares[ids[i]]["entries"], ids[i] != auditor))
    return i, shares[ids[i]]


def _lose(cluster: LocalCluster, i: int) -> int:
    """SIGKILL bookie ``i`` and delete its directories; the time (perf_counter_ns)."""
    cluster.kill_bookie(i)
    killed = time.perf_counter_ns()
    shutil.rmtree(cluster.data_dir / f"bookie-{i}", ignore_errors=True)
    return killed


def _wait(condition: Any, what: str, **context: object) -> None:
    deadline = time.monotonic() + _TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise WalkitError(f"timed out waiting for {what}", **context)
        time.sleep(_POLL)


def _registered(md: Cluster, bookie: str) -> bool:
    bookies = md.bookies()
    return bookie in bookies.writable or bookie in bookies.readonly


def _lost(cluster: LocalCluster, md: Cluster, i: int) -> tuple[str, int, int]:
    """Lose bookie ``i``: its id, the kill's and the registration expiry's times."""
    bookie = cluster.bookie_ids[i]
    killed = _lose(cluster, i)
    _wait(lambda: not _registered(md, bookie), "the lost bookie's registration to expire", bookie=bookie)
    return bookie, killed, time.perf_counter_ns()


def _manual(cluster: LocalCluster, md: Cluster, writer: _Writer, entry_size: int) -> dict[str, Any]:
    """Lose a bookie, then ``walkit recover`` it in a process of its own."""
    i, share = _victim(cluster, md, writer, None, entry_size)
    bookie, killed, expired = _lost(cluster, md, i)
    cmd = [sys.executable, "-m", "walkit.cli", "recover", "--metadata", cluster.metadata_uri, "--bookie", bookie,
           "--json"]
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    meter, t0 = _meter(cluster), time.perf_counter_ns()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT)
    t1 = time.perf_counter_ns()
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    tool_cpu = children1.ru_utime + children1.ru_stime - children0.ru_utime - children0.ru_stime
    if done.returncode != 0:
        raise WalkitError("walkit recover failed", code=done.returncode, stderr=done.stderr[-2000:])
    report = json.loads(done.stdout)
    seconds = (t1 - t0) / 1e9
    return {
        "bookie": bookie, "share": share, "expiry_s": round((expired - killed) / 1e9, 2),
        "seconds": figure(seconds), "recover_seconds": report["seconds"],
        "entries_copied": report["entries_copied"], "fragments_replaced": report["fragments_replaced"],
        "failures": len(report["failures"]), "open_ledgers": len(report["open_ledgers"]),
        "mb_per_s": round(share["bytes"] / seconds / 1e6, 1), "tool_cpu_s": round(tool_cpu, 2),
        "writer": _phase(writer, meter, t0, t1, tool_cpu),
    }


def _auto(cluster: LocalCluster, md: Cluster, writer: _Writer, entry_size: int) -> dict[str, Any]:
    """Lose a bookie with the daemons on; wait until nothing is marked or names it."""
    markers = UnderReplication(md.store, md.info)
    auditor = markers.auditor()
    i, share = _victim(cluster, md, writer, auditor, entry_size)
    bookie, killed, expired = _lost(cluster, md, i)
    meter, first_marker, last_scan = _meter(cluster), None, expired

    def repaired() -> bool:
        """No marker left, and (scanned: once markers came and went, or every few
        seconds if none was seen - a full scan competes with the writer) none names it."""
        nonlocal first_marker, last_scan
        now = time.perf_counter_ns()
        if markers.ledgers():
            first_marker = first_marker or now
            return False
        if first_marker is None and now - last_scan < _SCAN_EVERY * 1e9:
            return False
        last_scan = now
        return not _named(md, bookie)

    _wait(repaired, "autorecovery to repair the lost bookie's ledgers", bookie=bookie)
    t1 = time.perf_counter_ns()
    seconds, total = (t1 - expired) / 1e9, (t1 - killed) / 1e9
    return {
        "bookie": bookie, "was_auditor": bookie == auditor, "share": share,
        "expiry_s": round((expired - killed) / 1e9, 2),
        "first_marker_s": round((first_marker - killed) / 1e9, 2) if first_marker else None,
        "seconds": figure(seconds), "seconds_from_kill": round(total, 2),
        "ledgers_repaired_logged": _repaired_in_logs(cluster, bookie),
        "mb_per_s": round(share["bytes"] / seconds / 1e6, 1),
        "mb_per_s_from_kill": round(share["bytes"] / total / 1e6, 1),
        "writer": _phase(writer, meter, expired, t1),
    }


def _repaired_in_logs(cluster: LocalCluster, bookie: str) -> int:
    """Lines "ledger N repaired (<bookie>)" the replication workers logged."""
    logs = (cluster.data_dir / f"bookie-{i}" / "bookie.log" for i in range(len(cluster.bookie_ids)))
    needle = f"repaired ({bookie})"
    return sum(path.read_text(errors="replace").count(needle) for path in logs if path.exists())


# --- the run --------------------------------------------------------------------------------
def _measure(cluster: LocalCluster, seconds: float, gib: float, ledgers: int, entry_size: int) -> dict[str, Any]:
    entries = max(1, round(gib * 2**30 / entry_size / ledgers))
    with connect(cluster.metadata_uri) as md:
        markers = UnderReplication(md.store, md.info)
        markers.set_disabled(True)
        load = _load(cluster.metadata_uri, ledgers, entries, entry_size)
        writer = _Writer(cluster)
        writer.start()
        try:
            idle = _idle(cluster, writer, seconds)
            manual = _manual(cluster, md, writer, entry_size)
            cluster.add_bookie()  # the lost machine replaced: five bookies again
            markers.set_disabled(False)
            time.sleep(_SETTLE)  # the auditor's pass on being switched on stays out of the idle window
            idle_again = _idle(cluster, writer, seconds)
            auto = _auto(cluster, md, writer, entry_size)
        finally:
            writer.close()
    return {"load": load, "idle": idle, "recover": manual, "idle_before_autorecovery": idle_again,
            "autorecovery": auto}


def run_recovery_bench(directory: str | None = None, seconds: float = 10.0, gib: float = 1.0, ledgers: int = 1000,
                       entry_size: int = 64 * 1024, session_timeout: float = 10.0) -> dict[str, Any]:
    """The whole run on a fresh cluster of five bookie processes; the report (a dict)."""
    if seconds <= 0 or gib <= 0 or ledgers < 1 or entry_size < 1 or session_timeout <= 0:
        raise InvalidArgumentError("need seconds, gib, session_timeout > 0 and ledgers, entry_size >= 1",
                                   seconds=seconds, gib=gib, ledgers=ledgers, entry_size=entry_size)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    load_before = os.getloadavg()
    with bench_cluster(directory, "recovery", BOOKIES, BOOKIE_OPTIONS, session_timeout) as (cluster, _):
        o_direct = journals_o_direct(cluster, BOOKIES)  # before any bookie's directory is deleted
        result = _measure(cluster, seconds, gib, ledgers, entry_size)
    return {
        "started": started, "cpus": os.cpu_count(), "loadavg_before": [round(v, 2) for v in load_before],
        "loadavg_after": [round(v, 2) for v in os.getloadavg()], "bookies": BOOKIES, "ensemble": ENSEMBLE,
        "write_quorum": WRITE_QUORUM, "ack_quorum": ACK_QUORUM, "entry_size": entry_size, "gib": gib,
        "writer_entry_size": WRITER_SIZE, "seconds": seconds, "session_timeout": session_timeout,
        "journal_o_direct": o_direct, **result,
    }


# --- the table ------------------------------------------------------------------------------
def _recovery_row(name: str, r: dict[str, Any]) -> str:
    share = r["share"]
    return (f"| {name} | {share['ledgers']:,} | {share['fragments']:,} | {share['entries']:,} "
            f"| {share['bytes'] / 2**20:,.0f} | {r['expiry_s']} | {r['seconds']} | {r['mb_per_s']} |")


def _writer_row(name: str, w: dict[str, Any]) -> str:
    return (f"| {name} | {w['seconds']} | {w['entries']:,} | {w['entries_per_s']:,} | {w['p50_ms']} | {w['p99_ms']} "
            f"| {w['p999_ms']} | {w['max_ms']} | {w['client_cpu_cores']} | {w['bookie_cpu_cores']} "
            f"| {w['tool_cpu_cores']} | {w['other_cpu_cores']} | {w['steal_cores']} |")


def format_markdown(report: dict[str, Any]) -> str:
    load, manual, auto = report["load"], report["recover"], report["autorecovery"]
    return "\n".join([
        f"{report['started']}; {report['bookies']} bookie processes, E={report['ensemble']} "
        f"Qw={report['write_quorum']} Qa={report['ack_quorum']}, {report['cpus']} CPUs, load average "
        f"{report['loadavg_before'][0]} before / {report['loadavg_after'][0]} after, journal O_DIRECT: "
        f"{report['journal_o_direct']}, session timeout {report['session_timeout']} s",
        f"loaded {load['ledgers']:,} ledgers x {load['entries_per_ledger']:,} entries of {report['entry_size']:,} B "
        f"= {load['bytes'] / 2**30:.2f} GiB in {load['seconds']} s ({load['mb_per_s']} MB/s of data, x3 copies)",
        "",
        "| recovery | ledgers | fragments | entries | MiB | registration expired after s | s | MB/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        _recovery_row(f"walkit recover ({manual['entries_copied']:,} entries copied, "
                      f"{manual['failures']} failures)", manual),
        _recovery_row(f"autorecovery ({auto['ledgers_repaired_logged']:,} ledgers repaired in the logs)", auto),
        "",
        f"autorecovery from the SIGKILL: registration expired after {auto['expiry_s']} s, first marker seen after "
        f"{auto['first_marker_s']} s, done after {auto['seconds_from_kill']} s ({auto['mb_per_s_from_kill']} MB/s "
        f"end to end); walkit recover started once the registration expired ({manual['expiry_s']} s), its own report: "
        f"{manual['recover_seconds']} s, process CPU {manual['tool_cpu_s']} s",
        "",
        f"| writer ({report['writer_entry_size']:,} B, 1 add at a time) | s | adds | adds/s | p50 ms | p99 ms "
        "| p99.9 ms | max ms | this process cores | bookies cores | walkit recover cores | other cores | steal cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        _writer_row("idle", report["idle"]),
        _writer_row("during walkit recover", manual["writer"]),
        _writer_row("idle (before autorecovery)", report["idle_before_autorecovery"]),
        _writer_row("during autorecovery", auto["writer"]),
    ])
