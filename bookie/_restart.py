"""Restart: a bookie's ledger storage opened and brought up to date from its journal.

Theory of operation
-------------------
At start the bookie checks its cookies (:mod:`bookie.cookie`), opens the ledger storage
(:func:`open_storage`), replays the journals from the highest mark found in the ledger
directories into it (:func:`replay_journal`), starts a new journal file
(:func:`journal_config` says how the journal is set up) and checkpoints at once
(:mod:`bookie._checkpoints`).

Why replaying from the mark is enough: a checkpoint writes its mark M only after every
record before M is durable in storage, so what the journal holds from M on is all that
storage may lack. Replay applies records straight to storage - entries and master keys,
fences and explicit LACs (a LAC only ever raised) - and re-applying a record storage
already has changes nothing (a re-added entry overwrites itself), so a crash during a
replay, or after it and before the first checkpoint, only replays the same records
again. A torn tail (a write the crash cut short, never acknowledged) is truncated and
reported; corruption stops the start. A long journal does not sit in memory whole: the
storage is flushed whenever its write cache fills (no mark is written, so a crash
meanwhile replays from the same mark).

None of it needs new space: replay truncates, a write cache that cannot be flushed for a
full disk waits in memory for the first checkpoint, a journal disk still full starts the
journal without its new file, and a ledger disk still full fails only that first
checkpoint; either way ``on_no_space`` is told (the server starts read-only) and the
bookie is writable again once there is room, as when a running bookie fills a disk.
"""

from __future__ import annotations

import logging

from bookie._config import BookieConfig
from bookie.fs import FileSystem, is_no_space
from bookie.journal import GroupCommitPolicy, JournalConfig, LogMark, ReplayReport, highest_mark, replay
from bookie.storage import LedgerStorage
from walkit.logs import context

__all__ = ["journal_config", "open_storage", "replay_journal"]

log = logging.getLogger("bookie")

_BY_COUNT = 1 << 40  # a read-ahead's byte bound when dbStorage_readAheadCacheBatchBytesSize <= 0: none


def journal_config(c: BookieConfig) -> JournalConfig:
    """The journal's settings, from the bookie's configuration."""
    policy = GroupCommitPolicy(
        max_group_wait=c.journal_max_group_wait_msec / 1000.0,
        buffered_writes_threshold=c.journal_buffered_writes_threshold,
        buffered_entries_threshold=c.journal_buffered_entries_threshold,
        flush_when_queue_empty=c.journal_flush_when_queue_empty,
    )
    return JournalConfig(
        directory=c.journal_directory,
        policy=policy,
        alignment=c.journal_alignment_size,
        max_size=c.journal_max_size_mb << 20,
        prealloc_size=c.journal_pre_alloc_size_mb << 20,
        max_backups=c.journal_max_backups,
        recycle_files=c.journal_recycle_files,
        sync_data=c.journal_sync_data,
        direct_io=c.journal_direct_io,
        sync_warn=c.journal_sync_warn_millis / 1000.0,
        zero_fill_rate=c.journal_zero_fill_rate_mb << 20,
    )


def open_storage(c: BookieConfig, fs: FileSystem) -> LedgerStorage:
    """The ledger storage of the bookie's ledger directories, opened."""
    storage = LedgerStorage(
        fs, list(c.ledger_directories), entry_log_size_limit=c.entry_log_size_limit,
        open_index_files=c.open_file_limit, read_ahead_cache_bytes=c.read_ahead_cache_max_size_mb << 20,
        read_ahead_batch=c.read_ahead_cache_batch_size,
        read_ahead_batch_bytes=c.read_ahead_cache_batch_bytes_size if c.read_ahead_cache_batch_bytes_size > 0
        else _BY_COUNT, recent_writes_bytes=c.recent_writes_cache_max_size_mb << 20,
        write_cache_bytes=c.write_cache_max_size_mb << 20, placement_sync_bytes=c.flush_entrylog_bytes,
        slot_log_bytes=c.index_slot_log_max_size_mb << 20,
    )
    storage.open()
    return storage


def replay_journal(c: BookieConfig, fs: FileSystem,
                   storage: LedgerStorage) -> tuple[LogMark | None, ReplayReport, int]:
    """Replay the journals from the highest mark into ``storage``: the mark, what the
    replay found, and how many times the storage was flushed meanwhile."""
    mark = highest_mark(fs, list(c.ledger_directories))
    applier = _StorageReplay(storage, c.write_cache_max_size_mb << 20)
    report = replay(fs, c.journal_directory, mark, applier)
    log.info(
        "bookie %s replayed %d records (%d entries) from %s, torn tails: %d, storage flushed %d times meanwhile",
        c.effective_bookie_id, report.records, report.entries, mark,
        len(report.torn), applier.flushes, extra=context(bookie=c.effective_bookie_id),
    )
    return mark, report, applier.flushes


class _StorageReplay:
    """Journal replay applies records straight to ledger storage; the storage is flushed
    whenever its write cache holds ``cache_bytes`` (a long journal replayed does not sit
    in memory whole; no mark is written, so a crash meanwhile replays from the same mark,
    and re-adds overwrite)."""

    def __init__(self, storage: LedgerStorage, cache_bytes: int) -> None:
        self.s = storage
        self.cache_bytes = cache_bytes
        self.flushes = 0

    def replay_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        self.s.add_entry(ledger_id, entry_id, data)
        if self.s.cached_bytes() >= self.cache_bytes:
            try:
                self.s.flush()
            except OSError as exc:
                if not is_no_space(exc):
                    raise
                self.cache_bytes = _BY_COUNT  # a full disk: the rest waits in memory for the first checkpoint
            else:
                self.flushes += 1

    def replay_master_key(self, ledger_id: int, key: bytes) -> None:
        self.s.set_master_key(ledger_id, key)

    def replay_fence(self, ledger_id: int) -> None:
        self.s.set_fenced(ledger_id)

    def replay_lac(self, ledger_id: int, lac: int) -> None:
        current = self.s.explicit_lac(ledger_id)
        self.s.set_explicit_lac(ledger_id, lac if current is None else max(lac, current))
