"""A bookie's side of a connection in BookKeeper's dialects, sans-IO, and the choice of
dialect a connection's first frame makes (docs/format.md, "BookKeeper wire dialects").

Theory of operation. One bookie port hears walkit's dialect and BookKeeper 4.18's v3
(protobuf) and v2 (binary). A server connection starts with a :class:`DialectSniffer`:
it holds the first bytes until the first frame's first byte is in (walkit: 1, v2: 2,
v3: 0x0A - and then the whole frame, which must parse as a protobuf ``Request``;
:func:`~walkit.protocol._dialect.detect_dialect`), builds the connection of that
dialect - walkit's own :class:`~walkit.protocol.ServerConnection`, untouched, with its
ADD fast path, or a :class:`BkServerConnection` - hands it the bytes held, and gives
it to its owner through a callback, once. The owner (``bookie/server/_connection.py``)
then calls the chosen object directly: after the first frame a walkit connection pays
nothing for the other dialects. A first frame in no dialect goes to walkit's
connection, which answers it as it always did (EBADVERSION or EBADREQ, then closes);
a 0x0A frame that is no protobuf Request is v2 (BookKeeper falls back to v2 for good).

:class:`BkServerConnection` has ServerConnection's surface (``receive``, ``closing``,
``send``, ``send_added``, ``send_added_many``) and decodes with the dialect's codec
(:func:`~walkit.protocol._dialect.codec_for`) into the same request messages, so the
bookie has one request path; the BookKeeper-only ops come out as ``ForceLedger``,
``GetListOfEntries``, ``AuthMessage``, ``StartTls``. Answers go back through the same
codec. What BookKeeper's bookie does with bad input, and so this does:

* a frame longer than the maximum frame size: Netty's LengthFieldBasedFrameDecoder
  raises TooLongFrameException, the bookie's exceptionCaught closes the channel - no
  answer (walkit's dialect answers EBADREQ first);
* a frame that does not decode (cut short, junk, an unknown v2 opcode, v2's READ_LAC /
  WRITE_LAC / GET_BOOKIE_INFO opcodes, a v3 frame that is no Request): the decoder
  throws, the channel closes - no answer;
* a v3 Request of an operation the bookie does not serve (RANGE_READ_ENTRY,
  RANGE_ADD_ENTRY, BATCH_READ_ENTRY): BookieRequestProcessor's default branch answers
  the request's header with EBADREQ, and the connection stays (the server does not count
  these among the bad frames that close a walkit connection); so does a Request that
  parsed but whose fields walkit cannot take (a sub-message missing, an id out of
  range) - the status BookKeeper would give there is a guess (EBADREQ);
* a v2 READ of entry -1 (BookieProtocol.LAST_ADD_CONFIRMED: the last entry, as recovery
  and v2 readers of the LAC ask) is answered with entry id -1 and the last entry, as
  BookKeeper's bookie echoes the request's ids - the v2 client matches answers by
  (ledger, entry); such reads get request ids of this connection's own to find them;
* a v3 long poll (readLastAddConfirmedAndEntry: previousLAC, entry -1) reads entry
  previousLAC + 1 once the LAC passes previousLAC, as BookKeeper's bookie does; one
  with no entry to piggy-back - its time
  ran out, or the LAC moved but the entry asked for is not on this bookie - is answered
  EOK with ``maxLAC`` and no body (LongPollReadEntryProcessorV3), not ENOENTRY nor
  another entry as walkit's dialect answers;
* a v2 frame of another protocol version: served if older (0, 1), answered EBADVERSION
  if newer, the connection kept (PacketProcessorBase.isVersionCompatible);
* a wrong master key, a fenced ledger, a missing entry: answered by the bookie with its
  status (EUA, EFENCED, ENOENTRY, ...) in the request's own answer; the connection stays.

Errors :class:`ErrorResponse` cannot name (an error answer to a BookKeeper-only op, the
header-only EBADREQ) travel as :class:`BkErrorResponse`, an ErrorResponse (so the
server counts and queues it as any other) that carries the request or the frame.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from walkit.errors import FrameTooLargeError, InvalidArgumentError, ProtocolError, ProtocolVersionError
from walkit.protocol import _bk_v2, _bk_v3, _bk_v3_pb2
from walkit.protocol._codes import DEFAULT_MAX_FRAME_SIZE, PROTOCOL_VERSION, Op, Status
from walkit.protocol._connection import ServerConnection, WireCodec
from walkit.protocol._dialect import Dialect, codec_for, detect_dialect
from walkit.protocol._frames import Buffer
from walkit.protocol._messages import (
    _RESPONSE_OP,
    AddEntry,
    AddEntryResponse,
    BkResponse,
    ErrorResponse,
    ReadEntry,
    ReadEntryResponse,
)

pb: Any = _bk_v3_pb2  # generated code: unknown to mypy

__all__ = ["BkErrorResponse", "BkServerConnection", "DialectSniffer", "ServerWire",
           "encode_availability", "decode_availability"]

_LENGTH = struct.Struct(">I")
_V3_TAG = 0x0A
_V2_VERSION = 2
_AVAIL_HEAD = struct.Struct(">ii")
_AVAIL_GROUP = struct.Struct(">qqii")
_AVAIL_HEADER_SIZE = 64  # AvailabilityOfEntriesOfLedger.HEADER_SIZE


@dataclass(frozen=True)
class BkErrorResponse(ErrorResponse):
    """An error answer in a BookKeeper dialect that :class:`ErrorResponse` cannot name:
    to a BookKeeper-only request (``request``, encoded by the codec's ``encode_error``)
    or a ready frame (``frame``: the header-only EBADREQ to an operation not served)."""

    request: Any = None
    frame: bytes = b""


class ServerWire(Protocol):
    """What a bookie's connection needs of its sans-IO side, in any dialect."""

    @property
    def closing(self) -> bool: ...

    def receive(self, data: Buffer) -> list[Any]: ...

    def send(self, resp: Any) -> bytes: ...

    def send_added(self, req: AddEntry) -> bytes: ...

    def send_added_many(self, reqs: list[AddEntry]) -> bytes: ...


class BkServerConnection:
    """A bookie's side of one connection in BookKeeper's v3 or v2 (see the module
    docstring): frames in, requests (or error answers) out; answers in the dialect."""

    def __init__(self, dialect: Dialect, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if dialect is Dialect.WALKIT:
            raise InvalidArgumentError("walkit's dialect is ServerConnection's")
        self.dialect = dialect
        self._codec = codec_for(dialect)
        self._max = max_frame_size
        self._buf = bytearray()
        self._closing = False
        #: why the connection closes (a ProtocolError), for the owner's log
        self.error: ProtocolError | None = None
        self._last_reads = 0  # v2 READs of entry -1 numbered (v2 has no request ids)
        self._asked_last: set[int] = set()
        self._polls: dict[int, tuple[int, int]] = {}  # v3 long polls: txnId -> (entry, previous LAC)

    @property
    def closing(self) -> bool:
        """True once the stream is unusable: send what receive() returned, then close."""
        return self._closing

    def receive(self, data: Buffer) -> list[Any]:
        """Requests to serve and ready error answers, in stream order. Never raises: a
        bad frame ends the stream (:attr:`closing`), as in BookKeeper, without an answer."""
        if self._closing:
            return []
        buf = self._buf
        buf += data
        events: list[Any] = []
        off, n = 0, len(buf)
        while n - off >= 4:
            (length,) = _LENGTH.unpack_from(buf, off)
            if 4 + length > self._max:
                self._fail(ProtocolError("frame larger than the maximum frame size", dialect=self.dialect.value,
                                         size=length, limit=self._max))
                break
            end = off + 4 + length
            if end > n:
                break
            event = self._event(bytes(buf[off + 4:end]))
            off = end
            if event is None:
                break
            events.append(event)
        del buf[:off]
        if self._closing:
            buf.clear()
        return events

    def _fail(self, error: ProtocolError) -> None:
        self._closing, self.error = True, error

    def _event(self, frame: bytes) -> Any:
        try:
            req = self._codec.decode_request(frame)
        except ProtocolError as exc:
            if self.dialect is Dialect.BK_V2 and isinstance(exc, ProtocolVersionError):
                req = self._v2_other_version(frame, exc)  # an older version's request is served as v2's
                if req is None or isinstance(req, BkErrorResponse):
                    return req
            else:
                refusal = _v3_refusal(frame, exc) if self.dialect is Dialect.BK_V3 else None
                if refusal is None:
                    self._fail(exc)
                return refusal
        previous = req.previous_lac if type(req) is ReadEntry else None
        if previous is not None:  # a long poll (v3 only): its answer may be LAC-only
            if req.entry_id < 0:  # the Java client asks -1; BookKeeper's bookie reads previousLAC + 1
                req = dataclasses.replace(req, entry_id=min(previous + 1, 2**63 - 1))
            self._polls[req.request_id] = (req.entry_id, previous)
        elif type(req) is ReadEntry and req.entry_id < 0 and self.dialect is Dialect.BK_V2:
            self._last_reads += 1  # answered under entry -1: a v2 client matches (ledger, entry)
            req = dataclasses.replace(req, request_id=self._last_reads)
            self._asked_last.add(self._last_reads)
        return req

    def _v2_other_version(self, frame: bytes, exc: ProtocolError) -> Any:
        """A v2 frame of another protocol version, as BookKeeper's bookie takes it: decoded
        all the same (a frame that does not decode ends the stream); versions 0 and 1
        served (LOWEST_COMPAT_PROTOCOL_VERSION 0), a later one answered EBADVERSION with
        the request's ids (PacketProcessorBase.isVersionCompatible), the stream kept."""
        version = frame[0]
        try:
            req = self._codec.decode_request(bytes([_V2_VERSION]) + frame[1:])
        except ProtocolError as again:
            self._fail(again)
            return None
        if version < _V2_VERSION:
            return req
        try:
            refusal = bytes(self._codec.encode_error(req, Status.EBADVERSION, max_frame_size=self._max))
        except InvalidArgumentError:  # no error answer (AUTH): BookKeeper closes
            self._fail(exc)
            return None
        return BkErrorResponse(Op.INVALID, Status.EBADVERSION, message=str(exc)[:1024], frame=refusal)

    def send(self, resp: BkResponse) -> bytes:
        """The frame answering with ``resp`` in this connection's dialect. An answer past
        the maximum frame size (an entry too big to return) becomes EIO, as walkit's."""
        codec = self._codec
        if self._polls and resp.request_id in self._polls:
            frame = self._poll_answer(resp, *self._polls.pop(resp.request_id))
            if frame is not None:
                return frame
        if self._asked_last and _answers_read(resp) and resp.request_id in self._asked_last:
            self._asked_last.discard(resp.request_id)  # (a BATCH_READ's own id may be the same number)
            if isinstance(resp, ReadEntryResponse):  # v2's READ of entry -1 (LAST_ADD_CONFIRMED)
                return _bk_v2.last_entry_answer(resp, self._max)
        try:
            if isinstance(resp, BkErrorResponse):
                if resp.frame:
                    return resp.frame
                try:
                    return bytes(codec.encode_error(resp.request, resp.status, max_frame_size=self._max))
                except InvalidArgumentError:  # no error answer in the dialect (v2 AUTH): BookKeeper
                    self._fail(ProtocolError("no error answer in this dialect", reason=resp.message[:200]))
                    return b""  # closes the channel; so does the owner once it sees closing
            return bytes(codec.encode_response(resp, max_frame_size=self._max))
        except FrameTooLargeError as exc:
            op = _RESPONSE_OP.get(type(resp), Op.READ_ENTRY)
            error = ErrorResponse(op, Status.EIO, getattr(resp, "ledger_id", 0),
                                  getattr(resp, "entry_id", -1), str(exc)[:1024], resp.request_id)
            return bytes(codec.encode_response(error, max_frame_size=self._max))

    def _poll_answer(self, resp: BkResponse, entry_id: int, previous_lac: int) -> bytes | None:
        """A v3 long poll's answer as BookKeeper's LongPollReadEntryProcessorV3 gives it
        when there is no entry to piggy-back: EOK, ``maxLAC`` and no body - on time-out
        (walkit's machinery says ENOENTRY; the LAC did not pass the previous one, which is
        what ``maxLAC`` then tells) and when the LAC moved but the entry asked for is not
        on this bookie (walkit's answer then carries the last entry instead). None: the
        answer as it is."""
        if isinstance(resp, ErrorResponse) and resp.op is Op.READ_ENTRY and resp.status is Status.ENOENTRY:
            lac = previous_lac
        elif isinstance(resp, ReadEntryResponse) and resp.entry_id != entry_id:
            lac = resp.lac
        else:
            return None
        return bytes(_bk_v3.lac_only_answer(resp.ledger_id, entry_id, lac, resp.request_id, self._max))

    def send_added(self, req: AddEntry) -> bytes:
        """The frame answering the durable add ``req``."""
        return bytes(self._codec.encode_response(AddEntryResponse(req.ledger_id, req.entry_id, req.request_id)))

    def send_added_many(self, reqs: list[AddEntry]) -> bytes:
        """The frames answering each of ``reqs``, back to back."""
        return b"".join([self.send_added(req) for req in reqs])


def _answers_read(resp: BkResponse) -> bool:
    """Whether ``resp`` answers a READ_ENTRY (an entry, or an error of that op)."""
    return isinstance(resp, ReadEntryResponse) or (isinstance(resp, ErrorResponse) and resp.op is Op.READ_ENTRY)


def _v3_refusal(frame: bytes, exc: ProtocolError) -> BkErrorResponse | None:
    """The header-only EBADREQ BookKeeper answers a v3 Request with when the Request
    parsed but is not served; None when the frame is no Request (the stream ends)."""
    req = pb.Request()
    try:
        req.ParseFromString(frame)
    except Exception:  # any parser failure: no Request, the stream ends
        return None
    if not req.IsInitialized():
        return None
    out = pb.Response()
    out.header.CopyFrom(req.header)
    out.status = pb.EBADREQ
    body = bytes(out.SerializeToString())
    return BkErrorResponse(Op.INVALID, Status.EBADREQ, message=str(exc)[:1024], request_id=req.header.txnId,
                           frame=_LENGTH.pack(len(body)) + body)


class DialectSniffer:
    """A server connection before its first frame: holds bytes until the first frame
    tells the dialect, then builds that dialect's connection, hands it what it holds
    and gives it to ``chosen`` (once); see the module docstring. ``c_wire``: the C hot
    path a walkit dialect's :class:`ServerConnection` uses (None: Python only)."""

    def __init__(self, chosen: Callable[[ServerWire], None], max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 c_wire: WireCodec | None = None) -> None:
        self._chosen = chosen
        self._max = max_frame_size
        self._c = c_wire  # handed to a walkit dialect's ServerConnection
        self._buf = bytearray()
        self._wire: ServerWire | None = None
        self.dialect: Dialect | None = None

    @property
    def closing(self) -> bool:
        return False if self._wire is None else self._wire.closing

    def receive(self, data: Buffer) -> list[Any]:
        """[] until the dialect is known; then what the chosen connection makes of every
        byte so far (an owner that keeps calling this after the choice is forwarded)."""
        if self._wire is not None:
            return self._wire.receive(data)
        buf = self._buf
        buf += data
        dialect = self._sniff(buf)
        if dialect is None:
            return []
        self.dialect = dialect
        wire: ServerWire
        if dialect is Dialect.WALKIT:
            wire = ServerConnection(self._max, self._c)
        else:
            wire = BkServerConnection(dialect, self._max)
        self._buf, self._wire = bytearray(), wire
        self._chosen(wire)
        return wire.receive(bytes(buf))

    def _sniff(self, buf: bytearray) -> Dialect | None:
        """The dialect once the bytes held tell it, else None (more bytes needed)."""
        if len(buf) < 4:
            return None
        (length,) = _LENGTH.unpack_from(buf)
        if length == 0:
            return Dialect.WALKIT  # its answer to an empty frame (EBADREQ, closing)
        if len(buf) < 5:
            return None
        first = buf[4]
        if first == PROTOCOL_VERSION:
            return Dialect.WALKIT
        if first == _V2_VERSION:
            return Dialect.BK_V2
        if first != _V3_TAG:
            return Dialect.WALKIT  # no dialect: walkit's answer as before (EBADVERSION)
        if 4 + length > self._max:
            return Dialect.BK_V3  # too large to parse: it ends the stream in v3
        if len(buf) < 4 + length:
            return None
        try:
            return detect_dialect(bytes(buf[4:4 + length]))
        except ProtocolError:
            return Dialect.BK_V2  # no Request: BookKeeper falls back to v2 for good
        # (detect_dialect gives v3 here, or raises: 0x0A is no v2 version byte)

    def send(self, resp: Any) -> bytes:
        raise InvalidArgumentError("no answer before the first frame chose the dialect")

    def send_added(self, req: AddEntry) -> bytes:
        raise InvalidArgumentError("no answer before the first frame chose the dialect")

    def send_added_many(self, reqs: list[AddEntry]) -> bytes:
        raise InvalidArgumentError("no answer before the first frame chose the dialect")


# --- GET_LIST_OF_ENTRIES_OF_LEDGER's bytes ------------------------------------------------------


def encode_availability(entries: list[int]) -> bytes:
    """BookKeeper's AvailabilityOfEntriesOfLedger bytes for the sorted entry ids
    ``entries``: a 64-byte header (version 0, number of sequence groups, zeros), then
    per group first sequence start i64, last sequence start i64, sequence size i32,
    period i32. Here each run of consecutive ids is one group (period 0), which
    BookKeeper's reader (isEntryAvailable, getTotalNumOfAvailableEntries) reads right."""
    groups: list[tuple[int, int]] = []  # (start, size)
    for entry in entries:
        if groups and groups[-1][0] + groups[-1][1] == entry and groups[-1][1] < 2**31 - 1:
            groups[-1] = (groups[-1][0], groups[-1][1] + 1)
        elif not groups or entry >= groups[-1][0] + groups[-1][1]:
            groups.append((entry, 1))
    head = _AVAIL_HEAD.pack(0, len(groups)).ljust(_AVAIL_HEADER_SIZE, b"\0")
    return head + b"".join(_AVAIL_GROUP.pack(start, start, size, 0) for start, size in groups)


def decode_availability(data: bytes) -> list[int]:
    """The entry ids AvailabilityOfEntriesOfLedger bytes name (any period, as
    BookKeeper's reader); InvalidArgumentError for bytes that are none."""
    if len(data) < _AVAIL_HEADER_SIZE:
        raise InvalidArgumentError("availability shorter than its header", size=len(data))
    version, count = _AVAIL_HEAD.unpack_from(data)
    if version != 0 or count < 0 or len(data) < _AVAIL_HEADER_SIZE + count * _AVAIL_GROUP.size:
        raise InvalidArgumentError("bad availability header", version=version, groups=count)
    found: list[int] = []
    for i in range(count):
        first, last, size, period = _AVAIL_GROUP.unpack_from(data, _AVAIL_HEADER_SIZE + i * _AVAIL_GROUP.size)
        starts = [first] if period == 0 else range(first, last + 1, period)
        for start in starts:
            found.extend(range(start, start + size))
    return found
