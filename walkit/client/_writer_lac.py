"""When a ledger's writer sends its LAC on its own (WRITE_LAC): the explicit-LAC timer
and the idle LAC, for one :class:`~walkit.client._writer.LedgerWriter`.

Theory of operation
-------------------
Every entry carries the LAC the writer had when it encoded the entry (BookKeeper's
piggyback): a bookie that receives entry *e* learns that entries up to its LAC are
acknowledged, and a tailing reader learns it from the bookie. A writer that stops adding
leaves its last entries unseen, so there are two ways to send the LAC on its own, both
best effort (the next entry carries the LAC anyway) and both sent at most once for a
given LAC (:attr:`LacPublisher.piggybacked`: the highest LAC that went out, on an entry or
alone):

* **the timer** (``explicit_lac_interval``, BookKeeper's ``explicitLacInterval``; off by
  default): every interval while the LAC advanced and no entry carried it, WRITE_LAC to
  every bookie of the ensemble.
* **the idle LAC** (``idle_lac``): when the last pending add completes and none is
  queued, the writer goes idle and no entry will carry that LAC soon. It is sent to the bookies that acknowledged the LAC's
  entry (Qa of them, usually). They hold the entry, which their answer to a long poll
  carries along, and they are enough for every reader: a long poll takes the first
  answer of any bookie, and READ_LAC waits for Qw - Qa + 1 answers of the entry's write
  set, which cannot all come from its other Qw - Qa bookies.

**A writer that appends back to back waits ``idle_lac_delay``** (0.5 ms by default)
before its idle LAC leaves. Appending one record at a time, it goes idle after every
append, and its next append usually comes within microseconds, carrying that LAC on its
entry: an immediate idle LAC cost two requests per append (a send each on the writer's
side and a request each on two bookies) for nothing. So the writer times each idle
spell, from going idle to the next entry (:meth:`carried`): after one shorter than the
delay, the next idle LAC waits the delay and the next entry cancels it - such a writer
sends no WRITE_LAC at all; after a longer one (a writer that appends now and then: a
tailing reader waits for each of its entries) it leaves at once, as it always did. The
last entry of a run of appends is thus seen 0.5-1.5 ms later (the delay, and the parked
loop thread's ``tick``: the wait is a timer of the client's loop, and a cancelled one
costs the loop nothing - walkit/client/_baton.py skips cancelled timers). The entries
before it are seen no later: a bookie publishes the LAC an add carries to the ledger's
waiting long polls as the add arrives (bookie/server/_writes.py, ``_publish_carried``).
``idle_lac_delay`` 0: always at once.

**Who sends an idle LAC.** ``idle_lac=True``: every writer; False: none (the LAC rides
on the next entry, as in BookKeeper); None, the default: a WriteAheadLog's writers, and a
plain ledger's unless it *yields to a crowd* - another writer of the same client went idle
less than :data:`CROWD` (1 ms) before it. A client writing to many ledgers at once (a
thousand ledgers, an add each in turn) has writers going idle thousands of times a
second, and an idle LAC each would cost two requests per add; there the LAC rides on each
ledger's next entry. One ledger written now and then, or one at a time back to back,
is not a crowd.

A WRITE_LAC needs no fsync on the bookies (it only says which entries Qa bookies
acknowledged). A recovery writer publishes nothing (its LAC is the close's business).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Container, Sequence, Sized
from typing import Any, Protocol

from walkit.client._add_queue import AddQueue
from walkit.client._core import ClientCore
from walkit.client._entry_codec import EntryCodec
from walkit.errors import WalkitError
from walkit.metadata import LedgerMetadata, LedgerState
from walkit.protocol import Response, WriteLac

__all__ = ["CROWD", "LacPublisher", "LacWriter"]

#: A plain ledger's writer that goes idle within this many seconds of another writer of
#: the same client sends no idle LAC (module docstring).
CROWD = 0.001

log = logging.getLogger(__name__)


class LacWriter(Protocol):
    """What the publisher sees of its writer (:class:`~walkit.client._writer.LedgerWriter`)."""

    @property
    def core(self) -> ClientCore: ...
    @property
    def codec(self) -> EntryCodec: ...
    @property
    def ledger_id(self) -> int: ...
    @property
    def key(self) -> bytes: ...
    @property
    def recovery(self) -> bool: ...
    @property
    def lac(self) -> int: ...
    @property
    def error(self) -> WalkitError | None: ...
    @property
    def meta(self) -> LedgerMetadata: ...
    @property
    def pending(self) -> Sized: ...
    @property
    def queue(self) -> AddQueue: ...
    @property
    def ensemble(self) -> Sequence[str]: ...
    @property
    def failed(self) -> Container[str]: ...


class LacPublisher:
    """The LAC that ``writer`` sends on its own (module docstring)."""

    # slots, not an instance dict: a pass over a thousand writers reads each one's state in fewer places
    __slots__ = ("writer", "piggybacked", "interval", "idle", "yields", "idle_delay", "_timer", "_idle_timer",
                 "_idle_to", "idle_since", "_back_to_back")

    def __init__(self, writer: LacWriter, lac: int) -> None:
        config = writer.core.config
        self.writer = writer
        self.piggybacked = lac  # the highest LAC that went out on an entry or WRITE_LAC
        self.interval = config.explicit_lac_interval  # a WAL sets its own
        # None: on, yielding to a crowd (a WAL's writer: on, never yielding, unless the
        # client said False); a recoverer's LAC is the close's business
        self.idle = config.idle_lac is not False and not writer.recovery
        self.yields = config.idle_lac is None
        self.idle_delay = config.idle_lac_delay
        self._timer: asyncio.TimerHandle | None = None  # the explicit-LAC timer
        self._idle_timer: asyncio.TimerHandle | None = None  # the idle LAC's wait
        self._idle_to: Collection[str] | None = None  # where the idle LAC goes (went_idle's acked)
        self.idle_since = 0.0  # (time.monotonic()) when the writer went idle; 0: it is not
        self._back_to_back = False  # its last idle spell was shorter than idle_delay

    def carried(self, lac: int, now: float = 0.0) -> None:
        """(Loop) an entry was encoded with ``lac`` piggybacked: no idle LAC is owed (the
        writer calls it when ``lac`` is news, or the writer was idle: ``idle_since``).
        ``now``: ``time.monotonic()`` as the caller read it (0: read it here)."""
        if lac > self.piggybacked:
            self.piggybacked = lac
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self.idle_since:
            self._back_to_back = (now or time.monotonic()) - self.idle_since < self.idle_delay
            self.idle_since = 0.0

    def arm(self) -> None:
        """(Loop) start the explicit-LAC timer, if it is on and something may need it."""
        writer = self.writer
        if self._timer is None and self.interval > 0 and not writer.recovery and (
                writer.pending or writer.lac > self.piggybacked):  # an idle writer with nothing to send: no timer
            self._timer = asyncio.get_running_loop().call_later(self.interval, self._send_lac)

    def went_idle(self, acked: Collection[str] | None) -> None:
        """(Loop) the last pending add completed, none is queued: publish the LAC to
        the bookies of the ensemble in ``acked`` (those that acknowledged its entry; None
        or none of them: the ensemble) after ``idle_delay`` unless an entry carries it.
        Which bookies those are is worked out only when the LAC leaves (a writer that
        yields to a crowd sends nothing)."""
        writer = self.writer
        if not self.idle or writer.lac <= self.piggybacked:
            return
        self.idle_since = now = time.monotonic()
        if self.yields:  # a crowd: another writer of the client went idle just now
            core = writer.core
            crowded = core.last_idle_writer is not writer and now - core.last_idle_at < CROWD
            core.last_idle_writer, core.last_idle_at = writer, now
            if crowded:
                return
        if not self._back_to_back:  # (idle_delay 0: never) it idled longer last time: at once
            self.publish(self._among(acked))
            return
        self._idle_to = acked
        if self._idle_timer is None:
            self._idle_timer = asyncio.get_running_loop().call_later(self.idle_delay, self._idle_over)

    def stop(self) -> None:
        """(Loop) the writer closes: no timer outlives it."""
        for timer in (self._timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._idle_timer = None

    def _idle_over(self) -> None:
        self._idle_timer = None
        writer = self.writer
        if writer.error is None and writer.meta.state is not LedgerState.CLOSED and not writer.pending and \
                not writer.queue.queued:  # (an add on its way carries it)
            self.publish(self._among(self._idle_to))

    def _send_lac(self) -> None:
        self._timer = None
        writer = self.writer
        if writer.error is not None or writer.meta.state is LedgerState.CLOSED:
            return
        self.publish()
        self.arm()

    def _among(self, acked: Collection[str] | None) -> list[str] | None:
        """The bookies of the ensemble in ``acked``, in the ensemble's order (None: none)."""
        if not acked:
            return None
        return [b for b in self.writer.ensemble if b in acked] or None

    def publish(self, to: list[str] | None = None) -> None:
        """Send the LAC on its own (WRITE_LAC) to ``to`` (None: the ensemble), unless an
        entry or an earlier WRITE_LAC already carried it."""
        writer = self.writer
        if writer.lac > self.piggybacked:
            self.piggybacked = writer.lac
            request = WriteLac(writer.ledger_id, writer.lac, writer.key,
                               body=writer.codec.lac_body(writer.ledger_id, writer.lac))
            for bookie in writer.ensemble if to is None else to:
                if bookie not in writer.failed:
                    writer.core.pool.request_cb(bookie, request, _ignore, None)


def _ignore(response: Response | None, error: WalkitError | None, ctx: Any) -> None:
    """Explicit LAC writes are best effort: the next entry carries the LAC anyway."""
    if error is not None:
        log.debug("explicit LAC not written: %s", error)
