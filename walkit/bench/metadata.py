"""``walkit bench metadata``: how fast ledgers and logs come and go - creates, closes,
opens and deletes per second on the embedded store and on a real ZooKeeper, and the
time to open many WriteAheadLogs for writing (issue "Reads as fast as writes": ledger
creation >= 1,000/s with 4 threads; 1,000 logs opened for writing in <= 5 s).

What it measures
----------------
For each store - ``local://`` (the embedded SQLite store, the default) and ZooKeeper
(``zk="auto"`` starts Debian's ``zookeeper`` package on 127.0.0.1 as the tests do,
``zk="HOST:PORT"`` uses that server under a fresh root it deletes at the end,
``zk="none"`` skips it) - a :class:`~walkit.LocalCluster` of three bookie processes
registered in that store (in other processes, as an application meets them: bookies in
the client's own process would share its interpreter lock), and one
:class:`~walkit.BookKeeper` client. ``threads`` threads share the client and split ``ledgers`` ledgers between them; each phase is timed
from the first call to the last answer:

* **create**: ``create_ledger(3, 3, 2, password=...)`` - a ledger id, the metadata
  node (with the password's verifier), no bookie contacted;
* **close**: each handle closed (one compare-and-set of the node; nothing was added);
* **open**: ``open_ledger(id, password, recovery=False)`` of each closed ledger - a read
  of the node and the password check - and its handle closed;
* **delete**: ``delete_ledger(id)``.

Beside them, the same store's own floor in the same run: ``threads`` threads creating,
reading and deleting ``ledgers`` plain nodes of the same size under a scratch path, so
each phase's ratio to it says what walkit adds above the store. The floor's phases also
run once before anything else, as a warm-up, reported apart ("first run"): a ZooKeeper
just started (a JVM still compiling its request path) answers its first thousands of
requests markedly slower than the long-running server an application uses, and the
phases measured first would pay for it alone. Per phase: operations/s,
latency p50 / p99 (ms) and the client process's CPU per operation.

**WriteAheadLog opens** (``logs`` > 0): ``logs`` new logs opened for writing by
``threads`` threads (each open creates the log's node and its first segment ledger),
closed, then all opened for writing again - the failover path: the epoch bumped, the
previous segment recovered and closed (the bookies are asked), a new segment created.

**Password verifier**: the time of one check with ledger metadata version 2's
verifier (HMAC-SHA256) and version 1's (PBKDF2, 100,000 rounds, as every create and
open paid before version 2), measured here, so the figures above can be read against
what they would have cost.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from walkit._local_cluster import LocalCluster
from walkit.bench._common import latency_percentiles
from walkit.client import BookKeeper, LedgerHandle
from walkit.errors import InvalidArgumentError
from walkit.metadata import LedgerMetadata, MetadataStore, open_metadata_store

__all__ = ["run_metadata_bench", "format_markdown", "TARGETS"]

T = TypeVar("T")
PASSWORD = b"bench-password-0123456789abcdef"
TARGETS = {"creates_per_s": 1_000, "wal_opens_seconds_per_1000": 5.0}
ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 2


def _timed(items: Sequence[T], threads: int, call: Callable[[T], Any]) -> tuple[dict[str, Any], list[Any]]:
    """``call(item)`` for every item on ``threads`` threads: the phase's figures and the
    results in item order."""
    latencies: list[int] = [0] * len(items)
    results: list[Any] = [None] * len(items)
    clock = time.perf_counter_ns

    def one(i: int) -> None:
        started = clock()
        results[i] = call(items[i])
        latencies[i] = clock() - started

    cpu0, t0 = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(threads, thread_name_prefix="walkit-bench-md") as pool:
        for fut in [pool.submit(one, i) for i in range(len(items))]:
            fut.result()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    n = max(len(items), 1)
    figures = {"operations": len(items), "seconds": round(elapsed, 3), "per_s": round(len(items) / elapsed),
               "client_cpu_us_per_op": round(cpu / n * 1e6, 1)} | latency_percentiles(latencies)
    return figures, results


def _store_floor(store: MetadataStore, root: str, count: int, threads: int, size: int) -> dict[str, Any]:
    """The store's own create / get / delete of ``count`` nodes of ``size`` bytes."""
    store.create(root, b"")
    parents = [f"{root}/{p:02d}" for p in range(100)]
    for parent in parents:
        store.create(parent, b"")
    paths = [f"{parents[i % 100]}/n{i:08d}" for i in range(count)]
    data = os.urandom(size)
    try:
        create, _ = _timed(paths, threads, lambda p: store.create(p, data))
        get, _ = _timed(paths, threads, store.get)
        delete, _ = _timed(paths, threads, store.delete)
    finally:
        store.delete(root, recursive=True)
    return {"create": create, "get": get, "delete": delete}


def _ledger_phases(bk: BookKeeper, count: int, threads: int) -> dict[str, Any]:
    create, handles = _timed(range(count), threads, lambda _: bk.create_ledger(
        ENSEMBLE, WRITE_QUORUM, ACK_QUORUM, password=PASSWORD))
    ids = [h.ledger_id for h in handles]
    close, _ = _timed(handles, threads, LedgerHandle.close)

    def open_one(ledger_id: int) -> None:
        bk.open_ledger(ledger_id, PASSWORD, recovery=False).close()

    opened, _ = _timed(ids, threads, open_one)
    delete, _ = _timed(ids, threads, bk.delete_ledger)
    return {"create": create, "close": close, "open": opened, "delete": delete}


def _wal_phases(bk: BookKeeper, logs: int, threads: int) -> dict[str, Any]:
    from walkit.wal import WriteAheadLog

    names = [f"bench-{uuid.uuid4().hex[:8]}-{i}" for i in range(logs)]
    lock = threading.Lock()
    opened: list[WriteAheadLog] = []

    def open_one(name: str) -> None:
        log = WriteAheadLog.open(bk, name, namespace="bench", password=PASSWORD, ensemble_size=ENSEMBLE,
                                 write_quorum=WRITE_QUORUM, ack_quorum=ACK_QUORUM)
        with lock:
            opened.append(log)

    def close_all() -> None:
        for log in opened:
            log.close()
        opened.clear()

    try:
        first, _ = _timed(names, threads, open_one)
        close_all()
        again, _ = _timed(names, threads, open_one)
    finally:
        close_all()
    return {"first_open": first, "reopen": again}


def _verifier_cost() -> dict[str, float]:
    salt = os.urandom(16)
    t0 = time.perf_counter()
    for _ in range(10_000):
        LedgerMetadata.hash_password(PASSWORD, salt, 2)
    v2 = max(time.perf_counter() - t0, 1e-9) / 10_000
    t0 = time.perf_counter()
    for i in range(3):  # a fresh salt each: version 1 remembers what it derived
        LedgerMetadata.hash_password(PASSWORD, salt + bytes([i]), 1)
    v1 = (time.perf_counter() - t0) / 3
    return {"v2_us": round(v2 * 1e6, 2), "v1_ms": round(v1 * 1e3, 2), "v1_over_v2": round(v1 / v2)}


@contextlib.contextmanager
def _zookeeper(zk: str) -> Iterator[tuple[str | None, str | None]]:
    """(the ZooKeeper hosts to use or None, why it is skipped or None)."""
    if zk == "none":
        yield None, "ZooKeeper not asked for (--zk none)"
        return
    if zk != "auto":
        yield zk, None
        return
    from walkit._testing import ZooKeeperServer, zookeeper_missing

    missing = zookeeper_missing()
    if missing is not None:
        yield None, missing
        return
    server = ZooKeeperServer()
    try:
        yield server.hosts, None
    finally:
        server.stop()


def _one_store(base: Path, uri: str | None, ledgers: int, logs: int, threads: int) -> dict[str, Any]:
    cluster = LocalCluster(base / "cluster", 3, processes=True, metadata_uri=uri)
    try:
        sample = LedgerMetadata.create(0, tuple(cluster.bookie_ids), write_quorum=3, ack_quorum=2,
                                       password=PASSWORD, ctime=int(time.time() * 1000))
        store = open_metadata_store(cluster.metadata_uri)
        try:
            # the floor's phases once before anything is timed: a freshly started store (a
            # ZooKeeper JVM compiling its request path) answers its first thousands of
            # requests slower than the long-running one an application meets
            cold = _store_floor(store, f"/walkit-bench-warm-{uuid.uuid4().hex[:8]}", ledgers, threads,
                                len(sample.encode()))
            bk = cluster.client()
            try:
                phases = _ledger_phases(bk, ledgers, threads)
                wal = _wal_phases(bk, logs, threads) if logs else None
            finally:
                bk.close()
            floor = _store_floor(store, f"/walkit-bench-floor-{uuid.uuid4().hex[:8]}", ledgers, threads,
                                 len(sample.encode()))
        finally:
            store.close()
    finally:
        cluster.stop()
    ratios = {name: round(phases[name]["per_s"] / floor[base_name]["per_s"], 2)
              for name, base_name in (("create", "create"), ("open", "get"), ("delete", "delete"))}
    return {"ledgers": phases, "store": floor, "store_cold": cold, "vs_store": ratios, "wal": wal}


def run_metadata_bench(directory: str | None = None, *, ledgers: int = 2000, logs: int = 1000, threads: int = 4,
                       zk: str = "auto") -> dict[str, Any]:
    """Every phase on ``local://`` and (unless ``zk`` is "none") ZooKeeper; the report."""
    if ledgers < 1 or logs < 0 or threads < 1:
        raise InvalidArgumentError("need ledgers >= 1, logs >= 0, threads >= 1", ledgers=ledgers, logs=logs,
                                   threads=threads)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    if directory is not None:
        Path(directory).mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="walkit-bench-metadata-", dir=directory or "."))
    stores: dict[str, Any] = {}
    skipped: str | None = None
    try:
        stores["local://"] = _one_store(base / "local", None, ledgers, logs, threads)
        with _zookeeper(zk) as (hosts, skipped):
            if hosts is not None:
                root = f"/walkit-bench-md-{uuid.uuid4().hex[:8]}"
                try:
                    stores["ZooKeeper"] = _one_store(base / "zk", f"zk://{hosts}{root}", ledgers, logs, threads)
                finally:
                    if zk != "auto":  # a server we did not start keeps nothing of ours
                        with contextlib.suppress(Exception):
                            store = open_metadata_store(f"zk://{hosts}")
                            try:
                                store.delete(root, recursive=True)
                            finally:
                                store.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    checks = {f"{name}_creates_met": s["ledgers"]["create"]["per_s"] >= TARGETS["creates_per_s"]
              for name, s in stores.items()}
    for name, s in stores.items():
        if s["wal"] is not None and logs:
            per_1000 = s["wal"]["first_open"]["seconds"] * 1000 / logs
            checks[f"{name}_wal_opens_met"] = per_1000 <= TARGETS["wal_opens_seconds_per_1000"]
    return {"started": started, "cpus": os.cpu_count(), "threads": threads, "ledgers": ledgers, "logs": logs,
            "zookeeper_skipped": skipped, "stores": stores, "verifier": _verifier_cost(), "targets": TARGETS,
            "checks": checks}


def _row(store: str, phase: str, r: dict[str, Any], ratio: str = "") -> str:
    return (f"| {store} | {phase} | {r['operations']:,} | {r['per_s']:,} | {r['p50_ms']} | {r['p99_ms']} "
            f"| {r['client_cpu_us_per_op']} | {ratio} |")


def format_markdown(report: dict[str, Any]) -> str:
    lines = [f"{report['started']}; {report['threads']} threads, {report['ledgers']:,} ledgers, "
             f"{report['logs']:,} logs, {report['cpus']} CPUs"
             + (f"; {report['zookeeper_skipped']}" if report["zookeeper_skipped"] else ""),
             "",
             "| store | phase | operations | per s | p50 ms | p99 ms | client CPU µs/op | vs the store's own |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, s in report["stores"].items():
        for phase, r in s["ledgers"].items():
            ratio = s["vs_store"].get(phase)
            lines.append(_row(name, f"ledger {phase}", r, "" if ratio is None else f"{ratio}"))
        for phase, r in s["store"].items():
            lines.append(_row(name, f"store {phase} (floor)", r))
        for phase, r in s["store_cold"].items():
            lines.append(_row(name, f"store {phase}, first run (warm-up)", r))
        if s["wal"] is not None:
            for phase, r in s["wal"].items():
                lines.append(_row(name, f"WAL {phase.replace('_', ' ')} for writing", r))
    v = report["verifier"]
    lines += ["", f"Password verifier per check: version 2 {v['v2_us']} µs, version 1 (PBKDF2) {v['v1_ms']} ms "
                  f"({v['v1_over_v2']:,}x)."]
    met = ", ".join(f"{k}: {'met' if ok else '**missed**'}" for k, ok in report["checks"].items())
    lines += [f"Targets (creates >= {TARGETS['creates_per_s']:,}/s, 1,000 WAL opens <= "
              f"{TARGETS['wal_opens_seconds_per_1000']} s): {met}."]
    return "\n".join(lines)
