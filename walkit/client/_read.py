"""Reading a ledger's entries, its LAC, and long polls (client loop only).

A read of one entry goes to the first replica of the entry's write set (replicas that
failed lately last). It moves on to the next replica at once on an error, a missing
entry or a bad digest, and also - speculatively, the first one still allowed to answer -
when a replica has been silent for ``speculative_read_timeout``. The first valid answer
wins. Only when every replica has failed does the read fail: NoSuchEntryError if every
one said the entry (or ledger) is not there, else the first other error.

Every entry is checked: its digest, and that its header names the ledger and entry
asked for, so a bookie returning corrupted or misplaced bytes is just a replica skipped.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from walkit.client._core import ClientCore
from walkit.client._entry_codec import EntryCodec
from walkit.errors import (
    BookieTimeoutError,
    BookieUnavailableError,
    DigestMismatchError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
    WalkitError,
)
from walkit.metadata import LedgerMetadata
from walkit.protocol import (
    EntryHeader,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadLacResponse,
    Request,
    Response,
)

__all__ = ["Entry", "LedgerReader", "covers_every_write_set", "is_absent", "pick_error", "request_with_timeout"]


class Entry(NamedTuple):
    ledger_id: int
    entry_id: int
    data: bytes


def is_absent(error: BaseException) -> bool:
    """A bookie's definite "not here" (entry or ledger), as opposed to a failure."""
    return isinstance(error, (NoSuchEntryError, NoSuchLedgerError))


def covers_every_write_set(ensemble_size: int, write_quorum: int, ack_quorum: int, answered: set[int]) -> bool:
    """BookKeeper's recovery coverage rule: every write set of the ensemble has at least
    Qw - Qa + 1 members (by index) in ``answered``, so no entry can have reached Qa acks
    on bookies that did not answer."""
    need = write_quorum - ack_quorum + 1
    for first in range(ensemble_size):
        members = {(first + k) % ensemble_size for k in range(write_quorum)}
        if len(members & answered) < need:
            return False
    return True


def request_with_timeout(core: ClientCore, bookie: str, request: Request, cb: Callable[..., None],
                         ctx: Any) -> None:
    """``core.pool.request_cb`` whose callback also comes (once) after ``read_timeout``."""
    loop = asyncio.get_running_loop()
    state = {"answered": False}

    def once(response: Response | None, error: WalkitError | None, _: Any) -> None:
        if state["answered"]:
            return
        state["answered"] = True
        timer.cancel()
        cb(response, error, ctx)

    timer = loop.call_later(core.config.read_timeout, once, None,
                            BookieTimeoutError("no answer in time", bookie=bookie, op=type(request).__name__,
                                               ledger=getattr(request, "ledger_id", None)), None)
    core.pool.request_cb(bookie, request, once, None)


def pick_error(errors: list[WalkitError], **context: object) -> WalkitError:
    """The error of a read that every replica failed."""
    if errors and all(is_absent(e) for e in errors):
        return NoSuchEntryError("entry not found on any replica", **context)
    for kind in (UnauthorizedError, DigestMismatchError):
        for e in errors:
            if isinstance(e, kind):
                return e
    others = [e for e in errors if not is_absent(e)]
    if others:
        return others[0]
    return BookieUnavailableError("no replica to read from", **context)


class _EntryRead:
    """One entry's read across its replicas (see the module docstring)."""

    def __init__(self, reader: LedgerReader, entry_id: int, replicas: list[str], fence: bool) -> None:
        self.reader = reader
        self.entry_id = entry_id
        self.replicas = replicas
        self.fence = fence
        self.next = 0
        self.outstanding = 0
        self.errors: list[WalkitError] = []
        self.timers: list[asyncio.TimerHandle] = []
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[tuple[EntryHeader, bytes, int]] = self.loop.create_future()
        self.started = time.monotonic()

    def start(self) -> asyncio.Future[tuple[EntryHeader, bytes, int]]:
        self.future.add_done_callback(lambda _: self._finish())  # also when the caller cancels it
        self._try_next()
        return self.future

    def _try_next(self) -> None:
        if self.next >= len(self.replicas):
            return
        bookie = self.replicas[self.next]
        self.next += 1
        self.outstanding += 1
        r = self.reader
        request = ReadEntry(r.ledger_id, self.entry_id, self.fence, r.key if self.fence else b"")
        state = {"answered": False}
        r.core.pool.request_cb(bookie, request, self._answered, (bookie, state))
        config = r.core.config
        self.timers.append(self.loop.call_later(config.read_timeout, self._timed_out, bookie, state))
        if self.next < len(self.replicas):
            self.timers.append(self.loop.call_later(config.speculative_read_timeout, self._speculate, state))

    def _speculate(self, state: dict[str, bool]) -> None:
        if not self.future.done() and not state["answered"] and self.next < len(self.replicas):
            self.reader.core.stats.speculative_reads += 1
            self._try_next()

    def _timed_out(self, bookie: str, state: dict[str, bool]) -> None:
        if not state["answered"]:
            self.reader.core.bookie_failed(bookie)
            self._answered(None, BookieTimeoutError("read timed out", bookie=bookie, ledger=self.reader.ledger_id,
                                                    entry=self.entry_id), (bookie, state))

    def _answered(self, response: Response | None, error: WalkitError | None, ctx: Any) -> None:
        bookie, state = ctx
        if state["answered"]:
            return
        state["answered"] = True
        self.outstanding -= 1
        if self.future.done():
            return
        checked = self.reader.verified(response, error, self.entry_id)
        if not isinstance(checked, WalkitError):
            assert isinstance(response, ReadEntryResponse)
            self._finish()
            stats = self.reader.core.stats
            stats.reads += 1
            stats.read_seconds.observe(time.monotonic() - self.started)
            self.future.set_result((*checked, response.lac))
            return
        error = checked
        if isinstance(error, BookieUnavailableError):
            self.reader.core.bookie_failed(bookie)
        self.errors.append(error)
        if self.next < len(self.replicas):
            self._try_next()
        elif self.outstanding == 0:
            self._finish()
            self.reader.core.stats.read_failures += 1
            self.future.set_exception(pick_error(self.errors, ledger=self.reader.ledger_id, entry=self.entry_id))

    def _finish(self) -> None:
        for timer in self.timers:
            timer.cancel()


class LedgerReader:
    """Reads of one ledger, for the metadata it is given (callers refresh it)."""

    def __init__(self, core: ClientCore, metadata: LedgerMetadata, codec: EntryCodec) -> None:
        self.core = core
        self.metadata = metadata
        self.ledger_id = metadata.ledger_id
        #: the ledger's entry codec: its digest's checks, and the master key fences send
        self.codec = codec
        self.key = codec.master_key
        self._decode = codec.decode
        #: bytes of the entries read in runs lately (None: none yet): sizes the next run
        self.entry_size: int | None = None
        #: which replica of a fragment this reader asks first where E = Qw (modulo its size:
        #: sticky reads, in runs and entry by entry)
        self.replica_choice = random.getrandbits(16)
        #: the entries its runs return (READ_RANGE) carry, as ``data``, a read-only view of
        #: the answer's frame rather than bytes of their own: for a consumer that copies
        #: what it keeps (the WriteAheadLog's passes). Off: every entry's data is bytes.
        self.payload_views = False

    def check(self, entry_id: int, data: bytes) -> tuple[EntryHeader, bytes]:
        """Digest and ids of an entry a bookie returned (DigestMismatchError)."""
        header, payload = self._decode(data)
        if header.ledger_id != self.ledger_id or header.entry_id != entry_id:
            raise DigestMismatchError("bookie returned another entry than the one asked for", ledger=self.ledger_id,
                                      entry=entry_id, got_ledger=header.ledger_id, got_entry=header.entry_id)
        return header, payload

    def check_run(self, first: int, entries: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
        """The payloads of a run of entries from ``first`` a bookie returned, up to the
        first whose digest or ids do not check (:meth:`check` for each, in one loop);
        views of ``entries`` where they are views and :attr:`payload_views` is on."""
        return self.codec.decode_run(entries, self.ledger_id, first, copy=not self.payload_views)

    def verified(self, response: Response | None, error: WalkitError | None,
                 entry_id: int | None = None) -> tuple[EntryHeader, bytes] | WalkitError:
        """A READ_ENTRY answer as (header, payload) once its digest and ids check
        (``entry_id`` None: the entry the bookie says it returned), or the error to count
        against that replica (the bookie's, or DigestMismatchError)."""
        if error is not None:
            return error
        assert isinstance(response, ReadEntryResponse)
        try:
            return self.check(response.entry_id if entry_id is None else entry_id, response.data)
        except DigestMismatchError as exc:
            return exc

    def read_entry(self, entry_id: int, *, fence: bool = False,
                   replicas: list[str] | None = None) -> asyncio.Future[tuple[EntryHeader, bytes, int]]:
        """(header, payload, the answering bookie's LAC) of one entry. Where every bookie
        of the ensemble holds every entry (E = Qw) the replicas are asked in this reader's
        own order, the same for every entry (sticky reads: a reader going entry by entry
        keeps to one bookie, whose read-ahead then serves it; readers spread over the
        replicas); else in the entry's write-set order."""
        if replicas is None:
            meta = self.metadata
            if meta.write_quorum == meta.ensemble_size:
                ensemble = meta.ensemble_for(entry_id)
                shift = self.replica_choice % len(ensemble)
                replicas = self.core.read_order(ensemble[shift:] + ensemble[:shift])
            else:
                replicas = self.core.read_order(meta.write_set(entry_id))
        return _EntryRead(self, entry_id, replicas, fence).start()

    async def read_each(self, first: int, last: int) -> list[Entry]:
        """Entries ``first``..``last`` in order, one READ_ENTRY each, ``read_parallelism``
        in flight (:func:`walkit.client._ranges.read_entries` reads in runs where it can)."""
        window = self.core.config.read_parallelism
        results: list[Entry] = []
        pending: list[tuple[int, asyncio.Future[tuple[EntryHeader, bytes, int]]]] = []
        next_id = first
        try:
            while next_id <= last or pending:
                while next_id <= last and len(pending) < window:
                    pending.append((next_id, self.read_entry(next_id)))
                    next_id += 1
                entry_id, fut = pending.pop(0)
                _, payload, _ = await fut
                results.append(Entry(self.ledger_id, entry_id, payload))
        finally:
            for _, fut in pending:
                fut.cancel()
        return results

    async def read_lac(self) -> int:
        """The highest LAC the bookies of the last ensemble know (-1: none), once every
        write set has Qw - Qa + 1 answers (BookKeeper's coverage: no confirmed entry is
        missed) or every bookie answered. Bookies that never saw the ledger count as -1;
        BookieUnavailableError (or the bookies' error) when none answers."""
        meta = self.metadata
        bookies = meta.ensembles[-1][1]
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        answered: set[int] = set()
        lacs: list[int] = []
        errors: list[WalkitError] = []
        outstanding = [len(bookies)]

        def answer(response: Response | None, error: WalkitError | None, index: int) -> None:
            outstanding[0] -= 1
            if done.done():
                return
            if isinstance(response, ReadLacResponse):
                try:
                    lacs.append(self.codec.lac_of(response))
                    answered.add(index)
                except DigestMismatchError as exc:  # a damaged answer: as a failed bookie's
                    errors.append(exc)
            elif error is not None and is_absent(error):
                lacs.append(-1)
                answered.add(index)
            elif error is not None:
                errors.append(error)
            if covers_every_write_set(meta.ensemble_size, meta.write_quorum, meta.ack_quorum, answered) or (
                    outstanding[0] == 0 and lacs):
                done.set_result(max(lacs))
            elif outstanding[0] == 0:
                done.set_exception(pick_error(errors, ledger=self.ledger_id))

        for index, bookie in enumerate(bookies):
            request_with_timeout(self.core, bookie, ReadLac(self.ledger_id), answer, index)
        return await done

    async def wait_lac(self, previous: int, timeout: float) -> tuple[int, Entry | None]:
        """Long poll: the LAC once some bookie of the last ensemble knows one above
        ``previous``, or ``previous`` after ``timeout`` seconds - and entry
        ``previous + 1`` when the first answer carried it (the poll names it; a bookie
        that holds it sends it along, checked as any read is), so a follower needs no
        second round trip for the entry it waited for."""
        loop = asyncio.get_running_loop()
        bookies = self.metadata.ensembles[-1][1]
        result: asyncio.Future[tuple[int, Entry | None]] = loop.create_future()
        remaining = [len(bookies)]
        timeout_ms = max(0, int(timeout * 1000))
        wanted = previous + 1

        polled = [False]  # some bookie really waited (answered, or timed the poll out)

        def answered(response: Response | None, error: WalkitError | None, _: Any) -> None:
            remaining[0] -= 1
            if isinstance(response, ReadEntryResponse) or (error is not None and is_absent(error)):
                polled[0] = True
            if result.done():
                return
            if isinstance(response, ReadEntryResponse) and response.lac > previous:
                entry = None
                if response.entry_id == wanted:  # confirmed: wanted <= the LAC it came with
                    checked = self.verified(response, None, wanted)
                    if not isinstance(checked, WalkitError):
                        entry = Entry(self.ledger_id, wanted, checked[1])
                        self.core.stats.reads += 1
                result.set_result((response.lac, entry))
            elif remaining[0] == 0:
                result.set_result((previous, None))

        request = ReadEntry(self.ledger_id, wanted, previous_lac=previous, timeout_ms=timeout_ms)
        for bookie in bookies:
            self.core.pool.request_cb(bookie, request, answered, None)
        deadline = loop.time() + timeout
        try:
            lac, entry = await asyncio.wait_for(result, timeout + self.core.config.read_timeout)
        except asyncio.TimeoutError:
            return previous, None
        if lac == previous and not polled[0]:
            # every bookie failed at once (down, busy): wait out the poll rather than
            # let a follower spin on errors
            await asyncio.sleep(max(0.0, deadline - loop.time()))
        return lac, entry

