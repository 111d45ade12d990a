"""``walkit demo`` and ``walkit sandbox``: local clusters, for showing and for trying."""

from __future__ import annotations

import argparse
import json

from walkit.cli._commands import Subcommands


def _demo(args: argparse.Namespace) -> int:
    from walkit.demo import format_report, run_demo

    report = run_demo(args.data, seconds=args.seconds, bookies=args.bookies, progress=not args.no_progress,
                      verbose=args.verbose)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if report["pass"] else 1


def _sandbox(args: argparse.Namespace) -> int:
    from walkit.sandbox import parse_bookie_options, run_sandbox

    return run_sandbox(args.data, bookies=args.bookies, processes=args.processes, admin=args.admin,
                       bookie_options=parse_bookie_options(args.bookie_option))


def register(subparsers: Subcommands) -> None:
    """``walkit demo`` and ``walkit sandbox``."""
    demo = subparsers.add_parser("demo", help="failover of a replicated key-value store: SIGKILL, snapshot + replay, "
                                 "fencing")
    demo.add_argument("--data", default=None, help="where the cluster keeps its data (default: a temporary directory)")
    demo.add_argument("--seconds", type=float, default=10.0, help="how long the primary writes before SIGKILL (default 10)")
    demo.add_argument("--bookies", type=int, default=3, help="bookie processes (default 3; the log uses 3)")
    demo.add_argument("--json", action="store_true", help="print the report as JSON")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    demo.set_defaults(func=_demo)

    sandbox = subparsers.add_parser("sandbox", help="run a local cluster in the foreground until SIGINT/SIGTERM")
    sandbox.add_argument("--data", default=None, help="the cluster's directory (default: a temporary one, removed)")
    sandbox.add_argument("--bookies", type=int, default=None, help="bookies (default: the ones --data holds; 3 "
                         "in a new directory; fewer than it holds is refused)")
    sandbox.add_argument("--processes", action="store_true", help="bookies as child processes (default: in-process)")
    sandbox.add_argument("--admin", action="store_true", help="each bookie's admin endpoint (/metrics, /heartbeat, "
                         "/api/v1/...) on 127.0.0.1, a free port each, printed as admin.<i>=URL "
                         "(= --bookie-option httpServerEnabled=true)")
    sandbox.add_argument("--bookie-option", action="append", default=[], metavar="KEY=VALUE",
                         help="a bookie configuration key and value, as in bookie.toml, for every bookie "
                              "(repeatable; python -m bookie --config-reference lists them)")
    sandbox.set_defaults(func=_sandbox)
