"""``walkit bench bookie``: adds per second through one connection to one bookie process.

The bookie runs as its own process (``python -m bookie``), as users run it, with its
journal on O_DIRECT and no metadata service (registration is not on the add path). One
client connection in this process keeps ``in_flight`` adds of ``size``-byte payloads
(CRC32C-digested entries) outstanding: each acknowledgement sends the next add. After a
warm-up of one second, it counts acknowledgements for ``seconds`` and reads the bookie
process's CPU time (user + system, from ``/proc/<pid>/stat``) before and after, so the
report has the bookie's CPU time per add as well as the rate and the latencies (from
send to acknowledgement).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from walkit.bench._common import cpu_seconds, free_port, latency_percentiles
from walkit.client import BookieClient
from walkit.errors import WalkitError
from walkit.protocol import AddEntry, Response, encode_entry

__all__ = ["run_bookie_bench", "format_markdown"]

_KEY = b"bench-master-key"
_ENTRIES_PER_LEDGER = 100_000


def _start_bookie(base: str, port: int) -> subprocess.Popen[bytes]:
    conf = Path(base) / "bookie.toml"
    conf.write_text(
        f'bookiePort = {port}\njournalDirectory = "{base}/journal"\nledgerDirectories = ["{base}/ledgers"]\n'
        "journalDirectIO = true\n"
    )
    log = open(Path(base) / "bookie.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "bookie", "--conf", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"bookie exited: {(Path(base) / 'bookie.log').read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("bookie did not start listening in time")


async def _drive(port: int, pid: int, seconds: float, in_flight: int, size: int) -> dict[str, Any]:
    client = await BookieClient.connect("127.0.0.1", port)
    payload = os.urandom(size)
    ledger, entry, acked, counting = 1, 0, 0, False
    latencies: list[int] = []
    failures: list[BaseException] = []
    finished = asyncio.get_running_loop().create_future()
    clock = time.perf_counter_ns

    # The adds go through BookieClient.request_cb, the ledger client's path: a callback
    # per answer, no future (and no loop callback) per add.
    def send() -> None:
        nonlocal ledger, entry
        if entry == _ENTRIES_PER_LEDGER:
            ledger, entry = ledger + 1, 0
        data = encode_entry(ledger, entry, entry - 1, (entry + 1) * size, payload, digest="crc32c")
        client.request_cb(AddEntry(ledger, entry, _KEY, data), done, clock())
        entry += 1

    def done(response: Response | None, error: WalkitError | None, sent: int) -> None:
        nonlocal acked
        if finished.done():
            return  # the run is over; close() fails what is still in flight
        if error is not None:
            failures.append(error)
            finished.set_result(None)
            return
        if counting:
            acked += 1
            latencies.append(clock() - sent)
        send()

    for _ in range(in_flight):
        send()
    await asyncio.sleep(1.0)  # warm-up
    counting = True
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    client_cpu0 = time.process_time()
    await asyncio.wait([finished], timeout=seconds)
    elapsed = time.perf_counter() - t0
    cpu1, client_cpu1 = cpu_seconds(pid), time.process_time()
    counting = False
    if not finished.done():
        finished.set_result(None)
    await client.close()
    if failures:
        raise RuntimeError(f"an add failed: {failures[0]!r}")
    return {
        "entry_size": size, "in_flight": in_flight, "seconds": round(elapsed, 2), "adds": acked,
        "adds_per_s": round(acked / elapsed), "mb_per_s": round(acked * size / elapsed / 1e6, 1),
        "bookie_cpu_us_per_add": round((cpu1 - cpu0) / max(acked, 1) * 1e6, 2),
        "bookie_cpu_cores": round((cpu1 - cpu0) / elapsed, 2),
        "client_cpu_us_per_add": round((client_cpu1 - client_cpu0) / max(acked, 1) * 1e6, 2),
    } | latency_percentiles(latencies, digits=2)


def run_bookie_bench(directory: str | None = None, seconds: float = 5.0, in_flight: int = 1000,
                     size: int = 1024) -> dict[str, Any]:
    base = tempfile.mkdtemp(prefix="walkit-bench-bookie-", dir=directory or ".")
    port = free_port()
    proc = _start_bookie(base, port)
    try:
        result = asyncio.run(_drive(port, proc.pid, seconds, in_flight, size))
        result["journal_o_direct"] = "O_DIRECT is not available" not in (Path(base) / "bookie.log").read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(base, ignore_errors=True)
    result["cpus"] = os.cpu_count()
    result["target_adds_per_s"] = 50_000
    return result


def format_markdown(report: dict[str, Any]) -> str:
    return "\n".join([
        "| entry | in flight | adds/s | MB/s | bookie CPU µs/add | bookie cores | client CPU µs/add | p50 ms | p99 ms | p99.9 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {report['entry_size']} B | {report['in_flight']} | {report['adds_per_s']:,} | {report['mb_per_s']} "
        f"| {report['bookie_cpu_us_per_add']} | {report['bookie_cpu_cores']} | {report['client_cpu_us_per_add']} "
        f"| {report['p50_ms']} | {report['p99_ms']} | {report['p999_ms']} |",
    ])
