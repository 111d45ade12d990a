"""The journal writer: group commit, one aligned write + one fdatasync per batch.

Theory of operation
-------------------
Producers call :meth:`Journal.log_entry` (and the meta-record variants) from any thread:
that only appends a tuple to a deque and, when the journal thread sleeps, wakes it.

Two threads share the work, as BookKeeper's journal and force-write threads do:

* the **journal thread** drains the deque into an aligned buffer, frame after frame
  (header, ids, payload, CRC32C), asking :func:`~bookie.journal.flush_reason` after each
  one whether the batch must go out. When it must, the batch is padded to the alignment
  with a PADDING frame and handed to the sync thread. While the sync thread is still busy
  with the previous batch, records that keep arriving join the ready batch (up to the
  buffer's size): the busier the disk, the larger the batches;
* the **sync thread** writes the batch with one ``pwrite`` at an aligned offset (O_DIRECT
  where allowed), calls one ``fdatasync``, then runs every callback of the batch in queue
  order and the flush listeners - one wake-up per batch, not per entry. Callbacks must be
  quick and never block. Two buffers alternate, so framing the next batch (CPU, holds the
  GIL) overlaps the write and sync of the previous one (I/O, releases it).

A frame larger than the buffer is written out in aligned pieces before its batch (the
batch's fdatasync covers them). Space ahead of the tail is reserved (fallocate) in steps
of ``prealloc_size``, so most fdatasyncs need not grow the file. After a batch that
leaves the file past ``max_size`` the journal rolls to a new file (header written and
synced, directory synced) before the next batch.

Durability: a callback receives ``None`` only after the fdatasync that covers its frame
returned (or, with ``sync_data=False``, after the write). Any I/O error kills the
journal: the batch and everything queued later fail with that error, and so do later
submissions - the bookie must not acknowledge anything it cannot make durable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bookie.fs import AlignedBuffer, File, FileSystem
from bookie.journal._format import FrameType, JournalHeader, journal_name, parse_journal_name
from bookie.journal._framing import ENTRY, FrameBuffer, frame_size
from bookie.journal._mark import LogMark
from bookie.journal._policy import FlushReason, GroupCommitPolicy, flush_reason, wait_timeout
from walkit.errors import BookieShutdownError, InvalidArgumentError, NativeIOError

__all__ = ["Journal", "JournalConfig", "JournalStats", "Callback", "list_journals"]

log = logging.getLogger("bookie.journal")

#: ``callback(error, ctx)``: error is None once the record is durable.
Callback = Callable[[BaseException | None, Any], None]

_STOP = object()


@dataclass(frozen=True)
class JournalConfig:
    directory: str
    policy: GroupCommitPolicy = field(default_factory=GroupCommitPolicy)
    alignment: int = 4096  # O_DIRECT needs 4 KiB on the disks we target
    max_size: int = 2048 << 20  # journalMaxSizeMB=2048: roll after this many bytes
    prealloc_size: int = 16 << 20  # journalPreAllocSizeMB=16: fallocate step ahead of the tail
    max_backups: int = 5  # journalMaxBackups=5: old journals kept behind the mark
    sync_data: bool = True  # journalSyncData=true: fdatasync before acknowledging
    direct_io: bool = True  # O_DIRECT when the file system allows it
    buffer_size: int = 4 << 20  # per buffer (two alternate): the largest batch; >= the bytes threshold


@dataclass
class JournalStats:
    flushes: int = 0
    records: int = 0
    bytes_written: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    rolls: int = 0


def list_journals(fs: FileSystem, directory: str) -> list[int]:
    """Ids of the journal files in ``directory``, ascending."""
    ids = (parse_journal_name(n) for n in fs.listdir(directory))
    return sorted(i for i in ids if i is not None)


_U64_MAX = (1 << 64) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def _check_ids(ledger_id: int, value: int) -> None:
    """Refuse, in the caller's thread, what the journal thread could not frame."""
    if not (type(ledger_id) is int and type(value) is int and 0 <= ledger_id <= _U64_MAX and _I64_MIN <= value <= _I64_MAX):
        raise InvalidArgumentError("journal record ids out of range", ledger=ledger_id, value=value)


def _check_bytes(data: Any) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError("journal record data must be bytes", type=type(data).__name__)
    return data  # type: ignore[return-value]


def _call_back(records: list[tuple[Any, ...]], error: BaseException | None) -> None:
    """Run the callbacks of queued records (field 4, with field 5 as context), in order."""
    for rec in records:
        cb = rec[4]
        if cb is not None:
            cb(error, rec[5])


class _Batch:
    """A batch handed from the journal thread to the sync thread."""

    __slots__ = ("buf", "length", "offset", "journal_id", "records", "reason")

    def __init__(self, buf: AlignedBuffer, length: int, offset: int, journal_id: int,
                 records: list[tuple[Any, ...]], reason: FlushReason) -> None:
        self.buf, self.length, self.offset, self.journal_id = buf, length, offset, journal_id
        self.records, self.reason = records, reason


class Journal:
    """Group-committing journal over a :class:`bookie.fs.FileSystem`."""

    def __init__(self, fs: FileSystem, config: JournalConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        a = config.alignment
        self._fs = fs
        self._cfg = config
        self._clock = clock
        self._queue: deque[Any] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._waiting = False
        self._error: BaseException | None = None
        self._closed = False
        size = -(-max(config.buffer_size, config.policy.buffered_writes_threshold + a) // a) * a
        self._bufs = [fs.alloc_buffer(size), fs.alloc_buffer(size)]
        self._frames = FrameBuffer(self._bufs[0], a, self._spill)
        self._file: File | None = None
        self._journal_id = -1
        self._file_pos = 0  # file offset of the batch being built; always aligned
        self._allocated = 0
        self._durable = LogMark(-1, 0)
        # hand-off to the sync thread: at most one batch in flight
        self._sync_cond = threading.Condition(threading.Lock())
        self._handoff: _Batch | None = None
        self._sync_busy = False
        self._threads: list[threading.Thread] = []
        self.stats = JournalStats()
        self.direct = False
        #: Called on the sync thread after each batch's callbacks, with the new durable
        #: mark: one wake-up per batch for whoever waits on many entries.
        self.flush_listeners: list[Callable[[LogMark], None]] = []

    # --- lifecycle --------------------------------------------------------------------
    def start(self) -> LogMark:
        """Open a new journal file (id one above every existing one), start the threads
        and return the position where this run's records begin."""
        self._fs.makedirs(self._cfg.directory)
        existing = list_journals(self._fs, self._cfg.directory)
        self._open_file((existing[-1] + 1) if existing else 1)
        for target, name in ((self._run, "bookie-journal"), (self._sync_run, "bookie-journal-sync")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self._durable

    def shutdown(self) -> None:
        """Flush everything queued so far, then stop. Later submissions fail."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._queue.append(_STOP)
            self._cond.notify()
        for t in self._threads:
            t.join()
        if self._file is not None:
            self._file.close()
            self._file = None
        for b in self._bufs:
            b.close()

    @property
    def failed(self) -> BaseException | None:
        """The I/O error that killed the journal, if one did."""
        return self._error

    @property
    def current_journal_id(self) -> int:
        return self._journal_id

    def last_mark(self) -> LogMark:
        """The end of the durable part of the journal (everything before it is synced)."""
        return self._durable

    def gc(self, mark: LogMark) -> list[int]:
        """Remove journal files wholly before ``mark``, keeping ``max_backups`` of them."""
        old = [i for i in list_journals(self._fs, self._cfg.directory) if i < mark.journal_id]
        doomed = old[: max(0, len(old) - self._cfg.max_backups)]
        for jid in doomed:
            self._fs.remove(f"{self._cfg.directory}/{journal_name(jid)}")
        if doomed:
            self._fs.fsync_dir(self._cfg.directory)
        return doomed

    # --- producers ------------------------------------------------------------------------
    def log_entry(self, ledger_id: int, entry_id: int, data: bytes, callback: Callback | None = None, ctx: Any = None) -> None:
        _check_ids(ledger_id, entry_id)
        self._submit((ENTRY, ledger_id, entry_id, _check_bytes(data), callback, ctx, self._clock()))

    def log_master_key(self, ledger_id: int, key: bytes, callback: Callback | None = None, ctx: Any = None) -> None:
        _check_ids(ledger_id, 0)
        self._submit((FrameType.MASTER_KEY, ledger_id, 0, _check_bytes(key), callback, ctx, self._clock()))

    def log_fence(self, ledger_id: int, callback: Callback | None = None, ctx: Any = None) -> None:
        _check_ids(ledger_id, 0)
        self._submit((FrameType.FENCE, ledger_id, 0, b"", callback, ctx, self._clock()))

    def log_lac(self, ledger_id: int, lac: int, callback: Callback | None = None, ctx: Any = None) -> None:
        _check_ids(ledger_id, lac)
        self._submit((FrameType.LAC, ledger_id, lac, b"", callback, ctx, self._clock()))

    def _submit(self, record: tuple[Any, ...]) -> None:
        # Under the lock: a record is either refused here or called back later, even
        # when the journal dies or shuts down at this very moment (_fail_queued).
        with self._cond:
            if self._closed or self._error is not None:
                raise self._dead_error()
            self._queue.append(record)
            if self._waiting:
                self._cond.notify()

    def _dead_error(self) -> BaseException:
        if self._error is not None:
            return BookieShutdownError("journal failed", journal=self._journal_id, cause=self._error)
        return BookieShutdownError("journal is shut down", journal=self._journal_id)

    # --- the journal thread -------------------------------------------------------------
    def _run(self) -> None:
        batch: list[tuple[Any, ...]] = []
        try:
            while self._error is None:
                reason, stopping = self._drain(batch)
                if reason is not None:
                    self._gather_while_busy(batch)
                    self._hand_off(batch, reason)
                if stopping:
                    self._hand_off_stop()
                    self._fail_queued(self._dead_error())
                    return
                if reason is None:
                    oldest = batch[0][6] if batch else None
                    self._sleep(wait_timeout(self._cfg.policy, now=self._clock(), oldest_enqueued=oldest))
            self._fail(self._error, batch)
        except BaseException as exc:  # noqa: BLE001 - any failure kills the journal
            self._fail(exc, batch)
        finally:
            with self._sync_cond:
                self._sync_cond.notify_all()

    def _drain(self, batch: list[tuple[Any, ...]]) -> tuple[FlushReason | None, bool]:
        """Frame queued records into the buffer until the policy says flush or the queue
        is empty. Returns (reason to flush or None, whether the stop marker came)."""
        q, policy, clock, frames = self._queue, self._cfg.policy, self._clock, self._frames
        append = frames.append
        oldest = batch[0][6] if batch else None
        while q:
            rec = q.popleft()
            if rec is _STOP:
                return (FlushReason.SHUTDOWN if batch else None), True
            batch.append(rec)
            append(rec)
            if oldest is None:
                oldest = rec[6]
            head = q[0] if q else None
            reason = flush_reason(policy, clock(), oldest, frames.fill, len(batch), None if head is None or head is _STOP else head[6])
            if reason is not None:
                return reason, False
        if not batch:
            return None, False
        return flush_reason(policy, clock(), oldest, frames.fill, len(batch), None), False

    def _gather_while_busy(self, batch: list[tuple[Any, ...]]) -> None:
        """While the sync thread is still busy, let queued records join the ready batch
        (as long as they fit in the buffer)."""
        q = self._queue
        while self._sync_busy and self._error is None:
            head = q[0] if q else None
            if head is not None and head is not _STOP and self._frames.fits(frame_size(head)):
                q.popleft()
                batch.append(head)
                self._frames.append(head)
                continue
            with self._sync_cond:
                if self._sync_busy:
                    self._sync_cond.wait(0.001 if head is None else None)

    def _hand_off(self, batch: list[tuple[Any, ...]], reason: FlushReason) -> None:
        frames = self._frames
        frames.pad()
        with self._sync_cond:
            while self._sync_busy and self._error is None:
                self._sync_cond.wait()
            if self._error is not None:
                raise self._error
            end = self._file_pos + frames.fill
            if end > self._allocated:
                self._preallocate(end)
            self._handoff = _Batch(frames.buf, frames.fill, self._file_pos, self._journal_id, list(batch), reason)
            self._sync_busy = True
            self._sync_cond.notify_all()
        batch.clear()  # the sync thread owns these records now: never call them back here
        self._file_pos = end
        frames.use(self._bufs[1] if frames.buf is self._bufs[0] else self._bufs[0])
        if self._file_pos >= self._cfg.max_size:
            self._wait_sync_idle()
            self._roll()

    def _hand_off_stop(self) -> None:
        self._wait_sync_idle()
        with self._sync_cond:
            self._handoff = None
            self._sync_busy = True  # the sync thread sees busy without a batch: stop
            self._sync_cond.notify_all()

    def _wait_sync_idle(self) -> None:
        with self._sync_cond:
            while self._sync_busy and self._error is None:
                self._sync_cond.wait()
            if self._error is not None:
                raise self._error

    def _sleep(self, timeout: float | None) -> None:
        with self._cond:
            self._waiting = True
            if not self._queue:
                self._cond.wait(None if timeout is None else min(timeout, threading.TIMEOUT_MAX))
            self._waiting = False

    def _fail(self, exc: BaseException, batch: list[tuple[Any, ...]]) -> None:
        if self._error is None:
            log.error("journal %d failed: %s", self._journal_id, exc)
            self._error = exc
        _call_back(batch, exc)
        self._fail_queued(exc)

    def _fail_queued(self, exc: BaseException) -> None:
        with self._cond:
            records = [r for r in self._queue if r is not _STOP]
            self._queue.clear()
        _call_back(records, exc)

    # --- the sync thread ----------------------------------------------------------------------
    def _sync_run(self) -> None:
        while True:
            with self._sync_cond:
                while not self._sync_busy and self._error is None:
                    self._sync_cond.wait()
                batch = self._handoff
                if batch is None:  # stop, or the journal thread died
                    return
            try:
                self._write_batch(batch)
            except BaseException as exc:  # noqa: BLE001 - any failure kills the journal
                log.error("journal %d: write of %d records failed: %s", batch.journal_id, len(batch.records), exc)
                self._error = exc
                _call_back(batch.records, exc)
                with self._cond:
                    self._cond.notify()
            with self._sync_cond:
                self._handoff = None
                self._sync_busy = False
                self._sync_cond.notify_all()
                if self._error is not None:
                    return

    def _write_batch(self, b: _Batch) -> None:
        f = self._file
        assert f is not None
        f.pwrite(b.buf.view[: b.length], b.offset)
        if self._cfg.sync_data:
            f.sync()
        self._durable = LogMark(b.journal_id, b.offset + b.length)
        st = self.stats
        st.flushes += 1
        st.records += len(b.records)
        st.bytes_written += b.length
        st.reasons[b.reason.value] = st.reasons.get(b.reason.value, 0) + 1
        _call_back(b.records, None)
        for listener in self.flush_listeners:
            listener(self._durable)

    # --- spill, preallocate, roll ---------------------------------------------------------------
    def _spill(self, blocks: memoryview) -> None:
        """Write whole aligned blocks of a batch that outgrew the buffer (no sync; the
        batch's fdatasync covers them). It waits until the previous batch is synced:
        otherwise a power cut could keep this spill yet lose part of that batch, and
        replay would see valid data after a hole - corruption, not a torn tail."""
        self._wait_sync_idle()
        f = self._file
        assert f is not None
        end = self._file_pos + len(blocks)
        if end > self._allocated:
            self._preallocate(end)
        f.pwrite(blocks, self._file_pos)
        self._file_pos = end

    def _preallocate(self, end: int) -> None:
        """Reserve space ahead of the tail (fallocate) in ``prealloc_size`` steps, so
        most writes land inside the file and an fdatasync need not grow it."""
        f = self._file
        assert f is not None
        step = max(self._cfg.prealloc_size, self._cfg.alignment)
        target = -(-end // step) * step
        f.allocate(self._allocated, target - self._allocated)
        self._allocated = target

    def _roll(self) -> None:
        assert self._file is not None
        self._file.close()
        self.stats.rolls += 1
        self._open_file(self._journal_id + 1)

    def _open_file(self, journal_id: int) -> None:
        a = self._cfg.alignment
        path = f"{self._cfg.directory}/{journal_name(journal_id)}"
        try:
            f = self._fs.open(path, create=True, direct=self._cfg.direct_io)
        except OSError as exc:
            raise NativeIOError(exc.errno or 5, "cannot create journal", path=path) from exc
        self.direct = f.direct
        header = self._fs.alloc_buffer(a)
        try:
            header.view[:] = JournalHeader(journal_id=journal_id, alignment=a).encode()
            f.pwrite(header.view, 0)
        finally:
            header.close()
        f.sync()
        self._fs.fsync_dir(self._cfg.directory)
        self._file, self._journal_id = f, journal_id
        self._file_pos = self._allocated = a
        self._durable = LogMark(journal_id, a)
        log.info("journal %s opened (direct=%s)", path, f.direct)
