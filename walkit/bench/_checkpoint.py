"""``walkit bench scale --case checkpoint``: what one checkpoint of a bookie's ledger storage
costs against the number of ledgers it touches, with and without the slot log.

What it measures
----------------
A :class:`~bookie.storage.LedgerStorage` on the real disk (one ledger directory, as a
bookie's default; in this process, no cluster), for N ledgers: the ledgers are made and
checkpointed once (their index files created: not measured), then ``_ROUNDS`` times
``entries`` adds of ``SMALL`` bytes round-robin over the N ledgers and a timed
``flush()`` - the checkpoint's storage part (the write cache placed in the entry log,
the log synced, the index written and synced). Per row, medians of the rounds: the
flush's wall time, its CPU (``time.thread_time``: user and kernel time of the flushing
thread, which does all of it), and CPU per ledger touched. Two modes per N: ``index
files`` (``indexSlotLogMaxSizeMb = 0``: every touched ledger's index file written) and
``slot log`` (the default: a checkpoint of 8 ledgers or more appends their slots to one
file). In slot-log mode a *merge* (every run written to its index file, the log
emptied) comes once per ``checkpoints_per_merge`` such checkpoints (its bound divided
by what one appends): it costs about one index-files checkpoint, and is timed once
(``merge_ms``) by a last flush told to merge (``flush(merge_slot_logs=True)``).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bookie.fs.real import RealFS
from bookie.storage import SLOT_LOG, LedgerStorage

__all__ = ["checkpoint_rows"]

_ROUNDS = 4
_SIZE = 100  # bytes an entry
_MODES = (("index files", 0), ("slot log", SLOT_LOG))


def checkpoint_rows(directory: str | None, counts: list[int], entries: int) -> list[dict[str, Any]]:
    """A row per ledger count and mode (see the module docstring)."""
    if directory is not None:
        Path(directory).mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="walkit-bench-checkpoint-", dir=directory or "."))
    try:
        return [_row(base / f"{n}-{bound}", n, entries, mode, bound) for n in counts for mode, bound in _MODES]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _row(where: Path, ledgers: int, entries: int, mode: str, bound: int) -> dict[str, Any]:
    storage = LedgerStorage(RealFS(), [str(where)], slot_log_bytes=bound)
    storage.open()
    try:
        payload = b"c" * _SIZE
        per_ledger = max(1, entries // ledgers)
        for ledger in range(ledgers):
            storage.add_entry(ledger, 0, payload)
        storage.flush()  # the index files made: a ledger's first checkpoint is not what this measures
        walls, cpus, appended = [], [], []
        for r in range(_ROUNDS):
            first = 1 + r * per_ledger
            for entry in range(first, first + per_ledger):
                for ledger in range(ledgers):
                    storage.add_entry(ledger, entry, payload)
            end = storage.slot_log_bytes()
            wall, cpu = time.perf_counter(), time.thread_time()
            storage.flush()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.thread_time() - cpu)
            appended.append(storage.slot_log_bytes() - end)
        merge_ms = None
        if bound and statistics.median(appended):  # one more checkpoint, told to merge every run
            for ledger in range(ledgers):
                storage.add_entry(ledger, 1 + _ROUNDS * per_ledger, payload)
            wall = time.perf_counter()
            storage.flush(merge_slot_logs=True)
            merge_ms = round((time.perf_counter() - wall) * 1000, 1)
    finally:
        storage.close()
    cpu = statistics.median(cpus)
    per_checkpoint = statistics.median(appended)
    return {"ledgers": ledgers, "mode": mode, "entries": per_ledger * ledgers,
            "flush_ms": round(statistics.median(walls) * 1000, 1), "cpu_ms": round(cpu * 1000, 1),
            "cpu_us_per_ledger": round(cpu * 1e6 / ledgers, 1), "slot_log_bytes": int(per_checkpoint),
            "checkpoints_per_merge": int(bound // per_checkpoint) if bound and per_checkpoint else None,
            "merge_ms": merge_ms}
