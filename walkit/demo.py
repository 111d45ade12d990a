"""``walkit demo``: a replicated key-value store survives the SIGKILL of its primary.

Theory of operation
-------------------
A :class:`~walkit.LocalCluster` (bookie processes) holds one log, written through the
key-value store of :mod:`walkit.examples.kvstore` (every change logged before it is
applied, snapshots every few thousand changes, failover by snapshot + replay), which is
installed with walkit, so the demo runs from any install. Two acts:

1. **Crash.** A primary in a child process runs random sets and deletes over a key
   space, a few in flight at a time. Before it submits a change it writes the change to
   a pipe to this process (the *intent*); once the change is durable it writes its LSN
   and the latency it measured (the *ack*). Single pipe writes below ``PIPE_BUF`` are
   atomic, so a SIGKILL never leaves half a message, and every change that can be in
   the log was announced. After ``seconds`` the primary gets SIGKILL; a standby (this
   process, already connected) opens the log - fencing the dead primary's segment -
   loads the latest snapshot and replays the records after it. Its state must be
   exactly: the state before + every acknowledged change + a prefix of the announced
   but unacknowledged ones, in order (those may or may not have become durable).
2. **Fencing.** A new primary takes the log over from the standby (and must recover the
   same state), writes for a moment, and is frozen with SIGSTOP - a long GC pause or a
   partition, from the cluster's point of view - in the middle of its stream (at an
   instant when it holds no lock of the shared metadata file: :func:`_freeze_on_sigusr1`). A second
   standby takes over, then the frozen primary is resumed (SIGCONT): its next append
   must raise ``WriterFencedError``, the standby's state must again hold every change
   it acknowledged (even one acknowledged while it was frozen), and nothing it tried
   after the takeover may be in the log.

The report: records, throughput, append latencies measured in the primary (submit to
durable), failover time (SIGKILL to the standby's state rebuilt), the snapshot used,
and every check's PASS or FAIL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import random
import signal
import sys
import threading
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from multiprocessing.connection import Connection
from types import FrameType, ModuleType
from typing import Any

from walkit._stats import percentile
from walkit.errors import UsageError, WalkitError

__all__ = ["run_demo", "format_report", "load_kvstore"]

KEYS = 1000  # the key space of the workload
IN_FLIGHT = 16  # changes the primary keeps in flight
SNAPSHOT_EVERY = 2000  # changes between snapshots
ROLL_BYTES = 256 << 10  # segment size: small, so that truncation shows
FENCE_SECONDS = 1.5  # how long the second primary writes before it is frozen
DELETE_RATIO = 0.2
_STARTUP_TIMEOUT = 60.0  # a child's import and open
_RESUME_TIMEOUT = 30.0  # a resumed primary reports its fencing within this


def load_kvstore() -> ModuleType:
    """:mod:`walkit.examples.kvstore`, the example the demo runs (an ordinary module of the
    package: it is there in every install, and the demo's child processes import it by name)."""
    from walkit.examples import kvstore

    return kvstore


def digest(state: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:16]


# -- the primary (a child process) ------------------------------------------------------------

def _primary(conn: Connection, uri: str, log_name: str, seed: int, quiet: bool) -> None:
    """Open the store, announce its state, then change it until fenced or killed."""
    if quiet:
        logging.getLogger("walkit").setLevel(logging.ERROR)
    from walkit import BookKeeper

    kv = load_kvstore()
    bk = BookKeeper(uri)  # the primary's own client: the freeze takes its metadata store's write lock
    try:
        store = kv.KVStore.open(bk, log_name, snapshot_every=SNAPSHOT_EVERY, roll_bytes=ROLL_BYTES)
    except BaseException:
        bk.close()
        raise
    _freeze_on_sigusr1(bk.client.cluster.store)
    items = store.items()
    conn.send_bytes(b"R" + json.dumps({"pid": os.getpid(), "keys": len(items), "digest": digest(items)}).encode())
    try:
        _workload(conn, kv, store, random.Random(seed))
    except WalkitError as exc:
        conn.send_bytes(b"F" + f"{type(exc).__name__}: {exc}".encode())
    finally:
        with contextlib.suppress(WalkitError):
            store.close()
        with contextlib.suppress(WalkitError):
            bk.close()
        conn.close()


def _freeze_on_sigusr1(metadata_store: object) -> None:
    """SIGUSR1 makes the process SIGSTOP itself, at an instant when it has no metadata
    transaction open.

    The embedded ``local://`` metadata store is one SQLite file shared by every process
    of the cluster; a process frozen inside a write transaction would hold the file's
    lock and stall everyone's metadata until it is resumed (a ZooKeeper client frozen
    mid-request just loses its session). So the freeze takes the lock the store holds
    around each write transaction (``write_lock`` of the client's ``local://`` store;
    another store has none, and needs none) and stops with it held: appends in
    flight, open segment, session and all are frozen as they were; only the SQLite lock
    is free. It takes it on a thread of its own: the handler runs on the main thread,
    which may be inside a transaction, and the lock is re-entrant (taken there, it would
    freeze the process mid-transaction with SQLite's lock held, and every other process's
    metadata call would fail after its busy timeout)."""
    # LocalMetadataStore keeps the lock in its database object; walkit.metadata has no
    # public name for it yet (issue 36: LocalMetadataStore.write_lock, for walkit.metadata)
    db = getattr(metadata_store, "_db", None)
    lock: contextlib.AbstractContextManager[Any] = db.write_lock if db is not None else contextlib.nullcontext()

    def freeze_when_no_transaction() -> None:
        with lock:  # a thread of its own: the lock is re-entrant, and the main thread may be inside one
            os.kill(os.getpid(), signal.SIGSTOP)

    def freeze(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=freeze_when_no_transaction, name="demo-freeze", daemon=True).start()

    signal.signal(signal.SIGUSR1, freeze)


def _workload(conn: Connection, kv: ModuleType, store: Any, rng: random.Random) -> None:
    window: deque[tuple[int, Future[Any], float]] = deque()
    done_at: dict[int, float] = {}
    seq = 0
    while True:
        key = f"k{rng.randrange(KEYS):04d}"
        change = (kv.Change(kv.Op.DELETE, key) if rng.random() < DELETE_RATIO
                  else kv.Change(kv.Op.SET, key, f"v{seq}-{rng.getrandbits(32):08x}"))
        conn.send_bytes(b"I" + change.encode())  # announced before it can reach the log
        started = time.perf_counter()
        fut = store.submit(change)
        fut.add_done_callback(lambda _f, n=seq: done_at.__setitem__(n, time.perf_counter()))
        window.append((seq, fut, started))
        seq += 1
        while len(window) >= IN_FLIGHT or (window and window[0][0] in done_at):
            n, oldest, began = window.popleft()
            lsn = oldest.result()  # WriterFencedError ends the stream
            while (ended := done_at.pop(n, None)) is None:  # done: its callback runs right after
                time.sleep(0)
            conn.send_bytes(b"A" + f"{n} {lsn} {round((ended - began) * 1e9)}".encode())


# -- the parent's view of a primary -------------------------------------------------------------

@dataclasses.dataclass
class _Stream:
    """What a primary told this process: its start, announced and acknowledged changes."""

    ready: dict[str, Any] | None = None
    intents: list[bytes] = dataclasses.field(default_factory=list)
    lsns: list[str] = dataclasses.field(default_factory=list)
    latencies_ns: list[int] = dataclasses.field(default_factory=list)
    fenced: str | None = None
    in_order: bool = True

    def feed(self, message: bytes) -> None:
        kind, body = message[:1], message[1:]
        if kind == b"I":
            self.intents.append(body)
        elif kind == b"A":
            n, lsn, latency = body.decode().split()
            self.in_order &= int(n) == len(self.lsns)
            self.lsns.append(lsn)
            self.latencies_ns.append(int(latency))
        elif kind == b"R":
            self.ready = json.loads(body)
        elif kind == b"F":
            self.fenced = body.decode()

    def drain(self, conn: Connection, timeout: float) -> bool:
        """Read what arrives within ``timeout``; False once the primary is gone (EOF)."""
        deadline = time.monotonic() + timeout
        while conn.poll(max(0.0, deadline - time.monotonic())):
            try:
                self.feed(conn.recv_bytes())
            except EOFError:
                return False
            if time.monotonic() >= deadline:
                break
        return True


class _Child:
    """A primary process and the read end of its pipe."""

    def __init__(self, uri: str, log_name: str, seed: int, quiet: bool) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child_end = ctx.Pipe(duplex=False)
        self.stream = _Stream()
        self.process = ctx.Process(target=_primary, args=(child_end, uri, log_name, seed, quiet), daemon=True,
                                   name="walkit-demo-primary")
        self.process.start()
        child_end.close()  # EOF here once the child is gone

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def wait_ready(self) -> None:
        deadline = time.monotonic() + _STARTUP_TIMEOUT
        while self.stream.ready is None:
            if not self.stream.drain(self.conn, 0.1) or time.monotonic() > deadline:
                raise WalkitError("the demo's primary did not start", exit_code=self.process.exitcode)

    def signal(self, signum: signal.Signals) -> None:
        os.kill(self.pid, signum)

    def freeze(self, timeout: float = 10.0) -> None:
        """SIGUSR1 (the child stops itself, see :func:`_freeze_on_sigusr1`); wait until
        it is stopped."""
        self.signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while _process_state(self.pid) != "T":
            if time.monotonic() > deadline:
                raise WalkitError("the demo's primary did not stop", pid=self.pid, state=_process_state(self.pid))
            time.sleep(0.001)

    def finish(self, timeout: float) -> bool:
        """Read until the primary is gone; False (and SIGKILL) if it outlives ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.stream.drain(self.conn, 0.1):
            if time.monotonic() > deadline:
                self.kill()
                return False
        self.process.join(timeout)
        return True

    def kill(self) -> None:
        if self.process.is_alive():
            self.signal(signal.SIGKILL)  # stopped or not
        self.process.join(10)
        self.conn.close()


def _process_state(pid: int) -> str:
    """The state letter in ``/proc/<pid>/stat`` (T: stopped); "" when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


# -- checks ----------------------------------------------------------------------------------

def unacknowledged_found(kv: ModuleType, before: dict[str, str], stream: _Stream,
                         state: dict[str, str]) -> int | None:
    """How many of the announced but unacknowledged changes ``state`` holds, if it is
    ``before`` + every acknowledged change + a prefix of the rest, in order; None if it
    is no such state."""
    model = dict(before)
    acked = len(stream.lsns)
    for record in stream.intents[:acked]:
        kv.Change.decode(record).apply(model)
    if model == state:
        return 0
    for found, record in enumerate(stream.intents[acked:], 1):
        kv.Change.decode(record).apply(model)
        if model == state:
            return found
    return None


def _lsns_increase(stream: _Stream) -> bool:
    from walkit import LSN

    lsns = [LSN.parse(text) for text in stream.lsns]
    return stream.in_order and all(a < b for a, b in zip(lsns, lsns[1:]))


# -- the two acts ----------------------------------------------------------------------------

@dataclasses.dataclass
class _Checks:
    results: list[tuple[str, bool]] = dataclasses.field(default_factory=list)

    def add(self, name: str, ok: bool) -> bool:
        self.results.append((name, ok))
        return ok


def _crash_act(kv: ModuleType, uri: str, log_name: str, seconds: float, seed: int, progress: bool,
               quiet: bool, checks: _Checks) -> tuple[dict[str, Any], dict[str, str]]:
    """Primary, SIGKILL, standby by snapshot + replay; the act's report and the state."""
    from walkit import BookKeeper

    child = _Child(uri, log_name, seed, quiet)
    try:
        child.wait_ready()
        ran = _run_with_progress(child, seconds, progress)
        with BookKeeper(uri) as bk:  # the standby is connected before the crash
            child.signal(signal.SIGKILL)
            killed = time.monotonic()
            store = kv.KVStore.open(bk, log_name, snapshot_every=SNAPSHOT_EVERY, roll_bytes=ROLL_BYTES)
            failover = time.monotonic() - killed
            state = store.items()
            recovery = store.recovery
            store.close()
        child.finish(_RESUME_TIMEOUT)
    finally:
        child.kill()
    stream = child.stream
    found = unacknowledged_found(kv, {}, stream, state)
    in_flight = len(stream.intents) - len(stream.lsns)
    checks.add(f"standby state = every acknowledged change ({len(stream.lsns)})"
               f" + {found if found is not None else '?'} of {in_flight} unacknowledged, in LSN order",
               found is not None)
    checks.add("acknowledged LSNs increase in submission order", _lsns_increase(stream))
    snapshot = None if recovery.snapshot_lsn is None else {
        "lsn": str(recovery.snapshot_lsn), "bytes": recovery.snapshot_bytes, "replayed_after": recovery.replayed}
    latencies = stream.latencies_ns
    ms = {f"p{p}": round(percentile(latencies, p / 100) / 1e6, 3) if latencies else 0.0 for p in (50, 99, 99.9)}
    report = {"primary_pid": child.pid, "seconds": round(ran, 2), "records": len(stream.lsns),
              "throughput_per_s": round(len(stream.lsns) / ran) if ran else 0,
              "latency_ms": ms,
              "unacknowledged_in_flight": in_flight, "unacknowledged_in_state": found,
              "failover_s": round(failover, 3), "replay_s": round(recovery.seconds, 3), "snapshot": snapshot,
              "keys": len(state)}
    return report, state


def _run_with_progress(child: _Child, seconds: float, progress: bool) -> float:
    """Let the primary write for ``seconds`` (a progress bar on stderr); how long it did."""
    from tqdm import tqdm

    started = time.monotonic()
    with tqdm(total=seconds, disable=not progress, file=sys.stderr, unit="s", desc="primary writing",
              bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.0f} s{postfix}") as bar:
        while time.monotonic() - started < seconds:
            if not child.stream.drain(child.conn, 0.1):
                raise WalkitError("the demo's primary died before it was killed", exit_code=child.process.exitcode)
            acked, elapsed = len(child.stream.lsns), time.monotonic() - started
            bar.n = min(seconds, elapsed)
            bar.set_postfix_str(f"{acked:,} changes acknowledged ({acked / elapsed:,.0f}/s)")
    return time.monotonic() - started


def _fence_act(kv: ModuleType, uri: str, log_name: str, before: dict[str, str], seed: int, quiet: bool,
               checks: _Checks) -> dict[str, Any]:
    """A new primary, frozen mid-stream; a standby takes over; the primary resumes, fenced."""
    from walkit import BookKeeper, WriteAheadLog

    child = _Child(uri, log_name, seed, quiet)
    try:
        child.wait_ready()
        assert child.stream.ready is not None
        checks.add("the new primary recovered the standby's state", child.stream.ready["digest"] == digest(before))
        child.stream.drain(child.conn, FENCE_SECONDS)
        with BookKeeper(uri) as bk:
            child.freeze()
            child.stream.drain(child.conn, 0.05)  # what it wrote before it froze
            frozen_at = len(child.stream.lsns)
            opening = time.monotonic()
            store = kv.KVStore.open(bk, log_name, snapshot_every=SNAPSHOT_EVERY, roll_bytes=ROLL_BYTES)
            takeover = time.monotonic() - opening
            child.signal(signal.SIGCONT)
            exited = child.finish(_RESUME_TIMEOUT)
            state = store.items()
            store.set("demo:new-primary", "writes")
            final = store.items()
            store.close()
            with WriteAheadLog.reader(bk, log_name) as reader:
                in_log, _ = kv.recover(reader)
    finally:
        child.kill()
    stream = child.stream
    found = unacknowledged_found(kv, before, stream, state)
    checks.add(f"resumed primary: next append raised WriterFencedError (got: {stream.fenced or 'nothing'})",
               exited and (stream.fenced or "").startswith("WriterFencedError"))
    checks.add(f"standby state = every change the frozen primary acknowledged ({len(stream.lsns)})"
               f" + {found if found is not None else '?'} unacknowledged", found is not None)
    checks.add("the log holds nothing the fenced primary tried after the takeover", in_log == final)
    return {"primary_pid": child.pid, "records": len(stream.lsns), "acknowledged_before_freeze": frozen_at,
            "acknowledged_after_resume": len(stream.lsns) - frozen_at, "takeover_s": round(takeover, 3),
            "fenced_with": stream.fenced}


# -- the whole demo --------------------------------------------------------------------------

@contextlib.contextmanager
def _data_dir(data: str | None) -> Iterator[str]:
    if data is not None:
        yield data
        return
    with tempfile.TemporaryDirectory(prefix="walkit-demo-") as tmp:
        yield tmp


def run_demo(data: str | None = None, *, seconds: float = 10.0, bookies: int = 3, progress: bool = True,
             verbose: bool = False) -> dict[str, Any]:
    """Both acts on a local cluster under ``data`` (a temporary directory when None)."""
    from walkit import LocalCluster

    if seconds <= 0 or bookies < 3:
        raise UsageError("walkit demo needs seconds > 0 and at least 3 bookies", seconds=seconds, bookies=bookies)
    kv = load_kvstore()
    checks = _Checks()
    log_name = f"demo-kv-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    started = time.monotonic()
    with _data_dir(data) as directory, LocalCluster(directory, bookies=bookies, processes=True) as cluster:
        uri = cluster.metadata_uri
        crash, state = _crash_act(kv, uri, log_name, seconds, random.randrange(1 << 30), progress, not verbose,
                                  checks)
        _say(progress, "primary killed, standby took over; now freezing a new primary (SIGSTOP) ...")
        fence = _fence_act(kv, uri, log_name, state, random.randrange(1 << 30), not verbose, checks)
    return {"log": log_name, "bookies": bookies, "in_flight": IN_FLIGHT, "keys": KEYS,
            "snapshot_every": SNAPSHOT_EVERY, "crash": crash, "fence": fence,
            "checks": [{"check": name, "pass": ok} for name, ok in checks.results],
            "pass": all(ok for _, ok in checks.results), "total_s": round(time.monotonic() - started, 1)}


def _say(progress: bool, text: str) -> None:
    if progress:
        print(text, file=sys.stderr, flush=True)


def format_report(report: dict[str, Any]) -> str:
    crash, fence = report["crash"], report["fence"]
    lat = crash["latency_ms"]
    snap = crash["snapshot"]
    used = (f"lsn {snap['lsn']} ({snap['bytes']:,} bytes), then {snap['replayed_after']:,} records replayed"
            if snap else f"none (no snapshot yet): {crash['records']:,} records replayed")
    lines = [
        f"walkit demo: a key-value store on {report['bookies']} bookie processes (log {report['log']})",
        f"  records          {crash['records']:,} changes acknowledged in {crash['seconds']} s, "
        f"then SIGKILL (primary pid {crash['primary_pid']})",
        f"  throughput       {crash['throughput_per_s']:,} changes/s ({report['in_flight']} in flight)",
        f"  append latency   p50 {lat['p50']:.2f} ms  p99 {lat['p99']:.2f} ms  p99.9 {lat['p99.9']:.2f} ms "
        "(submit to durable, measured in the primary)",
        f"  failover         {crash['failover_s']:.3f} s from SIGKILL to the standby's state rebuilt "
        f"(replay {crash['replay_s']:.3f} s)",
        f"  snapshot used    {used}",
        f"  unacknowledged   {crash['unacknowledged_in_state']} of {crash['unacknowledged_in_flight']} "
        "in flight at the kill are in the state (allowed: a prefix)",
        f"  fencing          primary pid {fence['primary_pid']} frozen after {fence['acknowledged_before_freeze']:,} "
        f"acks, standby took over in {fence['takeover_s']:.3f} s; once resumed it got "
        f"{fence['acknowledged_after_resume']} late acks (in flight when frozen), then {fence['fenced_with']}",
        "  checks",
        *[f"    {'PASS' if c['pass'] else 'FAIL'}  {c['check']}" for c in report["checks"]],
        f"{'PASS' if report['pass'] else 'FAIL'} ({report['total_s']} s)",
    ]
    return "\n".join(lines)
