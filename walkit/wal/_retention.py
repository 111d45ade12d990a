"""Retention: which of a log's segments go, and the readers' holds that keep them.

Theory of operation
-------------------
A log only ever loses whole segments from its front (their ledgers deleted, the log
node's ``truncated`` mark moved past them); the open segment never goes. What may go is
bounded twice:

* **by the oldest snapshot kept** (``snapshots_kept``, default 2): every kept snapshot
  must stay loadable *and replayable*, so no segment at or after the one holding the
  oldest kept snapshot's LSN goes. A log without a snapshot loses nothing.
* **by holds**: a reader opened with ``hold=True`` keeps a node of its own (ephemeral:
  it goes with the reader's session) under ``<root>/logholds/<namespace>/<log>/``
  naming the position its replay or tail has reached; a *named cursor*
  (``reader(..., cursor="indexer")``) is a persistent node there naming the position
  its owner committed (``LogReader.commit``). No segment at or after a held position's
  segment goes; a hold at the start of the log keeps everything.

Inside those bounds the log's :class:`~walkit.wal._format.Retention` decides (any rule
that says "go" is enough; the first segment that stays ends the cut, so what goes is
always a prefix): ``before_snapshot``, ``max_age`` (the segment was closed more than that
long ago: its close time is its successor's creation, the moment the writer rolled) and
``max_bytes`` (the log's segments hold more than that, oldest go first). An explicit
``WriteAheadLog.truncate(before)`` is one more rule within the same bounds.

Why a hold registered while a cut is being decided is never missed: a cut is a
compare-and-set of the log node that reads the holds *after* reading the node, and
registering a hold (or moving one backwards) writes the node back unchanged *after*
creating the hold. If the hold came first, the cut's read of the holds sees it; if the
registration's write came after the cut read the node, the cut's compare-and-set fails
and it decides again, seeing the hold. Moving a hold forward needs no such write: it
only lets more go. The reader checks its position against ``truncated`` after
registering, so a position already cut is an error, never a silent gap.

The writer applies its log's rules by itself in the background (on a metadata thread
of its client, one pass at a time) after every roll and snapshot, when it opens, and
every :data:`PASS_INTERVAL` seconds while an age rule is set; the same pass deletes the
ledgers of snapshots a dead writer left half-written (``pending`` in the log node).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import dataclasses
import functools

from walkit.errors import (
    FormatError,
    InvalidArgumentError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
    NoSuchLedgerError,
    UsageError,
    WalkitError,
)
from walkit.metadata import LedgerState, MetadataStore, retry_cas
from walkit.wal._format import LogMetadata, Retention, Segment
from walkit.wal._lsn import LSN
from walkit.wal._state import WriterState

__all__ = ["Hold", "SegmentFacts", "PASS_INTERVAL", "read_holds", "named_holds", "segments_to_drop", "touch_node", "check_cursor_name",
           "cut", "delete_ledgers", "wait_locked"]

log = logging.getLogger(__name__)

PASS_INTERVAL = 60.0  # seconds between passes of a writer whose log has an age rule
_EPHEMERAL_PREFIX = "h-"
_CURSOR_PREFIX = "c-"
_START = b""  # a hold's data for "from the log's start"


@dataclass(frozen=True)
class SegmentFacts:
    """What the rules ask of a segment: its bytes and when it was closed (seconds since
    the epoch; None while it is open or unknown)."""

    size: int
    closed_at: float | None


def segments_to_drop(meta: LogMetadata, current: Segment | None, rules: Retention, holds: Sequence[LSN | None],
                     facts: Callable[[Segment], SegmentFacts], *, open_bytes: int = 0, before: LSN | None = None,
                     now: float | None = None) -> list[Segment]:
    """The segments of ``meta`` a cut removes now (a prefix, oldest first): within the
    bounds of the module docstring, those some rule (or ``before``) lets go.
    ``open_bytes``: what the open segment ``current`` holds (its ledger's length lags)."""
    if not meta.snapshots or not meta.segments:
        return []
    limit = meta.snapshots[0].lsn.segment  # snapshots are oldest first: the oldest kept
    for hold in holds:
        limit = min(limit, meta.segments[0].seq if hold is None else hold.segment)
    candidates = list(itertools.takewhile(lambda s: s.seq < limit and s != current, meta.segments))
    if not candidates or not (rules.active or before is not None):
        return []
    now = time.time() if now is None else now
    total = 0
    if rules.max_bytes is not None:
        total = open_bytes + sum(facts(s).size for s in meta.segments if s != current)
    dropped: list[Segment] = []
    for segment in candidates:
        go = rules.before_snapshot or (before is not None and segment.seq < before.segment)
        if not go and rules.max_age is not None:
            closed_at = facts(segment).closed_at
            go = closed_at is not None and now - closed_at > rules.max_age
        if not go and rules.max_bytes is not None:
            go = total > rules.max_bytes
        if not go:
            break
        if rules.max_bytes is not None:
            total -= facts(segment).size
        dropped.append(segment)
    return dropped


def cut(wal: WriterState, before: LSN | None = None) -> list[Segment]:
    """One retention pass of the writer ``wal`` (blocking; the writer's metadata thread or the
    caller's): the cut its log's rules allow (``before`` given: the cut an explicit
    ``truncate(before)`` asks, rules aside), and the ledgers of snapshots left pending by
    writers that are gone; the segments deleted."""
    node = wal.node
    facts = _Facts(wal)
    dropped: list[Segment] = []
    stale: list[int] = []
    listed: set[int] = set()

    def change(meta: LogMetadata) -> LogMetadata:
        rules = Retention() if before is not None else meta.settings.retention
        facts.segments = meta.segments
        unknown = bool(meta.unknown_retention)  # a newer walkit's rule: it may keep more, so nothing goes
        if unknown and before is not None:
            raise FormatError("the log has retention rules this walkit does not know; truncate it with the "
                              "walkit that set them", log=wal.name, rules=",".join(map(str, meta.unknown_retention)))
        holds: list[LSN | None] = []
        if meta.snapshots and (rules.active or before is not None) and not unknown:
            holds = read_holds(node.store, node.holds_path)  # after the node: see the module docstring
        current = wal.segment
        dropped[:] = [] if unknown else segments_to_drop(meta, current, rules, holds, facts,
                                                         open_bytes=wal.segment_bytes, before=before)
        gone = [p for p in meta.pending
                if p.epoch < wal.epoch or (p.epoch == wal.epoch and p.ledger_id not in wal.writing_snapshots)]
        stale[:] = [p.ledger_id for p in gone]
        listed.clear()
        listed.update(s.ledger_id for s in meta.snapshots)
        if not dropped and not gone:
            return meta
        keep = tuple(s for s in meta.segments if s not in dropped)
        truncated = meta.truncated
        if dropped:
            mark = LSN(keep[0].seq, 0, 0) if keep else LSN(dropped[-1].seq + 1, 0, 0)
            truncated = max(mark, meta.truncated or mark)
        return dataclasses.replace(meta, segments=keep, truncated=truncated,
                                   pending=tuple(p for p in meta.pending if p not in gone))

    retry_cas(functools.partial(wal.change, change), "log metadata (retention)", log=wal.name)
    for segment in dropped:
        wal.segment_facts.pop(segment.ledger_id, None)
    wal.undeleted.update([s.ledger_id for s in dropped] + [i for i in stale if i not in listed])
    delete_ledgers(wal)
    if dropped:
        log.info("log %s: retention deleted segments %d..%d", wal.name, dropped[0].seq, dropped[-1].seq)
    return dropped


def delete_ledgers(wal: WriterState) -> None:
    """(Blocking) delete the ledgers the log no longer names (``wal.undeleted``); one that
    cannot be deleted now is tried again at the next pass."""
    for ledger_id in sorted(wal.undeleted):
        try:
            wal.client.ledgers.delete(ledger_id)
        except NoSuchLedgerError:
            pass
        except WalkitError as exc:
            log.warning("log %s: ledger %d, no longer named by the log, not deleted yet: %s", wal.name, ledger_id,
                        exc)
            continue
        wal.undeleted.discard(ledger_id)


class _Facts:
    """Segment facts from ledger metadata, remembered per writer for closed ledgers."""

    def __init__(self, wal: WriterState) -> None:
        self._wal = wal
        self._cache = wal.segment_facts
        self.segments: tuple[Segment, ...] = ()  # the log's, as the pass read them

    def _meta(self, ledger_id: int) -> tuple[int, bool, float | None]:
        """(length, closed, created at) of a ledger; a deleted one counts as closed and
        empty, created at an unknown time."""
        known = self._cache.get(ledger_id)
        if known is not None:
            return known
        found: tuple[int, bool, float | None]
        try:
            meta = self._wal.client.ledgers.read(ledger_id)[0]
        except NoSuchLedgerError:
            found = (0, True, None)
        else:
            found = (meta.length, meta.state is LedgerState.CLOSED, meta.ctime / 1000.0)
        if found[1]:
            self._cache[ledger_id] = found
        return found

    def __call__(self, segment: Segment) -> SegmentFacts:
        length, closed, _ = self._meta(segment.ledger_id)
        closed_at = None
        if closed:
            following = [s for s in self.segments if s.seq > segment.seq]
            if following:
                closed_at = self._meta(following[0].ledger_id)[2]  # the roll created the next one
        return SegmentFacts(length, closed_at)


@contextlib.asynccontextmanager
async def wait_locked(lock: threading.Lock) -> AsyncIterator[None]:
    """``lock`` (a writer's ``_admin``: snapshots, truncations and retention passes, one at
    a time, taken by threads too), waited for on an event loop without blocking it - and
    never on one of the client's metadata threads, which what holds it may need."""
    delay = 0.0005
    while not lock.acquire(blocking=False):
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.02)
    try:
        yield
    finally:
        lock.release()


def read_holds(store: MetadataStore, path: str) -> list[LSN | None]:
    """The positions held on a log (None: from its start)."""
    return [position for _, position in named_holds(store, path)]


def named_holds(store: MetadataStore, path: str) -> list[tuple[str, LSN | None]]:
    """``(node name, position)`` of the holds on a log: ``h-<n>`` a reader's, ``c-<name>``
    a named cursor's; a hold that vanishes while it is read (its reader closed) is gone
    and holds nothing."""
    try:
        names = store.children(path)
    except NoNodeError:
        return []
    held: list[tuple[str, LSN | None]] = []
    for name in names:
        try:
            data, _ = store.get(f"{path}/{name}")
        except NoNodeError:
            continue
        held.append((name, _decode(data, f"{path}/{name}")))
    return held


def touch_node(store: MetadataStore, path: str, what: str, log_name: str) -> None:
    """Write the node back unchanged (a compare-and-set): any change decided on an older
    read of it now fails and is decided again (see the module docstring)."""

    def touch() -> None:
        data, stat = store.get(path)
        store.set(path, data, stat.version)

    retry_cas(touch, what, log=log_name)


def check_cursor_name(name: str) -> str:
    if not isinstance(name, str) or not name or "/" in name or name in (".", "..") or len(name) > 200:
        raise InvalidArgumentError("a cursor name is a non-empty string without '/' (at most 200 characters)",
                                   cursor=repr(name)[:80])
    return name


class Hold:
    """A reader's position kept where retention looks: ephemeral (``cursor`` None, one
    per reader, gone with its session or its :meth:`release`) or a named cursor
    (persistent, shared by every reader that names it). Blocking calls: not on the
    client's loop."""

    def __init__(self, store: MetadataStore, holds_path: str, log_path: str, log: str,
                 cursor: str | None = None) -> None:
        self._store = store
        self._dir = holds_path
        self._log_path = log_path
        self._log = log
        self.cursor = None if cursor is None else check_cursor_name(cursor)
        self._path: str | None = None if cursor is None else f"{holds_path}/{_CURSOR_PREFIX}{cursor}"
        self._position: LSN | None = None
        self._registered = False

    @property
    def position(self) -> LSN | None:
        """The position held (None: the log's start)."""
        return self._position

    def register(self, position: LSN | None) -> None:
        """Start holding ``position`` (a cursor that exists keeps its stored one and
        ``position`` is ignored)."""
        if self._registered:
            raise UsageError("hold already registered", log=self._log)
        data = _START if position is None else str(position).encode("ascii")
        if self.cursor is None:
            self._path = self._store.create(f"{self._dir}/{_EPHEMERAL_PREFIX}", data, ephemeral=True, sequential=True,
                                            make_parents=True)
            self._position = position
        else:
            assert self._path is not None
            try:
                self._store.create(self._path, data, make_parents=True)
                self._position = position
            except NodeExistsError:
                self._position = self._read()
                self._registered = True
                return
        self._registered = True
        touch_node(self._store, self._log_path, "log metadata (registering a reader's hold)", self._log)

    def _read(self) -> LSN | None:
        assert self._path is not None
        try:
            data, _ = self._store.get(self._path)
        except NoNodeError:
            raise UsageError("the cursor was deleted", log=self._log, cursor=self.cursor) from None
        return _decode(data, self._path)

    def refresh(self) -> LSN | None:
        """(Cursors) the position stored now (another reader of the cursor may have moved it)."""
        if self.cursor is not None and self._registered:
            self._position = self._read()
        return self._position

    def move(self, position: LSN | None) -> None:
        """Hold ``position`` from now on; a move backwards (or to the start) re-checks
        against cuts being decided (module docstring). A cursor is compared with what is
        stored (another reader of it may have moved it); a reader's hold whose node went
        with its session is registered again."""
        if not self._registered or self._path is None:
            raise UsageError("hold not registered", log=self._log)
        current = self._read() if self.cursor is not None else self._position
        if position == current:
            self._position = position
            return
        backwards = position is None or (current is not None and position < current)
        data = _START if position is None else str(position).encode("ascii")
        try:
            self._store.set(self._path, data)
        except NoNodeError:
            if self.cursor is not None:
                raise UsageError("the cursor was deleted", log=self._log, cursor=self.cursor) from None
            self._registered = False  # the session that held it expired: hold again, as new
            self.register(position)
            return
        self._position = position
        if backwards:
            touch_node(self._store, self._log_path, "log metadata (moving a reader's hold back)", self._log)

    def release(self) -> None:
        """Stop holding (an ephemeral hold's node is deleted; a cursor stays)."""
        if self._registered and self.cursor is None and self._path is not None:
            with contextlib.suppress(NoNodeError, MetadataVersionError):
                self._store.delete(self._path)
        self._registered = False

    def delete(self) -> None:
        """Delete the cursor itself (its position no longer keeps anything)."""
        if self.cursor is None or self._path is None:
            raise UsageError("only a named cursor can be deleted", log=self._log)
        with contextlib.suppress(NoNodeError):
            self._store.delete(self._path)
        self._registered = False


def _decode(data: bytes, path: str) -> LSN | None:
    if not data:
        return None
    try:
        return LSN.parse(data.decode("ascii"))
    except (ValueError, UnicodeDecodeError, InvalidArgumentError):
        log.warning("unreadable hold %s (%r): it keeps the whole log", path, data[:40])
        return None
