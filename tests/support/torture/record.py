"""The project's running record of torture runs (issue 18): every recorded seed run is one
line of ``docs/torture-record.jsonl``, and docs/reliability.md's "Record" table is made
from that file alone.

``pytest -m torture --torture-record docs/torture-record.jsonl`` appends one line per
seed run of the session (date, commit, seed, plan, wall time, faults by kind, records
and ledger entries acknowledged, anomalies); ``python tests/support/torture/record.py`` rewrites
the table between the ``torture-record`` markers of docs/reliability.md. CI never records
(its runs are the bounded ones); tests/torture/test_torture_record.py checks that the table in the
docs is the one the file gives, so neither can drift from the other.

Fault-hours: for each run, the seconds faults were in force (a fault lasting from ``start``
to ``end``; an instant one - a SIGKILL, a session expiry - counts one second), summed.
"""

from __future__ import annotations

import collections
import datetime
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
RECORD = ROOT / "docs" / "torture-record.jsonl"
DOC = ROOT / "docs" / "reliability.md"
START, END = "<!-- torture-record: start -->", "<!-- torture-record: end -->"


def entry(report: Any, wall: float, commit: str, when: datetime.datetime | None = None) -> dict[str, Any]:
    """One run as a record line (``report``: a harness.Report)."""
    plan = report.plan
    kinds = collections.Counter(f.kind for f in plan.faults)
    fault_seconds = sum(max(1.0, f.end - f.start) for f in plan.faults)
    return {
        "date": (when or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%d"),
        "commit": commit,
        "seed": plan.seed,
        "seconds": plan.seconds,
        "wall": round(wall, 1),
        "cluster": plan.mode,
        "metadata": plan.metadata,
        "faults": dict(sorted(kinds.items())),
        "fault_seconds": round(fault_seconds, 1),
        "records_acked": int(report.counts.get("acked", 0)),
        "entries_acked": int(report.ledger.counts.get("acked", 0)),
        "anomalies": len(report.anomalies),
    }


def append(path: Path, lines: Iterable[dict[str, Any]]) -> None:
    with path.open("a", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, sort_keys=True) + "\n")


def load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def commit_of(directory: Path) -> str:
    """The short commit of the tree the runs ran on ("unknown" outside git)."""
    try:
        out = subprocess.run(["git", "-C", str(directory), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def summary(lines: list[dict[str, Any]]) -> str:
    """The Markdown table of the record: one row per day, then the totals."""
    if not lines:
        return "No run recorded yet.\n"
    by_day: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for line in lines:
        by_day[line["date"]].append(line)
    rows = ["| date | commits | runs | seeds | run hours | fault-hours | faults by kind | records acked | "
            "ledger entries acked | anomalies |", "|---|---|---:|---:|---:|---:|---|---:|---:|---:|"]

    def row(label: str, group: list[dict[str, Any]]) -> str:
        kinds: collections.Counter[str] = collections.Counter()
        for line in group:
            kinds.update(line["faults"])
        commits = sorted({line["commit"] for line in group})
        return (f"| {label} | {', '.join(commits) if len(commits) <= 3 else f'{len(commits)} commits'} | "
                f"{len(group)} | {len({line['seed'] for line in group})} | "
                f"{sum(line['seconds'] for line in group) / 3600:.2f} | "
                f"{sum(line['fault_seconds'] for line in group) / 3600:.2f} | "
                f"{', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))} | "
                f"{sum(line['records_acked'] for line in group):,} | {sum(line['entries_acked'] for line in group):,} | "
                f"**{sum(line['anomalies'] for line in group)}** |")

    rows += [row(day, group) for day, group in sorted(by_day.items())]
    rows.append(row("**all**", lines))
    return "\n".join(rows) + "\n"


def write_doc(doc: Path = DOC, record: Path = RECORD) -> None:
    """Rewrite the table between the markers of ``doc`` from ``record``."""
    text = doc.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{START}\n{summary(load(record))}{END}{tail}", encoding="utf-8")


if __name__ == "__main__":
    write_doc()
    print(summary(load(RECORD)), end="")
    sys.exit(0)
