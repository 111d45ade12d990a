"""The placement's run of appends (bookie/storage/_ledgerdir.py ``append_run``,
bookie/storage/_entrylog.py ``EntryLogWriter.append_run``): the same log files, byte for
byte, the same locations, rolls and usage as :meth:`LedgerDir.append` one entry at a time,
and on a failure the entries before it appended and counted, the failing one not."""

from __future__ import annotations

import os

import pytest

from bookie.fs.mem import MemFS
from bookie.storage._format import LOG_HEADER_SIZE, RECORD_HEADER
from bookie.storage._ledgerdir import LedgerDir


def _dir(fs: MemFS, size_limit: int, buffer_size: int) -> LedgerDir:
    d = LedgerDir(fs, "/ledgers", 0, size_limit, buffer_size)
    d.prepare()
    return d


def _files(fs: MemFS, d: LedgerDir) -> dict[str, bytes]:
    for w in d.rolled + ([d.writer] if d.writer is not None else []):
        w.write_out()
    return {name: fs.open(f"{d.logs_dir}/{name}").pread(1 << 24, 0) for name in sorted(fs.listdir(d.logs_dir))}


@pytest.mark.parametrize("size_limit, buffer_size", [
    (1 << 20, 1 << 16),  # one log, one buffer write-out or none
    (LOG_HEADER_SIZE + 3 * (RECORD_HEADER.size + 300), 700),  # rolls every few records, a write-out every two
    (LOG_HEADER_SIZE + 10, 1),  # a record larger than a log: each alone in a log of its own
])
def test_a_run_writes_what_appends_one_by_one_write(size_limit: int, buffer_size: int) -> None:
    runs = [(7, list(range(0, 40)), 100), (9, list(range(5, 25)), 300), (7, [40, 42, 41], 1000)]
    fs_one, fs_run = MemFS(), MemFS()
    one, run = _dir(fs_one, size_limit, buffer_size), _dir(fs_run, size_limit, buffer_size)
    for ledger_id, entry_ids, size in runs:
        slots = {e: os.urandom(size - e % 7) for e in entry_ids}
        want = {e: one.append(ledger_id, e, slots[e]) for e in entry_ids}
        table: dict[int, int] = {3: 12345}  # a location already pending stays
        assert run.append_run(ledger_id, entry_ids, slots, table) == len(entry_ids) == run.run_placed
        assert table == {3: 12345} | want
    assert len(run.rolled) == len(one.rolled)
    assert [w.ledgers for w in run.rolled] == [w.ledgers for w in one.rolled]
    assert run.writer is not None and one.writer is not None and run.writer.ledgers == one.writer.ledgers
    assert run.writer.position == one.writer.position
    assert _files(fs_run, run) == _files(fs_one, one)


def _broken_dir() -> LedgerDir:
    """A dir whose active log's buffer (1000 bytes) cannot be written out."""
    d = _dir(MemFS(), 1 << 20, 1000)
    d.append(1, 0, b"x")  # the active log exists

    def broken(*_: object) -> None:
        raise OSError(5, "I/O error")

    assert d.writer is not None
    d.writer.file.pwrite = broken  # type: ignore[method-assign]
    return d


def test_a_failed_write_out_leaves_what_appends_one_by_one_leave() -> None:
    slots = {e: bytes([e]) * 300 for e in range(1, 8)}
    one, want = _broken_dir(), {}
    with pytest.raises(OSError):
        for e in slots:
            want[e] = one.append(1, e, slots[e])
    run, table = _broken_dir(), {}
    with pytest.raises(OSError):
        run.append_run(1, list(slots), slots, table)
    assert 0 < run.run_placed == len(want) < len(slots) and table == want
    assert run.writer is not None and one.writer is not None
    assert (run.writer.position, run.writer.ledgers) == (one.writer.position, one.writer.ledgers)
