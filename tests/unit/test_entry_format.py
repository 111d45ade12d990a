"""The entry format: header, digests, tamper detection."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from walkit.errors import DigestMismatchError, InvalidArgumentError, WalkitError
from walkit.protocol import (ENTRY_HEADER, decode_entry, decode_run, digest_size, encode_entry, master_key,
                             parse_entry_header)

KEY = master_key(b"pw")


@pytest.mark.parametrize("digest", ["crc32c", "mac", "none"])
@given(payload=st.binary(max_size=2048), ledger=st.integers(0, 2**63 - 1), entry=st.integers(0, 2**62))
def test_round_trip(digest: str, payload: bytes, ledger: int, entry: int) -> None:
    raw = encode_entry(ledger, entry, entry - 1, len(payload), payload, digest=digest, key=KEY)
    assert len(raw) == ENTRY_HEADER.size + digest_size(digest) + len(payload)
    header, out = decode_entry(raw, digest=digest, key=KEY)
    assert out == payload
    assert (header.ledger_id, header.entry_id, header.lac, header.length) == (ledger, entry, entry - 1, len(payload))
    assert parse_entry_header(raw) == header


@pytest.mark.parametrize("digest", ["crc32c", "mac"])
@pytest.mark.parametrize("where", [0, 9, 17, 25, 33, -1])
def test_any_flipped_byte_is_detected(digest: str, where: int) -> None:
    raw = bytearray(encode_entry(3, 4, 2, 10, b"0123456789", digest=digest, key=KEY))
    raw[where] ^= 0x40
    with pytest.raises(DigestMismatchError) as info:
        decode_entry(bytes(raw), digest=digest, key=KEY)
    assert isinstance(info.value, WalkitError)


def _run(digest: str, ledger: int = 3, first: int = 10, count: int = 6) -> list[bytes]:
    return [encode_entry(ledger, first + i, first + i - 1, 100 * (i + 1), bytes([i]) * (i * 37), digest=digest,
                         key=KEY) for i in range(count)]


@pytest.mark.parametrize("digest", ["crc32c", "mac", "none"])
@pytest.mark.parametrize("views", [False, True])
@pytest.mark.parametrize("copy", [True, False])
def test_a_run_is_checked_up_to_its_first_bad_entry(digest: str, views: bool, copy: bool) -> None:
    """decode_run keeps the payloads of a run (a READ_RANGE answer) while every entry
    checks as decode_entry would check it, and stops at the first that does not: a
    damaged byte, another ledger, a gap or a repeat in the ids, an entry too short.
    Without ``copy``, a crc32c run's payloads from views are views of the same bytes."""
    run = _run(digest)
    payloads = [bytes([i]) * (i * 37) for i in range(6)]

    def decoded(entries: list[bytes], ledger: int = 3, first: int = 10) -> list[bytes]:
        given = [memoryview(e) for e in entries] if views else entries
        out = decode_run(given, ledger, first, digest=digest, key=KEY, copy=copy)
        if copy or not views or digest != "crc32c":
            assert all(type(p) is bytes for p in out)  # bytes, also from views
        else:
            assert all(type(p) is memoryview and p.obj is e for p, e in zip(out, entries))  # no copy
        return [bytes(p) for p in out]

    assert decoded(run) == payloads
    assert decoded(run, first=11) == [] and decoded(run, ledger=4) == [] and decoded([]) == []
    assert decoded([*run[:3], run[4], run[5]]) == payloads[:3]  # a gap
    assert decoded([*run[:3], run[2]]) == payloads[:3]  # a repeat
    assert decoded([*run[:2], encode_entry(9, 12, 11, 0, b"", digest=digest, key=KEY)]) == payloads[:2]
    assert decoded([*run[:4], run[4][: ENTRY_HEADER.size - 1]]) == payloads[:4]  # too short for a header
    if digest != "none":
        damaged = bytearray(run[3])
        damaged[-1 if len(damaged) > ENTRY_HEADER.size + digest_size(digest) else 20] ^= 0x01
        assert decoded([*run[:3], bytes(damaged), *run[4:]]) == payloads[:3]
        assert decoded([*run[:4], run[4][:-1]]) == payloads[:4]  # a payload cut short


def test_mac_depends_on_the_key() -> None:
    raw = encode_entry(1, 0, -1, 3, b"abc", digest="mac", key=KEY)
    with pytest.raises(DigestMismatchError):
        decode_entry(raw, digest="mac", key=master_key(b"other"))


def test_master_key_is_derived_not_the_password() -> None:
    assert master_key(b"pw") != b"pw" and len(master_key(b"pw")) == 32
    assert master_key(b"pw") == master_key(b"pw") != master_key(b"pw2")


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgumentError, match="digest"):
        encode_entry(1, 0, -1, 0, b"", digest="sha1")
    with pytest.raises(InvalidArgumentError, match="shorter than its header"):
        parse_entry_header(b"\x00" * 31)
    with pytest.raises(DigestMismatchError):
        decode_entry(encode_entry(1, 0, -1, 0, b"", digest="none")[:32], digest="mac", key=KEY)
    for short in (b"", b"\x00" * 31, encode_entry(1, 0, -1, 0, b"")[:35]):  # damaged replicas, skipped by readers
        with pytest.raises(DigestMismatchError, match="shorter than header and digest"):
            decode_entry(short)
