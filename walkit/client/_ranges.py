"""Reading runs of entries with READ_RANGE (client loop only).

Theory of operation
-------------------
A sequential read (``read()``, a replay, a tail catching up, the Spark source) wants many
consecutive entries. Read one READ_ENTRY at a time, every entry costs a request, a
bookie task and a future; :func:`read_batched` asks for them in runs instead
(:mod:`walkit.protocol._range`: one request, one frame of consecutive entries back).

* **Where.** Only ledgers whose every bookie holds every entry (E = Qw, the default
  3/3/2) are read in runs: then any replica of a fragment can answer any run of it.
  A striped ledger (E > Qw) is read entry by entry, as before. A run never crosses a
  fragment's end (an ensemble change): each fragment's runs go to its own bookies.
* **Sticky.** Every run of one reader goes to the same replica of the fragment (each
  reader picks one at random, so readers - Spark tasks of one ledger too - spread over
  the bookies), keeping that bookie's page cache on one stream. A replica that failed
  lately goes last (:meth:`ClientCore.read_order`), so a reader moves on for good once
  its bookie fails and others move away from it too.
* **Pipelined by bytes and count.** A read is cut into spans of consecutive entries; at
  most ``read_batches_in_flight`` spans are under way, each asking for at most
  ``read_batch_bytes`` of entries (and at most :data:`~walkit.protocol.MAX_RANGE_ENTRIES`).
  A span's count comes from the size of the entries the reader saw last (its first span,
  before any is known, asks for :data:`FIRST_SPAN`, alone: no other span starts until
  it answered), and a span also stops once it holds ``read_batch_bytes`` (entries larger
  than those seen before): the read then goes on from where it stopped and drops the
  spans started after it. So a read holds about ``read_batches_in_flight *
  read_batch_bytes`` in flight whatever the entry sizes.
* **Short answers.** A bookie answers with the stored entries from the span's next one
  on and stops where it must (an entry it does not hold, its byte or frame limit): the
  span asks again from where the answer stopped - the same bookie after progress, the
  next replica when this one has nothing to give (an error, the entry not held, a bad
  digest). When every replica of the fragment failed at one entry, that entry is read
  by :meth:`LedgerReader.read_entry` (speculation, timeouts, the error that entry
  deserves: NoSuchEntryError only when every replica says it is not there), and the
  span goes on in runs after it.
* **Checked as single reads are.** Every entry of an answer is checked (digest, ledger
  and entry ids); the entries before a bad one are kept, the rest is asked of another
  replica. Spans whose replicas all are older bookies (below) are read entry by entry,
  ``read_parallelism`` in flight.
* **Speculative.** A run not answered within ``speculative_read_timeout`` is asked of the
  next replica too, the first answer with entries wins, and the slow replica counts as
  failed lately (later runs go elsewhere first). A run waits ``read_timeout`` at most.
* **Older bookies.** A bookie that does not know READ_RANGE (an older walkit answers
  EBADREQ) is remembered for :data:`~walkit.client._core.NO_RANGE_MEMORY` seconds (it
  may be upgraded meanwhile) and read entry by entry.
"""

from __future__ import annotations

import asyncio
import collections
from itertools import repeat

from walkit.client._read import Entry, LedgerReader, request_with_timeout
from walkit.errors import BookieUnavailableError, ProtocolError, WalkitError
from walkit.protocol import (
    ENTRY_HEADER,
    MAX_RANGE_ENTRIES,
    RANGE_RESPONSE_OVERHEAD,
    ReadRange,
    ReadRangeResponse,
    Response,
)

__all__ = ["read_entries", "read_batched", "ask_range", "is_older_bookie", "span_count", "FIRST_SPAN", "EACH_CHUNK",
           "ENTRY_COST"]

FIRST_SPAN = 64  # entries asked for in a reader's first span, before any entry's size is known
EACH_CHUNK = 256  # entries read one by one per bounded read at most (read_entries with max_bytes)
_LENGTH_FIELD = 4  # bytes an answer spends on each entry's length
_SMALLEST_ENTRY = ENTRY_HEADER.size  # no stored entry is shorter than its header
ENTRY_COST = 64  # bytes a returned entry counts for beyond its data (its Entry), in a bounded read


def is_older_bookie(error: WalkitError) -> bool:
    """Whether ``error`` answered a READ_RANGE as a bookie without the op does (EBADREQ
    for an op it cannot name)."""
    return isinstance(error, ProtocolError) and error.context.get("op") == "INVALID"


async def ask_range(reader: LedgerReader, bookie: str, first: int,
                    count: int) -> tuple[ReadRangeResponse | None, WalkitError | None]:
    """One READ_RANGE of ``count`` entries from ``first`` to ``bookie`` (at most
    ``read_batch_bytes`` of them): its answer, or the error (the bookie's, a timeout after
    ``read_timeout``, or ProtocolError for an answer to another range)."""
    config = reader.core.config
    room = config.max_frame_size - RANGE_RESPONSE_OVERHEAD  # of this client's frames, for entries and lengths
    count = min(MAX_RANGE_ENTRIES, count, room // (_LENGTH_FIELD + _SMALLEST_ENTRY))
    request = ReadRange(reader.ledger_id, first, count, min(config.read_batch_bytes, room - _LENGTH_FIELD * count))
    answer: asyncio.Future[tuple[ReadRangeResponse | None, WalkitError | None]] = \
        asyncio.get_running_loop().create_future()

    def answered(response: Response | None, error: WalkitError | None, _: object) -> None:
        if answer.done():
            return
        if error is not None:
            answer.set_result((None, error))
        elif isinstance(response, ReadRangeResponse) and response.first_entry == first:
            answer.set_result((response, None))
        else:
            answer.set_result((None, ProtocolError("a READ_RANGE answer for another range", bookie=bookie,
                                                   ledger=reader.ledger_id, entry=first)))

    request_with_timeout(reader.core, bookie, request, answered, None)
    return await answer


def span_count(reader: LedgerReader) -> int:
    """Entries a span asks for: as many as fit in ``read_batch_bytes`` at the size of
    the entries this reader saw last."""
    config = reader.core.config
    limit = min(config.read_batch_bytes, config.max_frame_size - RANGE_RESPONSE_OVERHEAD)
    size = reader.entry_size
    if size is None:
        return FIRST_SPAN
    return max(1, min(MAX_RANGE_ENTRIES, limit // (size + _LENGTH_FIELD)))


async def read_entries(reader: LedgerReader, first: int, last: int, max_bytes: int | None = None) -> list[Entry]:
    """Entries ``first``..``last`` in order: in runs where every bookie holds every entry
    (E = Qw; unless the client's ``range_reads`` is off), else entry by entry. With
    ``max_bytes``, a prefix of them instead (one entry at least): the read stops once the
    entries returned hold ``max_bytes`` (each counting :data:`ENTRY_COST` more than its
    data), or read entry by entry, after :data:`EACH_CHUNK` entries at most (or fewer, by
    the size of the entries seen lately)."""
    if reader.metadata.ensemble_size == reader.metadata.write_quorum and reader.core.config.range_reads:
        return await read_batched(reader, first, last, max_bytes)
    if max_bytes is not None:
        size = reader.entry_size
        count = EACH_CHUNK if size is None else max(1, min(EACH_CHUNK, max_bytes // max(1, size)))
        last = min(last, first + count - 1)
    entries = await reader.read_each(first, last)
    reader.entry_size = max(len(e.data) for e in entries)
    return entries


async def read_batched(reader: LedgerReader, first: int, last: int, max_bytes: int | None = None) -> list[Entry]:
    """Entries ``first``..``last`` in order, in runs (see the module docstring); with
    ``max_bytes``, the prefix read by the time the entries held ``max_bytes`` (one span
    at least): no span is started once the entries held and those expected from the
    spans under way (at the size seen lately) reach it, so a bounded read asks the
    bookies for little it does not return."""
    config = reader.core.config
    loop = asyncio.get_running_loop()
    meta = reader.metadata
    spans: collections.deque[tuple[asyncio.Task[list[Entry]], int, _Span]] = collections.deque()  # (.., bytes expected, ..)
    results: list[Entry] = []
    held = expected = 0
    next_id = first
    try:
        while next_id <= last or spans:
            while next_id <= last and len(spans) < config.read_batches_in_flight and (
                    max_bytes is None or not spans or held + expected < max_bytes):
                index = meta.fragment_index(next_id)
                end = meta.fragment_end(index)
                hi = min(last, next_id + span_count(reader) - 1, last if end is None else end)
                guess = (hi - next_id + 1) * ((reader.entry_size or 0) + ENTRY_COST)
                run = _Span(reader, next_id, hi, meta.ensembles[index][1])
                spans.append((loop.create_task(run.run()), guess, run))
                expected += guess
                next_id = hi + 1
                if reader.entry_size is None:
                    break  # one span until the entries' size is known
            span, guess, run = spans[0]
            entries = await span
            spans.popleft()
            expected -= guess
            results.extend(entries)
            if run.lo <= run.hi:  # cut short by its byte budget (entries larger than guessed): go on from there
                _drop(spans)
                expected, next_id = 0, run.lo
            if max_bytes is not None:
                held += sum([len(e.data) for e in entries]) + ENTRY_COST * len(entries)
                if held >= max_bytes:
                    break
    finally:
        _drop(spans)
    return results


def _drop(spans: collections.deque[tuple[asyncio.Task[list[Entry]], int, _Span]]) -> None:
    """Cancel the spans under way (a finished one's error is not what the read raises)."""
    for span, _, _ in spans:
        if span.done():
            if not span.cancelled():
                span.exception()  # retrieved
        else:
            span.cancel()
    spans.clear()


class _Span:
    """Entries ``lo``..``hi`` of one fragment, in runs (see the module docstring)."""

    def __init__(self, reader: LedgerReader, lo: int, hi: int, ensemble: tuple[str, ...]) -> None:
        self.reader = reader
        self.lo = lo
        self.hi = hi
        shift = reader.replica_choice % len(ensemble)  # sticky: one replica per reader, spread over readers
        self.ensemble = ensemble[shift:] + ensemble[:shift]
        self.out: list[Entry] = []
        #: bytes after which the span stops short (its count was guessed from smaller entries)
        self.budget = reader.core.config.read_batch_bytes
        self.size = 0

    async def run(self) -> list[Entry]:
        reader, core = self.reader, self.reader.core
        failed: set[str] = set()  # replicas that could not give entry self.lo
        while self.lo <= self.hi and self.size < self.budget:
            order = [b for b in core.read_order(self.ensemble) if b not in failed]
            capable = [b for b in order if core.speaks_range_reads(b)]
            if not capable:
                if not any(core.speaks_range_reads(b) for b in self.ensemble):  # no replica speaks READ_RANGE
                    each = await reader.read_each(self.lo, self.hi)
                    self.out.extend(each)
                    self.lo = self.hi + 1
                    reader.entry_size = max(len(e.data) for e in each)  # later spans sized by it
                    return self.out
                self._one(await reader.read_entry(self.lo))  # every replica failed here: it decides
                failed.clear()
                continue
            for bookie, response, error in await self._ask(capable):
                if response is None:
                    if error is not None and is_older_bookie(error):
                        core.note_no_range_reads(bookie)  # an older bookie (EBADREQ, op unknown): entry by entry
                    elif isinstance(error, BookieUnavailableError):
                        core.bookie_failed(bookie)
                    failed.add(bookie)
                elif self._take(response):
                    failed.clear()
                else:
                    failed.add(bookie)  # a bad entry: the rest from another replica
        return self.out

    async def _ask(self, capable: list[str]) -> list[tuple[str, ReadRangeResponse | None, WalkitError | None]]:
        """The run from ``self.lo`` asked of ``capable[0]``, and - speculatively - of the
        next replica too when no answer came within ``speculative_read_timeout`` (the slow
        one is then remembered as failed, so later runs go elsewhere first): the answers
        heard, in order, up to the first that carries entries."""
        reader, core = self.reader, self.reader.core
        count = self.hi - self.lo + 1
        asked = {asyncio.ensure_future(ask_range(reader, capable[0], self.lo, count)): capable[0]}
        heard: list[tuple[str, ReadRangeResponse | None, WalkitError | None]] = []
        spare = 1
        try:
            while asked:
                done, _ = await asyncio.wait(asked, timeout=core.config.speculative_read_timeout
                                             if spare < len(capable) else None, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    core.stats.speculative_reads += 1
                    for slow in asked.values():
                        core.bookie_failed(slow)
                    asked[asyncio.ensure_future(ask_range(reader, capable[spare], self.lo, count))] = capable[spare]
                    spare += 1
                    continue
                for task in done:
                    bookie = asked.pop(task)
                    response, error = task.result()
                    heard.append((bookie, response, error))
                    if response is not None:
                        return heard
            return heard
        finally:
            for task in asked:
                task.cancel()

    def _one(self, read: tuple[object, bytes, int]) -> None:
        self.out.append(Entry(self.reader.ledger_id, self.lo, read[1]))
        self.size += len(read[1])
        self.reader.entry_size = len(read[1])
        self.lo += 1

    def _take(self, response: ReadRangeResponse) -> bool:
        """Keep the answer's entries up to the first that does not check (digest, ids);
        whether every one did."""
        reader = self.reader
        ledger_id, lo = reader.ledger_id, self.lo
        entries = response.entries[: self.hi - lo + 1]
        payloads = reader.check_run(lo, entries)
        taken = len(payloads)
        self.out += map(tuple.__new__, repeat(Entry), zip(repeat(ledger_id), range(lo, lo + taken), payloads))
        size = sum(map(len, entries[:taken]))
        self.lo = lo + taken
        self.size += size
        stats = reader.core.stats
        stats.range_reads += 1
        if taken:
            reader.entry_size = size // taken
            stats.reads += taken
        return taken == len(entries)
