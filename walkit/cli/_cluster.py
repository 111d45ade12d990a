"""``walkit cluster info``: a cluster's identity, bookies and size, from its metadata."""

from __future__ import annotations

import argparse
import json
from typing import Any

from walkit.cli._commands import Subcommands
from walkit.cli._metadata import add_metadata_option

__all__ = ["register"]


def register(subparsers: Subcommands) -> None:
    """``walkit cluster`` and its sub-commands."""
    cluster = subparsers.add_parser("cluster", help="the cluster as its metadata describes it")
    verbs = subparsers.subcommands(cluster, dest="verb")
    info = verbs.add_parser("info", help="instance id, layout, bookies by state, number of ledgers and logs")
    add_metadata_option(info)
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=_info)


def _info(args: argparse.Namespace) -> int:
    from walkit.metadata import connect
    from walkit.wal import log_names

    with connect(args.metadata, read_only=True) as cluster:
        bookies = cluster.bookies()
        # Counted one directory of ledger nodes at a time: never every id in memory.
        ledgers = sum(len(ids) for _, _, ids in cluster.ledgers.ledger_ranges())
        logs = sum(1 for _ in log_names(cluster))
        result: dict[str, Any] = {
            "metadata": args.metadata, "root": cluster.info.root, "instance_id": cluster.info.instance_id,
            "format": cluster.info.format, "layout": cluster.info.layout, "bookies": {"writable": sorted(bookies.writable),
                                                      "readonly": sorted(bookies.readonly)},
            "ledgers": ledgers, "logs": logs}
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0
    print(f"cluster {result['instance_id']} at {args.metadata}")
    print(f"  root        {result['root']} (format: {result['format']}, ledger layout: {result['layout']})")
    for state in ("writable", "readonly"):
        names = result["bookies"][state]
        print(f"  {state:<11} {len(names)} bookies" + (": " + ", ".join(names) if names else ""))
    print(f"  ledgers     {ledgers}")
    print(f"  logs        {logs}")
    return 0
