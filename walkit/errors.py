"""The one exception tree of walkit.

Every error walkit raises on purpose is a :class:`WalkitError`. Each class has a
stable integer ``code`` (never reused, never renumbered) so that errors can cross
process and wire boundaries, and :meth:`WalkitError.from_code` rebuilds the class
from the number.

::

    WalkitError
    ├── UsageError                  "you did it": bad arguments, misuse
    │   ├── InvalidArgumentError
    │   ├── EntryTooLargeError
    │   ├── LedgerClosedError
    │   ├── UnauthorizedError        wrong password / master key (EUA)
    │   └── MetadataReadOnlyError    a write through a metadata store opened read-only
    ├── LedgerFencedError            the ledger was fenced by a recoverer (EFENCED)
    │   └── WriterFencedError        a newer writer took the log over
    ├── NoSuchLogError               no write-ahead log of that name
    ├── NoSuchLedgerError            (ENOLEDGER)
    ├── NoSuchEntryError             (ENOENTRY)
    ├── DigestMismatchError          an entry's digest does not match its bytes
    ├── ReplicasLostError            no surviving bookie holds an intact copy of an entry
    ├── BookieError                  "the world failed" on a bookie
    │   ├── BookieUnavailableError
    │   │   └── BookieTimeoutError   a bookie did not answer in time
    │   ├── BookieReadOnlyError      (EREADONLY)
    │   ├── BookieShutdownError
    │   ├── NativeIOError            an OSError from the native layer (keeps errno)
    │   ├── BookieBusyError          too many requests pending (ETOOMANYREQUESTS)
    │   └── NotEnoughBookiesError    too few bookies to form or repair an ensemble
    ├── StorageError                 bytes on disk are not what they must be
    │   ├── CorruptionError          bad data followed by good data: refuse to hide it
    │   ├── CookieError              missing / foreign cookie: wrong or wiped disk
    │   └── FormatError              unknown magic or format version
    │       └── FormatVersionError   intact bytes of a version this walkit does not read (or write)
    ├── MetadataError                the metadata store said no, or could not be reached
    │   ├── MetadataVersionError     a conditional write lost its compare-and-set
    │   ├── NodeExistsError
    │   ├── NoNodeError
    │   ├── NotEmptyError
    │   ├── SessionExpiredError      the store session ended: ephemeral nodes are gone
    │   ├── MetadataUnavailableError the store cannot be reached (after bounded retries)
    │   ├── ClusterLayoutError       no cluster, or one this walkit cannot use
    │   │   └── NoMetadataStoreError no local:// store at that path (a typo? `walkit init` makes one)
    │   ├── LedgerExistsError        ledger metadata already stored under that id
    │   └── BookieIdInUseError       another live bookie is registered with this id
    ├── ConfigError                  a configuration value is invalid
    └── ProtocolError                bytes on the wire are not a valid frame (EBADREQ)
        ├── ProtocolVersionError     the peer speaks another protocol version (EBADVERSION)
        └── FrameTooLargeError       a frame over the configured maximum

Errors carry ``key=value`` context in their message, and where the world failed the
original exception as ``__cause__`` (``raise … from exc``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar, TypeVar

__all__ = [
    "WalkitError",
    "UsageError",
    "InvalidArgumentError",
    "EntryTooLargeError",
    "LedgerClosedError",
    "UnauthorizedError",
    "MetadataReadOnlyError",
    "LedgerFencedError",
    "WriterFencedError",
    "NoSuchLogError",
    "NoSuchLedgerError",
    "NoSuchEntryError",
    "DigestMismatchError",
    "ReplicasLostError",
    "BookieError",
    "BookieUnavailableError",
    "BookieReadOnlyError",
    "BookieShutdownError",
    "NativeIOError",
    "StorageError",
    "CorruptionError",
    "CookieError",
    "FormatError",
    "FormatVersionError",
    "ConfigError",
    "MetadataError",
    "MetadataVersionError",
    "NodeExistsError",
    "NoNodeError",
    "NotEmptyError",
    "SessionExpiredError",
    "MetadataUnavailableError",
    "ClusterLayoutError",
    "NoMetadataStoreError",
    "LedgerExistsError",
    "BookieIdInUseError",
    "BookieBusyError",
    "NotEnoughBookiesError",
    "BookieTimeoutError",
    "ProtocolError",
    "ProtocolVersionError",
    "FrameTooLargeError",
]

_BY_CODE: dict[int, type[WalkitError]] = {}


def _context(context: dict[str, object]) -> str:
    return " ".join(f"{k}={v}" for k, v in context.items() if v is not None)


class WalkitError(Exception):
    """Base of every walkit error. ``code`` is stable across releases."""

    code: ClassVar[int] = 1

    def __init__(self, message: str = "", **context: object) -> None:
        self.context = {k: v for k, v in context.items() if v is not None}
        text = message or type(self).__name__
        ctx = _context(self.context)
        super().__init__(f"{text} ({ctx})" if ctx else text)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        code = cls.__dict__.get("code")
        if code is None:
            return
        if code in _BY_CODE and _BY_CODE[code] is not cls:
            raise TypeError(f"error code {code} used twice: {_BY_CODE[code]} and {cls}")
        _BY_CODE[code] = cls

    @staticmethod
    def from_code(code: int, message: str = "", **context: object) -> WalkitError:
        """Rebuild an error from its stable code (unknown codes give WalkitError)."""
        cls = _BY_CODE.get(code, WalkitError)
        return cls(message, **context)


_BY_CODE[1] = WalkitError


class UsageError(WalkitError):
    code = 100


class InvalidArgumentError(UsageError, ValueError):
    code = 101


class EntryTooLargeError(UsageError, ValueError):
    code = 102


class LedgerClosedError(UsageError):
    code = 103


class UnauthorizedError(UsageError):
    code = 104


class MetadataReadOnlyError(UsageError):
    """A write through a store opened with ``read_only=True`` (the inspection commands
    open it so): "you did it", not an outage - retrying cannot help."""

    code = 105


class LedgerFencedError(WalkitError):
    code = 200


class WriterFencedError(LedgerFencedError):
    """A newer writer opened the log (bumped its epoch and fenced this writer's segment):
    this WriteAheadLog can never append again."""

    code = 204


class NoSuchLogError(WalkitError):
    code = 205


class NoSuchLedgerError(WalkitError):
    code = 201


class NoSuchEntryError(WalkitError):
    code = 202


class DigestMismatchError(WalkitError):
    code = 203


class ReplicasLostError(WalkitError):
    """Recovery found an entry that no surviving bookie of its write set holds intact."""

    code = 206


class BookieError(WalkitError):
    code = 300


class BookieUnavailableError(BookieError):
    code = 301


class BookieReadOnlyError(BookieError):
    code = 302


class BookieShutdownError(BookieError):
    code = 303


class NativeIOError(BookieError, OSError):
    """An ``OSError`` raised by the I/O layer; ``errno`` and ``filename`` are kept."""

    code = 304

    def __init__(self, errno_: int, message: str = "", **context: object) -> None:
        WalkitError.__init__(self, message or "I/O error", errno=errno_, **context)
        self.errno = errno_
        self.strerror = message
        path = context.get("path")
        self.filename = str(path) if path is not None else None

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "I/O error"


class StorageError(WalkitError):
    code = 400


class CorruptionError(StorageError):
    code = 401


class CookieError(StorageError):
    code = 402


class FormatError(StorageError):
    code = 403


_T = TypeVar("_T")


class FormatVersionError(FormatError):
    """Bytes whose magic and checksum hold, of a format version this walkit does not read
    (or, for metadata it may read, does not write): another walkit's, most likely a newer
    one's. Never taken for damage: nothing is truncated, rebuilt or overwritten over it.
    ``version`` is the version found; ``known`` the versions this walkit reads (or writes)."""

    code = 404
    version: int = 0
    known: tuple[int, ...] = ()

    @classmethod
    def unreadable(cls, what: str, version: int, reads: Iterable[int], **context: object) -> FormatVersionError:
        """``<what> version N is not one this walkit reads (reads: 1)``, with ``context``."""
        return cls._make(f"{what} version {version} is not one this walkit reads", "reads", version, reads, context)

    @classmethod
    def unwritable(cls, what: str, version: int, writes: Iterable[int], **context: object) -> FormatVersionError:
        """``<what> version N is newer than this walkit writes (writes: 1)``, with ``context``."""
        return cls._make(f"{what} version {version} is newer than this walkit writes", "writes", version, writes,
                         context)

    @classmethod
    def reader(cls, readers: Mapping[int, _T], version: int, what: str, **context: object) -> _T:
        """``readers[version]`` - a format's table of version -> decoder - or, for a
        version not in it, the :meth:`unreadable` error."""
        found = readers.get(version)
        if found is None:
            raise cls.unreadable(what, version, readers, **context)
        return found

    @classmethod
    def _make(cls, text: str, verb: str, version: int, known: Iterable[int], context: dict[str, object]
              ) -> FormatVersionError:
        versions = tuple(sorted(known))
        error = cls(f"{text} ({verb}: {', '.join(map(str, versions))})", **context)
        error.version, error.known = version, versions
        return error


class ConfigError(WalkitError, ValueError):
    code = 500


class MetadataError(WalkitError):
    code = 600


class MetadataVersionError(MetadataError):
    code = 601


class NodeExistsError(MetadataError):
    code = 602


class NoNodeError(MetadataError):
    code = 603


class NotEmptyError(MetadataError):
    code = 604


class SessionExpiredError(MetadataError):
    code = 605


class MetadataUnavailableError(MetadataError):
    code = 606


class ClusterLayoutError(MetadataError):
    code = 607


class NoMetadataStoreError(ClusterLayoutError):
    """No ``local://`` store at the path: only ``walkit init`` (and the local clusters
    that make their own) create one, so a typo never makes a second, empty cluster."""

    code = 610


class LedgerExistsError(MetadataError):
    code = 608


class BookieIdInUseError(MetadataError):
    code = 609


class BookieBusyError(BookieError):
    code = 305


class NotEnoughBookiesError(BookieError):
    """Too few writable bookies to create a ledger, replace a failed bookie, or answer
    enough of a write set for recovery."""

    code = 306


class BookieTimeoutError(BookieUnavailableError):
    """A bookie did not answer a request within the client's timeout."""

    code = 307


class ProtocolError(WalkitError):
    code = 700


class ProtocolVersionError(ProtocolError):
    code = 701


class FrameTooLargeError(ProtocolError):
    code = 702
