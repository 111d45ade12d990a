"""Log sequence numbers: where a record is in a log."""

from __future__ import annotations

import re
from dataclasses import dataclass

from walkit.errors import InvalidArgumentError

__all__ = ["LSN"]

_TEXT = re.compile(r"^(\d{1,19})/(\d{1,19})/(\d{1,10})$")


@dataclass(frozen=True, order=True)
class LSN:
    """(segment, entry, slot): the log segment (its sequence number, from 1), the entry
    in that segment's ledger, and the record's place in the entry (records that arrive
    together share an entry). Totally ordered, hashable; ``str(lsn)`` is
    ``"segment/entry/slot"`` and :meth:`parse` reads it back."""

    segment: int
    entry: int
    slot: int

    def __post_init__(self) -> None:
        for name in ("segment", "entry", "slot"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidArgumentError("LSN parts are ints >= 0", part=name, value=repr(value))

    def __str__(self) -> str:
        return f"{self.segment}/{self.entry}/{self.slot}"

    @classmethod
    def parse(cls, text: str) -> LSN:
        match = _TEXT.match(text) if isinstance(text, str) else None
        if match is None:
            raise InvalidArgumentError("not an LSN (segment/entry/slot)", text=repr(text)[:60])
        return cls(int(match[1]), int(match[2]), int(match[3]))
