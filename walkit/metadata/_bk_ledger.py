"""Apache BookKeeper 4.18's ledger metadata bytes, and their mapping to walkit's LedgerMetadata.

Theory of operation
-------------------
A BookKeeper ledger znode holds one line ``BookieMetadataFormatVersion\\t<n>\\n`` and then
the body of format ``n`` (docs/format.md, "BookKeeper metadata formats"):

* 3 (what 4.9+ writes): a varint length, then that many bytes of the binary protobuf
  ``LedgerMetadataFormat`` (``bookkeeper.proto`` here, field numbers from BookKeeper's
  DataFormats.proto);
* 2 (4.2 to 4.8): the same message in protobuf text format, to the end of the value;
* 1 (4.0, 4.1): lines ``quorum``, ``ensemble``, ``length``, then ``first\\tbookie...`` per
  fragment, then ``last\\tCLOSED`` (``-102\\tCLOSED``: in recovery) if not open.

:class:`BkLedgerMetadata` is the record as BookKeeper keeps it, absent fields as None and
custom metadata in stored order, so ``decode(x).encode() == x`` for every version 3 value
BookKeeper writes (protobuf serialises fields in number order, as Java does; the golden
files in tests/unit/golden/bookkeeper/ are BookKeeper's own). Versions 1 and 2 are read;
version 2 is also written (text escapes of odd password bytes may differ from Java's).

Mapping to walkit's :class:`LedgerMetadata` (:meth:`BkLedgerMetadata.to_walkit`,
:func:`from_walkit`): quorums, state, last entry, length, fragments and custom metadata
map one to one (BookKeeper's ``customMetadata`` *is* walkit's). Digests: BookKeeper's
own, under walkit's ``bk-*`` names (CRC32 <-> bk-crc32, CRC32C <-> bk-crc32c, HMAC <->
bk-hmac, DUMMY <-> bk-dummy: BookKeeper's entry digests and SHA-1 master key); walkit's
own digests have no BookKeeper record and are refused. BookKeeper keeps the **clear
password** (field 8) where walkit keeps a salted verifier: ``to_walkit`` computes the
verifier and keeps the password in ``LedgerMetadata.bk_password`` (and returns it beside
the metadata), ``from_walkit`` writes ``bk_password`` (or the password it is given,
checked against the verifier). A record without a password (format 1, pre-4.2 clients)
keeps no digest type either - BookKeeper takes both from the reader - so ``to_walkit``
then needs them as arguments, and its metadata has ``bk_password`` None: written back,
the record again keeps neither. ctime is optional in BookKeeper (4.18 stores none unless
``storeSystemtimeAsLedgerCreationTime``); a missing one maps to the caller's ``ctime``
(BookKeeper uses the znode's creation time).

The creator token (``cToken``, field 12: a random number the creator writes so that a
create retried after a lost reply recognises its own znode) rides in the verifier's salt
of the walkit value: ``to_walkit`` makes the salt ``<cToken, 8 bytes big-endian>`` +
``bkcToken`` (``bkNoTokn`` and zeros: the record has none), so reading a record twice
gives equal values and ``from_walkit`` writes the token back unchanged;
:meth:`LedgerMetadata.create` gives a new ``bk-*`` ledger such a salt with a random
63-bit token. A salt with neither mark (a value made otherwise) gives its first 8 bytes,
as a non-negative 63-bit number, as the token.

Every malformed value raises :class:`FormatError` with context; nothing here does I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from google.protobuf import message as pb_message
from google.protobuf import text_format

from walkit.errors import FormatError, FormatVersionError, InvalidArgumentError
from walkit.metadata import _bk_meta_pb2
from walkit.metadata._ledger import (
    BK_NO_TOKEN_MARK,
    BK_TOKEN_MARK,
    Fragment,
    LedgerMetadata,
    LedgerState,
    bk_token_salt,
    is_bk_digest,
)

__all__ = ["BkLedgerMetadata", "decode_ledger_metadata", "from_walkit", "salt_for", "ctoken_of", "FROM_SALT",
           "HEADER", "VERSIONS"]

pb: Any = _bk_meta_pb2  # generated code: its classes are made at import, unknown to mypy
HEADER = b"BookieMetadataFormatVersion\t"
VERSIONS = (1, 2, 3)
MAX_VALUE = 1 << 20  # ZooKeeper's default jute.maxbuffer
_V1_RECOVERY = -102
_DIGEST_TO_WALKIT = {"CRC32": "bk-crc32", "CRC32C": "bk-crc32c", "HMAC": "bk-hmac", "DUMMY": "bk-dummy"}
_DIGEST_TO_BK = {v: k for k, v in _DIGEST_TO_WALKIT.items()}
_BK_DIGESTS = ("CRC32", "HMAC", "CRC32C", "DUMMY")
_LONG_MASK = (1 << 63) - 1


class _FromSalt(enum.Enum):
    FROM_SALT = "from the salt"


FROM_SALT = _FromSalt.FROM_SALT  # from_walkit's default cToken: the one the salt carries


salt_for = bk_token_salt  # the verifier salt that carries a record's creator token (see the docstring)


def ctoken_of(salt: bytes) -> int | None:
    """The creator token a walkit value's salt carries (a fresh salt: a new token)."""
    if salt[8:] == BK_TOKEN_MARK:
        return int.from_bytes(salt[:8], "big", signed=True)
    if salt[8:] == BK_NO_TOKEN_MARK:
        return None
    return int.from_bytes(salt[:8], "big") & _LONG_MASK


@dataclass(frozen=True)
class BkLedgerMetadata:
    """One ledger znode's content as BookKeeper keeps it (None: field absent)."""

    write_quorum: int
    ensemble_size: int
    length: int
    state: LedgerState
    segments: tuple[Fragment, ...]
    last_entry_id: int | None = None
    digest: str | None = None  # "CRC32", "HMAC", "CRC32C" or "DUMMY"
    password: bytes | None = None
    ack_quorum: int | None = None
    ctime: int | None = None
    custom: tuple[tuple[str, bytes], ...] = ()
    ctoken: int | None = None
    format_version: int = 3

    def __post_init__(self) -> None:
        if self.format_version not in VERSIONS:
            raise InvalidArgumentError("unknown BookKeeper ledger metadata version", version=self.format_version)
        if self.digest is not None and self.digest not in _BK_DIGESTS:
            raise InvalidArgumentError("unknown BookKeeper digest type", digest=self.digest)
        if not isinstance(self.state, LedgerState):
            raise InvalidArgumentError("state must be a LedgerState", state=repr(self.state))

    # -- bytes --------------------------------------------------------------------------

    def to_proto(self) -> Any:
        """The ``LedgerMetadataFormat`` message (fields set exactly where not None)."""
        msg = pb.LedgerMetadataFormat(quorumSize=self.write_quorum, ensembleSize=self.ensemble_size,
                                      length=self.length, state=int(self.state))
        for name, attr in (("lastEntryId", "last_entry_id"), ("password", "password"),
                           ("ackQuorumSize", "ack_quorum"), ("ctime", "ctime"), ("cToken", "ctoken")):
            if getattr(self, attr) is not None:
                setattr(msg, name, getattr(self, attr))
        if self.digest is not None:
            msg.digestType = pb.LedgerMetadataFormat.DigestType.Value(self.digest)
        for first, bookies in self.segments:
            msg.segment.add(firstEntryId=first, ensembleMember=list(bookies))
        for key, value in self.custom:
            msg.customMetadata.add(key=key, value=value)
        return msg

    def encode(self) -> bytes:
        """The znode value in this record's format version (2 or 3)."""
        try:
            msg = self.to_proto()
            if self.format_version == 2:  # never a cToken: BookKeeper's version 2 has none
                msg.ClearField("cToken")
                return HEADER + b"2\n" + bytes(text_format.MessageToString(msg).encode("utf-8"))
            body = bytes(msg.SerializeToString())
        except (ValueError, TypeError, pb_message.EncodeError) as exc:
            raise InvalidArgumentError("unencodable BookKeeper ledger metadata", reason=str(exc)[:200]) from exc
        if self.format_version != 3:
            raise InvalidArgumentError("BookKeeper ledger metadata version 1 is read, never written")
        return HEADER + b"3\n" + _varint(len(body)) + body

    # -- walkit -------------------------------------------------------------------------

    def to_walkit(self, ledger_id: int, *, ctime: int = 0, salt: bytes | None = None, digest: str | None = None,
                  password: bytes = b"") -> tuple[LedgerMetadata, bytes]:
        """walkit's metadata for this ledger and the ledger's password. ``ctime``: used
        when the record has none; ``salt``: the verifier's salt (None: the one carrying
        the record's cToken); ``digest`` (a ``bk-*`` name) and ``password``: only for a
        record that keeps no password (format 1, or a 4.0/4.1 client's), as BookKeeper
        then takes both from the reader; such a record without ``digest`` is refused."""
        kept = self.password
        digest, password = self._digest_and_password(ledger_id, digest, password)
        salt = salt_for(self.ctoken) if salt is None else salt
        try:
            meta = LedgerMetadata(
                ledger_id=ledger_id, ensemble_size=self.ensemble_size, write_quorum=self.write_quorum,
                ack_quorum=self.write_quorum if self.ack_quorum is None else self.ack_quorum, digest=digest,
                password_salt=salt, password_hash=LedgerMetadata.hash_password(password, salt),
                state=self.state,
                last_entry_id=-1 if self.state is LedgerState.OPEN or self.last_entry_id is None
                else self.last_entry_id,
                length=0 if self.state is LedgerState.OPEN else self.length, ensembles=self.segments,
                ctime=ctime if self.ctime is None else self.ctime,
                custom_metadata=tuple(sorted(dict(self.custom).items())),
                bk_password=None if kept is None else password)
        except InvalidArgumentError as exc:
            raise FormatError("BookKeeper ledger metadata walkit cannot hold", ledger=ledger_id,
                              reason=str(exc)[:300]) from exc
        return meta, password

    def _digest_and_password(self, ledger_id: int, digest: str | None, password: bytes) -> tuple[str, bytes]:
        if self.password is None:  # BookKeeper then ignores digestType too
            if digest is None:
                raise FormatError("BookKeeper ledger metadata keeps no password or digest type: the reader must "
                                  "name them", ledger=ledger_id, version=self.format_version)
            if not is_bk_digest(digest):
                raise FormatError("a BookKeeper ledger's digest is one of the bk-* names", ledger=ledger_id,
                                  digest=digest)
            return digest, password
        walkit = _DIGEST_TO_WALKIT.get(self.digest or "CRC32")  # an absent digestType reads as its default
        if walkit is None:
            raise FormatError("BookKeeper digest type walkit cannot verify", ledger=ledger_id,
                              digest=self.digest or "CRC32 (absent)")
        return walkit, self.password


def from_walkit(meta: LedgerMetadata, password: bytes | None = None, *, store_ctime: bool = True,
                ctoken: int | None | _FromSalt = FROM_SALT, format_version: int = 3) -> BkLedgerMetadata:
    """The BookKeeper record of walkit's ``meta`` (a ``bk-*`` digest; anything else is an
    InvalidArgumentError). ``password``: None for ``meta.bk_password`` (None there too:
    the record keeps no password and no digest type, as a 4.0/4.1 client's); given, it
    must match the verifier, as BookKeeper stores it in the clear. ``ctoken``: the
    creator token (default: the one ``meta``'s salt carries)."""
    if meta.digest not in _DIGEST_TO_BK:
        raise InvalidArgumentError("only a bk-* digest has a BookKeeper record (walkit's own digests do not)",
                                   ledger=meta.ledger_id, digest=meta.digest, known=",".join(_DIGEST_TO_BK))
    password = meta.bk_password if password is None else password
    if password is not None and not meta.check_password(password):
        raise InvalidArgumentError("password does not match the ledger's verifier", ledger=meta.ledger_id)
    token = ctoken_of(meta.password_salt) if isinstance(ctoken, _FromSalt) else ctoken
    return BkLedgerMetadata(
        write_quorum=meta.write_quorum, ensemble_size=meta.ensemble_size, length=meta.length, state=meta.state,
        segments=meta.ensembles, last_entry_id=meta.last_entry_id,
        digest=None if password is None else _DIGEST_TO_BK[meta.digest], password=password,
        ack_quorum=meta.ack_quorum, ctime=meta.ctime if store_ctime else None, custom=meta.custom_metadata,
        ctoken=token if format_version == 3 else None, format_version=format_version)


# --- decoding --------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = 0
    for shift in range(0, 35, 7):  # a length: at most 5 bytes
        if at >= len(data):
            raise FormatError("BookKeeper ledger metadata: truncated length", size=len(data))
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
    raise FormatError("BookKeeper ledger metadata: length varint too long")


def _header(data: bytes) -> tuple[int, int]:
    """(format version, offset of the body)."""
    if not data.startswith(HEADER):
        raise FormatError("not BookKeeper ledger metadata: bad header", start=data[:32].hex())
    end = data.find(b"\n", len(HEADER), len(HEADER) + 11)
    digits = data[len(HEADER):end]
    if end < 0 or not digits.isdigit():
        raise FormatError("BookKeeper ledger metadata: bad version line", start=data[:40].hex())
    return int(digits), end + 1


def _from_proto(msg: Any, version: int) -> BkLedgerMetadata:
    def opt(name: str) -> Any:
        return getattr(msg, name) if msg.HasField(name) else None

    digest = pb.LedgerMetadataFormat.DigestType.Name(msg.digestType) if msg.HasField("digestType") else None
    try:
        return BkLedgerMetadata(
            write_quorum=msg.quorumSize, ensemble_size=msg.ensembleSize, length=msg.length,
            state=LedgerState(msg.state), last_entry_id=opt("lastEntryId"), digest=digest,
            password=opt("password"), ack_quorum=opt("ackQuorumSize"), ctime=opt("ctime"),
            segments=tuple((s.firstEntryId, tuple(s.ensembleMember)) for s in msg.segment),
            custom=tuple((c.key, c.value) for c in msg.customMetadata), ctoken=opt("cToken"),
            format_version=version)
    except (InvalidArgumentError, ValueError) as exc:
        raise FormatError("invalid BookKeeper ledger metadata", reason=str(exc)[:200]) from exc


def _check_required(msg: Any, what: str) -> None:
    """protobuf's parsers leave proto2's required fields to the caller."""
    if not msg.IsInitialized():
        raise FormatError(f"BookKeeper {what}: required fields missing", missing=",".join(msg.FindInitializationErrors()))


def _decode_v3(body: bytes) -> BkLedgerMetadata:
    length, at = _read_varint(body, 0)
    if len(body) - at != length:
        raise FormatError("BookKeeper ledger metadata: length does not match the value", length=length,
                          available=len(body) - at)
    msg = pb.LedgerMetadataFormat()
    try:
        msg.ParseFromString(body[at:])
    except pb_message.DecodeError as exc:
        raise FormatError("BookKeeper ledger metadata: bad protobuf", reason=str(exc)[:200]) from exc
    _check_required(msg, "ledger metadata")
    return _from_proto(msg, 3)


def _decode_v2(body: bytes) -> BkLedgerMetadata:
    msg = pb.LedgerMetadataFormat()
    try:
        text_format.Parse(body.decode("utf-8"), msg)
    except (UnicodeDecodeError, text_format.ParseError, pb_message.DecodeError) as exc:
        raise FormatError("BookKeeper ledger metadata: bad text format", reason=str(exc)[:200]) from exc
    _check_required(msg, "ledger metadata")
    return _from_proto(msg, 2)


def _v1_fragment(line: str) -> Fragment:
    first, *bookies = line.split("\t")
    return int(first), tuple(bookies)


def _decode_v1(body: bytes) -> BkLedgerMetadata:
    try:
        lines = body.decode("utf-8").split("\n")
        quorum, ensemble, length = int(lines[0]), int(lines[1]), int(lines[2])
        rest = [line for line in lines[3:] if line]
        closing = [i for i, line in enumerate(rest) if line.split("\t")[1:2] == ["CLOSED"]]
        end = closing[0] if closing else len(rest)
        segments = tuple(_v1_fragment(line) for line in rest[:end])
        last = int(rest[end].split("\t")[0]) if closing else None
    except (UnicodeDecodeError, ValueError, IndexError) as exc:
        raise FormatError("BookKeeper ledger metadata: bad version 1 text", reason=str(exc)[:200]) from exc
    if last is None:
        state, last = LedgerState.OPEN, -1
    elif last == _V1_RECOVERY:
        state, last = LedgerState.IN_RECOVERY, -1
    else:
        state = LedgerState.CLOSED
    return BkLedgerMetadata(write_quorum=quorum, ensemble_size=ensemble, length=length, state=state,
                            segments=segments, last_entry_id=last, format_version=1)


_READERS = {1: _decode_v1, 2: _decode_v2, 3: _decode_v3}


def decode_ledger_metadata(data: bytes) -> BkLedgerMetadata:
    """Parse a BookKeeper ledger znode's value (format 1, 2 or 3)."""
    data = bytes(data)
    if len(data) > MAX_VALUE:
        raise FormatError("BookKeeper ledger metadata too large", size=len(data), limit=MAX_VALUE)
    version, at = _header(data)
    return FormatVersionError.reader(_READERS, version, "BookKeeper ledger metadata")(data[at:])

