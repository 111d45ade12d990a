"""Autorecovery: an auditor that finds missing copies, workers that put them back.

Theory of operation
-------------------
Every autorecovery daemon (in a bookie with ``autoRecoveryDaemonEnabled``, or
``walkit autorecovery run``) is an auditor candidate and a replication worker, on one
thread with one asyncio loop and one metadata session.

*Auditor* (exactly one per cluster: the seat, :mod:`walkit.metadata._underreplication`). Every
second it compares the bookies named by ledgers and seen before with the available ones
(writable or read-only). A bookie gone for ``lostBookieRecoveryDelay`` seconds (the
configured value; in a BookKeeper-format cluster the cluster's shared one, which
BookieShell sets, :meth:`UnderReplication.lost_bookie_recovery_delay`) - it did
not come back meanwhile, which would have cancelled it - is audited: one streaming pass
over the ledgers marks each ledger whose ensembles name it as under-replicated with that
bookie. The same pass runs every ``auditorPeriodicBookieCheckInterval`` (and at the start
of a term), so bookies lost while nobody audited are found too. Every
``auditorPeriodicCheckInterval`` a deeper check asks each available bookie of each closed
fragment which of its entries it stores (ADMIN ``ledger.entries``; a Java bookie, BookKeeper's
GET_LIST_OF_ENTRIES_OF_LEDGER): a bookie lacking some
(e.g. entries acknowledged by Qa bookies whose last write went nowhere before an
ensemble change) is marked too.

*Worker*. It takes markers one at a time under their lock (a dead worker's lock goes
with its session), in random order, skipping those in back-off. For a marked ledger:
gone from metadata - the marker is dropped (never retried forever); else, per marked
bookie and fragment naming it (every fragment but the last, live one of an open ledger,
:mod:`walkit.recovery._plan`): if the bookie is available again, only the entries it
lacks are copied back to it (a bookie that came back is not re-replicated wholesale);
if not, everything it held is copied to a new bookie and the fragment's ensemble changed
(:class:`~walkit.recovery._replicator.Replicator`). Then the marker is completed (kept
if the auditor added a bookie meanwhile) - unless a lost bookie is still in the last
fragment of an open ledger: that share is its writer's (an ensemble change replaces the
bookie), so the marker stays and the ledger is looked at again after
``openLedgerRereplicationGracePeriod``. A failure unlocks it with an exponential
back-off (1 s doubling to 5 min).

``underreplication/disable`` idles both (``walkit autorecovery disable``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from walkit.errors import NoSuchLedgerError, WalkitError
from walkit.logs import context
from walkit.metadata import RETRY_DEADLINE, Cluster, LedgerMetadata, Marker, UnderReplication, connect
from walkit.recovery._plan import choose_target, held_by_writer, held_entries, lost_fragments
from walkit.recovery._replicator import Replicator, off

__all__ = ["AutoRecovery", "AutoRecoveryConfig"]

log = logging.getLogger("walkit.autorecovery")

_TICK = 1.0  # seconds between the auditor's looks and the worker's scans
_BACKOFF = (1.0, 300.0)


@dataclass(frozen=True)
class AutoRecoveryConfig:
    """BookKeeper's keys (and defaults) for autorecovery, in seconds."""

    lost_bookie_recovery_delay: float = 0.0  # lostBookieRecoveryDelay
    auditor_periodic_check_interval: float = 604800.0  # auditorPeriodicCheckInterval (<= 0: off)
    auditor_periodic_bookie_check_interval: float = 86400.0  # auditorPeriodicBookieCheckInterval
    open_ledger_rereplication_grace_period: float = 30.0  # openLedgerRereplicationGracePeriod (ms there)


class AutoRecovery:
    """One daemon: ``start()``, ``stop()``. ``owner`` names it in the seat and the locks;
    its metadata calls give up after ``retry_deadline`` seconds (and are tried again)."""

    def __init__(self, uri: str, owner: str, config: AutoRecoveryConfig = AutoRecoveryConfig(), *,
                 session_timeout: float = 10.0, retry_deadline: float = RETRY_DEADLINE, tls_ca: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.uri, self.owner, self.config = uri, owner, config
        self._session_timeout, self._retry_deadline = session_timeout, retry_deadline
        self._tls_ca, self._clock = tls_ca, clock
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self.error: BaseException | None = None
        #: Counters for tests and status: ledgers marked, repaired, dropped; audits run.
        self.marked = self.repaired = self.dropped = self.audits = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="walkit-autorecovery", daemon=True)
        self._thread.start()
        self._ready.wait(30)

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(60)
            self._thread = None

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported; the daemon is best effort
            self.error = exc
            log.exception("autorecovery %s stopped on an error", self.owner, extra=context(daemon=self.owner))
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        cluster = await off(lambda: connect(self.uri, session_timeout=self._session_timeout,
                                            retry_deadline=self._retry_deadline))
        replicator = Replicator(cluster, self._tls_ca)
        self._ready.set()
        try:
            await asyncio.gather(_Auditor(self, cluster, replicator).run(), _Worker(self, cluster, replicator).run())
        finally:
            await off(UnderReplication(cluster.store, cluster.info).leave_seat)
            await replicator.close()
            await off(cluster.close)

    def now(self) -> float:
        """The daemon's clock (``clock``: ``time.monotonic`` unless a test gave its own),
        which the auditor's delays and intervals and the worker's back-offs are timed by."""
        return self._clock()

    async def sleep(self, seconds: float) -> bool:
        """Wait (True: stopping)."""
        assert self._stopped is not None
        try:
            await asyncio.wait_for(self._stopped.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return self._stopped.is_set()


class _Auditor:
    def __init__(self, daemon: AutoRecovery, cluster: Cluster, replicator: Replicator) -> None:
        self.d, self.cluster, self.replicator = daemon, cluster, replicator
        self.markers = UnderReplication(cluster.store, cluster.info)
        self.known: set[str] = set()
        self.gone_since: dict[str, float] = {}
        self.audited: set[str] = set()
        self.seated = False
        self.last_bookie_audit = -1e18
        self.last_check = daemon.now()

    async def run(self) -> None:
        while not await self.d.sleep(_TICK):
            try:
                await self._tick()
            except WalkitError as exc:
                log.warning("auditor %s: %s (next look in %.0f s)", self.d.owner, exc, _TICK,
                            extra=context(daemon=self.d.owner))

    async def _tick(self) -> None:
        seated = await off(self.markers.take_seat, self.d.owner)
        if seated != self.seated:
            log.info("autorecovery %s %s the auditor", self.d.owner, "is now" if seated else "is no longer",
                     extra=context(daemon=self.d.owner))
            self.seated, self.last_bookie_audit = seated, -1e18  # a new term audits at once
        if not seated or await off(self.markers.disabled):
            return
        delay = await off(self.markers.lost_bookie_recovery_delay, self.d.config.lost_bookie_recovery_delay)
        now = self.d.now()
        bookies = await self.replicator.bookies()
        available = set(bookies.writable | bookies.readonly)
        self._track(available, now)
        due = {b for b, t in self.gone_since.items() if now - t >= delay}
        periodic = now - self.last_bookie_audit >= self.d.config.auditor_periodic_bookie_check_interval
        if due - self.audited or periodic:
            await self._audit_bookies(available, due, now)
        interval = self.d.config.auditor_periodic_check_interval
        if interval > 0 and now - self.last_check >= interval:
            await self._check_copies(available)
            self.last_check = now

    def _track(self, available: set[str], now: float) -> None:
        for bookie in available:
            if self.gone_since.pop(bookie, None) is not None:
                log.info("auditor: bookie %s is back", bookie, extra=context(daemon=self.d.owner, bookie=bookie))
            self.audited.discard(bookie)
        self.known |= available
        for bookie in self.known - available:
            self.gone_since.setdefault(bookie, now)

    async def _audit_bookies(self, available: set[str], due: set[str], now: float) -> None:
        """Mark every ledger naming a bookie gone for the delay (learning, on the way,
        the bookies ledgers name that were never seen up)."""
        self.d.audits += 1
        ids = self.cluster.ledgers.ledger_ids()
        marked = 0
        while True:
            ledger_id = await off(next, ids, None)
            if ledger_id is None:
                break
            try:
                meta, _ = await off(self.cluster.ledgers.read, ledger_id)
            except NoSuchLedgerError:
                continue
            named = {b for _, ensemble in meta.ensembles for b in ensemble}
            for bookie in named - available - self.known:
                self.known.add(bookie)
                self.gone_since.setdefault(bookie, now)
            lost = named & due
            if lost:
                await off(self.markers.mark, ledger_id, lost)
                marked += 1
        self.audited |= due
        self.last_bookie_audit = now
        self.d.marked += marked
        if marked:
            log.info("auditor: %d ledgers marked under-replicated (lost bookies: %s)", marked, ", ".join(sorted(due)),
                     extra=context(daemon=self.d.owner))

    async def _check_copies(self, available: set[str]) -> None:
        """The deeper check: each available bookie of each fragment (but an open ledger's
        last) holds its share."""
        ids = self.cluster.ledgers.ledger_ids()
        while True:
            ledger_id = await off(next, ids, None)
            if ledger_id is None:
                return
            try:
                meta, _ = await off(self.cluster.ledgers.read, ledger_id)
            except NoSuchLedgerError:
                continue
            lacking = await self._lacking(meta, available)
            if lacking:
                await off(self.markers.mark, ledger_id, lacking)
                self.d.marked += 1

    async def _lacking(self, meta: LedgerMetadata, available: set[str]) -> set[str]:
        lacking: set[str] = set()
        for bookie in {b for _, ensemble in meta.ensembles for b in ensemble} & available:
            for work in lost_fragments(meta, bookie):
                if work.last < work.first:
                    continue
                try:
                    held = await self.replicator.present(bookie, meta.ledger_id, work.first, work.last)
                except WalkitError:
                    continue  # unreachable now: the bookie audit takes it if it stays away
                if any(e not in held for e in held_entries(work)):
                    lacking.add(bookie)
        return lacking


class _Worker:
    def __init__(self, daemon: AutoRecovery, cluster: Cluster, replicator: Replicator) -> None:
        self.d, self.cluster, self.replicator = daemon, cluster, replicator
        self.markers = UnderReplication(cluster.store, cluster.info)
        self.not_before: dict[int, float] = {}
        self.failures: dict[int, int] = {}

    async def run(self) -> None:
        while not await self.d.sleep(_TICK * random.uniform(0.5, 1.0)):
            try:
                if await off(self.markers.disabled):
                    continue
                ledgers = await off(self.markers.ledgers)
                random.shuffle(ledgers)
                for ledger_id in ledgers:
                    if self.d.now() >= self.not_before.get(ledger_id, 0.0):
                        await self._take(ledger_id)
            except WalkitError as exc:
                log.warning("replication worker %s: %s", self.d.owner, exc, extra=context(daemon=self.d.owner))

    async def _take(self, ledger_id: int) -> None:
        if not await off(self.markers.lock, ledger_id, self.d.owner):
            return
        try:
            marker = await off(self.markers.read, ledger_id)
            if marker is None:  # completed meanwhile (a BookKeeper lock outlives its mark: let it go)
                await off(self.markers.unlock, ledger_id)
                return
            done = await self._repair(marker)
        except WalkitError as exc:
            n = self.failures[ledger_id] = self.failures.get(ledger_id, 0) + 1
            delay = min(_BACKOFF[1], _BACKOFF[0] * 2 ** (n - 1))
            self.not_before[ledger_id] = self.d.now() + delay
            log.warning("replication worker %s: ledger %d not repaired (%s); again in %.0f s", self.d.owner,
                        ledger_id, exc, delay, extra=context(daemon=self.d.owner, ledger=ledger_id))
            await off(self.markers.unlock, ledger_id)
            return
        if done:
            self.failures.pop(ledger_id, None)
            self.not_before.pop(ledger_id, None)
        else:
            await off(self.markers.unlock, ledger_id)

    async def _repair(self, marker: Marker) -> bool:
        """True once the marker is gone (repaired, or its ledger is); False to look again later."""
        ledger_id = marker.ledger_id
        try:
            meta, _ = await off(self.cluster.ledgers.read, ledger_id)
        except NoSuchLedgerError:
            await off(self.markers.drop, ledger_id)
            self.d.dropped += 1
            log.info("replication worker %s: ledger %d is gone, its marker dropped", self.d.owner, ledger_id,
                     extra=context(daemon=self.d.owner, ledger=ledger_id))
            return True
        bookies = await self.replicator.bookies()
        available = set(bookies.writable | bookies.readonly)
        for bookie in sorted(marker.bookies):
            for work in lost_fragments(meta, bookie):
                if bookie in available:  # back (or never gone): only what it lacks
                    held = await self.replicator.present(bookie, ledger_id, work.first, work.last) \
                        if work.last >= work.first else set()
                    missing = [e for e in held_entries(work) if e not in held]
                    if missing:
                        await self.replicator.copy(work, missing, bookie)
                else:
                    target = choose_target(work, meta, sorted(bookies.writable), None)
                    await self.replicator.copy(work, held_entries(work), target)
                    await self.replicator.replace(work, target)
        if any(held_by_writer(meta, b) for b in marker.bookies - available):
            self.not_before[ledger_id] = self.d.now() + self.d.config.open_ledger_rereplication_grace_period
            return False  # the writer's share: looked at again after the grace period
        if await off(self.markers.complete, marker):
            self.d.repaired += 1
            log.info("replication worker %s: ledger %d repaired (%s)", self.d.owner, ledger_id,
                     ", ".join(sorted(marker.bookies)), extra=context(daemon=self.d.owner, ledger=ledger_id))
            return True
        return False
