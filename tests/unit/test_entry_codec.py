"""The client's per-ledger entry codec (walkit/client/_entry_codec.py): walkit digests
give walkit's bytes as before, bk-* digests BookKeeper's (golden bytes from _bk_digest)."""

from __future__ import annotations

import hashlib
import struct
import zlib

import pytest
from crc32c import crc32c

from walkit.client._entry_codec import EntryCodec, entry_digest_size
from walkit.errors import DigestMismatchError, InvalidArgumentError
from walkit.protocol import ReadLacResponse, decode_entry, encode_entry, master_key
from walkit.protocol._bk_digest import BkDigestType, bk_encode_entry, bk_encode_lac, bk_master_key

PW = b"secret"
BK = {"bk-crc32": BkDigestType.CRC32, "bk-crc32c": BkDigestType.CRC32C, "bk-hmac": BkDigestType.HMAC,
      "bk-dummy": BkDigestType.DUMMY}


@pytest.mark.parametrize("digest", ["crc32c", "mac", "none"])
def test_walkit_digests_give_walkits_bytes(digest: str) -> None:
    codec = EntryCodec.of(digest, PW)
    key = master_key(PW)
    assert codec.master_key == key and len(key) == 32 and not codec.bookkeeper
    data = codec.encode(7, 3, 2, 100, b"payload")
    assert data == encode_entry(7, 3, 2, 100, b"payload", digest=digest, key=key)
    header, payload = codec.decode(data)
    assert (header.ledger_id, header.entry_id, header.lac, header.length, payload) == (7, 3, 2, 100, b"payload")
    assert codec.lac_body(7, 2) == b""
    assert codec.lac_of(ReadLacResponse(7, 5)) == 5


@pytest.mark.parametrize("digest", list(BK))
def test_bookkeeper_digests_give_bookkeepers_bytes(digest: str) -> None:
    codec = EntryCodec.of(digest, PW)
    kind = BK[digest]
    assert codec.bookkeeper and codec.master_key == bk_master_key(PW) == hashlib.sha1(b"ledger" + PW).digest()
    data = codec.encode(7, 3, 2, 100, b"payload")
    assert data == bk_encode_entry(7, 3, 2, 100, b"payload", digest=kind, password=PW)
    assert len(data) == 32 + entry_digest_size(digest) + 7
    header, payload = codec.decode(data)
    assert (header.ledger_id, header.entry_id, header.lac, header.length, payload) == (7, 3, 2, 100, b"payload")
    assert codec.lac_body(7, 2) == bk_encode_lac(7, 2, digest=kind, password=PW)


def test_golden_bytes_computed_by_hand() -> None:
    """BookKeeper's digests, spelled out independently of _bk_digest."""
    header = struct.pack(">qqqq", 1, 0, -1, 5)
    covered = header + b"hello"
    assert EntryCodec.of("bk-crc32", b"").encode(1, 0, -1, 5, b"hello") == \
        header + struct.pack(">Q", zlib.crc32(covered)) + b"hello"
    assert EntryCodec.of("bk-crc32c", b"").encode(1, 0, -1, 5, b"hello") == \
        header + struct.pack(">I", crc32c(covered)) + b"hello"
    import hmac
    mac = hmac.new(hashlib.sha1(b"mac" + PW).digest(), covered, hashlib.sha1).digest()
    assert EntryCodec.of("bk-hmac", PW).encode(1, 0, -1, 5, b"hello") == header + mac + b"hello"
    assert EntryCodec.of("bk-dummy", PW).encode(1, 0, -1, 5, b"hello") == header + b"hello"


@pytest.mark.parametrize("digest", ["crc32c", "mac", *BK])
def test_damage_and_wrong_password_are_caught(digest: str) -> None:
    codec = EntryCodec.of(digest, PW)
    data = bytearray(codec.encode(7, 3, 2, 100, b"payload"))
    if digest not in ("none", "bk-dummy"):
        data[-1] ^= 1
        with pytest.raises(DigestMismatchError):
            codec.decode(bytes(data))
    with pytest.raises(DigestMismatchError):
        codec.decode(b"short")
    if digest in ("mac", "bk-hmac"):
        other = EntryCodec.of(digest, b"other")
        with pytest.raises(DigestMismatchError):
            other.decode(codec.encode(7, 3, 2, 100, b"payload"))


@pytest.mark.parametrize("digest", ["crc32c", "mac", "none", *BK])
def test_runs_stop_at_the_first_bad_entry(digest: str) -> None:
    codec = EntryCodec.of(digest, PW)
    entries = [codec.encode(9, i, i - 1, 10 * (i + 1), b"x" * 10) for i in range(5)]
    assert codec.decode_run(entries, 9, 0) == [b"x" * 10] * 5
    assert codec.decode_run(entries, 9, 1) == []  # ids must match
    entries[3] = codec.encode(9, 7, 2, 40, b"y" * 10)  # a misplaced entry
    assert len(codec.decode_run(entries, 9, 0)) == 3
    views = [memoryview(e) for e in entries[:2]]
    assert [bytes(p) for p in codec.decode_run(views, 9, 0, copy=False)] == [b"x" * 10] * 2


@pytest.mark.parametrize("digest", list(BK))
def test_read_lac_answers_are_checked(digest: str) -> None:
    codec = EntryCodec.of(digest, PW)
    last = codec.encode(4, 10, 9, 1000, b"z")
    body = codec.lac_body(4, 11)
    assert codec.lac_of(ReadLacResponse(4, 0, last_entry=last)) == 9
    assert codec.lac_of(ReadLacResponse(4, 0, lac_body=body)) == 11
    assert codec.lac_of(ReadLacResponse(4, 0, last_entry=last, lac_body=body)) == 11
    assert codec.lac_of(ReadLacResponse(4, 0, last_entry=codec.encode(5, 10, 30, 1000, b"z"), lac_body=body)) == 11
    if digest != "bk-dummy":
        bad = body[:-1] + bytes([body[-1] ^ 1])
        assert codec.lac_of(ReadLacResponse(4, 0, last_entry=last, lac_body=bad)) == 9
        with pytest.raises(DigestMismatchError):
            codec.lac_of(ReadLacResponse(4, 0, lac_body=bad))


def test_unknown_digests_and_passwords_are_refused() -> None:
    for name in ("bk-md5", "crc32", "sha1"):
        with pytest.raises(InvalidArgumentError):
            EntryCodec.of(name, PW)
    with pytest.raises(InvalidArgumentError):
        EntryCodec.of("crc32c", "text")  # type: ignore[arg-type]


def test_bk_crc32c_is_walkits_crc32c_but_for_the_key() -> None:
    ours, theirs = EntryCodec.of("crc32c", PW), EntryCodec.of("bk-crc32c", PW)
    assert ours.encode(3, 1, 0, 9, b"abc") == theirs.encode(3, 1, 0, 9, b"abc")
    assert decode_entry(theirs.encode(3, 1, 0, 9, b"abc"))[1] == b"abc"
    assert len(theirs.master_key) == 20 and len(ours.master_key) == 32


def test_crc32c_ledgers_call_the_crc32c_coders_themselves() -> None:
    """No per-entry cost for the codec choice on the hot path: a CRC32C ledger's (walkit's
    default, and bk-crc32c) encode and decode are the CRC32C functions, not wrappers."""
    from walkit.protocol._entry import decode_crc32c_entry, encode_crc32c_entry

    for digest in ("crc32c", "bk-crc32c"):
        codec = EntryCodec.of(digest, PW)
        assert codec.encode is encode_crc32c_entry and codec.decode is decode_crc32c_entry
    with pytest.raises(DigestMismatchError):
        decode_crc32c_entry(b"\0" * 35)
