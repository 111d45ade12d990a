"""Manual recovery of a lost bookie: every closed fragment it held is copied to another
bookie and the ledger's metadata names that bookie instead (``walkit recover``).

Theory of operation
-------------------
Two passes over the ledgers, each streaming (one ledger's metadata at a time, listed
one directory at a time: memory does not grow with the number of ledgers):

1. *count*: the closed ledgers with a fragment naming the bookie, those fragments and
   the entries the bookie held in them (:mod:`walkit.recovery._plan`) - what
   ``--dry-run`` reports, and the totals of the progress bar; open ledgers naming the
   bookie are listed apart: their writer replaces a failed bookie itself, and recovery
   waits until they are closed (a later run takes them);
2. *copy*: per fragment, a target bookie outside its ensemble (``--target`` or chosen
   as an ensemble change chooses); the held entries in chunks; for each entry the first
   registered survivor of its write set is asked (ADMIN ``ledger.replicate``,
   :mod:`bookie._replicate`) to verify its copy and push it to the target, entries it
   lacks or cannot verify go to the next survivor; once every entry of the fragment is
   durable on the target, the fragment's ensemble is changed by CAS (lost bookie out,
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
from typing import Any, Protocol, TypeVar

from walkit.client import BookieClient, Endpoint, client_ssl_context, parse_endpoint
from walkit.errors import (
    BookieUnavailableError,
    InvalidArgumentError,
    NotEnoughBookiesError,
    ReplicasLostError,
    WalkitError,
)
from walkit.metadata import BookieSet, Cluster, LedgerMetadata, connect, read_registration
from walkit.recovery._plan import FragmentWork, choose_target, count_held, held_entries, lost_fragments, sources

__all__ = ["RecoveryReport", "Progress", "recover"]

T = TypeVar("T")
CHUNK = 512  # entries asked of the survivors at once (bookie._replicate.MAX_ENTRIES bounds it)
_ADMIN_TIMEOUT = 180.0


@dataclass
class RecoveryReport:
    bookie: str
    dry_run: bool
    ledgers_scanned: int = 0
    ledgers_affected: int = 0
    fragments: int = 0  # closed fragments naming the bookie
    entries: int = 0  # entries the bookie held in them
    fragments_replaced: int = 0
    entries_copied: int = 0
    open_ledgers: list[int] = field(default_factory=list)  # naming the bookie, left to their writers
    failures: list[dict[str, Any]] = field(default_factory=list)
    targets: dict[str, int] = field(default_factory=dict)  # target -> fragments given to it
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
    """Move everything a *running* bookie holds elsewhere before it is removed: it is
    made read-only (no new ensemble picks it), then recovered as if lost - but it may
    serve its own copies as a last resort; ``removable`` says whether anything still
    names it (open ledgers: run again once their writers closed them)."""
    work = _Recovery(uri, bookie, None, False, tls_ca, progress or _Quiet(), decommission=True)
    return asyncio.run(work.run())


class _Recovery:
    def __init__(self, uri: str, bookie: str, target: str | None, dry_run: bool, tls_ca: str,
                 progress: Progress, decommission: bool = False) -> None:
        self.uri, self.bookie, self.target, self.tls_ca, self.progress = uri, bookie, target, tls_ca, progress
        self.decommission = decommission
        self.report = RecoveryReport(bookie, dry_run)
        self.cluster: Cluster | None = None
        self._clients: dict[str, BookieClient] = {}

    async def run(self) -> RecoveryReport:
        t0 = time.monotonic()
        self.cluster = await _off(connect, self.uri)
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
            for client in self._clients.values():
                await client.close()
            await _off(self.cluster.close)
        self.report.seconds = round(time.monotonic() - t0, 3)
        return self.report

    # --- the two passes -----------------------------------------------------------------
    async def _each(self, visit: Callable[[LedgerMetadata], Awaitable[None]]) -> None:
        assert self.cluster is not None
        ledgers = self.cluster.ledgers
        ids = ledgers.ledger_ids()
        while True:
            ledger_id = await _off(next, ids, None)
            if ledger_id is None:
                return
            try:
                meta, _ = await _off(ledgers.read, ledger_id)
            except WalkitError:  # deleted meanwhile (or unreadable: reported by the copy pass)
                continue
            await visit(meta)

    async def _count(self) -> None:
        r = self.report

        async def visit(meta: LedgerMetadata) -> None:
            r.ledgers_scanned += 1
            works = lost_fragments(meta, self.bookie)
            if not works:
                if any(self.bookie in ensemble for _, ensemble in meta.ensembles):
                    r.open_ledgers.append(meta.ledger_id)
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
        alive = await _off(self.cluster_bookies)
        if self.bookie not in alive.writable | alive.readonly:
            raise BookieUnavailableError("the bookie is not running: use walkit recover for a lost bookie",
                                         bookie=self.bookie)
        client = await self._client(self.bookie)
        await asyncio.wait_for(client.admin("bookie.readonly", {"readonly": True}), _ADMIN_TIMEOUT)

    def cluster_bookies(self) -> BookieSet:
        assert self.cluster is not None
        return self.cluster.bookies()

    # --- one fragment ---------------------------------------------------------------------
    async def _fragment(self, meta: LedgerMetadata, work: FragmentWork) -> None:
        writable = await self._writable()
        target = choose_target(work, meta, writable, self.target)
        endpoint = await self._endpoint(target)
        alive = await self._alive()
        chunk: list[int] = []
        for entry_id in held_entries(work):
            chunk.append(entry_id)
            if len(chunk) == CHUNK:
                await self._chunk(work, chunk, endpoint, alive)
                chunk = []
        if chunk:
            await self._chunk(work, chunk, endpoint, alive)
        await _off(self._replace, work, target)
        self.report.fragments_replaced += 1
        self.report.targets[target] = self.report.targets.get(target, 0) + 1
        self.progress.advance(1, 0)

    async def _chunk(self, work: FragmentWork, entries: list[int], target: Endpoint, alive: set[str]) -> None:
        """Copy ``entries`` to ``target``, each from the first survivor that has it intact."""
        own = [work.lost] if self.decommission else []  # a bookie being decommissioned serves last
        candidates = {e: [b for b in sources(work, e) if b in alive] + own for e in entries}
        while candidates:
            by_source: dict[str, list[int]] = {}
            for e, left in candidates.items():
                if not left:
                    raise ReplicasLostError("no surviving replica holds an intact copy", ledger=work.ledger_id,
                                        entry=e, lost=work.lost)
                by_source.setdefault(left[0], []).append(e)
            answers = await asyncio.gather(*(self._ask(src, work, ids, target) for src, ids in by_source.items()),
                                           return_exceptions=True)
            for (src, ids), answer in zip(by_source.items(), answers):
                if isinstance(answer, BaseException):
                    if not isinstance(answer, WalkitError):
                        raise answer
                    copied: set[int] = set()
                else:
                    if answer.get("failed"):
                        raise BookieUnavailableError("the target refused copies", ledger=work.ledger_id,
                                                     target=f"{target.host}:{target.port}",
                                                     reason=next(iter(answer["failed"].values())))
                    copied = set(answer["copied"])
                for e in ids:
                    if e in copied:
                        del candidates[e]
                    else:
                        candidates[e].remove(src)
                self.report.entries_copied += len(copied)
                self.progress.advance(0, len(copied))

    async def _ask(self, source: str, work: FragmentWork, entries: list[int], target: Endpoint) -> dict[str, Any]:
        client = await self._client(source)
        args = {"ledger": work.ledger_id, "entries": entries, "digest": work.digest,
                "target": f"{target.host}:{target.port}", "tls": target.tls}
        answer: dict[str, Any] = await asyncio.wait_for(client.admin("ledger.replicate", args), _ADMIN_TIMEOUT)
        return answer

    def _replace(self, work: FragmentWork, target: str) -> None:
        assert self.cluster is not None

        def change(current: LedgerMetadata) -> LedgerMetadata | None:
            ensemble = dict(current.ensembles).get(work.first)
            if ensemble is None or work.lost not in ensemble:
                return None  # replaced (or changed) by someone else meanwhile
            return current.replace_bookie(work.first, work.lost, target)

        self.cluster.ledgers.update(work.ledger_id, change)

    # --- bookies --------------------------------------------------------------------------
    async def _writable(self) -> list[str]:
        assert self.cluster is not None
        return sorted((await _off(self.cluster.bookies)).writable - {self.bookie})

    async def _alive(self) -> set[str]:
        assert self.cluster is not None
        bookies = await _off(self.cluster.bookies)
        return set(bookies.writable | bookies.readonly) - {self.bookie}

    async def _check_target(self, target: str) -> None:
        if target == self.bookie:
            raise InvalidArgumentError("the target is the lost bookie", bookie=target)
        if target not in await self._writable():
            raise NotEnoughBookiesError("the target is not a registered writable bookie", target=target)

    async def _endpoint(self, bookie: str) -> Endpoint:
        assert self.cluster is not None
        cluster = self.cluster
        registration = await _off(read_registration, cluster.store, cluster.info, bookie)
        return parse_endpoint(bookie, registration)

    async def _client(self, bookie: str) -> BookieClient:
        client = self._clients.get(bookie)
        if client is not None and not client.failed:
            return client
        endpoint = await self._endpoint(bookie)
        ssl_context = None
        if endpoint.tls:
            if not self.tls_ca:
                raise BookieUnavailableError("bookie serves TLS: give the CA file", bookie=bookie)
            ssl_context = client_ssl_context(self.tls_ca)
        client = await BookieClient.connect(endpoint.host, endpoint.port, ssl_context=ssl_context,
                                            server_hostname=endpoint.host)
        self._clients[bookie] = client
        return client

    def _fail(self, work: FragmentWork, exc: WalkitError) -> None:
        self.report.failures.append({"ledger": work.ledger_id, "first_entry": work.first, "error": str(exc)})


async def _off(fn: Callable[..., T], *args: Any) -> T:
    """A blocking (metadata) call on a worker thread."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
