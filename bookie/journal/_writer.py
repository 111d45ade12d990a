"""The journal writer: one thread, group commit, one aligned write + one fdatasync.

Theory of operation
-------------------
Producers call :meth:`Journal.log_entry` (and the meta-record variants) from any thread:
that only appends a tuple to a deque and, when the journal thread sleeps, wakes it. The
journal thread drains the deque into an aligned buffer, frame after frame (header, ids,
payload, CRC32C), asking :func:`bookie.journal.flush_reason` after each one whether the
batch must go out. A flush pads the buffer to the alignment with a PADDING frame, writes
it with one ``pwrite`` at an aligned offset (O_DIRECT where allowed) and calls one
``fdatasync``; then every callback of the batch runs, in queue order, on the journal
thread - one wake-up per batch, not per entry. Callbacks must be quick and never block.

A frame larger than the buffer is written out in aligned pieces before the flush (the
``fdatasync`` still covers them). Space ahead of the tail is zero-filled in steps of
``prealloc_size``, so most fdatasyncs need not commit a size change. After a flush that
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

from crc32c import crc32c

from bookie.fs import File, FileSystem
from bookie.journal._format import (
    ENTRY_PREFIX,
    FLAG_FLUSH_START,
    FRAME_HEADER,
    LAC_BODY,
    LEDGER_PREFIX,
    FrameType,
    JournalHeader,
    frame_crc,
    journal_name,
    padding_size,
    parse_journal_name,
)
from bookie.journal._mark import LogMark
from bookie.journal._policy import FlushReason, GroupCommitPolicy, flush_reason, wait_timeout
from walkit.errors import BookieShutdownError, NativeIOError

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
    prealloc_size: int = 16 << 20  # journalPreAllocSizeMB=16: zero-fill step ahead of the tail
    max_backups: int = 5  # journalMaxBackups=5: old journals kept behind the mark
    sync_data: bool = True  # journalSyncData=true: fdatasync before acknowledging
    direct_io: bool = True  # O_DIRECT when the file system allows it
    buffer_size: int = 1 << 20  # one batch fits: at least the bytes threshold


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
        size = max(config.buffer_size, config.policy.buffered_writes_threshold + a)
        self._buf = fs.alloc_buffer(-(-size // a) * a)
        self._view = self._buf.view
        self._zeros = bytes(a + FRAME_HEADER.size)
        self._file: File | None = None
        self._journal_id = -1
        self._file_pos = 0  # file offset of buffer[0]; always aligned
        self._fill = 0
        self._mid_batch = False
        self._allocated = 0
        self._durable = LogMark(-1, 0)
        self._thread: threading.Thread | None = None
        self.stats = JournalStats()
        self.direct = False

    # --- lifecycle --------------------------------------------------------------------
    def start(self) -> LogMark:
        """Open a new journal file (id one above every existing one), start the thread
        and return the position where this run's records begin."""
        self._fs.makedirs(self._cfg.directory)
        existing = list_journals(self._fs, self._cfg.directory)
        self._open_file((existing[-1] + 1) if existing else 1)
        self._thread = threading.Thread(target=self._run, name="bookie-journal", daemon=True)
        self._thread.start()
        return self._durable

    def shutdown(self) -> None:
        """Flush everything queued so far, then stop. Later submissions fail."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._queue.append(_STOP)
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        if self._file is not None:
            self._file.close()
            self._file = None
        self._buf.close()

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
        self._submit((FrameType.ENTRY, ledger_id, entry_id, data, callback, ctx, self._clock()))

    def log_master_key(self, ledger_id: int, key: bytes, callback: Callback | None = None, ctx: Any = None) -> None:
        self._submit((FrameType.MASTER_KEY, ledger_id, 0, key, callback, ctx, self._clock()))

    def log_fence(self, ledger_id: int, callback: Callback | None = None, ctx: Any = None) -> None:
        self._submit((FrameType.FENCE, ledger_id, 0, b"", callback, ctx, self._clock()))

    def log_lac(self, ledger_id: int, lac: int, callback: Callback | None = None, ctx: Any = None) -> None:
        self._submit((FrameType.LAC, ledger_id, lac, b"", callback, ctx, self._clock()))

    def _submit(self, record: tuple[Any, ...]) -> None:
        if self._closed or self._error is not None:
            raise self._dead_error()
        self._queue.append(record)
        if self._waiting:
            with self._cond:
                self._cond.notify()

    def _dead_error(self) -> BaseException:
        if self._error is not None:
            return BookieShutdownError("journal failed", journal=self._journal_id, cause=self._error)
        return BookieShutdownError("journal is shut down", journal=self._journal_id)

    # --- the journal thread -------------------------------------------------------------
    def _run(self) -> None:
        batch: list[tuple[Callback | None, Any]] = []
        oldest: float | None = None
        stopping = False
        q, policy, clock = self._queue, self._cfg.policy, self._clock
        try:
            while True:
                reason = None
                while q and reason is None:
                    rec = q.popleft()
                    if rec is _STOP:
                        stopping = True
                        break
                    batch.append((rec[4], rec[5]))
                    self._append_record(rec)
                    if oldest is None:
                        oldest = rec[6]
                    reason = self._reason(oldest, len(batch))
                if stopping and batch:
                    reason = FlushReason.SHUTDOWN
                if reason is None and batch:
                    reason = self._reason(oldest, len(batch))
                if reason is not None:
                    self._flush(batch, reason)
                    batch, oldest = [], None
                if stopping:
                    self._fail_queued(self._dead_error())
                    return
                if reason is None:
                    self._sleep(wait_timeout(policy, now=clock(), oldest_enqueued=oldest))
        except BaseException as exc:  # noqa: BLE001 - any failure kills the journal
            self._die(exc, batch)

    def _reason(self, oldest: float | None, entries: int) -> FlushReason | None:
        q = self._queue
        head = q[0] if q else None
        return flush_reason(
            self._cfg.policy, now=self._clock(), oldest_enqueued=oldest, buffered_bytes=self._fill,
            buffered_entries=entries, next_enqueued=None if head is None or head is _STOP else head[6],
        )

    def _sleep(self, timeout: float | None) -> None:
        with self._cond:
            self._waiting = True
            if not self._queue:
                self._cond.wait(timeout)
            self._waiting = False

    def _die(self, exc: BaseException, batch: list[tuple[Callback | None, Any]]) -> None:
        log.error("journal %d failed, failing %d pending records: %s", self._journal_id, len(batch), exc)
        self._error = exc
        for cb, ctx in batch:
            if cb is not None:
                cb(exc, ctx)
        self._fail_queued(exc)

    def _fail_queued(self, exc: BaseException) -> None:
        while self._queue:
            rec = self._queue.popleft()
            if rec is not _STOP and rec[4] is not None:
                rec[4](exc, rec[5])

    # --- frames into the buffer -------------------------------------------------------------
    def _append_record(self, rec: tuple[Any, ...]) -> None:
        ftype, ledger_id, arg, data = rec[0], rec[1], rec[2], rec[3]
        if ftype == FrameType.ENTRY:
            self._append_frame(ftype, ENTRY_PREFIX.pack(ledger_id, arg), data)
        elif ftype == FrameType.MASTER_KEY:
            self._append_frame(ftype, LEDGER_PREFIX.pack(ledger_id), data)
        elif ftype == FrameType.FENCE:
            self._append_frame(ftype, LEDGER_PREFIX.pack(ledger_id), b"")
        else:
            self._append_frame(ftype, LAC_BODY.pack(ledger_id, arg), b"")
        self.stats.records += 1

    def _append_frame(self, ftype: int, prefix: bytes, data: bytes) -> None:
        # The first frame of a flush sits at an aligned file offset; a spill can also
        # empty the buffer in the middle of a batch, hence _mid_batch.
        flags = FLAG_FLUSH_START if self._fill == 0 and not self._mid_batch else 0
        length = len(prefix) + len(data)
        total = FRAME_HEADER.size + length
        if self._fill + total > len(self._buf):
            self._spill()
        if self._fill + total > len(self._buf):
            self._append_large(ftype, flags, prefix, data)
            return
        pos, view = self._fill, self._view
        body = pos + FRAME_HEADER.size
        FRAME_HEADER.pack_into(view, pos, 0, ftype, flags, 0, length)
        view[body : body + len(prefix)] = prefix
        view[body + len(prefix) : pos + total] = data
        FRAME_HEADER.pack_into(view, pos, crc32c(view[pos + 4 : pos + total]), ftype, flags, 0, length)
        self._fill = pos + total

    def _append_large(self, ftype: int, flags: int, prefix: bytes, data: bytes) -> None:
        length = len(prefix) + len(data)
        crc = frame_crc(ftype, flags, length, prefix, data)
        self._append_bytes(FRAME_HEADER.pack(crc, ftype, flags, 0, length) + prefix)
        self._append_bytes(data)

    def _append_bytes(self, data: bytes | memoryview) -> None:
        mv = memoryview(data)
        while mv:
            room = len(self._buf) - self._fill
            if room == 0:
                self._spill()
                continue
            chunk = mv[:room]
            self._view[self._fill : self._fill + len(chunk)] = chunk
            self._fill += len(chunk)
            mv = mv[len(chunk) :]

    def _spill(self) -> None:
        """Write the whole aligned blocks of the buffer (no sync) to make room."""
        a = self._cfg.alignment
        aligned = self._fill - self._fill % a
        if not aligned:
            return
        self._write(self._view[:aligned])
        rest = self._fill - aligned
        self._view[:rest] = self._view[aligned : self._fill]
        self._fill = rest
        self._mid_batch = True

    # --- flush, write, roll ---------------------------------------------------------------
    def _flush(self, batch: list[tuple[Callback | None, Any]], reason: FlushReason) -> None:
        self._pad()
        self._write(self._view[: self._fill])
        self._fill = 0
        self._mid_batch = False
        if self._cfg.sync_data:
            assert self._file is not None
            self._file.sync()
        self._durable = LogMark(self._journal_id, self._file_pos)
        st = self.stats
        st.flushes += 1
        st.reasons[reason.value] = st.reasons.get(reason.value, 0) + 1
        for cb, ctx in batch:
            if cb is not None:
                cb(None, ctx)
        if self._file_pos >= self._cfg.max_size:
            self._roll()

    def _pad(self) -> None:
        pad = padding_size(self._fill, self._cfg.alignment)
        if not pad:
            return
        if self._fill + pad > len(self._buf):
            self._spill()
        pos, view = self._fill, self._view
        view[pos : pos + pad] = self._zeros[:pad] if pad <= len(self._zeros) else bytes(pad)
        FRAME_HEADER.pack_into(view, pos, 0, FrameType.PADDING, 0, 0, pad - FRAME_HEADER.size)
        FRAME_HEADER.pack_into(
            view, pos, crc32c(view[pos + 4 : pos + pad]), FrameType.PADDING, 0, 0, pad - FRAME_HEADER.size
        )
        self._fill = pos + pad

    def _write(self, data: memoryview) -> None:
        f = self._file
        assert f is not None
        end = self._file_pos + len(data)
        if end > self._allocated:
            self._preallocate(end)
        f.pwrite(data, self._file_pos)
        self._file_pos = end
        self.stats.bytes_written += len(data)

    def _preallocate(self, end: int) -> None:
        """Zero-fill ahead so later fdatasyncs need not commit a size change."""
        f = self._file
        assert f is not None
        step = max(self._cfg.prealloc_size, self._cfg.alignment)
        target = -(-end // step) * step
        zeros = self._fs.alloc_buffer(min(1 << 20, target - self._allocated))
        try:
            pos = self._allocated
            while pos < target:
                n = min(len(zeros), target - pos)
                f.pwrite(zeros.view[:n], pos)
                pos += n
        finally:
            zeros.close()
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
