"""The bookie journal: group-committed, checksummed frames on aligned, synced writes.

See :mod:`bookie.journal._writer` (writing; with _batch, _claim, _sync, _space, _tail, _config),
:mod:`bookie.journal._replay` (reading back),
:mod:`bookie.journal._inspect` (one file, read-only, for tools),
:mod:`bookie.journal._policy` (when to flush) and docs/format.md for the bytes.
"""

from bookie.journal._format import FrameType, JournalHeader, journal_name, parse_journal_name
from bookie.journal._inspect import JournalFile, JournalRecord, JournalStop
from bookie.journal._mark import MARK_FILE, LogMark, highest_mark, read_marks, write_mark
from bookie.journal._policy import FlushReason, GroupCommitPolicy, flush_reason, wait_timeout
from bookie.journal._replay import (
    RepairResult,
    ReplayReport,
    ReplayTarget,
    TornTail,
    repair_journal,
    replay,
    scan_journal,
)
from bookie.journal._batch import ENTRY, FENCE_RECORD, KEY_RECORD, LAC_RECORD, Callback, Record
from bookie.journal._config import JournalConfig, JournalStats
from bookie.journal._files import free_journals, list_journals
from bookie.journal._framing import C_FRAMING
from bookie.journal._writer import Journal

__all__ = [
    "C_FRAMING",
    "MARK_FILE",
    "free_journals",
    "ENTRY",
    "FENCE_RECORD",
    "KEY_RECORD",
    "LAC_RECORD",
    "Record",
    "Callback",
    "FlushReason",
    "FrameType",
    "GroupCommitPolicy",
    "Journal",
    "JournalConfig",
    "JournalFile",
    "JournalHeader",
    "JournalRecord",
    "JournalStop",
    "JournalStats",
    "LogMark",
    "RepairResult",
    "ReplayReport",
    "ReplayTarget",
    "TornTail",
    "flush_reason",
    "highest_mark",
    "journal_name",
    "list_journals",
    "parse_journal_name",
    "read_marks",
    "repair_journal",
    "replay",
    "scan_journal",
    "wait_timeout",
    "write_mark",
]
