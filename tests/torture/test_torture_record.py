"""The torture record (tests/support/torture/record.py): a seed run becomes one line with its
faults by kind and counts, the summary table sums them, and docs/reliability.md holds
exactly the table the record file gives."""

from __future__ import annotations

import datetime
from pathlib import Path

from support.torture.record import DOC, END, RECORD, START, append, entry, load, summary, write_doc
from support.torture.harness import LedgerCounts, Report
from support.torture.plan import make_plan


def _report(seed: int, acked: int, anomalies: int = 0) -> Report:
    report = Report(make_plan(seed, 30.0))
    report.counts = {"sent": acked + 3, "acked": acked, "failed": 3, "unknown": 0}
    report.ledger = LedgerCounts(counts={"acked": 2 * acked})
    report.anomalies = [object()] * anomalies  # type: ignore[list-item]
    return report


def test_a_run_becomes_one_line_and_the_table_sums_them(tmp_path: Path) -> None:
    when = datetime.datetime(2026, 11, 25, tzinfo=datetime.timezone.utc)
    lines = [entry(_report(seed, 100 * (seed + 1)), 42.0, "abc1234", when) for seed in range(3)]
    plan = make_plan(0, 30.0)
    assert lines[0]["faults"] == {k: sum(1 for f in plan.faults if f.kind == k) for k in {f.kind for f in plan.faults}}
    assert lines[0]["fault_seconds"] >= len(plan.faults) and lines[0]["records_acked"] == 100
    assert lines[2]["entries_acked"] == 600 and lines[0]["date"] == "2026-11-25" and lines[0]["wall"] == 42.0
    record = tmp_path / "record.jsonl"
    append(record, lines)
    append(record, [entry(_report(7, 5, anomalies=2), 40.0, "def5678", when + datetime.timedelta(days=1))])
    loaded = load(record)
    assert loaded[:3] == lines and len(loaded) == 4
    table = summary(loaded)
    day1, day2, total = table.splitlines()[2:]
    assert day1.startswith("| 2026-11-25 | abc1234 | 3 | 3 | 0.03 |") and day1.endswith("| 600 | 1,200 | **0** |")
    assert day2.startswith("| 2026-11-26 | def5678 | 1 | 1 |") and day2.endswith("| 5 | 10 | **2** |")
    assert total.startswith("| **all** | abc1234, def5678 | 4 | 4 |") and total.endswith("| 605 | 1,210 | **2** |")
    doc = tmp_path / "doc.md"
    doc.write_text(f"before\n{START}\nold table\n{END}\nafter\n")
    write_doc(doc, record)
    assert doc.read_text() == f"before\n{START}\n{table}{END}\nafter\n"
    assert summary([]) == "No run recorded yet.\n"


def test_the_docs_table_is_the_records() -> None:
    text = DOC.read_text(encoding="utf-8")
    table = text.split(START, 1)[1].split(END, 1)[0]
    assert table == "\n" + summary(load(RECORD)), "run: python tests/support/torture/record.py"
