"""The writer's batching policy (walkit/wal/_batching.py): pure, so checked directly -
against the arithmetic the writer has always used, so entries are cut where they were."""

from __future__ import annotations

import random

from walkit.wal._batching import BatchPolicy
from walkit.wal._format import FRAGMENT_HEAD_SIZE, pack_records


def _original(records: list[bytes], max_entry_bytes: int) -> int:
    """The writer's cut before the policy had a module of its own (``_pump``)."""
    if not sum(map(len, records)) + 4 * len(records) > max_entry_bytes - 12:
        return len(records)
    take, size = 0, 0
    for record in records:
        if len(record) > max_entry_bytes - 16 or (take and size + len(record) + 4 > max_entry_bytes):
            break
        take += 1
        size += len(record) + 4
    return take


def test_the_same_cut_as_the_original_arithmetic() -> None:
    rng = random.Random(36)
    for _ in range(20000):
        max_entry = rng.choice([1024, 1100, 4096, 1 << 20])
        scale = rng.choice([1, 16, max_entry // 8, max_entry // 2, max_entry])
        records = [b"x" * rng.randint(0, scale + 20) for _ in range(rng.randint(1, 12))]
        assert BatchPolicy(max_entry).take(records) == _original(records, max_entry)


def test_edges() -> None:
    policy = BatchPolicy(1024)
    assert policy.max_single == 1024 - 16 and policy.fragment_room == 1024 - FRAGMENT_HEAD_SIZE
    assert policy.take([b"a" * policy.max_single]) == 1  # fits: goes as a batch
    assert len(pack_records([b"a" * policy.max_single])) <= 1024
    assert policy.take([b"a" * (policy.max_single + 1)]) == 0  # alone, in fragments
    assert policy.take([b"a", b"b" * 2000]) == 1  # nothing goes with a record larger than an entry
    assert policy.take([b"a" * 600, b"b" * 600]) == 1  # the second waits for the next entry
    assert policy.take([b"a" * 10] * 10) == 10
