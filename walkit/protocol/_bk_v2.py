"""BookKeeper's v2 wire dialect (binary, "pre-v3"), sans-IO: frames <-> walkit's
messages (docs/format.md, "BookKeeper wire dialects").

::

    request   | length u32 | header u32 | body                                     |
    header    = version << 24 | opcode << 16 | flags           (version 2)
    ADD       header, master key (20), entry (ledger i64, entry i64, lac i64,
              length i64, digest, payload)
    READ      header, ledger i64, entry i64, [master key (20) if FLAG_DO_FENCING]
    BATCH_READ header, ledger i64, entry i64, request id i64, max count i32,
              max size i64, [master key (20) if FLAG_DO_FENCING]
    AUTH      header, AuthMessage (protobuf)
    response  | length u32 | header u32 (flags 0) | rc i32 | ledger i64 | entry i64 | ...
    ADD       nothing more                    READ   the entry when rc = 0
    BATCH_READ request id i64, then (size i32, entry) per entry
    AUTH      header, AuthMessage (no rc)

Big-endian. Theory of operation. v2 is what Pulsar's BookKeeper clients speak for
throughput: a fixed binary header and no request ids - a client matches an answer to
its request by (op, ledger, entry), except BATCH_READ, which carries a request id.
Decoding gives the request dataclasses of :mod:`walkit.protocol._messages` (the same
ones walkit's dialect gives, so the bookie has one request path) with ``request_id`` 0
(BATCH_READ: its request id); BATCH_READ decodes into :class:`ReadRange` (at most
``MAX_RANGE_ENTRIES`` entries: BookKeeper's max count is an upper bound). AUTH
decodes into :class:`AuthMessage`. The opcodes READ_LAC (4), WRITE_LAC (5) and
GET_BOOKIE_INFO (6) are numbered in v2 but BookKeeper's bookie refuses them in v2 (its
clients send those ops in v3 only); so does this codec. Nor has v2 long polls, TLS,
force or write flags. ``FLAG_HIGH_PRIORITY`` is dropped on decode.

An ADD's entry is carried untouched (it is walkit's entry layout; its digest is the
writer's, :mod:`walkit.protocol._bk_digest`); the ledger and entry ids of an ADD are
read from the entry's first 16 bytes, as BookKeeper's bookie reads them. A READ answer
has no LAC field: a decoded :class:`ReadEntryResponse` takes the LAC in the entry's
header (the writer's at the time), -1 when there is no entry. Master keys are exactly
20 bytes (BookKeeper's SHA1). Every fault in a frame is a :class:`ProtocolError` naming
the dialect, the op and the reason; an unsupported version a ProtocolVersionError.
"""

from __future__ import annotations

import struct
from enum import IntEnum, IntFlag
from typing import Any

from google.protobuf.message import DecodeError

from walkit.errors import FrameTooLargeError, InvalidArgumentError, ProtocolError, ProtocolVersionError
from walkit.protocol import _bk_v3_pb2
from walkit.protocol._codes import DEFAULT_MAX_FRAME_SIZE, Op, Status
from walkit.protocol._frames import Buffer
from walkit.protocol._messages import (
    AddEntry,
    AddEntryResponse,
    AuthMessage,
    BkRequest,
    BkResponse,
    ErrorResponse,
    ReadEntry,
    ReadEntryResponse,
)
from walkit.protocol._range import MAX_RANGE_ENTRIES, ReadRange, ReadRangeResponse

pb: Any = _bk_v3_pb2  # generated code: its classes and enum values are made at import, unknown to mypy

__all__ = ["V2_VERSION", "V2Op", "V2Flag", "STATUS_TO_V2", "V2_TO_STATUS", "decode_request", "encode_response",
           "last_entry_answer", "encode_error", "encode_request", "decode_response"]

V2_VERSION = 2  # BookieProtocol.CURRENT_PROTOCOL_VERSION
MASTER_KEY_SIZE = 20
_U32 = 2**32 - 1


class V2Op(IntEnum):
    ADDENTRY = 1
    READENTRY = 2
    AUTH = 3
    READ_LAC = 4
    WRITE_LAC = 5
    GET_BOOKIE_INFO = 6
    BATCH_READ_ENTRY = 7


class V2Flag(IntFlag):
    FLAG_DO_FENCING = 0x1
    FLAG_RECOVERY_ADD = 0x2
    FLAG_HIGH_PRIORITY = 0x4


STATUS_TO_V2: dict[Status, int] = {
    Status.EOK: 0,
    Status.ENOLEDGER: 1,
    Status.ENOENTRY: 2,
    Status.EBADREQ: 100,
    Status.EIO: 101,
    Status.EUA: 102,
    Status.EBADVERSION: 103,
    Status.EFENCED: 104,
    Status.EREADONLY: 105,
    Status.ETOOMANYREQUESTS: 106,
}
V2_TO_STATUS: dict[int, Status] = {v: k for k, v in STATUS_TO_V2.items()}
V2_TO_STATUS[107] = Status.EIO  # EUNKNOWNLEDGERSTATE: a walkit client reads it as EIO

_LEN = struct.Struct(">I")
_HDR = struct.Struct(">I")
_IDS = struct.Struct(">qq")
_BATCH = struct.Struct(">qqqiq")
_RESP = struct.Struct(">Iiqq")  # header, rc, ledger, entry: 24 bytes
_BATCH_RESP = struct.Struct(">Iiqqq")
_SIZE = struct.Struct(">i")
_ENTRY_LAC = struct.Struct(">q")


def header(version: int, op: int, flags: int) -> int:
    """BookKeeper's PacketHeader.toInt."""
    return (version & 0xFF) << 24 | (op & 0xFF) << 16 | (flags & 0xFFFF)


def _split(word: int) -> tuple[int, int, int]:
    return word >> 24, (word >> 16) & 0xFF, word & 0xFFFF


def _op_name(op: int) -> str:
    try:
        return V2Op(op).name
    except ValueError:
        return f"0x{op:02x}"


def _frame(body: bytes, max_frame_size: int, what: str) -> bytes:
    if 4 + len(body) > max_frame_size:
        raise FrameTooLargeError("frame larger than max_frame_size", size=4 + len(body), limit=max_frame_size,
                                 type=what, dialect="bk-v2")
    return _LEN.pack(len(body)) + body


def _pack(st: struct.Struct, *values: int) -> bytes:
    try:
        return st.pack(*values)
    except struct.error as exc:
        raise InvalidArgumentError("field out of range for BookKeeper v2", reason=str(exc)) from exc


# --- server side -----------------------------------------------------------------------------


def _key(frame: bytes, at: int) -> bytes:
    if len(frame) < at + MASTER_KEY_SIZE:
        raise InvalidArgumentError("master key cut short", size=len(frame))
    return frame[at:at + MASTER_KEY_SIZE]


def _auth(data: bytes, rid: int) -> AuthMessage:
    am = pb.AuthMessage()
    try:
        am.ParseFromString(data)
        if not am.IsInitialized():
            raise DecodeError("AuthMessage fields missing")
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidArgumentError(f"bad AuthMessage: {exc}") from exc
    return AuthMessage(am.authPluginName, bytes(am.payload), rid)


def _dec_request(frame: bytes, op: int, flags: int) -> BkRequest:
    fence = bool(flags & V2Flag.FLAG_DO_FENCING)
    if op == V2Op.ADDENTRY:
        key = _key(frame, 4)
        at = 4 + MASTER_KEY_SIZE
        if len(frame) < at + _IDS.size:
            raise InvalidArgumentError("entry shorter than its ids", size=len(frame))
        ledger, entry = _IDS.unpack_from(frame, at)
        return AddEntry(ledger, entry, key, frame[at:], bool(flags & V2Flag.FLAG_RECOVERY_ADD))
    if op == V2Op.READENTRY:
        ledger, entry = _IDS.unpack_from(frame, 4)
        end = 4 + _IDS.size
        key = _key(frame, end) if fence else b""
        if len(frame) != end + len(key):
            raise InvalidArgumentError("READ frame of the wrong size", size=len(frame))
        return ReadEntry(ledger, entry, fence, key)
    if op == V2Op.BATCH_READ_ENTRY:
        if fence:
            raise InvalidArgumentError("a fencing batch read is not served (use READ with fencing)")
        ledger, entry, rid, count, size = _BATCH.unpack_from(frame, 4)
        if len(frame) != 4 + _BATCH.size:
            raise InvalidArgumentError("BATCH_READ frame of the wrong size", size=len(frame))
        return ReadRange(ledger, entry, min(count, MAX_RANGE_ENTRIES) if count > 0 else count,
                         min(size, _U32) if size > 0 else _U32, rid)
    if op == V2Op.AUTH:
        return _auth(frame[4:], 0)
    raise InvalidArgumentError("opcode not spoken in v2 (BookKeeper sends it in v3 only)"
                               if op in (4, 5, 6) else "unknown opcode")


def decode_request(frame: Buffer) -> BkRequest:
    """A request from a v2 frame without its length prefix; ProtocolError if it is not one."""
    data = bytes(frame)
    if len(data) < 4:
        raise ProtocolError("frame shorter than its header", dialect="bk-v2", size=len(data),
                            reason="truncated header")
    version, op, flags = _split(_HDR.unpack_from(data)[0])
    if version != V2_VERSION:
        raise ProtocolVersionError(f"client speaks BookKeeper protocol version {version}, this bookie {V2_VERSION}",
                                   dialect="bk-v2", op=_op_name(op), reason="protocol version")
    try:
        return _dec_request(data, op, flags)
    except (InvalidArgumentError, struct.error) as exc:
        raise ProtocolError("invalid request", dialect="bk-v2", op=_op_name(op), size=len(data),
                            reason=str(exc)[:200]) from exc


_V2OP_OF: dict[Op, V2Op] = {Op.ADD_ENTRY: V2Op.ADDENTRY, Op.READ_ENTRY: V2Op.READENTRY,
                            Op.READ_RANGE: V2Op.BATCH_READ_ENTRY}


def _answer(op: V2Op, rc: int, ledger: int, entry: int, rid: int, tail: bytes = b"") -> bytes:
    if op == V2Op.BATCH_READ_ENTRY:
        return _pack(_BATCH_RESP, header(V2_VERSION, op, 0), rc, ledger, entry, rid) + tail
    return _pack(_RESP, header(V2_VERSION, op, 0), rc, ledger, entry) + tail


def _auth_bytes(msg: AuthMessage) -> bytes:
    am = pb.AuthMessage(authPluginName=msg.plugin_name, payload=msg.payload)
    return bytes(am.SerializeToString())


def encode_response(resp: BkResponse, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """The whole v2 frame (length prefix included) answering with ``resp``."""
    if isinstance(resp, AddEntryResponse):
        body = _answer(V2Op.ADDENTRY, 0, resp.ledger_id, resp.entry_id, 0)
    elif isinstance(resp, ReadEntryResponse):
        body = _answer(V2Op.READENTRY, 0, resp.ledger_id, resp.entry_id, 0, resp.data)
    elif isinstance(resp, ReadRangeResponse):
        tail = b"".join(_SIZE.pack(len(e)) + bytes(e) for e in resp.entries)
        body = _answer(V2Op.BATCH_READ_ENTRY, 0, resp.ledger_id, resp.first_entry, resp.request_id, tail)
    elif isinstance(resp, AuthMessage):
        body = _HDR.pack(header(V2_VERSION, V2Op.AUTH, 0)) + _auth_bytes(resp)
    elif isinstance(resp, ErrorResponse) and resp.op in _V2OP_OF:
        body = _answer(_V2OP_OF[resp.op], STATUS_TO_V2[resp.status], resp.ledger_id, resp.entry_id, resp.request_id)
    else:
        raise InvalidArgumentError("no BookKeeper v2 spelling for this response", type=type(resp).__name__)
    return _frame(body, max_frame_size, type(resp).__name__)


def last_entry_answer(resp: ReadEntryResponse, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """The frame answering a READ of entry -1 (LAST_ADD_CONFIRMED) with the last entry
    ``resp`` read: under entry id -1, the request's, as BookKeeper's bookie answers it."""
    return _frame(_answer(V2Op.READENTRY, 0, resp.ledger_id, -1, 0, resp.data), max_frame_size, "ReadEntryResponse")


def encode_error(req: BkRequest, status: Status, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """The v2 frame answering the decoded request ``req`` with an error ``status``
    (AUTH has no error answer in v2: BookKeeper's bookie closes the connection)."""
    if status is Status.EOK:
        raise InvalidArgumentError("an error answer needs an error status")
    if isinstance(req, AddEntry):
        op = V2Op.ADDENTRY
    elif isinstance(req, ReadEntry):
        op = V2Op.READENTRY
    elif isinstance(req, ReadRange):
        op = V2Op.BATCH_READ_ENTRY
    else:
        raise InvalidArgumentError("no BookKeeper v2 error answer for this request", type=type(req).__name__)
    return _frame(_answer(op, STATUS_TO_V2[status], req.ledger_id, req.entry_id, req.request_id),
                  max_frame_size, "error")


# --- client side -----------------------------------------------------------------------------


def _v2_key(key: bytes) -> bytes:
    if len(key) != MASTER_KEY_SIZE:
        raise InvalidArgumentError("a BookKeeper master key is 20 bytes", size=len(key))
    return key


def encode_request(req: BkRequest, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """The whole v2 frame (length prefix included) for ``req``. An AddEntry's data must
    start with its ledger and entry ids (a BookKeeper entry); v2 has no request ids but
    for ReadRange, nor long polls."""
    if isinstance(req, AddEntry):
        if len(req.data) < _IDS.size or _IDS.unpack_from(req.data) != (req.ledger_id, req.entry_id):
            raise InvalidArgumentError("the entry's header does not name the add's ledger and entry",
                                       ledger=req.ledger_id, entry=req.entry_id)
        flags = V2Flag.FLAG_RECOVERY_ADD if req.recovery else 0
        body = _HDR.pack(header(V2_VERSION, V2Op.ADDENTRY, flags)) + _v2_key(req.master_key) + req.data
    elif isinstance(req, ReadEntry):
        if req.previous_lac is not None:
            raise InvalidArgumentError("no long polls in BookKeeper v2", ledger=req.ledger_id)
        flags = V2Flag.FLAG_DO_FENCING if req.fence else 0
        body = (_HDR.pack(header(V2_VERSION, V2Op.READENTRY, flags)) + _pack(_IDS, req.ledger_id, req.entry_id)
                + (_v2_key(req.master_key) if req.fence else b""))
    elif isinstance(req, ReadRange):
        body = _HDR.pack(header(V2_VERSION, V2Op.BATCH_READ_ENTRY, 0)) + _pack(
            _BATCH, req.ledger_id, req.first_entry, req.request_id, req.count, req.max_bytes)
    elif isinstance(req, AuthMessage):
        body = _HDR.pack(header(V2_VERSION, V2Op.AUTH, 0)) + _auth_bytes(req)
    else:
        raise InvalidArgumentError("no BookKeeper v2 spelling for this request", type=type(req).__name__)
    return _frame(body, max_frame_size, type(req).__name__)


def _entry_lac(entry: bytes) -> int:
    return int(_ENTRY_LAC.unpack_from(entry, 16)[0]) if len(entry) >= 24 else -1


def _dec_response(data: bytes, op: int) -> BkResponse:
    if op == V2Op.AUTH:
        return _auth(data[4:], 0)
    if op == V2Op.BATCH_READ_ENTRY:
        _, rc, ledger, entry, rid = _BATCH_RESP.unpack_from(data)
        at = _BATCH_RESP.size
    elif op in (V2Op.ADDENTRY, V2Op.READENTRY):
        _, rc, ledger, entry = _RESP.unpack_from(data)
        at, rid = _RESP.size, 0
    else:
        raise InvalidArgumentError("unknown opcode")
    if rc != 0:
        status = V2_TO_STATUS.get(rc)
        if status is None:
            raise InvalidArgumentError(f"unknown error code {rc}")
        wop = {V2Op.ADDENTRY: Op.ADD_ENTRY, V2Op.READENTRY: Op.READ_ENTRY}.get(V2Op(op), Op.READ_RANGE)
        return ErrorResponse(wop, status, ledger, entry, status.name, rid)
    if op == V2Op.ADDENTRY:
        if len(data) != at:
            raise InvalidArgumentError("ADD answer of the wrong size", size=len(data))
        return AddEntryResponse(ledger, entry)
    if op == V2Op.READENTRY:
        payload = data[at:]
        if entry < 0 and len(payload) >= _IDS.size:  # an answer to a READ of entry -1: the entry's own id
            entry = _IDS.unpack_from(payload)[1]
        return ReadEntryResponse(ledger, entry, _entry_lac(payload), payload)
    entries: list[bytes] = []
    while at < len(data):
        (size,) = _SIZE.unpack_from(data, at)
        if size < 0 or at + 4 + size > len(data):
            raise InvalidArgumentError("batch entry cut short", at=at, size=size)
        entries.append(data[at + 4:at + 4 + size])
        at += 4 + size
    if not entries:
        raise InvalidArgumentError("batch read answer without entries")
    return ReadRangeResponse(ledger, entry, _entry_lac(entries[-1]), tuple(entries), rid)


def decode_response(frame: Buffer) -> BkResponse:
    """A response from a v2 frame without its length prefix; ProtocolError if it is not
    one. An error code is an :class:`ErrorResponse`."""
    data = bytes(frame)
    if len(data) < 4:
        raise ProtocolError("frame shorter than its header", dialect="bk-v2", size=len(data),
                            reason="truncated header")
    version, op, _ = _split(_HDR.unpack_from(data)[0])
    if version != V2_VERSION:
        raise ProtocolVersionError(f"bookie speaks BookKeeper protocol version {version}, this client {V2_VERSION}",
                                   dialect="bk-v2", op=_op_name(op), reason="protocol version")
    try:
        return _dec_response(data, op)
    except (InvalidArgumentError, struct.error) as exc:
        raise ProtocolError("invalid response", dialect="bk-v2", op=_op_name(op), size=len(data),
                            reason=str(exc)[:200]) from exc
