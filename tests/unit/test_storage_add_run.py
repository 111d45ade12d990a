"""The storage's whole-batch add (bookie/storage/_adds.py ``EntryAdds._add_run``): the
usual batch - new entries of one known ledger - is cached with C loops, leaving the write
cache, the ledger's last entry id and the cached bytes exactly as the entry-at-a-time
loop leaves them; any other batch (re-adds, several ledgers, an unknown ledger, a bad
entry) is left to that loop."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bookie import Bookie, BookieConfig
from bookie.fs.mem import MemFS
from bookie.storage import _adds as adds_module
from bookie.storage._adds import EntryAdds
from walkit.protocol import encode_entry

KEY = b"k" * 20


def _entry(ledger: int, entry_id: int, size: int = 10) -> bytes:
    return encode_entry(ledger, entry_id, entry_id - 1, size, b"b" * size)


def _bookie() -> Iterator[Bookie]:
    b = Bookie(BookieConfig(bookie_id="b:1", journal_directory="/bk/j", ledger_directories=["/bk/l"],
                            journal_pre_alloc_size_mb=1, flush_interval=3_600_000), fs=MemFS())
    b.start()
    try:
        assert b.add_entry(1, 0, KEY, _entry(1, 0)).result(20) is None
        yield b
    finally:
        b.shutdown()


BATCHES = {
    "new entries": [[(1, e, _entry(1, e, e)) for e in range(1, 40)]],
    "re-adds": [[(1, e, _entry(1, e)) for e in range(1, 5)], [(1, e, _entry(1, e, 99)) for e in range(3, 8)]],
    "two ledgers": [[(1, 1, _entry(1, 1)), (2, 0, _entry(2, 0)), (1, 2, _entry(1, 2))]],
    "unknown ledger": [[(5, e, _entry(5, e)) for e in range(3)]],
    "an id out of range": [[(1, 1, _entry(1, 1)), (1, -4, _entry(1, 2))]],
    "a bytearray": [[(1, 1, _entry(1, 1)), (1, 2, bytearray(_entry(1, 2)))]],
    "out of order": [[(1, e, _entry(1, e)) for e in (9, 3, 12, 4)]],
}


def _state(b: Bookie, batches: list[list[tuple[int, int, bytes]]]) -> tuple[object, ...]:
    failed = [[(i, type(exc)) for i, exc in b.storage.add_entries(list(batch))] for batch in batches]
    cache = b.storage._shared.cache  # type: ignore[attr-defined]
    lasts = {ledger: state.last_entry_id for ledger, state in b.storage._shared.states.items()}  # type: ignore[attr-defined]
    return failed, cache.active, cache.bytes, lasts


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_a_batch_is_cached_as_the_entry_at_a_time_loop_caches_it(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adds_module, "RUN_MIN", 1)  # every batch, however small, may take the whole-batch path
    states = []
    for whole in (True, False):
        if not whole:
            monkeypatch.setattr(EntryAdds, "_add_run", lambda *args: False)
        for b in _bookie():
            states.append(_state(b, BATCHES[name]))
    assert states[0] == states[1]
