"""The ledger storage's shared state, and its one owner: :class:`StorageShared`.

Theory of operation
-------------------
The ledger storage is a few parts - the lifecycle (:mod:`bookie.storage._storage`), the
add path (:mod:`bookie.storage._adds`), the per-ledger state API
(:mod:`bookie.storage._state`), reads (:mod:`bookie.storage._reads`), placement
(:mod:`bookie.storage._placement`), the flush protocol (:mod:`bookie.storage._flush`),
garbage collection's side (:mod:`bookie.storage._reclaim`) and the open files
(:mod:`bookie.storage._files`) - around one set of in-memory state. That state lives here, in one object every part is
given, so that each of them reads and changes it under the same rules:

Locking rule
    :attr:`~StorageShared.lock` (*the storage lock*) guards :attr:`states`,
    :attr:`dirty`, :attr:`pending`, :attr:`flushing`, :attr:`cache`, :attr:`read_ahead`,
    :attr:`failure`, :attr:`is_open` and every dir's in-memory state (its active log's
    write buffer, rolled logs, usage, slot log). It is held for memory work and for
    writing out a log buffer, never for a sync. :attr:`flush_lock` serialises what
    changes where an entry's location lives - a placement, a flush, a compaction batch,
    a ledger's deletion, open and close - and keeps every log a placement or a flush
    syncs outside the storage lock open meanwhile. Order: the flush lock first, then
    the storage lock; never the other way round. :attr:`recent` and the
    :class:`~bookie.storage._handles.HandleCache` s have locks of their own, taken
    without (or inside) the storage lock.

Where an entry is
    in :attr:`cache` (added since the last placement began), else in :attr:`pending`
    (placed; its location only in RAM), else in :attr:`flushing` (a running flush took
    it and writes it into the index), else in its dir's slot log runs (durable, not in
    the index file yet), else in its index file. A part moves an entry from one to the
    next only under the storage lock, so a reader holding it finds the entry in exactly
    one place, the newest copy first (:meth:`StorageShared.memory_slot`).

Failure
    ``with shared.failing:`` around a write: any error inside but a full disk leaves
    the storage *failed* (:meth:`StorageShared.latch`): writes and flushes raise
    ``StorageError`` until it is reopened, and ``on_failure`` is told once; a full disk
    tells ``on_no_space`` and fails nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

from bookie.fs import FileSystem, is_no_space
from bookie.storage._cache import ReadAheadCache, RecentWrites
from bookie.storage._format import MAX_LEDGER_ID
from bookie.storage._index import LedgerState
from bookie.storage._ledgerdir import LedgerDir
from bookie.storage._writecache import WriteCache
from walkit.errors import InvalidArgumentError, NoSuchLedgerError, StorageError, UsageError

__all__ = ["Failing", "StorageShared"]

log = logging.getLogger("bookie.storage")

Listener = Callable[[BaseException], None]


class StorageShared:
    """The state the storage's parts share (see the module docstring for the locking rule)."""

    def __init__(self, fs: FileSystem, dirs: list[LedgerDir], cache: WriteCache, read_ahead: ReadAheadCache,
                 recent: RecentWrites) -> None:
        self.fs = fs
        #: the ledger dirs; a ledger lives in ``dirs[ledger_id % len(dirs)]`` (fixed)
        self.dirs = dirs
        self.lock = threading.Lock()
        self.flush_lock = threading.Lock()
        #: every ledger's state (a few dozen bytes each, never anything per entry)
        self.states: dict[int, LedgerState] = {}
        #: ledgers whose header changed since it was last handed to a flush
        self.dirty: set[int] = set()
        #: entries added since the last placement began, placed by the next
        self.cache = cache
        #: locations of entries placed since the last flush took them: ledger -> entry -> location
        self.pending: dict[int, dict[int, int]] = {}
        #: the pending map a running flush took; dropped when its index writes are synced
        self.flushing: dict[int, dict[int, int]] = {}
        #: entries read ahead by single reads
        self.read_ahead = read_ahead
        #: log buffers written out lately (its own lock)
        self.recent = recent
        self.failure: BaseException | None = None
        self.is_open = False
        #: ``with shared.failing:`` - any error inside (but a full disk) leaves the storage failed
        self.failing = Failing(self)
        #: ``on_failure(error)``: called once when an I/O error failed the storage (any thread)
        self.on_failure: Listener | None = None
        #: ``on_no_space(error)``: a write found the disk full (the storage did not fail)
        self.on_no_space: Listener | None = None

    def dir(self, ledger_id: int) -> LedgerDir:
        """The ledger's dir."""
        return self.dirs[ledger_id % len(self.dirs)]

    def memory_slot(self, ledger_id: int, entry_id: int) -> int:
        """(Lock held) the newest location memory knows: the pending and flushing maps,
        then the slot log's runs (durable, not yet in the index file); 0: ask the file."""
        for table in (self.pending, self.flushing):
            slots = table.get(ledger_id)
            if slots is not None and entry_id in slots:
                return slots[entry_id]
        return self.dir(ledger_id).slot_log.slot(ledger_id, entry_id)

    # --- failure ------------------------------------------------------------------------
    def latch(self, exc: BaseException) -> None:
        """An error on the write path: the storage fails (unless the disk is just full)."""
        if is_no_space(exc):
            self.report(self.on_no_space, exc)
        elif self.failure is None:
            self.failure = exc
            self.report(self.on_failure, exc)

    @staticmethod
    def report(listener: Listener | None, exc: BaseException) -> None:
        if listener is not None:
            try:
                listener(exc)
            except Exception:  # noqa: BLE001 - a listener must not change what the storage does
                log.exception("ledger storage: listener raised")

    # --- ledger states (lock held) -------------------------------------------------------
    def readable_state(self, ledger_id: int) -> LedgerState | None:
        self.check_open()
        return self.states.get(ledger_id)

    def existing_state(self, ledger_id: int) -> LedgerState:
        state = self.readable_state(ledger_id)
        if state is None:
            raise NoSuchLedgerError("ledger not stored", ledger=ledger_id)
        return state

    def writable_state(self, ledger_id: int) -> LedgerState:
        """The ledger's state, made (and dirty) if absent; raises if the storage failed."""
        if not 0 <= ledger_id <= MAX_LEDGER_ID:
            raise InvalidArgumentError("ledger id out of range", ledger=ledger_id)
        self.check_writable()
        state = self.states.get(ledger_id)
        if state is None:
            state = self.states[ledger_id] = LedgerState(ledger_id)
            self.dirty.add(ledger_id)
        return state

    def check_open(self) -> None:
        if not self.is_open:
            raise UsageError("ledger storage is not open")

    def check_writable(self) -> None:
        self.check_open()
        if self.failure is not None:
            raise StorageError(
                "ledger storage failed earlier; reopen it to recover", cause=repr(self.failure)
            ) from self.failure


class Failing:
    """Context manager: an error inside leaves the storage failed (the first error is
    kept). A plain class, not ``@contextmanager``: it guards every add."""

    __slots__ = ("_shared",)

    def __init__(self, shared: StorageShared) -> None:
        self._shared = shared

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            self._shared.latch(exc)
