"""``walkit.BookKeeper``: the ledger client (synchronous, thread-safe).

One client = one metadata session (:func:`walkit.metadata.connect`), one event loop on a
thread of its own where every connection and every handle's state lives, and one pooled
connection per bookie. The asyncio flavour (``walkit.aio``) wraps the same core.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

from walkit.client._config import ClientConfig
from walkit.client._core import ClientCore
from walkit.client._handles import LedgerHandle, ReadHandle, ReadState
from walkit.client._loop import LoopThread
from walkit.client._placement import Placement
from walkit.client._read import LedgerReader
from walkit.client._recovery import recover
from walkit.client._writer import LedgerWriter
from walkit.errors import InvalidArgumentError, UnauthorizedError, UsageError
from walkit.metadata import LedgerMetadata, LedgerState
from walkit.metadata import connect as connect_metadata
from walkit.protocol import digest_size, master_key

__all__ = ["BookKeeper", "connect"]

T = TypeVar("T")


def _check_create(ensemble_size: int, write_quorum: int, ack_quorum: int, digest: str, password: bytes,
                  custom_metadata: Mapping[str, bytes] | None) -> dict[str, bytes]:
    for name, value in (("ensemble_size", ensemble_size), ("write_quorum", write_quorum), ("ack_quorum", ack_quorum)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidArgumentError("quorum sizes are ints", field=name, value=repr(value))
    if not ensemble_size >= write_quorum >= ack_quorum >= 1:
        raise InvalidArgumentError("quorums must satisfy ensemble_size >= write_quorum >= ack_quorum >= 1",
                                   E=ensemble_size, Qw=write_quorum, Qa=ack_quorum)
    digest_size(digest)
    if not isinstance(password, bytes):
        raise InvalidArgumentError("password must be bytes", type=type(password).__name__)
    custom = dict(custom_metadata or {})
    for key, raw in custom.items():
        if not isinstance(key, str) or not key or not isinstance(raw, bytes):
            raise InvalidArgumentError("custom metadata maps non-empty str keys to bytes", key=repr(key))
    return custom


class BookKeeper:
    """A client of the walkit cluster at ``metadata_uri`` (``zk://…`` or ``local:///…``).
    Options are :class:`ClientConfig`'s fields."""

    def __init__(self, metadata_uri: str, *, config: ClientConfig | None = None, **options: Any) -> None:
        self.config = ClientConfig.of(config, options)
        self.metadata_uri = metadata_uri
        self._cluster = connect_metadata(metadata_uri, session_timeout=self.config.session_timeout,
                                         retry_deadline=self.config.metadata_retry_deadline,
                                         read_only=self.config.metadata_read_only)
        self._loop = LoopThread("walkit-client")
        self._core = ClientCore(self.config, self._cluster, self._loop)
        self._closed = False

    # -- ledgers ---------------------------------------------------------------------------
    def create_ledger(self, ensemble_size: int = 3, write_quorum: int = 3, ack_quorum: int = 2,
                      digest: str = "crc32c", password: bytes = b"",
                      custom_metadata: Mapping[str, bytes] | None = None) -> LedgerHandle:
        """A new ledger on ``ensemble_size`` writable bookies, open for adds."""
        self._check_open()
        custom = _check_create(ensemble_size, write_quorum, ack_quorum, digest, password, custom_metadata)
        ensemble = self._core.bookies_now(ensemble_size)
        if ensemble is None:  # the bookie list or an endpoint must be read first: on the client's loop
            return LedgerHandle(self, self._run(self._create(ensemble_size, write_quorum, ack_quorum, digest,
                                                             password, custom_metadata)))
        # all known: on this thread, no hop through the loop and a metadata thread (docs/performance.md)
        meta = self._store_new(ensemble, write_quorum, ack_quorum, digest, password, custom)
        return LedgerHandle(self, LedgerWriter(self._core, meta, 0, master_key(password)))

    async def _create(self, ensemble_size: int, write_quorum: int, ack_quorum: int, digest: str, password: bytes,
                      custom_metadata: Mapping[str, bytes] | None) -> LedgerWriter:
        custom = _check_create(ensemble_size, write_quorum, ack_quorum, digest, password, custom_metadata)
        core = self._core
        ensemble = await core.choose_bookies(Placement.new_ledger(ensemble_size, write_quorum, ack_quorum))
        meta = await core.md(self._store_new, ensemble, write_quorum, ack_quorum, digest, password, custom)
        return LedgerWriter(core, meta, 0, master_key(password))

    def _store_new(self, ensemble: list[str], write_quorum: int, ack_quorum: int, digest: str, password: bytes,
                   custom: Mapping[str, bytes] | None) -> LedgerMetadata:
        """(Blocking) a new ledger's metadata, stored."""
        core = self._core
        meta = LedgerMetadata.create(
            core.ledgers.new_ledger_id(), tuple(ensemble), write_quorum=write_quorum, ack_quorum=ack_quorum,
            password=password, ctime=int(time.time() * 1000), digest=digest, custom=custom)
        core.ledgers.create(meta)
        return meta

    def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> ReadHandle:
        """A reader of ``ledger_id``. With ``recovery`` an unclosed ledger is fenced,
        recovered and closed first (its writer can add no more); without, it is read up
        to the LAC while its writer goes on."""
        return ReadHandle(self, self._run(self._open(ledger_id, password, recovery)))

    async def _open(self, ledger_id: int, password: bytes, recovery: bool) -> ReadState:
        core = self._core
        if not isinstance(ledger_id, int) or ledger_id < 0:
            raise InvalidArgumentError("ledger id must be an int >= 0", ledger=ledger_id)
        if not isinstance(password, bytes):
            raise InvalidArgumentError("password must be bytes", type=type(password).__name__)
        meta, version = await core.md(core.ledgers.read, ledger_id)
        check = meta.check_password  # version 1's is PBKDF2 (milliseconds): off the loop; later ones a MAC
        if not (check(password) if meta.format_version > 1 else await core.md(check, password)):
            raise UnauthorizedError("wrong password for ledger", ledger=ledger_id)
        key = master_key(password)
        if recovery and meta.state is not LedgerState.CLOSED:
            meta, version = await recover(core, ledger_id, key)
        reader = LedgerReader(core, meta, key)
        state = ReadState(reader, version, meta.last_entry_id)
        if meta.state is not LedgerState.CLOSED:
            state.lac = await reader.read_lac()
        return state

    def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's metadata; bookies reclaim its space later (GC).
        NoSuchLedgerError when there is no such ledger."""
        self._check_open()
        self._core.ledgers.delete(ledger_id)

    def list_ledgers(self) -> Iterator[int]:
        """Every ledger id, ascending (lazily)."""
        self._check_open()
        return self._core.ledgers.ledger_ids()

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        self._check_open()
        return self._core.ledgers.read(ledger_id)[0]

    # -- lifecycle -------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("client is closed")

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise UsageError("client is closed")
        return self._loop.run(coro)

    def close(self) -> None:
        """Close connections and the metadata session. Handles become unusable; ledgers
        still open stay open (a later open with recovery closes them)."""
        if self._closed:
            return
        if self._loop.in_loop():
            raise UsageError("close() blocks: not from the client's loop thread")
        self._closed = True
        try:
            self._loop.run(self._core.close(), timeout=30)
        finally:
            self._loop.stop()
            self._cluster.close()

    def __enter__(self) -> BookKeeper:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def connect(metadata_uri: str, **options: Any) -> BookKeeper:
    """``BookKeeper(metadata_uri, **options)``."""
    return BookKeeper(metadata_uri, **options)
