"""Pure decisions of garbage collection: rate limits, which logs to compact, and when.

Nothing here does I/O or reads a clock of its own: the clock and the sleep are passed
in, so every rule is tested with a fake clock (``tests/unit/test_gc.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from bookie._config import BookieConfig
from bookie.storage import EntryLogInfo
from walkit.errors import InvalidArgumentError

__all__ = ["RateLimiter", "Kind", "CompactionRule", "compaction_rule", "due_compaction", "candidates",
           "suspension"]

Kind = Literal["minor", "major"]


class RateLimiter:
    """At most ``rate`` units per second, spread evenly (no burst): each acquire
    books the next free slot and sleeps until it comes. ``sleep(seconds)`` may return
    early (True: stop waiting - the caller is stopping)."""

    def __init__(self, rate: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] = time.sleep) -> None:
        if rate <= 0:
            raise InvalidArgumentError("rate must be positive", rate=rate)
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._next = 0.0

    def acquire(self, units: float = 1.0) -> None:
        now = self._clock()
        start = max(now, self._next)
        self._next = start + units / self.rate
        if start > now:
            self._sleep(start - now)


@dataclass(frozen=True)
class CompactionRule:
    kind: Kind
    threshold: float  # logs whose live fraction is below it are compacted
    interval: float  # seconds between passes of this kind (<= 0: off)
    max_time: float  # seconds one pass may run (<= 0: unbounded)


def compaction_rule(config: BookieConfig, kind: Kind) -> CompactionRule:
    if kind == "major":
        return CompactionRule("major", config.major_compaction_threshold, config.major_compaction_interval,
                              config.major_compaction_max_time_millis / 1000.0)
    return CompactionRule("minor", config.minor_compaction_threshold, config.minor_compaction_interval,
                          config.minor_compaction_max_time_millis / 1000.0)


def due_compaction(now: float, last: dict[Kind, float], rules: dict[Kind, CompactionRule]) -> Kind | None:
    """The kind of compaction due now, major first (it covers minor's logs too)."""
    order: tuple[Kind, ...] = ("major", "minor")
    for kind in order:
        rule = rules[kind]
        if rule.interval > 0 and rule.threshold > 0 and now - last[kind] >= rule.interval:
            return kind
    return None


def candidates(logs: Sequence[EntryLogInfo], threshold: float) -> list[EntryLogInfo]:
    """Logs to compact: some live bytes, live fraction under ``threshold``; the emptiest
    first (most space back per byte copied). Logs with no live ledger are not here:
    they are deleted without copying anything."""
    chosen = [info for info in logs if info.ledgers and info.live_fraction < threshold]
    return sorted(chosen, key=lambda info: (info.live_fraction, info.dir, info.log_id))


def suspension(kind: Kind, disk_usage: float, config: BookieConfig, forced: bool) -> str | None:
    """Why compaction of ``kind`` must not run now (None: it may). It writes before it
    frees, so it pauses on a full disk: major above ``diskUsageWarnThreshold``, minor
    above ``diskUsageThreshold`` - unless ``isForceGCAllowWhenNoSpace`` lets a forced
    pass (or the collector's own pass on a full disk) run anyway."""
    if forced and config.is_force_gc_allow_when_no_space:
        return None
    limit = config.disk_usage_threshold
    if kind == "major":
        limit = min(config.disk_usage_warn_threshold, limit)
    if disk_usage >= limit:
        return f"disk {disk_usage:.1%} full (limit for {kind} compaction {limit:.0%})"
    return None
