"""Connecting to a cluster: the one door through which clients and bookies use metadata.

:func:`connect` opens the store named by the URI, reads the cluster's INSTANCEID and
LAYOUT - walkit's own or Apache BookKeeper's (``Cluster.info.format``; a tree BookKeeper's
own ``init`` made works as it is) - and refuses (:class:`~walkit.errors.ClusterLayoutError`) a cluster that is not
there, that this walkit cannot read, whose layout differs from the one the URI names,
or whose instance id differs from the one the caller expects (a bookie passes the
instance id in its cookie, so its disks never serve another cluster). It never makes a
store: a ``local://`` path with none is ``NoMetadataStoreError`` (a ClusterLayoutError).
``read_only=True`` opens the store for inspection (:func:`open_metadata_store`).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from walkit.errors import ClusterLayoutError
from walkit.metadata._cluster import ClusterInfo, read_cluster
from walkit.metadata._ledgers import LedgerManager
from walkit.metadata._registration import BookieRegistration, BookieSet, list_bookies, watch_bookies
from walkit.metadata._store import RETRY_DEADLINE, MetadataStore, Watch
from walkit.metadata._uri import MetadataURI, open_metadata_store, parse_metadata_uri

__all__ = ["Cluster", "connect"]


class Cluster:
    """A session with one cluster (walkit's format or BookKeeper's): its store, identity,
    ledgers and bookies."""

    def __init__(self, store: MetadataStore, info: ClusterInfo, uri: MetadataURI, session_timeout: float) -> None:
        self.store = store
        self.info = info
        self.uri = uri
        self.session_timeout = session_timeout
        self.ledgers = LedgerManager(store, info)

    def register_bookie(self, bookie_id: str, *, readonly: bool = False, data: bytes = b"",
                        wait_existing: float | None = None, on_lost: Callable[[BaseException], None] | None = None
                        ) -> BookieRegistration:
        """Register ``bookie_id`` (see :class:`BookieRegistration`) and return the handle.
        ``wait_existing`` defaults to 1.5 session timeouts: long enough for the session of
        a previous incarnation of this bookie (killed, restarted) to expire."""
        wait = self.session_timeout * 1.5 if wait_existing is None else wait_existing
        registration = BookieRegistration(self.store, self.info, bookie_id, data=data, wait_existing=wait,
                                          on_lost=on_lost)
        try:
            registration.register(readonly)
        except BaseException:
            registration.close()
            raise
        return registration

    def bookies(self) -> BookieSet:
        return list_bookies(self.store, self.info)

    def watch_bookies(self, callback: Callable[[BookieSet], None]) -> Watch:
        return watch_bookies(self.store, self.info, callback)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def connect(uri: str | MetadataURI, *, instance_id: str | None = None, session_timeout: float = 10.0,
            retry_deadline: float = RETRY_DEADLINE, read_only: bool = False) -> Cluster:
    """Open the cluster at ``uri``; ClusterLayoutError when it cannot be used. Every
    call of its store gives up after ``retry_deadline`` seconds (MetadataUnavailableError).
    ``read_only``: the store writes nothing (MetadataReadOnlyError on a change)."""
    parsed = parse_metadata_uri(uri) if isinstance(uri, str) else uri
    store = open_metadata_store(parsed, session_timeout=session_timeout, retry_deadline=retry_deadline,
                                read_only=read_only)
    try:
        info = read_cluster(store, parsed.root)
        if parsed.layout is not None and parsed.layout != info.layout:
            raise ClusterLayoutError("the cluster's ledger layout is not the one the URI names", root=info.root,
                                     cluster=info.layout, uri=parsed.layout)
        if instance_id is not None and instance_id != info.instance_id:
            raise ClusterLayoutError("this is another cluster than the one expected (instance ids differ)",
                                     root=info.root, expected=instance_id, found=info.instance_id)
    except BaseException:
        store.close()
        raise
    return Cluster(store, info, parsed, session_timeout)
