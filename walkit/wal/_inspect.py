"""Looking at logs without writing them (``walkit log list|show|read|tail``).

Every function here reads: none bumps an epoch, fences a segment or opens a ledger with
recovery, so a writer going on meanwhile is never disturbed. The log metadata comes
straight from the metadata store (no bookie is needed to list or describe logs); records
come from a :class:`LogReader`, which reads closed segments to their end and the open one
up to its LAC.

A log that was truncated (retention after a snapshot) refuses a replay "from the start"
to applications, which would silently miss records; an inspector asking for the start
means the first record still kept, which :func:`inspect_reader` gives.
"""

from __future__ import annotations

from collections.abc import Iterator

from walkit.client import BookKeeper
from walkit.errors import NoNodeError, NoSuchLogError
from walkit.metadata import Cluster, walkit_path
from walkit.wal._format import LogMetadata
from walkit.wal._lsn import LSN
from walkit.wal._node import LogNode, check_name
from walkit.wal._readers import LogReader, check_not_truncated
from walkit.wal._records import last_record
from walkit.wal._retention import named_holds

__all__ = ["list_namespaces", "log_names", "iter_logs", "read_log_metadata", "read_log_holds", "inspect_reader",
           "last_lsn"]


def _logs_root(cluster: Cluster) -> str:
    return walkit_path(cluster.info, "logs")


def list_namespaces(cluster: Cluster) -> list[str]:
    """The namespaces that hold (or held) logs, sorted."""
    try:
        return sorted(cluster.store.children(_logs_root(cluster)))
    except NoNodeError:
        return []


def read_log_metadata(cluster: Cluster, name: str, namespace: str = "default") -> tuple[LogMetadata, int]:
    """A log's metadata node, decoded, and its version. NoSuchLogError, FormatError."""
    path = f"{_logs_root(cluster)}/{check_name('namespace', namespace)}/{check_name('log', name)}"
    try:
        data, stat = cluster.store.get(path)
    except NoNodeError:
        raise NoSuchLogError("no such log", namespace=namespace, log=name) from None
    return LogMetadata.decode(data, path), stat.version


def read_log_holds(cluster: Cluster, name: str, namespace: str = "default") -> list[tuple[str, LSN | None]]:
    """What keeps a log's segments from retention besides its snapshots: ``("reader",
    position)`` per reader opened with ``hold=True``, ``("cursor <name>", position)`` per
    named cursor (position None: the log's start)."""
    path = walkit_path(cluster.info, f"logholds/{check_name('namespace', namespace)}/{check_name('log', name)}")
    return [("reader" if node.startswith("h-") else f"cursor {node[2:]}", position)
            for node, position in named_holds(cluster.store, path)]


def log_names(cluster: Cluster, namespace: str | None = None) -> Iterator[tuple[str, str]]:
    """``(namespace, name)`` of every log (of ``namespace``, or of all), by namespace
    then name: one listing per namespace, no log read."""
    for ns in list_namespaces(cluster) if namespace is None else [namespace]:
        try:
            names = cluster.store.children(f"{_logs_root(cluster)}/{check_name('namespace', ns)}")
        except NoNodeError:
            continue
        yield from ((ns, name) for name in sorted(names))


def iter_logs(cluster: Cluster, namespace: str | None = None) -> Iterator[tuple[str, str, LogMetadata]]:
    """``(namespace, name, metadata)`` of every log (:func:`log_names`); a log deleted
    meanwhile is skipped."""
    for ns, name in log_names(cluster, namespace):
        try:
            yield ns, name, read_log_metadata(cluster, name, ns)[0]
        except NoSuchLogError:
            continue


class _InspectReader(LogReader):
    """A LogReader that starts a truncated log at its first kept record when asked for
    the start (``after`` None); an explicit LSN before the truncation is still refused."""

    @staticmethod
    def _check_not_truncated(meta: LogMetadata, after: LSN | None) -> None:
        if after is not None:
            check_not_truncated(meta, after)


def inspect_reader(bk: BookKeeper, name: str, namespace: str = "default", password: bytes = b"") -> LogReader:
    """A reader of the log (``replay``, ``tail``) for inspection; NoSuchLogError now."""
    node = LogNode(bk.client.cluster, namespace, name)
    node.read()
    return _InspectReader(bk, False, node, password)


def last_lsn(bk: BookKeeper, meta: LogMetadata, password: bytes = b"") -> LSN | None:
    """The LSN of the log's last durable record (None: no record), found from the end:
    the last segment with an entry, its last readable entry, that entry's last slot - or,
    when that entry is a fragment of a record not finished (still being written, or left
    by a writer that died mid-record), the last record before it."""
    for segment in reversed(meta.segments):
        with bk.open_ledger(segment.ledger_id, password, recovery=False) as handle:
            if handle.last_add_confirmed < 0:
                continue
            found = last_record(segment.seq, handle.last_add_confirmed,
                                lambda entry_id: next(iter(handle.read(entry_id, entry_id))).data)
        if found is not None:
            return found
    return None
