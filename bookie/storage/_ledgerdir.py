"""One ledger directory: its layout, its entry-log ids and its active entry log.

Theory of operation
-------------------
Layout of a ledger dir (the ``COOKIE`` file next to ``current/`` belongs to
:mod:`bookie.cookie`)::

    <dir>/current/logs/<log id:016x>.log          entry logs
    <dir>/current/index/<ledger & 0xff:02x>/<ledger id:016x>.idx

``current/``, ``logs/`` and ``index/`` are made (and fsynced into their parents) when the
storage opens; a bucket is made by the first flush that creates an index file in it,
which then fsyncs ``index/`` as well as the bucket. A new index file is built as
``<ledger id:016x>.idx.tmp``, synced, then renamed, so a ``.idx`` name always holds a
synced header.

Guarantees: log ids only grow — a restart starts a new log one above the highest name
found, and never appends to an old log (its tail may hold torn records after a crash).
:meth:`LedgerDir.begin_flush` hands the flush every log written since the last flush;
rolled logs are closed only after that flush synced them. Assumptions: the storage's
lock serialises every call except the syncs of a :class:`LogFlush`, which a single
flush performs outside that lock. Recovery: :meth:`LedgerDir.scan_logs` and
:meth:`LedgerDir.scan_index` parse names strictly (a foreign name is a FormatError) and
remove ``.idx.tmp`` leftovers: they belong to a flush that never completed, which
promised nothing (the journal still holds what it was writing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from bookie.fs import FileSystem
from bookie.storage._entrylog import EntryLogWriter
from bookie.storage._format import (
    LOG_HEADER_SIZE,
    RECORD_HEADER,
    index_name,
    log_name,
    parse_index_name,
    parse_log_name,
    unpack_location,
)
from walkit.errors import CorruptionError, FormatError, StorageError

__all__ = ["LedgerDir", "LogFlush"]

T = TypeVar("T")

_BUCKETS = [f"{b:02x}" for b in range(256)]
_MAX_LOG_ID = (1 << 32) - 1  # a slot keeps the log id in its upper 32 bits


@dataclass
class LogFlush:
    """The entry-log part of one flush of one ledger dir."""

    sync: list[EntryLogWriter]
    close: list[EntryLogWriter]
    fsync_dir: str | None


@dataclass
class LedgerDir:
    fs: FileSystem
    root: str
    number: int
    size_limit: int
    buffer_size: int
    writer: EntryLogWriter | None = None
    rolled: list[EntryLogWriter] = field(default_factory=list)
    next_log_id: int = 1
    #: A log was created since the logs directory was last fsynced.
    logs_dirty: bool = False
    #: Bucket directories known to exist (made at open or by a flush).
    buckets: set[str] = field(default_factory=set)

    @property
    def current_dir(self) -> str:
        return f"{self.root.rstrip('/')}/current"

    @property
    def logs_dir(self) -> str:
        return f"{self.current_dir}/logs"

    @property
    def index_dir(self) -> str:
        return f"{self.current_dir}/index"

    def bucket_dir(self, ledger_id: int) -> str:
        return f"{self.index_dir}/{_BUCKETS[ledger_id & 0xFF]}"

    def index_path(self, ledger_id: int) -> str:
        return f"{self.bucket_dir(ledger_id)}/{index_name(ledger_id)}"

    def new_index_path(self, ledger_id: int) -> str:
        return self.index_path(ledger_id) + ".tmp"

    def log_path(self, log_id: int) -> str:
        return f"{self.logs_dir}/{log_name(log_id)}"

    # --- open -----------------------------------------------------------------------
    def prepare(self) -> None:
        """Make the layout (idempotent) and the new directories durable."""
        self.fs.makedirs(self.logs_dir)
        self.fs.makedirs(self.index_dir)
        for path in (self.root, self.current_dir):
            self.fs.fsync_dir(path)

    def ensure_bucket(self, ledger_id: int) -> bool:
        """Make the ledger's bucket directory; True if it is new (fsync ``index/``)."""
        bucket = self.bucket_dir(ledger_id)
        if bucket in self.buckets:
            return False
        self.fs.makedirs(bucket)
        self.buckets.add(bucket)
        return True

    def scan_logs(self) -> None:
        """Forget any writer; the next log gets an id above every log on disk."""
        ids = [self._parse(parse_log_name, self.logs_dir, n) for n in self.fs.listdir(self.logs_dir)]
        self.writer, self.rolled, self.logs_dirty = None, [], False
        self.next_log_id = max(ids, default=0) + 1

    def scan_index(self) -> Iterator[tuple[int, str]]:
        """``(ledger id, path)`` of every index file, checked against its bucket.
        ``.tmp`` leftovers of a flush that never completed are removed."""
        self.buckets = set()
        for bucket in self.fs.listdir(self.index_dir):
            if bucket not in _BUCKETS:
                raise FormatError("unexpected name in index directory", dir=self.index_dir, name=bucket)
            where = f"{self.index_dir}/{bucket}"
            self.buckets.add(where)
            for name in self.fs.listdir(where):
                ledger_id, leftover = self._parse(parse_index_name, where, name)
                if self.bucket_dir(ledger_id) != where:
                    raise CorruptionError("index file in the wrong bucket", bucket=bucket, name=name)
                if leftover:
                    self.fs.remove(f"{where}/{name}")
                    self.fs.fsync_dir(where)
                else:
                    yield ledger_id, self.index_path(ledger_id)

    @staticmethod
    def _parse(parser: Callable[[str], T | None], where: str, name: str) -> T:
        value = parser(name)
        if value is None:
            raise FormatError("unexpected file in ledger storage", dir=where, name=name)
        return value

    # --- writes (under the storage lock) ----------------------------------------------
    def append(self, ledger_id: int, entry_id: int, data: bytes) -> int:
        """Buffer a record in the active log (rolling it if full); return its location."""
        w = self.writer
        if w is None or (w.position > LOG_HEADER_SIZE and w.position + RECORD_HEADER.size + len(data) > self.size_limit):
            w = self._roll()
        return (w.log_id << 32) | w.append(ledger_id, entry_id, data)  # pack_location(), inlined

    def read_buffered(self, location: int, ledger_id: int, entry_id: int) -> bytes | None:
        log_id, offset = unpack_location(location)
        w = self.writer
        if w is None or w.log_id != log_id:
            return None
        return w.read_buffered(offset, ledger_id, entry_id)

    def begin_flush(self) -> LogFlush:
        """Write out the buffer; hand over every log the flush must sync."""
        if self.writer is not None:
            self.writer.write_out()
        done, self.rolled = self.rolled, []
        active = [self.writer] if self.writer is not None else []
        fsync_dir = self.logs_dir if self.logs_dirty else None
        self.logs_dirty = False
        return LogFlush(sync=done + active, close=done, fsync_dir=fsync_dir)

    def close(self) -> None:
        for w in self.rolled + ([self.writer] if self.writer is not None else []):
            w.close()
        self.writer, self.rolled = None, []

    def _roll(self) -> EntryLogWriter:
        old, self.writer = self.writer, None
        if old is not None:
            old.write_out()
            self.rolled.append(old)
        if self.next_log_id > _MAX_LOG_ID:
            raise StorageError("entry log ids exhausted", dir=self.root)
        log_id = self.next_log_id
        self.next_log_id += 1
        self.logs_dirty = True
        self.writer = EntryLogWriter(self.fs, self.log_path(log_id), log_id, self.buffer_size)
        return self.writer
