"""The C hot path of a bookie's walkit connection (``bookie._frames``: ``cut_adds`` and
``pack_added``, native/walkit_wire.c) held to the Python loop of
:class:`~walkit.protocol.ServerConnection`, the reference: the same messages (fields and
their order), the same errors, the same bytes held back and the same answer frames, for
valid streams cut anywhere and for fuzzed ones; the backend choice (C_WIRE) and the
batch admission of a run of adds (``_admitted_run``) against the loop it replaces."""

from __future__ import annotations

import collections
import importlib
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookie import native
from bookie.server import _connection
from bookie.server._admission import AddsInFlight
from walkit.protocol import AddEntry, DialectSniffer, ErrorResponse, ReadEntry, ServerConnection, encode_request

C = _connection.C_WIRE
needs_c = pytest.mark.skipif(C is None, reason="bookie._frames is not built here")
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_HEAD = struct.Struct(">IBBHQQQB")  # length, version, kind, flags, request id, ledger, entry, key length


def add_frame(ledger: int, entry: int, key: bytes, data: bytes, *, rid: int = 7, flags: int = 0,
              version: int = 1, kind: int = 1, klen: int | None = None) -> bytes:
    """An ADD_ENTRY frame of any shape (even ones the encoder refuses to make)."""
    body_len = 29 + len(key) + len(data)
    return _HEAD.pack(body_len, version, kind, flags, rid, ledger, entry,
                      len(key) if klen is None else klen) + key + data


def seen(events: list[Any]) -> list[tuple[str, Any]]:
    """Events as comparable values: a message's type and its fields in their order."""
    return [(type(e).__name__, list(vars(e).items())) for e in events]


def both(chunks: list[bytes], max_frame: int = 5 * 1024 * 1024) -> tuple[list[Any], list[Any]]:
    """What the Python and the C connection make of the same chunks (each fed in turn);
    also asserts they agree on closing and on the bytes held back."""
    py, c = ServerConnection(max_frame), ServerConnection(max_frame, C)
    out_py: list[Any] = []
    out_c: list[Any] = []
    for chunk in chunks:
        out_py += py.receive(chunk)
        out_c += c.receive(chunk)
        assert py.closing == c.closing
        assert py._decoder._buf == c._decoder._buf
    return out_py, out_c


_ids = st.one_of(st.integers(0, 5), st.integers(0, 2**64 - 1), st.just(2**63 - 1), st.just(2**63))
_keys = st.one_of(st.just(b"k" * 16), st.binary(max_size=70))


@st.composite
def a_frame(draw: st.DrawFn) -> bytes:
    """A valid add (mostly), an add of a shape the hot path refuses, another request,
    or a mangled frame."""
    how = draw(st.sampled_from(["add", "add", "add", "odd add", "read", "mangled", "bad length"]))
    if how == "add":
        return add_frame(draw(st.integers(0, 9)), draw(st.integers(0, 2**20)), b"k" * 16,
                         draw(st.binary(max_size=300)), rid=draw(st.integers(0, 2**64 - 1)),
                         flags=draw(st.sampled_from([0, 1])))
    if how == "odd add":
        key = draw(_keys)
        return add_frame(draw(_ids), draw(_ids), key, draw(st.binary(max_size=40)),
                         rid=draw(st.integers(0, 2**64 - 1)), flags=draw(st.integers(0, 3)),
                         version=draw(st.sampled_from([1, 1, 2, 0])),
                         klen=draw(st.one_of(st.none(), st.integers(0, 255))))
    if how == "read":
        return encode_request(ReadEntry(draw(st.integers(0, 9)), draw(st.integers(0, 99))))
    if how == "mangled":
        raw = bytearray(add_frame(1, 2, b"k", b"data"))
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        return bytes(raw)
    return struct.pack(">I", draw(st.sampled_from([0, 5, 11, 2**31]))) + b"\x01\x01"


@needs_c
@FUZZ
@given(frames=st.lists(a_frame(), max_size=30), cuts=st.lists(st.integers(0, 4000), max_size=6))
def test_the_c_cut_gives_the_reference_s_events_however_the_stream_is_chunked(frames: list[bytes],
                                                                             cuts: list[int]) -> None:
    stream = b"".join(frames)
    points = sorted({min(c, len(stream)) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)])]
    out_py, out_c = both(chunks)
    assert seen(out_py) == seen(out_c)
    assert out_py == out_c


@needs_c
@FUZZ
@given(raw=st.binary(max_size=400))
def test_random_bytes_give_the_reference_s_events(raw: bytes) -> None:
    out_py, out_c = both([add_frame(1, 0, b"k", b"x") + raw, raw], max_frame=4096)
    assert seen(out_py) == seen(out_c)


@needs_c
@pytest.mark.parametrize("frame", [
    add_frame(1, 2, b"k", b"x", kind=2),  # another request's kind
    add_frame(1, 2, b"k", b"x", version=2),  # another version: EBADVERSION, closing
    add_frame(1, 2, b"k", b"x", flags=2),  # a flag the hot path does not know
    add_frame(1, 2, b"k" * 65, b"x"),  # a key too long
    add_frame(1, 2, b"k", b"", klen=200),  # a key past the frame's end
    add_frame(2**63, 2, b"k", b"x"),  # a ledger id out of range
    add_frame(1, 2**64 - 1, b"k", b"x"),  # an entry id out of range
    struct.pack(">I", 11) + bytes(11),  # a length below the header's
    struct.pack(">I", 2**31) + bytes(40),  # a length past the maximum
])
def test_cut_adds_stops_at_a_frame_off_the_hot_path_and_the_loop_answers_it(frame: bytes) -> None:
    good = add_frame(1, 1, b"key", b"payload", rid=3)
    events: list[Any] = []
    stream = good + frame + good
    assert C is not None
    assert C.cut_adds(stream, 0, 1 << 20, AddEntry, events) == len(good)  # it stopped at the odd frame
    assert seen(events) == seen([AddEntry(1, 1, b"key", b"payload", request_id=3)])
    out_py, out_c = both([stream])
    assert seen(out_py) == seen(out_c)
    assert any(isinstance(e, ErrorResponse) for e in out_c)


@needs_c
def test_cut_adds_builds_the_reference_s_message_field_by_field() -> None:
    frame = add_frame(2**63 - 1, 2**63 - 1, b"K" * 64, b"entry bytes", rid=2**64 - 1, flags=1)
    (py,), (c,) = both([frame])
    assert type(c) is AddEntry and seen([c]) == seen([py])
    assert c == AddEntry(2**63 - 1, 2**63 - 1, b"K" * 64, b"entry bytes", True, 2**64 - 1)
    assert type(c.master_key) is bytes and type(c.data) is bytes and c.recovery is True
    with pytest.raises(Exception):  # still frozen
        c.entry_id = 3  # type: ignore[misc]


@needs_c
def test_cut_adds_refuses_arguments_it_does_not_take() -> None:
    assert C is not None
    with pytest.raises(TypeError):
        C.cut_adds(bytearray(b"x"), 0, 10, AddEntry, [])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        C.cut_adds(b"xx", 3, 10, AddEntry, [])


@needs_c
@FUZZ
@given(ids=st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), st.integers(0, 2**64 - 1)),
                    max_size=40))
def test_pack_added_gives_the_reference_s_bytes(ids: list[tuple[int, int, int]]) -> None:
    reqs = [AddEntry(ledger, entry, b"k", b"d", request_id=rid) for ledger, entry, rid in ids]
    assert ServerConnection(c_wire=C).send_added_many(reqs) == ServerConnection().send_added_many(reqs)
    assert C is not None and C.pack_added(reqs, 1) == b"".join(map(ServerConnection().send_added, reqs))


class _Odd:
    """An add whose ids are not the wire's: the Python pack raises, C hands it back."""

    def __init__(self, rid: Any) -> None:
        self.ledger_id, self.entry_id, self.request_id = 1, 2, rid


@needs_c
@pytest.mark.parametrize("rid", [-1, 2**64, 1.5, "7", None])
def test_pack_added_leaves_ids_off_the_wire_to_the_reference_s_error(rid: Any) -> None:
    reqs: Any = [AddEntry(1, 1, b"k", b"d"), _Odd(rid)]
    assert C is not None and C.pack_added(reqs, 1) is None
    with pytest.raises(struct.error) as py_error:
        ServerConnection().send_added_many(reqs)
    with pytest.raises(struct.error) as c_error:
        ServerConnection(c_wire=C).send_added_many(reqs)
    assert str(c_error.value) == str(py_error.value)


@needs_c
def test_a_sniffed_walkit_connection_is_given_the_c_path() -> None:
    chosen: list[Any] = []
    sniffer = DialectSniffer(chosen.append, c_wire=C)
    assert seen(sniffer.receive(add_frame(1, 0, b"k", b"x"))) == seen([AddEntry(1, 0, b"k", b"x", request_id=7)])
    assert chosen[0]._c is C


def test_without_the_extension_or_with_walkit_native_off_the_loop_cuts_everything(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "MODE", "off")
    assert _connection._load_c_wire() is None
    monkeypatch.setattr(native, "MODE", "auto")

    def missing(name: str) -> Any:
        raise ImportError(f"no {name}")

    monkeypatch.setattr(importlib, "import_module", missing)
    assert _connection._load_c_wire() is None
    monkeypatch.setattr(native, "MODE", "require")
    with pytest.raises(ImportError, match="not built"):
        _connection._load_c_wire()
    events = ServerConnection(c_wire=None).receive(add_frame(1, 0, b"k", b"x"))
    assert seen(events) == seen([AddEntry(1, 0, b"k", b"x", request_id=7)])


# --- the batch admission of a run of adds -----------------------------------------------------------------------


def _loop_admits(backlog: list[Any], room: int, count: int, size: int, max_adds: int, max_bytes: int) -> int:
    """How many adds at the head of ``backlog`` the per-add loop of ``_pump_adds`` admits
    before it stops (room, another request) or refuses one (busy)."""
    admitted = 0
    for req in backlog[:room]:
        if not isinstance(req, AddEntry) or count >= max_adds or size >= max_bytes:
            break
        count, size, admitted = count + 1, size + len(req.data), admitted + 1
    return admitted


@FUZZ
@given(sizes=st.lists(st.integers(0, 50), min_size=1, max_size=40), other_at=st.integers(0, 45),
       room=st.integers(1, 45), count=st.integers(0, 60), size=st.integers(0, 900),
       max_adds=st.integers(1, 80), max_bytes=st.integers(1, 1500))
def test_a_run_is_taken_at_once_only_when_the_loop_would_admit_all_of_it(
        sizes: list[int], other_at: int, room: int, count: int, size: int, max_adds: int, max_bytes: int) -> None:
    items: list[Any] = [AddEntry(1, i, b"k", bytes(n)) for i, n in enumerate(sizes)]
    if other_at < len(items):
        items.insert(other_at, ReadEntry(1, 0))
    run_len = next((i for i, r in enumerate(items) if not isinstance(r, AddEntry)), len(items))
    expect = _loop_admits(items, room, count, size, max_adds, max_bytes)
    whole = min(room, run_len)
    backlog = collections.deque(items)
    counts = AddsInFlight()
    counts.count, counts.bytes = count, size
    run = _connection._admitted_run(backlog, room, counts, max_adds, max_bytes)
    if run is None:  # some add of the run is refused (or none is there): the loop decides, nothing was taken
        assert expect < whole or whole == 0
        assert list(backlog) == items and (counts.count, counts.bytes) == (count, size)
    else:
        assert expect == whole == len(run) and run == items[:whole]
        assert list(backlog) == items[whole:]
        assert (counts.count, counts.bytes) == (count + whole, size + sum(len(r.data) for r in run))
