"""A bookie's metrics: what its server, journal, storage and garbage collector count,
as Prometheus metric families (see :mod:`walkit.metrics` for how recording stays cheap).

The server keeps a :class:`ServerStats` (written on its event loop only); the journal its
:class:`~bookie.journal.JournalStats` (its sync thread); the garbage collector its
totals. :class:`BookieCollector` reads them all when ``/metrics`` is asked for
(:mod:`bookie._http`), plus what is cheaper to look at then than to track: connections
and requests in flight, read-only state, disk usage and the bytes of entry logs and
index files on disk. docs/metrics.md lists every name.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from bookie._bookie import Bookie, BookieFailure
from bookie._config import BookieConfig
from walkit.metrics import COUNT_BUCKETS, Histogram, registry_of
from walkit.protocol import AddEntryResponse, BkResponse, ErrorResponse, Op, ReadRangeResponse, Response, Status

__all__ = ["ServerStats", "MetricsSource", "BookieCollector", "bookie_registry"]


class ServerStats:
    """The server's counts (its event loop writes them)."""

    __slots__ = ("responses", "adds_ok", "refused", "bytes_in", "bytes_out", "range_entries")

    def __init__(self) -> None:
        #: (op, status) -> answers sent, adds answered together excepted (``adds_ok``)
        self.responses: collections.Counter[tuple[str, str]] = collections.Counter()
        self.adds_ok = 0
        self.refused: collections.Counter[str] = collections.Counter()  # adds refused at once, by reason
        self.bytes_in = 0
        self.bytes_out = 0
        #: entries per READ_RANGE answer: its count is the range reads answered with
        #: entries, its sum the entries they carried (entries per request = sum / count)
        self.range_entries = Histogram(COUNT_BUCKETS)

    def answered(self, response: Response | BkResponse) -> None:
        self.responses[_labels(response)] += 1
        if type(response) is ReadRangeResponse:
            self.range_entries.observe(len(response.entries))


_LABELS: dict[tuple[type, int, int], tuple[str, str]] = {}


def _labels(response: Response | BkResponse) -> tuple[str, str]:
    """(op, status) of an answer, as label values (cached: a handful of combinations)."""
    key: tuple[type, int, int]
    if isinstance(response, ErrorResponse):
        key = (ErrorResponse, int(response.op), int(response.status))
    else:
        key = (type(response), 0, 0)
    labels = _LABELS.get(key)
    if labels is None:
        if isinstance(response, ErrorResponse):
            labels = (Op(response.op).name.lower(), Status(response.status).name)
        else:
            labels = (_SUCCESS_OPS.get(type(response).__name__, type(response).__name__), "EOK")
        _LABELS[key] = labels
    return labels


_SUCCESS_OPS = {"AddEntryResponse": "add_entry", "ReadEntryResponse": "read_entry", "ReadLacResponse": "read_lac",
                "WriteLacResponse": "write_lac", "BookieInfoResponse": "get_bookie_info", "AdminResponse": "admin",
                "ReadRangeResponse": "read_range", "ForceLedgerResponse": "force_ledger",
                "ListOfEntriesResponse": "get_list_of_entries", "AuthMessage": "auth"}
assert AddEntryResponse.__name__ in _SUCCESS_OPS


class MetricsSource(Protocol):
    """What the collector reads of a bookie server (:class:`bookie.server.BookieServer`),
    when ``/metrics`` is asked for (any thread: each value is one read)."""

    @property
    def config(self) -> BookieConfig: ...

    @property
    def bookie(self) -> Bookie | None: ...

    @property
    def stats(self) -> ServerStats: ...

    @property
    def readonly(self) -> bool: ...

    @property
    def failure(self) -> BookieFailure | None: ...

    @property
    def connection_count(self) -> int: ...

    @property
    def requests_in_flight(self) -> int: ...

    @property
    def adds_in_flight(self) -> int: ...

    def disk_usage_of(self, directory: str) -> float: ...


class BookieCollector:
    """prometheus-client's collector protocol over one bookie server."""

    def __init__(self, server: MetricsSource) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        server = self.server
        st = server.stats
        requests = CounterMetricFamily("walkit_bookie_requests", "Requests answered, by operation and status",
                                       labels=["op", "status"])
        responses = dict(st.responses)
        responses[("add_entry", "EOK")] = responses.get(("add_entry", "EOK"), 0) + st.adds_ok
        for (op, status), n in sorted(responses.items()):
            requests.add_metric([op, status], n)
        yield requests
        refused = CounterMetricFamily("walkit_bookie_adds_refused",
                                      "Adds refused on arrival (busy: back-pressure; readonly; stopping)",
                                      labels=["reason"])
        for reason in ("busy", "readonly", "stopping"):
            refused.add_metric([reason], st.refused.get(reason, 0))
        yield refused
        yield GaugeMetricFamily("walkit_bookie_requests_in_flight", "Requests dispatched and not yet answered",
                                value=server.requests_in_flight)
        yield GaugeMetricFamily("walkit_bookie_adds_in_flight", "Adds admitted and not yet durable",
                                value=server.adds_in_flight)
        yield GaugeMetricFamily("walkit_bookie_connections", "Client connections open", value=server.connection_count)
        yield CounterMetricFamily("walkit_bookie_received_bytes", "Bytes received from clients", value=st.bytes_in)
        yield CounterMetricFamily("walkit_bookie_sent_bytes", "Bytes sent to clients", value=st.bytes_out)
        yield st.range_entries.family("walkit_bookie_range_read_entries",
                                      "Entries in one READ_RANGE answer (count: range reads answered with entries)")
        yield GaugeMetricFamily("walkit_bookie_readonly", "1 while the bookie is read-only",
                                value=1 if server.readonly else 0)
        yield GaugeMetricFamily("walkit_bookie_failed",
                                "1 once an I/O error in the journal or ledger storage made the bookie read-only "
                                "until restarted", value=0 if server.failure is None else 1)
        bookie = server.bookie
        if bookie is None:
            return
        yield from _journal(bookie)
        yield from _storage(server)
        yield CounterMetricFamily("walkit_bookie_checkpoints", "Checkpoints (storage flushed, mark written)",
                                  value=bookie.checkpoints)
        yield bookie.checkpoint_seconds.family("walkit_bookie_checkpoint_seconds", "Time one checkpoint took")
        yield CounterMetricFamily("walkit_bookie_write_cache_placements", "Times a full write cache was placed in "
                                  "the entry logs between two checkpoints", value=bookie.placements)
        yield from _gc(bookie)


def _journal(bookie: Bookie) -> Iterator[Metric]:
    js = bookie.journal.stats
    flushes = CounterMetricFamily("walkit_bookie_journal_flushes", "Journal batches written and synced, by reason",
                                  labels=["reason"])
    for reason, n in sorted(js.reasons.items()):
        flushes.add_metric([reason], n)
    yield flushes
    yield CounterMetricFamily("walkit_bookie_journal_records", "Records made durable by the journal",
                              value=js.records)
    yield CounterMetricFamily("walkit_bookie_journal_written_bytes", "Bytes the journal wrote (padding included)",
                              value=js.bytes_written)
    yield CounterMetricFamily("walkit_bookie_journal_rolls", "Journal files started", value=js.rolls)
    yield CounterMetricFamily("walkit_bookie_journal_slow_syncs",
                              "Journal write+syncs slower than journalSyncWarnMillis", value=js.slow_syncs)
    yield CounterMetricFamily("walkit_bookie_journal_no_space",
                              "Journal batches refused because the disk had no room for them (ENOSPC)",
                              value=js.no_space)
    zero_bytes, zero_failures = bookie.journal.zero_filled
    yield CounterMetricFamily("walkit_bookie_journal_zero_filled_bytes",
                              "Zeros written ahead of new journal files' tails (journalZeroFillRateMB)",
                              value=zero_bytes)
    yield CounterMetricFamily("walkit_bookie_journal_zero_fill_failures",
                              "Zero writes ahead of a journal's tail that failed (each ended one file's filling)",
                              value=zero_failures)
    yield js.sync_seconds.family("walkit_bookie_journal_sync_seconds", "One batch's write + fdatasync")
    yield js.queue_wait_seconds.family("walkit_bookie_journal_queue_wait_seconds",
                                       "How long a batch's oldest record waited before its write began")
    yield js.records_per_flush.family("walkit_bookie_journal_flush_records", "Records in one journal batch")
    yield js.bytes_per_flush.family("walkit_bookie_journal_flush_bytes", "Bytes of one journal batch")


def _storage(server: MetricsSource) -> Iterator[Metric]:
    logs = GaugeMetricFamily("walkit_bookie_entry_log_bytes", "Bytes of entry log files, by ledger directory",
                             labels=["directory"])
    index = GaugeMetricFamily("walkit_bookie_index_bytes", "Bytes of index files and the slot log, by ledger directory",
                              labels=["directory"])
    usage = GaugeMetricFamily("walkit_bookie_disk_usage_ratio", "Fraction of the directory's file system in use",
                              labels=["directory"])
    for directory in server.config.ledger_directories:
        log_bytes, index_bytes = _sizes(directory)
        logs.add_metric([directory], log_bytes)
        index.add_metric([directory], index_bytes)
        usage.add_metric([directory], server.disk_usage_of(directory))
    yield logs
    yield index
    yield usage
    assert server.bookie is not None
    caches = server.bookie.storage.cache_stats()
    hits = CounterMetricFamily("walkit_bookie_read_cache_hits", "Reads a storage cache answered (read_ahead: "
                               "single reads; recent_writes: entry-log preads)", labels=["cache"])
    misses = CounterMetricFamily("walkit_bookie_read_cache_misses", "Reads a storage cache could not answer",
                                 labels=["cache"])
    held = GaugeMetricFamily("walkit_bookie_read_cache_bytes", "Bytes a storage cache holds", labels=["cache"])
    bound = GaugeMetricFamily("walkit_bookie_read_cache_max_bytes", "A storage cache's bound (0: off)",
                              labels=["cache"])
    for name, stats in sorted(caches.items()):
        hits.add_metric([name], stats["hits"])
        misses.add_metric([name], stats["misses"])
        held.add_metric([name], stats["bytes"])
        bound.add_metric([name], stats["max_bytes"])
    yield from (hits, misses, held, bound)
    yield GaugeMetricFamily("walkit_bookie_write_cache_bytes", "Bytes of entries in the write cache, waiting to "
                            "be placed in the entry logs (at dbStorage_writeCacheMaxSizeMb, or by a checkpoint; "
                            "past twice that adds are written through)",
                            value=server.bookie.storage.cached_bytes())
    yield GaugeMetricFamily("walkit_bookie_slot_log_slots", "Index slots the ledger directories' slot logs hold "
                            "(in RAM too, 8 bytes each) until a checkpoint merges them into the index files",
                            value=server.bookie.storage.slot_log_slots())


def _sizes(directory: str) -> tuple[int, int]:
    """(entry log bytes, index bytes) under ``directory`` (files that vanish meanwhile: 0)."""
    log_bytes = index_bytes = 0
    for root, _, files in os.walk(directory):
        for name in files:
            if not (name.endswith(".log") or name.endswith(".idx")):
                continue
            try:
                size = os.stat(os.path.join(root, name)).st_size
            except OSError:
                continue
            if name.endswith(".log") and name != "slots.log":  # the slot log is index
                log_bytes += size
            else:
                index_bytes += size
    return log_bytes, index_bytes


def _gc(bookie: Bookie) -> Iterator[Metric]:
    try:
        status = bookie.gc.status()
    except Exception:  # noqa: BLE001 - no collector (not started, stopping): no GC metrics this time
        return
    totals = status["totals"]
    yield CounterMetricFamily("walkit_bookie_gc_passes", "Garbage collection passes run", value=status["passes"])
    yield CounterMetricFamily("walkit_bookie_gc_metadata_unavailable_passes", "Garbage collection passes whose "
                              "metadata steps stopped: the store did not answer within the retry deadline",
                              value=status["metadata_unavailable_passes"])
    for key, doc in (("ledgers_removed", "Deleted ledgers removed from this bookie"),
                     ("overreplicated_removed", "Over-replicated ledgers removed from this bookie"),
                     ("entry_logs_deleted", "Entry logs deleted whole (nothing live)"),
                     ("entry_logs_compacted", "Entry logs compacted"),
                     ("entries_copied", "Live entries compaction copied")):
        yield CounterMetricFamily(f"walkit_bookie_gc_{key}", doc, value=totals[key])
    yield CounterMetricFamily("walkit_bookie_gc_reclaimed_bytes", "Entry log bytes garbage collection freed",
                              value=totals["bytes_reclaimed"])
    yield CounterMetricFamily("walkit_bookie_gc_copied_bytes", "Bytes compaction wrote anew",
                              value=totals["bytes_copied"])
    yield GaugeMetricFamily("walkit_bookie_gc_compacting", "1 while a compaction runs",
                            value=0 if status["compaction"] == "idle" else 1)


def bookie_registry(server: MetricsSource) -> CollectorRegistry:
    """The registry ``/metrics`` serves for ``server``."""
    return registry_of(BookieCollector(server))
