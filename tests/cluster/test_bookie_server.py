"""The bookie server in this process (real sockets on 127.0.0.1): the request semantics,
range reads, read-only mode, back-pressure, graceful shutdown, registration and TLS."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import ssl
import uuid
from pathlib import Path
from typing import Any

import pytest

from bookie._metrics import BookieCollector
from bookie.cookie import Cookie
from bookie.server import BookieServer
from bookie.server._connection import _READS_IN_FLIGHT
from bookie.storage._storage import SLOT_LOG_LEDGERS
from support.bookie import KEY, client_of, config, entry, in_process, make_certificates, run
from walkit.client import BookieClient, client_ssl_context
from walkit.errors import (
    BookieBusyError,
    BookieReadOnlyError,
    BookieUnavailableError,
    CookieError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from walkit.protocol import (
    AddEntry,
    AddEntryResponse,
    ClientConnection,
    ErrorResponse,
    Op,
    ReadEntry,
    ReadEntryResponse,
    ReadRange,
    ReadRangeResponse,
    Request,
    Response,
    Status,
    encode_request,
    range_response_size,
)
from walkit.metadata import SessionState, connect, init_cluster, open_metadata_store, parse_metadata_uri, read_cookie, write_cookie


def test_add_read_lac_pipelined(tmp_path: Path) -> None:
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            client = await client_of(server)
            adds = [client.add_entry(ledger, e, KEY, entry(ledger, e)) for ledger in (1, 2, 3) for e in range(300)]
            await asyncio.gather(*adds)
            reads = await asyncio.gather(*(client.read_entry(2, e) for e in range(300)))
            assert [r.data for r in reads] == [entry(2, e) for e in range(300)]
            assert {r.entry_id for r in reads} == set(range(300))
            last = await client.read_entry(3, -1)
            assert (last.entry_id, last.data, last.lac) == (299, entry(3, 299), 298)
            assert await client.read_lac(1) == 298
            await client.write_lac(1, 299, KEY)
            assert await client.read_lac(1) == 299
            info = await client.bookie_info()
            assert 0 < info.free_bytes <= info.total_bytes and not info.readonly
            with pytest.raises(NoSuchLedgerError):
                await client.read_entry(99, 0)
            with pytest.raises(NoSuchEntryError):
                await client.read_entry(1, 300)
            await client.close()

    run(body)


def test_master_key_and_fencing(tmp_path: Path) -> None:
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            client = await client_of(server)
            for e in range(3):
                await client.add_entry(7, e, KEY, entry(7, e))
            with pytest.raises(UnauthorizedError):
                await client.add_entry(7, 3, b"other-key", entry(7, 3))
            with pytest.raises(UnauthorizedError):
                await client.read_entry(7, -1, fence=True, master_key=b"other-key")
            fenced = await client.read_entry(7, -1, fence=True, master_key=KEY)
            assert fenced.entry_id == 2 and fenced.data == entry(7, 2)
            assert server.bookie is not None and server.bookie.is_fenced(7)
            with pytest.raises(LedgerFencedError):
                await client.add_entry(7, 3, KEY, entry(7, 3))
            await client.add_entry(7, 3, KEY, entry(7, 3), recovery=True)  # a recoverer may still add
            assert (await client.read_entry(7, 3)).data == entry(7, 3)
            # fencing a ledger this bookie never saw makes it refuse the old writer too
            with pytest.raises(NoSuchEntryError):
                await client.read_entry(8, -1, fence=True, master_key=KEY)
            with pytest.raises(LedgerFencedError):
                await client.add_entry(8, 0, KEY, entry(8, 0))
            await client.close()

    run(body)


def test_fence_is_durable_before_the_answer(tmp_path: Path) -> None:
    """The fence survives a restart (it was journaled before the reader heard of it)."""

    async def fence() -> None:
        async with in_process(config(tmp_path)) as server:
            client = await client_of(server)
            await client.add_entry(5, 0, KEY, entry(5, 0))
            await client.read_entry(5, -1, fence=True, master_key=KEY)
            await client.close()

    async def after() -> None:
        async with in_process(config(tmp_path)) as server:
            client = await client_of(server)
            with pytest.raises(LedgerFencedError):
                await client.add_entry(5, 1, KEY, entry(5, 1))
            await client.close()

    run(fence)
    run(after)


def test_long_poll(tmp_path: Path) -> None:
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            client = await client_of(server)
            await client.add_entry(1, 0, KEY, entry(1, 0, lac=-1))
            await client.add_entry(1, 1, KEY, entry(1, 1, lac=0))
            # the LAC (0) already passed -1: answered at once
            now = await client.read_entry(1, 0, previous_lac=-1, timeout_ms=5000)
            assert (now.entry_id, now.lac) == (0, 0)
            # waits until an add carries a LAC past 0
            poll = asyncio.ensure_future(client.read_entry(1, 1, previous_lac=0, timeout_ms=10_000))
            await asyncio.sleep(0.2)
            assert not poll.done()
            await client.add_entry(1, 2, KEY, entry(1, 2, lac=0))
            await asyncio.sleep(0.2)
            assert not poll.done(), "LAC 0 does not pass 0"
            await client.add_entry(1, 3, KEY, entry(1, 3, lac=1))
            answered = await poll
            assert (answered.entry_id, answered.lac) == (1, 1)
            # an explicit WRITE_LAC also wakes a poll
            poll = asyncio.ensure_future(client.read_entry(1, 2, previous_lac=1, timeout_ms=10_000))
            await asyncio.sleep(0.1)
            await client.write_lac(1, 2, KEY)
            assert (await poll).entry_id == 2
            # nothing happens: the timeout answers ENOENTRY
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(NoSuchEntryError, match="long poll"):
                await client.read_entry(1, 3, previous_lac=2, timeout_ms=300)
            assert 0.25 < loop.time() - started < 5
            # a poll on a ledger the bookie has not seen yet waits for its first entry
            poll = asyncio.ensure_future(client.read_entry(4, 0, previous_lac=-1, timeout_ms=10_000))
            await asyncio.sleep(0.1)
            await client.add_entry(4, 0, KEY, entry(4, 0, lac=-1))
            await client.add_entry(4, 1, KEY, entry(4, 1, lac=0))
            assert (await poll).entry_id == 0
            await client.close()

    run(body)


def test_a_long_poll_on_a_ledger_in_memory_is_checked_without_the_read_pool(tmp_path: Path) -> None:
    """A tailing reader's poll arrives while the ledger's last entry is still in its
    log's write buffer: its first LAC check runs on the loop (``Bookie.memory_lac``), not
    on the read pool and back - an explicit LAC counts, as on the pool - and a ledger
    that memory knows nothing of still goes to the pool."""
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            client = await client_of(server)
            await client.add_entry(1, 0, KEY, entry(1, 0, lac=-1))
            await client.add_entry(1, 1, KEY, entry(1, 1, lac=0))
            real = server.read_executor
            submitted: list[str] = []

            class Recording:
                def submit(self, fn: Any, *args: Any) -> Any:
                    submitted.append(getattr(fn, "__name__", repr(fn)))
                    return real.submit(fn, *args)

            server.read_executor = Recording()  # type: ignore[assignment]
            try:
                now = await client.read_entry(1, 1, previous_lac=-1, timeout_ms=5000)  # LAC 0 passed -1
                assert (now.entry_id, now.lac) == (1, 0)
                poll = asyncio.ensure_future(client.read_entry(1, 1, previous_lac=0, timeout_ms=10_000))
                await asyncio.sleep(0.2)
                assert not poll.done()
                await client.write_lac(1, 1, KEY)  # explicit LAC 1: wakes the poll
                assert (await poll).lac == 1
                # a poll arriving after the explicit LAC passed its previous one: answered at once
                again = await client.read_entry(1, 1, previous_lac=0, timeout_ms=10_000)
                assert (again.entry_id, again.lac) == (1, 1)
                assert "read_lac" not in submitted, f"a first check went to the read pool: {submitted}"
                # a ledger this bookie has not seen: the pool's check (it waits for the first entry)
                poll = asyncio.ensure_future(client.read_entry(4, 0, previous_lac=-1, timeout_ms=10_000))
                await asyncio.sleep(0.1)
                assert "read_lac" in submitted
                await client.add_entry(4, 0, KEY, entry(4, 0, lac=-1))
                await client.add_entry(4, 1, KEY, entry(4, 1, lac=0))
                assert (await poll).entry_id == 0
            finally:
                server.read_executor = real
            await client.close()

    run(body)


def test_long_poll_answers_survive_failures_on_the_loop(tmp_path: Path) -> None:
    """A poll names the entry it wants (one not stored yet: the last comes instead); a
    failure while answering a poll from memory on the loop falls back to the read pool,
    and one while waking polls after a published WRITE_LAC leaves that WRITE_LAC answered
    once - the connection goes on (a second answer would make the client drop it)."""
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            client = await client_of(server)
            await client.add_entry(1, 0, KEY, entry(1, 0, lac=-1))
            await client.add_entry(1, 1, KEY, entry(1, 1, lac=0))
            later = await client.read_entry(1, 9, previous_lac=-1, timeout_ms=5000)
            assert (later.entry_id, later.data) == (1, entry(1, 1, lac=0))  # 9 is not here: the last
            calls: list[int] = []

            def flaky(ledger: int, entry_id: int, data: bytes) -> bytes:
                calls.append(entry_id)
                if len(calls) == 1:
                    raise RuntimeError("fails on the loop's fast path")
                return data

            server.hooks.read = flaky
            poll = asyncio.ensure_future(client.read_entry(1, 1, previous_lac=0, timeout_ms=10_000))
            await asyncio.sleep(0.1)
            await client.write_lac(1, 1, KEY)  # published: wakes the poll, answered from memory
            answered = await poll
            assert (answered.entry_id, answered.lac, answered.data) == (1, 1, entry(1, 1, lac=0))
            assert calls == [1, 1], "the pool answered what the loop could not"
            server.hooks.read = None

            def broken(ledger_id: int, lac: int) -> None:
                raise RuntimeError("waking the polls failed")

            poll = asyncio.ensure_future(client.read_entry(1, 2, previous_lac=1, timeout_ms=300))
            await asyncio.sleep(0.1)
            real, server.polls.lac_advanced = server.polls.lac_advanced, broken  # type: ignore[method-assign]
            try:
                await client.write_lac(1, 5, KEY)
            finally:
                server.polls.lac_advanced = real  # type: ignore[method-assign]
            with pytest.raises(NoSuchEntryError, match="long poll"):
                await poll  # not woken: it timed out, answered once
            assert await client.read_lac(1) == 5  # the connection goes on
            await client.close()

    run(body)


def test_read_only_mode_follows_disk_usage(tmp_path: Path) -> None:
    usage = {"now": 0.5}
    md = tmp_path / "md"
    uri = f"local://{md}"
    admin = open_metadata_store(parse_metadata_uri(uri), create=True)
    init_cluster(admin, "/ledgers")
    admin.close()

    async def body() -> None:
        cfg = config(tmp_path, metadata_service_uri=uri, disk_usage_threshold=0.95, disk_usage_lwm_threshold=0.9)
        async with in_process(cfg, disk_usage=lambda path: usage["now"]) as server:
            with connect(uri) as cluster:
                assert cluster.bookies().writable == {server.bookie_id}
                client = await client_of(server)
                await client.add_entry(1, 0, KEY, entry(1, 0))
                usage["now"] = 0.97
                await server.check_disks()
                assert server.readonly
                assert cluster.bookies().readonly == {server.bookie_id} and not cluster.bookies().writable
                with pytest.raises(BookieReadOnlyError):
                    await client.add_entry(1, 1, KEY, entry(1, 1))
                assert (await client.read_entry(1, 0)).data == entry(1, 0)  # reads go on
                await client.add_entry(1, 1, KEY, entry(1, 1), recovery=True)  # recovery completes
                assert (await client.bookie_info()).readonly
                usage["now"] = 0.92  # between the marks: stays read-only
                await server.check_disks()
                assert server.readonly
                usage["now"] = 0.5
                await server.check_disks()
                assert not server.readonly and cluster.bookies().writable == {server.bookie_id}
                await client.add_entry(1, 2, KEY, entry(1, 2))
                await client.close()
        with connect(uri) as cluster:
            assert cluster.bookies().writable == frozenset(), "stop deregisters"

    run(body)


def test_too_many_adds_are_refused_and_a_full_connection_pauses(tmp_path: Path) -> None:
    slow = {"journal_max_group_wait_msec": 300.0, "journal_flush_when_queue_empty": False}

    async def body() -> None:
        async with in_process(config(tmp_path, max_pending_add_requests=10, **slow)) as server:
            client = await client_of(server)
            results = await asyncio.gather(*(client.add_entry(1, e, KEY, entry(1, e)) for e in range(40)),
                                           return_exceptions=True)
            busy = [r for r in results if isinstance(r, BookieBusyError)]
            assert len(busy) == 30 and results[:10] == [None] * 10
            await client.close()

    async def pausing() -> None:
        cfg = config(tmp_path / "b", max_pending_requests_per_connection=8, **slow)
        async with in_process(cfg) as server:
            client = await client_of(server)
            pauses = []
            conn_adds = asyncio.gather(*(client.add_entry(2, e, KEY, entry(2, e)) for e in range(200)))
            while not conn_adds.done():
                pauses.extend(c.reading_paused for c in server._connections)
                await asyncio.sleep(0.01)
            await conn_adds
            assert any(pauses), "reading paused while the connection was full"
            await client.close()

    run(body)
    run(pausing)


def test_requests_answered_while_dispatched_do_not_recurse(tmp_path: Path) -> None:
    """A published WRITE_LAC and a refused add are answered inside the dispatch loop;
    thousands of them in one connection's backlog are each answered once, in a loop (a
    nested dispatch per answer overflowed the stack, and the error answered a request a
    second time, which made the client drop the connection)."""
    slow = {"journal_max_group_wait_msec": 300.0, "journal_flush_when_queue_empty": False}

    async def body() -> None:
        async with in_process(config(tmp_path, max_pending_add_requests=1, **slow)) as server:
            client = await client_of(server)
            await client.add_entry(1, 0, KEY, entry(1, 0))  # its key is durable: WRITE_LACs are published
            await asyncio.gather(*(client.write_lac(1, lac, KEY) for lac in range(5000)))
            assert await client.read_lac(1) == 4999
            results = await asyncio.gather(*(client.add_entry(2, e, KEY, entry(2, e)) for e in range(3000)),
                                           return_exceptions=True)
            busy = [r for r in results if isinstance(r, BookieBusyError)]
            assert len(busy) >= 2900 and all(r is None or isinstance(r, BookieBusyError) for r in results)
            assert await client.read_lac(1) == 4999  # the connection is still in use
            await client.close()

    run(body)


def test_stop_answers_every_add_in_flight(tmp_path: Path) -> None:
    async def body() -> None:
        cfg = config(tmp_path, journal_max_group_wait_msec=500.0, journal_flush_when_queue_empty=False)
        server = BookieServer(cfg)
        await server.start()
        client = await client_of(server)
        adds = [asyncio.ensure_future(client.add_entry(1, e, KEY, entry(1, e))) for e in range(50)]
        await asyncio.sleep(0.1)  # sent, waiting for the group commit
        assert not any(a.done() for a in adds)
        await server.stop()
        assert await asyncio.gather(*adds) == [None] * 50
        with pytest.raises(BookieUnavailableError):
            await client.add_entry(1, 50, KEY, entry(1, 50))

    run(body)
    # and they are durable: a new server reads them
    async def after() -> None:
        async with in_process(config(tmp_path)) as server:
            client = await client_of(server)
            assert (await client.read_entry(1, 49)).data == entry(1, 49)
            await client.close()

    run(after)


def test_cookie_is_checked_against_metadata(tmp_path: Path) -> None:
    uri = f"local://{tmp_path / 'md'}"
    admin = open_metadata_store(parse_metadata_uri(uri), create=True)
    info = init_cluster(admin, "/ledgers")

    async def start_once(bookie_id: str) -> None:
        async with in_process(config(tmp_path / "disks", metadata_service_uri=uri, bookie_id=bookie_id)):
            pass

    run(lambda: start_once("bk1"))
    stored = read_cookie(admin, info, "bk1")
    assert stored is not None and b"bk1" in stored[0]
    run(lambda: start_once("bk1"))  # the same disks: accepted
    moved = dataclasses.replace(Cookie.decode(stored[0]), journal_dir="/elsewhere")
    write_cookie(admin, info, "bk1", moved.encode(), stored[1])
    with pytest.raises(CookieError):
        run(lambda: start_once("bk1"))
    admin.close()


def test_a_wiped_bookie_under_its_old_id_is_refused_until_its_cookie_is_dropped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Empty disks under an id the cluster knows: the data that id acknowledged is gone, and
    an empty bookie answering "no such entry" could let a recovery lose it. Refused until the
    operator drops the old cookie (after re-replicating) - or uses a new id."""
    from walkit.cli import main

    uri = f"local://{tmp_path / 'md'}"
    admin = open_metadata_store(parse_metadata_uri(uri), create=True)
    init_cluster(admin, "/ledgers")
    admin.close()
    disks = tmp_path / "disks"

    async def start_once(bookie_id: str) -> None:
        async with in_process(config(disks, metadata_service_uri=uri, bookie_id=bookie_id)):
            pass

    run(lambda: start_once("bk1"))
    shutil.rmtree(disks)  # the disks are replaced
    with pytest.raises(CookieError) as err:
        run(lambda: start_once("bk1"))
    assert "disks are empty but the cluster knows its id" in str(err.value) and "walkit recover" in str(err.value)
    with pytest.raises(CookieError):  # and again: the refusal stamped nothing
        run(lambda: start_once("bk1"))
    run(lambda: start_once("bk2"))  # a new id on empty disks: a new bookie
    shutil.rmtree(disks)
    assert main(["bookie", "cookie", "delete", "--bookie", "bk1", "--metadata", uri]) == 2  # no --yes, no terminal
    assert "not confirmed" in capsys.readouterr().err
    assert main(["bookie", "cookie", "delete", "--bookie", "bk1", "--metadata", uri, "--yes"]) == 0
    assert "dropped the cookie of bookie bk1" in capsys.readouterr().out
    run(lambda: start_once("bk1"))  # now it starts (a new bookie under the old id)
    assert main(["bookie", "cookie", "delete", "--bookie", "nobody", "--metadata", uri, "--yes"]) == 2
    assert "no cookie" in capsys.readouterr().err


def test_a_cluster_of_another_instance_is_refused(tmp_path: Path) -> None:
    first, second = f"local://{tmp_path / 'md1'}", f"local://{tmp_path / 'md2'}"
    for uri in (first, second):
        admin = open_metadata_store(parse_metadata_uri(uri), create=True)
        init_cluster(admin, "/ledgers")
        admin.close()

    async def start_once(uri: str) -> None:
        async with in_process(config(tmp_path / "disks", metadata_service_uri=uri, bookie_id="bk")):
            pass

    run(lambda: start_once(first))
    with pytest.raises(CookieError):  # these disks belong to the first cluster
        run(lambda: start_once(second))


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_certificates(tmp_path_factory.mktemp("tls"))


def test_tls_round_trip_and_refused_certificates(tmp_path: Path, certificates: dict[str, str]) -> None:
    async def body() -> None:
        cfg = config(tmp_path, tls_certificate_path=certificates["cert"], tls_key_store=certificates["key"],
                     tls_trust_store=certificates["ca"], tls_client_authentication=True)
        async with in_process(cfg) as server:
            good = client_ssl_context(certificates["ca"], certificate=certificates["client"])
            client = await client_of(server, ssl_context=good, server_hostname="127.0.0.1")
            await client.add_entry(1, 0, KEY, entry(1, 0))
            assert (await client.read_entry(1, 0)).data == entry(1, 0)
            await client.close()
            # a bookie whose certificate the client's CA did not sign
            with pytest.raises(BookieUnavailableError) as err:
                await client_of(server, ssl_context=client_ssl_context(certificates["stranger"],
                                                                       certificate=certificates["client"]),
                                server_hostname="127.0.0.1")
            assert isinstance(err.value.__cause__, ssl.SSLCertVerificationError)
            # a client without a certificate, when the bookie asks for one
            anonymous = await client_of(server, ssl_context=client_ssl_context(certificates["ca"]),
                                        server_hostname="127.0.0.1")
            with pytest.raises(BookieUnavailableError):
                await anonymous.add_entry(1, 1, KEY, entry(1, 1))
            await anonymous.close()
            # plaintext against a TLS bookie gets nowhere either: refused, naming TLS
            plain = await client_of(server)
            with pytest.raises(UnauthorizedError, match="TLS only"):
                await asyncio.wait_for(plain.add_entry(1, 1, KEY, entry(1, 1)), 10)
            await plain.close()

    run(body)


def test_binds_loopback_by_default(tmp_path: Path) -> None:
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            assert server._server is not None
            assert {s.getsockname()[0] for s in server._server.sockets} == {"127.0.0.1"}
            assert server.bookie_id == "test-bookie"

    run(body)


def test_runs_unregistered_without_metadata(tmp_path: Path) -> None:
    """Without metadata the bookie runs unregistered (tests, benchmarks)."""

    async def body() -> None:
        async with in_process(config(tmp_path, bookie_id=f"plain-{uuid.uuid4().hex[:6]}")) as server:
            assert server._registration is None
            client: BookieClient = await client_of(server)
            await client.add_entry(1, 0, KEY, entry(1, 0))
            await client.close()

    run(body)


def test_disk_checks_run_by_themselves(tmp_path: Path) -> None:
    usage = {"now": 0.99}

    async def body() -> None:
        cfg = config(tmp_path, disk_check_interval=50)
        async with in_process(cfg, disk_usage=lambda path: usage["now"]) as server:
            assert server.readonly, "read-only from the start on a full disk"
            usage["now"] = 0.1
            while server.readonly:
                await asyncio.sleep(0.02)
            client = await client_of(server)
            await client.add_entry(1, 0, KEY, entry(1, 0))
            usage["now"] = 0.99
            while not server.readonly:
                await asyncio.sleep(0.02)
            with pytest.raises(BookieReadOnlyError):
                await client.add_entry(1, 1, KEY, entry(1, 1))
            with pytest.raises(BookieReadOnlyError):
                await client.write_lac(1, 0, KEY)
            await client.close()

    run(body)


def test_a_client_that_does_not_read_cannot_make_the_bookie_hoard(tmp_path: Path) -> None:
    """Answers not yet sent stay within the byte budget; the rest waits unread in the
    socket, and the bookie stops reading from that client."""
    big = b"x" * (1 << 20)

    async def body() -> None:
        cfg = config(tmp_path, netty_max_frame_size_bytes=2 << 20)
        async with in_process(cfg) as server:
            client = await client_of(server)
            await client.add_entry(1, 0, KEY, entry(1, 0, payload=big))
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"".join(encode_request(ReadEntry(1, 0, request_id=i + 1)) for i in range(300)))
            await writer.drain()
            await asyncio.sleep(1.0)
            (conn,) = [c for c in server._connections if c.reads_in_flight or c.backlog]
            budget = 2 * cfg.netty_max_frame_size_bytes
            assert conn._unsent() <= budget + _READS_IN_FLIGHT * len(big) + 4096
            assert conn.reads_in_flight <= _READS_IN_FLIGHT and conn.reading_paused
            await client.add_entry(1, 1, KEY, entry(1, 1))  # others are served meanwhile
            writer.close()
            await client.close()

    run(body)


def test_long_polls_are_capped_and_answered_at_stop_or_forgotten(tmp_path: Path) -> None:
    async def body() -> None:
        server = BookieServer(config(tmp_path, max_long_polls=4))
        await server.start()
        client, leaver = await client_of(server), await client_of(server)
        await client.add_entry(1, 0, KEY, entry(1, 0, lac=-1))
        polls = [asyncio.ensure_future(client.read_entry(1, 1, previous_lac=0, timeout_ms=60_000)) for _ in range(3)]
        gone = asyncio.ensure_future(leaver.read_entry(1, 1, previous_lac=0, timeout_ms=60_000))
        while server.polls.count < 4:
            await asyncio.sleep(0.01)
        with pytest.raises(BookieBusyError):
            await client.read_entry(1, 1, previous_lac=0, timeout_ms=60_000)
        await leaver.close()
        with pytest.raises(BookieUnavailableError):
            await gone
        while server.polls.count != 3:
            await asyncio.sleep(0.01)
        await server.stop()
        for poll in polls:
            with pytest.raises(NoSuchEntryError):
                await poll
        assert server.polls.count == 0 and not server.polls.waiters

    run(body)


def test_half_closed_client_gets_every_answer(tmp_path: Path) -> None:
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"".join(encode_request(AddEntry(1, e, KEY, entry(1, e), request_id=e + 1))
                                  for e in range(200)))
            writer.write_eof()
            data = await asyncio.wait_for(reader.read(), 30)  # until the bookie closes
            wire = ClientConnection()
            for e in range(200):
                wire.send(AddEntry(1, e, KEY, entry(1, e)))
            responses = wire.receive(data)
            assert sorted(r.request_id for r in responses) == list(range(1, 201))
            assert all(isinstance(r, AddEntryResponse) for r in responses)
            writer.close()

    run(body)


def test_frames_split_across_reads_of_several_connections(tmp_path: Path) -> None:
    """Every connection is read into the server's one read buffer: a frame split across
    reads stays whole while other connections' reads come in between."""

    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            streams = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(3)]
            frames = {c: [encode_request(AddEntry(c + 1, e, KEY, entry(c + 1, e, payload=bytes([c]) * (3000 * e + 1)),
                                                  request_id=e + 1)) for e in range(40)] for c in range(3)}
            data = {c: b"".join(f) for c, f in frames.items()}
            step = 997  # cuts frames anywhere, headers included
            for off in range(0, max(len(d) for d in data.values()), step):
                for c, (_, writer) in enumerate(streams):
                    writer.write(data[c][off : off + step])
                    await writer.drain()
                await asyncio.sleep(0)
            for c, (reader, writer) in enumerate(streams):
                wire = ClientConnection()
                for e in range(40):
                    wire.send(AddEntry(c + 1, e, KEY, b""))
                got: list[Response] = []
                while len(got) < 40:
                    got += wire.receive(await asyncio.wait_for(reader.read(1 << 16), 30))
                assert sorted(r.request_id for r in got) == list(range(1, 41))
                assert all(isinstance(r, AddEntryResponse) and r.ledger_id == c + 1 for r in got), got
                writer.close()
            client = await client_of(server)
            for c in range(3):
                for e in (0, 39):
                    assert (await client.read_entry(c + 1, e)).data == entry(c + 1, e, payload=bytes([c]) * (3000 * e + 1))
            await client.close()

    run(body)


def test_a_lone_add_is_answered_by_the_callback_that_read_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone add on an idle bookie is flushed inline (journalInlineFlush) by a kick at
    the end of the read callback that brought it - the last callback of its loop
    iteration - and its answer is written by that same kick: nothing (no kick, no drain,
    no write) is left for another loop iteration. A request answered at once (a
    published WRITE_LAC, a read from memory) is written at the end of that callback too."""
    from bookie.journal import _writer

    monkeypatch.setattr(_writer, "INLINE_MAX_SYNC", 60.0)  # a slow test machine's disk still flushes inline

    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            client = await client_of(server)
            await client.add_entry(1, 0, KEY, entry(1, 0))
            loop = asyncio.get_running_loop()
            scheduled: list[str] = []
            kicks: list[str] = []
            call_soon = loop.call_soon
            kick = server.writes.kick_journal

            def counted(callback: Any, *args: Any, **kwargs: Any) -> asyncio.Handle:
                owner = getattr(callback, "__self__", None)
                if owner is server or type(owner).__module__.startswith("bookie.server"):
                    scheduled.append(callback.__name__)
                return call_soon(callback, *args, **kwargs)

            def kicked() -> None:
                kicks.append(server.writes.kicking and "nested" or "kick")
                kick()

            monkeypatch.setattr(loop, "call_soon", counted)
            monkeypatch.setattr(server.writes, "kick_journal", kicked)
            for e in range(1, 31):
                await client.add_entry(1, e, KEY, entry(1, e))
            # answered at once, by the read callback too: a published WRITE_LAC, a read from memory
            await client.write_lac(1, 30, KEY)
            assert (await client.read_entry(1, 30)).data == entry(1, 30)
            monkeypatch.undo()
            assert scheduled == [], scheduled
            assert kicks == ["kick"] * 30, kicks
            await client.close()

    run(body)


def test_adds_read_before_other_callbacks_of_the_iteration_are_kicked_after_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read callback that is not the last of its loop iteration (another connection's
    bytes, anything else ready) leaves the kick, and the write of the answers it gave, to
    the next iteration, after the others, so the adds of every connection read in this
    one share its flush; a loop whose queue is not visible (uvloop) always does so."""
    from bookie.journal import _writer
    from bookie.server._writes import _last_of_iteration

    monkeypatch.setattr(_writer, "INLINE_MAX_SYNC", 60.0)  # a slow test machine's disk still flushes inline
    assert not _last_of_iteration(object())

    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            loop = asyncio.get_running_loop()
            writes = server.writes
            order: list[object] = []
            kick = writes.kick_journal

            def kicked() -> None:
                order.append("kick")
                kick()

            monkeypatch.setattr(writes, "kick_journal", kicked)
            writes.reading()
            writes.read_done()  # nothing submitted while reading: nothing to kick
            writes.reading()
            loop.call_soon(order.append, "other")  # still to run in this iteration
            writes.submit_adds([AddEntry(1, 0, KEY, entry(1, 0))], lambda err, adds: order.append(("added", err)))
            writes.read_done()
            assert order == []
            for _ in range(1000):
                if ("added", None) in order:
                    break
                await asyncio.sleep(0.01)
            assert order == ["other", "kick", ("added", None)], order
            assert server.bookie is not None and server.bookie.read_entry(1, 0) == entry(1, 0)

            class Answered:  # a connection's side of the write: its answers flushed once
                peer = "test"

                def flush(self) -> None:
                    order.append("written")

            del order[:]
            assert not writes.write_later(Answered())  # outside a read or kick: the caller schedules
            writes.reading()
            loop.call_soon(order.append, "other")
            assert writes.write_later(Answered())  # held: written after the other callback
            writes.read_done()
            assert order == []
            await asyncio.sleep(0)
            assert order == ["other", "written"], order

    run(body)


def test_an_inline_flush_answers_its_adds_in_its_callback_after_those_queued_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kick's inline flush answers its adds from the journal's callback, on the loop's
    thread, without queueing them for the drain (no queue, no drain lock, no drain call)
    - unless a completion is queued already (the sync thread's): then it queues behind
    it and the drain answers both in their order. Answers written once, at the kick's end."""
    from bookie.journal import _writer
    from bookie.server import _writes

    monkeypatch.setattr(_writer, "INLINE_MAX_SYNC", 60.0)  # a slow test machine's disk still flushes inline

    class Peer:  # a connection's side of the answers
        peer = "test"
        waiters: set[Any] = set()

        def __init__(self, name: str) -> None:
            self.name = name

        def respond(self, response: Any) -> None:
            answered.append((self.name, "error", response))

        def respond_added(self, reqs: list[AddEntry]) -> None:
            answered.append((self.name, [r.entry_id for r in reqs], drains[:]))

        def flush(self) -> None:
            answered.append((self.name, "flush"))

    answered: list[Any] = []
    drains: list[str] = []

    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            writes = server.writes
            drain = writes._drain

            def counted() -> None:
                drains.append("drain")
                drain()

            monkeypatch.setattr(writes, "_drain", counted)
            lone, queued = Peer("lone"), Peer("queued")

            def submit(peer: Peer, entry_id: int) -> None:
                add = AddEntry(1, entry_id, KEY, entry(1, entry_id))
                writes.in_flight.count += 1  # as a connection's pump counts what it submits
                writes.in_flight.bytes += len(add.data)
                writes.submit_adds([add], writes.callback_for(lone if peer is lone else queued))

            for e in range(3):  # lone adds, each flushed inline by its kick: answered in its callback
                submit(lone, e)
                writes.kick_journal()
            assert answered == [("lone", [e], []) for e in range(3)] and drains == [], (answered, drains)
            # a completion the sync thread queued before this kick: the inline one goes behind it
            del answered[:]
            earlier = AddEntry(1, 3, KEY, entry(1, 3))
            writes.in_flight.count += 1
            writes.in_flight.bytes += len(earlier.data)
            writes._done.append((_writes._ADD_DONE, queued, [earlier], None))
            submit(lone, 4)
            writes.kick_journal()
            assert answered == [("queued", [3], ["drain"]), ("lone", [4], ["drain"])], answered
            assert writes.in_flight.count == 0 and writes.in_flight.bytes == 0
            assert server.bookie is not None and server.bookie.read_entry(1, 4) == entry(1, 4)

    run(body)


def test_tls_refuses_a_client_certificate_from_another_ca(tmp_path: Path, certificates: dict[str, str]) -> None:
    (tmp_path / "other").mkdir()
    other = make_certificates(tmp_path / "other")

    async def body() -> None:
        cfg = config(tmp_path, tls_certificate_path=certificates["cert"], tls_key_store=certificates["key"],
                     tls_trust_store=certificates["ca"], tls_client_authentication=True)
        async with in_process(cfg) as server:
            stranger = client_ssl_context(certificates["ca"], certificate=other["client"])
            client = await client_of(server, ssl_context=stranger, server_hostname="127.0.0.1")
            with pytest.raises(BookieUnavailableError):
                await asyncio.wait_for(client.add_entry(1, 0, KEY, entry(1, 0)), 10)
            await client.close()

    run(body)


def test_a_registration_lost_for_good_stops_the_bookie(tmp_path: Path) -> None:
    """Rather than serve while invisible: the registration's on_lost stops the server
    and marks it (python -m bookie then exits 1 for a supervisor to restart it)."""
    uri = f"local://{tmp_path / 'md'}"
    admin = open_metadata_store(parse_metadata_uri(uri), create=True)
    init_cluster(admin, "/ledgers")
    admin.close()

    async def body() -> None:
        server = BookieServer(config(tmp_path, metadata_service_uri=uri))
        await server.start()
        assert server._registration is not None
        server._registration._retry_deadline = 0.2
        server._registration._on_session(SessionState.LOST)  # what the store reports on expiry
        await asyncio.wait_for(server.wait_stopped(), 30)
        assert server.lost_registration and server.stop_error is None
        with connect(uri) as cluster:
            assert cluster.bookies().writable == frozenset()

    run(body)


def test_a_switch_to_read_only_landing_late_is_undone_by_the_next_disk_check(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The registration's switch to read-only gives up with its transaction still on its
    way, and the bookie is writable again before it lands: the next disk check switches
    the registration back (its mode is no longer known), so the bookie is listed as it
    serves - writable - instead of read-only for as long as its disks stay as they are."""
    import walkit.metadata
    from support.metadata import LandsLater

    uri = f"local://{tmp_path / 'md'}"
    admin = open_metadata_store(parse_metadata_uri(uri), create=True)
    init_cluster(admin, "/ledgers")
    admin.close()
    stores: list[LandsLater] = []
    real_connect = walkit.metadata.connect

    def connect_flaky(where: str, **options: object) -> walkit.metadata.Cluster:
        cluster = real_connect(where, **options)  # type: ignore[arg-type]
        cluster.store = LandsLater(cluster.store)  # type: ignore[assignment]
        stores.append(cluster.store)  # type: ignore[arg-type]
        return cluster

    monkeypatch.setattr(walkit.metadata, "connect", connect_flaky)  # the server imports it when it starts

    async def body() -> None:
        async with in_process(config(tmp_path, metadata_service_uri=uri)) as server:
            store = stores[0]
            store.give_up_next = True
            server.forced_readonly = True
            await server.check_disks()  # the switch gives up (logged); adds are refused meanwhile
            assert server.readonly
            server.forced_readonly = False
            await server.check_disks()
            assert not server.readonly
            store.land()  # what was still on its way lands (if the check did not make it land first)
            with connect(uri) as cluster:
                bookies = cluster.bookies()
                assert (bookies.writable, bookies.readonly) == ({server.bookie_id}, set()), bookies

    run(body)


# --- READ_RANGE -----------------------------------------------------------------------------
async def ask(server: BookieServer, *requests: Request) -> list[Response]:
    """The answers to ``requests``, in their order, over a connection of their own (the
    bare protocol: no client library between the test and the bookie's bytes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    wire = ClientConnection()
    ids = []
    for req in requests:
        rid, frame = wire.send(req)
        ids.append(rid)
        writer.write(frame)
    answers: dict[int, Response] = {}
    while len(answers) < len(ids):
        data = await reader.read(1 << 16)
        assert data, "the bookie closed the connection"
        answers.update((resp.request_id, resp) for resp in wire.receive(data))
    writer.close()
    return [answers[rid] for rid in ids]


def errors_of(answers: list[Response]) -> list[tuple[Op, Status, int]]:
    return [(a.op, a.status, a.entry_id) for a in answers if isinstance(a, ErrorResponse)]


def test_read_range_answers_consecutive_entries_with_the_lac(tmp_path: Path) -> None:
    stored = [e for e in range(30) if e != 20]  # entry 20 never came to this bookie

    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            added = await ask(server, *(AddEntry(1, e, KEY, entry(1, e)) for e in stored))
            assert all(isinstance(a, AddEntryResponse) for a in added)
            size = len(entry(1, 0))
            answers = await ask(server, ReadRange(1, 0, 100), ReadRange(1, 5, 3), ReadRange(1, 21, 65536),
                                ReadRange(1, 0, 100, max_bytes=2 * size + 1), ReadRange(1, 3, 100, max_bytes=1),
                                ReadRange(1, 20, 5), ReadRange(1, 30, 5), ReadRange(99, 0, 5))
            ranges = [a for a in answers if isinstance(a, ReadRangeResponse)]
            assert [(r.ledger_id, r.first_entry, r.lac) for r in ranges] == [(1, 0, 28), (1, 5, 28), (1, 21, 28),
                                                                                (1, 0, 28), (1, 3, 28)]
            assert [list(r.entries) for r in ranges] == [
                [entry(1, e) for e in range(20)],  # stops before the missing entry
                [entry(1, e) for e in range(5, 8)],  # count
                [entry(1, e) for e in range(21, 30)],  # the last one stored
                [entry(1, 0), entry(1, 1)],  # max bytes
                [entry(1, 3)],  # the first always
            ]
            assert errors_of(answers) == [(Op.READ_RANGE, Status.ENOENTRY, 20), (Op.READ_RANGE, Status.ENOENTRY, 30),
                                          (Op.READ_RANGE, Status.ENOLEDGER, 0)]
            stats = server.stats
            assert (stats.range_entries.count, stats.range_entries.sum) == (5, 20 + 3 + 9 + 2 + 1)
            assert stats.responses[("read_range", "EOK")] == 5 and stats.responses[("read_range", "ENOENTRY")] == 2
            (family,) = [m for m in BookieCollector(server).collect() if m.name == "walkit_bookie_range_read_entries"]
            samples = {sample.name: sample.value for sample in family.samples}
            assert (samples["walkit_bookie_range_read_entries_count"],
                    samples["walkit_bookie_range_read_entries_sum"]) == (5, 35)

    run(body)


def test_read_range_answers_fit_the_bookies_frame(tmp_path: Path) -> None:
    frame = 64 << 10

    async def body() -> None:
        async with in_process(config(tmp_path, netty_max_frame_size_bytes=frame)) as server:
            payload = b"p" * (10 << 10)
            added = await ask(server, *(AddEntry(1, e, KEY, entry(1, e, payload)) for e in range(20)))
            assert all(isinstance(a, AddEntryResponse) for a in added)
            assert server.bookie is not None  # an entry as large as a frame: no answer can carry it
            await asyncio.wrap_future(server.bookie.add_entry(2, 0, KEY, entry(2, 0, b"b" * (frame - 36))))
            await asyncio.wrap_future(server.bookie.add_entry(2, 1, KEY, entry(2, 1)))
            whole, capped, big, big_alone = await ask(server, ReadRange(1, 0, 20), ReadRange(1, 2, 20, 25 << 10),
                                                      ReadRange(2, 0, 2), ReadEntry(2, 0))
            assert isinstance(whole, ReadRangeResponse) and isinstance(capped, ReadRangeResponse)
            n = len(whole.entries)
            sizes = [len(entry(1, e, payload)) for e in range(20)]
            assert whole.entries == tuple(entry(1, e, payload) for e in range(n))
            assert range_response_size(sum(sizes[:n]), n) <= frame < range_response_size(sum(sizes[:n + 1]), n + 1)
            assert capped.entries == (entry(1, 2, payload), entry(1, 3, payload))  # a third would pass 25 KiB
            assert errors_of([big, big_alone]) == [(Op.READ_RANGE, Status.EIO, 0), (Op.READ_ENTRY, Status.EIO, 0)]

    run(body)


def test_the_read_hook_applies_to_every_entry_of_a_range(tmp_path: Path) -> None:
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            await ask(server, *(AddEntry(1, e, KEY, entry(1, e)) for e in range(6)))
            seen: list[tuple[int, int]] = []

            def corrupt_entry_3(ledger: int, entry_id: int, data: bytes) -> bytes:
                seen.append((ledger, entry_id))
                return data[:-1] + bytes([data[-1] ^ 1]) if entry_id == 3 else data

            server.hooks.read = corrupt_entry_3
            ranged, single = await ask(server, ReadRange(1, 1, 4), ReadEntry(1, 3))
            assert isinstance(ranged, ReadRangeResponse) and isinstance(single, ReadEntryResponse)
            assert seen == [(1, 1), (1, 2), (1, 3), (1, 4), (1, 3)]
            flipped = entry(1, 3)[:-1] + bytes([entry(1, 3)[-1] ^ 1])
            assert ranged.entries == (entry(1, 1), entry(1, 2), flipped, entry(1, 4)) and single.data == flipped

    run(body)


def test_single_reads_of_entries_read_ahead_are_answered_without_the_read_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            assert server.bookie is not None
            await ask(server, *(AddEntry(1, e, KEY, entry(1, e)) for e in range(200)))
            server.bookie.storage.flush()  # on disk only: not in a write buffer any more
            pooled: list[int] = []
            original = server.reads.read_entry

            def counting(req: ReadEntry) -> Response:
                pooled.append(req.entry_id)
                return original(req)

            monkeypatch.setattr(server.reads, "read_entry", counting)
            (first,) = await ask(server, ReadEntry(1, 0))  # to the disk, with the 99 after it
            rest = await ask(server, *(ReadEntry(1, e) for e in range(1, 100)))
            assert isinstance(first, ReadEntryResponse) and first.data == entry(1, 0)
            assert [(type(a), a.entry_id, a.data, a.lac) for a in rest if isinstance(a, ReadEntryResponse)] == [
                (ReadEntryResponse, e, entry(1, e), first.lac) for e in range(1, 100)]
            assert pooled == [0]
            assert server.bookie.storage.cache_stats()["read_ahead"]["hits"] == 99
            (family,) = [m for m in BookieCollector(server).collect() if m.name == "walkit_bookie_read_cache_hits"]
            hits = {s.labels["cache"]: s.value for s in family.samples}
            assert hits["read_ahead"] == 99 and hits["recent_writes"] >= 1  # the read-ahead's preads, from memory
            server.hooks.read = lambda ledger, entry_id, data: data  # a hook sees every read: the pool again
            await ask(server, ReadEntry(1, 100), ReadEntry(1, 101))
            assert pooled == [0, 100, 101]

    run(body)


def test_the_write_cache_is_measured_and_emptied_by_a_checkpoint(tmp_path: Path) -> None:
    """Adds wait in the write cache, answered from there; ``/metrics`` shows its bytes;
    a checkpoint places them in the entry logs and empties it."""
    async def body() -> None:
        async with in_process(config(tmp_path, flush_interval=3_600_000)) as server:
            assert server.bookie is not None

            def cached() -> float:
                (family,) = [m for m in BookieCollector(server).collect() if m.name == "walkit_bookie_write_cache_bytes"]
                return family.samples[0].value

            before = cached()
            await ask(server, *(AddEntry(1, e, KEY, entry(1, e)) for e in range(50)))
            assert cached() - before == sum(len(entry(1, e)) for e in range(50))
            (read,) = await ask(server, ReadEntry(1, 7))
            assert isinstance(read, ReadEntryResponse) and read.data == entry(1, 7)
            server.bookie.checkpoint()
            assert cached() == 0 and server.bookie.storage.pending_index_entries() == 0

    run(body)


def test_the_slot_log_is_measured_and_merged(tmp_path: Path) -> None:
    """A checkpoint of many ledgers puts their slots in the slot log: ``/metrics`` shows
    how many it holds, the directory's size counts it as index; a reopen reads them."""
    async def body() -> None:
        async with in_process(config(tmp_path, flush_interval=3_600_000, index_slot_log_max_size_mb=1)) as server:
            assert server.bookie is not None

            def metric(name: str) -> list[Any]:
                (family,) = [m for m in BookieCollector(server).collect() if m.name == name]
                return family.samples

            ledgers = range(1, 2 * SLOT_LOG_LEDGERS + 1)
            await ask(server, *(AddEntry(lid, 0, KEY, entry(lid, 0)) for lid in ledgers))
            server.bookie.checkpoint()  # new index files
            await ask(server, *(AddEntry(lid, e, KEY, entry(lid, e)) for lid in ledgers for e in (1, 2)))
            server.bookie.checkpoint()
            assert metric("walkit_bookie_slot_log_slots")[0].value == 2 * len(ledgers)
            index = {s.labels["directory"]: s.value for s in metric("walkit_bookie_index_bytes")}
            assert sum(index.values()) >= len(ledgers) * 1032 + 512 + len(ledgers) * (28 + 16)
            for lid in ledgers:
                (read,) = await ask(server, ReadEntry(lid, 2))
                assert isinstance(read, ReadEntryResponse) and read.data == entry(lid, 2)

    run(body)


def test_admission_is_one_pure_decision_with_its_precedence() -> None:
    """An add is refused for stopping before read-only before busy; a recovery add passes
    a read-only bookie; the limits are on adds and on bytes in flight."""
    from bookie.server._admission import REFUSALS, AddsInFlight, refusal

    idle, full, heavy = AddsInFlight(), AddsInFlight(), AddsInFlight()
    full.count, heavy.bytes = 10, 1000
    assert refusal(False, False, False, idle, 10, 1000) is None
    assert refusal(True, True, False, full, 10, 1000) == "stopping"
    assert refusal(False, True, False, full, 10, 1000) == "readonly"
    assert refusal(False, True, True, idle, 10, 1000) is None  # recovery completes others' recoveries
    assert refusal(False, True, True, full, 10, 1000) == "busy"
    assert refusal(False, False, False, heavy, 10, 1000) == "busy"
    assert set(REFUSALS) == {"stopping", "readonly", "busy"}
