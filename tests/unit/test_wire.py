"""The bookie wire protocol (walkit/protocol/_messages, _codec, _frames, _connection and
_range.py, docs/format.md "Wire protocol"): round trips, refusals, fuzzing, framing,
connection state machines, pinned bytes."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from walkit.errors import (
    BookieBusyError,
    BookieError,
    BookieReadOnlyError,
    BookieShutdownError,
    FrameTooLargeError,
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    NativeIOError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ProtocolError,
    ProtocolVersionError,
    UnauthorizedError,
)
from walkit.protocol import _codec
from walkit.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    MAX_ADMIN_BODY,
    MAX_LAC_BODY_SIZE,
    MAX_RANGE_ENTRIES,
    MIN_MAX_FRAME_SIZE,
    PROTOCOL_VERSION,
    RANGE_RESPONSE_OVERHEAD,
    AddEntry,
    AddEntryResponse,
    AdminRequest,
    AdminResponse,
    BookieInfoResponse,
    ClientConnection,
    ErrorResponse,
    FrameDecoder,
    GetBookieInfo,
    Op,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadLacResponse,
    ReadRange,
    ReadRangeResponse,
    Request,
    Response,
    ServerConnection,
    Status,
    WriteLac,
    WriteLacResponse,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    error_for,
    range_response_size,
    status_for,
)

FAST = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
I63 = 2**63 - 1
KEY = b"\xaa" * 4
REQUESTS = AddEntry | ReadEntry | ReadLac | WriteLac | GetBookieInfo | AdminRequest | ReadRange

# --- strategies ------------------------------------------------------------------------

ids = st.integers(0, I63)
ids_or_last = st.integers(-1, I63)
request_ids = st.integers(0, 2**64 - 1)
keys = st.binary(max_size=64)
some_keys = st.binary(min_size=1, max_size=64)
# up to 64 KiB of data without asking hypothesis to draw every byte
big_data = st.builds(lambda n, seed: random.Random(seed).randbytes(n), st.integers(0, 64 * 1024), st.integers())
datas = st.one_of(st.binary(max_size=300), big_data)


@st.composite
def read_entries(draw: st.DrawFn) -> ReadEntry:
    fence = draw(st.booleans())
    poll = draw(st.booleans())
    return ReadEntry(
        draw(ids), draw(ids_or_last), fence, draw(some_keys) if fence else b"",
        draw(ids_or_last) if poll else None, draw(st.integers(0, 2**32 - 1)) if poll else 0, draw(request_ids),
    )


@st.composite
def read_ranges(draw: st.DrawFn) -> ReadRange:
    first = draw(st.one_of(ids, st.just(I63)))
    count = draw(st.integers(1, min(MAX_RANGE_ENTRIES, I63 - first + 1)))
    return ReadRange(draw(ids), first, count, draw(st.integers(1, 2**32 - 1)), draw(request_ids))


@st.composite
def range_responses(draw: st.DrawFn, data: st.SearchStrategy[bytes]) -> ReadRangeResponse:
    entries = tuple(draw(st.lists(data, min_size=1, max_size=4)))
    first = draw(st.integers(0, I63 - len(entries) + 1))
    return ReadRangeResponse(draw(ids), first, draw(ids_or_last), entries, draw(request_ids))


def requests(data: st.SearchStrategy[bytes] = datas) -> st.SearchStrategy[Request]:
    return st.one_of(
        st.builds(AddEntry, ids, ids, keys, data, st.booleans(), request_ids),
        read_entries(),
        st.builds(ReadLac, ids, request_ids),
        st.builds(WriteLac, ids, ids_or_last, some_keys, request_ids, st.binary(max_size=MAX_LAC_BODY_SIZE)),
        st.builds(GetBookieInfo, request_ids),
        st.builds(AdminRequest, st.from_regex(r"[a-z0-9._-]{1,64}", fullmatch=True), st.binary(max_size=300),
                  request_ids),
        read_ranges(),
    )


def responses(data: st.SearchStrategy[bytes] = datas) -> st.SearchStrategy[Response]:
    u64 = st.integers(0, 2**64 - 1)
    return st.one_of(
        st.builds(AddEntryResponse, ids, ids, request_ids),
        st.builds(ReadEntryResponse, ids, ids, ids_or_last, data, request_ids),
        st.builds(ReadLacResponse, ids, ids_or_last, request_ids),
        st.builds(WriteLacResponse, ids, request_ids),
        st.builds(BookieInfoResponse, u64, u64, st.booleans(), request_ids),
        st.builds(AdminResponse, data, request_ids),
        range_responses(data),
        st.builds(ErrorResponse, st.sampled_from(Op), st.sampled_from([s for s in Status if s]), ids, ids_or_last,
                  st.text(max_size=256), request_ids),  # 256 chars <= 1024 UTF-8 bytes
    )


# --- round trips -----------------------------------------------------------------------


@FAST
@given(requests())
def test_every_request_round_trips(req: Request) -> None:
    frame = encode_request(req)
    assert struct.unpack(">I", frame[:4])[0] == len(frame) - 4
    assert frame[4] == PROTOCOL_VERSION and struct.unpack(">Q", frame[8:16])[0] == req.request_id
    assert decode_request(frame[4:]) == req
    assert decode_request(memoryview(frame)[4:]) == req
    assert decode_request(bytearray(frame[4:])) == req
    assert vars(decode_request(frame[4:])) == vars(req)  # fields left out of == too (WriteLac's body)


@FAST
@given(responses())
def test_every_response_round_trips(resp: Response) -> None:
    frame = encode_response(resp)
    assert struct.unpack(">I", frame[:4])[0] == len(frame) - 4
    assert decode_response(frame[4:]) == resp
    assert decode_response(memoryview(frame)[4:]) == resp


def test_error_messages_are_cut_to_1024_bytes_on_a_character_boundary() -> None:
    resp = ErrorResponse(Op.READ_ENTRY, Status.EIO, message="é" * 600, request_id=3)  # 1200 bytes
    out = decode_response(encode_response(resp)[4:])
    assert isinstance(out, ErrorResponse)
    assert out.message == "é" * 512 and len(out.message.encode()) == 1024
    odd = decode_response(encode_response(ErrorResponse(Op.READ_ENTRY, Status.EIO, message="x" + "é" * 600))[4:])
    assert isinstance(odd, ErrorResponse) and odd.message == "x" + "é" * 511  # no half character
    assert decode_response(encode_response(ErrorResponse(Op.ADD_ENTRY, Status.EIO, message="\udc80"))[4:])


def test_invalid_utf8_in_an_error_message_is_replaced_not_raised() -> None:
    frame = bytearray(encode_response(ErrorResponse(Op.ADD_ENTRY, Status.EIO, 1, 2, "ab", 9)))
    frame[-2:] = b"\xff\xfe"
    out = decode_response(bytes(frame[4:]))
    assert isinstance(out, ErrorResponse) and out.message == "\ufffd\ufffd"


def test_error_response_takes_plain_ints_and_normalizes_them() -> None:
    resp = ErrorResponse(2, 7)  # type: ignore[arg-type]
    assert resp.op is Op.READ_ENTRY and resp.status is Status.EFENCED


# --- pinned bytes (the examples in docs/format.md) -------------------------------------

PINNED: list[tuple[Request | Response, str]] = [
    (AddEntry(7, 12, KEY, b"entry", recovery=True, request_id=5),
     "00000026 01 01 0001 0000000000000005  0000000000000007 000000000000000c 04 aaaaaaaa 656e747279"),
    (ReadEntry(7, 12, request_id=10),
     "0000001d 01 02 0000 000000000000000a  0000000000000007 000000000000000c 00"),
    (ReadEntry(7, -1, fence=True, master_key=KEY, previous_lac=3, timeout_ms=1000, request_id=6),
     "0000002d 01 02 0006 0000000000000006  0000000000000007 ffffffffffffffff 04 aaaaaaaa"
     " 0000000000000003 000003e8"),
    (ReadLac(7, request_id=7),
     "00000014 01 03 0000 0000000000000007  0000000000000007"),
    (WriteLac(7, 11, KEY, request_id=8),
     "00000021 01 04 0000 0000000000000008  0000000000000007 000000000000000b 04 aaaaaaaa"),
    (WriteLac(7, 11, KEY, request_id=8, body=b"LACBODY"),
     "00000029 01 04 0008 0000000000000008  0000000000000007 000000000000000b 04 aaaaaaaa 07 4c4143424f4459"),
    (GetBookieInfo(request_id=9),
     "0000000c 01 05 0000 0000000000000009"),
    (AdminRequest("gc.status", b"{}", request_id=11),
     "00000018 01 06 0000 000000000000000b  09 67632e737461747573 7b7d"),
    (AddEntryResponse(7, 12, request_id=5),
     "0000001c 01 81 0000 0000000000000005  0000000000000007 000000000000000c"),
    (ReadEntryResponse(7, 12, 11, b"entry", request_id=6),
     "00000029 01 82 0000 0000000000000006  0000000000000007 000000000000000c 000000000000000b 656e747279"),
    (ReadLacResponse(7, 11, request_id=7),
     "0000001c 01 83 0000 0000000000000007  0000000000000007 000000000000000b"),
    (WriteLacResponse(7, request_id=8),
     "00000014 01 84 0000 0000000000000008  0000000000000007"),
    (BookieInfoResponse(2**30, 2**40, True, request_id=9),
     "0000001d 01 85 0000 0000000000000009  0000000040000000 0000010000000000 01"),
    (AdminResponse(b"{}", request_id=11),
     "0000000e 01 86 0000 000000000000000b  7b7d"),
    (ErrorResponse(Op.ADD_ENTRY, Status.EFENCED, 7, 12, "fenced", request_id=5),
     "00000022 01 81 0007 0000000000000005  0000000000000007 000000000000000c 66656e636564"),
    (ReadRange(7, 12, 100, 1048576, request_id=6),
     "00000024 01 07 0000 0000000000000006  0000000000000007 000000000000000c 00000064 00100000"),
    (ReadRangeResponse(7, 12, 11, (b"entry", b""), request_id=6),
     "00000035 01 87 0000 0000000000000006  0000000000000007 000000000000000c 000000000000000b 00000002"
     " 00000005 656e747279 00000000"),
]


@pytest.mark.parametrize(("msg", "hexed"), PINNED, ids=lambda v: type(v).__name__ if not isinstance(v, str) else "")
def test_frames_are_byte_exact(msg: Request | Response, hexed: str) -> None:
    expected = bytes.fromhex(hexed.replace(" ", ""))
    if isinstance(msg, REQUESTS):
        assert encode_request(msg) == expected
        assert vars(decode_request(expected[4:])) == vars(msg)
    else:
        assert encode_response(msg) == expected
        assert decode_response(expected[4:]) == msg


def test_the_examples_in_format_md_are_these_frames() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "format.md").read_text()
    section = text[text.index("## Wire protocol"):]
    squashed = "".join(section.replace("|", " ").split())
    documented = [m for m, _ in PINNED if isinstance(m, AddEntry | AddEntryResponse | ReadEntryResponse | ErrorResponse
                                                       | ReadRange | ReadRangeResponse)
                  or (isinstance(m, ReadEntry) and m.fence) or (isinstance(m, WriteLac) and m.body)]
    assert len(documented) == 8
    for msg, hexed in PINNED:
        if any(msg is d for d in documented):  # identity: a WriteLac equals one with a body
            assert hexed.replace(" ", "") in squashed, msg


# --- construction refuses invalid messages ---------------------------------------------

INVALID_MESSAGES: list[Callable[[], object]] = [
    lambda: AddEntry(-1, 0, b"", b""),
    lambda: AddEntry(2**63, 0, b"", b""),
    lambda: AddEntry(0, -1, b"", b""),
    lambda: AddEntry(0, 2**63, b"", b""),
    lambda: AddEntry(0, 0, b"k" * 65, b""),
    lambda: AddEntry(0, 0, "key", b""),  # type: ignore[arg-type]
    lambda: AddEntry(0, 0, b"", bytearray()),  # type: ignore[arg-type]
    lambda: AddEntry(0, 0, b"", b"", recovery=1),  # type: ignore[arg-type]
    lambda: AddEntry(0, 0, b"", b"", request_id=2**64),
    lambda: AddEntry(0, 0, b"", b"", request_id=-1),
    lambda: AddEntry("0", 0, b"", b""),  # type: ignore[arg-type]
    lambda: ReadEntry(0, -2),
    lambda: ReadEntry(2**63, 0),
    lambda: ReadEntry(0, 0, fence=True),  # fence needs the key
    lambda: ReadEntry(0, 0, master_key=KEY),  # a key only with fence
    lambda: ReadEntry(0, 0, fence=True, master_key=b"k" * 65),
    lambda: ReadEntry(0, 0, previous_lac=-2),
    lambda: ReadEntry(0, 0, previous_lac=2**63),
    lambda: ReadEntry(0, 0, previous_lac=0, timeout_ms=2**32),
    lambda: ReadEntry(0, 0, previous_lac=0, timeout_ms=-1),
    lambda: ReadEntry(0, 0, timeout_ms=5),  # a timeout without a long poll
    lambda: ReadLac(-1),
    lambda: WriteLac(0, -2, KEY),
    lambda: WriteLac(0, 0, b""),
    lambda: WriteLac(0, 0, b"k" * 65),
    lambda: GetBookieInfo(request_id=2**64),
    lambda: AddEntryResponse(0, -1),
    lambda: AddEntryResponse(2**63, 0),
    lambda: AddEntryResponse(0, 0, request_id=-1),
    lambda: ReadEntryResponse(0, 0, 0, b"", request_id=2**64),
    lambda: ReadEntryResponse(0, -1, 0, b""),
    lambda: ReadEntryResponse(0, 0, -2, b""),
    lambda: ReadEntryResponse(0, 0, 0, "data"),  # type: ignore[arg-type]
    lambda: ReadLacResponse(0, -2),
    lambda: WriteLacResponse(2**63),
    lambda: BookieInfoResponse(-1, 0, False),
    lambda: BookieInfoResponse(0, 2**64, False),
    lambda: BookieInfoResponse(0, 0, 1),  # type: ignore[arg-type]
    lambda: ErrorResponse(Op.ADD_ENTRY, Status.EOK),
    lambda: ErrorResponse(Op.ADD_ENTRY, 10),  # type: ignore[arg-type]
    lambda: ErrorResponse(max(Op) + 1, Status.EIO),  # type: ignore[arg-type]
    lambda: AdminRequest(""),
    lambda: AdminRequest("GC STATUS"),
    lambda: AdminRequest("x" * 65),
    lambda: AdminRequest("gc.status", "{}"),  # type: ignore[arg-type]
    lambda: AdminRequest("gc.status", b"x" * (MAX_ADMIN_BODY + 1)),
    lambda: AdminResponse(b"{}", -1),
    lambda: ErrorResponse(Op.ADD_ENTRY, Status.EIO, entry_id=-2),
    lambda: ErrorResponse(Op.ADD_ENTRY, Status.EIO, ledger_id=-1),
    lambda: ErrorResponse(Op.ADD_ENTRY, Status.EIO, message=b"x"),  # type: ignore[arg-type]
    lambda: ReadRange(0, 0, 0),
    lambda: ReadRange(0, 0, MAX_RANGE_ENTRIES + 1),
    lambda: ReadRange(0, 0, True),  # a bool is not a count
    lambda: ReadRange(-1, 0, 1),
    lambda: ReadRange(2**63, 0, 1),
    lambda: ReadRange(0, -1, 1),
    lambda: ReadRange(0, I63, 2),  # past the largest entry id
    lambda: ReadRange(0, 0, 1, max_bytes=0),
    lambda: ReadRange(0, 0, 1, max_bytes=2**32),
    lambda: ReadRange(0, 0, 1, request_id=2**64),
    lambda: ReadRangeResponse(0, 0, 0, ()),
    lambda: ReadRangeResponse(0, 0, 0, [b"x"]),  # type: ignore[arg-type]
    lambda: ReadRangeResponse(0, 0, 0, (b"x", "y")),  # type: ignore[arg-type]
    lambda: ReadRangeResponse(0, 0, 0, (b"",) * (MAX_RANGE_ENTRIES + 1)),
    lambda: ReadRangeResponse(0, 0, -2, (b"",)),
    lambda: ReadRangeResponse(0, -1, 0, (b"",)),
    lambda: ReadRangeResponse(0, I63, 0, (b"", b"")),  # past the largest entry id
    lambda: ReadRangeResponse(-1, 0, 0, (b"",)),
    lambda: ReadRangeResponse(0, 0, 0, (b"",), request_id=-1),
]


@pytest.mark.parametrize("build", INVALID_MESSAGES)
def test_an_invalid_message_cannot_be_built(build: Callable[[], object]) -> None:
    with pytest.raises(InvalidArgumentError):
        build()


def test_encoders_refuse_the_other_direction() -> None:
    with pytest.raises(InvalidArgumentError):
        encode_request(ReadLacResponse(1, 2))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        encode_response(ReadLac(1))  # type: ignore[arg-type]


# --- decoding refuses invalid frames ---------------------------------------------------


def frame(kind: int, field: int, body: bytes, *, rid: int = 42, version: int = PROTOCOL_VERSION) -> bytes:
    """A frame without its length prefix."""
    return struct.pack(">BBHQ", version, kind, field, rid) + body


def add_body(ledger: int = 1, entry: int = 2, key: bytes = KEY, klen: int | None = None) -> bytes:
    return struct.pack(">QQB", ledger, entry, len(key) if klen is None else klen) + key + b"entry"


def read_body(entry: int = 2, key: bytes = b"", poll: bytes = b"") -> bytes:
    return struct.pack(">QqB", 1, entry, len(key)) + key + poll


def range_body(ledger: int = 1, first: int = 2, count: int = 3, max_bytes: int = 1000) -> bytes:
    return struct.pack(">QQII", ledger, first, count, max_bytes)


POLL = struct.pack(">qI", 5, 100)
BAD_REQUESTS: dict[str, bytes] = {
    "unknown flag on add": frame(1, 0x8, add_body()),
    "fence on add": frame(1, 0x2, add_body()),
    "long poll on add": frame(1, 0x4, add_body()),
    "recovery on read": frame(2, 0x1, read_body()),
    "unknown flag on read": frame(2, 0x10, read_body()),
    "high flag on read": frame(2, 0x8000, read_body()),
    "flag on read lac": frame(3, 0x2, struct.pack(">Q", 1)),
    "flag on write lac": frame(4, 0x1, struct.pack(">QqB", 1, 0, 4) + KEY),
    "flag on bookie info": frame(5, 0x4, b""),
    "add key over 64": frame(1, 0, add_body(key=b"k" * 65)),
    "add key past the end": frame(1, 0, struct.pack(">QQB", 1, 2, 10) + b"abc"),
    "add body short": frame(1, 0, struct.pack(">QQ", 1, 2)),
    "add empty body": frame(1, 0, b""),
    "add ledger 2^63": frame(1, 0, add_body(ledger=2**63)),
    "add entry 2^63": frame(1, 0, add_body(entry=2**63)),
    "read entry -2": frame(2, 0, read_body(entry=-2)),
    "read trailing byte": frame(2, 0, read_body() + b"\0"),
    "read missing key byte": frame(2, 0, struct.pack(">QqB", 1, 2, 0)[:-1]),
    "read fence without key": frame(2, 0x2, read_body()),
    "read key without fence": frame(2, 0, read_body(key=KEY)),
    "read long poll fields missing": frame(2, 0x4, read_body()),
    "read long poll fields short": frame(2, 0x4, read_body(poll=POLL[:-1])),
    "read long poll trailing": frame(2, 0x4, read_body(poll=POLL + b"\0")),
    "read poll fields without flag": frame(2, 0, read_body(poll=POLL)),
    "read previous lac -2": frame(2, 0x4, read_body(poll=struct.pack(">qI", -2, 0))),
    "read lac short": frame(3, 0, b"\0" * 7),
    "read lac trailing": frame(3, 0, b"\0" * 9),
    "read lac ledger 2^63": frame(3, 0, struct.pack(">Q", 2**63)),
    "write lac body short": frame(4, 0, struct.pack(">Qq", 1, 0)),
    "write lac empty key": frame(4, 0, struct.pack(">QqB", 1, 0, 0)),
    "write lac lac -2": frame(4, 0, struct.pack(">QqB", 1, -2, 4) + KEY),
    "write lac trailing": frame(4, 0, struct.pack(">QqB", 1, 0, 4) + KEY + b"\0"),
    "write lac unknown flag": frame(4, 0x10, struct.pack(">QqB", 1, 0, 4) + KEY),
    "write lac body flag without a body": frame(4, 0x8, struct.pack(">QqB", 1, 0, 4) + KEY),
    "write lac body of length 0": frame(4, 0x8, struct.pack(">QqB", 1, 0, 4) + KEY + b"\0"),
    "write lac body truncated": frame(4, 0x8, struct.pack(">QqB", 1, 0, 4) + KEY + b"\x24" + b"b" * 35),
    "write lac body oversized": frame(4, 0x8, struct.pack(">QqB", 1, 0, 4) + KEY + b"\x41" + b"b" * 65),
    "write lac body trailing": frame(4, 0x8, struct.pack(">QqB", 1, 0, 4) + KEY + b"\x02bb\0"),
    "write lac body without the flag": frame(4, 0, struct.pack(">QqB", 1, 0, 4) + KEY + b"\x02bb"),
    "bookie info with body": frame(5, 0, b"\0"),
    "op 0": frame(0, 0, b""),
    "op 8": frame(8, 0, b""),
    "flag on read range": frame(7, 0x1, range_body()),
    "read range empty body": frame(7, 0, b""),
    "read range body short": frame(7, 0, range_body()[:-1]),
    "read range trailing": frame(7, 0, range_body() + b"\0"),
    "read range count 0": frame(7, 0, range_body(count=0)),
    "read range count over the maximum": frame(7, 0, range_body(count=MAX_RANGE_ENTRIES + 1)),
    "read range max bytes 0": frame(7, 0, range_body(max_bytes=0)),
    "read range ledger 2^63": frame(7, 0, range_body(ledger=2**63)),
    "read range first 2^63": frame(7, 0, range_body(first=2**63)),
    "read range past the largest entry id": frame(7, 0, range_body(first=I63, count=2)),
    "admin empty body": frame(6, 0, b""),
    "admin with a flag": frame(6, 1, b"\x01a"),
    "admin command longer than the body": frame(6, 0, b"\x05ab"),
    "admin command not allowed": frame(6, 0, b"\x02A!{}"),
    "admin command not ascii": frame(6, 0, b"\x02\xff\xfe{}"),
    "op 0x7f": frame(0x7F, 0, b""),
    "a response sent as request": frame(0x81, 0, struct.pack(">QQ", 1, 2)),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_bad_request_frames_are_refused_and_the_connection_stays_usable(name: str) -> None:
    raw = BAD_REQUESTS[name]
    with pytest.raises(ProtocolError) as info:
        decode_request(raw)
    assert type(info.value) is ProtocolError
    assert info.value.context["request_id"] == 42 and "reason" in info.value.context and "op" in info.value.context

    server = ServerConnection()
    good = encode_request(ReadLac(3, request_id=43))
    events = server.receive(struct.pack(">I", len(raw)) + raw + good)
    assert len(events) == 2 and events[1] == ReadLac(3, request_id=43) and not server.closing
    refusal = events[0]
    assert isinstance(refusal, ErrorResponse)
    assert (refusal.status, refusal.request_id) == (Status.EBADREQ, 42)
    assert refusal.op == (raw[1] if 1 <= raw[1] <= max(Op) else Op.INVALID)
    assert decode_response(server.send(refusal)[4:]) == refusal


def resp_frame(kind: int, status: int, body: bytes, rid: int = 42) -> bytes:
    return frame(kind, status, body, rid=rid)


def range_head(count: int, first: int = 2, lac: int = 1) -> bytes:
    """A READ_RANGE answer's body up to its first entry."""
    return struct.pack(">QQqI", 1, first, lac, count)


BAD_RESPONSES: dict[str, bytes] = {
    "unknown status": resp_frame(0x81, 10, struct.pack(">Qq", 1, 2)),
    "status 0xffff": resp_frame(0x81, 0xFFFF, struct.pack(">Qq", 1, 2)),
    "EOK for no op": resp_frame(0x80, 0, b""),
    "EOK on a request kind": resp_frame(0x01, 0, struct.pack(">QQ", 1, 2)),
    "error on a request kind": resp_frame(0x01, 3, struct.pack(">Qq", 1, 2)),
    "response op 8": resp_frame(0x88, 0, b""),
    "error op 8": resp_frame(0x88, 4, struct.pack(">Qq", 1, 2)),
    "add response trailing": resp_frame(0x81, 0, struct.pack(">QQ", 1, 2) + b"\0"),
    "add response short": resp_frame(0x81, 0, struct.pack(">QQ", 1, 2)[:-1]),
    "add response entry 2^63": resp_frame(0x81, 0, struct.pack(">QQ", 1, 2**63)),
    "read response short": resp_frame(0x82, 0, struct.pack(">Qq", 1, 2)),
    "read response entry -1": resp_frame(0x82, 0, struct.pack(">Qqq", 1, -1, 0)),
    "read response lac -2": resp_frame(0x82, 0, struct.pack(">Qqq", 1, 0, -2)),
    "read lac response trailing": resp_frame(0x83, 0, struct.pack(">Qq", 1, 2) + b"\0"),
    "write lac response short": resp_frame(0x84, 0, b"\0" * 7),
    "bookie info readonly 2": resp_frame(0x85, 0, struct.pack(">QQB", 1, 2, 2)),
    "bookie info short": resp_frame(0x85, 0, struct.pack(">QQ", 1, 2)),
    "error body short": resp_frame(0x81, 7, struct.pack(">Q", 1)),
    "error message over 1024": resp_frame(0x81, 7, struct.pack(">Qq", 1, 2) + b"m" * 1025),
    "error entry -2": resp_frame(0x81, 7, struct.pack(">Qq", 1, -2)),
    "error ledger 2^63": resp_frame(0x81, 7, struct.pack(">Qq", 2**63, 0)),
    "header short": b"\x01\x81\x00",
    "range response shorter than its fixed part": resp_frame(0x87, 0, struct.pack(">QQq", 1, 2, 3)),
    "range response count 0": resp_frame(0x87, 0, range_head(0)),
    "range response count over the maximum": resp_frame(0x87, 0, range_head(MAX_RANGE_ENTRIES + 1)),
    "range response entry past the frame": resp_frame(0x87, 0, range_head(1) + struct.pack(">I", 6) + b"entry"),
    "range response entry length cut": resp_frame(0x87, 0, range_head(2) + struct.pack(">I", 5) + b"entry\0\0"),
    "range response fewer entries than counted": resp_frame(0x87, 0, range_head(2) + struct.pack(">I", 5) + b"entry"),
    "range response trailing": resp_frame(0x87, 0, range_head(1) + struct.pack(">I", 5) + b"entry\0"),
    "range response lac -2": resp_frame(0x87, 0, range_head(1, lac=-2) + struct.pack(">I", 0)),
    "range response first 2^63": resp_frame(0x87, 0, range_head(1, first=2**63) + struct.pack(">I", 0)),
    "range response past the largest entry id": resp_frame(0x87, 0, range_head(2, first=I63) + bytes(8)),
}


@pytest.mark.parametrize("name", list(BAD_RESPONSES))
def test_bad_response_frames_are_refused(name: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_response(BAD_RESPONSES[name])
    assert type(info.value) is ProtocolError and "reason" in info.value.context


def test_an_error_message_of_exactly_1024_bytes_is_accepted() -> None:
    out = decode_response(resp_frame(0x81, 7, struct.pack(">Qq", 1, 2) + b"m" * 1024))
    assert isinstance(out, ErrorResponse) and out.message == "m" * 1024


# --- fuzzing: nothing but ProtocolError ever comes out ---------------------------------


def _canonical(event: Request | Response, raw: bytes) -> None:
    """Decoding accepts only canonical encodings (valid UTF-8 messages aside)."""
    if isinstance(event, ErrorResponse):
        return
    again = encode_request(event) if isinstance(event, REQUESTS) else encode_response(event)
    assert again[4:] == raw


@FAST
@given(st.binary(max_size=200))
def test_random_bytes_only_ever_raise_protocol_error(raw: bytes) -> None:
    for decode in (decode_request, decode_response):
        try:
            _canonical(decode(raw), raw)
        except ProtocolError:
            pass
    assert all(isinstance(e, Request | ErrorResponse) for e in ServerConnection().receive(raw))
    try:
        ClientConnection().receive(raw)
    except ProtocolError:
        pass


@st.composite
def mutated(draw: st.DrawFn, frames: st.SearchStrategy[bytes]) -> bytes:
    raw = bytearray(draw(frames))
    how = draw(st.sampled_from(["flip", "byte", "truncate", "extend", "length", "header"]))
    if how == "flip":
        bit = draw(st.integers(0, len(raw) * 8 - 1))
        raw[bit // 8] ^= 1 << (bit % 8)
    elif how == "byte":
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    elif how == "truncate":
        del raw[draw(st.integers(0, len(raw) - 1)):]
    elif how == "extend":
        raw += draw(st.binary(min_size=1, max_size=40))
    elif how == "length":
        raw[:4] = struct.pack(">I", draw(st.one_of(st.integers(0, 64), st.integers(0, 2**32 - 1))))
    else:
        raw[4 + draw(st.integers(0, 11))] = draw(st.integers(0, 255))
    return bytes(raw)


small = st.binary(max_size=64)
request_frames = requests(small).map(encode_request)
# responses to the ids a test client has pending (1..5)
response_frames = responses(small).map(lambda r: encode_response(replace(r, request_id=r.request_id % 5 + 1)))


@FAST
@given(mutated(request_frames), st.binary(max_size=40))
def test_mutated_requests_never_break_the_server(raw: bytes, tail: bytes) -> None:
    try:
        _canonical(decode_request(raw[4:]), raw[4:])
    except ProtocolError:
        pass
    server = ServerConnection(max_frame_size=MIN_MAX_FRAME_SIZE)
    for event in server.receive(raw) + server.receive(tail):  # never raises
        if isinstance(event, ErrorResponse):
            assert event.status in (Status.EBADREQ, Status.EBADVERSION)
            assert decode_response(server.send(event)[4:]) == event
        else:
            _canonical(event, encode_request(event)[4:])


def pending_client() -> ClientConnection:
    client = ClientConnection()
    for req in (AddEntry(1, 0, KEY, b"x"), ReadEntry(1, 0), ReadLac(1), WriteLac(1, 0, KEY, body=b"body"),
                GetBookieInfo()):
        client.send(req)
    return client


@FAST
@given(mutated(response_frames))
def test_mutated_responses_only_ever_raise_protocol_error(raw: bytes) -> None:
    try:
        _canonical(decode_response(raw[4:]), raw[4:])
    except ProtocolError:
        pass
    client = pending_client()
    try:
        for resp in client.receive(raw):
            assert resp.request_id not in client.pending_ids()
        resent = client.data_to_send()  # an EBADREQ to the WRITE_LAC with a body: it goes again, without
        if resent:
            assert vars(decode_request(resent[4:])) == vars(WriteLac(1, 0, KEY, 4)) and 4 in client.pending_ids()
    except ProtocolError:
        with pytest.raises(ProtocolError):
            client.receive(b"")  # fatal: stays failed


# --- framing -------------------------------------------------------------------------


@FAST
@given(st.lists(st.one_of(requests(small).map(encode_request), responses(small).map(encode_response)),
                max_size=12),
       st.lists(st.integers(0, 2000), max_size=12))
def test_frame_decoder_reassembles_any_chunking(frames: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frames)
    ends = [sum(len(f) for f in frames[: i + 1]) for i in range(len(frames))]
    points = sorted({min(c, len(stream)) for c in cuts} | {len(stream)})
    decoder = FrameDecoder()
    out: list[bytes] = []
    start = 0
    for point in points:
        chunk = stream[start:point]
        out += decoder.feed(chunk if len(out) % 2 else memoryview(chunk))
        done = max([e for e in ends if e <= point], default=0)
        assert decoder.buffered == point - done  # never more than the frame in progress
        start = point
    assert out == [f[4:] for f in frames]
    assert all(type(f) is bytes for f in out)


def test_frame_decoder_many_small_frames_and_one_big_frame_in_small_chunks() -> None:
    frames = [encode_request(AddEntry(1, i, KEY, b"d" * (i % 50))) for i in range(2000)]
    assert FrameDecoder().feed(b"".join(frames)) == [f[4:] for f in frames]
    big = encode_request(AddEntry(1, 0, KEY, bytes(DEFAULT_MAX_FRAME_SIZE - 33 - len(KEY))))
    assert len(big) == DEFAULT_MAX_FRAME_SIZE  # exactly the maximum is allowed
    decoder, out = FrameDecoder(), []
    for i in range(0, len(big), 1000):
        out += decoder.feed(big[i:i + 1000])
    assert out == [big[4:]] and decoder.buffered == 0


def test_a_client_gathers_a_large_answer_read_by_read_then_cuts_it_once() -> None:
    """A ~1 MiB READ_ENTRY answer arriving in 1 KiB reads, between two small answers:
    until it is whole, each read is only gathered (join gives nothing to cut - it copied
    the whole frame held back again on every read, quadratic in the frame's size); then
    it comes out intact, and so does what follows it in the same read."""
    client, server = ClientConnection(), ServerConnection()
    rids = [client.send(ReadEntry(5, e))[0] for e in range(3)]
    body = bytes(range(256)) * 4096
    answers = [ReadEntryResponse(5, 0, -1, b"small", rids[0]), ReadEntryResponse(5, 1, 0, body, rids[1]),
               ReadEntryResponse(5, 2, 1, b"after", rids[2])]
    stream = b"".join(server.send(a) for a in answers)
    small = len(server.send(answers[0]))
    got = client.receive(stream[:small + 2000])
    assert got == answers[:1]
    decoder = client._decoder
    pos = small + 2000
    while pos + 1024 < small + 4 + 36 + len(body) - 4:  # the big frame still incomplete after this read
        assert decoder.join(stream[pos:pos + 1024]) == b"", "an incomplete frame was handed out to be cut"
        pos += 1024
    assert client.receive(stream[pos:]) == answers[1:]
    assert client.pending == 0 and decoder.buffered == 0


def test_max_frame_size_is_the_whole_frame_and_is_checked_before_the_body() -> None:
    decoder = FrameDecoder(MIN_MAX_FRAME_SIZE)
    assert decoder.feed(struct.pack(">I", MIN_MAX_FRAME_SIZE - 4)) == []  # a 4096-byte frame is fine
    decoder = FrameDecoder(MIN_MAX_FRAME_SIZE)
    with pytest.raises(FrameTooLargeError) as info:
        decoder.feed(struct.pack(">I", MIN_MAX_FRAME_SIZE - 3))  # 4097 bytes: refused at the prefix
    assert info.value.context["frame_size"] == MIN_MAX_FRAME_SIZE + 1
    with pytest.raises(FrameTooLargeError):
        decoder.feed(encode_request(GetBookieInfo()))  # fatal: the stream is lost
    with pytest.raises(ProtocolError, match="below the header"):
        FrameDecoder().feed(struct.pack(">I", 11) + b"\0" * 11)
    for bad in (MIN_MAX_FRAME_SIZE - 1, 2**32, -1):
        with pytest.raises(InvalidArgumentError):
            FrameDecoder(bad)


def test_encoding_refuses_frames_over_the_maximum() -> None:
    req = AddEntry(1, 0, KEY, bytes(MIN_MAX_FRAME_SIZE))
    with pytest.raises(FrameTooLargeError):
        encode_request(req, max_frame_size=MIN_MAX_FRAME_SIZE)
    with pytest.raises(FrameTooLargeError):
        encode_request(AddEntry(1, 0, KEY, bytes(DEFAULT_MAX_FRAME_SIZE)))
    client = ClientConnection(max_frame_size=MIN_MAX_FRAME_SIZE)
    with pytest.raises(FrameTooLargeError):
        client.send(req)
    assert client.pending == 0 and client.send(GetBookieInfo())[0] == 1  # no id was used up
    fits = AddEntry(1, 0, KEY, bytes(MIN_MAX_FRAME_SIZE - 33 - len(KEY)))
    assert len(encode_request(fits, max_frame_size=MIN_MAX_FRAME_SIZE)) == MIN_MAX_FRAME_SIZE


def test_server_refuses_a_bad_length_and_closes() -> None:
    for prefix in (struct.pack(">I", 5), struct.pack(">I", DEFAULT_MAX_FRAME_SIZE)):
        server = ServerConnection()
        events = server.receive(encode_request(ReadLac(1, request_id=4)) + prefix)
        assert events[0] == ReadLac(1, request_id=4)
        refusal = events[1]
        assert isinstance(refusal, ErrorResponse) and len(events) == 2
        assert (refusal.op, refusal.status, refusal.request_id) == (Op.INVALID, Status.EBADREQ, 0)
        assert server.closing and server.receive(encode_request(ReadLac(1))) == []
        assert decode_response(server.send(refusal)[4:]) == refusal


def test_server_answers_an_entry_too_big_to_return_with_eio() -> None:
    server = ServerConnection(max_frame_size=MIN_MAX_FRAME_SIZE)
    out = decode_response(server.send(ReadEntryResponse(3, 4, 4, bytes(MIN_MAX_FRAME_SIZE), request_id=8))[4:])
    assert isinstance(out, ErrorResponse)
    assert (out.op, out.status, out.ledger_id, out.entry_id, out.request_id) == (Op.READ_ENTRY, Status.EIO, 3, 4, 8)
    fits = MIN_MAX_FRAME_SIZE - range_response_size(0, 1)  # one entry of this size fills the frame exactly
    assert len(server.send(ReadRangeResponse(3, 4, 4, (bytes(fits),), request_id=9))) == MIN_MAX_FRAME_SIZE
    out = decode_response(server.send(ReadRangeResponse(3, 4, 4, (bytes(fits + 1),), request_id=9))[4:])
    assert isinstance(out, ErrorResponse)
    assert (out.op, out.status, out.ledger_id, out.entry_id, out.request_id) == (Op.READ_RANGE, Status.EIO, 3, 4, 9)


@FAST
@given(range_responses(datas))
def test_range_response_size_is_the_size_of_the_frame(resp: ReadRangeResponse) -> None:
    frame = encode_response(resp)
    assert len(frame) == range_response_size(sum(map(len, resp.entries)), len(resp.entries))
    count, size = struct.unpack_from(">II", frame, RANGE_RESPONSE_OVERHEAD - 4)  # the first entry's length is next
    first = resp.entries[0]
    assert (count, size) == (len(resp.entries), len(first))
    assert frame[RANGE_RESPONSE_OVERHEAD + 4 : RANGE_RESPONSE_OVERHEAD + 4 + size] == first


def test_a_range_answer_is_matched_to_its_request() -> None:
    client, server = ClientConnection(), ServerConnection()
    rid, wire = client.send(ReadRange(5, 10, 3, request_id=77))
    assert server.receive(wire) == [ReadRange(5, 10, 3, request_id=rid)]
    answer = ReadRangeResponse(5, 10, 11, (b"a", b"b"), request_id=rid)
    assert client.receive(server.send(answer)) == [answer] and client.pending == 0
    rid, _ = client.send(ReadRange(5, 12, 3))
    with pytest.raises(ProtocolError, match="does not match"):
        client.receive(server.send(ReadEntryResponse(5, 12, 11, b"c", request_id=rid)))


def test_a_range_answers_entries_are_views_of_its_frame_and_other_answers_are_bytes() -> None:
    """A READ_RANGE answer is cut from the bytes received without copying its entries;
    every other answer (a READ_ENTRY's data, an error's message) is made of bytes, also
    when it arrives in pieces and is reassembled."""
    client, server = ClientConnection(), ServerConnection()
    rid, _ = client.send(ReadRange(5, 10, 2))
    eid, _ = client.send(ReadEntry(5, 12))
    frid, _ = client.send(ReadRange(5, 13, 1))
    wire = server.send(ReadRangeResponse(5, 10, 12, (b"a" * 300, b"b" * 5), request_id=rid)) \
        + server.send(ReadEntryResponse(5, 12, 12, b"c" * 40, request_id=eid)) \
        + server.send(ErrorResponse(Op.READ_RANGE, Status.ENOENTRY, 5, 13, "no", request_id=frid))
    got: list[Response] = []
    for cut in range(0, len(wire), 7):  # in pieces: frames are reassembled before they are cut
        got += client.receive(wire[cut : cut + 7])
    ranged, single, refused = got
    assert isinstance(ranged, ReadRangeResponse) and all(type(e) is memoryview for e in ranged.entries)
    assert ranged.entries == (b"a" * 300, b"b" * 5)
    assert isinstance(single, ReadEntryResponse) and type(single.data) is bytes and single.data == b"c" * 40
    assert isinstance(refused, ErrorResponse) and refused.status is Status.ENOENTRY and refused.message == "no"
    # a view of a buffer that may change is copied first: the answer never aliases it
    frame = bytearray(server.send(ReadRangeResponse(5, 10, 12, (b"a", b"b"), request_id=rid)))
    answer = decode_response(memoryview(frame)[4:])
    frame[-2:] = b"xy"  # changed under the answer: it kept copies ...
    frame += b"z"  # ... and no view (a held view would refuse the resize: BufferError)
    assert isinstance(answer, ReadRangeResponse) and answer.entries == (b"a", b"b")


# --- versions --------------------------------------------------------------------------


def test_server_answers_another_version_in_its_own_and_closes() -> None:
    server = ServerConnection()
    other = bytearray(encode_request(AddEntry(1, 2, KEY, b"e", request_id=77)))
    other[4] = 2
    events = server.receive(bytes(other) + encode_request(ReadLac(1, request_id=78)))
    assert len(events) == 1 and server.closing  # nothing after the foreign frame is read
    refusal = events[0]
    assert isinstance(refusal, ErrorResponse)
    assert (refusal.op, refusal.status, refusal.request_id) == (Op.ADD_ENTRY, Status.EBADVERSION, 77)
    wire = server.send(refusal)
    assert wire[4] == PROTOCOL_VERSION
    assert isinstance(error_for(refusal), ProtocolVersionError)
    assert server.receive(encode_request(ReadLac(1))) == []


def test_client_refuses_a_bookie_of_another_version() -> None:
    client = ClientConnection()
    rid, _ = client.send(ReadLac(1))
    other = bytearray(encode_response(ReadLacResponse(1, 5, request_id=rid)))
    other[4] = 3
    with pytest.raises(ProtocolVersionError, match="bookie speaks protocol version 3, this client version 1"):
        client.receive(bytes(other))
    with pytest.raises(ProtocolVersionError):
        decode_response(bytes(other[4:]))
    with pytest.raises(ProtocolVersionError, match="client speaks protocol version 3"):
        decode_request(frame(1, 0, add_body(), version=3))


def test_client_takes_a_version_refusal_sent_in_its_version() -> None:
    client = ClientConnection()
    rid, _ = client.send(ReadLac(1))
    refusal = ErrorResponse(Op.READ_LAC, Status.EBADVERSION, 1, -1, "no", request_id=rid)
    [got] = client.receive(encode_response(refusal))
    assert got == refusal and client.pending == 0
    assert isinstance(error_for(refusal), ProtocolVersionError)


# --- client connection: ids, pipelining, matching --------------------------------------


def test_pipelined_requests_answered_out_of_order() -> None:
    client, server = ClientConnection(), ServerConnection()
    reqs: list[Request] = [AddEntry(9, 0, KEY, b"a", request_id=999), AddEntry(9, 1, KEY, b"b"),
                           ReadEntry(9, 0), ReadLac(9), WriteLac(9, 1, KEY), GetBookieInfo()]
    sent = [client.send(r) for r in reqs]
    assert [rid for rid, _ in sent] == [1, 2, 3, 4, 5, 6]  # the request's own id is ignored
    assert client.pending == 6 and client.pending_ids() == [1, 2, 3, 4, 5, 6]
    received = server.receive(b"".join(wire for _, wire in sent))
    assert [r.request_id for r in received] == [1, 2, 3, 4, 5, 6]
    assert received[0] == AddEntry(9, 0, KEY, b"a", request_id=1)
    answers: list[Response] = [
        BookieInfoResponse(10, 20, False, request_id=6),
        ReadEntryResponse(9, 0, 1, b"a", request_id=3),
        AddEntryResponse(9, 1, request_id=2),
        ErrorResponse(Op.WRITE_LAC, Status.EUA, 9, -1, "bad key", request_id=5),
        ReadLacResponse(9, 1, request_id=4),
    ]
    stream = b"".join(server.send(a) for a in answers)
    got = client.receive(stream[:10]) + client.receive(stream[10:])
    assert got == answers
    assert client.pending_ids() == [1]
    assert client.receive(server.send(AddEntryResponse(9, 0, request_id=1))) == [AddEntryResponse(9, 0, 1)]
    assert client.pending == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["ok", "fenced", "lac", "unknown-id"]), min_size=1, max_size=40),
       st.integers(0, 2000), st.booleans())
def test_runs_of_add_answers_are_cut_like_any_other_frame(kinds: list[str], cut: int, acks: bool) -> None:
    """The run-at-a-time path for EOK add answers (``receive``, ``receive_acks``) gives
    what one frame at a time would: stream order, errors and other answers between the
    runs, any split of the stream, and an answer to no pending request still fatal."""
    client, server = ClientConnection(), ServerConnection()
    expected: list[object] = []
    frames: list[bytes] = []
    for i, kind in enumerate(kinds):
        if kind == "lac":
            rid, _ = client.send(ReadLac(3))
            answer: Response = ReadLacResponse(3, i, request_id=rid)
        else:
            rid, _ = client.send_add(AddEntry(3, i, KEY, b"x"))
            if kind == "fenced":
                answer = ErrorResponse(Op.ADD_ENTRY, Status.EFENCED, 3, i, "fenced", request_id=rid)
            else:
                answer = AddEntryResponse(3, i, request_id=rid + 10_000 if kind == "unknown-id" else rid)
        frames.append(server.send(answer))
        if kind == "unknown-id":
            break
        expected.append(rid if acks and kind == "ok" else answer)
    stream = b"".join(frames)
    cut = min(cut, len(stream))
    receive = client.receive_acks if acks else client.receive
    if kinds[len(frames) - 1] == "unknown-id":
        with pytest.raises(ProtocolError, match="no pending request"):
            receive(stream[:cut])
            receive(stream[cut:])
        return
    assert receive(stream[:cut]) + receive(stream[cut:]) == expected
    assert client.pending == 0


def test_an_invalid_op_error_answers_any_pending_request() -> None:
    client = ClientConnection()
    rid, _ = client.send(AddEntry(1, 0, KEY, b""))
    refusal = ErrorResponse(Op.INVALID, Status.EBADREQ, request_id=rid)
    assert client.receive(encode_response(refusal)) == [refusal] and client.pending == 0


@pytest.mark.parametrize("answer", [
    AddEntryResponse(1, 0, request_id=2),  # never sent
    AddEntryResponse(1, 0, request_id=0),
    ReadLacResponse(1, 0, request_id=1),  # the wrong op
    ErrorResponse(Op.READ_ENTRY, Status.EIO, request_id=1),
])
def test_client_refuses_unexpected_responses(answer: Response) -> None:
    client = ClientConnection()
    client.send(AddEntry(1, 0, KEY, b""))
    with pytest.raises(ProtocolError) as info:
        client.receive(encode_response(answer))
    assert type(info.value) is ProtocolError
    with pytest.raises(ProtocolError):
        client.receive(encode_response(AddEntryResponse(1, 0, request_id=1)))  # the connection is done


def test_a_stream_refusal_reaches_the_client_as_a_protocol_error_with_the_reason() -> None:
    client = ClientConnection()
    client.send(ReadLac(1))
    refusal = ServerConnection().receive(struct.pack(">I", 3))[0]
    assert isinstance(refusal, ErrorResponse) and refusal.request_id == 0
    with pytest.raises(ProtocolError, match="below the header") as info:
        client.receive(encode_response(refusal))
    assert info.value.context["status"] == "EBADREQ"


def test_a_duplicate_response_is_refused() -> None:
    client = ClientConnection()
    rid, _ = client.send(ReadLac(1))
    wire = encode_response(ReadLacResponse(1, 0, request_id=rid))
    assert len(client.receive(wire)) == 1
    with pytest.raises(ProtocolError, match="no pending request"):
        client.receive(wire)


# --- errors <-> status -----------------------------------------------------------------


@pytest.mark.parametrize("status", [s for s in Status if s is not Status.EOK])
def test_status_and_error_round_trip(status: Status) -> None:
    resp = ErrorResponse(Op.READ_ENTRY, status, 7, 12, "why", request_id=3)
    error = error_for(resp)
    assert status_for(error) is status
    assert "why" in str(error) and error.context["ledger"] == 7 and error.context["entry"] == 12


@pytest.mark.parametrize(("exc", "status"), [
    (NoSuchLedgerError(), Status.ENOLEDGER),
    (NoSuchEntryError(), Status.ENOENTRY),
    (ProtocolVersionError(), Status.EBADVERSION),
    (ProtocolError(), Status.EBADREQ),
    (FrameTooLargeError(), Status.EBADREQ),
    (InvalidArgumentError(), Status.EBADREQ),
    (UnauthorizedError(), Status.EUA),
    (LedgerFencedError(), Status.EFENCED),
    (BookieReadOnlyError(), Status.EREADONLY),
    (BookieBusyError(), Status.ETOOMANYREQUESTS),
    (BookieError(), Status.EIO),
    (BookieShutdownError(), Status.EIO),
    (NativeIOError(5, "disk"), Status.EIO),
    (LedgerClosedError(), Status.EIO),
    (OSError(), Status.EIO),
    (KeyError(), Status.EIO),
])
def test_status_for(exc: BaseException, status: Status) -> None:
    assert status_for(exc) is status


def test_error_for_names_the_error_class() -> None:
    expected = {
        Status.ENOLEDGER: NoSuchLedgerError, Status.ENOENTRY: NoSuchEntryError, Status.EBADREQ: ProtocolError,
        Status.EIO: BookieError, Status.EUA: UnauthorizedError, Status.EBADVERSION: ProtocolVersionError,
        Status.EFENCED: LedgerFencedError, Status.EREADONLY: BookieReadOnlyError,
        Status.ETOOMANYREQUESTS: BookieBusyError,
    }
    for status, cls in expected.items():
        assert type(error_for(ErrorResponse(Op.ADD_ENTRY, status))) is cls


# --- the add fast paths: the same messages as the general decoders ------------------------


def _add_frames() -> list[bytes]:
    """ADD_ENTRY frames of every shape the fast path takes, and near misses it leaves to
    decode_request (bad version, flags, key length, ids past 2^63-1, short body)."""
    good = [AddEntry(1, 0, KEY, b"x" * 1000), AddEntry(2**63 - 1, 2**63 - 1, b"", b""),
            AddEntry(3, 7, b"k" * 64, b"data", recovery=True, request_id=5)]
    frames = [encode_request(r) for r in good]
    base = encode_request(AddEntry(4, 1, KEY, b"payload", request_id=9))

    def patched(offset: int, raw: bytes) -> bytes:
        return base[:offset] + raw + base[offset + len(raw):]

    frames += [
        patched(6, b"\x00\x02"),  # FENCE is no add flag
        patched(32, bytes([65])),  # key longer than allowed
        patched(32, b"\xff"),  # key past the end of the frame
        patched(16, b"\x80" + b"\0" * 7),  # ledger id 2^63
        patched(24, b"\xff" * 8),  # entry id 2^64-1
        struct.pack(">IBBHQ", 20, 1, 1, 0, 3) + b"\0" * 8,  # body shorter than 17 bytes
        base,  # still read after those refusals
        patched(4, b"\x02"),  # protocol version 2: the stream closes
        base,  # not read
    ]
    return frames


def test_server_add_fast_path_answers_as_decode_request() -> None:
    """Every frame, fed whole or cut anywhere, gives what decode_request (or the refusal
    of a bad frame) gives; frames after a refused one are still read."""
    frames = _add_frames()
    expected: list[Request | ErrorResponse] = []
    for frame in frames:
        fresh = ServerConnection()
        expected += fresh.receive(frame)
        if fresh.closing:
            break  # another protocol version closes the stream: nothing after it counts
    stream = b"".join(frames)
    assert ServerConnection().receive(stream) == expected
    rng = random.Random(7)
    for _ in range(50):
        server, got, pos = ServerConnection(), [], 0
        while pos < len(stream):
            step = rng.randint(1, 1500)
            got += server.receive(memoryview(stream)[pos : pos + step] if step % 2 else stream[pos : pos + step])
            pos += step
        assert got == expected
    assert isinstance(expected[0], AddEntry) and expected[0] == decode_request(frames[0][4:])
    assert isinstance(expected[2], AddEntry) and expected[2].recovery
    assert [type(e).__name__ for e in expected[3:]] == ["ErrorResponse"] * 6 + ["AddEntry", "ErrorResponse"]
    assert all(e.status is Status.EBADREQ for e in expected[3:9] if isinstance(e, ErrorResponse))
    assert isinstance(expected[-1], ErrorResponse) and expected[-1].status is Status.EBADVERSION


def test_server_answers_many_adds_at_once_as_one_by_one() -> None:
    server = ServerConnection()
    reqs = [AddEntry(1, e, KEY, b"d", request_id=e + 1) for e in range(5)]
    assert server.send_added_many(reqs) == b"".join(server.send_added(r) for r in reqs)
    assert server.send_added(reqs[0]) == server.send(AddEntryResponse(1, 0, request_id=1))
    # a lone add's answer (its own path: no list, no join) is the same frame
    lone = AddEntry(7, 2**63 - 1, KEY, b"d", request_id=2**32 - 1)
    assert server.send_added_many([lone]) == server.send(AddEntryResponse(7, 2**63 - 1, request_id=2**32 - 1))


def test_client_add_fast_path_still_matches_and_refuses() -> None:
    """An add's answer is matched like any response: a second answer to the same id, or
    an add answer to a read, is a ProtocolError."""
    client, server = ClientConnection(), ServerConnection()
    rid, _ = client.send(AddEntry(1, 0, KEY, b"d"))
    answer = server.send(AddEntryResponse(1, 0, request_id=rid))
    assert client.receive(answer[:7]) == [] and client.receive(answer[7:]) == [AddEntryResponse(1, 0, rid)]
    with pytest.raises(ProtocolError, match="no pending request"):
        client.receive(answer)
    client = ClientConnection()
    rid, _ = client.send(ReadLac(1))
    with pytest.raises(ProtocolError, match="does not match"):
        client.receive(server.send(AddEntryResponse(1, 0, request_id=rid)))


@pytest.mark.parametrize("recovery", [False, True])
def test_client_send_add_in_pieces_is_the_frame_send_gives(recovery: bool) -> None:
    """send_add's head + key + entry are the bytes of send(), with the same numbering and
    matching; a frame past the maximum raises, leaves nothing pending and takes no id."""
    whole, parts = ClientConnection(MIN_MAX_FRAME_SIZE), ClientConnection(MIN_MAX_FRAME_SIZE)
    for entry_id, data in enumerate([b"", b"x", bytes(range(256)) * 3]):
        req = AddEntry(7, entry_id, KEY, data, recovery)
        rid, frame = whole.send(req)
        prid, head = parts.send_add(req)
        assert (prid, head + KEY + data) == (rid, frame) and len(head) == 33
        assert decode_request(frame[4:]) == replace(req, request_id=rid)
    assert parts.pending_ids() == whole.pending_ids() == [1, 2, 3]
    too_big = AddEntry(7, 9, KEY, b"y" * (MIN_MAX_FRAME_SIZE - 33 - len(KEY) + 1))
    with pytest.raises(FrameTooLargeError):
        whole.send(too_big)
    with pytest.raises(FrameTooLargeError):
        parts.send_add(too_big)
    assert parts.pending_ids() == [1, 2, 3] and parts.send_add(AddEntry(7, 9, KEY, b""))[0] == 4
    server = ServerConnection()
    assert parts.receive(server.send(AddEntryResponse(7, 1, request_id=2))) == [AddEntryResponse(7, 1, 2)]
    assert parts.pending_ids() == [1, 3, 4]


@pytest.mark.parametrize("recovery", [False, True])
def test_client_send_adds_is_send_add_for_each_entry(recovery: bool) -> None:
    """send_adds of a run of entries appends, entry by entry, what send_add gives for each
    (head, key, entry: the bytes of send()), numbered in order from the id it returns; one
    past the maximum frame size is skipped - not sent, not pending, its id returned - and
    the numbering goes on past it."""
    one, run = ClientConnection(MIN_MAX_FRAME_SIZE), ClientConnection(MIN_MAX_FRAME_SIZE)
    one.send(ReadLac(7))
    run.send(ReadLac(7))  # both connections at id 2
    too_big = b"y" * (MIN_MAX_FRAME_SIZE - 33 - len(KEY) + 1)
    entries = [AddEntry(7, 5 + i, KEY, data, recovery)
               for i, data in enumerate([b"", b"x", too_big, bytes(range(256)) * 3, b"z" * 100])]
    expected: list[bytes] = []
    for req in entries:
        try:
            expected += [one.send_add(req)[1], req.master_key, req.data]
        except FrameTooLargeError:
            one.send(ReadLac(7))  # takes the id the refused one took
            del one._pending[4]
    out: list[bytes] = [b"before"]
    assert run.send_adds(7, KEY, recovery, entries, out) == (2, [4])
    assert out == [b"before", *expected]
    assert run.pending_ids() == one.pending_ids() == [1, 2, 3, 5, 6]
    for rid, req in zip([2, 3, 5, 6], [entries[0], entries[1], entries[3], entries[4]]):
        frame = b"".join(out[1:])
        length = struct.unpack_from(">I", frame)[0]
        assert decode_request(frame[4:4 + length]) == replace(req, request_id=rid)
        out[1:4] = []
    assert run.send(ReadLac(7))[0] == 7
    server = ServerConnection()
    answers = server.send(AddEntryResponse(7, 5, request_id=2)) + server.send(AddEntryResponse(7, 9, request_id=6))
    assert run.receive_acks(answers) == [2, 6]
    assert run.pending_ids() == [1, 3, 5, 7]
    assert run.send_adds(7, KEY, recovery, [], out) == (8, []) and run.pending_ids() == [1, 3, 5, 7]


# --- WRITE_LAC's body (flag LAC_BODY, 2026-12-06) ----------------------------------------

LAC_BODY = b"L" * 36  # as long as BookKeeper's largest (HMAC-SHA1)


def test_write_lac_body_round_trips_and_the_form_without_one_is_unchanged() -> None:
    """A body goes under flag LAC_BODY (a length byte, then the body), up to
    MAX_LAC_BODY_SIZE bytes; without a body the frame is version 1's, byte for byte,
    which is what an older client sends and a bookie still reads."""
    for body in (b"x", LAC_BODY, b"m" * MAX_LAC_BODY_SIZE):
        raw = encode_request(WriteLac(7, 11, KEY, 8, body))
        assert struct.unpack(">H", raw[6:8])[0] == 0x8 and raw[-len(body) - 1] == len(body)
        decoded = decode_request(raw[4:])
        assert isinstance(decoded, WriteLac) and decoded.body == body and decoded == WriteLac(7, 11, KEY, 8)
    old = bytes.fromhex("00000021 01 04 0000 0000000000000008 0000000000000007 000000000000000b 04 aaaaaaaa"
                        .replace(" ", ""))
    assert encode_request(WriteLac(7, 11, KEY, 8)) == old
    assert vars(decode_request(old[4:])) == vars(WriteLac(7, 11, KEY, 8, b""))


def test_write_lac_body_over_the_maximum_is_refused_when_encoding() -> None:
    with pytest.raises(InvalidArgumentError, match="LAC body") as info:
        encode_request(WriteLac(7, 11, KEY, body=b"m" * (MAX_LAC_BODY_SIZE + 1)))
    assert info.value.context["size"] == MAX_LAC_BODY_SIZE + 1
    client = ClientConnection()
    with pytest.raises(InvalidArgumentError):
        client.send(WriteLac(7, 11, KEY, body=b"m" * (MAX_LAC_BODY_SIZE + 1)))
    assert client.pending == 0 and client.takes_lac_bodies is None
    with pytest.raises(InvalidArgumentError, match="body"):
        WriteLac(7, 11, KEY, body="text")  # type: ignore[arg-type]


def _older_write_lac(frame: bytes, n: int, flags: int, rid: int) -> Request:
    """WRITE_LAC as bookies before flag LAC_BODY decode it: any flag is a bad request."""
    if flags:
        raise InvalidArgumentError(f"flags 0x{flags:04x} not allowed for this op")
    return _real_write_lac(frame, n, flags, rid)


_real_write_lac = _codec._REQUEST_DECODERS[Op.WRITE_LAC]


def _converse(client: ClientConnection, server: ServerConnection, frames: list[bytes]) -> tuple[
        list[Request], list[Response], int]:
    """Frames to the bookie until nobody has more to say: what the bookie was asked (the
    requests), what the client was told, and how many frames the bookie refused."""
    asked: list[Request] = []
    told: list[Response] = []
    refused = 0
    out = b"".join(frames)
    while out:
        answers = b""
        for event in server.receive(out):
            if isinstance(event, ErrorResponse):
                refused += 1
                answers += server.send(event)
            elif isinstance(event, WriteLac):
                asked.append(event)
                answers += server.send(WriteLacResponse(event.ledger_id, event.request_id))
            else:
                assert isinstance(event, AddEntry)
                asked.append(event)
                answers += server.send(AddEntryResponse(event.ledger_id, event.entry_id, event.request_id))
        told += client.receive(answers)
        out = client.data_to_send()
    return asked, told, refused


def test_a_bookie_that_takes_bodies_is_asked_once_and_the_writes_held_meanwhile_keep_theirs() -> None:
    client, server = ClientConnection(), ServerConnection()
    first = client.send(WriteLac(1, 5, KEY, body=b"one"))
    assert struct.unpack(">H", first[1][6:8])[0] == 0x8  # asks with the first body
    held = [client.send(WriteLac(ledger, 5, KEY, body=b"b%d" % ledger)) for ledger in (2, 3)]
    assert [frame for _, frame in held] == [b"", b""] and client.pending == 3  # numbered, not sent yet
    add = client.send(AddEntry(1, 6, KEY, b"entry"))  # everything else goes on meanwhile
    asked, told, refused = _converse(client, server, [first[1], add[1]])
    assert refused == 0 and client.takes_lac_bodies is True and client.pending == 0
    assert [(type(r).__name__, r.request_id, getattr(r, "body", None)) for r in asked] == [
        ("WriteLac", 1, b"one"), ("AddEntry", 4, None), ("WriteLac", 2, b"b2"), ("WriteLac", 3, b"b3")]
    assert sorted(r.request_id for r in told) == [1, 2, 3, 4]
    rid, frame = client.send(WriteLac(4, 5, KEY, body=b"four"))  # known now: sent at once, with it
    assert vars(decode_request(frame[4:])) == vars(WriteLac(4, 5, KEY, rid, b"four"))


def test_an_older_bookie_gets_the_lac_without_its_body_and_one_bad_frame_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A bookie from before flag LAC_BODY answers it EBADREQ and keeps the connection: the
    client sends that WRITE_LAC and those it held again, under their ids, without their
    bodies; each is answered once, EOK; later ones go without bodies from the start."""
    monkeypatch.setitem(_codec._REQUEST_DECODERS, Op.WRITE_LAC, _older_write_lac)
    client, server = ClientConnection(), ServerConnection()
    sent = [client.send(WriteLac(ledger, 9, KEY, body=b"body")) for ledger in range(1, 30)]
    sent.append(client.send(AddEntry(1, 10, KEY, b"entry")))
    asked, told, refused = _converse(client, server, [frame for _, frame in sent])
    assert refused == 1 and client.takes_lac_bodies is False and client.pending == 0
    assert sorted(r.request_id for r in told) == list(range(1, 31))
    assert all(isinstance(r, WriteLacResponse | AddEntryResponse) for r in told)
    lacs = [r for r in asked if isinstance(r, WriteLac)]
    assert sorted(r.ledger_id for r in lacs) == list(range(1, 30)) and all(r.body == b"" for r in lacs)
    rid, frame = client.send(WriteLac(40, 9, KEY, body=b"body"))
    assert frame == encode_request(WriteLac(40, 9, KEY, rid))  # version 1's frame


def test_only_ebadreq_tells_an_older_bookie() -> None:
    """Any other answer to the asking WRITE_LAC (a wrong key, here) is handed on as it is,
    and the bookie takes bodies: it decoded the frame."""
    client, server = ClientConnection(), ServerConnection()
    rid, _ = client.send(WriteLac(1, 5, KEY, body=b"one"))
    held, _ = client.send(WriteLac(2, 5, KEY, body=b"two"))
    refusal = ErrorResponse(Op.WRITE_LAC, Status.EUA, 1, -1, "wrong key", rid)
    assert client.receive(server.send(refusal)) == [refusal]
    assert client.takes_lac_bodies is True
    released = decode_request(client.data_to_send()[4:])
    assert isinstance(released, WriteLac) and (released.request_id, released.body) == (held, b"two")
    assert client.data_to_send() == b""
