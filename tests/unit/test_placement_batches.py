"""The storage placement's batches (bookie/storage/_placement.py ``Placement.place``): cut
where the entry-by-entry rule cuts them - at the entry that makes ``batch`` entries or
reaches ``batch_bytes``, across ledgers - now that the sizes are summed in C."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from bookie.storage._placement import Placement, Share
from bookie.storage._writecache import WriteCache


class _Shared:
    """What ``place`` reads of the storage: its lock, its write cache, a writable check."""

    def __init__(self, cache: WriteCache) -> None:
        self.lock, self.cache = threading.Lock(), cache

    def check_writable(self) -> None:
        return None


class _Recorded(Placement):
    def __init__(self, shared: Any, batch: int, batch_bytes: int) -> None:
        super().__init__(shared, batch, batch_bytes, 0)
        self.batches: list[list[tuple[int, list[int]]]] = []

    def _place_batch(self, batch: list[Share], synced: Any) -> None:
        self.batches.append([(ledger_id, list(ids)) for ledger_id, ids, _ in batch])


def _one_by_one(cache: dict[int, dict[int, bytes]], batch: int, batch_bytes: int) -> list[list[tuple[int, list[int]]]]:
    """The rule, an entry at a time (the placement's loop before it summed in C)."""
    out, current, count, size = [], [], 0, 0
    for ledger_id in sorted(cache):
        order, slots, start = sorted(cache[ledger_id]), cache[ledger_id], 0
        for at, entry_id in enumerate(order, 1):
            count, size = count + 1, size + len(slots[entry_id])
            if count >= batch or size >= batch_bytes:
                out.append(current + [(ledger_id, order[start:at])])
                current, count, size, start = [], 0, 0, at
        if start < len(order):
            current.append((ledger_id, order[start:]))
    return out + ([current] if current else [])


@pytest.mark.parametrize("seed", range(30))
def test_batches_are_cut_where_the_entry_by_entry_rule_cuts_them(seed: int) -> None:
    rnd = random.Random(seed)
    batch, batch_bytes = rnd.choice([1, 2, 5, 50]), rnd.choice([1, 100, 1000, 10**9])
    content = {ledger_id: {e: b"x" * rnd.choice([0, 1, 30, 200, 999]) for e in rnd.sample(range(300), rnd.randint(0, 60))}
               for ledger_id in rnd.sample(range(20), rnd.randint(1, 6))}
    cache = WriteCache(1 << 30)
    for ledger_id, slots in content.items():
        cache.active[ledger_id] = dict(slots)
    placement = _Recorded(_Shared(cache), batch, batch_bytes)
    placement.place()
    assert placement.batches == _one_by_one(content, batch, batch_bytes)
