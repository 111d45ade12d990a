"""Apache BookKeeper 4.18's small ZooKeeper records: LAYOUT, INSTANCEID, cookies, bookie
registrations, under-replication marks and the auditor election. Pure bytes <-> values.

Theory of operation
-------------------
Each record is what BookKeeper 4.18 writes (docs/format.md, "BookKeeper metadata
formats"; the golden files in tests/unit/golden/bookkeeper/ are BookKeeper's own):

* ``<root>/LAYOUT`` (:class:`Layout`): ``<layout version>\\n<factory class>:<manager
  version>``, no final newline; 4.18 writes layout version 2, e.g.
  ``2\\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1``;
* ``<root>/INSTANCEID`` (:class:`InstanceId`): a UUID in UTF-8, no newline;
* ``<root>/cookies/<bookie>`` (:class:`BkCookie`): ``5\\n`` then ``CookieFormat`` in
  protobuf text format (versions 4 and 5 read alike; 3 is four plain lines). The ledger
  and index dirs are ``<count>\\t<dir>\\t<dir>...``; the journal dirs are comma-joined;
* ``<root>/available[/readonly]/<bookie>`` (:class:`BookieServiceInfo`): binary
  ``BookieServiceInfoFormat`` (endpoints, properties); empty data (pre-4.12 bookies) is
  a registration without endpoints;
* under ``<root>/underreplication`` (paths in ``_bk_paths``): ``LAYOUT``
  (:class:`UrLayout`, ``type: "BASIC"\\nversion: 1\\n``), marks (:class:`UrMark`,
  ``UnderreplicatedLedgerFormat``: replicas, ctime), locks (:class:`BookieNote` of
  ``LockDataFormat``) and the auditor election and its votes (:class:`BookieNote` of
  ``AuditorVoteFormat``), all protobuf text format.

Text formats are written as protobuf's text printer does (Java's and Python's agree for
these messages: one ``name: value`` per line, strings quoted, non-ASCII bytes escaped in
octal) and read by protobuf's text parser. Decoding raises :class:`FormatError` with
context for anything malformed; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import message as pb_message
from google.protobuf import text_format

from walkit.errors import FormatError, InvalidArgumentError
from walkit.metadata import _bk_meta_pb2

__all__ = [
    "Layout", "MANAGER_CLASSES", "InstanceId", "BkCookie", "Endpoint", "BookieServiceInfo", "UrLayout",
    "UrMark", "BookieNote",
]

pb: Any = _bk_meta_pb2  # generated code: its classes are made at import, unknown to mypy
#: BookKeeper's ledger manager names -> factory classes (as LAYOUT names them).
MANAGER_CLASSES = {
    "flat": "org.apache.bookkeeper.meta.FlatLedgerManagerFactory",
    "hierarchical": "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory",
    "longhierarchical": "org.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory",
    "legacyhierarchical": "org.apache.bookkeeper.meta.LegacyHierarchicalLedgerManagerFactory",
}
_LAYOUT_VERSIONS = (1, 2)
COOKIE_VERSION = 5


def _text(data: bytes, what: str) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"BookKeeper {what} is not UTF-8", at=exc.start) from exc


def _parse_text(message: str, data: bytes | str, what: str) -> Any:
    """``data`` parsed as protobuf text of ``message``, required fields checked."""
    msg = getattr(pb, message)()
    try:
        text_format.Parse(data if isinstance(data, str) else _text(data, what), msg)
    except (text_format.ParseError, pb_message.DecodeError) as exc:
        raise FormatError(f"BookKeeper {what}: bad text format", reason=str(exc)[:200]) from exc
    if not msg.IsInitialized():
        raise FormatError(f"BookKeeper {what}: required fields missing", missing=",".join(msg.FindInitializationErrors()))
    return msg


def _print_text(msg: Any) -> bytes:
    return bytes(text_format.MessageToString(msg).encode("utf-8"))


def _decimal(text: str, what: str) -> int:
    number = text.strip()  # (str.strip takes more than int() does: "\x1c0" left "0" to check and "\x1c0" to int)
    digits = number[1:] if number.startswith("-") else number
    if not digits or not digits.isascii() or not digits.isdigit():
        raise FormatError(f"BookKeeper {what}: not a number", text=text[:40])
    return int(number)


@dataclass(frozen=True)
class Layout:
    """``<root>/LAYOUT``: which ledger manager lays the cluster's ledgers out."""

    manager_class: str
    manager_version: int = 1
    layout_version: int = 2

    @classmethod
    def for_manager(cls, manager: str) -> Layout:
        if manager not in MANAGER_CLASSES:
            raise InvalidArgumentError("unknown BookKeeper ledger manager", manager=manager)
        return cls(MANAGER_CLASSES[manager])

    @property
    def manager(self) -> str | None:
        """The manager's short name ("hierarchical", ...), None for another class."""
        return next((name for name, cls in MANAGER_CLASSES.items() if cls == self.manager_class), None)

    def encode(self) -> bytes:
        return f"{self.layout_version}\n{self.manager_class}:{self.manager_version}".encode()

    @classmethod
    def decode(cls, data: bytes) -> Layout:
        lines = [line for line in _text(data, "LAYOUT").split("\n")]
        while lines and not lines[-1]:
            lines.pop()  # Java's split drops trailing empty strings
        version = _decimal(lines[0] if lines else "", "LAYOUT version")
        if version not in _LAYOUT_VERSIONS:
            raise FormatError("BookKeeper LAYOUT version not understood", version=version,
                              known=",".join(map(str, _LAYOUT_VERSIONS)))
        parts = lines[1].split(":") if len(lines) >= 2 else []
        if len(parts) != 2 or not parts[0]:
            raise FormatError("BookKeeper LAYOUT: no '<factory class>:<version>' line", layout=repr(lines)[:200])
        return cls(parts[0], _decimal(parts[1], "LAYOUT manager version"), version)


@dataclass(frozen=True)
class InstanceId:
    """``<root>/INSTANCEID``: the cluster's name, a UUID as text."""

    value: str

    def encode(self) -> bytes:
        return self.value.encode("utf-8")

    @classmethod
    def decode(cls, data: bytes) -> InstanceId:
        value = _text(data, "INSTANCEID")
        if not value or not value.isprintable() or value.strip() != value:
            raise FormatError("BookKeeper INSTANCEID: empty or not one printable word", value=value[:80])
        return cls(value)


def _dirs(field: str, what: str) -> tuple[str, ...]:
    """``<count>\\t<dir>...`` -> the dirs (the count checked)."""
    count, _, rest = field.partition("\t")
    dirs = tuple(rest.split("\t")) if rest else ()
    if not count.isdigit() or int(count) != len(dirs):
        raise FormatError(f"BookKeeper cookie: bad {what}", value=field[:200])
    return dirs


def _join_dirs(dirs: tuple[str, ...]) -> str:
    return "\t".join((str(len(dirs)), *dirs))


@dataclass(frozen=True)
class BkCookie:
    """A bookie's cookie (``<root>/cookies/<bookie>`` and each disk's ``current/VERSION``)."""

    bookie_id: str
    journal_dirs: str  # comma-joined, as BookKeeper keeps them
    ledger_dirs: tuple[str, ...]
    instance_id: str | None = None
    index_dirs: tuple[str, ...] | None = None
    version: int = COOKIE_VERSION

    def encode(self) -> bytes:
        """Version 5: ``5\\n`` and the text format (what 4.18 writes)."""
        msg = pb.CookieFormat(bookieHost=self.bookie_id, journalDir=self.journal_dirs,
                              ledgerDirs=_join_dirs(self.ledger_dirs))
        if self.instance_id is not None:
            msg.instanceId = self.instance_id
        if self.index_dirs is not None:
            msg.indexDirs = _join_dirs(self.index_dirs)
        return f"{COOKIE_VERSION}\n".encode() + _print_text(msg)

    @classmethod
    def decode(cls, data: bytes) -> BkCookie:
        first, _, rest = _text(data, "cookie").partition("\n")
        version = _decimal(first, "cookie version")
        if version == 3:
            lines = rest.split("\n")
            if len(lines) < 3:
                raise FormatError("BookKeeper cookie version 3: fewer than 3 lines", lines=len(lines))
            return cls(lines[0], lines[1], _dirs(lines[2], "ledger dirs"), version=3)
        if version not in (4, 5):
            raise FormatError("BookKeeper cookie version not understood", version=version, known="3,4,5")
        msg = _parse_text("CookieFormat", rest, "cookie")
        return cls(msg.bookieHost, msg.journalDir, _dirs(msg.ledgerDirs, "ledger dirs"),
                   msg.instanceId or None, _dirs(msg.indexDirs, "index dirs") if msg.indexDirs else None, version)


@dataclass(frozen=True)
class Endpoint:
    """One service a bookie offers (``bookie``/``bookie-rpc`` is its data port)."""

    id: str
    port: int
    host: str
    protocol: str
    auth: tuple[str, ...] = ()
    extensions: tuple[str, ...] = ()


@dataclass(frozen=True)
class BookieServiceInfo:
    """A bookie's registration data: its endpoints and free-form properties."""

    endpoints: tuple[Endpoint, ...] = ()
    properties: tuple[tuple[str, str], ...] = ()  # sorted by key

    def encode(self) -> bytes:
        msg = pb.BookieServiceInfoFormat()
        for e in self.endpoints:
            msg.endpoints.add(id=e.id, port=e.port, host=e.host, protocol=e.protocol, auth=list(e.auth),
                              extensions=list(e.extensions))
        msg.properties.update(dict(self.properties))
        try:
            return bytes(msg.SerializeToString(deterministic=True))
        except (ValueError, pb_message.EncodeError) as exc:
            raise InvalidArgumentError("unencodable bookie service info", reason=str(exc)[:200]) from exc

    @classmethod
    def decode(cls, data: bytes) -> BookieServiceInfo:
        msg = pb.BookieServiceInfoFormat()
        try:
            msg.ParseFromString(bytes(data))
        except pb_message.DecodeError as exc:
            raise FormatError("BookKeeper registration: bad protobuf", reason=str(exc)[:200]) from exc
        if not msg.IsInitialized():
            raise FormatError("BookKeeper registration: required fields missing",
                              missing=",".join(msg.FindInitializationErrors()))
        endpoints = tuple(Endpoint(e.id, e.port, e.host, e.protocol, tuple(e.auth), tuple(e.extensions))
                          for e in msg.endpoints)
        return cls(endpoints, tuple(sorted(msg.properties.items())))


@dataclass(frozen=True)
class UrLayout:
    """``<root>/underreplication/LAYOUT``: ``BASIC`` version 1 in 4.18."""

    type: str = "BASIC"
    version: int = 1

    def encode(self) -> bytes:
        return _print_text(pb.LedgerRereplicationLayoutFormat(type=self.type, version=self.version))

    @classmethod
    def decode(cls, data: bytes) -> UrLayout:
        msg = _parse_text("LedgerRereplicationLayoutFormat", data, "under-replication LAYOUT")
        return cls(msg.type, msg.version)


@dataclass(frozen=True)
class UrMark:
    """An under-replication mark: the bookies whose copies are missing, and when it was
    first marked (ms since the epoch; None: not recorded)."""

    replicas: tuple[str, ...]
    ctime: int | None = None

    def encode(self) -> bytes:
        msg = pb.UnderreplicatedLedgerFormat(replica=list(self.replicas))
        if self.ctime is not None:
            msg.ctime = self.ctime
        return _print_text(msg)

    @classmethod
    def decode(cls, data: bytes) -> UrMark:
        msg = _parse_text("UnderreplicatedLedgerFormat", data, "under-replication mark")
        return cls(tuple(msg.replica), msg.ctime if msg.HasField("ctime") else None)


@dataclass(frozen=True)
class BookieNote:
    """``{bookieId: ...}``: a replication lock's holder (``LockDataFormat``), an auditor
    vote or the elected auditor (``AuditorVoteFormat``); the two messages are the same
    bytes. None: the field is absent."""

    bookie_id: str | None = None

    def encode(self) -> bytes:
        msg = pb.AuditorVoteFormat()
        if self.bookie_id is not None:
            msg.bookieId = self.bookie_id
        return _print_text(msg)

    @classmethod
    def decode(cls, data: bytes) -> BookieNote:
        msg = _parse_text("AuditorVoteFormat", data, "auditor vote or lock")
        return cls(msg.bookieId if msg.HasField("bookieId") else None)
