"""The journal hand-off: admitted adds and WRITE_LACs go to the core, their answers come
back on the event loop.

Theory of operation
-------------------
The consecutive adds one pass of a connection's pump admitted are handed to the core in
one :meth:`Bookie.add_batch_cb` call (:meth:`Writes.submit_adds`), which still checks
each add on its own. The adds the core admitted are framed into one journal batch with
**one callback** for the group, called once their fdatasync returned (a refused add is
called back on its own, at once). The journal is not woken per chunk: at the end of the
loop iteration (:meth:`Writes.kick_journal`, once, after every connection with bytes was
read) an idle journal writes, syncs and calls back on the loop's own thread
(``journalInlineFlush``; no thread switch between a lone add and its answer, which the
kick drains and writes at once, in the same loop iteration), while a busy one groups them
into its next batch, written by its sync thread (:meth:`bookie.journal.Journal.kick`).
Answers held for the kick that wait on no fsync (the long polls an arriving add woke
with the LAC it carries, reads served from memory) are written before the journal is
kicked, not after its inline sync: a reader following a writer that appends back to back
is not held one sync behind per entry.

Where the kick runs: adds submitted by a connection's read callback (between
:meth:`Writes.reading` and :meth:`Writes.read_done`) are kicked at the end of that
callback when it is the last one of the loop iteration - asyncio's loop has nothing
else ready (:func:`_last_of_iteration`) - so a lone add is read, journaled, synced and
answered by one callback, without a second pass of the loop (an ``epoll_wait`` that
finds nothing, a handle scheduled and run). Otherwise - other connections still to be
read in this iteration, another loop (uvloop: its queue is not visible), adds submitted
outside a read (a pump after an answer, a resumed write) - the kick is scheduled with
``call_soon`` and runs at the start of the next iteration, after them. Answers given
while a read callback runs (a published WRITE_LAC, a read served from memory) are held
the same way (:meth:`Writes.write_later`) and written at its end, or by the kick, or by
one callback scheduled for the next iteration.

Completions are queued (a deque, thread-safe) and the loop is woken once per journal
flush (``call_soon_threadsafe`` only when no drain is scheduled yet - a callback that
sees the flag set does not even take the drain lock: the drain clears the flag *before*
it empties the queue, so a completion queued after the flag was read set is still found),
so a group commit of a thousand entries costs a few queue items and one wake-up.

A WRITE_LAC's BookKeeper body (ledger, LAC, the writer's digest; v3's ``body`` or walkit's
flag LAC_BODY) is kept in memory per ledger once the write succeeded, for READ_LAC to answer with (:class:`ReadPool`'s
``lac_bodies``), as BookKeeper's bookie keeps its explicit LAC.

A WRITE_LAC for a ledger whose key is durable here is published at once (storage, long
polls, the answer) and its record rides on the next flush: an explicit LAC needs no
fsync (:meth:`bookie.Bookie.publish_lac`). For a ledger new to this bookie it is
journaled like an add, after the ledger's key, and answered when durable.

Answers given during a kick or a read callback are not scheduled one flush each: the
connections are remembered (``unflushed``) and written once at the end of it. A durable add lowers
the adds in flight (:class:`~bookie.server._admission.AddsInFlight`) and wakes the long
polls of its ledger with the LAC its entry carries; a WRITE_LAC wakes them with its LAC.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable
from operator import attrgetter
from typing import Any, Protocol

from bookie._bookie import Bookie
from bookie._config import BookieConfig
from bookie.server._admission import AddsInFlight
from bookie.server._answers import Peer, error_response
from bookie.server._long_poll import LongPolls
from walkit.logs import context
from walkit.protocol import ENTRY_HEADER, AddEntry, Op, WriteLac, WriteLacResponse, parse_entry_header

__all__ = ["WriteHost", "Writes"]

log = logging.getLogger("bookie.server")

_ADD_DONE = 0
_LAC_WRITTEN = 1
_DATA = attrgetter("data")
_LAC_BODIES = 4096  # ledgers whose last BookKeeper WRITE_LAC body is kept

_NO_KICK = 0  # no add submitted since the last kick
_KICK_AFTER_READ = 1  # adds submitted by a read callback: read_done kicks or schedules
_KICK_SCHEDULED = 2  # kick_journal is in the loop's queue


def _last_of_iteration(loop: Any) -> bool:
    """Whether the callback running now is the last of this iteration of an asyncio
    event loop: nothing else is ready, so the next iteration would begin with an
    ``epoll_wait`` that cannot wait. Reads asyncio's ready queue (``_ready``, a deque in
    every ``BaseEventLoop`` since Python 3.4); False for any loop without one (uvloop)."""
    ready = getattr(loop, "_ready", None)
    return type(ready) is collections.deque and not ready


class WriteHost(Protocol):
    """What the hand-off needs of the server."""

    @property
    def config(self) -> BookieConfig: ...

    @property
    def bookie(self) -> Bookie | None: ...

    @property
    def bookie_id(self) -> str: ...

    @property
    def loop(self) -> Any: ...


class Writes:
    """Adds and WRITE_LACs between the connections and the journal (see the module
    docstring). Everything but the journal callbacks runs on the loop."""

    def __init__(self, host: WriteHost, polls: LongPolls, lac_bodies: dict[int, bytes] | None = None) -> None:
        self._host = host
        self._polls = polls
        #: ledger -> its last BookKeeper WRITE_LAC body, kept once the write succeeded (ReadPool's)
        self._lac_bodies: dict[int, bytes] = {} if lac_bodies is None else lac_bodies
        self.in_flight = AddsInFlight()
        #: Completions (kind, connection, adds or request, error), from the sync thread.
        self._done: collections.deque[tuple[int, Peer, Any, BaseException | None]] = collections.deque()
        self._drain_lock = threading.Lock()
        self._drain_scheduled = False
        self._kick = _NO_KICK  # whether a journal kick is due, and how it will run
        self._reading = False  # inside a connection's read callback (reading .. read_done)
        self._write_scheduled = False  # _write_answers is in the loop's queue
        #: Inside :meth:`kick_journal`: answers are drained and written by it.
        self.kicking = False
        #: Connections with answers queued during a kick or a read callback (written at its end).
        self.unflushed: list[Peer] = []
        #: The loop's thread id (a callback there needs no self-pipe wake-up); set by start.
        self.loop_thread = 0

    def callback_for(self, conn: Peer) -> Callable[[BaseException | None, list[AddEntry]], None]:
        """The core's callback for ``conn``'s adds (``cb(err, adds)``)."""
        return functools.partial(self._on_added, conn)

    def submit_adds(self, adds: list[AddEntry], callback: Callable[[BaseException | None, list[AddEntry]], None]) -> None:
        """Hand admitted adds to the core in one call; they are answered via ``callback``
        (once for those durable together, once per refusal). The journal is not woken
        now: :meth:`kick_journal` runs once at the end of this loop iteration, after every
        connection that had bytes was read, so the adds of all of them share one flush."""
        bookie = self._host.bookie
        assert bookie is not None
        if self._polls.any_waiting():
            self._publish_carried(bookie, adds)
        bookie.add_batch_cb(adds, callback, defer=True)
        if self._kick == _NO_KICK:
            if self._reading:  # read_done kicks (or schedules the kick) at the callback's end
                self._kick = _KICK_AFTER_READ
            else:
                self._kick = _KICK_SCHEDULED
                self._host.loop.call_soon(self.kick_journal)

    def _publish_carried(self, bookie: Bookie, adds: list[AddEntry]) -> None:
        """Tailing readers wait on a ledger of ``adds``: the LAC an add carries is
        published for them as the add arrives (as a WRITE_LAC is: storage's explicit LAC,
        then the polls), not once the add is durable here. What it says - the entries up
        to it were acknowledged by Qa bookies - is true whatever becomes of this add
        (:meth:`bookie._records.LedgerRecords.publish_lac`). A writer that appends back to
        back sends no WRITE_LAC (its idle LAC waits, and the next add carries it:
        walkit/client/_writer_lac.py), so its reader sees each entry when the next one
        arrives rather than when that one is durable. Only with the ledger's durable key
        (a stranger's add publishes nothing); a recoverer's adds publish nothing. Once per
        ledger and key in a batch, its highest LAC (a pipelined writer's batch of hundreds
        of adds takes one publication, not one each)."""
        polls = self._polls
        highest: dict[tuple[int, bytes], int] = {}
        for req in adds:
            if req.recovery or not polls.waiting_on(req.ledger_id) or len(req.data) < ENTRY_HEADER.size:
                continue
            lac = parse_entry_header(req.data).lac
            if lac > highest.get((req.ledger_id, req.master_key), -2):
                highest[(req.ledger_id, req.master_key)] = lac
        for (ledger_id, master_key), lac in highest.items():
            try:
                if bookie.publish_lac(ledger_id, master_key, lac, journal=False):
                    polls.lac_advanced(ledger_id, lac)
            except Exception:  # best effort: the add goes on; its durable answer wakes the polls
                log.debug("ledger %d: the LAC %d carried by an add not published on arrival", ledger_id, lac,
                          exc_info=True)

    def reading(self) -> None:
        """A connection's read callback begins: the adds it submits are kicked, and the
        answers it gives written, by :meth:`read_done`."""
        self._reading = True

    def read_done(self) -> None:
        """A connection's read callback ends: kick the journal and write the answers
        given now if that callback is the last of the loop iteration (nothing else
        ready), else at the next iteration's start (the module docstring)."""
        self._reading = False
        kick = self._kick == _KICK_AFTER_READ
        if not kick and not self.unflushed:
            return
        loop = self._host.loop
        if _last_of_iteration(loop):
            if kick:
                self.kick_journal()  # writes the answers at its end, with its own
            else:
                self._write_answers()
        elif kick:
            self._kick = _KICK_SCHEDULED
            loop.call_soon(self.kick_journal)
        elif not self._write_scheduled:
            self._write_scheduled = True
            loop.call_soon(self._write_answers)

    def write_later(self, conn: Peer) -> bool:
        """``conn`` has a first answer queued: True when the kick or the read callback
        under way will write it at its end (``conn`` is remembered), False when the
        caller must schedule the write itself."""
        if self.kicking or self._reading:
            self.unflushed.append(conn)
            return True
        return False

    def write_lac(self, conn: Peer, req: WriteLac) -> bool:
        """WRITE_LAC: True when it was published at once (the ledger's key is durable
        here: no fsync to wait for; the caller answers it with :meth:`lac_published`),
        False when it is journaled after the ledger's key (answered when durable)."""
        bookie = self._host.bookie
        assert bookie is not None
        if bookie.publish_lac(req.ledger_id, req.master_key, req.lac):
            return True
        bookie.write_lac_cb(req.ledger_id, req.master_key, req.lac, self._on_done, (_LAC_WRITTEN, conn, req))
        return False

    def lac_published(self, conn: Peer, req: WriteLac) -> None:
        """Answer a WRITE_LAC :meth:`write_lac` published, and wake the ledger's polls."""
        self._lac_written(conn, req, None)

    def kick_journal(self) -> None:
        """The end of a loop iteration that submitted adds: an idle journal flushes them
        here, on the loop's thread (``journalInlineFlush``; or hands them to its sync
        thread), and what completed is answered at once; a busy journal groups them into
        its next batch (:meth:`bookie.journal.Journal.kick`). Run by :meth:`read_done` or
        scheduled by :meth:`submit_adds` (the module docstring)."""
        self._kick = _NO_KICK
        host = self._host
        if host.bookie is None:
            self._write_answers()  # held by a read callback: written whatever happens
            return
        if self.unflushed:  # answers that wait on no fsync (reads, long polls woken by an add's LAC) go first
            self._write_answers()
        self.kicking = True  # an inline flush's answers: drained and written below, not scheduled
        try:
            host.bookie.kick_journal(host.config.journal_inline_flush)
        finally:
            if self._done:
                self._drain()  # never raises (each completion's failure is logged)
            self.kicking = False
            self._write_answers()

    def _write_answers(self) -> None:
        """Write the answers held for the connections in ``unflushed``, one write each."""
        self._write_scheduled = False
        unflushed, self.unflushed = self.unflushed, []
        for conn in unflushed:
            try:
                conn.flush()
            except Exception:  # one connection's failure must not keep the others' answers
                log.exception("writing answers to %s failed", conn.peer, extra=context(bookie=self._host.bookie_id))

    def _on_added(self, conn: Peer, err: BaseException | None, reqs: list[AddEntry]) -> None:
        """Journal callback for a group of adds (sync thread, or this thread: an inline
        flush, a refusal). A kick's inline flush with no completion queued before it
        answers at once (the order is the same: nothing waits ahead of it), without the
        queue, the drain lock and the drain's call; the kick writes the answer at its end."""
        if self.kicking and not self._done and threading.get_ident() == self.loop_thread:
            try:
                self._added(conn, reqs, err)
            except Exception:  # as _drain: logged, never raised into the journal's callbacks
                log.exception("answering a completed request failed")
            return
        self._done.append((_ADD_DONE, conn, reqs, err))
        self._wake_drain()

    def _on_done(self, err: BaseException | None, ctx: Any) -> None:
        """Journal callback of one WRITE_LAC: ``ctx`` is ``(_LAC_WRITTEN, conn, req)``."""
        kind, conn, req = ctx
        self._done.append((kind, conn, req, err))
        self._wake_drain()

    def _wake_drain(self) -> None:
        if self.kicking and threading.get_ident() == self.loop_thread:
            return  # a kick's inline flush: the kick drains at once
        if self._drain_scheduled:  # read without the lock: the drain, which clears the
            return  # flag before it empties the queue, will find this completion
        with self._drain_lock:
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        if threading.get_ident() == self.loop_thread:  # an inline flush, a refusal: no self-pipe
            self._host.loop.call_soon(self._drain)
        else:
            self._host.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._drain_lock:
            self._drain_scheduled = False
        done = self._done
        while done:
            kind, conn, req, err = done.popleft()
            try:
                if kind == _ADD_DONE:
                    self._added(conn, req, err)
                else:
                    self._lac_written(conn, req, err)
            except Exception:  # one bad completion must not strand the others
                log.exception("answering a completed request failed")

    def _added(self, conn: Peer, reqs: list[AddEntry], err: BaseException | None) -> None:
        self.in_flight.count -= len(reqs)
        self.in_flight.bytes -= sum(map(len, map(_DATA, reqs)))
        if err is None:
            conn.respond_added(reqs)
            polls = self._polls
            if polls.any_waiting():
                for req in reqs:
                    if polls.waiting_on(req.ledger_id):
                        polls.lac_advanced(req.ledger_id, parse_entry_header(req.data).lac)
        else:
            for req in reqs:
                conn.respond(error_response(Op.ADD_ENTRY, req.ledger_id, req.entry_id, req.request_id, err))

    def _lac_written(self, conn: Peer, req: WriteLac, err: BaseException | None) -> None:
        if err is None:
            if req.body:  # BookKeeper's: answered to READ_LAC as it came (bounded: forgotten all at once)
                if len(self._lac_bodies) >= _LAC_BODIES:
                    self._lac_bodies.clear()
                self._lac_bodies[req.ledger_id] = req.body
            conn.respond(WriteLacResponse(req.ledger_id, req.request_id))
            if self._polls.waiting_on(req.ledger_id):
                try:
                    self._polls.lac_advanced(req.ledger_id, req.lac)
                except Exception:  # the WRITE_LAC is answered; a poll left parked times out
                    bookie_id = self._host.bookie_id
                    log.exception("bookie %s: waking the long polls of ledger %d failed", bookie_id,
                                  req.ledger_id, extra=context(bookie=bookie_id, ledger=req.ledger_id))
        else:
            conn.respond(error_response(Op.WRITE_LAC, req.ledger_id, -1, req.request_id, err))
