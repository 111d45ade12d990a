"""One ledger directory: its layout, its entry-log ids and its active entry log.

Theory of operation
-------------------
Layout of a ledger dir (the ``COOKIE`` file next to ``current/`` belongs to
:mod:`bookie.cookie`)::

    <dir>/current/logs/<log id:016x>.log          entry logs
    <dir>/current/logs/<log id:016x>.use          a sealed log's usage (bookie.storage._usage)
    <dir>/current/logs/<log id:016x>.compact      marker: the log is being compacted
    <dir>/current/index/<ledger & 0xff:02x>/<ledger id:016x>.idx
    <dir>/current/index/slots.log                 slots not yet in index files (bookie.storage._slotlog)

``current/``, ``logs/`` and ``index/`` are made (and fsynced into their parents) when the
storage opens; a bucket is made by the first flush that creates an index file in it,
which then makes ``index/`` durable as well as the bucket (an fsync of each, or the
syncfs of a flush that syncs the whole file system; a flush undone for lack of space
forgets the buckets it made, so that the next one does it again). A new index file is
built as ``<ledger id:016x>.idx.tmp``, synced, then renamed, so a ``.idx`` name always
holds a synced header.

Guarantees: log ids only grow — a restart starts a new log one above the highest name
found, and never appends to an old log (its tail may hold torn records after a crash).
:meth:`LedgerDir.begin_flush` hands the flush every log written since the last flush;
rolled logs are closed only after that flush synced them. Assumptions: the storage's
lock serialises every call except the syncs of a :class:`LogFlush`, which a single
flush performs outside that lock, and the syncs of the active log a placement makes
outside it (``flushEntrylogBytes``); both run under the storage's flush lock, which
keeps every log they sync open. Recovery: :meth:`LedgerDir.scan_logs` and
:meth:`LedgerDir.scan_index` parse names strictly (a foreign name is a FormatError) and
remove ``.idx.tmp`` leftovers: they belong to a flush that never completed, which
promised nothing (the journal still holds what it was writing).

Sealed logs: once a flush synced a rolled log (or the storage closed), the log never
changes again; :meth:`LedgerDir.seal` files its usage in :attr:`LedgerDir.usage`, the
only logs garbage collection may compact. It may also delete an unsealed log that holds
no record of a live ledger (:meth:`LedgerDir.take_dead_logs`): on a disk too full for a
flush to complete, nothing is sealed, and deleted ledgers' logs are where room comes from. At open, :meth:`LedgerDir.load_usage`
reads each log's usage file or rebuilds it (and removes leftovers: ``.use.tmp`` files,
usage files and markers of logs that are gone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from bookie.fs import FileSystem, Syncer, is_no_space
import logging

from bookie.storage._cache import RecentWrites
from bookie.storage._entrylog import EntryLogWriter, open_log_for_read
from bookie.storage._format import (
    LOG_HEADER_SIZE,
    RECORD_HEADER,
    index_name,
    log_name,
    parse_index_name,
    parse_logs_dir_name,
    unpack_location,
)
from bookie.storage._slotlog import SLOT_LOG_NAME, SlotLog
from bookie.storage._usage import LogUsage, read_usage_file, rebuild_usage, write_usage_file
from walkit.errors import CorruptionError, FormatError, FormatVersionError, StorageError, WalkitError
from walkit.logs import context

log = logging.getLogger("bookie.storage")

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
    #: Usage of every sealed entry log (the ones GC may delete or compact), by log id.
    usage: dict[int, LogUsage] = field(default_factory=dict)
    #: Sealed logs with a compaction marker (a compaction to finish).
    compacting: set[int] = field(default_factory=set)
    #: Log ids found at open, to be sealed by :meth:`load_usage`.
    _found: dict[int, set[str]] = field(default_factory=dict)
    #: Where written-out log buffers are kept for readers (None or a bound of 0: nowhere).
    recent: RecentWrites | None = None
    #: syncfs of the dir's file system, open from :meth:`prepare` to :meth:`close` (None:
    #: the file system has none; index files are then synced one by one).
    syncer: Syncer | None = None
    #: Bytes the slot log may hold before a flush writes its runs to the index files (0: never used).
    slot_log_bytes: int = 0
    slot_log: SlotLog = field(init=False)
    #: Entries the last :meth:`append_run` appended (also when it raised).
    run_placed: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.slot_log = SlotLog(self.fs, f"{self.index_dir}/{SLOT_LOG_NAME}", self.slot_log_bytes)

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

    def usage_path(self, log_id: int) -> str:
        return self.log_path(log_id)[: -len(".log")] + ".use"

    def marker_path(self, log_id: int) -> str:
        return self.log_path(log_id)[: -len(".log")] + ".compact"

    # --- open -----------------------------------------------------------------------
    def prepare(self) -> None:
        """Make the layout (idempotent) and the new directories durable."""
        self.fs.makedirs(self.logs_dir)
        self.fs.makedirs(self.index_dir)
        for path in (self.root, self.current_dir):
            self.fs.fsync_dir(path)
        if self.syncer is None:  # before any write of this opening: it reports their failures
            self.syncer = self.fs.open_syncer(self.current_dir)
            if self.syncer is not None:
                try:  # takes a failure nobody was told of yet: one from before this opening
                    self.syncer.sync()
                except OSError as exc:
                    log.warning("%s: a write on its file system failed before the storage opened (%s): "
                                "not this opening's data; the journal replays what the last checkpoint "
                                "did not cover", self.root, exc, extra=context(directory=self.root))

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
        found: dict[int, set[str]] = {}
        for name in self.fs.listdir(self.logs_dir):
            log_id, kind = self._parse(parse_logs_dir_name, self.logs_dir, name)
            found.setdefault(log_id, set()).add(kind)
        self.writer, self.rolled, self.logs_dirty = None, [], False
        self.usage, self.compacting, self._found = {}, set(), found
        self.next_log_id = max(found, default=0) + 1

    def load_usage(self, ledgers: Mapping[int, object]) -> None:
        """Seal every log found by :meth:`scan_logs`: read its usage file, or rebuild
        the usage from the log and write the file; drop the ledgers not in ``ledgers``
        (deleted before the restart). Leftovers are removed. A log whose header cannot
        be read is left alone (never deleted or compacted) with a warning. A log or usage
        file of a version this code does not read stops the open (FormatVersionError):
        it is another walkit's, and nothing here may rebuild or remove it.

        A rebuilt log whose intact records end before its end of file has a torn tail
        only if it may have been written at the crash: its id is above every log with a
        valid usage file (logs are sealed in id order, and a flush fsyncs the directory
        after writing usage files). Below that, the same finding is damage to synced
        bytes - records after it may be indexed - so that log is left alone too."""
        changed = False
        found, self._found = self._found, {}
        for log_id, kinds in found.items():
            for kind in kinds - {"log"}:
                if "log" not in kinds or kind == "use.tmp":
                    self.fs.remove(f"{self.logs_dir}/{log_id:016x}.{kind}")
                    changed = True
        logs = sorted(log_id for log_id, kinds in found.items() if "log" in kinds)
        read = {log_id: self._read_usage(log_id) if "use" in found[log_id] else None for log_id in logs}
        self._refuse_other_versions(logs)
        sealed = max((log_id for log_id, usage in read.items() if usage is not None), default=0)
        for log_id in logs:
            usage = read[log_id]
            if usage is None:
                usage = self._rebuild_usage(log_id, may_be_torn=log_id > sealed)
                if usage is None:
                    continue
                changed = True
            usage.keep_only(ledgers)
            self.usage[log_id] = usage
            if "compact" in found[log_id]:
                self.compacting.add(log_id)
        if changed:
            self.fs.fsync_dir(self.logs_dir)

    def _refuse_other_versions(self, logs: list[int]) -> None:
        """FormatVersionError if a log is of a version this code does not read, before
        anything is rebuilt; a damaged header is judged later (rebuild, or reads)."""
        for log_id in logs:
            try:
                open_log_for_read(self.fs, self.log_path(log_id), log_id).close()
            except FormatVersionError:
                raise
            except WalkitError:
                continue

    def _read_usage(self, log_id: int) -> LogUsage | None:
        try:
            return read_usage_file(self.fs, self.usage_path(log_id), log_id)
        except FormatVersionError:
            raise  # another walkit's file: neither rebuilt nor overwritten
        except WalkitError as exc:
            log.warning("entry log %d in %s: usage file unreadable, rebuilding it: %s", log_id, self.root, exc,
                        extra=context(directory=self.root))
            return None

    def _rebuild_usage(self, log_id: int, may_be_torn: bool) -> LogUsage | None:
        path = self.log_path(log_id)
        try:
            f = open_log_for_read(self.fs, path, log_id)
        except FormatVersionError:
            raise  # another walkit's log: never removed, never taken for a torn one
        except WalkitError as exc:
            if self._empty(path):  # created, never synced (a crash): nothing can point into it
                self.fs.remove(path)
                return None
            log.warning("entry log %d in %s: header unreadable, the log is left alone: %s", log_id, self.root, exc,
                        extra=context(directory=self.root))
            return None
        try:
            usage, size = rebuild_usage(f, log_id), f.size()
        finally:
            f.close()
        if usage.end < size and not may_be_torn:
            log.warning("entry log %d in %s: a damaged record at offset %d of %d in a log sealed before others;"
                        " the log is left alone (never deleted or compacted)", log_id, self.root, usage.end, size,
                        extra=context(directory=self.root))
            return None
        if usage.end < size:
            log.info("entry log %d in %s: torn tail after a crash at offset %d (%d bytes, never indexed)",
                     log_id, self.root, usage.end, size - usage.end, extra=context(directory=self.root))
        self._write_rebuilt_usage(log_id, usage)
        return usage

    def _write_rebuilt_usage(self, log_id: int, usage: LogUsage) -> None:
        """Keep a rebuilt usage in its file - only in memory on a full disk (rebuilt
        again at the next start): opening the storage needs no new space."""
        try:
            write_usage_file(self.fs, self.usage_path(log_id), usage)
        except OSError as exc:
            if not is_no_space(exc):
                raise
            log.warning("entry log %d in %s: no space for its rebuilt usage file (kept in memory, rebuilt at the"
                        " next start): %s", log_id, self.root, exc, extra=context(directory=self.root))

    def _empty(self, path: str) -> bool:
        f = self.fs.open(path)
        try:
            return f.size() < LOG_HEADER_SIZE + RECORD_HEADER.size
        finally:
            f.close()

    def seal(self, writer: EntryLogWriter) -> None:
        """``writer``'s log was synced and takes no more records: GC may use it now."""
        self.usage[writer.log_id] = writer.usage()

    def drop_ledger(self, ledger_id: int) -> None:
        """A deleted ledger's bytes are dead in every log of this dir."""
        for usage in self.usage.values():
            usage.drop(ledger_id)
        for w in self.rolled + ([self.writer] if self.writer is not None else []):
            w.ledgers.pop(ledger_id, None)

    def take_dead_logs(self) -> list[EntryLogWriter]:
        """Take out of this dir the unsealed logs - rolled, or the active one once it
        holds records - none of whose ledgers exists any more (the caller closes and
        removes them; the next add starts a new active log). Only between flushes: a
        running flush holds the logs it syncs."""
        dead = [w for w in self.rolled if not w.ledgers]
        self.rolled = [w for w in self.rolled if w.ledgers]
        w = self.writer
        if w is not None and not w.ledgers and w.position > LOG_HEADER_SIZE:
            dead.append(w)
            self.writer = None
        return dead

    def write_usage(self, writer: EntryLogWriter) -> None:
        """Write a sealed log's usage file (the caller fsyncs the logs directory)."""
        write_usage_file(self.fs, self.usage_path(writer.log_id), writer.usage())

    def scan_index(self) -> Iterator[tuple[int, str]]:
        """``(ledger id, path)`` of every index file, checked against its bucket.
        ``.tmp`` leftovers of a flush that never completed are removed."""
        self.buckets = set()
        for bucket in self.fs.listdir(self.index_dir):
            if bucket in (SLOT_LOG_NAME, SLOT_LOG_NAME + ".tmp"):
                continue  # the slot log's (SlotLog.load)
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

    def append_run(self, ledger_id: int, entry_ids: list[int], slots: dict[int, bytes], table: dict[int, int]) -> int:
        """:meth:`append` for each of ``entry_ids`` (its data in ``slots``), in order, each
        location into ``table``, rolling the log whenever the next record would pass its
        size limit (:meth:`EntryLogWriter.append_run`); returns how many were appended -
        all, unless it raises: :attr:`run_placed` says how many then (those are in ``table``)."""
        done, n = 0, len(entry_ids)
        try:
            while done < n:
                w = self.writer if self.writer is not None else self._roll()
                try:
                    done = w.append_run(ledger_id, entry_ids, slots, table, done, self.size_limit)
                except BaseException:
                    done = w.run_end
                    raise
                if done < n:  # the next record would pass the size limit
                    self._roll()
        finally:
            self.run_placed = done
        return done

    def read_buffered(self, location: int, ledger_id: int, entry_id: int) -> bytes | None:
        log_id, offset = unpack_location(location)
        w = self.writer
        if w is None or w.log_id != log_id:
            return None
        return w.read_buffered(offset, ledger_id, entry_id)

    def buffer_span(self) -> tuple[int, int]:
        """``[lo, hi)``: the locations whose records may still be in the active log's
        write buffer (none when there is no active log)."""
        w = self.writer
        if w is None:
            return 0, 0
        return (w.log_id << 32) | w.buffer_start, (w.log_id + 1) << 32

    def write_out(self) -> None:
        """Write the active log's buffer (a flush does it first: a full disk then stops
        the flush before anything was taken from this directory)."""
        if self.writer is not None:
            self.writer.write_out()

    def no_space(self) -> OSError | None:
        """The full-disk error the active log's buffer is waiting out, if any."""
        return self.writer.no_space if self.writer is not None else None

    def begin_flush(self) -> LogFlush:
        """Hand over every log the flush must sync (their buffers written out)."""
        done, self.rolled = self.rolled, []
        active = [self.writer] if self.writer is not None else []
        fsync_dir = self.logs_dir if self.logs_dirty else None
        self.logs_dirty = False
        return LogFlush(sync=done + active, close=done, fsync_dir=fsync_dir)

    def _written(self, log_id: int, start: int, data: bytearray) -> None:
        assert self.recent is not None
        self.recent.keep(self.number, log_id, start, data)

    def close(self) -> None:
        syncer, self.syncer = self.syncer, None
        try:
            try:
                if syncer is not None:
                    syncer.close()
            finally:
                self.slot_log.close()
        finally:
            for w in self.rolled + ([self.writer] if self.writer is not None else []):
                w.close()
            self.writer, self.rolled = None, []

    def _roll(self) -> EntryLogWriter:
        """Start the next log. Nothing changes if it fails (e.g. a full disk while the
        old log's buffer is written out, or the new log is created): the old log stays
        the active one, with its buffer, and a later append tries again."""
        old = self.writer
        if old is not None:
            old.write_out()
        if self.next_log_id > _MAX_LOG_ID:
            raise StorageError("entry log ids exhausted", dir=self.root)
        log_id = self.next_log_id
        keep = self.recent is not None and self.recent.stats.max_bytes > 0
        writer = EntryLogWriter(self.fs, self.log_path(log_id), log_id, self.buffer_size,
                                on_written=self._written if keep else None)
        self.next_log_id += 1
        self.logs_dirty = True
        if old is not None:
            self.rolled.append(old)
        self.writer = writer
        return writer
