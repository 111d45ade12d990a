"""walkit._stats.percentile, the one percentile of every latency figure walkit prints:
the sample at index floor(q * n) of the sorted samples (docstring there says why)."""

from __future__ import annotations

import pytest

from walkit._stats import percentile
from walkit.bench._common import latency_percentiles

TEN = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]


@pytest.mark.parametrize(("samples", "q", "expected"), [
    ([7], 0.0, 7),  # one sample: every percentile is it
    ([7], 0.5, 7),
    ([7], 1.0, 7),
    (TEN, 0.0, 10),  # p0: the smallest
    (TEN, 1.0, 100),  # p100: the largest (index n clamped to the last)
    (TEN, 0.5, 60),  # q * n whole: one rank above nearest rank (50)
    (TEN, 0.99, 100),
    (TEN, 0.25, 30),  # q * n = 2.5: nearest rank, 3rd
    ([1, 2], 0.5, 2),
    ([100, 10, 50, 30, 90, 20, 80, 40, 70, 60], 0.5, 60),  # any order
    ([3.5, 1.25, 2.0], 0.5, 2.0),  # any unit
    (list(range(1000)), 0.999, 999),
    (list(range(1001)), 0.999, 999),
])
def test_percentile(samples: list[float], q: float, expected: float) -> None:
    assert percentile(samples, q) == expected


def test_percentile_leaves_its_input_alone() -> None:
    samples = [3, 1, 2]
    percentile(samples, 0.5)
    assert samples == [3, 1, 2]


@pytest.mark.parametrize(("samples", "q", "message"), [
    ([], 0.5, "no samples"),
    (iter(()), 0.5, "no samples"),
    ([1], -0.1, "not between 0 and 1"),
    ([1], 99.0, "not between 0 and 1"),  # a percent, not a fraction
])
def test_percentile_refuses(samples: list[float], q: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        percentile(samples, q)


def test_latency_percentiles_in_milliseconds() -> None:
    ns = [i * 1_000_000 for i in range(1, 1001)]  # 1..1000 ms
    assert latency_percentiles(ns) == {"p50_ms": 501.0, "p99_ms": 991.0, "p999_ms": 1000.0}
    assert latency_percentiles([1_234_567], digits=2) == {"p50_ms": 1.23, "p99_ms": 1.23, "p999_ms": 1.23}
    assert latency_percentiles([]) == {"p50_ms": 0.0, "p99_ms": 0.0, "p999_ms": 0.0}  # nothing measured
