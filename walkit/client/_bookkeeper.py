"""``walkit.BookKeeper``: the ledger client (synchronous, thread-safe).

A thin synchronous face over :class:`~walkit.client.LedgerClient` (one metadata session,
one event loop on a thread of its own where every connection and every handle's state
lives, one pooled connection per bookie): each method checks its arguments, runs the
client's coroutine on the loop (or the client's blocking fast path) and wraps what it
gives in a handle. The asyncio flavour (``walkit.aio``) wraps the same client.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

from walkit.client._client import LedgerClient
from walkit.client._config import ClientConfig
from walkit.client._handles import LedgerHandle, ReadHandle
from walkit.metadata import LedgerMetadata

__all__ = ["BookKeeper", "connect"]


class BookKeeper:
    """A client of the walkit cluster at ``metadata_uri`` (``zk://…`` or ``local:///…``).
    Options are :class:`ClientConfig`'s fields."""

    def __init__(self, metadata_uri: str, *, config: ClientConfig | None = None, **options: Any) -> None:
        self._client = LedgerClient(metadata_uri, ClientConfig.of(config, options))
        self.config = self._client.config
        self.metadata_uri = metadata_uri

    @property
    def client(self) -> LedgerClient:
        """The async core this client runs on (``walkit.client.LedgerClient``)."""
        return self._client

    # -- ledgers ---------------------------------------------------------------------------
    def create_ledger(self, ensemble_size: int = 3, write_quorum: int = 3, ack_quorum: int = 2,
                      digest: str = "crc32c", password: bytes = b"",
                      custom_metadata: Mapping[str, bytes] | None = None) -> LedgerHandle:
        """A new ledger on ``ensemble_size`` writable bookies, open for adds."""
        return LedgerHandle(self._client, self._client.create_now(ensemble_size, write_quorum, ack_quorum, digest,
                                                                  password, custom_metadata))

    def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> ReadHandle:
        """A reader of ``ledger_id``. With ``recovery`` an unclosed ledger is fenced,
        recovered and closed first (its writer can add no more); without, it is read up
        to the LAC while its writer goes on."""
        return ReadHandle(self._client, self._client.run(self._client.open(ledger_id, password, recovery)))

    def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's metadata; bookies reclaim its space later (GC).
        NoSuchLedgerError when there is no such ledger."""
        self._client.check_open()
        self._client.ledgers.delete(ledger_id)

    def list_ledgers(self) -> Iterator[int]:
        """Every ledger id, ascending (lazily)."""
        self._client.check_open()
        return self._client.ledgers.ledger_ids()

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        self._client.check_open()
        return self._client.ledgers.read(ledger_id)[0]

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Close connections and the metadata session. Handles become unusable; ledgers
        still open stay open (a later open with recovery closes them)."""
        self._client.close()

    def __enter__(self) -> BookKeeper:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def connect(metadata_uri: str, **options: Any) -> BookKeeper:
    """``BookKeeper(metadata_uri, **options)``."""
    return BookKeeper(metadata_uri, **options)
