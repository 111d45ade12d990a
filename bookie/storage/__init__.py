"""Ledger storage of a bookie: entry logs plus per-ledger index files.

See :mod:`bookie.storage._storage` for the theory of operation and ``docs/format.md``
("Entry log", "Index file") for the bytes on disk. ``SLOT_LOG``: the bytes a ledger dir's
slot log holds before a merge unless told (``LedgerStorage(slot_log_bytes=...)``, the
bookie's ``indexSlotLogMaxSizeMb``).
"""

from __future__ import annotations

from bookie.storage._format import MAX_ENTRY_ID, MAX_ENTRY_SIZE, MAX_MASTER_KEY
from bookie.storage._inspect import EntryLogFile, EntryLogRecord, LedgerDirSummary, ledger_dir_summary
from bookie.storage._reclaim import EntryLogInfo
from bookie.storage._storage import SLOT_LOG, LedgerStorage

__all__ = ["EntryLogFile", "EntryLogInfo", "EntryLogRecord", "LedgerDirSummary", "LedgerStorage",
           "ledger_dir_summary", "MAX_ENTRY_ID", "MAX_ENTRY_SIZE", "MAX_MASTER_KEY", "SLOT_LOG"]
