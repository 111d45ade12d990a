"""The walkit dialect of the bookie wire protocol: messages <-> frames, sans-IO
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

Theory of operation. This module is one dialect: how the messages of
:mod:`walkit.protocol._messages` are spelled in bytes, and which status a failure is
answered with (:func:`status_for`, :func:`error_for`). Another dialect (BookKeeper's v2 or
v3) goes in a module of its own beside this one, with the same four entry points
(``encode_request``, ``encode_response``, ``decode_request``, ``decode_response``).

Encoding packs a whole frame's fixed part with one ``struct`` and never fails on a
valid message but for size: past u32 or past ``max_frame_size`` is
:class:`FrameTooLargeError`. Decoding takes one frame *without* its length prefix (cut
by :mod:`walkit.protocol._frames`); inside an intact frame anything wrong (op, flags,
lengths, ranges) is a :class:`ProtocolError` naming the op, the request id and the
reason, and nothing else ever escapes decoding: decoders check structure, then call the
message's constructor, whose range checks are reused. Another protocol version is a
:class:`ProtocolVersionError`. A request's bytes are copied out of a caller's buffer
(what it carries outlives the buffer); a READ_RANGE answer given as a view of
``bytes`` is decoded without a copy.

Used by :mod:`walkit.protocol._connection`'s hot paths: the frame structs (``_HEAD``,
``_ADD_HEAD``, ``_ADD_REQ``, ``_ADD_RESP``), ``_V``, ``_RECOVERY_ADD``, the encoder
tables with ``_encode``, ``_enc_add``, ``_add_resp_frame``, ``_REQUEST_DECODERS`` and
``_RANGE_ANSWER`` - the same bytes the functions here give, spelled inline.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
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
    MAX_LAC_BODY_SIZE,
    MAX_MESSAGE_SIZE,
    PROTOCOL_VERSION,
    Flag,
    Op,
    Status,
)
from walkit.protocol._admin import AdminRequest, AdminResponse, dec_admin, dec_admin_resp, enc_admin, enc_admin_resp
from walkit.protocol._frames import Buffer
from walkit.protocol._messages import (
    _OPS,
    _STATUSES,
    AddEntry,
    AddEntryResponse,
    BookieInfoResponse,
    ErrorResponse,
    GetBookieInfo,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadLacResponse,
    Request,
    Response,
    WriteLac,
    WriteLacResponse,
)
from walkit.protocol._range import ReadRange, ReadRangeResponse, dec_range, dec_range_resp, enc_range, enc_range_resp

__all__ = [
    "encode_request",
    "encode_response",
    "decode_request",
    "decode_response",
    "status_for",
    "error_for",
]

# plain ints: ~ of an IntFlag member stays inside the known bits (3.11), hiding unknown ones
_RECOVERY_ADD, _FENCE, _LONG_POLL = int(Flag.RECOVERY_ADD), int(Flag.FENCE), int(Flag.LONG_POLL)
_LAC_BODY = int(Flag.LAC_BODY)


# --- encoding ----------------------------------------------------------------------------
# Each Struct packs a whole frame's fixed part: length, version, kind (requests: the op,
# responses: 0x80 | op), flags or status, request id, then the body's fixed fields. The
# length counts 12 header bytes + body: 29 = 12 + ledger, entry (or lac), key length.

_HEAD = struct.Struct(">BBHQ")
_FRAME = struct.Struct(">IBBHQ")
_ADD_REQ = struct.Struct(">IBBHQQQB")  # + key + data
_READ_REQ = struct.Struct(">IBBHQQqB")  # + key [+ _POLL]
_POLL = struct.Struct(">qI")
_LEDGER_REQ = struct.Struct(">IBBHQQ")
_WRITE_LAC_REQ = struct.Struct(">IBBHQQqB")  # + key [+ body length u8 + body: flag LAC_BODY]
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
    key, body = r.master_key, r.body
    if not body:  # the form every bookie reads
        return _WRITE_LAC_REQ.pack(29 + len(key), _V, 4, 0, rid, r.ledger_id, r.lac, len(key)) + key
    if len(body) > MAX_LAC_BODY_SIZE:
        raise InvalidArgumentError("LAC body over the maximum walkit's wire carries", ledger=r.ledger_id,
                                   size=len(body), max_size=MAX_LAC_BODY_SIZE)
    head = _WRITE_LAC_REQ.pack(30 + len(key) + len(body), _V, 4, _LAC_BODY, rid, r.ledger_id, r.lac, len(key))
    return b"".join((head, key, bytes((len(body),)), body))


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
    if flags & ~_LAC_BODY:
        raise _flags_fault(flags)
    if n < 29:
        raise _size_fault(n, "at least 17")
    ledger, lac, klen = _LEDGER_LAC_KEY.unpack_from(frame, 12)
    key, end = _keyed(frame, n, klen)
    body = b""
    if flags:  # LAC_BODY: a length byte, 1..MAX_LAC_BODY_SIZE, then the body
        if end == n:
            raise _Malformed("flag LAC_BODY without a body")
        blen = frame[end]
        if not 1 <= blen <= MAX_LAC_BODY_SIZE or end + 1 + blen > n:
            raise _Malformed(f"LAC body length {blen} not 1..{MAX_LAC_BODY_SIZE} or past the end of the frame")
        body, end = frame[end + 1 : end + 1 + blen], end + 1 + blen
    if end != n:
        raise _size_fault(n, f"{end - HEADER_SIZE}")
    return WriteLac(ledger, lac, key, rid, body)


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
