"""``walkit export``: a log to Parquet by segment with Spark (walkit[spark])."""

from __future__ import annotations

import argparse
import json

from walkit.cli._commands import Subcommands
from walkit.cli._metadata import add_metadata_option


def _export(args: argparse.Namespace) -> int:
    from walkit.spark import export_log, spark_session
    from walkit.wal import LSN

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


def register(subparsers: Subcommands) -> None:
    """``walkit export``."""
    export = subparsers.add_parser("export", help="archive a log to Parquet by segment with Spark, resumably "
                                   "(walkit[spark])")
    export.add_argument("--log", required=True, help="the log's name")
    export.add_argument("--to", required=True, help="the export directory (Parquet files and _walkit_export.json)")
    export.add_argument("--after", default=None, help="export the records after this LSN (segment/entry/slot) "
                        "instead of after the last one exported")
    export.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    add_metadata_option(export)
    export.add_argument("--namespace", default="default", help="the log's namespace (default: default)")
    export.add_argument("--password", default="", help="the log's ledger password")
    export.add_argument("--json", action="store_true", help="print the result as JSON")
    export.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    export.set_defaults(func=_export)
