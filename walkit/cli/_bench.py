"""``walkit bench journal|bookie|ledger|wal|read|spark|gc|recovery|scale|metadata|bookkeeper``: the benchmarks of
:mod:`walkit.bench`."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from walkit.cli._commands import Subcommands


def _print_report(args: argparse.Namespace, report: dict[str, Any], markdown: Callable[[dict[str, Any]], str]) -> None:
    print(json.dumps(report, indent=2) if args.json else markdown(report))


def _journal(args: argparse.Namespace) -> int:
    from walkit.bench.journal import format_markdown, run_journal_bench

    report = run_journal_bench(args.dir, seconds=args.seconds)
    _print_report(args, report, format_markdown)
    return 0


def _bookie(args: argparse.Namespace) -> int:
    from walkit.bench.bookie import format_markdown, run_bookie_bench

    report = run_bookie_bench(args.dir, seconds=args.seconds, in_flight=args.in_flight, size=args.size)
    _print_report(args, report, format_markdown)
    return 0


def _ledger(args: argparse.Namespace) -> int:
    from walkit.bench.ledger import format_markdown, run_ledger_bench

    report = run_ledger_bench(args.dir, seconds=args.seconds, in_flight=args.in_flight, size=args.size,
                              bookies=args.bookies)
    _print_report(args, report, format_markdown)
    return 0


def _wal(args: argparse.Namespace) -> int:
    from walkit.bench.wal import format_markdown, run_wal_bench

    report = run_wal_bench(args.dir, seconds=args.seconds, in_flight=args.in_flight, samples=args.samples)
    _print_report(args, report, format_markdown)
    return 0


def _read(args: argparse.Namespace) -> int:
    from walkit.bench.read import format_markdown, run_read_bench

    report = run_read_bench(args.dir, gib=args.gib, one_per_entry=args.one_per_entry,
                            ledger_entries=args.ledger_entries, samples=args.samples)
    _print_report(args, report, format_markdown)
    return 0


def _spark(args: argparse.Namespace) -> int:
    from walkit.bench.spark import format_markdown, run_spark_bench  # pyspark: only for this command

    report = run_spark_bench(args.dir, records=args.records, size=args.size, master=args.master)
    _print_report(args, report, format_markdown)
    return 0 if report["checksums_match"] else 1


def _gc(args: argparse.Namespace) -> int:
    from walkit.bench.gc import format_markdown, run_gc_bench

    report = run_gc_bench(args.dir, ledgers=args.ledgers, zk=args.zk, repeats=args.repeats, seconds=args.seconds,
                          volume_mib=args.volume_mib, unthrottled_volume_mib=args.unthrottled_volume_mib,
                          log_mib=args.log_mib, scan=args.part in ("all", "scan"),
                          compaction=args.part in ("all", "compaction"))
    _print_report(args, report, format_markdown)
    return 0


def _recovery(args: argparse.Namespace) -> int:
    from walkit.bench.recovery import format_markdown, run_recovery_bench

    report = run_recovery_bench(args.dir, seconds=args.seconds, gib=args.gib, ledgers=args.ledgers,
                                entry_size=args.entry_size, session_timeout=args.session_timeout)
    _print_report(args, report, format_markdown)
    return 0


def _scale(args: argparse.Namespace) -> int:
    from walkit.bench.scale import CASES, format_markdown, run_scale_bench

    report = run_scale_bench(args.dir, ledgers=args.ledgers, entries=args.entries, concurrent=args.concurrent,
                             seconds=args.seconds, in_flight=args.in_flight, gib=args.gib,
                             max_ledger_entries=args.max_ledger_entries, segments=args.segments,
                             snapshots=args.snapshots, checkpoint_interval=args.checkpoint_interval,
                             session_timeout=args.session_timeout, cases=args.case or CASES)
    _print_report(args, report, format_markdown)
    return 0


def _metadata(args: argparse.Namespace) -> int:
    from walkit.bench.metadata import format_markdown, run_metadata_bench

    report = run_metadata_bench(args.dir, ledgers=args.ledgers, logs=args.logs, threads=args.threads, zk=args.zk)
    _print_report(args, report, format_markdown)
    return 0


def _bookkeeper(args: argparse.Namespace) -> int:
    from walkit.bench.bookkeeper import Workload, format_markdown, run_bookkeeper_bench

    workload = Workload(seconds=args.seconds, warmup=args.warmup, in_flight=args.in_flight,
                        read_entries=args.read_entries, tail_samples=args.tail_samples,
                        tail_interval_ms=args.tail_interval_ms, ledgers=args.ledgers)
    report = run_bookkeeper_bench(args.dir, workload)
    _print_report(args, report, format_markdown)
    return 0


_CLUSTER_DIR = "where the cluster keeps its data (default: a temporary one here)"
_CLUSTERS_DIR = "where the clusters keep their data (default: a temporary one here)"
_TABLES = "print JSON instead of tables"


def _options(dir_help: str, *, json_help: str = "print JSON instead of a table",
             seconds: tuple[float, str] | None = None) -> argparse.ArgumentParser:
    """The options every bench takes, for ``parents=``: ``--json`` and ``--dir`` (and,
    for a timed bench, ``--seconds`` with its default and help), each bench with help
    texts of its own."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--json", action="store_true", help=json_help)
    if seconds is not None:
        default, seconds_help = seconds
        options.add_argument("--seconds", type=float, default=default, help=seconds_help)
    options.add_argument("--dir", default=None, help=dir_help)
    return options


def register(subparsers: Subcommands) -> None:
    """``walkit bench`` and its benchmarks."""
    bench = subparsers.subcommands(subparsers.add_parser("bench", help="benchmarks"), dest="what")
    for add in (_add_write_benches, _add_read_benches, _add_gc_recovery_benches, _add_scale_metadata_benches,
                _add_bookkeeper_bench):
        add(bench)


def _add_write_benches(bench: Subcommands) -> None:
    """The parsers of walkit bench journal, bookie, ledger and wal: the write path."""
    bj = bench.add_parser("journal", help="the journal vs. the disk's own floor", parents=[_options(
        "directory on the disk to measure (default: a temporary one here)",
        seconds=(3.0, "duration of each case (default 3)"))])
    bj.set_defaults(func=_journal)
    bb = bench.add_parser("bookie", help="adds per second through one connection to a bookie process", parents=[
        _options("where the bookie keeps its data (default: a temporary one here)",
                 seconds=(5.0, "duration of the measurement (default 5)"))])
    bb.add_argument("--in-flight", type=int, default=1000, help="adds in flight (default 1000)")
    bb.add_argument("--size", type=int, default=1024, help="entry payload bytes (default 1024)")
    bb.set_defaults(func=_bookie)
    bld = bench.add_parser("ledger", help="the ledger client: sequential add latency and pipelined adds per second",
                           parents=[_options(_CLUSTER_DIR,
                                             seconds=(5.0, "duration of each phase, after its warm-up (default 5)"))])
    bld.add_argument("--in-flight", type=int, default=1000, help="adds in flight in the pipelined phase (default 1000)")
    bld.add_argument("--size", type=int, default=1024, help="entry payload bytes (default 1024)")
    bld.add_argument("--bookies", type=int, default=3, help="bookie processes (default 3; the ledger uses 3)")
    bld.set_defaults(func=_ledger)
    bw = bench.add_parser("wal", help="the WriteAheadLog: records/s and append latency vs. a local file and SQLite",
                          parents=[_options("where the cluster and the baselines keep their data "
                                            "(default: a temporary one here)",
                                            seconds=(5.0, "duration of each case, after its warm-up (default 5)"))])
    bw.add_argument("--in-flight", type=int, default=1000, help="appends in flight in the windowed case (default 1000)")
    bw.add_argument("--samples", type=int, default=1000,
                    help="records per tail-visibility case (fewer at 20 ms, to stay under ~15 s; default 1000)")
    bw.set_defaults(func=_wal)


def _add_read_benches(bench: Subcommands) -> None:
    """The parsers of walkit bench read and spark: replay."""
    brd = bench.add_parser("read", help="replay of a log written beforehand (cold and hot, 100 B / 1 KiB records, "
                           "batched and one record per entry), a ledger's entries read back (in runs and entry by "
                           "entry) and tail visibility", parents=[_options(_CLUSTER_DIR, json_help=_TABLES)])
    brd.add_argument("--gib", type=float, default=1.0, help="GiB in each batched log (default 1)")
    brd.add_argument("--one-per-entry", type=int, default=100_000,
                     help="1 KiB records, an entry each, for the per-entry replay (default 100,000)")
    brd.add_argument("--ledger-entries", type=int, default=100_000,
                     help="1 KiB entries of the ledger read back (default 100,000); the ledgers written among others"
                          " get half as many each")
    brd.add_argument("--samples", type=int, default=2000,
                     help="records per tail-visibility case, fewer at slow rates (default 2,000)")
    brd.set_defaults(func=_read)
    bsp = bench.add_parser("spark", help="records/s read by Spark vs. the WAL's own replay() (walkit[spark])",
                           parents=[_options("where the cluster keeps its data (default: a temporary one)")])
    bsp.add_argument("--records", type=int, default=1_000_000, help="records in the log (default 1,000,000)")
    bsp.add_argument("--size", type=int, default=16, help="record bytes (default 16)")
    bsp.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    bsp.set_defaults(func=_spark)


def _add_gc_recovery_benches(bench: Subcommands) -> None:
    """The parsers of walkit bench gc and recovery."""
    bgc = bench.add_parser("gc", help="GC: scan of up to 1,000,000 ledgers in metadata (time, peak memory) and "
                           "compaction (MB/s rewritten, add latency with and without it)", parents=[_options(
                               "where the stores, storage and clusters live (default: a temporary directory here)",
                               json_help=_TABLES,
                               seconds=(5.0, "writer window without compaction in each compaction case (default 5)"))])
    bgc.add_argument("--part", choices=("all", "scan", "compaction"), default="all", help="what to run (default all)")
    bgc.add_argument("--ledgers", type=int, default=1_000_000, help="ledgers in metadata for the scan; a tenth and "
                     "a hundredth are measured too (default 1,000,000)")
    bgc.add_argument("--zk", default="auto", help="ZooKeeper for the scan: auto (start Debian's package on 127.0.0.1 "
                     "if installed), none, or HOST:PORT of a server to use under a fresh root (default auto)")
    bgc.add_argument("--repeats", type=int, default=3,
                     help="timed scan passes per case, the median reported (default 3)")
    bgc.add_argument("--volume-mib", type=int, default=32,
                     help="MiB written per bookie per compaction case at the default rate (default 32)")
    bgc.add_argument("--unthrottled-volume-mib", type=int, default=128,
                     help="MiB written per bookie per unthrottled compaction case (default 128)")
    bgc.add_argument("--log-mib", type=int, default=8, help="entry log size in MiB (default 8)")
    bgc.set_defaults(func=_gc)
    brc = bench.add_parser("recovery", help="a lost bookie's share put back by walkit recover and by autorecovery: "
                           "MB/s, and a writer's latency meanwhile",
                           parents=[_options(_CLUSTER_DIR,
                                             seconds=(10.0, "duration of each idle window (default 10)"))])
    brc.add_argument("--gib", type=float, default=1.0, help="GiB of data in the closed ledgers (default 1)")
    brc.add_argument("--ledgers", type=int, default=1000, help="closed ledgers holding it (default 1000)")
    brc.add_argument("--entry-size", type=int, default=64 * 1024, help="their entries' bytes (default 65536)")
    brc.add_argument("--session-timeout", type=float, default=10.0,
                     help="the bookies' metadata session timeout: how soon a lost bookie is seen gone (default 10)")
    brc.set_defaults(func=_recovery)


def _add_scale_metadata_benches(bench: Subcommands) -> None:
    """The parsers of walkit bench scale and metadata."""
    bsc = bench.add_parser("scale", help="cost as the data grows: bookie RSS against ledgers and entries stored, "
                           "throughput over 1..10,000 ledgers, a checkpoint against the ledgers it touches, bookie "
                           "restart against GiB stored, recovery against ledger length, WAL failover against segments "
                           "and snapshots", parents=[_options(
                               _CLUSTERS_DIR, json_help=_TABLES,
                               seconds=(20.0, "throughput: duration of each row after a 1 s warm-up, long enough for "
                                              "checkpoints to be part of it (default 20)"))])
    bsc.add_argument("--case", action="append", choices=("memory", "throughput", "checkpoint", "restart", "recovery",
                                                          "wal"),
                     help="run this case only (repeatable; default: all)")
    bsc.add_argument("--ledgers", type=int, default=10_000, help="memory: ledgers stored at the largest point; "
                     "1/10 and 1/100 are measured too (default 10,000; full size 100,000)")
    bsc.add_argument("--entries", type=int, default=1_000_000, help="memory: 100 B entries stored in them "
                     "(default 1,000,000; full size 10,000,000)")
    bsc.add_argument("--concurrent", type=int, default=10_000, help="throughput and checkpoint: most ledgers "
                     "written at once; 1, 100, 1,000 below it are measured too (default 10,000)")
    bsc.add_argument("--in-flight", type=int, default=1000, help="throughput: adds in flight (default 1000)")
    bsc.add_argument("--gib", type=float, default=1.0, help="restart: GiB stored at the largest point; 0, 1/100 "
                     "and 1/10 are measured too (default 1; full size 10)")
    bsc.add_argument("--max-ledger-entries", type=int, default=100_000, help="recovery: length of the longest "
                     "ledger recovered, from 1,000 by tens (default 100,000; full size 10,000,000)")
    bsc.add_argument("--segments", type=int, default=100, help="WAL: segments at the largest point, from 1 by "
                     "tens (default 100; full size 1,000)")
    bsc.add_argument("--snapshots", type=int, default=10, help="WAL: snapshots taken at the largest point, from 0 "
                     "(default 10)")
    bsc.add_argument("--checkpoint-interval", type=float, default=10.0,
                     help="the bookies' flushInterval in seconds (default 10, BookKeeper's)")
    bsc.add_argument("--session-timeout", type=float, default=10.0, help="the bookies' metadata session timeout: "
                     "how long a crashed bookie's registration outlives it (default 10)")
    bsc.set_defaults(func=_scale)
    bmd = bench.add_parser("metadata", help="ledger creates, closes, opens and deletes per second (local:// and "
                           "ZooKeeper, beside the store's own), and WriteAheadLogs opened for writing",
                           parents=[_options(_CLUSTERS_DIR)])
    bmd.add_argument("--ledgers", type=int, default=2000, help="ledgers created, closed, opened and deleted per "
                     "store (default 2,000)")
    bmd.add_argument("--logs", type=int, default=1000, help="WriteAheadLogs opened for writing, then again "
                     "(default 1,000; 0 skips them)")
    bmd.add_argument("--threads", type=int, default=4, help="threads sharing one client (default 4)")
    bmd.add_argument("--zk", default="auto", help="ZooKeeper: auto (start Debian's package on 127.0.0.1 if "
                     "installed), none, or HOST:PORT of a server to use under a fresh root (default auto)")
    bmd.set_defaults(func=_metadata)


def _add_bookkeeper_bench(bench: Subcommands) -> None:
    """The parser of walkit bench bookkeeper."""
    bbk = bench.add_parser("bookkeeper", help="walkit against Apache BookKeeper 4.18.2 (its defaults, and tuned for "
                           "low latency) on this machine: add latency, adds/s, reads, tail visibility, many ledgers "
                           "(needs java, javac and, the first time, mvn)",
                           parents=[_options(_CLUSTERS_DIR,
                                             seconds=(5.0, "duration of each timed phase, after its warm-up "
                                                           "(default 5)"))])
    bbk.add_argument("--warmup", type=float, default=1.0, help="uncounted seconds before each timed phase (default 1)")
    bbk.add_argument("--in-flight", type=int, default=1000, help="adds in flight in the pipelined phases (default 1000)")
    bbk.add_argument("--read-entries", type=int, default=100_000,
                     help="1 KiB entries of the closed ledger read back (default 100,000)")
    bbk.add_argument("--tail-samples", type=int, default=500, help="entries timed by the tailing reader (default 500)")
    bbk.add_argument("--tail-interval-ms", type=int, default=10,
                     help="milliseconds between the tail's adds (default 10)")
    bbk.add_argument("--ledgers", type=int, default=1000, help="ledgers created and written at once (default 1000)")
    bbk.set_defaults(func=_bookkeeper)
