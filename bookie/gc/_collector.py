"""The garbage collector of a bookie: one thread, one pass every ``gcWaitTime``.

Theory of operation
-------------------
A pass, in order (each step logs what it did at INFO, and why it stopped early at
WARNING; nothing is cut short silently):

1. *Deleted ledgers* (when the bookie has metadata): the bookie's ledgers are listed,
   then compared with the store range by range (:mod:`bookie.gc._scan`). Each candidate
   is read once more, directly, after a ``sync`` (again per candidate: a session lost
   meanwhile may land on a lagging server); only "no such node" deletes it from the
   bookie (index, state, its share of every log's usage). A store that cannot answer
   (down, session lost) ends this step for the pass and keeps every undecided ledger.
2. *Over-replicated ledgers*, every ``gcOverreplicatedLedgerWaitTime`` (and in forced
   passes): each ledger's metadata is read; a closed ledger no fragment of which names
   this bookie is removed once it has been found so for ``gcOverreplicatedLedgerWaitTime``
   (first found in one check, still so in a check at least that much later, forced or
   not), and never while the ledger is marked under-replicated: a re-replication copies
   entries here before it changes the metadata, and is never undone mid-way.
3. *Empty entry logs*: a log none of whose ledgers exists any more is deleted - sealed
   or not: on a disk too full for a flush to complete, no log is sealed, and the logs of
   deleted ledgers are where the room for the next flush comes from.
4. *Compaction*: first every log with a compaction marker (a pass that was cut short or
   a crash), then, when due (``majorCompactionInterval`` / ``minorCompactionInterval``)
   or forced, the logs under that kind's threshold, emptiest first, within the kind's
   maximum run time, at ``compactionRateByEntries`` (or ``ByBytes``). It pauses when the
   disk is too full for it (:func:`bookie.gc._policy.suspension`; a suspended major
   compaction falls back to minor, which copies the least), and skips a log whose live
   bytes would not fit in the free space. A log that cannot be read whole or removed is
   reported (``damaged_entry_logs``) and left alone.

Every metadata call is paced by ``gcMetadataOpRateLimit``. A store that does not answer
(``MetadataUnavailableError``: ZooKeeper unreachable, the ``local://`` database locked)
fails a call after ``metadataRetryDeadlineMs``; the first such failure ends the metadata
steps of the pass - the rest of step 1 and all of step 2, which stays due - so a pass
waits at most one retry deadline for a store that is down. It is logged once (WARNING,
why), counted (``metadata_unavailable_passes``), and the next pass tries again; steps 3
and 4 need no metadata and run as usual. A pass that gave space back
calls ``on_freed`` (the server re-checks its disks: a read-only bookie turns writable
again as soon as it can). :meth:`GarbageCollector.request` asks for a pass now
("forced": compaction of the kind asked, even if not due); :meth:`status` reports the
last pass, totals, compaction state and entry-log usage.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from bookie._config import BookieConfig
from bookie.gc._compactor import compact_log
from bookie.gc._policy import Kind, RateLimiter, candidates, compaction_rule, due_compaction, suspension
from bookie.gc._scan import is_overreplicated, unlisted
from bookie.storage import EntryLogInfo, LedgerStorage
from walkit.errors import CorruptionError, FormatError, MetadataUnavailableError, NoSuchLedgerError, WalkitError
from walkit.logs import context
from walkit.metadata import LedgerMetadata

__all__ = ["GarbageCollector", "GcMetadata", "PassStats"]

log = logging.getLogger("bookie.gc")

_FREE_MARGIN = 16 << 20  # free bytes kept beyond a log's live bytes before compacting it


class GcMetadata(Protocol):
    """What the collector needs of the metadata (a :class:`~walkit.metadata.LedgerManager`)."""

    def sync(self) -> None: ...

    def ledger_ranges(self, before_call: Callable[[], object] | None = None) -> Iterator[tuple[int, int, list[int]]]: ...

    def exists(self, ledger_id: int) -> bool: ...

    def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]: ...


@dataclass
class PassStats:
    ledgers_removed: int = 0
    overreplicated_removed: int = 0
    entry_logs_deleted: int = 0
    entry_logs_compacted: int = 0
    entries_copied: int = 0
    bytes_copied: int = 0
    bytes_reclaimed: int = 0  # entry-log bytes deleted (compaction wrote bytes_copied anew)

    def add(self, other: PassStats) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class _Pass:
    number: int
    forced: bool
    compact: Kind | None
    started: float
    stats: PassStats = field(default_factory=PassStats)
    cut_short: list[str] = field(default_factory=list)
    metadata_unavailable: bool = False  # a store call gave up: the metadata steps ended there
    error: str | None = None
    seconds: float = 0.0


def _iso(wall: float | None) -> str | None:
    return None if wall is None else datetime.fromtimestamp(wall, timezone.utc).isoformat(timespec="seconds")


def free_bytes(path: str) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None  # not a real directory (an in-memory file system): no check


class GarbageCollector:
    """See the module docstring. ``delete_ledger(id)`` removes a ledger from the
    bookie; ``disk_usage(dir)`` is the fraction of a ledger dir's disk in use;
    ``marked(id)``: the ledger is marked under-replicated (never over-replicated then)."""

    def __init__(self, storage: LedgerStorage, config: BookieConfig, bookie_id: str, *,
                 metadata: GcMetadata | None, delete_ledger: Callable[[int], None],
                 disk_usage: Callable[[str], float], on_freed: Callable[[], None] | None = None,
                 free_space: Callable[[str], int | None] = free_bytes,
                 marked: Callable[[int], bool] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._storage, self._config, self._bookie_id = storage, config, bookie_id
        self._metadata, self._delete_ledger = metadata, delete_ledger
        self._disk_usage, self._free_space, self.on_freed = disk_usage, free_space, on_freed
        self._marked = marked
        self._clock = clock
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._requests: list[Kind | None] = []
        self._thread: threading.Thread | None = None
        self._passes = 0
        self._metadata_unavailable_passes = 0
        self._running = False
        self._last: _Pass | None = None
        self._totals = PassStats()
        now = clock()
        self._last_compaction: dict[Kind, float] = {"minor": now, "major": now}
        self._last_compaction_wall: dict[Kind, float | None] = {"minor": None, "major": None}
        self._last_overreplication = now
        self._suspects: dict[int, float] = {}  # over-replicated ledger -> when first found so
        self._damaged: set[tuple[int, int]] = set()
        self._compaction = "idle"
        self._next_pass = now + config.gc_wait_time / 1000.0
        self._meta_pace = RateLimiter(config.gc_metadata_op_rate_limit, clock=clock, sleep=self._stop.wait)
        rate, by_bytes = ((config.compaction_rate_by_bytes, True) if config.is_throttle_by_bytes
                          else (config.compaction_rate_by_entries, False))
        self._copy_pace, self._by_bytes = RateLimiter(rate, clock=clock, sleep=self._stop.wait), by_bytes
        if metadata is None:
            log.info("bookie %s: no metadata store, so ledgers deleted elsewhere are never collected here;"
                        " entry logs are still deleted and compacted", bookie_id)

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="bookie-gc", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; a pass in progress ends at its next step (copies made so
        far are flushed; a compaction continues after the next start)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def request(self, compact: Kind | None = None) -> int:
        """Ask for a forced pass now (compacting ``compact``'s logs if given); returns
        the number of the pass that will serve it (see :meth:`wait_for`)."""
        with self._cond:
            self._requests.append(compact)
            self._cond.notify_all()
            return self._passes + (2 if self._running else 1)

    def wait_for(self, number: int, timeout: float | None = None) -> bool:
        """Wait until pass ``number`` has ended; False on timeout or when stopped."""
        with self._cond:
            return self._cond.wait_for(lambda: self._passes >= number or self._stop.is_set(), timeout) \
                and self._passes >= number

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop.is_set() and not self._requests and self._clock() < self._next_pass:
                    self._cond.wait(max(0.0, self._next_pass - self._clock()))
                if self._stop.is_set():
                    return
                forced = bool(self._requests)
                kinds = set(self._requests)
                self._requests = []
                self._running = True
                number = self._passes + 1
            compact: Kind | None = "major" if "major" in kinds else "minor" if "minor" in kinds else None
            try:
                self.run_pass(number, forced=forced, compact=compact)
            finally:
                with self._cond:
                    self._passes, self._running = number, False
                    self._next_pass = self._clock() + self._config.gc_wait_time / 1000.0
                    self._cond.notify_all()

    # --- one pass -----------------------------------------------------------------------
    def run_pass(self, number: int = 0, *, forced: bool = False, compact: Kind | None = None) -> PassStats:
        """One pass (the thread's; tests call it directly on a collector not started)."""
        p = _Pass(number, forced, compact, time.time())
        t0 = self._clock()
        try:
            self._collect_ledgers(p)
            due = t0 - self._last_overreplication >= self._config.gc_overreplicated_ledger_wait_time / 1000
            if (forced or due) and not p.metadata_unavailable:
                self._collect_overreplicated(p, t0)
                if not p.metadata_unavailable:  # else it stays due: the next pass checks
                    self._last_overreplication = t0
            if not self._stop.is_set():
                self._delete_empty_logs(p)
            if not self._stop.is_set():
                self._compact(p)
        except Exception as exc:  # noqa: BLE001 - a pass that fails is reported, the next one tries again
            p.error = f"{type(exc).__name__}: {exc}"
            log.exception("bookie %s: GC pass %d failed", self._bookie_id, number,
                          extra=context(bookie=self._bookie_id))
        p.seconds = self._clock() - t0
        self._last = p
        self._totals.add(p.stats)
        self._metadata_unavailable_passes += p.metadata_unavailable
        s = p.stats
        log.info("bookie %s: GC pass %d%s in %.2fs: %d ledgers removed (+%d over-replicated), %d entry logs deleted,"
                 " %d compacted (%d entries, %d bytes copied), %d bytes reclaimed", self._bookie_id, number,
                 " (forced)" if forced else "", p.seconds, s.ledgers_removed, s.overreplicated_removed,
                 s.entry_logs_deleted, s.entry_logs_compacted, s.entries_copied, s.bytes_copied, s.bytes_reclaimed)
        for reason in p.cut_short:
            log.warning("bookie %s: GC pass %d cut short: %s", self._bookie_id, number, reason,
                        extra=context(bookie=self._bookie_id))
        if s.bytes_reclaimed and self.on_freed is not None:
            try:
                self.on_freed()
            except Exception:  # noqa: BLE001 - the collector must outlive its listener
                log.exception("bookie %s: on_freed failed", self._bookie_id, extra=context(bookie=self._bookie_id))
        return p.stats

    def _collect_ledgers(self, p: _Pass) -> None:
        md = self._metadata
        if md is None:
            return
        local = self._storage.ledgers()  # before the listing: a ledger created later is no candidate
        try:
            self._meta_pace.acquire()
            md.sync()
            for ledger_id in unlisted(local, md.ledger_ranges(self._meta_pace.acquire)):
                if self._stop.is_set():
                    p.cut_short.append("bookie stopping")
                    return
                self._meta_pace.acquire()
                md.sync()  # again: a session lost since the first sync may now be on a lagging server
                if md.exists(ledger_id):
                    continue  # created while the listing ran past it: keep
                if self._remove(ledger_id):
                    p.stats.ledgers_removed += 1
        except MetadataUnavailableError as exc:
            self._unavailable(p, "deleted ledgers", exc)
        except WalkitError as exc:  # the store (session lost) or the storage failed
            p.cut_short.append(f"deleted ledgers: step stopped, undecided ledgers kept: {exc}")

    def _collect_overreplicated(self, p: _Pass, now: float) -> None:
        md = self._metadata
        if md is None:
            return
        wait = self._config.gc_overreplicated_ledger_wait_time / 1000.0
        suspects: dict[int, float] = {}
        checked: set[int] = set()
        try:
            for ledger_id in self._storage.ledgers():
                if self._stop.is_set():
                    p.cut_short.append("bookie stopping")
                    break
                self._meta_pace.acquire()
                try:
                    meta, _ = md.read(ledger_id)
                except NoSuchLedgerError:
                    checked.add(ledger_id)
                    continue  # deleted: the next pass's scan removes it
                checked.add(ledger_id)
                if not is_overreplicated(meta, self._bookie_id):
                    continue
                if self._marked is not None and self._marked(ledger_id):
                    continue  # being re-replicated: copies may land here before the metadata names us
                first = self._suspects.get(ledger_id, now)
                if now - first >= wait and self._remove(ledger_id):
                    p.stats.overreplicated_removed += 1
                else:
                    suspects[ledger_id] = first
        except MetadataUnavailableError as exc:
            self._unavailable(p, "over-replicated ledgers", exc)
        except WalkitError as exc:
            p.cut_short.append(f"over-replicated ledgers: step stopped, undecided ledgers kept: {exc}")
        # ledgers this check did not reach keep their standing
        suspects |= {lid: t for lid, t in self._suspects.items() if lid not in checked}
        self._suspects = suspects

    @staticmethod
    def _unavailable(p: _Pass, step: str, exc: MetadataUnavailableError) -> None:
        """The store gave up on a call of ``step``: no more metadata calls this pass
        (one retry deadline waited is enough), said once with the reason."""
        p.metadata_unavailable = True
        p.cut_short.append(f"metadata unavailable: {step}: step stopped, undecided ledgers kept; no more metadata "
                           f"steps this pass, the next pass tries again ({exc})")

    def _remove(self, ledger_id: int) -> bool:
        try:
            self._delete_ledger(ledger_id)
        except NoSuchLedgerError:
            return False
        log.debug("bookie %s: ledger %d removed by GC", self._bookie_id, ledger_id)
        return True

    def _delete_empty_logs(self, p: _Pass) -> None:
        for _, _, size in self._storage.remove_dead_unsealed_logs():
            p.stats.entry_logs_deleted += 1
            p.stats.bytes_reclaimed += size
        for info in self._storage.entry_logs():
            if info.ledgers == 0 and (info.dir, info.log_id) not in self._damaged:
                try:
                    p.stats.bytes_reclaimed += self._storage.remove_log(info.dir, info.log_id)
                except (CorruptionError, FormatError) as exc:  # its header is damaged: leave it, say so, go on
                    self._damaged.add((info.dir, info.log_id))
                    log.error("bookie %s: entry log %d of dir %d not removed: %s", self._bookie_id, info.log_id,
                              info.dir, exc, extra=context(bookie=self._bookie_id))
                    continue
                p.stats.entry_logs_deleted += 1

    def _compact(self, p: _Pass) -> None:
        now = self._clock()
        kind = p.compact or due_compaction(now, self._last_compaction, self._rules())
        logs = [i for i in self._storage.entry_logs() if (i.dir, i.log_id) not in self._damaged]
        todo = [i for i in logs if i.compacting]
        if kind is not None:
            todo += candidates([i for i in logs if not i.compacting], compaction_rule(self._config, kind).threshold)
        if not todo:
            self._finished(kind, now)
            return
        usage = max(self._disk_usage(d) for d in self._config.ledger_directories)
        forced = p.forced or usage >= self._config.disk_usage_threshold
        reason = suspension(kind or "minor", usage, self._config, forced)
        if reason is not None and kind == "major" and suspension("minor", usage, self._config, forced) is None:
            p.cut_short.append(f"major compaction suspended ({reason}): minor compaction instead")
            kind, reason = "minor", None  # major stays due; minor's logs copy the least
            todo = [i for i in logs if i.compacting]
            todo += candidates([i for i in logs if not i.compacting], compaction_rule(self._config, "minor").threshold)
        if reason is not None:
            self._compaction = f"suspended: {reason}"
            p.cut_short.append(f"compaction suspended: {reason}")
            return
        rule = compaction_rule(self._config, kind or "minor")
        deadline = now + rule.max_time if rule.max_time > 0 else math.inf
        self._compaction = f"running {kind or 'unfinished'}"
        try:
            if self._compact_logs(p, todo, deadline):
                self._finished(kind, now)  # after a fallback: minor's time only, major stays due
        finally:
            self._compaction = "idle"

    def _compact_logs(self, p: _Pass, todo: list[EntryLogInfo], deadline: float) -> bool:
        """Compact ``todo`` in order; False when the pass stopped before the end."""
        for info in todo:
            if not self._fits(info):
                p.cut_short.append(f"entry log {info.log_id} of dir {info.dir} not compacted: "
                                   f"{info.live_bytes} live bytes would not fit in the free space")
                continue
            try:
                out = compact_log(self._storage, info, self._copy_pace, self._by_bytes, deadline,
                                  self._stop.is_set, self._clock)
            except CorruptionError as exc:
                self._damaged.add((info.dir, info.log_id))
                log.error("bookie %s: %s", self._bookie_id, exc, extra=context(bookie=self._bookie_id))
                continue
            p.stats.entries_copied += out.entries
            p.stats.bytes_copied += out.bytes_copied
            if not out.done:
                p.cut_short.append("bookie stopping" if self._stop.is_set()
                                   else "compaction ran out of time; the next pass continues it")
                return False
            p.stats.entry_logs_compacted += 1
            p.stats.bytes_reclaimed += out.bytes_freed
        return True

    def _fits(self, info: EntryLogInfo) -> bool:
        free = self._free_space(self._config.ledger_directories[info.dir])
        return free is None or free >= info.live_bytes + _FREE_MARGIN

    def _finished(self, kind: Kind | None, now: float) -> None:
        if kind is not None:
            self._last_compaction[kind] = now
            self._last_compaction_wall[kind] = time.time()
            if kind == "major":  # a major pass covers every log a minor one would take
                self._last_compaction["minor"] = now
                self._last_compaction_wall["minor"] = time.time()
        self._compaction = "idle"

    def _rules(self) -> dict[Kind, Any]:
        return {"minor": compaction_rule(self._config, "minor"), "major": compaction_rule(self._config, "major")}

    # --- status -------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """What ``walkit bookie gc --status`` prints (JSON-ready)."""
        logs = self._storage.entry_logs()
        total, live = sum(i.total_bytes for i in logs), sum(i.live_bytes for i in logs)
        last = self._last
        with self._cond:
            running, passes, next_in = self._running, self._passes, max(0.0, self._next_pass - self._clock())
        return {
            "bookie": self._bookie_id,
            "metadata": self._metadata is not None,
            "running": running,
            "passes": passes,
            "metadata_unavailable_passes": self._metadata_unavailable_passes,
            "next_pass_in_seconds": round(next_in, 3),
            "last_pass": None if last is None else {
                "number": last.number, "started": _iso(last.started), "seconds": round(last.seconds, 3),
                "forced": last.forced, **dataclasses.asdict(last.stats), "cut_short": last.cut_short,
                "metadata_unavailable": last.metadata_unavailable, "error": last.error,
            },
            "totals": dataclasses.asdict(self._totals),
            "compaction": self._compaction,
            "last_compaction": {k: _iso(v) for k, v in self._last_compaction_wall.items()},
            "entry_logs": {"count": len(logs), "total_bytes": total, "live_bytes": live,
                           "live_fraction": round(live / total, 4) if total else None,
                           "compacting": sum(1 for i in logs if i.compacting)},
            "damaged_entry_logs": sorted(f"{d}:{log_id}" for d, log_id in list(self._damaged)),
            "disk_usage": round(max(self._disk_usage(d) for d in self._config.ledger_directories), 4),
        }
