"""The ``walkit`` command line.

``walkit init``            create the cluster layout in the metadata store (idempotent)
``walkit bench journal``   measure the journal against the disk's floor (docs/performance.md)
``walkit bench bookie``    one connection, 1 KiB adds with 1,000 in flight against a bookie process
``walkit bench ledger``    the ledger client (E=3 Qw=3 Qa=2, bookie processes): sequential latency, pipelined rate
``walkit bench wal``       the WriteAheadLog (100 B / 1 KiB records) against a fdatasync'd file and SQLite
``walkit bench spark``     records/s read by Spark local[2] vs. the WAL's own replay() (walkit[spark])
``walkit bookie start``    run a bookie (as ``python -m bookie --conf FILE``)
``walkit bookie list``     the available and read-only bookies of a cluster
``walkit journal repair``  keep a ``.broken`` copy of a damaged journal and truncate it
``walkit demo``            a key-value store's primary is SIGKILLed; a standby fails over; the old one is fenced
``walkit sandbox``         a local cluster in the foreground for other processes, until SIGINT/SIGTERM
``walkit export``          archive a log to Parquet by segment with Spark; a second run continues (walkit[spark])
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _bench_journal(args: argparse.Namespace) -> int:
    from bookie.bench import format_markdown, run_journal_bench

    report = run_journal_bench(args.dir, seconds=args.seconds)
    print(json.dumps(report, indent=2) if args.json else format_markdown(report))
    return 0


def _journal_repair(args: argparse.Namespace) -> int:
    from bookie.fs.real import RealFS
    from bookie.journal import repair_journal

    result = repair_journal(RealFS(), args.path)
    print(
        f"kept {result.broken_copy}; truncated {result.path} at offset {result.truncated_at} "
        f"({result.dropped_bytes} bytes dropped; entries in them are lost on this bookie "
        f"and must come back from their other replicas)"
    )
    return 0


def _init(args: argparse.Namespace) -> int:
    from walkit.metadata import init_cluster, open_metadata_store, parse_metadata_uri

    uri = parse_metadata_uri(args.metadata)
    store = open_metadata_store(uri)
    try:
        info = init_cluster(store, uri.root, uri.layout)
    finally:
        store.close()
    print(f"cluster {info.instance_id} at {args.metadata} (ledger layout: {info.layout})")
    return 0


def _bench_bookie(args: argparse.Namespace) -> int:
    from bookie.bench_server import format_markdown, run_bookie_bench

    report = run_bookie_bench(args.dir, seconds=args.seconds, in_flight=args.in_flight, size=args.size)
    print(json.dumps(report, indent=2) if args.json else format_markdown(report))
    return 0


def _bench_ledger(args: argparse.Namespace) -> int:
    from walkit.bench_ledger import format_markdown, run_ledger_bench

    report = run_ledger_bench(args.dir, seconds=args.seconds, in_flight=args.in_flight, size=args.size,
                              bookies=args.bookies)
    print(json.dumps(report, indent=2) if args.json else format_markdown(report))
    return 0


def _bench_wal(args: argparse.Namespace) -> int:
    from walkit.bench_wal import format_markdown, run_wal_bench

    report = run_wal_bench(args.dir, seconds=args.seconds, in_flight=args.in_flight)
    print(json.dumps(report, indent=2) if args.json else format_markdown(report))
    return 0


def _bench_spark(args: argparse.Namespace) -> int:
    from walkit.spark import format_markdown, run_spark_bench

    report = run_spark_bench(args.dir, records=args.records, size=args.size, master=args.master)
    print(json.dumps(report, indent=2) if args.json else format_markdown(report))
    return 0 if report["checksums_match"] else 1


def _export(args: argparse.Namespace) -> int:
    from walkit.spark import export_log, spark_session
    from walkit.wal import LSN

    if not args.metadata:
        print("walkit export: give --metadata URI (or set WALKIT_METADATA)", file=sys.stderr)
        return 2
    after = LSN.parse(args.after) if args.after else None
    spark = spark_session(args.master, "walkit-export")
    try:
        result = export_log(spark, args.metadata, args.log, args.to, namespace=args.namespace,
                            password=args.password.encode(), after=after, progress=not args.no_progress)
    finally:
        spark.stop()
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(f"exported {result.records:,} records of {result.namespace}/{result.log} "
              f"after {result.after or 'the start'} up to {result.last or '-'} into {result.directory} "
              f"({result.files} files, {result.bytes:,} bytes, {result.seconds:.1f} s); "
              f"{result.total_records:,} in all")
    return 0


def _bookie_start(args: argparse.Namespace) -> int:
    from bookie._main import run

    return run(args)


def _bookie_list(args: argparse.Namespace) -> int:
    from walkit.metadata import connect

    with connect(args.metadata) as cluster:
        bookies = cluster.bookies()
    for bookie_id in sorted(bookies.writable):
        print(f"{bookie_id}\tavailable")
    for bookie_id in sorted(bookies.readonly):
        print(f"{bookie_id}\treadonly")
    if not bookies.writable and not bookies.readonly:
        print("no bookies registered", file=sys.stderr)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from walkit.demo import format_report, run_demo

    report = run_demo(args.data, seconds=args.seconds, bookies=args.bookies, progress=not args.no_progress,
                      verbose=args.verbose)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if report["pass"] else 1


def _sandbox(args: argparse.Namespace) -> int:
    from walkit.sandbox import run_sandbox

    return run_sandbox(args.data, bookies=args.bookies, processes=args.processes)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="walkit", description="walkit: a replicated write-ahead log")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level to stderr")
    sub = p.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="what", required=True)
    bj = bench.add_parser("journal", help="the journal vs. the disk's own floor")
    bj.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bj.add_argument("--seconds", type=float, default=3.0, help="duration of each case (default 3)")
    bj.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temporary one here)")
    bj.set_defaults(func=_bench_journal)
    bb = bench.add_parser("bookie", help="adds per second through one connection to a bookie process")
    bb.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bb.add_argument("--seconds", type=float, default=5.0, help="duration of the measurement (default 5)")
    bb.add_argument("--in-flight", type=int, default=1000, help="adds in flight (default 1000)")
    bb.add_argument("--size", type=int, default=1024, help="entry payload bytes (default 1024)")
    bb.add_argument("--dir", default=None, help="where the bookie keeps its data (default: a temporary one here)")
    bb.set_defaults(func=_bench_bookie)
    bld = bench.add_parser("ledger", help="the ledger client: sequential add latency and pipelined adds per second")
    bld.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bld.add_argument("--seconds", type=float, default=5.0, help="duration of each phase, after its warm-up (default 5)")
    bld.add_argument("--in-flight", type=int, default=1000, help="adds in flight in the pipelined phase (default 1000)")
    bld.add_argument("--size", type=int, default=1024, help="entry payload bytes (default 1024)")
    bld.add_argument("--bookies", type=int, default=3, help="bookie processes (default 3; the ledger uses 3)")
    bld.add_argument("--dir", default=None, help="where the cluster keeps its data (default: a temporary one here)")
    bld.set_defaults(func=_bench_ledger)
    bw = bench.add_parser("wal", help="the WriteAheadLog: records/s and append latency vs. a local file and SQLite")
    bw.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bw.add_argument("--seconds", type=float, default=5.0, help="duration of each case, after its warm-up (default 5)")
    bw.add_argument("--in-flight", type=int, default=1000, help="appends in flight in the windowed case (default 1000)")
    bw.add_argument("--dir", default=None, help="where the cluster and the baselines keep their data "
                    "(default: a temporary one here)")
    bw.set_defaults(func=_bench_wal)
    bsp = bench.add_parser("spark", help="records/s read by Spark vs. the WAL's own replay() (walkit[spark])")
    bsp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bsp.add_argument("--records", type=int, default=1_000_000, help="records in the log (default 1,000,000)")
    bsp.add_argument("--size", type=int, default=16, help="record bytes (default 16)")
    bsp.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    bsp.add_argument("--dir", default=None, help="where the cluster keeps its data (default: a temporary one)")
    bsp.set_defaults(func=_bench_spark)

    init = sub.add_parser("init", help="create the cluster layout in the metadata store (idempotent)")
    init.add_argument("--metadata", required=True, help="metadata service URI: zk://host:port/ledgers or local:///dir")
    init.set_defaults(func=_init)

    bookie = sub.add_parser("bookie", help="run and inspect bookies").add_subparsers(dest="what", required=True)
    bs = bookie.add_parser("start", help="run a bookie until SIGTERM (as python -m bookie)")
    bs.add_argument("--conf", required=True, help="bookie configuration (TOML, BookKeeper key names)")
    bs.set_defaults(func=_bookie_start)
    bl = bookie.add_parser("list", help="the available and read-only bookies")
    bl.add_argument("--metadata", required=True, help="metadata service URI: zk://host:port/ledgers or local:///dir")
    bl.set_defaults(func=_bookie_list)

    journal = sub.add_parser("journal", help="journal tools").add_subparsers(dest="what", required=True)
    jr = journal.add_parser("repair", help="keep PATH.broken and truncate PATH at its first bad frame")
    jr.add_argument("path", help="a journal file (<id:016x>.txn) the bookie refused to replay")
    jr.set_defaults(func=_journal_repair)

    demo = sub.add_parser("demo", help="failover of a replicated key-value store: SIGKILL, snapshot + replay, fencing")
    demo.add_argument("--data", default=None, help="where the cluster keeps its data (default: a temporary directory)")
    demo.add_argument("--seconds", type=float, default=10.0, help="how long the primary writes before SIGKILL (default 10)")
    demo.add_argument("--bookies", type=int, default=3, help="bookie processes (default 3; the log uses 3)")
    demo.add_argument("--json", action="store_true", help="print the report as JSON")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    demo.set_defaults(func=_demo)

    sandbox = sub.add_parser("sandbox", help="run a local cluster in the foreground until SIGINT/SIGTERM")
    sandbox.add_argument("--data", default=None, help="the cluster's directory (default: a temporary one, removed)")
    sandbox.add_argument("--bookies", type=int, default=3, help="bookies (default 3)")
    sandbox.add_argument("--processes", action="store_true", help="bookies as child processes (default: in-process)")
    sandbox.set_defaults(func=_sandbox)

    export = sub.add_parser("export", help="archive a log to Parquet by segment with Spark, resumably (walkit[spark])")
    export.add_argument("--log", required=True, help="the log's name")
    export.add_argument("--to", required=True, help="the export directory (Parquet files and _walkit_export.json)")
    export.add_argument("--after", default=None, help="export the records after this LSN (segment/entry/slot) "
                        "instead of after the last one exported")
    export.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    export.add_argument("--metadata", default=os.environ.get("WALKIT_METADATA"),
                        help="metadata service URI (default: $WALKIT_METADATA)")
    export.add_argument("--namespace", default="default", help="the log's namespace (default: default)")
    export.add_argument("--password", default="", help="the log's ledger password")
    export.add_argument("--json", action="store_true", help="print the result as JSON")
    export.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    export.set_defaults(func=_export)
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


if __name__ == "__main__":
    sys.exit(main())
