"""The bookie core: ledger storage behind a journal, with checkpoints and restart.

Theory of operation
-------------------
:class:`Bookie` owns the bookie's lifecycle (start, shutdown) and its write path; the
rest is in modules of their own, each with its argument: admission of adds and keyed
writes (:mod:`bookie._admission`), ledger state records on their way to the journal
(:mod:`bookie._records`), reads (:mod:`bookie._reads`), checkpoints
(:mod:`bookie._checkpoints`), restart - storage opened and the journal replayed into it
(:mod:`bookie._restart`) - and disk faults (:mod:`bookie._faults`).

*Add*: check the master key (journaled on the ledger's first add or fence; a different
key is refused with ``UnauthorizedError``) and the fence (``LedgerFencedError`` unless it
is a recovery add), put the entry in ledger storage (memory), then hand it to the
journal - storage first, so that every record behind the journal's settled mark is in
storage, which is what a checkpoint relies on (:mod:`bookie._checkpoints`). The returned
future completes when the journal's fdatasync covering the entry returned - that is
what makes an acknowledgement durable. The server hands over
the adds of one received chunk together (:meth:`Bookie.add_batch_cb`): every check is
still made per add and a refusal touches that add only, but the bookie, storage and
journal locks are taken once for the batch - first all admitted entries go to storage,
then their records (new master keys first) are framed into the journal in one call,
with one callback for the admitted group (they share one flush, so one fdatasync makes
them all durable). The single-add and per-add-callback forms are built on it. The
bookie lock is held from admission to framing, and every record (entries, keys,
fences, LACs) is framed under it, so what admission decided still holds when the
journal takes the records.

*Fence*: journal a FENCE record, answer when it is durable; from the moment it is framed
normal adds are refused, for good once it is durable (the flag survives restarts by
replay or checkpoint). A ledger's state - fence, explicit LAC, master key - reaches
ledger storage only once its record is durable (a master key that comes with entries:
with them, taken back if its record is refused; an explicit LAC published by
:meth:`Bookie.publish_lac`: at once, since it is true whatever becomes of its record),
so memory and journal agree even when the journal refuses the record for a full disk:
the requester gets the error and the ledger's state is as if the request never came
(:mod:`bookie._records`).

*Checkpoint* (:mod:`bookie._checkpoints`): storage flushed up to the journal's settled
mark, the mark written, journal files behind it deleted. *Restart*
(:mod:`bookie._restart`): cookies, storage, journal replay from the highest mark, a new
journal file and a checkpoint at once. *Disk faults* (:mod:`bookie._faults`): an I/O
error makes the bookie failed (read-only until restarted), a full disk only waits.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from bookie._admission import A, AddRequest, admit_batch, admit_key, check_lac, check_ledger
from bookie._checkpoints import Checkpoints
from bookie._config import BookieConfig
from bookie._faults import BookieFailure, DiskFaults, as_walkit_error, where
from bookie._reads import LAST_ENTRY, Reads
from bookie._records import LedgerRecords
from bookie._restart import journal_config, open_storage, replay_journal
from bookie.cookie import Cookie, check_or_write_cookies
from bookie.fs import FileSystem, is_no_space
from bookie.gc import GarbageCollector, GcMetadata
from bookie.journal import LAC_RECORD, Journal, LogMark, Record, ReplayReport
from bookie.storage import MAX_ENTRY_SIZE, LedgerStorage
from walkit.errors import BookieShutdownError, InvalidArgumentError, UnauthorizedError, WalkitError
from walkit.logs import context
from walkit.metrics import Histogram

__all__ = ["Bookie", "BookieFailure", "LAST_ENTRY", "AddItem", "AddRequest", "BatchCallback"]

log = logging.getLogger("bookie")

Callback = Callable[[BaseException | None, Any], None]
#: One add for :meth:`Bookie.add_entries_cb`: ledger id, entry id, master key, payload, recovery, ctx.
AddItem = tuple[int, int, bytes, bytes, bool, Any]
#: ``cb(error, adds)``: error is None once every add of the group is durable.
BatchCallback = Callable[[BaseException | None, list[A]], None]


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
        fut.set_exception(as_walkit_error(err))


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
        self._faults = DiskFaults(config.effective_bookie_id)
        self._checkpoints = Checkpoints(config, fs, self, self._faults)
        self._reads = Reads(self, config.effective_bookie_id)

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        c, fs = self.config, self.fs
        for d in [c.journal_directory, *c.ledger_directories]:
            fs.makedirs(d)
        self.cookie = check_or_write_cookies(
            fs, c.effective_bookie_id, c.journal_directory, list(c.ledger_directories), self.instance_id,
            self.before_stamp,
        )
        faults = self._faults
        self._storage = open_storage(c, fs)
        self._storage.on_failure = lambda exc: faults.failed(where(exc, c.ledger_directories), exc)
        self._storage.on_no_space = lambda exc: faults.no_space(where(exc, c.ledger_directories), exc)
        self._records = LedgerRecords(self._storage)
        mark, self.replay_report, self.replay_flushes = replay_journal(c, fs, self._storage)
        self._journal = Journal(fs, journal_config(c))
        self._journal.on_failure = lambda exc: faults.failed(c.journal_directory, exc)
        self._journal.on_no_space = lambda exc: faults.no_space(c.journal_directory, exc)
        self._journal.start(min_id=mark.journal_id + 1 if mark is not None else 1)
        self._running = True
        self._checkpoints.at_start()
        self._checkpoints.start()
        self._gc = GarbageCollector(self._storage, c, c.effective_bookie_id, metadata=self._metadata,
                                    delete_ledger=self.delete_ledger, disk_usage=self._disk_usage,
                                    on_freed=self._space_freed, marked=self._marked)
        self._gc.start()

    def shutdown(self) -> None:
        """Complete every add already accepted, checkpoint, and close the storage."""
        if not self._running:
            return
        if self._gc is not None:
            self._gc.stop()  # a compaction in progress flushes its copies and continues after restart
        with self._lock:
            self._running = False
        self._checkpoints.stop()
        journal, storage = self._journal, self._storage
        assert journal is not None and storage is not None
        journal.shutdown()
        try:
            self._checkpoints.at_shutdown()
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

    @property
    def gc(self) -> GarbageCollector:
        """The garbage collector (``request()`` a pass, ``status()``)."""
        if self._gc is None:
            raise BookieShutdownError("bookie not started", bookie=self.config.effective_bookie_id)
        return self._gc

    def _space_freed(self) -> None:
        if self.on_space_freed is not None:
            self.on_space_freed()

    def _check_running(self) -> None:
        if not self._running:
            raise BookieShutdownError("bookie is not running", bookie=self.config.effective_bookie_id)

    # --- disk faults (bookie/_faults.py) ----------------------------------------------------
    @property
    def failure(self) -> BookieFailure | None:
        """The I/O error that made this bookie failed, once one did (:mod:`bookie._faults`)."""
        return self._faults.failure

    @property
    def on_failed(self) -> Callable[[BookieFailure], None] | None:
        """``on_failed(failure)``: called once, on the thread that met the error."""
        return self._faults.on_failed

    @on_failed.setter
    def on_failed(self, hook: Callable[[BookieFailure], None] | None) -> None:
        self._faults.on_failed = hook

    @property
    def on_no_space(self) -> Callable[[str, BaseException], None] | None:
        """``on_no_space(directory, error)``: a write found that directory's disk full."""
        return self._faults.on_no_space

    @on_no_space.setter
    def on_no_space(self, hook: Callable[[str, BaseException], None] | None) -> None:
        self._faults.on_no_space = hook

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
            self._checkpoints.count_pending(stored)
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
        # running: started, so the parts are there (read as attributes, not through the
        # properties that check it again: three calls less per batch)
        ledgers, storage, journal = self._records, self._storage, self._journal
        assert ledgers is not None and storage is not None and journal is not None
        records: list[Record] = []
        admitted, entries = admit_batch(ledgers, adds, self._max_entry_size, refused, records)
        if admitted:
            failed = storage.add_entries(entries)
            if failed:
                bad = {i for i, _ in failed}
                refused.extend((as_walkit_error(exc), admitted[i]) for i, exc in failed)
                admitted = [add for i, add in enumerate(admitted) if i not in bad]
                entries = [entry for i, entry in enumerate(entries) if i not in bad]
        if not admitted:  # the key records of refused adds are not journaled
            ledgers.drop(records, BookieShutdownError("no add admitted: the key record was not journaled"))
            return 0
        try:
            journal.log_entries(entries, cb, admitted, records, defer=defer)
        except (WalkitError, OSError) as exc:
            err = as_walkit_error(exc)
            ledgers.drop(records, err)
            refused.extend((err, add) for add in admitted)
            return 0
        return len(admitted)

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
        journal = self._journal
        (journal if journal is not None else self.journal).kick(inline)  # the property raises when not started

    def write_lac_cb(self, ledger_id: int, master_key: bytes, lac: int, cb: Callback, ctx: Any) -> None:
        """Record an explicit LAC (a writer's LAC that rode on no entry yet); it is in
        storage (``read_lac``) once durable, before ``cb``."""
        try:
            check_lac(ledger_id, lac)
        except InvalidArgumentError as exc:
            cb(exc, ctx)
            return
        self._keyed_write(ledger_id, master_key, lambda: self.records.lac_record(ledger_id, lac, cb, ctx), cb, ctx)

    def publish_lac(self, ledger_id: int, master_key: bytes, lac: int, *, journal: bool = True) -> bool:
        """Record an explicit LAC without waiting for the journal: it is in storage
        (``read_lac``) when this returns (unless the storage failed) and its record rides
        on the next flush - none with ``journal=False``: the LAC an arriving add carries,
        whose entry is its record (bookie/server/_writes.py, ``_publish_carried``)
        (:meth:`bookie._records.LedgerRecords.publish_lac` says why that is safe). Only
        for a ledger whose key is durable here: False, with nothing done, for any other
        (the caller takes :meth:`write_lac_cb`, which journals the key first). Raises
        UnauthorizedError for another key, InvalidArgumentError for an id or LAC out of
        range, BookieShutdownError (or the journal's error) when it cannot take the record."""
        check_ledger(ledger_id, master_key)
        check_lac(ledger_id, lac)
        self._check_running()
        key, durable, _ = self.records.look(ledger_id)
        if key is None or not durable:
            return False
        if key != master_key:
            raise UnauthorizedError("master key does not match", ledger=ledger_id)
        if journal:
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
            check_ledger(ledger_id, master_key)
            with self._lock:
                self._check_running()
                records: list[Record] = []
                admit_key(self.records, ledger_id, master_key, None, records)
                records.append(record())
                error = self._log_records(records)
        except (WalkitError, OSError) as exc:  # refused before any record was made
            cb(as_walkit_error(exc), ctx)
            return
        if error is not None:
            self.records.drop(records, error)  # outside the lock: ``cb`` may add again

    def _log_records(self, records: list[Record]) -> WalkitError | None:
        """Journal the records; the error when the journal took none of them."""
        try:
            self.journal.log_records(records)
            return None
        except (WalkitError, OSError) as exc:
            return as_walkit_error(exc)

    # --- reads (bookie/_reads.py) -----------------------------------------------------------
    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """An entry as it was added (``LAST_ENTRY``: the highest stored one)."""
        return self._reads.read_entry(ledger_id, entry_id)

    def read_entries(self, ledger_id: int, first: int, count: int, max_bytes: int) -> list[bytes]:
        """The stored entries ``first``, ``first + 1``, ... (:meth:`bookie._reads.Reads.read_entries`)."""
        return self._reads.read_entries(ledger_id, first, count, max_bytes)

    def stored_entries(self, ledger_id: int) -> list[int]:
        """The ids of the ledger's stored entries, sorted (:meth:`bookie._reads.Reads.stored_entries`)."""
        return self._reads.stored_entries(ledger_id)

    def read_lac(self, ledger_id: int) -> int:
        """max(explicit LAC, the LAC carried by the last stored entry); -1 when none."""
        return self._reads.read_lac(ledger_id)

    def read_recent(self, ledger_id: int, entry_id: int) -> tuple[int, bytes, int] | None:
        """``(entry id, entry, LAC)`` from memory alone, else None
        (:meth:`bookie._reads.Reads.read_recent`)."""
        return self._reads.read_recent(ledger_id, entry_id)

    def memory_lac(self, ledger_id: int) -> int | None:
        """:meth:`read_lac` from memory alone, else None (:meth:`bookie._reads.Reads.memory_lac`)."""
        return self._reads.memory_lac(ledger_id)

    def read_memory(self, ledger_id: int, entry_id: int) -> tuple[bytes, int] | None:
        """``(entry, LAC)`` of a stored entry from memory alone, else None
        (:meth:`bookie._reads.Reads.read_memory`)."""
        return self._reads.read_memory(ledger_id, entry_id)

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
        self._reads.forget(ledger_id)

    # --- checkpoints (bookie/_checkpoints.py) -----------------------------------------------
    def checkpoint(self) -> LogMark:
        """Flush storage and advance the LastLogMark; returns the new mark."""
        with self._lock:
            self._check_running()
        return self._checkpoints.checkpoint()

    @property
    def checkpoints(self) -> int:
        """Checkpoints done (bookie/_metrics.py)."""
        return self._checkpoints.count

    @property
    def checkpoint_seconds(self) -> Histogram:
        """How long each checkpoint took."""
        return self._checkpoints.seconds

    @property
    def placements(self) -> int:
        """Times a full write cache was placed between checkpoints."""
        return self._checkpoints.placements
