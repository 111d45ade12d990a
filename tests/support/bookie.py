"""Bookies for the tests: in this process (:func:`in_process`) or as real processes
(:class:`BookieProcess`, ``python -m bookie --conf``) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bookie import BookieConfig
from bookie.server import BookieServer
from walkit.client import BookieClient
from walkit.protocol import encode_entry
from support.zk import free_port

T = TypeVar("T")
KEY = b"master-key"


def entry(ledger_id: int, entry_id: int, payload: bytes = b"", lac: int | None = None) -> bytes:
    """A valid entry (CRC32C digest) as a writer would send it."""
    body = payload or f"L{ledger_id}E{entry_id}".encode()
    return encode_entry(ledger_id, entry_id, entry_id - 1 if lac is None else lac, 0, body)


def config(base: Path, **overrides: Any) -> BookieConfig:
    values: dict[str, Any] = {
        "bookie_id": "test-bookie", "bookie_port": 0, "journal_directory": str(base / "journal"), "ledger_directories": [str(base / "ledgers")],
        "flush_interval": 1000,
    }
    values.update(overrides)
    return BookieConfig(**values)


def run(coro_fn: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
    """Run a test coroutine in a fresh event loop, bounded."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro_fn(), timeout)

    return asyncio.run(bounded())


@contextlib.asynccontextmanager
async def in_process(cfg: BookieConfig, **kwargs: Any) -> AsyncIterator[BookieServer]:
    server = BookieServer(cfg, **kwargs)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def client_of(server: BookieServer, **kwargs: Any) -> BookieClient:
    return await BookieClient.connect("127.0.0.1", server.port, **kwargs)


def _toml(values: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    return "".join(f"{k} = {value(v)}\n" for k, v in values.items())


class BookieProcess:
    """``python -m bookie --conf <base>/bookie.toml`` with BookKeeper key names; the same
    port and directories across restarts."""

    def __init__(self, base: Path, metadata_uri: str = "", port: int | None = None, **keys: Any) -> None:
        self.base = base
        self.port = free_port() if port is None else port
        self.keys: dict[str, Any] = {
            "bookiePort": self.port, "journalDirectory": str(base / "journal"),
            "ledgerDirectories": [str(base / "ledgers")], "metadataServiceUri": metadata_uri,
            "zkTimeout": 2000, "flushInterval": 1000,
        }
        self.keys.update(keys)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = base / "bookie.log"
        self._log_from = 0
        base.mkdir(parents=True, exist_ok=True)

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> BookieProcess:
        conf = self.base / "bookie.toml"
        conf.write_text(_toml(self.keys))
        self._log_from = len(self.log())
        log = open(self.log_path, "ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "bookie", "--conf", str(conf)], stdout=log,
                                     stderr=subprocess.STDOUT, env=env)
        log.close()
        if wait:
            self.wait_serving()
        return self

    def wait_serving(self, timeout: float = 60.0) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"bookie exited {self.proc.returncode}: {self.log()[-3000:]}")
            if "serving on" in self.log()[self._log_from:]:
                return
            time.sleep(0.05)
        raise RuntimeError(f"bookie did not start serving in time: {self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no shutdown, no checkpoint, no deregistration."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait: the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def wait_exit(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def make_certificates(d: Path) -> dict[str, str]:
    """A throwaway CA, a bookie certificate for 127.0.0.1 signed by it, a client
    certificate (key and chain in one PEM), and a stranger CA that signed nothing here."""
    import trustme

    ca, stranger = trustme.CA(), trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    client_cert = ca.issue_cert("client.walkit.test")
    paths = {"ca": d / "ca.pem", "stranger": d / "stranger.pem", "cert": d / "bookie.pem", "key": d / "bookie.key",
             "client": d / "client.pem"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    stranger.cert_pem.write_to_path(str(paths["stranger"]))
    server_cert.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    server_cert.private_key_pem.write_to_path(str(paths["key"]))
    client_cert.private_key_and_cert_chain_pem.write_to_path(str(paths["client"]))
    return {k: str(v) for k, v in paths.items()}


@dataclass(frozen=True)
class Usage:
    """What a process holds, from /proc: resident memory, open files, threads."""

    rss: int  # bytes
    fds: int
    threads: int

    @classmethod
    def of(cls, pid: int) -> Usage:
        status = Path(f"/proc/{pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return cls(rss=int(fields["VmRSS"].split()[0]) * 1024, fds=len(os.listdir(f"/proc/{pid}/fd")),
                   threads=int(fields["Threads"]))
