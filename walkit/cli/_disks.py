"""``walkit bookie info|lastmark|readjournal|readlog|cookie get``: one bookie's disks,
read offline (a stopped bookie's directories; nothing is changed).

The directories come from the bookie's configuration (``--conf bookie.toml``) or from
``--journal-dir`` / ``--ledger-dir``. The readers are the bookie's own:
:class:`bookie.journal.JournalFile` (the frames replay reads, and what stops them),
:class:`bookie.storage.EntryLogFile` (the scan that rebuilds an entry log's usage),
:class:`bookie.journal.LogMark` and :func:`bookie.cookie.read_cookie`.
"""

from __future__ import annotations

import argparse
import errno
import functools
import json
import os
import shutil
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from walkit.cli._commands import Subcommands
from walkit.cli._metadata import add_metadata_option
from walkit.cli._output import limited, size
from walkit.errors import NativeIOError, UsageError, WalkitError

if TYPE_CHECKING:
    from bookie.cookie import Cookie
    from bookie.fs import FileSystem
    from bookie.journal import JournalStop

__all__ = ["add_parsers"]

_STOPS = {
    "end": "the end of the journal (only zeros, or nothing, follow)",
    "recycled-end": "the end of this file's life (a recycled file: its earlier life follows)",
    "torn": "a torn tail: the last flush did not reach the disk whole (nothing in it was acknowledged; the "
            "bookie truncates it at its next start)",
    "corrupt": "DAMAGED: valid frames follow, so synced data was lost; the bookie refuses to start on it "
               "(`walkit journal repair FILE` keeps FILE.broken and truncates there)",
}


def add_parsers(bookie: Subcommands) -> None:
    info = bookie.add_parser("info", help="offline: a stopped bookie's disks: cookie, directories, usage, "
                                          "lastMark, journal files, entry logs, index files")
    mark = bookie.add_parser("lastmark", help="offline: the LastLogMark in each ledger directory (where replay starts)")
    journal = bookie.add_parser("readjournal", help="offline: the records of a journal file; stops at the first "
                                                    "bad frame and says where and what follows")
    journal.add_argument("file", help="a journal file (<id:016x>.txn, or a copy of one)")
    journal.add_argument("--padding", action="store_true", help="also list the PADDING frames")
    entrylog = bookie.add_parser("readlog", help="offline: the records of an entry log (ledger, entry, size, offset)")
    entrylog.add_argument("file", help="an entry log (<ledger dir>/current/logs/<id:016x>.log)")
    entrylog.add_argument("--ledger", type=int, default=None, help="only this ledger's records")
    cookie = bookie.subcommands(bookie.add_parser("cookie", help="offline: the bookie's cookie"), dest="cookie_verb")
    get = cookie.add_parser("get", help="the cookie on each disk (and, with --metadata, the one in metadata)")
    add_metadata_option(get, required=False, help="also compare with the cookie kept in this cluster's metadata")
    drop = cookie.add_parser("delete", help="drop a bookie's cookie from the cluster's metadata (after `walkit "
                                            "recover` re-replicated what it held), so its id may start on empty "
                                            "disks; asks first")
    drop.add_argument("--bookie", required=True, help="the bookie id")
    add_metadata_option(drop)
    drop.add_argument("--yes", action="store_true", help="do not ask")
    drop.add_argument("--json", action="store_true", help="machine-readable output")
    drop.set_defaults(func=_cookie_delete)
    for p in (journal, entrylog):
        p.add_argument("--limit", type=int, default=None, help="at most this many records")
    for p in (info, mark, get):
        p.add_argument("--conf", help="the bookie's configuration (TOML): its journalDirectory and ledgerDirectories")
        p.add_argument("--journal-dir", help="the journal directory (instead of --conf)")
        p.add_argument("--ledger-dir", action="append", default=[], help="a ledger directory (repeat for each, in "
                                                                          "order; instead of --conf)")
    for p, func in ((info, _info), (mark, _lastmark), (journal, _readjournal), (entrylog, _readlog), (get, _cookie)):
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=_os_errors(func))


def _os_errors(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """The command, with an OSError of the disks (permissions, a file gone) turned into
    a NativeIOError: one line on stderr, not a traceback."""
    @functools.wraps(func)
    def command(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except (WalkitError, BrokenPipeError):
            raise
        except OSError as exc:
            raise NativeIOError(exc.errno or errno.EIO, exc.strerror or str(exc), path=exc.filename) from exc

    return command


def _dirs(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """(journal dir, ledger dirs) from --conf or the explicit options."""
    if args.conf:
        if args.journal_dir or args.ledger_dir:
            raise UsageError("give --conf or --journal-dir/--ledger-dir, not both")
        from bookie import BookieConfig

        config = BookieConfig.from_toml(args.conf)
        return config.journal_directory, list(config.ledger_directories)
    if not args.journal_dir and not args.ledger_dir:
        raise UsageError("which bookie? give --conf FILE (its bookie.toml) or --journal-dir and --ledger-dir")
    return args.journal_dir, list(args.ledger_dir)


def _fs() -> FileSystem:
    from bookie.fs.real import RealFS

    return RealFS()


def _locked(directory: str) -> bool:
    """Whether a bookie process holds the directory's LOCK (it is running)."""
    import fcntl

    path = os.path.join(directory, "LOCK")
    if not os.path.exists(path):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the shared lock, if we got it
    return False


def _cookie_of(fs: FileSystem, directory: str) -> tuple[Cookie | None, str | None]:
    from bookie.cookie import read_cookie

    try:
        return read_cookie(fs, directory), None
    except WalkitError as exc:
        return None, str(exc)


def _cookie_json(cookie: Cookie | None) -> dict[str, Any] | None:
    if cookie is None:
        return None
    return {"bookie_id": cookie.bookie_id, "instance_id": cookie.instance_id, "journal_dir": cookie.journal_dir,
            "ledger_dirs": list(cookie.ledger_dirs)}


def _mark_of(fs: FileSystem, directory: str) -> dict[str, Any] | None:
    from bookie.fs import read_all
    from bookie.journal import MARK_FILE, LogMark, journal_name

    path = f"{directory}/{MARK_FILE}"
    if not fs.exists(path):
        return None
    try:
        mark = LogMark.decode(read_all(fs, path), path=path)
    except WalkitError as exc:
        return {"error": str(exc)}
    return {"journal_id": mark.journal_id, "offset": mark.offset, "file": journal_name(mark.journal_id)}


def _disk(directory: str) -> dict[str, Any]:
    """The directory's file system: its size, what a bookie may still use of it, and
    the usage its disk check compares with ``diskUsageThreshold``."""
    from bookie.fs.real import disk_usage

    usage = shutil.disk_usage(directory)
    return {"total_bytes": usage.total, "free_bytes": usage.free, "used_fraction": round(disk_usage(directory), 4)}


def _journal_info(fs: FileSystem, directory: str) -> dict[str, Any]:
    from bookie.journal import free_journals, journal_name, list_journals

    ids = list_journals(fs, directory)
    total = sum(os.path.getsize(os.path.join(directory, journal_name(j))) for j in ids)
    return {"journal_files": len(ids), "journal_ids": ids, "journal_bytes": total,
            "free_files": len(free_journals(fs, directory))}


def _dir_info(fs: FileSystem, directory: str, kind: str) -> dict[str, Any]:
    from bookie.storage import ledger_dir_summary

    info: dict[str, Any] = {"dir": directory, "kind": kind, "exists": os.path.isdir(directory)}
    if not info["exists"]:
        return info
    cookie, error = _cookie_of(fs, directory)
    info.update(cookie=_cookie_json(cookie), cookie_error=error, disk=_disk(directory), locked=_locked(directory))
    if kind == "journal":
        info.update(_journal_info(fs, directory))
    else:
        s = ledger_dir_summary(fs, directory)
        info.update(last_mark=_mark_of(fs, directory), entry_logs=s.entry_logs, entry_log_bytes=s.entry_log_bytes,
                    usage_files=s.usage_files, compacting=s.compacting, index_files=s.index_files,
                    slot_log_bytes=s.slot_log_bytes, foreign_files=s.foreign)
    return info


def _info(args: argparse.Namespace) -> int:
    journal_dir, ledger_dirs = _dirs(args)
    fs = _fs()
    dirs = ([_dir_info(fs, journal_dir, "journal")] if journal_dir else []) + [
        _dir_info(fs, d, "ledgers") for d in ledger_dirs]
    cookies = [d["cookie"] for d in dirs if d.get("cookie")]
    result = {"bookie_id": cookies[0]["bookie_id"] if cookies else None,
              "instance_id": cookies[0]["instance_id"] if cookies else None,
              "cookies_agree": all(c == cookies[0] for c in cookies),
              "running": any(d.get("locked") for d in dirs), "directories": dirs}
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0
    state = "RUNNING (its directories are locked: what follows may be moving)" if result["running"] else "not running"
    print(f"bookie {result['bookie_id'] or '(no cookie)'}, cluster {result['instance_id'] or '-'}: {state}")
    if not result["cookies_agree"]:
        print("  the directories' cookies DIFFER (walkit bookie cookie get shows them)")
    for d in dirs:
        print(_dir_line(d))
    return 0


def _dir_line(d: dict[str, Any]) -> str:
    head = f"  {d['kind']:<8} {d['dir']}"
    if not d["exists"]:
        return f"{head}\n    missing"
    cookie = "damaged: " + d["cookie_error"] if d["cookie_error"] else ("ok" if d["cookie"] else "none")
    disk = d["disk"]
    lines = [head, f"    cookie       {cookie}",
             f"    disk         {disk['used_fraction']:.1%} used, {size(disk['free_bytes'])} free of "
             f"{size(disk['total_bytes'])}"]
    if d["kind"] == "journal":
        ids = d["journal_ids"]
        span = f", ids {ids[0]}..{ids[-1]}" if ids else ""
        lines.append(f"    journals     {d['journal_files']} files ({size(d['journal_bytes'])}){span}, "
                     f"{d['free_files']} free for reuse")
    else:
        lines.append(f"    lastMark     {_mark_text(d['last_mark'])}")
        lines.append(f"    entry logs   {d['entry_logs']} ({size(d['entry_log_bytes'])}), {d['usage_files']} usage "
                     f"files, {d['compacting']} being compacted")
        lines.append(f"    index files  {d['index_files']}, slot log {size(d['slot_log_bytes'])}"
                     + (f"; {d['foreign_files']} unknown files (the bookie would refuse them)"
                        if d["foreign_files"] else ""))
    return "\n".join(lines)


def _mark_text(mark: dict[str, Any] | None) -> str:
    if mark is None:
        return "none (replay starts at the first journal)"
    if "error" in mark:
        return f"damaged: {mark['error']}"
    return f"journal {mark['journal_id']} ({mark['file']}) offset {mark['offset']}"


def _lastmark(args: argparse.Namespace) -> int:
    _, ledger_dirs = _dirs(args)
    if not ledger_dirs:
        raise UsageError("lastmark needs the ledger directories (--conf or --ledger-dir)")
    fs = _fs()
    marks = {d: _mark_of(fs, d) for d in ledger_dirs}
    if args.json:
        print(json.dumps(marks, indent=2, sort_keys=True))
    else:
        for d, mark in marks.items():
            print(f"{d}\t{_mark_text(mark)}")
    return 1 if any(m is not None and "error" in m for m in marks.values()) else 0


def _records_json(head: dict[str, Any], records: Any, tail: Any) -> None:
    """``{...head, "records": [...], ...tail()}`` with the records streamed."""
    sys.stdout.write(json.dumps(head, sort_keys=True)[:-1] + (', ' if head else '') + '"records": [')
    for n, record in enumerate(records):
        sys.stdout.write(("," if n else "") + "\n  " + json.dumps(record, sort_keys=True))
    sys.stdout.write("\n], " + json.dumps(tail(), sort_keys=True)[1:] + "\n")


def _readjournal(args: argparse.Namespace) -> int:
    from bookie.journal import FrameType, JournalFile

    with JournalFile(_fs(), args.file) as jf:
        h = jf.header
        records = limited((r for r in jf.records() if args.padding or r.type is not FrameType.PADDING), args.limit)
        rows = ({"offset": r.offset, "type": r.type.name, "ledger": r.ledger_id, "arg": r.arg, "size": r.size,
                 "flush_start": bool(r.flags & 1)} for r in records)
        head = {"file": args.file, "journal_id": h.journal_id, "alignment": h.alignment, "previous_id": h.previous_id}
        if args.json:
            _records_json(head, rows, lambda: {"stop": _stop_json(jf.stop)})
        else:
            recycled = f", recycled from journal {h.previous_id}" if h.previous_id else ""
            print(f"journal {h.journal_id} ({args.file}): alignment {h.alignment}{recycled}")
            print(f"{'OFFSET':>12}  {'TYPE':<10}  {'LEDGER':>10}  {'ENTRY/ARG':>10}  SIZE")
            for r in rows:
                arg = "-" if r["arg"] is None else r["arg"]
                ledger = "-" if r["ledger"] is None else r["ledger"]
                print(f"{r['offset']:>12}  {r['type']:<10}  {ledger:>10}  {arg:>10}  {r['size']}")
            _print_stop(jf.stop)
    return 1 if jf.stop is not None and jf.stop.verdict == "corrupt" else 0


def _stop_json(stop: JournalStop | None) -> dict[str, Any] | None:
    if stop is None:  # --limit ended the walk before the end
        return None
    return {"offset": stop.offset, "file_size": stop.file_size, "verdict": stop.verdict,
            "valid_data_at": stop.valid_data_at, "meaning": _STOPS[stop.verdict]}


def _print_stop(stop: JournalStop | None) -> None:
    if stop is None:
        print("(--limit reached)")
        return
    where = f" (valid data at offset {stop.valid_data_at})" if stop.valid_data_at is not None else ""
    print(f"stopped at offset {stop.offset} of {stop.file_size}{where}: {_STOPS[stop.verdict]}")


def _readlog(args: argparse.Namespace) -> int:
    from bookie.storage import EntryLogFile

    with EntryLogFile(_fs(), args.file) as log:
        records = limited((r for r in log.records() if args.ledger is None or r.ledger_id == args.ledger), args.limit)
        rows = ({"ledger": r.ledger_id, "entry": r.entry_id, "size": r.size, "offset": r.offset} for r in records)
        head = {"file": args.file, "log_id": log.log_id, "file_size": log.size}
        if args.json:
            _records_json(head, rows, lambda: {"intact_end": log.end, "intact": log.end == log.size})
            return 0
        print(f"entry log {log.log_id} ({args.file}): {log.size} bytes")
        print(f"{'LEDGER':>10}  {'ENTRY':>10}  {'SIZE':>10}  OFFSET")
        count = 0
        for r in rows:
            print(f"{r['ledger']:>10}  {r['entry']:>10}  {r['size']:>10}  {r['offset']}")
            count += 1
        if args.limit is not None and count >= args.limit:
            print("(--limit reached)")
        elif log.end == log.size:
            print(f"{count} records; intact to the end of the file")
        else:
            print(f"{count} records; the intact records end at offset {log.end}: the {log.size - log.end} bytes "
                  "after it are torn (a crash while it was written) or damaged")
    return 0


def _cookie(args: argparse.Namespace) -> int:
    journal_dir, ledger_dirs = _dirs(args)
    fs = _fs()
    found = {d: _cookie_of(fs, d) for d in dict.fromkeys(([journal_dir] if journal_dir else []) + ledger_dirs)}
    disks: dict[str, dict[str, Any]] = {d: {"cookie": _cookie_json(c), "error": e} for d, (c, e) in found.items()}
    result: dict[str, Any] = {"directories": disks}
    cookies = [c for c, _ in found.values() if c is not None]
    if args.metadata:
        result["metadata"] = _metadata_cookie(args.metadata, cookies[0] if cookies else None)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        for d, entry in disks.items():
            print(f"{d}\t{_cookie_text(entry['cookie'], entry['error'])}")
        if "metadata" in result:
            m = result["metadata"]
            shown = _cookie_text(m["cookie"], None) if m["cookie"] else "no cookie"
            print(f"metadata\t{shown}\t({m['compared'] or m['error']})")
    bad = any(e for _, e in found.values()) or len({c for c in cookies}) > 1
    return 1 if bad or (args.metadata and result["metadata"]["error"]) else 0


def _cookie_text(cookie: dict[str, Any] | None, error: str | None) -> str:
    if error:
        return f"damaged: {error}"
    if cookie is None:
        return "no cookie"
    return (f"bookie {cookie['bookie_id']}  cluster {cookie['instance_id'] or '-'}  journal {cookie['journal_dir']}  "
            f"ledgers {','.join(cookie['ledger_dirs'])}")


def _metadata_cookie(uri: str, disk: Cookie | None) -> dict[str, Any]:
    """The cookie kept in metadata for the disks' bookie, compared with the disks'."""
    from bookie.cookie import decode_from_metadata
    from walkit.metadata import connect, read_cookie

    if disk is None:
        return {"cookie": None, "error": "no cookie on the disks: which bookie's?", "compared": None}
    with connect(uri, read_only=True) as cluster:
        stored = read_cookie(cluster.store, cluster.info, disk.bookie_id)
        cluster_format = cluster.info.format
    if stored is None:
        return {"cookie": None, "error": None, "compared": "none stored: the bookie never started with this metadata"}
    try:  # walkit's own bytes, or BookKeeper's text cookie in a BookKeeper-format cluster
        theirs = decode_from_metadata(stored[0], cluster_format, bookie_id=disk.bookie_id)
    except WalkitError as exc:
        return {"cookie": None, "error": str(exc), "compared": None}
    try:
        disk.verify_matches(theirs, where="metadata")
        compared = "the same as the disks'"
        error = None
    except WalkitError as exc:
        compared, error = None, f"differs from the disks': {exc}"
    return {"cookie": _cookie_json(theirs), "error": error, "compared": compared, "version": stored[1]}


def _cookie_delete(args: argparse.Namespace) -> int:
    """``walkit bookie cookie delete``: refused while the bookie is registered (running)."""
    from walkit.cli._output import confirm
    from walkit.errors import UsageError
    from walkit.metadata import connect, delete_cookie, read_cookie

    with connect(args.metadata) as cluster:
        bookies = cluster.bookies()
        if args.bookie in bookies.writable | bookies.readonly:
            raise UsageError("the bookie is running (registered): stop it first; its cookie guards its data",
                             bookie=args.bookie)
        stored = read_cookie(cluster.store, cluster.info, args.bookie)
        if stored is None:
            raise UsageError("the cluster holds no cookie for this bookie", bookie=args.bookie)
        if not confirm(f"drop bookie {args.bookie}'s cookie (only once what it held is re-replicated: "
                       f"`walkit recover --bookie {args.bookie}`)?", args.yes):
            print("not deleted", file=sys.stderr)
            return 1
        delete_cookie(cluster.store, cluster.info, args.bookie, stored[1])
    if args.json:
        print(json.dumps({"deleted_cookie": args.bookie}))
    else:
        print(f"dropped the cookie of bookie {args.bookie}: it may start on empty disks now")
    return 0
