"""The add path of the ledger storage: entries into the write cache, or written through.

Theory of operation
-------------------
An add puts the entry's bytes in the write cache (:mod:`bookie.storage._writecache`)
under the storage lock - nothing else: no log write, no CRC, no copy - and raises the
ledger's last entry id. The journal makes the entry durable; the storage promises
nothing until a flush (:mod:`bookie.storage._flush`) covers it. The hot path - an entry
of a ledger already known, ids in range, ``bytes`` data, a storage that has not failed -
is one dict insert; anything else takes :meth:`EntryAdds._add_checked`, which checks each
point (creating the ledger, as journal replay needs) and raises the right error, refusing
that entry only.
The server's usual batch - ``RUN_MIN`` new entries or more of one such ledger, all fitting in the cache - is
cached at once, its checks and sums made by C loops (:meth:`EntryAdds._add_run`), with the
same outcome as that loop.

Bounded memory: the cache holds at most its hard bound (twice ``write_cache_bytes``);
past it (adds outrunning the checkpoints) an entry is written straight to its dir's
active log, its location into the pending map, as the placement would - unless the cache
holds a copy of that entry, which the newer bytes must replace there (newest wins).

Re-adding overwrites (journal replay, a recovery's rewrite): the cache keeps the newest
bytes, and an add of an entry read ahead drops the copy and tells a running read-ahead
of its ledger not to keep the old bytes (:class:`bookie.storage._cache.ReadAheadCache`).
A log buffer the disk had no room for waits in memory, readable: the add still succeeds
and ``on_no_space`` is told.
"""

from __future__ import annotations

from bookie.storage._format import MAX_ENTRY_ID, MAX_ENTRY_SIZE, check_entry_ids
from bookie.storage._index import LedgerState
from bookie.storage._ledgerdir import LedgerDir
from bookie.storage._shared import StorageShared
from walkit.errors import EntryTooLargeError

__all__ = ["EntryAdds"]

_INT, _BYTES = {int}, {bytes}
#: Entries in a batch from which the C loops of :meth:`EntryAdds._add_run` pay (fewer: the loop is cheaper).
RUN_MIN = 32


class EntryAdds:
    """The storage's add path (see the module docstring); thread-safe."""

    def __init__(self, shared: StorageShared) -> None:
        self._shared = shared

    def add_entries(self, entries: list[tuple[int, int, bytes]]) -> list[tuple[int, Exception]]:
        """Store several entries, in order, under one lock acquisition: each as
        ``LedgerStorage.add_entry`` would. A refused entry does not stop the others;
        returns the refusals as ``(index in entries, error)`` (empty when every entry
        was stored).

        An entry goes to the write cache (:mod:`bookie.storage._writecache`): the next
        flush places it in its dir's log. The hot path: an entry of a ledger already
        known, ids in range, ``bytes`` data, a storage that has not failed, is one dict
        insert; anything else takes :meth:`_add_checked`, which checks each point and
        raises the right error."""
        failed: list[tuple[int, Exception]] = []
        sh = self._shared
        dirs, states, cache = sh.dirs, sh.states, sh.cache
        read_ahead = sh.read_ahead
        cached, reading = read_ahead.ledger_ids, read_ahead.reading_ahead  # usually empty: one test per entry
        added = 0
        with sh.lock:
            active = cache.active  # swapped by a flush, under the lock
            room = cache.room()  # past it: written through
            if len(entries) >= RUN_MIN and not (cached or reading) and self._add_run(entries, active, room):
                entries = []  # all cached at once: the loop below has nothing to do
            last_ledger, state, slots = -1, None, None
            for i, (ledger_id, entry_id, data) in enumerate(entries):
                if ledger_id != last_ledger:
                    state = states.get(ledger_id)
                    last_ledger, slots = -1, None
                if (state is None or sh.failure is not None or type(data) is not bytes
                        or not 0 <= entry_id <= MAX_ENTRY_ID or len(data) > MAX_ENTRY_SIZE):
                    try:
                        data, state = self._add_checked(ledger_id, entry_id, data)
                    except Exception as exc:  # noqa: BLE001 - refuses this entry only
                        failed.append((i, exc))
                        last_ledger = -1
                        continue
                assert state is not None
                if added >= room and not cache.holds(ledger_id, entry_id):
                    error = self._write_through(ledger_id, entry_id, data, state)
                    if error is not None:
                        failed.append((i, error))
                    continue
                if entry_id > state.last_entry_id:
                    state.last_entry_id = entry_id
                if slots is None:
                    slots = active.get(ledger_id)
                    if slots is None:
                        slots = active[ledger_id] = {}
                    last_ledger = ledger_id
                old = slots.get(entry_id)
                slots[entry_id] = data
                added += len(data) if old is None else len(data) - len(old)
                if (cached or reading) and (ledger_id in cached or ledger_id in reading):
                    read_ahead.added(ledger_id, entry_id)  # re-adding overwrites: no copy of the old bytes stays
            cache.grew(added)
            full = [exc for exc in map(LedgerDir.no_space, dirs) if exc is not None]
        if full:  # entries placed in a log buffer the disk has no room for wait in memory: say so
            sh.report(sh.on_no_space, full[0])
        return failed

    def _add_run(self, entries: list[tuple[int, int, bytes]], active: dict[int, dict[int, bytes]], room: int) -> bool:
        """(Lock held, no read-ahead to tell) The usual batch at once, with C loops: new
        entries of one known ledger, ids in range, ``bytes`` data within the entry limit,
        all fitting in the cache's room, on a storage that has not failed - exactly what
        the loop of :meth:`add_entries` would do with them. False, with nothing done, for
        any other batch (the loop takes it)."""
        sh = self._shared
        ledger_id = entries[0][0] if entries else -1
        state = sh.states.get(ledger_id)
        if state is None or sh.failure is not None or entries[-1][0] != ledger_id:
            return False  # (the last entry's ledger: a batch of many ledgers is told before the batch is unzipped)
        ledger_ids, entry_ids, datas = zip(*entries)
        if ledger_ids.count(ledger_id) != len(entries) or set(map(type, entry_ids)) != _INT \
                or set(map(type, datas)) != _BYTES or min(entry_ids) < 0 or max(entry_ids) > MAX_ENTRY_ID:
            return False
        sizes = list(map(len, datas))
        added = sum(sizes)
        if max(sizes) > MAX_ENTRY_SIZE or added >= room:
            return False
        slots = active.get(ledger_id)
        if slots is None:
            slots = active[ledger_id] = {}
        elif not slots.keys().isdisjoint(entry_ids):
            return False  # re-adds: the loop counts the bytes they replace
        slots.update(zip(entry_ids, datas))
        last = max(entry_ids)
        if last > state.last_entry_id:
            state.last_entry_id = last
        sh.cache.grew(added)
        return True

    def _write_through(self, ledger_id: int, entry_id: int, data: bytes, state: LedgerState) -> Exception | None:
        """(Lock held) the cache is full (adds outrun the checkpoints): the entry goes
        straight to its dir's log; returns the error that refused it (a full disk)."""
        sh = self._shared
        dirs = sh.dirs
        try:
            with sh.failing:
                location = dirs[ledger_id % len(dirs)].append(ledger_id, entry_id, data)
        except Exception as exc:  # noqa: BLE001 - refuses this entry only (a full disk)
            return exc
        sh.pending.setdefault(ledger_id, {})[entry_id] = location
        if entry_id > state.last_entry_id:
            state.last_entry_id = entry_id
        read_ahead = sh.read_ahead
        if ledger_id in read_ahead.ledger_ids or ledger_id in read_ahead.reading_ahead:
            read_ahead.added(ledger_id, entry_id)
        return None

    def _add_checked(self, ledger_id: int, entry_id: int, data: bytes) -> tuple[bytes, LedgerState]:
        """One entry with every check (lock held): its bytes (a copy of anything else)
        and its ledger's state."""
        check_entry_ids(ledger_id, entry_id)
        if len(data) > MAX_ENTRY_SIZE:
            raise EntryTooLargeError("entry too large", ledger=ledger_id, entry=entry_id, size=len(data))
        return bytes(data), self._shared.writable_state(ledger_id)
