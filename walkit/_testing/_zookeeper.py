"""A standalone Apache ZooKeeper for tests: Debian's ``zookeeper`` package, on 127.0.0.1.

The same server the walkit test suite runs (``tests/support/zk.py``, trimmed to one
standalone node): the package is installed with apt-get when its jar is missing (root,
Debian), the JVM runs ``ZooKeeperServerMain`` with its client port on a free loopback
port and a data directory of its own, and the start is complete when the server answers
the ``srvr`` four-letter word. :meth:`ZooKeeperServer.stop` ends the JVM (SIGTERM, then
SIGKILL) and removes the directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from walkit.errors import ConfigError, MetadataUnavailableError

__all__ = ["ZooKeeperServer", "ensure_zookeeper", "zookeeper_missing"]

HOST = "127.0.0.1"
JAR = Path("/usr/share/java/zookeeper.jar")
SLF4J = Path("/usr/share/java/slf4j-simple.jar")
MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
JVM_FLAGS = ("-Xms32m", "-Xmx256m", "-XX:+UseSerialGC")
TICK_MS = 500  # sessions may be as short as 2 ticks: 1 s
START_TIMEOUT = 30.0  # seconds: JVM start-up on a busy machine
_LOG_TAIL = 3000


def zookeeper_missing() -> str | None:
    """Why no ZooKeeper can run here without installing it (None: its jar is there)."""
    if JAR.exists():
        return None
    return f"ZooKeeper not installed ({JAR} missing; Debian package 'zookeeper')"


def ensure_zookeeper() -> None:
    """Install Debian's ``zookeeper`` package when its jar is missing (needs root)."""
    if JAR.exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ConfigError("ZooKeeper is missing: install Debian's 'zookeeper' package (needs root)", jar=JAR)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-qq", "zookeeper"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ConfigError("cannot install Debian's 'zookeeper' package", reason=str(exc)) from exc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _mode(port: int) -> str:
    """"standalone" once the server answers ``srvr``, else ""."""
    try:
        with socket.create_connection((HOST, port), timeout=1) as s:
            s.sendall(b"srvr")
            chunks = []
            while data := s.recv(4096):
                chunks.append(data)
    except OSError:
        return ""
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        if line.startswith("Mode: "):
            return line[len("Mode: "):].strip()
    return ""


class ZooKeeperServer:
    """One standalone server, started by the constructor; ``hosts`` is "127.0.0.1:<port>"."""

    def __init__(self, start_timeout: float = START_TIMEOUT) -> None:
        ensure_zookeeper()
        self.port = _free_port()
        self.hosts = f"{HOST}:{self.port}"
        self._dir = Path(tempfile.mkdtemp(prefix="walkit-testing-zk-"))
        self._log = self._dir / "server.log"
        cfg = self._dir / "zoo.cfg"
        cfg.write_text(f"tickTime={TICK_MS}\ndataDir={self._dir}\nclientPort={self.port}\nclientPortAddress={HOST}\n"
                       "admin.enableServer=false\n4lw.commands.whitelist=*\nmaxClientCnxns=0\n")
        classpath = ":".join(str(p) for p in (JAR, SLF4J) if p.exists())
        try:
            with open(self._log, "ab") as log:
                self._proc = subprocess.Popen(["java", *JVM_FLAGS, "-cp", classpath, MAIN, str(cfg)],
                                              stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        except OSError as exc:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise ConfigError("cannot start ZooKeeper (is java installed?)", reason=str(exc)) from exc
        try:
            self._wait_serving(start_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not _mode(self.port):
            if self._proc.poll() is not None:
                raise MetadataUnavailableError("ZooKeeper exited", exit_code=self._proc.returncode, log=self._tail())
            if time.monotonic() > deadline:
                raise MetadataUnavailableError("ZooKeeper did not start serving", timeout=timeout, log=self._tail())
            time.sleep(0.05)

    def _tail(self) -> str:
        try:
            return "\n" + self._log.read_bytes()[-_LOG_TAIL:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 10 s; then remove the data directory (idempotent)."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)
