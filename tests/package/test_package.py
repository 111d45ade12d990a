"""walkit works once installed: built as a user builds it, installed as a user installs it.

What this proves
----------------
* ``python -m build`` makes an sdist, and a wheel from that sdist, without a single
  deprecation warning; the sdist holds everything the wheel needs (the wheel built from
  it equals the wheel built from the tree) and the wheel holds every module of
  ``walkit/`` and ``bookie/`` (a subpackage missing from the package list would fail
  here), the C extensions (the I/O shim, the frame packing), ``py.typed``, and is tagged
  ``cp311-abi3``.
* That wheel, installed into a fresh virtualenv (dependencies from the package index)
  of CPython 3.11 and of every newer CPython on the machine, gives a working ``walkit``
  command - ``walkit demo --seconds 3`` passes away from any checkout, its example being
  part of the package - an importable ``walkit`` and ``bookie``, ``python -m bookie``,
  and the native I/O backend.
* With a compiler that fails (``CC=false``) the build still succeeds, prints exactly one
  warning more than a normal build (walkit's), and installs a working walkit on the
  pure-Python backend; ``WALKIT_NATIVE=require`` makes the same build fail instead.

The builds run on a copy of the checkout (without what .gitignore ignores), so nothing is
written into it; everything lives in one temporary directory, removed at the end. The
default run takes under a minute; ``WALKIT_SLOW=1`` (or ``-m slow``) adds ``pip install
<checkout>``, an editable install with and one without a compiler (what ``./dev`` does),
each into a fresh virtualenv and running the demo, and the demo on the pure-Python install
of the wheel.
"""

from __future__ import annotations

import collections
import dataclasses
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("walkit", "bookie")
FALLBACK_WARNING = "WARNING: walkit's C extensions (bookie._native, bookie._frames) were not built"
# The environment a user's shell would have: no checkout on the path, no backend forced.
_DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "WALKIT_NATIVE")
_SMOKE = """
import importlib.util, json, sys
import bookie, bookie.native, walkit, walkit.examples.kvstore, walkit.recovery
print(json.dumps({"prefix": sys.prefix, "walkit": walkit.__file__, "bookie": bookie.__file__,
                  "backend": bookie.native.BACKEND, "frames": importlib.util.find_spec("bookie._frames") is not None}))
"""


def slow_selected(config: pytest.Config) -> bool:
    """The long forms run with WALKIT_SLOW=1 or ``-m slow`` (as tests/cluster/test_gc_cluster.py)."""
    expr = str(config.getoption("markexpr") or "")
    return bool(os.environ.get("WALKIT_SLOW")) or ("slow" in expr and "not slow" not in expr)


# -- interpreters ------------------------------------------------------------------------------

def _probe(exe: str) -> str | None:
    """``"3.N"`` if ``exe`` is a CPython that can make virtualenvs, else None (a pyenv shim
    for a version that is not selected fails here)."""
    code = "import ensurepip, sys, venv; print(sys.implementation.name, '%d.%d' % sys.version_info[:2])"
    try:
        proc = subprocess.run([exe, "-c", code], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    name, _, version = proc.stdout.strip().partition(" ")
    return version if proc.returncode == 0 and name == "cpython" else None


def cpythons() -> dict[str, str]:
    """``"3.N"`` -> an interpreter, oldest first, for CPython 3.11 and every newer one found:
    ``python3.N`` on PATH, else a pyenv install of it."""
    versions = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found: dict[str, str] = {}
    for minor in range(11, 20):
        name = f"python3.{minor}"
        candidates = [shutil.which(name), *sorted(str(p) for p in versions.glob(f"3.{minor}.*/bin/{name}"))]
        exe = next((c for c in candidates if c and _probe(c) == f"3.{minor}"), None)
        if exe is not None:
            found[f"3.{minor}"] = exe
    return found


CPYTHONS = cpythons()


# -- running things ----------------------------------------------------------------------------

def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


def run(args: list[str], cwd: Path, *, timeout: float = 180, check: bool = True,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``args`` (``env`` added to the environment) with stdout and stderr merged; with
    ``check``, fail the test on a non-zero exit."""
    proc = subprocess.run(args, cwd=cwd, env=_env(**(env or {})), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-6000:]}"
    return proc


def _gitignored(root: Path) -> Callable[[str, list[str]], set[str]]:
    """A ``copytree`` ignore for the patterns of ``root/.gitignore`` (and ``.git``):
    unanchored ones anywhere, ``/anchored`` ones at the top only."""
    gitignore = root / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.is_file() else []
    patterns = [p for p in (line.strip().rstrip("/") for line in lines) if p and not p.startswith("#")] + [".git"]

    def ignore(directory: str, names: list[str]) -> set[str]:
        top = Path(directory) == root
        return {n for n in names for p in patterns
                if (not p.startswith("/") and fnmatch.fnmatch(n, p)) or (top and p.startswith("/")
                                                                            and fnmatch.fnmatch(n, p[1:]))}

    return ignore


def checkout_copy(dest: Path) -> Path:
    """A copy of the checkout as a fresh clone plus local edits would be (nothing ignored)."""
    shutil.copytree(ROOT, dest, ignore=_gitignored(ROOT))
    return dest


def build(src: Path, outdir: Path, *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m build`` (isolated, as a user runs it) with every warning shown."""
    return run([sys.executable, "-m", "build", "--outdir", str(outdir), *args, str(src)], cwd=src, check=check,
               env={"PYTHONWARNINGS": "always", **env})


def venv(python: str, where: Path, *install: str, **env: str) -> Path:
    """A fresh virtualenv of ``python`` at ``where`` with ``pip install *install``; its bin/."""
    run([python, "-m", "venv", str(where)], cwd=where.parent)
    run([str(where / "bin" / "python"), "-m", "pip", "install", "-q", *install], cwd=where.parent, timeout=600,
        env=env)
    return where / "bin"


def smoke(bin_dir: Path, cwd: Path, backend: str, home: Path | None = None) -> None:
    """walkit and bookie import from ``home`` (default: the virtualenv's site-packages), on
    ``backend``; ``python -m bookie`` and the ``walkit`` command answer."""
    proc = run([str(bin_dir / "python"), "-c", _SMOKE], cwd=cwd)
    seen = json.loads(proc.stdout.splitlines()[-1])
    home = home or Path(seen["prefix"])
    assert Path(seen["walkit"]).is_relative_to(home) and Path(seen["bookie"]).is_relative_to(home), seen
    assert seen["backend"] == backend, seen
    assert seen["frames"] == (backend == "native"), f"bookie._frames is built with the shim or not at all: {seen}"
    assert "usage" in run([str(bin_dir / "python"), "-m", "bookie", "--help"], cwd=cwd).stdout
    assert "demo" in run([str(bin_dir / "walkit"), "--help"], cwd=cwd).stdout


def demo(bin_dir: Path, cwd: Path) -> dict[str, object]:
    """``walkit demo --seconds 3`` from the virtualenv's console script: every check passes."""
    proc = subprocess.run([str(bin_dir / "walkit"), "demo", "--seconds", "3", "--json", "--no-progress", "--data",
                           str(cwd / "demo-data")], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    report: dict[str, object] = json.loads(proc.stdout)
    assert report["pass"], report
    return report


# -- the builds (once per module) --------------------------------------------------------------

@dataclasses.dataclass
class Builds:
    work: Path
    sdist: Path
    wheel: Path  # built from the sdist: what a user installs
    tree_wheel: Path  # built from the checkout directly
    nocc_wheel: Path  # built from the checkout with CC=false
    logs: dict[str, str]  # "sdist+wheel", "tree", "nocc", "require": each build's output


def _one(directory: Path, pattern: str) -> Path:
    found = sorted(directory.glob(pattern))
    assert len(found) == 1, (directory, pattern, found)
    return found[0]


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="walkit-package-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def builds(work: Path) -> Builds:
    logs = {
        "sdist+wheel": build(checkout_copy(work / "src"), work / "dist").stdout,
        "tree": build(checkout_copy(work / "src-tree"), work / "tree", "--wheel").stdout,
        "nocc": build(checkout_copy(work / "src-nocc"), work / "nocc", "--wheel", CC="false").stdout,
    }
    required = build(checkout_copy(work / "src-require"), work / "require", "--wheel", check=False, CC="false",
                     WALKIT_NATIVE="require")
    assert required.returncode != 0, "WALKIT_NATIVE=require: a failing compiler must fail the build"
    logs["require"] = required.stdout
    return Builds(work, _one(work / "dist", "*.tar.gz"), _one(work / "dist", "*.whl"),
                  _one(work / "tree", "*.whl"), _one(work / "nocc", "*.whl"), logs)


def workdir(parent: Path, name: str) -> Path:
    """A new directory under the module's temporary one (not tmp_path, which pytest keeps:
    the demo's cluster data goes here)."""
    directory = parent / name
    directory.mkdir()
    return directory


def _names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


# -- the tests ---------------------------------------------------------------------------------

def test_builds_print_no_deprecation_warning(builds: Builds) -> None:
    for name, log in builds.logs.items():
        assert "deprecat" not in log.lower(), f"{name} build:\n{log}"


def test_wheel_holds_every_module_the_shim_and_the_stable_abi_tag(builds: Builds) -> None:
    src = builds.work / "src"
    modules = {p.relative_to(src).as_posix() for package in PACKAGES for p in (src / package).rglob("*.py")}
    names = _names(builds.wheel)
    assert modules - names == set(), "modules missing from the wheel (a package without __init__.py?)"
    assert {"bookie/_native.abi3.so", "bookie/_frames.abi3.so", "walkit/py.typed", "bookie/py.typed"} <= names
    assert "walkit/examples/kvstore.py" in names  # what walkit demo runs
    assert "walkit/bench/java/BenchPeer.java" in names  # what walkit bench bookkeeper compiles
    assert "-cp311-abi3-" in builds.wheel.name  # one wheel for CPython 3.11 and newer


def test_sdist_holds_what_the_wheel_needs(builds: Builds) -> None:
    with tarfile.open(builds.sdist) as tf:
        names = {n.partition("/")[2] for n in tf.getnames()}
    assert {"setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "native/build.py",
            "native/walkit_native.c", "native/walkit_native.h", "native/walkit_frames.c", "native/walkit_wire.c",
            "native/walkit_wire.h"} <= names
    assert not [n for n in names if n.endswith((".so", ".o", ".pyc"))]
    assert _names(builds.wheel) == _names(builds.tree_wheel)  # the sdist lost nothing


@pytest.mark.parametrize("version", list(CPYTHONS))
def test_installed_wheel_runs_the_demo(builds: Builds, version: str, request: pytest.FixtureRequest) -> None:
    """Every CPython found installs the wheel and imports it on the native backend; the
    oldest and the newest also run the whole demo (~45 s each), the ones between only
    with ``-m slow`` or WALKIT_SLOW (the CI's bound)."""
    bin_dir = venv(CPYTHONS[version], builds.work / f"venv-{version}", str(builds.wheel))
    cwd = workdir(builds.work, f"run-{version}")
    smoke(bin_dir, cwd, backend="native")
    if version not in (min(CPYTHONS, key=_minor), max(CPYTHONS, key=_minor)) and not slow_selected(request.config):
        return
    report = demo(bin_dir, cwd)
    assert report["bookies"] == 3


def _minor(version: str) -> int:
    return int(version.split(".")[1])


def test_without_a_compiler_one_warning_and_the_python_backend(builds: Builds,
                                                               request: pytest.FixtureRequest) -> None:
    def warnings(log: str) -> collections.Counter[str]:
        return collections.Counter(line for line in log.splitlines() if "warning" in line.lower())

    added = warnings(builds.logs["nocc"]) - warnings(builds.logs["tree"])
    assert sum(added.values()) == 1 and next(iter(added)).startswith(FALLBACK_WARNING), builds.logs["nocc"]
    assert not [name for name in _names(builds.nocc_wheel) if name.startswith(("bookie/_native", "bookie/_frames"))]
    assert FALLBACK_WARNING not in builds.logs["require"]
    bin_dir = venv(sys.executable, builds.work / "venv-nocc", str(builds.nocc_wheel))
    cwd = workdir(builds.work, "run-nocc")
    smoke(bin_dir, cwd, backend="python")
    if slow_selected(request.config):
        demo(bin_dir, cwd)


@pytest.mark.slow
@pytest.mark.parametrize(("editable", "compiler"), [(False, True), (True, True), (True, False)],
                         ids=["pip-install-checkout", "editable", "editable-without-compiler"])
def test_pip_install_of_the_checkout(work: Path, editable: bool, compiler: bool,
                                     request: pytest.FixtureRequest) -> None:
    if not slow_selected(request.config):
        pytest.skip("long form: set WALKIT_SLOW=1 or select -m slow")
    name = f"{'editable' if editable else 'install'}-{'cc' if compiler else 'nocc'}"
    src = checkout_copy(work / f"src-{name}")
    install = ["-e", str(src)] if editable else [str(src)]
    bin_dir = venv(sys.executable, work / f"venv-{name}", *install, **({} if compiler else {"CC": "false"}))
    cwd = workdir(work, f"run-{name}")
    smoke(bin_dir, cwd, backend="native" if compiler else "python", home=src if editable else None)
    demo(bin_dir, cwd)
