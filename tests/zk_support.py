"""A real Apache ZooKeeper for the tests: Debian's package, standalone, on 127.0.0.1.

``ensure_zookeeper()`` installs the ``zookeeper`` package when it is missing (root,
Debian); ``ZooKeeperServer`` starts one standalone server on a free loopback port with
its own data directory and stops it (SIGTERM) afterwards.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

JAR = Path("/usr/share/java/zookeeper.jar")
SLF4J = Path("/usr/share/java/slf4j-simple.jar")


def ensure_zookeeper() -> None:
    if JAR.exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError("ZooKeeper is missing: install Debian's 'zookeeper' package (needs root)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-qq", "zookeeper"], check=True, env=env, stdout=subprocess.DEVNULL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def four_letter(port: int, word: bytes) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(word)
            chunks = []
            while True:
                data = s.recv(4096)
                if not data:
                    break
                chunks.append(data)
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


class ZooKeeperServer:
    """One standalone server; ``hosts`` is its "127.0.0.1:<port>"."""

    def __init__(self) -> None:
        ensure_zookeeper()
        self.port = free_port()
        self.hosts = f"127.0.0.1:{self.port}"
        self._dir = Path(tempfile.mkdtemp(prefix="walkit-zk-"))
        cfg = self._dir / "zoo.cfg"
        cfg.write_text(
            f"tickTime=500\ndataDir={self._dir}\nclientPort={self.port}\nclientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n4lw.commands.whitelist=*\nmaxClientCnxns=0\n"
        )
        classpath = ":".join(str(p) for p in (JAR, SLF4J) if p.exists())
        self._log = open(self._dir / "server.log", "wb")
        self._proc = subprocess.Popen(
            ["java", "-Xms32m", "-Xmx128m", "-XX:+UseSerialGC", "-cp", classpath,
             "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)],
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited: {(self._dir / 'server.log').read_text()[-2000:]}")
            if "Mode:" in four_letter(self.port, b"srvr"):
                return
            time.sleep(0.1)
        raise RuntimeError("ZooKeeper did not become ready in time")

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)
