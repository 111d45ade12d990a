"""Ledger recovery: what opening an unclosed ledger with ``recovery=True`` does.

BookKeeper's algorithm (``docs/architecture.md``, "Recovery"):

1. Compare-and-set the metadata OPEN -> IN_RECOVERY (a CLOSED ledger needs nothing; one
   already IN_RECOVERY - another recoverer, or one that died - is recovered again).
   From here the writer's ensemble changes and close fail.
2. Fence: a fencing read of the last entry on every bookie of the last ensemble. A bookie
   journals the fence before it answers and then refuses the writer's adds (EFENCED).
   A writer in this very client (one that recovers a ledger it still writes) needs no
   bookie to tell it: it is fenced first, quietly (no "another client" warning).
3. Wait until every write set of that ensemble has Qw - Qa + 1 definite answers (an
   entry, or "no such entry/ledger"): then no add of the old writer can still reach Qa
   acks. The start point is the highest LAC in the answers (or the entry before the last
   fragment, if higher).
4. Read forward from start + 1. An entry exists as soon as one replica returns it with a
   valid digest; it is absent once Qw - Qa + 1 replicas of its write set say it is not
   there; the first absent entry ends the ledger. Where every bookie holds every entry
   (E = Qw) the entries are read in runs (:func:`_found_in_runs`: READ_RANGE to every
   bookie of the ensemble, round after round); else (or once a bookie turns out not to
   know READ_RANGE) one entry at a time with fencing reads, ``recovery_read_parallelism``
   ahead. Runs need no fencing of their own: step 3 already fenced Qw - Qa + 1 bookies
   of every write set, so the old writer can no longer reach Qa acks for any entry.
5. Re-add every entry found, as it was read, with the recovery flag, to its whole write
   set (a bookie failing here is replaced, in memory only).
6. Compare-and-set IN_RECOVERY -> CLOSED with the last entry, its length and those
   ensembles. Concurrent recoverers read the same fenced bookies; whichever closes
   first decides, and the others take its metadata.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncGenerator

from walkit.client._core import ClientCore
from walkit.client._entry_codec import EntryCodec
from walkit.client._ranges import ask_range, is_older_bookie, span_count
from walkit.client._read import LedgerReader, covers_every_write_set, is_absent, pick_error, request_with_timeout
from walkit.client._writer import LedgerWriter
from walkit.errors import (
    BookieUnavailableError,
    DigestMismatchError,
    NotEnoughBookiesError,
    UnauthorizedError,
    WalkitError,
)
from walkit.metadata import LedgerMetadata, LedgerState
from walkit.protocol import EntryHeader, ReadEntry, ReadEntryResponse, Response

__all__ = ["recover"]

_Found = tuple[EntryHeader, bytes] | None


async def recover(core: ClientCore, ledger_id: int, codec: EntryCodec) -> tuple[LedgerMetadata, int]:
    """Recover and close ``ledger_id``; its final metadata and version."""

    def mark(current: LedgerMetadata) -> LedgerMetadata | None:
        return current.with_state(LedgerState.IN_RECOVERY) if current.state is LedgerState.OPEN else None

    meta, version = await core.md(core.ledgers.update, ledger_id, mark)
    if meta.state is LedgerState.CLOSED:
        return meta, version
    _fence_own_writer(core, ledger_id)
    reader = LedgerReader(core, meta, codec)
    lac = await _fence(core, reader)
    start = max(lac, meta.ensembles[-1][0] - 1)
    writer = LedgerWriter(core, meta, version, codec, recovery=True, lac=start)
    adds: list[asyncio.Future[int]] = []
    found = _found(core, reader, start + 1)
    try:
        async for entry_id, header, data in found:
            adds.append(asyncio.wrap_future(writer.submit_recovered(entry_id, data, header.length)))
        await asyncio.gather(*adds)
    except BaseException as exc:
        for add in adds:
            if add.done() and not add.cancelled():
                add.exception()
        writer.fail_for_close(exc if isinstance(exc, WalkitError) else WalkitError("recovery abandoned",
                                                                                     ledger=ledger_id))
        raise
    finally:
        await found.aclose()
    if not adds and start >= 0:
        header, _, _ = await reader.read_entry(start)  # nothing past the start: its length is the ledger's
        writer.lac_length = header.length
    meta = await writer.close()
    core.stats.recoveries += 1
    return meta, writer.version


def _fence_own_writer(core: ClientCore, ledger_id: int) -> None:
    """This client's own writer of the ledger, if it has one open (the application
    recovers a ledger it still writes), is fenced here, not by a bookie's EFENCED later:
    its adds fail at once, and its end is no news to warn about."""
    with core.writers_lock:
        own = [w for w in core.writers if isinstance(w, LedgerWriter) and w.ledger_id == ledger_id and not w.recovery]
    for writer in own:
        writer.fenced_here()


async def _fence(core: ClientCore, reader: LedgerReader) -> int:
    """Steps 2-3: fence the last ensemble; the highest LAC once every write set is covered."""
    meta = reader.metadata
    ensemble = meta.ensembles[-1][1]
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    answered: set[int] = set()
    lacs: list[int] = [-1]
    errors: list[WalkitError] = []
    outstanding = [len(ensemble)]

    def decide() -> None:
        if done.done():
            return
        if covers_every_write_set(meta.ensemble_size, meta.write_quorum, meta.ack_quorum, answered):
            done.set_result(max(lacs))
        elif outstanding[0] == 0:
            done.set_exception(NotEnoughBookiesError(
                "cannot recover: too few bookies of a write set answered the fencing read", ledger=meta.ledger_id,
                answered=len(answered), needed_per_write_set=meta.write_quorum - meta.ack_quorum + 1,
                errors="; ".join(str(e) for e in errors)[:500] or None))

    def answer(response: Response | None, error: WalkitError | None, index: int) -> None:
        outstanding[0] -= 1
        checked = reader.verified(response, error)
        if not isinstance(checked, WalkitError):
            assert isinstance(response, ReadEntryResponse)
            lacs.append(max(checked[0].lac, response.lac))
            answered.add(index)
        elif is_absent(checked):
            answered.add(index)
        elif isinstance(checked, UnauthorizedError):
            if not done.done():
                done.set_exception(checked)
            return
        else:
            errors.append(checked)
        decide()

    request = ReadEntry(meta.ledger_id, -1, True, reader.key)
    for index, bookie in enumerate(ensemble):
        request_with_timeout(core, bookie, request, answer, index)
    return await done


def _found(core: ClientCore, reader: LedgerReader, first: int) -> AsyncGenerator[tuple[int, EntryHeader, bytes], None]:
    """Step 4: the entries that exist from ``first`` on, in order, up to the first absent one."""
    meta = reader.metadata
    if meta.ensemble_size == meta.write_quorum and core.config.range_reads:
        return _found_in_runs(core, reader, first)
    return _found_one_by_one(core, reader, first)


async def _found_in_runs(core: ClientCore, reader: LedgerReader,
                         first: int) -> AsyncGenerator[tuple[int, EntryHeader, bytes], None]:
    """Step 4 where every bookie holds every entry: each round asks every bookie of the
    last ensemble still answering for a run from the next undecided entry and waits for
    all of them. The entries some answer carries (checked) are found, up to the first
    that none carries (the answers stopped there: an entry they lack, or their byte
    limit), and the next round starts there. A round that finds nothing decides its
    first entry: absent when Qw - Qa + 1 bookies said they do not hold it (ENOENTRY).
    Otherwise - an older bookie that does not know READ_RANGE, or too few definite
    answers (errors, bookies gone) - the rest is read with single fencing reads, which
    ask every replica of each entry again and fail recovery only if they cannot decide.
    A bookie that timed out or went away is not asked again in the rounds."""
    meta = reader.metadata
    bookies = list(meta.ensembles[-1][1])
    need_absent = meta.write_quorum - meta.ack_quorum + 1
    next_id = first
    while True:
        count = span_count(reader)
        answers = await asyncio.gather(*[ask_range(reader, bookie, next_id, count) for bookie in bookies])
        found: list[tuple[EntryHeader, bytes]] = []  # entries next_id, next_id + 1, ... some answer carried
        absent = 0
        for bookie, (response, error) in zip(list(bookies), answers):
            if response is not None:
                _extend(reader, next_id, response.entries, found)
            elif error is not None and is_older_bookie(error):
                core.note_no_range_reads(bookie)
                bookies.remove(bookie)
            elif error is not None and is_absent(error):
                absent += 1
            elif isinstance(error, BookieUnavailableError):
                core.bookie_failed(bookie)
                bookies.remove(bookie)
        if found:
            core.stats.reads += len(found)
            core.stats.range_reads += 1
            reader.entry_size = sum(len(data) for _, data in found) // len(found)
            for i, (header, data) in enumerate(found):
                yield next_id + i, header, data
            next_id += len(found)
        elif absent >= need_absent:
            return
        else:  # an older bookie, or too few answers to decide: single reads ask every replica again
            async with contextlib.aclosing(_found_one_by_one(core, reader, next_id)) as rest:
                async for item in rest:
                    yield item
            return


def _extend(reader: LedgerReader, first: int, entries: tuple[bytes | memoryview, ...],
            found: list[tuple[EntryHeader, bytes]]) -> None:
    """Add to ``found`` (entries ``first``.. found so far) what one answer carries beyond
    it, up to its first entry whose digest or ids do not check (a bad replica's answer
    counts neither as found nor as absent)."""
    for i, view in enumerate(entries):
        data = bytes(view)  # kept (written again): not a view of the answer's frame
        try:
            header, _ = reader.check(first + i, data)
        except DigestMismatchError:
            return
        if i == len(found):
            found.append((header, data))


async def _found_one_by_one(core: ClientCore, reader: LedgerReader,
                            first: int) -> AsyncGenerator[tuple[int, EntryHeader, bytes], None]:
    """Step 4 one entry at a time (fencing reads), ``recovery_read_parallelism`` ahead."""
    window = core.config.recovery_read_parallelism
    reads: collections.deque[tuple[int, asyncio.Future[_Found]]] = collections.deque()
    next_id = first
    try:
        while True:
            while len(reads) < window:
                reads.append((next_id, _RecoveryRead(core, reader, next_id).start()))
                next_id += 1
            entry_id, fut = reads.popleft()
            found = await fut
            if found is None:
                return
            yield entry_id, *found
    finally:
        for _, other in reads:
            if other.done() and not other.cancelled():
                other.exception()  # retrieved: it is not what ends the recovery
            other.cancel()


class _RecoveryRead:
    """Step 4 for one entry: found (header, entry bytes), or None when absent."""

    def __init__(self, core: ClientCore, reader: LedgerReader, entry_id: int) -> None:
        self.core = core
        self.reader = reader
        self.entry_id = entry_id
        meta = reader.metadata
        self.replicas = meta.write_set(entry_id)
        self.need_absent = meta.write_quorum - meta.ack_quorum + 1
        self.absent = 0
        self.outstanding = len(self.replicas)
        self.errors: list[WalkitError] = []
        self.future: asyncio.Future[_Found] = asyncio.get_running_loop().create_future()

    def start(self) -> asyncio.Future[_Found]:
        request = ReadEntry(self.reader.ledger_id, self.entry_id, True, self.reader.key)
        for bookie in self.replicas:
            request_with_timeout(self.core, bookie, request, self._answer, bookie)
        return self.future

    def _answer(self, response: Response | None, error: WalkitError | None, bookie: str) -> None:
        self.outstanding -= 1
        if self.future.done():
            return
        checked = self.reader.verified(response, error, self.entry_id)
        if not isinstance(checked, WalkitError):
            assert isinstance(response, ReadEntryResponse)
            self.future.set_result((checked[0], response.data))
            return
        error = checked
        if is_absent(error):
            self.absent += 1
            if self.absent >= self.need_absent:
                self.future.set_result(None)
                return
        else:
            self.errors.append(error)
        if self.outstanding == 0:
            self.future.set_exception(NotEnoughBookiesError(
                "cannot recover: too few replicas answered whether an entry exists", ledger=self.reader.ledger_id,
                entry=self.entry_id, cause=str(pick_error(self.errors, ledger=self.reader.ledger_id))[:300]))
