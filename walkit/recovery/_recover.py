"""Manual recovery of a lost bookie: every fragment it held (but the last, live one of
an open ledger) is copied to another bookie and the ledger's metadata names that bookie
instead (``walkit recover``).

Theory of operation
-------------------
Two passes over the ledgers, each streaming (one ledger's metadata at a time, listed
one directory at a time: memory does not grow with the number of ledgers):

1. *count*: the ledgers with a fragment naming the bookie, those fragments and the
   entries the bookie held in them (:mod:`walkit.recovery._plan`) - what ``--dry-run``
   reports, and the totals of the progress bar. The last fragment of an open ledger is
   its writer's (it replaces a failed bookie itself, with an ensemble change); ledgers
   whose last fragment still names the bookie are listed apart (``open_ledgers``) and
   a later run, once they are closed or changed, takes that fragment;
2. *copy*: per fragment, a target bookie outside its ensemble (``--target`` or chosen
   as an ensemble change chooses); the held entries in chunks; for each entry the first
   registered survivor of its write set is asked (ADMIN ``ledger.replicate``,
   :mod:`bookie._replicate`) to verify its copy and push it to the target, or - a Java
   bookie at either end, or a ``bk-hmac`` ledger - this process reads, verifies and
   writes it itself (:mod:`walkit.recovery._client_copy`); entries a survivor lacks or
   that fail their check come from the next survivor; once every entry of the fragment
   is durable on the target, the fragment's ensemble is changed by CAS (lost bookie out,
   target in; a fragment someone already changed is left as it is).

Resumable by construction: a run stopped anywhere leaves every fragment either still
naming the lost bookie (copied again by the next run, the same bytes: harmless) or
replaced; the next run does only what is left. An entry no survivor holds makes its
fragment fail (reported; the metadata still names the lost bookie), never a partial
replacement.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from walkit.errors import BookieUnavailableError, InvalidArgumentError, NotEnoughBookiesError, WalkitError
from walkit.metadata import Cluster, LedgerMetadata, connect
from walkit.recovery._plan import (
    FragmentWork,
    choose_target,
    count_held,
    held_by_writer,
    held_entries,
    lost_fragments,
)
from walkit.recovery._replicator import Replicator, off

__all__ = ["RecoveryReport", "Progress", "recover"]



@dataclass
class RecoveryReport:
    bookie: str
    dry_run: bool
    ledgers_scanned: int = 0
    ledgers_affected: int = 0
    fragments: int = 0  # fragments naming the bookie (but open ledgers' last ones)
    entries: int = 0  # entries the bookie held in them
    fragments_replaced: int = 0
    entries_copied: int = 0
    open_ledgers: list[int] = field(default_factory=list)  # the last fragment names it: left to its writer
    failures: list[dict[str, Any]] = field(default_factory=list)
    targets: dict[str, int] = field(default_factory=dict)  # target -> fragments given to it
    #: fragments copied by each path: "push" (by a walkit bookie), "client" (by this run)
    copy_paths: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    #: Decommission: nothing names the bookie any more (it can be stopped and removed).
    removable: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Progress(Protocol):
    """Told the totals once counted, then what was done (the CLI draws a bar)."""

    def start(self, fragments: int, entries: int) -> None: ...

    def advance(self, fragments: int, entries: int) -> None: ...


class _Quiet:
    def start(self, fragments: int, entries: int) -> None:
        return None

    def advance(self, fragments: int, entries: int) -> None:
        return None


def recover(uri: str, bookie: str, *, target: str | None = None, dry_run: bool = False, tls_ca: str = "",
            progress: Progress | None = None) -> RecoveryReport:
    """Recover what ``bookie`` held (see the module docstring); never raises for one
    fragment's failure (see ``failures``), raises for a cluster it cannot use."""
    return asyncio.run(_Recovery(uri, bookie, target, dry_run, tls_ca, progress or _Quiet()).run())


def decommission(uri: str, bookie: str, *, tls_ca: str = "", progress: Progress | None = None) -> RecoveryReport:
    """Move everything a *running* walkit bookie holds elsewhere before it is removed: it
    is made read-only (no new ensemble picks it), then recovered as if lost - but it may
    serve its own copies as a last resort; ``removable`` says whether anything still
    names it (open ledgers: run again once their writers closed them). A Java bookie is
    refused (InvalidArgumentError): walkit cannot make it read-only."""
    work = _Recovery(uri, bookie, None, False, tls_ca, progress or _Quiet(), decommission=True)
    return asyncio.run(work.run())


class _Recovery:
    def __init__(self, uri: str, bookie: str, target: str | None, dry_run: bool, tls_ca: str,
                 progress: Progress, decommission: bool = False) -> None:
        self.uri, self.bookie, self.target, self.tls_ca, self.progress = uri, bookie, target, tls_ca, progress
        self.decommission = decommission
        self.report = RecoveryReport(bookie, dry_run)
        self.cluster: Cluster | None = None
        self.replicator: Replicator | None = None

    async def run(self) -> RecoveryReport:
        t0 = time.monotonic()
        self.cluster = await off(lambda: connect(self.uri, read_only=self.report.dry_run))  # a dry run only reads
        self.replicator = Replicator(self.cluster, self.tls_ca)
        try:
            if self.target is not None:
                await self._check_target(self.target)
            if self.decommission:
                await self._set_readonly()
            await self._count()
            if not self.report.dry_run:
                self.progress.start(self.report.fragments, self.report.entries)
                await self._copy()
            if self.decommission:
                self.report.open_ledgers = []
                await self._each(self._still_named)
                self.report.removable = not self.report.open_ledgers and not self.report.failures
        finally:
            self.report.copy_paths = dict(self.replicator.paths)
            await self.replicator.close()
            await off(self.cluster.close)
        self.report.seconds = round(time.monotonic() - t0, 3)
        return self.report

    # --- the two passes -----------------------------------------------------------------
    async def _each(self, visit: Callable[[LedgerMetadata], Awaitable[None]]) -> None:
        assert self.cluster is not None
        ledgers = self.cluster.ledgers
        ids = ledgers.ledger_ids()
        while True:
            ledger_id = await off(next, ids, None)
            if ledger_id is None:
                return
            try:
                meta, _ = await off(ledgers.read, ledger_id)
            except WalkitError:  # deleted meanwhile
                continue
            await visit(meta)

    async def _count(self) -> None:
        r = self.report

        async def visit(meta: LedgerMetadata) -> None:
            r.ledgers_scanned += 1
            if held_by_writer(meta, self.bookie):
                r.open_ledgers.append(meta.ledger_id)
            works = lost_fragments(meta, self.bookie)
            if not works:
                return
            r.ledgers_affected += 1
            r.fragments += len(works)
            r.entries += sum(count_held(w) for w in works)
            if r.dry_run:
                writable = await self._writable()
                for work in works:
                    try:
                        chosen = choose_target(work, meta, writable, self.target)
                        r.targets[chosen] = r.targets.get(chosen, 0) + 1
                    except NotEnoughBookiesError as exc:
                        self._fail(work, exc)

        await self._each(visit)

    async def _copy(self) -> None:
        async def visit(meta: LedgerMetadata) -> None:
            for work in lost_fragments(meta, self.bookie):
                try:
                    await self._fragment(meta, work)
                except WalkitError as exc:
                    self._fail(work, exc)

        await self._each(visit)

    async def _still_named(self, meta: LedgerMetadata) -> None:
        if any(self.bookie in ensemble for _, ensemble in meta.ensembles):
            self.report.open_ledgers.append(meta.ledger_id)

    async def _set_readonly(self) -> None:
        assert self.replicator is not None
        alive = await self.replicator.bookies()
        if self.bookie not in alive.writable | alive.readonly:
            raise BookieUnavailableError("the bookie is not running: use walkit recover for a lost bookie",
                                         bookie=self.bookie)
        if await self.replicator.kind(self.bookie) != "walkit":
            raise InvalidArgumentError(
                "walkit decommissions only walkit bookies: a Java bookie has no ADMIN op to make it read-only, and "
                "without that new ensembles keep landing on it while it is emptied. Stop it and run walkit recover "
                "for it (every fragment is copied from its other replicas), or use BookKeeper's decommissionbookie",
                bookie=self.bookie)
        await self.replicator.admin(self.bookie, "bookie.readonly", {"readonly": True})

    # --- one fragment ---------------------------------------------------------------------
    async def _fragment(self, meta: LedgerMetadata, work: FragmentWork) -> None:
        assert self.replicator is not None
        target = choose_target(work, meta, await self._writable(), self.target)

        def copied(n: int) -> None:
            self.report.entries_copied += n
            self.progress.advance(0, n)

        await self.replicator.copy(work, held_entries(work), target,
                                   last_resort=work.lost if self.decommission else None, on_copied=copied)
        await self.replicator.replace(work, target)
        self.report.fragments_replaced += 1
        self.report.targets[target] = self.report.targets.get(target, 0) + 1
        self.progress.advance(1, 0)

    async def _writable(self) -> list[str]:
        assert self.replicator is not None
        return sorted((await self.replicator.bookies()).writable - {self.bookie})

    async def _check_target(self, target: str) -> None:
        if target == self.bookie:
            raise InvalidArgumentError("the target is the lost bookie", bookie=target)
        if target not in await self._writable():
            raise NotEnoughBookiesError("the target is not a registered writable bookie", target=target)

    def _fail(self, work: FragmentWork, exc: WalkitError) -> None:
        self.report.failures.append({"ledger": work.ledger_id, "first_entry": work.first, "error": str(exc)})
