"""``walkit init``: the cluster layout in the metadata store."""

from __future__ import annotations

import argparse

from walkit.cli._commands import Subcommands
from walkit.cli._metadata import add_metadata_option


def _init(args: argparse.Namespace) -> int:
    from walkit.metadata import init_cluster, open_metadata_store, parse_metadata_uri

    uri = parse_metadata_uri(args.metadata)
    store = open_metadata_store(uri, create=True)  # the one command that makes a store
    try:
        info = init_cluster(store, uri.root, uri.layout)
    finally:
        store.close()
    print(f"cluster {info.instance_id} at {args.metadata} (ledger layout: {info.layout})")
    return 0


def register(subparsers: Subcommands) -> None:
    """``walkit init``."""
    init = subparsers.add_parser("init", help="create the cluster layout in the metadata store (idempotent)")
    add_metadata_option(init)
    init.set_defaults(func=_init)
