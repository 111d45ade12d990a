"""The client side of a connection to an Apache BookKeeper bookie, sans-IO: walkit's
requests out in BookKeeper's v3 or v2 dialect, the bookie's answers back as walkit's
responses, matched to their requests (docs/format.md, "BookKeeper wire dialects").

Theory of operation. The ledger client speaks in walkit's messages
(:mod:`walkit.protocol._messages`); :class:`BkClientConnection` spells each in the
dialect it was made for with the codecs' client sides (:mod:`walkit.protocol._bk_v3`,
:mod:`walkit.protocol._bk_v2`) and reads the answers back, so the layers above see the
same messages and the same errors whichever bookie answers. :meth:`send` gives a
request its id and its frame; :meth:`receive` takes bytes off the socket and gives
``(request id, response)`` pairs (an :class:`ErrorResponse` for an error status, which
the caller turns into walkit's error with :func:`walkit.protocol.error_for`: EFENCED ->
LedgerFencedError, ENOENTRY / ENOLEDGER -> NoSuchEntryError / NoSuchLedgerError, EUA
-> UnauthorizedError, ...).

Matching. v3 carries the request id as the txnId. v2 has none but for BATCH_READ_ENTRY:
an answer names its op, ledger and entry, and answers to requests of the same (op,
ledger, entry) come back in order, so each such key keeps the ids of its requests in
flight, oldest first.

What each request becomes, and what does not travel:

=================  ==========================================  ================================
walkit request     v3                                          v2
=================  ==========================================  ================================
AddEntry           ADD_ENTRY (RECOVERY_ADD flag)               ADDENTRY (FLAG_RECOVERY_ADD)
ReadEntry          READ_ENTRY (FENCE_LEDGER; long poll:        READENTRY (FLAG_DO_FENCING); a
                   previousLAC + timeOut)                      long poll is :func:`v2_refusal`'s
ReadLac            READ_LAC: the last LAC body and the last    READENTRY of entry -1: the last
                   entry, both the writer's digest             entry (its header's LAC)
WriteLac           WRITE_LAC with its body                     refused (BookKeeper sends it in
                                                               v3 only)
GetBookieInfo      GET_BOOKIE_INFO                             refused
GetListOfEntries   GET_LIST_OF_ENTRIES_OF_LEDGER (the          refused (BookKeeper sends it in
                   availability bytes, kept as they came)      v3 only)
ReadRange          refused: op INVALID (the reads then go      BATCH_READ_ENTRY (BookKeeper
                   entry by entry, as from an older bookie)    4.17+), matched by its request id
admin commands     refused                                     refused
=================  ==========================================  ================================

Whatever the dialect, a READ_LAC answer keeps its bodies (``last_entry``,
``lac_body``) for the reader's entry codec to check (the connection knows no digest),
and a read of entry -1 is answered under the id of the entry the bookie returned
(the codecs' client sides decode it so).
A refused request never reaches the wire: :meth:`send` raises the ProtocolError
(context ``op="INVALID"``) that a caller hands back as that request's answer.

TLS. A client configured with TLS opens the connection as BookKeeper's does: before any
other request, :meth:`start_tls` spells START_TLS - in v3 whatever the dialect, as
BookKeeper's v2 clients send it too - and :meth:`tls_started` reads its answer: EOK
means the caller now runs the TLS handshake on the same connection (the bookie is the
TLS server) and goes on in the dialect; an error status (EBADREQ: a bookie without TLS)
is a ProtocolError naming TLS.
"""

from __future__ import annotations

import collections
import itertools
import struct

from walkit.errors import InvalidArgumentError, ProtocolError
from walkit.protocol import _bk_v2, _bk_v3
from walkit.protocol._codes import DEFAULT_MAX_FRAME_SIZE, Op
from walkit.protocol._dialect import Dialect
from walkit.protocol._messages import (
    AddEntry,
    StartTls,
    StartTlsResponse,
    AddEntryResponse,
    BookieInfoResponse,
    ErrorResponse,
    GetBookieInfo,
    GetListOfEntries,
    ListOfEntriesResponse,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadLacResponse,
    ReadRange,
    ReadRangeResponse,
    Request,
    Response,
    WriteLac,
    WriteLacResponse,
)

__all__ = ["Answer", "BkClientConnection", "refusal"]

#: what an answer can be: walkit's responses, and the list of entries a BookKeeper bookie stores
Answer = Response | ListOfEntriesResponse

_LEN = struct.Struct(">I")
_V2_IDS = struct.Struct(">Iiqq")  # header, rc, ledger, entry of a v2 answer
# what a v3 answer to one of walkit's requests can be
_ANSWERS = (AddEntryResponse, ReadEntryResponse, ReadLacResponse, WriteLacResponse, BookieInfoResponse,
            ListOfEntriesResponse, ErrorResponse)
_READ, _ADD, _BATCH = (int(_bk_v2.V2Op.READENTRY), int(_bk_v2.V2Op.ADDENTRY),
                       int(_bk_v2.V2Op.BATCH_READ_ENTRY))


def refusal(request: object, dialect: Dialect, why: str) -> ProtocolError:
    """The error a request this dialect cannot carry gets (context ``op="INVALID"``:
    what an older walkit bookie answers to an op it does not know)."""
    return ProtocolError(f"a BookKeeper bookie in {dialect.value} {why}", dialect=dialect.value, op="INVALID",
                         request=type(request).__name__, ledger=getattr(request, "ledger_id", None))


class BkClientConnection:
    """One connection's wire state: request ids, frames half received, v2 matching."""

    def __init__(self, dialect: Dialect, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if dialect not in (Dialect.BK_V3, Dialect.BK_V2):
            raise InvalidArgumentError("a BookKeeper connection speaks bk-v3 or bk-v2", dialect=dialect.value)
        self.dialect = dialect
        self.max_frame_size = max_frame_size
        self._ids = itertools.count(1)
        self._buffer = bytearray()
        self._v3_in_flight: set[int] = set()  # v3: ids of the requests in flight
        # v2: (op, ledger, entry) -> ids of its requests in flight, oldest first; and which
        # ids asked for a ReadLac (a read of -1 answered as READ_LAC)
        self._v2_waiting: dict[tuple[int, int, int], collections.deque[int]] = {}
        self._v2_lac: set[int] = set()
        self._v2_batches: set[int] = set()  # ids of batch reads in flight (their answers name them)
        self._tls_id: int | None = None  # the START_TLS waiting for its answer

    def start_tls(self) -> bytes:
        """The START_TLS frame (v3, whatever the dialect) to send before any other
        request; its answer is read with :meth:`tls_started`."""
        rid = next(self._ids)
        self._tls_id = rid
        return bytes(_bk_v3.encode_request(StartTls(rid), max_frame_size=self.max_frame_size))

    def tls_started(self, data: bytes) -> bool:
        """Bytes received while START_TLS waits: False until its answer is complete, True
        for EOK (then, and only then, the handshake starts). ProtocolError for any other
        answer, or for bytes after it (the bookie speaks first only in TLS)."""
        buf = self._buffer
        buf += data
        if len(buf) < 4:
            return False
        (size,) = _LEN.unpack_from(buf)
        if size + 4 > self.max_frame_size:
            raise ProtocolError("START_TLS answer larger than max_frame_size", dialect="bk-v3", size=size + 4)
        if len(buf) < 4 + size:
            return False
        answer = _bk_v3.decode_response(bytes(buf[4:4 + size]))
        extra = len(buf) - 4 - size
        buf.clear()
        if isinstance(answer, ErrorResponse):
            raise ProtocolError("the bookie refused START_TLS (TLS not configured there?)", dialect="bk-v3",
                                status=answer.status.name)
        if not isinstance(answer, StartTlsResponse) or answer.request_id != self._tls_id or extra:
            raise ProtocolError("no START_TLS answer where one was due", dialect="bk-v3",
                                answer=type(answer).__name__)
        self._tls_id = None
        return True

    @property
    def v2(self) -> bool:
        return self.dialect is Dialect.BK_V2

    def send(self, request: Request | GetListOfEntries) -> tuple[int, bytes]:
        """(request id, frame) for ``request``; ProtocolError (op INVALID) when this
        dialect cannot carry it (nothing is sent), InvalidArgumentError for a request
        BookKeeper refuses to spell (a v2 master key that is not 20 bytes)."""
        rid = next(self._ids)
        if self.v2:
            return rid, self._send_v2(request, rid)
        if not isinstance(request, (AddEntry, ReadEntry, ReadLac, WriteLac, GetBookieInfo, GetListOfEntries)):
            raise refusal(request, self.dialect, "has no such request")
        frame = _bk_v3.encode_request(_with_id(request, rid), max_frame_size=self.max_frame_size)
        self._v3_in_flight.add(rid)
        return rid, frame

    def _send_v2(self, request: Request | GetListOfEntries, rid: int) -> bytes:
        if isinstance(request, ReadLac):
            wire: AddEntry | ReadEntry = ReadEntry(request.ledger_id, -1)
            self._v2_lac.add(rid)
        elif isinstance(request, AddEntry):
            wire = request
        elif isinstance(request, ReadEntry):
            if request.previous_lac is not None:
                raise refusal(request, self.dialect, "has no long polls")
            wire = request
        elif isinstance(request, ReadRange):  # BATCH_READ_ENTRY (BookKeeper 4.17 and later): its request id travels
            frame = _bk_v2.encode_request(ReadRange(request.ledger_id, request.first_entry, request.count,
                                                    request.max_bytes, rid), max_frame_size=self.max_frame_size)
            self._v2_batches.add(rid)
            return frame
        else:
            raise refusal(request, self.dialect, "has no such request (BookKeeper sends it in v3 only)")
        frame = _bk_v2.encode_request(wire, max_frame_size=self.max_frame_size)
        key = (_ADD if isinstance(wire, AddEntry) else _READ, wire.ledger_id, wire.entry_id)
        self._v2_waiting.setdefault(key, collections.deque()).append(rid)
        return frame

    def receive(self, data: bytes) -> list[tuple[int, Answer]]:
        """The answers ``data`` completes, each with its request's id (answers to nothing
        in flight are dropped). ProtocolError for bytes that are not the dialect: the
        connection is then unusable."""
        buf = self._buffer
        buf += data
        out: list[tuple[int, Answer]] = []
        at = 0
        while len(buf) - at >= 4:
            (size,) = _LEN.unpack_from(buf, at)
            if size + 4 > self.max_frame_size:
                raise ProtocolError("answer larger than max_frame_size", dialect=self.dialect.value, size=size + 4,
                                    limit=self.max_frame_size)
            if len(buf) - at - 4 < size:
                break
            frame = bytes(buf[at + 4:at + 4 + size])
            at += 4 + size
            answered = self._answer_v2(frame) if self.v2 else self._answer_v3(frame)
            if answered is not None:
                out.append(answered)
        del buf[:at]
        return out

    def _answer_v3(self, frame: bytes) -> tuple[int, Answer] | None:
        resp = _bk_v3.decode_response(frame)
        rid = resp.request_id
        if rid not in self._v3_in_flight or not isinstance(resp, _ANSWERS):  # an answer to nothing in flight
            return None
        self._v3_in_flight.discard(rid)
        return rid, resp

    def _answer_v2(self, frame: bytes) -> tuple[int, Answer] | None:
        resp = _bk_v2.decode_response(frame)
        op = frame[1]  # the header's opcode byte (version, op, flags)
        if op == _BATCH:
            if resp.request_id not in self._v2_batches or not isinstance(resp, (ReadRangeResponse, ErrorResponse)):
                return None
            self._v2_batches.discard(resp.request_id)
            return resp.request_id, resp
        if op not in (_READ, _ADD):
            return None  # an AUTH answer: nothing waits for one
        _, _, ledger, entry = _V2_IDS.unpack_from(frame)
        waiting = self._v2_waiting.get((op, ledger, entry))
        if not waiting:
            return None
        rid = waiting.popleft()
        if not waiting:
            del self._v2_waiting[(op, ledger, entry)]
        if rid in self._v2_lac:
            self._v2_lac.discard(rid)
            if isinstance(resp, ReadEntryResponse):
                return rid, ReadLacResponse(ledger, resp.lac, 0, last_entry=resp.data)
            if isinstance(resp, ErrorResponse):
                return rid, ErrorResponse(Op.READ_LAC, resp.status, ledger, -1, resp.message, 0)
        if isinstance(resp, (AddEntryResponse, ReadEntryResponse, ErrorResponse)):
            return rid, resp
        return None


def _with_id(request: Request | GetListOfEntries, rid: int) -> Request | GetListOfEntries:
    """``request`` carrying ``rid`` as its id (the txnId of its v3 frame)."""
    if isinstance(request, AddEntry):
        return AddEntry(request.ledger_id, request.entry_id, request.master_key, request.data, request.recovery, rid)
    if isinstance(request, ReadEntry):
        return ReadEntry(request.ledger_id, request.entry_id, request.fence, request.master_key,
                         request.previous_lac, request.timeout_ms, request_id=rid)
    if isinstance(request, ReadLac):
        return ReadLac(request.ledger_id, rid)
    if isinstance(request, WriteLac):
        return WriteLac(request.ledger_id, request.lac, request.master_key, rid, request.body)
    if isinstance(request, GetListOfEntries):
        return GetListOfEntries(request.ledger_id, rid)
    return GetBookieInfo(rid)

