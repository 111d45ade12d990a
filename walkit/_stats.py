"""Percentiles of measured samples: the one definition behind every latency figure walkit
prints (the benchmarks' reports and the tables in docs/performance.md, ``walkit demo``).

Pure code with no imports of walkit, so that ``walkit.bench`` and ``walkit.demo`` both
take it from here without either importing the other.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["percentile"]


def percentile(samples: Iterable[float], q: float) -> float:
    """The ``q`` quantile (``0 <= q <= 1``: 0.99 is p99) of ``samples``, in any order and
    any unit: the sample at index ``floor(q * n)`` of the ``n`` sorted samples, the last
    one when that index is ``n`` (``q`` = 1).

    That is the smallest sample with more than ``q * n`` samples at or below it: the
    nearest rank, except that when ``q * n`` is a whole number it is the sample one rank
    higher (p50 of ``[1, 2]`` is 2, nearest rank says 1) - never lower than nearest rank.
    No interpolation: the figure is always a latency that was measured. This is the
    definition the benchmarks have used since the first table of docs/performance.md
    (three of the four percentile functions this one replaced), so published p50, p99 and
    p99.9 figures keep their meaning.

    :raises ValueError: no samples (there is no percentile of nothing: a caller that
        reports one anyway says so itself), or ``q`` outside ``[0, 1]``.
    """
    ordered = sorted(samples)
    if not ordered:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 1:
        raise ValueError(f"percentile q={q!r}: not between 0 and 1")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
