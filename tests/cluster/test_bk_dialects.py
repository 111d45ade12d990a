"""A walkit bookie speaking BookKeeper's v3 (protobuf) and v2 (binary) dialects on its one
port, beside walkit's own (issue 37): real bookies in this process, raw sockets, the
BookKeeper codecs' client side (``encode_request`` / ``decode_response``), entries in
BookKeeper's own format (``bk_encode_entry``) - and BookKeeper's answers to bad input."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from support.bookie import KEY, client_of, config, entry, in_process, run
from walkit.errors import InvalidArgumentError, NoSuchEntryError
from walkit.protocol import _codec
from walkit.protocol import (
    AddEntry,
    AddEntryResponse,
    AuthMessage,
    BkDigestType,
    BookieInfoResponse,
    Dialect,
    DialectSniffer,
    ErrorResponse,
    ForceLedger,
    ForceLedgerResponse,
    GetBookieInfo,
    GetListOfEntries,
    ListOfEntriesResponse,
    Op,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadLacResponse,
    ReadRange,
    ReadRangeResponse,
    ServerConnection,
    StartTls,
    Status,
    WriteLac,
    WriteLacResponse,
    bk_decode_entry,
    encode_request,
    bk_encode_entry,
    bk_master_key,
    codec_for,
    decode_availability,
    encode_availability,
)
from walkit.protocol import _bk_v3_pb2
from walkit.protocol._bk_digest import bk_decode_lac, bk_encode_lac

pb: Any = _bk_v3_pb2
PASSWORD = b"secret"
BK_KEY = bk_master_key(PASSWORD)
WRONG_KEY = bk_master_key(b"wrong")
DIALECTS = [Dialect.BK_V3, Dialect.BK_V2]
MAX_FRAME = 5 * 1024 * 1024


def bk_entry(ledger: int, entry_id: int, lac: int | None = None) -> bytes:
    """An entry as BookKeeper's client sends it (CRC32C digest, the ledger's length)."""
    payload = f"bk L{ledger}E{entry_id}".encode() * 3
    return bk_encode_entry(ledger, entry_id, entry_id - 1 if lac is None else lac, (entry_id + 1) * len(payload),
                           payload, digest=BkDigestType.CRC32C, password=PASSWORD)


class BkPeer:
    """A raw socket speaking one BookKeeper dialect with the codec's client side."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, dialect: Dialect) -> None:
        self.reader, self.writer, self.dialect = reader, writer, dialect
        self.codec: ModuleType = codec_for(dialect)
        self.txn = 0

    @classmethod
    async def open(cls, port: int, dialect: Dialect) -> BkPeer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, dialect)

    def frame(self, req: Any) -> bytes:
        """``req``'s frame, numbered with the next txnId (v2 has none: 0)."""
        self.txn += 1
        if self.dialect is Dialect.BK_V3 and hasattr(req, "request_id"):
            req = type(req)(**{**req.__dict__, "request_id": self.txn})
        return bytes(self.codec.encode_request(req))

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send(self, req: Any) -> None:
        await self.send_raw(self.frame(req))

    async def recv_frame(self) -> bytes:
        (length,) = struct.unpack(">I", await asyncio.wait_for(self.reader.readexactly(4), 10))
        return await asyncio.wait_for(self.reader.readexactly(length), 10)

    async def recv(self) -> Any:
        return self.codec.decode_response(await self.recv_frame())

    async def ask(self, req: Any) -> Any:
        await self.send(req)
        return await self.recv()

    async def closed_by_bookie(self) -> bool:
        """True when the bookie closes the connection without another byte."""
        try:
            rest = await asyncio.wait_for(self.reader.read(), 10)
        except ConnectionResetError:
            return True
        return rest == b""

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass


async def _handshake(peer: BkPeer) -> None:
    """The AUTH a BookKeeper client opens with; a bookie without an auth provider answers
    "AuthDisabledPlugin" and an empty payload, whatever the client sent."""
    answer = await peer.ask(AuthMessage("BookKeeperClientAuth", b"hello"))
    assert isinstance(answer, AuthMessage)
    assert (answer.plugin_name, answer.payload) == ("AuthDisabledPlugin", b"")
    if peer.dialect is Dialect.BK_V3:
        assert answer.request_id == peer.txn


def test_v3_every_operation(tmp_path: Path) -> None:
    """v3: auth, adds, reads (one, the last), LAC read and write, bookie info, force,
    the list of entries (runs and gaps) and START_TLS refused as a bookie without TLS."""
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            peer = await BkPeer.open(server.port, Dialect.BK_V3)
            await _handshake(peer)
            for e in range(5):
                assert await peer.ask(AddEntry(7, e, BK_KEY, bk_entry(7, e))) == AddEntryResponse(7, e, peer.txn)
            read = await peer.ask(ReadEntry(7, 2))
            assert isinstance(read, ReadEntryResponse) and read.data == bk_entry(7, 2)  # byte-exact
            assert bk_decode_entry(read.data, password=PASSWORD) == ((7, 2, 1, 3 * 21), b"bk L7E2" * 3)
            assert read.lac == 3
            last = await peer.ask(ReadEntry(7, -1))
            assert (last.entry_id, last.data) == (4, bk_entry(7, 4))
            assert await peer.ask(ReadLac(7)) == ReadLacResponse(7, 3, peer.txn)
            body = bk_encode_lac(7, 4, digest=BkDigestType.CRC32C)
            assert await peer.ask(WriteLac(7, 4, BK_KEY, body=body)) == WriteLacResponse(7, peer.txn)
            assert await peer.ask(ReadLac(7)) == ReadLacResponse(7, 4, peer.txn)
            await peer.send(ReadLac(7))  # as BookKeeper's: the LAC write's body and the last entry, as stored
            raw = pb.Response()
            raw.ParseFromString(await peer.recv_frame())
            assert (raw.readLacResponse.lacBody, raw.readLacResponse.lastEntryBody) == (body, bk_entry(7, 4))
            assert bk_decode_lac(raw.readLacResponse.lacBody, digest=BkDigestType.CRC32C) == 4
            walkit_client = await client_of(server)
            assert await walkit_client.read_lac(7) == 4
            await walkit_client.close()
            info = await peer.ask(GetBookieInfo())
            assert isinstance(info, BookieInfoResponse) and 0 < info.free_bytes <= info.total_bytes
            assert await peer.ask(ForceLedger(7)) == ForceLedgerResponse(7, peer.txn)
            for e in (0, 1, 2, 5, 6, 9):
                await peer.ask(AddEntry(8, e, BK_KEY, bk_entry(8, e)))
            listed = await peer.ask(GetListOfEntries(8))
            assert isinstance(listed, ListOfEntriesResponse)
            assert decode_availability(listed.availability) == [0, 1, 2, 5, 6, 9]
            assert decode_availability((await peer.ask(GetListOfEntries(7))).availability) == list(range(5))
            missing = await peer.ask(GetListOfEntries(99))
            assert isinstance(missing, ErrorResponse) and missing.status is Status.ENOLEDGER
            tls = await peer.ask(StartTls())
            assert isinstance(tls, ErrorResponse) and tls.status is Status.EBADREQ
            no_entry = await peer.ask(ReadEntry(7, 50))
            assert isinstance(no_entry, ErrorResponse) and no_entry.status is Status.ENOENTRY
            await peer.close()

    run(body)


def test_v2_adds_reads_and_batch_read(tmp_path: Path) -> None:
    """v2: auth, adds, reads (one, the last, a batch), answers matched by (op, ledger, entry)."""
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            peer = await BkPeer.open(server.port, Dialect.BK_V2)
            await _handshake(peer)
            for e in range(4):  # pipelined: v2 answers carry no id, but ledger and entry
                await peer.send(AddEntry(3, e, BK_KEY, bk_entry(3, e)))
            answers = [await peer.recv() for _ in range(4)]
            assert sorted(a.entry_id for a in answers) == [0, 1, 2, 3]
            assert all(isinstance(a, AddEntryResponse) and a.ledger_id == 3 for a in answers)
            read = await peer.ask(ReadEntry(3, 1))
            assert isinstance(read, ReadEntryResponse) and read.data == bk_entry(3, 1)
            last = await peer.ask(ReadEntry(3, -1))
            assert (last.entry_id, last.data) == (3, bk_entry(3, 3))
            await peer.send(ReadEntry(3, -1))  # on the wire: entry id -1, the request's (LAST_ADD_CONFIRMED)
            assert struct.unpack_from(">Iiqq", await peer.recv_frame()) == (2 << 24 | 2 << 16, 0, 3, -1)
            batch = await peer.ask(ReadRange(3, 0, 10, 1 << 20, 77))
            assert isinstance(batch, ReadRangeResponse) and batch.request_id == 77
            assert list(batch.entries) == [bk_entry(3, e) for e in range(4)]
            missing = await peer.ask(ReadEntry(42, 0))
            assert isinstance(missing, ErrorResponse) and missing.status is Status.ENOLEDGER
            await peer.close()

    run(body)


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.value)
def test_fencing_read_recovery_add_and_wrong_key(tmp_path: Path, dialect: Dialect) -> None:
    """A fencing read (of the last entry, as recovery does) fences; a normal add is then
    refused EFENCED, a recovery add taken; a wrong master key is EUA - for adds and for
    fencing reads - and the connection stays, as with BookKeeper's bookie."""
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            peer = await BkPeer.open(server.port, dialect)
            for e in range(2):
                assert isinstance(await peer.ask(AddEntry(5, e, BK_KEY, bk_entry(5, e))), AddEntryResponse)
            wrong = await peer.ask(AddEntry(5, 2, WRONG_KEY, bk_entry(5, 2)))
            assert isinstance(wrong, ErrorResponse) and wrong.status is Status.EUA
            wrong_fence = await peer.ask(ReadEntry(5, -1, True, WRONG_KEY))
            assert isinstance(wrong_fence, ErrorResponse) and wrong_fence.status is Status.EUA
            fenced = await peer.ask(ReadEntry(5, -1, True, BK_KEY))
            assert isinstance(fenced, ReadEntryResponse) and (fenced.entry_id, fenced.data) == (1, bk_entry(5, 1))
            refused = await peer.ask(AddEntry(5, 2, BK_KEY, bk_entry(5, 2)))
            assert isinstance(refused, ErrorResponse) and refused.status is Status.EFENCED
            recovered = await peer.ask(AddEntry(5, 2, BK_KEY, bk_entry(5, 2), recovery=True))
            assert isinstance(recovered, AddEntryResponse) and recovered.entry_id == 2
            again = await peer.ask(ReadEntry(5, 2))
            assert isinstance(again, ReadEntryResponse) and again.data == bk_entry(5, 2)
            await peer.close()

    run(body)


def test_v3_long_poll_lac_and_entry(tmp_path: Path) -> None:
    """readLastAddConfirmedAndEntry: a READ with previousLAC and a timeout waits until an
    add moves the LAC past it, then brings the entry asked for (walkit's long-poll
    machinery, _long_poll.py); with no entry to bring, BookKeeper's LAC-only answer."""
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            writer = await BkPeer.open(server.port, Dialect.BK_V3)
            poller = await BkPeer.open(server.port, Dialect.BK_V3)
            await writer.ask(AddEntry(9, 0, BK_KEY, bk_entry(9, 0)))  # carries LAC -1
            await poller.send(ReadEntry(9, 0, previous_lac=-1, timeout_ms=10_000))  # entry previousLAC + 1
            await asyncio.sleep(0.3)
            await writer.ask(AddEntry(9, 1, BK_KEY, bk_entry(9, 1)))  # carries LAC 0: the poll wakes
            woken = await poller.recv()
            assert isinstance(woken, ReadEntryResponse) and woken.request_id == poller.txn
            assert (woken.entry_id, woken.data, woken.lac) == (0, bk_entry(9, 0), 0)
            # time out: EOK, maxLAC (the previous LAC, not passed), no entry - as
            # BookKeeper's LongPollReadEntryProcessorV3 (walkit's own dialect says ENOENTRY)
            expired = await poller.ask(ReadEntry(9, 1, previous_lac=0, timeout_ms=200))
            assert expired == ReadEntryResponse(9, 1, 0, b"", poller.txn)
            # the LAC moves but the entry asked for is not here: EOK, the new LAC, no entry
            await poller.send(ReadEntry(9, 5, previous_lac=0, timeout_ms=10_000))
            await asyncio.sleep(0.3)
            await writer.ask(AddEntry(9, 2, BK_KEY, bk_entry(9, 2)))  # carries LAC 1
            assert await poller.recv() == ReadEntryResponse(9, 5, 1, b"", poller.txn)
            # the Java client's form: entry -1; the bookie reads previousLAC + 1, as BookKeeper's
            await poller.send(ReadEntry(9, -1, previous_lac=1, timeout_ms=10_000))
            await asyncio.sleep(0.3)
            await writer.ask(AddEntry(9, 3, BK_KEY, bk_entry(9, 3)))  # carries LAC 2
            piggy = await poller.recv()
            assert (piggy.entry_id, piggy.lac, piggy.data) == (2, 2, bk_entry(9, 2))
            await writer.close()
            await poller.close()

    run(body)


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.value)
def test_a_truncated_frame_closes_the_connection(tmp_path: Path, dialect: Dialect) -> None:
    """A frame whose body is cut short does not decode: BookKeeper's decoder throws and
    the bookie closes the channel, unanswered. What came before it is still answered."""
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            peer = await BkPeer.open(server.port, dialect)
            assert isinstance(await peer.ask(ReadEntry(1, 0)), ErrorResponse)  # ENOLEDGER: the dialect is chosen
            whole = peer.frame(ReadEntry(1, 0))[4:]
            cut = whole[:-5]
            await peer.send_raw(struct.pack(">I", len(cut)) + cut)
            assert await peer.closed_by_bookie()

    run(body)


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.value)
def test_an_oversized_frame_closes_the_connection(tmp_path: Path, dialect: Dialect) -> None:
    """A length past nettyMaxFrameSizeBytes: TooLongFrameException, the channel closed
    without an answer - also when it is the connection's first frame."""
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            peer = await BkPeer.open(server.port, dialect)
            await _handshake(peer)
            first = b"\x0a" if dialect is Dialect.BK_V3 else b"\x02"
            await peer.send_raw(struct.pack(">I", MAX_FRAME + 1) + first + b"\0" * 64)
            assert await peer.closed_by_bookie()
            fresh = await BkPeer.open(server.port, dialect)
            await fresh.send_raw(struct.pack(">I", MAX_FRAME + 1) + first + b"\0" * 64)
            assert await fresh.closed_by_bookie()

    run(body)


def test_v3_unknown_operation_is_ebadreq_and_the_connection_stays(tmp_path: Path) -> None:
    """A v3 Request of an operation the bookie does not serve (RANGE_READ_ENTRY) is
    answered with its header and EBADREQ (BookieRequestProcessor's default branch); the
    connection goes on."""
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            peer = await BkPeer.open(server.port, Dialect.BK_V3)
            await _handshake(peer)
            req = pb.Request()
            req.header.version, req.header.operation, req.header.txnId = pb.VERSION_THREE, pb.RANGE_READ_ENTRY, 4242
            body_ = req.SerializeToString()
            await peer.send_raw(struct.pack(">I", len(body_)) + body_)
            resp = pb.Response()
            resp.ParseFromString(await peer.recv_frame())
            assert (resp.header.operation, resp.header.txnId, resp.status) == (pb.RANGE_READ_ENTRY, 4242, pb.EBADREQ)
            for _ in range(40):  # never counted as bad frames: BookKeeper's bookie does not close for them
                await peer.send_raw(struct.pack(">I", len(body_)) + body_)
            for _ in range(40):
                assert len(await peer.recv_frame()) > 0
            assert isinstance(await peer.ask(GetBookieInfo()), BookieInfoResponse)
            await peer.close()

    run(body)


@pytest.mark.parametrize("opcode", [9, 4, 5, 6], ids=["unknown", "READ_LAC", "WRITE_LAC", "GET_BOOKIE_INFO"])
def test_v2_unknown_opcode_closes_the_connection(tmp_path: Path, opcode: int) -> None:
    """v2's decoder throws on an opcode it does not know (and on READ_LAC, WRITE_LAC and
    GET_BOOKIE_INFO, which BookKeeper speaks in v3 only): the channel closes, unanswered."""
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            peer = await BkPeer.open(server.port, Dialect.BK_V2)
            await _handshake(peer)
            frame = struct.pack(">IIqq", 20, 2 << 24 | opcode << 16, 1, 0)
            await peer.send_raw(frame)
            assert await peer.closed_by_bookie()

    run(body)


def test_v2_other_protocol_versions(tmp_path: Path) -> None:
    """A later v2 frame of protocol version 1 is served, of version 3 answered EBADVERSION
    (103) with the request's ids; the connection stays (BookKeeper's isVersionCompatible)."""
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            peer = await BkPeer.open(server.port, Dialect.BK_V2)
            await peer.ask(AddEntry(6, 0, BK_KEY, bk_entry(6, 0)))
            read = peer.frame(ReadEntry(6, 0))
            await peer.send_raw(read[:4] + b"\x01" + read[5:])
            assert (await peer.recv()).data == bk_entry(6, 0)
            await peer.send_raw(read[:4] + b"\x03" + read[5:])
            assert struct.unpack(">Iiqq", await peer.recv_frame()) == (2 << 24 | 2 << 16, 103, 6, 0)
            assert isinstance(await peer.ask(ReadEntry(6, 0)), ReadEntryResponse)
            await peer.close()

    run(body)


def test_walkit_and_both_bookkeeper_dialects_on_one_port(tmp_path: Path) -> None:
    """One bookie, three connections in three dialects at once, one ledger each way: a
    walkit client's adds and reads work beside them, and an entry written in one
    dialect reads back byte-exact in the others (one store, one request path)."""
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            v3 = await BkPeer.open(server.port, Dialect.BK_V3)
            v2 = await BkPeer.open(server.port, Dialect.BK_V2)
            client = await client_of(server)
            await asyncio.gather(*(client.add_entry(1, e, KEY, entry(1, e)) for e in range(20)))
            assert isinstance(await v3.ask(AddEntry(2, 0, BK_KEY, bk_entry(2, 0))), AddEntryResponse)
            assert isinstance(await v2.ask(AddEntry(2, 1, BK_KEY, bk_entry(2, 1))), AddEntryResponse)
            assert (await client.read_entry(2, 0)).data == bk_entry(2, 0)
            assert (await v2.ask(ReadEntry(2, 0))).data == bk_entry(2, 0)
            assert (await v3.ask(ReadEntry(2, 1))).data == bk_entry(2, 1)
            assert (await v3.ask(ReadEntry(1, 19))).data == entry(1, 19)
            assert [r.data for r in await asyncio.gather(*(client.read_entry(1, e) for e in range(20)))] == [
                entry(1, e) for e in range(20)]
            await client.close()
            await v3.close()
            await v2.close()

    run(body)


def test_bookkeeper_entries_survive_a_restart_byte_exact(tmp_path: Path) -> None:
    """Entries added in v2 come back byte-exact in v3 after the bookie restarts (journal
    replay and storage take a BookKeeper entry as they take walkit's: same layout)."""
    async def body() -> None:
        cfg = config(tmp_path)
        async with in_process(cfg) as server:
            v2 = await BkPeer.open(server.port, Dialect.BK_V2)
            for e in range(3):
                await v2.ask(AddEntry(4, e, BK_KEY, bk_entry(4, e)))
            await v2.close()
        async with in_process(cfg) as server:
            v3 = await BkPeer.open(server.port, Dialect.BK_V3)
            got = [(await v3.ask(ReadEntry(4, e))).data for e in range(3)]
            assert got == [bk_entry(4, e) for e in range(3)]
            assert await v3.ask(ReadLac(4)) == ReadLacResponse(4, 1, v3.txn)
            await v3.close()

    run(body)


# --- the sans-IO parts, without a bookie --------------------------------------------------------


@pytest.mark.parametrize("dialect", [Dialect.WALKIT, *DIALECTS], ids=lambda d: d.value)
def test_sniffer_chooses_once_from_bytes_coming_one_at_a_time(dialect: Dialect) -> None:
    chosen: list[Any] = []
    sniffer = DialectSniffer(chosen.append)
    req = ReadEntry(3, 1, request_id=0 if dialect is Dialect.BK_V2 else 9)
    frame = bytes(codec_for(dialect).encode_request(req))
    events: list[Any] = []
    for i in range(len(frame)):  # the owner swaps in the chosen connection
        events += (chosen[0] if chosen else sniffer).receive(frame[i:i + 1])
        if i < 4:
            assert not chosen
    assert len(chosen) == 1 and sniffer.dialect is dialect and events == [req]
    assert isinstance(chosen[0], ServerConnection) == (dialect is Dialect.WALKIT)
    assert sniffer.receive(frame) == [req]  # a late caller is forwarded


def test_availability_bytes() -> None:
    """AvailabilityOfEntriesOfLedger: a 64-byte header (version 0, groups), 24 bytes a
    group; decoded as BookKeeper's reader would, periodic groups included."""
    assert encode_availability([]) == b"\0" * 64
    data = encode_availability([0, 1, 2, 5, 6, 9])
    assert len(data) == 64 + 3 * 24 and struct.unpack_from(">ii", data) == (0, 3)
    assert decode_availability(data) == [0, 1, 2, 5, 6, 9]
    periodic = struct.pack(">ii", 0, 1).ljust(64, b"\0") + struct.pack(">qqii", 10, 30, 2, 10)
    assert decode_availability(periodic) == [10, 11, 20, 21, 30, 31]


def test_walkit_client_error_for_a_bookkeeper_status_is_unchanged(tmp_path: Path) -> None:
    """walkit's own dialect keeps its answers: a read of a missing entry is still
    NoSuchEntryError through BookieClient, on the bookie that serves BookKeeper too."""
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            client = await client_of(server)
            await client.add_entry(1, 0, KEY, entry(1, 0))
            with pytest.raises(NoSuchEntryError):
                await client.read_entry(1, 5)
            await client.close()

    run(body)


async def _v3_read_lac_bodies(port: int, ledger: int) -> tuple[bytes | None, bytes]:
    """A BookKeeper v3 READ_LAC, as the Java client sends it: the answer's lacBody (None
    when it has none) and lastEntryBody."""
    peer = await BkPeer.open(port, Dialect.BK_V3)
    try:
        await _handshake(peer)
        await peer.send(ReadLac(ledger))
        raw = pb.Response()
        raw.ParseFromString(await peer.recv_frame())
        sub = raw.readLacResponse
        return (bytes(sub.lacBody) if sub.HasField("lacBody") else None), bytes(sub.lastEntryBody)
    finally:
        await peer.close()


def test_a_walkit_write_lac_body_is_bookkeepers_read_lac_body(tmp_path: Path) -> None:
    """A WRITE_LAC in walkit's own dialect with BookKeeper's LAC body (flag LAC_BODY):
    the bookie keeps the last body of the ledger and a BookKeeper v3 READ_LAC gets it
    back as lacBody, digest and all, beside the last entry; walkit's READ_LAC tells the
    LAC. The first WRITE_LAC with a body asks, the second goes with it at once."""
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            client = await client_of(server)
            for e in range(5):
                await client.add_entry(7, e, BK_KEY, bk_entry(7, e))
            assert await _v3_read_lac_bodies(server.port, 7) == (None, bk_entry(7, 4))  # no WRITE_LAC yet
            for lac in (3, 4):
                await client.write_lac(7, lac, BK_KEY, body=bk_encode_lac(7, lac, password=PASSWORD))
            assert client._wire.takes_lac_bodies is True
            lac_body, last = await _v3_read_lac_bodies(server.port, 7)
            assert (lac_body, last) == (bk_encode_lac(7, 4, password=PASSWORD), bk_entry(7, 4))
            assert lac_body is not None and bk_decode_lac(lac_body, password=PASSWORD) == 4
            assert await client.read_lac(7) == 4
            with pytest.raises(InvalidArgumentError, match="LAC body"):  # walkit's wire carries 64 bytes at most
                await client.write_lac(7, 4, BK_KEY, body=b"b" * 65)
            await client.close()

    run(body)


def _older_write_lac(frame: bytes, n: int, flags: int, rid: int) -> Any:
    """WRITE_LAC as bookies before flag LAC_BODY decode it: any flag is a bad request."""
    if flags:
        raise InvalidArgumentError(f"flags 0x{flags:04x} not allowed for this op")
    return _REAL_WRITE_LAC(frame, n, flags, rid)


_REAL_WRITE_LAC = _codec._REQUEST_DECODERS[Op.WRITE_LAC]


def test_an_older_bookie_gets_the_lac_without_its_body(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bookie from before flag LAC_BODY (its WRITE_LAC decoder, here) refuses the flag
    with EBADREQ: every WRITE_LAC with a body, sent at once with adds in flight, is
    answered EOK all the same, its LAC taken (the client sent it again without the body);
    the bookie saw one bad frame and the connection goes on."""
    monkeypatch.setitem(_codec._REQUEST_DECODERS, Op.WRITE_LAC, _older_write_lac)

    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            client = await client_of(server)
            for ledger in range(1, 21):
                await client.add_entry(ledger, 0, BK_KEY, bk_entry(ledger, 0))
            lacs = [client.write_lac(ledger, 0, BK_KEY, body=bk_encode_lac(ledger, 0, password=PASSWORD))
                    for ledger in range(1, 21)]
            adds = [client.add_entry(ledger, 1, BK_KEY, bk_entry(ledger, 1)) for ledger in range(1, 21)]
            await asyncio.gather(*lacs, *adds)
            assert client._wire.takes_lac_bodies is False
            assert [await client.read_lac(ledger) for ledger in range(1, 21)] == [0] * 20
            assert [c.bad_frames for c in server._connections] == [1]
            assert (await _v3_read_lac_bodies(server.port, 3))[0] is None  # no body was kept
            await client.write_lac(3, 1, BK_KEY, body=b"not sent")  # from now on without, at once
            assert await client.read_lac(3) == 1
            await client.close()

    run(body)


def test_an_older_clients_write_lac_is_served_as_before(tmp_path: Path) -> None:
    """The bytes of WRITE_LAC as clients before flag LAC_BODY send it (version 1, no
    flag), on a raw socket: answered EOK, the LAC taken, no body kept."""
    old_frame = bytes.fromhex("00000021 01 04 0000 0000000000000001 0000000000000007 0000000000000000 04 aaaaaaaa"
                              .replace(" ", ""))

    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            client = await client_of(server)
            key = b"\xaa" * 4
            await client.add_entry(7, 0, key, entry(7, 0))
            assert encode_request(WriteLac(7, 0, key, 1)) == old_frame  # what this walkit still sends without a body
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(old_frame)
            (length,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 10))
            assert _codec.decode_response(await reader.readexactly(length)) == WriteLacResponse(7, 1)
            writer.close()
            assert await client.read_lac(7) == 0
            assert (await _v3_read_lac_bodies(server.port, 7))[0] is None
            await client.close()

    run(body)


def test_v3_deferred_sync_write_flag_is_accepted_and_synced_anyway(tmp_path: Path) -> None:
    """An add with writeFlags DEFERRED_SYNC (what BookKeeper's client sends for a
    WriteFlag.DEFERRED_SYNC ledger) is answered EOK like any add - walkit syncs every add
    before it answers, which is stronger - and FORCE_LEDGER after it is EOK too."""
    async def body() -> None:
        async with in_process(config(tmp_path)) as server:
            peer = await BkPeer.open(server.port, Dialect.BK_V3)
            await _handshake(peer)
            assert server.bookie is not None
            stats = server.bookie.journal.stats
            for e in range(3):
                synced = stats.records
                req = pb.Request()
                req.header.version = pb.VERSION_THREE
                req.header.operation = pb.ADD_ENTRY
                req.header.txnId = 100 + e
                req.addRequest.ledgerId, req.addRequest.entryId = 11, e
                req.addRequest.masterKey = BK_KEY
                req.addRequest.body = bk_entry(11, e)
                req.addRequest.writeFlags = 1  # DEFERRED_SYNC
                data = req.SerializeToString()
                await peer.send_raw(struct.pack(">I", len(data)) + data)
                raw = pb.Response()
                raw.ParseFromString(await peer.recv_frame())
                assert (raw.header.txnId, raw.status, raw.addResponse.status) == (100 + e, pb.EOK, pb.EOK)
                assert (raw.addResponse.ledgerId, raw.addResponse.entryId) == (11, e)
                assert stats.records > synced  # journaled and synced before the answer, flag or not
            assert await peer.ask(ForceLedger(11)) == ForceLedgerResponse(11, peer.txn)
            for e in range(3):
                assert (await peer.ask(ReadEntry(11, e))).data == bk_entry(11, e)  # byte-exact
            await peer.close()

    run(body)
