"""The torture suite's harness (docs/reliability.md): fault plans and the run of one seed
(harness), its workloads (ledgers, churn, disks, writer - a child process), the history
checker (history), the scheduler of seed processes (run) and the record of long runs
(record)."""

from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]  # tests/: where ``support`` is importable from


def child_env() -> dict[str, str]:
    """The environment of a child process of the harness (a seed's run, a writer): this
    one's, with tests/ first on PYTHONPATH so that ``python -m support.torture.…`` runs."""
    current = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{current}" if current else str(TESTS)}
