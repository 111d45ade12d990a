"""Snapshots of a log: written as a stream into a ledger of their own, kept by policy.

Theory of operation
-------------------
A snapshot is application state covering every record up to an LSN. It is written into
a new ledger, chunk by chunk (at most :data:`SNAPSHOT_CHUNK` bytes an entry, at most
:data:`IN_FLIGHT` entries unacknowledged), from bytes, a file-like object or any iterable
of byte chunks, so a snapshot of any size passes through a bounded amount of memory; it
is read back the same way (:meth:`Snapshot.chunks`, :meth:`Snapshot.open`), two read
chunks at a time (``walkit.client.read_ahead``).

A snapshot exists once the log node lists it, and the node lists only whole ones. The
steps, each a compare-and-set of the log node made only while the writer's epoch holds:

1. **begin**: create the ledger and name it in the node's ``pending`` list with the
   writer's epoch - before the first byte, so a writer that dies half-way leaves a name
   to clean up rather than an orphan ledger nobody knows of;
2. **write** the chunks, then close the ledger;
3. **commit**: move it from ``pending`` to ``snapshots`` (oldest first), keep the newest
   ``snapshots_kept`` and delete the ledgers of the others once the node says so.

A failure before the commit landed is settled by writing the node without the pending
name at the version just read (a "no" that no late commit can overturn), then deleting
the ledger; if the store cannot say, the name stays in ``pending`` and a later writer's
retention pass (walkit/wal/_retention.py) deletes pending ledgers of older epochs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import io
import logging
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from concurrent.futures import Future
from typing import IO, Any, Union

from walkit.client import BookKeeper, LedgerWriter, check_payload
from walkit.errors import InvalidArgumentError, WalkitError
from walkit.metadata import ledger_digest
from walkit.logs import context
from walkit.metadata import retry_cas
from walkit.wal._format import LogMetadata, PendingSnapshot, SnapshotRef
from walkit.wal._lsn import LSN
from walkit.wal._state import WriterState

__all__ = ["Snapshot", "SnapshotData", "SnapshotJob", "SNAPSHOT_CHUNK", "IN_FLIGHT", "snapshot_chunks",
           "asnapshot_chunks", "check_snapshot_data"]

log = logging.getLogger(__name__)

SNAPSHOT_CHUNK = 1 << 20  # bytes of a snapshot entry
IN_FLIGHT = 8  # snapshot entries written and not yet acknowledged, at most

#: What ``WriteAheadLog.snapshot`` takes: the bytes, a binary file-like object, or an
#: iterable of byte chunks (of any sizes).
SnapshotData = Union[bytes, bytearray, memoryview, IO[bytes], Iterable[bytes]]


class Snapshot:
    """A stored snapshot: ``lsn`` (everything up to it is in the state), ``size`` in
    bytes; :meth:`read` gives the bytes, :meth:`chunks` and :meth:`open` stream them."""

    def __init__(self, bk: BookKeeper, ref: SnapshotRef, password: bytes) -> None:
        self._bk = bk
        self.lsn = ref.lsn
        self.size = ref.size
        self.ledger_id = ref.ledger_id
        self._password = password

    def __repr__(self) -> str:
        return f"Snapshot(lsn={self.lsn}, size={self.size}, ledger={self.ledger_id})"

    def chunks(self) -> Iterator[bytes]:
        """The snapshot's bytes, chunk by chunk (at most two read chunks held at once)."""
        handle = self._bk.open_ledger(self.ledger_id, self._password, recovery=False)
        try:
            if handle.last_add_confirmed >= 0:
                for entry in handle.read(0, handle.last_add_confirmed):
                    yield entry.data
        finally:
            handle.close()

    def read(self) -> bytes:
        return b"".join(self.chunks())

    def open(self) -> io.BufferedReader:
        """A binary file-like object over the snapshot (streamed)."""
        return io.BufferedReader(_ChunkStream(self.chunks()), buffer_size=SNAPSHOT_CHUNK)


class _ChunkStream(io.RawIOBase):
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            nxt = next(self._chunks, None)
            if nxt is None:
                return 0
            self._buffer = memoryview(nxt)
        n = min(len(target), len(self._buffer))
        target[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()
        super().close()


class _Regroup:
    """Byte pieces of any sizes as chunks of :data:`SNAPSHOT_CHUNK` (the last one shorter)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, piece: object) -> list[bytes]:
        if not isinstance(piece, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError("a snapshot chunk is bytes", type=type(piece).__name__)
        buffer = self._buffer
        buffer += piece
        out = []
        while len(buffer) >= SNAPSHOT_CHUNK:
            out.append(bytes(buffer[:SNAPSHOT_CHUNK]))
            del buffer[:SNAPSHOT_CHUNK]
        return out

    def rest(self) -> list[bytes]:
        return [bytes(self._buffer)] if self._buffer else []


def check_snapshot_data(data: object) -> None:
    """InvalidArgumentError now, before a ledger is made, for what no snapshot is made of."""
    if isinstance(data, (bytes, bytearray, memoryview)) or callable(getattr(data, "read", None)):
        return
    if isinstance(data, str) or not isinstance(data, (Iterable, AsyncIterable)):
        raise InvalidArgumentError("a snapshot is bytes, a binary file-like object or an iterable of byte chunks",
                                   type=type(data).__name__)


def snapshot_chunks(data: SnapshotData) -> Iterator[bytes]:
    """``data`` as chunks of at most :data:`SNAPSHOT_CHUNK` bytes (all of that size but
    the last), read as they are needed."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        view = memoryview(data).cast("B")
        for at in range(0, len(view), SNAPSHOT_CHUNK):
            yield bytes(view[at:at + SNAPSHOT_CHUNK])
        return
    read = getattr(data, "read", None)
    if callable(read):
        while True:
            chunk = read(SNAPSHOT_CHUNK)
            if not chunk:
                return
            if not isinstance(chunk, (bytes, bytearray, memoryview)):
                raise InvalidArgumentError("a snapshot stream must be opened in binary mode",
                                           type=type(chunk).__name__)
            yield bytes(chunk)
    if isinstance(data, str) or not isinstance(data, Iterable):
        raise InvalidArgumentError("a snapshot is bytes, a binary file-like object or an iterable of byte chunks",
                                   type=type(data).__name__)
    regroup = _Regroup()
    for piece in data:
        yield from regroup.feed(piece)
    yield from regroup.rest()


async def asnapshot_chunks(data: SnapshotData | AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """:func:`snapshot_chunks` for the asyncio API: an async iterable of byte chunks is
    regrouped the same way; anything else as :func:`snapshot_chunks` gives it."""
    if not isinstance(data, AsyncIterable):
        for chunk in snapshot_chunks(data):
            yield chunk
        return
    regroup = _Regroup()
    async for piece in data:
        for chunk in regroup.feed(piece):
            yield chunk
    for chunk in regroup.rest():
        yield chunk


class SnapshotJob:
    """One snapshot being written by ``wal`` (the steps of the module docstring), as
    coroutines on the client's loop: the sync API runs each step with ``loop.run``, the
    asyncio API awaits it; the chunks come from the caller's side, one step each."""

    def __init__(self, wal: WriterState, lsn: LSN) -> None:
        self._wal = wal
        self.lsn = lsn
        self.size = 0
        self._pending: PendingSnapshot | None = None
        self._writer: LedgerWriter | None = None
        self._in_flight: collections.deque[Future[int]] = collections.deque()

    async def begin(self) -> None:
        wal = self._wal
        s = wal.settings
        client = wal.client
        self._writer = writer = await client.create(
            s.ensemble_size, s.write_quorum, s.ack_quorum, ledger_digest(client.cluster.info), wal.password,
            {"walkit.snapshot": f"{wal.namespace}/{wal.name}".encode(), "walkit.lsn": str(self.lsn).encode()})
        pending = PendingSnapshot(writer.ledger_id, wal.epoch)

        def name_it(meta: LogMetadata) -> LogMetadata:
            if pending in meta.pending:
                return meta  # our own write, whose reply was lost
            return dataclasses.replace(meta, pending=(*meta.pending, pending))

        wal.writing_snapshots.add(writer.ledger_id)
        self._pending = pending  # from here on it may have landed: abort() settles it
        await client.metadata(functools.partial(retry_cas, functools.partial(wal.change, name_it),
                                        "log metadata (naming a snapshot being written)", log=wal.name))

    async def add(self, chunk: bytes) -> None:
        """Write one chunk (at most :data:`SNAPSHOT_CHUNK` bytes), waiting first while
        :data:`IN_FLIGHT` are unacknowledged."""
        writer = self._writer
        assert writer is not None
        config = self._wal.client.config
        while len(self._in_flight) >= min(IN_FLIGHT, config.max_pending_adds):
            await asyncio.wrap_future(self._in_flight.popleft())
        self._in_flight.append(writer.submit(check_payload(chunk, config.max_frame_size, writer.meta.digest)))
        self.size += len(chunk)

    async def commit(self) -> tuple[Snapshot, list[SnapshotRef]]:
        """Wait for the chunks, close the ledger, list the snapshot; the snapshot and the
        older ones it pushed out (their ledgers are the caller's to delete)."""
        wal = self._wal
        writer = self._writer
        assert writer is not None
        while self._in_flight:
            await asyncio.wrap_future(self._in_flight.popleft())
        await writer.close()
        ref = SnapshotRef(self.lsn, writer.ledger_id, self.size)
        pending = self._pending
        pruned: list[SnapshotRef] = []

        def record(meta: LogMetadata) -> LogMetadata:
            rest = tuple(p for p in meta.pending if p != pending)
            if ref in meta.snapshots:
                return dataclasses.replace(meta, pending=rest)  # our own write, whose reply was lost
            if meta.snapshots and ref.lsn < meta.snapshots[-1].lsn:
                raise InvalidArgumentError("snapshot LSN is older than the latest snapshot's", lsn=str(ref.lsn),
                                           latest=str(meta.snapshots[-1].lsn))
            kept = (*meta.snapshots, ref)[-meta.settings.snapshots_kept:]
            pruned[:] = [old for old in meta.snapshots if old not in kept]
            return dataclasses.replace(meta, snapshots=kept, pending=rest)

        await wal.client.metadata(functools.partial(retry_cas, functools.partial(wal.change, record),
                                                    "log metadata (recording a snapshot)", log=wal.name))
        wal.writing_snapshots.discard(ref.ledger_id)
        return Snapshot(wal.bk, ref, wal.password), pruned

    async def abort(self) -> None:
        """After a failure: settle whether the snapshot was listed; if surely not, take
        its name out of ``pending`` and delete its ledger."""
        wal = self._wal
        writer = self._writer
        if writer is None:
            return
        self._in_flight.clear()
        with contextlib.suppress(WalkitError):
            await writer.close()
        ledger_id = writer.ledger_id
        node = wal.node
        client = wal.client

        def decide() -> bool:
            meta, version = node.read()
            if any(s.ledger_id == ledger_id for s in meta.snapshots):
                return True
            node.write(dataclasses.replace(meta, pending=tuple(p for p in meta.pending if p.ledger_id != ledger_id)),
                       version)  # written even unchanged: a late commit can no longer land
            return False

        listed: bool | None
        try:
            listed = await client.metadata(functools.partial(retry_cas, decide, "log metadata (settling a failed snapshot)",
                                                     log=wal.name))
        except WalkitError as exc:
            log.warning("log %s: cannot tell whether snapshot ledger %d was listed (%s): a later pass cleans it up",
                        wal.name, ledger_id, exc, extra=context(log=wal.name, namespace=wal.namespace,
                                                                 ledger=ledger_id))
            listed = None
        wal.writing_snapshots.discard(ledger_id)  # not under way: a pass may take its pending name now
        if listed is False:
            with contextlib.suppress(WalkitError):
                await client.metadata(client.ledgers.delete, ledger_id)
        elif listed:
            log.warning("log %s: snapshot ledger %d kept: it is the log's snapshot after all", wal.name, ledger_id,
                        extra=context(log=wal.name, namespace=wal.namespace, ledger=ledger_id))
