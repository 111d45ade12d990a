"""One BookKeeper-format cluster with walkit bookies and Java bookies side by side (issue 37).

Theory of operation
-------------------
:class:`MixedCluster` is a :class:`~support.bookkeeper.JavaCluster` (BookKeeper's own
``initnewcluster`` tree under a root of its own in the suite's ZooKeeper, M Java bookies)
to which it adds N walkit bookies as real processes (``python -m bookie``,
:class:`~support.bookie.BookieProcess`) whose ``metadataServiceUri`` is the cluster's
``zk+hierarchical://`` URI. Each walkit bookie registers there as BookKeeper's bookies do
(BookieServiceInfo with the ``walkit.protocol`` marker, BookKeeper's cookie), so the Java
client finds both kinds by the registrations alone, and the walkit client reads each
registration's kind (``Endpoint.kind``): walkit's protocol to walkit bookies, BookKeeper's
dialect (v3, or v2 on request) to Java ones. Nothing is copied between trees: both clients
create, open and recover ledgers in the same BookKeeper ledger tree.

Bookies of both kinds start side by side (JVMs and Python processes booting together) and
each is waited for until its writable registration exists. Tests that must decide which
bookies a new ledger lands on start only those, create the ledger, then start spares
(:meth:`MixedCluster.add_walkit`, :meth:`MixedCluster.add_java`): both clients place a new
ledger at random among the writable bookies. :meth:`MixedCluster.kill` SIGKILLs a bookie of
either kind by id. :meth:`MixedCluster.stop` ends every process and removes the tree and
the directories.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from support.bookie import BookieProcess
from support.bookkeeper import JavaBookie, JavaCluster, JavaPeer, fresh_bookie_port

__all__ = ["MixedCluster", "FAST"]

#: walkit client timeouts for the tests: a dead bookie is given up on quickly.
FAST: dict[str, Any] = {"add_timeout": 5.0, "read_timeout": 5.0, "speculative_read_timeout": 0.5,
                        "connect_timeout": 5.0, "session_timeout": 5.0}


class MixedCluster:
    """A BookKeeper-format cluster with ``walkit`` walkit bookie processes and ``java``
    Java bookies, both registered in BookKeeper's format."""

    def __init__(self, classpath: str, zk_hosts: str, *, walkit: int = 0, java: int = 0,
                 java_conf: dict[str, str] | None = None, walkit_conf: dict[str, Any] | None = None) -> None:
        self.java_conf = java_conf
        self.walkit_conf = dict(walkit_conf or {})
        self.java = JavaCluster(classpath, zk_hosts, bookies=0)
        self.directory = Path(tempfile.mkdtemp(prefix="walkit-mixed-"))
        self.walkit: list[BookieProcess] = []
        self._made = 0  # bookies made so far: each gets directories of its own, never reused
        try:
            self.start(walkit=walkit, java=java)
        except BaseException:
            self.stop()
            raise

    # -- the cluster ------------------------------------------------------------------------
    @property
    def uri(self) -> str:
        """The cluster's metadataServiceUri, the same for both clients and both kinds."""
        return self.java.metadata_uri

    @property
    def java_bookies(self) -> list[JavaBookie]:
        return self.java.bookies

    def start(self, *, walkit: int = 0, java: int = 0) -> tuple[list[BookieProcess], list[JavaBookie]]:
        """Start ``walkit`` walkit bookies and ``java`` Java bookies side by side; return
        them once every one is registered writable."""
        new_java = [JavaBookie(self.java.classpath, self.uri, self.java.zk, self.java.root,
                               self.java.directory / f"bookie{self._made + i}", self.java_conf) for i in range(java)]
        self._made += java
        self.java.bookies.extend(new_java)
        new_walkit = [BookieProcess(self.directory / f"walkit{self._made + i}", self.uri,
                                    port=fresh_bookie_port(self.java.zk, self.java.root), **{"zkTimeout": 2000, **self.walkit_conf})
                      for i in range(walkit)]
        self._made += walkit
        self.walkit.extend(new_walkit)
        for bookie in new_walkit:
            bookie.start(wait=False)
        for java_bookie in new_java:
            _spawn_java(java_bookie)
        for bookie in new_walkit:
            bookie.wait_serving()
            self.wait_registered(bookie.bookie_id)
        for java_bookie in new_java:
            java_bookie.wait_registered()
        return new_walkit, new_java

    def add_walkit(self) -> BookieProcess:
        return self.start(walkit=1)[0][0]

    def add_java(self) -> JavaBookie:
        return self.start(java=1)[1][0]

    def wait_registered(self, bookie_id: str, timeout: float = 60.0) -> None:
        node = f"{self.java.root}/available/{bookie_id}"
        deadline = time.monotonic() + timeout
        while self.java.zk.exists(node) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"bookie {bookie_id} not registered at {node} after {timeout:.0f} s")
            time.sleep(0.05)

    def running(self) -> set[str]:
        """The ids of the bookies of both kinds this cluster started that are running."""
        return ({b.bookie_id for b in self.walkit if b.proc is not None and b.proc.poll() is None}
                | {b.bookie_id for b in self.java.bookies if b.running})

    def registered(self) -> set[str]:
        """The ids registered writable now (BookKeeper's ``available/``)."""
        return {c for c in self.java.zk.get_children(f"{self.java.root}/available") if c != "readonly"}

    def wait_only_running(self, timeout: float = 30.0) -> None:
        """Until the writable registrations are exactly the running bookies: a killed
        bookie's node lives on until its session expires, and a client creating a ledger
        meanwhile could place it on the dead bookie."""
        deadline = time.monotonic() + timeout
        while self.registered() != self.running():
            if time.monotonic() > deadline:
                raise RuntimeError(f"registered {sorted(self.registered())}, running {sorted(self.running())}")
            time.sleep(0.1)

    def kind(self, bookie_id: str) -> str:
        """"walkit" or "bookkeeper" (a Java bookie) for a bookie this cluster started."""
        if any(b.bookie_id == bookie_id for b in self.walkit):
            return "walkit"
        if any(b.bookie_id == bookie_id for b in self.java.bookies):
            return "bookkeeper"
        raise KeyError(bookie_id)

    def kill(self, bookie_id: str) -> None:
        """SIGKILL the bookie ``bookie_id`` (either kind); its registration lives on until
        its ZooKeeper session expires."""
        for walkit_bookie in self.walkit:
            if walkit_bookie.bookie_id == bookie_id:
                walkit_bookie.kill()
                return
        for java_bookie in self.java.bookies:
            if java_bookie.bookie_id == bookie_id:
                java_bookie.kill()
                return
        raise KeyError(bookie_id)

    def stop_bookies(self) -> None:
        """Stop every bookie of both kinds (the cluster's tree stays): a test that placed
        its ledgers by what was running leaves a clean cluster to the next."""
        for walkit_bookie in self.walkit:
            walkit_bookie.close()
        for java_bookie in self.java.bookies:  # SIGTERM to all first: the JVMs shut down side by side
            if java_bookie.running:
                java_bookie._proc.terminate()  # type: ignore[union-attr]
        for java_bookie in self.java.bookies:
            java_bookie.stop()
        self.walkit.clear()
        self.java.bookies.clear()

    # -- clients ----------------------------------------------------------------------------
    def peer(self, *, v2: bool = False) -> JavaPeer:
        """BookKeeper's Java client on the cluster (a process of its own)."""
        return self.java.peer(v2=v2)

    def client(self, dialect: str = "v3", **options: Any) -> Any:
        """The walkit client on the same URI; ``dialect`` is what it speaks to Java bookies."""
        import walkit

        return walkit.BookKeeper(self.uri, **{**FAST, "use_v2_wire_protocol": dialect == "v2", **options})

    def stop(self) -> None:
        for walkit_bookie in self.walkit:
            walkit_bookie.close()
        self.java.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def _spawn_java(bookie: JavaBookie) -> None:
    """Start a Java bookie's JVM without waiting for it (the caller waits for all)."""
    import subprocess

    from support.bookkeeper import JVM_FLAGS

    with open(bookie.log, "ab") as log:
        bookie._proc = subprocess.Popen(
            ["java", *JVM_FLAGS, "-cp", bookie.classpath, "org.apache.bookkeeper.server.Main", "--conf",
             str(bookie.conf)], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
