"""The tables of ``walkit bench scale``'s report: one Markdown table per case.

Theory of operation
-------------------
Each function turns one case's part of the report (a dict, as
:func:`walkit.bench.scale.run_scale_bench` returns it, also as JSON) into the lines of its
table: rows in the order they were measured, numbers as the report holds them (already
rounded), "-" where a row has no figure. Nothing here measures or changes the report, so
``walkit bench scale --json`` and the tables always show the same numbers; what the
tables need beyond the report (the throughput target, the opens per failover row) is
passed in by :func:`walkit.bench.scale.format_markdown`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["checkpoint_table", "memory_table", "recovery_table", "restart_table", "throughput_table", "wal_table"]


def _fill_rate(fill: dict[str, Any] | None) -> str:
    return f"{fill['entries_per_s']:,}" if fill else "-"


def memory_table(case: dict[str, Any]) -> list[str]:
    lines = [f"bookie memory: RSS with ledgers and {case['entry_size']} B entries stored, after two checkpoints "
             f"(empty bookie: {case['empty_rss_mib']} MiB)", "",
             "| ledgers | entries | RSS MiB (mean) | RSS MiB (max) | bytes/ledger above empty | marginal bytes/ledger "
             "| written entries/s |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in case["rows"]:
        marginal = "-" if r["marginal_bytes_per_ledger"] is None else f"{r['marginal_bytes_per_ledger']:,}"
        lines.append(f"| {r['ledgers']:,} | {r['entries']:,} | {r['rss_mib']} | {r['rss_max_mib']} "
                     f"| {r['bytes_per_ledger']:,} | {marginal} | {_fill_rate(r['fill'])} |")
    return lines


def throughput_table(case: dict[str, Any], met: bool | None, ratio: float) -> list[str]:
    """``met``: whether the rate at 10,000 ledgers was at least ``ratio`` of one ledger's
    (None: not measured)."""
    verdict = "not measured (fewer ledgers)" if met is None else "met" if met else "**missed**"
    lines = [f"throughput: {case['entry_size']} B adds round-robin over N ledgers, {case['in_flight']:,} in flight, "
             f"{case['seconds']:g} s each", "",
             "| ledgers | entries/s | vs 1 ledger | p50 ms | p99 ms | client CPU µs/entry | bookies CPU µs/entry "
             "| other cores | steal cores |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in case["rows"]:
        lines.append(f"| {r['ledgers']:,} | {r['entries_per_s']:,} | {r['ratio']:.2f} | {r['p50_ms']} | {r['p99_ms']} "
                     f"| {r['client_cpu_us_per_entry']} | {r['bookie_cpu_us_per_entry']} | {r['other_cpu_cores']} "
                     f"| {r['steal_cores']} |")
    return [*lines, "", f"target: >= {ratio:.0%} of the one-ledger rate at 10,000 ledgers: {verdict}"]


def checkpoint_table(case: dict[str, Any]) -> list[str]:
    lines = [f"checkpoint: one flush of a bookie's ledger storage after {case['entry_size']} B adds round-robin over "
             "N ledgers (medians of 4; the ledgers' index files exist)", "",
             "| ledgers | entries | index written to | flush ms | CPU ms | CPU µs/ledger | slot log bytes "
             "| checkpoints a merge | merge ms |", "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in case["rows"]:
        per_merge = "-" if r["checkpoints_per_merge"] is None else f"{r['checkpoints_per_merge']:,}"
        merge = "-" if r["merge_ms"] is None else r["merge_ms"]
        lines.append(f"| {r['ledgers']:,} | {r['entries']:,} | {r['mode']} | {r['flush_ms']} | {r['cpu_ms']} "
                     f"| {r['cpu_us_per_ledger']} | {r['slot_log_bytes']:,} | {per_merge} | {merge} |")
    return lines


def restart_table(case: dict[str, Any]) -> list[str]:
    lines = [f"bookie restart ({case['entry_size'] >> 20} MiB entries stored; s until it serves again)", "",
             "| GiB stored | crash: start s | replayed entries | start CPU s | registration expired after s "
             "| graceful: stop s | start s | replayed entries | written MB/s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in case["rows"]:
        c, g = r["crash"], r["graceful"]
        mb = f"{r['fill']['mb_per_s']}" if r["fill"] else "-"
        lines.append(f"| {r['gib']:g} | {c['seconds']} | {c['replayed_entries']:,} | {c['bookie_cpu_s']} "
                     f"| {c['expiry_s']} | {g['stop_seconds']} | {g['seconds']} | {g['replayed_entries']:,} | {mb} |")
    return lines


def recovery_table(case: dict[str, Any]) -> list[str]:
    lines = [f"recovery: open_ledger(recovery=True) of a ledger of {case['entry_size']} B entries its writer left open",
             "", "| against | entries | LAC the bookies had | tail read back | s | client CPU s | bookies CPU s "
             "| written entries/s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for against, rows in (("length", case["rows"]), ("tail", case["tail_rows"])):
        for r in rows:
            lines.append(f"| {against} | {r['entries']:,} | {r['lac_before']:,} | {r['tail']:,} | {r['seconds']} "
                         f"| {r['client_cpu_s']} | {r['bookie_cpu_s']} | {_fill_rate(r['fill'])} |")
    return lines


def wal_table(case: dict[str, Any], opens: int) -> list[str]:
    """``opens``: the opens each row's figures are of."""
    rolls = case["rolls"]
    lines = [f"WAL open for writing while the previous writer is open (failover), {opens} opens a row", "",
             "| the log holds | median s | min s | max s | client CPU s | bookies CPU s |",
             "|---|---:|---:|---:|---:|---:|"]
    for key, label in (("segments", "segment"), ("snapshots", "snapshot")):
        for r in case[key]:
            held = f"{r[key]:,} {label}{'' if r[key] == 1 else 's'}{' taken' if key == 'snapshots' else ''}"
            lines.append(f"| {held} | {r['median_s']} | {r['min_s']} | {r['max_s']} | {r['client_cpu_s']} "
                         f"| {r['bookie_cpu_s']} |")
    return [*lines, "", f"segment rolls while growing the log: {rolls['rolls']:,} in {rolls['seconds']} s "
                        f"({rolls['per_s']}/s)"]
