"""From ledger entries to a log's records: the one place a replay, a tail or an
inspection turns the entries it read into ``(lsn, record)`` pairs.

Theory of operation
-------------------
Each pass over a log (one ``replay``, one ``tail``) makes one :class:`RecordReader`
and hands it every entry it reads, in order, segment by segment. An entry is a record
batch (docs/format.md); its records get the LSNs ``(segment, entry, slot)``, and those
at or before the pass's ``after`` are skipped. The reader keeps whatever state a pass
needs across entries, so a record's bytes may come from more than one entry.

A record larger than an entry is written alone, as fragments in consecutive entries of
one segment (``"WKRF"``: fragment ``index`` of ``count``, the record's length). An
:class:`Assembly` puts them together: a record is handed out only once its last fragment
was read, with the LSN ``(segment, entry of the last fragment, 0)``. What may be found
instead, and what becomes of it:

- fragments whose first one this pass did not read (it started inside the record) are
  skipped: that record is not "after" the pass's start;
- a record begun and not finished when an entry of another segment or a new record
  comes (a batch, or another first fragment) was left by a writer that died (or was
  fenced) mid-record, and never acknowledged: it is dropped without a word;
- a fragment that contradicts the one before it in the next entry (another index,
  count or length), or bytes that do not add up to the record's length, are damage:
  FormatError.

Memory stays bounded: a record whose declared length is over the reader's
``max_record_bytes`` is refused (FormatError naming the length and the limit) before
any of it is kept, and at most one record is being put together at a time.

Record batches take the path they took before fragments existed: one comparison of
the magic per entry, nothing per record. A pass hands the reader a chunk of entries at
a time (:meth:`RecordReader.chunk`): an entry that holds exactly one record (a log
written one append at a time) is recognised by its 13-byte head in one loop over the
chunk, its record copied out and its pair made in C when the consumer takes it; every
other entry - a batch of many, a fragment, damage, an entry at or before ``after`` -
goes through :meth:`RecordReader.records`, so the pairs, errors and stats are the same
either way (tests/cluster/test_wal_large.py reads every case both ways).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain

from walkit.client import Entry
from walkit.errors import FormatError, InvalidArgumentError
from walkit.wal._format import (DEFAULT_MAX_RECORD_BYTES, FRAGMENT_MAGIC, ONE_RECORD, ONE_RECORD_PREFIX, Segment,
                                unpack_fragment, unpack_records)
from walkit.wal._lsn import LSN
from walkit.wal._stats import LogStats

__all__ = ["Assembly", "DEFAULT_MAX_RECORD_BYTES", "RecordReader", "check_max_record_bytes", "last_record"]


def check_max_record_bytes(value: int) -> int:
    """``value`` if it is a valid ``max_record_bytes`` (an int >= 1), else InvalidArgumentError."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgumentError("max_record_bytes must be an int >= 1", max_record_bytes=repr(value)[:40])
    return value


class Assembly:
    """The one record being put together from its fragments (``log``: names it in errors)."""

    __slots__ = ("log", "limit", "active", "_parts", "_size", "_seq", "_first", "_next", "_count", "_length")

    def __init__(self, log: str, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        self.log = log
        self.limit = check_max_record_bytes(max_record_bytes)
        self.active = False  # a record is begun and not finished
        self._parts: list[bytes] = []
        self._size = 0
        self._seq = self._first = self._next = self._count = self._length = 0

    def drop(self) -> None:
        """Forget a record begun and not finished (its writer died mid-record)."""
        self.active = False
        self._parts = []
        self._size = 0

    def add(self, seq: int, entry_id: int, data: bytes) -> tuple[int, bytes] | None:
        """A fragment entry of segment ``seq``: ``(entry of the record's first fragment,
        record)`` when it completes a record, else None."""
        try:
            frag = unpack_fragment(data)
        except FormatError as exc:
            raise FormatError("a log entry is not a record fragment", log=self.log, segment=seq, entry=entry_id,
                              reason=str(exc)) from exc
        if self.active and (seq != self._seq or entry_id != self._next or frag.part == 0):
            self.drop()  # another segment or a new record: the one begun will never be finished
        if not self.active:
            if frag.part != 0:
                return None  # the rest of a record whose start was not read
            if frag.length > self.limit:
                raise FormatError("a record is larger than the reader's max_record_bytes", log=self.log,
                                  segment=seq, entry=entry_id, size=frag.length, limit=self.limit)
            self.active = True
            self._seq, self._first, self._count, self._length = seq, entry_id, frag.parts, frag.length
        elif (frag.part, frag.parts, frag.length) != (self._next - self._first, self._count, self._length):
            raise FormatError("a record fragment does not follow the one before it", log=self.log, segment=seq,
                              entry=entry_id, index=frag.part, count=frag.parts, length=frag.length,
                              expected_index=self._next - self._first, expected_count=self._count,
                              expected_length=self._length)
        self._size += len(frag.data)
        if self._size > self._length or (frag.part == frag.parts - 1 and self._size != self._length):
            raise FormatError("a record's fragments do not add up to its length", log=self.log, segment=seq,
                              entry=entry_id, size=self._size, length=self._length)
        self._parts.append(frag.data)
        self._next = entry_id + 1
        if frag.part != frag.parts - 1:
            return None
        record = b"".join(self._parts)
        first = self._first
        self.drop()
        return first, record


class RecordReader:
    """The records of one pass over a log, entry by entry (``log``: names it in errors;
    ``max_record_bytes``: the largest record it puts together from fragments)."""

    def __init__(self, log: str, stats: LogStats, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        self.log = log
        self.stats = stats
        self._assembly = Assembly(log, max_record_bytes)

    def chunk(self, segment: Segment, entries: Sequence[Entry], after: LSN | None) -> Iterable[tuple[LSN, bytes]]:
        """The records of consecutive entries of ``segment`` that come after ``after``.

        Entries that hold one record each (a log written one append at a time) take one
        check of their head each, in one loop over the chunk; their pairs are made as
        the consumer takes them. Any other entry (a batch of many, a fragment, damage, an
        entry the pass starts inside) goes through :meth:`records`. The reader's stats
        count the chunk's records and entries when it is unpacked, here."""
        parts: list[Iterable[tuple[LSN, bytes]]] = []  # in order: runs of single records, other entries' records
        seq = segment.seq
        # entries up to ``skip`` may hold records at or before ``after``: each goes through records()
        skip = -1 if after is None or after.segment < seq else after.entry if after.segment == seq else None
        if skip is None:  # a segment before the pass's start: nothing of it is handed out
            return chain.from_iterable([self.records(segment, entry, after) for entry in entries])
        # a run of single records is kept as two lists (ids, records: no object the cyclic
        # GC tracks) and paired as the consumer takes them; a chunk's worth of LSN and pair
        # tuples held at once would cost GC passes over them all
        ids: list[int] = []
        records: list[bytes] = []
        head, size, prefix = ONE_RECORD.unpack_from, ONE_RECORD.size, ONE_RECORD_PREFIX
        singles = 0
        assembling = self._assembly.active  # a record begun: the entry after it decides its fate (records())
        for entry in entries:
            data = entry.data
            entry_id = entry.entry_id
            if entry_id > skip and not assembling and len(data) >= size:
                start, length = head(data)
                if start == prefix and length == len(data) - size:
                    ids.append(entry_id)
                    records.append(bytes(data[size:]))
                    continue
            if ids:
                parts.append(_singles(seq, ids, records))
                singles += len(ids)
                ids, records = [], []
            try:
                parts.append(self.records(segment, entry, after))
            except FormatError as exc:  # the records before the damage are handed out first
                parts.append(_raising(exc))
                break
            assembling = self._assembly.active
        if ids:
            parts.append(_singles(seq, ids, records))
            singles += len(ids)
        self.stats.replayed_entries += singles
        self.stats.replayed_records += singles
        return parts[0] if len(parts) == 1 else chain.from_iterable(parts)  # none: an empty chain

    def records(self, segment: Segment, entry: Entry, after: LSN | None) -> Iterable[tuple[LSN, bytes]]:
        """The records of one entry of ``segment`` that come after ``after``."""
        data = bytes(entry.data)  # a view (a reader's ``payload_views``) copied: records outlive its frame
        if data[:4] == FRAGMENT_MAGIC:
            return self._fragment(segment, entry.entry_id, data, after)
        if self._assembly.active:
            self._assembly.drop()  # a record batch after a record begun: its writer died mid-record
        try:
            records = unpack_records(data)
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
            return zip(LSN.slots(seq, entry_id, count), records)
        return zip(LSN.slots_between(seq, entry_id, first, count), records[first:])

    def _fragment(self, segment: Segment, entry_id: int, data: bytes, after: LSN | None) -> Iterable[tuple[LSN, bytes]]:
        """A fragment entry: the record it completes, if the record began after ``after``
        (an ``after`` inside a record - a position no record has - counts as past it: the
        pass did not start early enough to read the record's first fragment)."""
        self.stats.replayed_entries += 1
        whole = self._assembly.add(segment.seq, entry_id, data)
        if whole is None:
            return ()
        first, record = whole
        if after is not None and (after.segment, after.entry) >= (segment.seq, first):
            return ()
        self.stats.replayed_records += 1
        return ((LSN.unchecked(segment.seq, entry_id, 0), record),)


def _singles(seq: int, ids: list[int], records: list[bytes]) -> Iterator[tuple[LSN, bytes]]:
    """The pairs of a run of single-record entries of segment ``seq``, made in C as taken."""
    return zip(LSN.first_slots(seq, ids), records)


def _raising(error: FormatError) -> Iterator[tuple[LSN, bytes]]:
    """What a chunk hands out where it met damage: the error, once reached."""
    raise error
    yield  # a generator: raises when iterated, not when made


def last_record(seq: int, last: int, read: Callable[[int], bytes]) -> LSN | None:
    """The LSN of the last whole record in entries ``0 .. last`` of segment ``seq``
    (``read(entry id)``: that entry's payload), found from the end: an entry that is not
    the last fragment of a record sends the search to the entry before that record's
    first fragment (a record still being written, or left unfinished by a dead writer,
    is not a record). None: the segment holds no whole record."""
    entry = last
    while entry >= 0:
        data = read(entry)
        if data[:4] != FRAGMENT_MAGIC:
            return LSN(seq, entry, max(len(unpack_records(data)) - 1, 0))
        frag = unpack_fragment(data)
        if frag.part == frag.parts - 1:
            return LSN(seq, entry, 0)
        entry -= frag.part + 1
    return None
