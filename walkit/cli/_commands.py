"""The tree of ``walkit`` sub-commands, as the command modules add to it.

Theory of operation
-------------------
Each command module's ``register`` is given a :class:`Subcommands`: the sub-commands of
one command (at the top, ``walkit`` itself). ``add_parser`` adds one, as argparse's
sub-parsers action does (it is one underneath); ``subcommands(parser, dest)`` gives the
sub-commands of a command added that way (``walkit bookie`` -> ``start``, ``list``, ...).

Every parser made through the tree, at any depth, is remembered in the order it was made
(:attr:`Subcommands.parsers`, shared by the whole tree): :func:`walkit.cli.main` adds the
logging options to each of them once all are made, without reaching into argparse's
private attributes to find them. A parser made some other way is not in the list, so
every sub-command must be added through a :class:`Subcommands`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

__all__ = ["Subcommands"]


class Subcommands:
    """The sub-commands of ``parser`` (its ``dest`` names the one chosen; one is
    required); ``parsers``: every parser of the tree, shared with the tree's other
    :class:`Subcommands` (a new list at the top)."""

    def __init__(self, parser: argparse.ArgumentParser, dest: str,
                 parsers: list[argparse.ArgumentParser] | None = None) -> None:
        self._action = parser.add_subparsers(dest=dest, required=True)
        self.parsers: list[argparse.ArgumentParser] = [] if parsers is None else parsers

    def add_parser(self, name: str, *, help: str | None = None,
                   parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
        """A new sub-command ``name`` (``help``: its line in the parent's help;
        ``parents``: parsers whose options it takes, as argparse's ``parents=``)."""
        parser = self._action.add_parser(name, help=help, parents=parents)
        self.parsers.append(parser)
        return parser

    def subcommands(self, parser: argparse.ArgumentParser, dest: str) -> Subcommands:
        """The sub-commands of ``parser``, a command of this tree."""
        return Subcommands(parser, dest, self.parsers)
