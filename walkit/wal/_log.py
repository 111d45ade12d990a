"""``WriteAheadLog``: a log that outlives any one writer, on top of ledgers.

Theory of operation
-------------------
A log is a node ``<root>/logs/<namespace>/<name>`` (walkit/wal/_node.py): the writer
epoch, the segments (ledgers, in order, numbered from 1), the snapshots and settings.
Every change is a compare-and-set on the node's version, and every change a writer makes
first checks that the epoch is still its own.

The pieces, each in a module of its own: opening for writing claims the epoch, fences the
previous writer and starts a segment (walkit/wal/_open.py); appends are batched into
entries on the client's loop (walkit/wal/_writer.py, cut by walkit/wal/_batching.py) and
the segment rolls; snapshots, truncation and retention run one at a time beside them
(walkit/wal/_admin.py); readers never fence (walkit/wal/_readers.py).

This module is the synchronous face: :class:`WriteAheadLog` runs the writer core's
coroutines (:class:`~walkit.wal._writer.LogWriter`, its :attr:`~WriteAheadLog.core`)
with ``LoopThread.run``, and the replay's with ``LoopThread.iterate``; ``walkit.aio``
awaits the very same coroutines from the caller's loop, so both behave alike. Blocking
metadata calls run on the client's metadata threads (``LedgerClient.metadata``); the
namespace functions below run on the caller's thread.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Coroutine, Iterable, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from walkit.client import BookKeeper, LedgerWriter
from walkit.errors import NodeExistsError, NoNodeError, NoSuchLedgerError, UsageError, WalkitError
from walkit.wal._format import LogSettings, Retention, Segment
from walkit.wal._lsn import LSN
from walkit.wal._node import NAME_RULES, LogNode, check_name, is_plain_name
from walkit.wal._open import Claimed, OpenRequest, claim, client_of
from walkit.wal._readers import LogReader, LogView, open_reader
from walkit.wal._records import DEFAULT_MAX_RECORD_BYTES, check_max_record_bytes
from walkit.wal._snapshots import Snapshot, SnapshotData, SnapshotJob, snapshot_chunks
from walkit.wal._state import WriterState
from walkit.wal._writer import LogWriter

__all__ = ["NAME_RULES", "WriteAheadLog", "LogReader", "Snapshot", "is_plain_name", "list_logs", "delete_log",
           "set_namespace_defaults"]


class WriteAheadLog(LogView):
    """The single writer of a log (:meth:`open`); readers use :meth:`reader`."""

    def __init__(self, bk: BookKeeper, owned: bool, request: OpenRequest, claimed: Claimed) -> None:
        super().__init__(bk, owned, request.node, request.password, max_record_bytes=request.max_record_bytes)
        state = WriterState(bk, request.node, request.password, claimed.epoch, claimed.meta.settings,
                            claimed.segment)
        #: The writer's core, which this and ``walkit.aio.AsyncWriteAheadLog`` drive.
        self.core = LogWriter(state, claimed.writer, self.stats, max_entry_bytes=request.max_entry_bytes,
                              max_inflight_entries=request.max_inflight_entries,
                              max_record_bytes=request.max_record_bytes)

    @property
    def epoch(self) -> int:
        """This writer's epoch."""
        return self.core.state.epoch

    @property
    def settings(self) -> LogSettings:
        """The log's settings as this writer opened it."""
        return self.core.state.settings

    @property
    def last_lsn(self) -> LSN | None:
        """The last record acknowledged (None: none yet)."""
        return self.core.last_lsn

    @property
    def _writer(self) -> LedgerWriter:
        """The open segment's ledger writer (what tests of bookie failures look at)."""
        return self.core.ledger

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
        bk, owned = client_of(client_or_uri)
        try:
            return bk.client.loop.run(cls.opening(
                bk, owned, name, namespace=namespace, password=password, ensemble_size=ensemble_size,
                write_quorum=write_quorum, ack_quorum=ack_quorum, roll_bytes=roll_bytes, roll_seconds=roll_seconds,
                max_entry_bytes=max_entry_bytes, max_inflight_entries=max_inflight_entries, retention=retention,
                snapshots_kept=snapshots_kept, max_record_bytes=max_record_bytes))
        except BaseException:
            if owned:
                bk.close()
            raise

    @classmethod
    def opening(cls, bk: BookKeeper, owned: bool, name: str, **options: Any) -> Coroutine[Any, Any, WriteAheadLog]:
        """:meth:`open` on ``bk`` for either API: its checks made now (the caller's thread
        or loop: they block on nothing), and the coroutine that opens the log, for the
        client's loop. ``owned``: the log closes ``bk`` when it closes."""
        request = OpenRequest.make(bk, name, **options)

        async def opened() -> WriteAheadLog:
            claimed = await claim(bk, request)
            wal = cls(bk, owned, request, claimed)
            meta = claimed.meta
            wal.core.admin.start(bool(meta.pending or (meta.settings.retention.active and meta.snapshots)))
            return wal  # the first pass: the policy, and what a dead writer left pending

        return opened()

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
        bk, owned = client_of(client_or_uri)
        try:
            return open_reader(bk, owned, name, namespace=namespace, password=password, hold=hold, cursor=cursor,
                               max_record_bytes=max_record_bytes)
        except BaseException:
            if owned:
                bk.close()
            raise

    # -- appending --------------------------------------------------------------------------
    def append_async(self, record: bytes) -> Future[LSN]:
        """Queue a record; the future gives its LSN once it is durable on a quorum.
        Futures complete in append order."""
        return self.core.append_async(record)

    def append_many(self, records: Iterable[bytes]) -> Future[list[LSN]]:
        """Queue ``records`` together, in order; one future gives their LSNs (in order)
        once the last of them is durable on a quorum. They are packed into entries with
        whatever else is queued (a large batch spans several entries), and appends made
        after this call come after them. Every record is checked before any is queued:
        a bad one raises and queues nothing. On a writer failure the future fails, and
        which of the records became durable is unknown (``last_lsn`` tells what was
        acknowledged before), as for the futures of ``append_async``."""
        return self.core.append_many(records)

    def append(self, record: bytes) -> LSN:
        """Append a record; its LSN once it is durable on a quorum of bookies."""
        if self._client.loop.in_loop():
            raise UsageError("append blocks: not from the client's loop thread; use append_async")
        return self._client.loop.lone_run(self.core.append_async, record).result()  # alone: run here

    def flush(self) -> LSN | None:
        """Wait until every record appended so far is durable; the last LSN."""
        return self._client.loop.run(self.core.flush())

    def _own_lac(self, segment: Segment) -> int | None:
        return self.core.own_lac(segment)

    # -- snapshots and truncation ---------------------------------------------------------------
    def snapshot(self, data: SnapshotData, lsn: LSN) -> Snapshot:
        """Store application state that covers every record up to ``lsn``: ``data`` is the
        bytes, a binary file-like object or an iterable of byte chunks, streamed into a
        ledger of its own (walkit/wal/_snapshots.py), then listed in the log metadata
        atomically; the newest ``snapshots_kept`` are kept. ``lsn`` must be acknowledged
        and not older than the latest snapshot's. A snapshot that fails half-way is never
        listed and its ledger is deleted."""
        core = self.core
        core.check_snapshot(data, lsn)
        run, admin = self._client.loop.run, core.admin
        with admin.lock:
            admin.check_snapshot_lsn(lsn)
            job = SnapshotJob(core.state, lsn)
            try:
                run(job.begin())
                for chunk in snapshot_chunks(data):
                    run(job.add(chunk))
                snapshot, pruned = run(job.commit())
            except BaseException as exc:
                admin.snapshot_failed(exc)
                with contextlib.suppress(UsageError):  # the client closed under it: nothing to settle with
                    run(job.abort())
                raise
            run(admin.snapshotted(snapshot, pruned))
            return snapshot

    def truncate(self, before: LSN) -> int:
        """Delete whole segments wholly below ``before``, never past the oldest snapshot
        kept (without a snapshot nothing goes) nor a position a reader holds
        (walkit/wal/_retention.py); the number deleted. The log's retention rules play no
        part here (they run after rolls and snapshots)."""
        self.core.check_truncate(before)
        with self.core.admin.lock:
            return self.core.admin.truncate_locked(before)

    # -- closing ------------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for appended records, close the segment; the log stays (open it again
        to write more, or read it)."""
        if self._closed:
            return
        try:
            self._client.loop.run(self.core.finish())
        finally:
            if self.shut():
                self._bk.close()

    def __enter__(self) -> WriteAheadLog:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
        else:
            with contextlib.suppress(WalkitError):
                self.close()


# -- namespaces ---------------------------------------------------------------------------------
def list_logs(client_or_uri: BookKeeper | str, namespace: str = "default") -> list[str]:
    """The names of the logs of ``namespace``, sorted."""
    bk, owned = client_of(client_or_uri)
    try:
        node = LogNode(bk.client.cluster, namespace, "x")
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
    bk, owned = client_of(client_or_uri)
    try:
        node = LogNode(bk.client.cluster, namespace, name)
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
    LogSettings.of(settings)  # checked against the defaults of the others
    bk, owned = client_of(client_or_uri)
    try:
        node = LogNode(bk.client.cluster, check_name("namespace", namespace, new=True), "x")
        body = {k: v.to_json() if isinstance(v, Retention) else v for k, v in settings.items()}
        data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("ascii")
        try:
            node.store.create(node.ns_path, data, make_parents=True)
        except NodeExistsError:
            node.store.set(node.ns_path, data)
    finally:
        if owned:
            bk.close()
