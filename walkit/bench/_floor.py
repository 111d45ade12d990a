"""The floor of one replicated append on this machine, for ``walkit bench wal``.

Theory of operation
-------------------
What a sequential append costs is mostly not walkit's: three processes receive the
record over loopback TCP, each writes it to its disk and waits for fdatasync, and the
writer waits for the second answer. This module measures that part alone, with
nothing else: three **minimal servers** (``python -m walkit.bench._floor DIR SIZE``, one
process each, one connection, no threads) that receive a record of ``SIZE`` bytes, write
it with one O_DIRECT ``pwrite`` of whole 4 KiB blocks into a zero-filled file (a
bookie's journal in its steady state: recycled or zero-filled files), ``fdatasync``
and answer one byte; and a **writer** that sends each record to the three and returns at
the second answer (E=3, Qw=3, Qa=2, as the benchmark's logs), the third collected
later. No digest, no protocol, no journal threads, no client loop thread.

``walkit bench wal`` runs it beside its local baselines, so each run says how far its
sequential appends are from the floor of replication on the same machine, as well as
from a local write + fdatasync. The servers listen on 127.0.0.1 only, on ports the
kernel picks, write under the benchmark's directory and exit when their connection
closes, or when no writer connected within 30 s (or, failing that, are killed when the
writer closes).
"""

from __future__ import annotations

import mmap
import os
import select
import socket
import subprocess
import sys
from pathlib import Path

__all__ = ["ReplicatedFloor"]

BLOCK = 4096
FILE_BYTES = 16 << 20  # the servers' zero-filled file; writes wrap around in it
SERVERS, ACKS = 3, 2
_START_TIMEOUT = 30.0


class ReplicatedFloor:
    """Three minimal servers and the writer's end: :meth:`append` sends one record to
    all three and returns once two answered. A context manager: the servers stop on exit."""

    def __init__(self, directory: Path, size: int) -> None:
        if size < 1:
            raise ValueError("the floor's records are at least one byte")
        self._size = size
        self._procs: list[subprocess.Popen[str]] = []
        self._socks: list[socket.socket] = []
        self._poll = select.epoll()
        try:
            for i in range(SERVERS):
                proc = subprocess.Popen([sys.executable, "-m", "walkit.bench._floor", str(directory / f"floor-{i}"),
                                         str(size)], stdout=subprocess.PIPE, text=True)
                self._procs.append(proc)
            for proc in self._procs:
                assert proc.stdout is not None
                port = int(proc.stdout.readline())
                sock = socket.create_connection(("127.0.0.1", port), timeout=_START_TIMEOUT)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setblocking(True)
                self._socks.append(sock)
                self._poll.register(sock.fileno(), select.EPOLLIN)
        except BaseException:
            self.close()
            raise
        self._index = {s.fileno(): i for i, s in enumerate(self._socks)}
        self._sent = 0
        self._acked = [0] * SERVERS

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def append(self, record: bytes) -> int:
        """Send ``record`` to the three servers; return (1) once two have it on disk."""
        if len(record) != self._size:
            raise ValueError(f"the servers expect records of {self._size} bytes, not {len(record)}")
        for sock in self._socks:
            sock.sendall(record)
        self._sent += 1
        sent, acked, index = self._sent, self._acked, self._index
        while sum(1 for n in acked if n >= sent) < ACKS:
            for fd, _ in self._poll.poll():
                data = os.read(fd, 64)
                if not data:
                    raise ConnectionError("a floor server went away")
                acked[index[fd]] += len(data)
        return 1

    def close(self) -> None:
        for sock in self._socks:
            sock.close()
        self._poll.close()
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    def __enter__(self) -> ReplicatedFloor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_direct(path: str) -> int:
    """The server's file, O_DIRECT where the file system allows it, zero-filled."""
    flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC
    try:
        fd = os.open(path, flags | getattr(os, "O_DIRECT", 0), 0o644)
    except OSError:
        fd = os.open(path, flags, 0o644)  # e.g. a tmpfs without O_DIRECT
    zeros = mmap.mmap(-1, 1 << 20)
    for offset in range(0, FILE_BYTES, len(zeros)):
        os.pwrite(fd, zeros, offset)
    os.fsync(fd)
    zeros.close()
    return fd


def serve(path: str, size: int) -> None:
    """One server: print the port, take one connection, then record by record: receive,
    write, fdatasync, answer. Exits when the connection closes; removes its file."""
    fd = _open_direct(path)
    blocks = -(-max(size, 1) // BLOCK) * BLOCK
    buf = mmap.mmap(-1, blocks)  # page-aligned: an O_DIRECT buffer
    record = bytearray(size)
    view = memoryview(record)
    try:
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            listener.settimeout(_START_TIMEOUT)  # a writer that died before connecting: exit
            print(listener.getsockname()[1], flush=True)
            conn, _ = listener.accept()
            conn.settimeout(None)
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            offset = 0
            while True:
                got = 0
                while got < size:
                    n = conn.recv_into(view[got:])
                    if not n:
                        return
                    got += n
                buf[:size] = record
                os.pwrite(fd, buf, offset)
                os.fdatasync(fd)
                offset = (offset + blocks) % (FILE_BYTES - blocks)
                conn.sendall(b"\x01")
    finally:
        os.close(fd)
        os.unlink(path)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
