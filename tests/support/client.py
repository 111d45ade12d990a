"""What the ledger client tests share: a LocalCluster on either metadata driver, a
client with short timeouts, and raw writes that leave a ledger as a crashed writer
would (entries on chosen bookies only)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import walkit
from support.metadata import Driver, cluster_uri
from walkit.client import BookieClient
from walkit.errors import WalkitError
from walkit.metadata import LedgerMetadata
from walkit.protocol import encode_entry, master_key

FAST = {"add_timeout": 2.0, "read_timeout": 2.0, "speculative_read_timeout": 0.2, "connect_timeout": 2.0,
        "session_timeout": 5.0}


@contextlib.contextmanager
def local_cluster(tmp_path: Path, driver: Driver, bookies: int = 4, **kwargs: Any) -> Iterator[walkit.LocalCluster]:
    uri = cluster_uri(driver) if driver.spec.driver == "zk" else None
    with walkit.LocalCluster(tmp_path / "cluster", bookies=bookies, metadata_uri=uri, session_timeout=2.0,
                             **kwargs) as cluster:
        yield cluster


@contextlib.contextmanager
def client(cluster: walkit.LocalCluster, **options: Any) -> Iterator[walkit.BookKeeper]:
    bk = cluster.client(**{**FAST, **options})
    try:
        yield bk
    finally:
        bk.close()


def index_of(cluster: walkit.LocalCluster, bookie_id: str) -> int:
    return cluster.bookie_ids.index(bookie_id)


def raw_add(cluster: walkit.LocalCluster, meta: LedgerMetadata, entry_id: int, payload: bytes, lac: int, length: int,
            bookies: list[str], password: bytes = b"") -> None:
    """Store one entry on ``bookies`` only, as a writer that crashed mid-add leaves it."""
    data = encode_entry(meta.ledger_id, entry_id, lac, length, payload, digest=meta.digest, key=master_key(password))

    async def go() -> None:
        for bookie in bookies:
            host, port = cluster.bookie_address(index_of(cluster, bookie))
            conn = await BookieClient.connect(host, port)
            try:
                await conn.add_entry(meta.ledger_id, entry_id, master_key(password), data)
            finally:
                await conn.close()

    asyncio.run(go())


def stored_on(cluster: walkit.LocalCluster, bookie_id: str, ledger_id: int, entry_id: int) -> bool:
    """Whether in-process bookie ``bookie_id`` holds the entry."""
    server = cluster.server(index_of(cluster, bookie_id))
    assert server.bookie is not None
    try:
        server.bookie.read_entry(ledger_id, entry_id)
    except WalkitError:
        return False
    return True


def hang_single_reads(cluster: walkit.LocalCluster, bookie_id: str, release: Any) -> Callable[[], None]:
    """Bookie ``bookie_id`` answers no READ_ENTRY until ``release`` (a threading.Event) is
    set: its read pool's ``read_entry`` waits, and its event loop answers none from
    memory (``read_memory``). Returns the undo."""
    bookie = cluster.server(index_of(cluster, bookie_id)).bookie
    assert bookie is not None
    real_entry, real_memory = bookie.read_entry, bookie.read_memory

    def stuck(ledger_id: int, entry_id: int) -> bytes:
        release.wait(60)
        return real_entry(ledger_id, entry_id)

    def undo() -> None:
        bookie.read_entry, bookie.read_memory = real_entry, real_memory  # type: ignore[method-assign]

    bookie.read_entry = stuck  # type: ignore[method-assign]
    bookie.read_memory = lambda ledger_id, entry_id: None  # type: ignore[method-assign]
    return undo
