"""The write-ahead log applications use (``walkit.WriteAheadLog``): LSNs, batched
appends, snapshots, replay, tailing, writer failover and retention over ledgers."""

from walkit.wal._log import LogReader, Snapshot, WriteAheadLog, delete_log, list_logs, set_namespace_defaults
from walkit.wal._lsn import LSN

__all__ = ["LSN", "LogReader", "Snapshot", "WriteAheadLog", "delete_log", "list_logs", "set_namespace_defaults"]
