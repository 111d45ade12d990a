"""walkit: an embeddable, replicated write-ahead log.

``walkit.BookKeeper(metadata_uri)`` (or ``walkit.connect``) is the ledger client;
``walkit.LocalCluster`` runs bookies and an embedded metadata store on one machine;
``walkit.aio`` is the asyncio flavour of the client; errors are in ``walkit.errors``.
"""

from walkit import errors
from walkit.client import BookKeeper, ClientConfig, Entry, LedgerHandle, ReadHandle, connect
from walkit._local_cluster import LocalCluster
from walkit.wal import LSN, LogReader, Retention, Snapshot, WriteAheadLog

__all__ = ["errors", "BookKeeper", "ClientConfig", "Entry", "LedgerHandle", "LocalCluster", "ReadHandle", "connect", "LSN", "LogReader", "Retention", "Snapshot", "WriteAheadLog"]
