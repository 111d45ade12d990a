"""What every part of one client shares: options, the loop thread, the bookie pool, the
metadata session, and what the client has learnt about bookies' health and endpoints.

Submissions from the application's threads reach the loop through one queue for the
whole client (:meth:`ClientCore.schedule`): a writer with new adds is queued once, and
the loop is woken once for all the writers queued meanwhile, which then send their adds
and flush each bookie connection once. An application that writes round-robin over
thousands of ledgers thus pays one wake-up and one write per bookie per loop iteration,
as one that writes a single ledger does, not one per add.

Add timeouts are checked the same way: one sweep of the client, every
``add_timeout / 4`` while any writer has adds in flight (:meth:`ClientCore.watch_adds`),
not a timer per writer.

Placement reads no metadata in the common case: the writable bookies are watched from
the first choice on (the store calls back on every change of the lists), and a choice is
made from what the watch last said. The store is read instead when that is too few for
the choice (a bookie may have just registered and its event not be here yet) or older
than :data:`BOOKIE_LIST_MAX_AGE` (a watch may lag, or stop until the session comes
back). A bookie gone but not yet reported is handled as any failed bookie: the writer's
first add to it fails and an ensemble change replaces it (BookKeeper's watched bookie
list does the same).

Adds need no metadata, even during an outage of the store: the endpoints of the bookies
a ledger is created on (or moved to) are read with the bookie list, while the store
answers, so that the first connection to one of them is made from what was read; a
reconnection reads the registration again (a restarted bookie may have moved) and, if
the store does not answer, goes on with the endpoint known before.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Sequence, Sized
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from walkit.client._bookie_client import AddGroups
from walkit.client._config import ClientConfig
from walkit.client._loop import LoopThread
from walkit.client._placement import Placement, shortage
from walkit.client._pool import BookiePool, Endpoint, parse_endpoint
from walkit.client._stats import CLIENTS
from walkit.errors import MetadataUnavailableError, UsageError, WalkitError
from walkit.logs import context
from walkit.metadata import BookieSet, Cluster, Watch, read_registration

__all__ = ["ClientCore"]

T = TypeVar("T")

log = logging.getLogger(__name__)

FAILURE_MEMORY = 60.0  # seconds a failed bookie is picked last (BookKeeper's failure history)
BOOKIE_LIST_MAX_AGE = 5.0  # seconds a watched bookie list is chosen from before the store is read again
NO_RANGE_MEMORY = 300.0  # seconds a bookie that refused READ_RANGE is read entry by entry before it is asked again
#: A timeout sweep that runs this much later than planned (or one sweep interval, if
#: longer) means this process did not run meanwhile (SIGSTOP, a suspended VM, a starved
#: machine): the bookies' answers may be waiting unread, so no add is timed out by it.
STALL = 0.5


class _Failable(Protocol):
    def fail_for_close(self, error: WalkitError) -> None: ...


class _Timed(Protocol):
    @property
    def pending(self) -> Sized: ...

    def check_timeouts(self, now: float, stalled: bool) -> None: ...


class _Sender(Protocol):
    @property
    def ensemble(self) -> Sequence[str]: ...

    def take_incoming(self, flush: bool = True, sink: AddGroups | None = None) -> None: ...

    def abandon_incoming(self, error: WalkitError) -> None: ...


class ClientCore:
    def __init__(self, config: ClientConfig, cluster: Cluster, loop: LoopThread) -> None:
        self.config = config
        self.cluster = cluster
        self.ledgers = cluster.ledgers
        self.loop = loop
        self._metadata = ThreadPoolExecutor(4, thread_name_prefix="walkit-metadata")
        self.pool = BookiePool(config, self._resolve)
        self._endpoints: dict[str, Endpoint] = {}  # what each bookie registered, when last read
        self._unused: set[str] = set()  # endpoints read ahead (with a choice), no connection made yet
        self._failed_at: dict[str, float] = {}
        #: bookie -> when it answered READ_RANGE "unknown op" (an older walkit): read entry by entry
        self.no_range_reads: dict[str, float] = {}
        # the writable bookies as the store's watch or a read last told, and when (None: not yet)
        self._writable: frozenset[str] | None = None
        self._writable_at = 0.0
        self._bookie_watch: Watch | None = None
        self._watch_starting = False
        self._watch_lock = threading.Lock()  # never held across a store call
        self.closing = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.writers: weakref.WeakSet[_Failable] = weakref.WeakSet()
        self.writers_lock = threading.Lock()  # writers are made on any thread (BookKeeper.create_ledger)
        self.stats = CLIENTS.new(self)  # written on the loop thread only (walkit/client/_stats.py)
        # writers with adds to send (any thread appends; the loop takes them all at once)
        self._ready: collections.deque[_Sender] = collections.deque()
        self._ready_scheduled = False
        # writers with adds in flight, for the one add-timeout sweep (loop only)
        self._watched: set[_Timed] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_due = 0.0  # when the sweep was planned to run (time.monotonic())
        self._sweep_every = max(0.05, config.add_timeout / 4)
        # the writer that went idle last, and when (time.monotonic()): a plain ledger's
        # idle LAC yields to a crowd of writers (walkit/client/_writer_lac.py)
        self.last_idle_writer: object = None
        self.last_idle_at = 0.0
        loop.quiet = self.quiet  # a lone synchronous caller may run the loop when it is (walkit/client/_baton.py)

    def quiet(self) -> bool:
        """(Loop) whether the client owes nobody an answer from a bookie: no writer has
        adds pending, no task of the core (an ensemble change) runs, no connection is
        being made. Then the loop thread may park while a lone caller runs the loop."""
        return not self._tasks and not self.pool.connecting and not any(w.pending for w in self._watched)

    def schedule(self, writer: _Sender) -> None:
        """(Any thread) ``writer`` has adds queued: the loop sends them soon, with those
        of every writer queued meanwhile (one wake-up for all). Raises UsageError when
        the client is closed; the adds of writers queued with this one are then failed
        (nothing would ever send them).

        No lock: a client writing round-robin over a thousand ledgers schedules a writer
        for nearly every add, and a lock its loop thread takes too cost a hand-over of the
        interpreter lock now and then. A deque's ``append`` and ``popleft`` are atomic;
        the loop clears ``_ready_scheduled`` *before* it empties the deque
        (:meth:`_send_ready`), so a writer appended after the loop took the last one
        finds the flag clear and wakes the loop itself, and one that finds it set was
        appended before the pass that the setter woke empties the deque (at worst a
        pass finds nothing: two threads that both found the flag clear)."""
        self._ready.append(writer)
        if self._ready_scheduled:
            return
        self._ready_scheduled = True
        try:
            self.loop.call(self._send_ready)
        except UsageError as exc:
            self._ready_scheduled = False
            ready = self._ready
            while ready:
                other = ready.popleft()
                if other is not writer:
                    other.abandon_incoming(exc)
            raise

    def _send_ready(self) -> None:
        """(Loop) every queued writer sends its adds; then each bookie they went to is
        flushed once (now, not at the loop's next iteration). The writers' batches are
        queued together: one :meth:`BookieClient.queue_add_groups` per bookie for all of
        them (frames of different ledgers share a write; each writer's stay in entry
        order), not one call per writer and bookie - a pass over a thousand writers with
        an add each costs three calls rather than three thousand."""
        self._ready_scheduled = False  # before the deque is emptied: schedule()'s docstring
        ready = self._ready
        ensembles: set[Sequence[str]] = set()
        sink = AddGroups()
        try:
            while ready:
                writer = ready.popleft()
                writer.take_incoming(False, sink)
                ensembles.add(writer.ensemble)
        finally:  # what was made pending is sent, whatever happened to a writer after it
            sink.queue()
        self.pool.flush({bookie for ensemble in ensembles for bookie in ensemble})

    def watch_adds(self, writer: _Timed) -> None:
        """(Loop) ``writer`` has adds in flight: the client's timeout sweep, one timer
        for every writer, looks at it every ``add_timeout / 4`` until it has none (a
        timer per writer, armed again whenever an idle writer got an add, cost as much
        as the add itself once thousands of ledgers were written round-robin)."""
        self._watched.add(writer)
        if self._sweep is None:
            self._sweep_due = time.monotonic() + self._sweep_every
            self._sweep = asyncio.get_running_loop().call_later(self._sweep_every, self._sweep_timeouts)

    def _sweep_timeouts(self) -> None:
        self._sweep = None
        now = time.monotonic()
        late = now - self._sweep_due
        stalled = late > max(STALL, self._sweep_every)
        if stalled:
            log.warning("the add-timeout check ran %.1f s late (was this process stopped?): the adds in flight of %d "
                        "writers get %.1f s more", late, len(self._watched), self.config.add_timeout)
        for writer in list(self._watched):
            if writer.pending:
                writer.check_timeouts(now, stalled)
            if not writer.pending:
                self._watched.discard(writer)
        if self._watched and not self.closing and self._sweep is None:
            self._sweep_due = now + self._sweep_every
            self._sweep = asyncio.get_running_loop().call_later(self._sweep_every, self._sweep_timeouts)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as a task the core keeps (asyncio keeps only weak references) and
        cancels when the client closes."""
        if self.closing:
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def md(self, fn: Callable[..., T], *args: object) -> T:
        """Run a blocking metadata call off the loop."""
        return await asyncio.get_running_loop().run_in_executor(self._metadata, fn, *args)

    async def _resolve(self, bookie: str) -> Endpoint:
        """(Loop) the endpoint to connect to ``bookie`` at (see the module docstring)."""
        if bookie in self._unused:
            self._unused.discard(bookie)
            return self._endpoints[bookie]
        try:
            endpoint = await self.md(self._registration_of, bookie)
        except MetadataUnavailableError as exc:
            known = self._endpoints.get(bookie)
            if known is None:
                raise
            log.warning("metadata unavailable: connecting to bookie %s at its last known endpoint (%s)", bookie, exc,
                        extra=context(bookie=bookie))
            return known
        self._endpoints[bookie] = endpoint
        return endpoint

    def _registration_of(self, bookie: str) -> Endpoint:
        info = self.cluster.info
        return parse_endpoint(bookie, read_registration(self.cluster.store, info, bookie), info.format)

    def _read_ahead(self, bookies: list[str]) -> dict[str, Endpoint]:
        """(Metadata thread) the endpoints of those of ``bookies`` never read before
        (best effort: one that cannot be read is read again when connecting)."""
        found: dict[str, Endpoint] = {}
        for bookie in bookies:
            try:
                found[bookie] = self._registration_of(bookie)
            except WalkitError:
                continue
        return found

    async def _learn_endpoints(self, bookies: list[str]) -> None:
        new = [b for b in bookies if b not in self._endpoints]
        if new:
            for bookie, endpoint in (await self.md(self._read_ahead, new)).items():
                if bookie not in self._endpoints:
                    self._endpoints[bookie] = endpoint
                    self._unused.add(bookie)

    # -- bookie health and placement ---------------------------------------------------
    def bookie_failed(self, bookie: str) -> None:
        self._failed_at[bookie] = time.monotonic()

    def recently_failed(self, bookie: str) -> bool:
        at = self._failed_at.get(bookie)
        return at is not None and time.monotonic() - at < FAILURE_MEMORY

    def note_no_range_reads(self, bookie: str) -> None:
        """``bookie`` does not know READ_RANGE: read it entry by entry for a while."""
        self.no_range_reads[bookie] = time.monotonic()

    def speaks_range_reads(self, bookie: str) -> bool:
        """Whether runs may be asked of ``bookie``: it did not refuse READ_RANGE in the last
        :data:`NO_RANGE_MEMORY` seconds (an older bookie may be upgraded meanwhile)."""
        at = self.no_range_reads.get(bookie)
        return at is None or time.monotonic() - at >= NO_RANGE_MEMORY

    def read_order(self, bookies: tuple[str, ...] | list[str]) -> list[str]:
        """Replicas to read from: as given, recently failed ones last."""
        return sorted(bookies, key=self.recently_failed)

    async def choose_bookies(self, want: Placement) -> list[str]:
        """``want.needed`` distinct writable bookies not in ``want.exclude``, at random,
        bookies that failed lately only when no others are left (NotEnoughBookiesError,
        with what the ledger needs and the remedy: walkit/client/_placement.py)."""
        count, exclude = want.needed, want.exclude
        writable = self._writable
        if not self._fresh(writable, count, exclude):  # (the watch may lag a bookie that just joined)
            writable = await self.md(self._read_bookies)
        assert writable is not None
        candidates = [b for b in writable if b not in exclude]
        if len(candidates) < count:
            raise shortage(want, writable)
        chosen = self._pick(candidates, count)
        await self._learn_endpoints(chosen)
        return chosen

    def bookies_now(self, count: int) -> list[str] | None:
        """(Any thread) what :meth:`choose_bookies` gives for a new ledger, when it needs
        neither the store nor the loop: the watched list is fresh and every chosen
        bookie's endpoint known; None otherwise."""
        writable = self._writable
        if self.closing or not self._fresh(writable, count, frozenset()):
            return None
        assert writable is not None
        chosen = self._pick(list(writable), count)
        return chosen if all(b in self._endpoints for b in chosen) else None

    def _fresh(self, writable: frozenset[str] | None, count: int, exclude: frozenset[str]) -> bool:
        return (writable is not None and time.monotonic() - self._writable_at <= BOOKIE_LIST_MAX_AGE
                and len(writable.difference(exclude)) >= count)

    def _pick(self, candidates: list[str], count: int) -> list[str]:
        random.shuffle(candidates)
        candidates.sort(key=self.recently_failed)
        return candidates[:count]

    def _read_bookies(self) -> frozenset[str]:
        """(Metadata thread) the writable bookies, read from the store; the lists are
        watched from now on (a watch that could not be started is tried again next time)."""
        self._start_watch()
        writable = self.cluster.bookies().writable
        self._writable, self._writable_at = writable, time.monotonic()
        return writable

    def _start_watch(self) -> None:
        with self._watch_lock:
            if self._bookie_watch is not None or self._watch_starting or self.closing:
                return
            self._watch_starting = True
        watch: Watch | None = None
        try:
            watch = self.cluster.watch_bookies(self._bookies_changed)
        except WalkitError as exc:  # the read that follows says whether the store answers
            log.debug("bookie lists not watched: %s", exc)
        finally:
            with self._watch_lock:
                self._watch_starting = False
                late = watch is not None and self.closing
                if watch is not None and not late:
                    self._bookie_watch = watch
        if late and watch is not None:
            watch.cancel()

    def _bookies_changed(self, bookies: BookieSet) -> None:
        """(The store's thread) the lists changed."""
        self._writable, self._writable_at = bookies.writable, time.monotonic()

    async def close(self) -> None:
        """Fail what writers still have in flight (their outcome is unknown), stop the
        core's tasks, close every connection."""
        self.closing = True
        with self._watch_lock:
            watch, self._bookie_watch = self._bookie_watch, None
        if watch is not None:
            watch.cancel()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        error = UsageError("client closed with adds in flight: their outcome is unknown")
        with self.writers_lock:
            writers = list(self.writers)
        for writer in writers:
            writer.fail_for_close(error)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.pool.close()
        self._metadata.shutdown(wait=False)
        CLIENTS.retire(self)
