"""The layers' arrows (docs/architecture.md "Layers"): the layers above the ledger
client - walkit.wal, walkit.aio, walkit.spark - import from ``walkit.client`` itself,
never from its private modules, so the client can rearrange its insides without
breaking them; the same holds of ``walkit.wal`` for the layers above it (aio, spark) and
of ``walkit.metadata`` and ``walkit.protocol`` for the client's side (client, recovery,
wal, aio, spark) and the bookie; and nothing below the client imports the layers above it, but for the
two documented exceptions (``ALLOWED``): a source bookie pushes re-replicated copies
with a BookieClient, and a bookie may run the autorecovery daemon."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ABOVE = ["walkit/wal", "walkit/aio.py", "walkit/spark"]
BELOW = {"walkit/client": ("walkit.wal", "walkit.aio", "walkit.spark", "walkit.cli", "walkit.bench"),
         "walkit/metadata": ("walkit.client", "walkit.wal", "walkit.aio", "walkit.spark", "walkit.cli"),
         "walkit/protocol": ("walkit.client", "walkit.wal", "walkit.metadata", "bookie"),
         "bookie": ("walkit.client", "walkit.recovery", "walkit.wal", "walkit.aio", "walkit.spark", "walkit.cli",
                    "walkit.bench")}
ALLOWED = {("bookie/_replicate.py", "walkit.client"), ("bookie/server/_startup.py", "walkit.recovery")}
#: a package, and the layers that import it by its public name only
PUBLIC_ONLY = {"walkit.client": ABOVE,
               "walkit.wal": ["walkit/aio.py", "walkit/spark"],
               "walkit.metadata": ["walkit/client", "walkit/recovery", *ABOVE, "bookie"],
               "walkit.protocol": ["walkit/client", "walkit/recovery", *ABOVE, "bookie"]}


def _sources(*where: str) -> list[Path]:
    found: list[Path] = []
    for part in where:
        path = ROOT / part
        found += [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))
    assert found, f"no sources under {where}"
    return found


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, at any depth (those inside functions too)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names
                      if node.module == "walkit.client"]
    return found


@pytest.mark.parametrize("package", sorted(PUBLIC_ONLY))
def test_the_layers_above_a_package_use_its_public_api_only(package: str) -> None:
    private = [f"{path.relative_to(ROOT)}:{line}: {module}" for path in _sources(*PUBLIC_ONLY[package])
               for line, module in _imports(path) if module.startswith(package + "._")]
    assert not private, f"import these from {package} (export them there):\n" + "\n".join(private)


@pytest.mark.parametrize("layer", sorted(BELOW))
def test_arrows_point_down(layer: str) -> None:
    upward = [f"{path.relative_to(ROOT)}:{line}: {module}" for path in _sources(layer)
              for line, module in _imports(path)
              if any((module == up or module.startswith(up + "."))
                     and (str(path.relative_to(ROOT)), up) not in ALLOWED for up in BELOW[layer])]
    assert not upward, f"{layer} imports a layer above it:\n" + "\n".join(upward)
