"""Garbage collection end to end (issue 15, "space comes back"): bookie processes
(``LocalCluster(processes=True)``), their real ledger directories, a real ZooKeeper, a
real small file system (tmpfs), and the ``walkit bookie gc`` CLI as an operator runs it.

What each test proves:

1. ledgers deleted through the client leave every bookie's disk (index files and entry
   logs) on its own, on local://, ZooKeeper hierarchical and ZooKeeper flat metadata;
2. a WriteAheadLog written without pause, with retention keeping a few segments, keeps
   each bookie's disk within a small multiple of what the log retains, and every
   retained record replays;
3. a bookie SIGKILLed in the middle of a compaction loses no byte of a live entry and
   finishes the compaction after its restart;
4. a bookie made read-only by a full disk turns writable again by itself once ledgers
   are deleted (the only thing the test does);
5. ``walkit bookie gc``: forced passes, one bookie, an unknown bookie, JSON, a bookie
   that is registered but cannot be reached;
6. a metadata store that cannot answer never makes a bookie remove a ledger.

``WALKIT_SLOW=1`` (or ``-m slow``) runs the long forms: 10,000 ledgers, a soak of
several minutes, a ZooKeeper outage longer than the metadata retry deadline.

Two bugs found here are fixed: ZooKeeperStore calls never gave up while ZooKeeper was
down (now each ends within its retry deadline: the past-retry-deadline outage and
``test_bug_zk_call_during_an_outage_gives_up_after_its_retry_deadline``), and ``walkit
bookie gc`` waited for ever on a hung bookie (its requests time out).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

import walkit
from support.bookie import KEY, entry, run
from support.disk import tmpfs, usage
from support.gc import (
    DiskView,
    StoppableZooKeeper,
    admin,
    bookie_ids_registered,
    delete_ledgers,
    gc_cli,
    gc_status_json,
    make_ledgers,
    payload,
    read_from_bookie,
    wait_until,
)
from walkit import LSN, WriteAheadLog
from walkit.client import BookieClient
from walkit.errors import BookieReadOnlyError, MetadataUnavailableError, WalkitError
from walkit.metadata._zk import ZooKeeperStore
from walkit.protocol import decode_entry
from support.zk import ZooKeeperServer

pytestmark = pytest.mark.timeout(900)

KIB = 1024
MIB = 1024 * KIB
# Generous timeouts: with E = 3 bookies of 3 an add timed out on a busy machine has no
# bookie to go to, and these tests are about GC, not about slow bookies.
CLIENT: dict[str, Any] = {"add_timeout": 30.0, "read_timeout": 30.0, "connect_timeout": 10.0, "session_timeout": 10.0}
# The bookies' metadata session: long enough that a busy machine does not expire it (a
# bookie without registration takes no new ledgers), short where a test restarts a
# killed bookie (the restart waits the old session out).
SESSION = 10.0
RESTART_SESSION = 2.0
# Every bookie of these tests: GC every second, small entry logs, a flush (which seals
# rolled logs) five times a second, journal files that cost little to create.
BASE: dict[str, Any] = {
    "gc_wait_time": 1000, "entry_log_size_limit": 256 * KIB, "flush_interval": 200,
    "journal_max_group_wait_msec": 0.5, "journal_pre_alloc_size_mb": 1, "journal_max_size_mb": 16,
}


def slow_selected(config: pytest.Config) -> bool:
    """The long forms run with WALKIT_SLOW=1 or ``-m slow`` (as tests/crash/test_bookie_crash.py)."""
    expr = str(config.getoption("markexpr") or "")
    return bool(os.environ.get("WALKIT_SLOW")) or ("slow" in expr and "not slow" not in expr)


def zk_uri(hosts: str, scheme: str) -> str:
    """A cluster root of its own on a real ZooKeeper: ``<scheme>://hosts/gc-<uuid>``."""
    chroot = f"/gc-{uuid.uuid4().hex}"
    store = ZooKeeperStore(hosts)
    try:
        store.create(chroot)
    finally:
        store.close()
    return f"{scheme}://{hosts}{chroot}"


def cluster(tmp_path: Path, bookies: int = 3, uri: str | None = None, session: float = SESSION,
            **options: Any) -> walkit.LocalCluster:
    return walkit.LocalCluster(tmp_path / "cluster", bookies, processes=True, metadata_uri=uri,
                               session_timeout=session, bookie_options={**BASE, **options})


# -- 1. deleted ledgers leave the bookies' disks ----------------------------------------------------

# What may stay in a bookie's logs/ once every ledger is gone: the active log (never
# sealed, so never collected: at most entryLogSizeLimit plus one record) and one rolled
# log whose flush has not sealed it yet - in bytes, two log limits.
AFTER_GC_CEILING = 2 * BASE["entry_log_size_limit"]


def long_form(count: int, default: int, config: pytest.Config) -> None:
    """Skip the long form of a test unless it was asked for."""
    if count != default and not slow_selected(config):
        pytest.skip("long form: set WALKIT_SLOW=1 or select -m slow")


def layout_uri(layout: str, request: pytest.FixtureRequest) -> str | None:
    """local:// (LocalCluster's own), or a real ZooKeeper, hierarchical or flat."""
    if layout == "local":
        return None
    zk: ZooKeeperServer = request.getfixturevalue("zk_server")
    return zk_uri(zk.hosts, layout)


@pytest.mark.parametrize("count", [1_000, pytest.param(10_000, marks=[pytest.mark.slow, pytest.mark.timeout(1800)])])
@pytest.mark.parametrize("layout", ["local", "zk", "zk+flat"])
def test_deleted_ledgers_leave_the_disks(tmp_path: Path, layout: str, count: int,
                                         request: pytest.FixtureRequest) -> None:
    long_form(count, 1_000, request.config)
    with cluster(tmp_path, uri=layout_uri(layout, request)) as c, c.client(**CLIENT) as bk:
        views = [DiskView.of(c, i) for i in range(3)]
        ledgers = make_ledgers(bk, count, entries=3, size=KIB, threads=4)
        wanted = set(ledgers)
        # index files are made by the flush: wait for them, or deleting would prove nothing
        wait_until(lambda: all(wanted <= v.indexed_ledgers() for v in views), 30 + count / 200,
                   "every ledger indexed")
        full = [v.total_bytes() for v in views]
        assert all(b > count * 3 * KIB for b in full), full
        delete_ledgers(bk, ledgers)

        def clean() -> bool:
            return all(not (v.indexed_ledgers() & wanted) and v.log_bytes() <= AFTER_GC_CEILING
                       and len(v.logs()) <= 2 for v in views)

        wait_until(clean, 60 + count / 100, "deleted ledgers gone from every bookie's disk",
                   detail=lambda: [(len(v.indexed_ledgers() & wanted), v.logs()) for v in views])
        after = [v.total_bytes() for v in views]
        print(f"{count} ledgers: ledger dirs {full} bytes before deletion, {after} after GC")
        status = gc_status_json(c.metadata_uri)
        assert sorted(status) == sorted(c.bookie_ids)
        assert [status[b]["totals"]["ledgers_removed"] for b in c.bookie_ids] == [count] * 3, status


# -- 2. a WriteAheadLog soak with retention -----------------------------------------------------------

RECORD = KIB
RATE = 1000  # records a second: ~1 MiB/s on every bookie (E = Qw = 3)
ROLL = MIB  # a segment a second
# When the log rolls to segment s, retention snapshots at the last record of segment
# s - KEEP and truncates below it: the log keeps segments s - KEEP .. s (truncate keeps
# the segment the snapshot's LSN is in), about five MiB.
KEEP = 4


def record(n: int) -> bytes:
    head = b"record %010d " % n
    return (head * (RECORD // len(head) + 1))[:RECORD]


class Soak:
    """The writer's side: paced appends, acknowledged LSNs in order, and retention
    (see KEEP) whenever the log rolled."""

    def __init__(self, wal: WriteAheadLog) -> None:
        self.wal = wal
        self.acked: list[tuple[LSN, int]] = []
        self.last_of: dict[int, LSN] = {}  # segment -> its last acknowledged LSN
        self.pending: deque[tuple[int, Future[LSN]]] = deque()
        self.appended = 0
        self.snapshots = 0
        self.truncated = 0

    def run(self, seconds: float) -> None:
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < seconds:
            while self.appended < elapsed * RATE:
                self.pending.append((self.appended, self.wal.append_async(record(self.appended))))
                self.appended += 1
            self.collect(block=False)
            self.retain()
            time.sleep(0.005)
        self.collect(block=True)

    def collect(self, block: bool) -> None:
        while self.pending and (block or self.pending[0][1].done()):
            n, fut = self.pending.popleft()
            lsn = fut.result(60)
            self.acked.append((lsn, n))
            self.last_of[lsn.segment] = lsn

    def retain(self) -> None:
        if not self.acked:
            return
        cut = self.acked[-1][0].segment - KEEP  # the last segment to drop
        if cut not in self.last_of:
            return
        lsn = self.last_of.pop(cut)
        covered = next(n for n in range(len(self.acked) - 1, -1, -1) if self.acked[n][0] == lsn)
        self.wal.snapshot(b"%d" % (self.acked[covered][1] + 1), lsn)  # the state: records 0..n applied
        self.snapshots += 1
        self.truncated += self.wal.truncate(LSN(cut + 1, 0, 0))


@pytest.mark.parametrize("seconds", [45, pytest.param(300, marks=pytest.mark.slow)])
def test_wal_soak_with_retention_keeps_disks_bounded(tmp_path: Path, seconds: int,
                                                     request: pytest.FixtureRequest) -> None:
    long_form(seconds, 45, request.config)
    options: dict[str, Any] = {"entry_log_size_limit": 512 * KIB, "minor_compaction_interval": 2,
                               "major_compaction_interval": 10, "compaction_rate_by_entries": 10_000}
    with cluster(tmp_path, **options) as c, c.client(**CLIENT) as bk:
        views = [DiskView.of(c, i) for i in range(3)]
        samples: list[list[int]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(1.0):
                samples.append([v.total_bytes() for v in views])

        sampler = threading.Thread(target=sample, name="disk-sampler")
        sampler.start()
        try:
            wal = WriteAheadLog.open(bk, "soak", roll_bytes=ROLL)
            soak = Soak(wal)
            soak.run(seconds)
            wal.close()
        finally:
            stop.set()
            sampler.join()
        reader = WriteAheadLog.reader(bk, "soak")
        meta, snapshot = reader.metadata(), reader.latest_snapshot()
        assert snapshot is not None and soak.truncated > 0
        retained = sum(bk.ledger_metadata(s.ledger_id).length for s in meta.segments) + snapshot.size
        # The ceiling: 3 x what the log retains at the end (measured: about 1.8 x). Between
        # truncations the log holds up to KEEP/(KEEP-1) of what it holds right after one;
        # on top of that come writes GC has not caught up with yet (gcWaitTime plus the
        # pass: about two segments), the active entry log and one being sealed (1 MiB),
        # and the logs at a truncation boundary, partly live until the next truncation.
        # 3 x leaves room for a slow CI machine and still fails within seconds if dead
        # segments stayed on disk (1 MiB more every second: 45 MiB by the end).
        ceiling = 3 * retained
        peaks = [max(s[i] for s in samples) for i in range(3)]
        print(f"soak {seconds}s: {soak.appended} records, {len(meta.segments)} segments kept, "
              f"{soak.snapshots} snapshots, {soak.truncated} segments truncated; retained {retained} bytes, "
              f"peak ledger-dir bytes {peaks} (ceiling {ceiling}), last {samples[-1]}")
        assert len(samples) >= seconds * 0.8
        assert max(peaks) < ceiling, (peaks, retained)
        # every retained record replays: exactly those acknowledged after the snapshot, in order
        with reader:
            replayed = list(reader.replay(after=snapshot.lsn))
        after = [n for lsn, n in soak.acked if lsn > snapshot.lsn]
        assert after and after[0] == int(snapshot.read())  # the snapshot's state ends where the replay begins
        assert replayed == [(lsn, record(n)) for lsn, n in soak.acked if lsn > snapshot.lsn]


# -- 3. SIGKILL during compaction, on the real disk ------------------------------------------------

def make_interleaved(bk: walkit.BookKeeper, ledgers: int, entries: int) -> list[int]:
    """``ledgers`` closed ledgers written round-robin, entry by entry, so that every
    entry log holds a share of each: deleting some ledgers leaves every log partly live."""
    handles = [bk.create_ledger(3, 3, 2) for _ in range(ledgers)]
    futures = [lh.add_entry_async(payload(lh.ledger_id, e)) for e in range(entries) for lh in handles]
    for fut in futures:
        fut.result(60)
    for lh in handles:
        lh.close()
    return [lh.ledger_id for lh in handles]


def test_sigkill_during_compaction_loses_nothing_and_the_restart_finishes_it(tmp_path: Path) -> None:
    # 128 KiB logs of 1 KiB entries, a third of them live after the deletion: ~40 live
    # entries a log, copied at 100 a second, so a forced major compaction of ~20 logs runs
    # for about 8 s - long enough to be killed three times at different moments.
    options: dict[str, Any] = {"gc_wait_time": 600_000, "entry_log_size_limit": 128 * KIB,
                               "compaction_rate_by_entries": 100}
    with cluster(tmp_path, session=RESTART_SESSION, **options) as c, c.client(**CLIENT) as bk:
        ledgers = make_interleaved(bk, 60, 40)
        # Bookie 0 may trail (an add is acknowledged by 2 of 3): wait until its flushes
        # sealed every log but the active one (< 128 KiB), else the pass below sees only
        # the logs sealed so far (9 of 19 once, in a loaded CI run)
        wait_until(lambda: admin(c, 0, "gc.status")["entry_logs"]["total_bytes"] >= (60 * 40 - 128) * KIB,
                   30, "bookie 0's logs sealed", detail=lambda: admin(c, 0, "gc.status")["entry_logs"])
        survivors = ledgers[::3]
        for ledger_id in set(ledgers) - set(survivors):
            bk.delete_ledger(ledger_id)
        view = DiskView.of(c, 0)
        wait_until(lambda: set(ledgers) <= view.indexed_ledgers(), 30, "every ledger indexed on bookie 0")
        number = admin(c, 0, "gc.run")["pass"]  # collect the deleted ledgers; no compaction yet
        wait_until(lambda: admin(c, 0, "gc.status")["passes"] >= number, 60, "the first pass")
        status = admin(c, 0, "gc.status")
        assert status["last_pass"]["ledgers_removed"] == len(ledgers) - len(survivors), status
        assert status["entry_logs"]["count"] >= 15 and 0.2 < status["entry_logs"]["live_fraction"] < 0.45, \
            status["entry_logs"]
        keys = [(ledger_id, e) for ledger_id in survivors for e in range(40)]
        stored = read_from_bookie(c, 0, keys)
        for (ledger_id, e), data in stored.items():
            assert decode_entry(data)[1] == payload(ledger_id, e)
        at_start = set(view.logs())
        old_logs = at_start - {max(at_start)}  # sealed: all but the active one (a restart seals that one too)
        bytes_before = view.log_bytes()
        killed_in: set[int] = set()
        for delay in (0.0, 1.0, 2.5):  # right at the first marker, a second in, later
            admin(c, 0, "gc.run", {"compact": "major"})
            # after the first kill the marker is there already: the status tells the pass runs
            wait_until(lambda: bool(view.markers()) and admin(c, 0, "gc.status")["compaction"].startswith("running"),
                       30, "a compaction running", poll=0.01)
            time.sleep(delay)
            marked = view.markers()
            assert marked, f"compaction ended before the kill (delay {delay}s): make it slower"
            killed_in |= marked
            print(f"SIGKILL {delay}s into compaction: marked {sorted(marked)}, "
                  f"{len(old_logs & set(view.logs()))} of {len(old_logs)} old logs left")
            c.kill_bookie(0)  # SIGKILL
            c.restart_bookie(0)
            assert read_from_bookie(c, 0, keys) == stored, f"bookie 0 after a SIGKILL {delay}s into compaction"
        final = gc_cli("--metadata", c.metadata_uri, "--bookie", c.bookie_ids[0], "--compact", "major", "--json")
        assert final.returncode == 0, final
        status = json.loads(final.stdout)[c.bookie_ids[0]]
        assert status["last_pass"]["error"] is None and status["entry_logs"]["compacting"] == 0, status
        assert not view.markers()
        assert not (set(view.logs()) & old_logs), f"old logs left: {sorted(set(view.logs()) & old_logs)}"
        assert killed_in <= at_start  # markers only on logs that held the deleted ledgers' entries
        assert read_from_bookie(c, 0, keys) == stored
        assert view.log_bytes() < 0.6 * bytes_before, (view.log_bytes(), bytes_before)


# -- 4. read-only on a full disk comes back -----------------------------------------------------------

TMPFS_SIZE = 32 * MIB


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """Bookie 0's ledger directory on a tmpfs of TMPFS_SIZE (its journal stays on the
    test's disk); unmounted at the end (tests/support/disk.py)."""
    with tmpfs(tmp_path / "cluster" / "bookie-0" / "ledgers", TMPFS_SIZE) as target:
        yield target


def test_read_only_on_a_full_disk_comes_back_after_deletions(small_disk: Path, tmp_path: Path) -> None:
    # One bookie and E = Qw = Qa = 1: when it is read-only, nothing else can take the
    # writes, so what the bookie says is what the client sees.
    options: dict[str, Any] = {"disk_usage_threshold": 0.6, "disk_usage_lwm_threshold": 0.4,
                               "disk_usage_warn_threshold": 0.5, "disk_check_interval": 200,
                               "entry_log_size_limit": MIB}
    with cluster(tmp_path, bookies=1, **options) as c, c.client(**CLIENT) as bk:
        uri, bookie_id = c.metadata_uri, c.bookie_ids[0]
        ledgers: list[int] = []
        body = b"x" * (16 * KIB)
        while not bookie_ids_registered(uri)[1]:
            assert len(ledgers) < 2 * TMPFS_SIZE // MIB, f"still writable with the disk {usage(small_disk):.0%} full"
            try:
                lh = bk.create_ledger(1, 1, 1)
            except WalkitError:  # no writable bookie: it just went read-only
                break
            ledgers.append(lh.ledger_id)
            try:
                for fut in [lh.add_entry_async(body) for _ in range(64)]:
                    fut.result(30)
                lh.close()
            except WalkitError:  # refused mid-ledger: it just went read-only
                pass
        wait_until(lambda: bookie_ids_registered(uri) == (frozenset(), frozenset({bookie_id})), 10,
                   "registered read-only")
        assert usage(small_disk) >= 0.6

        async def refused() -> None:
            client = await BookieClient.connect(*c.bookie_address(0))
            try:
                with pytest.raises(BookieReadOnlyError):
                    await client.add_entry(1 << 40, 0, KEY, entry(1 << 40, 0))
            finally:
                await client.close()

        run(refused, 30)
        first = bk.open_ledger(ledgers[0])
        assert [e.data for e in first.read(0, 1)] == [body, body]  # reads go on
        delete_ledgers(bk, ledgers)  # the only thing the test does: GC and the disk check do the rest
        took = wait_until(lambda: bookie_ids_registered(uri) == (frozenset({bookie_id}), frozenset()), 30,
                          "registered writable again", detail=lambda: f"disk {usage(small_disk):.0%} used")
        assert usage(small_disk) < 0.4
        lh = bk.create_ledger(1, 1, 1)
        for i in range(20):
            lh.add_entry(b"after %d" % i)
        lh.close()
        assert [e.data for e in bk.open_ledger(lh.ledger_id).read(0, 19)] == [b"after %d" % i for i in range(20)]
        print(f"read-only after {len(ledgers)} ledgers; writable again {took:.1f}s after the deletions")


# -- 5. the CLI -------------------------------------------------------------------------------------

STATUS_KEYS = {"bookie", "metadata", "running", "passes", "metadata_unavailable_passes", "next_pass_in_seconds",
               "last_pass", "totals", "compaction", "last_compaction", "entry_logs", "damaged_entry_logs", "disk_usage",
               "readonly", "registered"}


def blocks(out: str) -> list[str]:
    """The bookie ids heading the blocks of ``walkit bookie gc`` output."""
    return [line.split()[1].rstrip(":") for line in out.splitlines() if line.startswith("bookie ")]


def test_gc_cli(tmp_path: Path) -> None:
    # a long session: a killed bookie stays registered for the whole of the last check
    with cluster(tmp_path, session=60.0, gc_wait_time=600_000) as c, c.client(**CLIENT) as bk:
        uri, ids = c.metadata_uri, c.bookie_ids
        ledgers = make_ledgers(bk, 10, entries=20, threads=2)
        delete_ledgers(bk, ledgers[:6])
        forced = gc_cli("--metadata", uri, "--force", "--compact", "minor")
        assert forced.returncode == 0, forced
        assert sorted(blocks(forced.stdout)) == sorted(ids), forced.stdout
        assert forced.stdout.count("(forced)") == 3 and "6 ledgers removed" in forced.stdout, forced.stdout

        one = gc_cli("--metadata", uri, "--bookie", ids[1], "--force")
        assert one.returncode == 0 and blocks(one.stdout) == [ids[1]], one

        unknown = gc_cli("--metadata", uri, "--bookie", "127.0.0.1:1")
        assert unknown.returncode != 0 and not unknown.stdout, unknown
        assert "not registered" in unknown.stderr and "127.0.0.1:1" in unknown.stderr, unknown.stderr
        assert "Traceback" not in unknown.stderr

        as_json = gc_cli("--metadata", uri, "--json")
        assert as_json.returncode == 0, as_json
        status = json.loads(as_json.stdout)
        assert sorted(status) == sorted(ids)
        for bookie_id, s in status.items():
            assert STATUS_KEYS <= set(s), sorted(STATUS_KEYS - set(s))
            assert s["bookie"] == bookie_id and s["registered"] == "writable" and s["metadata"] is True
            assert s["totals"]["ledgers_removed"] == 6 and s["passes"] == (2 if bookie_id == ids[1] else 1)

        c.kill_bookie(2)  # SIGKILL: its registration lives on until its session expires
        assert ids[2] in bookie_ids_registered(uri)[0]
        down = gc_cli("--metadata", uri)
        down_json = gc_cli("--metadata", uri, "--json")
        assert ids[2] in bookie_ids_registered(uri)[0], "the registration expired during the check"
        assert down.returncode == 1 and sorted(blocks(down.stdout)) == sorted(ids), down
        unreachable = [line for line in down.stdout.splitlines() if line.startswith(f"bookie {ids[2]}: ")]
        assert len(unreachable) == 1 and "Traceback" not in down.stderr, down
        assert down.stdout.count("  totals ") == 2, down.stdout  # the two others are reported in full
        print(unreachable[0])
        assert down_json.returncode == 1, down_json
        answers = json.loads(down_json.stdout)
        assert set(answers[ids[2]]) == {"error"} and "passes" in answers[ids[0]], answers


@pytest.mark.slow
def test_gc_cli_reports_a_hung_bookie(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A SIGSTOPped bookie is reported like an unreachable one (its requests time out
    after 20 s), exit status 1 (slow form only: it waits that long)."""
    long_form(0, 1, request.config)
    with cluster(tmp_path, bookies=1, session=120.0) as c:
        pid = c.bookie_pid(0)
        os.kill(pid, signal.SIGSTOP)
        try:
            done = gc_cli("--metadata", c.metadata_uri, "--status", timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError("walkit bookie gc --status still waiting on a hung bookie after 30 s") from None
        finally:
            os.kill(pid, signal.SIGCONT)
        assert done.returncode == 1 and c.bookie_ids[0] in done.stdout, done

# -- 6. a metadata store that cannot answer keeps every ledger ----------------------------------------

@pytest.fixture(scope="module")
def own_zookeeper_module() -> Iterator[StoppableZooKeeper]:
    zk = StoppableZooKeeper()
    try:
        yield zk
    finally:
        zk.close()


@pytest.fixture
def own_zookeeper(own_zookeeper_module: StoppableZooKeeper) -> StoppableZooKeeper:
    """A ZooKeeper of this module's own (stopping it hurts no other test), serving."""
    if not own_zookeeper_module.running:
        own_zookeeper_module.start()
    return own_zookeeper_module


def removed(c: walkit.LocalCluster) -> list[int]:
    """Each bookie's count of ledgers its GC removed so far."""
    return [admin(c, i, "gc.status")["totals"]["ledgers_removed"] for i in range(3)]


def force_passes(c: walkit.LocalCluster) -> list[int]:
    """Ask every bookie for a pass now (ADMIN gc.run: no metadata needed); their numbers."""
    return [admin(c, i, "gc.run")["pass"] for i in range(3)]


def passes_ended(c: walkit.LocalCluster, numbers: list[int]) -> bool:
    return all(admin(c, i, "gc.status")["passes"] >= n for i, n in enumerate(numbers))


def on_every_disk(views: list[DiskView], ledgers: list[int]) -> bool:
    return all(set(ledgers) <= v.indexed_ledgers() for v in views)


def on_no_disk(views: list[DiskView], ledgers: list[int]) -> bool:
    return all(not (set(ledgers) & v.indexed_ledgers()) for v in views)


@pytest.mark.parametrize("outage", [
    pytest.param(3.0, id="short"),
    pytest.param(80.0, id="past-retry-deadline",
                 marks=pytest.mark.slow),
])
def test_metadata_unavailable_keeps_ledgers(tmp_path: Path, outage: float, request: pytest.FixtureRequest) -> None:
    """ZooKeeper is killed, then passes are forced: while the store cannot answer no
    ledger leaves any bookie - not even those deleted before the outage, which only a
    store that answers can confirm. A short outage the pass waits out (the store's calls
    retry for 30 s); a long one (slow form) cuts the pass short, and status says so (the
    first call that gives up ends every metadata step of the pass: one retry deadline).
    Back, the store answers and the deleted ledgers go; the live ones stay until they
    are deleted too."""
    long_form(int(outage), 3, request.config)
    zk: StoppableZooKeeper = request.getfixturevalue("own_zookeeper")
    options: dict[str, Any] = {"gc_wait_time": 600_000, "gc_metadata_op_rate_limit": 20}
    with cluster(tmp_path, uri=zk_uri(zk.hosts, "zk"), **options) as c:
        views = [DiskView.of(c, i) for i in range(3)]
        with c.client(**CLIENT) as bk:
            kept = make_ledgers(bk, 10, entries=3, threads=2)
            gone = make_ledgers(bk, 30, entries=3, threads=2)
            wait_until(lambda: on_every_disk(views, kept + gone), 30, "every ledger indexed")
            delete_ledgers(bk, gone)
        zk.kill()
        killed = time.monotonic()
        try:
            numbers = force_passes(c)
            time.sleep(2.0)
            assert on_every_disk(views, kept + gone), "a ledger left a bookie while ZooKeeper was down"
            if outage > 30:
                wait_until(lambda: passes_ended(c, numbers), 30 + 15, "the passes cut short")
                for i in range(3):
                    last = admin(c, i, "gc.status")["last_pass"]
                    assert last["ledgers_removed"] == 0, last
                    assert any("metadata unavailable" in reason for reason in last["cut_short"]), last
                assert on_every_disk(views, kept + gone)
                numbers = force_passes(c)  # asked while ZooKeeper is still down
                time.sleep(max(0.0, outage - (time.monotonic() - killed)))
            else:
                assert all(admin(c, i, "gc.status")["running"] for i in range(3)), "the passes wait for the store"
                assert removed(c) == [0, 0, 0]
        finally:
            zk.start()
        wait_until(lambda: passes_ended(c, numbers), 60, "the passes once ZooKeeper is back")
        assert on_no_disk(views, gone) and on_every_disk(views, kept)
        assert removed(c) == [len(gone)] * 3
        with c.client(**CLIENT) as bk:
            delete_ledgers(bk, kept)
        numbers = force_passes(c)
        wait_until(lambda: passes_ended(c, numbers), 60, "the pass after the last deletions")
        assert on_no_disk(views, kept + gone)
        assert removed(c) == [len(kept) + len(gone)] * 3
        assert bookie_ids_registered(c.metadata_uri)[0] == set(c.bookie_ids), "every bookie kept its registration"


def test_bug_zk_call_during_an_outage_gives_up_after_its_retry_deadline(own_zookeeper: StoppableZooKeeper) -> None:
    """Reproducer of a fixed bug (kazoo queued a call made while ZooKeeper was down until
    the connection was back, and KazooRetry's deadline only counted between attempts):
    ``retry_deadline=0.3`` and ZooKeeper down; the call fails with
    MetadataUnavailableError within a couple of seconds."""
    zk = own_zookeeper
    store = ZooKeeperStore(zk.hosts, session_timeout=10.0, retry_deadline=0.3)
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            store.exists("/")
            outcome.append(None)
        except WalkitError as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call, name="zk-call-during-outage", daemon=True)
    try:
        zk.kill()
        caller.start()
        caller.join(2.0)
        assert outcome and isinstance(outcome[0], MetadataUnavailableError), \
            f"after 2 s: {outcome or 'still waiting'} (retry_deadline 0.3 s)"
    finally:
        zk.start()
        caller.join(30)
        store.close()
