"""A real Apache ZooKeeper for the tests: Debian's package, on 127.0.0.1 only.

``ensure_zookeeper()`` installs the ``zookeeper`` package when it is missing (root,
Debian). ``ZooKeeperServer`` starts one standalone server on a free loopback port;
``ZooKeeperEnsemble`` starts a 3-node quorum (``QuorumPeerMain``) whose client, quorum
and election ports are all free loopback ports chosen at run time, and can SIGKILL and
restart single nodes. Both stop their JVMs and remove their temporary directories in
``stop()``. Every JVM runs through :class:`ZooKeeperProcess`.
"""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from walkit.bench._common import free_port  # the one free-port picker, shared with the benches
from walkit._testing._zookeeper import JAR, JVM_FLAGS, SLF4J, START_TIMEOUT, TICK_MS, ensure_zookeeper

STANDALONE_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
__all__ = ["JAR", "JVM_FLAGS", "SLF4J", "START_TIMEOUT", "TICK_MS", "ensure_zookeeper", "free_port", "free_ports",
           "ZooKeeperServer", "ZooKeeperEnsemble", "ZooKeeperProcess"]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


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


def base_config(data_dir: Path, client_port: int) -> str:
    """zoo.cfg lines shared by standalone and quorum servers (client port on loopback)."""
    return (
        f"tickTime={TICK_MS}\ndataDir={data_dir}\nclientPort={client_port}\nclientPortAddress=127.0.0.1\n"
        "admin.enableServer=false\n4lw.commands.whitelist=*\nmaxClientCnxns=0\n"
    )


class ZooKeeperProcess:
    """One ZooKeeper JVM: a config in ``directory``, a log appended across restarts."""

    def __init__(self, name: str, directory: Path, main_class: str, client_port: int, config: str) -> None:
        self.name = name
        self.directory = directory
        self.client_port = client_port
        self._main_class = main_class
        self._cfg = directory / "zoo.cfg"
        self._cfg.write_text(config)
        self._log = directory / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        classpath = ":".join(str(p) for p in (JAR, SLF4J) if p.exists())
        with open(self._log, "ab") as log:
            self._proc = subprocess.Popen(
                ["java", *JVM_FLAGS, "-cp", classpath, self._main_class, str(self._cfg)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def mode(self) -> str:
        """"leader", "follower" or "standalone" while serving requests, else ""."""
        if not self.running:
            return ""
        found = re.search(r"^Mode: (\w+)", four_letter(self.client_port, b"srvr"), re.MULTILINE)
        return found.group(1) if found else ""

    def wait_serving(self, timeout: float = START_TIMEOUT) -> None:
        """Poll ``srvr`` until the server serves requests; RuntimeError with the log tail if not."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                raise RuntimeError(f"{self.name} is not running (exit {self.returncode})\n{self.log_tail()}")
            if self.mode():
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{self.name} not serving after {timeout:.0f} s\n{self.log_tail()}")
            time.sleep(0.05)

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def kill(self) -> None:
        """SIGKILL (no clean shutdown) and reap."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()

    def terminate(self) -> None:
        """Send SIGTERM (does not wait)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        self.terminate()
        if self._proc is None:
            return
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            text = self._log.read_bytes()[-chars:].decode(errors="replace")
        except OSError:
            return f"--- {self.name}: no log ---"
        return f"--- last {chars} chars of {self._log} ---\n{text}"


class ZooKeeperServer:
    """One standalone server; ``hosts`` is its "127.0.0.1:<port>"."""

    def __init__(self) -> None:
        ensure_zookeeper()
        self.port = free_port()
        self.hosts = f"127.0.0.1:{self.port}"
        self._dir = Path(tempfile.mkdtemp(prefix="walkit-zk-"))
        self._node = ZooKeeperProcess("zookeeper", self._dir, STANDALONE_MAIN, self.port,
                                      base_config(self._dir, self.port))
        try:
            self._node.start()
            self._node.wait_serving()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self._node.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


class ZooKeeperEnsemble:
    """A 3-node quorum on 127.0.0.1; nodes are indexed 0..2 (their ``myid`` is index + 1).

    ``hosts`` is the client connect string. A majority (2 of 3) must stay up for writes:
    kill one node at a time.
    """

    SIZE = 3

    def __init__(self, *, init_limit: int = 10, sync_limit: int = 5) -> None:
        ensure_zookeeper()
        ports = free_ports(3 * self.SIZE)
        self.client_ports = ports[0:self.SIZE]
        self.quorum_ports = ports[self.SIZE:2 * self.SIZE]
        self.election_ports = ports[2 * self.SIZE:]
        self.hosts = ",".join(f"127.0.0.1:{p}" for p in self.client_ports)
        self._dir = Path(tempfile.mkdtemp(prefix="walkit-zk-ensemble-"))
        servers = "".join(
            f"server.{i + 1}=127.0.0.1:{q}:{e}\n"
            for i, (q, e) in enumerate(zip(self.quorum_ports, self.election_ports))
        )
        quorum = f"initLimit={init_limit}\nsyncLimit={sync_limit}\nquorumListenOnAllIPs=false\n{servers}"
        self._nodes: list[ZooKeeperProcess] = []
        for i, port in enumerate(self.client_ports):
            node_dir = self._dir / f"node{i + 1}"
            node_dir.mkdir()
            (node_dir / "myid").write_text(f"{i + 1}\n")
            self._nodes.append(ZooKeeperProcess(f"zookeeper node {i} (myid {i + 1}, client port {port})",
                                                node_dir, QUORUM_MAIN, port, base_config(node_dir, port) + quorum))
        try:
            for node in self._nodes:
                node.start()
            self.wait_quorum()
        except BaseException:
            self.stop()
            raise

    def mode(self, i: int) -> str:
        """"leader" or "follower" while node ``i`` serves requests, "" otherwise (down, electing)."""
        return self._nodes[i].mode()

    def running(self, i: int) -> bool:
        return self._nodes[i].running

    def leader(self, timeout: float = START_TIMEOUT) -> int:
        """The index of the node serving as leader (polls until there is one)."""
        deadline = time.monotonic() + timeout
        while True:
            leaders = [i for i in range(self.SIZE) if self.mode(i) == "leader"]
            if len(leaders) == 1:
                return leaders[0]
            if time.monotonic() >= deadline:
                raise RuntimeError(f"no single leader after {timeout:.0f} s (leaders: {leaders})\n{self._tails()}")
            time.sleep(0.05)

    def kill(self, i: int) -> None:
        """SIGKILL node ``i``."""
        self._nodes[i].kill()

    def start(self, i: int) -> None:
        """Restart a killed node on its own data directory and ports (does not wait)."""
        self._nodes[i].start()

    def wait_serving(self, i: int, timeout: float = START_TIMEOUT) -> None:
        self._nodes[i].wait_serving(timeout)

    def wait_quorum(self, timeout: float = START_TIMEOUT) -> int:
        """Wait until every running node serves and one of them leads; returns the leader."""
        deadline = time.monotonic() + timeout
        for node in self._nodes:
            if node.running:
                node.wait_serving(max(0.0, deadline - time.monotonic()))
        return self.leader(max(0.0, deadline - time.monotonic()))

    def restore(self, timeout: float = START_TIMEOUT) -> int:
        """Restart every stopped node and wait for all three to serve; returns the leader."""
        for node in self._nodes:
            if not node.running:
                node.start()
        return self.wait_quorum(timeout)

    def node_of_session(self, session_id: int) -> int | None:
        """The node holding a connection of ``session_id`` (from ``cons``), None if none does."""
        pattern = re.compile(rf"\bsid=0x0*{session_id:x}\b")
        holders = [i for i, node in enumerate(self._nodes)
                   if node.running and pattern.search(four_letter(node.client_port, b"cons"))]
        return holders[0] if len(holders) == 1 else None

    def log_tail(self, i: int, chars: int = 3000) -> str:
        return self._nodes[i].log_tail(chars)

    def _tails(self) -> str:
        return "\n".join(node.log_tail(1500) for node in self._nodes)

    def stop(self) -> None:
        """Stop every node and remove the data directories."""
        for node in self._nodes:
            node.terminate()
        for node in self._nodes:
            node.stop()
        shutil.rmtree(self._dir, ignore_errors=True)
