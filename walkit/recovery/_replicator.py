"""The mechanism every kind of re-replication shares: copy entries of a fragment to a
bookie, and change the fragment's ensemble.

Theory of operation
-------------------
:meth:`Replicator.copy` first picks how the fragment's copies travel
(:func:`walkit.recovery._plan.copy_path`, by the kinds the bookies registered and the
ledger's digest):

- *push*: it asks, for each entry, the first registered survivor of its write set (ADMIN
  ``ledger.replicate``, :mod:`bookie._replicate`) to verify its copy with the ledger's
  master key and push it to the target; entries a survivor lacks or cannot verify go to
  the next one;
- *client copy* (:mod:`walkit.recovery._client_copy`): it reads each entry from a
  survivor of any kind itself, checks it with the ledger's entry codec and writes it to
  the target as a recovery add.

Either way an entry no survivor holds intact raises
:class:`~walkit.errors.ReplicasLostError`, a target that refuses copies
:class:`~walkit.errors.BookieUnavailableError`, and copies are durable on the target
when ``copy`` returns. :meth:`Replicator.replace` then changes the fragment's ensemble
by CAS (a fragment someone already changed is left alone). :meth:`Replicator.present`
asks a bookie which entries of a range it holds (ADMIN ``ledger.entries`` of a walkit
bookie; BookKeeper's GET_LIST_OF_ENTRIES_OF_LEDGER of a Java one, or - its default
DbLedgerStorage does not serve that op and never answers it - a read of each entry),
for copies that went missing on a bookie that is still there. One asyncio loop drives it; metadata calls run
on worker threads; one pipelined connection per bookie, in the bookie's kind (a Java
bookie's in BookKeeper's v3 dialect).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from walkit.client import (
    BkBookieClient,
    BookieClient,
    Endpoint,
    client_ssl_context,
    connect_endpoint,
    parse_endpoint,
    uses_tls,
)
from walkit.errors import (
    BookieTimeoutError,
    BookieUnavailableError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReplicasLostError,
    WalkitError,
)
from walkit.metadata import BookieSet, Cluster, LedgerMetadata, read_registration
from walkit.recovery._client_copy import codec_of, copy_chunk
from walkit.recovery._plan import CopyPath, FragmentWork, copy_path, sources

__all__ = ["Replicator", "CHUNK", "LIST_TIMEOUT", "off"]

T = TypeVar("T")
CHUNK = 512  # entries asked of the survivors at once (bookie._replicate.MAX_ENTRIES bounds it)
_ADMIN_TIMEOUT = 180.0
#: seconds a Java bookie has to answer GET_LIST_OF_ENTRIES_OF_LEDGER (with its default
#: DbLedgerStorage it never does: see Replicator._present_java)
LIST_TIMEOUT = 5.0
_READ_TIMEOUT = 30.0  # seconds for one read of a Java bookie's share


async def off(fn: Callable[..., T], *args: Any) -> T:
    """A blocking (metadata) call on a worker thread."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


class Replicator:
    def __init__(self, cluster: Cluster, tls_ca: str = "") -> None:
        self.cluster = cluster
        self.tls_ca = tls_ca
        self._clients: dict[str, BookieClient] = {}
        self._kinds: dict[str, str] = {}  # bookie -> the kind it registered (an id keeps its kind)
        self._unlisted: set[str] = set()  # Java bookies that do not answer GET_LIST_OF_ENTRIES_OF_LEDGER
        self._connecting = asyncio.Lock()  # one connection per bookie, however many ask at once
        #: fragments copied so far by each path ("push", "client"): what a report tells
        self.paths: dict[str, int] = {}

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    # --- bookies ----------------------------------------------------------------------------
    async def bookies(self) -> BookieSet:
        return await off(self.cluster.bookies)

    async def endpoint(self, bookie: str) -> Endpoint:
        cluster = self.cluster
        return parse_endpoint(bookie, await off(read_registration, cluster.store, cluster.info, bookie),
                              cluster.info.format)

    async def kind(self, bookie: str) -> str:
        """The kind ``bookie`` registered: "walkit", or "bookkeeper" (a Java bookie)."""
        kind = self._kinds.get(bookie)
        if kind is None:
            kind = self._kinds[bookie] = (await self.endpoint(bookie)).kind
        return kind

    async def client(self, bookie: str) -> BookieClient:
        """The connection to ``bookie``, in its kind's protocol (opened once)."""
        client = self._clients.get(bookie)
        if client is not None and not client.failed:
            return client
        async with self._connecting:
            client = self._clients.get(bookie)
            if client is None or client.failed:
                client = self._clients[bookie] = await self._connect(bookie)
        return client

    async def _connect(self, bookie: str) -> BookieClient:
        endpoint = await self.endpoint(bookie)
        self._kinds[bookie] = endpoint.kind
        ssl_context = None
        if uses_tls(endpoint, bool(self.tls_ca)):
            if not self.tls_ca:
                raise BookieUnavailableError("bookie serves TLS: give the CA file", bookie=bookie)
            ssl_context = client_ssl_context(self.tls_ca)
        return await connect_endpoint(endpoint, ssl_context)

    async def admin(self, bookie: str, command: str, args: dict[str, Any]) -> dict[str, Any]:
        client = await self.client(bookie)
        answer: dict[str, Any] = await asyncio.wait_for(client.admin(command, args), _ADMIN_TIMEOUT)
        return answer

    # --- copies -----------------------------------------------------------------------------
    async def copy(self, work: FragmentWork, entries: Iterable[int], target: str, *, last_resort: str | None = None,
                   on_copied: Callable[[int], None] = lambda n: None) -> int:
        """Copy ``entries`` of ``work``'s fragment to ``target`` (see the module
        docstring); ``last_resort`` is asked after every survivor (a bookie being
        decommissioned). Returns how many were copied."""
        live = await self.bookies()
        alive = set(live.writable | live.readonly) - {work.lost}
        path = await self.path(work, target, alive, last_resort)
        copied = 0
        chunk: list[int] = []
        for entry_id in entries:
            chunk.append(entry_id)
            if len(chunk) == CHUNK:
                copied += await self._chunk(path, work, chunk, target, alive, last_resort, on_copied)
                chunk = []
        if chunk:
            copied += await self._chunk(path, work, chunk, target, alive, last_resort, on_copied)
        self.paths[path] = self.paths.get(path, 0) + 1
        return copied

    async def path(self, work: FragmentWork, target: str, alive: set[str], last_resort: str | None = None
                   ) -> CopyPath:
        """How ``work``'s copies travel to ``target`` (:func:`walkit.recovery._plan.copy_path`)."""
        asked = {b for b in work.ensemble if b in alive} | {target} | ({last_resort} if last_resort else set())
        kinds = {b: await self.kind(b) for b in sorted(asked)}
        return copy_path(work, kinds, target, last_resort)

    async def _chunk(self, path: CopyPath, work: FragmentWork, entries: list[int], target: str, alive: set[str],
                     last_resort: str | None, on_copied: Callable[[int], None]) -> int:
        extra = [last_resort] if last_resort else []
        candidates = {e: [b for b in sources(work, e) if b in alive and b != target] + extra for e in entries}
        if path == "client":
            copied = await copy_chunk(self.client, work, codec_of(work), target, candidates)
            on_copied(copied)
            return copied
        return await self._push(work, candidates, await self.endpoint(target), on_copied)

    async def _push(self, work: FragmentWork, candidates: dict[int, list[str]], target: Endpoint,
                    on_copied: Callable[[int], None]) -> int:
        copied_total = 0
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
                copied: set[int] = set()
                if isinstance(answer, BaseException):
                    if not isinstance(answer, WalkitError):
                        raise answer
                else:
                    if answer.get("failed"):
                        raise BookieUnavailableError("the target refused copies", ledger=work.ledger_id,
                                                     target=target_id(target),
                                                     reason=next(iter(answer["failed"].values())))
                    copied = set(answer["copied"])
                for e in ids:
                    if e in copied:
                        del candidates[e]
                    else:
                        candidates[e].remove(src)
                copied_total += len(copied)
                on_copied(len(copied))
        return copied_total

    async def _ask(self, source: str, work: FragmentWork, entries: list[int], target: Endpoint) -> dict[str, Any]:
        return await self.admin(source, "ledger.replicate", {
            "ledger": work.ledger_id, "entries": entries, "digest": work.digest,
            "target": target_id(target), "tls": target.tls})

    async def present(self, bookie: str, ledger_id: int, first: int, last: int) -> set[int]:
        """The entries of ``first..last`` that ``bookie`` holds (none: it has no such ledger)."""
        client = await self.client(bookie)
        if isinstance(client, BkBookieClient):
            return await self._present_java(bookie, client, ledger_id, first, last)
        held: set[int] = set()
        start = first
        while start <= last:
            end = min(last, start + 65535)
            try:
                answer = await self.admin(bookie, "ledger.entries", {"ledger": ledger_id, "first": start, "last": end})
            except NoSuchLedgerError:
                return set()
            held.update(answer["entries"])
            start = end + 1
        return held

    async def _present_java(self, bookie: str, client: BkBookieClient, ledger_id: int, first: int, last: int
                            ) -> set[int]:
        """A Java bookie's share: GET_LIST_OF_ENTRIES_OF_LEDGER, which its
        InterleavedLedgerStorage and SortedLedgerStorage answer; its default
        DbLedgerStorage throws UnsupportedOperationException and answers nothing, so a
        bookie silent for :data:`LIST_TIMEOUT` is asked entry by entry from then on."""
        if bookie not in self._unlisted:
            try:
                listed = await asyncio.wait_for(client.entries_of(ledger_id), LIST_TIMEOUT)
                return {e for e in listed if first <= e <= last}
            except NoSuchLedgerError:
                return set()
            except asyncio.TimeoutError:
                self._unlisted.add(bookie)
        held: set[int] = set()
        for start in range(first, last + 1, CHUNK):
            ids = range(start, min(last, start + CHUNK - 1) + 1)
            answers = await asyncio.gather(*(asyncio.wait_for(client.read_entry(ledger_id, e), _READ_TIMEOUT)
                                             for e in ids), return_exceptions=True)
            for entry_id, answer in zip(ids, answers):
                if isinstance(answer, (NoSuchEntryError, NoSuchLedgerError)):
                    continue
                if isinstance(answer, asyncio.TimeoutError):
                    raise BookieTimeoutError("no answer to a read", bookie=bookie, ledger=ledger_id,
                                             entry=entry_id) from answer
                if isinstance(answer, BaseException):
                    raise answer
                held.add(entry_id)
        return held

    # --- metadata ---------------------------------------------------------------------------
    async def replace(self, work: FragmentWork, target: str) -> None:
        """The fragment names ``target`` instead of the lost bookie (CAS)."""

        def change(current: LedgerMetadata) -> LedgerMetadata | None:
            ensemble = dict(current.ensembles).get(work.first)
            if ensemble is None or work.lost not in ensemble:
                return None  # replaced (or changed) by someone else meanwhile
            return current.replace_bookie(work.first, work.lost, target)

        await off(self.cluster.ledgers.update, work.ledger_id, change)


def target_id(endpoint: Endpoint) -> str:
    return f"{endpoint.host}:{endpoint.port}"
