"""Pure planning for the Spark data source: options, sort keys, offsets, partitions.

Nothing here does I/O or imports Spark: the driver learns what the log holds
(:class:`SegmentExtent`, from ``_read.py``) and these functions decide which entries
each Spark task reads (:class:`LogRange`, :class:`LedgerRange`). Tasks carry ids,
entry ranges and LSN bounds only - never a client or a handle - so they pickle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from walkit.errors import InvalidArgumentError
from walkit.wal import DEFAULT_MAX_RECORD_BYTES, LSN

__all__ = [
    "END_SLOT", "LedgerRange", "LogRange", "ReadOptions", "SegmentExtent", "lsn_key", "lsn_of_offset",
    "offset_of_lsn", "plan_ledger", "plan_log",
]

# The sortable text form of an LSN: fixed-width decimal parts, so that comparing strings
# compares LSNs ("10/0/0" sorts before "2/0/0" as text; these do not). 19 digits hold
# any int64 and keep the form readable by LSN.parse.
LSN_KEY_WIDTHS = (19, 19, 10)
LSN_KEY_FORMAT = "{{:0{}d}}/{{:0{}d}}/{{:0{}d}}".format(*LSN_KEY_WIDTHS)  # "{:019d}/{:019d}/{:010d}"
# A slot past any real one: (segment, entry, END_SLOT) is "after every record of that
# entry", the position a stream offset takes at an entry boundary.
END_SLOT = (1 << 32) - 1
DEFAULT_PARTITION_BYTES = 64 << 20  # like Spark's file splits: enough work per task to pay for its start
DEFAULT_ENTRY_BYTES = 1 << 20  # the WAL's largest entry: the estimate when a segment's size is unknown


def lsn_key(lsn: LSN) -> str:
    """The sortable text form of ``lsn`` (the ``lsn_key`` column)."""
    return LSN_KEY_FORMAT.format(lsn.segment, lsn.entry, lsn.slot)


def offset_of_lsn(lsn: LSN) -> dict[str, int]:
    """A stream offset: every record up to ``lsn`` (inclusive) is behind it."""
    return {"segment": lsn.segment, "entry": lsn.entry, "slot": lsn.slot}


def lsn_of_offset(offset: Mapping[str, object]) -> LSN:
    """The LSN a stream offset (:func:`offset_of_lsn`) stands for."""
    parts = [offset.get(name) for name in ("segment", "entry", "slot")]
    segment, entry, slot = parts
    if not (isinstance(segment, int) and isinstance(entry, int) and isinstance(slot, int)):
        raise InvalidArgumentError("not a walkit stream offset", offset=repr(dict(offset))[:120])
    return LSN(segment, entry, slot)


@dataclass(frozen=True)
class ReadOptions:
    """The data source's options, checked once on the driver (option names are
    case-insensitive in Spark; values are strings)."""

    metadata: str
    namespace: str = "default"
    log: str | None = None
    ledgers: tuple[int, ...] | None = None
    password: bytes = b""
    after: LSN | None = None  # exclusive
    until: LSN | None = None  # inclusive
    partition_bytes: int = DEFAULT_PARTITION_BYTES
    entries_per_partition: int | None = None  # overrides partition_bytes when given
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES  # a larger record (in fragments) is refused

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        opts = {str(k).lower(): str(v) for k, v in options.items() if k.lower() != "path"}
        metadata = opts.pop("metadata", "") or opts.pop("metadatauri", "")
        if not metadata:
            raise InvalidArgumentError("the walkit data source needs .option('metadata', URI)")
        log, ledgers = opts.pop("log", None), opts.pop("ledgers", None)
        if (log is None) == (ledgers is None):
            raise InvalidArgumentError("give exactly one of .option('log', NAME) and .option('ledgers', '1,2,3')")
        parsed = cls(
            metadata=metadata,
            namespace=opts.pop("namespace", "default"),
            log=log,
            ledgers=None if ledgers is None else _ledger_ids(ledgers),
            password=opts.pop("password", "").encode("utf-8"),
            after=_lsn_option(opts, "after"),
            until=_lsn_option(opts, "until"),
            partition_bytes=_int_option(opts, "partitionbytes") or DEFAULT_PARTITION_BYTES,
            entries_per_partition=_int_option(opts, "entriesperpartition"),
            max_record_bytes=_int_option(opts, "maxrecordbytes") or DEFAULT_MAX_RECORD_BYTES,
        )
        if opts:
            raise InvalidArgumentError("unknown walkit data source option", options=",".join(sorted(opts)))
        if parsed.ledgers is not None and (parsed.after is not None or parsed.until is not None):
            raise InvalidArgumentError("after/until are LSNs: they apply to logs, not to raw ledgers")
        return parsed


def _ledger_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InvalidArgumentError("ledgers is a comma-separated list of ledger ids", ledgers=text[:80]) from None
    if not ids or any(i < 0 for i in ids):
        raise InvalidArgumentError("ledgers is a comma-separated list of ledger ids", ledgers=text[:80])
    return ids


def _lsn_option(opts: dict[str, str], name: str) -> LSN | None:
    text = opts.pop(name, None)
    return None if text is None or text == "" else LSN.parse(text)


def _int_option(opts: dict[str, str], name: str) -> int | None:
    text = opts.pop(name, None)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgumentError("option is a positive integer", option=name, value=text[:40]) from None
    if value < 1:
        raise InvalidArgumentError("option is a positive integer", option=name, value=value)
    return value


@dataclass(frozen=True)
class SegmentExtent:
    """What the driver learned of a segment: its readable entries ``0..last`` (``last``
    is the LAC of an open ledger, -1 when empty) and its size when known (closed)."""

    seq: int
    ledger_id: int
    last: int
    length: int | None = None

    def entry_bytes(self) -> float | None:
        return self.length / (self.last + 1) if self.length and self.last >= 0 else None


@dataclass(frozen=True)
class LogRange:
    """One Spark task of a log read: entries ``first..last`` of segment ``seq``,
    records strictly after ``after`` and up to ``until`` (either may be None)."""

    seq: int
    ledger_id: int
    first: int
    last: int
    after: LSN | None = None
    until: LSN | None = None

    def wants(self, lsn: LSN) -> bool:
        return (self.after is None or lsn > self.after) and (self.until is None or lsn <= self.until)


@dataclass(frozen=True)
class LedgerRange:
    """One Spark task of a raw ledger read: entries ``first..last`` of ``ledger_id``."""

    ledger_id: int
    first: int
    last: int


def _entries_per_task(entry_bytes: float, partition_bytes: int, entries_per_partition: int | None) -> int:
    if entries_per_partition is not None:
        return entries_per_partition
    return max(1, int(partition_bytes // max(entry_bytes, 1.0)))


def _split(first: int, last: int, per_task: int) -> list[tuple[int, int]]:
    count = last - first + 1
    tasks = max(1, math.ceil(count / per_task))
    size = math.ceil(count / tasks)  # even ranges rather than a runt at the end
    return [(start, min(last, start + size - 1)) for start in range(first, last + 1, size)]


def plan_log(extents: Sequence[SegmentExtent], *, after: LSN | None = None, until: LSN | None = None,
             partition_bytes: int = DEFAULT_PARTITION_BYTES,
             entries_per_partition: int | None = None) -> list[LogRange]:
    """The tasks reading the records of ``extents`` after ``after`` and up to ``until``,
    in LSN order: a segment's entries in ranges of about ``partition_bytes`` (or of
    ``entries_per_partition`` entries). A segment of unknown size (the open one) is
    estimated from the closed ones."""
    known = [e.entry_bytes() for e in extents]
    sizes = [k for k in known if k is not None]
    fallback = sum(sizes) / len(sizes) if sizes else DEFAULT_ENTRY_BYTES
    tasks: list[LogRange] = []
    for extent, size in zip(extents, known):
        first = after.entry if after is not None and after.segment == extent.seq else 0
        if after is not None and after.segment == extent.seq and after.slot == END_SLOT:
            first += 1
        last = extent.last
        if until is not None and until.segment == extent.seq:
            last = min(last, until.entry)
        if (after is not None and extent.seq < after.segment) or (until is not None and extent.seq > until.segment):
            continue
        if first > last:
            continue
        entry_bytes = size if size is not None else fallback
        per_task = _entries_per_task(entry_bytes, partition_bytes, entries_per_partition)
        for lo, hi in _split(first, last, per_task):
            tasks.append(LogRange(extent.seq, extent.ledger_id, lo, hi, after, until))
    return tasks


def plan_ledger(ledger_id: int, last: int, length: int | None, *, partition_bytes: int = DEFAULT_PARTITION_BYTES,
                entries_per_partition: int | None = None) -> list[LedgerRange]:
    """The tasks reading entries ``0..last`` of a ledger (none when it is empty)."""
    if last < 0:
        return []
    entry_bytes = length / (last + 1) if length else DEFAULT_ENTRY_BYTES
    per_task = _entries_per_task(entry_bytes, partition_bytes, entries_per_partition)
    return [LedgerRange(ledger_id, lo, hi) for lo, hi in _split(first=0, last=last, per_task=per_task)]
