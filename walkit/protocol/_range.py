"""Batched entry reads on the bookie wire protocol: READ_RANGE (op 7), sans-IO.

A reader that wants many consecutive entries of one ledger asks for them in one request
and gets them in one frame, instead of one READ_ENTRY round trip (and one bookie task,
one client future) per entry - BookKeeper's BATCH_READ_ENTRY (BP-62) in spirit::

    request body:   ledger id u64 | first entry u64 | count u32 | max bytes u32
    response body:  ledger id u64 | first entry u64 | lac i64 | count u32 |
                    count x (entry length u32 | entry)

Theory of operation. The answer holds the entries ``first``, ``first + 1``, ... that the
bookie stores, **consecutive and in order**: it stops before the first entry it does not
hold, after ``count`` entries, or before the entry that would take the entries' bytes
past ``max bytes`` (or the frame past the bookie's maximum frame size). The first entry
is always sent when it is stored and fits in a frame, however large, so every answer
makes progress; when it is not stored the answer is ENOENTRY (ENOLEDGER for a ledger the
bookie never saw), exactly as READ_ENTRY would answer for it. So a short answer says only
"ask again from where this one stopped" (perhaps of another replica); a reader never
mistakes a stopped range for the end of the ledger. ``lac`` is the bookie's LAC for the
ledger when it answered, as in a READ_ENTRY answer. Every entry is still the stored
entry, checked by the reader (digest, ledger and entry ids) as a single read is.

A bookie that predates this op answers it EBADREQ (kind 0x80, an op it cannot name); a
client then reads from that bookie entry by entry. The frame header is
:mod:`walkit.protocol._codec`'s; these are the body codecs it dispatches to.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from walkit.errors import InvalidArgumentError

__all__ = ["MAX_RANGE_ENTRIES", "RANGE_RESPONSE_OVERHEAD", "ReadRange", "ReadRangeResponse", "enc_range", "range_response_size",
           "dec_range", "enc_range_resp", "dec_range_resp"]

MAX_RANGE_ENTRIES = 65536  # entries asked for in one READ_RANGE at most
RANGE_RESPONSE_OVERHEAD = 44  # bytes of a READ_RANGE answer's frame before its first entry's length
_I63 = 2**63 - 1
_U32 = 2**32 - 1
_U64 = 2**64 - 1
_OP = 7
_REQ = struct.Struct(">IBBHQQQII")  # length, version, kind, flags, request id, ledger, first, count, max bytes
_RESP = struct.Struct(">IBBHQQQqI")  # length, version, kind, status, request id, ledger, first, lac, count
_REQ_BODY = struct.Struct(">QQII")
_RESP_BODY = struct.Struct(">QQqI")
_LEN = struct.Struct(">I")


def _check(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidArgumentError(f"{name} out of range or of the wrong type", field=name, value=repr(value)[:80],
                                   low=low, high=high)


@dataclass(frozen=True)
class ReadRange:
    """Entries ``first_entry`` .. ``first_entry + count - 1`` of one ledger, at most
    ``max_bytes`` of entries (the first one always, when stored)."""

    ledger_id: int
    first_entry: int
    count: int
    max_bytes: int = _U32
    request_id: int = 0

    def __post_init__(self) -> None:
        _check("ledger_id", self.ledger_id, 0, _I63)
        _check("first_entry", self.first_entry, 0, _I63)
        _check("count", self.count, 1, MAX_RANGE_ENTRIES)
        if self.first_entry + self.count - 1 > _I63:
            raise InvalidArgumentError("range past the largest entry id", ledger=self.ledger_id,
                                       first=self.first_entry, count=self.count)
        _check("max_bytes", self.max_bytes, 1, _U32)
        _check("request_id", self.request_id, 0, _U64)

    @property
    def entry_id(self) -> int:
        """The first entry: what an error answering this request names."""
        return self.first_entry


@dataclass(frozen=True)
class ReadRangeResponse:
    """Consecutive stored entries from ``first_entry`` on (at least one)."""

    ledger_id: int
    first_entry: int
    lac: int  # the bookie's LAC for the ledger when it answered
    #: the stored entries first_entry, first_entry + 1, ... (decoded answers: views of their frame)
    entries: tuple[bytes | memoryview, ...]
    request_id: int = 0

    def __post_init__(self) -> None:
        _check("ledger_id", self.ledger_id, 0, _I63)
        _check("first_entry", self.first_entry, 0, _I63)
        _check("lac", self.lac, -1, _I63)
        if not isinstance(self.entries, tuple) or not 1 <= len(self.entries) <= MAX_RANGE_ENTRIES \
                or not all(isinstance(e, (bytes, memoryview)) for e in self.entries):
            raise InvalidArgumentError("entries: a tuple of 1 to 65536 bytes objects (or views)", ledger=self.ledger_id,
                                       type=type(self.entries).__name__)
        if self.first_entry + len(self.entries) - 1 > _I63:
            raise InvalidArgumentError("range past the largest entry id", ledger=self.ledger_id,
                                       first=self.first_entry, count=len(self.entries))
        _check("request_id", self.request_id, 0, _U64)

    @property
    def entry_id(self) -> int:
        return self.first_entry


def range_response_size(entry_sizes: int, count: int) -> int:
    """The whole frame of an answer carrying ``count`` entries of ``entry_sizes`` bytes."""
    return RANGE_RESPONSE_OVERHEAD + 4 * count + entry_sizes


def enc_range(r: ReadRange, rid: int, version: int) -> bytes:
    return _REQ.pack(36, version, _OP, 0, rid, r.ledger_id, r.first_entry, r.count, r.max_bytes)


def enc_range_resp(r: ReadRangeResponse, rid: int, version: int) -> bytes:
    entries = r.entries
    parts: list[bytes | memoryview] = [b""] * (2 * len(entries) + 1)
    pack = _LEN.pack
    size = 0
    for i, data in enumerate(entries):
        parts[2 * i + 1] = pack(len(data))
        parts[2 * i + 2] = data
        size += len(data)
    parts[0] = _RESP.pack(range_response_size(size, len(entries)) - 4, version, 0x80 | _OP, 0, rid, r.ledger_id,
                          r.first_entry, r.lac, len(entries))
    return b"".join(parts)


def dec_range(frame: bytes, n: int, flags: int, rid: int) -> ReadRange:
    """``frame`` is the frame after its length (``n`` bytes, header included)."""
    if flags:
        raise InvalidArgumentError(f"flags 0x{flags:x} not allowed on READ_RANGE")
    if n != 12 + _REQ_BODY.size:
        raise InvalidArgumentError(f"READ_RANGE body of {n - 12} bytes, expected {_REQ_BODY.size}")
    ledger, first, count, max_bytes = _REQ_BODY.unpack_from(frame, 12)
    return ReadRange(ledger, first, count, max_bytes, rid)


def dec_range_resp(frame: bytes | memoryview, n: int, rid: int) -> ReadRangeResponse:
    """``frame`` is the frame after its length; its entries are slices of it (views of a
    memoryview: no copy)."""
    if n < 12 + _RESP_BODY.size:
        raise InvalidArgumentError(f"READ_RANGE answer of {n - 12} bytes is shorter than its {_RESP_BODY.size} "
                                   "fixed bytes")
    ledger, first, lac, count = _RESP_BODY.unpack_from(frame, 12)
    if not 1 <= count <= MAX_RANGE_ENTRIES:
        raise InvalidArgumentError(f"READ_RANGE answer counts {count} entries, not 1 to {MAX_RANGE_ENTRIES}")
    entries: list[bytes | memoryview] = []
    append, length_of = entries.append, _LEN.unpack_from
    off = 12 + _RESP_BODY.size
    for _ in range(count):
        if off + 4 > n:
            raise InvalidArgumentError(f"READ_RANGE answer ends after {len(entries)} of its {count} entries")
        (size,) = length_of(frame, off)
        end = off + 4 + size
        if end > n:
            raise InvalidArgumentError(f"entry {first + len(entries)} of {size} bytes runs past the frame")
        append(frame[off + 4 : end])
        off = end
    if off != n:
        raise InvalidArgumentError(f"{n - off} bytes after the last entry of a READ_RANGE answer")
    return ReadRangeResponse(ledger, first, lac, tuple(entries), rid)
