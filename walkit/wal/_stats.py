"""What the WriteAheadLogs and log readers of this process count (:mod:`walkit.metrics`
explains how recording stays cheap): each log handle keeps a :class:`LogStats` - the
append side written on its client's loop thread, the replay side by the thread that
replays, snapshots by the thread that writes them - and :data:`LOGS` sums them for
:data:`walkit.metrics.REGISTRY`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from walkit.metrics import COUNT_BUCKETS, LATENCY_BUCKETS, REGISTRY, Histogram, Stats, StatsGroup, counter

__all__ = ["LogStats", "LOGS"]


@dataclass
class LogStats(Stats):
    records: int = 0  # records appended and durable
    entries: int = 0  # ledger entries those records went in
    append_failures: int = 0  # records whose append failed
    #: per entry: from the append of its oldest record to its durability (the slowest record's latency)
    append_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    records_per_entry: Histogram = field(default_factory=lambda: Histogram(COUNT_BUCKETS))
    rolls: int = 0  # segments rolled (closed, next one started)
    snapshots: int = 0
    snapshot_bytes: int = 0
    replayed_records: int = 0  # records replay / tail unpacked for the application (a chunk at a time)
    replayed_entries: int = 0
    replay_read_seconds: float = 0.0  # time spent reading entries from bookies for replay
    retention_passes: int = 0  # background retention passes made
    retention_segments: int = 0  # segments they deleted
    retention_failures: int = 0  # passes that failed (retried at the next roll or snapshot)


def _describe(s: LogStats) -> Iterator[Metric]:
    yield counter("walkit_wal_records", "Records appended and durable on a quorum", s.records)
    yield counter("walkit_wal_entries", "Ledger entries the appended records went in (a batch each)", s.entries)
    yield counter("walkit_wal_append_failures", "Records whose append failed", s.append_failures)
    yield s.append_seconds.family("walkit_wal_append_seconds",
                                  "Per entry: from the append of its oldest record until the entry is durable "
                                  "(the latency of its slowest record)")
    yield s.records_per_entry.family("walkit_wal_records_per_entry", "Records batched into one ledger entry")
    yield counter("walkit_wal_rolls", "Segments rolled", s.rolls)
    yield counter("walkit_wal_snapshots", "Snapshots written", s.snapshots)
    yield counter("walkit_wal_snapshot_bytes", "Bytes of snapshots written", s.snapshot_bytes)
    yield counter("walkit_wal_replayed_records", "Records read back by replay or tail", s.replayed_records)
    yield counter("walkit_wal_replayed_entries", "Entries read back by replay or tail", s.replayed_entries)
    yield counter("walkit_wal_replay_read_seconds",
                  "Time replay spent reading entries from bookies (replayed_records / this: the replay rate)",
                  s.replay_read_seconds)
    yield counter("walkit_wal_retention_passes", "Background retention passes made by log writers", s.retention_passes)
    yield counter("walkit_wal_retention_segments", "Segments deleted by background retention passes",
                  s.retention_segments)
    yield counter("walkit_wal_retention_failures", "Background retention passes that failed", s.retention_failures)


LOGS: StatsGroup[LogStats] = StatsGroup(LogStats, _describe)
REGISTRY.register(LOGS)
