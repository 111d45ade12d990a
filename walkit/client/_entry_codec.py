"""A ledger's entry codec: how its entries, master key and LAC bodies are made and checked.

Theory of operation. Which bytes a ledger's entries carry is decided once, by the
ledger's digest name (:attr:`walkit.metadata.LedgerMetadata.digest`), when a writer,
reader or recovery takes the ledger up: :meth:`EntryCodec.of` picks walkit's own
(``crc32c``, ``mac``, ``none``: :mod:`walkit.protocol._entry`, master key SHA-256) or
Apache BookKeeper's (``bk-crc32``, ``bk-crc32c``, ``bk-hmac``, ``bk-dummy``:
:mod:`walkit.protocol._bk_digest`, master key SHA-1, 20 bytes). Everything the client
does with an entry's bytes goes through the codec - the writer's encode, the reads'
and recovery's checks (entry by entry and in runs), the master key sent with adds,
fences and LAC writes, the body of a WRITE_LAC and the check of a READ_LAC's answer -
so there is one piece of code per piece of logic whatever the digest.

The choice costs nothing per entry: :attr:`EntryCodec.encode` and
:attr:`EntryCodec.decode` of a CRC32C ledger (walkit's default, and ``bk-crc32c``) are
:func:`walkit.protocol._entry.encode_crc32c_entry` / ``decode_crc32c_entry`` themselves
(no digest to choose per entry: less work than the keyword call the writer made before);
other digests get small closures binding digest and key (a ``functools.partial`` with
keywords would build a dict per call). Both
layouts share walkit's 32-byte entry header, and BookKeeper's CRC32C digest is
walkit's ``crc32c`` byte for byte (CRC32C of header and payload, a big-endian u32), so
a ``bk-crc32c`` ledger's entries are encoded and checked by walkit's fast CRC32C path
(and ``bk-dummy``'s by walkit's ``none``); only their master key differs. A walkit ledger's WRITE_LAC carries no body (its
readers take a READ_LAC answer's LAC as the bookie tells it); a BookKeeper ledger's
WRITE_LAC carries BookKeeper's digest-protected body, to bookies of both kinds (walkit's
keep it for Java readers' READ_LAC), and a
READ_LAC answer that brings bodies (a BookKeeper bookie's: the last LAC body and the
last entry) counts only the ones whose digest checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from walkit.errors import DigestMismatchError, InvalidArgumentError
from walkit.metadata import is_bk_digest
from walkit.protocol import (
    ENTRY_HEADER,
    EntryHeader,
    ReadLacResponse,
    decode_entry,
    decode_run,
    digest_size,
    encode_entry,
    master_key,
    BkDigestType,
    decode_crc32c_entry,
    encode_crc32c_entry,
    bk_decode_entry,
    bk_decode_lac,
    bk_digest_size,
    bk_encode_entry,
    bk_encode_lac,
    bk_master_key,
)

__all__ = ["EntryCodec", "entry_digest_size"]

# BookKeeper's digests by the ledger digest names that pick them (the names: walkit.metadata's BK_DIGESTS)
_BK_TYPES: dict[str, BkDigestType] = {
    "bk-crc32": BkDigestType.CRC32,
    "bk-crc32c": BkDigestType.CRC32C,
    "bk-hmac": BkDigestType.HMAC,
    "bk-dummy": BkDigestType.DUMMY,
}


# BookKeeper digests whose entries are byte for byte those of a walkit digest
_SAME_BYTES: dict[BkDigestType, str] = {BkDigestType.CRC32C: "crc32c", BkDigestType.DUMMY: "none"}


def _bk_type(digest: str) -> BkDigestType:
    try:
        return _BK_TYPES[digest]
    except KeyError:
        raise InvalidArgumentError("unknown digest type", digest=digest,
                                   known=",".join(("crc32c", "mac", "none", *_BK_TYPES))) from None


def entry_digest_size(digest: str) -> int:
    """Bytes the digest of an entry of a ``digest`` ledger takes (InvalidArgumentError
    for a name that is neither walkit's nor BookKeeper's)."""
    if is_bk_digest(digest):
        return bk_digest_size(_bk_type(digest))
    return digest_size(digest)


Encoder = Callable[[int, int, int, int, bytes], bytes]
Decoder = Callable[[bytes], tuple[EntryHeader, bytes]]


def _walkit_coders(digest: str, key: bytes) -> tuple[Encoder, Decoder]:
    """walkit's encoder and decoder with ``digest`` and ``key`` bound: CRC32C's own
    functions (nothing to bind), else closures (no dict made per call as a
    ``functools.partial`` with keywords makes)."""
    if digest == "crc32c":
        return encode_crc32c_entry, decode_crc32c_entry

    def encode(ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
        return encode_entry(ledger_id, entry_id, lac, length, payload, digest=digest, key=key)

    def decode(data: bytes) -> tuple[EntryHeader, bytes]:
        return decode_entry(data, digest=digest, key=key)
    return encode, decode


def _bk_coders(kind: BkDigestType, password: bytes) -> tuple[Encoder, Decoder]:
    """BookKeeper's encoder and decoder of digest ``kind`` for ``password``."""
    def encode(ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
        return bk_encode_entry(ledger_id, entry_id, lac, length, payload, digest=kind, password=password)

    def decode(data: bytes) -> tuple[EntryHeader, bytes]:
        fields, payload = bk_decode_entry(bytes(data), digest=kind, password=password)
        return EntryHeader._make(fields), payload
    return encode, decode


class EntryCodec:
    """The entry codec of one ledger (:meth:`of`); immutable once made."""

    __slots__ = ("digest", "master_key", "digest_size", "bookkeeper", "encode", "decode", "_run_digest",
                 "_run_key", "_bk", "_password")

    def __init__(self, digest: str, password: bytes) -> None:
        self.digest = digest
        self.bookkeeper = is_bk_digest(digest)
        self.digest_size = entry_digest_size(digest)
        self._password = password
        self._bk: BkDigestType | None = None
        #: ``encode(ledger_id, entry_id, lac, length, payload) -> bytes``: an entry as sent
        self.encode: Encoder
        #: ``decode(data) -> (header, payload)``: an entry's digest checked (DigestMismatchError)
        self.decode: Decoder
        if self.bookkeeper:
            kind = self._bk = _bk_type(digest)
            self.master_key = bk_master_key(password)
            same = _SAME_BYTES.get(kind)
            if same is not None:  # walkit's digest makes the same bytes: its (faster) code
                self._run_digest, self._run_key = same, b""
                self.encode, self.decode = _walkit_coders(same, b"")
            else:
                self._run_digest, self._run_key = "", b""
                self.encode, self.decode = _bk_coders(kind, password)
        else:
            self.master_key = master_key(password)
            self._run_digest, self._run_key = digest, self.master_key
            self.encode, self.decode = _walkit_coders(digest, self.master_key)

    @classmethod
    def of(cls, digest: str, password: bytes) -> EntryCodec:
        """The codec of a ledger of ``digest`` written with ``password``."""
        if not isinstance(password, bytes):
            raise InvalidArgumentError("password must be bytes", type=type(password).__name__)
        return cls(digest, password)

    def decode_run(self, entries: Sequence[bytes | memoryview], ledger_id: int, first: int,
                   copy: bool = True) -> list[bytes | memoryview]:
        """The payloads of a run of entries from ``first`` (see
        :func:`walkit.protocol.decode_run`): up to the first whose digest or ids do not check."""
        if self._run_digest:
            return decode_run(entries, ledger_id, first, digest=self._run_digest, key=self._run_key, copy=copy)
        payloads: list[bytes | memoryview] = []
        for index, data in enumerate(entries):
            try:
                header, payload = self.decode(bytes(data))
            except DigestMismatchError:
                break
            if header.ledger_id != ledger_id or header.entry_id != first + index:
                break
            payloads.append(payload)
        return payloads

    def lac_body(self, ledger_id: int, lac: int) -> bytes:
        """The body a WRITE_LAC of this ledger carries, to bookies of both kinds (walkit's
        under its flag LAC_BODY): BookKeeper's (ledger, LAC, digest) for a BookKeeper
        ledger, for Java readers' READ_LAC; nothing for a walkit one."""
        if self._bk is None:
            return b""
        return bk_encode_lac(ledger_id, lac, digest=self._bk, password=self._password)

    def lac_of(self, response: ReadLacResponse) -> int:
        """The LAC a READ_LAC answer tells. An answer with BookKeeper's bodies (the last
        WRITE_LAC body, the last entry) counts the ones whose digest checks and that
        name this ledger: DigestMismatchError when it brought bodies and none checks. An
        answer without bodies (walkit's wire) tells its ``lac``."""
        if not response.lac_body and not response.last_entry:
            return response.lac
        lacs: list[int] = []
        if response.lac_body:
            try:
                lacs.append(self._checked_lac(response.ledger_id, response.lac_body))
            except DigestMismatchError:
                pass
        if response.last_entry:
            try:
                header, _ = self.decode(response.last_entry)
                if header.ledger_id == response.ledger_id:
                    lacs.append(header.lac)
            except DigestMismatchError:
                pass
        if not lacs:
            raise DigestMismatchError("READ_LAC answer: neither body checks", ledger=response.ledger_id,
                                      digest=self.digest)
        return max(lacs)

    def _checked_lac(self, ledger_id: int, body: bytes) -> int:
        if self._bk is None:  # a walkit ledger has no LAC bodies: only their ids can be checked
            if len(body) < 16 or int.from_bytes(body[:8], "big", signed=True) != ledger_id:
                raise DigestMismatchError("LAC body of another ledger", ledger=ledger_id)
            return int.from_bytes(body[8:16], "big", signed=True)
        if int.from_bytes(body[:8], "big", signed=True) != ledger_id:
            raise DigestMismatchError("LAC body of another ledger", ledger=ledger_id)
        return bk_decode_lac(body, digest=self._bk, password=self._password)

    @property
    def min_entry_size(self) -> int:
        """Bytes of an entry with an empty payload (header and digest)."""
        return ENTRY_HEADER.size + self.digest_size
