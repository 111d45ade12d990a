"""The writer's core: appends batched into entries on the client's loop, and rolls.

Theory of operation
-------------------
Appends are batched on the client's loop: records queue up (with their futures, side by
side) while up to ``max_inflight_entries`` entries of the segment are in flight; as soon
as there is room the front of the queue becomes one ledger entry, a record batch
(docs/format.md), cut by the pure :class:`~walkit.wal._batching.BatchPolicy`. A lone
writer thus pays one entry per record, a busy one a fraction of an entry per record. A
record's LSN is (segment, entry, slot in batch); entries complete in order, so do
records. A record larger than an entry (up to ``max_record_bytes``) goes alone, in
fragments in consecutive entries - no other record and no roll among them; its LSN is
(segment, entry of its last fragment, 0), and readers hand it out whole or not at all
(walkit/wal/_records.py).

The segment rolls (close, new ledger, compare-and-set into the node while our epoch
holds) when it reached ``roll_bytes`` or ``roll_seconds``; records wait meanwhile. A
segment whose addition failed is settled and its ledger deleted only if the node surely
never names it (walkit/wal/_open.py).

Threads: ``append_async`` and ``append_many`` run on the caller's thread and touch only
the queue, under ``_lock`` (held for a swap: appends wait on it); everything else - the
pump, entry completions, rolls, idle waiters - runs on the client's loop. The first
failure (a fenced ledger, a roll that failed, a fenced metadata change) fails the writer
for good: every queued and later record's future gets that error.

:class:`LogWriter` is the one core both APIs drive: ``walkit.WriteAheadLog`` runs its
coroutines with ``LoopThread.run``, ``walkit.aio.AsyncWriteAheadLog`` awaits them from
the caller's loop. Its administration (snapshots, truncation, retention) is
:attr:`LogWriter.admin` (walkit/wal/_admin.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Coroutine, Iterable, Sequence
from concurrent.futures import Future
from typing import Any

from walkit.client import LedgerWriter, QuickFuture
from walkit.errors import InvalidArgumentError, LedgerFencedError, UsageError, WalkitError, WriterFencedError
from walkit.logs import context
from walkit.metadata import retry_cas
from walkit.wal._admin import LogAdmin
from walkit.wal._batching import BatchPolicy
from walkit.wal._format import LogMetadata, Segment, fragment_count, pack_fragment, pack_records
from walkit.wal._lsn import LSN
from walkit.wal._many import ManyFuture, complete_entry, fail_all
from walkit.wal._open import discard_segment, new_segment_ledger
from walkit.wal._snapshots import check_snapshot_data
from walkit.wal._state import WriterState
from walkit.wal._stats import LogStats

__all__ = ["LogWriter"]

log = logging.getLogger("walkit.wal._log")  # the logger these lines always had

_Taken = tuple[list[bytes], list[QuickFuture[Any]], float, bool]  # records, futures, queued at, any group


class LogWriter:
    """A log's single writer: appends, flushes, rolls and its close (module docstring)."""

    def __init__(self, state: WriterState, ledger: LedgerWriter, stats: LogStats, *, max_entry_bytes: int,
                 max_inflight_entries: int, max_record_bytes: int) -> None:
        self.state = state
        self.ledger = ledger  # the open segment's ledger
        self.stats = stats
        self.max_record = max_record_bytes  # the largest record taken
        self.last_lsn: LSN | None = None  # the last record acknowledged
        self.error: WalkitError | None = None  # what failed the writer, for good
        self.closing = False  # close began: no more appends, no more rolls
        self.admin = LogAdmin(state, self, stats)
        self._loop = state.client.loop
        self._policy = BatchPolicy(max_entry_bytes)
        self._max_inflight = max_inflight_entries
        self._lock = threading.Lock()
        self._queue: list[bytes] = []
        self._queued_at = 0.0  # when the oldest queued record was appended
        self._futures: list[QuickFuture[Any]] = []  # one per queued record (a ManyFuture repeated for a group)
        self._many = False  # whether the queue holds a group of append_many
        self._large: _LargeRecord | None = None  # (loop) the record being sent fragment by fragment
        self._scheduled = False
        self._in_flight = 0
        self._segment_started = time.monotonic()
        self._rolling = False
        self._idle: list[asyncio.Future[None]] = []

    @property
    def name(self) -> str:
        return self.state.name

    def check_writable(self) -> None:
        """UsageError once close began; the writer's error once it failed."""
        if self.closing:
            raise UsageError("log handle is closed", log=self.name)
        if self.error is not None:
            raise self.error

    def check_snapshot(self, data: object, lsn: LSN) -> None:
        """A snapshot's checks, made before anything is written."""
        self.check_writable()
        if not isinstance(lsn, LSN):
            raise InvalidArgumentError("snapshot needs the LSN it covers", type=type(lsn).__name__)
        check_snapshot_data(data)

    def check_truncate(self, before: LSN) -> None:
        """A truncation's checks, made before anything is read."""
        self.check_writable()
        if not isinstance(before, LSN):
            raise InvalidArgumentError("truncate needs an LSN", type=type(before).__name__)

    # -- appending (the caller's thread) ----------------------------------------------------
    def append_async(self, record: bytes) -> Future[LSN]:
        """Queue a record; the future gives its LSN once it is durable on a quorum."""
        if record.__class__ is not bytes or len(record) > self.max_record:
            record = self.checked(record)
        fut: QuickFuture[LSN] = QuickFuture()
        lock = self._lock
        lock.acquire()  # not "with": that costs twice as much, once per record
        try:
            if self.closing:
                raise UsageError("log is closed", log=self.name)
            if self.error is not None:
                fut.set_exception(self.error)
                return fut
            if not self._queue:
                self._queued_at = time.monotonic()
            self._queue.append(record)
            self._futures.append(fut)
            if self._scheduled:
                return fut
            self._scheduled = True
        finally:
            lock.release()
        self._loop.call(self._pump)
        return fut

    def append_many(self, records: Iterable[bytes]) -> Future[list[LSN]]:
        """Queue ``records`` together, in order (``WriteAheadLog.append_many``)."""
        batch = [self.checked(record) for record in records]
        many = ManyFuture(len(batch))
        if not batch:
            many.set_result([])
            return many
        with self._lock:  # append_async's steps, which it keeps inline: a call less per record
            if self.closing:
                raise UsageError("log is closed", log=self.name)
            if self.error is not None:
                many.set_exception(self.error)
                return many
            if not self._queue:
                self._queued_at = time.monotonic()
            self._queue += batch
            self._futures += [many] * len(batch)
            self._many = True
            if self._scheduled:
                return many
            self._scheduled = True
        self._loop.call(self._pump)
        return many

    def checked(self, record: bytes) -> bytes:
        """``record`` as bytes, or InvalidArgumentError."""
        if record.__class__ is not bytes:
            if not isinstance(record, (bytes, bytearray, memoryview)):
                raise InvalidArgumentError("a record is bytes", type=type(record).__name__)
            record = bytes(record)
        if len(record) > self.max_record:
            raise InvalidArgumentError("record larger than max_record_bytes", size=len(record),
                                       limit=self.max_record)
        return record

    def flush(self) -> Coroutine[Any, Any, LSN | None]:
        """The records appended so far (taken now, on the caller's side), and the
        coroutine (client loop) that waits until they are durable: the last LSN."""
        with self._lock:
            last = self._futures[-1] if self._futures else None
        return self._flushed(last)

    async def _flushed(self, last: Future[Any] | None) -> LSN | None:
        if last is not None:
            await _done(last)  # its error (if any) is the records' to report
        await self._wait_idle()
        if self.error is not None:
            raise self.error
        return self.last_lsn

    def finish(self) -> Coroutine[Any, Any, None]:
        """Close: appends are refused from now on, no roll starts; the coroutine (client
        loop) that waits for the appended records, the retention pass under way and the
        segment's close."""
        with self._lock:
            self.closing = True
        return self._finished()

    async def _finished(self) -> None:
        await self._wait_idle()
        await self.admin.stop()
        if not isinstance(self.error, WriterFencedError):  # a fenced segment is the new writer's to close
            with contextlib.suppress(LedgerFencedError):
                await self.ledger.close()

    # -- the loop side -------------------------------------------------------------------------
    def _pump(self) -> None:
        with self._lock:
            self._scheduled = False
        state = self.state
        while self.error is None and not self._rolling and self._in_flight < self._max_inflight:
            if self._large is not None:  # no roll, no other record, until its last fragment is sent
                if not self._submit_fragment(self._large):
                    break
                continue
            if not self.closing and self._roll_due():
                self._rolling = True
                asyncio.get_running_loop().create_task(self._roll())
                return
            taken = self._take()
            if taken is None:
                break
            records, futures, queued_at, many = taken
            if not records:  # the first record is larger than an entry: it goes alone, in fragments
                continue
            packed = pack_records(records)
            try:  # on the loop: never blocks (max_inflight_entries <= max_pending_adds, checked at open)
                done = self.ledger.submit(packed)
            except WalkitError as exc:
                self.fail(self._as_wal_error(exc), futures)
                break
            self._in_flight += 1
            state.segment_bytes += len(packed)
            done.add_done_callback(functools.partial(self._entry_done, futures=futures, seq=state.segment.seq,
                                                     queued_at=queued_at, many=many))
        if self._large is not None and self.error is not None:  # the writer failed before its last fragment
            large, self._large = self._large, None
            self.stats.append_failures += fail_all([large.future], self.error)
        if self._in_flight == 0 and not self._rolling:
            self._wake_idle()

    def _roll_due(self) -> bool:
        state = self.state
        size = state.segment_bytes
        return size >= state.settings.roll_bytes or bool(
            size and time.monotonic() - self._segment_started >= state.settings.roll_seconds)

    def _take(self) -> _Taken | None:
        """(Loop) the records of the next entry off the queue (None: it is empty); none,
        with :attr:`_large` set, when the first is larger than an entry. What the policy
        leaves goes back ahead of whatever was appended meanwhile."""
        with self._lock:  # held for a swap only: appends wait on this lock
            records, futures = self._queue, self._futures
            if not records:
                return None
            self._queue, self._futures = [], []
            queued_at, many, self._many = self._queued_at, self._many, False
        take = self._policy.take(records)
        if take == len(records):
            return records, futures, queued_at, many
        cut = take or 1  # nothing before a record larger than an entry: it goes alone, in fragments
        rest: list[QuickFuture[Any]] = []
        with self._lock:  # the rest goes back ahead of whatever came meanwhile
            if self.error is None:
                if not self._queue:
                    self._queued_at = queued_at
                self._queue[:0] = records[cut:]
                self._futures[:0] = futures[cut:]
                self._many = self._many or many
            else:  # fail took the queue while these were out of it
                rest = futures[cut:]
        if rest:
            assert self.error is not None
            fail_all(rest, self.error)
        if not take:
            self._large = _LargeRecord(records[0], futures[0], self._policy.fragment_room, queued_at)
            return [], [], queued_at, many
        return records[:take], futures[:take], queued_at, many

    def _submit_fragment(self, large: _LargeRecord) -> bool:
        """(Loop) send the next fragment of ``large`` as an entry; False if the writer failed.
        The record's future goes with its last fragment: it completes once that entry is
        durable (entries complete in order, so every fragment is), at LSN (segment, that
        entry, 0)."""
        room, index, record = self._policy.fragment_room, large.index, large.record
        packed = pack_fragment(len(record), index, large.count, memoryview(record)[index * room:(index + 1) * room])
        try:  # never blocks: in flight <= max_inflight_entries <= max_pending_adds, as for batches
            done = self.ledger.submit(packed)
        except WalkitError as exc:
            self._large = None
            self.fail(self._as_wal_error(exc), [large.future])
            return False
        self._in_flight += 1
        self.state.segment_bytes += len(packed)
        large.index += 1
        futures: list[Any] = []  # a fragment before the last completes no record
        if large.index == large.count:
            self._large = None  # the segment may roll now (a roll waits for the entries in flight)
            futures = [large.future]
        done.add_done_callback(functools.partial(self._entry_done, futures=futures, seq=self.state.segment.seq,
                                                 queued_at=large.queued_at,
                                                 many=large.future.__class__ is ManyFuture))
        return True

    def _entry_done(self, done: Future[int], futures: list[Any], seq: int, queued_at: float,
                    many: bool = False) -> None:
        self._in_flight -= 1
        error = done.exception()
        stats = self.stats
        if error is not None:
            self.fail(self._as_wal_error(error), futures)
        elif not futures:  # a fragment of a record larger than an entry, not its last
            stats.entries += 1
        else:
            stats.records += len(futures)
            stats.entries += 1
            stats.records_per_entry.observe(len(futures))
            stats.append_seconds.observe(time.monotonic() - queued_at)
            entry = done.result()
            self.last_lsn = LSN.unchecked(seq, entry, len(futures) - 1)  # before any caller hears of these records
            if many:  # some of these records were appended together (append_many)
                complete_entry(futures, seq, entry)
            else:
                QuickFuture.set_results(futures, LSN.slots(seq, entry, len(futures)))
        if self._in_flight == 0:
            self._wake_idle()  # a roll waits for this, and so does flush()
        if self._loop.in_loop():
            self._pump()
        else:
            self._loop.call(self._pump)

    def _as_wal_error(self, error: BaseException) -> WalkitError:
        if isinstance(error, WriterFencedError):
            return error
        if isinstance(error, LedgerFencedError):
            return WriterFencedError("a newer writer took the log over", log=self.name, epoch=self.state.epoch)
        if isinstance(error, WalkitError):
            return error
        return WalkitError("append failed", log=self.name, reason=repr(error))

    def fail(self, error: WalkitError, futures: Sequence[Future[LSN]] = ()) -> None:
        """Fail the writer for good with ``error`` (the first one sticks): ``futures`` and
        every queued record's fail; waiters for idleness wake."""
        if self.error is None:
            self.error = error
            log.warning("log %s: writer failed: %s", self.name, error,
                        extra=context(log=self.name, namespace=self.state.namespace))
        with self._lock:
            queued, self._futures, self._queue = self._futures, [], []
        self.stats.append_failures += fail_all([*futures, *queued], self.error)
        if self._loop.in_loop():
            self._wake_idle()
        else:  # snapshot / truncate fail on the caller's thread: the waiters live on the loop
            with contextlib.suppress(UsageError):
                self._loop.call(self._wake_idle)

    def _wake_idle(self) -> None:
        waiters, self._idle = self._idle, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _wait_idle(self) -> None:
        while True:
            with self._lock:
                queued = bool(self._queue)
            if self.error is not None or (not queued and self._in_flight == 0 and not self._rolling
                                          and self._large is None):
                return
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle.append(fut)
            self._pump()
            await fut

    async def _roll(self) -> None:
        """Close the segment and start the next one (records wait meanwhile)."""
        try:
            while self._in_flight:
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._idle.append(fut)
                await fut
            if self.error is not None:
                return
            await self._next_segment()
        except WalkitError as exc:
            self.fail(self._as_wal_error(exc))
        except Exception as exc:
            log.exception("log %s: roll failed", self.name,
                          extra=context(log=self.name, namespace=self.state.namespace))
            self.fail(WalkitError("segment roll failed", log=self.name, reason=repr(exc)))
        finally:
            self._rolling = False
            self._pump()

    async def _next_segment(self) -> None:
        """(Loop, nothing in flight) close the segment's ledger, add the next segment."""
        state = self.state
        await self.ledger.close()
        writer = await new_segment_ledger(state.bk, state.node, state.settings, state.password)
        segment = Segment(state.segment.seq + 1, writer.ledger_id)

        def add(meta: LogMetadata) -> LogMetadata:
            if segment in meta.segments:
                return meta  # our own write, whose reply was lost
            return dataclasses.replace(meta, segments=(*meta.segments, segment))

        try:
            await state.client.metadata(functools.partial(retry_cas, functools.partial(state.change, add),
                                                          "log metadata (adding a segment)", log=self.name))
        except BaseException:
            await discard_segment(state.bk, state.node, writer, segment)
            raise
        writer.lacs.interval = self.ledger.lacs.interval
        writer.lacs.idle, writer.lacs.yields = self.ledger.lacs.idle, self.ledger.lacs.yields
        self.ledger, state.segment = writer, segment
        state.segment_bytes, self._segment_started = 0, time.monotonic()
        self.stats.rolls += 1
        self.admin.want_pass()
        log.info("log %s: rolled to segment %d (ledger %d)", self.name, segment.seq, writer.ledger_id,
                 extra=context(log=self.name, namespace=self.state.namespace, ledger=writer.ledger_id))

    def own_lac(self, segment: Segment) -> int | None:
        """The LAC of ``segment`` if it is the open one (the writer knows it best)."""
        return self.ledger.lac if segment == self.state.segment else None


class _LargeRecord:
    """(Loop) a record larger than an entry, sent one fragment an entry, alone: nothing
    else is sent and the segment does not roll until its last fragment is sent."""

    __slots__ = ("record", "future", "count", "index", "queued_at")

    def __init__(self, record: bytes, future: QuickFuture[Any], room: int, queued_at: float) -> None:
        self.record = record
        self.future = future  # a ManyFuture when the record came with others (append_many)
        self.count = fragment_count(len(record), room)
        self.index = 0  # the next fragment to send
        self.queued_at = queued_at


async def _done(fut: Future[Any]) -> None:
    """(Client loop) until ``fut`` is done, its result not taken: a group's LSNs
    (``append_many``) are made by whoever asks for them, not by a flush that waits."""
    if fut.done():
        return
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: Future[Any]) -> None:
        loop.call_soon_threadsafe(_resolve, waiter)

    fut.add_done_callback(wake)
    await waiter


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
