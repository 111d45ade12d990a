"""Compaction of one entry log: live records copied out, then the log removed.

Theory of operation
-------------------
The storage provides the crash-safe steps (:mod:`bookie.storage._reclaim`: marker,
relocate, flush, remove); this module drives them for one log at a pace and within a
time budget. Records are copied in small batches (``_BATCH_RECORDS`` records or
``_BATCH_BYTES`` bytes) so a batch holds the storage's lock only briefly and adds keep
flowing; the rate limiter is charged after each batch with what it copied (entries, or
bytes with ``isThrottleByBytes``: dead records cost a read only). When the budget runs out or the bookie stops, the copies made so
far are flushed and the log keeps its marker: the next pass continues it (its already
moved records are dead by then and are skipped).

A log whose intact records end before the end its usage recorded (its size when it was
sealed; for the log being written at a crash, where its torn tail begins) holds a damaged
record: it is never removed (what follows the damage may be live), and the caller stops
choosing it. Bytes after the recorded end are a torn tail: never indexed, garbage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from bookie.gc._policy import RateLimiter
from bookie.storage import EntryLogInfo, LedgerStorage
from bookie.storage._format import LOG_HEADER_SIZE, RECORD_HEADER
from bookie.storage._reclaim import Record
from walkit.errors import CorruptionError

__all__ = ["CompactionOutcome", "compact_log"]

log = logging.getLogger("bookie.gc")

_BATCH_RECORDS = 64
_BATCH_BYTES = 256 << 10


@dataclass
class CompactionOutcome:
    done: bool  # the log was removed
    entries: int = 0  # live entries copied
    bytes_copied: int = 0
    bytes_freed: int = 0


def compact_log(storage: LedgerStorage, info: EntryLogInfo, limiter: RateLimiter, by_bytes: bool,
                deadline: float, stopping: Callable[[], bool], clock: Callable[[], float] = time.monotonic,
                ) -> CompactionOutcome:
    """Compact sealed log ``info`` (see the module docstring); raises CorruptionError
    for a damaged log (nothing removed)."""
    if not info.compacting:
        storage.mark_compacting(info.dir, info.log_id)
    out = CompactionOutcome(done=False)
    end = LOG_HEADER_SIZE
    batch: list[Record] = []
    batch_bytes = 0
    for record in storage.log_records(info.dir, info.log_id):
        batch.append(record)
        batch_bytes += RECORD_HEADER.size + len(record[3])
        end = record[0] + RECORD_HEADER.size + len(record[3])
        if len(batch) >= _BATCH_RECORDS or batch_bytes >= _BATCH_BYTES:
            _copy(storage, info, batch, limiter, by_bytes, out)
            batch, batch_bytes = [], 0
            if stopping() or clock() >= deadline:
                storage.flush()  # what was copied counts; the marker brings us back
                return out
    if batch:
        _copy(storage, info, batch, limiter, by_bytes, out)
    if end != info.end:  # a record before the recorded end could not be read
        storage.flush()
        raise CorruptionError("entry log holds a damaged record: not removed", dir=info.dir, log=info.log_id,
                              intact_until=end, end=info.end)
    storage.flush()
    out.bytes_freed = storage.remove_log(info.dir, info.log_id)
    out.done = True
    return out


def _copy(storage: LedgerStorage, info: EntryLogInfo, batch: list[Record], limiter: RateLimiter, by_bytes: bool,
          out: CompactionOutcome) -> None:
    entries, size = storage.relocate(info.dir, info.log_id, batch)
    out.entries += entries
    out.bytes_copied += size
    if entries:  # the pace counts copies: dead records cost a read only
        limiter.acquire(size if by_bytes else entries)

