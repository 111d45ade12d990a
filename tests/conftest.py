"""Shared fixtures: a real ZooKeeper (started only when a test asks for it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from zk_support import ZooKeeperServer


@pytest.fixture(scope="session")
def zk_server() -> Iterator[ZooKeeperServer]:
    """One standalone ZooKeeper on 127.0.0.1 for the whole run (installed if missing)."""
    server = ZooKeeperServer()
    try:
        yield server
    finally:
        server.stop()
