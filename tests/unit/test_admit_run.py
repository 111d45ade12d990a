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
    # several ledgers in one batch (round-robin writers): ledger 1 as the fixture made it, 2 and 3 new
    "many ledgers": lambda: [AddEntry(lg, e, KEY, _entry(lg, e)) for e in range(1, 12) for lg in (1, 2, 3)],
    "many ledgers, recovery adds": lambda: [AddEntry(lg, e, KEY, _entry(lg, e), recovery=e % 2 == 0)
                                            for e in range(1, 6) for lg in (1, 2)],
    "many ledgers, another key": lambda: [AddEntry(lg, e, b"other-key" if lg == 1 else KEY, _entry(lg, e))
                                          for e in range(1, 6) for lg in (1, 2, 3)],
    "many ledgers, a bad header": lambda: [AddEntry(lg, e, KEY, _entry(lg, e if (lg, e) != (2, 3) else 9))
                                           for e in range(1, 6) for lg in (1, 2)],
    "many ledgers, too large": lambda: [AddEntry(lg, e, KEY, _entry(lg, e, MAX if (lg, e) == (3, 2) else 10))
                                        for e in range(1, 4) for lg in (1, 2, 3)],
    "many ledgers, two keys in one": lambda: [AddEntry(lg, e, b"other-key" if (lg, e) == (2, 4) else KEY,
                                                       _entry(lg, e)) for e in range(1, 6) for lg in (1, 2)],
    "many ledgers, a new one with two keys": lambda: [AddEntry(3, 1, b"other-key", _entry(3, 1))] + [
        AddEntry(lg, e, KEY, _entry(lg, e)) for e in range(1, 4) for lg in (2, 3)],
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
    if name in ("clean", "many ledgers") and not fenced:
        assert outcomes[0][0] == adds and not outcomes[0][2]


@pytest.mark.parametrize("known", [False, True])
def test_a_clean_batch_of_many_ledgers_takes_the_whole_batch_path(known: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clean batch of several ledgers is decided without the add-at-a-time loop, and
    asks admit_key about a ledger only when its durable key is not the one given: once
    per new ledger (its MASTER_KEY record), never for a known one."""
    adds = BATCHES["many ledgers"]()
    asked: list[int] = []
    real_admit_key = admission.admit_key

    def counting(ledgers: object, ledger_id: int, *args: object) -> bool:
        asked.append(ledger_id)
        return real_admit_key(ledgers, ledger_id, *args)  # type: ignore[arg-type]

    def no_loop(*args: object) -> object:
        raise AssertionError("a clean batch of many ledgers went through the add-at-a-time loop")

    for b in _bookie(False, known):
        monkeypatch.setattr(admission, "admit_key", counting)
        monkeypatch.setattr(admission, "_admit_each", no_loop)
        admitted, entries, refused, records = _decide(b, adds, True)
    assert admitted == adds and not refused
    assert entries == [(a.ledger_id, a.entry_id, a.data) for a in adds]
    assert asked == ([2, 3] if known else [1, 2, 3])
    assert [record[1] for record in records] == asked  # a MASTER_KEY record per new ledger, in order
