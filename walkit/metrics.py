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

A bookie has a registry of its own (several may run in one process). The application
side - every ledger client (:class:`walkit.BookKeeper`) and WriteAheadLog of the process
- shares :data:`REGISTRY`: each client or log keeps its own :class:`Stats` (written on its
client's loop thread), registered in a :class:`StatsGroup` that sums the live ones and
those closed before (so counters never go back) when scraped. :func:`serve` exposes
:data:`REGISTRY` over HTTP in one call; an application with an exporter of its own
collects :data:`REGISTRY` (or registers its collectors in another registry).
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["Histogram", "LATENCY_BUCKETS", "SIZE_BUCKETS", "COUNT_BUCKETS", "REGISTRY", "Stats", "StatsGroup",
           "registry_of", "serve"]

S = TypeVar("S", bound="Stats")

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


#: The registry of every ledger client and WriteAheadLog in this process.
REGISTRY = CollectorRegistry(auto_describe=False)


class Stats:
    """Counts of one owner (a client, a log), as a dataclass of ``int`` and
    :class:`Histogram` fields; subclasses are dataclasses. One thread writes them."""

    def merge(self, other: Stats) -> None:
        """Add ``other``'s counts to these (both of the same class)."""
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, Histogram):
                mine.counts = [a + b for a, b in zip(mine.counts, theirs.counts)]
                mine.sum += theirs.sum
            else:
                setattr(self, f.name, mine + theirs)


class StatsGroup(Generic[S]):
    """The :class:`Stats` of every live owner of one kind, plus the sum of those gone; a
    collector of their total (``describe`` maps a total to metric families). An owner's
    counts join the sum of those gone when it is retired (closed) or garbage collected,
    whichever comes first - never lost, so counters never go back."""

    def __init__(self, factory: Callable[[], S], describe: Callable[[S], Iterator[Metric]]) -> None:
        self._factory, self._describe = factory, describe
        self._live: dict[int, S] = {}  # by a key of the owner's own
        self._finalizers: dict[int, weakref.finalize] = {}  # type: ignore[type-arg]
        self._retired = factory()
        self._lock = threading.Lock()
        self._keys = iter(range(1 << 62))

    def new(self, owner: Any) -> S:
        """A fresh ``Stats`` for ``owner`` (which keeps it as ``owner.stats``)."""
        stats = self._factory()
        with self._lock:
            key = next(self._keys)
            self._live[key] = stats
            self._finalizers[key] = weakref.finalize(owner, self._retire, key)
            owner.__dict__["_stats_key"] = key
        return stats

    def retire(self, owner: Any) -> None:
        """``owner`` closed: its counts join the sum of those gone (once)."""
        finalizer = self._finalizers.get(owner.__dict__.get("_stats_key", -1))
        if finalizer is not None:
            finalizer()  # runs _retire at most once, now rather than at collection

    def _retire(self, key: int) -> None:
        with self._lock:
            stats = self._live.pop(key, None)
            self._finalizers.pop(key, None)
            if stats is not None:
                self._retired.merge(stats)

    def total(self) -> S:
        with self._lock:
            live = list(self._live.values())
            total = self._factory()
            total.merge(self._retired)
        for stats in live:
            total.merge(stats)
        return total

    def collect(self) -> Iterator[Metric]:
        return self._describe(self.total())


def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    """A counter family of one sample (``name`` without ``_total``)."""
    return CounterMetricFamily(name, documentation, value=value)


def serve(port: int, address: str = "127.0.0.1", registry: CollectorRegistry = REGISTRY) -> int:
    """Serve ``registry`` (default: this process's clients and logs) as Prometheus text
    on ``http://address:port/metrics``, from a daemon thread; returns the port (``port``
    0 takes a free one)."""
    server, _ = start_http_server(port, addr=address, registry=registry)
    return int(server.server_address[1])
