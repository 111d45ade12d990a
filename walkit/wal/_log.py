"""``WriteAheadLog``: a log that outlives any one writer, on top of ledgers.

Theory of operation
-------------------
A log is a node ``<root>/logs/<namespace>/<name>`` (:class:`LogMetadata`): the writer
epoch, the segments (ledgers, in order, numbered from 1), the snapshots and settings.
Every change is a compare-and-set on the node's version, and every change a writer makes
first checks that the epoch is still its own.

Opening for writing makes the caller the single writer: it bumps the epoch (CAS), opens
the last two segments with recovery (which fences the previous writer's ledger and closes
it at what was acknowledged), creates a new ledger and appends it as the next segment
(CAS). The previous writer's next add fails with EFENCED; its next metadata change sees
the new epoch; either way it gets :class:`WriterFencedError` and is done for good.

Appends are batched on the client's loop: records queue up while up to
``max_inflight_entries`` entries of the segment are in flight; as soon as there is room
the queued records (up to ``max_entry_bytes``) become one ledger entry (a record batch,
docs/format.md). A lone writer thus pays one entry per record, a busy one a fraction of
an entry per record. A record's LSN is (segment, entry, slot in batch); entries complete
in order, so do records. The segment rolls (close, new ledger, CAS) when it reached
``roll_bytes`` or ``roll_seconds``; records wait meanwhile.

Readers (``WriteAheadLog.reader``) never fence: they read closed segments to the end
and the open one up to its LAC, which the writer publishes (an explicit LAC write) the
moment it goes idle; ``tail`` follows the open segment by long poll and moves to the next
segment once its ledger is closed (by a roll, a writer's close, or a new writer's
recovery).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import io
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import IO, Any

from walkit.client import BookKeeper, Entry, LedgerWriter, QuickFuture, ReadState, read_ahead
from walkit.errors import (
    InvalidArgumentError,
    LedgerFencedError,
    NodeExistsError,
    NoNodeError,
    NoSuchLedgerError,
    NoSuchLogError,
    FormatError,
    UsageError,
    WalkitError,
    WriterFencedError,
)
from walkit.logs import context
from walkit.metadata import retry_cas
from walkit.metadata._cluster import cluster_path
from walkit.metadata._registration import check_bookie_id
from walkit.wal._format import LogMetadata, LogSettings, Segment, SnapshotRef, pack_records
from walkit.wal._lsn import LSN
from walkit.wal._many import ManyFuture, complete_entry, fail_all
from walkit.wal._records import RecordReader
from walkit.wal._stats import LOGS
from walkit.wal._watch import NodeWatch

__all__ = ["WriteAheadLog", "LogReader", "Snapshot", "list_logs", "delete_log", "set_namespace_defaults"]

log = logging.getLogger(__name__)

SNAPSHOT_CHUNK = 1 << 20
#: Seconds an idle log's last record may look stale to readers when the client's
#: ``idle_lac`` is False (otherwise the writer publishes its LAC the moment it goes idle).
EXPLICIT_LAC_INTERVAL = 0.1
_READ_CHUNK = 256  # entries per read on the client loop
_POLL = 5.0  # seconds a tail waits for the log node's watch before it reads the node anyway


def _client(client_or_uri: BookKeeper | str) -> tuple[BookKeeper, bool]:
    if isinstance(client_or_uri, BookKeeper):
        return client_or_uri, False
    if isinstance(client_or_uri, str):
        return BookKeeper(client_or_uri), True
    raise InvalidArgumentError("expected a walkit.BookKeeper or a metadata URI", type=type(client_or_uri).__name__)


def _check_name(kind: str, value: str) -> str:
    try:
        return check_bookie_id(value)  # the same rules: one non-empty node name
    except InvalidArgumentError:
        raise InvalidArgumentError(f"invalid {kind} name", name=repr(value)) from None


class _LogNode:
    """The log's metadata node (blocking calls: run them off the client loop)."""

    def __init__(self, bk: BookKeeper, namespace: str, name: str) -> None:
        self.store = bk._cluster.store
        self.namespace = _check_name("namespace", namespace)
        self.name = _check_name("log", name)
        self.ns_path = cluster_path(bk._cluster.info.root, f"logs/{namespace}")
        self.path = f"{self.ns_path}/{name}"

    def read(self) -> tuple[LogMetadata, int]:
        try:
            data, stat = self.store.get(self.path)
        except NoNodeError:
            raise NoSuchLogError("no such log", namespace=self.namespace, log=self.name) from None
        return LogMetadata.decode(data, self.path), stat.version

    def namespace_defaults(self) -> dict[str, Any]:
        import json

        try:
            data, _ = self.store.get(self.ns_path)
        except NoNodeError:
            return {}
        try:
            return dict(json.loads(data or b"{}"))
        except (ValueError, TypeError) as exc:
            raise FormatError("unreadable namespace defaults", path=self.ns_path, reason=str(exc)[:200]) from exc

    def create(self, settings: LogSettings) -> None:
        meta = LogMetadata(0, (), (), None, settings)
        with contextlib.suppress(NodeExistsError):
            self.store.create(self.path, meta.encode(), make_parents=True)

    def write(self, meta: LogMetadata, version: int) -> int:
        return self.store.set(self.path, meta.encode(), version).version


class Snapshot:
    """A stored snapshot: ``lsn`` (everything up to it is in the state), ``size`` in
    bytes; :meth:`read` gives the bytes, :meth:`open` a stream for large ones."""

    def __init__(self, bk: BookKeeper, ref: SnapshotRef, password: bytes) -> None:
        self._bk = bk
        self.lsn = ref.lsn
        self.size = ref.size
        self.ledger_id = ref.ledger_id
        self._password = password

    def _chunks(self) -> Iterator[bytes]:
        handle = self._bk.open_ledger(self.ledger_id, self._password, recovery=False)
        if handle.last_add_confirmed >= 0:
            for entry in handle.read(0, handle.last_add_confirmed):
                yield entry.data

    def read(self) -> bytes:
        return b"".join(self._chunks())

    def open(self) -> io.BufferedReader:
        return io.BufferedReader(_ChunkStream(self._chunks()), buffer_size=SNAPSHOT_CHUNK)


class _ChunkStream(io.RawIOBase):
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            nxt = next(self._chunks, None)
            if nxt is None:
                return 0
            self._buffer = nxt
        n = min(len(target), len(self._buffer))
        target[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n


class _LogView:
    """What readers and the writer share: the node, reading segments, snapshots."""

    def __init__(self, bk: BookKeeper, owned: bool, node: _LogNode, password: bytes) -> None:
        self._bk = bk
        self._owned = owned
        self._node = node
        self._password = password
        self._closed = False
        self.stats = LOGS.new(self)  # walkit/wal/_stats.py

    @property
    def name(self) -> str:
        return self._node.name

    @property
    def namespace(self) -> str:
        return self._node.namespace

    def metadata(self) -> LogMetadata:
        return self._node.read()[0]

    def latest_snapshot(self) -> Snapshot | None:
        snapshots = self.metadata().snapshots
        return Snapshot(self._bk, snapshots[-1], self._password) if snapshots else None

    def _open_segment(self, segment: Segment) -> ReadState:
        """A reader of the segment's ledger; a segment deleted under the reader (retention
        after a newer snapshot) is an error, never a silent gap."""
        try:
            return self._bk._loop.run(self._bk._open(segment.ledger_id, self._password, False))
        except NoSuchLedgerError as exc:
            raise NoSuchLedgerError("a segment of the log was deleted (truncated) while it was being read; "
                                    "start again from the latest snapshot", log=self.name, segment=segment.seq,
                                    ledger=segment.ledger_id) from exc

    def _records(self, segment: Segment, state: ReadState, first: int, last: int, after: LSN | None,
                 unpacker: RecordReader) -> Iterator[tuple[LSN, bytes]]:
        if first > last:
            return
        for entries in read_ahead(self._bk._loop, state, first, last, self._waited):
            for entry in entries:
                yield from unpacker.records(segment, entry, after)

    def _waited(self, seconds: float) -> None:
        self.stats.replay_read_seconds += seconds

    def _own_lac(self, segment: Segment) -> int | None:
        """The writer's LAC for its own open segment (None for readers)."""
        return None

    def replay(self, after: LSN | None = None) -> Iterator[tuple[LSN, bytes]]:
        """Every durable record after ``after`` (all when None), across segments, in
        order: ``(lsn, record)``."""
        self._check_open()
        if after is not None and not isinstance(after, LSN):
            raise InvalidArgumentError("after must be an LSN or None", type=type(after).__name__)
        meta = self.metadata()
        self._check_not_truncated(meta, after)
        unpacker = RecordReader(self.name, self.stats)
        for segment in meta.segments_from(after):
            state = self._open_segment(segment)
            own = self._own_lac(segment)
            if own is not None:  # the writer knows its own segment's LAC better than the bookies
                state.lac = max(state.lac, own)
            last = state.lac
            first = after.entry if after is not None and after.segment == segment.seq else 0
            yield from self._records(segment, state, first, last, after, unpacker)

    @staticmethod
    def _check_not_truncated(meta: LogMetadata, after: LSN | None) -> None:
        """Reading from a point retention deleted would silently skip records: refuse."""
        if meta.truncated is None:
            return
        first_kept = meta.segments[0].seq if meta.segments else meta.truncated.segment
        if after is None or after.segment < first_kept:
            raise InvalidArgumentError("the records after this point were truncated; load the latest snapshot and "
                                       "read after its LSN", after=str(after) if after else "start",
                                       truncated=str(meta.truncated))

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("log handle is closed", log=self.name)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            LOGS.retire(self)
            if self._owned:
                self._bk.close()


class LogReader(_LogView):
    """A read-only view of a log (no fencing: the writer goes on)."""

    def __init__(self, bk: BookKeeper, owned: bool, node: _LogNode, password: bytes) -> None:
        super().__init__(bk, owned, node, password)
        self._watch = NodeWatch(node.store, node.path)  # runs while a tail runs

    def close(self) -> None:
        self._watch.close()  # a tail waiting for the log to move on ends now
        super().close()

    def tail(self, after: LSN | None = None, *, poll_timeout: float = 1.0) -> Iterator[tuple[LSN, bytes]]:
        """Records after ``after`` as they become durable, for ever (break out of the
        loop to stop): replay, then follow the open segment by long poll, then the next
        segments as the log rolls or changes writer."""
        self._check_open()
        position = after
        next_seq = 1 if after is None else after.segment
        meta = self.metadata()
        if meta.truncated is not None:
            self._check_not_truncated(meta, after)
        self._watch.acquire()
        try:
            yield from self._tail(position, next_seq, poll_timeout)
        finally:
            self._watch.release()

    def _tail(self, position: LSN | None, next_seq: int, poll_timeout: float) -> Iterator[tuple[LSN, bytes]]:
        unpacker = RecordReader(self.name, self.stats)
        while True:
            self._check_open()  # close() ends a tail at its next poll
            meta, version = self._node.read()
            segments = [s for s in meta.segments if s.seq >= next_seq]
            if not segments:
                self._watch.wait_past(version, _POLL)  # woken by the node's next change (walkit/wal/_watch.py)
                continue
            if segments[0].seq > next_seq and position is not None:
                raise NoSuchLedgerError("segments the tail had not read yet were truncated", log=self.name,
                                        expected=next_seq, first_kept=segments[0].seq)
            for segment in segments:
                state = self._open_segment(segment)
                first = position.entry if position is not None and position.segment == segment.seq else 0
                for lsn, record in self._follow(segment, state, first, position, poll_timeout, version, unpacker):
                    position = lsn
                    yield lsn, record
                next_seq = segment.seq + 1

    def _follow(self, segment: Segment, state: ReadState, first: int, after: LSN | None,
                poll_timeout: float, version: int, unpacker: RecordReader) -> Iterator[tuple[LSN, bytes]]:
        """The records of ``segment`` from entry ``first`` as they come, until it is closed
        and read; ``version``: the log node's version when the segment was listed."""
        next_id = first
        while True:
            self._check_open()  # close() ends a tail at its next poll
            batch, version = self._bk._loop.run(self._step(state, next_id, poll_timeout, version))
            if batch is None:
                return
            for entry in batch:
                next_id = entry.entry_id + 1
                yield from unpacker.records(segment, entry, after)

    async def _step(self, state: ReadState, next_id: int, poll_timeout: float,
                    version: int) -> tuple[list[Entry] | None, int]:
        """One ``follow_step``, cut short when the log node moves past ``version`` (a roll
        or a new writer may have closed the segment: its metadata is read again); the
        step's entries (None: closed and read) and the node version now known."""
        moved = self._watch.changed_past(version)
        step = asyncio.ensure_future(state.follow_step(next_id, poll_timeout, _READ_CHUNK))
        try:
            await asyncio.wait((step, moved), return_when=asyncio.FIRST_COMPLETED)
            if step.done():
                return step.result(), version
            step.cancel()
            try:
                await step
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this step was cancelled, not only the poll
            now = self._watch.version
            if now == -1:
                raise NoSuchLogError("the log was deleted while it was tailed", namespace=self.namespace,
                                     log=self.name)
            await state.refresh()
            return [], version if now is None else max(version, now)
        finally:
            moved.cancel()
            step.cancel()

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WriteAheadLog(_LogView):
    """The single writer of a log (:meth:`open`); readers use :meth:`reader`."""

    def __init__(self, bk: BookKeeper, owned: bool, node: _LogNode, password: bytes, *, epoch: int,
                 settings: LogSettings, segment: Segment, writer: LedgerWriter, max_entry_bytes: int,
                 max_inflight_entries: int) -> None:
        super().__init__(bk, owned, node, password)
        self.epoch = epoch
        self.settings = settings
        self._segment = segment
        self._writer = writer
        self._max_entry_bytes = max_entry_bytes
        self._max_inflight = max_inflight_entries
        self._lock = threading.Lock()
        self._queue: list[bytes] = []
        self._queued_at = 0.0  # when the oldest queued record was appended
        self._futures: list[QuickFuture[Any]] = []  # one per queued record (a ManyFuture repeated for a group)
        self._many = False  # whether the queue holds a group of append_many
        self._max_record = max_entry_bytes - 16
        self._scheduled = False
        self._in_flight = 0
        self._segment_bytes = 0
        self._segment_started = time.monotonic()
        self._rolling = False
        self._error: WalkitError | None = None
        self._idle: list[asyncio.Future[None]] = []
        self._closing = False  # close() began: no more appends, no more rolls
        self._admin = threading.Lock()  # snapshot and truncate, one at a time
        self.last_lsn: LSN | None = None

    # -- opening ----------------------------------------------------------------------------
    @classmethod
    def open(cls, client_or_uri: BookKeeper | str, name: str, *, namespace: str = "default", password: bytes = b"",
             ensemble_size: int | None = None, write_quorum: int | None = None, ack_quorum: int | None = None,
             roll_bytes: int | None = None, roll_seconds: float | None = None, max_entry_bytes: int = 1 << 20,
             max_inflight_entries: int = 4) -> WriteAheadLog:
        """Become the log's single writer (creating the log on first use): bump the epoch,
        recover and close the previous writer's segment (fencing it), start a segment.
        Settings given here apply to a new log; an existing log keeps its own."""
        bk, owned = _client(client_or_uri)
        try:
            node = _LogNode(bk, namespace, name)
            if not 1 <= max_inflight_entries <= 1024 or not 1024 <= max_entry_bytes <= 4 << 20:
                raise InvalidArgumentError("max_inflight_entries in 1..1024, max_entry_bytes in 1 KiB..4 MiB",
                                           max_inflight_entries=max_inflight_entries, max_entry_bytes=max_entry_bytes)
            if max_inflight_entries > bk.config.max_pending_adds:
                raise InvalidArgumentError("max_inflight_entries exceeds the client's max_pending_adds",
                                           max_inflight_entries=max_inflight_entries,
                                           max_pending_adds=bk.config.max_pending_adds)
            frame_room = bk.config.max_frame_size - 512  # frame and entry headers, digest, batch header
            if max_entry_bytes > frame_room:
                raise InvalidArgumentError("max_entry_bytes does not fit the client's max_frame_size",
                                           max_entry_bytes=max_entry_bytes, max_frame_size=bk.config.max_frame_size)
            asked = {k: v for k, v in (("ensemble_size", ensemble_size), ("write_quorum", write_quorum),
                                       ("ack_quorum", ack_quorum), ("roll_bytes", roll_bytes),
                                       ("roll_seconds", roll_seconds)) if v is not None}
            return bk._loop.run(cls._open(bk, owned, node, password, asked, max_entry_bytes, max_inflight_entries))
        except BaseException:
            if owned:
                bk.close()
            raise

    @classmethod
    async def _open(cls, bk: BookKeeper, owned: bool, node: _LogNode, password: bytes, asked: dict[str, Any],
                    max_entry_bytes: int, max_inflight: int) -> WriteAheadLog:
        core = bk._core

        def claim() -> tuple[LogMetadata, int]:
            settings = LogSettings.of({**node.namespace_defaults(), **asked})
            node.create(settings)

            def bump() -> tuple[LogMetadata, int]:
                meta, version = node.read()
                bumped = dataclasses.replace(meta, epoch=meta.epoch + 1)
                return bumped, node.write(bumped, version)

            return retry_cas(bump, "log metadata (claiming its epoch)", log=node.name)

        meta, version = await core.md(claim)
        epoch = meta.epoch
        for segment in meta.segments[-2:]:  # fence and close what a previous writer left open
            try:
                await bk._open(segment.ledger_id, password, True)
            except NoSuchLedgerError:
                log.warning("log %s: segment %d's ledger %d is gone", node.name, segment.seq, segment.ledger_id,
                            extra=context(log=node.name, namespace=node.namespace, ledger=segment.ledger_id))
        settings = meta.settings
        writer = await bk._create(settings.ensemble_size, settings.write_quorum, settings.ack_quorum, "crc32c",
                                  password, {"walkit.log": f"{node.namespace}/{node.name}".encode()})
        seq = meta.segments[-1].seq + 1 if meta.segments else 1
        segment = Segment(seq, writer.ledger_id)

        def add_segment() -> None:
            current, current_version = node.read()
            if segment in current.segments:
                return  # our own write, whose reply was lost
            if current.epoch != epoch:
                raise WriterFencedError("another writer opened the log", log=node.name, epoch=epoch,
                                        current=current.epoch)
            node.write(dataclasses.replace(current, segments=(*current.segments, segment)), current_version)

        try:
            await core.md(functools.partial(retry_cas, add_segment, "log metadata (adding a segment)", log=node.name))
        except BaseException:
            await _discard_segment(bk, node, writer, segment)
            raise
        writer.idle_lac = bk.config.idle_lac is not False  # on unless the client turned it off
        if not writer.idle_lac:
            writer.explicit_lac_interval = bk.config.explicit_lac_interval or EXPLICIT_LAC_INTERVAL
        wal = cls(bk, owned, node, password, epoch=epoch, settings=settings, segment=segment, writer=writer,
                  max_entry_bytes=max_entry_bytes, max_inflight_entries=max_inflight)
        log.info("log %s/%s: writer epoch %d, segment %d (ledger %d)", node.namespace, node.name, epoch, seq,
                 writer.ledger_id, extra=context(log=node.name, namespace=node.namespace, ledger=writer.ledger_id))
        return wal

    @classmethod
    def reader(cls, client_or_uri: BookKeeper | str, name: str, *, namespace: str = "default",
               password: bytes = b"") -> LogReader:
        """A read-only view of the log: ``replay``, ``tail``, ``latest_snapshot``."""
        bk, owned = _client(client_or_uri)
        try:
            node = _LogNode(bk, namespace, name)
            node.read()  # NoSuchLogError now rather than at the first read
        except BaseException:
            if owned:
                bk.close()
            raise
        return LogReader(bk, owned, node, password)

    # -- appending --------------------------------------------------------------------------
    def append_async(self, record: bytes) -> Future[LSN]:
        """Queue a record; the future gives its LSN once it is durable on a quorum.
        Futures complete in append order."""
        if record.__class__ is not bytes or len(record) > self._max_record:
            record = self._checked(record)
        fut: QuickFuture[LSN] = QuickFuture()
        lock = self._lock
        lock.acquire()  # not "with": that costs twice as much, once per record
        try:
            if self._closing:
                raise UsageError("log is closed", log=self.name)
            if self._error is not None:
                fut.set_exception(self._error)
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
        self._bk._loop.call(self._pump)
        return fut

    def append_many(self, records: Iterable[bytes]) -> Future[list[LSN]]:
        """Queue ``records`` together, in order; one future gives their LSNs (in order)
        once the last of them is durable on a quorum. They are packed into entries with
        whatever else is queued (a large batch spans several entries), and appends made
        after this call come after them. Every record is checked before any is queued:
        a bad one raises and queues nothing. On a writer failure the future fails, and
        which of the records became durable is unknown (``last_lsn`` tells what was
        acknowledged before), as for the futures of ``append_async``."""
        batch = [self._checked(record) for record in records]
        many = ManyFuture(len(batch))
        if not batch:
            many.set_result([])
            return many
        with self._lock:  # append_async's steps, which it keeps inline: a call less per record
            if self._closing:
                raise UsageError("log is closed", log=self.name)
            if self._error is not None:
                many.set_exception(self._error)
                return many
            if not self._queue:
                self._queued_at = time.monotonic()
            self._queue += batch
            self._futures += [many] * len(batch)
            self._many = True
            if self._scheduled:
                return many
            self._scheduled = True
        self._bk._loop.call(self._pump)
        return many

    def _checked(self, record: bytes) -> bytes:
        """``record`` as bytes, or InvalidArgumentError."""
        if record.__class__ is not bytes:
            if not isinstance(record, (bytes, bytearray, memoryview)):
                raise InvalidArgumentError("a record is bytes", type=type(record).__name__)
            record = bytes(record)
        if len(record) > self._max_record:
            raise InvalidArgumentError("record larger than max_entry_bytes", size=len(record),
                                       limit=self._max_record)
        return record

    def append(self, record: bytes) -> LSN:
        """Append a record; its LSN once it is durable on a quorum of bookies."""
        if self._bk._loop.in_loop():
            raise UsageError("append blocks: not from the client's loop thread; use append_async")
        return self.append_async(record).result()

    def flush(self) -> LSN | None:
        """Wait until every record appended so far is durable; the last LSN."""
        with self._lock:
            last = self._futures[-1] if self._futures else None
        if last is not None:
            last.exception()  # waits; the error (if any) is the records' to report
        self._bk._loop.run(self._wait_idle())
        if self._error is not None:
            raise self._error
        return self.last_lsn

    # loop side
    def _pump(self) -> None:
        with self._lock:
            self._scheduled = False
        while self._error is None and not self._rolling and self._in_flight < self._max_inflight:
            if not self._closing and (self._segment_bytes >= self.settings.roll_bytes or (
                    self._segment_bytes and time.monotonic() - self._segment_started >= self.settings.roll_seconds)):
                self._rolling = True
                asyncio.get_running_loop().create_task(self._roll())
                return
            with self._lock:  # held for a swap only: appends wait on this lock
                records, futures = self._queue, self._futures
                if not records:
                    break
                self._queue, self._futures = [], []
                queued_at, many, self._many = self._queued_at, self._many, False
            if sum(map(len, records)) + 4 * len(records) > self._max_entry_bytes:  # more than an entry holds
                take, size = 0, 0
                for record in records:
                    if take and size + len(record) + 4 > self._max_entry_bytes:
                        break
                    take += 1
                    size += len(record) + 4
                rest: list[QuickFuture[LSN]] = []
                with self._lock:  # the rest goes back ahead of whatever came meanwhile
                    if self._error is None:
                        if not self._queue:
                            self._queued_at = queued_at
                        self._queue[:0] = records[take:]
                        self._futures[:0] = futures[take:]
                        self._many = self._many or many
                    else:  # _fail took the queue while these were out of it
                        rest = futures[take:]
                if rest:
                    assert self._error is not None
                    fail_all(rest, self._error)
                records, futures = records[:take], futures[:take]
            packed = pack_records(records)
            try:  # on the loop: never blocks (max_inflight_entries <= max_pending_adds, checked at open)
                done = self._writer.submit(packed)
            except WalkitError as exc:
                self._fail(self._as_wal_error(exc), futures)
                break
            self._in_flight += 1
            self._segment_bytes += len(packed)
            done.add_done_callback(functools.partial(self._entry_done, futures=futures, seq=self._segment.seq,
                                                     queued_at=queued_at, many=many))
        if self._in_flight == 0 and not self._rolling:
            self._wake_idle()

    def _entry_done(self, done: Future[int], futures: list[Any], seq: int, queued_at: float,
                    many: bool = False) -> None:
        self._in_flight -= 1
        error = done.exception()
        stats = self.stats
        if error is not None:
            self._fail(self._as_wal_error(error), futures)
        else:
            stats.records += len(futures)
            stats.entries += 1
            stats.records_per_entry.observe(len(futures))
            stats.append_seconds.observe(time.monotonic() - queued_at)
            entry = done.result()
            self.last_lsn = LSN._trusted(seq, entry, len(futures) - 1)  # before any caller hears of these records
            if many:  # some of these records were appended together (append_many)
                complete_entry(futures, seq, entry)
            else:
                QuickFuture.set_results(futures, LSN._slots(seq, entry, len(futures)))
        if self._in_flight == 0:
            self._wake_idle()  # a roll waits for this, and so does flush()
        if self._bk._loop.in_loop():
            self._pump()
        else:
            self._bk._loop.call(self._pump)

    def _as_wal_error(self, error: BaseException) -> WalkitError:
        if isinstance(error, WriterFencedError):
            return error
        if isinstance(error, LedgerFencedError):
            return WriterFencedError("a newer writer took the log over", log=self.name, epoch=self.epoch)
        if isinstance(error, WalkitError):
            return error
        return WalkitError("append failed", log=self.name, reason=repr(error))

    def _fail(self, error: WalkitError, futures: Sequence[Future[LSN]] = ()) -> None:
        if self._error is None:
            self._error = error
            log.warning("log %s: writer failed: %s", self.name, error,
                        extra=context(log=self.name, namespace=self.namespace))
        with self._lock:
            queued, self._futures, self._queue = self._futures, [], []
        self.stats.append_failures += fail_all([*futures, *queued], self._error)
        if self._bk._loop.in_loop():
            self._wake_idle()
        else:  # snapshot / truncate fail on the caller's thread: the waiters live on the loop
            with contextlib.suppress(UsageError):
                self._bk._loop.call(self._wake_idle)

    def _wake_idle(self) -> None:
        waiters, self._idle = self._idle, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _wait_idle(self) -> None:
        while True:
            with self._lock:
                queued = bool(self._queue)
            if self._error is not None or (not queued and self._in_flight == 0 and not self._rolling):
                return
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle.append(fut)
            self._pump()
            await fut

    async def _roll(self) -> None:
        """Close the segment and start the next one (records wait meanwhile)."""
        core = self._bk._core
        try:
            while self._in_flight:
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._idle.append(fut)
                await fut
            if self._error is not None:
                return
            await self._writer.close()
            settings = self.settings
            writer = await self._bk._create(settings.ensemble_size, settings.write_quorum, settings.ack_quorum,
                                            "crc32c", self._password,
                                            {"walkit.log": f"{self.namespace}/{self.name}".encode()})
            segment = Segment(self._segment.seq + 1, writer.ledger_id)

            def add(meta: LogMetadata) -> LogMetadata:
                if segment in meta.segments:
                    return meta  # our own write, whose reply was lost
                return dataclasses.replace(meta, segments=(*meta.segments, segment))

            try:
                await core.md(functools.partial(retry_cas, functools.partial(self._change, add),
                                                "log metadata (adding a segment)", log=self.name))
            except BaseException:
                await _discard_segment(self._bk, self._node, writer, segment)
                raise
            writer.explicit_lac_interval = self._writer.explicit_lac_interval
            writer.idle_lac = self._writer.idle_lac
            self._writer, self._segment = writer, segment
            self._segment_bytes, self._segment_started = 0, time.monotonic()
            self.stats.rolls += 1
            log.info("log %s: rolled to segment %d (ledger %d)", self.name, segment.seq, writer.ledger_id,
                     extra=context(log=self.name, namespace=self.namespace, ledger=writer.ledger_id))
        except WalkitError as exc:
            self._fail(self._as_wal_error(exc))
        except Exception as exc:
            log.exception("log %s: roll failed", self.name, extra=context(log=self.name, namespace=self.namespace))
            self._fail(WalkitError("segment roll failed", log=self.name, reason=repr(exc)))
        finally:
            self._rolling = False
            self._pump()

    def _change(self, change: Any) -> None:
        """(Metadata thread) CAS ``change(meta)`` into the log node if our epoch holds."""
        current, version = self._node.read()
        if current.epoch != self.epoch:
            raise WriterFencedError("another writer opened the log", log=self.name, epoch=self.epoch,
                                    current=current.epoch)
        new = change(current)
        if new != current:
            self._node.write(new, version)

    def _own_lac(self, segment: Segment) -> int | None:
        return self._writer.lac if segment == self._segment else None

    # -- snapshots and retention ----------------------------------------------------------------
    def snapshot(self, data: bytes | IO[bytes], lsn: LSN) -> Snapshot:
        """Store application state that covers every record up to ``lsn`` (chunked into
        a ledger of its own, then recorded in the log metadata atomically). ``lsn`` must
        be acknowledged and not older than the latest snapshot's."""
        self._check_writable()
        if not isinstance(lsn, LSN):
            raise InvalidArgumentError("snapshot needs the LSN it covers", type=type(lsn).__name__)
        with self._admin:
            self._check_snapshot_lsn(lsn)
            return self._snapshot(data, lsn)

    def _check_snapshot_lsn(self, lsn: LSN) -> None:
        meta = self.metadata()
        known = {s.seq: s for s in meta.segments}
        if lsn.segment not in known:
            raise InvalidArgumentError("snapshot LSN names no segment of the log", lsn=str(lsn),
                                       segments=f"{meta.segments[0].seq}..{meta.segments[-1].seq}"
                                       if meta.segments else "none")
        if self.last_lsn is not None and lsn <= self.last_lsn:
            return
        if lsn.segment >= self._segment.seq:
            raise InvalidArgumentError("snapshot LSN is past the last acknowledged record", lsn=str(lsn),
                                       last=str(self.last_lsn))
        # a segment closed before this writer: everything in it up to its last entry is durable
        last_entry = self._bk.ledger_metadata(known[lsn.segment].ledger_id).last_entry_id
        if lsn.entry > last_entry:
            raise InvalidArgumentError("snapshot LSN is past the end of its segment", lsn=str(lsn),
                                       last_entry=last_entry)

    def _snapshot(self, data: bytes | IO[bytes], lsn: LSN) -> Snapshot:
        s = self.settings
        handle = self._bk.create_ledger(s.ensemble_size, s.write_quorum, s.ack_quorum, password=self._password,
                                        custom_metadata={"walkit.snapshot": f"{self.namespace}/{self.name}".encode(),
                                                         "walkit.lsn": str(lsn).encode()})
        size = 0
        previous: list[SnapshotRef] = []
        try:
            stream = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
            pending = []
            while True:
                chunk = stream.read(SNAPSHOT_CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                pending.append(handle.add_entry_async(bytes(chunk)))
                if len(pending) >= 16:
                    pending.pop(0).result()
            for fut in pending:
                fut.result()
            handle.close()
            ref = SnapshotRef(lsn, handle.ledger_id, size)

            def record(meta: LogMetadata) -> LogMetadata:
                if meta.snapshots and meta.snapshots[-1] == ref:
                    return meta  # our own write, whose reply was lost
                if meta.snapshots and lsn < meta.snapshots[-1].lsn:
                    raise InvalidArgumentError("snapshot LSN is older than the latest snapshot's", lsn=str(lsn),
                                               latest=str(meta.snapshots[-1].lsn))
                previous[:] = [old for old in meta.snapshots if old != ref]
                return dataclasses.replace(meta, snapshots=(ref,))

            retry_cas(functools.partial(self._change, record), "log metadata (recording a snapshot)", log=self.name)
            self.stats.snapshots += 1
            self.stats.snapshot_bytes += size
        except BaseException as exc:
            with contextlib.suppress(WalkitError):
                handle.close()
            if _settle(self._node, lambda meta: any(s.ledger_id == handle.ledger_id for s in meta.snapshots)) is False:
                with contextlib.suppress(WalkitError):
                    self._bk.delete_ledger(handle.ledger_id)
            else:
                log.warning("log %s: snapshot ledger %d kept: it is, or may be, the log's latest snapshot",
                            self.name, handle.ledger_id,
                            extra=context(log=self.name, namespace=self.namespace, ledger=handle.ledger_id))
            if isinstance(exc, WriterFencedError):
                self._fail(exc)
            raise
        for old in previous:
            with contextlib.suppress(NoSuchLedgerError):
                self._bk.delete_ledger(old.ledger_id)
        return Snapshot(self._bk, ref, self._password)

    def truncate(self, before: LSN) -> int:
        """Delete whole segments wholly below ``before`` and below the latest snapshot
        (never past it: without a snapshot nothing goes); the number deleted."""
        self._check_writable()
        if not isinstance(before, LSN):
            raise InvalidArgumentError("truncate needs an LSN", type=type(before).__name__)
        with self._admin:
            return self._truncate(before)

    def _truncate(self, before: LSN) -> int:
        dropped: list[Segment] = []

        def cut(meta: LogMetadata) -> LogMetadata:
            limit = min(before, meta.snapshots[-1].lsn) if meta.snapshots else None
            dropped[:] = [s for s in meta.segments
                          if limit is not None and s.seq < limit.segment and s != self._segment]
            if not dropped:
                return meta
            keep = tuple(s for s in meta.segments if s not in dropped)
            mark = LSN(keep[0].seq, 0, 0) if keep else LSN(dropped[-1].seq + 1, 0, 0)
            return dataclasses.replace(meta, segments=keep, truncated=max(mark, meta.truncated or mark))

        try:
            retry_cas(functools.partial(self._change, cut), "log metadata (truncating)", log=self.name)
        except WriterFencedError as exc:
            self._fail(exc)
            raise
        for segment in dropped:
            with contextlib.suppress(NoSuchLedgerError):
                self._bk.delete_ledger(segment.ledger_id)
        return len(dropped)

    def _check_writable(self) -> None:
        self._check_open()
        if self._error is not None:
            raise self._error

    # -- closing ------------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for appended records, close the segment; the log stays (open it again
        to write more, or read it)."""
        if self._closed:
            return
        with self._lock:
            self._closing = True  # appends from now on are refused, no roll starts
        try:
            self._bk._loop.run(self._wait_idle())
            if not isinstance(self._error, WriterFencedError):  # a fenced segment is the new writer's to close
                with contextlib.suppress(LedgerFencedError):
                    self._bk._loop.run(self._writer.close())
        finally:
            with self._lock:
                self._closed = True
            super().close()

    def __enter__(self) -> WriteAheadLog:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
        else:
            with contextlib.suppress(WalkitError):
                self.close()


def _settle(node: _LogNode, present: Any) -> bool | None:
    """After a change to the log node failed, whether it is in: True, False (and never
    will be), or None (the metadata store cannot tell now).

    A failed change may still have landed: its reply was lost, or it was retried and a
    later attempt failed. Reading the node is not enough to say "no": a write whose
    connection dropped can still be committed after the read. So a "no" is made final by
    writing the node back unchanged at the version read: every write that expected an
    older version can never apply. Only a final "no" lets the caller delete what the
    change would have named (a segment's or a snapshot's ledger); anything else keeps it.
    (Blocking: run it off the client loop.)"""

    def decide() -> bool:
        meta, version = node.read()
        if present(meta):
            return True
        node.write(meta, version)
        return False

    try:
        return retry_cas(decide, "log metadata (settling a failed change)", log=node.name)
    except WalkitError as exc:
        log.warning("log %s: cannot tell whether a failed metadata change landed: %s", node.name, exc,
                    extra=context(log=node.name, namespace=node.namespace))
        return None


async def _discard_segment(bk: BookKeeper, node: _LogNode, writer: LedgerWriter, segment: Segment) -> None:
    """A new segment could not be added to the log: close its ledger, and delete it only
    if the segment is surely not in the log (its records would be lost with it)."""
    with contextlib.suppress(WalkitError):
        await writer.close()
    core = bk._core
    if await core.md(_settle, node, lambda meta: segment in meta.segments) is False:
        with contextlib.suppress(WalkitError):
            await core.md(core.ledgers.delete, writer.ledger_id)
    else:
        log.warning("log %s: ledger %d kept: it is, or may be, segment %d of the log", node.name,
                    writer.ledger_id, segment.seq,
                    extra=context(log=node.name, namespace=node.namespace, ledger=writer.ledger_id))


# -- namespaces ---------------------------------------------------------------------------------
def list_logs(client_or_uri: BookKeeper | str, namespace: str = "default") -> list[str]:
    """The names of the logs of ``namespace``, sorted."""
    bk, owned = _client(client_or_uri)
    try:
        node = _LogNode(bk, namespace, "x")
        try:
            return sorted(node.store.children(node.ns_path))
        except NoNodeError:
            return []
    finally:
        if owned:
            bk.close()


def delete_log(client_or_uri: BookKeeper | str, namespace: str, name: str) -> None:
    """Delete a log: its metadata, then its segments' and snapshots' ledgers.
    NoSuchLogError when there is no such log; FormatVersionError when its metadata is of
    a later format (a newer walkit's: it may name ledgers this one does not know of)."""
    bk, owned = _client(client_or_uri)
    try:
        node = _LogNode(bk, namespace, name)
        meta, version = node.read()
        meta.check_writable()  # a newer walkit's log may hold ledgers this one does not know of
        node.store.delete(node.path, version)
        for ledger_id in [s.ledger_id for s in meta.segments] + [s.ledger_id for s in meta.snapshots]:
            with contextlib.suppress(NoSuchLedgerError):
                bk.delete_ledger(ledger_id)
    finally:
        if owned:
            bk.close()


def set_namespace_defaults(client_or_uri: BookKeeper | str, namespace: str, **settings: Any) -> None:
    """Default settings (``ensemble_size``, ``write_quorum``, ``ack_quorum``,
    ``roll_bytes``, ``roll_seconds``) for logs created in ``namespace`` from now on."""
    import json

    LogSettings.of(settings)  # checked against the defaults of the others
    bk, owned = _client(client_or_uri)
    try:
        node = _LogNode(bk, namespace, "x")
        data = json.dumps(settings, sort_keys=True, separators=(",", ":")).encode("ascii")
        try:
            node.store.create(node.ns_path, data, make_parents=True)
        except NodeExistsError:
            node.store.set(node.ns_path, data)
    finally:
        if owned:
            bk.close()
