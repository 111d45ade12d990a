"""The bookie wire protocol's messages: one frozen dataclass per request and per
response (docs/format.md, "Wire protocol"), and the ``Request`` / ``Response`` unions.

Theory of operation. A message is what a frame means, independent of how it is spelled
in bytes: the codec (:mod:`walkit.protocol._codec`, the walkit dialect) turns messages
into frames and back, and a later dialect (BookKeeper's v2/v3) would spell the same
messages its own way. Every message is checked when built: a field out of range or of
the wrong type raises :class:`InvalidArgumentError` naming the field, so an invalid
message cannot exist and a decoder only has to call the constructor to check ranges.
The entry path's messages trade the generated ``__init__`` for one combined test (the
per-field checks run only when it fails, to name the bad field), and
:func:`_trusted_add` / :func:`_trusted_added` build one without any test for a caller
that has already checked every field (the connections' hot paths); nothing else may
use them. Messages are frozen: a message handed to another thread or kept in a queue
cannot change under its reader.

Used by the package's siblings: the field checks (``_int``), the ranges (``_I63``,
``_U32``, ``_U64``), the op / status look-ups (``_OPS``, ``_STATUSES``) and
``_REQUEST_OP`` / ``_response_op`` (which op a message answers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeAlias

from walkit.errors import InvalidArgumentError
from walkit.protocol._codes import MAX_KEY_SIZE, Op, Status
from walkit.protocol._admin import AdminRequest, AdminResponse
from walkit.protocol._range import ReadRange, ReadRangeResponse

__all__ = [
    "AddEntry",
    "ReadEntry",
    "ReadLac",
    "WriteLac",
    "GetBookieInfo",
    "AdminRequest",
    "AdminResponse",
    "ReadRange",
    "ReadRangeResponse",
    "Request",
    "AddEntryResponse",
    "ReadEntryResponse",
    "ReadLacResponse",
    "WriteLacResponse",
    "BookieInfoResponse",
    "ErrorResponse",
    "Response",
    "ForceLedger",
    "ForceLedgerResponse",
    "GetListOfEntries",
    "ListOfEntriesResponse",
    "AuthMessage",
    "StartTls",
    "StartTlsResponse",
    "BkRequest",
    "BkResponse",
]

_I63 = 2**63 - 1
_U64 = 2**64 - 1
_U32 = 2**32 - 1


_OPS = {op.value: op for op in Op}
_STATUSES = {s.value: s for s in Status}
_MAX_OP = max(_OPS)
_MAX_STATUS = max(_STATUSES)


# --- field checks (construction) ---------------------------------------------------------


def _bad_field(name: str, value: object) -> InvalidArgumentError:
    shown = f"{len(value)} bytes" if isinstance(value, bytes) else repr(value)[:80]
    return InvalidArgumentError(
        f"{name} out of range or of the wrong type", field=name, value=shown, type=type(value).__name__
    )


def _int(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or not low <= value <= high:
        raise _bad_field(name, value)


def _key(value: object, *, required: bool) -> None:
    if not isinstance(value, bytes) or len(value) > MAX_KEY_SIZE or (required and not value):
        raise _bad_field("master_key", value)


def _bytes(name: str, value: object) -> None:
    if not isinstance(value, bytes):
        raise _bad_field(name, value)


def _bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise _bad_field(name, value)


# --- messages ----------------------------------------------------------------------------


# The entry path's messages (AddEntry, AddEntryResponse, ReadEntryResponse) have a
# hand-written __init__: the generated frozen one (object.__setattr__ per field) plus a
# call per field check cost ~3 us; one combined test and __dict__ stores cost ~1 us. The
# per-field checks in _check() run only when that test fails, to name the bad field.


@dataclass(frozen=True, init=False)
class AddEntry:
    ledger_id: int
    entry_id: int
    master_key: bytes
    data: bytes  # the encoded entry (walkit.protocol._entry)
    recovery: bool = False
    request_id: int = 0

    def __init__(
        self, ledger_id: int, entry_id: int, master_key: bytes, data: bytes, recovery: bool = False,
        request_id: int = 0,
    ) -> None:
        fields = self.__dict__
        fields["ledger_id"], fields["entry_id"], fields["master_key"] = ledger_id, entry_id, master_key
        fields["data"], fields["recovery"], fields["request_id"] = data, recovery, request_id
        if not (
            isinstance(ledger_id, int) and 0 <= ledger_id <= _I63 and isinstance(entry_id, int)
            and 0 <= entry_id <= _I63 and isinstance(master_key, bytes) and len(master_key) <= MAX_KEY_SIZE
            and isinstance(data, bytes) and isinstance(recovery, bool) and isinstance(request_id, int)
            and 0 <= request_id <= _U64
        ):
            self._check()

    def _check(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("entry_id", self.entry_id, 0, _I63)
        _key(self.master_key, required=False)
        _bytes("data", self.data)
        _bool("recovery", self.recovery)
        _int("request_id", self.request_id, 0, _U64)
        raise InvalidArgumentError("invalid AddEntry")  # unreachable unless the two checks disagree


_new = object.__new__


def _trusted_add(ledger_id: int, entry_id: int, master_key: bytes, data: bytes, recovery: bool,
                 request_id: int) -> AddEntry:
    """An AddEntry whose fields the caller already checked (the server's decode of an
    ADD_ENTRY frame: the frame layout fixes the types, the decoder the ranges), without
    running the constructor's test again: ~0.5 us less per add."""
    req: AddEntry = _new(AddEntry)
    fields = req.__dict__
    fields["ledger_id"], fields["entry_id"], fields["master_key"] = ledger_id, entry_id, master_key
    fields["data"], fields["recovery"], fields["request_id"] = data, recovery, request_id
    return req


@dataclass(frozen=True)
class ReadEntry:
    ledger_id: int
    entry_id: int  # -1: the last entry the bookie stores
    fence: bool = False
    master_key: bytes = b""  # non-empty iff fence
    previous_lac: int | None = None  # not None: a long poll
    timeout_ms: int = 0  # long polls only
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("entry_id", self.entry_id, -1, _I63)
        _bool("fence", self.fence)
        _key(self.master_key, required=self.fence)
        if self.master_key and not self.fence:
            raise InvalidArgumentError("a master key is sent only with fence", ledger=self.ledger_id)
        if self.previous_lac is None:
            _int("timeout_ms", self.timeout_ms, 0, 0)
        else:
            _int("previous_lac", self.previous_lac, -1, _I63)
            _int("timeout_ms", self.timeout_ms, 0, _U32)
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class ReadLac:
    ledger_id: int
    request_id: int = 0
    #: BookKeeper's v3 READ_LAC: answer with the last stored entry too (its reader takes
    #: the LAC from that entry's header, digest-checked); never on walkit's wire
    with_last_entry: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("request_id", self.request_id, 0, _U64)
        _bool("with_last_entry", self.with_last_entry)


@dataclass(frozen=True)
class WriteLac:
    ledger_id: int
    lac: int
    master_key: bytes
    request_id: int = 0
    #: BookKeeper's LAC body (ledger, LAC, the writer's digest), kept in memory by the
    #: bookie to answer BookKeeper's READ_LAC with: v3's ``WriteLacRequest.body``, and on
    #: walkit's wire the flag LAC_BODY's field (at most MAX_LAC_BODY_SIZE bytes there)
    body: bytes = field(default=b"", compare=False, repr=False)

    def __post_init__(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("lac", self.lac, -1, _I63)
        _key(self.master_key, required=True)
        _int("request_id", self.request_id, 0, _U64)
        _bytes("body", self.body)


@dataclass(frozen=True)
class GetBookieInfo:
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True, init=False)
class AddEntryResponse:
    ledger_id: int
    entry_id: int
    request_id: int = 0

    def __init__(self, ledger_id: int, entry_id: int, request_id: int = 0) -> None:
        fields = self.__dict__
        fields["ledger_id"], fields["entry_id"], fields["request_id"] = ledger_id, entry_id, request_id
        if not (
            isinstance(ledger_id, int) and 0 <= ledger_id <= _I63 and isinstance(entry_id, int)
            and 0 <= entry_id <= _I63 and isinstance(request_id, int) and 0 <= request_id <= _U64
        ):
            self._check()

    def _check(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("entry_id", self.entry_id, 0, _I63)
        _int("request_id", self.request_id, 0, _U64)
        raise InvalidArgumentError("invalid AddEntryResponse")


def _trusted_added(ledger_id: int, entry_id: int, request_id: int) -> AddEntryResponse:
    """An AddEntryResponse whose fields the caller already checked (see _trusted_add)."""
    resp: AddEntryResponse = _new(AddEntryResponse)
    fields = resp.__dict__
    fields["ledger_id"], fields["entry_id"], fields["request_id"] = ledger_id, entry_id, request_id
    return resp


@dataclass(frozen=True, init=False)
class ReadEntryResponse:
    ledger_id: int
    entry_id: int  # the entry actually read (never -1)
    lac: int  # the bookie's LAC for the ledger when it answered
    data: bytes  # the stored entry
    request_id: int = 0

    def __init__(self, ledger_id: int, entry_id: int, lac: int, data: bytes, request_id: int = 0) -> None:
        fields = self.__dict__
        fields["ledger_id"], fields["entry_id"], fields["lac"] = ledger_id, entry_id, lac
        fields["data"], fields["request_id"] = data, request_id
        if not (
            isinstance(ledger_id, int) and 0 <= ledger_id <= _I63 and isinstance(entry_id, int)
            and 0 <= entry_id <= _I63 and isinstance(lac, int) and -1 <= lac <= _I63
            and isinstance(data, bytes) and isinstance(request_id, int) and 0 <= request_id <= _U64
        ):
            self._check()

    def _check(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("entry_id", self.entry_id, 0, _I63)
        _int("lac", self.lac, -1, _I63)
        _bytes("data", self.data)
        _int("request_id", self.request_id, 0, _U64)
        raise InvalidArgumentError("invalid ReadEntryResponse")


@dataclass(frozen=True)
class ReadLacResponse:
    ledger_id: int
    lac: int
    request_id: int = 0
    #: the last stored entry, when the request asked for it (ReadLac.with_last_entry)
    last_entry: bytes = field(default=b"", compare=False, repr=False)
    #: the body of the ledger's last BookKeeper WRITE_LAC, when one came (same request)
    lac_body: bytes = field(default=b"", compare=False, repr=False)

    def __post_init__(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("lac", self.lac, -1, _I63)
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class WriteLacResponse:
    ledger_id: int
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class BookieInfoResponse:
    free_bytes: int
    total_bytes: int
    readonly: bool
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("free_bytes", self.free_bytes, 0, _U64)
        _int("total_bytes", self.total_bytes, 0, _U64)
        _bool("readonly", self.readonly)
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class ErrorResponse:
    """Any op's answer when status != EOK. ``message`` is cut to 1024 UTF-8 bytes on the wire."""

    op: Op
    status: Status
    ledger_id: int = 0
    entry_id: int = -1
    message: str = ""
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("op", self.op, 0, _MAX_OP)
        _int("status", self.status, 1, _MAX_STATUS)
        self.__dict__["op"], self.__dict__["status"] = _OPS[self.op], _STATUSES[self.status]
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("entry_id", self.entry_id, -1, _I63)
        if not isinstance(self.message, str):
            raise _bad_field("message", self.message)
        _int("request_id", self.request_id, 0, _U64)


Request: TypeAlias = AddEntry | ReadEntry | ReadLac | WriteLac | GetBookieInfo | AdminRequest | ReadRange
Response: TypeAlias = (
    AddEntryResponse | ReadEntryResponse | ReadLacResponse | WriteLacResponse | BookieInfoResponse | AdminResponse
    | ReadRangeResponse | ErrorResponse
)

_REQUEST_OP: dict[type[Any], Op] = {
    AddEntry: Op.ADD_ENTRY,
    ReadEntry: Op.READ_ENTRY,
    ReadLac: Op.READ_LAC,
    WriteLac: Op.WRITE_LAC,
    GetBookieInfo: Op.GET_BOOKIE_INFO,
    AdminRequest: Op.ADMIN,
    ReadRange: Op.READ_RANGE,
}
_RESPONSE_OP: dict[type[Any], Op] = {
    AddEntryResponse: Op.ADD_ENTRY,
    ReadEntryResponse: Op.READ_ENTRY,
    ReadLacResponse: Op.READ_LAC,
    WriteLacResponse: Op.WRITE_LAC,
    BookieInfoResponse: Op.GET_BOOKIE_INFO,
    AdminResponse: Op.ADMIN,
    ReadRangeResponse: Op.READ_RANGE,
}


def _response_op(resp: Response) -> Op:
    return resp.op if isinstance(resp, ErrorResponse) else _RESPONSE_OP[type(resp)]



# --- BookKeeper-only operations (issue 37) -----------------------------------------------
# Ops BookKeeper's wire dialects carry that walkit's own dialect does not: the BookKeeper
# codecs (walkit.protocol._bk_v3, _bk_v2) decode into these; walkit's codec never sees
# them (they are outside Request / Response; see BkRequest / BkResponse).


@dataclass(frozen=True)
class ForceLedger:
    """Make every entry of the ledger the bookie acknowledged durable (v3 FORCE_LEDGER)."""

    ledger_id: int
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class ForceLedgerResponse:
    ledger_id: int
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class GetListOfEntries:
    """Which entries of the ledger the bookie stores (v3 GET_LIST_OF_ENTRIES_OF_LEDGER)."""

    ledger_id: int
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class ListOfEntriesResponse:
    """``availability``: BookKeeper's AvailabilityOfEntriesOfLedger bytes, carried as they are."""

    ledger_id: int
    availability: bytes
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("ledger_id", self.ledger_id, 0, _I63)
        _bytes("availability", self.availability)
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class AuthMessage:
    """One step of BookKeeper's authentication handshake (AUTH, both directions): the
    plug-in's name and its opaque payload."""

    plugin_name: str
    payload: bytes
    request_id: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.plugin_name, str):
            raise _bad_field("plugin_name", self.plugin_name)
        _bytes("payload", self.payload)
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class StartTls:
    """Upgrade the connection to TLS (v3 START_TLS; the answer is a StartTlsResponse)."""

    request_id: int = 0

    def __post_init__(self) -> None:
        _int("request_id", self.request_id, 0, _U64)


@dataclass(frozen=True)
class StartTlsResponse:
    request_id: int = 0

    def __post_init__(self) -> None:
        _int("request_id", self.request_id, 0, _U64)


BkRequest: TypeAlias = Request | ForceLedger | GetListOfEntries | AuthMessage | StartTls
BkResponse: TypeAlias = Response | ForceLedgerResponse | ListOfEntriesResponse | AuthMessage | StartTlsResponse
