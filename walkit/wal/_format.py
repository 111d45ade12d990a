"""Bytes of the WAL: record batches (ledger entries) and log metadata (docs/format.md).

A **record batch** is one ledger entry's payload::

    "WKRB" | version u8 (2) | count u32 | count x length u32 | the records, back to back

big-endian (version 1, still read: ``count x (length u32 | record bytes)``). A record too
large for one entry goes alone into consecutive entries of one segment as **record
fragments**::

    "WKRF" | version u8 (1) | record length u64 | index u32 | count u32 | the fragment's bytes

(fragment ``index`` of ``count``; the record is their bytes in order; readers put them
together: ``walkit/wal/_records.py``). **Log metadata** (node ``<root>/logs/<namespace>/<name>``) is canonical JSON:
``{"format": 1, "epoch": int, "segments": [[seq, ledger_id], ...],
"snapshots": [[lsn, ledger_id, size], ...], "truncated": lsn | null,
"settings": {...}}`` plus ``"pending": [[ledger_id, epoch], ...]`` while snapshots are
being written (omitted when none). Snapshots are listed oldest first; ``settings`` holds
``snapshots_kept`` and ``retention`` only when they differ from their defaults (2, no
rule). A **namespace** node (``<root>/logs/<namespace>``) holds the
namespace's default settings as canonical JSON (``{}``: none).

Log metadata of any format is read (the keys of format 1 keep their meaning in every
later one); keys this code does not know - at the top or in ``settings`` - are kept and
written back as they were, so an older walkit's read-modify-write never drops what a
newer one added. A node of a format above :data:`LOG_FORMAT` is never written here
(:class:`~walkit.errors.FormatVersionError`): that format may rule how its keys change.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, islice
from typing import Any, NamedTuple

from walkit.errors import FormatError, FormatVersionError, InvalidArgumentError
from walkit.wal._auth import LogAuth
from walkit.wal._lsn import LSN

__all__ = ["LogMetadata", "LogSettings", "Retention", "PendingSnapshot", "pack_records", "unpack_records", "Segment", "SnapshotRef",
           "Fragment", "fragment_count", "is_fragment", "pack_fragment", "unpack_fragment"]

MAGIC = b"WKRB"
VERSION = 2  # written; 1 is still read
_HEAD = struct.Struct(">4sBI")
_LEN = struct.Struct(">I")
BATCH_HEAD_SIZE = _HEAD.size  # 9: magic, version, count
RECORD_LENGTH_SIZE = _LEN.size  # 4: each record's length, in a version-2 batch's table
#: A version-2 batch of one record starts with these 9 bytes, then the record's length:
#: what a reader checks of an entry written by one append (``RecordReader.chunk``).
ONE_RECORD = struct.Struct(">9sI")
ONE_RECORD_PREFIX = _HEAD.pack(MAGIC, VERSION, 1)
LOG_FORMAT = 1  # written; every format >= 1 is read, only formats <= this one are written
FRAGMENT_MAGIC = b"WKRF"
FRAGMENT_VERSION = 1  # written and read
_FRAGMENT_HEAD = struct.Struct(">4sBQII")  # magic, version, record length, index, count
FRAGMENT_HEAD_SIZE = _FRAGMENT_HEAD.size  # 21: what an entry holds besides a fragment's bytes
#: The largest record a writer takes and a reader puts together from fragments, unless told.
DEFAULT_MAX_RECORD_BYTES = 64 << 20


def pack_records(records: Sequence[bytes]) -> bytes:
    """A version-2 batch: the lengths together, then the records back to back (both made in
    C: the writer packs every record it is given, hundreds of thousands a second)."""
    count = len(records)
    parts = [_HEAD.pack(MAGIC, VERSION, count), struct.pack(f">{count}I", *map(len, records))]
    parts += records
    return b"".join(parts)


def unpack_records(data: bytes) -> list[bytes]:
    """The records of a batch of either version (1: each record after its length)."""
    if len(data) < _HEAD.size:
        raise FormatError("record batch shorter than its header", size=len(data))
    magic, version, count = _HEAD.unpack_from(data)
    if magic != MAGIC:
        if magic == FRAGMENT_MAGIC:
            raise FormatError("entry is a fragment of a record larger than an entry, not a record batch "
                              "(RecordReader puts fragments together)", magic=magic.hex(), version=version)
        raise FormatError("not a walkit record batch", magic=magic.hex(), version=version)
    return FormatVersionError.reader(_BATCH_READERS, version, "record batch")(data, count)


def _unpack_v2(data: bytes, count: int) -> list[bytes]:
    if type(data) is not bytes:
        data = bytes(data)  # slices of it are the records: bytes, whatever the entry came in
    pos = _HEAD.size + 4 * count
    if pos > len(data):
        raise FormatError("record batch truncated", count=count, at=0)
    lengths = struct.unpack_from(f">{count}I", data, _HEAD.size)
    if pos + sum(lengths) != len(data):
        if pos + sum(lengths) > len(data):
            raise FormatError("record batch truncated", count=count, size=len(data), needed=pos + sum(lengths))
        raise FormatError("bytes after the last record of a batch", extra=len(data) - pos - sum(lengths))
    bounds = list(accumulate(lengths, initial=pos))  # where each record starts, and the end
    return list(map(data.__getitem__, map(slice, bounds, islice(bounds, 1, None))))  # sliced in C


def _unpack_v1(data: bytes, count: int) -> list[bytes]:
    records: list[bytes] = []
    pos = _HEAD.size
    view = memoryview(data)
    for _ in range(count):
        if pos + 4 > len(data):
            raise FormatError("record batch truncated", count=count, at=len(records))
        (length,) = _LEN.unpack_from(data, pos)
        pos += 4
        if pos + length > len(data):
            raise FormatError("record batch truncated", count=count, at=len(records))
        records.append(bytes(view[pos:pos + length]))
        pos += length
    if pos != len(data):
        raise FormatError("bytes after the last record of a batch", extra=len(data) - pos)
    return records


#: Record-batch version -> its unpacker (``count`` read from the common head).
_BATCH_READERS: dict[int, Callable[[bytes, int], list[bytes]]] = {1: _unpack_v1, 2: _unpack_v2}


class Fragment(NamedTuple):
    """One entry of a record too large for an entry: fragment ``part`` (from 0) of
    ``parts``, and ``data``, its bytes; ``length`` is the whole record's."""

    length: int
    part: int
    parts: int
    data: bytes


def fragment_count(length: int, room: int) -> int:
    """How many fragments of at most ``room`` bytes a record of ``length`` bytes takes."""
    return max(1, -(-length // room))


def pack_fragment(length: int, index: int, count: int, data: bytes | memoryview) -> bytes:
    """Fragment ``index`` of ``count`` of a record of ``length`` bytes (``data``: its bytes;
    a memoryview of the record is copied once, here)."""
    return b"".join((_FRAGMENT_HEAD.pack(FRAGMENT_MAGIC, FRAGMENT_VERSION, length, index, count), data))


def is_fragment(data: bytes) -> bool:
    """Whether an entry's payload is a record fragment (else it should be a record batch)."""
    return data[:4] == FRAGMENT_MAGIC


def unpack_fragment(data: bytes) -> Fragment:
    """A fragment entry's head and bytes (FormatError when damaged, FormatVersionError
    for a version this walkit does not read)."""
    if len(data) < 5 or data[:4] != FRAGMENT_MAGIC:
        raise FormatError("not a walkit record fragment", size=len(data), magic=bytes(data[:4]).hex())
    return FormatVersionError.reader(_FRAGMENT_READERS, data[4], "record fragment")(data)


def _unpack_fragment_v1(data: bytes) -> Fragment:
    if len(data) < _FRAGMENT_HEAD.size:
        raise FormatError("record fragment shorter than its header", size=len(data))
    _, _, length, index, count = _FRAGMENT_HEAD.unpack_from(data)
    if not index < count:
        raise FormatError("record fragment index out of range", index=index, count=count)
    body = data[_FRAGMENT_HEAD.size:]
    if len(body) > length:
        raise FormatError("record fragment longer than its record", size=len(body), length=length)
    return Fragment(length, index, count, body)


#: Record-fragment version -> its unpacker.
_FRAGMENT_READERS: dict[int, Callable[[bytes], Fragment]] = {1: _unpack_fragment_v1}


@dataclass(frozen=True)
class Retention:
    """What a log's writer deletes by itself (walkit/wal/_retention.py): whole closed
    segments, oldest first, never past the oldest snapshot kept nor a position a reader
    holds. A segment goes when any rule given says so: it was closed more than
    ``max_age`` seconds ago; the log's segments hold more than ``max_bytes``; or
    ``before_snapshot`` (everything the oldest kept snapshot covers). No rule: nothing
    goes by itself (``WriteAheadLog.truncate`` still can)."""

    max_age: float | None = None
    max_bytes: int | None = None
    before_snapshot: bool = False

    def __post_init__(self) -> None:
        if self.max_age is not None and (isinstance(self.max_age, bool) or not isinstance(self.max_age, (int, float))
                                         or not self.max_age > 0):
            raise InvalidArgumentError("retention max_age is a number of seconds > 0", max_age=repr(self.max_age))
        if self.max_bytes is not None and (type(self.max_bytes) is not int or self.max_bytes <= 0):
            raise InvalidArgumentError("retention max_bytes is an int > 0", max_bytes=repr(self.max_bytes))
        if type(self.before_snapshot) is not bool:
            raise InvalidArgumentError("retention before_snapshot is a bool",
                                       before_snapshot=repr(self.before_snapshot))

    @property
    def active(self) -> bool:
        return self.max_age is not None or self.max_bytes is not None or self.before_snapshot

    @classmethod
    def of(cls, value: Retention | Mapping[str, Any]) -> Retention:
        if isinstance(value, Retention):
            return value
        if not isinstance(value, Mapping):
            raise InvalidArgumentError("retention is a walkit.Retention or a mapping of its fields",
                                       type=type(value).__name__)
        unknown = sorted(set(value) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise InvalidArgumentError("unknown retention rule", rules=",".join(map(str, unknown)))
        return cls(**value)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v not in (None, False)}


@dataclass(frozen=True)
class LogSettings:
    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    roll_bytes: int = 256 << 20
    roll_seconds: float = 3600.0
    snapshots_kept: int = 2  # the newest snapshots kept; an older one's ledger is deleted
    retention: Retention = Retention()

    def __post_init__(self) -> None:
        if not self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            raise InvalidArgumentError("quorums must satisfy ensemble_size >= write_quorum >= ack_quorum >= 1",
                                       E=self.ensemble_size, Qw=self.write_quorum, Qa=self.ack_quorum)
        if not self.roll_bytes > 0 or not self.roll_seconds > 0:
            raise InvalidArgumentError("roll_bytes and roll_seconds must be > 0", roll_bytes=self.roll_bytes,
                                       roll_seconds=self.roll_seconds)
        if type(self.snapshots_kept) is not int or self.snapshots_kept < 1:
            raise InvalidArgumentError("snapshots_kept is an int >= 1", snapshots_kept=repr(self.snapshots_kept))
        if not isinstance(self.retention, Retention):
            object.__setattr__(self, "retention", Retention.of(self.retention))

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> LogSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InvalidArgumentError("unknown log setting", settings=",".join(unknown))
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON; the policy keys only when not their defaults (a log
        without a policy reads the same to a walkit from before them)."""
        body = dataclasses.asdict(self)
        body["retention"] = self.retention.to_json()
        for key, default in _POLICY_DEFAULTS.items():
            if body[key] == default:
                del body[key]
        return body


_POLICY_DEFAULTS: dict[str, Any] = {"snapshots_kept": 2, "retention": {}}


@dataclass(frozen=True)
class Segment:
    seq: int
    ledger_id: int


@dataclass(frozen=True)
class SnapshotRef:
    lsn: LSN
    ledger_id: int
    size: int


@dataclass(frozen=True)
class PendingSnapshot:
    """A snapshot being written (its ledger, the writer's epoch): recorded before its
    first byte, so a writer that dies half-way leaves a name to clean up, not an orphan."""

    ledger_id: int
    epoch: int


_LOG_KEYS = frozenset({"format", "epoch", "segments", "snapshots", "truncated", "settings", "pending", "auth"})
_SETTINGS_KEYS = frozenset(f.name for f in dataclasses.fields(LogSettings))
_RULES = frozenset(f.name for f in dataclasses.fields(Retention))


def _known_rules(rules: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in dict(rules).items() if k in _RULES}


@dataclass(frozen=True)
class LogMetadata:
    epoch: int
    segments: tuple[Segment, ...]
    snapshots: tuple[SnapshotRef, ...]
    truncated: LSN | None
    settings: LogSettings
    #: Snapshots being written (oldest first); a newer epoch's writer deletes the others'.
    pending: tuple[PendingSnapshot, ...] = ()
    #: The verifier of the log's password (None: a node written before logs had one;
    #: walkit/wal/_auth.py).
    auth: LogAuth | None = None
    #: The node's format: above LOG_FORMAT, a newer walkit's (read here, never written).
    format_version: int = LOG_FORMAT
    #: Keys this walkit does not know (a newer one's), at the top and in ``settings``:
    #: written back as they were read.
    unknown: Mapping[str, Any] = field(default_factory=dict, hash=False)
    unknown_settings: Mapping[str, Any] = field(default_factory=dict, hash=False)
    #: Retention rules this walkit does not know (a newer one's): kept as they were, and
    #: while there are any this walkit deletes no segment (an unknown rule may keep more).
    unknown_retention: Mapping[str, Any] = field(default_factory=dict, hash=False)
    #: The node it was read from (names the log in errors; not part of the value).
    path: str = field(default="", compare=False, repr=False)

    def check_writable(self) -> None:
        """Raise FormatVersionError unless this walkit may write (or delete) the node."""
        if self.format_version > LOG_FORMAT:
            raise FormatVersionError.unwritable("log metadata format", self.format_version, range(1, LOG_FORMAT + 1),
                                                path=self.path or None)

    def encode(self) -> bytes:
        self.check_writable()
        body = {
            **self.unknown, "format": LOG_FORMAT, "epoch": self.epoch,
            "segments": [[s.seq, s.ledger_id] for s in self.segments],
            "snapshots": [[str(s.lsn), s.ledger_id, s.size] for s in self.snapshots],
            "truncated": None if self.truncated is None else str(self.truncated),
            "settings": {**self.unknown_settings, **self.settings.to_json()},
        }
        if self.unknown_retention:
            body["settings"]["retention"] = {**self.unknown_retention, **self.settings.retention.to_json()}
        if self.pending:
            body["pending"] = [[p.ledger_id, p.epoch] for p in self.pending]
        if self.auth is not None:
            body["auth"] = self.auth.to_json()
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("ascii")

    @classmethod
    def decode(cls, data: bytes, path: str) -> LogMetadata:
        """What :meth:`encode` wrote, of any format (FormatError when unreadable)."""
        try:
            return cls._from_json(json.loads(data), path)
        except FormatError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, InvalidArgumentError) as exc:
            raise FormatError("unreadable log metadata", path=path, reason=str(exc)[:200]) from exc

    @classmethod
    def _from_json(cls, body: dict[str, Any], path: str) -> LogMetadata:
        version, settings = body["format"], dict(body["settings"])
        if type(version) is not int or version < 1:
            raise FormatError("unknown log metadata format", path=path, format=repr(version)[:40])
        return cls(
            epoch=int(body["epoch"]),
            segments=tuple(Segment(int(a), int(b)) for a, b in body["segments"]),
            snapshots=tuple(SnapshotRef(LSN.parse(a), int(b), int(c)) for a, b, c in body["snapshots"]),
            truncated=None if body["truncated"] is None else LSN.parse(body["truncated"]),
            settings=LogSettings.of({k: _known_rules(v) if k == "retention" else v
                                     for k, v in settings.items() if k in _SETTINGS_KEYS}),
            pending=tuple(PendingSnapshot(int(a), int(b)) for a, b in body.get("pending", ())),
            auth=None if body.get("auth") is None else LogAuth.from_json(body["auth"], path),
            format_version=version,
            unknown={k: v for k, v in body.items() if k not in _LOG_KEYS},
            unknown_settings={k: v for k, v in settings.items() if k not in _SETTINGS_KEYS},
            unknown_retention={k: v for k, v in dict(settings.get("retention") or {}).items() if k not in _RULES},
            path=path,
        )

    def ledgers_newest_first(self) -> Iterator[int]:
        """The log's ledgers that carry its password: segments, then snapshots, newest first."""
        yield from (s.ledger_id for s in reversed(self.segments))
        yield from (s.ledger_id for s in reversed(self.snapshots))

    def segments_from(self, after: LSN | None) -> Iterator[Segment]:
        for segment in self.segments:
            if after is None or segment.seq >= after.segment:
                yield segment
