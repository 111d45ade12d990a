"""A churn soak (issue 18, "Leaks and long runs"): for a while, clients connect and close,
ledgers are created, written, read, closed and deleted, a WriteAheadLog is opened by one
writer after another (each fencing the last, some abandoning theirs), snapshots and
retention cut it, and one bookie is restarted again and again - on real bookie
processes with GC busy. Then:

* the RSS, open file descriptors and threads of the bookies that ran throughout, and of
  this (client) process, measured from /proc, stay under ceilings above what they were
  once warm: a leak of one descriptor, thread or connection per iteration fails;
* once every ledger and the log are deleted and a forced GC pass with major compaction
  ran, no entry log, index file or journal file is left that should be gone;
* the log replayed every acknowledged record until it was deleted.

CI runs it for 30 s; ``WALKIT_SLOW=1`` for 5 minutes (``WALKIT_SOAK_SECONDS`` overrides).
"""

from __future__ import annotations

import gc
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import walkit
from support.bookie import Usage
from support.gc import DiskView, admin
from walkit import WriteAheadLog
from walkit.wal import delete_log

pytestmark = pytest.mark.timeout(900)

KIB = 1024
SECONDS = float(os.environ.get("WALKIT_SOAK_SECONDS") or (300 if os.environ.get("WALKIT_SLOW") else 30))
OPTIONS = {
    "gc_wait_time": 1000, "entry_log_size_limit": 256 * KIB, "flush_interval": 200,
    "journal_max_group_wait_msec": 0.5, "journal_pre_alloc_size_mb": 1, "journal_max_size_mb": 2,
    "journal_max_backups": 1, "minor_compaction_interval": 2, "minor_compaction_threshold": 0.5,
}
CLIENT = {"add_timeout": 5.0, "read_timeout": 5.0, "connect_timeout": 5.0}
RESTARTED = 3  # the bookie restarted again and again; 0..2 run throughout


def _assert_no_leak(what: str, warm: Usage, end: Usage, rss_slack: int) -> None:
    assert end.fds <= warm.fds + 12, f"{what}: open files {warm.fds} -> {end.fds}"
    assert end.threads <= warm.threads + 4, f"{what}: threads {warm.threads} -> {end.threads}"
    assert end.rss <= warm.rss * 1.5 + rss_slack, f"{what}: RSS {warm.rss >> 20} -> {end.rss >> 20} MiB"


def _one_round(cluster: walkit.LocalCluster, rng: random.Random, state: dict[str, object]) -> None:
    """One client's life: ledgers made, read, deleted; the log taken over and written."""
    with cluster.client(**CLIENT) as bk:
        kept: list[int] = state.setdefault("ledgers", [])  # type: ignore[assignment]
        for _ in range(3):
            lh = bk.create_ledger(3, 3, 2)
            for f in [lh.add_entry_async(rng.randbytes(KIB)) for _ in range(40)]:
                f.result(timeout=60)
            lh.close()
            kept.append(lh.ledger_id)
        rh = bk.open_ledger(kept[-1])
        assert len(list(rh.read(0, 39))) == 40
        rh.close()
        while len(kept) > 6:  # the oldest go: GC has work every second
            bk.delete_ledger(kept.pop(0))
        wal = WriteAheadLog.open(bk, "churn", roll_bytes=64 * KIB)
        records: list[bytes] = state.setdefault("records", [])  # type: ignore[assignment]
        batch = [b"%08d" % (len(records) + i) + rng.randbytes(rng.randint(10, 300)) for i in range(200)]
        lsns = [f.result(timeout=60) for f in [wal.append_async(r) for r in batch]]
        records.extend(batch)
        if rng.random() < 0.3:  # a snapshot covering everything so far, and retention up to it
            wal.snapshot(b"state after %d records" % len(records), lsns[-1])
            wal.truncate(lsns[-1])
            state["snapshot_at"] = len(records)
        if rng.random() < 0.3:
            return  # abandoned: the next writer fences and recovers it (the client closes under it)
        wal.close()


def test_churn_keeps_resources_bounded_and_leaves_no_files_behind(tmp_path: Path) -> None:
    rng = random.Random(18)
    with walkit.LocalCluster(tmp_path / "cluster", bookies=4, processes=True, session_timeout=2.0,
                             bookie_options=OPTIONS) as cluster:
        me = os.getpid()
        state: dict[str, object] = {}
        start = time.monotonic()
        warm: dict[str, Usage] = {}
        rounds = restarts = 0
        next_restart = start + 5
        while time.monotonic() - start < SECONDS:
            _one_round(cluster, rng, state)
            rounds += 1
            if time.monotonic() >= next_restart:
                cluster.stop_bookie(RESTARTED)
                cluster.restart_bookie(RESTARTED)
                restarts += 1
                next_restart = time.monotonic() + 5
            if not warm and time.monotonic() - start >= SECONDS / 3:  # warm: every path ran at least once
                gc.collect()
                warm = {f"bookie {i}": Usage.of(cluster.bookie_pid(i)) for i in range(3)}
                warm["client"] = Usage.of(me)
        gc.collect()
        time.sleep(1.0)  # closed clients' threads and sockets are gone by now
        assert rounds >= 5 and restarts >= 1, (rounds, restarts)
        print(f"churn: {rounds} rounds, {restarts} restarts in {time.monotonic() - start:.0f} s; warm -> end: "
              + "; ".join(f"{what} {u.rss >> 20} MiB/{u.fds} fds/{u.threads} threads -> "
                          f"{(e := Usage.of(cluster.bookie_pid(int(what[-1])) if what != 'client' else me)).rss >> 20}"
                          f" MiB/{e.fds}/{e.threads}" for what, u in warm.items()))
        for i in range(3):
            _assert_no_leak(f"bookie {i}", warm[f"bookie {i}"], Usage.of(cluster.bookie_pid(i)), 48 << 20)
        _assert_no_leak("client", warm["client"], Usage.of(me), 64 << 20)

        # every acknowledged record is still there, then everything goes
        with cluster.client(**CLIENT) as bk:
            records: list[bytes] = state["records"]  # type: ignore[assignment]
            with WriteAheadLog.open(bk, "churn") as wal:
                snapshot = wal.latest_snapshot()
                after = snapshot.lsn if snapshot is not None else None
                replayed = [r for _, r in wal.replay(after)]
            assert replayed == records[int(state.get("snapshot_at", 0)):]  # nothing acknowledged lost, in order
            delete_log(bk, "default", "churn")
            for ledger_id in state["ledgers"]:  # type: ignore[attr-defined]
                bk.delete_ledger(ledger_id)
        for i in range(4):  # a forced pass with major compaction on every bookie, and its end awaited
            number = admin(cluster, i, "gc.run", {"compact": "major"})["pass"]
            deadline = time.monotonic() + 60
            while admin(cluster, i, "gc.status")["passes"] < number and time.monotonic() < deadline:
                time.sleep(0.2)
        for i in range(4):
            disk = DiskView.of(cluster, i)
            assert disk.indexed_ledgers() == set(), f"bookie {i} keeps index files of deleted ledgers"
            assert disk.log_bytes() <= 2 * OPTIONS["entry_log_size_limit"] + 64 * KIB, \
                f"bookie {i}: {disk.log_bytes()} bytes of entry logs after every ledger is gone"
            journals = sorted((cluster.data_dir / f"bookie-{i}" / "journal").glob("*.txn"))
            # the live journal, journalMaxBackups behind the mark, and the recycled spares
            assert len(journals) <= 1 + OPTIONS["journal_max_backups"] + 2 + 1, (i, [p.name for p in journals])
