"""``walkit bench gc``: a bookie's garbage collection and compaction, measured in one run.

What it measures
----------------
**Scan** (issue 15: a GC pass over 1,000,000 ledgers in metadata must take bounded
memory, not memory proportional to the ledgers). For each store - ``local://`` (the
SQLite file) and a real ZooKeeper - and each size N (by default 10,000, 100,000 and
1,000,000), the store holds the metadata of ledgers 0..N-1 in the hierarchical layout.
The benchmark writes the nodes straight into the store, in large transactions, and
grows the same tree from one size to the next (a client would spend a PBKDF2 per
ledger). A bookie's :class:`~bookie.storage.LedgerStorage` on the real disk holds
10,000 ledgers spread over 0..N-1, and one in ten of them has no node (deleted
elsewhere). A :class:`~bookie.gc.GarbageCollector` runs unforced passes, with
``gcMetadataOpRateLimit`` high enough not to matter (reported). In such a pass only
the deleted-ledger step has work: compaction is not due and the over-replication
check waits a day. The report gives:

* the median time of ``repeats`` passes; the metadata calls of a pass (a listing per
  directory of the tree, then a ``sync`` and an ``exists`` per candidate); and the time
  the storage spent deleting the 1,000 ledgers a pass removes (they are put back before
  the next pass);
* from one more pass under :mod:`tracemalloc`, the peak Python memory the pass
  allocated (peak minus the level before it), and how much the process's peak RSS grew
  (``VmHWM``, reset through ``/proc/self/clear_refs``). The RSS figure includes C
  allocations such as SQLite's page cache. It is a lower bound, since freed memory gets
  reused.

A pass reads no listed node: it only checks that its candidates exist. So only the
bookie's ledgers get metadata encoded for their own id. The other nodes hold one valid
encoding of another id, of the same size.

ZooKeeper: ``zk="auto"`` starts Debian's ZooKeeper (the ``zookeeper`` package, as the
tests do) on 127.0.0.1 with a 2 GiB heap when it is installed: 1,000,000 nodes overflow
the default 256 MiB. Without the package, this part is skipped and the report says so.
``zk="HOST:PORT"`` uses that server under a fresh root, and deletes the root at the end.
``zk="none"`` skips ZooKeeper.

**Compaction**. For each rate (``compactionRateByEntries`` at BookKeeper's default of
1,000 entries/s, and unthrottled) and each live fraction (10 %, 30 %, 50 %), the
benchmark starts a fresh cluster of three bookie processes: 8 MiB entry logs, a
checkpoint every second so that rolled logs are sealed quickly, and no automatic GC
pass. Ten ledgers (E=Qw=3, Qa=2) get ``volume_mib`` MiB of 1 KiB entries round robin
(``unthrottled_volume_mib`` for the unthrottled rate, so that its compaction lasts long
enough to time the writer's adds during it), so every entry log holds a tenth of each.
The fraction's share of the ten is kept and the rest deleted. A forced pass without
compaction then removes the deleted ledgers from the bookies. After that, a writer (a
ledger of its own, sequential 1 KiB adds, each add timed) runs for ``seconds`` with
nothing else going on ("idle"). It keeps running while every bookie runs a forced major
compaction (ADMIN ``gc.run``, as ``walkit bookie gc --compact major`` does), and stops
when all three passes have ended. Reported: the live fraction of the sealed logs after
the deletes and when compaction starts (the writer's entries may have sealed one more
log, part dead case data, part live writes, which is compacted too); per bookie, the
bytes copied divided by the pass's seconds (median of the three); the add latency
p50 / p99 / p99.9 of both windows side by side; and the CPU of the bookies and the
machine's steal in each window.

Everything goes into a ``walkit-bench-gc-*`` directory under ``directory``, which is
removed at the end, also after an error or Ctrl-C; the ZooKeeper it started is stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc as python_gc
import os
import shutil
import statistics
import tempfile
import time
import tracemalloc
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bookie import BookieConfig
from bookie.fs.real import RealFS
from bookie.gc import GarbageCollector
from bookie.storage import LedgerStorage
from walkit.bench._common import Meter, figure, mib
from walkit.bench._gc_compaction import RATES, compaction_table, run_compaction
from walkit.errors import InvalidArgumentError
from walkit.metadata import (
    Create,
    Delete,
    LedgerManager,
    LedgerMetadata,
    LocalMetadataStore,
    MetadataStore,
    Op,
    init_cluster,
    ledger_path,
    ledger_path_prefixes,
    open_metadata_store,
)

__all__ = ["run_gc_bench", "format_markdown", "scan_sizes"]

MiB = 1 << 20
# --- scan
BOOKIE_LEDGERS = 10_000  # ledgers the bookie holds
DELETED_EVERY = 10  # one bookie ledger in ten has no metadata
SCAN_RATE_LIMIT = 10_000_000  # gcMetadataOpRateLimit for the scan: far above what a pass asks
ZK_HEAP = "-Xmx2g"  # the ZooKeeper this benchmark starts: 1 M nodes need more than 256 MiB
ZK_BATCH, LOCAL_BATCH = 1_000, 10_000  # ops per transaction (ZooKeeper: under its 1 MiB request limit)
ENSEMBLE = ("bench-bookie", "127.0.0.2:3181", "127.0.0.3:3181")
# --- compaction
LIVE_FRACTIONS = (0.1, 0.3, 0.5)


def scan_sizes(ledgers: int) -> list[int]:
    """The sizes measured for ``ledgers``: it, a tenth and a hundredth of it, those at
    least as large as the bookie's ledger count (so the bookie's side stays the same)."""
    floor = min(ledgers, BOOKIE_LEDGERS)
    return sorted({n for n in (ledgers // 100, ledgers // 10, ledgers) if n >= floor})


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# ======================================================================= scan: stores ==
@dataclass
class _ScanStore:
    """One metadata store holding ledgers 0..populated-1, except ``absent``."""

    name: str
    store: MetadataStore
    manager: LedgerManager
    batch: int
    populated: int = 0
    absent: set[int] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)
    populate_seconds: float = 0.0

    @property
    def root(self) -> str:
        return self.manager.cluster.root


class _NodeData:
    """Node bytes: valid metadata of the ledger for the bookie's ledgers, and one valid
    encoding of ledger 0 (of the same size) for the others, which no pass reads."""

    def __init__(self) -> None:
        self._template = LedgerMetadata.create(0, ENSEMBLE, write_quorum=3, ack_quorum=2, password=b"", ctime=0)
        self._other = self._template.encode()
        self._own: dict[int, bytes] = {}

    def set_bookie_ledgers(self, ids: list[int]) -> None:
        self._own = {i: dataclasses.replace(self._template, ledger_id=i).encode() for i in ids}

    def __call__(self, ledger_id: int) -> bytes:
        return self._own.get(ledger_id, self._other)


def _commit(store: MetadataStore, ops: list[Op], batch: int) -> None:
    for at in range(0, len(ops), batch):
        store.transaction(ops[at:at + batch])


def _grow(s: _ScanStore, n: int, absent: set[int], data: _NodeData) -> None:
    """Make ``s`` hold ledgers 0..n-1 except ``absent``: new nodes, absent ones brought
    back, newly absent ones deleted. Directories first, in order, so that node batches
    never miss a parent."""
    t0 = time.perf_counter()
    new_ids = [i for i in range(s.populated, n) if i not in absent]
    back = sorted(i for i in s.absent - absent if i < s.populated)
    gone = sorted(i for i in absent if i < s.populated and i not in s.absent)
    dirs: list[Op] = []
    last_parent = ""
    for i in new_ids:
        parent = ledger_path(s.root, i).rsplit("/", 1)[0]
        if parent != last_parent:
            last_parent = parent
            for p in ledger_path_prefixes(s.root, i):
                if p not in s.dirs:
                    s.dirs.add(p)
                    dirs.append(Create(p))
    _commit(s.store, dirs, s.batch)
    nodes: list[Op] = [Create(ledger_path(s.root, i), data(i)) for i in [*new_ids, *back]]
    nodes += [Delete(ledger_path(s.root, i)) for i in gone]
    _commit(s.store, nodes, s.batch)
    s.populated, s.absent = max(n, s.populated), set(absent)
    s.populate_seconds += time.perf_counter() - t0


def _drop(s: _ScanStore) -> None:
    """Delete everything this benchmark put into a store it did not start."""
    ops: list[Op] = [Delete(ledger_path(s.root, i)) for i in range(s.populated) if i not in s.absent]
    ops += [Delete(d) for d in sorted(s.dirs, key=lambda d: -d.count("/"))]
    _commit(s.store, ops, s.batch)
    s.store.delete(s.root, recursive=True)


def _start_zookeeper() -> tuple[Any, str]:
    """Debian's ZooKeeper on 127.0.0.1 with a bigger heap (the JVM reads
    ``_JAVA_OPTIONS`` after its command line); its ``hosts``."""
    from walkit._testing import ZooKeeperServer

    saved = os.environ.get("_JAVA_OPTIONS")
    os.environ["_JAVA_OPTIONS"] = ZK_HEAP
    try:
        server = ZooKeeperServer()
    finally:
        if saved is None:
            os.environ.pop("_JAVA_OPTIONS", None)
        else:
            os.environ["_JAVA_OPTIONS"] = saved
    return server, server.hosts


@contextlib.contextmanager
def _scan_stores(base: Path, zk: str) -> Iterator[tuple[list[_ScanStore], str | None]]:
    """The stores to scan, and why ZooKeeper is not among them (None if it is)."""
    stores: list[_ScanStore] = []
    local = LocalMetadataStore(str(base / "metadata"), create=True)
    stores.append(_ScanStore("local://", local, LedgerManager(local, init_cluster(local, "/ledgers")), LOCAL_BATCH))
    server: Any = None
    skipped: str | None = None
    try:
        if zk == "auto":
            from walkit._testing import zookeeper_missing

            skipped = zookeeper_missing()
            if skipped is None:
                server, zk = _start_zookeeper()
            else:
                zk = "none"
        elif zk == "none":
            skipped = "ZooKeeper not asked for (--zk none)"
        if zk != "none":
            root = f"/walkit-bench-gc-{uuid.uuid4().hex[:8]}"
            store = open_metadata_store(f"zk://{zk}{root}")
            stores.append(_ScanStore("ZooKeeper", store, LedgerManager(store, init_cluster(store, root)), ZK_BATCH))
        yield stores, skipped
    finally:
        for s in stores:
            with contextlib.suppress(Exception):
                if s.name == "ZooKeeper" and server is None:
                    _drop(s)  # a server we did not start keeps nothing of ours
            s.store.close()
        if server is not None:
            server.stop()


# ==================================================================== scan: a pass ==
class _CountedMetadata:
    """The collector's view of a LedgerManager, counting its calls."""

    def __init__(self, manager: LedgerManager) -> None:
        self._m = manager
        self.calls: Counter[str] = Counter()

    def sync(self) -> None:
        self.calls["sync"] += 1
        self._m.sync()

    def ledger_ranges(self, before_call: Callable[[], object] | None = None) -> Iterator[tuple[int, int, list[int]]]:
        def counted() -> None:
            self.calls["list"] += 1
            if before_call is not None:
                before_call()

        return self._m.ledger_ranges(counted)

    def exists(self, ledger_id: int) -> bool:
        self.calls["exists"] += 1
        return self._m.exists(ledger_id)

    def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        self.calls["read"] += 1
        return self._m.read(ledger_id)


def _bookie_ledgers(n: int) -> tuple[list[int], list[int]]:
    """The bookie's ledgers for ``n`` ledgers in metadata (spread over 0..n-1), and the
    ones among them deleted from the metadata."""
    ids = sorted({k * n // BOOKIE_LEDGERS for k in range(BOOKIE_LEDGERS)})
    return ids, ids[DELETED_EVERY - 1::DELETED_EVERY]


def _add_ledgers(storage: LedgerStorage, ids: list[int]) -> None:
    for i in ids:
        storage.set_master_key(i, b"bench")
        storage.add_entry(i, 0, b"x" * 100)
    storage.flush()


def _status_kib(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _one_pass(storage: LedgerStorage, config: BookieConfig, s: _ScanStore) -> dict[str, Any]:
    metadata = _CountedMetadata(s.manager)
    deleting = [0.0]

    def delete(ledger_id: int) -> None:
        t0 = time.perf_counter()
        storage.delete_ledger(ledger_id)
        deleting[0] += time.perf_counter() - t0

    collector = GarbageCollector(storage, config, ENSEMBLE[0], metadata=metadata, delete_ledger=delete,
                                 disk_usage=lambda _d: 0.1)
    meter = Meter([])
    meter.start()
    t0 = time.perf_counter()
    stats = collector.run_pass(forced=False)
    seconds = time.perf_counter() - t0
    report = meter.stop(stats.ledgers_removed)
    return {"seconds": seconds, "removed": stats.ledgers_removed,
            "delete_seconds": deleting[0], "calls": dict(metadata.calls), "steal_cores": report["steal_cores"],
            "other_cpu_cores": report["other_cpu_cores"],
            "error": collector.status()["last_pass"]["error"]}


def _memory_pass(storage: LedgerStorage, config: BookieConfig, s: _ScanStore) -> dict[str, Any]:
    python_gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        rss_before, rss_reset = _status_kib("VmRSS"), _reset_peak_rss()
        result = _one_pass(storage, config, s)
        peak = tracemalloc.get_traced_memory()[1] - before
        rss_growth = max(0, _status_kib("VmHWM") - rss_before) if rss_reset else None
    finally:
        tracemalloc.stop()
    return {"peak_python_mib": mib(peak), "removed": result["removed"],
            "peak_rss_growth_mib": None if rss_growth is None else mib(rss_growth * 1024)}


def _scan_case(storage: LedgerStorage, config: BookieConfig, s: _ScanStore, n: int, deleted: list[int],
               repeats: int) -> dict[str, Any]:
    passes = []
    for k in range(repeats):
        if k:
            _add_ledgers(storage, deleted)
        passes.append(_one_pass(storage, config, s))
    _add_ledgers(storage, deleted)
    memory = _memory_pass(storage, config, s)
    _add_ledgers(storage, deleted)  # the next store's passes find them again
    seconds = statistics.median(p["seconds"] for p in passes)
    errors = [p["error"] for p in passes if p["error"]]
    calls = passes[-1]["calls"]
    paced = 1 + calls.get("list", 0) + calls.get("exists", 0)  # the limiter: first sync, listings, candidates
    return {
        "store": s.name, "ledgers": n, "populate_seconds": round(s.populate_seconds, 1),
        "pass_seconds": figure(seconds), "pass_seconds_all": [round(p["seconds"], 3) for p in passes],
        "ledgers_listed_per_s": round(n / seconds), "metadata_calls": calls, "paced_calls": paced,
        "floor_at_default_limit_seconds": round(paced / BookieConfig.gc_metadata_op_rate_limit, 2),
        "bookie_ledgers": len(storage.ledgers()), "deleted": len(deleted),
        "removed": [p["removed"] for p in passes] + [memory["removed"]],
        "storage_delete_seconds": round(statistics.median(p["delete_seconds"] for p in passes), 3),
        "peak_python_mib": memory["peak_python_mib"], "peak_rss_growth_mib": memory["peak_rss_growth_mib"],
        "steal_cores": max(p["steal_cores"] for p in passes), "errors": errors,
        # ZooKeeper's JVM counts here, and whatever else ran on the machine
        "other_cpu_cores": max(p["other_cpu_cores"] for p in passes),
    }


def _run_scan(base: Path, ledgers: int, zk: str, repeats: int) -> dict[str, Any]:
    config = BookieConfig(journal_directory=str(base / "journal"), ledger_directories=[str(base / "scan-storage")],
                          gc_metadata_op_rate_limit=SCAN_RATE_LIMIT)
    data = _NodeData()
    cases: list[dict[str, Any]] = []
    with _scan_stores(base, zk) as (stores, zk_skipped):
        for n in scan_sizes(ledgers):
            ids, deleted = _bookie_ledgers(n)
            data.set_bookie_ledgers(ids)
            for s in stores:
                _grow(s, n, set(deleted), data)
            shutil.rmtree(base / "scan-storage", ignore_errors=True)
            storage = LedgerStorage(RealFS(), config.ledger_directories, entry_log_size_limit=8 * MiB)
            storage.open()
            try:
                _add_ledgers(storage, ids)
                cases += [_scan_case(storage, config, s, n, deleted, repeats) for s in stores]
            finally:
                storage.close()
        shutil.rmtree(base / "scan-storage", ignore_errors=True)
    return {"sizes": scan_sizes(ledgers), "repeats": repeats, "gc_metadata_op_rate_limit": SCAN_RATE_LIMIT,
            "zookeeper_skipped": zk_skipped, "zookeeper_heap": ZK_HEAP if zk == "auto" and not zk_skipped else None,
            "cases": cases, "memory_bounded": _bounded(cases)}


def _bounded(cases: list[dict[str, Any]]) -> dict[str, bool | None]:
    """Per store: the peak at the largest size is within 1.5 x (+1 MiB) of the
    smallest's (None: one size only)."""
    verdict: dict[str, bool | None] = {}
    for name in dict.fromkeys(c["store"] for c in cases):
        mine = sorted((c for c in cases if c["store"] == name), key=lambda c: c["ledgers"])
        verdict[name] = (mine[-1]["peak_python_mib"] <= 1.5 * mine[0]["peak_python_mib"] + 1.0
                         if len(mine) > 1 else None)
    return verdict


# ================================================================ compaction: bookies ==
def _machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "loadavg": [round(v, 2) for v in os.getloadavg()]}


def run_gc_bench(directory: str | None = None, *, ledgers: int = 1_000_000, zk: str = "auto", repeats: int = 3,
                 seconds: float = 5.0, warmup: float = 1.0, volume_mib: int = 32, unthrottled_volume_mib: int = 128,
                 log_mib: int = 8,
                 rates: tuple[str, ...] = tuple(RATES), fractions: tuple[float, ...] = LIVE_FRACTIONS,
                 scan: bool = True, compaction: bool = True) -> dict[str, Any]:
    """Both parts (or the ones asked for) in a fresh directory; the report (a dict)."""
    if ledgers < 1 or repeats < 1 or seconds <= 0 or min(volume_mib, unthrottled_volume_mib, log_mib) < 1 \
            or not set(rates) <= set(RATES) \
            or not all(0 < f < 1 for f in fractions):
        raise InvalidArgumentError("need ledgers >= 1, repeats >= 1, seconds > 0, volume and log MiB >= 1, rates "
                                   "among default/unthrottled, fractions in (0, 1)", ledgers=ledgers, repeats=repeats,
                                   seconds=seconds, volume_mib=volume_mib, log_mib=log_mib, rates=rates)
    if directory is not None:
        Path(directory).mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="walkit-bench-gc-", dir=directory or "."))
    report: dict[str, Any] = {"started": _now(), "machine_before": _machine()}
    whole = Meter([])
    whole.start()
    t0 = time.perf_counter()
    try:
        if scan:
            report["scan"] = _run_scan(base, ledgers, zk, repeats)
        if compaction:
            volumes = {"default": volume_mib, "unthrottled": unthrottled_volume_mib}
            report["compaction"] = run_compaction(base, rates, fractions, volumes, log_mib, seconds, warmup)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    during = whole.stop(0)
    report["machine_after"] = _machine() | {"this_process_cores": during["client_cpu_cores"],
                                            "other_cpu_cores": during["other_cpu_cores"],
                                            "steal_cores": during["steal_cores"]}
    report["total_seconds"] = round(time.perf_counter() - t0, 1)
    return report


# ======================================================================== markdown ==
def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _scan_table(scan: dict[str, Any]) -> list[str]:
    lines = [
        f"Scan: unforced GC pass, {scan['repeats']} timed passes (median) + 1 under tracemalloc; "
        f"gcMetadataOpRateLimit={scan['gc_metadata_op_rate_limit']:,}/s"
        + (f"; ZooKeeper skipped: {scan['zookeeper_skipped']}" if scan["zookeeper_skipped"] else "")
        + (f"; ZooKeeper heap {scan['zookeeper_heap']}" if scan.get("zookeeper_heap") else ""),
        "",
        "| store | ledgers in metadata | populate s (cumulative) | pass s (median) | ledgers listed/s | listings "
        "| sync() + exists() | paced calls (s at 1,000/s) | bookie ledgers / removed | storage deletes s "
        "| peak Python MiB | peak RSS growth MiB | other cores | steal cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in scan["cases"]:
        calls = c["metadata_calls"]
        lines.append(
            f"| {c['store']} | {c['ledgers']:,} | {c['populate_seconds']} | {c['pass_seconds']} "
            f"| {c['ledgers_listed_per_s']:,} | {calls.get('list', 0):,} "
            f"| {calls.get('sync', 0):,} + {calls.get('exists', 0):,} "
            f"| {c['paced_calls']:,} ({c['floor_at_default_limit_seconds']}) "
            f"| {c['bookie_ledgers']:,} / {min(c['removed']):,} | {c['storage_delete_seconds']} "
            f"| {c['peak_python_mib']} | {_fmt(c['peak_rss_growth_mib'])} | {c['other_cpu_cores']} "
            f"| {c['steal_cores']} |")
    words = {True: "yes", False: "**no**", None: "one size only"}
    verdicts = ", ".join(f"{k}: {words[v]}" for k, v in scan["memory_bounded"].items())
    lines += ["", f"Peak memory bounded (largest size within 1.5x + 1 MiB of the smallest): {verdicts}"]
    return lines


def format_markdown(report: dict[str, Any]) -> str:
    m0, m1 = report["machine_before"], report["machine_after"]
    lines = [f"{report['started']}; {m0['cpus']} CPUs; load average before {m0['loadavg']}, after {m1['loadavg']}; "
             f"{report['total_seconds']} s in all; over the run: this process {m1['this_process_cores']} cores, "
             f"everything else (bookies, ZooKeeper, other work) {m1['other_cpu_cores']} cores, "
             f"steal {m1['steal_cores']} cores"]
    if "scan" in report:
        lines += ["", *_scan_table(report["scan"])]
    if "compaction" in report:
        lines += ["", *compaction_table(report["compaction"])]
    return "\n".join(lines)
