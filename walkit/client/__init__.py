"""walkit's client side: the ledger client (:class:`BookKeeper` and its handles) and the
connection to one bookie (:class:`BookieClient`)."""

from walkit.client._bookie_client import BookieClient, client_ssl_context
from walkit.client._bookkeeper import BookKeeper, connect
from walkit.client._config import ClientConfig
from walkit.client._handles import LedgerHandle, ReadHandle, ReadState
from walkit.client._loop import LoopThread
from walkit.client._pool import Endpoint, parse_endpoint
from walkit.client._read import Entry

__all__ = ["BookKeeper", "BookieClient", "ClientConfig", "Endpoint", "Entry", "LedgerHandle", "LoopThread", "ReadHandle",
           "ReadState", "client_ssl_context", "connect", "parse_endpoint"]
