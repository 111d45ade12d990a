"""The write-ahead log applications use (``walkit.WriteAheadLog``): LSNs, batched
appends, snapshots, replay, tailing, writer failover and retention over ledgers; and
read-only inspection of logs (``_inspect``: what ``walkit log`` shows)."""

from walkit.wal._format import LogMetadata, LogSettings, Retention, Segment, SnapshotRef
from walkit.wal._inspect import (
    inspect_reader,
    iter_logs,
    last_lsn,
    list_namespaces,
    log_names,
    read_log_holds,
    read_log_metadata,
)
from walkit.wal._log import LogReader, Snapshot, WriteAheadLog, delete_log, list_logs, set_namespace_defaults
from walkit.wal._lsn import LSN
from walkit.wal._snapshots import SnapshotData

__all__ = ["LSN", "LogMetadata", "LogReader", "LogSettings", "Retention", "Segment", "Snapshot", "SnapshotData",
           "SnapshotRef", "WriteAheadLog",
           "delete_log", "inspect_reader", "iter_logs", "last_lsn", "list_logs", "list_namespaces", "log_names",
           "read_log_holds", "read_log_metadata", "set_namespace_defaults"]
