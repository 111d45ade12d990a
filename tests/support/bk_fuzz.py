"""Hypothesis strategies for BookKeeper's v3 and v2 frames, valid, mutated and random
(issue 37): shared by tests/unit/test_bk_fuzz.py and tests/cluster/test_fuzz_bookie.py.
``any_v3`` / ``any_v2`` draw frame bodies (no length prefix); :func:`framed` adds it."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import strategies as st

from walkit.protocol import (
    AddEntry,
    AddEntryResponse,
    AuthMessage,
    ErrorResponse,
    ForceLedger,
    GetBookieInfo,
    GetListOfEntries,
    Op,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadLacResponse,
    ReadRange,
    ReadRangeResponse,
    StartTls,
    Status,
    WriteLac,
)
from walkit.protocol import _bk_v2, _bk_v3, _bk_v3_pb2

pb: Any = _bk_v3_pb2
FieldDescriptor: Any = type(pb.Request.DESCRIPTOR.fields[0])  # its TYPE_* constants

__all__ = ["any_v3", "any_v2", "framed", "mutated"]

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
    st.builds(lambda l, e, c, rid: ReadRange(l, e, c, 4096, rid), _ids, st.integers(0, 2**62), st.integers(1, 50),
              st.integers(0, 2**63 - 1)),
    st.builds(lambda name, p: AuthMessage(name, p), st.text(max_size=10), _body),
)


@st.composite
def mutated(draw: st.DrawFn, frames: st.SearchStrategy[bytes]) -> bytes:
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


_statuses = st.sampled_from([Status.ENOENTRY, Status.ENOLEDGER, Status.EFENCED, Status.EUA, Status.EIO])
_entry = st.builds(lambda l, e, b: struct.pack(">qqq", l, e, e - 1) + b, _ids, _ids, _body)
_responses: st.SearchStrategy[Any] = st.one_of(  # what both dialects can say
    st.builds(AddEntryResponse, _ids, _ids),
    st.builds(lambda l, e, d: ReadEntryResponse(l, e, e - 1, d), _ids, st.integers(0, 2**62), _entry),
    st.builds(lambda op, s, l, e: ErrorResponse(op, s, l, e, s.name), st.sampled_from([Op.ADD_ENTRY, Op.READ_ENTRY]),
              _statuses, _ids, _ids),
    st.builds(lambda name, p: AuthMessage(name, p), st.text(max_size=10), _body),
)
_v3_responses = st.one_of(_responses, st.builds(ReadLacResponse, _ids, st.integers(-1, 2**62)))
_v2_responses = st.one_of(_responses, st.builds(lambda l, e, d, rid: ReadRangeResponse(l, e, e + len(d) - 2,
                                                                                       tuple(d), rid),
                                                _ids, st.integers(0, 2**62), st.lists(_entry, min_size=1, max_size=3),
                                                st.integers(0, 2**63 - 1)))
_v3_answers = _v3_responses.map(lambda r: bytes(_bk_v3.encode_response(r))[4:])
_v2_answers = _v2_responses.map(lambda r: bytes(_bk_v2.encode_response(r))[4:])

any_v3 = st.one_of(st.binary(max_size=200), mutated(_v3_bodies), _protobuf(pb.Request), _protobuf(pb.Response),
                   mutated(_protobuf(pb.Request)), mutated(_v3_answers))
any_v2 = st.one_of(st.binary(max_size=200), mutated(_v2_bodies), _v2_headers(),
                   _v2_headers().map(lambda b: b[:4]), mutated(_v2_answers))


def framed(body: bytes) -> bytes:
    """``body`` with the 4-byte big-endian length all three dialects frame with."""
    return struct.pack(">I", len(body)) + body
