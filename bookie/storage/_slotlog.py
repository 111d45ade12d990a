"""Slot log: the index slots of many checkpoints in one file per ledger directory.

Theory of operation
-------------------
A checkpoint writes the location of every entry it placed into its ledger's index file
(:mod:`bookie.storage._index`). With 10,000 ledgers written at once that is, per
checkpoint, 10,000 files opened, written and closed for a few slots each: seconds of
kernel time (each write dirties an inode), whatever the checkpoint's size. The slot log
turns those writes into one:

* a flush that gives a dir ``SLOT_LOG_LEDGERS`` ledgers or more (the storage's
  constant) appends to the dir's ``current/index/slots.log`` one record per ledger whose new
  slots are *deferrable* - the ledger has an index file already, no header to write, and
  its new slots are one run of consecutive entry ids - and keeps that run in memory
  (:meth:`SlotLog.defer`, a ``array('Q')`` of locations: 8 bytes a slot). The index file
  is not touched;
* a ledger whose slots are not deferrable gets its index file written as before (with
  its runs in memory first, then the new slots), and - if the slot log holds records of
  it (:attr:`SlotLog.logged`) - its new slots appended to the slot log too, so that the
  log's last record for each entry is always the newest location;
* once the log would pass ``max_bytes``, the flush *merges*: every run in memory goes to
  its index file with the flush's own slots, the files are synced, and only then is the
  log emptied (:meth:`SlotLog.reset`: truncated to its header, synced);
* a ledger deleted while the log holds records of it is *voided* (:meth:`SlotLog.forget`:
  its runs dropped; its index file is removed as before): the next flush appends a
  *deleted* record of it, which makes its earlier records void. That record is synced
  with the flush's first sync, before any new index file gets its name (the renames
  come after), so a ledger made again under the same id never gets its predecessor's
  locations; until then, records of a ledger without an index file are void at open
  too (and voided again).

Lookups (the storage lock held) ask the write cache, the pending and flushing maps, then
:meth:`SlotLog.slot` (runs, newest first), then the index file: a run is newer than the
file and older than any map.

Crash safety. The slot log is written and synced in the flush's step 3 with the index
files (the same syncfs, or its own fdatasync), after the entry logs it points into are
durable, and before the flush completes (the journal's checkpoint mark comes after). At
open (:meth:`SlotLog.load`) its intact records are replayed into memory in order; the
first record that is torn (a length or CRC that does not hold) ends it, and the file is
cut there. Replaying a record that a completed flush superseded is impossible (the
superseding record comes later in the log, or the merge that wrote it to the file
emptied the log before completing); a record of a flush that did not complete points at
records that step 2 made durable, in logs that nothing removes before a later flush
completes (compaction deletes a log only after the flush of the copies) - so every
location replayed is readable. That needs the records of a flush undone for lack of
space gone before any later flush completes: the undoing cuts them at once
(:meth:`SlotLog.cut`; if that fails, the storage fails). A clean close writes every run
into its index file, syncs, and removes the log (:meth:`SlotLog.remove`): it lives in
``index/``, where an older walkit refuses an unknown name, so a log left by a crash stops
a downgrade instead of being ignored.

Assumes: only the storage's flush (and ``delete_ledger``, under the same flush lock)
writes the log.
"""

from __future__ import annotations

import logging
import struct
import sys
from array import array
from collections.abc import Callable, Container

from crc32c import crc32c

from bookie.fs import File, FileSystem, write_atomic
from walkit.errors import CorruptionError, FormatError, FormatVersionError
from walkit.logs import context

log = logging.getLogger("bookie.storage")

__all__ = ["SLOT_LOG_NAME", "SLOT_LOG_VERSION", "SLOT_LOG_HEADER_SIZE", "SlotLog", "encode_run", "encode_deleted",
           "encode_slot_log_header"]

#: Its name in the index directory, where an older walkit (which cannot read it) refuses to
#: start on an unknown name rather than lose the slots it holds.
SLOT_LOG_NAME = "slots.log"
SLOT_LOG_MAGIC = b"WKSLOTLG"
SLOT_LOG_VERSION = 1  # 1: first format (512-byte header, CRC32C records of runs and deletions)
SLOT_LOG_HEADER_SIZE = 512
_HEADER = struct.Struct("<8sHHI")  # magic, version, header size, crc32c of the 12 bytes before it
#: length (of everything after the CRC), crc32c (of the length and everything after it),
#: kind, reserved (0), ledger id, first entry id; then ``(length - 20) / 8`` locations.
RECORD = struct.Struct("<IIHHQQ")
_AFTER_CRC = RECORD.size - 8
_U32 = struct.Struct("<I")
KIND_RUN = 1
KIND_DELETED = 2
MAX_RUN = 1 << 24  # slots a record holds at most (a longer run is several records)
#: Bytes a record may take: bounds what a torn length allocates.
_MAX_RECORD = RECORD.size + 8 * MAX_RUN


def encode_slot_log_header() -> bytes:
    raw = _HEADER.pack(SLOT_LOG_MAGIC, SLOT_LOG_VERSION, SLOT_LOG_HEADER_SIZE, 0)[:-4]
    raw += _U32.pack(crc32c(raw))
    return raw + bytes(SLOT_LOG_HEADER_SIZE - len(raw))


def _record(kind: int, ledger_id: int, first: int, locations: bytes) -> bytes:
    body = struct.pack("<HHQQ", kind, 0, ledger_id, first) + locations
    length = _U32.pack(len(body))
    return length + _U32.pack(crc32c(body, crc32c(length))) + body


def encode_run(ledger_id: int, first: int, locations: array[int]) -> bytes:
    """The records of ``locations`` of entries ``first, first + 1, ...`` of a ledger (one,
    or one per ``MAX_RUN`` slots)."""
    if len(locations) > MAX_RUN:
        return b"".join(encode_run(ledger_id, first + at, locations[at:at + MAX_RUN])
                        for at in range(0, len(locations), MAX_RUN))
    if sys.byteorder != "little":
        locations = array("Q", locations)
        locations.byteswap()
    return _record(KIND_RUN, ledger_id, first, locations.tobytes())


def encode_deleted(ledger_id: int) -> bytes:
    """The record that makes every earlier record of the ledger void."""
    return _record(KIND_DELETED, ledger_id, 0, b"")


def _check_header(raw: bytes, path: str) -> None:
    if len(raw) < _HEADER.size:
        raise CorruptionError("slot log header truncated", path=path, size=len(raw))
    magic, version, size, crc = _HEADER.unpack_from(raw)
    if magic != SLOT_LOG_MAGIC:
        raise FormatError("not a slot log", path=path, magic=magic.hex())
    if crc != crc32c(raw[: _HEADER.size - 4]):
        raise CorruptionError("slot log header CRC mismatch", path=path)
    FormatVersionError.reader(_HEADER_READERS, version, "slot log", path=path)(size, path)


def _check_header_v1(size: int, path: str) -> None:
    if size != SLOT_LOG_HEADER_SIZE:
        raise FormatError("slot log header size invalid", path=path, size=size)


#: Slot-log version -> the check of the rest of its header (records follow at 512).
_HEADER_READERS: dict[int, Callable[[int, str], None]] = {1: _check_header_v1}


def parse_records(raw: bytes | memoryview, at: int = 0) -> tuple[list[tuple[int, int, int, array[int]]], int]:
    """The intact records of ``raw`` from ``at`` as ``(kind, ledger, first, locations)``,
    and where they end (a torn or partial record, or zeros, ends them)."""
    out: list[tuple[int, int, int, array[int]]] = []
    view = memoryview(raw)
    while at + RECORD.size <= len(view):
        length, crc, kind, _, ledger_id, first = RECORD.unpack_from(view, at)
        end = at + 8 + length
        if length < _AFTER_CRC or (length - _AFTER_CRC) % 8 or end > len(view) or end - at > _MAX_RECORD:
            break
        if crc != crc32c(view[at + 8 : end], crc32c(view[at : at + 4])) or kind not in (KIND_RUN, KIND_DELETED):
            break
        locations = array("Q")
        locations.frombytes(view[at + RECORD.size : end])
        if sys.byteorder != "little":
            locations.byteswap()
        out.append((kind, ledger_id, first, locations))
        at = end
    return out, at


class SlotLog:
    """One ledger dir's slot log: the file and the runs it holds that no index file has.
    The file exists only while it may hold records: made by the first append, removed
    when the storage closes (after a merge)."""

    def __init__(self, fs: FileSystem, path: str, max_bytes: int) -> None:
        self.fs, self.path, self.max_bytes = fs, path, max_bytes
        self.directory = path.rsplit("/", 1)[0]
        self.file: File | None = None
        #: Where the last complete append ends (an undone flush's bytes after it are cut).
        self.end = SLOT_LOG_HEADER_SIZE
        #: Deferred runs by ledger, oldest first: ``(first entry id, locations)``.
        self.runs: dict[int, list[tuple[int, array[int]]]] = {}
        #: Ledgers the file holds records of (since it was last emptied).
        self.logged: set[int] = set()
        #: Deleted ledgers whose records the file holds, with no *deleted* record after them yet.
        self.voided: set[int] = set()
        #: Slots held in :attr:`runs`.
        self.slots = 0

    # --- open / close -----------------------------------------------------------------
    def load(self, ledgers: Container[int]) -> None:
        """Open the file, if there is one, and replay its intact records into memory
        (records of ledgers not in ``ledgers`` - deleted - are void); a torn tail is cut
        off. A ``.tmp`` left by a crash while the file was being made is removed."""
        self.runs, self.logged, self.voided, self.slots = {}, set(), set(), 0
        self.end = SLOT_LOG_HEADER_SIZE
        if self.fs.exists(self.path + ".tmp"):
            self.fs.remove(self.path + ".tmp")
            self.fs.fsync_dir(self.directory)
        if not self.fs.exists(self.path):
            return
        self.file = f = self.fs.open(self.path)
        size = f.size()
        _check_header(f.pread(SLOT_LOG_HEADER_SIZE, 0), self.path)
        raw = f.pread(size - SLOT_LOG_HEADER_SIZE, SLOT_LOG_HEADER_SIZE) if size > SLOT_LOG_HEADER_SIZE else b""
        records, used = parse_records(raw)  # bounded by max_bytes (a merge empties it past that)
        for kind, ledger_id, first, locations in records:
            self._replay(kind, ledger_id, first, locations, ledgers)
        self.end = SLOT_LOG_HEADER_SIZE + used
        if self.end < size:
            if any(raw[used:]):
                log.info("%s: %d bytes after its last intact record dropped (a flush that never completed)",
                         self.path, size - self.end, extra=context(directory=self.path))
            self.cut()

    def _make(self) -> File:
        """The file, with its header (made, synced, renamed, its directory synced)."""
        write_atomic(self.fs, self.path, encode_slot_log_header())
        self.end = SLOT_LOG_HEADER_SIZE
        return self.fs.open(self.path)

    def _replay(self, kind: int, ledger_id: int, first: int, locations: array[int],
                ledgers: Container[int]) -> None:
        if kind == KIND_DELETED:
            self._drop(ledger_id)
            self.logged.discard(ledger_id)
            self.voided.discard(ledger_id)
            return
        if ledger_id not in ledgers:  # deleted, its deleted record not written yet: void it again
            self.voided.add(ledger_id)
            return
        self.logged.add(ledger_id)
        self.runs.setdefault(ledger_id, []).append((first, locations))
        self.slots += len(locations)

    def close(self) -> None:
        f, self.file = self.file, None
        self.runs, self.logged, self.voided, self.slots = {}, set(), set(), 0
        if f is not None:
            f.close()

    def remove(self) -> None:
        """(The storage closing, every run in its synced index file) remove the file: a
        cleanly stopped bookie leaves none (so an older walkit, which refuses one, opens
        its directories)."""
        f, self.file = self.file, None
        if f is not None:
            f.close()
        if self.fs.exists(self.path):
            self.fs.remove(self.path)
            self.fs.fsync_dir(self.directory)
        self.runs, self.logged, self.voided, self.slots = {}, set(), set(), 0
        self.end = SLOT_LOG_HEADER_SIZE

    # --- lookups (the storage lock held) ------------------------------------------------
    def slot(self, ledger_id: int, entry_id: int) -> int:
        """The newest location the runs hold for the entry, 0 when none."""
        runs = self.runs.get(ledger_id)
        if runs is None:
            return 0
        for first, locations in reversed(runs):
            if 0 <= entry_id - first < len(locations):
                return locations[entry_id - first]
        return 0

    def window(self, ledger_id: int, first: int, count: int) -> dict[int, int]:
        """``entry -> location`` the runs hold for entries ``first .. first + count - 1``."""
        runs = self.runs.get(ledger_id)
        found: dict[int, int] = {}
        if runs is None:
            return found
        last = first + count
        for start, locations in runs:  # oldest first: newer runs overwrite
            lo, hi = max(first, start), min(last, start + len(locations))
            for e in range(lo, hi):
                found[e] = locations[e - start]
        return found

    # --- a flush (the flush lock held) --------------------------------------------------
    def append(self, data: bytes) -> None:
        """Write records after :attr:`end` (made first if there is no file; not synced:
        the flush syncs). :meth:`appended` moves ``end`` once the flush completed; a
        flush undone meanwhile calls :meth:`cut`."""
        if self.file is None:
            self.file = self._make()
        self.file.pwrite(data, self.end)

    def appended(self, size: int) -> None:
        self.end += size

    def cut(self) -> None:
        """Cut (and sync) whatever lies past :attr:`end`: the records of a flush that was
        undone, which a later flush must not leave behind (their ledgers are not in
        :attr:`logged`, and a replay would put their runs over newer index slots)."""
        f = self.file
        if f is not None and f.size() > self.end:
            f.truncate(self.end)
            f.sync()

    def sync(self) -> None:
        assert self.file is not None, "slot log not open"
        self.file.sync()

    def defer(self, ledger_id: int, first: int, locations: array[int]) -> None:
        """Keep a run the file now holds (the flush completed)."""
        runs = self.runs.setdefault(ledger_id, [])
        if runs and runs[-1][0] + len(runs[-1][1]) == first:
            runs[-1][1].extend(locations)
        else:
            runs.append((first, locations))
        self.slots += len(locations)
        self.logged.add(ledger_id)

    def written(self, ledger_id: int, logged: bool) -> None:
        """The ledger's index file has its runs now (the flush completed); ``logged``: the
        flush appended its new slots to the file too."""
        self._drop(ledger_id)
        if logged:
            self.logged.add(ledger_id)

    def reset(self) -> None:
        """Empty the file (every run is in its synced index file) and sync it."""
        f = self.file
        if f is not None:
            f.truncate(SLOT_LOG_HEADER_SIZE)
            f.sync()
        self.end = SLOT_LOG_HEADER_SIZE

    def emptied(self) -> None:
        """Forget every run (after :meth:`reset`, the flush completed)."""
        self.runs, self.logged, self.voided, self.slots = {}, set(), set(), 0

    def forget(self, ledger_id: int) -> None:
        """The ledger is deleted (the storage lock held): its runs go, and if the file
        holds records of it, the next flush makes them void."""
        self._drop(ledger_id)
        if ledger_id in self.logged:
            self.logged.discard(ledger_id)
            self.voided.add(ledger_id)

    def void_records(self, ledger_ids: set[int]) -> bytes:
        """The *deleted* records of ``ledger_ids`` (a flush appends them first)."""
        return b"".join(encode_deleted(ledger_id) for ledger_id in sorted(ledger_ids))

    def voided_written(self, ledger_ids: set[int]) -> None:
        """Their deleted records are in the file (the flush completed)."""
        self.voided -= ledger_ids

    def _drop(self, ledger_id: int) -> None:
        runs = self.runs.pop(ledger_id, None)
        if runs:
            self.slots -= sum(len(locations) for _, locations in runs)
