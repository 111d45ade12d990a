"""Admission's whole-batch path (bookie/_admission.py ``admit_batch`` / ``_clean_run``):
a batch of one ledger with one key is decided with C loops over the batch, with exactly
the outcome of the add-at-a-time loop (``_admit_each``) - admitted adds and entries,
refusals and their errors, MASTER_KEY records - clean or not, fenced or not, any key."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from bookie import Bookie, BookieConfig
from bookie import _admission as admission
from bookie._admission import _admit_each, admit_batch
from bookie.fs.mem import MemFS
from bookie.journal import Record
from walkit.errors import BookieShutdownError
from walkit.protocol import AddEntry, encode_entry

KEY = b"k" * 20
MAX = 4096


def _entry(ledger: int, entry_id: int, size: int = 10) -> bytes:
    return encode_entry(ledger, entry_id, entry_id - 1, size, b"b" * size)


def _bookie(fenced: bool, known: bool) -> Iterator[Bookie]:
    b = Bookie(BookieConfig(bookie_id="b:1", journal_directory="/bk/j", ledger_directories=["/bk/l"],
                            journal_pre_alloc_size_mb=1), fs=MemFS())
    b.start()
    try:
        if known or fenced:
            assert b.add_entry(1, 0, KEY, _entry(1, 0)).result(20) is None
        if fenced:
            assert b.fence(1, KEY).result(20) is None
        yield b
    finally:
        b.shutdown()


Batch = Callable[[], list[AddEntry]]
BATCHES: dict[str, Batch] = {
    "clean": lambda: [AddEntry(1, e, KEY, _entry(1, e)) for e in range(1, 30)],
    "recovery adds": lambda: [AddEntry(1, e, KEY, _entry(1, e), recovery=e % 2 == 0) for e in range(1, 9)],
    "another key": lambda: [AddEntry(1, e, b"other-key", _entry(1, e)) for e in range(1, 5)],
    "a bad header": lambda: [AddEntry(1, e, KEY, _entry(1, e if e != 3 else 9)) for e in range(1, 6)],
    "too large": lambda: [AddEntry(1, e, KEY, _entry(1, e, MAX if e == 2 else 10)) for e in range(1, 4)],
    "two keys": lambda: [AddEntry(1, e, KEY if e < 3 else b"other-key", _entry(1, e)) for e in range(1, 5)],
    "one add": lambda: [AddEntry(1, 7, KEY, _entry(1, 7))],
}


@pytest.fixture(autouse=True)
def _every_batch_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch takes the whole-batch path here, however small (``RUN_MIN``)."""
    monkeypatch.setattr(admission, "RUN_MIN", 1)


def _decide(b: Bookie, adds: list[AddEntry], whole: bool) -> tuple[object, ...]:
    refused: list[tuple[BaseException, AddEntry]] = []
    records: list[Record] = []
    if whole:
        admitted, entries = admit_batch(b.records, adds, MAX, refused, records)
    else:
        admitted, entries = _admit_each(b.records, adds, MAX, refused, records, {}, (-1, b"", False))
    b.records.drop(records, BookieShutdownError("test over"))
    return (admitted, entries, [(type(err), str(err), add) for err, add in refused],
            [tuple(record[:4]) for record in records])


@pytest.mark.parametrize("name", sorted(BATCHES))
@pytest.mark.parametrize("fenced, known", [(False, False), (False, True), (True, True)])
def test_a_batch_is_decided_as_the_add_at_a_time_loop_decides_it(name: str, fenced: bool, known: bool) -> None:
    adds = BATCHES[name]()
    outcomes = []
    for whole in (True, False):
        for b in _bookie(fenced, known):
            outcomes.append(_decide(b, adds, whole))
    assert outcomes[0] == outcomes[1]
    if name == "clean" and not fenced:
        assert outcomes[0][0] == adds and not outcomes[0][2]
