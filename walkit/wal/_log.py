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
``roll_bytes`` or ``roll_seconds``; records wait meanwhile. A record larger than an entry
(up to ``max_record_bytes``) goes alone, in fragments in consecutive entries (no other
record and no roll among them); its LSN is (segment, entry of its last fragment, 0), and
readers hand it out whole or not at all (``walkit/wal/_records.py``).

Readers (``WriteAheadLog.reader``) never fence: they read closed segments to the end
and the open one up to its LAC, which the writer publishes (an explicit LAC write) the
moment it goes idle; ``tail`` follows the open segment by long poll and moves to the next
segment once its ledger is closed (by a roll, a writer's close, or a new writer's
recovery).

Where things run: the orchestration is written once, for the sync API here and the
asyncio one (``walkit.aio``), as coroutines and async generators on the client's loop -
opening (``_open``), ``flush`` (``_flush``), ``close`` (``_finish``), and the entries
of a replay or a tail (``_replay_entries``, ``_tail_entries``: batches of entries with
their segment, a replay's next chunk read while one is out). The sync methods run them
with ``LoopThread.run`` / ``LoopThread.iterate``; ``walkit.aio`` awaits them from the
caller's loop. The records of a pass are made on the consumer's side (its thread or its
loop) by one :class:`RecordReader` per pass (:class:`_Pass`). Blocking metadata calls
run on the client's metadata threads (``ClientCore.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from walkit.client import BookKeeper, Entry, LedgerWriter, QuickFuture, ReadState, read_chunks
from walkit.errors import (
    InvalidArgumentError,
    LedgerFencedError,
    MetadataVersionError,
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
from walkit.metadata import check_bookie_id, cluster_path, retry_cas
from walkit.wal._auth import LogAuth, check_password
from walkit.wal._format import LogMetadata, LogSettings, Retention, Segment, SnapshotRef, pack_records
from walkit.wal._lsn import LSN
from walkit.wal._many import ManyFuture, complete_entry, fail_all
from walkit.wal._format import FRAGMENT_HEAD_SIZE, fragment_count, pack_fragment
from walkit.wal._records import DEFAULT_MAX_RECORD_BYTES, RecordReader, check_max_record_bytes
from walkit.wal._retention import PASS_INTERVAL, Hold, cut, delete_ledgers, wait_locked
from walkit.wal._snapshots import Snapshot, SnapshotData, SnapshotJob, check_snapshot_data, snapshot_chunks
from walkit.wal._stats import LOGS
from walkit.wal._watch import NodeWatch

__all__ = ["WriteAheadLog", "LogReader", "Snapshot", "list_logs", "delete_log", "set_namespace_defaults"]

log = logging.getLogger(__name__)

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


#: What a new log's or namespace's name may hold: letters and digits (any script), and
#: ``. _ - : @ + =``; 1 to 255 characters, not starting with ".". Names that pass stay
#: one word in every listing, a shell argument without quotes, and a node name.
NAME_RULES = "1-255 letters, digits and . _ - : @ + =, not starting with '.'"
_NAME_PUNCTUATION = frozenset("._-:@+=")


def is_plain_name(value: object) -> bool:
    """True if ``value`` follows :data:`NAME_RULES`."""
    return (isinstance(value, str) and 0 < len(value) <= 255 and not value.startswith(".")
            and all(c.isalnum() or c in _NAME_PUNCTUATION for c in value))


def _check_name(kind: str, value: str, *, new: bool = False) -> str:
    """``value`` as a name of ``kind`` ("log", "namespace"). A name given to make
    something ``new`` follows :data:`NAME_RULES`; one that may name an existing node
    only has to be a node name (logs made by an earlier walkit stay reachable)."""
    if new and not is_plain_name(value):
        raise InvalidArgumentError(f"invalid {kind} name: use {NAME_RULES}", name=repr(value)[:300])
    try:
        return check_bookie_id(value)  # the same rules: one non-empty node name
    except InvalidArgumentError:
        raise InvalidArgumentError(f"invalid {kind} name: use {NAME_RULES}", name=repr(value)[:300]) from None


class _LogNode:
    """The log's metadata node (blocking calls: run them off the client loop)."""

    def __init__(self, bk: BookKeeper, namespace: str, name: str) -> None:
        self.store = bk._cluster.store
        self.namespace = _check_name("namespace", namespace)
        self.name = _check_name("log", name)
        self.ns_path = cluster_path(bk._cluster.info.root, f"logs/{namespace}")
        self.path = f"{self.ns_path}/{name}"
        self.holds_path = cluster_path(bk._cluster.info.root, f"logholds/{namespace}/{name}")

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

    def create(self, settings: LogSettings, password: bytes) -> LogMetadata | None:
        """Make the node of a new log, its epoch 1 claimed by the caller (a writer
        opening it) with a verifier of its password: the node made (at version 0), or
        None when it exists (already, or made by another writer at the same time: the
        caller checks the password and bumps the epoch)."""
        meta = LogMetadata(1, (), (), None, settings, auth=LogAuth.of(password))
        if not (is_plain_name(self.namespace) and is_plain_name(self.name)) and self.store.exists(self.path):
            return None  # made by an earlier walkit, whose names had fewer rules: it stays reachable
        _check_name("namespace", self.namespace, new=True)
        _check_name("log", self.name, new=True)
        try:
            self.store.create(self.path, meta.encode(), make_parents=True)
        except NodeExistsError:
            return None
        return meta

    def write(self, meta: LogMetadata, version: int) -> int:
        return self.store.set(self.path, meta.encode(), version).version

    def check_password(self, bk: BookKeeper, meta: LogMetadata, password: bytes) -> None:
        """(Blocking) UnauthorizedError unless ``password`` is the log's: before anything
        of the log changes on its bearer's behalf (walkit/wal/_auth.py)."""
        def ledger_ok(ledger_id: int, candidate: bytes) -> bool:
            return bk.ledger_metadata(ledger_id).check_password(candidate)

        check_password(meta.auth, meta.ledgers_newest_first(), password, ledger_ok,
                       namespace=self.namespace, log=self.name)


class _LogView:
    """What readers and the writer share: the node, reading segments, snapshots."""

    #: The largest record a pass puts together from fragments (``reader(max_record_bytes=)``).
    _max_record_bytes = DEFAULT_MAX_RECORD_BYTES

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
        """The newest snapshot (None: none yet)."""
        snapshots = self.metadata().snapshots
        return Snapshot(self._bk, snapshots[-1], self._password) if snapshots else None

    def snapshots(self) -> list[Snapshot]:
        """The snapshots kept, oldest first (only whole ones are ever listed); load any of
        them and replay after its ``lsn``."""
        return [Snapshot(self._bk, ref, self._password) for ref in self.metadata().snapshots]

    async def _open_segment(self, segment: Segment) -> ReadState:
        """(Client loop) a reader of the segment's ledger; a segment deleted under the
        reader (retention after a newer snapshot) is an error, never a silent gap."""
        try:
            state = await self._bk._open(segment.ledger_id, self._password, False)
        except NoSuchLedgerError as exc:
            raise NoSuchLedgerError("a segment of the log was deleted (truncated) while it was being read; "
                                    "start again from the latest snapshot", log=self.name, segment=segment.seq,
                                    ledger=segment.ledger_id) from exc
        state.reader.payload_views = True  # its entries only reach RecordReader.chunk, which copies what it keeps
        return state

    def _record_reader(self) -> RecordReader:
        """The records of one pass (a replay, a tail): one reader, every entry in order."""
        return RecordReader(self.name, self.stats, self._max_record_bytes)

    def _waited(self, seconds: float) -> None:
        self.stats.replay_read_seconds += seconds

    def _own_lac(self, segment: Segment) -> int | None:
        """The writer's LAC for its own open segment (None for readers)."""
        return None

    def replay(self, after: LSN | None = None) -> Iterator[tuple[LSN, bytes]]:
        """Every durable record after ``after`` (all when None), across segments, in
        order: ``(lsn, record)``."""
        return self._replay_pass(after).records()

    def _replay_pass(self, after: LSN | None) -> _Pass:
        return _Pass(self, self._replay_entries(after), after, self._waited)

    async def _replay_entries(self, after: LSN | None) -> AsyncGenerator[tuple[Segment, list[Entry]], None]:
        """(Client loop) the entries of a replay after ``after``, in chunks with their
        segment, the next chunk's read under way while one is out (``read_chunks``)."""
        self._check_open()
        if after is not None and not isinstance(after, LSN):
            raise InvalidArgumentError("after must be an LSN or None", type=type(after).__name__)
        md = self._bk._core.md
        meta = await self._start_held(after)
        for segment in meta.segments_from(after):
            await md(self._held, _segment_start(segment, after))
            state = await self._open_segment(segment)
            own = self._own_lac(segment)
            if own is not None:  # the writer knows its own segment's LAC better than the bookies
                state.lac = max(state.lac, own)
            last = state.lac
            first = after.entry if after is not None and after.segment == segment.seq else 0
            if first <= last:
                async with contextlib.aclosing(read_chunks(state, first, last)) as chunks:
                    async for entries in chunks:
                        yield segment, entries

    async def _start_held(self, after: LSN | None) -> LogMetadata:
        """(Client loop) a pass from ``after`` begins: hold it (before the node is read,
        walkit/wal/_retention.py), then refuse it if it was cut - putting the hold back."""
        md = self._bk._core.md
        previous = await md(self._held, after)
        meta = await md(self.metadata)
        try:
            self._check_not_truncated(meta, after)
        except InvalidArgumentError:
            await md(self._held, previous)
            raise
        return meta

    def _held(self, position: LSN | None) -> LSN | None:
        """A pass has reached ``position``: what a reader's hold keeps from now on; what
        it kept before."""
        return None

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
        if self._shut():
            self._bk.close()

    def _shut(self) -> bool:
        """Close the handle itself (blocking: it may release what it holds in metadata);
        whether its own client (opened from a URI) is left for the caller to close."""
        if self._closed:
            return False
        self._closed = True
        LOGS.retire(self)
        return self._owned


def _segment_start(segment: Segment, after: LSN | None) -> LSN:
    """Where a pass that reads ``segment`` from ``after`` stands as it starts it."""
    return after if after is not None and after.segment == segment.seq else LSN(segment.seq, 0, 0)


class _Pass:
    """One pass over a log - a replay or a tail - for either API: the entries come from
    ``entries``, an async generator on the client's loop, a batch at a time with their
    segment; the records are made on the consumer's side (its thread, or its event loop)
    by one :class:`RecordReader` for the pass, handed every entry in order."""

    def __init__(self, view: _LogView, entries: AsyncGenerator[tuple[Segment, list[Entry]], None],
                 after: LSN | None, waited: Callable[[float], None] | None) -> None:
        self._view = view
        self._entries = entries
        self._after = after
        self._waited = waited

    def records(self) -> Iterator[tuple[LSN, bytes]]:
        """(Another thread than the client's loop) the pass's ``(lsn, record)`` pairs."""
        unpack = self._view._record_reader().chunk
        after = self._after
        for segment, entries in self._view._bk._loop.iterate(self._entries, self._waited):
            yield from unpack(segment, entries, after)

    async def arecords(self) -> AsyncGenerator[tuple[LSN, bytes], None]:
        """(On the caller's event loop) the same pairs, awaited: no thread of that loop's
        is used (``LoopThread.aiterate``)."""
        unpack = self._view._record_reader().chunk
        after = self._after
        async with contextlib.aclosing(self._view._bk._loop.aiterate(self._entries, self._waited)) as batches:
            async for segment, entries in batches:
                for record in unpack(segment, entries, after):
                    yield record


@contextlib.asynccontextmanager
async def _watching(bk: BookKeeper, watch: NodeWatch) -> AsyncIterator[None]:
    """(Client loop) hold the log node's watch while a tail runs: started on a metadata
    thread (the store reports the node at once), released when the tail ends however it
    ends - one cancelled while the watch started releases it once started."""
    started = asyncio.ensure_future(bk._core.md(watch.acquire))
    try:
        await asyncio.shield(started)
        yield
    finally:
        if started.done():
            watch.release()
        else:
            started.add_done_callback(lambda _: watch.release())


class LogReader(_LogView):
    """A read-only view of a log (no fencing: the writer goes on). With ``hold``, the
    position its replay or tail has reached is kept from retention; with ``cursor``, a
    named position (:meth:`commit`, :attr:`position`) is (walkit/wal/_retention.py)."""

    def __init__(self, bk: BookKeeper, owned: bool, node: _LogNode, password: bytes, *, hold: bool = False,
                 cursor: str | None = None) -> None:
        super().__init__(bk, owned, node, password)
        self._watch = NodeWatch(node.store, node.path)  # runs while a tail runs
        self._hold = Hold(node.store, node.holds_path, node.path, node.name) if hold else None
        self._cursor = None if cursor is None else Hold(node.store, node.holds_path, node.path, node.name, cursor)
        try:
            if self._hold is not None:
                self._hold.register(None)  # everything, until a pass says where it stands
            if self._cursor is not None:
                self._cursor.register(None)  # a new cursor starts at the log's start
        except BaseException:
            self._release_holds()
            raise

    @property
    def position(self) -> LSN | None:
        """The cursor's committed position (None: the log's start); UsageError without a cursor."""
        if self._cursor is None:
            raise UsageError("this reader has no cursor (WriteAheadLog.reader(..., cursor=name))", log=self.name)
        return self._cursor.refresh()

    def commit(self, lsn: LSN) -> None:
        """Store ``lsn`` as the cursor's position: everything after it stays readable.
        Moving it back is allowed while the records after the new position still exist."""
        self._check_open()
        if self._cursor is None:
            raise UsageError("this reader has no cursor (WriteAheadLog.reader(..., cursor=name))", log=self.name)
        if not isinstance(lsn, LSN):
            raise InvalidArgumentError("commit needs an LSN", type=type(lsn).__name__)
        self._check_not_truncated(self.metadata(), lsn)  # refused before anything moves
        previous = self._cursor.refresh()
        self._cursor.move(lsn)
        try:
            self._check_not_truncated(self.metadata(), lsn)  # a cut that landed meanwhile
        except InvalidArgumentError:
            with contextlib.suppress(WalkitError):
                self._cursor.move(previous)
            raise

    def delete_cursor(self) -> None:
        """Delete the named cursor: its position keeps nothing from now on."""
        if self._cursor is None:
            raise UsageError("this reader has no cursor", log=self.name)
        self._cursor.delete()

    def _held(self, position: LSN | None) -> LSN | None:
        if self._hold is None or self._closed:
            return None
        previous = self._hold.position
        self._hold.move(position)
        return previous

    def _release_holds(self) -> None:
        for hold in (self._hold, self._cursor):
            if hold is not None:
                with contextlib.suppress(WalkitError):
                    hold.release()

    def _shut(self) -> bool:
        self._watch.close()  # a tail waiting for the log to move on ends now
        self._release_holds()
        return super()._shut()

    def tail(self, after: LSN | None = None, *, poll_timeout: float = 1.0) -> Iterator[tuple[LSN, bytes]]:
        """Records after ``after`` as they become durable, for ever (break out of the
        loop to stop): replay, then follow the open segment by long poll, then the next
        segments as the log rolls or changes writer."""
        return self._tail_pass(after, poll_timeout).records()

    def _tail_pass(self, after: LSN | None, poll_timeout: float) -> _Pass:
        return _Pass(self, self._tail_entries(after, poll_timeout), after, None)

    async def _tail_entries(self, after: LSN | None,
                            poll_timeout: float) -> AsyncGenerator[tuple[Segment, list[Entry]], None]:
        """(Client loop) the entries of a tail after ``after``, a follow step's worth at a
        time, as they become durable, segment after segment."""
        self._check_open()
        md = self._bk._core.md
        await self._start_held(after)
        handed = after is not None  # whether the tail stands past a point (segments cut since are an error)
        next_seq = 1 if after is None else after.segment
        async with _watching(self._bk, self._watch):
            while True:
                self._check_open()  # close() ends a tail at its next poll
                meta, version = await md(self._node.read)
                segments = [s for s in meta.segments if s.seq >= next_seq]
                if not segments:
                    await self._watch.wait_past(version, _POLL)  # woken by the node's next change (_watch.py)
                    continue
                if segments[0].seq > next_seq and handed:
                    raise NoSuchLedgerError("segments the tail had not read yet were truncated", log=self.name,
                                            expected=next_seq, first_kept=segments[0].seq)
                for segment in segments:
                    await md(self._held, _segment_start(segment, after))
                    state = await self._open_segment(segment)
                    next_id = after.entry if after is not None and after.segment == segment.seq else 0
                    while True:  # the segment's entries as they come, until it is closed and read
                        self._check_open()  # close() ends a tail at its next poll
                        batch, version = await self._step(state, next_id, poll_timeout, version)
                        if batch is None:
                            break
                        if batch:
                            next_id = batch[-1].entry_id + 1
                            handed = True
                            yield segment, batch
                    next_seq = segment.seq + 1

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
        self._max_record = DEFAULT_MAX_RECORD_BYTES  # the largest record taken (open's max_record_bytes)
        self._max_single = max_entry_bytes - 16  # a larger record goes alone, in fragments (one an entry)
        self._fragment_room = max_entry_bytes - FRAGMENT_HEAD_SIZE  # a fragment's bytes in an entry
        self._large: _LargeRecord | None = None  # (loop) the record being sent fragment by fragment
        self._scheduled = False
        self._in_flight = 0
        self._segment_bytes = 0
        self._segment_started = time.monotonic()
        self._rolling = False
        self._error: WalkitError | None = None
        self._idle: list[asyncio.Future[None]] = []
        self._closing = False  # close() began: no more appends, no more rolls
        self._admin = threading.Lock()  # snapshot, truncate and retention passes, one at a time
        self.last_lsn: LSN | None = None
        self._writing_snapshots: set[int] = set()  # ledgers of this writer's snapshots under way
        self._segment_facts: dict[int, tuple[int, bool, float | None]] = {}  # closed ledgers' (length, closed, ctime)
        self._undeleted: set[int] = set()  # ledgers the log no longer names, not deleted yet (retried by passes)
        self._retain_event = asyncio.Event()  # set: a retention pass is wanted
        self._retention_task: asyncio.Task[None] | None = None

    # -- opening ----------------------------------------------------------------------------
    @classmethod
    def open(cls, client_or_uri: BookKeeper | str, name: str, *, namespace: str = "default", password: bytes = b"",
             ensemble_size: int | None = None, write_quorum: int | None = None, ack_quorum: int | None = None,
             roll_bytes: int | None = None, roll_seconds: float | None = None, max_entry_bytes: int = 1 << 20,
             max_inflight_entries: int = 4, retention: Retention | Mapping[str, Any] | None = None,
             snapshots_kept: int | None = None, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> WriteAheadLog:
        """Become the log's single writer (creating the log on first use): bump the epoch,
        recover and close the previous writer's segment (fencing it), start a segment.
        ``max_record_bytes``: the largest record appended (a larger one is refused); a
        record larger than an entry (``max_entry_bytes``) is written in fragments.
        Quorums and roll settings given here apply to a new log (an existing log keeps its
        own); ``retention`` and ``snapshots_kept`` are the log's policy from now on, for
        this writer and the next (not given: the log keeps its policy; a new log takes its
        namespace's defaults)."""
        bk, owned = _client(client_or_uri)
        try:
            return bk._loop.run(cls._opening(
                bk, owned, name, namespace=namespace, password=password, ensemble_size=ensemble_size,
                write_quorum=write_quorum, ack_quorum=ack_quorum, roll_bytes=roll_bytes, roll_seconds=roll_seconds,
                max_entry_bytes=max_entry_bytes, max_inflight_entries=max_inflight_entries, retention=retention,
                snapshots_kept=snapshots_kept, max_record_bytes=max_record_bytes))
        except BaseException:
            if owned:
                bk.close()
            raise

    @classmethod
    def _opening(cls, bk: BookKeeper, owned: bool, name: str, *, namespace: str = "default", password: bytes = b"",
                 ensemble_size: int | None = None, write_quorum: int | None = None, ack_quorum: int | None = None,
                 roll_bytes: int | None = None, roll_seconds: float | None = None, max_entry_bytes: int = 1 << 20,
                 max_inflight_entries: int = 4, retention: Retention | Mapping[str, Any] | None = None,
                 snapshots_kept: int | None = None,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Coroutine[Any, Any, WriteAheadLog]:
        """:meth:`open`'s checks, made now (the caller's thread or loop: they block on
        nothing); the coroutine that opens the log, for the client's loop."""
        node = _LogNode(bk, namespace, name)
        check_max_record_bytes(max_record_bytes)
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
        policy: dict[str, Any] = {}
        if retention is not None:
            policy["retention"] = Retention.of(retention)
        if snapshots_kept is not None:
            policy["snapshots_kept"] = snapshots_kept
        if policy:
            LogSettings.of(policy)  # checked now, before anything changes

        async def opened() -> WriteAheadLog:
            wal = await cls._open(bk, owned, node, password, asked, max_entry_bytes, max_inflight_entries, policy)
            wal._max_record = wal._max_record_bytes = max_record_bytes  # before any append can come
            return wal

        return opened()

    @classmethod
    async def _open(cls, bk: BookKeeper, owned: bool, node: _LogNode, password: bytes, asked: dict[str, Any],
                    max_entry_bytes: int, max_inflight: int, policy: dict[str, Any] | None = None) -> WriteAheadLog:
        core = bk._core

        policy = policy or {}

        def claim() -> tuple[LogMetadata, int]:
            settings = LogSettings.of({**node.namespace_defaults(), **asked, **policy})
            made = node.create(settings, password)
            if made is not None:  # a new log: made with epoch 1, no second write to claim it
                return made, 0

            def bump() -> tuple[LogMetadata, int]:
                meta, version = node.read()
                node.check_password(bk, meta, password)  # nothing moves for a wrong password
                bumped = dataclasses.replace(meta, epoch=meta.epoch + 1, auth=meta.auth or LogAuth.of(password),
                                             settings=dataclasses.replace(meta.settings, **policy))
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

        known = [(meta, version)]  # the node as the claim left it: the first try writes over it unread

        def add_segment() -> None:
            if known:
                mine, mine_version = known.pop()
                with contextlib.suppress(MetadataVersionError):  # written since (or our own write, retried)
                    node.write(dataclasses.replace(mine, segments=(*mine.segments, segment)), mine_version)
                    return
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
        wal._retention_task = asyncio.get_running_loop().create_task(wal._retention_loop())
        if meta.pending or (settings.retention.active and meta.snapshots):
            wal._retain_event.set()  # a first pass: the policy, and what a dead writer left pending
        log.info("log %s/%s: writer epoch %d, segment %d (ledger %d)", node.namespace, node.name, epoch, seq,
                 writer.ledger_id, extra=context(log=node.name, namespace=node.namespace, ledger=writer.ledger_id))
        return wal

    @classmethod
    def reader(cls, client_or_uri: BookKeeper | str, name: str, *, namespace: str = "default",
               password: bytes = b"", hold: bool = False, cursor: str | None = None,
               max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> LogReader:
        """A read-only view of the log: ``replay``, ``tail``, ``snapshots``. ``hold``:
        retention keeps what this reader's passes have not read yet (until it closes);
        ``cursor``: a named position stored in metadata (``commit``) that retention
        keeps, for this reader and any later one that names it. ``max_record_bytes``:
        a record declared larger (put together from fragments) is refused, FormatError."""
        check_max_record_bytes(max_record_bytes)
        bk, owned = _client(client_or_uri)
        try:
            return cls._reader_of(bk, owned, name, namespace=namespace, password=password, hold=hold, cursor=cursor,
                                  max_record_bytes=max_record_bytes)
        except BaseException:
            if owned:
                bk.close()
            raise

    @staticmethod
    def _reader_of(bk: BookKeeper, owned: bool, name: str, *, namespace: str = "default", password: bytes = b"",
                   hold: bool = False, cursor: str | None = None,
                   max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> LogReader:
        """(Blocking: metadata) :meth:`reader` on ``bk``."""
        check_max_record_bytes(max_record_bytes)
        node = _LogNode(bk, namespace, name)
        meta, _ = node.read()  # NoSuchLogError now rather than at the first read
        node.check_password(bk, meta, password)  # before a hold or a cursor is written
        reader = LogReader(bk, owned, node, password, hold=hold, cursor=cursor)
        reader._max_record_bytes = max_record_bytes
        return reader

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
            raise InvalidArgumentError("record larger than max_record_bytes", size=len(record),
                                       limit=self._max_record)
        return record

    def append(self, record: bytes) -> LSN:
        """Append a record; its LSN once it is durable on a quorum of bookies."""
        if self._bk._loop.in_loop():
            raise UsageError("append blocks: not from the client's loop thread; use append_async")
        return self.append_async(record).result()

    def flush(self) -> LSN | None:
        """Wait until every record appended so far is durable; the last LSN."""
        return self._bk._loop.run(self._flush())

    def _flush(self) -> Coroutine[Any, Any, LSN | None]:
        """:meth:`flush`: the records appended so far (taken now, on the caller's side),
        and the coroutine (client loop) that waits for them."""
        with self._lock:
            last = self._futures[-1] if self._futures else None
        return self._flushed(last)

    async def _flushed(self, last: Future[Any] | None) -> LSN | None:
        if last is not None:
            await _done(last)  # its error (if any) is the records' to report
        await self._wait_idle()
        if self._error is not None:
            raise self._error
        return self.last_lsn

    # loop side
    def _pump(self) -> None:
        with self._lock:
            self._scheduled = False
        while self._error is None and not self._rolling and self._in_flight < self._max_inflight:
            if self._large is not None:  # no roll, no other record, until its last fragment is sent
                if not self._submit_fragment(self._large):
                    break
                continue
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
            # more than an entry holds, or a record larger than an entry (len > max - 16) among them
            if sum(map(len, records)) + 4 * len(records) > self._max_entry_bytes - 12:
                take, size = 0, 0
                for record in records:
                    if len(record) > self._max_single or (take and size + len(record) + 4 > self._max_entry_bytes):
                        break
                    take += 1
                    size += len(record) + 4
                cut = take or 1  # nothing before a record larger than an entry: it goes alone, in fragments
                rest: list[QuickFuture[LSN]] = []
                with self._lock:  # the rest goes back ahead of whatever came meanwhile
                    if self._error is None:
                        if not self._queue:
                            self._queued_at = queued_at
                        self._queue[:0] = records[cut:]
                        self._futures[:0] = futures[cut:]
                        self._many = self._many or many
                    else:  # _fail took the queue while these were out of it
                        rest = futures[cut:]
                if rest:
                    assert self._error is not None
                    fail_all(rest, self._error)
                if not take:
                    self._large = _LargeRecord(records[0], futures[0], self._fragment_room, queued_at)
                    continue
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
        if self._large is not None and self._error is not None:  # the writer failed before its last fragment
            large, self._large = self._large, None
            self.stats.append_failures += fail_all([large.future], self._error)
        if self._in_flight == 0 and not self._rolling:
            self._wake_idle()

    def _submit_fragment(self, large: _LargeRecord) -> bool:
        """(Loop) send the next fragment of ``large`` as an entry; False if the writer failed.
        The record's future goes with its last fragment: it completes once that entry is
        durable (entries complete in order, so every fragment is), at LSN (segment, that
        entry, 0)."""
        room, index, record = self._fragment_room, large.index, large.record
        packed = pack_fragment(len(record), index, large.count, memoryview(record)[index * room:(index + 1) * room])
        try:  # never blocks: in flight <= max_inflight_entries <= max_pending_adds, as for batches
            done = self._writer.submit(packed)
        except WalkitError as exc:
            self._large = None
            self._fail(self._as_wal_error(exc), [large.future])
            return False
        self._in_flight += 1
        self._segment_bytes += len(packed)
        large.index += 1
        futures: list[Any] = []  # a fragment before the last completes no record
        if large.index == large.count:
            self._large = None  # the segment may roll now (a roll waits for the entries in flight)
            futures = [large.future]
        done.add_done_callback(functools.partial(self._entry_done, futures=futures, seq=self._segment.seq,
                                                 queued_at=large.queued_at,
                                                 many=large.future.__class__ is ManyFuture))
        return True

    def _entry_done(self, done: Future[int], futures: list[Any], seq: int, queued_at: float,
                    many: bool = False) -> None:
        self._in_flight -= 1
        error = done.exception()
        stats = self.stats
        if error is not None:
            self._fail(self._as_wal_error(error), futures)
        elif not futures:  # a fragment of a record larger than an entry, not its last
            stats.entries += 1
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
            if self._error is not None or (not queued and self._in_flight == 0 and not self._rolling
                                           and self._large is None):
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
            self._retain_event.set()
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
    def snapshot(self, data: SnapshotData, lsn: LSN) -> Snapshot:
        """Store application state that covers every record up to ``lsn``: ``data`` is the
        bytes, a binary file-like object or an iterable of byte chunks, streamed into a
        ledger of its own (walkit/wal/_snapshots.py), then listed in the log metadata
        atomically; the newest ``snapshots_kept`` are kept. ``lsn`` must be acknowledged
        and not older than the latest snapshot's. A snapshot that fails half-way is never
        listed and its ledger is deleted."""
        self._check_writable()
        if not isinstance(lsn, LSN):
            raise InvalidArgumentError("snapshot needs the LSN it covers", type=type(lsn).__name__)
        check_snapshot_data(data)
        run = self._bk._loop.run
        with self._admin:
            self._check_snapshot_lsn(lsn)
            job = SnapshotJob(self, lsn)
            try:
                run(job.begin())
                for chunk in snapshot_chunks(data):
                    run(job.add(chunk))
                snapshot, pruned = run(job.commit())
            except BaseException as exc:
                self._snapshot_failed(exc)
                with contextlib.suppress(UsageError):  # the client closed under it: nothing to settle with
                    run(job.abort())
                raise
            run(self._snapshotted(snapshot, pruned))
            return snapshot

    def _snapshot_failed(self, exc: BaseException) -> None:
        if isinstance(exc, WriterFencedError):
            self._fail(exc)

    async def _snapshotted(self, snapshot: Snapshot, pruned: Sequence[SnapshotRef]) -> None:
        """(Loop) after a snapshot was listed: delete the ones it pushed out, count it,
        let retention look again."""
        self._undeleted.update(old.ledger_id for old in pruned)
        await self._bk._core.md(delete_ledgers, self)
        self.stats.snapshots += 1
        self.stats.snapshot_bytes += snapshot.size
        self._retain_event.set()

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

    def truncate(self, before: LSN) -> int:
        """Delete whole segments wholly below ``before``, never past the oldest snapshot
        kept (without a snapshot nothing goes) nor a position a reader holds
        (walkit/wal/_retention.py); the number deleted. The log's retention rules play no
        part here (they run after rolls and snapshots)."""
        self._check_truncate(before)
        with self._admin:
            return self._truncate_locked(before)

    def _check_truncate(self, before: LSN) -> None:
        self._check_writable()
        if not isinstance(before, LSN):
            raise InvalidArgumentError("truncate needs an LSN", type=type(before).__name__)

    def _truncate_locked(self, before: LSN) -> int:
        """(Blocking, ``_admin`` held) the cut of :meth:`truncate`."""
        try:
            return len(cut(self, before))
        except WriterFencedError as exc:
            self._fail(exc)
            raise

    # -- retention in the background ------------------------------------------------------------
    async def _retention_loop(self) -> None:
        """(Loop) one retention pass at a time, on a metadata thread: at open, when asked
        (rolls, snapshots) and every PASS_INTERVAL while an age rule is set."""
        event = self._retain_event
        while True:
            every = PASS_INTERVAL if self.settings.retention.max_age is not None else None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), every)
            event.clear()
            if self._closing or self._error is not None:
                return
            try:
                async with wait_locked(self._admin):  # waited for here, never on a metadata thread
                    if self._closing:
                        return
                    await self._bk._core.md(self._retain_once)
            except WriterFencedError as exc:
                self._fail(exc)
                return
            except WalkitError as exc:
                self.stats.retention_failures += 1
                log.warning("log %s: retention pass failed: %s", self.name, exc,
                            extra=context(log=self.name, namespace=self.namespace))
            except Exception:  # a bug: said loudly, and the next pass tries again
                self.stats.retention_failures += 1
                log.exception("log %s: retention pass failed", self.name,
                              extra=context(log=self.name, namespace=self.namespace))

    async def _stop_retention(self) -> None:
        """(Loop) end the background pass, letting one under way finish."""
        task = self._retention_task
        if task is not None:
            self._retain_event.set()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _retain_once(self) -> None:
        """(Metadata thread, ``_admin`` held: never beside a snapshot or a truncate of
        this writer) one background pass."""
        self.stats.retention_passes += 1
        self.stats.retention_segments += len(cut(self))

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
        try:
            self._bk._loop.run(self._finish())
        finally:
            if self._shut():
                self._bk.close()

    def _finish(self) -> Coroutine[Any, Any, None]:
        """:meth:`close`: appends are refused from now on, no roll starts; the coroutine
        (client loop) that waits for the appended records, the retention pass under way
        and the segment's close."""
        with self._lock:
            self._closing = True
        return self._finished()

    async def _finished(self) -> None:
        await self._wait_idle()
        await self._stop_retention()
        if not isinstance(self._error, WriterFencedError):  # a fenced segment is the new writer's to close
            with contextlib.suppress(LedgerFencedError):
                await self._writer.close()

    def __enter__(self) -> WriteAheadLog:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
        else:
            with contextlib.suppress(WalkitError):
                self.close()


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
    """Delete a log: its metadata, then its segments', snapshots' (pending ones too)
    ledgers and its readers' holds and cursors. NoSuchLogError when there is no such log; FormatVersionError when its metadata is of
    a later format (a newer walkit's: it may name ledgers this one does not know of)."""
    bk, owned = _client(client_or_uri)
    try:
        node = _LogNode(bk, namespace, name)
        meta, version = node.read()
        meta.check_writable()  # a newer walkit's log may hold ledgers this one does not know of
        node.store.delete(node.path, version)
        for ledger_id in ([s.ledger_id for s in meta.segments] + [s.ledger_id for s in meta.snapshots]
                          + [p.ledger_id for p in meta.pending]):
            with contextlib.suppress(NoSuchLedgerError):
                bk.delete_ledger(ledger_id)
        with contextlib.suppress(NoNodeError):
            node.store.delete(node.holds_path, recursive=True)
    finally:
        if owned:
            bk.close()


def set_namespace_defaults(client_or_uri: BookKeeper | str, namespace: str, **settings: Any) -> None:
    """Default settings (``ensemble_size``, ``write_quorum``, ``ack_quorum``,
    ``roll_bytes``, ``roll_seconds``, ``snapshots_kept``, ``retention``) for logs
    created in ``namespace`` from now on."""
    import json

    LogSettings.of(settings)  # checked against the defaults of the others
    bk, owned = _client(client_or_uri)
    try:
        node = _LogNode(bk, _check_name("namespace", namespace, new=True), "x")
        body = {k: v.to_json() if isinstance(v, Retention) else v for k, v in settings.items()}
        data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("ascii")
        try:
            node.store.create(node.ns_path, data, make_parents=True)
        except NodeExistsError:
            node.store.set(node.ns_path, data)
    finally:
        if owned:
            bk.close()
