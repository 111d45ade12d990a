"""Metrics at next to no cost on the hot paths, exposed through prometheus-client.

Theory of operation
-------------------
A hot path never calls into prometheus-client (whose every ``inc``/``observe`` takes a
lock): it bumps plain integer attributes and :class:`Histogram` buckets, each written by
one thread only (the journal's sync thread, a server's event loop), so a record costs an
attribute add or a bisect and a list add. When the exposition is asked for, a
collector - prometheus-client's custom-collector protocol: an object with
``collect()`` yielding metric families - reads those numbers and builds the families;
prometheus-client writes the text format. A reader may see a count one record behind
(it reads without the writer's thread): counters and histograms stay monotonic, which is
all Prometheus asks.

Names follow Prometheus conventions (``walkit_<component>_<what>_<unit>``, ``_total`` for
counters, ``_seconds`` and ``_bytes`` for units); docs/metrics.md lists every one.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["Histogram", "LATENCY_BUCKETS", "SIZE_BUCKETS", "COUNT_BUCKETS", "registry_of"]

#: Seconds, from 50 µs (a journal sync on a fast device) to 10 s.
LATENCY_BUCKETS: tuple[float, ...] = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                      0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Bytes, 512 B to 64 MiB by powers of four.
SIZE_BUCKETS: tuple[float, ...] = tuple(float(512 * 4 ** i) for i in range(9))
#: Counts (records in a batch, ...), 1 to 65,536 by powers of four.
COUNT_BUCKETS: tuple[float, ...] = tuple(float(4 ** i) for i in range(9))


class Histogram:
    """Bucket counts and a sum, recorded by one thread (see the module docstring).
    Buckets are upper bounds, inclusive, as Prometheus' ``le``."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError("histogram bounds must be distinct and ascending")
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        """This histogram as a metric family (cumulative buckets, as the format wants)."""
        counts, total = list(self.counts), self.sum  # one consistent-enough copy
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*map(repr, self.bounds), "+Inf"), counts):
            running += n
            buckets.append((bound, running))
        return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=total)


def registry_of(*collectors: Collector | Iterable[Collector]) -> CollectorRegistry:
    """A registry of its own holding ``collectors`` (several bookies in one process each
    have theirs, so their names never collide)."""
    registry = CollectorRegistry(auto_describe=False)
    for item in collectors:
        for collector in (item if isinstance(item, Iterable) else (item,)):
            registry.register(collector)
    return registry
