"""Batched reads: consecutive entries of one ledger in a few preads (the wire's READ_RANGE).

Theory of operation
-------------------
:meth:`~bookie.storage.LedgerStorage.get_entries` answers "the stored entries ``first``,
``first + 1``, ... of a ledger, at most ``count`` of them and ``max_bytes`` of data" for
much less than one :meth:`~bookie.storage.LedgerStorage.get_entry` per entry:

1. under the storage lock, once (:func:`in_memory`): the data of the range's entries in
   the write cache, the ledger's in-memory slots for the range (pending and flushing
   maps, then the slot log's runs) and the data of the entries still in the active log's write buffer, which may
   be written out and dropped once the lock is released;
2. one pread of the index slots of the range, when an entry was not found in memory and
   the ledger has an index file;
3. :func:`located`: per entry, in order, its data or its ``(log id, offset)``, stopping
   before the first entry found nowhere - the answer is consecutive, a gap ends it;
4. :func:`read_range`: the locations are read in *spans*. A ledger written sequentially
   has its records one after another in a log, maybe with other ledgers' records in
   between; a run of entries whose records lie in one log at increasing offsets, each
   within ``_MAX_GAP`` of the one before and all within ``_MAX_SPAN`` bytes, comes from
   one pread, from the run's first record to its last record's offset + ``FIRST_READ``
   (or + the size of the record taken last, when larger; less when the budget could not
   take that much of the last record). Records farther apart are read on their own: a
   ledger written among many others is read without the others' bytes. A record
   longer than what was read gets the rest read
   (:func:`~bookie.storage._entrylog.finish_record`). Every record is verified as
   :func:`~bookie.storage._entrylog.read_record` verifies one (length bounds, CRC,
   ledger and entry ids) - in place, in the pread's buffer, when the whole record is
   there and intact; anything else goes through the single-record path, so damage
   raises the ``CorruptionError`` a single read would. Other ledgers' records in a span
   are never parsed, only skipped.

Budget: an entry whose data would take the total past ``max_bytes`` ends the answer, and
is not read past its header; the first entry is always taken (every answer makes
progress). A span ends where the budget could no longer take its next record (assuming
the records in between are the run's own), so a small budget reads little; a record of
another ledger in between only cuts a span shorter, at the cost of one more pread.

Compaction: an entry log removed after step 2 (compaction copied the records, a flush
pointed the index at the copies, then the log went) shows up as
:class:`~bookie.storage._entrylog.LogGone` when the span's log is opened; the span's
entries are then read one by one with ``get_entry``, which looks each up again (and
retries). Assumes: record locations never change while their log exists, which the
entry-log writer guarantees.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TypeAlias, cast

from crc32c import crc32c

from bookie.storage._entrylog import FIRST_READ, LogGone, Preader, finish_record, record_where
from bookie.storage._format import MAX_ENTRY_SIZE, RECORD_HEADER, record_length, unpack_location

__all__ = ["Source", "in_memory", "located", "read_range"]

#: An entry's data (it was in a log's write buffer) or its location ``(log id, offset)``.
Source: TypeAlias = bytes | tuple[int, int]
_MAX_SPAN = 4 << 20  # bytes one pread covers at most: bounds what a span may read for nothing
#: bytes from one record's start to the next one's in a span at most: farther apart, other
#: ledgers' records (or a large record) lie between them, and each is read on its own
_MAX_GAP = 64 << 10
_HEAD = RECORD_HEADER.size  # a record is this header and then the entry's data


def in_memory(cached: list[dict[int, bytes]], tables: list[dict[int, int]],
              read_buffered: Callable[[int, int, int], bytes | None], buffer_span: tuple[int, int], ledger_id: int,
              first: int, count: int, max_bytes: int, on_disk: bool) -> list[bytes | int]:
    """Step 1 (the storage lock held): for the entries ``first``.., the data of those in
    the write cache (``cached``: the ledger's cached entries, newest first) or still in a
    log's write buffer, else the location memory has for them (``tables``: the ledger's
    pending and flushing maps, then the slot log's runs: newest first), else 0. Cut where nothing more could be
    taken: at an entry found nowhere when the ledger has no index file, or when the data
    found in memory alone passes ``max_bytes``.

    Only locations within ``buffer_span`` (the active log's buffer, ``[lo, hi)``) can be
    in a buffer: the lookups are comprehensions and ``read_buffered`` is called for those
    alone, so the lock is held ~60 ns an entry (a tail catching up on small entries asks
    for thousands)."""
    if not tables and not cached:
        return [0] * count if on_disk else []
    ids = range(first, first + count)
    if not tables:
        locations = [0] * count
    elif len(tables) == 1:
        get = tables[0].get
        locations = [get(e, 0) for e in ids]
    elif len(tables) == 2:
        newer, older = tables[0].get, tables[1].get
        locations = [newer(e, 0) or older(e, 0) for e in ids]
    else:  # the maps and the slot log's runs
        gets = [table.get for table in tables]
        locations = [next((found for get in gets if (found := get(e, 0))), 0) for e in ids]
    known = cast("list[bytes | int]", locations)  # data found in memory replaces the locations
    in_cache: list[int] = []
    if cached:
        for table in reversed(cached):  # the older copy first: a newer one replaces it
            for i, e in enumerate(ids):
                copy = table.get(e)
                if copy is not None:
                    known[i] = copy
        in_cache = [i for i, item in enumerate(known) if type(item) is bytes]
    if not on_disk and 0 in known:
        del known[known.index(0):]
    lo, hi = buffer_span
    if in_cache:
        in_buffer = [i for i, item in enumerate(known) if type(item) is int and lo <= item < hi]
        memory = sorted(in_cache + in_buffer)
    else:
        memory = [i for i, location in enumerate(locations) if lo <= location < hi]
    held = 0
    for i in memory:
        if i >= len(known):
            break  # cut above: nothing found for an entry before it
        item = known[i]
        if isinstance(item, int):
            buffered = read_buffered(item, ledger_id, first + i)
            if buffered is None:
                continue
            known[i] = item = buffered
        held += len(item)
        if i and held > max_bytes:
            del known[i:]
            break
    return known


def located(known: list[bytes | int], slots: list[int]) -> list[Source]:
    """Step 3: what memory knew (:func:`in_memory`), completed by the index ``slots`` of
    the same entries, up to the first entry found in neither."""
    sources: list[Source] = []
    for k, item in enumerate(known):
        if isinstance(item, bytes):
            sources.append(item)
            continue
        location = item or slots[k]
        if not location:
            break
        sources.append(unpack_location(location))
    return sources


class _Taken:
    """The entries taken so far; one more fits while their data stays within
    ``max_bytes`` (the first one always)."""

    __slots__ = ("entries", "size", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.entries: list[bytes] = []
        self.size = 0
        self.max_bytes = max_bytes

    def fits(self, size: int) -> bool:
        return not self.entries or self.size + size <= self.max_bytes

    def add(self, data: bytes) -> None:
        self.entries.append(data)
        self.size += len(data)


def read_range(sources: list[Source], ledger_id: int, first: int, max_bytes: int,
               log_file: Callable[[int], AbstractContextManager[Preader]],
               read_one: Callable[[int], bytes]) -> list[bytes]:
    """Step 4: the data of ``sources`` (entries ``first``, ``first + 1``, ...), in order,
    within ``max_bytes`` (the first always). ``log_file(log id)`` opens an entry log of
    the ledger's dir (LogGone when it is not there); ``read_one(entry id)`` reads one
    entry as ``get_entry`` does."""
    taken = _Taken(max_bytes)
    i = 0
    while i < len(sources):
        source = sources[i]
        if isinstance(source, bytes):
            if not taken.fits(len(source)):
                break
            taken.add(source)
            i += 1
            continue
        run = _span(sources, i, first, max_bytes - taken.size)
        before = len(taken.entries)
        try:
            with log_file(source[0]) as f:
                whole = _read_span(f, source[0], ledger_id, run, taken)
        except LogGone:
            whole = _read_each(read_one, [e for e, _ in run[len(taken.entries) - before:]], taken)
        if not whole:
            break
        i += len(run)
    return taken.entries


def _span(sources: list[Source], i: int, first: int, room: int) -> list[tuple[int, int]]:
    """``(entry id, offset)`` of the run from ``sources[i]`` (a location) that one pread
    covers: one log, increasing offsets at most ``_MAX_GAP`` apart, within ``_MAX_SPAN``
    bytes, and no record past what ``room`` bytes of data (plus the run's record headers)
    could reach."""
    start_source = sources[i]
    assert not isinstance(start_source, bytes)
    log_id, start = start_source
    run = [(first + i, start)]
    last = start
    for k in range(i + 1, len(sources)):
        source = sources[k]
        if isinstance(source, bytes) or source[0] != log_id:
            break
        offset = source[1]
        if not last < offset <= start + _MAX_SPAN - FIRST_READ or offset - last > _MAX_GAP \
                or offset - start > room + len(run) * _HEAD:
            break
        run.append((first + k, offset))
        last = offset
    return run


def _read_span(f: Preader, log_id: int, ledger_id: int, run: list[tuple[int, int]], taken: _Taken) -> bool:
    """Take the records of ``run`` (one pread, more for a record longer than what it
    read); False when the budget stopped it before the end. Past the run's last offset
    the pread takes ``FIRST_READ`` bytes or the size of the ledger's record taken last,
    if larger (a ledger's entries tend to be alike: a large one is read in one pread), or
    only what the budget could still take of that record (its header alone when the
    budget is spent)."""
    start = run[0][1]
    guess = max(FIRST_READ, len(taken.entries[-1]) + _HEAD) if taken.entries else FIRST_READ
    if not taken.entries and len(run) == 1:
        tail = guess  # the answer's first entry: taken whatever its size
    else:
        tail = min(guess, max(taken.max_bytes - taken.size, 0) + _HEAD)
    raw = f.pread(run[-1][1] - start + tail, start)
    view = memoryview(raw)
    size, unpack = len(raw), RECORD_HEADER.unpack_from
    for entry_id, offset in run:
        rel = offset - start
        if rel + _HEAD <= size:  # the usual case, checked in place: a whole, intact record of this entry
            length, crc, found_ledger, found_entry = unpack(raw, rel)
            end = rel + 8 + length
            if _HEAD - 8 <= length <= _HEAD - 8 + MAX_ENTRY_SIZE and end <= size and found_ledger == ledger_id \
                    and found_entry == entry_id and crc == crc32c(view[rel + 8 : end], crc32c(view[rel : rel + 4])):
                if not taken.fits(end - rel - _HEAD):
                    return False
                taken.add(raw[rel + _HEAD : end])
                continue
        where = record_where(log_id, offset, ledger_id, entry_id)  # longer than read, or damaged: the
        total = record_length(raw[rel : rel + _HEAD], where)  # single-record path reads the rest or says
        if not taken.fits(total - _HEAD):  # what is wrong, as get_entry would
            return False
        taken.add(finish_record(f, raw[rel : rel + total], offset, ledger_id, entry_id, where))
    return True


def _read_each(read_one: Callable[[int], bytes], entries: list[int], taken: _Taken) -> bool:
    """The compaction fallback: ``entries`` one by one; False when the budget stopped it."""
    for entry_id in entries:
        data = read_one(entry_id)
        if not taken.fits(len(data)):
            return False
        taken.add(data)
    return True
