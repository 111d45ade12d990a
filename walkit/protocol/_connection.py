"""One connection's protocol state, sans-IO: the bookie's side
(:class:`ServerConnection`) and the client's (:class:`ClientConnection`).

Theory of operation. Nothing here touches a socket, a thread or an event loop (h11
style): the asyncio transports of ``bookie/server/_connection.py`` and the client hand received
bytes to ``receive()`` and write the bytes ``send()`` returns. Frames are cut by a
:class:`~walkit.protocol._frames.FrameDecoder` and spelled by the walkit dialect
(:mod:`walkit.protocol._codec`).

The server side never raises: a malformed frame becomes an :class:`ErrorResponse`
(EBADREQ) to send back and the connection stays usable; another protocol version gets
EBADVERSION and :attr:`ServerConnection.closing` (nothing after that frame counts); a
bad length prefix gets EBADREQ and closing (the stream cannot be resynchronized). The
client side numbers requests 1, 2, 3, ... and matches responses by id, in any order; a
response nobody asked for, of the wrong op, or a bad frame is fatal and raised again by
every later ``receive()``.

A WRITE_LAC with a body (flag LAC_BODY, added 2026-12-06) is refused by older bookies
(EBADREQ: a flag they do not know), so the client side learns per connection whether its
bookie takes one: the first such WRITE_LAC goes with its body and, until it is answered,
later ones are held back (numbered, not sent). Its answer decides - EBADREQ: an older
bookie, so it and the held ones go again without their bodies under the same ids (the
LAC itself still reaches the bookie) and no later one carries a body; anything else: the
held ones go as they are. The frames it sends of its own accord are taken by
:meth:`ClientConnection.data_to_send` after each ``receive()``. An older bookie so sees
one bad frame per connection, far below the count at which it closes one.

Both sides have a hot path for ADD_ENTRY and its answers that cuts frames inline and
builds the message without a second range test (``_trusted_add`` /
``_trusted_added``); each states the exact shape it accepts, and any other frame goes
through :func:`decode_request` / :func:`decode_response`, so the answer to every frame
is the one the general path gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from walkit.errors import FrameTooLargeError, ProtocolError, ProtocolVersionError
from walkit.protocol._codec import (
    _ADD_HEAD,
    _ADD_REQ,
    _ADD_RESP,
    _HEAD,
    _RANGE_ANSWER,
    _RECOVERY_ADD,
    _REQUEST_DECODERS,
    _REQUEST_ENCODERS,
    _RESPONSE_ENCODERS,
    _V,
    _add_resp_frame,
    _enc_add,
    _encode,
    decode_request,
    decode_response,
    encode_response,
)
from walkit.protocol._codes import DEFAULT_MAX_FRAME_SIZE, HEADER_SIZE, MAX_KEY_SIZE, Op, Status
from walkit.protocol._frames import _LENGTH, Buffer, FrameDecoder
from walkit.protocol._messages import (
    _I63,
    _OPS,
    _REQUEST_OP,
    AddEntry,
    ErrorResponse,
    Request,
    Response,
    WriteLac,
    _new,
    _response_op,
    _trusted_added,
)

__all__ = ["ServerConnection", "ClientConnection"]


class _Entry(Protocol):
    """What :meth:`ClientConnection.send_adds` reads of an entry it sends."""

    @property
    def entry_id(self) -> int: ...

    @property
    def data(self) -> bytes: ...


class WireCodec(Protocol):
    """The C side of :class:`ServerConnection`'s hot path (``bookie._frames``, built from
    ``native/walkit_wire.c``): the same messages and bytes as the Python loop, the reference."""

    def cut_adds(self, src: bytes, off: int, limit: int, add_type: type[AddEntry],
                 events: list[Request | ErrorResponse]) -> int:
        """Append the AddEntry of each hot-path ADD_ENTRY frame from ``src[off:]`` to
        ``events``, up to the first frame that is not one; its offset."""
        ...

    def pack_added(self, reqs: list[AddEntry], version: int) -> bytes | None:
        """The answer frames of ``reqs``, or None when their ids are not the wire's."""
        ...


class ServerConnection:
    """A bookie's side of one connection: frames in, requests (or errors to send) out."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, c_wire: WireCodec | None = None) -> None:
        self._decoder = FrameDecoder(max_frame_size)
        self._max = max_frame_size
        self._closing = False
        #: The C cut of the add hot path and packing of its answers (a bookie's
        #: ``bookie._frames``), or None: all in Python, the reference.
        self._c = c_wire

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
        exactly the answer it got before (the same checks, the same messages). With
        ``c_wire``, its ``cut_adds`` takes the runs of such adds (the same messages), this
        loop every frame it stops at."""
        if self._closing:
            return []
        decoder = self._decoder
        src = decoder.join(data)
        events: list[Request | ErrorResponse] = []
        n, off, limit, length_of, add_head = len(src), 0, decoder.limit, _LENGTH.unpack_from, _ADD_HEAD.unpack_from
        new, add_entry, append = _new, AddEntry, events.append
        cut = None if self._c is None else self._c.cut_adds
        error: ProtocolError | None = None
        while n - off >= 4:
            if cut is not None:  # the hot path for a run of adds in one C call; the loop takes the frame it stops at
                off = cut(src, off, limit, add_entry, events)
                if n - off < 4:
                    break
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
                    req = new(add_entry)  # _trusted_add(...), inlined: a call less per add
                    fields = req.__dict__
                    fields["ledger_id"], fields["entry_id"] = ledger, entry
                    fields["master_key"] = src[off + 33 : key_end]
                    fields["data"], fields["recovery"], fields["request_id"] = src[key_end:end], flags == 1, rid
                    append(req)
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
        if self._c is not None and len(reqs) > 1:
            frames = self._c.pack_added(reqs, _V)
            if frames is not None:  # else: a message's ids are not the wire's (the join below raises)
                return frames
        if len(reqs) == 1:  # a lone add's answer: its frame, no list or join
            r = reqs[0]
            return pack(28, _V, 0x81, 0, r.request_id, r.ledger_id, r.entry_id)
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
        self._lac_bodies: bool | None = None  # whether the bookie takes WRITE_LAC bodies
        #: the WRITE_LAC with a body whose answer tells (its id, it), and those held back meanwhile
        self._asking: tuple[int, WriteLac] | None = None
        self._held: list[tuple[int, WriteLac, bytes]] = []
        self._output: list[bytes] = []

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def takes_lac_bodies(self) -> bool | None:
        """Whether the bookie takes a WRITE_LAC's body (flag LAC_BODY): None until the
        first WRITE_LAC with one is answered."""
        return self._lac_bodies

    def pending_ids(self) -> list[int]:
        """Ids of the requests sent and not answered, oldest first."""
        return list(self._pending)

    def send(self, req: Request) -> tuple[int, bytes]:
        """(request id, frame): ``req.request_id`` is replaced by the next id of this connection."""
        rid = self._next_id
        if type(req) is AddEntry and 33 + len(req.master_key) + len(req.data) <= self._max:
            frame = _enc_add(req, rid)  # the hot path: no table look-up, the size known
            op = Op.ADD_ENTRY
        elif type(req) is WriteLac and req.body and self._lac_bodies is not True:
            frame = self._lac_frame(req, rid)
            op = Op.WRITE_LAC
        else:
            frame = _encode(_REQUEST_ENCODERS, req, self._max, rid)
            op = _REQUEST_OP[type(req)]
        self._next_id = rid + 1
        self._pending[rid] = op
        return rid, frame

    def _lac_frame(self, req: WriteLac, rid: int) -> bytes:
        """The frame of a WRITE_LAC with a body while the bookie's answer to bodies is not
        known to take them (module docstring): without it, with it (the one that asks),
        or nothing yet (held until that one is answered)."""
        if self._lac_bodies is False:
            return self._without_body(req, rid)
        frame = _encode(_REQUEST_ENCODERS, req, self._max, rid)  # refuses a bad body now, not when released
        if self._asking is None:
            self._asking = (rid, req)
            return frame
        self._held.append((rid, req, frame))
        return b""

    def _lac_answered(self, resp: Response) -> bool:
        """The answer to the WRITE_LAC that asked whether the bookie takes bodies: release
        the held ones. True when it was an older bookie's refusal (EBADREQ): then that
        WRITE_LAC went again without its body and is still pending."""
        assert self._asking is not None
        rid, req = self._asking
        self._asking = None
        refused = isinstance(resp, ErrorResponse) and resp.status is Status.EBADREQ
        self._lac_bodies = not refused
        held, self._held = self._held, []
        if refused:
            held.insert(0, (rid, req, b""))
        for held_rid, held_req, frame in held:
            self._output.append(self._without_body(held_req, held_rid) if refused else frame)
        return refused

    def _without_body(self, req: WriteLac, rid: int) -> bytes:
        """The frame of ``req`` without its body: the WRITE_LAC every bookie reads."""
        return _encode(_REQUEST_ENCODERS, replace(req, body=b""), self._max, rid)

    def data_to_send(self) -> bytes:
        """Frames this connection sends of its own accord, to write after a ``receive()``:
        WRITE_LACs held back or sent again (module docstring); usually none."""
        if not self._output:
            return b""
        out, self._output = self._output, []
        return b"".join(out)

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

    def send_adds(self, ledger_id: int, key: bytes, recovery: bool, entries: Sequence[_Entry],
                  out: list[bytes]) -> tuple[int, list[int]]:
        """:meth:`send_add` for a run of entries of one ledger (a writer's batch to one
        bookie), numbered in order from the id returned: each one's head, ``key`` and
        ``entry.data`` are appended to ``out``, exactly as ``send_add`` makes them. Ids and
        key are the caller's to check (a writer's come from a checked ledger: an
        :class:`AddEntry` of the same fields would pass). An entry whose frame would be
        over the maximum frame size is not sent and not pending: its id is in the list
        returned (the caller fails it), and the ids go on past it."""
        return self.send_add_groups([(ledger_id, key, recovery, entries)], out)

    def send_add_groups(self, groups: Sequence[tuple[int, bytes, bool, Sequence[_Entry]]],
                        out: list[bytes]) -> tuple[int, list[int]]:
        """:meth:`send_adds` for the runs of several ledgers at once (``(ledger_id, key,
        recovery, entries)`` each: the batches of many writers to one bookie), numbered
        in order across the groups from the id returned; frames of different ledgers
        share the write."""
        first = rid = self._next_id
        pack, limit = _ADD_REQ.pack, self._max - 33
        refused: list[int] = []
        for ledger_id, key, recovery, entries in groups:
            klen, flags = len(key), _RECOVERY_ADD if recovery else 0
            for entry in entries:
                data = entry.data
                if len(data) + klen > limit:
                    refused.append(rid)
                else:
                    out += (pack(29 + klen + len(data), _V, 1, flags, rid, ledger_id, entry.entry_id, klen), key, data)
                rid += 1
        self._next_id = rid
        pending = self._pending
        pending.update(dict.fromkeys(range(first, rid), Op.ADD_ENTRY))
        for refused_rid in refused:
            del pending[refused_rid]
        return first, refused

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
                matched = self._match(decode_response(frame))
                if matched is not None:
                    append(matched)
                off = end
        except ProtocolError as exc:
            self._error = exc
            raise
        decoder.keep(src, off)
        if error is not None:
            self._error = error
            raise error
        return responses

    def _match(self, resp: Response) -> Response | None:
        """The response to a pending request, or None when it is not one to hand on (an
        older bookie's refusal of a WRITE_LAC's body: the request went again)."""
        rid, op = resp.request_id, _response_op(resp)
        expected = self._pending.get(rid)
        if expected is None:  # an error here may be the bookie refusing the whole stream (id 0)
            told = {"status": resp.status.name, "said": resp.message} if isinstance(resp, ErrorResponse) else {}
            raise ProtocolError("response to no pending request", request_id=rid, op=op.name, **told)
        if op != expected and op is not Op.INVALID:
            raise ProtocolError("response op does not match the request", request_id=rid, op=op.name,
                                expected=expected.name)
        if self._asking is not None and rid == self._asking[0] and self._lac_answered(resp):
            return None
        del self._pending[rid]
        return resp
