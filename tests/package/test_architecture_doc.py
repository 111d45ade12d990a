"""docs/architecture.md stays true to the tree it describes.

1. Its "Layers" block names every module of ``walkit/`` and ``bookie/``. The block's
   convention: a *heading* is a line that starts (column 0) with a directory of the
   repository ending in ``/`` (``walkit/wal/``, ``bookie/``); every line under it that
   starts with indentation and a file name ending in ``.py`` (``    _writer.py   job``)
   names the file of that directory. A directory may head several layers. Every other
   line (layer titles, arrows, the naming note) is ignored.
2. Every backticked path ending in ``.py`` with a ``/`` in it (``bookie/_faults.py``)
   names a file that exists: the prose and the guarantees table point at real code.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("walkit", "bookie")

_HEADING = re.compile(r"^((?:walkit|bookie)/(?:[\w.]+/)*)(?:\s|$)")
_MODULE = re.compile(r"^\s+([\w.]+\.py)(?:\s|$)")
_PATH = re.compile(r"`([\w./-]*/[\w.-]+\.py)`")


def layers_block(text: str) -> str:
    """The fenced block right under the "## Layers" heading."""
    match = re.search(r"^## Layers[^\n]*\n+```\n(.*?)^```", text, flags=re.S | re.M)
    assert match, "docs/architecture.md has no fenced block under its '## Layers' heading"
    return match.group(1)


def named_modules(block: str) -> tuple[set[str], list[str]]:
    """The repository paths the block names, and its lines that break the convention
    (a module line before any heading)."""
    named: set[str] = set()
    broken: list[str] = []
    heading: str | None = None
    for line in block.splitlines():
        if found := _HEADING.match(line):
            heading = found.group(1)
        elif found := _MODULE.match(line):
            if heading is None:
                broken.append(line)
            else:
                named.add(heading + found.group(1))
    return named, broken


def repository_modules() -> set[str]:
    return {path.relative_to(ROOT).as_posix() for package in PACKAGES for path in (ROOT / package).rglob("*.py")}


def missing_paths(text: str) -> list[str]:
    """Backticked ``dir/file.py`` paths of ``text`` that do not exist, with their line."""
    missing: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        missing += [f"line {number}: {path}" for path in _PATH.findall(line) if not (ROOT / path).is_file()]
    return missing


def test_the_layers_block_names_every_module() -> None:
    named, broken = named_modules(layers_block(DOC.read_text()))
    assert not broken, "module lines before any directory heading:\n" + "\n".join(broken)
    unnamed = sorted(repository_modules() - named)
    assert not unnamed, ("docs/architecture.md's Layers block does not name these modules (add a line "
                         "'    <file>.py   <its job>' under its directory's heading):\n" + "\n".join(unnamed))
    gone = sorted(name for name in named if not (ROOT / name).is_file())
    assert not gone, "the Layers block names modules that do not exist:\n" + "\n".join(gone)


def test_every_backticked_path_exists() -> None:
    missing = missing_paths(DOC.read_text())
    assert not missing, "docs/architecture.md names files that do not exist:\n" + "\n".join(missing)


def test_the_checks_catch_what_they_are_for() -> None:
    """A block missing a module, a stray module line and a dead path are all seen."""
    text = DOC.read_text()
    block = layers_block(text)
    named, _ = named_modules(block)
    assert "walkit/wal/_writer.py" in named and "bookie/_bookie.py" in named
    without = "\n".join(line for line in block.splitlines() if not re.match(r"\s+_writer\.py\s", line))
    fewer, _ = named_modules(without)
    assert {"walkit/wal/_writer.py", "bookie/journal/_writer.py", "walkit/client/_writer.py"} <= named - fewer
    assert named_modules("    orphan.py   no heading\n")[1] == ["    orphan.py   no heading"]
    assert missing_paths("see `bookie/server.py` and `bookie/_faults.py`") == ["line 1: bookie/server.py"]
