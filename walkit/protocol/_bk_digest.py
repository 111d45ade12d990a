"""BookKeeper's entry digests and master key, beside walkit's own (``_entry.py``).

::

    0        8        16       24       32           32+d
    +--------+--------+--------+--------+------------+---------+
    | ledger | entry  |  lac   | length |  digest    | payload |
    |  i64   |  i64   |  i64   |  i64   |  d bytes   |         |
    +--------+--------+--------+--------+------------+---------+

Theory of operation. A BookKeeper entry has walkit's entry layout byte for byte (the
same 32-byte header, then the digest, then the payload), so a bookie stores either
kind as it came and reads ids and LAC from the header with
:func:`walkit.protocol.parse_entry_header`. What differs is the digest and the key:

=============  ========================================  =====  ==========================
name           algorithm (over header + payload)         bytes  walkit's counterpart
=============  ========================================  =====  ==========================
``CRC32``      zlib CRC32, written as a big-endian u64   8      none
``CRC32C``     CRC32C, big-endian u32                    4      ``crc32c`` (same bytes)
``HMAC``       HMAC-SHA1 keyed by SHA1(b"mac" + pw)      20     ``mac``: HMAC-SHA256, 32
``DUMMY``      nothing                                   0      ``none``
=============  ========================================  =====  ==========================

The master key a BookKeeper client sends with adds, fences and LAC writes is
SHA1(b"ledger" + password), 20 bytes (:func:`bk_master_key`); walkit's is SHA-256 of
the same string, 32 bytes (:func:`walkit.protocol.master_key`). Only writers compute a
digest and only readers check one: the bookie never does, so the codecs carry entries
untouched and these functions serve the client side (and tests).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from enum import Enum

from crc32c import crc32c

from walkit.errors import DigestMismatchError, InvalidArgumentError

__all__ = ["BkDigestType", "BK_MASTER_KEY_SIZE", "bk_master_key", "bk_mac_key", "bk_digest_size",
           "bk_encode_entry", "bk_decode_entry", "bk_encode_lac", "bk_decode_lac"]

BK_MASTER_KEY_SIZE = 20
_HEADER = struct.Struct(">qqqq")
_LAC = struct.Struct(">qq")


class BkDigestType(Enum):
    """BookKeeper's DigestType, named as BookKeeper names it."""

    CRC32 = "CRC32"
    CRC32C = "CRC32C"
    HMAC = "HMAC"
    DUMMY = "DUMMY"


_SIZES = {BkDigestType.CRC32: 8, BkDigestType.CRC32C: 4, BkDigestType.HMAC: 20, BkDigestType.DUMMY: 0}


def bk_master_key(password: bytes) -> bytes:
    """SHA1(b"ledger" + password): the 20-byte key BookKeeper sends with adds and fences."""
    return hashlib.sha1(b"ledger" + password).digest()


def bk_mac_key(password: bytes) -> bytes:
    """SHA1(b"mac" + password): the HMAC-SHA1 key of BookKeeper's HMAC digest."""
    return hashlib.sha1(b"mac" + password).digest()


def bk_digest_size(digest: BkDigestType) -> int:
    return _SIZES[digest]


def _digest(digest: BkDigestType, password: bytes, covered: bytes) -> bytes:
    if digest is BkDigestType.CRC32:
        return struct.pack(">Q", zlib.crc32(covered))
    if digest is BkDigestType.CRC32C:
        return struct.pack(">I", crc32c(covered))
    if digest is BkDigestType.HMAC:
        return hmac.new(bk_mac_key(password), covered, hashlib.sha1).digest()
    return b""


def bk_encode_entry(ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes, *,
                    digest: BkDigestType = BkDigestType.CRC32C, password: bytes = b"") -> bytes:
    """An entry as a BookKeeper writer sends it (``length``: the ledger's length in bytes
    including this payload)."""
    try:
        header = _HEADER.pack(ledger_id, entry_id, lac, length)
    except struct.error as exc:
        raise InvalidArgumentError("entry header out of range", ledger=ledger_id, entry=entry_id) from exc
    return header + _digest(digest, password, header + payload) + payload


def bk_decode_entry(data: bytes, *, digest: BkDigestType = BkDigestType.CRC32C,
                    password: bytes = b"") -> tuple[tuple[int, int, int, int], bytes]:
    """(ledger, entry, lac, length) and the payload of a BookKeeper entry, its digest
    checked (DigestMismatchError if it does not match or the entry is cut short)."""
    size = _SIZES[digest]
    if len(data) < _HEADER.size + size:
        raise DigestMismatchError("entry shorter than its header and digest", size=len(data))
    header, payload = data[:_HEADER.size], data[_HEADER.size + size:]
    fields: tuple[int, int, int, int] = _HEADER.unpack(header)
    if not hmac.compare_digest(data[_HEADER.size:_HEADER.size + size], _digest(digest, password, header + payload)):
        raise DigestMismatchError("entry digest mismatch", ledger=fields[0], entry=fields[1], digest=digest.value)
    return fields, payload


def bk_encode_lac(ledger_id: int, lac: int, *, digest: BkDigestType = BkDigestType.CRC32C,
                  password: bytes = b"") -> bytes:
    """A WRITE_LAC body: ledger id, LAC and a digest over those 16 bytes."""
    head = _LAC.pack(ledger_id, lac)
    return head + _digest(digest, password, head)


def bk_decode_lac(body: bytes, *, digest: BkDigestType = BkDigestType.CRC32C, password: bytes = b"") -> int:
    """The LAC of a WRITE_LAC / READ_LAC body, its digest checked."""
    size = _SIZES[digest]
    if len(body) != _LAC.size + size or not hmac.compare_digest(
            body[_LAC.size:], _digest(digest, password, body[:_LAC.size])):
        raise DigestMismatchError("LAC body digest mismatch", size=len(body), digest=digest.value)
    lac: int = _LAC.unpack_from(body)[1]
    return lac
