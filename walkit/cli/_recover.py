"""``walkit recover`` (put back the copies a lost bookie held) and ``walkit decommission``
(move everything off a running bookie before removing it): :mod:`walkit.recovery`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from walkit.cli._commands import Subcommands
from walkit.cli._metadata import add_metadata_option

if TYPE_CHECKING:
    from walkit.recovery import RecoveryReport

__all__ = ["register"]


def register(subparsers: Subcommands) -> None:
    p = subparsers.add_parser("recover", help="re-replicate every fragment a lost bookie held")
    add_metadata_option(p)
    p.add_argument("--bookie", required=True, help="the lost bookie's id")
    p.add_argument("--target", help="put every copy on this bookie (default: chosen per fragment)")
    p.add_argument("--dry-run", action="store_true", help="only count what would be copied (metadata opened "
                   "read-only)")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--tls-ca", default="", help="CA file, for bookies that serve TLS")
    p.set_defaults(func=_recover)
    d = subparsers.add_parser("decommission", help="move everything a running bookie holds to others, then say "
                                                    "whether it can be removed")
    add_metadata_option(d)
    d.add_argument("--bookie", required=True, help="the bookie to retire (it must be running)")
    d.add_argument("--json", action="store_true", help="machine-readable report")
    d.add_argument("--tls-ca", default="", help="CA file, for bookies that serve TLS")
    d.set_defaults(func=_decommission)


class _Bar:
    """A tqdm bar of entries copied (fragments in the postfix), on a terminal only."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._fragments = 0
        self._total_fragments = 0

    def start(self, fragments: int, entries: int) -> None:
        if not sys.stderr.isatty():
            return
        from tqdm import tqdm

        self._total_fragments = fragments
        self._bar = tqdm(total=entries, unit="entry", desc="re-replicating", file=sys.stderr)

    def advance(self, fragments: int, entries: int) -> None:
        if self._bar is None:
            return
        self._fragments += fragments
        self._bar.set_postfix_str(f"fragments {self._fragments}/{self._total_fragments}", refresh=False)
        self._bar.update(entries)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _recover(args: argparse.Namespace) -> int:
    from walkit.recovery import recover

    bar = _Bar()
    try:
        report = recover(args.metadata, args.bookie, target=args.target, dry_run=args.dry_run, tls_ca=args.tls_ca,
                         progress=None if args.json else bar)
    finally:
        bar.close()
    return _print(report, args.json)


def _decommission(args: argparse.Namespace) -> int:
    from walkit.recovery import decommission

    bar = _Bar()
    try:
        report = decommission(args.metadata, args.bookie, tls_ca=args.tls_ca, progress=None if args.json else bar)
    finally:
        bar.close()
    code = _print(report, args.json)
    if not args.json:
        print(f"bookie {report.bookie} can now be stopped and removed" if report.removable else
              f"bookie {report.bookie} is read-only but still needed: run walkit decommission again once the "
              "ledgers above are closed (or the failures fixed)")
    return code if report.removable else 1


def _print(report: RecoveryReport, as_json: bool) -> int:
    if as_json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    else:
        r: RecoveryReport = report
        verb = "would copy" if r.dry_run else "copied"
        print(f"bookie {r.bookie}: {r.ledgers_scanned} ledgers scanned, {r.ledgers_affected} closed ledgers with "
              f"{r.fragments} fragments naming it ({r.entries} entries held)")
        if not r.dry_run:
            print(f"  {verb} {r.entries_copied} entries; {r.fragments_replaced} fragments now name another bookie "
                  f"in {r.seconds:.1f} s")
        if r.copy_paths:
            print("  copied by " + ", ".join(f"{'a walkit bookie' if path == 'push' else 'walkit itself'}: {n} fragments"
                                           for path, n in sorted(r.copy_paths.items())))
        for target, n in sorted(r.targets.items()):
            print(f"  {'planned' if r.dry_run else 'moved'} to {target}: {n} fragments")
        if r.open_ledgers:
            print(f"  {len(r.open_ledgers)} open ledgers' live fragments name it (left to their writers; "
                  "run again once changed or closed): " + " ".join(map(str, r.open_ledgers[:20])) + (" ..." if len(r.open_ledgers) > 20 else ""))
        for failure in r.failures:
            print(f"  FAILED ledger {failure['ledger']} fragment @{failure['first_entry']}: {failure['error']}")
    return 1 if report.failures else 0
