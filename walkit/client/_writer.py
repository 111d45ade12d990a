"""The write path of one ledger: quorum adds, in-order completion, ensemble change.

Theory of operation (all state lives on the client loop except the submission queue,
:class:`~walkit.client._add_queue.AddQueue`, the one part any thread touches):

* :meth:`LedgerWriter.submit` (any thread) numbers the entry and queues it; the loop
  takes the queue in one go, encodes each entry with the current LAC piggybacked, and
  sends it to the Qw bookies of its write set (striping: ensemble[(e + i) mod E]). The
  LAC sent on its own (the explicit-LAC timer, the idle LAC) is
  :class:`~walkit.client._writer_lac.LacPublisher`'s.
* An add is *acknowledged* once Qa bookies of its current write set confirmed it (each
  after its journal's fdatasync). It *completes* when it is acknowledged and every lower
  entry has completed: completions run in entry order and each moves the LAC.
* A bookie that fails (connection lost, timeout, EIO, EREADONLY, busy) is dropped from
  every pending add's counts (an entry must end up acknowledged by the bookies that
  metadata says hold it) and an ensemble change starts: replacements from the writable
  bookies, a new fragment from LAC + 1 written with compare-and-set (a recovery writer
  keeps it in memory until its close), then every pending add is sent to the new members
  of its write set. No add completes while a change is under way (as in BookKeeper): the
  LAC stays where the new fragment starts, so every entry of that fragment is resent to
  its replacements before it can complete. The application sees nothing of this while
  bookies are left; when none are, every pending add fails with NotEnoughBookiesError.
* The writer owns its ledger's *last* fragment only. Re-replication
  (:mod:`walkit.recovery`) may put another bookie into an earlier fragment while the
  ledger is open: the writer's compare-and-sets (ensemble change, close) accept any
  metadata whose fragments start where its own do and whose last fragment is its own,
  and keep those replacements (the compare-and-sets: walkit/client/_writer_metadata.py).
* A recovery writer (re-adding what recovery found) waits for its whole write set, not
  Qa, so a recovered entry ends up on every bookie metadata names; if a failed bookie
  cannot be replaced it settles for Qa acks from the others, as BookKeeper does.
* EFENCED from any bookie means a recoverer took the ledger: every pending add fails
  with LedgerFencedError (their outcome is unknown: recovery decides) and the writer
  takes no more adds. EUA likewise fails the writer.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from concurrent.futures import Future

from walkit.client._add_batch import send_taken
from walkit.client._add_queue import Add, AddQueue
from walkit.client._bookie_client import AddGroups
from walkit.client._core import ClientCore
from walkit.client._entry_codec import EntryCodec
from walkit.client._placement import Placement
from walkit.client._submit import QuickFuture
from walkit.client._writer_lac import LacPublisher
from walkit.client._writer_metadata import write_close, write_ensemble, write_recovered
from walkit.errors import (
    BookieTimeoutError,
    LedgerFencedError,
    NotEnoughBookiesError,
    UsageError,
    WalkitError,
)
from walkit.logs import context
from walkit.metadata import LedgerMetadata, LedgerState
from walkit.protocol import AddEntry

__all__ = ["LedgerWriter"]

log = logging.getLogger(__name__)

class LedgerWriter:
    # slots, not an instance dict: a pass over a thousand writers reads each one's state in fewer places
    __slots__ = ("core", "meta", "version", "codec", "key", "_encode", "recovery", "ledger_id", "lac", "lac_length",
                 "error", "failed", "ensemble_changes", "quorum_size", "_degraded", "pending", "_changing", "_drained",
                 "lacs", "ensemble", "_write_sets", "queue", "slots", "__weakref__")

    def __init__(self, core: ClientCore, metadata: LedgerMetadata, version: int, codec: EntryCodec, *,
                 recovery: bool = False, lac: int = -1, length: int = 0) -> None:
        self.core = core
        self.meta = metadata
        self.version = version
        #: the ledger's entry codec (its digest's entries, master key and LAC bodies)
        self.codec = codec
        self.key = codec.master_key
        self._encode = codec.encode
        self.recovery = recovery
        self.ledger_id = metadata.ledger_id
        self.lac = lac
        self.lac_length = length
        self.error: WalkitError | None = None
        self.failed: set[str] = set()  # bookies that failed this writer: never used again
        self.ensemble_changes = 0
        # acks an add needs: Qa; a recovery writer wants the whole write set (Qw) until
        # a bookie cannot be replaced ("degraded": then Qa)
        self.quorum_size = metadata.write_quorum if recovery else metadata.ack_quorum
        self._degraded = False
        self.pending: collections.deque[Add] = collections.deque()
        self._changing = False
        self._drained: list[asyncio.Future[None]] = []
        self.lacs = LacPublisher(self, lac)  # the LAC sent on its own: walkit/client/_writer_lac.py
        self._set_ensemble()
        # submission (any thread): walkit/client/_add_queue.py
        self.queue = AddQueue(self, self.ledger_id, core.config.max_pending_adds, core.loop.in_loop, lac + 1, length)
        self.slots = self.queue.slots  # max_pending_adds (walkit.aio takes them itself)
        with core.writers_lock:
            core.writers.add(self)

    def fail_for_close(self, error: WalkitError) -> None:
        """(Loop) the client is closing: adds in flight fail now rather than hang."""
        if self.pending or self.queue.queued:
            self._fail(error)

    def fenced_here(self) -> None:
        """(Loop) this very client is recovering the ledger (``open_ledger`` with
        recovery while this handle is open): the writer is done, as if a bookie had
        answered EFENCED - without waiting for one, and without the warning, since no
        other client took the ledger."""
        if self.error is None:
            log.info("ledger %d: its own client recovers it; its writer takes no more adds", self.ledger_id,
                     extra=context(ledger=self.ledger_id))
        self._fail(LedgerFencedError("ledger fenced: this client recovered it; this writer is done",
                                     ledger=self.ledger_id), warn=False)

    def _set_ensemble(self) -> None:
        first, ensemble = self.meta.ensembles[-1]
        self.ensemble = ensemble
        size, qw = self.meta.ensemble_size, self.meta.write_quorum
        self._write_sets = [tuple(ensemble[(e + i) % size] for i in range(qw)) for e in range(size)]

    # -- submission (any thread) -------------------------------------------------------
    def submit(self, payload: bytes, *, reserved: bool = False) -> Future[int]:
        """Queue an add; its future gives the entry id once it completes. Unless
        ``reserved`` (the caller took a slot already) this waits for a free slot when
        ``max_pending_adds`` adds are in flight."""
        fut: QuickFuture[int] = QuickFuture()
        add, schedule = self.queue.put(payload, fut, reserved)
        if add is None:  # the writer failed: so does the add
            fut.set_exception(self.error)
            return fut
        if schedule:
            try:
                self.core.schedule(self)
            except UsageError:  # the client is closed: nothing will ever take this add
                self.queue.unput(add)
                raise
        return fut

    def submit_recovered(self, entry_id: int, data: bytes, length: int) -> Future[int]:
        """(Loop, recovery writer) re-add an entry exactly as it was read (recovery's
        own read window bounds these: they take no slot)."""
        fut: QuickFuture[int] = QuickFuture()
        add = Add(self, entry_id, b"", length, fut, data, slot=False)
        self.pending.append(add)
        if self.error is not None:
            self._settle(add, self.error)
            self.pending.pop()
        else:
            self._send(add)
            self._arm_timers()
        return fut

    def take_incoming(self, flush: bool = True, sink: AddGroups | None = None) -> None:
        """(Loop) send the adds submitted since the last call; ``flush``: write them to
        the bookies now (else the caller flushes, once for many writers); ``sink``: the
        batch goes there, queued with other writers' (``ClientCore._send_ready``)."""
        batch = self.queue.take()
        for add in () if batch and send_taken(self, batch, sink) else batch:  # else one by one (_add_batch.py)
            if self.error is not None:
                self._settle(add, self.error)
                continue
            self.pending.append(add)
            self._send(add)
        if batch and flush:
            self.core.pool.flush(self.ensemble)  # now, not at the loop's next iteration
        self._arm_timers()

    def abandon_incoming(self, error: WalkitError) -> None:
        """(Any thread) the client closed before the loop took the queued adds: each
        fails with ``error`` (nothing was sent) and gives its slot back."""
        for add in self.queue.take():  # not _settle: the client's stats are the loop's
            if add.slot:
                self.slots.release()
            self._finish(add, error)

    # -- sending and acks --------------------------------------------------------------
    def _send(self, add: Add) -> None:
        """Send ``add`` to the members of its write set it has not gone to yet."""
        if not add.data:
            add.data = self._encode(self.ledger_id, add.entry_id, self.lac, add.length, add.payload)
            lacs = self.lacs
            if self.lac > lacs.piggybacked or lacs.idle_since:
                lacs.carried(self.lac)
        write_set = self._write_sets[add.entry_id % len(self._write_sets)]
        failed, sent = self.failed, add.sent
        if self._degraded:
            alive = [b for b in write_set if b not in failed]
            if len(alive) < self.quorum_size:
                self._fail(NotEnoughBookiesError("too few bookies left for the ack quorum", ledger=self.ledger_id,
                                                 entry=add.entry_id))
                return
        add.sent_at = time.monotonic()
        if failed or sent:  # a resend (ensemble change) or a failed member: only those it has not gone to
            write_set = tuple(b for b in write_set if b not in failed and b not in sent)
            if not write_set:
                return
            add.sent = sent + write_set
        else:
            add.sent = write_set  # the write set's own tuple: nothing made
        request = AddEntry(self.ledger_id, add.entry_id, self.key, add.data, self.recovery)
        self.core.pool.request_each(write_set, request, add)  # after add.sent: no answer comes inside it

    def on_ack(self, add: Add, bookie: str, error: WalkitError | None) -> None:
        """(Loop) ``bookie`` answered ``add``."""
        if error is not None:
            if isinstance(error, LedgerFencedError):
                self._fail(LedgerFencedError("ledger fenced: another client recovered it; this writer is done",
                                             ledger=self.ledger_id, entry=add.entry_id, bookie=bookie))
            elif isinstance(error, UsageError):  # EUA, or a request no bookie would take
                self._fail(error)
            else:
                self.bookie_failed(bookie, error)
            return
        if add.done or bookie not in add.sent or bookie in add.acked:
            return  # late: completed already, or from a bookie since replaced
        add.acked += (bookie,)
        if not add.quorum and len(add.acked) >= self.quorum_size:
            add.quorum = True
            if self.pending and self.pending[0] is add:
                self._complete_ready()

    def _complete_ready(self) -> None:
        """Complete, in entry order, every pending add from the oldest on that has its
        quorum. Run once per writer and pass of the acks (a thousand writers with an add
        each complete one add each): what it does per writer is kept to the few steps
        each needs - the slots freed given back at once and without the lock, the idle
        LAC's test before any call, the drained waiters looked at only when there are some."""
        if self._changing:
            return  # held until the new fragment's entries went to its replacements
        pending = self.pending
        ready: list[Add] = []
        freed = 0
        while pending and pending[0].quorum:
            add = pending.popleft()
            freed += add.slot
            ready.append(add)
        if not ready:
            return
        if freed:
            self.slots.give_back(freed)  # the batch's at once, without the lock (walkit/client/_submit.py)
        stats = self.core.stats
        for add in ready:  # _finish's, without a call per add
            add.done = True
            self.lac = add.entry_id
            self.lac_length = add.length
            add.payload = add.data = b""
            if add.started:
                stats.add_seconds.observe(time.monotonic() - add.started)
            add.future.set_result(add.entry_id)
        if not self.recovery:  # a recoverer's re-adds are not the application's
            stats.adds += len(ready)
        if not pending:
            lacs = self.lacs
            # idle: no entry will carry this LAC soon (went_idle's own first test, made here)
            if lacs.idle and self.lac > lacs.piggybacked and not self.queue.queued:
                lacs.went_idle(ready[-1].acked)
            if self._drained:
                self._wake_drained()

    def _settle(self, add: Add, error: WalkitError | None) -> None:
        if add.slot:
            self.slots.release()
        if error is not None and add.slot:  # an application's add (a recoverer's take no slot)
            self.core.stats.add_failures += 1
        self._finish(add, error)

    def _finish(self, add: Add, error: WalkitError | None) -> None:
        """Mark ``add`` done and complete its future (its slot is the caller's business)."""
        add.done = True
        add.payload = add.data = b""
        if error is None:
            add.future.set_result(add.entry_id)
        else:
            add.future.set_exception(error)

    def _fail(self, error: WalkitError, *, warn: bool = True) -> None:
        """The writer is done: every pending and queued add fails with ``error``."""
        if self.error is None:
            self.error = error
            if warn:
                log.warning("ledger %d writer failed: %s", self.ledger_id, error,
                            extra=context(ledger=self.ledger_id))
        while self.pending:
            self._settle(self.pending.popleft(), self.error)
        for add in self.queue.take_failed():
            self._settle(add, self.error)
        self._wake_drained()

    # -- failures and ensemble change --------------------------------------------------
    def bookie_failed(self, bookie: str, error: WalkitError) -> None:
        if self.error is not None or self.meta.state is LedgerState.CLOSED or self.core.closing:
            return
        if bookie not in self.ensemble or bookie in self.failed:
            return
        if self.queue.closing and not self.pending:
            return  # every add is settled: the close records the ledger as it is
        log.info("ledger %d: bookie %s failed (%s); changing the ensemble", self.ledger_id, bookie, error,
                 extra=context(ledger=self.ledger_id, bookie=bookie))
        self.core.bookie_failed(bookie)
        self.failed.add(bookie)
        need = self.quorum_size
        for add in self.pending:
            if bookie in add.sent:
                add.sent = tuple(b for b in add.sent if b != bookie)
                add.acked = tuple(b for b in add.acked if b != bookie)
                add.quorum = len(add.acked) >= need
        if self._degraded:
            self._check_reachable(NotEnoughBookiesError("too few bookies left for the ack quorum",
                                                        ledger=self.ledger_id, bookie=bookie))
        elif not self._changing:
            self._changing = True
            self.core.spawn(self._change_ensemble())

    async def _change_ensemble(self) -> None:
        try:
            while self.error is None:
                failed = [b for b in self.ensemble if b in self.failed]
                if not failed:
                    return
                start = self.lac + 1
                chosen = await self.core.choose_bookies(Placement.replacing(self.meta, self.ensemble, self.failed))
                replacement = dict(zip(failed, chosen))
                new = tuple(replacement.get(b, b) for b in self.ensemble)
                if self.error is not None:
                    return
                if self.recovery:
                    self.meta = self.meta.with_ensemble(start, new)
                else:
                    self.meta, self.version = await self.core.md(write_ensemble, self.core.ledgers, self.meta, start, new)
                self._set_ensemble()
                self.ensemble_changes += 1
                self.core.stats.ensemble_changes += 1
                log.info("ledger %d: new ensemble from entry %d: %s", self.ledger_id, start, ",".join(new),
                         extra=context(ledger=self.ledger_id, entry=start))
                for add in list(self.pending):
                    self._send(add)
        except NotEnoughBookiesError as exc:
            if self.recovery and not self._degraded:
                self._degrade(exc)
            else:
                self._fail(exc)
        except WalkitError as exc:
            self._fail(exc)
        except asyncio.CancelledError:  # the client is closing
            self._fail(UsageError("client closed during an ensemble change", ledger=self.ledger_id))
            raise
        except Exception as exc:  # a bug must not leave adds hanging for ever
            log.exception("ensemble change failed", extra=context(ledger=self.ledger_id))
            self._fail(WalkitError("ensemble change failed", ledger=self.ledger_id, reason=repr(exc)))
        finally:
            self._changing = False
            if self.error is None and self.pending and self.pending[0].quorum:
                self._complete_ready()  # what the change held back

    def _degrade(self, error: NotEnoughBookiesError) -> None:
        """(Recovery) no replacement: keep the ensemble and settle for Qa acks."""
        log.warning("ledger %d: recovery keeps a failed bookie in the ensemble (%s); entries need Qa acks",
                    self.ledger_id, error, extra=context(ledger=self.ledger_id))
        self._degraded = True
        self.quorum_size = self.meta.ack_quorum
        for add in self.pending:
            add.quorum = len(add.acked) >= self.quorum_size
        self._check_reachable(error)
        if self.error is None and self.pending and self.pending[0].quorum:
            self._complete_ready()

    def _check_reachable(self, error: WalkitError) -> None:
        """Fail the writer when some pending add can no longer get its acks."""
        size = self.meta.ensemble_size
        for add in self.pending:
            alive = [b for b in self._write_sets[add.entry_id % size] if b not in self.failed]
            if len(alive) < self.quorum_size:
                self._fail(error)
                return

    # -- timeouts ----------------------------------------------------------------------
    def _arm_timers(self) -> None:
        if self.pending:
            self.core.watch_adds(self)  # the client's one timeout sweep looks at this writer
        lacs = self.lacs
        if lacs.interval > 0:  # (arm's own first test, made here: the explicit-LAC timer is off by default)
            lacs.arm()

    def check_timeouts(self, now: float, stalled: bool) -> None:
        """(The client's timeout sweep) fail, as timed out, the bookies that have not
        answered an add sent more than ``add_timeout`` ago - unless the sweep ran so late
        that the process itself was stopped (``stalled``,
        :data:`walkit.client._core.STALL`): then every pending add gets ``add_timeout``
        afresh, from now. Answers that came in during the stop are read first, but an
        add sent just before it (its bytes maybe still in this process) would look timed
        out on every bookie at once: after a SIGSTOP longer than ``add_timeout``, the
        resumed writer would drop its whole ensemble instead of hearing that it was
        fenced."""
        if stalled:
            for add in self.pending:
                add.sent_at = max(add.sent_at, now)
            return
        deadline = now - self.core.config.add_timeout
        for add in list(self.pending):
            if add.sent_at < deadline and not add.done:
                waiting = [b for b in add.sent if b not in add.acked]
                for bookie in waiting:
                    self.bookie_failed(bookie, BookieTimeoutError("add timed out", bookie=bookie,
                                                                  ledger=self.ledger_id, entry=add.entry_id))
                if not waiting and not add.quorum and not self._changing and self.error is None:
                    self._fail(NotEnoughBookiesError("an add can no longer reach its quorum", ledger=self.ledger_id,
                                                     entry=add.entry_id, acked=len(add.acked)))

    # -- drain and close ---------------------------------------------------------------
    def _wake_drained(self) -> None:
        if not self._drained:
            return
        waiters, self._drained = self._drained, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def drain(self) -> None:
        """Until no add is queued or pending (each completed or failed)."""
        while True:
            self.take_incoming()
            if not self.pending:
                return
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._drained.append(fut)
            await fut

    async def close(self) -> LedgerMetadata:
        """Stop taking adds, let the pending ones finish, and record the close (CAS):
        last entry = LAC, length = the LAC entry's length."""
        self.queue.close()
        await self.drain()
        while self._changing:  # an ensemble change already under way lands first
            await asyncio.sleep(0.01)
        self.lacs.stop()
        record = write_recovered if self.recovery else write_close  # walkit/client/_writer_metadata.py
        self.meta, self.version = await self.core.md(record, self.core.ledgers, self.meta, self.lac, self.lac_length)
        return self.meta

