"""``walkit init``: the cluster layout in the metadata store.

``--format walkit`` (the default) makes walkit's own records; ``--format bookkeeper``
makes exactly what Apache BookKeeper 4.18's ``initnewcluster`` makes (its LAYOUT and
INSTANCEID, ``available/``), so Java bookies and clients use the cluster as their own;
the URI's scheme names the ledger manager (``zk+flat://``, ``zk+longhierarchical://``;
hierarchical by default).
"""

from __future__ import annotations

import argparse

from walkit.cli._commands import Subcommands
from walkit.cli._metadata import add_metadata_option


def _init(args: argparse.Namespace) -> int:
    from walkit.metadata import init_cluster, open_metadata_store, parse_metadata_uri

    uri = parse_metadata_uri(args.metadata)
    store = open_metadata_store(uri, create=True)  # the one command that makes a store
    try:
        info = init_cluster(store, uri.root, uri.layout, format=args.format)
    finally:
        store.close()
    print(f"cluster {info.instance_id} at {args.metadata} (format: {info.format}, ledger layout: {info.layout})")
    return 0


def register(subparsers: Subcommands) -> None:
    """``walkit init``."""
    init = subparsers.add_parser("init", help="create the cluster layout in the metadata store (idempotent)")
    add_metadata_option(init)
    init.add_argument("--format", choices=("walkit", "bookkeeper"), default="walkit",
                      help="whose records the cluster keeps: walkit's own (default) or Apache BookKeeper 4.18's, "
                           "so Java bookies and clients share it")
    init.set_defaults(func=_init)
