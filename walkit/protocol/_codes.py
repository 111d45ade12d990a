"""The numbers of the bookie wire protocol, in one place: the protocol version, the size
bounds every frame is checked against, and the opcodes (:class:`Op`), request flags
(:class:`Flag`) and status codes (:class:`Status`), named as BookKeeper names them.

Pure constants, no behaviour: the codec (:mod:`walkit.protocol._codec`) encodes and decodes
with them; a later wire dialect keeps its own numbers in a module beside this one.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag

__all__ = [
    "PROTOCOL_VERSION",
    "DEFAULT_MAX_FRAME_SIZE",
    "MIN_MAX_FRAME_SIZE",
    "HEADER_SIZE",
    "MAX_KEY_SIZE",
    "MAX_MESSAGE_SIZE",
    "MAX_LAC_BODY_SIZE",
    "Op",
    "Flag",
    "Status",
]

PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME_SIZE = 5 * 1024 * 1024  # BookKeeper's nettyMaxFrameSizeBytes
MIN_MAX_FRAME_SIZE = 4096  # every message without entry data fits (the largest is 1056 bytes)
HEADER_SIZE = 12  # version, kind, flags/status, request id: the bytes after the length
MAX_KEY_SIZE = 64
MAX_MESSAGE_SIZE = 1024  # bytes of UTF-8 in an error response
MAX_LAC_BODY_SIZE = 64  # a WRITE_LAC's BookKeeper LAC body (BookKeeper's largest: 16 + HMAC-SHA1's 20)


class Op(IntEnum):
    """A request's kind byte; its response has kind ``0x80 | op``."""

    INVALID = 0  # never a request; an error response with it answers a frame whose op is unknown
    ADD_ENTRY = 1
    READ_ENTRY = 2
    READ_LAC = 3
    WRITE_LAC = 4
    GET_BOOKIE_INFO = 5
    ADMIN = 6  # operator commands with JSON bodies (walkit.protocol._admin)
    READ_RANGE = 7  # consecutive entries of one ledger in one frame (walkit.protocol._range)


class Flag(IntFlag):
    RECOVERY_ADD = 0x1  # ADD_ENTRY: a recoverer re-replicating; accepted on a fenced ledger
    FENCE = 0x2  # READ_ENTRY: fence the ledger first (needs the master key)
    LONG_POLL = 0x4  # READ_ENTRY: wait until the LAC passes previous_lac or timeout_ms
    LAC_BODY = 0x8  # WRITE_LAC: BookKeeper's LAC body follows the key (bookies before 2026-12-06 refuse it)


class Status(IntEnum):
    EOK = 0
    ENOLEDGER = 1
    ENOENTRY = 2
    EBADREQ = 3
    EIO = 4
    EUA = 5
    EBADVERSION = 6
    EFENCED = 7
    EREADONLY = 8
    ETOOMANYREQUESTS = 9
