"""``walkit ledger list|show|read|delete``: the ledgers of a cluster, from its metadata.

``list`` streams (one metadata read per ledger, printed as it comes: millions of ledgers
never sit in memory); ``read`` opens the ledger without recovery, so a ledger still open
is read up to its LAC and its writer goes on (never fenced); ``delete`` asks first.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from walkit.cli._commands import Subcommands
from walkit.cli._output import (
    add_format,
    confirm,
    iso_ms,
    ledger_id,
    limited,
    payload_json,
    record_line,
    size,
    stream_json,
    text_or_escaped,
)
from walkit.cli._metadata import add_metadata_option

if TYPE_CHECKING:
    from walkit.metadata import Cluster, LedgerMetadata

__all__ = ["register"]

def register(subparsers: Subcommands) -> None:
    """``walkit ledger`` and its sub-commands."""
    ledger = subparsers.add_parser("ledger", help="list, show, read and delete ledgers")
    verbs = subparsers.subcommands(ledger, dest="verb")
    ls = verbs.add_parser("list", help="every ledger: id, state, E/Qw/Qa, last entry, length, custom metadata")
    ls.add_argument("--limit", type=int, default=None, help="at most this many ledgers (lowest ids first)")
    show = verbs.add_parser("show", help="one ledger's metadata: fragments and their bookies, state, digest, ctime")
    read = verbs.add_parser("read", help="a ledger's entries (an open ledger up to its LAC, without fencing it)")
    read.add_argument("--from", dest="first", type=int, default=0, help="first entry id (default 0)")
    read.add_argument("--to", dest="last", type=int, default=None, help="last entry id (default: the last readable)")
    read.add_argument("--password", default="", help="the ledger's password (default: empty)")
    add_format(read)
    delete = verbs.add_parser("delete", help="delete a ledger (asks first; bookies reclaim its space at their GC)")
    delete.add_argument("--yes", action="store_true", help="do not ask")
    for p, func in ((ls, _list), (show, _show), (read, _read), (delete, _delete)):
        if p is not ls:
            p.add_argument("ledger", type=ledger_id, help="the ledger id")
        add_metadata_option(p)
        if p is not read:
            p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=func)


def custom_fields(meta: LedgerMetadata) -> dict[str, dict[str, str]]:
    return {key: payload_json(value) for key, value in meta.custom_metadata}


def _summary(meta: LedgerMetadata) -> dict[str, Any]:
    return {"ledger": meta.ledger_id, "state": meta.state.name, "ensemble_size": meta.ensemble_size,
            "write_quorum": meta.write_quorum, "ack_quorum": meta.ack_quorum, "last_entry_id": meta.last_entry_id,
            "length": meta.length, "custom_metadata": custom_fields(meta)}


def _tags(meta: LedgerMetadata) -> str:
    return " ".join(f"{key}={text_or_escaped(value)}" for key, value in meta.custom_metadata)


def _each(cluster: Cluster) -> Iterator[LedgerMetadata]:
    from walkit.errors import NoSuchLedgerError

    for lid in cluster.ledgers.ledger_ids():
        try:
            yield cluster.ledgers.read(lid)[0]
        except NoSuchLedgerError:
            continue  # deleted while we listed


def _list(args: argparse.Namespace) -> int:
    from walkit.metadata import connect

    if args.limit is not None and args.limit < 0:
        from walkit.errors import InvalidArgumentError

        raise InvalidArgumentError("--limit must be >= 0", limit=args.limit)
    with connect(args.metadata, read_only=True) as cluster:
        ledgers = limited(_each(cluster), args.limit)
        if args.json:
            stream_json(_summary(meta) for meta in ledgers)
            return 0
        count = 0
        for meta in ledgers:
            if not count:
                print(f"{'LEDGER':>12}  {'STATE':<11}  {'E/Qw/Qa':<7}  {'LAST':>8}  {'LENGTH':>10}  CUSTOM")
            last = "-" if meta.state.name == "OPEN" else str(meta.last_entry_id)
            print(f"{meta.ledger_id:>12}  {meta.state.name:<11}  "
                  f"{meta.ensemble_size}/{meta.write_quorum}/{meta.ack_quorum:<3}  {last:>8}  "
                  f"{size(meta.length):>10}  {_tags(meta)}".rstrip())
            count += 1
        print(f"{count} ledgers" if count else "no ledgers", file=sys.stderr)
    return 0


def _show(args: argparse.Namespace) -> int:
    from walkit.metadata import connect

    with connect(args.metadata, read_only=True) as cluster:
        meta, version = cluster.ledgers.read(args.ledger)
    fragments: list[dict[str, Any]] = [
        {"first_entry": first, "last_entry": meta.fragment_end(i), "bookies": list(bookies)}
        for i, (first, bookies) in enumerate(meta.ensembles)]
    shown = {**_summary(meta), "digest": meta.digest, "ctime": meta.ctime, "created": iso_ms(meta.ctime),
             "password": "empty" if meta.check_password(b"") else "set", "metadata_version": version,
             "fragments": fragments}
    if args.json:
        print(json.dumps(shown, indent=2, sort_keys=True))
        return 0
    print(f"ledger {meta.ledger_id}")
    last = "- (open: its writer's LAC is on the bookies)" if meta.state.name == "OPEN" else meta.last_entry_id
    for label, value in (("state", meta.state.name),
                         ("quorums", f"E={meta.ensemble_size} Qw={meta.write_quorum} Qa={meta.ack_quorum}"),
                         ("digest", meta.digest), ("password", shown["password"]),
                         ("created", f"{shown['created']} (ctime {meta.ctime})"), ("last entry", last),
                         ("length", f"{size(meta.length)} ({meta.length} bytes)"), ("custom", _tags(meta) or "-"),
                         ("version", f"{version} (of its metadata node)"), ("fragments", len(fragments))):
        print(f"  {label:<12} {value}")
    for f in fragments:
        end = "(open)" if f["last_entry"] is None else f["last_entry"]
        print(f"    entries {f['first_entry']}..{end}:\t{', '.join(f['bookies'])}")
    return 0


def _read(args: argparse.Namespace) -> int:
    from walkit.client import BookKeeper
    from walkit.errors import InvalidArgumentError

    fmt = "json" if args.json else args.format
    if args.first < 0 or (args.last is not None and args.last < args.first):
        raise InvalidArgumentError("entries to read: need 0 <= --from <= --to", first=args.first, last=args.last)
    with BookKeeper(args.metadata, metadata_read_only=True) as bk, bk.open_ledger(args.ledger, args.password.encode(), recovery=False) as h:
        lac = h.last_add_confirmed
        last = lac if args.last is None else args.last
        if last > lac:
            raise InvalidArgumentError("--to is past the last readable entry", ledger=args.ledger, to=last,
                                       last_add_confirmed=lac, state=h.metadata.state.name)
        if args.first > last:
            print(f"ledger {args.ledger}: no entries from {args.first} (last readable: {lac})", file=sys.stderr)
            return 0
        for entry in h.read(args.first, last):
            record_line(fmt, "entry", str(entry.entry_id), entry.data)
    return 0


def _delete(args: argparse.Namespace) -> int:
    from walkit.metadata import connect

    with connect(args.metadata) as cluster:
        meta, version = cluster.ledgers.read(args.ledger)
        what = f"ledger {meta.ledger_id} ({meta.state.name}, {size(meta.length)}" + (
            f", {_tags(meta)})" if meta.custom_metadata else ")")
        if meta.custom.get("walkit.log") or meta.custom.get("walkit.snapshot"):
            print(f"warning: {what} belongs to a write-ahead log: its records go with it", file=sys.stderr)
        if not confirm(f"delete {what}?", args.yes):
            print("not deleted", file=sys.stderr)
            return 1
        cluster.ledgers.delete(meta.ledger_id, version)
    if args.json:
        print(json.dumps({"deleted": meta.ledger_id}))
    else:
        print(f"deleted ledger {meta.ledger_id} (bookies reclaim its space at their next garbage collection)")
    return 0
