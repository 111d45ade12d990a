"""Long polls: READ_ENTRY with a previous LAC and a timeout, parked until the ledger's
LAC passes it.

Theory of operation
-------------------
A long-poll READ_ENTRY (previous LAC + timeout) waits until the ledger's LAC passes the
previous one (an add whose entry carries a higher LAC, or a WRITE_LAC:
:meth:`LongPolls.lac_advanced`, called by :mod:`bookie.server._writes`) or the timeout
ends (then ENOENTRY). Its answer carries the entry the poller named when this bookie
holds it (a follower names the next one it needs), else the last entry.

Ordering: the waiter is registered (on the loop) before the LAC is first read - on the
loop when memory knows it (the ledger's last entry still in its log's write buffer, as a
tailed ledger's is: :meth:`bookie.Bookie.memory_lac`, no thread hand-off), else on the
pool - so an advance between the two is never missed; whoever takes the waiter out of
the parked set first (advance, first check, timeout, stop, the connection going) answers
it - :attr:`LongPoll.done` says it was taken, and every path checks it, so a poll is
answered exactly once. The parked polls of a ledger are kept sorted by (previous LAC,
arrival), so an advance answers the lowest first: O(answered · log n). At most
``maxLongPolls`` are parked; more are answered EBUSY at once. Everything here runs on the
loop but the first LAC read and the pool's answers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
from typing import Any, Protocol

from sortedcontainers import SortedKeyList

from bookie._bookie import LAST_ENTRY, Bookie
from bookie._config import BookieConfig
from bookie.server._answers import Peer, error_response
from bookie.server._hooks import ServerHooks
from bookie.server._reads import ReadPool
from walkit.errors import BookieBusyError, NoSuchEntryError, WalkitError
from walkit.protocol import Op, ReadEntry, ReadEntryResponse, Response

__all__ = ["MAX_POLL_TIMEOUT_MS", "LongPoll", "LongPolls", "PollHost"]

MAX_POLL_TIMEOUT_MS = 600_000  # a long poll waits at most 10 minutes


class PollHost(Protocol):
    """What the long polls need of the server."""

    @property
    def config(self) -> BookieConfig: ...

    @property
    def bookie(self) -> Bookie | None: ...

    @property
    def loop(self) -> Any: ...

    @property
    def hooks(self) -> ServerHooks: ...

    @property
    def read_executor(self) -> concurrent.futures.Executor: ...


class LongPoll:
    """A parked long-poll read. ``done`` is set by whoever answers it first (an LAC
    advance, its first check, its timeout, shutdown, the connection going)."""

    __slots__ = ("conn", "req", "previous", "seq", "timer", "done")

    def __init__(self, conn: Peer, req: ReadEntry, seq: int) -> None:
        self.conn = conn
        self.req = req
        self.previous = -1 if req.previous_lac is None else req.previous_lac
        self.seq = seq
        self.timer: asyncio.TimerHandle | None = None
        self.done = False


def _poll_order(waiter: LongPoll) -> tuple[int, int]:
    return waiter.previous, waiter.seq


class LongPolls:
    """The parked long polls of one server (see the module docstring)."""

    def __init__(self, host: PollHost, reads: ReadPool) -> None:
        self._host = host
        self._reads = reads
        self.waiters: dict[int, SortedKeyList] = {}  # ledger -> parked polls by (previous LAC, seq)
        self._seq = itertools.count()
        self.count = 0  # polls parked

    def any_waiting(self) -> bool:
        return bool(self.waiters)

    def waiting_on(self, ledger_id: int) -> bool:
        return ledger_id in self.waiters

    def park(self, conn: Peer, req: ReadEntry) -> None:
        """Park a long poll, then read the ledger's LAC on the pool (:meth:`_first_check`)."""
        host = self._host
        if self.count >= host.config.max_long_polls:
            conn.respond(error_response(Op.READ_ENTRY, req.ledger_id, req.entry_id, req.request_id,
                                        BookieBusyError("too many long polls", limit=host.config.max_long_polls)))
            return
        waiter = LongPoll(conn, req, next(self._seq))
        waiters = self.waiters.get(req.ledger_id)
        if waiters is None:
            waiters = self.waiters[req.ledger_id] = SortedKeyList(key=_poll_order)
        waiters.add(waiter)
        conn.waiters.add(waiter)
        self.count += 1
        assert host.bookie is not None
        lac = host.bookie.memory_lac(req.ledger_id)
        if lac is not None:  # a tailed ledger's LAC is in memory: checked here, no hand-off to the pool
            self._first_check(waiter, lac)
            return
        loop = host.loop

        def checked(fut: Any) -> None:  # pool thread
            try:
                lac = fut.result()
            except WalkitError:
                lac = -1  # a ledger this bookie has not seen yet: wait for its first entry
            loop.call_soon_threadsafe(self._first_check, waiter, lac)

        try:
            host.read_executor.submit(host.bookie.read_lac, req.ledger_id).add_done_callback(checked)
        except RuntimeError:  # the read pool is shut down (stopping): answer as a timeout
            self.expired(waiter)

    def _first_check(self, waiter: LongPoll, lac: int) -> None:
        """The LAC when the poll arrived: answer now, or start the timeout. (Registered
        before this check, the waiter has not missed an advance in between.)"""
        if waiter.done:
            return
        if lac > waiter.previous:
            self._answer(waiter)
        else:
            timeout = min(waiter.req.timeout_ms, MAX_POLL_TIMEOUT_MS) / 1000.0
            waiter.timer = self._host.loop.call_later(timeout, self.expired, waiter)

    def _unpark(self, waiter: LongPoll) -> None:
        waiter.done = True
        if waiter.timer is not None:
            waiter.timer.cancel()
        waiters = self.waiters.get(waiter.req.ledger_id)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self.waiters[waiter.req.ledger_id]
        waiter.conn.waiters.discard(waiter)
        self.count -= 1

    def _answer(self, waiter: LongPoll) -> None:
        """Answer a poll whose LAC moved: here when the entry is still in memory (a
        tailing reader's is: just written), else from the read pool."""
        self._unpark(waiter)
        req = waiter.req
        bookie, hook = self._host.bookie, self._host.hooks.read
        assert bookie is not None
        try:
            recent = bookie.read_recent(req.ledger_id, req.entry_id)
            if recent is not None:
                entry_id, data, lac = recent
                if hook is not None:
                    data = hook(req.ledger_id, entry_id, data)
                answer = ReadEntryResponse(req.ledger_id, entry_id, lac, data, req.request_id)
        except Exception:  # the pool's path answers it, errors included
            recent = None
        if recent is None:
            self._reads.in_pool(waiter.conn, req, self._poll_read, req)
            return
        waiter.conn.respond(answer)

    def _poll_read(self, req: ReadEntry) -> Response:
        """A long poll's answer once the LAC passed the previous one: the entry the
        poller named (a follower names the one after its previous LAC: the entry it reads
        next, spared a second round trip) when this bookie holds it, else the last entry
        it stores - the LAC is what the poller waits for."""
        if req.entry_id != LAST_ENTRY:
            try:
                return self._reads.read_entry(req)
            except NoSuchEntryError:
                pass
        return self._reads.read_entry(dataclasses.replace(req, entry_id=LAST_ENTRY))

    def lac_advanced(self, ledger_id: int, lac: int) -> None:
        """Answer the waiters whose previous LAC is below ``lac`` (the lowest first:
        O(answered · log n))."""
        waiters = self.waiters.get(ledger_id)
        while waiters and waiters[0].previous < lac:
            self._answer(waiters[0])
            waiters = self.waiters.get(ledger_id)

    def expired(self, waiter: LongPoll) -> None:
        """The poll's time is up (or its client closed): answered ENOENTRY, unless taken."""
        if not waiter.done:
            self._unpark(waiter)
            self._answer_expired(waiter)

    def _answer_expired(self, waiter: LongPoll) -> None:
        req = waiter.req
        waiter.conn.respond(error_response(
            Op.READ_ENTRY, req.ledger_id, req.entry_id, req.request_id,
            NoSuchEntryError("long poll timed out: the LAC did not pass the previous one",
                             ledger=req.ledger_id, previous_lac=req.previous_lac)))

    def forget(self, conn: Peer) -> None:
        """``conn`` is gone: its polls are dropped unanswered."""
        for waiter in list(conn.waiters):
            self._unpark(waiter)

    def expire_all(self) -> None:
        """Shutdown: every parked poll is answered as timed out."""
        for waiters in list(self.waiters.values()):
            for waiter in list(waiters):
                self._unpark(waiter)
                self._answer_expired(waiter)
