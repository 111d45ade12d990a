"""The journal writer: group commit, one aligned write + one fdatasync per batch.

Theory of operation
-------------------
Producers call :meth:`Journal.log_entry` (and the meta-record variants) from any thread,
or :meth:`Journal.log_records` with several records at once (the bookie hands over the
adds of one received chunk together: one lock acquisition and at most one wake-up for
all of them). Under the journal's lock each record is framed straight into the batch
being built (an aligned :class:`~bookie.journal._framing.FrameBuffer`: header, ids,
payload, CRC32C) and its callback is appended to the batch. Framing in the caller's thread means a record is
touched once, and the journal threads wake once per batch, not per record - in CPython,
where every thread shares one core's worth of bytecode, that is what throughput is made of.

* The **journal thread** decides when the batch goes out while the disk is idle: it asks
  the pure :func:`~bookie.journal.flush_reason` policy (the oldest record's wait, buffered
  bytes and entries, flush-when-the-queue-is-empty) whenever it wakes. Producers wake it
  for the first record of a batch, and - while it sleeps out a group wait - when the
  policy says a threshold was reached. When a batch must go and the sync thread is free,
  it pads the batch to the alignment (PADDING frame), swaps in an empty buffer and hands
  the batch over. While the sync thread is busy, records keep joining the batch: the
  busier the disk, the larger the batches. When it finds the sync thread busy it waits
  for it to go idle and then asks the policy again (the sync thread may have taken the
  batch meanwhile, see below). It also rolls to the next file.
* The **sync thread** writes the batch with one ``pwritev`` at an aligned offset (O_DIRECT
  where allowed) and one ``fdatasync`` - a single call, :meth:`bookie.fs.File.pwritev_sync`,
  so the native backend releases the GIL once for both - then runs the batch's callbacks
  in submission order and the flush listeners. Callbacks must be quick; they may submit
  new records (appending never blocks: a batch larger than its buffer gets a larger
  buffer). Then, under load, it **takes the next batch itself**: if the batch being
  built is non-empty and the same policy says it must go now, it closes it exactly as
  the journal thread would and writes it, without handing control back - no thread
  switch per batch (in CPython each one can wait a GIL switch interval, 5 ms). It goes
  idle (and wakes the journal thread) when the batch is empty, when the policy says wait,
  or when the batch could fill the file: rolls stay on the journal thread.

* The **caller's thread** may take the journal thread's part - or both parts - when the
  journal is idle (:meth:`Journal.kick`). A producer that frames records with
  ``defer=True`` (the bookie's event loop, for the adds of one loop iteration) does not
  wake the parked journal thread; it calls :meth:`Journal.kick` once it has framed all
  it will frame for now. If the journal thread is parked with nothing to do and no flush
  is in flight, the caller claims the flush, closes the batch and either hands it to the
  sync thread itself (one thread switch fewer) or - ``inline`` - writes, syncs and calls
  back on its own thread: no thread switch at all between the request and its answer,
  which is what one append at a time waits for. Otherwise it wakes the journal thread
  exactly as the producer would have, and group commit goes on as above: while a flush
  is in flight, later records join the next batch. An inline flush blocks its caller
  for one write + fdatasync, so it is only taken while the disk is quick (the last
  write + sync took less than :data:`INLINE_MAX_SYNC`); a slow disk sends batches back
  to the sync thread until a flush is quick again.

Only one flush is ever in flight: a batch is closed either by the journal thread while
the sync thread is idle, or by the sync thread itself between two of its flushes, or by
a kicking caller that found the journal thread parked and the sync thread idle - never
two of them, since the flush is claimed (``_sync_busy``, set under the producer lock by
the journal thread's hand-off and by a kick, and only released after the flush's
callbacks) before a batch is closed and kept until the flush went idle. So every batch,
and its FLUSH_START frame, is written after the previous batch's fdatasync returned.

A batch that leaves the file past ``max_size`` makes the journal roll to the next id.
The next file is a recycled one when :meth:`Journal.gc` kept a retired journal free
(appends then overwrite written blocks: no extent conversion at each fdatasync), else a
new file whose space is reserved (fallocate) in steps of ``prealloc_size``. Frames carry
a CRC seeded with the file's id, so a recycled file's earlier life never reads as this
one; each batch written into a recycled file is followed by a zero block that marks
where this life ends (docs/format.md).

Durability: a callback receives ``None`` only after the fdatasync that covers its frame
returned (or, with ``sync_data=False``, after the write). Two marks tell how far the
journal got: :meth:`Journal.last_mark` moves as soon as a batch is durable (before its
callbacks: whoever hears of a record finds the mark past it); :meth:`Journal.settled_mark`
only after its callbacks returned - what a checkpoint takes, since a callback may apply
the record's state (the bookie's master keys, fences and LACs reach its ledger storage
there, once durable). Any I/O error kills the journal:
the batch in flight, the batch being built and every later submission fail - exactly once
each - and nothing later is acknowledged; ``on_failure`` is told. A failed fdatasync is
never retried: the kernel may have dropped the pages it failed to write, and a second
fdatasync would succeed without them ("fsyncgate"); only a restart, which replays what
is really on disk, knows what is durable.

A full disk is not an I/O error: before a batch is written its space is reserved
(fallocate), and when even the batch's own size does not fit the batch is refused - its
records fail with ENOSPC, nothing of it reaches the file, the next batch is written where
it would have gone - and ``on_no_space`` is told (the bookie turns read-only). A batch
that was to end the file is refused the same way, with the records framed after it (they
carry the next file's seed), and framing goes back to this file's seed. The journal
goes on, so once space is freed the bookie can be writable again without a restart.
The same holds at a roll: when the next file cannot be made, the records framed for it
are refused and the next batch tries the roll again - and at :meth:`Journal.start`: when
the disk has no room for this run's first file (a journal disk still full at restart),
the journal starts without one, ``on_no_space`` is told, and the first batch makes the
file, or is refused while there is no room for it. Replay needs no new space, so a
bookie with a full journal disk still starts (read-only) and serves what it holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bookie.fs import AlignedBuffer, FileSystem, is_no_space
from bookie.journal._files import JournalFiles, OpenJournal
from bookie.journal._format import FrameType, frame_seed
from bookie.journal._framing import ENTRY, FrameBuffer, Segment
from bookie.journal._mark import LogMark
from bookie.journal._policy import FlushReason, GroupCommitPolicy, flush_reason, wait_timeout
from bookie.journal._zero import ZeroFiller
from walkit.errors import BookieShutdownError, InvalidArgumentError
from walkit.logs import context
from walkit.metrics import COUNT_BUCKETS, LATENCY_BUCKETS, SIZE_BUCKETS, Histogram

__all__ = ["Journal", "JournalConfig", "JournalStats", "Callback", "Record", "ENTRY", "KEY_RECORD", "FENCE_RECORD",
           "LAC_RECORD"]

log = logging.getLogger("bookie.journal")

#: ``callback(error, ctx)``: error is None once the record is durable.
Callback = Callable[[BaseException | None, Any], None]
#: ``(type, ledger id, arg, data, callback or None, ctx)``: one record for :meth:`Journal.log_records`.
Record = tuple[int, int, int, Any, "Callback | None", Any]
KEY_RECORD, FENCE_RECORD, LAC_RECORD = int(FrameType.MASTER_KEY), int(FrameType.FENCE), int(FrameType.LAC)
_RECORD_TYPES = frozenset({ENTRY, KEY_RECORD, FENCE_RECORD, LAC_RECORD})
_NO_RECORDS: list[Record] = []


@dataclass(frozen=True)
class JournalConfig:
    directory: str
    policy: GroupCommitPolicy = field(default_factory=GroupCommitPolicy)
    alignment: int = 4096  # O_DIRECT needs 4 KiB on the disks we target
    max_size: int = 2048 << 20  # journalMaxSizeMB=2048: roll after this many bytes
    prealloc_size: int = 16 << 20  # journalPreAllocSizeMB=16: fallocate step ahead of the tail
    max_backups: int = 5  # journalMaxBackups=5: old journals kept behind the mark
    recycle_files: int = 2  # walkit: retired journals kept for reuse (appends into written blocks)
    sync_data: bool = True  # journalSyncData=true: fdatasync before acknowledging
    direct_io: bool = True  # O_DIRECT when the file system allows it
    buffer_size: int = 1 << 20  # one segment; a larger batch is several (written with one pwritev)
    sync_warn: float = 1.0  # journalSyncWarnMillis (s here): a write+sync slower than this is logged
    zero_fill_rate: int = 64 << 20  # walkit's journalZeroFillRateMB: zeros ahead of a new file's tail, bytes/s (0: off)


@dataclass
class JournalStats:
    """Counts the sync thread keeps (one writer: :mod:`walkit.metrics`)."""

    flushes: int = 0
    records: int = 0
    bytes_written: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    rolls: int = 0
    slow_syncs: int = 0  # write+syncs slower than ``sync_warn``
    no_space: int = 0  # batches refused because the disk had no room for them
    sync_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))  # one write+sync
    queue_wait_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))  # oldest record's
    records_per_flush: Histogram = field(default_factory=lambda: Histogram(COUNT_BUCKETS))
    bytes_per_flush: Histogram = field(default_factory=lambda: Histogram(SIZE_BUCKETS))


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


def _check_record(ftype: int, ledger_id: int, arg: int, data: Any) -> None:
    """Refuse a record the journal could not frame (one combined test)."""
    if (
        type(ledger_id) is not int or type(arg) is not int or not 0 <= ledger_id <= _U64_MAX
        or not _I64_MIN <= arg <= _I64_MAX or not isinstance(data, (bytes, bytearray, memoryview))
        or ftype not in _RECORD_TYPES
    ):
        _check_ids(ledger_id, arg)
        _check_bytes(data)
        raise InvalidArgumentError("unknown journal record type", type=ftype)


def _check_records(records: list[Record]) -> None:
    for ftype, ledger_id, arg, data, _, _ in records:
        _check_record(ftype, ledger_id, arg, data)


def _call_back(records: list[tuple[Callback, Any]], error: BaseException | None) -> None:
    """Run a batch's callbacks, in submission order."""
    for cb, ctx in records:
        cb(error, ctx)


class _Batch:
    """A batch handed from the journal thread to the sync thread."""

    __slots__ = ("segments", "length", "offset", "journal_id", "records", "count", "reason", "terminator", "oldest")

    def __init__(self, segments: list[Segment], offset: int, journal_id: int,
                 records: list[tuple[Callback, Any]], count: int, reason: FlushReason, oldest: float | None) -> None:
        self.segments, self.offset, self.journal_id = segments, offset, journal_id
        self.oldest = oldest  # when its oldest record was queued (the journal's clock)
        self.length = sum(n for _, n in segments)
        self.records, self.reason = records, reason  # records: the callbacks only
        self.count = count  # every framed record, with a callback or not
        #: a zero block written after the batch (recycled files: marks the end of this life)
        self.terminator: memoryview | None = None


_IDLE, _UNTIMED, _TIMED = 0, 1, 2  # what the journal thread is waiting for
#: A kick flushes on its caller's thread only while the last write + fdatasync took less
#: than this (seconds): an inline flush blocks the caller (the bookie's event loop) for it.
INLINE_MAX_SYNC = 0.002
_POOL = 16  # spare buffers kept: 16 x buffer_size of memory at most when idle


class Journal:
    """Group-committing journal over a :class:`bookie.fs.FileSystem`."""

    def __init__(self, fs: FileSystem, config: JournalConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        a = config.alignment
        self._fs = fs
        self._cfg = config
        self._clock = clock
        self._buf_size = -(-max(config.buffer_size, config.policy.buffered_writes_threshold + 2 * a) // a) * a
        # Producer state, all under _lock: the batch being built.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # wakes the journal thread
        self._pool: list[AlignedBuffer] = []  # spare standard buffers (under _lock)
        self._frames = FrameBuffer(a, self._get_buffer, self._put_buffer)
        self._records: list[tuple[Callback, Any]] = []  # callbacks of the batch being built
        self._entries = 0
        self._oldest: float | None = None
        self._waiting = _IDLE
        self._closed = True  # until start(): nothing may be framed before the file's seed is known
        self._error: BaseException | None = None
        # Journal-thread state: the file and where the next batch goes.
        self._files = JournalFiles(
            fs, config.directory, alignment=a, direct_io=config.direct_io, prealloc_size=config.prealloc_size,
            max_backups=config.max_backups, recycle_files=config.recycle_files,
        )
        self._current: OpenJournal | None = None
        self._filler = ZeroFiller(fs, config.zero_fill_rate, alignment=a) if config.zero_fill_rate > 0 else None
        self._journal_id = -1
        self._file_pos = 0  # file offset of the next batch; always aligned
        self._durable = LogMark(-1, 0)
        self._settled = LogMark(-1, 0)  # the durable mark, once the callbacks before it returned
        # Hand-off to the sync thread: at most one batch in flight. Two conditions on one
        # lock, so that each wake-up reaches only the thread that waits for it: the sync
        # thread waits on _sync_cond for a batch (or the stop); the journal thread waits
        # on _idle_cond for the flush in flight to end. An inline flush (kick) then wakes
        # nobody when nobody waits - not the idle sync thread at every add.
        sync_lock = threading.Lock()
        self._sync_cond = threading.Condition(sync_lock)
        self._idle_cond = threading.Condition(sync_lock)
        self._zero_block = fs.alloc_buffer(a)
        self._terminator: memoryview | None = None
        self._handoff: _Batch | None = None
        self._sync_busy = False  # a flush is claimed: in flight, or about to be
        self._sync_stop = False
        self._last_sync = 0.0  # seconds the last write + sync took (:meth:`kick` reads it)
        self._threads: list[threading.Thread] = []
        self.stats = JournalStats()
        self.direct = False
        #: Called on the sync thread after each batch's callbacks, with the new durable
        #: mark: one wake-up per batch for whoever waits on many entries.
        self.flush_listeners: list[Callable[[LogMark], None]] = []
        #: ``on_failure(error)``: called once, on the thread that met it, when an I/O
        #: error killed the journal (the bookie turns read-only for good).
        self.on_failure: Callable[[BaseException], None] | None = None
        #: ``on_no_space(error)``: a batch was refused because the disk is full (the
        #: journal lives on; the bookie turns read-only until there is room).
        self.on_no_space: Callable[[BaseException], None] | None = None
        #: Test hook (walkit.testing's slow_disk): seconds the sync thread sleeps before
        #: writing and syncing each batch, as a slow disk would take; 0 in production.
        self.sync_delay = 0.0

    # --- lifecycle --------------------------------------------------------------------
    def start(self, *, min_id: int = 1) -> LogMark:
        """Open a new journal file - its id above every existing one, and at least
        ``min_id`` (the bookie passes one past its checkpoint mark's file, which may never
        have been made) - start the threads and return the position where this run's
        records begin. A disk without room for the file does not stop the start
        (:meth:`_start_without_file`)."""
        self._fs.makedirs(self._cfg.directory)
        journal_id = max(self._files.next_id(), min_id)
        no_space: BaseException | None = None
        try:
            self._open_file(journal_id)
        except OSError as exc:
            if not is_no_space(exc):
                raise
            no_space = exc
            self._start_without_file(journal_id, exc)
        with self._lock:
            self._frames.seed = frame_seed(self._journal_id)
            self._closed = False
        for target, name in ((self._run, "bookie-journal"), (self._sync_run, "bookie-journal-sync")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        if self._filler is not None:
            self._filler.start()
        if no_space is not None and self.on_no_space is not None:
            self.on_no_space(no_space)
        return self._durable

    def _start_without_file(self, journal_id: int, exc: BaseException) -> None:
        """The disk has no room for journal ``journal_id``: start without a file. Records
        are framed for it as usual; the first batch makes it (:meth:`_roll_or_refuse`) -
        or, while the disk is still full, is refused with the ENOSPC. The marks point at
        where its records will begin: everything before is in older files."""
        log.warning("journal %d: no room in %s for a new journal file (%s); started without one: writes are"
                    " refused until its disk has room, then the file is made by the first batch", journal_id,
                    self._cfg.directory, exc, extra=context(journal=journal_id, directory=self._cfg.directory))
        self._journal_id = journal_id
        self._file_pos = self._cfg.alignment
        self._durable = self._settled = LogMark(journal_id, self._file_pos)

    def shutdown(self) -> None:
        """Flush everything submitted so far, then stop. Later submissions fail."""
        with self._lock:
            if self._closed or not self._threads:
                return
            self._closed = True
            self._cond.notify()
        for t in self._threads:
            t.join()
        if self._filler is not None:
            self._filler.stop()
        if self._current is not None:
            self._current.file.close()
            self._current = None
        for buf in [self._frames.buf, *self._pool, self._zero_block]:
            buf.close()
        self._pool.clear()

    @property
    def zero_filled(self) -> tuple[int, int]:
        """Bytes of zeros the filler wrote ahead of new files' tails, and its zero writes
        that failed (each ended the filling of one file)."""
        f = self._filler
        return (f.written, f.failures) if f is not None else (0, 0)

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

    def settled_mark(self) -> LogMark:
        """The end of the durable part whose callbacks have all returned (never past
        :meth:`last_mark`): what a checkpoint takes when callbacks apply state."""
        return self._settled

    def gc(self, mark: LogMark) -> list[int]:
        """Retire journal files wholly before ``mark``, keeping ``max_backups`` of them:
        up to ``recycle_files`` become free files for later rolls, the rest are removed."""
        return self._files.retire(mark.journal_id)

    # --- producers ------------------------------------------------------------------------
    def log_entry(self, ledger_id: int, entry_id: int, data: bytes, callback: Callback | None = None, ctx: Any = None) -> None:
        """One ENTRY record (:meth:`log_records`' contract): framed as :meth:`log_entries`
        frames a chunk's entries, with ``callback`` (if any) as the group's."""
        _check_record(ENTRY, ledger_id, entry_id, data)
        self._add(_NO_RECORDS, [(ledger_id, entry_id, data)], None if callback is None else (callback, ctx))

    def log_master_key(self, ledger_id: int, key: bytes, callback: Callback | None = None, ctx: Any = None) -> None:
        self.log_records([(KEY_RECORD, ledger_id, 0, key, callback, ctx)])

    def log_fence(self, ledger_id: int, callback: Callback | None = None, ctx: Any = None) -> None:
        self.log_records([(FENCE_RECORD, ledger_id, 0, b"", callback, ctx)])

    def log_lac(self, ledger_id: int, lac: int, callback: Callback | None = None, ctx: Any = None) -> None:
        self.log_records([(LAC_RECORD, ledger_id, lac, b"", callback, ctx)])

    def log_records(self, records: list[Record], *, defer: bool = False) -> None:
        """Frame several records, in order, under one lock acquisition (one wake-up of
        the journal thread at most). A record is ``(type, ledger id, arg, data, callback,
        ctx)``: ``ENTRY`` (arg: entry id, data: payload), ``KEY_RECORD`` (data: the key),
        ``FENCE_RECORD``, ``LAC_RECORD`` (arg: the LAC). Either the call raises and no
        record is taken (a record out of range, a dead or shut-down journal), or every
        callback is called exactly once later - with ``None`` once durable. ``defer``: as
        for :meth:`log_entries`; without a :meth:`kick` the records ride on whatever
        flush comes next."""
        _check_records(records)
        self._add(records, defer=defer)

    def log_entries(self, entries: list[tuple[int, int, bytes]], callback: Callback, ctx: Any,
                    records: list[Record] | None = None, *, defer: bool = False) -> None:
        """Frame ``records`` (checked as :meth:`log_records` checks them; e.g. the master
        keys of ledgers seen for the first time), then the ENTRY records ``(ledger id,
        entry id, payload)``, in order, under one lock acquisition; ``callback(error,
        ctx)`` is called **once** for all the entries - with ``None`` when the flush that
        covers them returned (they are framed into one batch, so one fdatasync covers
        them all). The hot path: the bookie checked the entries (ids in range, payload
        bytes), so they are not checked again; a value that cannot be framed fails the
        group's callback with its error (the entries framed before it are written but
        not acknowledged). A dead or shut-down journal raises and takes nothing.

        ``defer``: do not wake a parked journal thread - the caller promises to call
        :meth:`kick` soon (after framing whatever else it has), which may flush on its
        own thread."""
        if not entries:
            raise InvalidArgumentError("log_entries needs at least one entry")
        if records:
            _check_records(records)
        self._add(records or [], entries, (callback, ctx), defer)

    def _add(self, records: list[Record], entries: list[tuple[int, int, bytes]] | None = None,
             group: tuple[Callback, Any] | None = None, defer: bool = False) -> None:
        # Under the lock: a record is either refused here or called back later exactly
        # once, even when the journal dies or shuts down at this very moment.
        failed: list[tuple[Callback, Any]] = []
        error: BaseException | None = None
        lock = self._lock  # acquire/release: cheaper than `with` on this hot path
        lock.acquire()
        try:
            if self._closed or self._error is not None:
                raise self._dead_error()
            callbacks = self._records
            frames = self._frames
            taken = 0
            try:
                for ftype, ledger_id, arg, data, callback, ctx in records:
                    self._frames.append(ftype, ledger_id, arg, data)
                    taken += 1
                    if callback is not None:
                        callbacks.append((callback, ctx))
                if entries:
                    frames.framed = 0
                    frames.append_entries(entries)
                    taken += frames.framed
                if group is not None:
                    callbacks.append(group)
            except BaseException as exc:  # noqa: BLE001 - e.g. no memory for a buffer:
                error = exc  # the records not framed fail, the framed ones stay
                if taken < len(records):
                    failed = [(cb, ctx) for _, _, _, _, cb, ctx in records[taken:] if cb is not None]
                else:
                    taken += frames.framed  # entries framed before the failure
                if group is not None:
                    failed.append(group)
            if taken:
                self._entries += taken
                if self._oldest is None:
                    self._oldest = self._clock()
                if (self._waiting == _UNTIMED and not defer) or (
                        self._waiting == _TIMED and self._reason() is not None):
                    self._waiting = _IDLE
                    self._cond.notify()
        finally:
            lock.release()
        if failed:
            _call_back(failed, error)

    def kick(self, inline: bool = True) -> None:
        """Flush what deferred producers framed (``log_entries(..., defer=True)``). If the
        journal thread is parked with nothing to do, no flush is in flight and the
        policy says the batch must go now, this thread claims the flush and closes the
        batch: with ``inline`` (and a quick disk, see :data:`INLINE_MAX_SYNC`) it writes,
        syncs and runs the callbacks itself before returning; otherwise it hands the
        batch to the sync thread. In any other case it wakes the journal thread, as a
        producer without ``defer`` would have. Never raises: a failure kills the journal
        as it would on the journal's threads."""
        now = self._clock()
        batch: _Batch | None = None
        with self._lock:
            if self._waiting != _UNTIMED or self._entries == 0:
                return  # the journal thread is awake, or times a group wait; or nothing to do
            if not self._closed and self._error is None and self._current is not None and (
                    self._file_pos + self._frames.size + 2 * self._cfg.alignment < self._cfg.max_size):
                reason = flush_reason(self._cfg.policy, now, self._oldest, self._frames.size, self._entries)
                if reason is not None:
                    with self._sync_cond:  # lock order: _lock, then _sync_cond (nobody nests them the other way)
                        if not self._sync_busy:
                            self._sync_busy = True  # the flush is ours: the journal thread waits for it
                            batch = self._close_batch(reason)
            if batch is None:  # a roll, a shutdown, a group wait or a flush in flight: the journal thread's
                self._waiting = _IDLE
                self._cond.notify()
                return
        ready = False
        try:
            ready = self._reserve(batch)  # False: refused for lack of space (its records failed)
        except BaseException as exc:  # noqa: BLE001 - any failure kills the journal
            log.error("journal %d: reserving space for %d records failed: %s", batch.journal_id,
                      len(batch.records), exc, extra=context(journal=batch.journal_id))
            self._fail(exc)
        if ready and not (inline and self.sync_delay == 0 and self._last_sync < INLINE_MAX_SYNC):
            with self._sync_cond:  # the sync thread writes it, then releases the flush
                self._handoff = batch
                self._sync_cond.notify_all()
            return
        if ready:
            self._write_batch(batch)  # a failure killed the journal (and woke its thread)
        with self._sync_cond:  # records framed meanwhile woke the journal thread, which waits for this
            self._sync_busy = False
            self._idle_cond.notify_all()

    def _reason(self) -> FlushReason | None:
        """The policy's verdict on the batch being built (producers, lock held)."""
        return flush_reason(self._cfg.policy, self._clock(), self._oldest, self._frames.size, self._entries)

    def _dead_error(self) -> BaseException:
        if self._error is not None:
            return BookieShutdownError("journal failed", journal=self._journal_id, cause=self._error)
        return BookieShutdownError("journal is shut down", journal=self._journal_id)

    # --- the journal thread -------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._error is None:
                reason = self._await_batch()
                if reason is None:
                    break  # shut down with nothing left
                if self._wait_sync_idle():
                    continue  # the sync thread may have taken the batch itself: ask again
                self._hand_off(reason)
        except BaseException as exc:  # noqa: BLE001 - any failure kills the journal
            self._die(exc)
        finally:
            with self._sync_cond:
                self._sync_stop = True
                self._sync_cond.notify_all()
                self._idle_cond.notify_all()
            if self._error is not None:
                self._die(self._error)

    def _await_batch(self) -> FlushReason | None:
        """Sleep until the policy says the batch must go (None: shut down, batch empty).
        The clock is read before taking the lock, never while holding it."""
        while True:
            now = self._clock()
            with self._lock:
                if self._error is not None:
                    raise self._error
                if self._entries == 0:
                    if self._closed:
                        return None
                    self._waiting = _UNTIMED
                    self._cond.wait()
                    continue
                if self._closed:
                    return FlushReason.SHUTDOWN
                reason = flush_reason(self._cfg.policy, now, self._oldest, self._frames.size, self._entries)
                if reason is not None:
                    self._waiting = _IDLE
                    return reason
                timeout = wait_timeout(self._cfg.policy, now=now, oldest_enqueued=self._oldest)
                self._waiting = _TIMED
                self._cond.wait(None if timeout is None else min(timeout, threading.TIMEOUT_MAX))

    def _close_batch(self, reason: FlushReason) -> _Batch:
        """Close the batch being built (lock held; by whichever thread may flush now)."""
        segments, records, count, oldest = self._frames.take(), self._records, self._entries, self._oldest
        self._records, self._entries, self._oldest = [], 0, None
        batch = _Batch(segments, self._file_pos, self._journal_id, records, count, reason, oldest)
        batch.terminator = self._terminator
        self._file_pos += batch.length
        if self._file_pos >= self._cfg.max_size:  # the next batch goes to the next file
            self._frames.seed = frame_seed(self._journal_id + 1)
        return batch

    def _reserve(self, batch: _Batch) -> bool:
        """Make room in the file for ``batch`` (and its terminator). False when the disk
        is full (:func:`~bookie.fs.is_no_space`): the batch is refused - nothing of it
        was written, its records fail with the ENOSPC, the next batch takes its place
        in the file - and the journal lives on. Any other error fails the batch's
        records and is raised (it kills the journal)."""
        end = batch.offset + batch.length + (len(batch.terminator) if batch.terminator is not None else 0)
        try:
            assert self._current is not None
            self._current.reserve(end)
            return True
        except BaseException as exc:  # these records left the batch: fail them here
            if is_no_space(exc):
                self._refuse(batch, exc)
                return False
            _call_back(batch.records, exc)
            raise

    def _refuse(self, batch: _Batch, exc: BaseException) -> None:
        """Drop a batch the disk has no room for (see :meth:`_reserve`). When it was to
        end the file, the records framed since carry the next file's seed: they are
        refused with it, and framing goes on with this file's seed (nobody else closes a
        batch meanwhile: the file looks full to the inline and sync-thread flushes)."""
        later: list[tuple[Callback, Any]] = []
        with self._lock:
            self._file_pos = batch.offset  # only the thread that closed a batch moves it
            for buf, _ in batch.segments:
                self._put_buffer(buf)
            if batch.offset + batch.length >= self._cfg.max_size:
                later = self._drop_framed()
                self._frames.seed = frame_seed(batch.journal_id)
        self._refused(batch.records + later, exc, f"{batch.length} bytes at offset {batch.offset}")

    def _drop_framed(self) -> list[tuple[Callback, Any]]:
        """Take the records framed since the last batch closed out of the journal (lock
        held): their buffers go back to the pool; the caller fails them."""
        segments, records = self._frames.take(), self._records
        self._records, self._entries, self._oldest = [], 0, None
        for buf, _ in segments:
            self._put_buffer(buf)
        return records

    def _refused(self, records: list[tuple[Callback, Any]], exc: BaseException, what: str) -> None:
        """Records the disk had no room for fail with its ENOSPC; the bookie is told."""
        self.stats.no_space += 1
        log.warning("journal %d: no space for %d records (%s), refused: %s", self._journal_id, len(records), what,
                    exc, extra=context(journal=self._journal_id, directory=self._cfg.directory))
        _call_back(records, exc)
        if self.on_no_space is not None:
            self.on_no_space(exc)

    def _hand_off(self, reason: FlushReason) -> None:
        """Close the batch being built and give it to the (idle) sync thread."""
        if (self._current is None or self._file_pos >= self._cfg.max_size) and not self._roll_or_refuse():
            return  # a file the disk had no room for: tried again with the next batch
        with self._lock:
            batch = self._close_batch(reason)
        if not self._reserve(batch):
            return
        with self._sync_cond:
            self._handoff = batch
            self._sync_busy = True
            self._sync_cond.notify_all()
        if self._file_pos >= self._cfg.max_size:
            self._wait_sync_idle()
            self._roll_or_refuse()

    def _roll_or_refuse(self) -> bool:
        """Roll to the next file (the sync thread idle), or make the first one when the
        journal started without it. When the disk has no room for it, the records framed
        for that file are refused (ENOSPC, as in :meth:`_refuse`) and False is returned:
        the journal stays where it was, and the next batch tries again. Any other error
        is raised (it kills the journal)."""
        try:
            self._roll()
            return True
        except BaseException as exc:
            if not is_no_space(exc):
                raise
            with self._lock:
                records = self._drop_framed()
            self._refused(records, exc, f"no room for journal {self._next_file_id()}")
            return False

    def _wait_sync_idle(self) -> bool:
        """Wait until no flush is in flight; True when one was."""
        waited = False
        with self._sync_cond:
            while self._sync_busy and self._error is None:
                waited = True
                self._idle_cond.wait()
        if self._error is not None:
            raise self._error
        return waited

    def _die(self, exc: BaseException) -> None:
        """Fail the batch being built and refuse everything later (exactly once each)."""
        with self._lock:
            first = self._error is None
            if first:
                log.error("journal %d in %s failed: %s", self._journal_id, self._cfg.directory, exc,
                          extra=context(journal=self._journal_id, directory=self._cfg.directory))
                self._error = exc
            records, self._records = self._records, []
            self._entries, self._oldest = 0, None
        _call_back(records, exc)
        if first:
            self._report_failure(exc)

    def _report_failure(self, exc: BaseException) -> None:
        if self.on_failure is not None:
            try:
                self.on_failure(exc)
            except Exception:  # noqa: BLE001 - the journal is dead either way
                log.exception("journal %d: failure listener raised", self._journal_id)

    # --- the sync thread ----------------------------------------------------------------------
    def _sync_run(self) -> None:
        while True:
            with self._sync_cond:
                # busy without a hand-off: a kicking caller flushes on its own thread
                while self._handoff is None and not self._sync_stop:
                    self._sync_cond.wait()
                batch = self._handoff
                if batch is None:
                    return
            failed = False
            while batch is not None and not failed:
                failed = self._write_batch(batch)
                if not failed:  # busy all along: nobody else can take a batch now
                    batch, failed = self._take_next()
            with self._sync_cond:
                self._handoff = None
                self._sync_busy = False
                self._idle_cond.notify_all()
            if failed:
                return

    def _take_next(self) -> tuple[_Batch | None, bool]:
        """The sync thread, between two flushes: close the batch being built if the
        policy says it must go now; ``(batch or None, journal died)``. The clock is read
        before taking the lock, as the journal thread does."""
        now = self._clock()
        with self._lock:
            if self._error is not None or self._entries == 0:
                return None, False
            if self._closed:
                reason: FlushReason | None = FlushReason.SHUTDOWN
            else:
                reason = flush_reason(self._cfg.policy, now, self._oldest, self._frames.size, self._entries)
            if reason is None:
                return None, False  # the journal thread times the group wait
            if self._file_pos + self._frames.size + 2 * self._cfg.alignment >= self._cfg.max_size:
                if self._waiting != _IDLE:  # this batch may fill the file: the journal
                    self._waiting = _IDLE  # thread hands it off and rolls
                    self._cond.notify()
                return None, False
            batch = self._close_batch(reason)
        try:
            if not self._reserve(batch):
                return None, False  # refused for lack of space; the journal lives on
        except BaseException as exc:  # noqa: BLE001 - any failure kills the journal
            log.error("journal %d: reserving space for %d records failed: %s", batch.journal_id,
                      len(batch.records), exc, extra=context(journal=batch.journal_id))
            self._fail(exc)
            return None, True
        return batch, False

    def _fail(self, exc: BaseException) -> None:
        """The sync thread hit an I/O error: the journal is dead; wake its thread. It is
        never retried: after a failed fdatasync the kernel may have dropped the dirty
        pages, so a later sync that succeeds would prove nothing ("fsyncgate")."""
        with self._lock:
            first = self._error is None
            self._error = self._error or exc
            self._cond.notify()
        if first:
            self._report_failure(exc)

    def _write_batch(self, b: _Batch) -> bool:
        """Write, sync and acknowledge one batch; True when the journal died doing it."""
        assert self._current is not None
        f = self._current.file
        if self.sync_delay > 0:
            time.sleep(self.sync_delay)
        started = time.monotonic()
        queued_for = self._clock() - b.oldest if b.oldest is not None else 0.0
        try:
            views = [buf.view[:n] for buf, n in b.segments]
            if b.terminator is not None:
                views.append(b.terminator)
            if self._cfg.sync_data:  # one call: one GIL release for write + fdatasync
                f.pwritev_sync(views, b.offset)
            else:
                f.pwritev(views, b.offset)
        except BaseException as exc:  # noqa: BLE001 - any failure kills the journal
            log.error("journal %d: write of %d records failed: %s", b.journal_id, len(b.records), exc,
                      extra=context(journal=b.journal_id))
            self._fail(exc)
            _call_back(b.records, exc)
            return True
        took = self._last_sync = time.monotonic() - started
        self._durable = LogMark(b.journal_id, b.offset + b.length)
        st = self.stats
        st.flushes += 1
        st.records += b.count
        st.bytes_written += b.length
        st.reasons[b.reason.value] = st.reasons.get(b.reason.value, 0) + 1
        st.sync_seconds.observe(took)
        st.queue_wait_seconds.observe(max(0.0, queued_for))
        st.records_per_flush.observe(b.count)
        st.bytes_per_flush.observe(b.length)
        if took > self._cfg.sync_warn:
            st.slow_syncs += 1
            log.warning("journal %d: write+sync of %d records (%d bytes) took %.0f ms (journalSyncWarnMillis: %.0f)",
                        b.journal_id, b.count, b.length, took * 1000, self._cfg.sync_warn * 1000,
                        extra=context(journal=b.journal_id, directory=self._cfg.directory))
        with self._lock:
            for buf, _ in b.segments:
                self._put_buffer(buf)
        _call_back(b.records, None)
        self._settled = self._durable  # only the sync thread moves it now (a roll waits for it)
        for listener in self.flush_listeners:
            listener(self._durable)
        return False

    # --- buffers (called with _lock held) ----------------------------------------------------
    def _get_buffer(self, min_size: int) -> AlignedBuffer:
        """A standard buffer from the pool, or a new one; a larger one when asked."""
        if min_size <= self._buf_size:
            return self._pool.pop() if self._pool else self._fs.alloc_buffer(self._buf_size)
        a = self._cfg.alignment
        return self._fs.alloc_buffer(-(-min_size // a) * a)

    def _put_buffer(self, buf: AlignedBuffer) -> None:
        if len(buf) == self._buf_size and len(self._pool) < _POOL and not self._closed:
            self._pool.append(buf)
        else:
            buf.close()

    # --- roll ---------------------------------------------------------------------------------
    def _roll(self) -> None:
        """Open the next file, then close this one (if the open fails, nothing changed)."""
        old = self._current
        self._open_file(self._next_file_id())
        if old is not None:
            old.file.close()
            self.stats.rolls += 1

    def _next_file_id(self) -> int:
        """The file the next roll opens: this run's first when it has none yet."""
        return self._journal_id if self._current is None else self._journal_id + 1

    def _open_file(self, journal_id: int) -> None:
        """Open journal ``journal_id`` as the one appended to (the zero filler moves to it:
        no zero write goes to the file before once this returns)."""
        cur = self._current = self._files.open(journal_id)
        if self._filler is not None:
            self._filler.attach(cur, self._cfg.max_size)
        self.direct = cur.file.direct
        self._journal_id = journal_id
        self._file_pos = self._cfg.alignment
        # In a recycled file the earlier life's bytes follow our tail: each batch is
        # followed by a zero block so that replay can tell where this life ends.
        self._terminator = self._zero_block.view if cur.previous_id else None
        self._durable = self._settled = LogMark(journal_id, self._file_pos)
