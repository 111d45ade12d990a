"""One future for many records: what ``WriteAheadLog.append_many`` hands back.

Theory of operation
-------------------
The writer queues a record and the future that waits for it side by side, and completes
an entry's futures with its records' LSNs in one pass (``QuickFuture.set_results``).
``append_many(records)`` queues its records the same way, but its future slot holds one
:class:`ManyFuture`, repeated once per record (``[many] * n``: one list operation,
no object per record). The records go into entries with whatever else is queued, in
call order, so one call's records may share an entry with other calls' records or span
several entries.

An entry whose records include such a group is completed by :func:`complete_entry`,
which walks the entry's slots a *run* at a time: a run of a group's records is as long
as the group's records still waiting, or the rest of the entry, whichever is shorter
(a group's records are contiguous). The group notes each run and completes when its
last record's entry did (entries complete in order, so groups do too); its list of LSNs is
made from the runs when it is first asked for. An
entry without a group takes the one-pass path, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from itertools import chain
from typing import Any

from walkit.client import QuickFuture
from walkit.wal._lsn import LSN

__all__ = ["ManyFuture", "complete_entry"]


class ManyFuture(QuickFuture[list[LSN]]):
    """The future of ``count`` records appended together: their LSNs, in order, once the
    last of them is durable.

    The completer (the client's loop) records only where the group's records went - a run
    ``(segment, entry, first slot, end slot)`` an entry - and the list of LSNs is made by the
    first ``result()`` (the caller's thread, or the loop of an asyncio caller; a done
    callback that asks makes it where it runs). An LSN made on the client's loop would live
    until the caller takes it; made when taken, it lives as long as the caller keeps it,
    and the client's loop, which every entry's acknowledgements wait for, does not make
    them (``WriteAheadLog.flush`` waits for a group without taking its result)."""

    __slots__ = ("runs", "waiting")

    def __init__(self, count: int) -> None:
        super().__init__()
        self.runs: list[tuple[int, int, int, int]] = []
        self.waiting = count  # records not yet in a completed entry

    def take(self, segment: int, entry: int, first: int, last: int) -> None:
        """Slots ``first`` .. ``last - 1`` of an entry are this group's records."""
        self.runs.append((segment, entry, first, last))
        self.waiting -= last - first
        if self.waiting == 0:
            self.set_result(None)  # type: ignore[arg-type]  # the list is made when asked for

    def result(self, timeout: float | None = None) -> list[LSN]:
        if not self.done() or self._exception is not None:  # done: FINISHED (a QuickFuture is never cancelled)
            super().result(timeout)  # waits; raises the writer's error
        lsns: list[LSN] | None = self._result
        if lsns is None:
            with _MAKING:  # once, whoever asks first
                lsns = self._result
                if lsns is None:
                    lsns = self._result = list(chain.from_iterable(LSN.slots_between(*run) for run in self.runs))
                    self.runs = []  # made: not needed any more
        return lsns


_MAKING = threading.Lock()


def complete_entry(futures: Sequence[Any], segment: int, entry: int) -> None:
    """Complete the futures of one entry's records (slot ``i``: ``futures[i]``), where
    some are :class:`ManyFuture` groups."""
    slot, count = 0, len(futures)
    while slot < count:
        fut = futures[slot]
        if fut.__class__ is ManyFuture:
            end = min(count, slot + fut.waiting)
            fut.take(segment, entry, slot, end)
            slot = end
        else:
            fut.set_result(LSN.unchecked(segment, entry, slot))
            slot += 1


def fail_all(futures: Sequence[Future[Any]], error: BaseException) -> int:
    """Fail every future of ``futures`` not done yet (a group once); how many failed."""
    failed = 0
    for fut in futures:
        if not fut.done():
            fut.set_exception(error)
            failed += 1
    return failed
