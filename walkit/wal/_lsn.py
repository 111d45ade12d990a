"""Log sequence numbers: where a record is in a log."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from itertools import repeat
from typing import NamedTuple

from walkit.errors import InvalidArgumentError

__all__ = ["LSN"]

_TEXT = re.compile(r"^(\d{1,19})/(\d{1,19})/(\d{1,10})$")


class _Parts(NamedTuple):
    segment: int
    entry: int
    slot: int


class LSN(_Parts):
    """(segment, entry, slot): the log segment (its sequence number, from 1), the entry
    in that segment's ledger, and the record's place in the entry (records that arrive
    together share an entry). Totally ordered (as the tuple), hashable, immutable;
    ``str(lsn)`` is ``"segment/entry/slot"`` and :meth:`parse` reads it back.

    A tuple underneath: the writer makes one per record, so it must cost little. Code
    that numbers records itself (the writer, the readers) makes them without the checks
    of the constructor: :meth:`unchecked`, :meth:`slots`, :meth:`first_slots`,
    :meth:`slots_between` (the last three made in C, as they are taken).
    """

    __slots__ = ()

    def __new__(cls, segment: int, entry: int, slot: int) -> LSN:
        for name, value in (("segment", segment), ("entry", entry), ("slot", slot)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidArgumentError("LSN parts are ints >= 0", part=name, value=repr(value))
        return tuple.__new__(cls, (segment, entry, slot))

    @classmethod
    def unchecked(cls, segment: int, entry: int, slot: int) -> LSN:
        """Without the checks: for parts the writer itself numbered."""
        return tuple.__new__(cls, (segment, entry, slot))

    @classmethod
    def slots(cls, segment: int, entry: int, count: int) -> Iterator[LSN]:
        """The LSNs of slots 0 .. count - 1 of one entry, made in C (the completer's path)."""
        return map(tuple.__new__, repeat(cls), zip(repeat(segment), repeat(entry), range(count)))

    @classmethod
    def first_slots(cls, segment: int, entries: Iterable[int]) -> Iterator[LSN]:
        """The LSNs of slot 0 of ``entries`` of one segment (made in C, as taken)."""
        return map(tuple.__new__, repeat(cls), zip(repeat(segment), entries, repeat(0)))

    @classmethod
    def slots_between(cls, segment: int, entry: int, first: int, last: int) -> Iterator[LSN]:
        """The LSNs of slots ``first`` .. ``last - 1`` of one entry (made in C)."""
        return map(tuple.__new__, repeat(cls), zip(repeat(segment), repeat(entry), range(first, last)))

    def __str__(self) -> str:
        return f"{self.segment}/{self.entry}/{self.slot}"

    def __repr__(self) -> str:
        return f"LSN({self.segment}, {self.entry}, {self.slot})"

    @classmethod
    def parse(cls, text: str) -> LSN:
        match = _TEXT.match(text) if isinstance(text, str) else None
        if match is None:
            raise InvalidArgumentError("not an LSN (segment/entry/slot)", text=repr(text)[:60])
        return cls(int(match[1]), int(match[2]), int(match[3]))
