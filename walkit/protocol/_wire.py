"""The bookie wire protocol, sans-IO: frames, messages, per-connection state
(docs/format.md, "Wire protocol").

::

    0        4     5      6       8             16
    +--------+-----+------+-------+-------------+--------+
    | length | ver | kind | flags | request id  |  body  |
    |  u32   | u8  |  u8  |  u16  |     u64     |        |
    +--------+-----+------+-------+-------------+--------+

Big-endian (network order). ``length`` counts the bytes after itself (the 12 header bytes
and the body); a whole frame, length field included, is at most ``max_frame_size`` bytes.
A request's ``kind`` is its :class:`Op`, a response's ``0x80 | op``; requests carry
:class:`Flag` bits in the flags field, responses a :class:`Status` there.

Theory of operation. Nothing here touches a socket, a thread or an event loop: bytes go
in, messages come out (h11-style). :class:`FrameDecoder` cuts a byte stream into frames;
a bad length prefix is fatal because the stream cannot be resynchronized. Inside an
intact frame, anything wrong (op, flags, lengths, ranges) is a :class:`ProtocolError`
naming the op, the request id and the reason, and nothing else ever escapes decoding.
:class:`ServerConnection` turns such a frame into an :class:`ErrorResponse` (EBADREQ) to
send back and stays usable; another protocol version gets EBADVERSION and the connection
closes. :class:`ClientConnection` numbers requests 1, 2, 3, ... and matches responses by
id, in any order; a response nobody asked for is fatal. Messages are frozen dataclasses
checked when built (:class:`InvalidArgumentError`), so an invalid message cannot exist,
and decoding reuses those checks.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from walkit.errors import (
    BookieBusyError,
    BookieError,
    BookieReadOnlyError,
    EntryTooLargeError,
    FrameTooLargeError,
    InvalidArgumentError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ProtocolError,
    ProtocolVersionError,
    UnauthorizedError,
    WalkitError,
)
from walkit.protocol._codes import (
    DEFAULT_MAX_FRAME_SIZE,
    HEADER_SIZE,
    MAX_KEY_SIZE,
    MAX_MESSAGE_SIZE,
    MIN_MAX_FRAME_SIZE,
    PROTOCOL_VERSION,
    Flag,
    Op,
    Status,
)
from walkit.protocol._admin import AdminRequest, AdminResponse, dec_admin, dec_admin_resp, enc_admin, enc_admin_resp
from walkit.protocol._range import ReadRange, ReadRangeResponse, dec_range, dec_range_resp, enc_range, enc_range_resp

__all__ = [
    "AddEntry",
    "ReadEntry",
    "ReadLac",
    "WriteLac",
    "GetBookieInfo",
    "AdminRequest",
    "AdminResponse",
    "ReadRange",
    "ReadRangeResponse",
    "Request",
    "AddEntryResponse",
    "ReadEntryResponse",
    "ReadLacResponse",
    "WriteLacResponse",
    "BookieInfoResponse",
    "ErrorResponse",
    "Response",
    "encode_request",
    "encode_response",
    "decode_request",
    "decode_response",
    "status_for",
    "error_for",
    "FrameDecoder",
    "ServerConnection",
    "ClientConnection",
]

_I63 = 2**63 - 1
_U64 = 2**64 - 1
_U32 = 2**32 - 1
Buffer: TypeAlias = bytes | bytearray | memoryview


_OPS = {op.value: op for op in Op}
_STATUSES = {s.value: s for s in Status}
_MAX_OP = max(_OPS)
_MAX_STATUS = max(_STATUSES)
# plain ints: ~ of an IntFlag member stays inside the known bits (3.11), hiding unknown ones
_RECOVERY_ADD, _FENCE, _LONG_POLL = int(Flag.RECOVERY_ADD), int(Flag.FENCE), int(Flag.LONG_POLL)


# --- field checks (construction) ---------------------------------------------------------


def _bad_field(name: str, value: object) -> InvalidArgumentError:
    shown = f"{len(value)} bytes" if isinstance(value, bytes) else repr(value)[:80]
    return InvalidArgumentError(
        f"{name} out of range or of the wrong type", field=name, value=shown, type=type(value).__name__
    )


def _int(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or not low <= value <= high:
        raise _bad_field(name, value)


def _key(value: object, *, required: bool) -> None:
    if not isinstance(value, bytes) or len(value) > MAX_KEY_SIZE or (required and not value):
        raise _bad_field("master_key", value)


def _bytes(name: str, value: object) -> None:
    if not isinstance(value, bytes):
        raise _bad_field(name, value)


def _bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise _bad_field(name, value)


# --- messages ----------------------------------------------------------------------------


# The entry path's messages (AddEntry, AddEntryResponse, ReadEntryResponse) have a
# hand-written __init__: the generated frozen one (object.__setattr__ per field) plus a
# call per field check cost ~3 us; one combined test and __dict__ stores cost ~1 us. The
# per-field checks in _check() run only when that test fails, to name the bad field.


@dataclass(frozen=True, init=False)
class AddEntry:
    ledger_id: int
    entry_id: int
    master_key: bytes
    data: bytes  # the encoded entry (walkit.protocol._entry)
    recovery: bool = False
    request_id: int = 0

    def __init__(
        self, ledger_id: int, entry_id: int, master_key: bytes, data: bytes, recovery: bool = False,
        request_id: int = 0,
    ) -> None:
        fields = self.__dict__
        fields["ledger_id"], fields["entry_id"], fields["master_key"] = ledger_id, entry_id, master_key
        fields["data"], fields["recovery"], fields["request_id"] = data, recovery, request_id
        if not (
            isinstance(ledger_id, int) and 0 <= ledger_id <= _I63 and isinstance(entry_id, int)
            and 0 <= entry_id <= _I63 and isinstance(master_key, bytes) and len(master_key) <= MAX_KEY_SIZE
            and isinstance(data, bytes) and isinstance(recovery, bool) and isinstance(request_id, int)
            and 0 <= request_id <= _U64
        ):
            self._check()

    def _check(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("entry_id", self.entry_id, 0, _I63)
        _key(self.master_key, required=False)
        _bytes("data", self.data)
        _bool("recovery", self.recovery)
        _int("request_id", self.request_id, 0, _U64)
        raise InvalidArgumentError("invalid AddEntry")  # unreachable unless the two checks disagree


_new = object.__new__


def _trusted_add(ledger_id: int, entry_id: int, master_key: bytes, data: bytes, recovery: bool,
                 request_id: int) -> AddEntry:
    """An AddEntry whose fields the caller already checked (the server's decode of an
    ADD_ENTRY frame: the frame layout fixes the types, the decoder the ranges), without
    running the constructor's test again: ~0.5 us less per add."""
    req: AddEntry = _new(AddEntry)
    fields = req.__dict__
    fields["ledger_id"], fields["entry_id"], fields["master_key"] = ledger_id, entry_id, master_key
    fields["data"], fields["recovery"], fields["request_id"] = data, recovery, request_id
    return req


@dataclass(frozen=True)
class ReadEntry:
    ledger_id: int
    entry_id: int  # -1: the last entry the bookie stores
    fence: bool = False
    master_key: bytes = b""  # non-empty iff fence
    previous_lac: int | None = None  # not None: a long poll
    timeout_ms: int = 0  # long polls only
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("entry_id", self.entry_id, -1, _I63)
        _bool("fence", self.fence)
        _key(self.master_key, required=self.fence)
        if self.master_key and not self.fence:
            raise InvalidArgumentError("a master key is sent only with fence", ledger=self.ledger_id)
        if self.previous_lac is None:
            _int("timeout_ms", self.timeout_ms, 0, 0)
        else:
            _int("previous_lac", self.previous_lac, -1, _I63)
            _int("timeout_ms", self.timeout_ms, 0, _U32)
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class ReadLac:
    ledger_id: int
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class WriteLac:
    ledger_id: int
    lac: int
    master_key: bytes
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("lac", self.lac, -1, _I63)
        _key(self.master_key, required=True)
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class GetBookieInfo:
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True, init=False)
class AddEntryResponse:
    ledger_id: int
    entry_id: int
    request_id: int = 0

    def __init__(self, ledger_id: int, entry_id: int, request_id: int = 0) -> None:
        fields = self.__dict__
        fields["ledger_id"], fields["entry_id"], fields["request_id"] = ledger_id, entry_id, request_id
        if not (
            isinstance(ledger_id, int) and 0 <= ledger_id <= _I63 and isinstance(entry_id, int)
            and 0 <= entry_id <= _I63 and isinstance(request_id, int) and 0 <= request_id <= _U64
        ):
            self._check()

    def _check(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("entry_id", self.entry_id, 0, _I63)
        _int("request_id", self.request_id, 0, _U64)
        raise InvalidArgumentError("invalid AddEntryResponse")


def _trusted_added(ledger_id: int, entry_id: int, request_id: int) -> AddEntryResponse:
    """An AddEntryResponse whose fields the caller already checked (see _trusted_add)."""
    resp: AddEntryResponse = _new(AddEntryResponse)
    fields = resp.__dict__
    fields["ledger_id"], fields["entry_id"], fields["request_id"] = ledger_id, entry_id, request_id
    return resp


@dataclass(frozen=True, init=False)
class ReadEntryResponse:
    ledger_id: int
    entry_id: int  # the entry actually read (never -1)
    lac: int  # the bookie's LAC for the ledger when it answered
    data: bytes  # the stored entry
    request_id: int = 0

    def __init__(self, ledger_id: int, entry_id: int, lac: int, data: bytes, request_id: int = 0) -> None:
        fields = self.__dict__
        fields["ledger_id"], fields["entry_id"], fields["lac"] = ledger_id, entry_id, lac
        fields["data"], fields["request_id"] = data, request_id
        if not (
            isinstance(ledger_id, int) and 0 <= ledger_id <= _I63 and isinstance(entry_id, int)
            and 0 <= entry_id <= _I63 and isinstance(lac, int) and -1 <= lac <= _I63
            and isinstance(data, bytes) and isinstance(request_id, int) and 0 <= request_id <= _U64
        ):
            self._check()

    def _check(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("entry_id", self.entry_id, 0, _I63)
        _int("lac", self.lac, -1, _I63)
        _bytes("data", self.data)
        _int("request_id", self.request_id, 0, _U64)
        raise InvalidArgumentError("invalid ReadEntryResponse")


@dataclass(frozen=True)
class ReadLacResponse:
    ledger_id: int
    lac: int
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("lac", self.lac, -1, _I63)
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class WriteLacResponse:
    ledger_id: int
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class BookieInfoResponse:
    free_bytes: int
    total_bytes: int
    readonly: bool
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("free_bytes", self.free_bytes, 0, _U64)
        _int("total_bytes", self.total_bytes, 0, _U64)
        _bool("readonly", self.readonly)
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class ErrorResponse:
    """Any op's answer when status != EOK. ``message`` is cut to 1024 UTF-8 bytes on the wire."""

    op: Op
    status: Status
    ledger_id: int = 0
    entry_id: int = -1
    message: str = ""
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("op", self.op, 0, _MAX_OP)
        _int("status", self.status, 1, _MAX_STATUS)
        self.__dict__["op"], self.__dict__["status"] = _OPS[self.op], _STATUSES[self.status]
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("entry_id", self.entry_id, -1, _I63)
        if not isinstance(self.message, str):
            raise _bad_field("message", self.message)
        _int("request_id", self.request_id, 0, _U64)


Request: TypeAlias = AddEntry | ReadEntry | ReadLac | WriteLac | GetBookieInfo | AdminRequest | ReadRange
Response: TypeAlias = (
    AddEntryResponse | ReadEntryResponse | ReadLacResponse | WriteLacResponse | BookieInfoResponse | AdminResponse
    | ReadRangeResponse | ErrorResponse
)

_REQUEST_OP: dict[type[Any], Op] = {
    AddEntry: Op.ADD_ENTRY,
    ReadEntry: Op.READ_ENTRY,
    ReadLac: Op.READ_LAC,
    WriteLac: Op.WRITE_LAC,
    GetBookieInfo: Op.GET_BOOKIE_INFO,
    AdminRequest: Op.ADMIN,
    ReadRange: Op.READ_RANGE,
}
_RESPONSE_OP: dict[type[Any], Op] = {
    AddEntryResponse: Op.ADD_ENTRY,
    ReadEntryResponse: Op.READ_ENTRY,
    ReadLacResponse: Op.READ_LAC,
    WriteLacResponse: Op.WRITE_LAC,
    BookieInfoResponse: Op.GET_BOOKIE_INFO,
    AdminResponse: Op.ADMIN,
    ReadRangeResponse: Op.READ_RANGE,
}


def _response_op(resp: Response) -> Op:
    return resp.op if isinstance(resp, ErrorResponse) else _RESPONSE_OP[type(resp)]


# --- encoding ----------------------------------------------------------------------------
# Each Struct packs a whole frame's fixed part: length, version, kind (requests: the op,
# responses: 0x80 | op), flags or status, request id, then the body's fixed fields. The
# length counts 12 header bytes + body: 29 = 12 + ledger, entry (or lac), key length.

_LENGTH = struct.Struct(">I")
_HEAD = struct.Struct(">BBHQ")
_FRAME = struct.Struct(">IBBHQ")
_ADD_REQ = struct.Struct(">IBBHQQQB")  # + key + data
_READ_REQ = struct.Struct(">IBBHQQqB")  # + key [+ _POLL]
_POLL = struct.Struct(">qI")
_LEDGER_REQ = struct.Struct(">IBBHQQ")
_WRITE_LAC_REQ = struct.Struct(">IBBHQQqB")  # + key
_ADD_RESP = struct.Struct(">IBBHQQQ")
_READ_RESP = struct.Struct(">IBBHQQqq")  # + data
_LAC_RESP = struct.Struct(">IBBHQQq")
_INFO_RESP = struct.Struct(">IBBHQQQB")
_ERROR_RESP = struct.Struct(">IBBHQQq")  # + message
_V = PROTOCOL_VERSION


def _enc_add(r: AddEntry, rid: int) -> bytes:
    key, data = r.master_key, r.data
    flags = _RECOVERY_ADD if r.recovery else 0
    head = _ADD_REQ.pack(29 + len(key) + len(data), _V, 1, flags, rid, r.ledger_id, r.entry_id, len(key))
    return b"".join((head, key, data))


def _enc_read(r: ReadEntry, rid: int) -> bytes:
    key = r.master_key
    flags = _FENCE if r.fence else 0
    poll = b""
    if r.previous_lac is not None:
        flags |= _LONG_POLL
        poll = _POLL.pack(r.previous_lac, r.timeout_ms)
    head = _READ_REQ.pack(29 + len(key) + len(poll), _V, 2, flags, rid, r.ledger_id, r.entry_id, len(key))
    return head + key + poll


def _enc_read_lac(r: ReadLac, rid: int) -> bytes:
    return _LEDGER_REQ.pack(20, _V, 3, 0, rid, r.ledger_id)


def _enc_write_lac(r: WriteLac, rid: int) -> bytes:
    key = r.master_key
    return _WRITE_LAC_REQ.pack(29 + len(key), _V, 4, 0, rid, r.ledger_id, r.lac, len(key)) + key


def _enc_info(r: GetBookieInfo, rid: int) -> bytes:
    return _FRAME.pack(12, _V, 5, 0, rid)


def _enc_add_resp(r: AddEntryResponse, rid: int) -> bytes:
    return _add_resp_frame(r.ledger_id, r.entry_id, rid)


def _add_resp_frame(ledger_id: int, entry_id: int, rid: int) -> bytes:
    return _ADD_RESP.pack(28, _V, 0x81, 0, rid, ledger_id, entry_id)


def _enc_read_resp(r: ReadEntryResponse, rid: int) -> bytes:
    head = _READ_RESP.pack(36 + len(r.data), _V, 0x82, 0, rid, r.ledger_id, r.entry_id, r.lac)
    return b"".join((head, r.data))


def _enc_read_lac_resp(r: ReadLacResponse, rid: int) -> bytes:
    return _LAC_RESP.pack(28, _V, 0x83, 0, rid, r.ledger_id, r.lac)


def _enc_write_lac_resp(r: WriteLacResponse, rid: int) -> bytes:
    return _LEDGER_REQ.pack(20, _V, 0x84, 0, rid, r.ledger_id)


def _enc_info_resp(r: BookieInfoResponse, rid: int) -> bytes:
    return _INFO_RESP.pack(29, _V, 0x85, 0, rid, r.free_bytes, r.total_bytes, 1 if r.readonly else 0)


def _message_bytes(message: str) -> bytes:
    raw = message.encode("utf-8", "replace")
    if len(raw) > MAX_MESSAGE_SIZE:  # cut, then drop a character split by the cut
        raw = raw[:MAX_MESSAGE_SIZE].decode("utf-8", "ignore").encode("utf-8")
    return raw


def _enc_error(r: ErrorResponse, rid: int) -> bytes:
    msg = _message_bytes(r.message)
    return _ERROR_RESP.pack(28 + len(msg), _V, 0x80 | r.op, r.status, rid, r.ledger_id, r.entry_id) + msg


_Encoder: TypeAlias = Callable[[Any, int], bytes]
_REQUEST_ENCODERS: dict[type[Any], _Encoder] = {
    AddEntry: _enc_add,
    ReadEntry: _enc_read,
    ReadLac: _enc_read_lac,
    WriteLac: _enc_write_lac,
    GetBookieInfo: _enc_info,
    AdminRequest: lambda r, rid: enc_admin(r, rid, _V),
    ReadRange: lambda r, rid: enc_range(r, rid, _V),
}
_RESPONSE_ENCODERS: dict[type[Any], _Encoder] = {
    AddEntryResponse: _enc_add_resp,
    ReadEntryResponse: _enc_read_resp,
    ReadLacResponse: _enc_read_lac_resp,
    WriteLacResponse: _enc_write_lac_resp,
    BookieInfoResponse: _enc_info_resp,
    AdminResponse: lambda r, rid: enc_admin_resp(r, rid, _V),
    ReadRangeResponse: lambda r, rid: enc_range_resp(r, rid, _V),
    ErrorResponse: _enc_error,
}


def _encode(table: dict[type[Any], _Encoder], msg: Request | Response, max_frame_size: int, rid: int | None) -> bytes:
    encoder = table.get(type(msg))
    if encoder is None:
        raise InvalidArgumentError("not a message of this direction", type=type(msg).__name__)
    if rid is None:
        rid = msg.request_id
    try:
        frame = encoder(msg, rid)
    except struct.error as exc:  # only a length past u32 can fail: every field was checked when built
        raise FrameTooLargeError("frame length does not fit in u32", type=type(msg).__name__) from exc
    if len(frame) > max_frame_size:
        raise FrameTooLargeError(
            "frame over the maximum frame size",
            type=type(msg).__name__, request_id=rid, frame_size=len(frame), max_frame_size=max_frame_size,
        )
    return frame


def encode_request(req: Request, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """The whole frame, length prefix included (FrameTooLargeError past max_frame_size)."""
    return _encode(_REQUEST_ENCODERS, req, max_frame_size, None)


def encode_response(resp: Response, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """The whole frame, length prefix included (FrameTooLargeError past max_frame_size)."""
    return _encode(_RESPONSE_ENCODERS, resp, max_frame_size, None)


# --- decoding ----------------------------------------------------------------------------
# Decoders get the frame after its length prefix (bytes, >= 12 long), its size, the
# flags/status field and the request id; they check structure, the constructors ranges.

_ADD_BODY = struct.Struct(">QQB")
_ADD_HEAD = struct.Struct(">BBHQQQB")  # an ADD_ENTRY frame after its length: header + body
_READ_BODY = struct.Struct(">QqB")
_LEDGER = struct.Struct(">Q")
_LEDGER_LAC = struct.Struct(">Qq")
_LEDGER_LAC_KEY = struct.Struct(">QqB")
_ADD_RESP_BODY = struct.Struct(">QQ")
_READ_RESP_BODY = struct.Struct(">Qqq")
_INFO_BODY = struct.Struct(">QQB")


class _Malformed(Exception):
    """A fault inside one intact frame; becomes a ProtocolError naming op and request id."""


def _flags_fault(flags: int) -> _Malformed:
    return _Malformed(f"flags 0x{flags:04x} not allowed for this op")


def _size_fault(n: int, expected: str) -> _Malformed:
    return _Malformed(f"body of {n - HEADER_SIZE} bytes, expected {expected}")


def _keyed(frame: bytes, n: int, klen: int) -> tuple[bytes, int]:
    """The master key after the 29 fixed bytes of a keyed request, and where it ends."""
    end = 29 + klen
    if klen > MAX_KEY_SIZE or end > n:
        raise _Malformed(f"master key length {klen} over {MAX_KEY_SIZE} or past the end of the frame")
    return frame[29:end], end


def _dec_add(frame: bytes, n: int, flags: int, rid: int) -> AddEntry:
    if flags & ~_RECOVERY_ADD:
        raise _flags_fault(flags)
    if n < 29:
        raise _size_fault(n, "at least 17")
    ledger, entry, klen = _ADD_BODY.unpack_from(frame, 12)
    key, end = _keyed(frame, n, klen)
    return AddEntry(ledger, entry, key, frame[end:], flags == _RECOVERY_ADD, rid)


def _dec_read(frame: bytes, n: int, flags: int, rid: int) -> ReadEntry:
    if flags & ~(_FENCE | _LONG_POLL):
        raise _flags_fault(flags)
    if n < 29:
        raise _size_fault(n, "at least 17")
    ledger, entry, klen = _READ_BODY.unpack_from(frame, 12)
    key, end = _keyed(frame, n, klen)
    fence = bool(flags & _FENCE)
    if not flags & _LONG_POLL:
        if end != n:
            raise _size_fault(n, f"{end - HEADER_SIZE} (no long poll)")
        return ReadEntry(ledger, entry, fence, key, None, 0, rid)
    if end + _POLL.size != n:
        raise _size_fault(n, f"{end + _POLL.size - HEADER_SIZE} (long poll)")
    previous_lac, timeout_ms = _POLL.unpack_from(frame, end)
    return ReadEntry(ledger, entry, fence, key, previous_lac, timeout_ms, rid)


def _dec_read_lac(frame: bytes, n: int, flags: int, rid: int) -> ReadLac:
    if flags:
        raise _flags_fault(flags)
    if n != 20:
        raise _size_fault(n, "8")
    return ReadLac(_LEDGER.unpack_from(frame, 12)[0], rid)


def _dec_write_lac(frame: bytes, n: int, flags: int, rid: int) -> WriteLac:
    if flags:
        raise _flags_fault(flags)
    if n < 29:
        raise _size_fault(n, "at least 17")
    ledger, lac, klen = _LEDGER_LAC_KEY.unpack_from(frame, 12)
    key, end = _keyed(frame, n, klen)
    if end != n:
        raise _size_fault(n, f"{end - HEADER_SIZE}")
    return WriteLac(ledger, lac, key, rid)


def _dec_info(frame: bytes, n: int, flags: int, rid: int) -> GetBookieInfo:
    if flags:
        raise _flags_fault(flags)
    if n != 12:
        raise _size_fault(n, "0")
    return GetBookieInfo(rid)


def _dec_add_resp(frame: bytes, n: int, rid: int) -> AddEntryResponse:
    if n != 28:
        raise _size_fault(n, "16")
    ledger, entry = _ADD_RESP_BODY.unpack_from(frame, 12)
    return AddEntryResponse(ledger, entry, rid)


def _dec_read_resp(frame: bytes, n: int, rid: int) -> ReadEntryResponse:
    if n < 36:
        raise _size_fault(n, "at least 24")
    ledger, entry, lac = _READ_RESP_BODY.unpack_from(frame, 12)
    return ReadEntryResponse(ledger, entry, lac, frame[36:], rid)


def _dec_read_lac_resp(frame: bytes, n: int, rid: int) -> ReadLacResponse:
    if n != 28:
        raise _size_fault(n, "16")
    ledger, lac = _LEDGER_LAC.unpack_from(frame, 12)
    return ReadLacResponse(ledger, lac, rid)


def _dec_write_lac_resp(frame: bytes, n: int, rid: int) -> WriteLacResponse:
    if n != 20:
        raise _size_fault(n, "8")
    return WriteLacResponse(_LEDGER.unpack_from(frame, 12)[0], rid)


def _dec_info_resp(frame: bytes, n: int, rid: int) -> BookieInfoResponse:
    if n != 29:
        raise _size_fault(n, "17")
    free, total, readonly = _INFO_BODY.unpack_from(frame, 12)
    if readonly > 1:
        raise _Malformed(f"readonly byte {readonly} is not 0 or 1")
    return BookieInfoResponse(free, total, readonly == 1, rid)


def _dec_error(frame: bytes, n: int, op: Op, status: Status, rid: int) -> ErrorResponse:
    if not 28 <= n <= 28 + MAX_MESSAGE_SIZE:
        raise _size_fault(n, f"16 to {16 + MAX_MESSAGE_SIZE} (error body)")
    ledger, entry = _LEDGER_LAC.unpack_from(frame, 12)
    return ErrorResponse(op, status, ledger, entry, frame[28:].decode("utf-8", "replace"), rid)


_RequestDecoder: TypeAlias = Callable[[bytes, int, int, int], Request]
_REQUEST_DECODERS: dict[int, _RequestDecoder] = {
    Op.ADD_ENTRY: _dec_add,
    Op.READ_ENTRY: _dec_read,
    Op.READ_LAC: _dec_read_lac,
    Op.WRITE_LAC: _dec_write_lac,
    Op.GET_BOOKIE_INFO: _dec_info,
    Op.ADMIN: dec_admin,
    Op.READ_RANGE: dec_range,
}
_ResponseDecoder: TypeAlias = Callable[[Any, int, int], Response]  # bytes; a memoryview for READ_RANGE
_RANGE_ANSWER = 0x80 | Op.READ_RANGE
_RESPONSE_DECODERS: dict[int, _ResponseDecoder] = {
    0x80 | Op.ADD_ENTRY: _dec_add_resp,
    0x80 | Op.READ_ENTRY: _dec_read_resp,
    0x80 | Op.READ_LAC: _dec_read_lac_resp,
    0x80 | Op.WRITE_LAC: _dec_write_lac_resp,
    0x80 | Op.GET_BOOKIE_INFO: _dec_info_resp,
    0x80 | Op.ADMIN: dec_admin_resp,
    0x80 | Op.READ_RANGE: dec_range_resp,
}


def _kind_name(kind: int) -> str:
    op = _OPS.get(kind & 0x7F)
    if op is None or (op is Op.INVALID):
        return f"0x{kind:02x}"
    return op.name if kind < 0x80 else f"{op.name}_RESPONSE"


def _header(frame: Buffer) -> tuple[int, int, int, int]:
    if len(frame) < HEADER_SIZE:
        raise ProtocolError("frame shorter than its header", size=len(frame), reason="truncated header")
    version, kind, field, rid = _HEAD.unpack_from(frame)
    return version, kind, field, rid


def decode_request(frame: Buffer) -> Request:
    """A request from a frame without its length prefix; ProtocolError if it is not one."""
    version, kind, flags, rid = _header(frame)
    data = frame if type(frame) is bytes else bytes(frame)  # what a request carries outlives the buffer
    if version != PROTOCOL_VERSION:
        raise ProtocolVersionError(
            f"client speaks protocol version {version}, this bookie version {PROTOCOL_VERSION}",
            op=_kind_name(kind), request_id=rid, reason="protocol version",
        )
    decoder = _REQUEST_DECODERS.get(kind)
    try:
        if decoder is None:
            raise _Malformed(f"kind 0x{kind:02x} is no request op")
        return decoder(data, len(data), flags, rid)
    except (_Malformed, InvalidArgumentError, struct.error) as exc:
        raise ProtocolError("invalid request", op=_kind_name(kind), request_id=rid, reason=str(exc)) from exc


def decode_response(frame: Buffer) -> Response:
    """A response from a frame without its length prefix; ProtocolError if it is not one.
    A READ_RANGE answer given as a memoryview of ``bytes`` is decoded from it as it is,
    its entries views of it (no copy of a megabyte's frame, nor of each entry: bytes
    never change, :class:`ClientConnection` gives such views). Anything else - another
    answer, a view of a mutable buffer - is read from a copy."""
    version, kind, status, rid = _header(frame)
    if version != PROTOCOL_VERSION:
        raise ProtocolVersionError(
            f"bookie speaks protocol version {version}, this client version {PROTOCOL_VERSION}",
            op=_kind_name(kind), request_id=rid, reason="protocol version",
        )
    try:
        if status:
            op, known = _OPS.get(kind & 0x7F), _STATUSES.get(status)
            if not kind & 0x80 or op is None or known is None:
                raise _Malformed(f"kind 0x{kind:02x} with status {status} is no error response")
            raw = frame if type(frame) is bytes else bytes(frame)
            return _dec_error(raw, len(raw), op, known, rid)
        decoder = _RESPONSE_DECODERS.get(kind)
        if decoder is None:
            raise _Malformed(f"kind 0x{kind:02x} is no response to an op")
        view = kind == _RANGE_ANSWER and type(frame) is memoryview and type(frame.obj) is bytes
        data = frame if type(frame) is bytes or view else bytes(frame)
        return decoder(data, len(data), rid)
    except (_Malformed, InvalidArgumentError, struct.error) as exc:
        raise ProtocolError("invalid response", op=_kind_name(kind), request_id=rid, reason=str(exc)) from exc


# --- errors <-> status -------------------------------------------------------------------

_STATUS_OF: tuple[tuple[type[BaseException], Status], ...] = (
    (NoSuchLedgerError, Status.ENOLEDGER),
    (NoSuchEntryError, Status.ENOENTRY),
    (ProtocolVersionError, Status.EBADVERSION),  # before its base, ProtocolError
    (ProtocolError, Status.EBADREQ),
    (InvalidArgumentError, Status.EBADREQ),
    (EntryTooLargeError, Status.EBADREQ),
    (UnauthorizedError, Status.EUA),
    (LedgerFencedError, Status.EFENCED),
    (BookieReadOnlyError, Status.EREADONLY),  # both before the EIO default for BookieError
    (BookieBusyError, Status.ETOOMANYREQUESTS),
)
_ERROR_OF: dict[Status, type[WalkitError]] = {
    Status.ENOLEDGER: NoSuchLedgerError,
    Status.ENOENTRY: NoSuchEntryError,
    Status.EBADREQ: ProtocolError,
    Status.EIO: BookieError,
    Status.EUA: UnauthorizedError,
    Status.EBADVERSION: ProtocolVersionError,
    Status.EFENCED: LedgerFencedError,
    Status.EREADONLY: BookieReadOnlyError,
    Status.ETOOMANYREQUESTS: BookieBusyError,
}


def status_for(exc: BaseException) -> Status:
    """The status a bookie answers with when handling a request raised ``exc``."""
    for cls, status in _STATUS_OF:
        if isinstance(exc, cls):
            return status
    return Status.EIO


def error_for(resp: ErrorResponse) -> WalkitError:
    """The error a client raises for an error response (inverse of :func:`status_for`)."""
    cls = _ERROR_OF[resp.status]
    return cls(resp.message or resp.status.name, ledger=resp.ledger_id, entry=resp.entry_id, op=resp.op.name,
               status=resp.status.name)


# --- framing and connections -------------------------------------------------------------


class FrameDecoder:
    """Cuts a byte stream into frames (returned without their length prefix).

    Holds at most one partial frame. A length prefix below 12 or past the maximum is
    raised at once (before its body arrives) and again on every later feed: the stream
    cannot be resynchronized, the connection must close.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        _int("max_frame_size", max_frame_size, MIN_MAX_FRAME_SIZE, _U32)
        self.max_frame_size = max_frame_size
        self._limit = max_frame_size - 4  # the largest length field
        self._buf = bytearray()
        self._error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held back."""
        return len(self._buf)

    def feed(self, data: Buffer) -> list[bytes]:
        """Complete frames in ``data`` (and what was buffered before it). On a bad length
        the frames before it in the same call are dropped with the raise (see split())."""
        frames, error = self.split(data)
        if error is not None:
            raise error
        return frames

    def split(self, data: Buffer) -> tuple[list[bytes], ProtocolError | None]:
        """Like :meth:`feed`, but hands back the frames before a bad length with the error."""
        if self._error is not None:
            return [], self._error
        buf = self._buf
        if buf:
            buf += data
            frames, end = self._scan(buf)
            del buf[:end]  # moves only the partial frame's bytes, each at most once
        else:
            frames, end = self._scan(data)
            if end < len(data):
                buf += memoryview(data)[end:]
        return frames, self._error

    def join(self, data: Buffer) -> bytes:
        """The bytes held back followed by ``data``, as one ``bytes`` (no copy when
        nothing was held back and ``data`` is bytes); the buffer is emptied. For a
        reader that cuts frames itself: it hands back what it did not use with
        :meth:`keep` and a bad length prefix with :meth:`refuse`. While the frame held
        back is still incomplete with ``data``, ``data`` is held back too and the result
        is empty (nothing to cut yet)."""
        buf = self._buf
        if not buf:
            return data if type(data) is bytes else bytes(data)
        if len(buf) >= 4:  # a frame of a known length is held back: until it is whole, only gather
            (length,) = _LENGTH.unpack_from(buf)
            if HEADER_SIZE <= length <= self._limit and len(buf) + len(data) < 4 + length:
                buf += data  # a large answer comes in many reads: each is copied once, not the
                return b""  # whole frame again on every read (that was quadratic in its size)
        buf += data
        src = bytes(buf)
        buf.clear()
        return src

    def keep(self, src: bytes, end: int) -> None:
        """Hold back ``src[end:]`` (an incomplete frame) for the next call."""
        if end < len(src):
            self._buf += memoryview(src)[end:]

    def refuse(self, length: int) -> ProtocolError:
        """The error for a bad length prefix, kept: later calls get it again."""
        self._error = self._length_error(length)
        return self._error

    @property
    def limit(self) -> int:
        """The largest length prefix accepted."""
        return self._limit

    def _scan(self, src: Buffer) -> tuple[list[bytes], int]:
        if type(src) is bytes:
            return self._cut(src, src)
        with memoryview(src) as view:
            return self._cut(src, view)

    def _cut(self, src: Buffer, view: bytes | memoryview) -> tuple[list[bytes], int]:
        frames: list[bytes] = []
        n, off, limit, unpack = len(src), 0, self._limit, _LENGTH.unpack_from
        while n - off >= 4:
            (length,) = unpack(src, off)
            if not HEADER_SIZE <= length <= limit:
                self._error = self._length_error(length)
                break
            end = off + 4 + length
            if end > n:
                break
            frames.append(bytes(view[off + 4 : end]))
            off = end
        return frames, off

    def _length_error(self, length: int) -> ProtocolError:
        if length < HEADER_SIZE:
            return ProtocolError("frame length below the header size", length=length, reason="bad length prefix")
        return FrameTooLargeError(
            "frame over the maximum frame size", frame_size=length + 4, max_frame_size=self.max_frame_size
        )


class ServerConnection:
    """A bookie's side of one connection: frames in, requests (or errors to send) out."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._decoder = FrameDecoder(max_frame_size)
        self._max = max_frame_size
        self._closing = False

    @property
    def closing(self) -> bool:
        """True once the stream is unusable: send what receive() returned last, then close."""
        return self._closing

    def receive(self, data: Buffer) -> list[Request | ErrorResponse]:
        """Requests to handle and ErrorResponses to send back, in stream order. Never raises.

        Frames are cut here, not by :meth:`FrameDecoder.split`: an ADD_ENTRY frame of the
        usual shape (version 1, no flag but RECOVERY_ADD, a key of at most 64 bytes inside
        the frame, ids up to 2^63-1) becomes an AddEntry straight from the received bytes
        - one copy of key and entry, one struct unpack, no second range test. Any other
        frame, a malformed add included, goes through :func:`decode_request` and gets
        exactly the answer it got before (the same checks, the same messages)."""
        if self._closing:
            return []
        decoder = self._decoder
        src = decoder.join(data)
        events: list[Request | ErrorResponse] = []
        n, off, limit, length_of, add_head = len(src), 0, decoder.limit, _LENGTH.unpack_from, _ADD_HEAD.unpack_from
        error: ProtocolError | None = None
        while n - off >= 4:
            (length,) = length_of(src, off)
            if not HEADER_SIZE <= length <= limit:
                error = decoder.refuse(length)
                break
            end = off + 4 + length
            if end > n:
                break
            if src[off + 5] == 1 and length >= 29:  # ADD_ENTRY (kind byte): the hot path
                version, _, flags, rid, ledger, entry, klen = add_head(src, off + 4)
                key_end = off + 33 + klen
                if version == 1 and flags <= 1 and klen <= MAX_KEY_SIZE and key_end <= end and ledger <= _I63 \
                        and entry <= _I63:
                    events.append(_trusted_add(ledger, entry, src[off + 33 : key_end], src[key_end:end], flags == 1,
                                               rid))
                    off = end
                    continue
            events.append(self._event(src[off + 4 : end]))
            off = end
            if self._closing:  # another protocol version: nothing after this frame counts
                return events
        decoder.keep(src, off)
        if error is not None:
            self._closing = True
            events.append(ErrorResponse(Op.INVALID, Status.EBADREQ, message=str(error)))
        return events

    def _event(self, frame: bytes) -> Request | ErrorResponse:
        try:
            return decode_request(frame)
        except ProtocolError as exc:
            _, kind, _, rid = _HEAD.unpack_from(frame)
            op = _OPS[kind] if kind in _REQUEST_DECODERS else Op.INVALID
            status = Status.EBADREQ
            if isinstance(exc, ProtocolVersionError):
                self._closing, status = True, Status.EBADVERSION
            return ErrorResponse(op, status, message=str(exc), request_id=rid)

    def send_added(self, req: AddEntry) -> bytes:
        """The frame of the AddEntryResponse answering ``req`` (the same bytes as
        ``send(AddEntryResponse(req.ledger_id, req.entry_id, req.request_id))``), without
        building the response: the bookie's hot path. ``req`` already passed the same
        range checks, and the frame (32 bytes) is below any maximum frame size."""
        return _add_resp_frame(req.ledger_id, req.entry_id, req.request_id)

    def send_added_many(self, reqs: list[AddEntry]) -> bytes:
        """The frames answering each of ``reqs`` (durable adds), back to back: the bytes of
        :meth:`send_added` for each, joined once."""
        pack = _ADD_RESP.pack
        return b"".join([pack(28, _V, 0x81, 0, r.request_id, r.ledger_id, r.entry_id) for r in reqs])

    def send(self, resp: Response) -> bytes:
        """The frame for ``resp``. A response past the maximum frame size (an entry too
        big to return) is replaced by an EIO ErrorResponse saying so."""
        try:
            return _encode(_RESPONSE_ENCODERS, resp, self._max, None)
        except FrameTooLargeError as exc:
            ledger, entry = getattr(resp, "ledger_id", 0), getattr(resp, "entry_id", -1)
            error = ErrorResponse(_response_op(resp), Status.EIO, ledger, entry, str(exc), resp.request_id)
            return encode_response(error, max_frame_size=self._max)


class ClientConnection:
    """A client's side of one connection to a bookie: numbers requests, matches responses.

    Requests may be pipelined and answered in any order. A response that matches no
    pending request, or the wrong op, is a ProtocolError; so is a bad frame. These are
    fatal: receive() raises the same error from then on.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._decoder = FrameDecoder(max_frame_size)
        self._max = max_frame_size
        self._next_id = 1
        self._pending: dict[int, Op] = {}
        self._error: ProtocolError | None = None

    @property
    def pending(self) -> int:
        return len(self._pending)

    def pending_ids(self) -> list[int]:
        """Ids of the requests sent and not answered, oldest first."""
        return list(self._pending)

    def send(self, req: Request) -> tuple[int, bytes]:
        """(request id, frame): ``req.request_id`` is replaced by the next id of this connection."""
        rid = self._next_id
        if type(req) is AddEntry and 33 + len(req.master_key) + len(req.data) <= self._max:
            frame = _enc_add(req, rid)  # the hot path: no table look-up, the size known
            op = Op.ADD_ENTRY
        else:
            frame = _encode(_REQUEST_ENCODERS, req, self._max, rid)
            op = _REQUEST_OP[type(req)]
        self._next_id = rid + 1
        self._pending[rid] = op
        return rid, frame

    def send_add(self, req: AddEntry) -> tuple[int, bytes]:
        """(request id, head) for an AddEntry: the frame :meth:`send` would give is
        ``head + req.master_key + req.data`` (head: the 33 bytes from the length prefix to
        the key length). For a writer sending one entry to several bookies: the key and
        the entry go out as they are, not copied into a frame per connection.
        FrameTooLargeError (and nothing pending) past the maximum frame size."""
        key = req.master_key
        size = 33 + len(key) + len(req.data)
        if size > self._max:
            raise FrameTooLargeError("frame over the maximum frame size", type="AddEntry", request_id=self._next_id,
                                     frame_size=size, max_frame_size=self._max)
        rid = self._next_id
        self._next_id = rid + 1
        self._pending[rid] = Op.ADD_ENTRY
        head = _ADD_REQ.pack(size - 4, _V, 1, _RECOVERY_ADD if req.recovery else 0, rid, req.ledger_id, req.entry_id,
                             len(key))
        return rid, head

    def receive(self, data: Buffer) -> list[Response]:
        """Responses completed by ``data``, in stream order.

        Frames are cut here (as :meth:`ServerConnection.receive` does): an EOK answer to
        a pending ADD_ENTRY (32 bytes, version 1, ids up to 2^63-1) becomes an
        AddEntryResponse straight from the received bytes; every other frame goes
        through :func:`decode_response` and the matching as before."""
        return self._receive(data, True)  # type: ignore[return-value]

    def receive_acks(self, data: Buffer) -> list[Response | int]:
        """:meth:`receive` for a writer, which needs nothing of an EOK answer to its
        ADD_ENTRY but that it came: such an answer is its request id (an ``int``), not
        an AddEntryResponse (a third of the cost of an answer, three answers an entry)."""
        return self._receive(data, False)

    def _receive(self, data: Buffer, objects: bool) -> list[Response | int]:
        if self._error is not None:
            raise self._error
        decoder, pending = self._decoder, self._pending
        src = decoder.join(data)
        view = memoryview(src)  # runs of add answers are unpacked from it: no copy of the rest
        responses: list[Response | int] = []
        append = responses.append
        n, off, limit, length_of = len(src), 0, decoder.limit, _LENGTH.unpack_from
        add_op, size = Op.ADD_ENTRY, _ADD_RESP.size
        error: ProtocolError | None = None
        try:
            while n - off >= 4:
                (length,) = length_of(src, off)
                if not HEADER_SIZE <= length <= limit:
                    error = decoder.refuse(length)
                    break
                end = off + 4 + length
                if end > n:
                    break
                if length == 28 and src[off + 5] == 0x81:  # ADD_ENTRY's answers: the hot path, a run at a time
                    start = off
                    for size_, version, op, status, rid, ledger, entry in _ADD_RESP.iter_unpack(
                            view[off : off + (n - off) // size * size]):
                        if size_ != 28 or op != 0x81 or version != 1 or status or ledger > _I63 or entry > _I63 \
                                or pending.get(rid) is not add_op:
                            break  # not a plain EOK answer to a pending add: the general path
                        del pending[rid]
                        append(_trusted_added(ledger, entry, rid) if objects else rid)
                        off += size
                    if off != start:
                        continue  # the frame that ended the run goes through the loop's checks
                # a READ_RANGE answer is decoded from a view of src (a fresh buffer each call)
                frame = view[off + 4 : end] if src[off + 5] == _RANGE_ANSWER else src[off + 4 : end]
                append(self._match(decode_response(frame)))
                off = end
        except ProtocolError as exc:
            self._error = exc
            raise
        decoder.keep(src, off)
        if error is not None:
            self._error = error
            raise error
        return responses

    def _match(self, resp: Response) -> Response:
        rid, op = resp.request_id, _response_op(resp)
        expected = self._pending.get(rid)
        if expected is None:  # an error here may be the bookie refusing the whole stream (id 0)
            told = {"status": resp.status.name, "said": resp.message} if isinstance(resp, ErrorResponse) else {}
            raise ProtocolError("response to no pending request", request_id=rid, op=op.name, **told)
        if op != expected and op is not Op.INVALID:
            raise ProtocolError("response op does not match the request", request_id=rid, op=op.name,
                                expected=expected.name)
        del self._pending[rid]
        return resp
