"""The house's measures (issue 36; docs/architecture.md "Layers"), read from the code's
syntax trees, beside the arrows of test_layers.py:

- size: no module over 600 lines, no class over 400, no function over 60 in walkit/ and
  bookie/ (bench/ and cli/ included) - a room that grows past these has taken a second
  job, and is split along its seam;
- circles: no import circle among walkit/ and bookie/ modules, counting every import
  (``TYPE_CHECKING`` blocks and imports inside functions too): a collaborator that
  needs part of another takes a narrow view of it, not the module;
- privacy: the layers above the client (wal, aio, spark, recovery, cli, bench, demo,
  examples) read no other module's private names - neither ``thing._name`` on anything
  but ``self``/``cls``, nor ``from m import _name``, nor a private module of a package
  they are not inside (``walkit._files`` is walkit's own: anything under walkit/ may
  import it; ``bookie._main`` is not walkit.cli's).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("walkit", "bookie")
MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 600, 400, 60
UPPER = ("walkit/wal", "walkit/aio.py", "walkit/spark", "walkit/recovery", "walkit/cli", "walkit/bench",
         "walkit/demo.py", "walkit/examples")


def _sources(*where: str) -> list[Path]:
    found: list[Path] = []
    for part in where:
        path = ROOT / part
        found += [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))
    return [path for path in found if path.exists()]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _span(node: ast.AST) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1  # type: ignore[attr-defined]


def test_no_room_is_too_large() -> None:
    large: list[str] = []
    for path in _sources(*PACKAGES):
        text = path.read_text()
        where = path.relative_to(ROOT)
        if (lines := len(text.splitlines())) > MAX_MODULE:
            large.append(f"{where}: module of {lines} lines (> {MAX_MODULE})")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.ClassDef) and _span(node) > MAX_CLASS:
                large.append(f"{where}:{node.lineno}: class {node.name} of {_span(node)} lines (> {MAX_CLASS})")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _span(node) > MAX_FUNCTION:
                large.append(f"{where}:{node.lineno}: {node.name}() of {_span(node)} lines (> {MAX_FUNCTION})")
    assert not large, "split these along their seams:\n" + "\n".join(large)


def _imported(path: Path, name: str, known: dict[str, Path]) -> Iterator[str]:
    """The walkit/bookie modules ``path`` (module ``name``) imports, at any depth."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # ``from pkg import sub`` imports the submodule; ``from pkg import name`` the package
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_circles() -> None:
    known = {_module_name(path): path for path in _sources(*PACKAGES)}
    graph = {name: set(_imported(path, name, known)) for name, path in known.items()}
    circles = _circles(graph)
    assert not circles, "import circles (give the collaborator a narrow view):\n" + "\n".join(
        " <-> ".join(circle) for circle in circles)


def test_a_circle_is_found() -> None:
    """The search itself: a circle of three and a self-contained pair."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_reads(path: Path) -> Iterator[str]:
    where = path.relative_to(ROOT)
    inside = list(where.with_suffix("").parts[:-1])  # the packages this module is inside
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            yield f"{where}:{node.lineno}: {ast.unparse(owner)}.{node.attr}"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    continue  # relative imports stay inside their package
                modules = [node.module or ""]
                module_path = ROOT.joinpath(*modules[0].split("."))
                for alias in node.names:
                    submodule = module_path / alias.name
                    is_module = submodule.with_suffix(".py").exists() or submodule.is_dir()
                    if _private(alias.name) and not (is_module and modules[0].split(".") == inside):
                        yield f"{where}:{node.lineno}: from {node.module} import {alias.name}"
            else:
                modules = [alias.name for alias in node.names]
            for module in modules:
                parts = module.split(".")
                for i, part in enumerate(parts):
                    if _private(part) and inside[:i] != parts[:i]:
                        yield f"{where}:{node.lineno}: {module} is private to {'.'.join(parts[:i])}"
                        break


def test_the_upper_layers_read_no_private_names() -> None:
    reads = [read for path in _sources(*UPPER) for read in _private_reads(path)]
    assert not reads, "give these a public name in their own room:\n" + "\n".join(reads)


def test_no_two_test_modules_share_a_name() -> None:
    """pytest imports each test module by its file name (the folders of tests/ are not
    packages): two files of one name in two folders stop the whole collection ("import
    file mismatch"), which only a run of the whole suite shows."""
    seen: dict[str, Path] = {}
    twins: list[str] = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name in seen:
            twins.append(f"{seen[path.name].relative_to(ROOT)} and {path.relative_to(ROOT)}")
        seen.setdefault(path.name, path)
    assert not twins, "test modules with one name: " + "; ".join(twins)


_MARKERS = ("<<<<<<< ", ">>>>>>> ", "||||||| ")  # a merge's conflict, left in a file
_TEXT = {".py", ".md", ".c", ".h", ".toml", ".cfg", ".txt", ".java", ".sh", ".ini", ".yml", ".yaml"}


def _conflict_lines(text: str) -> list[int]:
    """The numbers of the lines that open, split or close a merge conflict (git's markers,
    seven characters and a space, at the start of a line)."""
    return [n for n, line in enumerate(text.splitlines(), 1) if line.startswith(_MARKERS)]


def test_no_merge_conflict_is_left_in_a_file() -> None:
    """A conflict resolved by committing both sides with git's markers between them (it
    happened once, in docs/architecture.md's layers block) is caught here rather than by
    a reader."""
    assert _conflict_lines("a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> topic\n") == [2, 6]
    assert _conflict_lines("=======  ====\n>>> 1 + 1\n<<<<<<<\n") == []  # rst tables, doctests
    found: list[str] = []
    for part in ("README.md", "docs", "walkit", "bookie", "native", "tests", "setup.py", "pyproject.toml", ".ci"):
        path = ROOT / part
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in _TEXT or
                                                     (p.parent.name == ".ci" and p.is_file()))
        for file in files:
            found += [f"{file.relative_to(ROOT)}:{n}" for n in _conflict_lines(file.read_text(errors="replace"))]
    assert not found, "merge conflict markers: " + ", ".join(found)
