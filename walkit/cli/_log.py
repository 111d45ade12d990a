"""``walkit log list|show|read|tail``: the write-ahead logs of a cluster (:mod:`walkit.wal._inspect`).

Nothing here writes: no epoch is bumped and no segment is fenced or recovered, so the
log's writer goes on undisturbed, and the metadata store is opened read-only. ``read``
and ``tail`` read closed segments to their end and the open one up to its LAC (what is
durable); a truncated log is read from its first kept record.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import TYPE_CHECKING, Any

from walkit.cli._commands import Subcommands
from walkit.cli._metadata import add_metadata_option
from walkit.cli._output import add_format, limited, record_line, size

if TYPE_CHECKING:
    from walkit.client import BookKeeper
    from walkit.metadata import Cluster
    from walkit.wal import LSN, LogMetadata, LogReader, Retention, Segment

__all__ = ["register"]


def _lsn(text: str) -> LSN:
    from walkit.errors import InvalidArgumentError
    from walkit.wal import LSN

    try:
        return LSN.parse(text)
    except InvalidArgumentError:
        raise argparse.ArgumentTypeError(f"not an LSN (segment/entry/slot): {text!r}") from None


def register(subparsers: Subcommands) -> None:
    """``walkit log`` and its sub-commands."""
    log = subparsers.add_parser("log", help="list, show, read and tail write-ahead logs (never fencing the writer)")
    verbs = subparsers.subcommands(log, dest="verb")
    ls = verbs.add_parser("list", help="the logs (of one namespace, or of all): epoch, segments, snapshot, truncation")
    show = verbs.add_parser("show", help="one log: epoch, settings, snapshots, truncation, segments with their "
                                         "ledgers and LSN ranges (segment/entry/slot; * is any slot)")
    read = verbs.add_parser("read", help="a log's durable records (LSN and record)")
    read.add_argument("--after", type=_lsn, default=None, help="only the records after this LSN (default: all)")
    read.add_argument("--limit", type=int, default=None, help="at most this many records")
    tail = verbs.add_parser("tail", help="print records as they become durable, until Ctrl-C")
    start = tail.add_mutually_exclusive_group()
    start.add_argument("--after", type=_lsn, default=None, help="start after this LSN (default: at the log's end)")
    start.add_argument("--from-start", action="store_true", help="start with the log's first record")
    for p, func in ((ls, _list), (show, _show), (read, _read), (tail, _tail)):
        if p is not ls:
            p.add_argument("name", help="the log's name")
            p.add_argument("--password", default="", help="the log's password (default: empty)")
        add_metadata_option(p)
        p.add_argument("--namespace", default=None if p is ls else "default",
                       help="only this namespace (default: every one)" if p is ls else "the log's namespace "
                                                                                       "(default: default)")
        if p in (read, tail):
            add_format(p)
        else:
            p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=func)


def _summary(namespace: str, name: str, meta: LogMetadata) -> dict[str, Any]:
    return {"namespace": namespace, "log": name, "epoch": meta.epoch, "segments": len(meta.segments),
            "first_segment": meta.segments[0].seq if meta.segments else None,
            "last_segment": meta.segments[-1].seq if meta.segments else None,
            "latest_snapshot": str(meta.snapshots[-1].lsn) if meta.snapshots else None,
            "truncated": None if meta.truncated is None else str(meta.truncated)}


def _list(args: argparse.Namespace) -> int:
    from walkit.metadata import connect
    from walkit.wal import iter_logs

    with connect(args.metadata, read_only=True) as cluster:
        logs = [_summary(ns, name, meta) for ns, name, meta in iter_logs(cluster, args.namespace)]
    if args.json:
        print(json.dumps(logs, indent=2, sort_keys=True))
        return 0
    if not logs:
        print("no logs" + (f" in namespace {args.namespace}" if args.namespace else ""), file=sys.stderr)
        return 0
    from walkit.wal import is_plain_name

    def shown(name: str) -> str:  # a name made by an earlier walkit may hold spaces or newlines
        return name if is_plain_name(name) else repr(name)

    names = [f"{shown(d['namespace'])}/{shown(d['log'])}" for d in logs]
    width = max(map(len, names))
    print(f"{'LOG':<{width}}  {'EPOCH':>5}  {'SEGMENTS':<12}  {'SNAPSHOT':<12}  TRUNCATED")
    for name, d in zip(names, logs):
        segments = f"{d['segments']} ({d['first_segment']}..{d['last_segment']})" if d["segments"] else "0"
        print(f"{name:<{width}}  {d['epoch']:>5}  {segments:<12}  "
              f"{d['latest_snapshot'] or '-':<12}  {d['truncated'] or '-'}")
    return 0


def _segment(cluster: Cluster, bk: BookKeeper, segment: Segment, password: bytes) -> dict[str, Any]:
    """One segment as ``show`` prints it: its ledger's state, entries and bytes; for an
    open ledger, what the bookies say is readable (its LAC)."""
    from walkit.errors import NoSuchLedgerError, WalkitError

    info: dict[str, Any] = {"seq": segment.seq, "ledger": segment.ledger_id}
    try:
        meta = cluster.ledgers.read(segment.ledger_id)[0]
    except NoSuchLedgerError:
        return {**info, "state": "MISSING", "last_entry": None, "length": None}
    info.update(state=meta.state.name, last_entry=meta.last_entry_id, length=meta.length)
    if meta.state.name != "CLOSED":
        try:
            with bk.open_ledger(segment.ledger_id, password, recovery=False) as handle:
                info.update(last_entry=handle.last_add_confirmed, length=None)
        except WalkitError as exc:
            info.update(last_entry=None, length=None, error=str(exc))
    return info


def _show(args: argparse.Namespace) -> int:
    from walkit.client import BookKeeper
    from walkit.errors import WalkitError
    from walkit.metadata import connect
    from walkit.wal import last_lsn, read_log_holds, read_log_metadata

    password = args.password.encode()
    with connect(args.metadata, read_only=True) as cluster, _client(args) as bk:
        meta, version = read_log_metadata(cluster, args.name, args.namespace)
        holds = read_log_holds(cluster, args.name, args.namespace)
        segments = [_segment(cluster, bk, s, password) for s in meta.segments]
        try:
            last: str | None = str(last_lsn(bk, meta, password) or "") or None
        except WalkitError as exc:
            last = f"unknown ({exc})"
    shown = {**_summary(args.namespace, args.name, meta), "metadata_version": version, "last_lsn": last,
             "settings": meta.settings.to_json(), "segments": segments,
             "snapshots": [{"lsn": str(s.lsn), "ledger": s.ledger_id, "size": s.size} for s in meta.snapshots],
             "pending_snapshots": [{"ledger": p.ledger_id, "epoch": p.epoch} for p in meta.pending],
             "holds": [{"by": by, "position": None if at is None else str(at)} for by, at in holds]}
    if args.json:
        print(json.dumps(shown, indent=2, sort_keys=True))
        return 0
    s = meta.settings
    print(f"log {args.namespace}/{args.name}")
    for label, value in (
            ("epoch", f"{meta.epoch} (writers so far; metadata version {version})"),
            ("settings", f"E={s.ensemble_size} Qw={s.write_quorum} Qa={s.ack_quorum}, a segment rolls at "
                         f"{size(s.roll_bytes)} or {s.roll_seconds:g} s"),
            ("truncated", f"before {meta.truncated} (retention: earlier records are gone)" if meta.truncated else "-"),
            ("last LSN", last or "- (no record yet)"),
            ("retention", _retention_text(s.retention, s.snapshots_kept)),
            ("snapshots", "; ".join(f"LSN {d['lsn']} in ledger {d['ledger']} ({size(d['size'])})"
                                    for d in shown["snapshots"]) or "-"),
            ("pending", "; ".join(f"ledger {p.ledger_id} (writer epoch {p.epoch}, being written or left by a dead "
                                  "writer)" for p in meta.pending) or "-"),
            ("holds", "; ".join(f"{by} at {'the start' if at is None else at}" for by, at in holds) or "-"),
            ("segments", len(segments))):
        print(f"  {label:<10} {value}")
    for d in segments:
        print("    " + _segment_line(d))
    return 0


def _retention_text(rules: Retention, kept: int) -> str:
    said = [f"segments closed over {rules.max_age:g} s ago" if rules.max_age is not None else "",
            f"oldest segments beyond {size(rules.max_bytes)}" if rules.max_bytes is not None else "",
            "everything before the oldest snapshot kept" if rules.before_snapshot else ""]
    text = ", ".join(x for x in said if x) or "none (truncate by hand)"
    return f"{text}; the newest {kept} snapshot(s) kept"


def _segment_line(d: dict[str, Any]) -> str:
    head = f"{d['seq']:>4}  ledger {d['ledger']:<8} {d['state']:<11}"
    if d.get("error"):
        return f"{head} LAC unknown: {d['error']}"
    if d["state"] == "MISSING":
        return f"{head} its ledger is gone (deleted outside the log)"
    last = d["last_entry"]
    if last is None or last < 0:
        return f"{head} no entries" + ("" if d["state"] == "CLOSED" else " readable yet")
    length = f", {size(d['length'])}" if d["length"] is not None else " readable"
    return f"{head} LSN {d['seq']}/0/0 .. {d['seq']}/{last}/*  ({last + 1} entries{length})"


def _client(args: argparse.Namespace) -> BookKeeper:
    """A client that reads: its metadata store opened read-only."""
    from walkit.client import BookKeeper

    return BookKeeper(args.metadata, metadata_read_only=True)


def _reader_and_meta(bk: BookKeeper, args: argparse.Namespace) -> tuple[LogReader, LogMetadata]:
    from walkit.wal import inspect_reader

    reader = inspect_reader(bk, args.name, args.namespace, args.password.encode())
    meta = reader.metadata()
    if meta.truncated is not None and getattr(args, "after", None) is None:
        print(f"log {args.namespace}/{args.name} is truncated: records before {meta.truncated} are gone",
              file=sys.stderr)
    return reader, meta


def _read(args: argparse.Namespace) -> int:
    from walkit.client import BookKeeper
    from walkit.errors import InvalidArgumentError

    if args.limit is not None and args.limit < 0:
        raise InvalidArgumentError("--limit must be >= 0", limit=args.limit)
    fmt = "json" if args.json else args.format
    with _client(args) as bk:
        reader, _ = _reader_and_meta(bk, args)
        with reader:
            for lsn, record in limited(reader.replay(args.after), args.limit):
                record_line(fmt, "lsn", str(lsn), record)
    return 0


def _tail(args: argparse.Namespace) -> int:
    """Until Ctrl-C (exit status 130), or an error. The tail runs on a thread of its own
    and SIGINT only wakes this one (walkit/cli/_sigint.py), which then closes the reader:
    the tail ends at once, between two records, and the client is closed as usual."""
    from walkit.cli._sigint import run_until_interrupted

    tail = _Tail(args)
    return 130 if run_until_interrupted(tail.run, tail.stop, "walkit-log-tail") else 0


class _Tail:
    """``walkit log tail``'s work (:meth:`run`, on its thread), and :meth:`stop` from another."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._args = args
        self._lock = threading.Lock()  # stop() and the reader's open/close, one at a time
        self._stopping = False
        self._reader: LogReader | None = None

    def stop(self) -> None:
        """End the tail: its reader closed, the tail ends at its next step (at once when it
        waits: closing wakes its long poll); before or while connecting, at its end."""
        with self._lock:
            self._stopping = True
            if self._reader is not None:
                self._reader.close()

    def run(self) -> None:
        from walkit.errors import UsageError

        with _client(self._args) as bk:
            reader, meta = _reader_and_meta(bk, self._args)
            with self._lock:
                self._reader = reader
            try:
                if not self._stopping:
                    self._follow(bk, reader, meta)
            except UsageError:
                if not self._stopping:
                    raise  # else: the reader closed by stop() under the tail
            finally:
                with self._lock:
                    reader.close()

    def _follow(self, bk: BookKeeper, reader: LogReader, meta: LogMetadata) -> None:
        from walkit.wal import last_lsn

        args = self._args
        fmt = "json" if args.json else args.format
        after = args.after if args.after is not None or args.from_start else last_lsn(bk, meta, args.password.encode())
        where = f"after {after}" if after is not None else "from its first record"
        print(f"tailing log {args.namespace}/{args.name} {where} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        for lsn, record in reader.tail(after):
            record_line(fmt, "lsn", str(lsn), record)
            sys.stdout.flush()
            if self._stopping:
                break
