"""Fuzzing BookKeeper's v3 (protobuf) and v2 (binary) dialects below the socket (issue 37):
hypothesis feeds arbitrary bytes and mutated valid frames to the codecs' four decoders,
to :class:`BkServerConnection` and to :class:`DialectSniffer`. A decoder answers a
frame or raises ProtocolError, nothing else; a connection never raises, and closes or
stays as docs/format.md's table of bad input says (a v3 Request that parses but is not
served: header-only EBADREQ, the connection stays; a frame that is no Request, a v2
frame that does not decode: closed, no answer; a later v2 version: EBADVERSION, stays).

``WALKIT_FUZZ_EXAMPLES`` raises the example count (CI runs the default)."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from google.protobuf.descriptor import FieldDescriptor

from walkit.errors import ProtocolError
from walkit.protocol import (
    AddEntry,
    AuthMessage,
    ForceLedger,
    GetBookieInfo,
    GetListOfEntries,
    ReadEntry,
    ReadLac,
    ReadRange,
    StartTls,
    WriteLac,
)
from walkit.protocol import _bk_v2, _bk_v3, _bk_v3_pb2
from walkit.protocol._bk_connection import BkErrorResponse, BkServerConnection, DialectSniffer
from walkit.protocol._dialect import Dialect

pb: Any = _bk_v3_pb2
pytestmark = pytest.mark.timeout(120)

EXAMPLES = int(os.environ.get("WALKIT_FUZZ_EXAMPLES", "120"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEY = bytes(range(20))
_ids = st.integers(0, 2**63 - 1)
_entries = st.one_of(st.just(-1), st.integers(0, 5), _ids)
_txn = st.integers(0, 2**64 - 1)
_body = st.binary(max_size=64)

_v3_requests: st.SearchStrategy[Any] = st.one_of(
    st.builds(AddEntry, _ids, _ids, st.just(KEY), _body, st.booleans(), _txn),
    st.builds(lambda l, e, f, t: ReadEntry(l, e, f, KEY if f else b"", request_id=t), _ids, _entries,
              st.booleans(), _txn),
    st.builds(lambda l, e, t: ReadEntry(l, e + 1, previous_lac=e, timeout_ms=100, request_id=t),
              _ids, st.integers(-1, 100), _txn),
    st.builds(ReadLac, _ids, _txn),
    st.builds(lambda l, lac, t: WriteLac(l, lac, KEY, t), _ids, st.integers(-1, 100), _txn),
    st.builds(GetBookieInfo, _txn),
    st.builds(ForceLedger, _ids, _txn),
    st.builds(GetListOfEntries, _ids, _txn),
    st.builds(AuthMessage, st.text(max_size=10), _body, _txn),
    st.builds(StartTls, _txn),
)
_v2_requests: st.SearchStrategy[Any] = st.one_of(
    st.builds(lambda l, e, b, r: AddEntry(l, e, KEY, struct.pack(">qq", l, e) + b, r), _ids, _ids, _body,
              st.booleans()),
    st.builds(lambda l, e, f: ReadEntry(l, e, f, KEY if f else b""), _ids, _entries, st.booleans()),
    st.builds(lambda l, e, c, rid: ReadRange(l, e, c, 4096, rid), _ids, _ids, st.integers(1, 50),
              st.integers(0, 2**63 - 1)),
    st.builds(lambda name, p: AuthMessage(name, p), st.text(max_size=10), _body),
)


@st.composite
def _mutated(draw: st.DrawFn, frames: st.SearchStrategy[bytes]) -> bytes:
    """A frame body (no length prefix) with bits flipped, cut, grown, bytes swapped or
    a length-like byte rewritten."""
    body = bytearray(draw(frames))
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["flip", "cut", "insert", "swap", "byte"]))
        if how == "flip" and body:
            i = draw(st.integers(0, len(body) - 1))
            body[i] ^= 1 << draw(st.integers(0, 7))
        elif how == "cut" and body:
            del body[draw(st.integers(0, len(body) - 1)):]
        elif how == "insert":
            i = draw(st.integers(0, len(body)))
            body[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif how == "swap" and len(body) >= 2:
            i, j = draw(st.integers(0, len(body) - 1)), draw(st.integers(0, len(body) - 1))
            body[i], body[j] = body[j], body[i]
        elif how == "byte" and body:  # protobuf lengths and varints live in single bytes
            body[draw(st.integers(0, len(body) - 1))] = draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]))
    return bytes(body)


_v3_bodies = _v3_requests.map(lambda r: bytes(_bk_v3.encode_request(r))[4:])
_v2_bodies = _v2_requests.map(lambda r: bytes(_bk_v2.encode_request(r))[4:])


def _fill(draw: st.DrawFn, msg: Any, depth: int = 0) -> None:
    """Set a random subset of ``msg``'s fields to random values of their types (required
    ones may stay unset: a Request whose sub-message lacks them is no Request)."""
    for fd in msg.DESCRIPTOR.fields:
        if getattr(fd, "is_repeated", False) or not draw(st.booleans()):
            continue
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            if depth < 1:
                _fill(draw, getattr(msg, fd.name), depth + 1)
                getattr(msg, fd.name).SetInParent()
        elif fd.type == FieldDescriptor.TYPE_ENUM:
            setattr(msg, fd.name, draw(st.sampled_from([v.number for v in fd.enum_type.values])))
        elif fd.type == FieldDescriptor.TYPE_BYTES:
            setattr(msg, fd.name, draw(st.binary(max_size=32)))
        elif fd.type == FieldDescriptor.TYPE_STRING:
            setattr(msg, fd.name, draw(st.text(max_size=8)))
        elif fd.type == FieldDescriptor.TYPE_BOOL:
            setattr(msg, fd.name, draw(st.booleans()))
        elif fd.type in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
            setattr(msg, fd.name, draw(st.integers(0, 2**64 - 1)))
        elif fd.type in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
            setattr(msg, fd.name, draw(st.integers(0, 2**32 - 1)))
        elif fd.type in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
            setattr(msg, fd.name, draw(st.integers(-(2**31), 2**31 - 1)))
        else:
            setattr(msg, fd.name, draw(st.integers(-(2**63), 2**63 - 1)))


@st.composite
def _protobuf(draw: st.DrawFn, cls: Any) -> bytes:
    """A protobuf Request or Response: any operation, any (or no) sub-messages, fields
    set or not - valid protobuf, often not what its operation wants."""
    msg = cls()
    msg.header.version = draw(st.sampled_from([1, 2, 3]))
    msg.header.operation = draw(st.integers(1, 12))
    msg.header.txnId = draw(_txn)
    if draw(st.booleans()):
        _fill(draw, msg)
    if cls is pb.Response and draw(st.booleans()):
        msg.status = draw(st.sampled_from([v.number for v in pb.StatusCode.DESCRIPTOR.values]))
    return bytes(msg.SerializePartialToString())


@st.composite
def _v2_headers(draw: st.DrawFn) -> bytes:
    """Every v2 version, opcode and flags byte, then a body that may fit the opcode."""
    head = struct.pack(">BBH", draw(st.integers(0, 255)), draw(st.integers(0, 255)), draw(st.integers(0, 0xFFFF)))
    tail = draw(st.one_of(st.binary(max_size=80), _v2_bodies.map(lambda b: b[4:]),
                          st.binary(min_size=16, max_size=16).map(lambda b: b + KEY)))
    return head + tail


_any_v3 = st.one_of(st.binary(max_size=200), _mutated(_v3_bodies), _protobuf(pb.Request), _protobuf(pb.Response),
                    _mutated(_protobuf(pb.Request)))
_any_v2 = st.one_of(st.binary(max_size=200), _mutated(_v2_bodies), _v2_headers(),
                    _v2_headers().map(lambda b: b[:4]))


def _decodes(decode: Callable[[bytes], Any], body: bytes) -> Any:
    """What ``decode`` makes of ``body``: a message, or None when it raised ProtocolError
    (anything else escapes and fails the test)."""
    try:
        return decode(body)
    except ProtocolError:
        return None


def _is_request(body: bytes) -> bool:
    req = pb.Request()
    try:
        req.ParseFromString(body)
    except Exception:  # noqa: BLE001  (any parser failure: no Request)
        return False
    return bool(req.IsInitialized())


# --- the decoders ---------------------------------------------------------------------------


@FUZZ
@given(body=st.one_of(_any_v3, _any_v2))
def test_every_decoder_answers_or_raises_protocol_error(body: bytes) -> None:
    for codec in (_bk_v3, _bk_v2):
        _decodes(codec.decode_request, body)
        _decodes(codec.decode_response, body)


@FUZZ
@given(body=_any_v3)
def test_v3_decoded_requests_re_encode(body: bytes) -> None:
    """A frame the v3 decoder takes is a Request carrying a message the encoder can say
    again (an out-of-range field would show here as an encoder error)."""
    req = _decodes(_bk_v3.decode_request, body)
    if req is not None:
        assert _is_request(body)
        again = _bk_v3.decode_request(bytes(_bk_v3.encode_request(req))[4:])
        assert type(again) is type(req)


# --- the server connection: closed or stays, as the table says -----------------------------------


def _framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@FUZZ
@given(body=_any_v3)
def test_v3_connection_closes_or_stays_as_documented(body: bytes) -> None:
    conn = BkServerConnection(Dialect.BK_V3)
    events = conn.receive(_framed(body))
    if _decodes(_bk_v3.decode_request, body) is not None:
        assert len(events) == 1 and not isinstance(events[0], BkErrorResponse) and not conn.closing
    elif _is_request(body):  # parsed, not served: header-only EBADREQ, the connection stays
        assert len(events) == 1 and isinstance(events[0], BkErrorResponse) and events[0].frame
        assert not conn.closing
        answer = pb.Response()
        answer.ParseFromString(events[0].frame[4:])
        assert answer.status == pb.EBADREQ
    else:  # no Request: closed, no answer
        assert events == [] and conn.closing and conn.error is not None
    assert conn.receive(_framed(body)) == [] if conn.closing else True


@FUZZ
@given(body=_any_v2)
def test_v2_connection_closes_or_stays_as_documented(body: bytes) -> None:
    conn = BkServerConnection(Dialect.BK_V2)
    events = conn.receive(_framed(body))
    as_v2 = _decodes(_bk_v2.decode_request, bytes([2]) + body[1:]) if len(body) >= 4 else None
    if as_v2 is None:
        assert events == [] and conn.closing
        return
    assert len(events) == 1 and not conn.closing
    if body[0] > 2:  # a later version: EBADVERSION, with the request's ids
        assert isinstance(events[0], BkErrorResponse) and events[0].frame
    else:
        assert not isinstance(events[0], BkErrorResponse)


@FUZZ
@given(body=st.one_of(_any_v3, _any_v2), sizes=st.lists(st.integers(1, 4096), max_size=5))
def test_server_connection_is_deaf_to_how_bytes_are_cut(body: bytes, sizes: list[int]) -> None:
    """Two frames fed in arbitrary pieces give what they give in one piece."""
    data = _framed(body) * 2
    for dialect in (Dialect.BK_V3, Dialect.BK_V2):
        whole = BkServerConnection(dialect)
        expected = whole.receive(data)
        pieces = BkServerConnection(dialect)
        got, at = [], 0
        for size in sizes + [len(data)]:
            got += pieces.receive(data[at:at + size])
            at += size
        assert len(got) == len(expected) and pieces.closing == whole.closing
        assert [type(e) for e in got] == [type(e) for e in expected]


@FUZZ
@given(data=st.one_of(st.binary(max_size=300), _any_v3.map(_framed), _any_v2.map(_framed),
                      st.builds(lambda n, b: struct.pack(">I", n) + b, st.sampled_from([0, 1, 5, 2**31, 2**32 - 1]),
                                st.binary(max_size=20))),
       cut=st.integers(0, 300))
def test_sniffer_never_raises_and_chooses_once(data: bytes, cut: int) -> None:
    chosen: list[Any] = []
    sniffer = DialectSniffer(chosen.append)
    sniffer.receive(data[:cut])
    sniffer.receive(data[cut:])
    assert len(chosen) <= 1
    if len(data) >= 5 and data[4] in (1, 2):  # walkit's version byte, v2's: decided at once
        assert sniffer.dialect is (Dialect.WALKIT if data[4] == 1 else Dialect.BK_V2)
    sniffer.receive(b"\x00" * 8)
    assert len(chosen) <= 1
