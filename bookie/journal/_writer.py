"""The journal writer: group commit, one aligned write + one fdatasync per batch.

Theory of operation
-------------------
Producers call :meth:`Journal.log_entry` (and the meta-record variants) from any thread,
or :meth:`Journal.log_records` with several records at once (the bookie hands over the
adds of one received chunk together: one lock acquisition and at most one wake-up for
all of them). Under the journal's lock each record is framed straight into the batch
being built (an aligned :class:`~bookie.journal._framing.FrameBuffer`: header, ids,
payload, CRC32C) and its callback is appended to the batch (:meth:`Journal.log_entry`, one
entry a call, frames it with a single C call and checks only what C hands back: that
call is most of its producer's cost). Framing in the caller's thread means a record is
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
* The **sync thread** (:mod:`bookie.journal._sync`) writes the batch with one ``pwritev``
  and one ``fdatasync``, then runs the batch's callbacks in submission order and the
  flush listeners. Then, under load, it **takes the next batch itself**
  (:meth:`Journal._take_next`): if the batch being built is non-empty and the same policy
  says it must go now, it closes it exactly as the journal thread would and writes it,
  without handing control back. It goes idle (and wakes the journal thread) when the
  batch is empty, when the policy says wait, or when the batch could fill the file: rolls
  stay on the journal thread.

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

Who may close a batch, and why only one flush is ever in flight, is
:class:`~bookie.journal._claim.FlushClaim`'s to say (and nobody else's).

A batch that leaves the file past ``max_size`` makes the journal thread roll to the
next file (:mod:`bookie.journal._tail`: new or recycled files, the zero filler).

Durability (:mod:`bookie.journal._sync`): a callback receives ``None`` only after the
fdatasync that covers its frame returned; :meth:`Journal.last_mark` moves as soon as a
batch is durable, :meth:`Journal.settled_mark` only after its callbacks returned. Any
I/O error kills the journal (:mod:`bookie.journal._death`): the batch in flight, the
batch being built and every later submission fail - exactly once each - and nothing later
is acknowledged; ``on_failure`` is told. A failed fdatasync is never retried.

A full disk is not an I/O error (:mod:`bookie.journal._space`): a batch the disk has no
room for is refused - its records fail with ENOSPC, ``on_no_space`` is told - and the
journal goes on; so does a roll, and :meth:`Journal.start` without room for its file.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from bookie.fs import FileSystem
from bookie.journal._batch import (
    ENTRY,
    FENCE_RECORD,
    KEY_RECORD,
    LAC_RECORD,
    Batch,
    Callback,
    OpenBatch,
    Record,
    call_back,
    check_record,
    check_records,
)
from bookie.journal._claim import FlushClaim
from bookie.journal._config import JournalConfig, JournalStats
from bookie.journal._death import JournalDeath
from bookie.journal._format import frame_seed
from bookie.journal._mark import LogMark
from bookie.journal._policy import FlushReason, wait_timeout
from bookie.journal._space import SpaceGuard
from bookie.journal._sync import SyncThread
from bookie.journal._tail import JournalTail
from walkit.errors import InvalidArgumentError

__all__ = ["Journal"]

_NO_RECORDS: list[Record] = []
_IDLE, _UNTIMED, _TIMED = 0, 1, 2  # what the journal thread is waiting for
#: A kick flushes on its caller's thread only while the last write + fdatasync took less
#: than this (seconds): an inline flush blocks the caller (the bookie's event loop) for it.
INLINE_MAX_SYNC = 0.002


class Journal:
    """Group-committing journal over a :class:`bookie.fs.FileSystem`."""

    def __init__(self, fs: FileSystem, config: JournalConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._fs = fs
        self._cfg = config
        self._clock = clock
        self.stats = JournalStats()
        # Producer state, all under _lock: the batch being built.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # wakes the journal thread
        self._building = OpenBatch(fs, config)
        self._waiting = _IDLE
        self._closed = True  # until start(): nothing may be framed before the file's seed is known
        self._death = JournalDeath(config.directory, lock=self._lock, cond=self._cond, building=self._building,
                                   journal_id=lambda: self._tail.journal_id)
        # The flush: at most one in flight (FlushClaim), written by the sync thread or a kick.
        self._claim = FlushClaim()
        self._sync = SyncThread(config, self.stats, self._claim, clock, take_next=self._take_next,
                                recycle=self._recycle, fail=self._death.fail)
        # Journal-thread state: the file and where the next batch goes; a full disk.
        self._tail = JournalTail(fs, config, self.stats, restart_marks=self._sync.restart_at)
        self._space = SpaceGuard(config, self.stats, lock=self._lock, building=self._building, tail=self._tail,
                                 fail=self._death.fail)
        self._threads: list[threading.Thread] = []

    # --- what callers set and read ------------------------------------------------------
    @property
    def flush_listeners(self) -> list[Callable[[LogMark], None]]:
        """Called on the sync thread after each batch's callbacks, with the new durable
        mark: one wake-up per batch for whoever waits on many entries."""
        return self._sync.listeners

    @flush_listeners.setter
    def flush_listeners(self, listeners: list[Callable[[LogMark], None]]) -> None:
        self._sync.listeners = listeners

    @property
    def on_no_space(self) -> Callable[[BaseException], None] | None:
        """``on_no_space(error)``: a batch was refused because the disk is full (the
        journal lives on; the bookie turns read-only until there is room)."""
        return self._space.on_no_space

    @on_no_space.setter
    def on_no_space(self, listener: Callable[[BaseException], None] | None) -> None:
        self._space.on_no_space = listener

    @property
    def on_failure(self) -> Callable[[BaseException], None] | None:
        """``on_failure(error)``: called once, on the thread that met it, when an I/O
        error killed the journal (the bookie turns read-only for good)."""
        return self._death.on_failure

    @on_failure.setter
    def on_failure(self, listener: Callable[[BaseException], None] | None) -> None:
        self._death.on_failure = listener

    @property
    def sync_delay(self) -> float:
        """Test hook (walkit.testing's slow_disk): seconds the sync thread sleeps before
        writing and syncing each batch, as a slow disk would take; 0 in production."""
        return self._sync.delay

    @sync_delay.setter
    def sync_delay(self, seconds: float) -> None:
        self._sync.delay = seconds

    @property
    def direct(self) -> bool:
        """The journal file is written with O_DIRECT."""
        return self._tail.direct

    @property
    def zero_filled(self) -> tuple[int, int]:
        """Bytes of zeros the filler wrote ahead of new files' tails, and its zero writes
        that failed (each ended the filling of one file)."""
        return self._tail.zero_filled

    @property
    def failed(self) -> BaseException | None:
        """The I/O error that killed the journal, if one did."""
        return self._death.error

    @property
    def current_journal_id(self) -> int:
        return self._tail.journal_id

    def last_mark(self) -> LogMark:
        """The end of the durable part of the journal (everything before it is synced)."""
        return self._sync.durable

    def settled_mark(self) -> LogMark:
        """The end of the durable part whose callbacks have all returned (never past
        :meth:`last_mark`): what a checkpoint takes when callbacks apply state."""
        return self._sync.settled

    # --- lifecycle --------------------------------------------------------------------
    def start(self, *, min_id: int = 1) -> LogMark:
        """Open a new journal file - its id above every existing one, and at least
        ``min_id`` (the bookie passes one past its checkpoint mark's file, which may never
        have been made) - start the threads and return the position where this run's
        records begin. A disk without room for the file does not stop the start
        (:meth:`JournalTail.open_first`: the first batch makes the file)."""
        self._fs.makedirs(self._cfg.directory)
        no_space = self._tail.open_first(min_id)
        with self._lock:
            self._building.frames.seed = frame_seed(self._tail.journal_id)
            self._closed = False
        for target, name in ((self._run, "bookie-journal"), (self._sync.run, "bookie-journal-sync")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self._tail.start_filler()
        if no_space is not None and self.on_no_space is not None:
            self.on_no_space(no_space)
        return self._sync.durable

    def shutdown(self) -> None:
        """Flush everything submitted so far, then stop. Later submissions fail."""
        with self._lock:
            if self._closed or not self._threads:
                return
            self._closed = True
            self._building.pool.retire()
            self._cond.notify()
        for t in self._threads:
            t.join()
        self._tail.close()
        self._building.frames.buf.close()
        self._building.pool.close()

    def gc(self, mark: LogMark) -> list[int]:
        """Retire journal files wholly before ``mark``, keeping ``max_backups`` of them:
        up to ``recycle_files`` become free files for later rolls, the rest are removed."""
        return self._tail.retire(mark.journal_id)

    # --- producers ------------------------------------------------------------------------
    def log_entry(self, ledger_id: int, entry_id: int, data: bytes, callback: Callback | None = None, ctx: Any = None) -> None:
        """One ENTRY record (:meth:`log_records`' contract). The one-call-per-entry hot
        path: under the lock, one C call frames it (:meth:`FrameBuffer.append_entry`) -
        plain values, those :func:`check_record` takes as they are, need no check before
        it. What C hands back (no C framing, odd or bad values, a dead journal) is
        checked and framed as :meth:`log_entries` frames a chunk, ``callback`` (if any)
        as the group's."""
        error: BaseException | None = None
        lock = self._lock
        lock.acquire()
        try:
            building = self._building
            if self._closed or self._death.error is not None:
                framed = False  # refused below, after the check, as log_records refuses
            else:
                try:
                    framed = building.frames.append_entry(ledger_id, entry_id, data)
                except BaseException as exc:  # noqa: BLE001 - e.g. no memory for a buffer: nothing framed,
                    error, framed = exc, True  # the callback fails (as in _add)
                else:
                    if framed:
                        if callback is not None:
                            building.records.append((callback, ctx))
                        if building.oldest is None or self._waiting:
                            self._joined(building, 1, False)
                        else:  # the batch has its oldest record and nobody waits for it
                            building.entries += 1
        finally:
            lock.release()
        if not framed:
            check_record(ENTRY, ledger_id, entry_id, data)
            self._add(_NO_RECORDS, [(ledger_id, entry_id, data)], None if callback is None else (callback, ctx))
        elif error is not None and callback is not None:
            callback(error, ctx)

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
        check_records(records)
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
            check_records(records)
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
            if self._closed or self._death.error is not None:
                raise self._death.refusal()
            building = self._building
            callbacks, frames = building.records, building.frames
            taken = 0
            try:
                for ftype, ledger_id, arg, data, callback, ctx in records:
                    frames.append(ftype, ledger_id, arg, data)
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
                self._joined(building, taken, defer)
        finally:
            lock.release()
        if failed:
            call_back(failed, error)

    def _joined(self, building: OpenBatch, taken: int, defer: bool) -> None:
        """``taken`` records joined the batch being built (lock held): count them, and
        wake the journal thread if it waits for a batch (unless ``defer``) or times a
        group wait the policy now cuts short."""
        building.entries += taken
        if building.oldest is None:
            building.oldest = self._clock()
        waiting = self._waiting
        if waiting and ((waiting == _UNTIMED and not defer) or (
                waiting == _TIMED and building.reason(self._cfg, self._clock()) is not None)):
            self._waiting = _IDLE
            self._cond.notify()

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
        batch: Batch | None = None
        with self._lock:
            building, tail = self._building, self._tail
            if self._waiting != _UNTIMED or building.entries == 0:
                return  # the journal thread is awake, or times a group wait; or nothing to do
            if not self._closed and self._death.error is None and tail.current is not None and (
                    tail.pos + building.frames.size + 2 * self._cfg.alignment < self._cfg.max_size):
                reason = building.reason(self._cfg, now)
                if reason is not None and self._claim.claim():  # the flush is ours: the journal thread waits for it
                    batch = self._close_batch(reason)
            if batch is None:  # a roll, a shutdown, a group wait or a flush in flight: the journal thread's
                self._waiting = _IDLE
                self._cond.notify()
                return
        ready = self._space.reserve_or_fail(batch)  # False: refused for lack of space; None: the journal died
        sync = self._sync
        if ready and not (inline and sync.delay == 0 and sync.last_sync < INLINE_MAX_SYNC):
            self._claim.hand_over(batch)  # the sync thread writes it, then releases the flush
            return
        if ready:
            sync.write(batch)  # a failure killed the journal (and woke its thread)
        self._claim.release()  # records framed meanwhile woke the journal thread, which waits for this

    # --- the journal thread -------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._death.error is None:
                reason = self._await_batch()
                if reason is None:
                    break  # shut down with nothing left
                if self._wait_sync_idle():
                    continue  # the sync thread may have taken the batch itself: ask again
                self._hand_off(reason)
        except BaseException as exc:  # noqa: BLE001 - any failure kills the journal
            self._death.die(exc)
        finally:
            self._claim.stop()
            if self._death.error is not None:
                self._death.die(self._death.error)

    def _await_batch(self) -> FlushReason | None:
        """Sleep until the policy says the batch must go (None: shut down, batch empty).
        The clock is read before taking the lock, never while holding it."""
        building = self._building
        while True:
            now = self._clock()
            with self._lock:
                if self._death.error is not None:
                    raise self._death.error
                if building.entries == 0:
                    if self._closed:
                        return None
                    self._waiting = _UNTIMED
                    self._cond.wait()
                    continue
                if self._closed:
                    return FlushReason.SHUTDOWN
                reason = building.reason(self._cfg, now)
                if reason is not None:
                    self._waiting = _IDLE
                    return reason
                timeout = wait_timeout(self._cfg.policy, now=now, oldest_enqueued=building.oldest)
                self._waiting = _TIMED
                self._cond.wait(None if timeout is None else min(timeout, threading.TIMEOUT_MAX))

    def _close_batch(self, reason: FlushReason) -> Batch:
        """Close the batch being built (lock held; by whichever thread holds the flush claim)."""
        tail = self._tail
        assert tail.current is not None
        batch = self._building.close(reason, tail.current, tail.pos, tail.journal_id, tail.terminator)
        tail.pos += batch.length
        if tail.pos >= self._cfg.max_size:  # the next batch goes to the next file
            self._building.frames.seed = frame_seed(tail.journal_id + 1)
        return batch

    def _hand_off(self, reason: FlushReason) -> None:
        """Close the batch being built and give it to the (idle) sync thread."""
        space, tail = self._space, self._tail
        if (tail.current is None or tail.pos >= self._cfg.max_size) and not space.roll_or_refuse():
            return  # a file the disk had no room for: tried again with the next batch
        with self._lock:
            batch = self._close_batch(reason)
        if not space.reserve(batch):
            return
        self._claim.hand_over(batch)
        if tail.pos >= self._cfg.max_size:
            self._wait_sync_idle()
            space.roll_or_refuse()

    def _wait_sync_idle(self) -> bool:
        """Wait until no flush is in flight; True when one was."""
        waited = self._claim.wait_idle(lambda: self._death.error is not None)
        if self._death.error is not None:
            raise self._death.error
        return waited

    # --- what the sync thread sees of the journal (bookie.journal._sync) --------------------
    def _take_next(self) -> tuple[Batch | None, bool]:
        """The sync thread, between two flushes: close the batch being built if the
        policy says it must go now; ``(batch or None, journal died)``. The clock is read
        before taking the lock, as the journal thread does."""
        now = self._clock()
        with self._lock:
            building = self._building
            if self._death.error is not None or building.entries == 0:
                return None, False
            reason = FlushReason.SHUTDOWN if self._closed else building.reason(self._cfg, now)
            if reason is None:
                return None, False  # the journal thread times the group wait
            if self._tail.pos + building.frames.size + 2 * self._cfg.alignment >= self._cfg.max_size:
                if self._waiting != _IDLE:  # this batch may fill the file: the journal
                    self._waiting = _IDLE  # thread hands it off and rolls
                    self._cond.notify()
                return None, False
            batch = self._close_batch(reason)
        ready = self._space.reserve_or_fail(batch)  # False: refused for lack of space; the journal lives on
        return (batch, False) if ready else (None, ready is None)

    def _recycle(self, batch: Batch) -> None:
        """A written batch's buffers go back to the pool."""
        with self._lock:
            self._building.pool.put_segments(batch.segments)
