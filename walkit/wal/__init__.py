"""The write-ahead log applications use (``walkit.WriteAheadLog``): LSNs, batched
appends, snapshots, replay, tailing, writer failover and retention over ledgers; and
read-only inspection of logs (``_inspect``: what ``walkit log`` shows).

The layers above it (``walkit.aio``, ``walkit.spark``) import from this package only,
never from its private modules: what they build on is exported here too - the record
format a reader of raw entries decodes (:data:`FRAGMENT_MAGIC`, :func:`unpack_records`,
:func:`unpack_fragment`, :class:`Assembly`, :func:`last_record`,
:data:`DEFAULT_MAX_RECORD_BYTES`), the snapshot writer's steps (:class:`SnapshotJob`,
:func:`asnapshot_chunks`, :func:`check_snapshot_data`), the wait for a retention
lock (:func:`wait_locked`) and the blocking open of a reader (:func:`open_reader`)."""

from walkit.wal._format import (
    DEFAULT_MAX_RECORD_BYTES,
    FRAGMENT_MAGIC,
    LogMetadata,
    LogSettings,
    Retention,
    Segment,
    SnapshotRef,
    unpack_fragment,
    unpack_records,
)
from walkit.wal._inspect import (
    inspect_reader,
    iter_logs,
    last_lsn,
    list_namespaces,
    log_names,
    read_log_holds,
    read_log_metadata,
)
from walkit.wal._log import WriteAheadLog, delete_log, list_logs, set_namespace_defaults
from walkit.wal._lsn import LSN
from walkit.wal._node import NAME_RULES, is_plain_name
from walkit.wal._readers import LogReader, open_reader
from walkit.wal._records import Assembly, last_record
from walkit.wal._retention import wait_locked
from walkit.wal._snapshots import Snapshot, SnapshotData, SnapshotJob, asnapshot_chunks, check_snapshot_data

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "FRAGMENT_MAGIC", "LSN", "NAME_RULES", "is_plain_name", "Assembly", "LogMetadata", "LogReader", "LogSettings",
           "Retention", "Segment", "Snapshot", "SnapshotData", "SnapshotJob", "SnapshotRef", "WriteAheadLog",
           "asnapshot_chunks", "check_snapshot_data", "delete_log", "inspect_reader", "iter_logs", "open_reader", "last_lsn", "list_logs", "list_namespaces", "log_names",
           "last_record", "read_log_holds", "read_log_metadata", "set_namespace_defaults", "unpack_fragment",
           "unpack_records", "wait_locked"]
