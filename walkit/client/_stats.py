"""What the ledger clients of this process count (:mod:`walkit.metrics` explains how
recording stays cheap): each :class:`~walkit.client._core.ClientCore` keeps a
:class:`ClientStats`, written on its loop thread only, and :data:`CLIENTS` sums them
for :data:`walkit.metrics.REGISTRY`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from walkit.metrics import LATENCY_BUCKETS, REGISTRY, Histogram, Stats, StatsGroup, counter

__all__ = ["ClientStats", "CLIENTS"]


@dataclass
class ClientStats(Stats):
    adds: int = 0  # adds acknowledged (Qa) and completed
    add_failures: int = 0  # adds failed (their outcome unknown: recovery decides)
    #: submit -> completed, for one add in 8 (entry ids divisible by 8): a sample, so timing costs
    #: the add path next to nothing
    add_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    reads: int = 0  # entries read (digest checked)
    read_failures: int = 0  # entry reads that failed (no valid copy, or no such entry)
    read_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))  # one entry's read
    speculative_reads: int = 0  # reads sent to another replica because one was slow
    range_reads: int = 0  # READ_RANGE requests answered (runs of entries; their entries count in reads)
    ensemble_changes: int = 0
    recoveries: int = 0  # ledgers this client recovered and closed


def _describe(s: ClientStats) -> Iterator[Metric]:
    yield counter("walkit_client_adds", "Adds acknowledged by their ack quorum and completed", s.adds)
    yield counter("walkit_client_add_failures", "Adds that failed (their outcome is recovery's to decide)",
                  s.add_failures)
    yield s.add_seconds.family("walkit_client_add_seconds",
                               "From an add's submission to its completion (sampled: one add in 8)")
    yield counter("walkit_client_reads", "Entries read (digest and ids checked)", s.reads)
    yield counter("walkit_client_read_failures",
                  "Entry reads that failed: no replica answered with a valid copy, or the entry does not exist",
                  s.read_failures)
    yield s.read_seconds.family("walkit_client_read_seconds", "One entry's read, from request to a valid answer")
    yield counter("walkit_client_speculative_reads",
                  "Reads sent to the next replica because the first stayed silent for speculative_read_timeout",
                  s.speculative_reads)
    yield counter("walkit_client_range_reads",
                  "READ_RANGE requests answered: runs of consecutive entries read in one request (their entries "
                  "count in walkit_client_reads)", s.range_reads)
    yield counter("walkit_client_ensemble_changes", "Ensemble changes (a bookie of a writer's ensemble replaced)",
                  s.ensemble_changes)
    yield counter("walkit_client_recoveries", "Ledgers recovered (fenced and closed) by this process",
                  s.recoveries)


CLIENTS: StatsGroup[ClientStats] = StatsGroup(ClientStats, _describe)
REGISTRY.register(CLIENTS)
