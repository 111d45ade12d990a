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

from bookie.server._connection import C_WIRE
from support.bk_fuzz import any_v2, any_v3, framed
from walkit.errors import ProtocolError
from walkit.protocol import AuthMessage, ReadEntry, ReadEntryResponse, _bk_v2, _bk_v3, _bk_v3_pb2
from walkit.protocol._bk_connection import BkErrorResponse, BkServerConnection, DialectSniffer
from walkit.protocol._dialect import Dialect

pb: Any = _bk_v3_pb2
pytestmark = pytest.mark.timeout(120)

EXAMPLES = int(os.environ.get("WALKIT_FUZZ_EXAMPLES", "120"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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
@given(body=st.one_of(any_v3, any_v2))
def test_every_decoder_answers_or_raises_protocol_error(body: bytes) -> None:
    for codec in (_bk_v3, _bk_v2):
        _decodes(codec.decode_request, body)
        _decodes(codec.decode_response, body)


@FUZZ
@given(body=any_v3)
def test_v3_decoded_requests_re_encode(body: bytes) -> None:
    """A frame the v3 decoder takes is a Request carrying a message the encoder can say
    again (an out-of-range field would show here as an encoder error)."""
    req = _decodes(_bk_v3.decode_request, body)
    if req is not None:
        assert _is_request(body)
        again = _bk_v3.decode_request(bytes(_bk_v3.encode_request(req))[4:])
        assert type(again) is type(req)


# --- the server connection: closed or stays, as the table says -----------------------------------


@FUZZ
@given(body=any_v3)
def test_v3_connection_closes_or_stays_as_documented(body: bytes) -> None:
    conn = BkServerConnection(Dialect.BK_V3)
    events = conn.receive(framed(body))
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
    assert conn.receive(framed(body)) == [] if conn.closing else True


@FUZZ
@given(body=any_v2)
def test_v2_connection_closes_or_stays_as_documented(body: bytes) -> None:
    conn = BkServerConnection(Dialect.BK_V2)
    events = conn.receive(framed(body))
    as_v2 = _decodes(_bk_v2.decode_request, bytes([2]) + body[1:]) if len(body) >= 4 else None
    if as_v2 is None or (body[0] > 2 and isinstance(as_v2, AuthMessage)):  # (no error answer to AUTH)
        assert events == [] and conn.closing
        return
    assert len(events) == 1 and not conn.closing
    if body[0] > 2:  # a later version: EBADVERSION, with the request's ids
        assert isinstance(events[0], BkErrorResponse) and events[0].frame
    else:
        assert not isinstance(events[0], BkErrorResponse)
        if isinstance(events[0], ReadEntry) and events[0].entry_id < 0:  # numbered, to answer under -1
            assert events[0].request_id >= 1


@FUZZ
@given(body=st.one_of(any_v3, any_v2), sizes=st.lists(st.integers(1, 4096), max_size=5))
def test_server_connection_is_deaf_to_how_bytes_are_cut(body: bytes, sizes: list[int]) -> None:
    """Two frames fed in arbitrary pieces give what they give in one piece."""
    data = framed(body) * 2
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
@given(data=st.one_of(st.binary(max_size=300), any_v3.map(framed), any_v2.map(framed),
                      st.builds(lambda n, b: struct.pack(">I", n) + b, st.sampled_from([0, 1, 5, 2**31, 2**32 - 1]),
                                st.binary(max_size=20))),
       cut=st.integers(0, 300))
def test_sniffer_never_raises_and_chooses_once(data: bytes, cut: int) -> None:
    chosen: list[Any] = []
    sniffer = DialectSniffer(chosen.append)
    events = sniffer.receive(data[:cut]) + sniffer.receive(data[cut:])
    assert len(chosen) <= 1
    if len(data) >= 5 and data[4] in (1, 2):  # walkit's version byte, v2's: decided at once
        assert sniffer.dialect is (Dialect.WALKIT if data[4] == 1 else Dialect.BK_V2)
    if C_WIRE is not None:  # a bookie's sniffer, with the C hot path (issue 38): the same events
        with_c = DialectSniffer(lambda wire: None, c_wire=C_WIRE)
        assert list(map(repr, with_c.receive(data[:cut]) + with_c.receive(data[cut:]))) == list(map(repr, events))
    sniffer.receive(b"\x00" * 8)
    assert len(chosen) <= 1


@FUZZ
@given(body=st.one_of(any_v3, any_v2), limit=st.integers(5, 128))
def test_frames_past_the_maximum_close_unanswered(body: bytes, limit: int) -> None:
    """A frame longer than the maximum frame size closes the connection without an answer
    (Netty's TooLongFrameException), in both dialects and through the sniffer, once its
    length is in - the body need not come."""
    data = framed(body)
    for dialect in (Dialect.BK_V3, Dialect.BK_V2):
        conn = BkServerConnection(dialect, max_frame_size=limit)
        events = conn.receive(data[:4] if len(data) > limit else data)
        if len(data) > limit:
            assert events == [] and conn.closing
    if body[:1] == b"\x0a" and len(data) > limit:
        sniffer = DialectSniffer(lambda wire: None, max_frame_size=limit)
        assert sniffer.receive(data[:5]) == [] and sniffer.dialect is Dialect.BK_V3 and sniffer.closing


def test_v2_older_version_read_of_the_last_entry_is_answered_under_entry_minus_one() -> None:
    """Regression: a version 1 READ of entry -1 (LAST_ADD_CONFIRMED) skipped the numbering
    v2's READ of entry -1 gets, so its answer named the entry read, not -1, and the v2
    client, matching (ledger, entry), never found it. Now served as version 2's."""
    conn = BkServerConnection(Dialect.BK_V2)
    [req] = conn.receive(framed(struct.pack(">BBHqq", 1, _bk_v2.V2Op.READENTRY, 0, 7, -1)))
    assert isinstance(req, ReadEntry) and req.entry_id == -1 and req.request_id == 1
    entry = struct.pack(">qqq", 7, 5, 4) + b"data"
    frame = conn.send(ReadEntryResponse(7, 5, 4, entry, req.request_id))
    assert struct.unpack_from(">qq", frame, 12) == (7, -1)  # the request's own ids, as BookKeeper echoes
    answer = _bk_v2.decode_response(frame[4:])
    assert isinstance(answer, ReadEntryResponse) and answer.data == entry
    assert struct.unpack_from(">qq", conn.send(ReadEntryResponse(7, 5, 4, entry, 99)), 12) == (7, 5)
