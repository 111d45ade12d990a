"""Ledger metadata: invariants, updates, striping, password hashing and the byte format."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import struct
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from walkit.errors import FormatError, FormatVersionError, InvalidArgumentError, LedgerClosedError
from walkit.metadata._ledger import MAX_BODY, LedgerMetadata, LedgerState
from walkit.protocol import master_key

SALT = bytes(range(16))
HASH = bytes(range(32))
BOOKIES = ("b0:3181", "b1:3181", "b2:3181")


def base(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = dict(
        ledger_id=7, ensemble_size=3, write_quorum=2, ack_quorum=2, digest="crc32c",
        password_salt=SALT, password_hash=HASH, state=LedgerState.OPEN, last_entry_id=-1,
        length=0, ensembles=((0, BOOKIES),), ctime=1_700_000_000_000,
        custom_metadata=(("app", b"x"),), format_version=1,
    )
    fields.update(changes)
    return fields


def make(**changes: Any) -> LedgerMetadata:
    return LedgerMetadata(**base(**changes))


CLOSED = {"state": LedgerState.CLOSED}

BAD_CASES: list[tuple[str, dict[str, Any]]] = [
    ("ledger id negative", {"ledger_id": -1}),
    ("ledger id 2^63", {"ledger_id": 1 << 63}),
    ("ledger id bool", {"ledger_id": True}),
    ("ledger id str", {"ledger_id": "7"}),
    ("Qa 0", {"ack_quorum": 0, "write_quorum": 1, "ensemble_size": 1, "ensembles": ((0, ("a",)),)}),
    ("Qa > Qw", {"ack_quorum": 3}),
    ("Qw > E", {"write_quorum": 4, "ack_quorum": 1}),
    ("E 0", {"ensemble_size": 0, "write_quorum": 0, "ack_quorum": 0, "ensembles": ((0, ()),)}),
    ("unknown digest", {"digest": "crc32"}),
    ("salt too short", {"password_salt": b"x"}),
    ("salt not bytes", {"password_salt": bytearray(SALT)}),
    ("hash too short", {"password_hash": b"x" * 31}),
    ("hash str", {"password_hash": "x" * 32}),
    ("state int", {"state": 1}),
    ("format version 3", {"format_version": 3}),
    ("format version 0", {"format_version": 0}),
    ("ctime negative", {"ctime": -1}),
    ("length negative", {**CLOSED, "last_entry_id": 3, "length": -1}),
    ("last entry < -1", {**CLOSED, "last_entry_id": -2}),
    ("no fragments", {"ensembles": ()}),
    ("fragments a list", {"ensembles": [(0, BOOKIES)]}),
    ("first fragment at 1", {"ensembles": ((1, BOOKIES),)}),
    ("first fragment negative", {"ensembles": ((-1, BOOKIES), (0, BOOKIES))}),
    ("equal starts", {"ensembles": ((0, BOOKIES), (5, BOOKIES), (5, BOOKIES))}),
    ("descending starts", {"ensembles": ((0, BOOKIES), (5, BOOKIES), (3, BOOKIES))}),
    ("fragment start bool", {"ensembles": ((False, BOOKIES),)}),
    ("too few bookies", {"ensembles": ((0, BOOKIES[:2]),)}),
    ("too many bookies", {"ensembles": ((0, (*BOOKIES, "b3")),)}),
    ("duplicate bookie", {"ensembles": ((0, ("a", "b", "a")),)}),
    ("empty bookie id", {"ensembles": ((0, ("a", "b", "")),)}),
    ("bookies a list", {"ensembles": ((0, list(BOOKIES)),)}),
    ("fragment triple", {"ensembles": ((0, BOOKIES, 1),)}),
    ("open with last entry", {"last_entry_id": 0}),
    ("open with length", {"length": 10}),
    ("closed, fragment past end", {**CLOSED, "last_entry_id": 4, "length": 5,
                                   "ensembles": ((0, BOOKIES), (6, BOOKIES))}),
    ("closed empty with length", {**CLOSED, "last_entry_id": -1, "length": 3}),
    ("custom unsorted", {"custom_metadata": (("b", b""), ("a", b""))}),
    ("custom duplicate", {"custom_metadata": (("a", b""), ("a", b"1"))}),
    ("custom value str", {"custom_metadata": (("a", "v"),)}),
    ("custom empty key", {"custom_metadata": (("", b"v"),)}),
    ("custom a dict", {"custom_metadata": {"a": b"v"}}),
]


@pytest.mark.parametrize(("name", "changes"), BAD_CASES, ids=[name for name, _ in BAD_CASES])
def test_validation_rejects(name: str, changes: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        make(**changes)
    assert "ledger=" in str(info.value) or "field=" in str(info.value)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {**CLOSED, "last_entry_id": -1, "length": 0},
        {**CLOSED, "last_entry_id": 4, "length": 50, "ensembles": ((0, BOOKIES), (5, BOOKIES))},
        {"state": LedgerState.IN_RECOVERY},
        {"ensemble_size": 1, "write_quorum": 1, "ack_quorum": 1, "ensembles": ((0, ("a",)),)},
        {"ledger_id": (1 << 63) - 1, "digest": "none", "custom_metadata": ()},
    ],
)
def test_validation_accepts(changes: dict[str, Any]) -> None:
    assert make(**changes).ledger_id >= 0


# -- hypothesis: valid metadata ------------------------------------------------------

bookie_ids = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=12)


@st.composite
def metadata(draw: st.DrawFn) -> LedgerMetadata:
    e = draw(st.integers(1, 6))
    qw = draw(st.integers(1, e))
    qa = draw(st.integers(1, qw))
    starts = sorted(draw(st.sets(st.integers(1, 1 << 40), max_size=4)))
    fragments = tuple(
        (start, tuple(draw(st.lists(bookie_ids, min_size=e, max_size=e, unique=True))))
        for start in [0, *starts]
    )
    state = draw(st.sampled_from(LedgerState))
    last, length = -1, 0
    if state is LedgerState.CLOSED:
        last = draw(st.integers(fragments[-1][0] - 1, 1 << 50))
        length = 0 if last == -1 else draw(st.integers(0, (1 << 63) - 1))
    custom = draw(st.dictionaries(st.text(min_size=1, max_size=10), st.binary(max_size=20), max_size=4))
    return LedgerMetadata(
        ledger_id=draw(st.integers(0, (1 << 63) - 1)), ensemble_size=e, write_quorum=qw,
        ack_quorum=qa, digest=draw(st.sampled_from(["crc32c", "mac", "none"])),
        password_salt=draw(st.binary(min_size=16, max_size=16)),
        password_hash=draw(st.binary(min_size=32, max_size=32)), state=state,
        last_entry_id=last, length=length, ensembles=fragments,
        ctime=draw(st.integers(0, 1 << 45)), custom_metadata=tuple(sorted(custom.items())),
    )


@settings(max_examples=300)
@given(metadata())
def test_round_trip(meta: LedgerMetadata) -> None:
    data = meta.encode()
    decoded = LedgerMetadata.decode(data)
    assert decoded == meta
    assert hash(decoded) == hash(meta)
    assert decoded.encode() == data
    assert LedgerMetadata.decode(memoryview(data)) == meta  # type: ignore[arg-type]


@settings(max_examples=100)
@given(metadata(), st.integers(0, 1 << 41))
def test_write_set_is_striped_over_the_fragment(meta: LedgerMetadata, entry: int) -> None:
    ensemble = meta.ensemble_for(entry)
    first = max(start for start, _ in meta.ensembles if start <= entry)
    assert ensemble == dict(meta.ensembles)[first]
    ws = meta.write_set(entry)
    assert len(ws) == len(set(ws)) == meta.write_quorum
    assert ws == tuple(ensemble[(entry + i) % meta.ensemble_size] for i in range(meta.write_quorum))


# -- corruption --------------------------------------------------------------------


def sample() -> bytes:
    return make(custom_metadata=(("app", b"\x00\xff"), ("owner", b"svc"))).encode()


def test_every_single_byte_change_is_rejected() -> None:
    data = sample()
    for at in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            bad = bytearray(data)
            bad[at] ^= mask
            with pytest.raises(FormatError):
                LedgerMetadata.decode(bytes(bad))


def test_truncation_and_extension_are_rejected() -> None:
    data = sample()
    for size in range(len(data)):
        with pytest.raises(FormatError):
            LedgerMetadata.decode(data[:size])
    with pytest.raises(FormatError):
        LedgerMetadata.decode(data + b"\x00")


def frame(body: bytes, *, magic: bytes = b"WKLEDGER", version: int = 1, length: int | None = None) -> bytes:
    head = struct.pack("<8sHI", magic, version, len(body) if length is None else length) + body
    return head + struct.pack("<I", crc32c(head))


def body_of(meta: LedgerMetadata) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(meta.encode()[14:-4])
    return result


def dump(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def test_frame_is_as_documented() -> None:
    meta = make()
    data = meta.encode()
    assert data[:8] == b"WKLEDGER"
    assert struct.unpack_from("<HI", data, 8) == (1, len(data) - 18)
    assert frame(dump(body_of(meta))) == data


def with_body(**changes: Any) -> bytes:
    body = body_of(make())
    body.update(changes)
    return frame(dump({k: v for k, v in body.items() if v is not ...}))


STRICT_CASES: list[tuple[str, bytes]] = [
    ("unknown version", frame(dump(body_of(make())), version=3)),
    ("version 0", frame(dump(body_of(make())), version=0)),
    ("foreign magic", frame(dump(body_of(make())), magic=b"WKCOOKIE")),
    ("length over bound", frame(b"{}", length=MAX_BODY + 1)),
    ("body over bound", frame(b" " * (MAX_BODY + 1))),
    ("missing field", with_body(ctime=...)),
    ("extra field", with_body(password="hunter2")),
    ("format_version in body", with_body(format_version=1)),
    ("not an object", frame(b"[]")),
    ("not JSON", frame(b"{nope")),
    ("not ASCII", frame('{"é":1}'.encode())),
    ("float", with_body(ctime=1.5)),
    ("NaN", frame(dump(body_of(make())).replace(b'"ctime":1700000000000', b'"ctime":NaN'))),
    ("duplicate key", frame(dump(body_of(make()))[:-1] + b',"ctime":1}')),
    ("bool as int", with_body(ledger_id=True)),
    ("state number", with_body(state=1)),
    ("state unknown", with_body(state="FENCED")),
    ("bad base64", with_body(password_salt="!!!!")),
    ("base64 not str", with_body(password_hash=5)),
    ("invalid metadata", with_body(ack_quorum=3)),
    ("ensembles not list", with_body(ensembles={"0": ["a"]})),
    ("fragment shape", with_body(ensembles=[[0, "abc"]])),
    ("custom not object", with_body(custom_metadata=[])),
    ("non canonical spacing", frame(json.dumps(body_of(make()), sort_keys=True).encode())),
    ("non canonical order", frame(json.dumps(dict(reversed(body_of(make()).items())), separators=(",", ":")).encode())),
    ("huge int", frame(dump(body_of(make())).replace(b'"ctime":1700000000000', b'"ctime":' + b"9" * 5000))),
    ("big int", with_body(ledger_id=1 << 63)),
    ("deep nesting", frame(b"[" * 100_000 + b"]" * 100_000)),
]


@pytest.mark.parametrize(("name", "data"), STRICT_CASES, ids=[name for name, _ in STRICT_CASES])
def test_decode_is_strict(name: str, data: bytes) -> None:
    with pytest.raises(FormatError):
        LedgerMetadata.decode(data)


def test_decode_error_names_the_problem() -> None:
    with pytest.raises(FormatError, match="missing=ctime"):
        LedgerMetadata.decode(with_body(ctime=...))
    with pytest.raises(FormatVersionError,
                       match=r"ledger metadata version 3 is not one this walkit reads \(reads: 1, 2\)"):
        LedgerMetadata.decode(frame(dump(body_of(make())), version=3))


# -- passwords ---------------------------------------------------------------------


def test_password_is_hashed_salted_and_checked() -> None:
    password = b"correct horse battery staple"
    meta = LedgerMetadata.create(5, BOOKIES, write_quorum=2, ack_quorum=2, password=password, ctime=1)
    data = meta.encode()
    assert password not in data and base64.b64encode(password) not in data
    assert password not in repr(meta).encode()
    assert meta.check_password(password)
    assert not meta.check_password(b"wrong")
    assert not meta.check_password(b"")
    other = LedgerMetadata.create(5, BOOKIES, write_quorum=2, ack_quorum=2, password=password, ctime=1)
    assert other.password_salt != meta.password_salt
    assert other.password_hash != meta.password_hash
    assert LedgerMetadata.decode(data).check_password(password)


@pytest.mark.parametrize("version", [1, 2])
def test_hash_password_depends_on_salt_and_password(version: int) -> None:
    a = LedgerMetadata.hash_password(b"pw", b"s" * 16, version)
    assert a == LedgerMetadata.hash_password(b"pw", b"s" * 16, version)
    assert a != LedgerMetadata.hash_password(b"pw", b"t" * 16, version)
    assert a != LedgerMetadata.hash_password(b"px", b"s" * 16, version)
    assert len(a) == 32


def test_each_version_has_its_own_verifier() -> None:
    """Version 2 (new ledgers): HMAC-SHA256 keyed with the password over a context and
    the salt; version 1: PBKDF2-HMAC-SHA256, 100,000 rounds. Neither is the other, nor
    the master key the bookies keep."""
    salt = b"s" * 16
    v2 = hmac.digest(b"pw", b"walkit ledger password\x00" + salt, "sha256")
    assert LedgerMetadata.hash_password(b"pw", salt) == LedgerMetadata.hash_password(b"pw", salt, 2) == v2
    assert LedgerMetadata.hash_password(b"pw", salt, 1) == hashlib.pbkdf2_hmac("sha256", b"pw", salt, 100_000, 32)
    assert master_key(b"pw") not in (v2, LedgerMetadata.hash_password(b"pw", salt, 1))
    with pytest.raises(InvalidArgumentError, match="unknown ledger metadata version"):
        LedgerMetadata.hash_password(b"pw", salt, 3)


def test_a_new_ledger_is_version_2_and_an_old_one_keeps_version_1() -> None:
    """Created ledgers are version 2; a version-1 value is read, checked (PBKDF2) and
    updated as version 1 - its verifier stays valid - and encodes with its version."""
    new = LedgerMetadata.create(5, BOOKIES, write_quorum=2, ack_quorum=2, password=b"pw", ctime=1)
    assert new.format_version == 2 and new.encode()[8:10] == b"\x02\x00"
    assert LedgerMetadata.decode(new.encode()).check_password(b"pw")
    old = make(password_hash=LedgerMetadata.hash_password(b"pw", SALT, 1))
    assert old.format_version == 1 and old.check_password(b"pw") and not old.check_password(b"px")
    closed = LedgerMetadata.decode(old.encode()).with_ensemble(1, BOOKIES[::-1]).closed(3, 30)
    assert closed.format_version == 1 and closed.encode()[8:10] == b"\x01\x00"
    assert LedgerMetadata.decode(closed.encode()).check_password(b"pw")
    assert not make(password_hash=LedgerMetadata.hash_password(b"pw", SALT, 2)).check_password(b"pw"), \
        "a version-1 value is checked with version 1's verifier only"


def test_create_is_open_from_entry_zero() -> None:
    meta = LedgerMetadata.create(9, BOOKIES, write_quorum=3, ack_quorum=2, password=b"", ctime=3,
                                 digest="mac", custom={"b": b"2", "a": b"1"})
    assert meta.state is LedgerState.OPEN and meta.ensembles == ((0, BOOKIES),)
    assert meta.custom_metadata == (("a", b"1"), ("b", b"2"))
    assert dict(meta.custom) == {"a": b"1", "b": b"2"}
    with pytest.raises(TypeError):
        meta.custom["c"] = b"3"  # type: ignore[index]


# -- updates -----------------------------------------------------------------------


def test_updates_return_new_values() -> None:
    meta = make()
    recovering = meta.with_state(LedgerState.IN_RECOVERY)
    assert recovering.state is LedgerState.IN_RECOVERY and meta.state is LedgerState.OPEN
    done = recovering.closed(9, 100)
    assert (done.state, done.last_entry_id, done.length) == (LedgerState.CLOSED, 9, 100)
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.length = 3  # type: ignore[misc]
    with pytest.raises(InvalidArgumentError):
        meta.closed(-1, 5)
    with pytest.raises(InvalidArgumentError):
        meta.with_state(LedgerState.CLOSED).with_state(LedgerState.OPEN).with_ensemble(0, BOOKIES).closed(-2, 0)


def test_with_ensemble_appends_and_replaces() -> None:
    meta = make()
    second = ("b0:3181", "b3:3181", "b2:3181")
    third = ("b0:3181", "b3:3181", "b4:3181")
    appended = meta.with_ensemble(5, second)
    assert appended.ensembles == ((0, BOOKIES), (5, second))
    replaced = appended.with_ensemble(5, third)
    assert replaced.ensembles == ((0, BOOKIES), (5, third))
    assert meta.with_ensemble(0, second).ensembles == ((0, second),)
    assert replaced.ensemble_for(4) == BOOKIES and replaced.ensemble_for(5) == third
    assert replaced.write_set(4) == ("b1:3181", "b2:3181")
    assert replaced.write_set(5) == ("b4:3181", "b0:3181")


def test_with_ensemble_rejects_bad_changes() -> None:
    meta = make().with_ensemble(5, BOOKIES)
    with pytest.raises(InvalidArgumentError):
        meta.with_ensemble(3, BOOKIES)  # before the last fragment
    with pytest.raises(InvalidArgumentError):
        meta.with_ensemble(8, ("a", "a", "b"))
    with pytest.raises(InvalidArgumentError):
        meta.with_ensemble(8, ("a", "b"))
    with pytest.raises(LedgerClosedError, match="ledger=7"):
        meta.closed(10, 1).with_ensemble(11, BOOKIES)


def test_ensemble_for_rejects_negative_entries() -> None:
    with pytest.raises(InvalidArgumentError, match="entry=-1"):
        make().write_set(-1)


@pytest.mark.parametrize(("entry", "expected"), [(0, ("a", "b")), (1, ("b", "c")), (2, ("c", "a")), (3, ("a", "b"))])
def test_write_set_examples(entry: int, expected: tuple[str, ...]) -> None:
    meta = make(ensembles=((0, ("a", "b", "c")),))
    assert meta.write_set(entry) == expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300)
@given(st.sampled_from(sorted(body_of(make()))), json_values)
def test_framed_garbage_fields_only_raise_format_error(key: str, value: object) -> None:
    body = body_of(make())
    body[key] = value
    try:
        meta = LedgerMetadata.decode(frame(dump(body)))
    except FormatError:
        return
    assert meta.encode() == frame(dump(body))
