"""walkit's metadata: one store interface, two drivers, the ledger metadata on top.

- :class:`MetadataStore` (``_store``): a ZooKeeper-shaped tree with versioned CAS,
  ephemeral and sequential nodes, transactions, watches and sessions;
- drivers chosen by URI (:func:`open_metadata_store`): ``zk://`` (Apache ZooKeeper
  through kazoo, ``_zk``) and ``local://`` (an SQLite file shared by the processes of
  one machine, ``_local``);
- :class:`LedgerMetadata` (``_ledger``) and the ledger path layouts (``_paths``);
- the cluster layout (``_cluster``), the ledger manager (``_ledgers``), bookie
  registration (``_registration``), under-replication markers and the auditor's seat
  (``_underreplication``), and :func:`connect` (``_connect``), which checks a
  cluster before anything uses it; :func:`retry_cas` (``_retry``), the one policy
  for retrying a change that lost its compare-and-set;
- Apache BookKeeper 4.18's own records, pure bytes and paths (no I/O): ledger metadata
  (``_bk_ledger``), LAYOUT, INSTANCEID, cookies, registrations, under-replication and
  auditor records (``_bk_records``) and znode paths (``_bk_paths``).
- a cluster is walkit's format or BookKeeper's (``ClusterInfo.format``, read from its
  LAYOUT): in a BookKeeper-format cluster the ledger manager keeps BookKeeper's records
  and draws ids from BookKeeper's generators (``_bk_ledgers``), under-replication uses
  BookKeeper's own marks, locks and auditor election (``_bk_underreplication``), and
  walkit's own nodes live below ``ID-walkit`` (:func:`walkit_path`); a bookie's
  registration holds BookKeeper's ``BookieServiceInfo`` there, walkit's JSON otherwise
  (``_service_info``).
"""

from walkit.metadata._cluster import (
    ClusterFormat,
    ClusterInfo,
    ClusterLayout,
    cluster_path,
    init_cluster,
    ledger_digest,
    read_cluster,
    walkit_path,
)
from walkit.metadata._connect import Cluster, connect
from walkit.metadata._ledger import BK_DIGESTS, BOOKIE_CHECKED_DIGESTS, Fragment, LedgerMetadata, LedgerState, is_bk_digest
from walkit.metadata._ledgers import LedgerManager
from walkit.metadata._local import LocalMetadataStore
from walkit.metadata._retry import retry_cas
from walkit.metadata._registration import (
    READONLY,
    BookieRegistration,
    BookieSet,
    check_bookie_id,
    list_bookies,
    delete_cookie,
    read_cookie,
    read_registration,
    watch_bookies,
    write_cookie,
)
from walkit.metadata._paths import (
    Layout,
    iter_ledger_ids,
    iter_ledger_ranges,
    ledger_path,
    ledger_path_prefixes,
    parse_ledger_path,
)
from walkit.metadata._store import (
    ANY_VERSION,
    RETRY_DEADLINE,
    Check,
    Create,
    Delete,
    MetadataStore,
    Op,
    SessionState,
    SetData,
    Stat,
    Watch,
    check_path,
)
from walkit.metadata._underreplication import Marker, UnderReplication
from walkit.metadata._bk_records import BkCookie
from walkit.metadata._service_info import decode_service_info, encode_service_info
from walkit.metadata._uri import MetadataURI, open_metadata_store, parse_metadata_uri

__all__ = [
    "ANY_VERSION",
    "BK_DIGESTS",
    "BOOKIE_CHECKED_DIGESTS",
    "READONLY",
    "RETRY_DEADLINE",
    "BkCookie",
    "BookieRegistration",
    "BookieSet",
    "Check",
    "Cluster",
    "ClusterFormat",
    "ClusterInfo",
    "ClusterLayout",
    "Create",
    "Delete",
    "Fragment",
    "Layout",
    "LedgerManager",
    "LedgerMetadata",
    "LedgerState",
    "LocalMetadataStore",
    "Marker",
    "MetadataStore",
    "MetadataURI",
    "Op",
    "SessionState",
    "SetData",
    "Stat",
    "UnderReplication",
    "Watch",
    "check_bookie_id",
    "check_path",
    "cluster_path",
    "connect",
    "decode_service_info",
    "encode_service_info",
    "init_cluster",
    "is_bk_digest",
    "iter_ledger_ids",
    "ledger_digest",
    "iter_ledger_ranges",
    "ledger_path",
    "retry_cas",
    "list_bookies",
    "ledger_path_prefixes",
    "open_metadata_store",
    "parse_ledger_path",
    "parse_metadata_uri",
    "read_cluster",
    "delete_cookie",
    "read_cookie",
    "read_registration",
    "walkit_path",
    "watch_bookies",
    "write_cookie",
]
