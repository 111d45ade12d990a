"""The bookie's admin endpoint (bookie/_http.py) and its metrics (bookie/_metrics.py,
walkit/metrics.py): every endpoint on an in-process bookie, the metrics moving with
real traffic (adds, reads, refusals, read-only, journal batches, checkpoints), clear 4xx
answers to wrong methods, paths and bodies, keep-alive, the config keys, and the slow
journal sync warning (issue 17). The transport's limits (bookie/_http_connection.py, issue
36), on an endpoint over a stub AdminView with raw sockets: malformed and oversized requests, slow clients, pipelining,
clients gone mid-way, HTTP/1.0, 100-continue - each answered or closed, nothing logged as
an error, no task left behind."""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import json
import logging
import re
import select
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

import bookie._http_connection as http_connection
from bookie import BookieConfig
from bookie._http import AdminEndpoint
from bookie.fs.mem import MemFS, _MemFile
from support.bookie import KEY, client_of, config, entry, in_process, run
from walkit.errors import BookieReadOnlyError, ConfigError, NoSuchEntryError
from walkit.metadata import init_cluster, open_metadata_store, parse_metadata_uri
from walkit.metrics import Histogram

pytestmark = pytest.mark.timeout(120)

Reply = tuple[int, dict[str, str], bytes]


def _request(port: int, method: str, path: str, body: bytes | None = None) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


async def _http(port: int, method: str, path: str, body: bytes | None = None) -> Reply:
    return await asyncio.get_running_loop().run_in_executor(None, _request, port, method, path, body)


async def _json(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    status, _, data = await _http(port, method, path, None if body is None else json.dumps(body).encode())
    return status, json.loads(data)


async def _metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, headers, data = await _http(port, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(data.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _local_metadata(tmp_path: Path) -> str:
    uri = f"local://{tmp_path / 'md'}"
    admin = open_metadata_store(parse_metadata_uri(uri), create=True)
    init_cluster(admin, "/ledgers")
    admin.close()
    return uri


def test_histogram_buckets_are_inclusive_upper_bounds_and_cumulative() -> None:
    h = Histogram((0.001, 0.01, 0.1))
    for value in (0.0005, 0.001, 0.002, 0.01, 5.0):
        h.observe(value)
    assert h.counts == [2, 2, 0, 1] and h.count == 5 and h.sum == pytest.approx(5.0135)
    family = h.family("walkit_test_seconds", "test")
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    assert buckets == {"0.001": 2, "0.01": 4, "0.1": 4, "+Inf": 5}
    with pytest.raises(ValueError):
        Histogram((0.1, 0.01))
    with pytest.raises(ValueError):
        Histogram(())


def test_config_keys() -> None:
    defaults = BookieConfig()
    assert (defaults.http_server_enabled, defaults.http_server_port, defaults.http_server_address) == (
        False, 8000, "127.0.0.1")
    assert defaults.journal_sync_warn_millis == 1000
    for key, value in (("httpServerPort", 70000), ("httpServerPort", -1), ("journalSyncWarnMillis", 0)):
        with pytest.raises(ConfigError) as err:
            BookieConfig.from_dict({key: value})
        assert key in str(err.value)


def test_the_endpoint_is_off_by_default(tmp_path: Path) -> None:
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            assert server.http_port == 0

    run(body)


def test_every_endpoint_and_metrics_that_move_with_traffic(tmp_path: Path) -> None:
    uri = _local_metadata(tmp_path)

    async def body() -> None:
        cfg = config(tmp_path, metadata_service_uri=uri, http_server_enabled=True, http_server_port=0,
                     flush_interval=100)
        async with in_process(cfg, disk_usage=lambda path: 0.25) as server:
            port = server.http_port
            assert port > 0
            status, headers, data = await _http(port, "GET", "/heartbeat")
            assert (status, data) == (200, b"OK\n") and headers["content-type"].startswith("text/plain")
            before = await _metrics(port)
            client = await client_of(server)
            n = 200
            await asyncio.gather(*(client.add_entry(7, e, KEY, entry(7, e, b"x" * 100)) for e in range(n)))
            assert (await client.read_entry(7, 3)).data == entry(7, 3, b"x" * 100)
            with pytest.raises(NoSuchEntryError):
                await client.read_entry(7, n + 5)
            await asyncio.sleep(0.5)  # a checkpoint (flushInterval 100 ms)
            m = await _metrics(port)
            assert m[("walkit_bookie_requests_total", (("op", "add_entry"), ("status", "EOK")))] == n
            assert m[("walkit_bookie_requests_total", (("op", "read_entry"), ("status", "EOK")))] == 1
            assert m[("walkit_bookie_requests_total", (("op", "read_entry"), ("status", "ENOENTRY")))] == 1
            assert m[("walkit_bookie_journal_records_total", ())] >= n  # + the master key record
            flushes = m[("walkit_bookie_journal_sync_seconds_count", ())]
            assert 1 <= flushes <= n + 1
            assert m[("walkit_bookie_journal_flush_records_sum", ())] == m[("walkit_bookie_journal_records_total", ())]
            assert sum(v for (name, _), v in m.items() if name == "walkit_bookie_journal_flushes_total") == flushes
            assert m[("walkit_bookie_journal_written_bytes_total", ())] >= n * 100
            assert m[("walkit_bookie_journal_zero_filled_bytes_total", ())] > 0  # a new journal: filled ahead
            assert m[("walkit_bookie_journal_zero_fill_failures_total", ())] == 0
            assert m[("walkit_bookie_received_bytes_total", ())] - before[("walkit_bookie_received_bytes_total", ())] \
                > n * 100
            assert m[("walkit_bookie_sent_bytes_total", ())] > 0
            assert m[("walkit_bookie_connections", ())] >= 1 and m[("walkit_bookie_adds_in_flight", ())] == 0
            assert m[("walkit_bookie_checkpoints_total", ())] >= 1
            assert m[("walkit_bookie_checkpoint_seconds_count", ())] == m[("walkit_bookie_checkpoints_total", ())]
            ledgers = str(tmp_path / "ledgers")
            assert m[("walkit_bookie_entry_log_bytes", (("directory", ledgers),))] >= n * 100
            assert m[("walkit_bookie_index_bytes", (("directory", ledgers),))] > 0
            assert m[("walkit_bookie_disk_usage_ratio", (("directory", ledgers),))] == 0.25
            assert m[("walkit_bookie_readonly", ())] == 0
            assert ("walkit_bookie_gc_passes_total", ()) in m

            status, info = await _json(port, "GET", "/api/v1/bookie/info")
            assert status == 200 and info["id"] == server.bookie_id and info["state"] == "writable"
            assert info["ledger_directories"][0]["directory"] == ledgers
            assert info["ledger_directories"][0]["usage"] == 0.25 and info["version"]
            assert info["journal"]["mark"]["offset"] > 0 and info["autorecovery"] is False

            assert await _json(port, "GET", "/api/v1/bookie/state/readonly") == (
                200, {"readonly": False, "forced": False})
            assert await _json(port, "PUT", "/api/v1/bookie/state/readonly", {"readonly": True}) == (
                200, {"readonly": True, "forced": True})
            with pytest.raises(BookieReadOnlyError):
                await client.add_entry(7, n, KEY, entry(7, n))
            m = await _metrics(port)
            assert m[("walkit_bookie_readonly", ())] == 1
            assert m[("walkit_bookie_adds_refused_total", (("reason", "readonly"),))] == 1
            assert m[("walkit_bookie_requests_total", (("op", "add_entry"), ("status", "EREADONLY")))] == 1
            assert (await _json(port, "GET", "/api/v1/bookie/info"))[1]["state"] == "readonly"
            assert (await _json(port, "PUT", "/api/v1/bookie/state/readonly", {"readonly": False}))[1] == {
                "readonly": False, "forced": False}
            await client.add_entry(7, n, KEY, entry(7, n))

            status, gc = await _json(port, "GET", "/api/v1/bookie/gc")
            assert status == 200 and gc["bookie"] == server.bookie_id and "passes" in gc
            status, started = await _json(port, "PUT", "/api/v1/bookie/gc", {})
            assert status == 200 and started["pass"] >= 1
            status, error = await _json(port, "PUT", "/api/v1/bookie/gc", {"compact": "everything"})
            assert status == 400 and "compact" in error["error"]
            status, error = await _json(port, "GET", "/api/v1/autorecovery/status")
            assert status == 404 and "autoRecoveryDaemonEnabled" in error["error"]
            await client.close()

    run(body)


def test_wrong_requests_get_a_clear_4xx_and_the_connection_is_kept(tmp_path: Path) -> None:
    async def body() -> None:
        async with in_process(config(tmp_path, http_server_enabled=True, http_server_port=0)) as server:
            port = server.http_port
            status, _, data = await _http(port, "GET", "/nowhere")
            assert status == 404 and json.loads(data) == {"error": "no such path: /nowhere", "status": 404}
            status, headers, data = await _http(port, "POST", "/heartbeat", b"{}")
            assert status == 405 and headers["allow"] == "GET" and "POST not allowed" in json.loads(data)["error"]
            status, headers, _ = await _http(port, "DELETE", "/api/v1/bookie/state/readonly")
            assert status == 405 and headers["allow"] == "GET, PUT"
            for bad in (b"not json", b"[1]", b'{"readonly": "yes"}', b""):
                status, _, data = await _http(port, "PUT", "/api/v1/bookie/state/readonly", bad)
                assert status == 400 and json.loads(data)["error"], bad
            status, _, data = await _http(port, "PUT", "/api/v1/bookie/gc", b'{"compakt": "minor"}')
            assert status == 400 and "compakt" in json.loads(data)["error"]
            status, _, _ = await _http(port, "PUT", "/api/v1/bookie/gc", b"x" * (65 << 10))
            assert status == 413
            status, headers, data = await _http(port, "HEAD", "/heartbeat")
            assert status == 200 and data == b"" and headers["content-length"] == "3"

            def raw(payload: bytes) -> bytes:
                with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                    s.sendall(payload)
                    chunks = []
                    while True:
                        chunk = s.recv(65536)
                        if not chunk:
                            return b"".join(chunks)
                        chunks.append(chunk)

            loop = asyncio.get_running_loop()
            answer = await loop.run_in_executor(None, raw, b"GARBAGE\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 400 ") and b"malformed request line" in answer
            answer = await loop.run_in_executor(None, raw, b"GET / HTTP/1.1\r\nno colon here\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 400 ") and b"malformed header" in answer
            # keep-alive: two requests on one connection, the second closing it
            answer = await loop.run_in_executor(None, raw, b"GET /heartbeat HTTP/1.1\r\nHost: x\r\n\r\n"
                                                b"GET /heartbeat HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert answer.count(b"HTTP/1.1 200 OK") == 2 and answer.endswith(b"OK\n")

    run(body)


def test_the_endpoint_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        async def body() -> None:
            with pytest.raises(Exception) as err:
                async with in_process(config(tmp_path, http_server_enabled=True, http_server_port=port)):
                    pass
            assert "admin endpoint" in str(err.value) and str(port) in str(err.value)

        run(body)


def test_a_slow_journal_sync_is_logged_and_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    real = _MemFile.pwritev_sync

    def slow(self: _MemFile, buffers: list[memoryview], offset: int, datasync: bool = True) -> int:
        time.sleep(0.03)
        return real(self, buffers, offset, datasync)

    monkeypatch.setattr(_MemFile, "pwritev_sync", slow)

    async def body() -> None:
        cfg = config(tmp_path, http_server_enabled=True, http_server_port=0, journal_sync_warn_millis=10)
        async with in_process(cfg, fs=MemFS(), disk_usage=lambda path: 0.1) as server:
            client = await client_of(server)
            await client.add_entry(3, 0, KEY, entry(3, 0))
            m = await _metrics(server.http_port)
            assert m[("walkit_bookie_journal_slow_syncs_total", ())] >= 1
            assert m[("walkit_bookie_journal_sync_seconds_bucket", (("le", "0.025"),))] == 0
            await client.close()

    with caplog.at_level(logging.WARNING, logger="bookie.journal"):
        run(body)
    assert "(journalSyncWarnMillis: 10)" in caplog.text and "took" in caplog.text


# --- the transport's limits (issue 36): an endpoint over a stub AdminView, raw sockets --------
@dataclasses.dataclass
class _Stub:
    """An AdminView without a bookie: what the transport tests need of a server."""

    config: BookieConfig
    read_executor: ThreadPoolExecutor
    bookie: None = None
    bookie_id: str = "stub:3181"
    port: int = 3181
    tls: bool = False
    readonly: bool = False
    forced_readonly: bool = False
    autorecovery: None = None
    failure: None = None

    def disk_usage_of(self, directory: str) -> float:
        return 0.5


_BIG = 8 << 20  # the size of the stub's gc.status answer: more than the socket buffers hold


def _commands(command: str, args: bytes) -> dict[str, Any]:
    return {"command": command, "args": json.loads(args), "pad": "x" * _BIG if command == "gc.status" else ""}


def _endpoint_test(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                   test: Callable[[AdminEndpoint], Awaitable[None]], **limits: float) -> None:
    """Run ``test`` against a started endpoint, then check the rules every limit keeps: no
    connection task left once the clients are done, none after stop, nothing logged as an
    error and no traceback."""
    for name, value in limits.items():
        monkeypatch.setattr(http_connection, name, value)

    async def main() -> None:
        with ThreadPoolExecutor(2) as pool:
            view = _Stub(BookieConfig(http_server_enabled=True, http_server_port=0), pool)
            endpoint = AdminEndpoint(view, CollectorRegistry(), _commands)
            await endpoint.start()
            try:
                await test(endpoint)
                for _ in range(100):
                    if endpoint.open_connections == 0:
                        break
                    await asyncio.sleep(0.05)
                assert endpoint.open_connections == 0, "a connection task outlived its client"
            finally:
                await endpoint.stop()
        left = [t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "").startswith("AdminEndpoint")]
        assert not left, left

    with caplog.at_level(logging.DEBUG, logger="bookie.http"):
        run(main)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text
    assert "Traceback" not in caplog.text


def _talk(port: int, *parts: bytes | float, timeout: float = 10.0) -> tuple[bytes, bool]:
    """Send ``parts`` (a float: sleep that long), then read until the server closes: what
    came back and whether the server closed (False: still open at ``timeout``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        for part in parts:
            if isinstance(part, float):
                time.sleep(part)
            else:
                s.sendall(part)
        return _read_to_end(s)


def _read_to_end(s: socket.socket) -> tuple[bytes, bool]:
    chunks = []
    try:
        while chunk := s.recv(65536):
            chunks.append(chunk)
    except TimeoutError:
        return b"".join(chunks), False
    return b"".join(chunks), True


def _dribble(port: int, data: bytes, every: float, timeout: float = 10.0) -> tuple[bytes, bool, float]:
    """Send ``data`` a byte every ``every`` seconds until the server answers or closes;
    (the answer, closed, seconds it took)."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        for i in range(len(data)):
            if select.select([s], [], [], every)[0]:
                break
            s.sendall(data[i:i + 1])
        answer, closed = _read_to_end(s)
    return answer, closed, time.monotonic() - start


async def _in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


def _statuses(answer: bytes) -> list[bytes]:
    return re.findall(rb"(?:^|\n)HTTP/1\.1 (\d{3}) ", answer)


def _closing(answer: bytes, status: int, words: str) -> None:
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:200]
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"\r\nConnection: close" in head, head
    assert json.loads(body) == {"error": json.loads(body)["error"], "status": status} and words in body.decode()


_GET = b"GET /heartbeat HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("request_bytes, words", [
    (b"GARBAGE\r\n\r\n", "malformed request line"),
    (b"G\xffT / HTTP/1.1\r\nHost: x\r\n\r\n", "malformed request line"),
    (b"\r\n\r\nGET / HTTP/1.1\r\n\r\n", "malformed request line"),
    (b"GET /heartbeat HTTP/2.0\r\nHost: x\r\n\r\n", "malformed request line"),
    (b"GET http://x/heartbeat HTTP/1.1\r\nHost: x\r\n\r\n", "malformed request line"),
    (b"GET / HTTP/1.1\r\nno colon here\r\n\r\n", "malformed header"),
    (b"GET / HTTP/1.1\r\nHost: x\r\nX-Bad : y\r\n\r\n", "malformed header"),
    (b"GET /heartbeat HTTP/1.1\r\n\r\n", "Host"),
    (b"GET /heartbeat HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", "Host"),
    (b"PUT /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n", "Content-Length"),
    (b"PUT /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
     "chunked bodies are not accepted"),
    (b"PUT /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", "chunked bodies"),
])
def test_a_malformed_request_is_a_400_and_the_connection_closed(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, request_bytes: bytes, words: str) -> None:
    async def test(endpoint: AdminEndpoint) -> None:
        answer, closed = await _in_thread(_talk, endpoint.port, request_bytes + _GET)  # the GET is not answered
        assert closed and _statuses(answer) == [b"400"]
        _closing(answer, 400, words)

    _endpoint_test(monkeypatch, caplog, test)
    assert "refused (400)" in caplog.text  # one info line


def test_oversized_headers_are_a_431_by_total_bytes_and_by_count(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    async def test(endpoint: AdminEndpoint) -> None:
        one_long = b"GET /heartbeat HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * (20 << 10) + b"\r\n\r\n"
        many_short = b"GET /heartbeat HTTP/1.1\r\nHost: x\r\n" + b"".join(
            b"X-%03d: %s\r\n" % (i, b"b" * 60) for i in range(90)) + b"\r\n"  # 90 headers, 6 KiB: fine
        many_short = many_short.replace(b"Host: x", b"Connection: close\r\nHost: x")
        answer, closed = await _in_thread(_talk, endpoint.port, many_short)
        assert closed and _statuses(answer) == [b"200"]
        # under 8 KiB each and under 100 headers (the old caps), 18 KiB in all: refused
        wide = b"GET /heartbeat HTTP/1.1\r\nHost: x\r\n" + b"".join(
            b"X-%03d: %s\r\n" % (i, b"c" * 300) for i in range(60)) + b"\r\n"
        too_many = b"GET /heartbeat HTTP/1.1\r\nHost: x\r\n" + b"".join(
            b"X-%03d: d\r\n" % i for i in range(101)) + b"\r\n"
        for request_bytes, words in ((one_long, "over 16384 bytes"), (wide, "over 16384 bytes"),
                                     (too_many, "over 100 headers")):
            answer, closed = await _in_thread(_talk, endpoint.port, request_bytes)
            assert closed and _statuses(answer) == [b"431"]
            _closing(answer, 431, words)
        # a header block that never ends is cut at the cap, not buffered for ever
        answer, closed = await _in_thread(_talk, endpoint.port, b"GET / HTTP/1.1\r\nX: " + b"e" * (64 << 10))
        assert closed and _statuses(answer) == [b"431"]

    _endpoint_test(monkeypatch, caplog, test)


def test_an_oversized_body_is_a_413_before_it_is_read(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    async def test(endpoint: AdminEndpoint) -> None:
        big = 64 << 10
        request_bytes = b"PUT /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (big + 1)
        answer, closed = await _in_thread(_talk, endpoint.port, request_bytes + b"{" * (big + 1))
        assert closed and _statuses(answer) == [b"413"]
        _closing(answer, 413, "body over 65536 bytes")
        # announced but never sent (nor waited for): answered at once
        answer, closed = await _in_thread(_talk, endpoint.port, b"PUT /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\n"
                                          b"Content-Length: 1000000000\r\n\r\n", timeout=5.0)
        assert closed and _statuses(answer) == [b"413"]
        # the limit itself is fine
        body = b'{"compact": null' + b" " * (big - 17) + b"}"
        answer, closed = await _in_thread(_talk, endpoint.port, b"PUT /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\n"
                                          b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        assert closed and _statuses(answer) == [b"200"] and b'"gc.run"' in answer

    _endpoint_test(monkeypatch, caplog, test)


def test_expect_100_continue(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def continued(port: int) -> tuple[bytes, bytes, bool]:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"PUT /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                      b"Connection: close\r\nContent-Length: 2\r\n\r\n")
            interim = s.recv(65536)  # nothing else can come before the body is sent
            s.sendall(b"{}")
            return (interim, *_read_to_end(s))

    async def test(endpoint: AdminEndpoint) -> None:
        interim, answer, closed = await _in_thread(continued, endpoint.port)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert closed and _statuses(answer) == [b"200"] and b'"gc.run"' in answer
        # refused on its headers: no 100, the answer, closed
        answer, closed = await _in_thread(_talk, endpoint.port, b"PUT /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\n"
                                          b"Expect: 100-continue\r\nContent-Length: 70000\r\n\r\n")
        assert closed and _statuses(answer) == [b"413"]

    _endpoint_test(monkeypatch, caplog, test)


def test_slow_loris_is_cut_at_the_whole_request_deadline(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    async def test(endpoint: AdminEndpoint) -> None:
        # a byte every 50 ms never lets the idle time (1 s) run out; the request's deadline (0.6 s) does
        headers = b"GET /heartbeat HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"z" * 1000
        answer, closed, took = await _in_thread(_dribble, endpoint.port, headers, 0.05)
        assert closed and _statuses(answer) == [b"408"] and took < 3.0, (answer, took)
        _closing(answer, 408, "request not whole within 0.6 s")
        # the body dribbled: the same
        body_slow = b"PUT /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n"
        answer, closed = await _in_thread(_talk, endpoint.port, body_slow, 0.2, b"{", 0.2, b" ", 0.2, b" ", 0.2,
                                          b" ", 0.2, b" ")
        assert closed and _statuses(answer) == [b"408"]
        # a connection that never says a word is closed at the idle time, without an answer
        start = time.monotonic()
        answer, closed = await _in_thread(_talk, endpoint.port)
        assert (answer, closed) == (b"", True) and time.monotonic() - start < 3.0
        # a kept connection, idle after its first answer: closed the same way
        answer, closed = await _in_thread(_talk, endpoint.port, _GET)
        assert closed and _statuses(answer) == [b"200"]

    _endpoint_test(monkeypatch, caplog, test, IDLE=1.0, REQUEST_DEADLINE=0.6, LINGER=0.5)
    assert "refused (408)" in caplog.text


def test_connections_over_the_cap_are_turned_away_with_a_503(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    async def test(endpoint: AdminEndpoint) -> None:
        idle = [socket.create_connection(("127.0.0.1", endpoint.port), timeout=10) for _ in range(3)]
        try:
            for _ in range(100):  # each accepted and served (waiting for its first byte)
                if endpoint.open_connections == 3:
                    break
                await asyncio.sleep(0.02)
            assert endpoint.open_connections == 3
            answer, closed = await _in_thread(_talk, endpoint.port, _GET)
            assert closed
            _closing(answer, 503, "over 3 connections open")
        finally:
            for s in idle:
                s.close()
        for _ in range(100):
            if endpoint.open_connections == 0:
                break
            await asyncio.sleep(0.02)
        answer, closed = await _in_thread(_talk, endpoint.port, _GET)  # room again: served
        assert _statuses(answer) == [b"200"]

    _endpoint_test(monkeypatch, caplog, test, MAX_CONNECTIONS=3, IDLE=1.0)
    assert "turned away" in caplog.text


def test_pipelined_requests_are_answered_in_order(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    async def test(endpoint: AdminEndpoint) -> None:
        pipeline = (_GET + b"PUT /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n"
                    b'{"compact": "minor"}'
                    + b"DELETE /heartbeat HTTP/1.1\r\nHost: x\r\n\r\n"
                    + b"HEAD /heartbeat HTTP/1.1\r\nHost: x\r\n\r\n"
                    + b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
                    + b"GET /heartbeat HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                    + _GET)  # after Connection: close: never answered
        answer, closed = await _in_thread(_talk, endpoint.port, pipeline)
        assert closed and _statuses(answer) == [b"200", b"200", b"405", b"200", b"404", b"200"], answer
        assert answer.endswith(b"\r\n\r\nOK\n") and b"Allow: GET\r\n" in answer and b'"minor"' in answer
        # a malformed request ends the pipeline: what came before it answered, nothing after
        answer, closed = await _in_thread(_talk, endpoint.port, _GET * 5 + b"GARBAGE\r\n\r\n" + _GET)
        assert closed and _statuses(answer) == [b"200"] * 5 + [b"400"]
        # many requests in one write, one answer each, in order
        answer, closed = await _in_thread(_talk, endpoint.port, _GET * 200
                                          + b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert closed and _statuses(answer) == [b"200"] * 200 + [b"404"]

    _endpoint_test(monkeypatch, caplog, test)


def test_clients_gone_mid_request_or_mid_answer_end_their_task(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def close_after(port: int, data: bytes, reset: bool = False) -> None:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if reset:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        s.sendall(data)
        time.sleep(0.1)
        s.close()

    def never_reads(port: int, endpoint: AdminEndpoint) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\n\r\n")  # 8 MiB back, never read
            deadline = time.monotonic() + 5
            while endpoint.open_connections and time.monotonic() < deadline:
                time.sleep(0.05)
            assert endpoint.open_connections == 0, "the answer the client does not take holds the task"

    async def test(endpoint: AdminEndpoint) -> None:
        port = endpoint.port
        for partial in (b"GET /heart", b"GET /heartbeat HTTP/1.1\r\nHost: x\r\nX-Half: ",
                        b"PUT /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"com"):
            await _in_thread(close_after, port, partial)  # then closed (FIN)
            await _in_thread(close_after, port, partial, reset=True)  # or reset
        # gone mid-answer (8 MiB): closed, or reset
        await _in_thread(close_after, port, b"GET /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\n\r\n")
        await _in_thread(close_after, port, b"GET /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\n\r\n", reset=True)
        await _in_thread(never_reads, port, endpoint)

    _endpoint_test(monkeypatch, caplog, test, SEND_DEADLINE=0.5)
    assert "refused" not in caplog.text  # nobody left to answer: no 400s sent or logged


def test_http_1_0_is_answered_and_closed(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    async def test(endpoint: AdminEndpoint) -> None:
        answer, closed = await _in_thread(_talk, endpoint.port, b"GET /heartbeat HTTP/1.0\r\n\r\n" + _GET)
        assert closed and _statuses(answer) == [b"200"] and answer.endswith(b"\r\n\r\nOK\n")
        assert b"\r\nConnection: close\r\n" in answer
        answer, closed = await _in_thread(_talk, endpoint.port, b"HEAD /heartbeat HTTP/1.0\r\n\r\n")
        assert closed and answer.endswith(b"Content-Length: 3\r\nConnection: close\r\n\r\n")
        answer, closed = await _in_thread(_talk, endpoint.port, b"GET /nowhere HTTP/1.0\r\n\r\n")
        assert closed and _statuses(answer) == [b"404"]

    _endpoint_test(monkeypatch, caplog, test)


def test_wrong_methods_and_paths_keep_the_connection(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    async def test(endpoint: AdminEndpoint) -> None:
        answer, closed = await _in_thread(_talk, endpoint.port, b"BREW /heartbeat HTTP/1.1\r\nHost: x\r\n\r\n",
                                          b"POST /api/v1/bookie/gc HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
                                          b"GET /api/v1/nothing?x=1 HTTP/1.1\r\nHost: x\r\n\r\n",
                                          b"GET /api/v1/autorecovery/status HTTP/1.1\r\nHost: x\r\n\r\n",
                                          b"GET /api/v1/bookie/info/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert closed and _statuses(answer) == [b"405", b"405", b"404", b"404", b"200"], answer
        assert b"Allow: GET\r\n" in answer and b"Allow: GET, PUT\r\n" in answer
        assert b'"id": "stub:3181"' in answer and b'"usage": 0.5' in answer

    _endpoint_test(monkeypatch, caplog, test)
