"""Sequential read-ahead (walkit/client/_readahead.py, under ReadHandle.read and a
WriteAheadLog's replay): chunks in order, bounded by bytes, the next one read while the
current one is handed out, never more than one ahead; errors at their chunk; an
abandoned read cancels its read."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest

from walkit.client import Entry, LoopThread
from walkit.errors import BookieUnavailableError
from walkit.client import _readahead as readahead
from walkit.client._readahead import FIRST_CHUNK_BYTES, read_ahead


class _Ledger:
    """A stand-in for ReadState: entries of the sizes given, reads logged and slowed."""

    def __init__(self, size_of: Callable[[int], int], fail_at: int | None = None, delay: float = 0.0) -> None:
        self.size_of = size_of
        self.fail_at = fail_at
        self.delay = delay
        self.reads: list[tuple[int, int]] = []
        self.running = 0
        self.most_running = 0
        self.cancelled = 0

    async def read(self, first: int, last: int, max_bytes: int | None = None) -> list[Entry]:
        """As ReadState.read: with ``max_bytes``, the prefix whose entries hold that many
        bytes (one entry at least)."""
        self.reads.append((first, last))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(self.delay)
            entries: list[Entry] = []
            held = 0
            for e in range(first, last + 1):
                if self.fail_at == e:
                    raise BookieUnavailableError("no replica", entry=self.fail_at)
                entries.append(Entry(1, e, bytes(self.size_of(e))))
                held += self.size_of(e)
                if max_bytes is not None and held >= max_bytes:
                    break
            return entries
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread("readahead-test")
    yield thread
    thread.stop()


def _ids(chunks: list[list[Entry]]) -> list[int]:
    return [e.entry_id for chunk in chunks for e in chunk]


def test_chunks_cover_the_range_in_order_bounded_by_bytes(loop: LoopThread,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readahead, "CHUNK_BYTES", 1 << 16)  # the same arithmetic in less memory
    monkeypatch.setattr(readahead, "FIRST_CHUNK_BYTES", 1 << 10)
    big = (1 << 16) // 4  # four of these make a chunk
    ledger = _Ledger(lambda e: big if e >= 300 else 10)
    waits: list[float] = []
    chunks = list(read_ahead(loop, ledger, 3, 600, waits.append))  # type: ignore[arg-type]
    assert _ids(chunks) == list(range(3, 601))
    assert [first for first, _ in ledger.reads[1:]] == [chunk[-1].entry_id + 1 for chunk in chunks[:-1]]
    assert len(waits) == len(chunks) == len(ledger.reads)
    assert all(last == 600 for _, last in ledger.reads), "each read asks for the rest, bounded by bytes"
    sizes = [len(chunk) for chunk in chunks]
    assert sizes[0] == 1024 // 10 + 1, f"the first chunk is small: {sizes}"
    assert sizes[1] == 300 - 106 + 4, f"small entries, then as many big ones as 64 KiB holds {sizes}"
    assert set(sizes[2:-1]) == {4}, f"big entries: 64 KiB a chunk {sizes}"
    held = [sum(len(e.data) for e in chunk) for chunk in chunks]
    assert max(held) < (1 << 16) + big, f"no chunk holds more than its bound and one entry {held}"


def test_the_next_chunk_is_read_while_this_one_is_handed_out(loop: LoopThread) -> None:
    ledger = _Ledger(lambda e: 1000, delay=0.01)
    handed = 0
    for chunk in read_ahead(loop, ledger, 0, 2000):  # type: ignore[arg-type]
        handed += 1
        if chunk[-1].entry_id == 2000:
            break
        for _ in range(500):  # while this chunk is ours, the next one's read starts
            if len(ledger.reads) == handed + 1:
                break
            time.sleep(0.002)
        assert len(ledger.reads) == handed + 1, f"chunk {handed}: the next read did not start"
    assert ledger.most_running == 1, "never more than one chunk read ahead"


def test_a_failed_read_raises_at_its_chunk(loop: LoopThread) -> None:
    ledger = _Ledger(lambda e: 10, fail_at=40_000)  # in the second chunk
    got: list[int] = []
    with pytest.raises(BookieUnavailableError):
        for chunk in read_ahead(loop, ledger, 0, 100_000):  # type: ignore[arg-type]
            got += [e.entry_id for e in chunk]
    assert got == list(range(len(got))) and 0 < len(got) <= 40_000


def test_an_abandoned_replay_cancels_the_read_under_way(loop: LoopThread) -> None:
    ledger = _Ledger(lambda e: 1000, delay=0.5)
    chunks = read_ahead(loop, ledger, 0, 10_000)  # type: ignore[arg-type]
    assert [e.entry_id for e in next(chunks)] == list(range(-(-FIRST_CHUNK_BYTES // 1000)))
    chunks.close()
    for _ in range(100):
        if ledger.cancelled:
            break
        time.sleep(0.01)
    assert ledger.cancelled == 1 and ledger.running == 0


def test_one_entry_range_and_empty_entries(loop: LoopThread) -> None:
    ledger = _Ledger(lambda e: 0)
    assert _ids(list(read_ahead(loop, ledger, 5, 5))) == [5]  # type: ignore[arg-type]
    assert _ids(list(read_ahead(loop, ledger, 0, 999))) == list(range(1000))  # type: ignore[arg-type]
