"""``walkit bookie start|list|gc|info|lastmark|readjournal|readlog|cookie``: run and inspect
bookies (``gc``: :mod:`walkit.cli._gc`; the offline disk tools: :mod:`walkit.cli._disks`)."""

from __future__ import annotations

import argparse
import json
import sys

from walkit.cli import _disks, _gc
from walkit.cli._commands import Subcommands
from walkit.cli._metadata import add_metadata_option


def _start(args: argparse.Namespace) -> int:
    from bookie import run

    return run(args)


def _list(args: argparse.Namespace) -> int:
    from walkit.metadata import connect

    with connect(args.metadata, read_only=True) as cluster:
        bookies = cluster.bookies()
    if args.json:
        print(json.dumps({"writable": sorted(bookies.writable), "readonly": sorted(bookies.readonly)}, indent=2))
        return 0
    for bookie_id in sorted(bookies.writable):
        print(f"{bookie_id}\tavailable")
    for bookie_id in sorted(bookies.readonly):
        print(f"{bookie_id}\treadonly")
    if not bookies.writable and not bookies.readonly:
        print("no bookies registered", file=sys.stderr)
    return 0


def register(subparsers: Subcommands) -> None:
    """``walkit bookie`` and its sub-commands."""
    bookie = subparsers.subcommands(subparsers.add_parser("bookie", help="run and inspect bookies"), dest="what")
    bs = bookie.add_parser("start", help="run a bookie until SIGTERM (as python -m bookie)")
    bs.add_argument("--conf", required=True, help="bookie configuration, BookKeeper key names: *.toml is TOML; "
                    "*.conf and *.properties are BookKeeper's bk_server.conf (Java properties; keys walkit does "
                    "not implement are listed in one warning); another name is TOML if it parses as TOML, else "
                    "properties")
    bs.set_defaults(func=_start, log_default="INFO")  # python -m bookie's: a server says what it does
    bl = bookie.add_parser("list", help="the available and read-only bookies")
    add_metadata_option(bl)
    bl.add_argument("--json", action="store_true", help="machine-readable output")
    bl.set_defaults(func=_list)
    _gc.add_parser(bookie)
    _disks.add_parsers(bookie)
