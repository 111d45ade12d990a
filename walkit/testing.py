"""``walkit.testing``: a pytest plugin for the tests of applications built on walkit.

Installed with walkit and loaded by pytest through the ``pytest11`` entry point
(``walkit = "walkit.testing"``); nothing to import. It provides:

``walkit_cluster``
    A :class:`FaultyCluster`: an in-process :class:`walkit.LocalCluster` in the test's
    temporary directory (4 bookies, embedded ``local://`` metadata, 2 s sessions) with
    fault injection - ``kill_bookie``, ``restart_bookie``, ``set_read_only``,
    ``partition`` / ``heal``, ``slow_disk``, ``corrupt_entry``, ``expire_session``.
    Stopped after the test, with the clients made by its ``client()``. Four bookies, not
    three: a ledger or a ``WriteAheadLog`` with the default ensemble (E=3 Qw=3 Qa=2)
    keeps writing after ``kill_bookie`` only if a bookie outside its ensemble can
    replace the lost one.
``walkit_zk_cluster``
    The same with its metadata in ZooKeeper (a fresh cluster root per test).
``walkit_zookeeper``
    The session's ZooKeeper: Debian's ``zookeeper`` package (installed with apt-get when
    missing and run as root), one standalone server on 127.0.0.1; its connect string.
    Override this fixture in a ``conftest.py`` to use a ZooKeeper of your own.

Configure a cluster with the ``walkit_cluster`` marker, or an indirect parameter (an int
is the number of bookies, a dict the keyword arguments)::

    @pytest.mark.walkit_cluster(bookies=4, session_timeout=3.0)
    def test_x(walkit_cluster): ...

    @pytest.mark.parametrize("walkit_cluster", [4, {"bookies": 5}], indirect=True)
    def test_y(walkit_cluster): ...

The keyword arguments are :class:`FaultyCluster`'s: ``bookies``, ``bookie_options``
(:class:`~bookie.BookieConfig` attribute values), ``session_timeout`` (seconds) and, for
``walkit_cluster`` only, ``metadata_uri``. docs/testing.md has a worked example.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from walkit._testing import FaultyCluster, ZooKeeperServer
from walkit.errors import InvalidArgumentError

__all__ = ["FaultyCluster", "ZooKeeperServer", "walkit_cluster", "walkit_zk_cluster", "walkit_zookeeper"]

MARKER = "walkit_cluster"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(bookies=4, *, bookie_options=None, session_timeout=2.0, metadata_uri=None): "
                   "how the walkit_cluster / walkit_zk_cluster fixtures build their cluster")


def _cluster_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The cluster's keyword arguments: the closest ``walkit_cluster`` marker, then an
    indirect parameter (which wins)."""
    options: dict[str, Any] = {}
    marker = request.node.get_closest_marker(MARKER)
    if marker is not None:
        options.update(_as_options(marker.args, marker.kwargs))
    param = getattr(request, "param", None)
    if param is not None:
        options.update(_as_options((param,), {}) if isinstance(param, int) else _as_options((), param))
    return options


def _as_options(args: tuple[Any, ...], kwargs: Any) -> dict[str, Any]:
    if len(args) > 1 or (args and not isinstance(args[0], int)) or not isinstance(kwargs, dict):
        raise InvalidArgumentError("walkit_cluster takes the number of bookies and keyword arguments",
                                   args=repr(args), kwargs=repr(kwargs))
    return {**({"bookies": args[0]} if args else {}), **kwargs}


@pytest.fixture
def walkit_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FaultyCluster]:
    """An in-process walkit cluster with fault injection (embedded metadata by default)."""
    with FaultyCluster(tmp_path / "walkit-cluster", **_cluster_options(request)) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def walkit_zookeeper() -> Iterator[str]:
    """A standalone ZooKeeper on 127.0.0.1 for the test session: its connect string."""
    server = ZooKeeperServer()
    try:
        yield server.hosts
    finally:
        server.stop()


@pytest.fixture
def walkit_zk_cluster(request: pytest.FixtureRequest, tmp_path: Path, walkit_zookeeper: str) -> Iterator[FaultyCluster]:
    """``walkit_cluster`` with its metadata in ZooKeeper, under a root of its own."""
    options = _cluster_options(request)
    if "metadata_uri" in options:
        raise InvalidArgumentError("walkit_zk_cluster chooses its own metadata_uri", uri=options["metadata_uri"])
    uri = f"zk://{walkit_zookeeper}/walkit-{uuid.uuid4().hex}/ledgers"
    with FaultyCluster(tmp_path / "walkit-zk-cluster", metadata_uri=uri, **options) as cluster:
        yield cluster
