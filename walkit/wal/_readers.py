"""Reading a log: the view readers and the writer share, passes, and the reader.

Theory of operation
-------------------
Readers (:class:`LogReader`, ``WriteAheadLog.reader``) never fence: they read closed
segments to the end and the open one up to its LAC, which the writer publishes (an
explicit LAC write) the moment it goes idle; ``tail`` follows the open segment by long
poll and moves to the next segment once its ledger is closed (by a roll, a writer's
close, or a new writer's recovery). A segment deleted under a reader (retention after a
newer snapshot) is an error, never a silent gap; so is a pass that starts before the
log's ``truncated`` mark (:func:`check_not_truncated`).

Where things run: the entries of a replay or a tail are an async generator on the
client's loop (``LogView._replay_entries``, ``LogReader._tail_entries``: batches of
entries with their segment, a replay's next chunk read while one is out). A :class:`Pass`
(``replay_pass``, ``tail_pass``) hands them to the consumer - a thread through
``LoopThread.iterate``, an asyncio loop through ``LoopThread.aiterate`` - where one :class:`RecordReader` per pass makes the records. So
the sync API (``replay``, ``tail``) and ``walkit.aio`` run the very same generators.

Holds (walkit/wal/_retention.py): a reader opened with ``hold`` moves its hold to where a
pass stands *before* the pass reads the node, so a cut decided meanwhile sees it; a pass
refused because it starts past a cut puts the hold back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator

from walkit.client import BookKeeper, Entry, LoopThread, ReadState, read_chunks
from walkit.errors import InvalidArgumentError, NoSuchLedgerError, NoSuchLogError, UsageError, WalkitError
from walkit.wal._format import LogMetadata, Segment
from walkit.wal._lsn import LSN
from walkit.wal._node import LogNode
from walkit.wal._records import DEFAULT_MAX_RECORD_BYTES, RecordReader, check_max_record_bytes
from walkit.wal._retention import Hold
from walkit.wal._snapshots import Snapshot
from walkit.wal._stats import LOGS
from walkit.wal._watch import NodeWatch

__all__ = ["LogView", "LogReader", "Pass", "check_not_truncated", "open_reader", "segment_start"]

READ_CHUNK = 256  # entries per read on the client loop
POLL = 5.0  # seconds a tail waits for the log node's watch before it reads the node anyway


def check_not_truncated(meta: LogMetadata, after: LSN | None) -> None:
    """Reading from a point retention deleted would silently skip records: refuse."""
    if meta.truncated is None:
        return
    first_kept = meta.segments[0].seq if meta.segments else meta.truncated.segment
    if after is None or after.segment < first_kept:
        raise InvalidArgumentError("the records after this point were truncated; load the latest snapshot and "
                                   "read after its LSN", after=str(after) if after else "start",
                                   truncated=str(meta.truncated))


def segment_start(segment: Segment, after: LSN | None) -> LSN:
    """Where a pass that reads ``segment`` from ``after`` stands as it starts it."""
    return after if after is not None and after.segment == segment.seq else LSN(segment.seq, 0, 0)


class LogView:
    """What readers and the writer share: the node, reading segments, snapshots."""

    def __init__(self, bk: BookKeeper, owned: bool, node: LogNode, password: bytes, *,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        self._bk = bk
        self._client = bk.client
        self._owned = owned
        self._node = node
        self._password = password
        self._max_record_bytes = max_record_bytes  # the largest record a pass puts together from fragments
        self._closed = False
        self.stats = LOGS.new(self)  # walkit/wal/_stats.py

    @property
    def name(self) -> str:
        return self._node.name

    @property
    def namespace(self) -> str:
        return self._node.namespace

    @property
    def bookkeeper(self) -> BookKeeper:
        """The client this handle runs on."""
        return self._bk

    @property
    def closed(self) -> bool:
        """Whether the handle was closed."""
        return self._closed

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
            state = await self._client.open(segment.ledger_id, self._password, False)
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
        return self.replay_pass(after).records()

    def replay_pass(self, after: LSN | None) -> Pass:
        """The replay after ``after`` as a :class:`Pass`, for either API (``walkit.aio``
        iterates it on its own loop)."""
        return Pass(self._client.loop, self._record_reader, self._replay_entries(after), after, self._waited)

    async def _replay_entries(self, after: LSN | None) -> AsyncGenerator[tuple[Segment, list[Entry]], None]:
        """(Client loop) the entries of a replay after ``after``, in chunks with their
        segment, the next chunk's read under way while one is out (``read_chunks``)."""
        self._check_open()
        if after is not None and not isinstance(after, LSN):
            raise InvalidArgumentError("after must be an LSN or None", type=type(after).__name__)
        md = self._client.metadata
        meta = await self._start_held(after)
        for segment in meta.segments_from(after):
            await md(self._held, segment_start(segment, after))
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
        md = self._client.metadata
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
        """Where a pass may start (an inspector allows more): :func:`check_not_truncated`."""
        check_not_truncated(meta, after)

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("log handle is closed", log=self.name)

    def close(self) -> None:
        if self.shut():
            self._bk.close()

    def shut(self) -> bool:
        """Close the handle itself (blocking: it may release what it holds in metadata);
        whether its own client (opened from a URI) is left for the caller to close
        (``walkit.aio`` closes it off its loop)."""
        if self._closed:
            return False
        self._closed = True
        LOGS.retire(self)
        return self._owned


class Pass:
    """One pass over a log - a replay or a tail - for either API: the entries come from
    ``entries``, an async generator on the client's loop, a batch at a time with their
    segment; the records are made on the consumer's side (its thread, or its event loop)
    by one :class:`RecordReader` for the pass (``new_reader``), handed every entry in order."""

    def __init__(self, loop: LoopThread, new_reader: Callable[[], RecordReader],
                 entries: AsyncGenerator[tuple[Segment, list[Entry]], None],
                 after: LSN | None, waited: Callable[[float], None] | None) -> None:
        self._loop = loop
        self._new_reader = new_reader
        self._entries = entries
        self._after = after
        self._waited = waited

    def records(self) -> Iterator[tuple[LSN, bytes]]:
        """(Another thread than the client's loop) the pass's ``(lsn, record)`` pairs."""
        unpack = self._new_reader().chunk
        after = self._after
        for segment, entries in self._loop.iterate(self._entries, self._waited):
            yield from unpack(segment, entries, after)

    async def arecords(self) -> AsyncGenerator[tuple[LSN, bytes], None]:
        """(On the caller's event loop) the same pairs, awaited: no thread of that loop's
        is used (``LoopThread.aiterate``)."""
        unpack = self._new_reader().chunk
        after = self._after
        async with contextlib.aclosing(self._loop.aiterate(self._entries, self._waited)) as batches:
            async for segment, entries in batches:
                for record in unpack(segment, entries, after):
                    yield record


@contextlib.asynccontextmanager
async def _watching(metadata: Callable[..., Awaitable[None]], watch: NodeWatch) -> AsyncIterator[None]:
    """(Client loop) hold the log node's watch while a tail runs: started on a metadata
    thread (the store reports the node at once), released when the tail ends however it
    ends - one cancelled while the watch started releases it once started."""
    started = asyncio.ensure_future(metadata(watch.acquire))
    try:
        await asyncio.shield(started)
        yield
    finally:
        if started.done():
            watch.release()
        else:
            started.add_done_callback(lambda _: watch.release())


class LogReader(LogView):
    """A read-only view of a log (no fencing: the writer goes on). With ``hold``, the
    position its replay or tail has reached is kept from retention; with ``cursor``, a
    named position (:meth:`commit`, :attr:`position`) is (walkit/wal/_retention.py)."""

    def __init__(self, bk: BookKeeper, owned: bool, node: LogNode, password: bytes, *, hold: bool = False,
                 cursor: str | None = None, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        super().__init__(bk, owned, node, password, max_record_bytes=max_record_bytes)
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

    def shut(self) -> bool:
        self._watch.close()  # a tail waiting for the log to move on ends now
        self._release_holds()
        return super().shut()

    def tail(self, after: LSN | None = None, *, poll_timeout: float = 1.0) -> Iterator[tuple[LSN, bytes]]:
        """Records after ``after`` as they become durable, for ever (break out of the
        loop to stop): replay, then follow the open segment by long poll, then the next
        segments as the log rolls or changes writer."""
        return self.tail_pass(after, poll_timeout).records()

    def tail_pass(self, after: LSN | None, poll_timeout: float) -> Pass:
        """The tail after ``after`` as a :class:`Pass`, for either API."""
        return Pass(self._client.loop, self._record_reader, self._tail_entries(after, poll_timeout), after, None)

    async def _tail_entries(self, after: LSN | None,
                            poll_timeout: float) -> AsyncGenerator[tuple[Segment, list[Entry]], None]:
        """(Client loop) the entries of a tail after ``after``, a follow step's worth at a
        time, as they become durable, segment after segment."""
        self._check_open()
        md = self._client.metadata
        await self._start_held(after)
        handed = after is not None  # whether the tail stands past a point (segments cut since are an error)
        next_seq = 1 if after is None else after.segment
        async with _watching(self._client.metadata, self._watch):
            while True:
                self._check_open()  # close() ends a tail at its next poll
                meta, version = await md(self._node.read)
                segments = [s for s in meta.segments if s.seq >= next_seq]
                if not segments:
                    await self._watch.wait_past(version, POLL)  # woken by the node's next change (_watch.py)
                    continue
                if segments[0].seq > next_seq and handed:
                    raise NoSuchLedgerError("segments the tail had not read yet were truncated", log=self.name,
                                            expected=next_seq, first_kept=segments[0].seq)
                for segment in segments:
                    await md(self._held, segment_start(segment, after))
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
        step = asyncio.ensure_future(state.follow_step(next_id, poll_timeout, READ_CHUNK))
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



def open_reader(bk: BookKeeper, owned: bool, name: str, *, namespace: str = "default", password: bytes = b"",
                hold: bool = False, cursor: str | None = None,
                max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> LogReader:
    """(Blocking: metadata) ``WriteAheadLog.reader`` on ``bk``: the log must exist and
    the password be its own before a hold or a cursor is written."""
    check_max_record_bytes(max_record_bytes)
    node = LogNode(bk.client.cluster, namespace, name)
    meta, _ = node.read()  # NoSuchLogError now rather than at the first read
    node.check_password(bk.ledger_metadata, meta, password)  # before a hold or a cursor is written
    return LogReader(bk, owned, node, password, hold=hold, cursor=cursor, max_record_bytes=max_record_bytes)
