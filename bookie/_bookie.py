"""The bookie core: ledger storage behind a journal, with checkpoints and restart.

Theory of operation
-------------------
*Add*: check the master key (journaled on the ledger's first add or fence; a different
key is refused with ``UnauthorizedError``) and the fence (``LedgerFencedError`` unless it
is a recovery add), put the entry in ledger storage (memory), then hand it to the
journal. The returned future completes when the journal's fdatasync covering the
entry returned - that is what makes an acknowledgement durable. The server hands over
the adds of one received chunk together (:meth:`Bookie.add_batch_cb`): every check is
still made per add and a refusal touches that add only, but the bookie, storage and
journal locks are taken once for the batch - first all admitted entries go to storage,
then their records (new master keys first) are framed into the journal in one call,
with one callback for the admitted group (they share one flush, so one fdatasync makes
them all durable). The single-add and per-add-callback forms are built on it.

*Fence*: journal a FENCE record, answer when it is durable; from the moment it is framed
normal adds are refused, for good once it is durable (the flag survives restarts by
replay or checkpoint). A ledger's state - fence, explicit LAC, master key - reaches
ledger storage only once its record is durable (a master key that comes with entries:
with them, taken back if its record is refused; an explicit LAC published by
:meth:`Bookie.publish_lac`: at once, since it is true whatever becomes of its record),
so memory and journal agree even when the journal refuses the record for a full disk: the requester gets the error and the
ledger's state is as if the request never came (:mod:`bookie._records`).

*Checkpoint* (every ``flushInterval`` ms, when ``flushEntriesThreshold`` entries wait in
memory, and at start and shutdown): take the journal's settled mark M, flush and sync
ledger storage, write M into every ledger directory, delete journal files behind M
beyond ``journalMaxBackups``. Every record before M is in storage - an entry (and a key
that came with it) was put there before it was journaled, a state record by its
callback, which returned before the journal settled M - so after the flush it is durable
in storage; replaying from M is enough. Between checkpoints, once the write cache holds
``dbStorage_writeCacheMaxSizeMb``, the checkpoint thread only *places* it in the entry
logs (``LedgerStorage.place``: sorted by ledger, locations kept in memory until the next
checkpoint writes the index): the cache's size bounds memory without making checkpoints
- whose index writes cost per ledger touched - come more often.

*Restart*: check the cookies, open storage, replay journals from the highest mark
(a torn tail is truncated and reported; corruption stops the start), start a new
journal file and checkpoint at once. None of it needs new space: a journal disk still
full starts the journal without its new file, a ledger disk still full fails only that
first checkpoint; either way ``on_no_space`` is told (the server starts read-only) and
the bookie is writable again once there is room, as when a running bookie fills a disk.

*Disk faults*: an I/O error in the journal (a failed write or fdatasync) or the ledger
storage (a failed write, sync or directory sync) makes the bookie **failed**
(:attr:`Bookie.failure`, ``on_failed`` told once, an ERROR naming the directory and
the cause): the journal or storage refuses every later write, nothing is retried
(after a failed fsync the data's fate is unknown - "fsyncgate"), checkpoints stop
short of what was not flushed, and only a restart - which replays the journal from the
last mark and so finds out what is durable - makes it writable again. Reads go on:
what was synced is intact. A full disk (ENOSPC on a write or a reservation, never on a
sync) is not a failure: the refused batch or buffer waits, ``on_no_space`` is told
(the server turns read-only), and the bookie is writable again once there is room.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from bookie._config import BookieConfig
from bookie.cookie import Cookie, check_or_write_cookies
from bookie.fs import FileSystem, is_no_space
from bookie.gc import GarbageCollector, GcMetadata
from bookie._records import LedgerRecords, LedgerView
from bookie.journal import (
    GroupCommitPolicy,
    Journal,
    JournalConfig,
    LAC_RECORD,
    LogMark,
    Record,
    ReplayReport,
    highest_mark,
    replay,
    write_mark,
)
from bookie.storage import MAX_ENTRY_ID, MAX_ENTRY_SIZE, LedgerStorage
from walkit.errors import (
    BookieShutdownError,
    EntryTooLargeError,
    InvalidArgumentError,
    LedgerFencedError,
    NativeIOError,
    NoSuchLedgerError,
    UnauthorizedError,
    WalkitError,
)
from walkit.logs import context
from walkit.metrics import LATENCY_BUCKETS, Histogram
from walkit.protocol import ENTRY_HEADER, parse_entry_header

__all__ = ["Bookie", "BookieFailure", "LAST_ENTRY", "AddItem", "AddRequest", "BatchCallback"]

log = logging.getLogger("bookie")

#: ``read_entry(ledger, LAST_ENTRY)`` reads the last entry stored (BookKeeper's -1).
LAST_ENTRY = -1
_MAX_LEDGER_ID = (1 << 63) - 1
_MAX_KEY = 64


def _journal_config(c: BookieConfig) -> JournalConfig:
    policy = GroupCommitPolicy(
        max_group_wait=c.journal_max_group_wait_msec / 1000.0,
        buffered_writes_threshold=c.journal_buffered_writes_threshold,
        buffered_entries_threshold=c.journal_buffered_entries_threshold,
        flush_when_queue_empty=c.journal_flush_when_queue_empty,
    )
    return JournalConfig(
        directory=c.journal_directory,
        policy=policy,
        alignment=c.journal_alignment_size,
        max_size=c.journal_max_size_mb << 20,
        prealloc_size=c.journal_pre_alloc_size_mb << 20,
        max_backups=c.journal_max_backups,
        recycle_files=c.journal_recycle_files,
        sync_data=c.journal_sync_data,
        direct_io=c.journal_direct_io,
        sync_warn=c.journal_sync_warn_millis / 1000.0,
        zero_fill_rate=c.journal_zero_fill_rate_mb << 20,
    )


def _as_walkit_error(exc: BaseException) -> WalkitError:
    if isinstance(exc, WalkitError):
        return exc
    err: WalkitError
    if isinstance(exc, OSError):
        err = NativeIOError(exc.errno or 5, f"bookie I/O failed: {exc}")
    else:
        err = BookieShutdownError("journal failed")
    err.__cause__ = exc
    return err


Callback = Callable[[BaseException | None, Any], None]
#: One add for :meth:`Bookie.add_entries_cb`: ledger id, entry id, master key, payload, recovery, ctx.
AddItem = tuple[int, int, bytes, bytes, bool, Any]


class AddRequest(Protocol):
    """What :meth:`Bookie.add_batch_cb` reads of an add (an ADD_ENTRY request has it)."""

    @property
    def ledger_id(self) -> int: ...

    @property
    def entry_id(self) -> int: ...

    @property
    def master_key(self) -> bytes: ...

    @property
    def data(self) -> bytes: ...

    @property
    def recovery(self) -> bool: ...


A = TypeVar("A", bound=AddRequest)
#: ``cb(error, adds)``: error is None once every add of the group is durable.
BatchCallback = Callable[[BaseException | None, list[A]], None]
_HEADER_IDS = struct.Struct(">Qq")  # the ledger and entry id an entry's header starts with
_HEADER_SIZE = ENTRY_HEADER.size


@dataclass(frozen=True, slots=True)
class _Add:
    """An :data:`AddItem` as an :class:`AddRequest` (the per-add callback forms)."""

    ledger_id: int
    entry_id: int
    master_key: bytes
    data: bytes
    recovery: bool
    ctx: Any


def _resolve(err: BaseException | None, fut: Future[Any]) -> None:
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(_as_walkit_error(err))


@dataclass(frozen=True)
class BookieFailure:
    """What made a bookie failed: the directory (journal or ledger), the error, when."""

    directory: str
    error: BaseException
    since: float  # time.time()

    def describe(self) -> dict[str, Any]:
        """As ``/api/v1/bookie/info`` shows it."""
        return {"directory": self.directory, "error": str(self.error),
                "errno": getattr(self.error, "errno", None), "since": self.since}


class _StorageReplay:
    """Journal replay applies records straight to ledger storage; the storage is flushed
    whenever its write cache holds ``cache_bytes`` (a long journal replayed does not sit
    in memory whole; no mark is written, so a crash meanwhile replays from the same mark,
    and re-adds overwrite)."""

    def __init__(self, storage: LedgerStorage, cache_bytes: int) -> None:
        self.s = storage
        self.cache_bytes = cache_bytes
        self.flushes = 0

    def replay_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        self.s.add_entry(ledger_id, entry_id, data)
        if self.s.cached_bytes() >= self.cache_bytes:
            try:
                self.s.flush()
            except OSError as exc:
                if not is_no_space(exc):
                    raise
                self.cache_bytes = _BY_COUNT  # a full disk: the rest waits in memory for the first checkpoint
            else:
                self.flushes += 1

    def replay_master_key(self, ledger_id: int, key: bytes) -> None:
        self.s.set_master_key(ledger_id, key)

    def replay_fence(self, ledger_id: int) -> None:
        self.s.set_fenced(ledger_id)

    def replay_lac(self, ledger_id: int, lac: int) -> None:
        current = self.s.explicit_lac(ledger_id)
        self.s.set_explicit_lac(ledger_id, lac if current is None else max(lac, current))


_LAST_LACS = 4096  # ledgers whose last entry's LAC read_lac remembers (forgotten all at once past it)
_BY_COUNT = 1 << 40  # a read-ahead's byte bound when dbStorage_readAheadCacheBatchBytesSize <= 0: none


class Bookie:
    """A storage server's core, without the network (``bookie.server`` calls this)."""

    def __init__(self, config: BookieConfig, *, fs: FileSystem | None = None, instance_id: str | None = None,
                 metadata: GcMetadata | None = None, disk_usage: Callable[[str], float] | None = None,
                 marked: Callable[[int], bool] | None = None) -> None:
        """``metadata`` (the cluster's ledger manager) lets garbage collection remove
        ledgers deleted from the cluster; ``disk_usage(dir)`` (default: the file
        system's) is the fraction of a ledger disk in use, which pauses compaction;
        ``marked(ledger)`` tells a ledger under re-replication (kept by GC)."""
        if fs is None:
            from bookie.fs.real import RealFS

            fs = RealFS()
        self.config = config
        self.fs = fs
        self.instance_id = instance_id
        self.cookie: Cookie | None = None
        #: Runs before empty disks are stamped as this bookie's (the server's may refuse them).
        self.before_stamp: Callable[[], None] = lambda: None
        self.replay_report: ReplayReport | None = None
        #: storage flushes during the last start's journal replay (each time the write cache filled)
        self.replay_flushes = 0
        self._lock = threading.Lock()
        self._ckpt_lock = threading.Lock()
        self.checkpoints = 0  # checkpoints done, and how long each took (bookie/_metrics.py)
        self.checkpoint_seconds = Histogram(LATENCY_BUCKETS)
        self.placements = 0  # a full write cache placed between checkpoints (the checkpoint thread only)
        self._ckpt_wake = threading.Event()
        self._ckpt_thread: threading.Thread | None = None
        self._pending = 0
        self._write_cache_bytes = self.config.write_cache_max_size_mb << 20
        self._running = False
        self._max_entry_size = min(config.netty_max_frame_size_bytes, MAX_ENTRY_SIZE)
        self._storage: LedgerStorage | None = None
        self._records: LedgerRecords | None = None
        self._journal: Journal | None = None
        self._metadata = metadata
        self._marked = marked
        self._disk_usage = disk_usage or fs.disk_usage
        self._gc: GarbageCollector | None = None
        #: Called (on the GC thread) after garbage collection gave disk space back.
        self.on_space_freed: Callable[[], None] | None = None
        #: The I/O error that made this bookie failed, once one did (see the module docstring).
        self.failure: BookieFailure | None = None
        #: ``on_failed(failure)``: called once, on the thread that met the error.
        self.on_failed: Callable[[BookieFailure], None] | None = None
        #: ``on_no_space(directory, error)``: a write found that directory's disk full.
        self.on_no_space: Callable[[str, BaseException], None] | None = None
        self._ckpt_no_space = False  # the last checkpoint found a disk full (logged once)
        self._failure_lock = threading.Lock()
        self._mark_failed = False  # writing lastMark met an I/O error: no more checkpoints
        #: ledger -> (its last stored entry, the LAC that entry carries): read_lac's memory
        self._last_lacs: dict[int, tuple[int, int]] = {}

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        c, fs = self.config, self.fs
        for d in [c.journal_directory, *c.ledger_directories]:
            fs.makedirs(d)
        self.cookie = check_or_write_cookies(
            fs, c.effective_bookie_id, c.journal_directory, list(c.ledger_directories), self.instance_id,
            self.before_stamp,
        )
        self._storage = LedgerStorage(
            fs, list(c.ledger_directories), entry_log_size_limit=c.entry_log_size_limit,
            open_index_files=c.open_file_limit, read_ahead_cache_bytes=c.read_ahead_cache_max_size_mb << 20,
            read_ahead_batch=c.read_ahead_cache_batch_size,
            read_ahead_batch_bytes=c.read_ahead_cache_batch_bytes_size if c.read_ahead_cache_batch_bytes_size > 0
            else _BY_COUNT, recent_writes_bytes=c.recent_writes_cache_max_size_mb << 20,
            write_cache_bytes=self._write_cache_bytes, placement_sync_bytes=c.flush_entrylog_bytes,
            slot_log_bytes=c.index_slot_log_max_size_mb << 20,
        )
        self._storage.open()
        self._storage.on_failure = lambda exc: self._failed(self._where(exc, c.ledger_directories), exc)
        self._storage.on_no_space = lambda exc: self._no_space(self._where(exc, c.ledger_directories), exc)
        self._records = LedgerRecords(self._storage)
        mark = highest_mark(fs, list(c.ledger_directories))
        applier = _StorageReplay(self._storage, self._write_cache_bytes)
        self.replay_report = replay(fs, c.journal_directory, mark, applier)
        self.replay_flushes = applier.flushes
        log.info(
            "bookie %s replayed %d records (%d entries) from %s, torn tails: %d, storage flushed %d times meanwhile",
            c.effective_bookie_id, self.replay_report.records, self.replay_report.entries, mark,
            len(self.replay_report.torn), applier.flushes, extra=context(bookie=c.effective_bookie_id),
        )
        self._journal = Journal(fs, _journal_config(c))
        self._journal.on_failure = lambda exc: self._failed(c.journal_directory, exc)
        self._journal.on_no_space = lambda exc: self._no_space(c.journal_directory, exc)
        self._journal.start(min_id=mark.journal_id + 1 if mark is not None else 1)
        self._running = True
        self._first_checkpoint()
        self._ckpt_thread = threading.Thread(target=self._checkpoint_loop, name="bookie-checkpoint", daemon=True)
        self._ckpt_thread.start()
        self._gc = GarbageCollector(self._storage, c, c.effective_bookie_id, metadata=self._metadata,
                                    delete_ledger=self.delete_ledger, disk_usage=self._disk_usage,
                                    on_freed=self._space_freed, marked=self._marked)
        self._gc.start()

    def _first_checkpoint(self) -> None:
        """The checkpoint at start. A full ledger disk does not stop the start: the
        journal keeps what could not be flushed, the checkpoint loop tries again, and
        the disk was reported full (``on_no_space``: the server starts read-only)."""
        try:
            self.checkpoint()
        except OSError as exc:
            if not is_no_space(exc):
                raise
            self._ckpt_no_space = True
            log.warning("bookie %s: no space for the checkpoint at start (%s); started anyway: the journal is"
                        " kept until a checkpoint succeeds", self.config.effective_bookie_id, exc,
                        extra=context(bookie=self.config.effective_bookie_id))

    def shutdown(self) -> None:
        """Complete every add already accepted, checkpoint, and close the storage."""
        if not self._running:
            return
        if self._gc is not None:
            self._gc.stop()  # a compaction in progress flushes its copies and continues after restart
        with self._lock:
            self._running = False
        self._ckpt_wake.set()
        if self._ckpt_thread is not None:
            self._ckpt_thread.join()
        journal, storage = self._journal, self._storage
        assert journal is not None and storage is not None
        journal.shutdown()
        try:
            if journal.failed is None and storage.failure is None and not self._mark_failed:
                self._checkpoint_now()
        except OSError as exc:
            if not is_no_space(exc):
                raise  # the journal keeps what the checkpoint could not flush (replayed at the start)
            log.warning("bookie %s: no space for the last checkpoint; the next start replays the journal: %s",
                        self.config.effective_bookie_id, exc, extra=context(bookie=self.config.effective_bookie_id))
        finally:
            self._close_storage(storage)

    def _close_storage(self, storage: LedgerStorage) -> None:
        try:
            storage.close()
        except OSError as exc:
            if not is_no_space(exc):
                raise
            log.warning("bookie %s: ledger storage closed without its last flush (disk full); the next start "
                        "replays the journal: %s", self.config.effective_bookie_id, exc,
                        extra=context(bookie=self.config.effective_bookie_id))

    def __enter__(self) -> Bookie:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def storage(self) -> LedgerStorage:
        if self._storage is None:
            raise BookieShutdownError("bookie not started", bookie=self.config.effective_bookie_id)
        return self._storage

    @property
    def gc(self) -> GarbageCollector:
        """The garbage collector (``request()`` a pass, ``status()``)."""
        if self._gc is None:
            raise BookieShutdownError("bookie not started", bookie=self.config.effective_bookie_id)
        return self._gc

    def _space_freed(self) -> None:
        if self.on_space_freed is not None:
            self.on_space_freed()

    # --- disk faults ----------------------------------------------------------------------
    @staticmethod
    def _where(exc: BaseException, directories: tuple[str, ...] | list[str]) -> str:
        """The ledger directory an error happened in (all of them when its path is unknown)."""
        path = getattr(exc, "filename", None)
        if isinstance(path, str):
            for d in directories:
                if path == d or path.startswith(d.rstrip("/") + "/"):
                    return d
        return ",".join(directories)

    def _failed(self, directory: str, exc: BaseException) -> None:
        """An I/O error failed the journal or the storage: the bookie is failed for good."""
        with self._failure_lock:  # not the bookie lock: a failing add holds it while storage reports
            if self.failure is not None:
                return
            self.failure = BookieFailure(directory, exc, time.time())
        log.error("bookie %s failed: I/O error in %s: %s; it stays read-only (reads are served) until restarted,"
                  " and the restart replays the journal to find out what is durable",
                  self.config.effective_bookie_id, directory, exc,
                  extra=context(bookie=self.config.effective_bookie_id, directory=directory))
        if self.on_failed is not None:
            self.on_failed(self.failure)

    def _no_space(self, directory: str, exc: BaseException) -> None:
        if self.on_no_space is not None:
            self.on_no_space(directory, exc)

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            raise BookieShutdownError("bookie not started", bookie=self.config.effective_bookie_id)
        return self._journal

    @property
    def records(self) -> LedgerRecords:
        """Ledger state records in flight (:mod:`bookie._records`)."""
        if self._records is None:
            raise BookieShutdownError("bookie not started", bookie=self.config.effective_bookie_id)
        return self._records

    # --- writes ---------------------------------------------------------------------------
    # Each write exists twice: ``*_cb(..., cb, ctx)`` calls ``cb(err, ctx)`` exactly once
    # (on the journal's sync thread once durable, or at once on a refusal) - the server's
    # hot path, without a Future per request; the plain form returns a Future.

    def add_entry_cb(self, ledger_id: int, entry_id: int, master_key: bytes, payload: bytes, recovery: bool,
                     cb: Callback, ctx: Any) -> None:
        """Store an entry; ``cb`` once it is durable (journal fdatasync) or refused."""
        self.add_entries_cb([(ledger_id, entry_id, master_key, payload, recovery, ctx)], cb)

    def add_entries_cb(self, adds: list[AddItem], cb: Callback) -> None:
        """Store several entries - ``(ledger id, entry id, master key, payload, recovery,
        ctx)`` each - as :meth:`add_batch_cb` does, but ``cb(err, ctx)`` is called once
        per add: when it is durable, or at once when it is refused."""

        def each(err: BaseException | None, group: list[_Add]) -> None:
            for add in group:
                cb(err, add.ctx)

        self.add_batch_cb([_Add(*add) for add in adds], each)

    def add_batch_cb(self, adds: list[A], cb: BatchCallback[A], *, defer: bool = False) -> None:
        """Store several entries (e.g. the adds of one received chunk; anything with the
        fields of an ADD_ENTRY request: ``ledger_id``, ``entry_id``, ``master_key``,
        ``data``, ``recovery``), taking the bookie, storage and journal locks once for
        all of them. Each add is checked as a single one would be and a refusal affects
        no other add; every add is handed to ``cb(err, group)`` exactly once: the
        admitted ones together, in order, once the journal's fdatasync covering them
        returned (``err`` None; or the journal's error), each refused one on its own
        (``[add]``) at once, after the bookie lock is released. ``defer``: the caller
        will call :meth:`kick_journal` once it has submitted what it has for now (the
        event loop, once per iteration), instead of the journal thread being woken."""
        refused: list[tuple[BaseException, A]] = []
        with self._lock:
            stored = self._store_batch(adds, refused, cb, defer)
        if stored:
            self._count_pending(stored)
        for err, add in refused:
            cb(err, [add])

    def _store_batch(self, adds: list[A], refused: list[tuple[BaseException, A]], cb: BatchCallback[A],
                     defer: bool) -> int:
        """Under the bookie lock: admit each add (arguments, entry header, master key,
        fence), put the admitted ones in storage, then journal them - the master keys
        seen for the first time, then the entries, in order, all framed at once, with one
        callback for the group. Refusals go to ``refused``; returns how many adds were
        handed to the journal."""
        if not self._running:
            exc = BookieShutdownError("bookie is not running", bookie=self.config.effective_bookie_id)
            refused.extend((exc, add) for add in adds)
            return 0
        records: list[Record] = []
        admitted, entries = self._admit_batch(adds, refused, records)
        if admitted:
            failed = self.storage.add_entries(entries)
            if failed:
                bad = {i for i, _ in failed}
                refused.extend((_as_walkit_error(exc), admitted[i]) for i, exc in failed)
                admitted = [add for i, add in enumerate(admitted) if i not in bad]
                entries = [entry for i, entry in enumerate(entries) if i not in bad]
        if not admitted:  # the key records of refused adds are not journaled
            self.records.drop(records, BookieShutdownError("no add admitted: the key record was not journaled"))
            return 0
        try:
            self.journal.log_entries(entries, cb, admitted, records, defer=defer)
        except (WalkitError, OSError) as exc:
            err = _as_walkit_error(exc)
            self.records.drop(records, err)
            refused.extend((err, add) for add in admitted)
            return 0
        return len(admitted)

    def _admit_batch(self, adds: list[A], refused: list[tuple[BaseException, A]],
                     records: list[Record]) -> tuple[list[A], list[tuple[int, int, bytes]]]:
        """The adds that pass every check, and their ``(ledger id, entry id, payload)``
        for storage and journal. One combined test per add; only an add that fails it
        goes through the checks that name the fault (:meth:`_check_ledger`,
        :meth:`_check_entry`, which refuse it - or pass it, e.g. an ``int`` subclass).
        The key and fence of a ledger are looked up once per run of adds of that ledger
        with the same key (only this thread can add to them meanwhile: the bookie lock is
        held); a batch that spans ledgers looks them all up at once first."""
        admitted: list[A] = []
        entries: list[tuple[int, int, bytes]] = []
        first = adds[0].ledger_id if adds else -1
        seen: dict[int, LedgerView] = {} if all(add.ledger_id == first for add in adds) else \
            self.records.look_many({add.ledger_id for add in adds if type(add.ledger_id) is int})
        max_size, header_ids = self._max_entry_size, _HEADER_IDS.unpack_from
        last_ledger, last_key, fenced = -1, b"", False
        for add in adds:
            ledger_id, entry_id, key, data = add.ledger_id, add.entry_id, add.master_key, add.data
            try:
                if not (
                    type(ledger_id) is int and type(entry_id) is int and type(key) is bytes and type(data) is bytes
                    and 0 <= ledger_id <= _MAX_LEDGER_ID and 0 <= entry_id <= MAX_ENTRY_ID
                    and 0 < len(key) <= _MAX_KEY and _HEADER_SIZE <= len(data) <= max_size
                    and header_ids(data) == (ledger_id, entry_id)
                ):
                    self._check_ledger(ledger_id, key)
                    self._check_entry(ledger_id, entry_id, data)
                if ledger_id != last_ledger or key != last_key:
                    last_ledger = -1
                    fenced = self._admit_key(ledger_id, key, seen, records)
                    last_ledger, last_key = ledger_id, key
                if fenced and not add.recovery:
                    raise LedgerFencedError("ledger is fenced", ledger=ledger_id, entry=entry_id)
            except (WalkitError, OSError) as exc:
                refused.append((_as_walkit_error(exc), add))
                continue
            admitted.append(add)
            entries.append((ledger_id, entry_id, data))
        return admitted, entries

    def add_entry(
        self, ledger_id: int, entry_id: int, master_key: bytes, payload: bytes, recovery: bool = False
    ) -> Future[None]:
        fut: Future[None] = Future()
        self.add_entry_cb(ledger_id, entry_id, master_key, payload, recovery, _resolve, fut)
        return fut

    def fence_cb(self, ledger_id: int, master_key: bytes, cb: Callback, ctx: Any) -> None:
        """Fence a ledger; ``cb`` when the fence is durable (then it is in storage).
        Normal adds are refused from the moment the FENCE record is framed; a fence the
        journal refuses (a full disk) leaves the ledger as it was, and ``cb`` gets the
        error. Creates the ledger's state when this bookie has never seen it, so a late
        add from the old writer is refused."""
        self._keyed_write(ledger_id, master_key, lambda: self.records.fence_record(ledger_id, cb, ctx), cb, ctx)

    def fence(self, ledger_id: int, master_key: bytes) -> Future[None]:
        fut: Future[None] = Future()
        self.fence_cb(ledger_id, master_key, _resolve, fut)
        return fut

    def kick_journal(self, inline: bool) -> None:
        """Flush the adds submitted with ``defer`` (:meth:`bookie.journal.Journal.kick`):
        on this thread when the journal is idle and ``inline``, else by its threads.
        Not under the bookie lock: an inline flush runs the adds' callbacks here."""
        self.journal.kick(inline)

    def write_lac_cb(self, ledger_id: int, master_key: bytes, lac: int, cb: Callback, ctx: Any) -> None:
        """Record an explicit LAC (a writer's LAC that rode on no entry yet); it is in
        storage (``read_lac``) once durable, before ``cb``."""
        try:
            self._check_lac(ledger_id, lac)
        except InvalidArgumentError as exc:
            cb(exc, ctx)
            return
        self._keyed_write(ledger_id, master_key, lambda: self.records.lac_record(ledger_id, lac, cb, ctx), cb, ctx)

    def publish_lac(self, ledger_id: int, master_key: bytes, lac: int) -> bool:
        """Record an explicit LAC without waiting for the journal: it is in storage
        (``read_lac``) when this returns (unless the storage failed) and its record rides
        on the next flush
        (:meth:`bookie._records.LedgerRecords.publish_lac` says why that is safe). Only
        for a ledger whose key is durable here: False, with nothing done, for any other
        (the caller takes :meth:`write_lac_cb`, which journals the key first). Raises
        UnauthorizedError for another key, InvalidArgumentError for an id or LAC out of
        range, BookieShutdownError (or the journal's error) when it cannot take the record."""
        self._check_ledger(ledger_id, master_key)
        self._check_lac(ledger_id, lac)
        self._check_running()
        key, durable, _ = self.records.look(ledger_id)
        if key is None or not durable:
            return False
        if key != master_key:
            raise UnauthorizedError("master key does not match", ledger=ledger_id)
        with self._lock:
            self._check_running()
            self.journal.log_records([(LAC_RECORD, ledger_id, lac, b"", None, None)], defer=True)
        self.records.publish_lac(ledger_id, lac)
        return True

    def write_lac(self, ledger_id: int, master_key: bytes, lac: int) -> Future[None]:
        fut: Future[None] = Future()
        self.write_lac_cb(ledger_id, master_key, lac, _resolve, fut)
        return fut

    def _keyed_write(self, ledger_id: int, master_key: bytes, record: Callable[[], Record], cb: Callback,
                     ctx: Any) -> None:
        """Check the key, then journal ``record()`` (whose callback answers ``cb``) -
        after the ledger's MASTER_KEY record when its key is not durable yet - under the
        bookie lock. ``cb`` is called exactly once; errors never escape the call."""
        try:
            self._check_ledger(ledger_id, master_key)
            with self._lock:
                self._check_running()
                records: list[Record] = []
                self._admit_key(ledger_id, master_key, None, records)
                records.append(record())
                error = self._log_records(records)
        except (WalkitError, OSError) as exc:  # refused before any record was made
            cb(_as_walkit_error(exc), ctx)
            return
        if error is not None:
            self.records.drop(records, error)  # outside the lock: ``cb`` may add again

    def _log_records(self, records: list[Record]) -> WalkitError | None:
        """Journal the records; the error when the journal took none of them."""
        try:
            self.journal.log_records(records)
            return None
        except (WalkitError, OSError) as exc:
            return _as_walkit_error(exc)

    def _admit_key(self, ledger_id: int, master_key: bytes, seen: dict[int, LedgerView] | None,
                   records: list[Record]) -> bool:
        """Refuse a key other than the ledger's; return whether the ledger is fenced (or a
        fence is on its way). The ledger's first key - and a key not durable yet - is
        appended to ``records`` as a MASTER_KEY record, for the caller to journal or
        :meth:`LedgerRecords.drop`. ``seen`` (given for a batch of adds, whose entries
        go to storage with the key) remembers each ledger's state across the adds of the
        batch (the bookie lock is held), so a batch looks at a ledger once and journals
        its key once."""
        state = seen.get(ledger_id) if seen is not None else None
        if state is None:
            state = self.records.look(ledger_id)
        key, durable, fenced = state
        if key is None or (not durable and key == master_key):
            records.append(self.records.key_record(ledger_id, master_key, with_entries=seen is not None))
            state = (master_key, True, fenced)  # journaled with this batch: once is enough
        elif key != master_key:
            raise UnauthorizedError("master key does not match", ledger=ledger_id)
        if seen is not None:
            seen[ledger_id] = state
        return fenced

    # --- reads ------------------------------------------------------------------------------
    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """An entry as it was added (``LAST_ENTRY``: the highest stored one)."""
        s = self.storage
        if not s.has_ledger(ledger_id):
            raise NoSuchLedgerError("ledger not on this bookie", ledger=ledger_id, bookie=self.config.effective_bookie_id)
        if entry_id == LAST_ENTRY:
            entry_id = s.last_entry_id(ledger_id)
        return s.get_entry(ledger_id, entry_id)

    def read_entries(self, ledger_id: int, first: int, count: int, max_bytes: int) -> list[bytes]:
        """The stored entries ``first``, ``first + 1``, ... as they were added: at most
        ``count``, ending before the first one not stored and before the one that would
        take their bytes past ``max_bytes`` (the first always;
        :meth:`bookie.storage.LedgerStorage.get_entries`)."""
        s = self.storage
        if not s.has_ledger(ledger_id):
            raise NoSuchLedgerError("ledger not on this bookie", ledger=ledger_id, bookie=self.config.effective_bookie_id)
        return s.get_entries(ledger_id, first, count, max_bytes)

    def read_lac(self, ledger_id: int) -> int:
        """max(explicit LAC, the LAC carried by the last stored entry); -1 when none. The
        last entry's LAC is remembered per ledger while that entry stays the last (an
        entry never changes once stored), so a read's answer, which carries the LAC,
        costs no second entry read."""
        s = self.storage
        if not s.has_ledger(ledger_id):
            raise NoSuchLedgerError("ledger not on this bookie", ledger=ledger_id, bookie=self.config.effective_bookie_id)
        last = s.last_entry_id(ledger_id)
        if last < 0:
            return self._lac(ledger_id, None)
        known = self._last_lacs.get(ledger_id)
        if known is None or known[0] != last:
            known = (last, parse_entry_header(s.get_entry(ledger_id, last)).lac)
            if len(self._last_lacs) >= _LAST_LACS:
                self._last_lacs.clear()
            self._last_lacs[ledger_id] = known
        explicit = s.explicit_lac(ledger_id)
        return known[1] if explicit is None else max(explicit, known[1])

    def _lac(self, ledger_id: int, last_entry: bytes | None) -> int:
        explicit = self.storage.explicit_lac(ledger_id)
        lac = -1 if explicit is None else explicit
        return lac if last_entry is None else max(lac, parse_entry_header(last_entry).lac)

    def read_recent(self, ledger_id: int, entry_id: int) -> tuple[int, bytes, int] | None:
        """``(entry id, entry, LAC)`` from memory alone - when the entry (``LAST_ENTRY`` or
        one not stored yet: the last one stored) and the ledger's last entry, which carries the LAC, are both
        still in their entry log's write buffer, as a just-written one is - else None:
        :meth:`read_entry` and :meth:`read_lac`, which may wait for the disk, answer it.
        For an event loop answering a tailing reader without a thread hand-off."""
        s = self.storage
        try:
            last = s.last_entry_id(ledger_id)
            if entry_id == LAST_ENTRY or entry_id > last:  # one not here yet: the last, as the slow path
                entry_id = last
            if last < 0:
                return None
            data = s.memory_entry(ledger_id, entry_id)
            lac = None if data is None else self._memory_lac(ledger_id, last, entry_id, data)
            return None if data is None or lac is None else (entry_id, data, lac)
        except WalkitError:  # not stored, storage closed: the slow path gives the answer
            return None

    def read_memory(self, ledger_id: int, entry_id: int) -> tuple[bytes, int] | None:
        """``(entry, LAC)`` for a READ_ENTRY of a stored ``entry_id`` from memory alone - the
        entry in its log's write buffer or read ahead, and a LAC known without a read
        (the last entry's, remembered by :meth:`read_lac`, or that entry in memory too) -
        else None: :meth:`read_entry` and :meth:`read_lac`, which may wait for the disk,
        answer it. For the event loop: a reader going entry by entry through a ledger is
        answered without a hand-off to the read pool."""
        s = self.storage
        try:
            data = s.memory_entry(ledger_id, entry_id)
            lac = None if data is None else self._memory_lac(ledger_id, s.last_entry_id(ledger_id), entry_id, data)
            return None if data is None or lac is None else (data, lac)
        except WalkitError:  # not stored, storage closed: the slow path gives the answer
            return None

    def _memory_lac(self, ledger_id: int, last: int, entry_id: int, data: bytes) -> int | None:
        """What :meth:`read_lac` answers, when memory knows it: the LAC of the ledger's
        last entry ``last`` - remembered, or that entry in memory (``data`` when it is
        ``entry_id``) - raised to the explicit LAC; None when only a read would tell."""
        known = self._last_lacs.get(ledger_id)
        if known is not None and known[0] == last:
            carried = known[1]
        else:
            last_data = data if entry_id == last else self.storage.memory_entry(ledger_id, last)
            if last_data is None:
                return None
            carried = parse_entry_header(last_data).lac
        explicit = self.storage.explicit_lac(ledger_id)
        return carried if explicit is None else max(explicit, carried)

    def is_fenced(self, ledger_id: int) -> bool:
        """Whether normal adds are refused: a fence of the ledger is durable, or on its
        way to the journal (and forgotten if the journal refuses it)."""
        return self.records.look(ledger_id)[2]

    def ledgers(self) -> list[int]:
        return self.storage.ledgers()

    def delete_ledger(self, ledger_id: int) -> None:
        """Forget a ledger (garbage collection calls this). Not under the bookie lock:
        the storage may wait for a checkpoint's flush here, and adds must not wait with
        it; an add racing the deletion at most re-creates the ledger, which is deleted
        in metadata and so collected again by the next pass."""
        self.storage.delete_ledger(ledger_id)
        self._last_lacs.pop(ledger_id, None)

    # --- checkpoints ------------------------------------------------------------------------
    def checkpoint(self) -> LogMark:
        """Flush storage and advance the LastLogMark; returns the new mark."""
        with self._lock:
            self._check_running()
        return self._checkpoint_now()

    def _checkpoint_now(self) -> LogMark:
        with self._ckpt_lock:
            started = time.monotonic()
            mark = self.journal.settled_mark()
            self._pending = 0
            self.storage.flush()
            self._write_mark(mark)
            self.journal.gc(mark)
            self.checkpoints += 1  # under the checkpoint lock: one writer (walkit.metrics)
            self.checkpoint_seconds.observe(time.monotonic() - started)
            return mark

    def _write_mark(self, mark: LogMark) -> None:
        """Write the mark in every ledger directory; an I/O error there (not a full disk)
        fails the bookie as a storage error does: its disk is failing. A full disk is
        reported (``on_no_space``) as any write that meets one."""
        dirs = list(self.config.ledger_directories)
        try:
            write_mark(self.fs, dirs, mark)
        except OSError as exc:
            if is_no_space(exc):
                self._no_space(self._where(exc, dirs), exc)
            else:
                self._mark_failed = True
                self._failed(self._where(exc, dirs), exc)
            raise

    def _count_pending(self, n: int) -> None:
        """``n`` more entries wait in memory: a checkpoint starts early once they are
        ``flushEntriesThreshold`` many; the write cache is placed once it holds
        ``dbStorage_writeCacheMaxSizeMb``."""
        self._pending += n
        if self._pending >= self.config.flush_entries_threshold \
                or self.storage.cached_bytes() >= self._write_cache_bytes:
            self._ckpt_wake.set()

    def _checkpoint_loop(self) -> None:
        interval = self.config.flush_interval / 1000.0
        last = time.monotonic()  # the last checkpoint (or attempt)
        while True:
            self._ckpt_wake.wait(max(0.0, last + interval - time.monotonic()))
            self._ckpt_wake.clear()
            if not self._running:
                return
            if self._mark_failed or (self._storage is not None and self._storage.failure is not None):
                last = time.monotonic()
                continue  # a failed storage (or mark) flushes nothing more: the mark stays where it is
            try:
                if self._pending < self.config.flush_entries_threshold and time.monotonic() - last < interval:
                    self.storage.place()  # woken by a full write cache: placed, not checkpointed
                    self.placements += 1
                    continue
                last = time.monotonic()
                self._checkpoint_now()
                self._ckpt_no_space = False
            except OSError as exc:
                if not is_no_space(exc):
                    log.exception("checkpoint failed; journals are kept until one succeeds")
                elif not self._ckpt_no_space:
                    self._ckpt_no_space = True
                    log.warning("checkpoint: a disk is full (%s); entries wait in memory and the journal is kept"
                                " until a checkpoint succeeds", exc,
                                extra=context(bookie=self.config.effective_bookie_id))
            except Exception:  # noqa: BLE001 - report and retry at the next interval
                log.exception("checkpoint failed; journals are kept until one succeeds")

    # --- checks -----------------------------------------------------------------------------
    def _check_running(self) -> None:
        if not self._running:
            raise BookieShutdownError("bookie is not running", bookie=self.config.effective_bookie_id)

    def _check_ledger(self, ledger_id: int, master_key: bytes) -> None:
        if not isinstance(ledger_id, int) or not 0 <= ledger_id <= _MAX_LEDGER_ID:
            raise InvalidArgumentError("ledger id out of range", ledger=ledger_id)
        if not isinstance(master_key, bytes) or not 0 < len(master_key) <= _MAX_KEY:
            raise InvalidArgumentError("master key must be 1..64 bytes", ledger=ledger_id)

    @staticmethod
    def _check_lac(ledger_id: int, lac: int) -> None:
        if not isinstance(lac, int) or not -1 <= lac <= _MAX_LEDGER_ID:
            raise InvalidArgumentError("explicit LAC out of range", ledger=ledger_id, lac=lac)

    def _check_entry(self, ledger_id: int, entry_id: int, payload: bytes) -> None:
        if not isinstance(entry_id, int) or not 0 <= entry_id <= MAX_ENTRY_ID:
            raise InvalidArgumentError("entry id out of range", ledger=ledger_id, entry=entry_id, max=MAX_ENTRY_ID)
        if len(payload) > self._max_entry_size:
            raise EntryTooLargeError(
                "entry too large", ledger=ledger_id, entry=entry_id, size=len(payload), limit=self._max_entry_size
            )
        header = parse_entry_header(payload)
        if header.ledger_id != ledger_id or header.entry_id != entry_id:
            raise InvalidArgumentError(
                "entry header names another entry", ledger=ledger_id, entry=entry_id,
                header_ledger=header.ledger_id, header_entry=header.entry_id,
            )
