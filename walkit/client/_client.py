"""``walkit.client.LedgerClient``: the ledger client's public async core.

Theory of operation
-------------------
One client is one metadata session (:func:`walkit.metadata.connect`), one event loop on
a thread of its own (:class:`~walkit.client.LoopThread`) where every connection and
every ledger's state lives, and the :class:`~walkit.client._core.ClientCore` they share
(the bookie pool, placement, the add queue and timeout sweep). Everything built on the
client - the synchronous ``BookKeeper`` and its handles, ``walkit.aio``, the write-ahead
log - goes through this face and nothing else of the client:

* coroutines of the client run on its loop: :meth:`LedgerClient.run` (blocking, from
  any other thread), :meth:`LedgerClient.submit` (a ``concurrent.futures.Future``) and
  :meth:`LedgerClient.on_loop` (awaited from another event loop, no thread of that
  loop's used);
* blocking metadata calls made from the loop run on the client's metadata threads
  (:meth:`LedgerClient.metadata`), never on the loop;
* ledgers are made (:meth:`LedgerClient.create`, or :meth:`LedgerClient.create_now` on
  the caller's thread when nothing need be read) and opened
  (:meth:`LedgerClient.open`) as the loop-side objects the handles wrap
  (:class:`~walkit.client.LedgerWriter`, :class:`~walkit.client.ReadState`).

Closed is final: once :meth:`LedgerClient.close` began, every entry point refuses new
work with UsageError("client is closed") - a coroutine handed in is closed unrun, so
nothing is left half-started - and close itself fails what writers still have in
flight (their outcome is unknown), stops the loop and ends the metadata session, in
that order (the loop's last work may still need the session). Close blocks, so it is
refused on the client's own loop thread (it would wait for itself).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from walkit.client._config import ClientConfig
from walkit.client._core import ClientCore
from walkit.client._entry_codec import EntryCodec, entry_digest_size
from walkit.client._loop import LoopThread
from walkit.client._placement import Placement
from walkit.client._read import LedgerReader
from walkit.client._read_state import ReadState
from walkit.client._recovery import recover
from walkit.client._writer import LedgerWriter
from walkit.errors import InvalidArgumentError, UnauthorizedError, UsageError
from walkit.metadata import Cluster, LedgerManager, LedgerMetadata, LedgerState
from walkit.metadata import connect as connect_metadata

__all__ = ["LedgerClient"]

T = TypeVar("T")


def check_create(ensemble_size: int, write_quorum: int, ack_quorum: int, digest: str, password: bytes,
                 custom_metadata: Mapping[str, bytes] | None) -> dict[str, bytes]:
    """The arguments of a create, checked before anything is chosen; the custom metadata
    as a dict."""
    for name, value in (("ensemble_size", ensemble_size), ("write_quorum", write_quorum), ("ack_quorum", ack_quorum)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidArgumentError("quorum sizes are ints", field=name, value=repr(value))
    if not ensemble_size >= write_quorum >= ack_quorum >= 1:
        raise InvalidArgumentError("quorums must satisfy ensemble_size >= write_quorum >= ack_quorum >= 1",
                                   E=ensemble_size, Qw=write_quorum, Qa=ack_quorum)
    entry_digest_size(digest)  # walkit's digests and BookKeeper's (bk-*)
    if not isinstance(password, bytes):
        raise InvalidArgumentError("password must be bytes", type=type(password).__name__)
    custom = dict(custom_metadata or {})
    for key, raw in custom.items():
        if not isinstance(key, str) or not key or not isinstance(raw, bytes):
            raise InvalidArgumentError("custom metadata maps non-empty str keys to bytes", key=repr(key))
    return custom


class LedgerClient:
    """A client of the walkit cluster at ``metadata_uri`` (``zk://…`` or ``local:///…``):
    its metadata session, its loop thread and the core they share (module docstring)."""

    def __init__(self, metadata_uri: str, config: ClientConfig) -> None:
        self.config = config
        self.metadata_uri = metadata_uri
        #: the metadata session (walkit.metadata.Cluster): store, cluster identity, ledgers, bookies
        self.cluster: Cluster = connect_metadata(metadata_uri, session_timeout=config.session_timeout,
                                                 retry_deadline=config.metadata_retry_deadline,
                                                 read_only=config.metadata_read_only)
        #: the loop every connection and ledger state lives on
        self.loop = LoopThread("walkit-client")
        self._core = ClientCore(config, self.cluster, self.loop)
        self._closed = False

    @property
    def ledgers(self) -> LedgerManager:
        """The ledger manager of the metadata session (blocking calls: off the loop)."""
        return self._core.ledgers

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        """UsageError("client is closed") once :meth:`close` began."""
        if self._closed:
            raise UsageError("client is closed")

    # -- running on the loop ---------------------------------------------------------------
    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """(Blocking; never from the client's loop) run ``coro`` on the loop, its result."""
        if self._closed:
            coro.close()
            raise UsageError("client is closed")
        return self.loop.run(coro, timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; its future (UsageError, ``coro`` closed, when the
        client is closed)."""
        if self._closed:
            coro.close()
            raise UsageError("client is closed")
        return self.loop.submit(coro)

    async def on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """(From another event loop) run ``coro`` on the client's loop and await it here,
        no thread of the caller's loop used. UsageError when the client is (or gets)
        closed; cancelling the caller cancels ``coro``."""
        if self._closed:
            coro.close()
            raise UsageError("client is closed")
        try:
            return await asyncio.wrap_future(self.loop.submit(coro))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller was cancelled (and the coroutine with it)
            raise UsageError("client closed while the call ran") from None

    async def metadata(self, fn: Callable[..., T], *args: object) -> T:
        """(Client loop) the blocking metadata call ``fn(*args)``, run on one of the
        client's metadata threads."""
        return await self._core.md(fn, *args)

    # -- ledgers ---------------------------------------------------------------------------
    async def create(self, ensemble_size: int, write_quorum: int, ack_quorum: int, digest: str, password: bytes,
                     custom_metadata: Mapping[str, bytes] | None) -> LedgerWriter:
        """(Client loop) a new ledger on ``ensemble_size`` writable bookies, its writer."""
        custom = check_create(ensemble_size, write_quorum, ack_quorum, digest, password, custom_metadata)
        core = self._core
        ensemble = await core.choose_bookies(Placement.new_ledger(ensemble_size, write_quorum, ack_quorum))
        meta = await core.md(self._store_new, ensemble, write_quorum, ack_quorum, digest, password, custom)
        return LedgerWriter(core, meta, 0, EntryCodec.of(digest, password))

    def create_now(self, ensemble_size: int, write_quorum: int, ack_quorum: int, digest: str, password: bytes,
                   custom_metadata: Mapping[str, bytes] | None) -> LedgerWriter:
        """(Blocking; never from the client's loop) :meth:`create`. When the bookie list
        is fresh and the chosen bookies' endpoints known, on this thread: no hop through
        the loop and a metadata thread (docs/performance.md); otherwise through :meth:`run`."""
        self.check_open()
        custom = check_create(ensemble_size, write_quorum, ack_quorum, digest, password, custom_metadata)
        ensemble = self._core.bookies_now(ensemble_size)
        if ensemble is None:  # the bookie list or an endpoint must be read first: on the client's loop
            return self.run(self.create(ensemble_size, write_quorum, ack_quorum, digest, password, custom_metadata))
        meta = self._store_new(ensemble, write_quorum, ack_quorum, digest, password, custom)
        return LedgerWriter(self._core, meta, 0, EntryCodec.of(digest, password))

    def _store_new(self, ensemble: list[str], write_quorum: int, ack_quorum: int, digest: str, password: bytes,
                   custom: Mapping[str, bytes] | None) -> LedgerMetadata:
        """(Blocking) a new ledger's metadata, stored."""
        ledgers = self._core.ledgers
        meta = LedgerMetadata.create(
            ledgers.new_ledger_id(), tuple(ensemble), write_quorum=write_quorum, ack_quorum=ack_quorum,
            password=password, ctime=int(time.time() * 1000), digest=digest, custom=custom)
        ledgers.create(meta)
        return meta

    async def open(self, ledger_id: int, password: bytes, recovery: bool) -> ReadState:
        """(Client loop) a reader's state of ``ledger_id``. With ``recovery`` an unclosed
        ledger is fenced, recovered and closed first; without, it is read up to the LAC."""
        core = self._core
        if not isinstance(ledger_id, int) or ledger_id < 0:
            raise InvalidArgumentError("ledger id must be an int >= 0", ledger=ledger_id)
        if not isinstance(password, bytes):
            raise InvalidArgumentError("password must be bytes", type=type(password).__name__)
        meta, version = await core.md(core.ledgers.read, ledger_id)
        check = meta.check_password  # version 1's is PBKDF2 (milliseconds): off the loop; later ones a MAC
        if not (check(password) if meta.format_version > 1 else await core.md(check, password)):
            raise UnauthorizedError("wrong password for ledger", ledger=ledger_id)
        codec = EntryCodec.of(meta.digest, password)
        if recovery and meta.state is not LedgerState.CLOSED:
            meta, version = await recover(core, ledger_id, codec)
        reader = LedgerReader(core, meta, codec)
        state = ReadState(reader, version, meta.last_entry_id)
        if meta.state is not LedgerState.CLOSED:
            state.lac = await reader.read_lac()
        return state

    def read_state(self, meta: LedgerMetadata, codec: EntryCodec, version: int = 0,
                   lac: int | None = None) -> ReadState:
        """A reader's state over a ledger the caller writes (its writer's ``meta``,
        ``codec``, metadata ``version`` and ``lac``; ``lac`` None: the metadata's last entry)."""
        return ReadState(LedgerReader(self._core, meta, codec), version, meta.last_entry_id if lac is None else lac)

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Close connections and the metadata session (module docstring); again: nothing."""
        if self._closed:
            return
        if self.loop.in_loop():
            raise UsageError("close() blocks: not from the client's loop thread")
        self._closed = True
        try:
            self.loop.run(self._core.close(), timeout=30)
        finally:
            self.loop.stop()
            self.cluster.close()
