"""``walkit bookie start|list|gc|info|lastmark|readjournal|readlog|cookie``: run and inspect
bookies (``gc``: :mod:`walkit.cli._gc`; the offline disk tools: :mod:`walkit.cli._disks`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from walkit.cli import _disks, _gc
from walkit.cli._commands import Subcommands
from walkit.cli._metadata import add_metadata_option
from walkit.errors import BookieUnavailableError

if TYPE_CHECKING:
    from walkit.metadata import Cluster


def _start(args: argparse.Namespace) -> int:
    from bookie import run

    return run(args)


def _list(args: argparse.Namespace) -> int:
    from walkit.metadata import connect

    with connect(args.metadata, read_only=True) as cluster:
        bookies = cluster.bookies()
        # a BookKeeper-format cluster may hold Java bookies and walkit ones: say which
        kinds = _kinds(cluster, bookies.writable | bookies.readonly) if cluster.info.format == "bookkeeper" else None
    if args.json:
        listed: dict[str, Any] = {"writable": sorted(bookies.writable), "readonly": sorted(bookies.readonly)}
        if kinds is not None:
            listed["kinds"] = kinds
        print(json.dumps(listed, indent=2))
        return 0
    for bookie_id, state in sorted([(b, "available") for b in bookies.writable]) + sorted(
            [(b, "readonly") for b in bookies.readonly]):
        print(f"{bookie_id}\t{state}" + (f"\t{kinds[bookie_id]}" if kinds is not None else ""))
    if not bookies.writable and not bookies.readonly:
        print("no bookies registered", file=sys.stderr)
    return 0


def _kinds(cluster: Cluster, bookie_ids: Iterable[str]) -> dict[str, str]:
    """``bookie id -> "walkit" | "bookkeeper"`` (what its registration says it speaks;
    "unreadable" when it cannot be read, "gone" when it went meanwhile)."""
    from walkit.client import parse_endpoint
    from walkit.metadata import read_registration

    kinds: dict[str, str] = {}
    for bookie_id in sorted(bookie_ids):
        data = read_registration(cluster.store, cluster.info, bookie_id)
        try:
            kinds[bookie_id] = "gone" if data is None else parse_endpoint(bookie_id, data, cluster.info.format).kind
        except BookieUnavailableError:
            kinds[bookie_id] = "unreadable"
    return kinds


def register(subparsers: Subcommands) -> None:
    """``walkit bookie`` and its sub-commands."""
    bookie = subparsers.subcommands(subparsers.add_parser("bookie", help="run and inspect bookies"), dest="what")
    bs = bookie.add_parser("start", help="run a bookie until SIGTERM (as python -m bookie)")
    bs.add_argument("--conf", required=True, help="bookie configuration, BookKeeper key names: *.toml is TOML; "
                    "*.conf and *.properties are BookKeeper's bk_server.conf (Java properties; keys walkit does "
                    "not implement are listed in one warning); another name is TOML if it parses as TOML, else "
                    "properties")
    bs.set_defaults(func=_start, log_default="INFO")  # python -m bookie's: a server says what it does
    bl = bookie.add_parser("list", help="the available and read-only bookies (in a BookKeeper-format cluster, "
                           "with what each speaks: walkit or bookkeeper)")
    add_metadata_option(bl)
    bl.add_argument("--json", action="store_true", help="machine-readable output")
    bl.set_defaults(func=_list)
    _gc.add_parser(bookie)
    _disks.add_parsers(bookie)
