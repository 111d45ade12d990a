"""The client side of BookKeeper's dialects: the sans-IO BkClientConnection (frames the
codecs' server sides read, answers matched to requests) and BkBookieClient over a fake
transport (callbacks, error mapping, the v2 long-poll by polling, refusals)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from walkit.client._bk_bookie_client import BkBookieClient
from walkit.client._entry_codec import EntryCodec
from walkit.client._ranges import is_older_bookie
from walkit.errors import (
    BookieUnavailableError,
    InvalidArgumentError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ProtocolError,
    UnauthorizedError,
    WalkitError,
)
from walkit.protocol import (
    AddEntry,
    AddEntryResponse,
    GetBookieInfo,
    GetListOfEntries,
    ListOfEntriesResponse,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadLacResponse,
    ReadRange,
    StartTls,
    StartTlsResponse,
    Status,
    WriteLac,
    WriteLacResponse,
    encode_availability,
    error_for,
)
from walkit.protocol import _bk_v2, _bk_v3
from walkit.protocol._bk_client import BkClientConnection
from walkit.protocol._dialect import Dialect
from walkit.protocol._messages import ErrorResponse

KEY = b"k" * 20
CODEC = EntryCodec.of("bk-crc32c", b"pw")


def entry(ledger: int, entry_id: int, lac: int = -1) -> bytes:
    return CODEC.encode(ledger, entry_id, lac, 10 * (entry_id + 1), b"payload-%d" % entry_id)


def frames(data: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(data):
        (size,) = struct.unpack_from(">I", data, at)
        out.append(data[at + 4:at + 4 + size])
        at += 4 + size
    return out


# -- sans-IO, v3 --------------------------------------------------------------------------------


def test_v3_requests_are_what_a_bookie_decodes_and_answers_match_by_txn_id() -> None:
    wire = BkClientConnection(Dialect.BK_V3)
    sent = {}
    for request in (AddEntry(5, 0, KEY, entry(5, 0), True), ReadEntry(5, 0, True, KEY),
                    ReadEntry(5, 3, previous_lac=2, timeout_ms=500), ReadLac(5), WriteLac(5, 0, KEY, body=b"B" * 20),
                    GetBookieInfo()):
        rid, frame = wire.send(request)
        decoded = _bk_v3.decode_request(frames(frame)[0])
        assert decoded.request_id == rid
        sent[rid] = decoded
    add, fence, poll, lac, wlac, _ = sent.values()
    assert isinstance(add, AddEntry) and add.recovery and add.master_key == KEY and add.data == entry(5, 0)
    assert isinstance(fence, ReadEntry) and fence.fence and fence.master_key == KEY
    assert isinstance(poll, ReadEntry) and (poll.previous_lac, poll.timeout_ms) == (2, 500)
    assert isinstance(lac, ReadLac)
    assert isinstance(wlac, WriteLac) and wlac.body == b"B" * 20
    # answers in another order than the requests, all in one read, the last one cut in two
    answers = (_bk_v3.encode_response(ReadLacResponse(5, 0, lac.request_id, last_entry=entry(5, 0), lac_body=b"L"))
               + _bk_v3.encode_response(AddEntryResponse(5, 0, add.request_id))
               + _bk_v3.encode_error(fence, Status.EFENCED)
               + _bk_v3.encode_response(WriteLacResponse(5, wlac.request_id)))
    got = wire.receive(answers[:-3]) + wire.receive(answers[-3:])
    assert [rid for rid, _ in got] == [lac.request_id, add.request_id, fence.request_id, wlac.request_id]
    read_lac = got[0][1]
    assert isinstance(read_lac, ReadLacResponse) and read_lac.last_entry == entry(5, 0) and read_lac.lac_body == b"L"
    assert isinstance(got[1][1], AddEntryResponse)
    assert isinstance(got[2][1], ErrorResponse) and isinstance(error_for(got[2][1]), LedgerFencedError)
    assert wire.receive(_bk_v3.encode_response(AddEntryResponse(5, 0, add.request_id))) == []  # answered already


@pytest.mark.parametrize("status, error", [(Status.EFENCED, LedgerFencedError), (Status.ENOENTRY, NoSuchEntryError),
                                           (Status.ENOLEDGER, NoSuchLedgerError), (Status.EUA, UnauthorizedError)])
@pytest.mark.parametrize("dialect", [Dialect.BK_V3, Dialect.BK_V2])
def test_statuses_become_walkits_errors(dialect: Dialect, status: Status, error: type[WalkitError]) -> None:
    wire = BkClientConnection(dialect)
    codec = _bk_v3 if dialect is Dialect.BK_V3 else _bk_v2
    rid, frame = wire.send(ReadEntry(7, 4))
    request = codec.decode_request(frames(frame)[0])
    [(got_rid, response)] = wire.receive(codec.encode_error(request, status))
    assert got_rid == rid and isinstance(response, ErrorResponse)
    assert isinstance(error_for(response), error)


def test_a_read_of_entry_minus_one_is_answered_under_the_entrys_id() -> None:
    for dialect, codec in ((Dialect.BK_V3, _bk_v3), (Dialect.BK_V2, _bk_v2)):
        wire = BkClientConnection(dialect)
        rid, frame = wire.send(ReadEntry(5, -1, True, KEY))
        request = codec.decode_request(frames(frame)[0])
        assert isinstance(request, ReadEntry) and request.entry_id == -1 and request.fence
        if dialect is Dialect.BK_V3:  # BookKeeper's bookie answers under the request's -1, no maxLAC
            out = _bk_v3.pb.Response()
            out.header.version, out.header.operation, out.header.txnId = _bk_v3.pb.VERSION_THREE, _bk_v3.pb.READ_ENTRY, rid
            out.status = _bk_v3.pb.EOK
            sub = out.readResponse
            sub.status, sub.ledgerId, sub.entryId, sub.body = _bk_v3.pb.EOK, 5, -1, entry(5, 9, 8)
            body = out.SerializeToString()
            answer = struct.pack(">I", len(body)) + body
        else:
            answer = _bk_v2.last_entry_answer(ReadEntryResponse(5, 9, 8, entry(5, 9, 8)))
        [(got, response)] = wire.receive(answer)
        assert got == rid and isinstance(response, ReadEntryResponse)
        assert (response.entry_id, response.lac) == (9, 8)


def test_what_a_dialect_cannot_carry_is_refused_before_the_wire() -> None:
    v3, v2 = BkClientConnection(Dialect.BK_V3), BkClientConnection(Dialect.BK_V2)
    with pytest.raises(ProtocolError) as refused:
        v3.send(ReadRange(5, 0, 10, 1 << 20))
    assert is_older_bookie(refused.value)  # the reads then go entry by entry
    for request in (WriteLac(5, 1, KEY), GetBookieInfo(), ReadEntry(5, 2, previous_lac=1, timeout_ms=10)):
        with pytest.raises(ProtocolError):
            v2.send(request)
    with pytest.raises(InvalidArgumentError):  # v2 keys are BookKeeper's 20 bytes
        v2.send(AddEntry(5, 0, b"k" * 32, entry(5, 0)))
    with pytest.raises(InvalidArgumentError):
        BkClientConnection(Dialect.WALKIT)


# -- sans-IO, v2 --------------------------------------------------------------------------------


def test_v2_answers_match_by_op_ledger_and_entry_oldest_first() -> None:
    wire = BkClientConnection(Dialect.BK_V2)
    a0, f0 = wire.send(AddEntry(5, 0, KEY, entry(5, 0)))
    a1, _ = wire.send(AddEntry(5, 1, KEY, entry(5, 1)))
    r1, _ = wire.send(ReadEntry(5, 1))
    r1b, _ = wire.send(ReadEntry(5, 1))
    lac, flac = wire.send(ReadLac(5))
    assert isinstance(_bk_v2.decode_request(frames(f0)[0]), AddEntry)
    lac_request = _bk_v2.decode_request(frames(flac)[0])
    assert isinstance(lac_request, ReadEntry) and lac_request.entry_id == -1  # v2 reads the LAC off the last entry
    answers = (_bk_v2.encode_response(ReadEntryResponse(5, 1, 0, entry(5, 1, 0)))
               + _bk_v2.encode_response(AddEntryResponse(5, 1))
               + _bk_v2.last_entry_answer(ReadEntryResponse(5, 1, 0, entry(5, 1, 0)))
               + _bk_v2.encode_error(ReadEntry(5, 1), Status.ENOENTRY)
               + _bk_v2.encode_response(AddEntryResponse(5, 0)))
    got = []
    for i in range(len(answers)):  # byte by byte
        got += wire.receive(answers[i:i + 1])
    assert [rid for rid, _ in got] == [r1, a1, lac, r1b, a0]
    assert isinstance(got[0][1], ReadEntryResponse)
    read_lac = got[2][1]
    assert isinstance(read_lac, ReadLacResponse) and read_lac.last_entry == entry(5, 1, 0)
    assert CODEC.lac_of(read_lac) == 0
    assert isinstance(got[3][1], ErrorResponse)
    # an error answer to a LAC read stays a LAC read's error
    lac2, _ = wire.send(ReadLac(6))
    [(rid, err)] = wire.receive(_bk_v2.encode_error(ReadEntry(6, -1), Status.ENOLEDGER))
    assert rid == lac2 and isinstance(err, ErrorResponse) and isinstance(error_for(err), NoSuchLedgerError)


def test_v2_range_reads_are_batch_reads_matched_by_their_request_id() -> None:
    from walkit.protocol import ReadRangeResponse

    wire = BkClientConnection(Dialect.BK_V2)
    first, frame = wire.send(ReadRange(5, 0, 3, 1 << 20))
    second, frame2 = wire.send(ReadRange(5, 0, 3, 1 << 20))
    request = _bk_v2.decode_request(frames(frame)[0])
    assert isinstance(request, ReadRange) and request.request_id == first and (request.first_entry, request.count) == (0, 3)
    answers = (_bk_v2.encode_error(ReadRange(5, 0, 3, 1 << 20, second), Status.ENOENTRY)
               + _bk_v2.encode_response(ReadRangeResponse(5, 0, 1, (entry(5, 0), entry(5, 1)), first)))
    got = wire.receive(answers)
    assert [rid for rid, _ in got] == [second, first]
    assert isinstance(got[0][1], ErrorResponse) and isinstance(error_for(got[0][1]), NoSuchEntryError)
    run = got[1][1]
    assert isinstance(run, ReadRangeResponse) and CODEC.decode_run(run.entries, 5, 0) == [b"payload-0", b"payload-1"]
    assert wire.receive(_bk_v2.encode_response(ReadRangeResponse(5, 0, 1, (entry(5, 0),), first))) == []


def test_garbage_is_a_protocol_error() -> None:
    for dialect in (Dialect.BK_V3, Dialect.BK_V2):
        wire = BkClientConnection(dialect)
        wire.send(ReadEntry(1, 1))
        with pytest.raises(ProtocolError):
            wire.receive(struct.pack(">I", 6) + b"\xff\xfe\xfd\xfc\xfb\xfa")
    with pytest.raises(ProtocolError):
        BkClientConnection(Dialect.BK_V3, max_frame_size=1 << 16).receive(struct.pack(">I", 1 << 20))


# -- BkBookieClient over a fake transport -------------------------------------------------------


class FakeBookie:
    """A transport whose writes a scripted bookie answers (on the next loop iteration)."""

    def __init__(self, client: BkBookieClient, answer: Callable[[Any], bytes | None]) -> None:
        self.client = client
        self.answer = answer
        self.requests: list[Any] = []
        self.closed = False
        self.codec = _bk_v2 if client.dialect is Dialect.BK_V2 else _bk_v3

    def write(self, data: bytes) -> None:
        for frame in frames(data):
            request = self.codec.decode_request(frame)
            self.requests.append(request)
            reply = self.answer(request)
            if reply is not None:
                asyncio.get_running_loop().call_soon(self.client._received, reply)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def fake(dialect: Dialect, answer: Callable[[Any], bytes | None]) -> tuple[BkBookieClient, FakeBookie]:
    client = BkBookieClient("127.0.0.1:1", 1 << 20, dialect)
    bookie = FakeBookie(client, answer)
    client._transport = bookie  # type: ignore[assignment]
    return client, bookie


@pytest.mark.parametrize("dialect", [Dialect.BK_V3, Dialect.BK_V2])
def test_callbacks_errors_and_a_lost_connection(dialect: Dialect) -> None:
    codec = _bk_v3 if dialect is Dialect.BK_V3 else _bk_v2

    def answer(request: Any) -> bytes | None:
        if isinstance(request, AddEntry) and request.entry_id == 1:
            return codec.encode_error(request, Status.EFENCED)
        if isinstance(request, AddEntry):
            return codec.encode_response(AddEntryResponse(request.ledger_id, request.entry_id, request.request_id))
        if isinstance(request, ReadEntry) and request.entry_id == 3:
            return None  # never answered
        return codec.encode_response(ReadEntryResponse(request.ledger_id, request.entry_id, 0,
                                                       entry(request.ledger_id, request.entry_id, 0),
                                                       request.request_id))

    async def go() -> None:
        client, bookie = fake(dialect, answer)
        heard: list[tuple[Any, Any, Any]] = []
        client.request_cb(AddEntry(5, 0, KEY, entry(5, 0)), lambda r, e, c: heard.append((r, e, c)), "a0")
        client.request_cb(AddEntry(5, 1, KEY, entry(5, 1)), lambda r, e, c: heard.append((r, e, c)), "a1")
        read = await client.read_entry(5, 2)
        assert CODEC.decode(read.data)[1] == b"payload-2"
        assert heard[0] == (None, None, "a0")  # an add's answer is "durable", nothing more
        assert heard[1][0] is None and isinstance(heard[1][1], LedgerFencedError) and heard[1][2] == "a1"
        assert len(bookie.requests) == 3
        stuck = asyncio.ensure_future(client.read_entry(5, 3))
        await asyncio.sleep(0.01)
        client._lost(BookieUnavailableError("connection to bookie lost", bookie=client.address))
        with pytest.raises(BookieUnavailableError):
            await stuck
        assert client.failed
        refused: list[Any] = []
        client.request_cb(ReadEntry(5, 4), lambda r, e, c: refused.append(e), None)
        await asyncio.sleep(0)
        assert isinstance(refused[0], BookieUnavailableError)
    asyncio.run(go())


def test_a_refused_request_is_answered_and_the_connection_goes_on() -> None:
    async def go() -> None:
        client, bookie = fake(Dialect.BK_V2, lambda r: _bk_v2.encode_response(AddEntryResponse(r.ledger_id, r.entry_id)))
        heard: list[Any] = []
        assert client.try_request_cb(WriteLac(5, 1, KEY), lambda r, e, c: heard.append(e), None)
        await asyncio.sleep(0)
        assert isinstance(heard[0], ProtocolError) and not client.failed and bookie.requests == []
        await client.add_entry(5, 0, KEY, entry(5, 0))
        assert len(bookie.requests) == 1
    asyncio.run(go())


def test_the_list_of_entries_a_java_bookie_stores() -> None:
    """GET_LIST_OF_ENTRIES_OF_LEDGER (re-replication's ``present`` on a Java bookie): the
    availability bytes read back as ids; no ledger there is NoSuchLedgerError; bytes that
    are no availability a ProtocolError; v2 cannot carry it."""
    def answer(request: Any) -> bytes:
        assert isinstance(request, GetListOfEntries)
        if request.ledger_id == 6:
            return _bk_v3.encode_error(request, Status.ENOLEDGER)
        body = encode_availability([0, 1, 2, 5, 9]) if request.ledger_id == 5 else b"\x01" * 10
        return _bk_v3.encode_response(ListOfEntriesResponse(request.ledger_id, body, request.request_id))

    async def go() -> None:
        client, bookie = fake(Dialect.BK_V3, answer)
        assert await client.entries_of(5) == [0, 1, 2, 5, 9]
        with pytest.raises(NoSuchLedgerError):
            await client.entries_of(6)
        with pytest.raises(ProtocolError):
            await client.entries_of(7)
        assert [r.ledger_id for r in bookie.requests] == [5, 6, 7] and not client.failed
        v2, v2_bookie = fake(Dialect.BK_V2, lambda r: None)
        with pytest.raises(ProtocolError):
            await v2.entries_of(5)
        assert v2_bookie.requests == []
    asyncio.run(go())


def test_v2_long_poll_is_served_by_polling_the_last_entry() -> None:
    last = {"entry": 3}  # the bookie's last entry; its LAC is the one before

    def answer(request: Any) -> bytes:
        assert isinstance(request, ReadEntry) and request.entry_id == -1 and request.previous_lac is None
        e = last["entry"]
        return _bk_v2.last_entry_answer(ReadEntryResponse(5, e, e - 1, entry(5, e, e - 1)))

    async def go() -> None:
        client, bookie = fake(Dialect.BK_V2, answer)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[Any, Any]] = loop.create_future()
        client.request_cb(ReadEntry(5, 3, previous_lac=2, timeout_ms=5000),
                          lambda r, e, c: done.set_result((r, e)), None)
        await asyncio.sleep(0.1)
        assert not done.done() and len(bookie.requests) >= 3  # polled, LAC not past 2 yet
        last["entry"] = 5
        response, error = await asyncio.wait_for(done, 2)
        assert error is None and isinstance(response, ReadEntryResponse) and response.lac == 4
        # a poll whose time is up answers with the LAC as it is
        timed: asyncio.Future[tuple[Any, Any]] = loop.create_future()
        client.request_cb(ReadEntry(5, 5, previous_lac=4, timeout_ms=50), lambda r, e, c: timed.set_result((r, e)), None)
        response, error = await asyncio.wait_for(timed, 2)
        assert error is None and response.lac == 4
        # closing the client answers a poll still waiting
        waiting: asyncio.Future[tuple[Any, Any]] = loop.create_future()
        client.request_cb(ReadEntry(5, 5, previous_lac=4, timeout_ms=60_000),
                          lambda r, e, c: waiting.set_result((r, e)), None)
        await asyncio.sleep(0.05)
        await client.close()
        _, error = await asyncio.wait_for(waiting, 2)
        assert isinstance(error, BookieUnavailableError)
    asyncio.run(go())


def test_the_pool_picks_the_connection_by_kind_and_tls_by_the_client_configuration(tmp_path: Path) -> None:
    """A bookie of kind "bookkeeper" gets a BkBookieClient in the configured dialect.
    TLS toward it follows the client's configuration, not the registration (as
    BookKeeper's client): with a CA the connection's first frame is a v3 START_TLS, in v2
    too; a bookie that answers EBADREQ (no TLS there) is BookieUnavailableError naming TLS."""
    from support.bookie import make_certificates
    from walkit.client._config import ClientConfig
    from walkit.client._pool import BookiePool, Endpoint

    certs = make_certificates(tmp_path)

    async def go() -> None:
        first_frames: list[bytes] = []

        async def bookie(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                (size,) = struct.unpack(">I", await reader.readexactly(4))
                frame = await reader.readexactly(size)
            except asyncio.IncompleteReadError:
                writer.close()
                return
            first_frames.append(frame)
            try:
                request = _bk_v3.decode_request(frame)
            except ProtocolError:  # a plain client's v2 read: nothing to answer here
                request = None
            if request is not None:  # as a BookKeeper bookie without TLS answers START_TLS
                writer.write(_bk_v3.encode_error(request, Status.EBADREQ))
                await writer.drain()
            await reader.read()
            writer.close()

        server = await asyncio.start_server(bookie, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        endpoints = {"plain": Endpoint("127.0.0.1", port, False, "bookkeeper")}

        async def resolve(name: str) -> Endpoint:
            return endpoints[name]
        try:
            for v2 in (False, True):
                tls = BookiePool(ClientConfig(use_v2_wire_protocol=v2, connect_timeout=2.0,
                                              tls_ca_file=certs["ca"]), resolve)
                heard: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                tls.request_cb("plain", ReadEntry(1, 0), lambda r, e, c: heard.set_result(e), None)
                error = await asyncio.wait_for(heard, 5)
                assert isinstance(error, BookieUnavailableError) and "TLS" in str(error)
                assert isinstance(error.__cause__, ProtocolError) and "EBADREQ" in str(error.__cause__)
                assert isinstance(_bk_v3.decode_request(first_frames[-1]), StartTls)  # v3, whatever the dialect
                await tls.close()
                pool = BookiePool(ClientConfig(use_v2_wire_protocol=v2, connect_timeout=2.0), resolve)
                pool.request_cb("plain", ReadEntry(1, 0), lambda r, e, c: None, None)
                for _ in range(100):
                    if "plain" in pool._clients:
                        break
                    await asyncio.sleep(0.01)
                conn = pool._clients["plain"]
                assert isinstance(conn, BkBookieClient)
                assert conn.dialect is (Dialect.BK_V2 if v2 else Dialect.BK_V3)
                await pool.close()
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(go())


def test_start_tls_answer_is_read_whole_and_only_eok_starts_the_handshake() -> None:
    for dialect in (Dialect.BK_V3, Dialect.BK_V2):
        conn = BkClientConnection(dialect)
        request = _bk_v3.decode_request(frames(conn.start_tls())[0])
        assert isinstance(request, StartTls)
        answer = _bk_v3.encode_response(StartTlsResponse(request.request_id))
        assert conn.tls_started(answer[:3]) is False and conn.tls_started(answer[3:-1]) is False
        assert conn.tls_started(answer[-1:]) is True
        # after TLS the dialect goes on, numbering on
        rid, frame = conn.send(ReadEntry(1, 0))
        assert rid == request.request_id + 1 and frame
    refused = BkClientConnection(Dialect.BK_V3)
    request = _bk_v3.decode_request(frames(refused.start_tls())[0])
    with pytest.raises(ProtocolError, match="refused START_TLS"):
        refused.tls_started(_bk_v3.encode_error(request, Status.EBADREQ))
    early = BkClientConnection(Dialect.BK_V3)
    request = _bk_v3.decode_request(frames(early.start_tls())[0])
    with pytest.raises(ProtocolError, match="no START_TLS answer"):  # bytes after EOK: not TLS's
        early.tls_started(_bk_v3.encode_response(StartTlsResponse(request.request_id)) + b"\x16")
    other = BkClientConnection(Dialect.BK_V3)
    other.start_tls()
    with pytest.raises(ProtocolError, match="no START_TLS answer"):
        other.tls_started(_bk_v3.encode_response(WriteLacResponse(1, 99)))


@pytest.mark.parametrize("kind, registered_tls, have_ca, expected", [
    ("walkit", True, False, True),  # walkit's TLS starts with the connection: its registration decides
    ("walkit", False, True, False),
    ("bookkeeper", False, True, True),  # BookKeeper's client decides by its own CA: START_TLS first
    ("bookkeeper", True, False, False),
])
def test_one_rule_says_which_connections_are_tls(kind: str, registered_tls: bool, have_ca: bool,
                                                 expected: bool) -> None:
    from walkit.client import Endpoint, uses_tls
    assert uses_tls(Endpoint("127.0.0.1", 3181, registered_tls, kind), have_ca) is expected  # type: ignore[arg-type]
