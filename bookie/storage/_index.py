"""Per-ledger index files: durable ledger state plus one 8-byte slot per entry.

Theory of operation
-------------------
``<ledger:016x>.idx`` starts with two 512-byte header copies (master key, fenced flag,
explicit LAC, a sequence number, CRC32C), then slot ``e`` at ``1024 + 8 * e`` holds the
location ``(entry log id << 32) | offset`` of entry ``e``, or 0 when it is absent.

Guarantees: the header is never lost to a torn write. A header update writes the copy
holding the *older* sequence number (copy ``seq % 2``) and leaves the newest durable
copy alone; :func:`load_index` reads both and takes the valid one with the highest
sequence. So after a crash a ledger shows either its last durable state or the state
the interrupted flush was writing — never less. Slots are 8 aligned bytes inside one
sector, so a crash leaves a slot old or new, never mixed.

Assumptions: only the storage's flush writes index files, one flush at a time; it
writes a slot only after the record it points to is durable (entry log synced and its
name made durable), and it builds a new file under a ``.tmp`` name, syncs it and only
then renames it, so a ``.idx`` file always holds at least one synced header copy.
Recovery: nothing to repair — the loader picks the newest valid copy; two invalid
copies can only be damage and raise :class:`~walkit.errors.CorruptionError`.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from bookie.fs import File
from bookie.storage._format import (
    INDEX_COPY_SIZE,
    INDEX_HEADER_SIZE,
    SLOT,
    IndexHeader,
    decode_index_copy,
    encode_index_copy,
)
from walkit.errors import CorruptionError

__all__ = ["LedgerState", "load_index", "write_header", "write_slots", "write_run", "runs_of", "read_slot", "read_slots"]

_SCAN_SLOTS = 8192  # slots read per step when looking for the last entry at open


@dataclass
class LedgerState:
    """What the storage keeps in RAM per ledger (never per entry)."""

    ledger_id: int
    master_key: bytes | None = None
    fenced: bool = False
    explicit_lac: int | None = None
    last_entry_id: int = -1
    #: The index file exists (a flush created it).
    on_disk: bool = False
    #: Sequence number of the newest header copy written (owned by the flush).
    seq: int = 0

    def snapshot(self) -> IndexHeader:
        """The header the next flush writes (sequence ``seq + 1``)."""
        return IndexHeader(
            ledger_id=self.ledger_id,
            seq=self.seq + 1,
            fenced=self.fenced,
            explicit_lac=self.explicit_lac,
            master_key=self.master_key,
        )


def load_index(f: File, ledger_id: int, path: str) -> LedgerState:
    """The state held by an index file (the valid header copy with the highest seq)."""
    raw = f.pread(INDEX_HEADER_SIZE, 0)
    copies = [
        decode_index_copy(raw[i * INDEX_COPY_SIZE : (i + 1) * INDEX_COPY_SIZE], i, ledger_id, path)
        for i in range(2)
    ]
    valid = [h for h in copies if h is not None]
    if not valid:
        raise CorruptionError("both index header copies are invalid", path=path, ledger=ledger_id)
    newest = max(valid, key=lambda h: h.seq)
    return LedgerState(
        ledger_id=ledger_id,
        master_key=newest.master_key,
        fenced=newest.fenced,
        explicit_lac=newest.explicit_lac,
        last_entry_id=_scan_last_entry(f),
        on_disk=True,
        seq=newest.seq,
    )


def _scan_last_entry(f: File) -> int:
    """Highest entry id with a non-zero slot, -1 if none (scans back from the end)."""
    n = max(0, (f.size() - INDEX_HEADER_SIZE) // SLOT.size)
    while n > 0:
        k = min(n, _SCAN_SLOTS)
        raw = f.pread(SLOT.size * k, INDEX_HEADER_SIZE + SLOT.size * (n - k))
        used = len(raw[: SLOT.size * k].rstrip(b"\0"))
        if used:
            return n - k + (used - 1) // SLOT.size
        n -= k
    return -1


def write_header(f: File, header: IndexHeader) -> None:
    """Overwrite the older copy (number ``header.seq % 2``)."""
    f.pwrite(encode_index_copy(header), (header.seq % 2) * INDEX_COPY_SIZE)


def runs_of(ids: Iterable[int]) -> list[range]:
    """The distinct ``ids`` as runs of consecutive ids, in order."""
    ordered = sorted(ids)
    runs, start = [], 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            runs.append(range(ordered[start], ordered[i - 1] + 1))
            start = i
    return runs


def write_slots(f: File, slots: dict[int, int]) -> None:
    """Write every ``entry -> location`` slot, one ``pwrite`` per run of entry ids."""
    ordered = sorted(slots)
    runs = [range(ordered[0], ordered[-1] + 1)] if ordered and ordered[-1] - ordered[0] == len(ordered) - 1 \
        else runs_of(ordered)  # the usual case, one run, without a turn of runs_of's loop per entry
    for run in runs:
        raw = struct.pack(f"<{len(run)}Q", *map(slots.__getitem__, run))
        f.pwrite(raw, INDEX_HEADER_SIZE + SLOT.size * run[0])


def write_run(f: File, first: int, locations: array[int]) -> None:
    """Write the slots of entries ``first, first + 1, ...`` (an ``array('Q')``) in one ``pwrite``."""
    if sys.byteorder != "little":
        locations = array("Q", locations)
        locations.byteswap()
    f.pwrite(locations.tobytes(), INDEX_HEADER_SIZE + SLOT.size * first)


def read_slots(f: File, first: int, count: int) -> list[int]:
    """The locations of entries ``first .. first + count - 1`` (0 when absent)."""
    raw = f.pread(SLOT.size * count, INDEX_HEADER_SIZE + SLOT.size * first)
    slots = [s for (s,) in SLOT.iter_unpack(raw[: len(raw) - len(raw) % SLOT.size])]
    return slots + [0] * (count - len(slots))


def read_slot(f: File, entry_id: int) -> int:
    """The location of ``entry_id``, 0 when absent."""
    raw = f.pread(SLOT.size, INDEX_HEADER_SIZE + SLOT.size * entry_id)
    return SLOT.unpack(raw)[0] if len(raw) == SLOT.size else 0
