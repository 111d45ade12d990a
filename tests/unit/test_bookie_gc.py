"""A bookie process's garbage collector (bookie._main.tune_gc, issue 38): what exists at
the start is frozen and the young generation is collected every GC_YOUNG_THRESHOLD
allocations; cycles made later are still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from bookie._main import GC_YOUNG_THRESHOLD, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_tune_gc_freezes_the_start_and_widens_the_young_generation(restored_gc: None) -> None:
    _, middle, old = gc.get_threshold()
    before = gc.get_freeze_count()
    tune_gc()
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, middle, old)
    assert gc.get_freeze_count() > before


def test_cycles_made_after_tune_gc_are_still_collected(restored_gc: None) -> None:
    tune_gc()
    refs = [weakref.ref(_Node()) for _ in range(3)]
    assert all(r() is not None for r in refs)  # unreachable, but in cycles: alive until a collection
    kept = [[] for _ in range(2 * GC_YOUNG_THRESHOLD)]  # tracked allocations alone trigger a young collection
    assert len(kept) == 2 * GC_YOUNG_THRESHOLD
    assert all(r() is None for r in refs)
