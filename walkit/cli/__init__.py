"""The ``walkit`` command line.

``walkit init``            create the cluster layout in the metadata store (idempotent)
``walkit bench journal``   measure the journal against the disk's floor (docs/performance.md)
``walkit bench bookie``    one connection, 1 KiB adds with 1,000 in flight against a bookie process
``walkit bench ledger``    the ledger client (E=3 Qw=3 Qa=2, bookie processes): sequential latency, pipelined rate
``walkit bench wal``       the WriteAheadLog (100 B / 1 KiB records) against a fdatasync'd file and SQLite
``walkit bench read``      replay of a log (cold/hot, batched/one per entry) and tail visibility
``walkit bench spark``     records/s read by Spark local[2] vs. the WAL's own replay() (walkit[spark])
``walkit bench gc``        GC scan of 1,000,000 ledgers in metadata (time, memory); compaction MB/s and add latency
``walkit bench recovery``  a lost bookie's share put back by walkit recover / autorecovery: MB/s, writer p99
``walkit bench scale``     cost as data grows: bookie RSS, rate over 10,000 ledgers, restart, recovery, WAL failover
``walkit bench bookkeeper`` walkit against Apache BookKeeper 4.18.2 (defaults and tuned) on this machine, row by row
``walkit bookie start``    run a bookie (as ``python -m bookie --conf FILE``)
``walkit bookie list``     the available and read-only bookies of a cluster
``walkit bookie gc``       force garbage collection / compaction on bookies (--force, --compact), or --status
``walkit bookie info|lastmark|readjournal|readlog|cookie get``  offline: a stopped bookie's disks and files
``walkit cluster info``    instance id, layout, bookies by state, how many ledgers and logs
``walkit ledger``          list | show | read | delete: ledgers and their metadata, entries read without fencing
``walkit log``             list | show | read | tail: write-ahead logs, their segments and records (never fencing)
``walkit recover``         re-replicate every fragment a lost bookie held (--dry-run, --target, --json)
``walkit decommission``    make a running bookie read-only and move what it holds to others; say when it can go
``walkit autorecovery``    status | list-underreplicated | who-is-auditor | disable | enable | run (the daemon)
``walkit journal repair``  keep a ``.broken`` copy of a damaged journal and truncate it
``walkit demo``            a key-value store's primary is SIGKILLed; a standby fails over; the old one is fenced
``walkit sandbox``         a local cluster in the foreground for other processes, until SIGINT/SIGTERM
``walkit export``          archive a log to Parquet by segment with Spark; a second run continues (walkit[spark])

One module per group of commands, each with ``register(subparsers)`` adding its
sub-commands (and the function each runs, as ``func``) to a ``_commands.Subcommands``
(which remembers every parser made): ``_bench``, ``_init``,
``_bookie`` (with ``_gc`` and ``_disks``), ``_cluster``, ``_ledger``, ``_log``, ``_recover`` (recover,
decommission), ``_autorecovery``, ``_journal``, ``_demo`` (demo, sandbox), ``_export``;
``_output`` holds what the inspection commands print alike; ``_metadata`` the
``--metadata URI`` option every command that uses a cluster takes, with
``$WALKIT_METADATA`` used when it is not given (filled in here, after parsing). Commands
that only look (``ledger list|show|read``, ``log``, ``bookie list|gc|cookie get``,
``cluster info``, ``autorecovery status|list-underreplicated|who-is-auditor``,
``recover --dry-run``, ``export``) open the metadata store read-only; no command but
``init`` and ``sandbox`` makes a ``local://`` store. What a command imports, it
imports when it runs. ``-v`` / ``--log-level`` / ``--log-format text|json`` are accepted
before the command and after it, on every command (:mod:`walkit.logs`). Errors become messages and exit codes here, in :func:`main`:
a WalkitError (bad input, nothing there, the world failed) is one line on stderr and
exit status 2, like argparse's usage errors; Ctrl-C is exit status 130.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from walkit.cli import (
    _autorecovery, _bench, _bookie, _cluster, _demo, _export, _init, _journal, _ledger, _log, _recover,
)
from walkit.cli._commands import Subcommands
from walkit.cli._metadata import resolve_metadata

__all__ = ["main"]


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _level(text: str) -> int:
    name = text.upper()
    if name not in _LEVELS:
        raise argparse.ArgumentTypeError(f"not a log level: {text!r} (one of {', '.join(_LEVELS)})")
    return int(getattr(logging, name))


def _add_logging_options(p: argparse.ArgumentParser, top: bool) -> None:
    """-v, --log-level and --log-format; below the top parser their defaults are
    SUPPRESS, so a command's parser sets them only when they are given there. A command
    that logs at another level than WARNING by default says so with
    ``set_defaults(log_default="INFO")`` (its help names it)."""
    default = p.get_default("log_default") or "WARNING"
    verbose = ("log at INFO level to stderr (-vv: DEBUG)" if default == "WARNING" else
               f"-vv: log at DEBUG level to stderr ({default} is this command's default)")
    p.add_argument("-v", "--verbose", action="count", default=0 if top else argparse.SUPPRESS, help=verbose)
    p.add_argument("--log-level", type=_level, default=None if top else argparse.SUPPRESS, metavar="LEVEL",
                   help=f"log at this level to stderr ({', '.join(_LEVELS)}; default {default})")
    p.add_argument("--log-format", choices=("text", "json"), default="text" if top else argparse.SUPPRESS,
                   help="log lines as text (context appended as [ledger=... bookie=...]) or one JSON object "
                        "per line (walkit.logs)")


def _parsers() -> tuple[argparse.ArgumentParser, list[argparse.ArgumentParser]]:
    """The ``walkit`` parser, and the parsers of every sub-command below it, at any depth."""
    # no abbreviations: `walkit export --log NAME` must not read as a prefix of --log-level
    p = argparse.ArgumentParser(prog="walkit", description="walkit: a replicated write-ahead log", allow_abbrev=False)
    sub = Subcommands(p, dest="command")
    for group in (_bench, _init, _bookie, _cluster, _ledger, _log, _recover, _autorecovery, _journal, _demo,
                  _export):  # the order of --help
        group.register(sub)
    _add_logging_options(p, top=True)
    for q in sub.parsers:
        _add_logging_options(q, top=False)
    return p, sub.parsers


def _parser() -> argparse.ArgumentParser:
    return _parsers()[0]


def _log_level(args: argparse.Namespace) -> int:
    if args.log_level is not None:
        return int(args.log_level)
    return logging.DEBUG if args.verbose >= 2 else logging.INFO if args.verbose else logging.WARNING


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    resolve_metadata(args)
    from walkit.logs import configure

    configure(_log_level(args), args.log_format)  # walkit bookie start configures again, at its own default
    from walkit.errors import WalkitError

    try:
        return int(args.func(args))
    except WalkitError as exc:
        print(f"walkit: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("walkit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (| head): what it wanted is printed
        _quiet_stdout()
        return 0


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush of what is left for a
    closed pipe raises nothing more."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
