"""The real Apache BookKeeper 4.18.2 in the tests: Maven-fetched jars, Java bookies, a Java peer.

Theory of operation
-------------------
- **Classpath.** :func:`bookkeeper_classpath` is ``walkit.bench._bookkeeper_java``'s (a tiny
  ``pom.xml`` depending on ``org.apache.bookkeeper:bookkeeper-server:4.18.2`` in
  ``~/.cache/walkit/bookkeeper-4.18.2/``, ``$WALKIT_BK_CACHE`` overriding, and
  ``mvn -q -B dependency:build-classpath``: 68 jars, ~121 MB into ``~/.m2``; ~14 s the first
  time), shared with ``walkit bench bookkeeper``. Without ``java``, ``javac`` or ``mvn`` on PATH
  the caller is skipped (``pytest.skip``); a failed fetch raises with the tail of Maven's output.
- **Cluster.** :class:`JavaCluster` puts a cluster under a root of its own in the suite's
  ZooKeeper: ``zk+hierarchical://127.0.0.1:PORT/bk-<uuid>/ledgers``. BookKeeper 4.18 accepts a
  multi-level root but ``initnewcluster`` does not create the parent (``NoNode``): we create
  ``/bk-<uuid>`` with kazoo first. Then N :class:`JavaBookie`\\ s
  (``org.apache.bookkeeper.server.Main``, DbLedgerStorage, loopback only, small caches),
  each ready once ``<root>/available/127.0.0.1:<port>`` exists (it registers writable).
- **Peer.** :class:`JavaPeer` runs ``tests/support/java/Peer.java`` (compiled once per
  version of the source into the cache dir with ``javac`` by the same package's ``compile_java``: ~1 s, and starting the compiled class saves the ~2 s a
  ``java Peer.java`` run spends compiling each time). It reads one JSON command per line and
  answers one JSON line each; while adding with ``report`` it also emits ``{"ack": id}``
  lines as entries are acknowledged. ``conf`` adds client settings (``key=value`` arguments:
  TLS, for one). Errors come back as ``{"error": "<BKException code
  name>", "message": ...}`` and raise :class:`PeerError`.
- **Shell.** ``JavaCluster.shell(*args)`` runs BookieShell with the cluster's client.conf and
  returns its stdout (logs included: parse the ``{key=value, ...}`` parts).

Run them with ``pytest -m bookkeeper tests/bookkeeper``. Processes are stopped (SIGTERM, then
SIGKILL) and temporary directories removed by ``stop()``.
"""

from __future__ import annotations

import base64
import json
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from support.zk import free_port
from walkit.bench import _bookkeeper_java as _shared
from walkit.bench._bookkeeper_java import CACHE, POM, VERSION, bookie_conf, compile_java
from walkit.errors import ConfigError

PEER_SOURCE = Path(__file__).parent / "java" / "Peer.java"
JVM_FLAGS = ("-Djava.net.preferIPv4Stack=true", "-Xmx256m", "-XX:MaxDirectMemorySize=256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
START_TIMEOUT = 60.0

__all__ = ["CACHE", "POM", "VERSION", "bookkeeper_classpath", "peer_classes", "JavaBookie", "JavaCluster", "JavaPeer",
           "PeerError", "NO_GC", "WalkitRegistry", "fresh_bookie_port"]

# the tests' bookies: small caches and journal preallocation, a short ZooKeeper session
SMALL = {"dbStorage_writeCacheMaxSizeMb": "16", "dbStorage_readAheadCacheMaxSizeMb": "16",
         "dbStorage_rocksDB_blockCacheSize": "16777216", "journalPreAllocSizeMB": "4", "zkTimeout": "4000"}

# Java bookies garbage-collect the ledgers their own (BookKeeper) metadata does not know:
# every ledger a walkit client writes with a walkit-format store of its own. GC first runs
# gcWaitTime (default 15 min) after start; these push it to a day and turn compaction off.
NO_GC = {"gcWaitTime": "86400000", "minorCompactionInterval": "0", "majorCompactionInterval": "0",
         "isForceGCAllowWhenNoSpace": "false"}


def bookkeeper_classpath() -> str:
    """The classpath of bookkeeper-server 4.18.2 (fetched by Maven once, then cached);
    skips the caller when java, javac or mvn is missing."""
    try:
        return _shared.bookkeeper_classpath()
    except ConfigError as exc:
        if "missing" in exc.context:
            pytest.skip(f"Apache BookKeeper tests: {exc}")
        raise


def peer_classes(classpath: str) -> Path:
    """The directory of the compiled Peer class, one per version of Peer.java."""
    return compile_java(PEER_SOURCE, classpath)


_tail = _shared.log_tail  # one copy, shared with walkit bench bookkeeper


def fresh_bookie_port(zk: Any, root: str) -> int:
    """A free loopback port that no bookie of the cluster under ``root`` has held: the
    kernel hands a freed port out again, and a new bookie at an old bookie's address would
    meet that bookie's cookie (``<root>/cookies/127.0.0.1:<port>``, persistent) and, with
    directories of its own, be refused at boot (InvalidCookieException) as BookKeeper must."""
    while True:
        port = free_port()
        if zk.exists(f"{root}/cookies/127.0.0.1:{port}") is None:
            return port


class JavaBookie:
    """One ``org.apache.bookkeeper.server.Main`` on 127.0.0.1, its disks under ``directory``."""

    def __init__(self, classpath: str, metadata_uri: str, zk: Any, root: str, directory: Path,
                 conf: dict[str, str] | None = None) -> None:
        self.classpath = classpath
        self.port = fresh_bookie_port(zk, root)
        self.bookie_id = f"127.0.0.1:{self.port}"
        self.directory = directory
        self._zk = zk
        self._znode = f"{root}/available/{self.bookie_id}"
        directory.mkdir(parents=True, exist_ok=True)
        self.conf = directory / "bk_server.conf"
        self.conf.write_text(bookie_conf(self.port, metadata_uri, directory, {**SMALL, **(conf or {})}))
        self.log = directory / "bookie.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = START_TIMEOUT) -> None:
        if self.running:
            raise RuntimeError(f"bookie {self.bookie_id} is already running")
        stale = self._owner()  # a killed bookie's node lives on until its session expires
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                ["java", *JVM_FLAGS, "-cp", self.classpath, "org.apache.bookkeeper.server.Main",
                 "--conf", str(self.conf)], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self.wait_registered(timeout, stale)

    def _owner(self) -> int | None:
        """The session holding the writable registration znode (None: no node)."""
        stat = self._zk.exists(self._znode)
        return None if stat is None else int(stat.ephemeralOwner)

    def wait_registered(self, timeout: float = START_TIMEOUT, stale: int | None = None) -> None:
        """Until the bookie's writable registration znode exists under a session other than
        ``stale`` (the previous process's, which outlives a SIGKILL by the session timeout);
        RuntimeError with the log tail if not."""
        deadline = time.monotonic() + timeout
        while self._owner() in (None, stale):
            if not self.running:
                raise RuntimeError(f"bookie {self.bookie_id} exited ({self.returncode})\n{_tail(self.log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"bookie {self.bookie_id} not registered after {timeout:.0f} s\n{_tail(self.log)}")
            time.sleep(0.1)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.running:
            assert self._proc is not None
            self._proc.send_signal(signal.SIGKILL)
        if self._proc is not None:
            self._proc.wait()

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 15 s."""
        if self.running:
            assert self._proc is not None
            self._proc.terminate()
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self, timeout: float = START_TIMEOUT) -> None:
        self.stop()
        self.start(timeout)

    def log_tail(self, chars: int = 3000) -> str:
        return _tail(self.log, chars)


class JavaCluster:
    """``initnewcluster`` under ``/bk-<uuid>/ledgers`` of ZooKeeper ``zk_hosts``, then N bookies."""

    def __init__(self, classpath: str, zk_hosts: str, bookies: int = 3, conf: dict[str, str] | None = None) -> None:
        from kazoo.client import KazooClient

        self.classpath = classpath
        self.chroot = f"/bk-{uuid.uuid4().hex[:12]}"
        self.root = f"{self.chroot}/ledgers"
        self.metadata_uri = f"zk+hierarchical://{zk_hosts}{self.root}"
        self.directory = Path(tempfile.mkdtemp(prefix="walkit-bk-"))
        self.zk = KazooClient(zk_hosts)
        self.zk.start(timeout=15)
        self.bookies: list[JavaBookie] = []
        self.client_conf = self.directory / "client.conf"
        self.client_conf.write_text(f"metadataServiceUri={self.metadata_uri}\n")
        try:
            self.zk.ensure_path(self.chroot)  # initnewcluster does not create the root's parent
            self.shell("initnewcluster")
            self.bookies = [JavaBookie(classpath, self.metadata_uri, self.zk, self.root, self.directory / f"bookie{i}",
                                       conf) for i in range(bookies)]
            self._start_all()  # all JVMs boot side by side, then wait for each
        except BaseException:
            self.stop()
            raise

    def _start_all(self) -> None:
        for bookie in self.bookies:
            with open(bookie.log, "ab") as log:
                bookie._proc = subprocess.Popen(
                    ["java", *JVM_FLAGS, "-cp", self.classpath, "org.apache.bookkeeper.server.Main",
                     "--conf", str(bookie.conf)], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        for bookie in self.bookies:
            bookie.wait_registered()

    def shell(self, *args: str, timeout: float = 120.0, check: bool = True) -> str:
        """BookieShell ``args`` with the cluster's client.conf; its stdout (logs included)."""
        run = subprocess.run(["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp",
                              self.classpath, "org.apache.bookkeeper.bookie.BookieShell", "-conf",
                              str(self.client_conf), *args],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        if check and run.returncode != 0:
            raise RuntimeError(f"BookieShell {' '.join(args)} exited {run.returncode}:\n"
                               f"{(run.stdout + run.stderr)[-3000:]}")
        return run.stdout + run.stderr

    def skip_ledger_ids(self, count: int) -> None:
        """Make BookKeeper's ledger id generator skip ``count`` ids (sequential nodes made
        and deleted under ``idgen/``, ``count`` at a time in transactions), so ledgers the
        Java client creates do not take ids a walkit-format store of the test's own hands
        out too: the Java bookies would then hold two ledgers' entries and fences as one."""
        from walkit.metadata._bk_paths import idgen_prefix

        prefix = idgen_prefix(self.root)
        self.zk.ensure_path(prefix.rsplit("/", 1)[0])
        for start in range(0, count, 1000):
            create = self.zk.transaction()
            for _ in range(min(1000, count - start)):
                create.create(prefix, b"", sequence=True)
            created = create.commit()
            delete = self.zk.transaction()
            for path in created:
                delete.delete(path)
            delete.commit()

    def peer(self, *, v2: bool = False, conf: dict[str, str] | None = None) -> JavaPeer:
        return JavaPeer(self.classpath, self.metadata_uri, self.directory, v2=v2, conf=conf)

    def stop(self) -> None:
        for bookie in self.bookies:
            if bookie.running:
                assert bookie._proc is not None
                bookie._proc.terminate()
        for bookie in self.bookies:
            bookie.stop()
        try:
            self.zk.delete(self.chroot, recursive=True)
        except Exception:
            pass
        self.zk.stop()
        self.zk.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class PeerError(Exception):
    """A command the Java client refused: ``code`` is the BKException code name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class JavaPeer:
    """The Java client in a process of its own, one JSON command per line."""

    def __init__(self, classpath: str, metadata_uri: str, directory: Path, *, v2: bool = False,
                 timeout: float = 60.0, conf: dict[str, str] | None = None) -> None:
        classes = peer_classes(classpath)
        self.v2 = v2
        self.log = Path(tempfile.mkstemp(prefix="peer-", suffix=".log", dir=directory)[1])
        self.acks: list[int] = []
        self._results: queue.Queue[dict[str, Any]] = queue.Queue()
        self._next = 0
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp",
                 f"{classes}:{classpath}", "Peer", metadata_uri, "v2" if v2 else "v3",
                 *(f"{key}={value}" for key, value in (conf or {}).items())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        ready = self._get(timeout)
        if not ready.get("ready"):
            raise RuntimeError(f"Java peer did not start: {ready}\n{_tail(self.log)}")

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            message = json.loads(line)
            if "ack" in message:
                self.acks.append(message["ack"])
            else:
                self._results.put(message)
        self._results.put({"error": "PeerExited", "message": f"exit {self._proc.wait()}"})

    def _get(self, timeout: float) -> dict[str, Any]:
        try:
            return self._results.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"Java peer: no answer in {timeout} s\n{_tail(self.log)}") from None

    def send(self, op: str, **args: Any) -> int:
        """Send a command without waiting; :meth:`result` collects its answer."""
        assert self._proc.stdin is not None
        self._next += 1
        self._proc.stdin.write((json.dumps({"op": op, "id": self._next, **args}) + "\n").encode())
        self._proc.stdin.flush()
        return self._next

    def result(self, timeout: float = 60.0) -> dict[str, Any]:
        answer = self._get(timeout)
        if "error" in answer:
            raise PeerError(answer["error"], answer.get("message", ""))
        return answer

    def call(self, op: str, timeout: float = 60.0, **args: Any) -> dict[str, Any]:
        self.send(op, **args)
        return self.result(timeout)

    def create(self, ensemble: int = 3, write_quorum: int = 3, ack_quorum: int = 2, digest: str = "CRC32C",
               password: str = "") -> int:
        return int(self.call("create", ensemble=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum,
                             digest=digest, password=password)["ledger"])

    def add(self, ledger: int, payloads: list[bytes] | None = None, *, count: int = 1, size: int = 100,
            seed: int = 0, pipelined: bool = True, timeout: float = 120.0) -> list[int]:
        args: dict[str, Any] = {"ledger": ledger, "pipelined": pipelined}
        if payloads is not None:
            args.update(payloads=[base64.b64encode(p).decode() for p in payloads], count=len(payloads))
        else:
            args.update(count=count, size=size, seed=seed)
        return list(self.call("add", timeout, **args)["entries"])

    def read(self, ledger: int, first: int, last: int, timeout: float = 60.0) -> list[bytes]:
        answer = self.call("read", timeout, ledger=ledger, first=first, last=last)
        assert answer["entries"] == list(range(first, last + 1))
        return [base64.b64decode(p) for p in answer["payloads"]]

    def open(self, ledger: int, *, recovery: bool = False, digest: str = "CRC32C", password: str = "") -> dict[str, Any]:
        return self.call("open", ledger=ledger, recovery=recovery, digest=digest, password=password)

    def read_lac(self, ledger: int) -> int:
        return int(self.call("read_lac", ledger=ledger)["lac"])

    def tail(self, ledger: int, entry: int, timeout_ms: int = 1000) -> tuple[int, bytes | None]:
        """One long poll for ``entry``: (last add confirmed, its payload or None)."""
        answer = self.call("tail", timeout_ms / 1000 + 30, ledger=ledger, entry=entry, timeout_ms=timeout_ms)
        payload = answer.get("payload")
        return int(answer["lac"]), None if payload is None else base64.b64decode(payload)

    def close_ledger(self, ledger: int) -> None:
        self.call("close", ledger=ledger)

    def delete(self, ledger: int) -> None:
        self.call("delete", ledger=ledger)

    def list_ledgers(self) -> list[int]:
        return sorted(self.call("list")["ledgers"])

    @property
    def pid(self) -> int:
        return self._proc.pid

    def kill(self) -> None:
        """SIGKILL the peer process."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
        self._proc.wait()

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.close()
                self._proc.wait(15)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self._reader.join(5)


def payload(seed: int, i: int, size: int = 100) -> bytes:
    """The bytes Peer.java generates for entry ``i`` of an add with ``seed`` (its LCG, in Python)."""
    mask = (1 << 64) - 1
    state = (seed * 1_000_003 + i) & mask
    out = bytearray(size)
    for k in range(size):
        state = (state * 6364136223846793005 + 1442695040888963407) & mask
        out[k] = state >> 56
    return bytes(out)


class WalkitRegistry:
    """A walkit-format metadata store of its own (``local://`` under ``directory``) in
    which Java bookies are registered so that a walkit client sees them as kind
    "bookkeeper" (JSON ``{"endpoint": id, "kind": "bookkeeper"}``): a walkit client
    then writes its ledgers to Java bookies in BookKeeper's dialect. The registrations
    last while this object is open (they are the store session's)."""

    def __init__(self, directory: Path, bookies: list[JavaBookie]) -> None:
        from walkit.metadata import connect, init_cluster, open_metadata_store, parse_metadata_uri

        directory.mkdir(parents=True, exist_ok=True)
        self.uri = f"local://{directory / 'walkit-metadata'}"
        parsed = parse_metadata_uri(self.uri)
        store = open_metadata_store(parsed, create=True)
        try:
            init_cluster(store, parsed.root, parsed.layout)
        finally:
            store.close()
        self.cluster = connect(self.uri, session_timeout=5.0)
        self._registrations: dict[str, Any] = {}
        for bookie in bookies:
            self.register(bookie.bookie_id)

    def register(self, bookie_id: str) -> None:
        data = json.dumps({"endpoint": bookie_id, "kind": "bookkeeper"}).encode()
        self._registrations[bookie_id] = self.cluster.register_bookie(bookie_id, data=data, wait_existing=0)

    def unregister(self, bookie_id: str) -> None:
        registration = self._registrations.pop(bookie_id, None)
        if registration is not None:
            registration.close()

    def close(self) -> None:
        for bookie_id in list(self._registrations):
            self.unregister(bookie_id)
        self.cluster.close()
