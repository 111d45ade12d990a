"""Metadata service URIs: which driver, where, and which ledger layout.

- ``zk://h1:2181,h2:2181/ledgers`` - Apache ZooKeeper through kazoo; the path is the
  cluster root (BookKeeper's ``zkLedgersRootPath``). ``zk+hierarchical://``,
  ``zk+flat://`` and ``zk+longhierarchical://`` (BookKeeper-format clusters only) name
  how ledger paths are laid out: BookKeeper's ``metadataServiceUri`` forms, where the
  scheme names the ledger manager. Hosts are separated by ``,`` or,
  as in BookKeeper's ``metadataServiceUri``, by ``;``; each is ``host[:port]`` with a port
  of 1-65535, checked here (kazoo would raise a bare ValueError later).
- ``local:///path/to/dir`` - the embedded SQLite store in that directory; the cluster
  root inside it is ``/ledgers``. ``local+flat://`` chooses the flat layout.

A store opened from a URI (:func:`open_metadata_store`) gives up on a call after
``retry_deadline`` seconds with MetadataUnavailableError: ZooKeeper's retry deadline,
and the ``local://`` store's busy timeout (its database locked by another process), the
same setting for both (client option ``metadata_retry_deadline``, bookie key
``metadataRetryDeadlineMs``).

Opening never makes a store by accident: a ``local://`` directory without the store in
it is ``NoMetadataStoreError`` unless the caller passes ``create=True`` (``walkit init``,
``walkit sandbox`` and the local clusters, which make their own). ``read_only=True``
(the inspection commands) opens a ``local://`` store so that it writes nothing - no
session, no heartbeat, the file opened read-only, writes refused with
``MetadataReadOnlyError`` - and works where the file cannot be written. For ``zk://``
both flags are accepted and change nothing: a ZooKeeper cluster exists or not as a whole
(``connect`` says "no walkit cluster here"), and a kazoo session that only reads writes
nothing.

Without a layout in the scheme, ``layout`` is None: ``walkit init`` makes a hierarchical
cluster (BookKeeper's default) and clients use whatever layout the cluster has. With
one, init makes that layout and clients refuse a cluster laid out otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from walkit.errors import InvalidArgumentError
from walkit.metadata._cluster import CLUSTER_LAYOUTS, ClusterLayout
from walkit.metadata._store import RETRY_DEADLINE, MetadataStore, check_path

__all__ = ["MetadataURI", "parse_metadata_uri", "open_metadata_store", "redact"]

_LOCAL_ROOT = "/ledgers"


@dataclass(frozen=True)
class MetadataURI:
    driver: str  # "zk" or "local"
    location: str  # ZooKeeper hosts, or the local directory
    root: str  # the cluster root path inside the store
    layout: ClusterLayout | None  # None: not named in the URI


def redact(uri: str) -> str:
    """``uri`` without the password of a ``zk://user:password@...`` URI (for messages)."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    return parts._replace(netloc=f"{parts.username}:***@{parts.netloc.rpartition('@')[2]}").geturl()


def parse_metadata_uri(uri: str) -> MetadataURI:
    parts = urlsplit(uri)
    scheme, _, layout_name = parts.scheme.partition("+")
    layout = layout_name or None
    if (layout is not None and layout not in CLUSTER_LAYOUTS) or scheme not in ("zk", "local"):
        raise InvalidArgumentError("unknown metadata service URI scheme", uri=redact(uri),
                                   known="zk, zk+flat, zk+hierarchical, zk+longhierarchical, local, local+flat")
    if scheme == "zk":
        if not parts.netloc:
            raise InvalidArgumentError("zk:// URI needs host:port[,host:port...]", uri=redact(uri))
        root = parts.path.rstrip("/") or "/ledgers"
        return MetadataURI("zk", _zk_hosts(parts.netloc, uri), check_path(root), layout)
    if parts.netloc or not parts.path:
        raise InvalidArgumentError("local:// URI is local:///absolute/directory", uri=redact(uri))
    return MetadataURI("local", parts.path, _LOCAL_ROOT, layout)


def _zk_hosts(netloc: str, uri: str) -> str:
    """``netloc``'s hosts joined by ``,`` (BookKeeper's ``;`` accepted), each checked."""
    auth, at, hosts = netloc.rpartition("@")
    checked = []
    for host in hosts.replace(";", ",").split(","):
        name, colon, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
        name = name if colon else host
        if not name or (colon and not (port.isdigit() and 0 < int(port) < 65536)):
            raise InvalidArgumentError("zk:// URI hosts are host[:port], separated by ',' or ';'", uri=redact(uri),
                                       host=host)
        checked.append(host)
    return auth + at + ",".join(checked)


def open_metadata_store(uri: str | MetadataURI, *, session_timeout: float = 10.0,
                        retry_deadline: float = RETRY_DEADLINE, create: bool = False,
                        read_only: bool = False) -> MetadataStore:
    """A store for the URI (kazoo is imported only for zk://) whose calls give up after
    ``retry_deadline`` seconds. ``create``: a ``local://`` store may be made here (else
    NoMetadataStoreError when there is none); ``read_only``: see the module docstring."""
    parsed = parse_metadata_uri(uri) if isinstance(uri, str) else uri
    if parsed.driver == "zk":
        from walkit.metadata._zk import ZooKeeperStore

        return ZooKeeperStore(parsed.location, session_timeout=session_timeout, retry_deadline=retry_deadline)
    from walkit.metadata._local import LocalMetadataStore

    return LocalMetadataStore(parsed.location, session_timeout=session_timeout, busy_timeout=retry_deadline,
                              create=create, read_only=read_only)
