"""``--metadata URI``, as every command that uses a cluster takes it.

Every parser adds the option through :func:`add_metadata_option`, so the help text and
the fallback are the same everywhere: when the option is not given, ``$WALKIT_METADATA``
is used (:func:`resolve_metadata`, run once by :func:`walkit.cli.main` after parsing:
read when the command runs, not when the parser is built). A command that needs a
cluster and has neither stops with its own usage error (exit status 2) naming both.
"""

from __future__ import annotations

import argparse
import os

__all__ = ["ENV", "URI_HELP", "add_metadata_option", "resolve_metadata"]

ENV = "WALKIT_METADATA"
URI_HELP = "metadata service URI: zk://host:port/ledgers or local:///dir"

_NEEDED_BY = "metadata_needed_by"  # the parser whose command needs a URI (for its usage error)


def add_metadata_option(p: argparse.ArgumentParser, *, required: bool = True, help: str = URI_HELP) -> None:
    """``--metadata URI`` on ``p``; ``required``: the command cannot run without one."""
    p.add_argument("--metadata", metavar="URI", default=None, help=f"{help} (default: ${ENV})")
    p.set_defaults(**{_NEEDED_BY: p if required else None})


def resolve_metadata(args: argparse.Namespace) -> None:
    """``args.metadata`` from ``$WALKIT_METADATA`` when the option was not given (an
    empty variable is no URI); the command's usage error when it needs one and has none."""
    needed_by = vars(args).pop(_NEEDED_BY, None)
    if getattr(args, "metadata", "") is None:
        args.metadata = os.environ.get(ENV) or None
    if needed_by is not None and args.metadata is None:
        needed_by.error(f"give --metadata URI or set {ENV}")
