"""The bookie's admin endpoint (bookie/_http.py) and its metrics (bookie/_metrics.py,
walkit/metrics.py): every endpoint on an in-process bookie, the metrics moving with
real traffic (adds, reads, refusals, read-only, journal batches, checkpoints), clear 4xx
answers to wrong methods, paths and bodies, keep-alive, the config keys, and the slow
journal sync warning (issue 17)."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bookie import BookieConfig
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
                                                b"GET /heartbeat HTTP/1.1\r\nConnection: close\r\n\r\n")
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
