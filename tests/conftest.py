"""Shared fixtures: a real ZooKeeper (started only when a test asks for it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from zk_support import ZooKeeperEnsemble, ZooKeeperServer


@pytest.fixture(scope="session")
def zk_server() -> Iterator[ZooKeeperServer]:
    """One standalone ZooKeeper on 127.0.0.1 for the whole run (installed if missing)."""
    server = ZooKeeperServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def walkit_zookeeper(zk_server: ZooKeeperServer) -> str:
    """The walkit.testing plugin's ZooKeeper is the suite's: one JVM for the whole run."""
    return zk_server.hosts


@pytest.fixture(scope="module")
def zk_ensemble_module() -> Iterator[ZooKeeperEnsemble]:
    """A fresh 3-node ZooKeeper ensemble on 127.0.0.1 per test module."""
    ensemble = ZooKeeperEnsemble()
    try:
        yield ensemble
    finally:
        ensemble.stop()


@pytest.fixture
def zk_ensemble(zk_ensemble_module: ZooKeeperEnsemble) -> ZooKeeperEnsemble:
    """The module's ensemble with all three nodes serving: nodes killed by an earlier test
    (even a failed one) are restarted on their own data before this test starts."""
    zk_ensemble_module.restore()
    return zk_ensemble_module
