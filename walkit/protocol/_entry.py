"""Entries as they travel and rest: header, digest, payload (docs/format.md, "Entry").

::

    0        8        16       24       32           32+d
    +--------+--------+--------+--------+------------+---------+
    | ledger | entry  |  lac   | length |  digest    | payload |
    |  u64   |  i64   |  i64   |  u64   |  d bytes   |         |
    +--------+--------+--------+--------+------------+---------+

Big-endian (network order). ``lac`` is the writer's last-add-confirmed when it sent the
entry; ``length`` the ledger's length in bytes including this payload. The digest covers
the 32-byte header and the payload: CRC32C (4 bytes), HMAC-SHA256 keyed by the ledger's
master key (32 bytes, "mac") or nothing ("none"). Bookies store the whole entry as it
came and read ids and LAC from its header; only readers check the digest.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Sequence
from typing import Literal, NamedTuple, overload

from crc32c import crc32c

from walkit.errors import DigestMismatchError, InvalidArgumentError

__all__ = [
    "ENTRY_HEADER",
    "DigestType",
    "EntryHeader",
    "digest_size",
    "encode_entry",
    "encode_crc32c_entry",
    "decode_entry",
    "decode_crc32c_entry",
    "decode_run",
    "parse_entry_header",
    "master_key",
]

ENTRY_HEADER = struct.Struct(">QqqQ")
DigestType = Literal["crc32c", "mac", "none"]
_SIZES: dict[str, int] = {"crc32c": 4, "mac": 32, "none": 0}
_CRC = struct.Struct(">I")
_CRC_ENTRY = struct.Struct(">QqqQI")  # the header and a CRC32C digest


class EntryHeader(NamedTuple):
    """An entry's header (a named tuple: parsed on every add, cheap to build)."""

    ledger_id: int
    entry_id: int
    lac: int
    length: int


def digest_size(digest: str) -> int:
    try:
        return _SIZES[digest]
    except KeyError:
        raise InvalidArgumentError("unknown digest type", digest=digest, known=",".join(_SIZES)) from None


def master_key(password: bytes) -> bytes:
    """The key a writer proves itself with (sent with adds and fences, never stored in
    clear in metadata): SHA-256 of b"ledger" + password."""
    return hashlib.sha256(b"ledger" + password).digest()


def _digest(digest: str, key: bytes, header: bytes, payload: bytes | memoryview) -> bytes:
    if digest == "crc32c":
        return _CRC.pack(crc32c(payload, crc32c(header)))
    if digest == "mac":
        mac = hmac.new(key, header, hashlib.sha256)
        mac.update(payload)
        return mac.digest()
    digest_size(digest)
    return b""


def encode_entry(
    ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes, *, digest: str = "crc32c", key: bytes = b""
) -> bytes:
    if digest == "crc32c":
        return encode_crc32c_entry(ledger_id, entry_id, lac, length, payload)
    header = ENTRY_HEADER.pack(ledger_id, entry_id, lac, length)
    return header + _digest(digest, key, header, payload) + payload


def encode_crc32c_entry(ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
    """:func:`encode_entry` of a CRC32C entry, nothing to choose (a writer's per-entry call)."""
    header = ENTRY_HEADER.pack(ledger_id, entry_id, lac, length)
    return header + _CRC.pack(crc32c(payload, crc32c(header))) + payload


def parse_entry_header(data: bytes | memoryview) -> EntryHeader:
    """The header of a stored or received entry (no digest check)."""
    if len(data) < ENTRY_HEADER.size:
        raise InvalidArgumentError("entry shorter than its header", size=len(data))
    return EntryHeader._make(ENTRY_HEADER.unpack_from(data))


def decode_entry(data: bytes, *, digest: str = "crc32c", key: bytes = b"") -> tuple[EntryHeader, bytes]:
    """Check the digest and split an entry into header and payload (DigestMismatchError
    for a wrong digest or an entry too short to hold one)."""
    if digest == "crc32c" and len(data) >= _CRC_ENTRY.size:  # the usual case: one unpack, no copy but the payload
        return decode_crc32c_entry(data)
    d = digest_size(digest)
    if len(data) < ENTRY_HEADER.size + d:  # damage, as a bad digest is: a reader tries another replica
        raise DigestMismatchError("entry shorter than header and digest", size=len(data), needed=ENTRY_HEADER.size + d)
    header = parse_entry_header(data)
    raw_header = data[: ENTRY_HEADER.size]
    payload = data[ENTRY_HEADER.size + d :]
    expected = _digest(digest, key, raw_header, payload)
    if not hmac.compare_digest(expected, data[ENTRY_HEADER.size : ENTRY_HEADER.size + d]):
        raise DigestMismatchError("entry digest mismatch", ledger=header.ledger_id, entry=header.entry_id, digest=digest)
    return header, payload


def decode_crc32c_entry(data: bytes) -> tuple[EntryHeader, bytes]:
    """:func:`decode_entry` of a CRC32C entry, nothing to choose (a reader's per-entry call)."""
    if len(data) < _CRC_ENTRY.size:
        raise DigestMismatchError("entry shorter than header and digest", size=len(data), needed=_CRC_ENTRY.size)
    ledger_id, entry_id, lac, length, crc = _CRC_ENTRY.unpack_from(data)
    view = memoryview(data)
    if crc != crc32c(view[_CRC_ENTRY.size :], crc32c(view[: ENTRY_HEADER.size])):
        raise DigestMismatchError("entry digest mismatch", ledger=ledger_id, entry=entry_id, digest="crc32c")
    return EntryHeader(ledger_id, entry_id, lac, length), data[_CRC_ENTRY.size :]


@overload
def decode_run(entries: Sequence[bytes | memoryview], ledger_id: int, first: int, *, digest: str = ...,
               key: bytes = ..., copy: Literal[True] = ...) -> list[bytes]: ...


@overload
def decode_run(entries: Sequence[bytes | memoryview], ledger_id: int, first: int, *, digest: str = ...,
               key: bytes = ..., copy: bool) -> list[bytes | memoryview]: ...


def decode_run(entries: Sequence[bytes | memoryview], ledger_id: int, first: int, *, digest: str = "crc32c",
               key: bytes = b"", copy: bool = True) -> list[bytes] | list[bytes | memoryview]:
    """The payloads of ``entries``, which should be entries ``first``, ``first + 1``, ...
    of ledger ``ledger_id``, in order, up to the first that does not check (its digest,
    or other ids than expected): that one's index is the length of the list. One loop
    over the run (a READ_RANGE answer), the same checks as :func:`decode_entry`. Entries
    may be views (of the answer's frame); the payloads are bytes - or, without ``copy``,
    a view's payload is a view of the same bytes (no copy: for a consumer that copies
    what it keeps)."""
    payloads: list[bytes | memoryview] = []
    append = payloads.append
    if digest == "crc32c":  # the usual case, inline: one unpack and two CRC calls an entry
        unpack, head, size = _CRC_ENTRY.unpack_from, ENTRY_HEADER.size, _CRC_ENTRY.size
        expected = first
        for data in entries:
            if len(data) < size:
                break
            ledger, entry, _, _, crc = unpack(data)
            # a view's bytes copied once (or not at all without ``copy``), a slice of bytes as it is
            payload = bytes(data[size:]) if copy else data[size:]
            if ledger != ledger_id or entry != expected or crc != crc32c(payload, crc32c(data[:head])):
                break
            append(payload)
            expected += 1
        return payloads
    for index, data in enumerate(entries):
        try:
            header, checked = decode_entry(bytes(data), digest=digest, key=key)
        except DigestMismatchError:
            break
        if header.ledger_id != ledger_id or header.entry_id != first + index:
            break
        append(checked)
    return payloads
