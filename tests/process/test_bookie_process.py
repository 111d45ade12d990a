"""Real bookie processes (``python -m bookie --conf``) on 127.0.0.1, as users run them."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.bookie import KEY, BookieProcess, entry, free_port, make_certificates, run
from walkit.client import BookieClient, client_ssl_context
from walkit.errors import (
    BookieReadOnlyError,
    BookieUnavailableError,
    LedgerFencedError,
    NoSuchEntryError,
    UnauthorizedError,
)
from walkit.metadata import connect, init_cluster, open_metadata_store, parse_metadata_uri
from walkit.protocol import DEFAULT_MAX_FRAME_SIZE, ReadLac, encode_request

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def cluster_uri(tmp_path: Path) -> str:
    uri = f"local://{tmp_path / 'md'}"
    admin = open_metadata_store(parse_metadata_uri(uri), create=True)
    init_cluster(admin, "/ledgers")
    admin.close()
    return uri


@pytest.fixture
def processes() -> Iterator[list[BookieProcess]]:
    started: list[BookieProcess] = []
    yield started
    for proc in started:
        proc.close()


def _bookie(processes: list[BookieProcess], base: Path, uri: str = "", **keys: object) -> BookieProcess:
    proc = BookieProcess(base, uri, **keys)
    processes.append(proc)
    return proc


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "walkit.cli", *args], capture_output=True, text=True, timeout=60)


def test_pipelined_adds_and_reads_through_a_process(tmp_path: Path, processes: list[BookieProcess],
                                                     cluster_uri: str) -> None:
    bookie = _bookie(processes, tmp_path / "b", cluster_uri).start()
    listed = _cli("bookie", "list", "--metadata", cluster_uri)
    assert listed.returncode == 0 and listed.stdout == f"{bookie.bookie_id}\tavailable\n", listed

    async def body() -> None:
        client = await BookieClient.connect("127.0.0.1", bookie.port)
        futures = [client.add_entry_nowait(ledger, e, KEY, entry(ledger, e)) for e in range(2000) for ledger in (1, 2)]
        await asyncio.gather(*futures)
        reads = await asyncio.gather(*(client.read_entry(1, e) for e in range(0, 2000, 7)))
        assert all(r.data == entry(1, r.entry_id) for r in reads)
        assert await client.read_lac(2) == 1998
        with pytest.raises(UnauthorizedError):  # EUA: another writer's key
            await client.add_entry(1, 2000, b"not-the-key", entry(1, 2000))
        fenced = await client.read_entry(2, -1, fence=True, master_key=KEY)
        assert fenced.entry_id == 1999
        with pytest.raises(LedgerFencedError):  # EFENCED for the old writer
            await client.add_entry(2, 2000, KEY, entry(2, 2000))
        await client.add_entry(2, 2000, KEY, entry(2, 2000), recovery=True)
        await client.close()

    run(body)
    assert bookie.terminate() == 0, bookie.log()[-2000:]
    listed = _cli("bookie", "list", "--metadata", cluster_uri)
    assert listed.stdout == "" and "no bookies" in listed.stderr


def test_kill_9_and_restart_keeps_every_acknowledged_entry(tmp_path: Path, processes: list[BookieProcess],
                                                            cluster_uri: str) -> None:
    bookie = _bookie(processes, tmp_path / "b", cluster_uri).start()
    acked: list[tuple[int, int]] = []

    async def write_until_killed() -> None:
        client = await BookieClient.connect("127.0.0.1", bookie.port)
        in_flight: set[asyncio.Future[object]] = set()
        next_entry = {1: 0, 2: 0, 3: 0}
        killed = False
        loop = asyncio.get_running_loop()
        started = loop.time()
        while not killed:
            while len(in_flight) < 300:
                ledger = 1 + len(acked) % 3
                e = next_entry[ledger]
                next_entry[ledger] += 1
                fut = client.add_entry_nowait(ledger, e, KEY, entry(ledger, e))
                fut.add_done_callback(lambda f, key=(ledger, e): acked.append(key) if not f.exception() else None)
                in_flight.add(fut)  # type: ignore[arg-type]
            done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            in_flight -= done
            if any(f.exception() for f in done):
                break
            if loop.time() - started > 1.5 and not killed:
                bookie.kill()  # mid-stream: adds are in flight
                killed = True
        await asyncio.gather(*in_flight, return_exceptions=True)
        await client.close()

    run(write_until_killed)
    assert len(acked) > 500
    bookie.start()  # waits out the old session's registration, replays the journal

    async def verify() -> None:
        client = await BookieClient.connect("127.0.0.1", bookie.port)
        for start in range(0, len(acked), 500):
            batch = acked[start:start + 500]
            reads = await asyncio.gather(*(client.read_entry(ledger, e) for ledger, e in batch))
            assert [r.data for r in reads] == [entry(ledger, e) for ledger, e in batch]
        await client.close()

    run(verify)
    with connect(cluster_uri) as cluster:
        assert cluster.bookies().writable == {bookie.bookie_id}


def test_malformed_frames_hurt_only_their_connection(tmp_path: Path, processes: list[BookieProcess]) -> None:
    bookie = _bookie(processes, tmp_path / "b").start()

    progress = [0]

    async def good_client_keeps_working(stop: asyncio.Event) -> None:
        client = await BookieClient.connect("127.0.0.1", bookie.port)
        while not stop.is_set():
            await client.add_entry(1, progress[0], KEY, entry(1, progress[0]))
            progress[0] += 1
        await client.close()

    async def still_served() -> None:
        """The good client completes adds after each bad connection."""
        before = progress[0]
        while progress[0] < before + 5:
            await asyncio.sleep(0.01)

    def raw(data: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", bookie.port), timeout=10) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks)

    async def body() -> None:
        stop = asyncio.Event()
        good = asyncio.ensure_future(good_client_keeps_working(stop))
        loop = asyncio.get_running_loop()
        # a frame with a valid length and garbage inside: EBADREQ, and the next frame still works
        garbage = struct.pack(">I", 20) + b"\x01\x09" + b"\xff" * 18
        answer = await loop.run_in_executor(None, raw, garbage + encode_request(ReadLac(1, request_id=77)))
        status = struct.unpack(">H", answer[6:8])[0]
        assert status == 3, answer[:32]  # EBADREQ
        assert len(answer) > struct.unpack(">I", answer[:4])[0] + 4, "the well-formed request was answered too"
        await still_served()
        # a length past the maximum: the bookie answers EBADREQ and closes that connection
        huge = struct.pack(">I", DEFAULT_MAX_FRAME_SIZE + 1) + b"\x01\x01\x00\x00" + b"\x00" * 8
        answer = await loop.run_in_executor(None, raw, huge)
        assert struct.unpack(">H", answer[6:8])[0] == 3
        await still_served()
        # another protocol version: EBADVERSION in our version, then closed
        future = struct.pack(">I", 12) + b"\x07\x03\x00\x00" + b"\x00" * 7 + b"\x05"
        answer = await loop.run_in_executor(None, raw, future)
        assert answer[4] == 1 and struct.unpack(">H", answer[6:8])[0] == 6
        await still_served()
        # plain noise (it reads as the start of a 66 KB frame that never ends): closed
        await loop.run_in_executor(None, raw, bytes(range(256)) * 20)
        await still_served()
        stop.set()
        await good

    run(body)
    assert bookie.proc is not None and bookie.proc.poll() is None, "the bookie survived"


def test_lowered_threshold_makes_a_bookie_read_only(tmp_path: Path, processes: list[BookieProcess],
                                                     cluster_uri: str) -> None:
    bookie = _bookie(processes, tmp_path / "b", cluster_uri, diskCheckInterval=200).start()

    async def write() -> None:
        client = await BookieClient.connect("127.0.0.1", bookie.port)
        for e in range(10):
            await client.add_entry(3, e, KEY, entry(3, e))
        await client.close()

    run(write)
    assert bookie.terminate() == 0
    # any real disk is fuller than 0.01 %: a full disk as far as this bookie knows
    bookie.keys.update(diskUsageThreshold=0.0001, diskUsageLwmThreshold=0.0001)
    bookie.start()
    listed = _cli("bookie", "list", "--metadata", cluster_uri)
    assert listed.stdout == f"{bookie.bookie_id}\treadonly\n", listed

    async def read_only() -> None:
        client = await BookieClient.connect("127.0.0.1", bookie.port)
        with pytest.raises(BookieReadOnlyError):
            await client.add_entry(3, 10, KEY, entry(3, 10))
        assert (await client.read_entry(3, 9)).data == entry(3, 9)
        with pytest.raises(NoSuchEntryError):
            await client.read_entry(3, 10)
        assert (await client.bookie_info()).readonly
        await client.close()

    run(read_only)


def test_second_bookie_with_the_same_id_is_refused(tmp_path: Path, processes: list[BookieProcess],
                                                   cluster_uri: str) -> None:
    first = _bookie(processes, tmp_path / "a", cluster_uri).start()
    # other (empty) disks, same id: the cluster knows the id, so these disks are not its own
    second = _bookie(processes, tmp_path / "b", cluster_uri, bookieId=first.bookie_id)
    second.start(wait=False)
    assert second.wait_exit(60) == 2
    assert "CookieError" in second.log() and "disks are empty but the cluster knows its id" in second.log()
    assert not list((tmp_path / "b").rglob("COOKIE")), "refused before stamping its disks"
    # the same configuration started twice by mistake: stopped before it touches the disks
    twin = _bookie(processes, tmp_path / "a2", cluster_uri, **{**first.keys, "bookiePort": free_port()})
    twin.start(wait=False)
    assert twin.wait_exit(60) == 2
    assert "in use by another bookie process" in twin.log()
    assert first.proc is not None and first.proc.poll() is None
    with connect(cluster_uri) as cluster:
        assert cluster.bookies().writable == {first.bookie_id}


def test_a_typo_in_the_local_metadata_path_stops_the_bookie_and_makes_no_store(tmp_path: Path,
                                                                                processes: list[BookieProcess],
                                                                                cluster_uri: str) -> None:
    """Not a second, empty cluster beside the real one (issue 35): exit 2, the path named."""
    typo = tmp_path / "mdd"
    bookie = _bookie(processes, tmp_path / "b", f"local://{typo}")
    bookie.start(wait=False)
    assert bookie.wait_exit(60) == 2
    last = bookie.log().strip().splitlines()[-1]
    assert f"NoMetadataStoreError: no metadata store at {typo}" in last and "walkit init --metadata" in last
    assert not typo.exists()


def test_bad_configuration_exits_with_a_clear_error(tmp_path: Path) -> None:
    conf = tmp_path / "bookie.toml"
    conf.write_text('bookiePort = 3181\njournalDirectory = "/tmp/x"\nnoSuchKey = 1\n')
    proc = subprocess.run([sys.executable, "-m", "bookie", "--conf", str(conf)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "noSuchKey" in proc.stderr


@pytest.mark.parametrize("loop", ["asyncio", "tokio"])
def test_a_bookie_runs_on_the_event_loop_asked_for_and_refuses_an_unknown_one(
        tmp_path: Path, processes: list[BookieProcess], monkeypatch: pytest.MonkeyPatch, loop: str) -> None:
    """WALKIT_EVENT_LOOP (walkit.eventloop): the loop is in the "serving on" line; an
    unknown one stops the start with exit 2 and the setting's name and value."""
    monkeypatch.setenv("WALKIT_EVENT_LOOP", loop)
    bookie = _bookie(processes, tmp_path / "b")
    if loop == "tokio":
        bookie.start(wait=False)
        assert bookie.wait_exit(60) == 2
        last = bookie.log().strip().splitlines()[-1]
        assert "ConfigError: WALKIT_EVENT_LOOP must be auto, asyncio or uvloop (value=tokio)" in last, last
        return
    bookie.start()
    assert "event loop: asyncio)" in bookie.log()


@pytest.mark.parametrize("key", ["journalDirectory", "ledgerDirectories"])
def test_a_file_where_a_directory_belongs_names_the_key(tmp_path: Path, processes: list[BookieProcess],
                                                        key: str) -> None:
    """Not a bare `[Errno 17] File exists`: the key, the path, and what is wrong."""
    plain = tmp_path / "not-a-dir"
    plain.write_text("a file")
    bookie = _bookie(processes, tmp_path / "b", **{key: str(plain) if key == "journalDirectory" else [str(plain)]})
    bookie.start(wait=False)
    assert bookie.wait_exit(60) == 2
    last = bookie.log().strip().splitlines()[-1]
    assert "ConfigError" in last and f"{key} is a file, not a directory" in last and f"path={plain}" in last
    assert "Errno" not in last


def test_port_0_without_a_bookie_id_is_refused_on_a_restart(tmp_path: Path, processes: list[BookieProcess],
                                                            cluster_uri: str) -> None:
    """bookiePort = 0 gets another port at every start, and without a bookieId the id
    (in the cookie on the disks) names the port: the restart is refused with the port
    to give, not with a cookie mismatch; given it, the bookie starts on its own disks."""
    bookie = _bookie(processes, tmp_path / "b", cluster_uri, bookiePort=0).start()
    first = re.search(r"bookie (127\.0\.0\.1:(\d+)) serving on", bookie.log())
    assert first is not None and f"later starts must set bookiePort = {first[2]}" in bookie.log()
    assert bookie.terminate() == 0
    bookie.start(wait=False)
    assert bookie.wait_exit(60) == 2
    last = bookie.log().strip().splitlines()[-1]
    assert "ConfigError: bookiePort must not be 0" in last and "would change at every start" in last
    assert f'set bookiePort = {first[2]}, or bookieId = "{first[1]}" (then any port will do)' in last
    assert "key=bookiePort" in last
    bookie.keys["bookiePort"] = bookie.port = int(first[2])
    bookie.start()
    assert f"bookie {first[1]} serving on" in bookie.log().strip().splitlines()[-1]


def test_unreachable_zookeeper_is_one_line_at_the_bookies_level(tmp_path: Path) -> None:
    """A bookie logs INFO by default; kazoo's lines for each reconnect attempt are not
    part of it (--log-level DEBUG shows them): the start fails with one line naming the
    address and the timeout."""
    from support.bookie import _toml

    hosts = f"127.0.0.1:{free_port()}"
    procs = []
    for name, extra in (("quiet", []), ("chatty", ["--log-level", "DEBUG"])):
        conf = tmp_path / f"{name}.toml"
        conf.write_text(_toml({"bookieId": name, "bookiePort": free_port(), "metadataServiceUri": f"zk://{hosts}/ledgers",
                               "journalDirectory": str(tmp_path / name / "j"),
                               "ledgerDirectories": [str(tmp_path / name / "l")]}))
        procs.append(subprocess.Popen([sys.executable, "-m", "bookie", "--conf", str(conf), *extra],
                                      stderr=subprocess.PIPE, text=True))
    (quiet, quiet_err), (chatty, chatty_err) = [(p, p.communicate(timeout=90)[1]) for p in procs]
    assert quiet.returncode == chatty.returncode == 2
    assert "kazoo" not in quiet_err, quiet_err
    last = quiet_err.strip().splitlines()[-1]
    assert "bookie failed: MetadataUnavailableError: cannot connect to ZooKeeper" in last
    assert last.endswith(f"(hosts={hosts} timeout=15s)")
    assert "WARNING kazoo.client: Connection dropped" in chatty_err


def test_walkit_bookie_start_runs_the_same_server(tmp_path: Path) -> None:
    bookie = BookieProcess(tmp_path / "b")
    conf = bookie.base / "bookie.toml"
    from support.bookie import _toml

    conf.write_text(_toml(bookie.keys))
    proc = subprocess.Popen([sys.executable, "-m", "walkit.cli", "bookie", "start", "--conf", str(conf)],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", bookie.port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.05)
        proc.terminate()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "serving on" in err and "stopped" in err
    finally:
        proc.kill()
        proc.wait()


def test_tls_bookie_process(tmp_path: Path, processes: list[BookieProcess]) -> None:
    certs = make_certificates(tmp_path)
    bookie = _bookie(processes, tmp_path / "b", tlsCertificatePath=certs["cert"], tlsKeyStore=certs["key"]).start()

    async def body() -> None:
        client = await BookieClient.connect("127.0.0.1", bookie.port, ssl_context=client_ssl_context(certs["ca"]),
                                            server_hostname="127.0.0.1")
        await client.add_entry(1, 0, KEY, entry(1, 0))
        assert (await client.read_entry(1, 0)).data == entry(1, 0)
        await client.close()
        with pytest.raises(BookieUnavailableError) as err:
            await BookieClient.connect("127.0.0.1", bookie.port, ssl_context=client_ssl_context(certs["stranger"]),
                                       server_hostname="127.0.0.1")
        assert isinstance(err.value.__cause__, ssl.SSLCertVerificationError)

    run(body)
    assert bookie.terminate() == 0


def test_bookie_process_from_bookkeepers_bk_server_conf(tmp_path: Path, cluster_uri: str) -> None:
    """BookKeeper 4.18's default bk_server.conf, its directories, ports and metadata
    service changed, started by ``walkit bookie start --conf``: it serves, registers, answers
    /heartbeat, and says in one warning which keys it ignores."""
    golden = Path(__file__).parents[1] / "unit" / "golden" / "bookkeeper" / "bk_server.conf"
    port, http_port = free_port(), free_port()
    changes = {"bookiePort": str(port), "journalDirectories": str(tmp_path / "journal"),
               "ledgerDirectories": str(tmp_path / "ledgers"), "metadataServiceUri": cluster_uri,
               "httpServerEnabled": "true", "httpServerPort": str(http_port), "httpServerHost": "127.0.0.1"}
    text = golden.read_text(encoding="iso-8859-1")
    for key, value in changes.items():
        text, count = re.subn(rf"^{key}=.*$", f"{key}={value}", text, flags=re.M)
        assert count == 1, key
    conf = tmp_path / "bk_server.conf"
    conf.write_text(text, encoding="iso-8859-1")
    log_path = tmp_path / "bookie.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "walkit.cli", "bookie", "start", "--conf", str(conf)],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "serving on" not in log_path.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.05)

        async def body() -> None:
            client = await BookieClient.connect("127.0.0.1", port)
            await client.add_entry(1, 0, KEY, entry(1, 0))
            assert (await client.read_entry(1, 0)).data == entry(1, 0)
            await client.close()

        run(body)
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/heartbeat", timeout=30) as answer:
            assert answer.status == 200
        listed = _cli("bookie", "list", "--metadata", cluster_uri)
        assert listed.stdout == f"127.0.0.1:{port}\tavailable\n", listed
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        proc.wait()
    warnings = [line for line in log_path.read_text().splitlines() if "not implemented by walkit" in line]
    assert len(warnings) == 1 and "statsProviderClass" in warnings[0] and "storageserver.grpc.port" in warnings[0]
    assert "bookiePort" not in warnings[0] and "journalDirectories" not in warnings[0]
