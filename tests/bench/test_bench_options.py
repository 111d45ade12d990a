"""The option strings each ``walkit bench X`` accepts, written down from the parsers as they were before
issue 36 reshaped them (and ``bookkeeper``'s as issue 38 made it): a shared option set must not add, drop or
rename a flag."""

from __future__ import annotations

import argparse

import pytest

from walkit.cli import _bench
from walkit.cli._commands import Subcommands

EXPECTED: dict[str, list[str]] = {
    "journal": ["--dir", "--help", "--json", "--seconds", "-h"],
    "bookie": ["--dir", "--help", "--in-flight", "--json", "--seconds", "--size", "-h"],
    "ledger": ["--bookies", "--dir", "--help", "--in-flight", "--json", "--seconds", "--size", "-h"],
    "wal": ["--dir", "--help", "--in-flight", "--json", "--samples", "--seconds", "-h"],
    "read": ["--dir", "--gib", "--help", "--json", "--ledger-entries", "--one-per-entry", "--samples", "-h"],
    "spark": ["--dir", "--help", "--json", "--master", "--records", "--size", "-h"],
    "gc": ["--dir", "--help", "--json", "--ledgers", "--log-mib", "--part", "--repeats", "--seconds",
           "--unthrottled-volume-mib", "--volume-mib", "--zk", "-h"],
    "recovery": ["--dir", "--entry-size", "--gib", "--help", "--json", "--ledgers", "--seconds",
                 "--session-timeout", "-h"],
    "scale": ["--case", "--checkpoint-interval", "--concurrent", "--dir", "--entries", "--gib", "--help",
              "--in-flight", "--json", "--ledgers", "--max-ledger-entries", "--seconds", "--segments",
              "--session-timeout", "--snapshots", "-h"],
    "metadata": ["--dir", "--help", "--json", "--ledgers", "--logs", "--threads", "--zk", "-h"],
    # issue 38: walkit against Apache BookKeeper 4.18.2
    "bookkeeper": ["--dir", "--help", "--in-flight", "--json", "--ledgers", "--read-entries", "--seconds",
                   "--tail-interval-ms", "--tail-samples", "--warmup", "-h"],
}


def _bench_parsers() -> dict[str, argparse.ArgumentParser]:
    root = argparse.ArgumentParser()
    _bench.register(Subcommands(root, dest="command"))
    (bench,) = [a for a in root._actions if isinstance(a, argparse._SubParsersAction)]
    (what,) = [a for a in bench.choices["bench"]._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(what.choices)


def test_every_bench_is_listed() -> None:
    assert sorted(_bench_parsers()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_option_strings_unchanged(name: str) -> None:
    parser = _bench_parsers()[name]
    assert sorted(o for action in parser._actions for o in action.option_strings) == EXPECTED[name]
