"""A ledger writer's adds from submission until the loop takes them: the record of one
add (:class:`Add`) and the queue the application's threads put adds on
(:class:`AddQueue`).

Theory of operation
-------------------
Everything of a writer lives on the client's loop except this queue: it is the one
piece of a writer that any thread touches, and all of it is under one lock (which the
writer's ``max_pending_adds`` slots, :class:`~walkit.client._submit.Slots`, share, so
that taking a slot and queueing the add are one step).

* :meth:`AddQueue.put` (any thread) takes a slot (waiting for one, unless on the
  loop's own thread: that would stop the very loop that frees slots), then - under the
  same lock - numbers the entry, adds its length to the ledger's, and queues it. Entry
  ids are thus given in the order adds are queued, and the loop sends them in that
  order. A closed queue (the handle closed) and a failed writer refuse the add, giving
  its slot back.
* Whether the writer must be scheduled on the loop (``ClientCore.schedule``) is decided
  under the lock too: only the first add queued since the loop's last :meth:`take` asks
  for it, so a burst of adds costs one hand-over to the loop.
* :meth:`AddQueue.take` (loop) empties the queue in one go and re-opens scheduling,
  without the lock (a client writing round-robin over a thousand ledgers takes each
  writer's queue once per add, and the lock was a good part of that): the queue is a
  deque, whose ``append`` (under the lock, in entry order) and ``popleft`` are atomic,
  so a take gets a prefix of the adds in entry order. Scheduling is re-opened *before*
  the deque is emptied, and :meth:`AddQueue.put` appends before it looks, and sets the
  flag only when it found it clear: an add appended after the take's last ``popleft``
  finds the flag clear and schedules the writer; one that found it set was appended
  before the take that clears it empties the deque (at worst a writer is scheduled
  with nothing left to take). The deque is emptied, never swapped for a fresh one: a
  fresh one would live until the ledger's next add, long enough to reach the cyclic
  GC's oldest generation when thousands of ledgers are written round-robin (and make
  its full passes come often).
* A failed writer drains the queue (:meth:`AddQueue.take_failed`) and fails every add
  in it; scheduling is left as it is, since the loop's pending call clears it.

An :class:`Add` is made for the cyclic GC, which walks every object that lives past a
collection or two (an add lives a few ms to a few tens): the bookies it went to and
that acknowledged it are tuples of ``str`` (the write set's own tuple, usually; the GC
stops tracking tuples of strings), and it is its own context for the bookies' answers
(:meth:`Add.answered`) - a QuickFuture and this object per add, nothing else.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

from walkit.client._submit import QuickFuture, Slots
from walkit.errors import LedgerClosedError, UsageError, WalkitError
from walkit.protocol import Response

__all__ = ["Add", "AddQueue"]

_SAMPLE = 7  # adds whose entry id is a multiple of 8 are timed: the latency histogram's sample


class AckSink(Protocol):
    """What an add and its queue see of their writer."""

    @property
    def error(self) -> WalkitError | None: ...

    def on_ack(self, add: Add, bookie: str, error: WalkitError | None) -> None: ...


class Add:
    """One add in flight (see the module docstring for what it keeps, and why)."""

    __slots__ = ("writer", "entry_id", "payload", "length", "future", "data", "sent", "acked", "sent_at", "quorum",
                 "done", "slot", "started")

    def __init__(self, writer: AckSink, entry_id: int, payload: bytes, length: int, future: Future[int],
                 data: bytes = b"", slot: bool = True) -> None:
        self.writer = writer
        self.entry_id = entry_id
        self.payload = payload
        self.length = length  # the ledger's length including this entry
        self.future = future
        self.data = data  # the encoded entry, made when first sent (recovery: as read)
        self.sent: tuple[str, ...] = ()  # bookies of the current write set it went to
        self.acked: tuple[str, ...] = ()  # those of them that acknowledged it
        self.sent_at = 0.0
        self.quorum = False
        self.done = False
        self.slot = slot  # holds one of the writer's max_pending_adds slots
        self.started = 0.0  # when submitted, for one add in 8 (0: not timed)

    def answered(self, bookie: str, response: Response | None, error: WalkitError | None) -> None:
        """(Loop) ``bookie``'s answer to this add (BookiePool.request_each's target)."""
        self.writer.on_ack(self, bookie, error)


class AddQueue:
    """The adds submitted to ``writer`` and not yet taken by the loop (module docstring)."""

    # slots, not an instance dict: a pass over a thousand writers reads each one's state in fewer places
    __slots__ = ("_writer", "_ledger_id", "_in_loop", "_lock", "slots", "_incoming", "_scheduled", "_next_entry_id",
                 "_length", "closing")

    def __init__(self, writer: AckSink, ledger_id: int, max_pending_adds: int, in_loop: Callable[[], bool],
                 next_entry_id: int, length: int) -> None:
        self._writer = writer
        self._ledger_id = ledger_id
        self._in_loop = in_loop  # whether the caller is the client's loop thread (which must never wait)
        self._lock = threading.Lock()
        self.slots = Slots(max_pending_adds, self._lock)  # max_pending_adds, under the same lock
        self._incoming: collections.deque[Add] = collections.deque()
        self._scheduled = False
        self._next_entry_id = next_entry_id
        self._length = length
        self.closing = False  # (under the lock) no more adds: the handle is closing

    @property
    def queued(self) -> bool:
        """(Loop; read without the lock) whether adds wait to be taken."""
        return bool(self._incoming)

    def put(self, payload: bytes, future: QuickFuture[int], reserved: bool) -> tuple[Add | None, bool]:
        """(Any thread) number and queue an add of ``payload`` completing ``future``; the
        add (None: the writer failed, its error is the add's) and whether the writer must
        now be scheduled on the loop. Unless ``reserved`` (the caller took a slot already)
        this waits for a free slot. LedgerClosedError once closing; UsageError when no
        slot is free on the loop's own thread."""
        with self._lock:
            if not reserved:
                slots = self.slots
                if slots.free > 0:
                    slots.free -= 1
                # blocking on the loop thread would stop the very loop that frees slots
                elif not slots.take_locked(blocking=not self._in_loop()):
                    raise UsageError("too many adds in flight to wait for a slot on the client's loop thread",
                                     ledger=self._ledger_id, limit=slots.limit)
            if self.closing:
                self.slots.release_locked()
                raise LedgerClosedError("ledger handle is closed", ledger=self._ledger_id)
            if self._writer.error is not None:
                self.slots.release_locked()
                return None, False
            entry_id = self._next_entry_id
            self._next_entry_id += 1
            self._length += len(payload)
            add = Add(self._writer, entry_id, payload, self._length, future)
            if not entry_id & _SAMPLE:  # one add in 8 is timed (walkit_client_add_seconds)
                add.started = time.monotonic()
            self._incoming.append(add)  # before the flag is read (module docstring)
            if self._scheduled:
                return add, False
            self._scheduled = True  # only when it was clear: never over a take's clearing
        return add, True

    def unput(self, add: Add) -> None:
        """(Any thread) take back ``add``, just put, that nothing will ever send (the
        client closed before the writer could be scheduled); its slot is given back."""
        with self._lock:
            self._incoming.remove(add)
            self._scheduled = False
            self.slots.release_locked()

    def take(self) -> list[Add]:
        """(Loop) every add queued, in order; the next put schedules the writer again.
        No lock: see the module docstring."""
        self._scheduled = False  # before the deque is emptied
        incoming = self._incoming
        count = len(incoming)
        if count == 1:  # a writer among a thousand: an add per take
            return [incoming.popleft()]
        popleft = incoming.popleft
        return [popleft() for _ in range(count)]

    def take_failed(self) -> list[Add]:
        """(Loop) every add queued, for the failed writer to fail."""
        with self._lock:
            batch = list(self._incoming)
            self._incoming.clear()
        return batch

    def close(self) -> None:
        """No more adds (LedgerClosedError from now on)."""
        with self._lock:
            self.closing = True
