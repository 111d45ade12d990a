"""Reading ledger storage for an operator (``walkit bookie info|readlog``): read-only.

:class:`EntryLogFile` lists the records of one entry log with the scan that rebuilds a
log's usage (:func:`~bookie.storage._usage.scan_records`: each record's bounds and CRC
checked) and says where the intact records end; :func:`ledger_dir_summary` counts what
a ledger directory holds. Neither changes anything on disk (the storage's own scans
remove leftovers: these do not).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from bookie.fs import File, FileSystem
from bookie.storage._entrylog import open_log_for_read
from bookie.storage._format import LOG_HEADER_SIZE, RECORD_HEADER, parse_index_name, parse_log_name, parse_logs_dir_name
from bookie.storage._ledgerdir import LedgerDir
from bookie.storage._slotlog import SLOT_LOG_NAME
from walkit.errors import InvalidArgumentError

_BUCKET = re.compile(r"[0-9a-f]{2}")  # index/<ledger id & 0xff:02x>/

__all__ = ["EntryLogRecord", "EntryLogFile", "LedgerDirSummary", "ledger_dir_summary"]


@dataclass(frozen=True)
class EntryLogRecord:
    offset: int
    ledger_id: int
    entry_id: int
    size: int  # bytes of entry data (the record adds a 24-byte header)


class EntryLogFile:
    """The intact records of one entry log (``<id:016x>.log``), in order. After
    :meth:`records` ran to its end, :attr:`end` is where they end: the file's size, or
    less when the rest is torn or damaged. FormatError / CorruptionError for a bad
    header, NativeIOError when it cannot be read."""

    def __init__(self, fs: FileSystem, path: str) -> None:
        log_id = parse_log_name(os.path.basename(path))
        if log_id is None:
            raise InvalidArgumentError("not an entry log name (<id:016x>.log)", path=path)
        self.path = path
        self.log_id = log_id
        self._file: File = open_log_for_read(fs, path, log_id)
        self.size = self._file.size()
        self.end = LOG_HEADER_SIZE

    def records(self) -> Iterator[EntryLogRecord]:
        from bookie.storage._usage import scan_records

        for offset, ledger_id, entry_id, data in scan_records(self._file, self.log_id):
            self.end = offset + RECORD_HEADER.size + len(data)
            yield EntryLogRecord(offset, ledger_id, entry_id, len(data))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> EntryLogFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class LedgerDirSummary:
    """What one ledger directory holds (names only: nothing is opened)."""

    directory: str
    entry_logs: int
    entry_log_bytes: int
    usage_files: int
    compacting: int
    index_files: int
    slot_log_bytes: int  # the slot log's size (its header alone: 512; none: 0)
    foreign: int  # names the storage does not know (it would refuse to start on them)


def ledger_dir_summary(fs: FileSystem, directory: str) -> LedgerDirSummary:
    d = LedgerDir(fs, directory, 0, LOG_HEADER_SIZE + RECORD_HEADER.size, 1)  # for its paths only
    logs = usage = compacting = foreign = size = indexes = 0
    for name in fs.listdir(d.logs_dir) if fs.exists(d.logs_dir) else []:
        parsed = parse_logs_dir_name(name)
        kind = parsed[1] if parsed else None
        logs += kind == "log"
        usage += kind == "use"
        compacting += kind == "compact"
        foreign += parsed is None
        if kind == "log":
            size += _file_size(fs, f"{d.logs_dir}/{name}")
    for bucket in fs.listdir(d.index_dir) if fs.exists(d.index_dir) else []:
        if bucket == SLOT_LOG_NAME:
            continue
        if not _BUCKET.fullmatch(bucket):
            foreign += 1
            continue
        for name in fs.listdir(f"{d.index_dir}/{bucket}"):
            index = parse_index_name(name)
            indexes += index is not None and not index[1]
            foreign += index is None
    slots = _file_size(fs, d.slot_log.path) if fs.exists(d.slot_log.path) else 0
    return LedgerDirSummary(directory, logs, size, usage, compacting, indexes, slots, foreign)


def _file_size(fs: FileSystem, path: str) -> int:
    f = fs.open(path)
    try:
        return f.size()
    finally:
        f.close()
