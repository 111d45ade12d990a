"""What every metadata test needs: drivers, stores on them, and a bounded wait.

``driver`` (a :class:`Driver`) is parametrized over every MetadataStore driver:
``driver.make_store()`` opens one more client on the same backing location, so several
instances model several clients. Multi-process tests pass the picklable ``driver.spec``
to a child, which opens its own client with :func:`open_store`. To add a driver: add a
param to the ``driver`` fixture and a branch to :func:`open_store`; the store must also
offer the ``expire_session()`` test hook (a simulated ZooKeeper session expiry).
Test modules import the fixtures they use from here.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from walkit.errors import MetadataUnavailableError
from walkit.metadata._local import LocalMetadataStore
from walkit.metadata._store import MetadataStore, Op, Stat
from walkit.metadata._zk import ZooKeeperStore

SESSION_TIMEOUT = 1.0  # short leases so expiry tests stay quick


class ExpirableStore(MetadataStore, Protocol):
    def expire_session(self) -> None: ...


@dataclass(frozen=True)
class StoreSpec:
    """Picklable: where a driver's backing store lives."""

    driver: str
    location: str


def open_store(spec: StoreSpec, session_timeout: float = SESSION_TIMEOUT) -> ExpirableStore:
    if spec.driver == "local":
        return LocalMetadataStore(spec.location, session_timeout=session_timeout, poll_interval=0.02, create=True)
    if spec.driver == "zk":
        return ZooKeeperStore(spec.location, session_timeout=session_timeout)
    raise AssertionError(f"unknown driver {spec.driver}")


def _zk_location(request: pytest.FixtureRequest) -> str:
    """A fresh chroot on the session's real ZooKeeper, so tests never see each other."""
    server = request.getfixturevalue("zk_server")
    chroot = f"/contract-{uuid.uuid4().hex}"
    admin = ZooKeeperStore(server.hosts)
    try:
        admin.create(chroot)
    finally:
        admin.close()
    return server.hosts + chroot


@dataclass
class Driver:
    spec: StoreSpec
    opened: list[ExpirableStore] = field(default_factory=list)

    def make_store(self, session_timeout: float = SESSION_TIMEOUT) -> ExpirableStore:
        store = open_store(self.spec, session_timeout)
        self.opened.append(store)
        return store


@pytest.fixture(params=["local", "zk"])
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Driver]:
    location = str(tmp_path / "md") if request.param == "local" else _zk_location(request)
    result = Driver(StoreSpec(request.param, location))
    yield result
    for store in result.opened:
        store.close()


@pytest.fixture
def store(driver: Driver) -> ExpirableStore:
    return driver.make_store()


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def cluster_uri(driver: Driver, layout: str | None = None) -> str:
    """A metadata service URI for the driver's location (cluster root ``/ledgers``
    inside the test's own chroot for ZooKeeper)."""
    scheme = driver.spec.driver + (f"+{layout}" if layout else "")
    if driver.spec.driver == "zk":
        return f"{scheme}://{driver.spec.location}/ledgers"
    return f"{scheme}://{driver.spec.location}"



@contextlib.contextmanager
def ready_child(target: Callable[..., None], *args: object) -> Iterator[Callable[[], None]]:
    """Run ``target(*args, out)`` in a spawned process until it puts "ready" on ``out``;
    yields a function that SIGKILLs it (the process is killed on exit in any case)."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, out))
    proc.start()

    def kill() -> None:
        proc.kill()
        proc.join(timeout=10)

    try:
        assert out.get(timeout=30) == "ready"
        yield kill
    finally:
        proc.kill()
        proc.join()


# -- a stuck process holding the local:// store's lock ------------------------------------------------

_LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
conn.execute("UPDATE meta SET value = value WHERE key = 'seq'")
print("locked", flush=True)
sys.stdin.readline()
"""


class StuckLocker:
    """Another process holding the write lock of the local:// store's database ``file``,
    then SIGSTOPped (stuck); :meth:`release` kills it, which releases the lock."""

    def __init__(self, file: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _LOCKER, str(file)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line != b"locked\n":
            self.release()
            raise RuntimeError(f"the locker did not lock {file}: {line!r}")
        self.proc.send_signal(signal.SIGSTOP)

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # SIGKILL works on a stopped process
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


# -- a call that gave up and lands later ---------------------------------------------------------------

class LandsLater:
    """A store (wrapping ``store``) whose next :meth:`transaction` gives up with
    MetadataUnavailableError, as a ZooKeeper call past its retry deadline does, while its
    request is still queued: the transaction is applied just before the store's next
    call (kazoo sends a session's queued requests in order once connected), or by
    :meth:`land`. Every other call goes to ``store``."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._held: list[Callable[[], object]] = []
        self.give_up_next = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.land()
            return attr(*args, **kwargs)

        return call

    def land(self) -> None:
        """Apply the held transaction now (the store answered again)."""
        while self._held:
            self._held.pop(0)()

    def transaction(self, ops: Sequence[Op]) -> list[str | Stat | None]:
        self.land()
        if not self.give_up_next:
            return self._store.transaction(ops)
        self.give_up_next = False
        self._held.append(lambda: self._store.transaction(ops))
        raise MetadataUnavailableError("metadata unavailable: no answer within the retry deadline (simulated)",
                                       path=ops[0].path)
