"""BookKeeper's wire dialects (walkit.protocol._bk_v3, _bk_v2, _bk_digest, _dialect):
round trips of every message both ways, golden bytes built by hand from BookKeeper's
layouts, broken frames as ProtocolError, fuzzed decoders, dialect detection."""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from walkit.errors import (
    DigestMismatchError,
    FrameTooLargeError,
    InvalidArgumentError,
    ProtocolError,
    ProtocolVersionError,
)
from walkit.protocol import (
    AddEntry,
    AddEntryResponse,
    AuthMessage,
    BkDigestType,
    BookieInfoResponse,
    Dialect,
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
    StartTls,
    StartTlsResponse,
    Status,
    WriteLac,
    WriteLacResponse,
    bk_decode_entry,
    bk_encode_entry,
    bk_master_key,
    codec_for,
    detect_dialect,
)
from walkit.protocol import _bk_digest, _bk_v2, _bk_v3, _codec

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEY = bk_master_key(b"secret")
ENTRY = bk_encode_entry(7, 3, 2, 105, b"hello", digest=BkDigestType.CRC32C)


# --- digests and master key ------------------------------------------------------------------


def test_master_key_is_sha1_of_ledger_and_password() -> None:
    assert KEY == hashlib.sha1(b"ledgersecret").digest() and len(KEY) == 20
    assert _bk_digest.bk_mac_key(b"pw") == hashlib.sha1(b"macpw").digest()


@pytest.mark.parametrize("digest,size", [(BkDigestType.CRC32, 8), (BkDigestType.CRC32C, 4),
                                         (BkDigestType.HMAC, 20), (BkDigestType.DUMMY, 0)])
def test_entry_digests(digest: BkDigestType, size: int) -> None:
    entry = bk_encode_entry(1, 2, 1, 9, b"payload", digest=digest, password=b"pw")
    header = struct.pack(">qqqq", 1, 2, 1, 9)
    assert entry[:32] == header and len(entry) == 32 + size + 7 and entry[32 + size:] == b"payload"
    assert bk_decode_entry(entry, digest=digest, password=b"pw") == ((1, 2, 1, 9), b"payload")
    if digest is BkDigestType.CRC32:  # CRC32 in a long: 4 zero bytes, then zlib's CRC
        assert entry[32:40] == struct.pack(">Q", zlib.crc32(header + b"payload"))
    if digest is BkDigestType.HMAC:
        mac = hmac.new(hashlib.sha1(b"macpw").digest(), header + b"payload", hashlib.sha1).digest()
        assert entry[32:52] == mac
    if size:
        bad = entry[:-1] + bytes([entry[-1] ^ 1])
        with pytest.raises(DigestMismatchError):
            bk_decode_entry(bad, digest=digest, password=b"pw")


def test_lac_body() -> None:
    body = _bk_digest.bk_encode_lac(4, 9, digest=BkDigestType.HMAC, password=b"p")
    assert len(body) == 36 and _bk_digest.bk_decode_lac(body, digest=BkDigestType.HMAC, password=b"p") == 9
    with pytest.raises(DigestMismatchError):
        _bk_digest.bk_decode_lac(body, digest=BkDigestType.HMAC, password=b"q")


# --- round trips ---------------------------------------------------------------------------

V3_REQUESTS = [
    AddEntry(7, 3, KEY, ENTRY, False, 1),
    AddEntry(7, 3, KEY, ENTRY, True, 2**64 - 1),
    ReadEntry(7, 3, request_id=5),
    ReadEntry(7, -1, True, KEY, request_id=6),
    ReadEntry(7, 4, previous_lac=3, timeout_ms=1000, request_id=7),
    ReadLac(7, 8),
    WriteLac(7, 3, KEY, 9),
    GetBookieInfo(10),
    ForceLedger(7, 11),
    GetListOfEntries(7, 12),
    AuthMessage("SASL", b"\x00token", 13),
    StartTls(14),
]
V3_RESPONSES = [
    AddEntryResponse(7, 3, 1),
    ReadEntryResponse(7, 3, 2, ENTRY, 5),
    ReadLacResponse(7, 3, 8),
    WriteLacResponse(7, 9),
    BookieInfoResponse(100, 1000, False, 10),
    ForceLedgerResponse(7, 11),
    ListOfEntriesResponse(7, b"\x01\x02", 12),
    AuthMessage("SASL", b"reply", 13),
    StartTlsResponse(14),
    ErrorResponse(Op.ADD_ENTRY, Status.EFENCED, 7, 3, "EFENCED", 15),
    ErrorResponse(Op.READ_ENTRY, Status.ENOENTRY, 7, 4, "ENOENTRY", 16),
    ErrorResponse(Op.READ_LAC, Status.ENOLEDGER, 7, -1, "ENOLEDGER", 17),
    ErrorResponse(Op.WRITE_LAC, Status.EUA, 7, -1, "EUA", 18),
    ErrorResponse(Op.GET_BOOKIE_INFO, Status.EIO, 0, -1, "EIO", 19),
]


@pytest.mark.parametrize("req", V3_REQUESTS, ids=lambda r: type(r).__name__)
def test_v3_request_round_trip(req: object) -> None:
    frame = _bk_v3.encode_request(req)  # type: ignore[arg-type]
    assert struct.unpack(">I", frame[:4])[0] == len(frame) - 4
    assert _bk_v3.decode_request(frame[4:]) == req


@pytest.mark.parametrize("resp", V3_RESPONSES, ids=lambda r: type(r).__name__)
def test_v3_response_round_trip(resp: object) -> None:
    frame = _bk_v3.encode_response(resp)  # type: ignore[arg-type]
    assert _bk_v3.decode_response(frame[4:]) == resp


@pytest.mark.parametrize("req", V3_REQUESTS, ids=lambda r: type(r).__name__)
def test_v3_error_answer_to_every_request(req: object) -> None:
    got = _bk_v3.decode_response(_bk_v3.encode_error(req, Status.ETOOMANYREQUESTS)[4:])  # type: ignore[arg-type]
    if isinstance(req, AuthMessage):  # an AUTH answer is an AuthMessage whatever its status
        assert isinstance(got, ErrorResponse) and got.status is Status.ETOOMANYREQUESTS
        return
    assert isinstance(got, ErrorResponse)
    assert got.status is Status.ETOOMANYREQUESTS and got.request_id == req.request_id  # type: ignore[attr-defined]


def test_v3_status_codes_map_both_ways() -> None:
    assert [_bk_v3.STATUS_TO_BK[s] for s in Status] == [0, 402, 403, 404, 501, 502, 503, 504, 505, 506]
    assert _bk_v3.BK_TO_STATUS[507] is Status.EIO  # EUNKNOWNLEDGERSTATE


def test_v2_status_codes_map_both_ways() -> None:
    assert [_bk_v2.STATUS_TO_V2[s] for s in Status] == [0, 1, 2, 100, 101, 102, 103, 104, 105, 106]
    assert _bk_v2.V2_TO_STATUS[107] is Status.EIO


V2_REQUESTS = [
    AddEntry(7, 3, KEY, ENTRY),
    AddEntry(7, 3, KEY, ENTRY, True),
    ReadEntry(7, 3),
    ReadEntry(7, -1),
    ReadEntry(7, 3, True, KEY),
    ReadRange(7, 3, 10, 4096, 99),
    AuthMessage("SASL", b"t"),
]
V2_RESPONSES = [
    AddEntryResponse(7, 3),
    ReadEntryResponse(7, 3, 2, ENTRY),  # the LAC comes back from the entry's header
    ReadRangeResponse(7, 3, 2, (ENTRY, ENTRY), 99),
    AuthMessage("SASL", b"r"),
    ErrorResponse(Op.ADD_ENTRY, Status.EFENCED, 7, 3, "EFENCED"),
    ErrorResponse(Op.READ_ENTRY, Status.ENOENTRY, 7, 3, "ENOENTRY"),
    ErrorResponse(Op.READ_RANGE, Status.EIO, 7, 3, "EIO", 99),
]


@pytest.mark.parametrize("req", V2_REQUESTS, ids=lambda r: type(r).__name__)
def test_v2_request_round_trip(req: object) -> None:
    frame = _bk_v2.encode_request(req)  # type: ignore[arg-type]
    assert struct.unpack(">I", frame[:4])[0] == len(frame) - 4
    assert _bk_v2.decode_request(frame[4:]) == req


@pytest.mark.parametrize("resp", V2_RESPONSES, ids=lambda r: type(r).__name__)
def test_v2_response_round_trip(resp: object) -> None:
    assert _bk_v2.decode_response(_bk_v2.encode_response(resp)[4:]) == resp  # type: ignore[arg-type]


@pytest.mark.parametrize("req", V2_REQUESTS[:-1], ids=lambda r: type(r).__name__)
def test_v2_error_answer(req: object) -> None:
    got = _bk_v2.decode_response(_bk_v2.encode_error(req, Status.EUA)[4:])  # type: ignore[arg-type]
    assert isinstance(got, ErrorResponse) and got.status is Status.EUA


def test_v2_refuses_what_v2_cannot_say() -> None:
    with pytest.raises(InvalidArgumentError):
        _bk_v2.encode_request(ReadEntry(7, 3, previous_lac=2, timeout_ms=5))  # no long polls
    with pytest.raises(InvalidArgumentError):
        _bk_v2.encode_request(AddEntry(7, 3, b"k" * 32, ENTRY))  # a 32-byte (walkit) key
    with pytest.raises(InvalidArgumentError):
        _bk_v2.encode_request(AddEntry(7, 4, KEY, ENTRY))  # the entry names entry 3
    with pytest.raises(InvalidArgumentError):
        _bk_v2.encode_request(ReadLac(7))
    with pytest.raises(InvalidArgumentError):
        _bk_v2.encode_error(AuthMessage("x", b""), Status.EUA)


# --- golden bytes ----------------------------------------------------------------------------


def test_v2_golden_fencing_read() -> None:
    # BookieProtoEncoding.RequestEnDeCoderPreV3.encode, ReadRequest: int frame size
    # (4 + 8 + 8 + 20 = 40 = 0x28), PacketHeader.toInt(2, READENTRY=2, FLAG_DO_FENCING=1)
    # = 0x02020001, long ledger, long entry, the 20-byte master key.
    key = bytes(range(20))
    golden = (bytes.fromhex("00000028" "02020001" "0000000000000007" "0000000000000003") + key)
    assert _bk_v2.encode_request(ReadEntry(7, 3, True, key)) == golden
    assert _bk_v2.decode_request(golden[4:]) == ReadEntry(7, 3, True, key)


def test_v2_golden_add_and_answer() -> None:
    # ADD: PacketHeader.toInt(2, ADDENTRY=1, FLAG_RECOVERY_ADD=2) = 0x02010002, the master
    # key, then the entry as DigestManager packs it: ledger, entry, lac, length (longs),
    # the CRC32C digest (int), the payload. The bookie reads ledger/entry from the entry.
    key = b"\xaa" * 20
    entry = (bytes.fromhex("0000000000000007" "0000000000000003" "0000000000000002" "0000000000000069")
             + struct.pack(">I", _crc32c(bytes.fromhex("0000000000000007" "0000000000000003"
                                                         "0000000000000002" "0000000000000069") + b"hello"))
             + b"hello")
    assert entry == ENTRY
    golden = struct.pack(">I", 4 + 20 + len(entry)) + bytes.fromhex("02010002") + key + entry
    assert _bk_v2.encode_request(AddEntry(7, 3, key, entry, True)) == golden
    # The answer (ResponseEnDeCoderPreV3 / serializeAddResponseInto): frame size 24,
    # header toInt(2, 1, 0), int rc (EFENCED: 104 = 0x68), long ledger, long entry.
    answer = bytes.fromhex("00000018" "02010000" "00000068" "0000000000000007" "0000000000000003")
    assert _bk_v2.encode_error(AddEntry(7, 3, key, entry, True), Status.EFENCED) == answer
    assert _bk_v2.decode_response(answer[4:]) == ErrorResponse(Op.ADD_ENTRY, Status.EFENCED, 7, 3, "EFENCED")


def _crc32c(data: bytes) -> int:
    from crc32c import crc32c

    return int(crc32c(data))


def test_v3_golden_read_lac_request() -> None:
    # Request{header(1){version(1)=VERSION_THREE 3, operation(2)=READ_LAC 7, txnId(3)=5},
    #         readLacRequest(104){ledgerId(1)=7}}
    # 0a 06 | 08 03 | 10 07 | 18 05        field 1, length 6: three varint fields
    # c2 06 02 | 08 07                    field 104 (104<<3|2 = 834 = varint c2 06), length 2
    golden = bytes.fromhex("0000000d" "0a06" "0803" "1007" "1805" "c20602" "0807")
    assert _bk_v3.encode_request(ReadLac(7, 5)) == golden
    assert _bk_v3.decode_request(golden[4:]) == ReadLac(7, 5)


def test_v3_golden_add_response() -> None:
    # Response{header{3, ADD_ENTRY 2, txnId 9}, status(2)=EOK 0,
    #          addResponse(101){status(1)=0, ledgerId(2)=7, entryId(3)=3}}
    # 101<<3|2 = 810 = varint aa 06.
    # length: 8 (header) + 2 (status) + 3 + 6 (addResponse) = 19 = 0x13
    golden = bytes.fromhex("00000013" "0a06" "0803" "1002" "1809" "1000" "aa0606" "0800" "1007" "1803")
    assert _bk_v3.encode_response(AddEntryResponse(7, 3, 9)) == golden
    assert _bk_v3.decode_response(golden[4:]) == AddEntryResponse(7, 3, 9)


# --- broken frames -------------------------------------------------------------------------


@pytest.mark.parametrize("frame", [b"", b"\x02\x01", b"\x02\x02\x00\x00" + b"\x00" * 8,
                                   bytes.fromhex("02010000") + b"k" * 19,  # key cut short
                                   bytes.fromhex("02010000") + b"k" * 20 + b"\x00" * 8,  # entry ids cut
                                   bytes.fromhex("02020001") + b"\x00" * 16 + b"k" * 5,  # fencing key cut
                                   bytes.fromhex("02020000") + b"\x00" * 17,  # trailing byte
                                   bytes.fromhex("02040000") + b"\x00" * 8,  # READ_LAC: v3 only
                                   bytes.fromhex("02630000"),  # unknown opcode 0x63
                                   bytes.fromhex("02020000") + b"\xff" * 16,  # ledger -1
                                   bytes.fromhex("02070001") + b"\x00" * 36,  # fencing batch read
                                   ])
def test_v2_bad_requests_are_protocol_errors(frame: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        _bk_v2.decode_request(frame)
    assert "bk-v2" in str(info.value)


def test_v2_other_version_is_a_version_error() -> None:
    with pytest.raises(ProtocolVersionError):
        _bk_v2.decode_request(bytes.fromhex("03020000") + b"\x00" * 16)


@pytest.mark.parametrize("frame", [b"\x00", b"\x0a\x02\x08", b"\x0a\x06\x08\x03\x10\x07\x18\x05",  # no body
                                   bytes.fromhex("0a0608031003180a"),  # RANGE_READ_ENTRY: not served
                                   bytes.fromhex("0a06080310021801"),  # ADD without addRequest
                                   bytes.fromhex("0a0608031007180bc20600"),  # readLacRequest, no ledgerId
                                   bytes.fromhex("0a0608031007180bc2060b08") + b"\xff" * 9 + b"\x01",  # ledgerId -1
                                   ])
def test_v3_bad_requests_are_protocol_errors(frame: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        _bk_v3.decode_request(frame)
    assert "bk-v3" in str(info.value)


def test_v3_truncations_of_every_request_are_protocol_errors_or_shorter_messages() -> None:
    # protobuf cannot tell a message cut at a field boundary from a shorter one (an
    # optional sub-message left out: GetBookieInfo, StartTls): the frame's length is what
    # guarantees the whole message. Every other cut is a ProtocolError.
    for req in V3_REQUESTS:
        body = _bk_v3.encode_request(req)[4:]  # type: ignore[arg-type]
        for cut in range(len(body)):
            try:
                got = _bk_v3.decode_request(body[:cut])
            except ProtocolError:
                continue
            assert isinstance(req, (GetBookieInfo, StartTls)) and got == req, (req, cut)


def test_v2_truncations_of_every_request_raise_protocol_error() -> None:
    for req in V2_REQUESTS:
        body = _bk_v2.encode_request(req)[4:]  # type: ignore[arg-type]
        for cut in range(len(body)):
            if isinstance(req, AddEntry) and cut >= 4 + 20 + 16:
                continue  # an ADD's entry runs to the frame's end: a shorter one is another entry
            with pytest.raises(ProtocolError):
                _bk_v2.decode_request(body[:cut])


def test_oversized_frames_are_refused() -> None:
    big = AddEntry(7, 3, KEY, ENTRY + b"x" * 5000)
    for codec in (_bk_v2, _bk_v3):
        with pytest.raises(FrameTooLargeError):
            codec.encode_request(big, max_frame_size=4096)
    with pytest.raises(FrameTooLargeError):
        _bk_v3.encode_response(ReadEntryResponse(7, 3, 2, b"x" * 5000), max_frame_size=4096)


def test_messages_a_dialect_cannot_carry() -> None:
    with pytest.raises(InvalidArgumentError):
        _bk_v3.encode_response(ReadRangeResponse(7, 3, 2, (ENTRY,)))
    with pytest.raises(InvalidArgumentError):
        _bk_v2.encode_response(BookieInfoResponse(1, 2, False))


# --- fuzzing -------------------------------------------------------------------------------


@FAST
@given(st.binary(max_size=200))
def test_fuzz_v3_decoders_raise_only_protocol_error(data: bytes) -> None:
    for decode in (_bk_v3.decode_request, _bk_v3.decode_response):
        try:
            decode(data)
        except ProtocolError:
            pass


@FAST
@given(st.binary(max_size=200))
def test_fuzz_v2_decoders_raise_only_protocol_error(data: bytes) -> None:
    for frame in (data, bytes([2]) + data):
        for decode in (_bk_v2.decode_request, _bk_v2.decode_response):
            try:
                decode(frame)
            except ProtocolError:
                pass


@FAST
@given(st.sampled_from(V3_REQUESTS + V3_RESPONSES), st.integers(0, 300), st.integers(0, 255))
def test_fuzz_v3_mutated_frames(msg: object, at: int, byte: int) -> None:
    encode = _bk_v3.encode_request if msg in V3_REQUESTS else _bk_v3.encode_response
    body = bytearray(encode(msg)[4:])  # type: ignore[operator]
    body[at % len(body)] = byte
    for decode in (_bk_v3.decode_request, _bk_v3.decode_response):
        try:
            decode(bytes(body))
        except ProtocolError:
            pass


@FAST
@given(st.sampled_from(V2_REQUESTS + V2_RESPONSES), st.integers(0, 300), st.integers(0, 255))
def test_fuzz_v2_mutated_frames(msg: object, at: int, byte: int) -> None:
    encode = _bk_v2.encode_request if msg in V2_REQUESTS else _bk_v2.encode_response
    body = bytearray(encode(msg)[4:])  # type: ignore[operator]
    body[at % len(body)] = byte
    for decode in (_bk_v2.decode_request, _bk_v2.decode_response):
        try:
            decode(bytes(body))
        except ProtocolError:
            pass


@FAST
@given(st.integers(0, 2**63 - 1), st.integers(-1, 2**63 - 1), st.integers(0, 2**64 - 1), st.booleans())
def test_fuzz_v3_read_round_trip(ledger: int, entry: int, txn: int, fence: bool) -> None:
    req = ReadEntry(ledger, entry, fence, KEY if fence else b"", request_id=txn)
    assert _bk_v3.decode_request(_bk_v3.encode_request(req)[4:]) == req


@FAST
@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), st.binary(max_size=64), st.booleans(),
       st.sampled_from(list(BkDigestType)))
def test_fuzz_add_round_trip_both_dialects(ledger: int, entry: int, payload: bytes, recovery: bool,
                                           digest: BkDigestType) -> None:
    data = bk_encode_entry(ledger, entry, entry - 1, len(payload), payload, digest=digest, password=b"pw")
    req = AddEntry(ledger, entry, KEY, data, recovery)
    assert _bk_v2.decode_request(_bk_v2.encode_request(req)[4:]) == req
    assert _bk_v3.decode_request(_bk_v3.encode_request(req)[4:]) == req
    assert bk_decode_entry(req.data, digest=digest, password=b"pw") == ((ledger, entry, entry - 1, len(payload)),
                                                                        payload)


# --- dialect detection ---------------------------------------------------------------------


@pytest.mark.parametrize("req", [ReadLac(1), ReadEntry(1, 2), AddEntry(7, 3, KEY, ENTRY)],
                         ids=lambda r: type(r).__name__)
def test_detect_dialect(req: object) -> None:
    assert detect_dialect(_codec.encode_request(req)[4:]) is Dialect.WALKIT  # type: ignore[arg-type]
    assert detect_dialect(_bk_v3.encode_request(req)[4:]) is Dialect.BK_V3  # type: ignore[arg-type]
    if not isinstance(req, ReadLac):
        assert detect_dialect(_bk_v2.encode_request(req)[4:]) is Dialect.BK_V2  # type: ignore[arg-type]
    assert codec_for(Dialect.BK_V3) is _bk_v3 and codec_for(Dialect.BK_V2) is _bk_v2
    assert codec_for(Dialect.WALKIT) is _codec


@pytest.mark.parametrize("req", V2_REQUESTS, ids=lambda r: type(r).__name__)
def test_no_v2_frame_parses_as_v3(req: object) -> None:
    with pytest.raises(ProtocolError):
        _bk_v3.decode_request(_bk_v2.encode_request(req)[4:])  # type: ignore[arg-type]


@pytest.mark.parametrize("frame", [b"", b"\x00\x01", b"\x0a\x00", b"\x7f"])
def test_detect_dialect_refuses_the_unknown(frame: bytes) -> None:
    with pytest.raises(ProtocolError):
        detect_dialect(frame)


# --- generated code ------------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools not installed")
def test_generated_pb2_matches_the_proto() -> None:
    from walkit.protocol import gen_proto

    assert gen_proto.OUTPUT.read_text(encoding="utf-8") == gen_proto.generate(), (
        "run: python -m walkit.protocol.gen_proto")
