"""A writer's administration: snapshots' bookkeeping, truncation and background retention.

Theory of operation
-------------------
Snapshots (walkit/wal/_snapshots.py), explicit truncations and retention passes
(walkit/wal/_retention.py) each read the log node, decide, and compare-and-set it; they
run one at a time under :attr:`LogAdmin.lock` - taken by the caller's thread for the
synchronous API, waited for without blocking on an event loop (``wait_locked``) for the
asyncio one and for the background pass - so none of them decides on a node another is
changing, and the sets of :class:`~walkit.wal._state.WriterState` they share stay whole.
The lock is never waited for on a metadata thread: what holds it may need one.

The background pass runs on the client's loop and does its work on a metadata thread:
when the writer opens (if the log has a policy and snapshots, or pending snapshots a
dead writer left), after every roll and snapshot (:meth:`LogAdmin.want_pass`) and every
``PASS_INTERVAL`` seconds while an age rule is set. It ends when the writer closes or
fails; a failed pass is counted and logged, and the next one tries again. A pass, a
snapshot or a truncation that finds the writer fenced fails the writer for good
(:class:`WriterHealth`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence
from typing import Protocol

from walkit.errors import InvalidArgumentError, WalkitError, WriterFencedError
from walkit.logs import context
from walkit.wal._format import SnapshotRef
from walkit.wal._lsn import LSN
from walkit.wal._retention import PASS_INTERVAL, cut, delete_ledgers, wait_locked
from walkit.wal._snapshots import Snapshot
from walkit.wal._state import WriterState
from walkit.wal._stats import LogStats

__all__ = ["LogAdmin", "WriterHealth"]

log = logging.getLogger("walkit.wal._log")  # the logger these lines always had


class WriterHealth(Protocol):
    """What administration asks of the writer it serves."""

    @property
    def closing(self) -> bool:
        """Whether the writer's close began."""

    @property
    def error(self) -> WalkitError | None:
        """What failed the writer (None: it works)."""

    @property
    def last_lsn(self) -> LSN | None:
        """The last record acknowledged."""

    def fail(self, error: WalkitError) -> None:
        """Fail the writer for good (its queued records too)."""


class LogAdmin:
    """Snapshots' bookkeeping, truncation and the background retention pass of one writer."""

    def __init__(self, state: WriterState, health: WriterHealth, stats: LogStats) -> None:
        self.state = state
        self.lock = threading.Lock()  # snapshot, truncate and retention passes, one at a time
        self._health = health
        self._stats = stats
        self._wanted = asyncio.Event()  # set: a retention pass is wanted
        self._task: asyncio.Task[None] | None = None

    # -- snapshots ---------------------------------------------------------------------------
    def check_snapshot_lsn(self, lsn: LSN) -> None:
        """(Blocking) InvalidArgumentError unless every record up to ``lsn`` is durable."""
        meta = self.state.node.read()[0]
        known = {s.seq: s for s in meta.segments}
        if lsn.segment not in known:
            raise InvalidArgumentError("snapshot LSN names no segment of the log", lsn=str(lsn),
                                       segments=f"{meta.segments[0].seq}..{meta.segments[-1].seq}"
                                       if meta.segments else "none")
        last_lsn = self._health.last_lsn
        if last_lsn is not None and lsn <= last_lsn:
            return
        if lsn.segment >= self.state.segment.seq:
            raise InvalidArgumentError("snapshot LSN is past the last acknowledged record", lsn=str(lsn),
                                       last=str(last_lsn))
        # a segment closed before this writer: everything in it up to its last entry is durable
        last_entry = self.state.bk.ledger_metadata(known[lsn.segment].ledger_id).last_entry_id
        if lsn.entry > last_entry:
            raise InvalidArgumentError("snapshot LSN is past the end of its segment", lsn=str(lsn),
                                       last_entry=last_entry)

    def snapshot_failed(self, exc: BaseException) -> None:
        """A snapshot failed with ``exc``: a fenced writer is done for good."""
        if isinstance(exc, WriterFencedError):
            self._health.fail(exc)

    async def snapshotted(self, snapshot: Snapshot, pruned: Sequence[SnapshotRef]) -> None:
        """(Loop) after a snapshot was listed: delete the ones it pushed out, count it,
        let retention look again."""
        self.state.undeleted.update(old.ledger_id for old in pruned)
        await self.state.client.metadata(delete_ledgers, self.state)
        self._stats.snapshots += 1
        self._stats.snapshot_bytes += snapshot.size
        self._wanted.set()

    # -- truncation --------------------------------------------------------------------------
    def truncate_locked(self, before: LSN) -> int:
        """(Blocking, :attr:`lock` held) the cut of ``WriteAheadLog.truncate``."""
        try:
            return len(cut(self.state, before))
        except WriterFencedError as exc:
            self._health.fail(exc)
            raise

    # -- retention in the background ---------------------------------------------------------
    def start(self, first_pass: bool) -> None:
        """(Loop) start the background pass; ``first_pass``: one now."""
        self._task = asyncio.get_running_loop().create_task(self._passes())
        if first_pass:
            self._wanted.set()

    def want_pass(self) -> None:
        """(Loop) a pass is wanted (a roll, a snapshot)."""
        self._wanted.set()

    async def _passes(self) -> None:
        """(Loop) one retention pass at a time, on a metadata thread: at open, when asked
        (rolls, snapshots) and every PASS_INTERVAL while an age rule is set."""
        event, health, name, namespace = self._wanted, self._health, self.state.name, self.state.namespace
        while True:
            every = PASS_INTERVAL if self.state.settings.retention.max_age is not None else None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), every)
            event.clear()
            if health.closing or health.error is not None:
                return
            try:
                async with wait_locked(self.lock):  # waited for here, never on a metadata thread
                    if health.closing:
                        return
                    await self.state.client.metadata(self._retain_once)
            except WriterFencedError as exc:
                health.fail(exc)
                return
            except WalkitError as exc:
                self._stats.retention_failures += 1
                log.warning("log %s: retention pass failed: %s", name, exc,
                            extra=context(log=name, namespace=namespace))
            except Exception:  # a bug: said loudly, and the next pass tries again
                self._stats.retention_failures += 1
                log.exception("log %s: retention pass failed", name, extra=context(log=name, namespace=namespace))

    async def stop(self) -> None:
        """(Loop) end the background pass, letting one under way finish."""
        task = self._task
        if task is not None:
            self._wanted.set()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _retain_once(self) -> None:
        """(Metadata thread, :attr:`lock` held: never beside a snapshot or a truncate of
        this writer) one background pass."""
        self._stats.retention_passes += 1
        self._stats.retention_segments += len(cut(self.state))
