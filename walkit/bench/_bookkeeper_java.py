"""Apache BookKeeper 4.18.2 itself on this machine: its jars, Java bookies and a Java peer.

Theory of operation
-------------------
- **Classpath.** :func:`bookkeeper_classpath` writes a tiny ``pom.xml`` depending on
  ``org.apache.bookkeeper:bookkeeper-server:4.18.2`` into ``~/.cache/walkit/bookkeeper-4.18.2/``
  (``$WALKIT_BK_CACHE`` overrides) and runs ``mvn -q -B dependency:build-classpath`` (68 jars,
  ~121 MB into ``~/.m2``, ~14 s the first time). The classpath file is reused while every jar
  it names exists. Without ``java`` (or, with nothing cached, ``mvn``) on PATH it raises
  :class:`~walkit.errors.ConfigError` naming what is missing (:func:`missing_tools` tells
  without raising: the tests skip on it); a failed fetch raises with the tail of Maven's
  output.
- **Java sources** (:func:`compile_java`) are compiled once with ``javac`` against that
  classpath into a directory of the cache named after the class, kept while the source's
  SHA-256 is unchanged (built aside, then renamed into place).
- **Bookies.** :func:`bookie_conf` is the ``bk_server.conf`` of one bookie on 127.0.0.1
  (DbLedgerStorage, its own journal and ledger directories, loopback only, no HTTP server,
  no stats), plus the caller's settings. :class:`JavaBookKeeper` runs a cluster of them for
  the benchmark: a fresh root in a ZooKeeper made as ``BookieShell initnewcluster`` makes it
  (by :func:`walkit.metadata.init_cluster` in BookKeeper's format: no JVM to start), N
  ``org.apache.bookkeeper.server.Main`` JVMs started side by side, each ready once its
  writable registration (``<root>/available/127.0.0.1:<port>``) exists; ``stop()`` ends
  them (SIGTERM, SIGKILL after 15 s) and removes their directories.
- **Bench peer.** :class:`BenchPeer` runs ``java/BenchPeer.java`` (package data): the Java
  client with the settings given, one JSON command per line in, one JSON answer per line out;
  the peer measures its own CPU (and the bookies') from ``/proc`` over each counted interval.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from walkit.bench._common import free_port
from walkit.errors import ConfigError, WalkitError

__all__ = ["VERSION", "CACHE", "POM", "BOOKIE_JVM_FLAGS", "PEER_JVM_FLAGS", "PEER_SOURCE", "BenchPeer", "JavaBookKeeper",
           "bookie_conf", "bookkeeper_classpath", "compile_java", "log_tail", "missing_tools"]

VERSION = "4.18.2"
CACHE = Path(os.environ.get("WALKIT_BK_CACHE", Path.home() / ".cache" / "walkit" / f"bookkeeper-{VERSION}"))
POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>walkit.tests</groupId><artifactId>bookkeeper-classpath</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies><dependency>
    <groupId>org.apache.bookkeeper</groupId><artifactId>bookkeeper-server</artifactId><version>{VERSION}</version>
  </dependency></dependencies>
</project>
"""
# a benchmark's bookies: full JIT, G1 (the JVM's and bin/bookkeeper's collector), heap and
# direct memory of 512 MiB each (DbLedgerStorage then sizes its caches from the latter)
BOOKIE_JVM_FLAGS = ("-Djava.net.preferIPv4Stack=true", "-Xms512m", "-Xmx512m", "-XX:MaxDirectMemorySize=512m",
                    "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=10")
PEER_JVM_FLAGS = ("-Djava.net.preferIPv4Stack=true", "-Xms256m", "-Xmx512m", "-XX:MaxDirectMemorySize=512m",
                  "-XX:+UseG1GC")
PEER_SOURCE = Path(__file__).parent / "java" / "BenchPeer.java"
START_TIMEOUT = 90.0  # seconds: three bookie JVMs starting at once on two shared cores


def missing_tools(*tools: str) -> list[str]:
    """The ``tools`` (e.g. "java", "mvn") not on PATH."""
    return [tool for tool in tools if shutil.which(tool) is None]


def _require(*tools: str) -> None:
    missing = missing_tools(*tools)
    if missing:
        raise ConfigError(f"Apache BookKeeper {VERSION} needs {' and '.join(repr(t) for t in missing)} on PATH "
                          "(Java 17 and Maven)", missing=",".join(missing))


def _cached_classpath() -> str | None:
    cp_file = CACHE / "classpath.txt"
    if not cp_file.exists():
        return None
    cp = cp_file.read_text().strip()
    return cp if cp and all(Path(jar).exists() for jar in cp.split(":")) else None


def bookkeeper_classpath() -> str:
    """The classpath of bookkeeper-server 4.18.2 (fetched by Maven once, then cached)."""
    _require("java", "javac")
    cached = _cached_classpath()
    if cached is not None:
        return cached
    _require("mvn")
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / "pom.xml").write_text(POM)
    tmp = CACHE / "classpath.txt.tmp"
    run = subprocess.run(["mvn", "-q", "-B", "dependency:build-classpath", f"-Dmdep.outputFile={tmp}"],
                         cwd=CACHE, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if run.returncode != 0 or not tmp.exists():
        raise ConfigError(f"mvn could not fetch bookkeeper-server {VERSION}", exit_code=run.returncode,
                          output=(run.stdout + run.stderr)[-3000:])
    tmp.replace(CACHE / "classpath.txt")
    return (CACHE / "classpath.txt").read_text().strip()


def compile_java(source: Path, classpath: str) -> Path:
    """The directory of ``source``'s compiled classes: one per version of the source, named
    by its hash, so that runs with different versions (worktrees, an upgrade) share the
    cache without recompiling under each other's running JVMs; a race to compile the same
    version keeps the first copy."""
    name = source.stem
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    out = CACHE / f"{name.lower()}-classes-{digest[:16]}"
    if (out / f"{name}.class").exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{name.lower()}-", dir=CACHE))
    run = subprocess.run(["javac", "-d", str(tmp), "-cp", classpath, str(source)],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if run.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConfigError(f"javac {source.name} failed", output=(run.stdout + run.stderr)[-3000:])
    try:
        tmp.rename(out)
    except OSError:  # another run compiled the same version meanwhile: keep its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def bookie_conf(port: int, metadata_uri: str, directory: Path, settings: dict[str, str] | None = None) -> str:
    """``bk_server.conf`` of a bookie on 127.0.0.1:``port``, its disks under ``directory``."""
    return "\n".join([
        f"bookiePort={port}", "listeningInterface=lo", "allowLoopback=true", "advertisedAddress=127.0.0.1",
        f"metadataServiceUri={metadata_uri}", f"journalDirectories={directory / 'journal'}",
        f"ledgerDirectories={directory / 'ledgers'}",
        "ledgerStorageClass=org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage",
        "httpServerEnabled=false", "statsProviderClass=org.apache.bookkeeper.stats.NullStatsProvider",
        *(f"{key}={value}" for key, value in (settings or {}).items()), "",
    ])


def log_tail(path: Path, chars: int = 3000) -> str:
    """The last ``chars`` characters of a Java process's log, for an error message."""
    try:
        return f"--- last {chars} chars of {path} ---\n" + path.read_bytes()[-chars:].decode(errors="replace")
    except OSError:
        return f"--- no log at {path} ---"


def _stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


class JavaBookKeeper:
    """``bookies`` Java bookies (``settings`` in each bk_server.conf) under root ``/<name>`` of
    the ZooKeeper at ``zk_hosts``, their data in a new directory under ``directory``."""

    def __init__(self, classpath: str, zk_hosts: str, directory: Path, name: str, bookies: int = 3,
                 settings: dict[str, str] | None = None) -> None:
        from walkit.metadata import init_cluster, open_metadata_store

        self.classpath = classpath
        self.root = f"/{name}"
        self.metadata_uri = f"zk+hierarchical://{zk_hosts}{self.root}"
        self.directory = Path(tempfile.mkdtemp(prefix=f"walkit-bench-bk-{name}-", dir=directory))
        self._zk = open_metadata_store(f"zk://{zk_hosts}")
        self._procs: list[subprocess.Popen[bytes]] = []
        self.bookie_ids: list[str] = []
        try:
            init_cluster(self._zk, self.root, format="bookkeeper")
            self._start(bookies, settings or {})
        except BaseException:
            self.stop()
            raise

    def _start(self, bookies: int, settings: dict[str, str]) -> None:
        for i in range(bookies):
            port, home = free_port(), self.directory / f"bookie{i}"
            home.mkdir()
            (home / "bk_server.conf").write_text(bookie_conf(port, self.metadata_uri, home, settings))
            with open(home / "bookie.log", "ab") as out:
                self._procs.append(subprocess.Popen(
                    ["java", *BOOKIE_JVM_FLAGS, "-cp", self.classpath, "org.apache.bookkeeper.server.Main",
                     "--conf", str(home / "bk_server.conf")],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT))
            self.bookie_ids.append(f"127.0.0.1:{port}")
        deadline = time.monotonic() + START_TIMEOUT
        for i, bookie_id in enumerate(self.bookie_ids):
            while self._zk.exists(f"{self.root}/available/{bookie_id}") is None:
                log = self.directory / f"bookie{i}" / "bookie.log"
                if self._procs[i].poll() is not None:
                    raise WalkitError("a Java bookie exited", bookie=bookie_id, exit_code=self._procs[i].returncode,
                                      log=log_tail(log))
                if time.monotonic() > deadline:
                    raise WalkitError("a Java bookie did not register", bookie=bookie_id, timeout=START_TIMEOUT,
                                      log=log_tail(log))
                time.sleep(0.1)

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def stop(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            _stop(proc)
        self._zk.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class BenchPeer:
    """The Java client (``settings``: throttle, v2, explicit_lac_ms, parallel_long_poll) in a
    JVM of its own, running the benchmark's workloads on command."""

    def __init__(self, classpath: str, metadata_uri: str, settings: dict[str, Any], log: Path,
                 timeout: float = 120.0) -> None:
        classes = compile_java(PEER_SOURCE, classpath)
        self.log = log
        self._timeout = timeout
        self._log_file: IO[bytes] = open(log, "ab")
        self._proc = subprocess.Popen(
            ["java", *PEER_JVM_FLAGS, "-cp", f"{classes}:{classpath}", "BenchPeer", metadata_uri,
             json.dumps(settings)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log_file)
        ready = self._answer()
        if not ready.get("ready"):
            self.close()
            raise WalkitError("the Java bench peer did not start", answer=ready, log=log_tail(log))

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _answer(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise WalkitError("the Java bench peer exited", exit_code=self._proc.wait(), log=log_tail(self.log))
        answer: dict[str, Any] = json.loads(line)
        return answer

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Run workload ``op`` in the peer; its answer (WalkitError if the peer failed it)."""
        assert self._proc.stdin is not None
        self._proc.stdin.write((json.dumps({"op": op, **args}) + "\n").encode())
        self._proc.stdin.flush()
        answer = self._answer()
        if "error" in answer:
            raise WalkitError(f"the Java client failed {op}", error=answer["error"], detail=answer.get("message"))
        return answer

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.close()
                self._proc.wait(15)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.send_signal(signal.SIGKILL)
                self._proc.wait()
        self._log_file.close()
