"""What the garbage-collection cluster tests share (tests/cluster/test_gc_cluster.py): a look at a
bookie's ledger directory on disk, the ``walkit bookie gc`` CLI as a subprocess, ADMIN
requests to one bookie, ledgers made by a few threads, and a standalone ZooKeeper that
a test may stop and start again (on its own port and data, not the session's server).

On-disk layout read here (bookie/storage/_ledgerdir.py)::

    <data_dir>/bookie-<i>/ledgers/current/logs/<log id:016x>.log|.use|.compact
    <data_dir>/bookie-<i>/ledgers/current/index/<ledger & 0xff:02x>/<ledger id:016x>.idx
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import walkit
from walkit.client import BookieClient
from walkit.metadata import connect
from support.zk import STANDALONE_MAIN, ZooKeeperProcess, base_config, ensure_zookeeper, free_port

__all__ = ["DiskView", "StoppableZooKeeper", "admin", "bookie_ids_registered", "delete_ledgers", "gc_cli",
           "gc_status_json", "make_ledgers", "payload", "read_from_bookie", "wait_until"]

KIB = 1024


@dataclass(frozen=True)
class DiskView:
    """Bookie ``i``'s ledger directory as the file system shows it (sizes are st_size)."""

    current: Path

    @classmethod
    def of(cls, cluster: walkit.LocalCluster, i: int) -> DiskView:
        return cls(cluster.data_dir / f"bookie-{i}" / "ledgers" / "current")

    @property
    def logs_dir(self) -> Path:
        return self.current / "logs"

    def total_bytes(self) -> int:
        """Bytes of every file under the ledger directory (logs, usage files, index)."""
        return _tree_bytes(self.current)

    def log_bytes(self) -> int:
        """Bytes of the entry-log directory (logs, their usage files and markers)."""
        return _tree_bytes(self.logs_dir)

    def logs(self) -> dict[int, int]:
        """``log id -> size`` of every entry log."""
        return {int(p.stem, 16): _size(p) for p in _listdir(self.logs_dir) if p.suffix == ".log"}

    def markers(self) -> set[int]:
        """Log ids with a compaction marker (``.compact``)."""
        return {int(p.stem, 16) for p in _listdir(self.logs_dir) if p.suffix == ".compact"}

    def indexed_ledgers(self) -> set[int]:
        """Ledger ids with an index file."""
        index = self.current / "index"
        return {int(p.name.split(".")[0], 16) for bucket in _listdir(index) if bucket.is_dir()
                for p in _listdir(bucket) if p.name.endswith(".idx")}  # beside the buckets: slots.log


def _listdir(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except FileNotFoundError:
        return []


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # removed by the bookie while we looked
        return 0


def _tree_bytes(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        total += sum(_size(Path(folder) / name) for name in files)
    return total


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, poll: float = 0.2,
               detail: Callable[[], object] | None = None) -> float:
    """Poll ``predicate`` until it holds; the seconds it took. AssertionError naming
    ``what`` (and ``detail()``) when ``timeout`` passes first."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not reached within {timeout:.0f} s"
                                 + (f"; {detail()}" if detail is not None else ""))
        time.sleep(poll)
    return time.monotonic() - start


# -- the CLI and the ADMIN op ------------------------------------------------------------------

def gc_cli(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``walkit bookie gc ARGS`` in a subprocess, as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "walkit.cli", "bookie", "gc", *args], capture_output=True,
                          text=True, timeout=timeout)


def gc_status_json(uri: str) -> dict[str, Any]:
    """Every bookie's ``gc --status --json``, by bookie id (the CLI must succeed)."""
    out = gc_cli("--metadata", uri, "--status", "--json")
    assert out.returncode == 0, out
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def admin(cluster: walkit.LocalCluster, i: int, command: str, args: dict[str, Any] | None = None,
          timeout: float = 10.0) -> Any:
    """One ADMIN request to bookie ``i`` (``gc.status``, ``gc.run``), its decoded answer."""

    async def ask() -> Any:
        client = await BookieClient.connect(*cluster.bookie_address(i))
        try:
            return await client.admin(command, args)
        finally:
            await client.close()

    return asyncio.run(asyncio.wait_for(ask(), timeout))


def read_from_bookie(cluster: walkit.LocalCluster, i: int, keys: list[tuple[int, int]],
                     timeout: float = 60.0) -> dict[tuple[int, int], bytes]:
    """The stored bytes of entries ``(ledger, entry)`` as bookie ``i`` alone answers them
    (pipelined on one connection); a missing entry fails the call."""

    async def read() -> dict[tuple[int, int], bytes]:
        client = await BookieClient.connect(*cluster.bookie_address(i))
        try:
            out: dict[tuple[int, int], bytes] = {}
            for start in range(0, len(keys), 500):
                part = keys[start:start + 500]
                answers = await asyncio.gather(*(client.read_entry(ledger, e) for ledger, e in part))
                out.update({key: bytes(a.data) for key, a in zip(part, answers)})
            return out
        finally:
            await client.close()

    return asyncio.run(asyncio.wait_for(read(), timeout))


def bookie_ids_registered(uri: str) -> tuple[frozenset[str], frozenset[str]]:
    """``(writable, readonly)`` bookie ids as the metadata store lists them."""
    with connect(uri) as cluster:
        bookies = cluster.bookies()
        return frozenset(bookies.writable), frozenset(bookies.readonly)


# -- ledgers -----------------------------------------------------------------------------------

def payload(ledger_id: int, entry_id: int, size: int = KIB) -> bytes:
    """A recognisable entry body of ``size`` bytes."""
    head = f"ledger {ledger_id} entry {entry_id} ".encode()
    return (head * (size // len(head) + 1))[:size]


def make_ledgers(bk: walkit.BookKeeper, count: int, entries: int, size: int = KIB, threads: int = 4,
                 ensemble: tuple[int, int, int] = (3, 3, 2)) -> list[int]:
    """``count`` closed ledgers of ``entries`` entries of ``size`` bytes, made by
    ``threads`` threads (creating a ledger costs a PBKDF2 of its password); their ids."""
    made: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    share = [count // threads + (1 if t < count % threads else 0) for t in range(threads)]

    def work(n: int) -> None:
        try:
            for _ in range(n):
                lh = bk.create_ledger(*ensemble)
                futures = [lh.add_entry_async(payload(lh.ledger_id, e, size)) for e in range(entries)]
                for fut in futures:
                    fut.result(60)
                lh.close()
                with lock:
                    made.append(lh.ledger_id)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller's thread
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(n,), name=f"make-ledgers-{t}") for t, n in enumerate(share)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    if errors:
        raise errors[0]
    return sorted(made)


def delete_ledgers(bk: walkit.BookKeeper, ledger_ids: Iterable[int], threads: int = 4) -> None:
    ids = list(ledger_ids)
    errors: list[BaseException] = []

    def work(part: list[int]) -> None:
        try:
            for ledger_id in part:
                bk.delete_ledger(ledger_id)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(ids[t::threads],)) for t in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    if errors:
        raise errors[0]


# -- a ZooKeeper that stops and starts ------------------------------------------------------------

class StoppableZooKeeper:
    """One standalone ZooKeeper of a test's own on 127.0.0.1: :meth:`kill` and
    :meth:`start` again on the same port and data (sessions live on when it comes back
    within their timeout)."""

    def __init__(self) -> None:
        ensure_zookeeper()
        self.port = free_port()
        self.hosts = f"127.0.0.1:{self.port}"
        self._dir = Path(tempfile.mkdtemp(prefix="walkit-gc-zk-"))
        self._node = ZooKeeperProcess("zookeeper (gc tests)", self._dir, STANDALONE_MAIN, self.port,
                                      base_config(self._dir, self.port))
        try:
            self.start()
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        self._node.start()
        self._node.wait_serving()

    def kill(self) -> None:
        self._node.kill()

    @property
    def running(self) -> bool:
        return self._node.running

    def close(self) -> None:
        self._node.stop()
        shutil.rmtree(self._dir, ignore_errors=True)
