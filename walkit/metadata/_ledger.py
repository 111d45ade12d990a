"""Ledger metadata: the record the metadata store keeps for every ledger.

A ledger's metadata names its state (OPEN, IN_RECOVERY, CLOSED), its quorums
(E ≥ Qw ≥ Qa ≥ 1), its digest type, a salted verifier of its password (never the clear
password, unlike BookKeeper's v3 field 8), where its entries are (fragments: the
ensemble in use from a first entry id on) and, once closed, its last entry id and
length.

A ledger of a BookKeeper-format cluster (its digest one of the ``bk-*`` names) also
carries its clear password in ``bk_password``, because BookKeeper's record keeps it
(``LedgerMetadataFormat`` field 8) and Java clients check their password against it:
:meth:`LedgerMetadata.create` sets it for a ``bk-*`` digest, the BookKeeper codec
(``_bk_ledger``) reads and writes it, and every value checks it against the verifier
(a mismatch, or a password on a walkit-digest ledger, is an InvalidArgumentError). It is
never part of walkit's own encoding below (a walkit-format store keeps only the
verifier); None: not known (a ledger read from walkit's bytes, or a BookKeeper record
of a 4.0/4.1 client, which keeps no password).

The password verifier depends on the format version, and each value keeps its own
version through updates (a ledger created as version 1 is closed as version 1):

* version 2 (what new ledgers are written as): HMAC-SHA256 keyed with the password
  over a context string and the salt - about a microsecond, so creating and opening a
  ledger costs no CPU worth counting. A ledger password is an access secret the
  application draws, not a human password: a slow hash buys nothing against someone who
  can read the metadata store, who can also read a bookie's disks, where every ledger's
  master key (SHA-256 of the password, unsalted) is kept (docs/architecture.md,
  "Metadata": "Ledger passwords, and who can do what with the metadata store").
* version 1: PBKDF2-HMAC-SHA256, 100,000 rounds (~19 ms); still read and checked, each
  (password, salt) derived once per process (an LRU of :data:`_PBKDF2_CACHE` entries).

:class:`LedgerMetadata` is immutable and checks every invariant when built, so
a value that exists is valid; updates build new values (read–modify–CAS on the store's
version happens above this module).

Bytes (docs/format.md, "Ledger metadata"), integers little-endian::

    0         8         10        14          14+n
    +---------+---------+---------+-----------+---------+
    |  magic  | version | length  |   body    | crc32c  |
    | WKLEDGER|   u16   |   u32   |  n bytes  |   u32   |
    +---------+---------+---------+-----------+---------+

The body is canonical JSON (sorted keys, no spaces, ASCII, bytes as base64); the CRC
covers header and body. Decoding is strict: it refuses unknown versions, lengths over
:data:`MAX_BODY`, missing or extra fields, wrong types and non-canonical bodies.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import dataclasses
import enum
import functools
import hashlib
import hmac
import json
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from crc32c import crc32c

from walkit.errors import FormatError, FormatVersionError, InvalidArgumentError, LedgerClosedError

__all__ = [
    "LedgerState",
    "LedgerMetadata",
    "Fragment",
    "MAGIC",
    "FORMAT_VERSION",
    "VERSIONS",
    "MAX_BODY",
    "MAX_LEDGER_ID",
    "BK_DIGESTS",
    "BOOKIE_CHECKED_DIGESTS",
    "is_bk_digest",
    "bk_token_salt",
]

MAGIC = b"WKLEDGER"
FORMAT_VERSION = 2  # what new ledgers are written as
VERSIONS = (1, 2)  # what this walkit reads, and writes back unchanged
MAX_BODY = 1 << 20  # ZooKeeper's default jute.maxbuffer: no znode can hold more
MAX_LEDGER_ID = (1 << 63) - 1
SALT_SIZE = 16
HASH_SIZE = 32
_PBKDF2_ROUNDS = 100_000  # version 1's verifier
_PBKDF2_CACHE = 4096  # version-1 verifiers remembered per process
_VERIFIER_CONTEXT = b"walkit ledger password\x00"  # version 2's: HMAC(password, context + salt)
_HEADER = struct.Struct("<8sHI")
_CRC = struct.Struct("<I")
# walkit's own digests, then BookKeeper's (the ledgers of a BookKeeper-format cluster:
# BookKeeper's entry digest and its SHA-1 master key, walkit.protocol._bk_digest).
BK_DIGESTS = ("bk-crc32", "bk-crc32c", "bk-hmac", "bk-dummy")
_DIGESTS = ("crc32c", "mac", "none", *BK_DIGESTS)
# The digests a bookie can check with what it holds (the ledger's master key): walkit's
# own, and BookKeeper's but HMAC, whose key comes from the password, never the master
# key (re-replication: a bookie pushes only copies it checked, walkit.recovery).
BOOKIE_CHECKED_DIGESTS = ("crc32c", "mac", "none", "bk-crc32", "bk-crc32c", "bk-dummy")
BK_TOKEN_MARK = b"bkcToken"  # the end of a BookKeeper ledger's salt that carries its cToken
BK_NO_TOKEN_MARK = b"bkNoTokn"  # ... of one whose record has no cToken
_FIELDS = frozenset(
    {
        "ledger_id", "ensemble_size", "write_quorum", "ack_quorum", "digest",
        "password_salt", "password_hash", "state", "last_entry_id", "length",
        "ensembles", "ctime", "custom_metadata",
    }
)

Fragment = tuple[int, tuple[str, ...]]


class LedgerState(enum.IntEnum):
    """As BookKeeper's ``LedgerMetadataFormat.State``."""

    OPEN = 1
    IN_RECOVERY = 2
    CLOSED = 3


def _bad(message: str, ledger: int, **context: object) -> InvalidArgumentError:
    return InvalidArgumentError(message, ledger=ledger, **context)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class LedgerMetadata:
    """One ledger's metadata. ``custom_metadata`` is a tuple of (key, value) pairs
    sorted by key (see :attr:`custom` for a mapping view)."""

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    digest: str
    password_salt: bytes
    password_hash: bytes
    state: LedgerState
    last_entry_id: int
    length: int
    ensembles: tuple[Fragment, ...]
    ctime: int
    custom_metadata: tuple[tuple[str, bytes], ...] = ()
    format_version: int = FORMAT_VERSION
    bk_password: bytes | None = dataclasses.field(default=None, repr=False)  # bk-* ledgers only: see above

    def __post_init__(self) -> None:
        self._check_scalars()
        self._check_quorums()
        self._check_password()
        self._check_bk_password()
        self._check_ensembles()
        self._check_state()
        self._check_custom()

    # -- construction -------------------------------------------------------------

    @classmethod
    def create(
        cls,
        ledger_id: int,
        ensemble: tuple[str, ...],
        *,
        write_quorum: int,
        ack_quorum: int,
        password: bytes,
        ctime: int,
        digest: str = "crc32c",
        custom: Mapping[str, bytes] | None = None,
    ) -> LedgerMetadata:
        """A new OPEN ledger with one fragment from entry 0 and a fresh random salt (a
        ``bk-*`` digest keeps ``password`` in ``bk_password`` too, and its salt carries
        a random creator token: :func:`bk_token_salt`)."""
        salt = bk_token_salt(_random_token()) if is_bk_digest(digest) else os.urandom(SALT_SIZE)
        return cls(
            ledger_id=ledger_id, ensemble_size=len(ensemble), write_quorum=write_quorum,
            ack_quorum=ack_quorum, digest=digest, password_salt=salt,
            password_hash=cls.hash_password(password, salt), state=LedgerState.OPEN,
            last_entry_id=-1, length=0, ensembles=((0, tuple(ensemble)),), ctime=ctime,
            custom_metadata=tuple(sorted((custom or {}).items())),
            bk_password=bytes(password) if is_bk_digest(digest) else None,
        )

    @property
    def is_bookkeeper(self) -> bool:
        """A BookKeeper ledger: its digest is one of the ``bk-*`` names."""
        return is_bk_digest(self.digest)

    @staticmethod
    def hash_password(password: bytes, salt: bytes, version: int = FORMAT_VERSION) -> bytes:
        """The 32-byte verifier of ``password`` with ``salt`` that format ``version``
        stores: HMAC-SHA256(key=password, context + salt) for 2, PBKDF2-HMAC-SHA256 at
        100,000 rounds for 1 (remembered per process)."""
        if version == 1:
            return _pbkdf2(bytes(password), bytes(salt))
        if version == 2:
            return hmac.digest(password, _VERIFIER_CONTEXT + salt, "sha256")
        raise InvalidArgumentError("unknown ledger metadata version", version=version, known=str(VERSIONS))

    def check_password(self, password: bytes) -> bool:
        """True if ``password`` is the ledger's password (constant-time comparison)."""
        candidate = self.hash_password(password, self.password_salt, self.format_version)
        return hmac.compare_digest(candidate, self.password_hash)

    # -- validation ---------------------------------------------------------------

    def _check_scalars(self) -> None:
        ints = ("ledger_id", "ensemble_size", "write_quorum", "ack_quorum",
                "last_entry_id", "length", "ctime", "format_version")
        for name in ints:
            if not _is_int(getattr(self, name)):
                raise InvalidArgumentError("field must be an int", field=name, value=repr(getattr(self, name)))
        if not 0 <= self.ledger_id <= MAX_LEDGER_ID:
            raise InvalidArgumentError("ledger id out of range", ledger=self.ledger_id)
        if self.format_version not in VERSIONS:
            raise _bad("unknown format version", self.ledger_id, version=self.format_version, known=str(VERSIONS))
        if self.digest not in _DIGESTS:
            raise _bad("unknown digest type", self.ledger_id, digest=self.digest)
        if self.ctime < 0 or self.length < 0 or self.last_entry_id < -1:
            raise _bad("negative ctime, length or last entry id", self.ledger_id,
                       ctime=self.ctime, length=self.length, last_entry_id=self.last_entry_id)

    def _check_quorums(self) -> None:
        e, qw, qa = self.ensemble_size, self.write_quorum, self.ack_quorum
        if not e >= qw >= qa >= 1:
            raise _bad("quorums must satisfy E >= Qw >= Qa >= 1", self.ledger_id, E=e, Qw=qw, Qa=qa)

    def _check_password(self) -> None:
        salt, digest = self.password_salt, self.password_hash
        if not isinstance(salt, bytes) or len(salt) != SALT_SIZE:
            raise _bad("password salt must be bytes", self.ledger_id, expected_size=SALT_SIZE)
        if not isinstance(digest, bytes) or len(digest) != HASH_SIZE:
            raise _bad("password hash must be bytes", self.ledger_id, expected_size=HASH_SIZE)

    def _check_bk_password(self) -> None:
        password = self.bk_password
        if password is None:
            return
        if not isinstance(password, bytes):
            raise _bad("bk_password must be bytes", self.ledger_id)
        if not self.is_bookkeeper:
            raise _bad("only a BookKeeper (bk-*) ledger keeps its clear password", self.ledger_id,
                       digest=self.digest)
        if not self.check_password(password):
            raise _bad("bk_password does not match the ledger's password verifier", self.ledger_id)

    def _check_ensembles(self) -> None:
        if not isinstance(self.ensembles, tuple) or not self.ensembles:
            raise _bad("ledger needs at least one fragment", self.ledger_id)
        previous = -1
        for fragment in self.ensembles:
            first = self._check_fragment(fragment)
            if (previous == -1 and first != 0) or first <= previous:
                raise _bad("fragments must start at 0 and ascend strictly", self.ledger_id,
                           first_entry=first, previous=previous)
            previous = first

    def _check_fragment(self, fragment: object) -> int:
        if not (isinstance(fragment, tuple) and len(fragment) == 2 and _is_int(fragment[0])
                and isinstance(fragment[1], tuple)):
            raise _bad("fragment must be (first_entry_id, (bookie, ...))", self.ledger_id, fragment=repr(fragment))
        first, bookies = fragment
        ok = all(isinstance(b, str) and b for b in bookies) and len(set(bookies)) == len(bookies)
        if not ok or len(bookies) != self.ensemble_size:
            raise _bad("fragment needs E distinct bookie ids", self.ledger_id, first_entry=first,
                       E=self.ensemble_size, bookies=",".join(map(str, bookies)))
        return int(first)

    def _check_state(self) -> None:
        if not isinstance(self.state, LedgerState):
            raise _bad("state must be a LedgerState", self.ledger_id, state=repr(self.state))
        last, length = self.last_entry_id, self.length
        if self.state is LedgerState.OPEN and (last != -1 or length != 0):
            raise _bad("open ledger has no last entry and no length", self.ledger_id, last_entry_id=last, length=length)
        if self.state is LedgerState.CLOSED:
            if self.ensembles[-1][0] > last + 1:
                raise _bad("closed ledger's last fragment starts past its end", self.ledger_id,
                           last_entry_id=last, fragment=self.ensembles[-1][0])
            if last == -1 and length != 0:
                raise _bad("empty closed ledger has length 0", self.ledger_id, length=length)

    def _check_custom(self) -> None:
        pairs = self.custom_metadata
        if not isinstance(pairs, tuple):
            raise _bad("custom metadata must be a tuple of pairs", self.ledger_id)
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
                    and pair[0] and isinstance(pair[1], bytes)):
                raise _bad("custom metadata pair must be (str, bytes)", self.ledger_id, pair=repr(pair))
        keys = [key for key, _ in pairs]
        if keys != sorted(set(keys)):
            raise _bad("custom metadata keys must be unique and sorted", self.ledger_id)

    # -- views and updates --------------------------------------------------------

    @property
    def custom(self) -> Mapping[str, bytes]:
        """A read-only mapping view of ``custom_metadata``."""
        return MappingProxyType(dict(self.custom_metadata))

    def with_state(self, state: LedgerState) -> LedgerMetadata:
        return dataclasses.replace(self, state=state)

    def closed(self, last_entry_id: int, length: int) -> LedgerMetadata:
        """This ledger CLOSED at ``last_entry_id`` (-1: empty) with ``length`` bytes."""
        return dataclasses.replace(self, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length)

    def with_ensemble(self, first_entry_id: int, bookies: tuple[str, ...]) -> LedgerMetadata:
        """A new fragment from ``first_entry_id`` on; replaces the last fragment if it
        starts at the same entry (no entry was written to it), as BookKeeper does."""
        if self.state is LedgerState.CLOSED:
            raise LedgerClosedError("no ensemble change on a closed ledger", ledger=self.ledger_id)
        fragments = self.ensembles
        if fragments[-1][0] == first_entry_id:
            fragments = fragments[:-1]
        return dataclasses.replace(self, ensembles=(*fragments, (first_entry_id, tuple(bookies))))

    def replace_bookie(self, first_entry_id: int, old: str, new: str) -> LedgerMetadata:
        """The fragment starting at ``first_entry_id`` with ``new`` in ``old``'s place
        (re-replication: ``new`` now holds what ``old`` held). Any state; the checks of
        a fragment apply (``new`` must not be in it already)."""
        fragments = list(self.ensembles)
        at = next((i for i, (first, _) in enumerate(fragments) if first == first_entry_id), None)
        if at is None or old not in fragments[at][1]:
            raise _bad("no such bookie in that fragment", self.ledger_id, first_entry=first_entry_id, bookie=old)
        first, bookies = fragments[at]
        fragments[at] = (first, tuple(new if b == old else b for b in bookies))
        return dataclasses.replace(self, ensembles=tuple(fragments))

    def fragment_end(self, index: int) -> int | None:
        """The last entry of fragment ``index``: the entry before the next fragment's
        first, the ledger's last entry for the last fragment of a closed ledger, None for
        the last fragment of a ledger still open (its writer decides)."""
        if index + 1 < len(self.ensembles):
            return self.ensembles[index + 1][0] - 1
        return self.last_entry_id if self.state is LedgerState.CLOSED else None

    def fragment_index(self, entry_id: int) -> int:
        """The index (in ``ensembles``) of the fragment that holds ``entry_id``."""
        if entry_id < 0:
            raise _bad("entry id must be >= 0", self.ledger_id, entry=entry_id)
        return bisect.bisect_right(self.ensembles, entry_id, key=lambda fragment: fragment[0]) - 1

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        """The bookies of the fragment that holds ``entry_id``."""
        return self.ensembles[self.fragment_index(entry_id)][1]

    def write_set(self, entry_id: int) -> tuple[str, ...]:
        """Where ``entry_id`` is stored: ensemble[(e + i) mod E] for i < Qw."""
        ensemble = self.ensemble_for(entry_id)
        size = self.ensemble_size
        return tuple(ensemble[(entry_id + i) % size] for i in range(self.write_quorum))

    # -- bytes --------------------------------------------------------------------

    def encode(self) -> bytes:
        body = json.dumps(_to_json(self), sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
        if len(body) > MAX_BODY:
            raise _bad("metadata too large", self.ledger_id, size=len(body), limit=MAX_BODY)
        head = _HEADER.pack(MAGIC, self.format_version, len(body)) + body
        return head + _CRC.pack(crc32c(head))

    @classmethod
    def decode(cls, data: bytes) -> LedgerMetadata:
        """Parse what :meth:`encode` wrote; anything else raises FormatError
        (FormatVersionError: intact, but of a version this code does not read)."""
        data = bytes(data)
        version, body = _unframe(data)
        return FormatVersionError.reader(_READERS, version, "ledger metadata")(data, body)


def _random_token() -> int:
    return int.from_bytes(os.urandom(8), "big") & MAX_LEDGER_ID


def bk_token_salt(ctoken: int | None) -> bytes:
    """The salt of a BookKeeper ledger's verifier: it carries the record's creator token
    (``cToken``) so a value read and written back keeps it (``_bk_ledger``): 8 bytes of
    the token, big-endian, and ``bkcToken``; zeros and ``bkNoTokn`` for a record without
    one. A new BookKeeper ledger draws a random 63-bit token, as BookKeeper's creator does."""
    if ctoken is None:
        return bytes(8) + BK_NO_TOKEN_MARK
    return ctoken.to_bytes(8, "big", signed=True) + BK_TOKEN_MARK


def is_bk_digest(digest: str) -> bool:
    """Whether ``digest`` names one of BookKeeper's digests (a BookKeeper ledger)."""
    return isinstance(digest, str) and digest.startswith("bk-")


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _to_json(meta: LedgerMetadata) -> dict[str, object]:
    return {
        "ledger_id": meta.ledger_id, "ensemble_size": meta.ensemble_size,
        "write_quorum": meta.write_quorum, "ack_quorum": meta.ack_quorum,
        "digest": meta.digest, "password_salt": _b64(meta.password_salt),
        "password_hash": _b64(meta.password_hash), "state": meta.state.name,
        "last_entry_id": meta.last_entry_id, "length": meta.length,
        "ensembles": [[first, list(bookies)] for first, bookies in meta.ensembles],
        "ctime": meta.ctime, "custom_metadata": {k: _b64(v) for k, v in meta.custom_metadata},
    }


def _unframe(data: bytes) -> tuple[int, bytes]:
    """The version and body of an intact value (magic, length and CRC checked)."""
    if len(data) < _HEADER.size + _CRC.size:
        raise FormatError("ledger metadata truncated", size=len(data))
    magic, version, length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise FormatError("not ledger metadata", magic=magic.hex())
    if length > MAX_BODY or len(data) != _HEADER.size + length + _CRC.size:
        raise FormatError("bad ledger metadata length", length=length, size=len(data), limit=MAX_BODY)
    end = _HEADER.size + length
    (stored,) = _CRC.unpack_from(data, end)
    if crc32c(data[:end]) != stored:
        raise FormatError("ledger metadata checksum mismatch", stored=stored)
    return version, data[_HEADER.size:end]


@functools.lru_cache(maxsize=_PBKDF2_CACHE)
def _pbkdf2(password: bytes, salt: bytes) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", password, salt, _PBKDF2_ROUNDS, HASH_SIZE)


def _decode_body(version: int, data: bytes, body: bytes) -> LedgerMetadata:
    """Versions 1 and 2 (the same keys; the password verifier differs): exactly the
    documented keys, canonical (re-encoding gives ``data``)."""
    try:
        meta = LedgerMetadata(**_from_json(_parse_json(body)), format_version=version)
    except InvalidArgumentError as exc:
        raise FormatError("invalid ledger metadata", reason=str(exc)) from exc
    if meta.encode() != data:
        raise FormatError("ledger metadata body is not canonical", ledger=meta.ledger_id)
    return meta


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("duplicate key in JSON object")
    return result


def _no_floats(text: str) -> Any:
    raise ValueError(f"non-integer number {text[:20]!r}")


def _parse_json(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body.decode("ascii"), object_pairs_hook=_no_duplicates,
                         parse_float=_no_floats, parse_constant=_no_floats)
    except (ValueError, RecursionError) as exc:
        raise FormatError("ledger metadata body is not valid JSON", reason=str(exc)[:200]) from exc
    if not isinstance(obj, dict):
        raise FormatError("ledger metadata body is not an object", kind=type(obj).__name__)
    if set(obj) != _FIELDS:
        missing, extra = sorted(_FIELDS - set(obj)), sorted(set(obj) - _FIELDS)
        raise FormatError("ledger metadata fields", missing=",".join(missing) or None, extra=",".join(extra) or None)
    return obj


def _unb64(value: object, field: str) -> bytes:
    if not isinstance(value, str):
        raise FormatError("expected base64 string", field=field)
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise FormatError("bad base64", field=field) from exc


def _fragments(value: object) -> tuple[Fragment, ...]:
    if not isinstance(value, list):
        raise FormatError("ensembles must be a list")
    fragments: list[Fragment] = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], list)):
            raise FormatError("fragment must be [first_entry_id, [bookie, ...]]")
        fragments.append((item[0], tuple(item[1])))
    return tuple(fragments)


def _state(value: object) -> LedgerState:
    if not isinstance(value, str) or value not in LedgerState.__members__:
        raise FormatError("unknown ledger state", state=repr(value))
    return LedgerState[value]


def _custom(value: object) -> tuple[tuple[str, bytes], ...]:
    if not isinstance(value, dict):
        raise FormatError("custom_metadata must be an object")
    return tuple(sorted((key, _unb64(raw, f"custom_metadata.{key}")) for key, raw in value.items()))


def _from_json(obj: dict[str, Any]) -> dict[str, Any]:
    fields = dict(obj)
    fields["password_salt"] = _unb64(obj["password_salt"], "password_salt")
    fields["password_hash"] = _unb64(obj["password_hash"], "password_hash")
    fields["state"] = _state(obj["state"])
    fields["ensembles"] = _fragments(obj["ensembles"])
    fields["custom_metadata"] = _custom(obj["custom_metadata"])
    return fields


#: Ledger-metadata version -> the decoder of an intact value (the whole value, its body).
_READERS: dict[int, Callable[[bytes, bytes], LedgerMetadata]] = {
    version: functools.partial(_decode_body, version) for version in VERSIONS}
