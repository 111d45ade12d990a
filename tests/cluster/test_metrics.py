"""Client and WriteAheadLog metrics (walkit/client/_stats.py, walkit/wal/_stats.py, the
process registry and ``walkit.metrics.serve``): each metric moves by what real traffic
on an in-process cluster does - adds, reads, a speculative read, an ensemble change, a
recovery, appends in batches, a roll, a snapshot, a replay - and keeps counting after
its client or log is closed (issue 17)."""

from __future__ import annotations

import gc
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import walkit
from walkit.errors import DigestMismatchError
from support.client import FAST, hang_single_reads, index_of
from support.metadata import wait_for
from test_ledger_client import _corrupt_reads
from walkit import WriteAheadLog
from walkit.metrics import REGISTRY, serve

pytestmark = pytest.mark.timeout(120)


def _value(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    assert value is not None, name
    return value


class _Delta:
    """Sample values now, and how far they moved since (the registry is the process's)."""

    def __init__(self, *names: str) -> None:
        self.before = {name: _value(name) for name in names}

    def __call__(self, name: str) -> float:
        return _value(name) - self.before[name]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[walkit.LocalCluster]:
    with walkit.LocalCluster(tmp_path / "cluster", bookies=4, session_timeout=2.0) as c:
        yield c


def test_client_metrics_follow_adds_reads_speculation_ensemble_changes_and_recoveries(
        cluster: walkit.LocalCluster) -> None:
    names = ("walkit_client_adds_total", "walkit_client_add_seconds_count", "walkit_client_add_seconds_sum",
             "walkit_client_reads_total", "walkit_client_read_seconds_count", "walkit_client_read_failures_total",
             "walkit_client_range_reads_total",
             "walkit_client_speculative_reads_total", "walkit_client_ensemble_changes_total",
             "walkit_client_recoveries_total", "walkit_client_add_failures_total")
    delta = _Delta(*names)
    bk = cluster.client(**FAST)
    lh = bk.create_ledger(3, 3, 2)
    for f in [lh.add_entry_async(b"e%d" % i) for i in range(100)]:
        f.result(timeout=30)
    assert delta("walkit_client_adds_total") == 100
    assert delta("walkit_client_add_seconds_count") == 13  # sampled: entries 0, 8, ..., 96
    assert 0 < delta("walkit_client_add_seconds_sum") < 13 * 30
    assert [e.data for e in lh.read(0, 9)] == [b"e%d" % i for i in range(10)]
    # read in one run (READ_RANGE): ten entries, one request; the latency histogram times single reads
    assert delta("walkit_client_reads_total") == 10 and delta("walkit_client_range_reads_total") == 1
    assert delta("walkit_client_read_seconds_count") == 0
    assert [e.data for e in lh.read(0, 1)] == [b"e0", b"e1"]
    assert delta("walkit_client_reads_total") == 12 and delta("walkit_client_range_reads_total") == 2

    # a speculative read: the first replica of entry 0 of a striped ledger (read entry by entry) hangs
    striped = bk.create_ledger(3, 2, 2)
    striped.add_entry(b"e0")
    release = threading.Event()
    first = striped.metadata.write_set(0)[0]
    undo = hang_single_reads(cluster, first, release)
    try:
        assert [e.data for e in striped.read(0, 0)] == [b"e0"]
        assert delta("walkit_client_read_seconds_count") == 1
    finally:
        release.set()
        undo()
    assert delta("walkit_client_speculative_reads_total") >= 1

    # an ensemble change, then a recovery by another client of the unclosed ledger
    cluster.kill_bookie(index_of(cluster, lh.metadata.ensembles[0][1][2]))
    for f in [lh.add_entry_async(b"e%d" % i) for i in range(100, 150)]:
        f.result(timeout=30)
    wait_for(lambda: delta("walkit_client_ensemble_changes_total") == 1, 10)  # Qa acks need not wait for it
    other = cluster.client(**FAST)
    assert other.open_ledger(lh.ledger_id).last_add_confirmed == 149
    assert delta("walkit_client_recoveries_total") == 1
    # a read no replica answers with a valid copy
    lh2 = other.create_ledger(3, 3, 2)
    lh2.add_entry(b"only")
    lh2.close()
    for bookie_id in lh2.metadata.ensembles[0][1]:
        _corrupt_reads(cluster, bookie_id)
    with pytest.raises(DigestMismatchError):
        list(other.open_ledger(lh2.ledger_id).read(0, 0))
    assert delta("walkit_client_read_failures_total") == 1
    adds = delta("walkit_client_adds_total")
    bk.close()  # a closed client's counts stay in the totals
    other.close()
    assert delta("walkit_client_adds_total") == adds == 152


def test_write_ahead_log_metrics_follow_appends_rolls_snapshots_and_replay(cluster: walkit.LocalCluster) -> None:
    names = ("walkit_wal_records_total", "walkit_wal_entries_total", "walkit_wal_append_seconds_count",
             "walkit_wal_records_per_entry_sum", "walkit_wal_records_per_entry_count", "walkit_wal_rolls_total",
             "walkit_wal_snapshots_total", "walkit_wal_snapshot_bytes_total", "walkit_wal_replayed_records_total",
             "walkit_wal_replayed_entries_total", "walkit_wal_replay_read_seconds_total",
             "walkit_wal_append_failures_total")
    delta = _Delta(*names)
    with cluster.client(**FAST) as bk:
        with WriteAheadLog.open(bk, "metered", roll_bytes=4_000, max_entry_bytes=2048) as wal:
            futures = [wal.append_async(b"r%05d" % i) for i in range(2000)]
            lsns = [f.result(timeout=60) for f in futures]
            assert delta("walkit_wal_records_total") == 2000
            entries = delta("walkit_wal_entries_total")
            assert 1 <= entries < 2000  # batched
            assert delta("walkit_wal_records_per_entry_sum") == 2000
            assert delta("walkit_wal_records_per_entry_count") == entries == delta("walkit_wal_append_seconds_count")
            assert delta("walkit_wal_rolls_total") >= 1
            wal.snapshot(b"s" * 3000, lsns[-1])
            assert delta("walkit_wal_snapshots_total") == 1 and delta("walkit_wal_snapshot_bytes_total") == 3000
            assert [r for _, r in wal.replay()] == [b"r%05d" % i for i in range(2000)]
            assert delta("walkit_wal_replayed_records_total") == 2000
            assert delta("walkit_wal_replayed_entries_total") == entries
            assert delta("walkit_wal_replay_read_seconds_total") > 0
        assert delta("walkit_wal_records_total") == 2000  # closed: still counted
        replayed = delta("walkit_wal_replayed_records_total")
        reader = WriteAheadLog.reader(bk, "metered")
        assert sum(1 for _ in reader.replay()) == 2000
        del reader  # never closed: its counts must survive its garbage collection
        gc.collect()
        assert delta("walkit_wal_replayed_records_total") - replayed == 2000
        with pytest.raises(walkit.errors.WalkitError):
            wal.append(b"closed")
        assert delta("walkit_wal_append_failures_total") == 0  # refused at once: nothing was in flight


def test_serve_exposes_the_process_registry() -> None:
    port = serve(0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
        assert response.status == 200
    for name in ("walkit_client_adds_total", "walkit_client_add_seconds_bucket", "walkit_wal_records_total",
                 "walkit_wal_append_seconds_bucket"):
        assert name in text
