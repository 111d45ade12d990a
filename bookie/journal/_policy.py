"""Group commit: when does the journal thread write and fdatasync its batch?

BookKeeper's rule (Journal.run), as a pure function so that it can be tested on a
fake clock. A batch is flushed when any of these holds:

* the oldest pending entry has waited ``journalMaxGroupWaitMSec`` (default 2 ms);
* buffered bytes reached ``journalBufferedWritesThreshold`` (default 512 KiB);
* buffered entries reached ``journalBufferedEntriesThreshold`` (default 0 = off);
* the queue is empty and ``journalFlushWhenQueueEmpty`` is set - **walkit's default is
  on** (BookKeeper's is off). Our writer frames every record into the batch as it is
  submitted, so no record ever waits in a queue outside the batch: this trigger means
  "flush as soon as the journal thread looks" (and BookKeeper's ``groupWhenTimeout``,
  which lets overdue queued entries join a timed-out batch, holds by construction). With a sync thread that gathers records while the previous
  fdatasync runs, batches grow by themselves under load, so waiting on an idle disk only
  adds latency: a lone writer is acknowledged in ~0.2 ms instead of ~2.3 ms, and 256
  entries in flight are not capped at 256 per 2 ms (docs/performance.md).

Waiting trades latency for batch size: every flush costs one write and one fdatasync
however many entries it carries.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["GroupCommitPolicy", "FlushReason", "flush_reason", "wait_timeout"]


class FlushReason(enum.Enum):
    MAX_WAIT = "max_wait"
    MAX_BYTES = "max_bytes"
    MAX_ENTRIES = "max_entries"
    QUEUE_EMPTY = "queue_empty"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True, slots=True)
class GroupCommitPolicy:
    max_group_wait: float = 0.002  # journalMaxGroupWaitMSec=2: bounds added latency
    buffered_writes_threshold: int = 512 * 1024  # journalBufferedWritesThreshold
    buffered_entries_threshold: int = 0  # journalBufferedEntriesThreshold (0 = off)
    flush_when_queue_empty: bool = True  # journalFlushWhenQueueEmpty (BookKeeper: false)


def flush_reason(
    policy: GroupCommitPolicy,
    now: float,
    oldest_enqueued: float | None,
    buffered_bytes: int,
    buffered_entries: int,
) -> FlushReason | None:
    """Why the pending batch must be flushed now, or None to keep gathering.

    ``oldest_enqueued`` is when the oldest entry of the batch was queued (None: the
    batch is empty, and an empty batch is never flushed)."""
    if oldest_enqueued is None:
        return None
    if now - oldest_enqueued >= policy.max_group_wait:
        return FlushReason.MAX_WAIT
    if buffered_bytes >= policy.buffered_writes_threshold:
        return FlushReason.MAX_BYTES
    if 0 < policy.buffered_entries_threshold <= buffered_entries:
        return FlushReason.MAX_ENTRIES
    if policy.flush_when_queue_empty:
        return FlushReason.QUEUE_EMPTY
    return None


def wait_timeout(policy: GroupCommitPolicy, *, now: float, oldest_enqueued: float | None) -> float | None:
    """How long the journal thread may sleep waiting for more entries: until the
    oldest pending entry reaches the group wait, or forever (None) with no batch."""
    if oldest_enqueued is None:
        return None
    return max(0.0, oldest_enqueued + policy.max_group_wait - now)
