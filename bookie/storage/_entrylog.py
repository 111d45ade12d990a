"""Entry logs: append-only files holding the entries of every ledger of a ledger dir.

Theory of operation
-------------------
An entry log ``<id:016x>.log`` is a 512-byte header (magic, version, log id, CRC32C)
followed by records ``length | crc32c | ledger id | entry id | data`` (format in
``docs/format.md``). :class:`EntryLogWriter` appends records to an in-memory buffer and
writes the buffer at the file's end when it reaches ``buffer_size``, when the log rolls,
and when the storage flushes; records still in the buffer are read from memory.

Guarantees: a record's location (log id, offset) never changes once it is handed out,
and once :meth:`EntryLogWriter.write_out` and ``sync`` returned, the record and the
header are durable. :func:`read_record` checks length bounds, CRC and the (ledger, entry)
ids of what it reads and raises :class:`~walkit.errors.CorruptionError` otherwise.

Assumptions: the caller serialises calls on one writer (the storage's lock) and only
points its index at records whose log was synced and whose name was made durable
(``fsync_dir``). Recovery: nothing to do here. A log is never appended to after a
restart (the tail of the log that was active at a crash may hold torn records, but no
index slot points there); a new log with a higher id is started instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from crc32c import crc32c

from bookie.fs import File, FileSystem, is_no_space
from bookie.storage._format import (
    LOG_HEADER_SIZE,
    RECORD_CRC_HEAD,
    RECORD_HEADER,
    check_log_header,
    check_record,
    encode_log_header,
    record_length,
)
from bookie.storage._usage import LogUsage

__all__ = ["FIRST_READ", "EntryLogWriter", "LogGone", "Preader", "finish_record", "open_log_for_read",
           "read_record", "record_where"]

_RECORD_HEADER_PACK = RECORD_HEADER.pack
_CRC_HEAD_PACK = RECORD_CRC_HEAD.pack
_IDS_SIZE = RECORD_HEADER.size - 8  # ledger and entry id: counted in a record's length

#: First read of a record: its header and, for most entries, all of its data.
FIRST_READ = 4096


class Preader(Protocol):
    """What reading records needs of a log: a file, or memory in front of one
    (:class:`bookie.storage._cache.KeptFirst`)."""

    def pread(self, size: int, offset: int) -> bytes: ...


class LogGone(Exception):
    """The entry log a location names is not there (compaction removed it, or damage)."""


class EntryLogWriter:
    """The active (or rolled, not yet synced) entry log of one ledger dir."""

    def __init__(self, fs: FileSystem, path: str, log_id: int, buffer_size: int,
                 on_written: Callable[[int, int, bytearray], None] | None = None) -> None:
        self.path = path
        self.log_id = log_id
        self.file = fs.open(path, create=True)
        self.file.truncate(0)
        self._buf = bytearray(encode_log_header(log_id))
        self._buf_start = 0
        self._buffer_size = buffer_size
        #: Offset the next record will get.
        self.position = len(self._buf)
        #: Record bytes per ledger (the log's usage; :mod:`bookie.storage._usage`).
        self.ledgers: dict[int, int] = {}
        #: The disk was full when the buffer was last due to be written (ENOSPC): the
        #: records wait in the buffer (readable) for a flush once there is room.
        self.no_space: OSError | None = None
        #: ``on_written(log id, offset, buffer)``: a buffer was just written there (the
        #: recent-writes cache keeps it: the buffer is never changed after that)
        self.on_written = on_written
        #: Where the last :meth:`append_run` stopped (an index into its ``entry_ids``).
        self.run_end = 0

    def append(self, ledger_id: int, entry_id: int, data: bytes) -> int:
        """Buffer one record (writing the buffer out once it holds ``buffer_size``
        bytes); return its offset."""
        offset = self.position
        buf = self._buf
        length = _IDS_SIZE + len(data)  # record_prefix(), inlined: the hot path
        buf += _RECORD_HEADER_PACK(length, crc32c(data, crc32c(_CRC_HEAD_PACK(length, ledger_id, entry_id))),
                                   ledger_id, entry_id)
        buf += data
        self.position = self._buf_start + len(buf)
        ledgers = self.ledgers
        ledgers[ledger_id] = ledgers.get(ledger_id, 0) + length + 8
        if len(buf) >= self._buffer_size:
            self._write_out_or_hold()
        return offset

    def _write_out_or_hold(self) -> None:
        """:meth:`write_out` the full buffer - but on a full disk the records stay in the
        buffer (:attr:`no_space` set): a flush writes them later."""
        try:
            self.write_out()
        except OSError as exc:
            if not is_no_space(exc):
                raise
            self.no_space = exc

    def append_run(self, ledger_id: int, entry_ids: list[int], slots: dict[int, bytes], table: dict[int, int],
                   start: int, size_limit: int) -> int:
        """:meth:`append` for ``entry_ids[start:]`` in order (each one's data in
        ``slots``), its location (``log id << 32 | offset``) into ``table``, while the log
        stays within ``size_limit`` bytes (a record that would pass it ends the run,
        unless the log holds no record yet); returns the index of the first entry not
        appended. The placement's hot path: the same records and buffer write-outs as one
        :meth:`append` per entry, with the loop's state in locals. An error raises with
        the entries before it appended and in ``table``; :attr:`run_end` says how many."""
        buf, position, buf_start, buffer_size = self._buf, self.position, self._buf_start, self._buffer_size
        base, head, pack, crc_head = self.log_id << 32, RECORD_HEADER.size, _RECORD_HEADER_PACK, _CRC_HEAD_PACK
        i, n, used = start, len(entry_ids), 0
        try:
            while i < n:
                entry_id = entry_ids[i]
                data = slots[entry_id]
                if position > LOG_HEADER_SIZE and position + head + len(data) > size_limit:
                    break
                length = _IDS_SIZE + len(data)
                buf += pack(length, crc32c(data, crc32c(crc_head(length, ledger_id, entry_id))), ledger_id, entry_id)
                buf += data
                offset, position = position, buf_start + len(buf)
                used += length + 8
                if len(buf) >= buffer_size:
                    self.position = position
                    self._write_out_or_hold()
                    buf, buf_start = self._buf, self._buf_start
                table[entry_id] = base | offset
                i += 1
        finally:
            self.position, self.run_end = position, i
            if used:
                ledgers = self.ledgers
                ledgers[ledger_id] = ledgers.get(ledger_id, 0) + used
        return i

    def write_out(self) -> None:
        """Write the buffer at the end of the file (no sync). When it fails the buffer
        is kept whole (the next call writes it again, over any part that got through)."""
        if self._buf:
            self.file.pwrite(self._buf, self._buf_start)
            if self.on_written is not None:
                self.on_written(self.log_id, self._buf_start, self._buf)
            self._buf_start += len(self._buf)
            self._buf = bytearray()
        self.no_space = None

    @property
    def buffer_start(self) -> int:
        """The offset of the buffer's first byte (all before it is in the file)."""
        return self._buf_start

    def read_buffered(self, offset: int, ledger_id: int, entry_id: int) -> bytes | None:
        """The data of the record at ``offset`` if it is still in the buffer."""
        if offset < self._buf_start:
            return None
        rel = offset - self._buf_start
        where = self._where(offset, ledger_id, entry_id)
        total = record_length(bytes(self._buf[rel : rel + RECORD_HEADER.size]), where)
        return check_record(bytes(self._buf[rel : rel + total]), ledger_id, entry_id, where)

    def usage(self) -> LogUsage:
        """What this log holds per ledger (final once the log stopped taking records)."""
        ledgers = dict(self.ledgers)
        return LogUsage(self.log_id, ledgers, self.position - LOG_HEADER_SIZE, sum(ledgers.values()), self.position)

    def close(self) -> None:
        self.file.close()

    def _where(self, offset: int, ledger_id: int, entry_id: int) -> dict[str, object]:
        return record_where(self.log_id, offset, ledger_id, entry_id)


def open_log_for_read(fs: FileSystem, path: str, log_id: int) -> File:
    """Open an entry log and check its header."""
    f = fs.open(path)
    try:
        check_log_header(f.pread(LOG_HEADER_SIZE, 0), log_id, path)
    except BaseException:
        f.close()
        raise
    return f


def read_record(f: Preader, log_id: int, offset: int, ledger_id: int, entry_id: int) -> bytes:
    """Read, verify and return the data of the record at ``offset`` of log ``log_id``."""
    where = record_where(log_id, offset, ledger_id, entry_id)
    return finish_record(f, f.pread(FIRST_READ, offset), offset, ledger_id, entry_id, where)


def finish_record(f: Preader, head: bytes, offset: int, ledger_id: int, entry_id: int,
                  where: dict[str, object]) -> bytes:
    """The verified data of the record at ``offset`` whose first bytes, read already, are
    ``head`` (the rest is read when the record is longer)."""
    total = record_length(head, where)
    if len(head) < total:
        head += f.pread(total - len(head), offset + len(head))
    return check_record(head, ledger_id, entry_id, where)


def record_where(log_id: int, offset: int, ledger_id: int, entry_id: int) -> dict[str, object]:
    """The key=value context of an error about one record."""
    return {"ledger": ledger_id, "entry": entry_id, "log": log_id, "offset": offset}
