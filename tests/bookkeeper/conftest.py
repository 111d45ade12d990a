"""Fixtures for the tests against Apache BookKeeper 4.18.2 itself (tests/support/bookkeeper.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.bookkeeper import JavaCluster, bookkeeper_classpath
from support.zk import ZooKeeperServer


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/bookkeeper/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.bookkeeper)


@pytest.fixture(scope="session")
def bk_classpath() -> str:
    """bookkeeper-server 4.18.2's classpath (Maven, cached in ~/.cache/walkit; skips without java/mvn)."""
    return bookkeeper_classpath()


@pytest.fixture(scope="module")
def java_cluster(bk_classpath: str, zk_server: ZooKeeperServer) -> Iterator[JavaCluster]:
    """Three Java bookies under a cluster root of their own in the suite's ZooKeeper."""
    cluster = JavaCluster(bk_classpath, zk_server.hosts, bookies=3)
    try:
        yield cluster
    finally:
        cluster.stop()
