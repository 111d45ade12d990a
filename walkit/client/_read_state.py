"""What a reader knows of a ledger (:class:`ReadState`) and the argument check of a
read (:func:`check_range`).

Theory of operation
-------------------
A :class:`ReadState` lives on the client's loop and is only touched there: every sync
handle (``ReadHandle``, ``LedgerHandle.read``), every asyncio handle and every WAL pass
runs its coroutines there, so its fields (metadata, metadata version, LAC, length, the
entry a long poll brought) need no lock. Its LAC only moves forward and stops moving
once the metadata says the ledger is CLOSED (then it is the closed ledger's last entry,
which no bookie answer may override). A read that fails on a ledger still open re-reads
the metadata once: an ensemble change may have moved the entries asked for; a read that
fails again, or on a closed ledger, raises.

It is built by the client (``LedgerClient.open`` for a ledger opened to be read,
``LedgerClient.read_state`` for one the caller writes) and read in chunks ahead of its
consumer by :mod:`walkit.client._readahead`, which needs nothing else of the client.
"""

from __future__ import annotations

from walkit.client._ranges import read_entries
from walkit.client._read import Entry, LedgerReader
from walkit.errors import InvalidArgumentError, NoSuchEntryError, WalkitError
from walkit.metadata import LedgerMetadata, LedgerState

__all__ = ["ReadState", "check_range"]


def check_range(ledger_id: int, first: int, last: int, lac: int) -> None:
    if not isinstance(first, int) or not isinstance(last, int) or first < 0 or last < first:
        raise InvalidArgumentError("read needs 0 <= first <= last", ledger=ledger_id, first=first, last=last)
    if last > lac:
        raise NoSuchEntryError("read past the last add confirmed", ledger=ledger_id, last=last,
                               last_add_confirmed=lac)


class ReadState:
    """What a reader knows of a ledger (client loop): metadata, LAC, closed."""

    def __init__(self, reader: LedgerReader, version: int, lac: int) -> None:
        self.reader = reader
        self.version = version
        self.lac = lac
        self.length = reader.metadata.length
        self._polled: Entry | None = None  # the entry a long poll brought along (confirmed)

    @property
    def metadata(self) -> LedgerMetadata:
        return self.reader.metadata

    @property
    def closed(self) -> bool:
        return self.reader.metadata.state is LedgerState.CLOSED

    async def refresh(self) -> None:
        """Re-read the metadata (a writer's ensemble change; a close)."""
        core = self.reader.core
        meta, version = await core.md(core.ledgers.read, self.reader.ledger_id)
        if version != self.version:
            self.reader.metadata, self.version = meta, version
            if meta.state is LedgerState.CLOSED:
                self.lac, self.length = meta.last_entry_id, meta.length

    async def read(self, first: int, last: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries ``first``..``last``; with ``max_bytes``, a prefix of them (one entry at
        least) holding about that many bytes (:func:`walkit.client._ranges.read_entries`)."""
        check_range(self.reader.ledger_id, first, last, self.lac)
        try:
            return await read_entries(self.reader, first, last, max_bytes)
        except WalkitError:
            if self.closed:
                raise
            old = self.version
            await self.refresh()  # an ensemble change may have moved entries: try once more
            if self.version == old:
                raise
            return await read_entries(self.reader, first, last, max_bytes)

    def _saw(self, lac: int) -> None:
        if lac > self.lac and not self.closed:
            self.lac = lac

    async def follow_step(self, next_id: int, poll_timeout: float, limit: int) -> list[Entry] | None:
        """One step of following the ledger from ``next_id``: the entries up to the LAC
        (at most ``limit``); ``[]`` after a long poll that brought nothing yet; None once
        the ledger is closed and read to its end. (Shared by the sync, asyncio and WAL
        followers.)"""
        if next_id > self.lac:
            if self.closed:
                return None
            await self.wait_lac(self.lac, poll_timeout)
            if next_id > self.lac:
                return []
        last = min(self.lac, next_id + limit - 1)
        polled, self._polled = self._polled, None
        if polled is not None and polled.entry_id == next_id:  # the poll brought it: no read
            return [polled] if last == next_id else [polled, *await self.read(next_id + 1, last)]
        return await self.read(next_id, last)

    async def read_lac(self) -> int:
        if not self.closed:
            await self.refresh()
        if not self.closed:
            self._saw(await self.reader.read_lac())
        return self.lac

    async def wait_lac(self, previous: int, timeout: float) -> int:
        if self.closed or self.lac > previous:
            return self.lac
        lac, entry = await self.reader.wait_lac(previous, timeout)
        self._saw(lac)
        if entry is not None:
            self._polled = entry
        if self.lac <= previous:
            await self.refresh()  # no news from bookies: maybe the ledger was closed
        return self.lac
