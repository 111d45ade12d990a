"""``walkit journal repair``: journal tools."""

from __future__ import annotations

import argparse
import os

from walkit.cli._commands import Subcommands


def _repair(args: argparse.Namespace) -> int:
    from bookie.fs.real import RealFS
    from bookie.journal import repair_journal

    result = repair_journal(RealFS(), os.path.abspath(args.path))
    print(
        f"kept {result.broken_copy}; truncated {result.path} at offset {result.truncated_at} "
        f"({result.dropped_bytes} bytes dropped; entries in them are lost on this bookie "
        f"and must come back from their other replicas)"
    )
    return 0


def register(subparsers: Subcommands) -> None:
    """``walkit journal`` and its sub-commands."""
    journal = subparsers.subcommands(subparsers.add_parser("journal", help="journal tools"), dest="what")
    jr = journal.add_parser("repair", help="keep PATH.broken and truncate PATH at its first bad frame")
    jr.add_argument("path", help="a journal file (<id:016x>.txn) the bookie refused to replay")
    jr.set_defaults(func=_repair)
