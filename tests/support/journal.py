"""Shared by the journal tests: records as tuples, submitting them, recording a replay."""

from __future__ import annotations

from typing import Any

from bookie.journal import Journal

#: A record as submitted and as replayed: ("entry", ledger, entry, data),
#: ("master_key", ledger, key), ("fence", ledger) or ("lac", ledger, lac).
Rec = tuple[Any, ...]


class Recorder:
    """A ReplayTarget that remembers every record in order."""

    def __init__(self) -> None:
        self.records: list[Rec] = []

    def replay_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        self.records.append(("entry", ledger_id, entry_id, data))

    def replay_master_key(self, ledger_id: int, key: bytes) -> None:
        self.records.append(("master_key", ledger_id, key))

    def replay_fence(self, ledger_id: int) -> None:
        self.records.append(("fence", ledger_id))

    def replay_lac(self, ledger_id: int, lac: int) -> None:
        self.records.append(("lac", ledger_id, lac))


def submit(j: Journal, rec: Rec, cb: Any = None, ctx: Any = None) -> None:
    kind = rec[0]
    if kind == "entry":
        j.log_entry(rec[1], rec[2], rec[3], cb, ctx)
    elif kind == "master_key":
        j.log_master_key(rec[1], rec[2], cb, ctx)
    elif kind == "fence":
        j.log_fence(rec[1], cb, ctx)
    else:
        j.log_lac(rec[1], rec[2], cb, ctx)
