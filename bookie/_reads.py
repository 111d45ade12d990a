"""Reads: a bookie's entries and LACs out of its ledger storage.

Theory of operation
-------------------
Reads take no bookie lock: the ledger storage answers them under its own locks, and an
entry never changes once stored. They go on when the bookie failed (what was synced is
intact) and refuse a ledger this bookie does not hold with ``NoSuchLedgerError``.

A ledger's LAC is max(its explicit LAC, the LAC its last stored entry carries); -1 when
there is neither. The LAC of the last entry is remembered per ledger (``(last entry id,
its LAC)``, up to ``_LAST_LACS`` ledgers, then forgotten all at once) while that entry
stays the last - it is valid exactly as long as the ledger's last entry id is the one
remembered with it - so a read's answer, which carries the LAC, costs no second entry
read. A deleted ledger is forgotten (:meth:`Reads.forget`). The memory is a plain dict
read and written by single operations from the read threads and the event loop, with no
lock: every pair it may hold is true of its entry (entries never change), and a pair is
used only when its entry id is the ledger's last one now, so a racing update or clear
can cost a read, never give a wrong LAC.

The *memory* forms (:meth:`Reads.read_recent`, :meth:`Reads.read_memory`) are for the
event loop: they answer only from what is in memory (an entry log's write buffer, the
read-ahead cache, a remembered LAC) and otherwise return None, never waiting for a disk;
the caller then takes the slow path (:meth:`Reads.read_entry`, :meth:`Reads.read_lac`)
on a read thread. Any error on the fast path (not stored, storage closed) also means
"take the slow path", which gives the real answer.

The storage is reached through a narrow view (:class:`Stored`), so that a read before
the bookie started, or after it stopped, gets the bookie's own error.
"""

from __future__ import annotations

from typing import Protocol

from bookie.storage import LedgerStorage
from walkit.errors import NoSuchLedgerError, WalkitError
from walkit.protocol import parse_entry_header

__all__ = ["LAST_ENTRY", "Reads", "Stored"]

#: ``read_entry(ledger, LAST_ENTRY)`` reads the last entry stored (BookKeeper's -1).
LAST_ENTRY = -1
_LAST_LACS = 4096  # ledgers whose last entry's LAC read_lac remembers (forgotten all at once past it)


class Stored(Protocol):
    """Where reads find the ledger storage (the bookie: BookieShutdownError when not started)."""

    @property
    def storage(self) -> LedgerStorage: ...


class Reads:
    """The read side of one bookie (see the module docstring)."""

    def __init__(self, stored: Stored, bookie_id: str) -> None:
        self._stored = stored
        self._bookie_id = bookie_id
        #: ledger -> (its last stored entry, the LAC that entry carries): read_lac's memory
        self._last_lacs: dict[int, tuple[int, int]] = {}

    def _holding(self, ledger_id: int) -> LedgerStorage:
        s = self._stored.storage
        if not s.has_ledger(ledger_id):
            raise NoSuchLedgerError("ledger not on this bookie", ledger=ledger_id, bookie=self._bookie_id)
        return s

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """An entry as it was added (``LAST_ENTRY``: the highest stored one)."""
        s = self._holding(ledger_id)
        if entry_id == LAST_ENTRY:
            entry_id = s.last_entry_id(ledger_id)
        return s.get_entry(ledger_id, entry_id)

    def read_entries(self, ledger_id: int, first: int, count: int, max_bytes: int) -> list[bytes]:
        """The stored entries ``first``, ``first + 1``, ... as they were added: at most
        ``count``, ending before the first one not stored and before the one that would
        take their bytes past ``max_bytes`` (the first always;
        :meth:`bookie.storage.LedgerStorage.get_entries`)."""
        return self._holding(ledger_id).get_entries(ledger_id, first, count, max_bytes)

    def stored_entries(self, ledger_id: int) -> list[int]:
        """The ids of the entries of ``ledger_id`` stored here, sorted, from the index
        slots alone (no entry is read): BookKeeper's GET_LIST_OF_ENTRIES_OF_LEDGER."""
        s = self._holding(ledger_id)
        last = s.last_entry_id(ledger_id)
        return [] if last < 0 else s.stored_entries(ledger_id, 0, last)

    def read_lac(self, ledger_id: int) -> int:
        """max(explicit LAC, the LAC carried by the last stored entry); -1 when none. The
        last entry's LAC is remembered per ledger while that entry stays the last (an
        entry never changes once stored), so a read's answer, which carries the LAC,
        costs no second entry read."""
        s = self._holding(ledger_id)
        last = s.last_entry_id(ledger_id)
        if last < 0:
            explicit = s.explicit_lac(ledger_id)
            return -1 if explicit is None else explicit
        known = self._last_lacs.get(ledger_id)
        if known is None or known[0] != last:
            known = (last, parse_entry_header(s.get_entry(ledger_id, last)).lac)
            if len(self._last_lacs) >= _LAST_LACS:
                self._last_lacs.clear()
            self._last_lacs[ledger_id] = known
        explicit = s.explicit_lac(ledger_id)
        return known[1] if explicit is None else max(explicit, known[1])

    def read_recent(self, ledger_id: int, entry_id: int) -> tuple[int, bytes, int] | None:
        """``(entry id, entry, LAC)`` from memory alone - when the entry (``LAST_ENTRY`` or
        one not stored yet: the last one stored) and the ledger's last entry, which carries the LAC, are both
        still in their entry log's write buffer, as a just-written one is - else None:
        :meth:`read_entry` and :meth:`read_lac`, which may wait for the disk, answer it.
        For an event loop answering a tailing reader without a thread hand-off."""
        s = self._stored.storage
        try:
            last = s.last_entry_id(ledger_id)
            if entry_id == LAST_ENTRY or entry_id > last:  # one not here yet: the last, as the slow path
                entry_id = last
            if last < 0:
                return None
            data = s.memory_entry(ledger_id, entry_id)
            lac = None if data is None else self._memory_lac(s, ledger_id, last, entry_id, data)
            return None if data is None or lac is None else (entry_id, data, lac)
        except WalkitError:  # not stored, storage closed: the slow path gives the answer
            return None

    def memory_lac(self, ledger_id: int) -> int | None:
        """What :meth:`read_lac` answers, from memory alone - the ledger's last entry in
        its log's write buffer, or its LAC remembered - else None (no entry stored, the
        ledger unknown, or only a read would tell). For the event loop: a tailing
        reader's long poll is checked without a hand-off to the read pool."""
        s = self._stored.storage
        try:
            last = s.last_entry_id(ledger_id)
            return None if last < 0 else self._memory_lac(s, ledger_id, last, -1, b"")
        except WalkitError:  # not stored, storage closed: the slow path gives the answer
            return None

    def read_memory(self, ledger_id: int, entry_id: int) -> tuple[bytes, int] | None:
        """``(entry, LAC)`` for a READ_ENTRY of a stored ``entry_id`` from memory alone - the
        entry in its log's write buffer or read ahead, and a LAC known without a read
        (the last entry's, remembered by :meth:`read_lac`, or that entry in memory too) -
        else None: :meth:`read_entry` and :meth:`read_lac`, which may wait for the disk,
        answer it. For the event loop: a reader going entry by entry through a ledger is
        answered without a hand-off to the read pool."""
        s = self._stored.storage
        try:
            data = s.memory_entry(ledger_id, entry_id)
            lac = None if data is None else self._memory_lac(s, ledger_id, s.last_entry_id(ledger_id), entry_id, data)
            return None if data is None or lac is None else (data, lac)
        except WalkitError:  # not stored, storage closed: the slow path gives the answer
            return None

    def _memory_lac(self, s: LedgerStorage, ledger_id: int, last: int, entry_id: int, data: bytes) -> int | None:
        """What :meth:`read_lac` answers, when memory knows it: the LAC of the ledger's
        last entry ``last`` - remembered, or that entry in memory (``data`` when it is
        ``entry_id``) - raised to the explicit LAC; None when only a read would tell."""
        known = self._last_lacs.get(ledger_id)
        if known is not None and known[0] == last:
            carried = known[1]
        else:
            last_data = data if entry_id == last else s.memory_entry(ledger_id, last)
            if last_data is None:
                return None
            carried = parse_entry_header(last_data).lac
        explicit = s.explicit_lac(ledger_id)
        return carried if explicit is None else max(explicit, carried)

    def forget(self, ledger_id: int) -> None:
        """The ledger was deleted: drop what is remembered of it."""
        self._last_lacs.pop(ledger_id, None)
