"""The journal's settings and its counts: :class:`JournalConfig` (what the bookie's
configuration decides, BookKeeper's ``journal*`` keys where there is one) and
:class:`JournalStats` (what the journal did, for metrics).

Theory of operation. Both are plain data. A config is frozen: the journal reads it from
every thread without a lock. The stats have one writer per field - the thread that did
the work: the sync thread (or a kicking caller, while it holds the flush claim) counts
flushes and their histograms, the journal thread counts rolls, whichever thread refused
a batch counts ``no_space`` (:mod:`walkit.metrics`: readers may see a count a moment
old, never a torn one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bookie.journal._policy import GroupCommitPolicy
from walkit.metrics import COUNT_BUCKETS, LATENCY_BUCKETS, SIZE_BUCKETS, Histogram

__all__ = ["JournalConfig", "JournalStats"]


@dataclass(frozen=True)
class JournalConfig:
    directory: str
    policy: GroupCommitPolicy = field(default_factory=GroupCommitPolicy)
    alignment: int = 4096  # O_DIRECT needs 4 KiB on the disks we target
    max_size: int = 2048 << 20  # journalMaxSizeMB=2048: roll after this many bytes
    prealloc_size: int = 16 << 20  # journalPreAllocSizeMB=16: fallocate step ahead of the tail
    max_backups: int = 5  # journalMaxBackups=5: old journals kept behind the mark
    recycle_files: int = 2  # walkit: retired journals kept for reuse (appends into written blocks)
    sync_data: bool = True  # journalSyncData=true: fdatasync before acknowledging
    direct_io: bool = True  # O_DIRECT when the file system allows it
    buffer_size: int = 1 << 20  # one segment; a larger batch is several (written with one pwritev)
    sync_warn: float = 1.0  # journalSyncWarnMillis (s here): a write+sync slower than this is logged
    zero_fill_rate: int = 64 << 20  # walkit's journalZeroFillRateMB: zeros ahead of a new file's tail, bytes/s (0: off)


@dataclass
class JournalStats:
    """Counts the sync thread keeps (one writer: :mod:`walkit.metrics`)."""

    flushes: int = 0
    records: int = 0
    bytes_written: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    rolls: int = 0
    slow_syncs: int = 0  # write+syncs slower than ``sync_warn``
    no_space: int = 0  # batches refused because the disk had no room for them
    sync_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))  # one write+sync
    queue_wait_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))  # oldest record's
    records_per_flush: Histogram = field(default_factory=lambda: Histogram(COUNT_BUCKETS))
    bytes_per_flush: Histogram = field(default_factory=lambda: Histogram(SIZE_BUCKETS))
