"""walkit's client side: the ledger client (:class:`BookKeeper` and its handles, over the
public async core :class:`LedgerClient`) and the connection to one bookie
(:class:`BookieClient`; :class:`BkBookieClient` to an Apache BookKeeper bookie, in its
v3 or v2 dialect), and a ledger's entry codec (:class:`EntryCodec`: walkit's digests or
BookKeeper's ``bk-*``).

The layers above it (``walkit.wal``, ``walkit.aio``, ``walkit.spark``) import from this
package only, never from its private modules: what they build on is exported here - the
writer and reader a handle wraps (:class:`LedgerWriter`, :class:`LedgerReader`), the
future an add returns (:class:`QuickFuture`), the argument checks a handle applies
(:func:`check_payload`, :func:`check_range`) and the chunked sequential read a replay
uses (:func:`read_chunks` on the client's loop, :func:`read_ahead` from a thread)."""

from walkit.client._bk_bookie_client import BkBookieClient
from walkit.client._bookie_client import BookieClient, client_ssl_context
from walkit.client._bookkeeper import BookKeeper, connect
from walkit.client._client import LedgerClient
from walkit.client._config import ClientConfig
from walkit.client._entry_codec import EntryCodec
from walkit.client._handles import LedgerHandle, ReadHandle, check_payload
from walkit.client._loop import LoopThread
from walkit.client._pool import Endpoint, connect_endpoint, parse_endpoint, uses_tls
from walkit.client._read import Entry, LedgerReader
from walkit.client._read_state import ReadState, check_range
from walkit.client._readahead import read_ahead, read_chunks
from walkit.client._submit import QuickFuture
from walkit.client._writer import LedgerWriter

__all__ = ["BkBookieClient", "BookKeeper", "BookieClient", "ClientConfig", "Endpoint", "Entry", "EntryCodec", "LedgerClient", "LedgerHandle",
           "LedgerReader", "LedgerWriter", "LoopThread", "QuickFuture", "ReadHandle", "ReadState", "check_payload", "check_range",
           "client_ssl_context", "connect", "connect_endpoint", "parse_endpoint", "read_ahead", "read_chunks", "uses_tls"]
