"""BookKeeper's v3 wire dialect (protobuf), sans-IO: frames <-> walkit's messages
(docs/format.md, "BookKeeper wire dialects").

::

    0        4
    +--------+------------------------------------------------------------+
    | length | Request / Response (protobuf, bookkeeper.proto)             |
    |  u32   | header{version=3, operation, txnId, priority}, one sub-message |
    +--------+------------------------------------------------------------+

Theory of operation. A BookKeeper 4.18 client that speaks v3 sends each request as a
protobuf ``Request`` after a big-endian length; the bookie answers with a ``Response``
whose header echoes the request's ``operation`` and ``txnId`` (answers may come out of
order: the client matches them by txnId). This module decodes such a frame into the
request dataclasses of :mod:`walkit.protocol._messages` - the same ones walkit's own
dialect decodes into, so the bookie has one request path - with the txnId as the
message's ``request_id``; encoding a response puts the ``request_id`` back as the txnId.
The BookKeeper-only ops (FORCE_LEDGER, GET_LIST_OF_ENTRIES_OF_LEDGER, AUTH, START_TLS)
decode into the small dataclasses at the end of ``_messages`` (see ``BkRequest``). The
client side (:func:`encode_request`, :func:`decode_response`) is the mirror image, so a
walkit client can talk to a Java bookie.

What a message carries and a v3 frame does not (and back): entries travel as they are
- an ``AddRequest.body`` is a whole BookKeeper entry (header, digest, payload;
:mod:`walkit.protocol._bk_digest`), which is walkit's entry layout, so the bookie reads
ids and LAC from it the same way and never computes a digest. A read's answer carries
the bookie's LAC as ``maxLAC`` (a missing one is read back from the entry's header). A
LAC write's ``body`` (ledger, LAC, the writer's digest) rides on :class:`WriteLac`
(``body``, outside equality) and the bookie keeps the last one per ledger in memory, as
BookKeeper's bookie keeps its explicit LAC; a READ_LAC (decoded with
``with_last_entry``) is answered as BookKeeper's: that body as ``lacBody`` and the
ledger's last stored entry as ``lastEntryBody`` - both with the writer's digest, which
any reader checks. Only when the bookie has neither does it send a digest-less
``lacBody`` (16 bytes, what a DUMMY-digest reader accepts). ``priority``, ``writeFlags`` (DEFERRED_SYNC; walkit
always syncs, which is stronger), ``ENTRY_PIGGYBACK`` and ``requestContext`` are dropped
on decode. Statuses map one to one (:data:`STATUS_TO_BK`), but for EUNKNOWNLEDGERSTATE,
which a walkit client reads as EIO.

Errors: anything wrong with a frame (not protobuf, required fields missing, an op walkit
does not serve, a field out of range) is a :class:`ProtocolError` naming the dialect,
the op, the txnId (when it could be read) and the reason; nothing else escapes a
decoder. Encoding a message this dialect cannot carry is an InvalidArgumentError; a
frame past ``max_frame_size`` a FrameTooLargeError.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError, Message

from walkit.errors import FrameTooLargeError, InvalidArgumentError, ProtocolError
from walkit.protocol import _bk_v3_pb2
from walkit.protocol._codes import DEFAULT_MAX_FRAME_SIZE, Op, Status
from walkit.protocol._frames import Buffer
from walkit.protocol._messages import (
    AddEntry,
    AddEntryResponse,
    AuthMessage,
    BkRequest,
    BkResponse,
    BookieInfoResponse,
    ErrorResponse,
    ForceLedger,
    ForceLedgerResponse,
    GetBookieInfo,
    GetListOfEntries,
    ListOfEntriesResponse,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadLacResponse,
    StartTls,
    StartTlsResponse,
    WriteLac,
    WriteLacResponse,
)

pb: Any = _bk_v3_pb2  # generated code: its classes and enum values are made at import, unknown to mypy

__all__ = ["STATUS_TO_BK", "BK_TO_STATUS", "decode_request", "encode_response", "lac_only_answer", "encode_error",
           "encode_request", "decode_response", "operation_of"]

_U32 = 2**32 - 1
_I63 = 2**63 - 1
_LEN = struct.Struct(">I")
_LAC_BODY = struct.Struct(">qq")
_ENTRY_LAC = struct.Struct(">q")

STATUS_TO_BK: dict[Status, int] = {
    Status.EOK: pb.EOK,
    Status.ENOLEDGER: pb.ENOLEDGER,
    Status.ENOENTRY: pb.ENOENTRY,
    Status.EBADREQ: pb.EBADREQ,
    Status.EIO: pb.EIO,
    Status.EUA: pb.EUA,
    Status.EBADVERSION: pb.EBADVERSION,
    Status.EFENCED: pb.EFENCED,
    Status.EREADONLY: pb.EREADONLY,
    Status.ETOOMANYREQUESTS: pb.ETOOMANYREQUESTS,
}
BK_TO_STATUS: dict[int, Status] = {v: k for k, v in STATUS_TO_BK.items()}
BK_TO_STATUS[pb.EUNKNOWNLEDGERSTATE] = Status.EIO

# BookKeeper's operation <-> walkit's Op, for the ops both have.
_OP_OF: dict[int, Op] = {
    pb.READ_ENTRY: Op.READ_ENTRY,
    pb.ADD_ENTRY: Op.ADD_ENTRY,
    pb.WRITE_LAC: Op.WRITE_LAC,
    pb.READ_LAC: Op.READ_LAC,
    pb.GET_BOOKIE_INFO: Op.GET_BOOKIE_INFO,
}
_OPERATION_OF: dict[Op, int] = {v: k for k, v in _OP_OF.items()}
_OPERATION_OF_TYPE: dict[type[Any], int] = {
    AddEntry: pb.ADD_ENTRY, AddEntryResponse: pb.ADD_ENTRY,
    ReadEntry: pb.READ_ENTRY, ReadEntryResponse: pb.READ_ENTRY,
    ReadLac: pb.READ_LAC, ReadLacResponse: pb.READ_LAC,
    WriteLac: pb.WRITE_LAC, WriteLacResponse: pb.WRITE_LAC,
    GetBookieInfo: pb.GET_BOOKIE_INFO, BookieInfoResponse: pb.GET_BOOKIE_INFO,
    ForceLedger: pb.FORCE_LEDGER, ForceLedgerResponse: pb.FORCE_LEDGER,
    GetListOfEntries: pb.GET_LIST_OF_ENTRIES_OF_LEDGER, ListOfEntriesResponse: pb.GET_LIST_OF_ENTRIES_OF_LEDGER,
    AuthMessage: pb.AUTH,
    StartTls: pb.START_TLS, StartTlsResponse: pb.START_TLS,
}


def _op_name(operation: int) -> str:
    try:
        return str(pb.OperationType.Name(operation))
    except ValueError:
        return str(operation)


def operation_of(msg: BkRequest | BkResponse) -> int:
    """The v3 OperationType a message travels as (ErrorResponse: its op's)."""
    if isinstance(msg, ErrorResponse):
        return _OPERATION_OF.get(msg.op, 0)
    try:
        return _OPERATION_OF_TYPE[type(msg)]
    except KeyError:
        raise InvalidArgumentError("no BookKeeper v3 operation for this message", type=type(msg).__name__) from None


# --- frames --------------------------------------------------------------------------------


def _frame(msg: Message, max_frame_size: int, what: str) -> bytes:
    body = bytes(msg.SerializeToString())
    if 4 + len(body) > max_frame_size:
        raise FrameTooLargeError("frame larger than max_frame_size", size=4 + len(body), limit=max_frame_size,
                                 type=what, dialect="bk-v3")
    return _LEN.pack(len(body)) + body


def _header(into: Any, operation: int, txn: int) -> None:
    into.version = pb.VERSION_THREE
    into.operation = operation
    into.txnId = txn


def _parse(cls: Callable[[], Any], frame: Buffer, what: str) -> Any:
    msg = cls()
    try:
        msg.ParseFromString(bytes(frame))
        if not msg.IsInitialized():
            raise DecodeError("required fields missing: " + ", ".join(msg.FindInitializationErrors()))
    except (DecodeError, RuntimeError, ValueError, TypeError) as exc:
        txn = msg.header.txnId if msg.HasField("header") else None
        raise ProtocolError(f"invalid {what}", dialect="bk-v3", request_id=txn, reason=str(exc)[:200]) from exc
    return msg


# --- server side: requests in, responses out -----------------------------------------------


def _dec_read(r: Any, txn: int) -> ReadEntry:
    fence = r.HasField("flag") and r.flag == pb.ReadRequest.FENCE_LEDGER
    key = bytes(r.masterKey) if fence else b""
    if r.HasField("previousLAC"):
        return ReadEntry(r.ledgerId, r.entryId, fence, key, r.previousLAC, r.timeOut, request_id=txn)
    return ReadEntry(r.ledgerId, r.entryId, fence, key, request_id=txn)


def _dec_add(r: Any, txn: int) -> AddEntry:
    recovery = r.HasField("flag") and r.flag == pb.AddRequest.RECOVERY_ADD
    return AddEntry(r.ledgerId, r.entryId, bytes(r.masterKey), bytes(r.body), recovery, txn)


_REQUEST_FIELDS: dict[int, tuple[str, Callable[[Any, int], BkRequest]]] = {
    pb.READ_ENTRY: ("readRequest", _dec_read),
    pb.ADD_ENTRY: ("addRequest", _dec_add),
    pb.READ_LAC: ("readLacRequest", lambda r, t: ReadLac(r.ledgerId, t, with_last_entry=True)),
    pb.WRITE_LAC: ("writeLacRequest", lambda r, t: WriteLac(r.ledgerId, r.lac, bytes(r.masterKey), t, bytes(r.body))),
    pb.GET_BOOKIE_INFO: ("getBookieInfoRequest", lambda r, t: GetBookieInfo(t)),
    pb.FORCE_LEDGER: ("forceLedgerRequest", lambda r, t: ForceLedger(r.ledgerId, t)),
    pb.GET_LIST_OF_ENTRIES_OF_LEDGER: (
        "getListOfEntriesOfLedgerRequest", lambda r, t: GetListOfEntries(r.ledgerId, t)),
    pb.AUTH: ("authRequest", lambda r, t: AuthMessage(r.authPluginName, bytes(r.payload), t)),
    pb.START_TLS: ("startTLSRequest", lambda r, t: StartTls(t)),
}


def decode_request(frame: Buffer) -> BkRequest:
    """A request from a v3 frame without its length prefix; ProtocolError if it is not one."""
    req = _parse(pb.Request, frame, "request")
    operation, txn = req.header.operation, req.header.txnId
    entry = _REQUEST_FIELDS.get(operation)
    try:
        if entry is None:
            raise InvalidArgumentError("operation not served by a walkit bookie")
        field, decoder = entry
        if field != "getBookieInfoRequest" and field != "startTLSRequest" and not req.HasField(field):
            raise InvalidArgumentError(f"{field} missing")
        return decoder(getattr(req, field), txn)
    except InvalidArgumentError as exc:
        raise ProtocolError("invalid request", dialect="bk-v3", op=_op_name(operation), request_id=txn,
                            reason=str(exc)[:200]) from exc


def _fill_response(out: Any, resp: BkResponse) -> None:
    if isinstance(resp, AddEntryResponse):
        sub = out.addResponse
        sub.status, sub.ledgerId, sub.entryId = pb.EOK, resp.ledger_id, resp.entry_id
    elif isinstance(resp, ReadEntryResponse):
        sub = out.readResponse
        sub.status, sub.ledgerId, sub.entryId = pb.EOK, resp.ledger_id, resp.entry_id
        sub.body, sub.maxLAC = resp.data, resp.lac
    elif isinstance(resp, ReadLacResponse):
        sub = out.readLacResponse
        sub.status, sub.ledgerId = pb.EOK, resp.ledger_id
        if resp.lac_body:  # the last WRITE_LAC's body, the writer's digest in it
            sub.lacBody = resp.lac_body
        if resp.last_entry:  # the writer's digest: any reader checks it
            sub.lastEntryBody = resp.last_entry
        if not resp.lac_body and not resp.last_entry:  # a digest-less lacBody: DUMMY readers only
            sub.lacBody = _LAC_BODY.pack(resp.ledger_id, resp.lac)
    elif isinstance(resp, WriteLacResponse):
        out.writeLacResponse.status, out.writeLacResponse.ledgerId = pb.EOK, resp.ledger_id
    elif isinstance(resp, BookieInfoResponse):
        sub = out.getBookieInfoResponse
        sub.status = pb.EOK
        sub.totalDiskCapacity, sub.freeDiskSpace = min(resp.total_bytes, _I63), min(resp.free_bytes, _I63)
    elif isinstance(resp, ForceLedgerResponse):
        out.forceLedgerResponse.status, out.forceLedgerResponse.ledgerId = pb.EOK, resp.ledger_id
    elif isinstance(resp, ListOfEntriesResponse):
        sub = out.getListOfEntriesOfLedgerResponse
        sub.status, sub.ledgerId, sub.availabilityOfEntriesOfLedger = pb.EOK, resp.ledger_id, resp.availability
    elif isinstance(resp, AuthMessage):
        out.authResponse.authPluginName, out.authResponse.payload = resp.plugin_name, resp.payload
    elif isinstance(resp, StartTlsResponse):
        out.startTLSResponse.SetInParent()
    else:
        raise InvalidArgumentError("no BookKeeper v3 spelling for this response", type=type(resp).__name__)


def _fill_error(out: Any, operation: int, status: int, ledger_id: int, entry_id: int) -> None:
    """An error answer's sub-message: BookKeeper repeats the status in it, with the ids."""
    if operation == pb.ADD_ENTRY:
        out.addResponse.status, out.addResponse.ledgerId, out.addResponse.entryId = status, ledger_id, entry_id
    elif operation == pb.READ_ENTRY:
        out.readResponse.status, out.readResponse.ledgerId, out.readResponse.entryId = status, ledger_id, entry_id
    elif operation == pb.READ_LAC:
        out.readLacResponse.status, out.readLacResponse.ledgerId = status, ledger_id
    elif operation == pb.WRITE_LAC:
        out.writeLacResponse.status, out.writeLacResponse.ledgerId = status, ledger_id
    elif operation == pb.GET_BOOKIE_INFO:
        out.getBookieInfoResponse.status = status
    elif operation == pb.FORCE_LEDGER:
        out.forceLedgerResponse.status, out.forceLedgerResponse.ledgerId = status, ledger_id
    elif operation == pb.GET_LIST_OF_ENTRIES_OF_LEDGER:
        sub = out.getListOfEntriesOfLedgerResponse
        sub.status, sub.ledgerId = status, ledger_id


def encode_response(resp: BkResponse, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """The whole v3 frame (length prefix included) answering with ``resp``; its
    ``request_id`` becomes the txnId."""
    out = pb.Response()
    if isinstance(resp, ErrorResponse):
        operation = operation_of(resp)
        if not operation:
            raise InvalidArgumentError("no BookKeeper v3 operation for this error", op=resp.op.name)
        _header(out.header, operation, resp.request_id)
        out.status = STATUS_TO_BK[resp.status]
        _fill_error(out, operation, out.status, resp.ledger_id, resp.entry_id)
    else:
        _header(out.header, operation_of(resp), resp.request_id)
        out.status = pb.EOK
        _fill_response(out, resp)
    return _frame(out, max_frame_size, type(resp).__name__)


def lac_only_answer(ledger_id: int, entry_id: int, lac: int, request_id: int,
                    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """A long poll's EOK answer without an entry: ``maxLAC`` only (BookKeeper's
    LongPollReadEntryProcessorV3 on time-out, or when the entry is not on the bookie)."""
    out = pb.Response()
    _header(out.header, pb.READ_ENTRY, request_id)
    out.status = pb.EOK
    sub = out.readResponse
    sub.status, sub.ledgerId, sub.entryId, sub.maxLAC = pb.EOK, ledger_id, entry_id, lac
    return _frame(out, max_frame_size, "ReadEntryResponse")


def encode_error(req: BkRequest, status: Status, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """The v3 frame answering the decoded request ``req`` with an error ``status``
    (also for BookKeeper-only ops, which :class:`ErrorResponse` cannot name)."""
    if status is Status.EOK:
        raise InvalidArgumentError("an error answer needs an error status")
    operation = operation_of(req)
    out = pb.Response()
    _header(out.header, operation, req.request_id)
    out.status = STATUS_TO_BK[status]
    ledger = getattr(req, "ledger_id", 0)
    entry = getattr(req, "entry_id", -1)
    if operation == pb.AUTH:
        out.authResponse.authPluginName, out.authResponse.payload = getattr(req, "plugin_name", ""), b""
    _fill_error(out, operation, out.status, ledger, entry)
    return _frame(out, max_frame_size, "error")


# --- client side: requests out, responses in -----------------------------------------------


def encode_request(req: BkRequest, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """The whole v3 frame (length prefix included) for ``req``; its ``request_id`` is the
    txnId. A WriteLac's body is sent digest-less (see the module docstring)."""
    out = pb.Request()
    _header(out.header, operation_of(req), req.request_id)
    if isinstance(req, AddEntry):
        sub = out.addRequest
        sub.ledgerId, sub.entryId, sub.masterKey, sub.body = req.ledger_id, req.entry_id, req.master_key, req.data
        if req.recovery:
            sub.flag = pb.AddRequest.RECOVERY_ADD
    elif isinstance(req, ReadEntry):
        rd = out.readRequest
        rd.ledgerId, rd.entryId = req.ledger_id, req.entry_id
        if req.fence:
            rd.flag, rd.masterKey = pb.ReadRequest.FENCE_LEDGER, req.master_key
        if req.previous_lac is not None:
            rd.previousLAC, rd.timeOut = req.previous_lac, req.timeout_ms
    elif isinstance(req, ReadLac):
        out.readLacRequest.ledgerId = req.ledger_id
    elif isinstance(req, WriteLac):
        w = out.writeLacRequest
        w.ledgerId, w.lac, w.masterKey = req.ledger_id, req.lac, req.master_key
        w.body = req.body or _LAC_BODY.pack(req.ledger_id, req.lac)  # none given: digest-less
    elif isinstance(req, GetBookieInfo):
        out.getBookieInfoRequest.requested = (
            pb.GetBookieInfoRequest.TOTAL_DISK_CAPACITY | pb.GetBookieInfoRequest.FREE_DISK_SPACE)
    elif isinstance(req, ForceLedger):
        out.forceLedgerRequest.ledgerId = req.ledger_id
    elif isinstance(req, GetListOfEntries):
        out.getListOfEntriesOfLedgerRequest.ledgerId = req.ledger_id
    elif isinstance(req, AuthMessage):
        out.authRequest.authPluginName, out.authRequest.payload = req.plugin_name, req.payload
    elif isinstance(req, StartTls):
        out.startTLSRequest.SetInParent()
    else:
        raise InvalidArgumentError("no BookKeeper v3 spelling for this request", type=type(req).__name__)
    return _frame(out, max_frame_size, type(req).__name__)


def _read_lac(sub: Any) -> int:
    """The LAC a READ_LAC answer tells: the larger of its lacBody's and its last entry's
    (unchecked: the answer keeps both bodies for a reader that knows the digest to check)."""
    lacs = [-1]
    if sub.HasField("lacBody") and len(sub.lacBody) >= _LAC_BODY.size:
        lacs.append(_LAC_BODY.unpack_from(sub.lacBody)[1])
    if sub.HasField("lastEntryBody") and len(sub.lastEntryBody) >= 24:
        lacs.append(_ENTRY_LAC.unpack_from(sub.lastEntryBody, 16)[0])
    return max(lacs)


def _dec_read_resp(sub: Any, txn: int) -> ReadEntryResponse:
    body = bytes(sub.body)
    entry_id = sub.entryId
    if entry_id < 0 and len(body) >= 16:  # an answer to a read of entry -1: the entry's own id
        entry_id = _ENTRY_LAC.unpack_from(body, 8)[0]
    if sub.HasField("maxLAC"):
        lac = sub.maxLAC
    elif len(body) >= 24:
        lac = _ENTRY_LAC.unpack_from(body, 16)[0]
    else:
        lac = -1
    return ReadEntryResponse(sub.ledgerId, entry_id, lac, body, txn)


_RESPONSE_FIELDS: dict[int, tuple[str, Callable[[Any, int], BkResponse]]] = {
    pb.ADD_ENTRY: ("addResponse", lambda s, t: AddEntryResponse(s.ledgerId, s.entryId, t)),
    pb.READ_ENTRY: ("readResponse", _dec_read_resp),
    pb.READ_LAC: ("readLacResponse", lambda s, t: ReadLacResponse(
        s.ledgerId, _read_lac(s), t, last_entry=bytes(s.lastEntryBody) if s.HasField("lastEntryBody") else b"",
        lac_body=bytes(s.lacBody) if s.HasField("lacBody") else b"")),
    pb.WRITE_LAC: ("writeLacResponse", lambda s, t: WriteLacResponse(s.ledgerId, t)),
    pb.GET_BOOKIE_INFO: (
        "getBookieInfoResponse",
        lambda s, t: BookieInfoResponse(max(s.freeDiskSpace, 0), max(s.totalDiskCapacity, 0), False, t)),
    pb.FORCE_LEDGER: ("forceLedgerResponse", lambda s, t: ForceLedgerResponse(s.ledgerId, t)),
    pb.GET_LIST_OF_ENTRIES_OF_LEDGER: (
        "getListOfEntriesOfLedgerResponse",
        lambda s, t: ListOfEntriesResponse(s.ledgerId, bytes(s.availabilityOfEntriesOfLedger), t)),
    pb.AUTH: ("authResponse", lambda s, t: AuthMessage(s.authPluginName, bytes(s.payload), t)),
    pb.START_TLS: ("startTLSResponse", lambda s, t: StartTlsResponse(t)),
}


def decode_response(frame: Buffer) -> BkResponse:
    """A response from a v3 frame without its length prefix; ProtocolError if it is not
    one. An error status is an :class:`ErrorResponse` (op INVALID for the
    BookKeeper-only ops)."""
    resp = _parse(pb.Response, frame, "response")
    operation, txn = resp.header.operation, resp.header.txnId
    try:
        entry = _RESPONSE_FIELDS.get(operation)
        if entry is None:
            raise InvalidArgumentError("operation not spoken by walkit")
        field, decoder = entry
        if resp.status != pb.EOK:
            sub = getattr(resp, field)
            fields = sub.DESCRIPTOR.fields_by_name
            ledger = sub.ledgerId if "ledgerId" in fields and sub.HasField("ledgerId") else 0
            entry_id = sub.entryId if "entryId" in fields and sub.HasField("entryId") else -1
            return ErrorResponse(_OP_OF.get(operation, Op.INVALID), BK_TO_STATUS[resp.status], ledger, entry_id,
                                 str(pb.StatusCode.Name(resp.status)), txn)
        if field not in ("startTLSResponse",) and not resp.HasField(field):
            raise InvalidArgumentError(f"{field} missing")
        return decoder(getattr(resp, field), txn)
    except (InvalidArgumentError, KeyError) as exc:
        raise ProtocolError("invalid response", dialect="bk-v3", op=_op_name(operation), request_id=txn,
                            reason=str(exc)[:200]) from exc
