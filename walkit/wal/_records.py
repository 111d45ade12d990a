"""From ledger entries to a log's records: the one place a replay, a tail or an
inspection turns the entries it read into ``(lsn, record)`` pairs.

Theory of operation
-------------------
Each pass over a log (one ``replay``, one ``tail``) makes one :class:`RecordReader`
and hands it every entry it reads, in order, segment by segment. An entry is a record
batch (docs/format.md); its records get the LSNs ``(segment, entry, slot)``, and those
at or before the pass's ``after`` are skipped. The reader keeps whatever state a pass
needs across entries, so a record's bytes may come from more than one entry.
"""

from __future__ import annotations

from collections.abc import Iterable

from walkit.client import Entry
from walkit.errors import FormatError
from walkit.wal._format import Segment, unpack_records
from walkit.wal._lsn import LSN
from walkit.wal._stats import LogStats

__all__ = ["RecordReader"]


class RecordReader:
    """The records of one pass over a log, entry by entry (``log``: names it in errors)."""

    def __init__(self, log: str, stats: LogStats) -> None:
        self.log = log
        self.stats = stats

    def records(self, segment: Segment, entry: Entry, after: LSN | None) -> Iterable[tuple[LSN, bytes]]:
        """The records of one entry of ``segment`` that come after ``after``."""
        try:
            records = unpack_records(entry.data)
        except FormatError as exc:
            raise FormatError("a log entry is not a record batch", log=self.log, segment=segment.seq,
                              entry=entry.entry_id, reason=str(exc)) from exc
        stats = self.stats
        stats.replayed_entries += 1
        stats.replayed_records += len(records)
        seq, entry_id, count = segment.seq, entry.entry_id, len(records)
        first = 0  # the first slot after ``after``
        if after is not None and (after.segment, after.entry) >= (seq, entry_id):
            first = after.slot + 1 if (after.segment, after.entry) == (seq, entry_id) else count
        if first == 0:  # the (lsn, record) pairs are made in C: replay hands out millions a second
            return zip(LSN._slots(seq, entry_id, count), records)
        return zip(LSN._slots_between(seq, entry_id, first, count), records[first:])
