"""The ``walkit`` command line.

``walkit init``            create the cluster layout in the metadata store (idempotent)
``walkit bench journal``   measure the journal against the disk's floor (docs/performance.md)
``walkit bench bookie``    one connection, 1 KiB adds with 1,000 in flight against a bookie process
``walkit bench ledger``    the ledger client (E=3 Qw=3 Qa=2, bookie processes): sequential latency, pipelined rate
``walkit bench wal``       the WriteAheadLog (100 B / 1 KiB records) against a fdatasync'd file and SQLite
``walkit bench spark``     records/s read by Spark local[2] vs. the WAL's own replay() (walkit[spark])
``walkit bench gc``        GC scan of 1,000,000 ledgers in metadata (time, memory); compaction MB/s and add latency
``walkit bench recovery``  a lost bookie's share put back by walkit recover / autorecovery: MB/s, writer p99
``walkit bookie start``    run a bookie (as ``python -m bookie --conf FILE``)
``walkit bookie list``     the available and read-only bookies of a cluster
``walkit bookie gc``       force garbage collection / compaction on bookies (--force, --compact), or --status
``walkit recover``         re-replicate every fragment a lost bookie held (--dry-run, --target, --json)
``walkit decommission``    make a running bookie read-only and move what it holds to others; say when it can go
``walkit autorecovery``    status | list-underreplicated | who-is-auditor | disable | enable | run (the daemon)
``walkit journal repair``  keep a ``.broken`` copy of a damaged journal and truncate it
``walkit demo``            a key-value store's primary is SIGKILLed; a standby fails over; the old one is fenced
``walkit sandbox``         a local cluster in the foreground for other processes, until SIGINT/SIGTERM
``walkit export``          archive a log to Parquet by segment with Spark; a second run continues (walkit[spark])

One module per group of commands, each with ``register(subparsers)`` adding its
sub-commands (and the function each runs, as ``func``): ``_bench``, ``_init``,
``_bookie``, ``_recover`` (recover, decommission), ``_autorecovery``, ``_journal``, ``_demo`` (demo, sandbox), ``_export``. What a command
imports, it imports when it runs. Errors become messages and exit codes here, in
:func:`main`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from walkit.cli import _autorecovery, _bench, _bookie, _demo, _export, _init, _journal, _recover

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="walkit", description="walkit: a replicated write-ahead log")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level to stderr")
    sub = p.add_subparsers(dest="command", required=True)
    for group in (_bench, _init, _bookie, _recover, _autorecovery, _journal, _demo, _export):  # the order of --help
        group.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr)
    from walkit.errors import WalkitError

    try:
        return int(args.func(args))
    except WalkitError as exc:
        print(f"walkit: {exc}", file=sys.stderr)
        return 2
