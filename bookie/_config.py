"""Bookie configuration: BookKeeper's key names and defaults, loadable from TOML (and from
BookKeeper's own ``bk_server.conf``, Java properties: :mod:`bookie._bk_conf`).

Attributes are snake_case; the TOML keys are BookKeeper's (``journalMaxGroupWaitMSec``,
``ledgerDirectories``, ...). Keys that walkit adds are marked "walkit" below.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any, NoReturn

from bookie.journal._format import MIN_ALIGNMENT
from walkit.errors import ConfigError, WalkitError
from walkit.metadata import RETRY_DEADLINE, parse_metadata_uri

__all__ = ["BookieConfig", "reference"]


def _bad(key: str, message: str, value: Any) -> NoReturn:
    raise ConfigError(f"{key} {message}", key=key, value=repr(value)[:200])


def _key(key: str, default: Any, doc: str) -> Any:
    """A field read from TOML key ``key``; ``doc`` is its line in the reference
    (docs/operations.md). Docs of keys BookKeeper does not have start with "walkit:"."""
    meta = {"key": key, "doc": doc}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class BookieConfig:
    # Identity and network. The id names the cookie and the registration.
    bookie_id: str = _key("bookieId", "", "the bookie's id, in its cookie and registration; empty: "
                          "`<advertisedAddress or bindAddress>:<port bound>`")
    bookie_port: int = _key("bookiePort", 3181, "port of the bookie protocol (0: any free one; without a "
                            "bookieId the id names that port, so later starts must give it)")
    bind_address: str = _key("bindAddress", "127.0.0.1", "address the bookie listens on; walkit's default is "
                             "loopback: set it (or a wildcard such as 0.0.0.0) to serve other machines")
    advertised_address: str = _key("advertisedAddress", "", "the host clients reach: the default id's host and the "
                                   "registered endpoint (empty: bindAddress); needed with a wildcard bindAddress")
    metadata_service_uri: str = _key("metadataServiceUri", "", "`zk://host:2181[,host:2181...]/ledgers` or "
                                     "`local:///dir`; empty: none (no registration, no cookie in metadata: tests)")
    zk_timeout: int = _key("zkTimeout", 10000, "ms: the metadata session timeout")
    # walkit: BookKeeper retries ZooKeeper calls by count (zkRetryBackoffMaxRetries); walkit
    # bounds each call's wait, the same for both metadata drivers.
    metadata_retry_deadline_ms: int = _key(
        "metadataRetryDeadlineMs", round(RETRY_DEADLINE * 1000), "walkit: ms a metadata call (registration, "
        "cookie, GC, autorecovery) waits for an unreachable ZooKeeper or a locked local:// store before it fails")
    # Server limits: reading pauses on a connection past this many requests in flight
    # (walkit), and adds past the bookie-wide bound are answered ETOOMANYREQUESTS.
    max_pending_requests_per_connection: int = _key(
        "maxPendingRequestsPerConnection", 10000,
        "walkit: requests in flight on one connection past which the bookie stops reading it")
    max_pending_add_requests: int = _key("maxPendingAddRequests", 100000,
                                         "adds in flight, bookie-wide; more are answered ETOOMANYREQUESTS")
    max_pending_add_bytes: int = _key("maxPendingAddBytes", 256 << 20, "walkit: bytes of entries in flight, "
                                      "bookie-wide (256 MiB); more are answered ETOOMANYREQUESTS")
    max_long_polls: int = _key("maxLongPolls", 100000, "walkit: parked long-poll reads, bookie-wide; more are "
                               "answered ETOOMANYREQUESTS")
    max_connections: int = _key("maxConnections", 1024, "walkit: client connections; more are refused")
    num_read_worker_threads: int = _key("numReadWorkerThreads", 4, "threads serving reads and admin requests")
    # TLS (PEM files; off when tlsCertificatePath is empty).
    tls_certificate_path: str = _key("tlsCertificatePath", "", "the bookie's certificate, PEM (empty: no TLS)")
    tls_key_store: str = _key("tlsKeyStore", "", "the certificate's private key, PEM")
    tls_trust_store: str = _key("tlsTrustStore", "", "CA certificates, PEM, to verify clients by (and the bookies "
                                "this one pushes re-replicated copies to)")
    tls_client_authentication: bool = _key("tlsClientAuthentication", False,
                                           "require a client certificate signed by tlsTrustStore")
    # Directories.
    journal_directory: str = _key("journalDirectory", "/tmp/bk-txn", "the journal (every add waits for its "
                                  "fdatasync: a disk of its own)")
    ledger_directories: list[str] = _key("ledgerDirectories", ["/tmp/bk-data"], "entry logs and index files; "
                                         "ledger L lives in the (L mod count)-th, so the order is part of the cookie")
    # Journal group commit: wait at most 2 ms or 512 KiB to batch many entries per fsync.
    journal_max_group_wait_msec: float = _key("journalMaxGroupWaitMSec", 2.0, "ms: a batch whose oldest record "
                                              "waited this long is written and synced")
    journal_buffered_writes_threshold: int = _key("journalBufferedWritesThreshold", 512 * 1024,
                                                  "bytes: a batch this large (512 KiB) is written and synced")
    journal_buffered_entries_threshold: int = _key("journalBufferedEntriesThreshold", 0,
                                                   "records: a batch this large is written and synced (0: off)")
    journal_flush_when_queue_empty: bool = _key(
        "journalFlushWhenQueueEmpty", True, "write a batch as soon as the journal thread looks (BookKeeper: false; "
        "walkit's sync thread groups while busy, so waiting on an idle disk only adds latency)")
    journal_inline_flush: bool = _key(
        "journalInlineFlush", True, "walkit: an idle journal writes and syncs the adds of one event-loop iteration "
        "on the loop's thread (no thread switch per append; taken only while a write + sync is quick); false: "
        "the loop hands the batch straight to the sync thread")
    # Journal files: 2 GiB files, zero-filled 16 MiB ahead, 5 kept behind the mark.
    journal_max_size_mb: int = _key("journalMaxSizeMB", 2048, "MiB: a journal file rolls at this size")
    journal_pre_alloc_size_mb: int = _key("journalPreAllocSizeMB", 16, "MiB: new journal space is reserved "
                                          "(fallocate) this far ahead of the tail")
    journal_max_backups: int = _key("journalMaxBackups", 5, "journal files kept behind the checkpoint mark")
    journal_recycle_files: int = _key("journalRecycleFiles", 2, "walkit: retired journals kept for reuse, so "
                                      "appends overwrite written blocks instead of converting fresh extents")
    journal_zero_fill_rate_mb: int = _key(
        "journalZeroFillRateMB", 64, "walkit: MiB/s of zeros a thread writes ahead of a new journal file's tail "
        "(8 MiB ahead), so that adds land on written blocks rather than converting fallocated extents at each "
        "fdatasync (0: off)")
    journal_alignment_size: int = _key("journalAlignmentSize", 4096, "bytes, a power of two >= 512 (>= 4096 with "
                                       "journalDirectIO): journal write alignment (BookKeeper: 512)")
    journal_sync_data: bool = _key("journalSyncData", True, "fdatasync before acknowledging (false: acknowledge "
                                   "after the write, lost on a power cut)")
    journal_direct_io: bool = _key("journalDirectIO", True, "walkit: write journals with O_DIRECT where the file "
                                   "system allows (else buffered + fdatasync, logged once per directory)")
    journal_sync_warn_millis: int = _key("journalSyncWarnMillis", 1000, "walkit: ms; a slower journal write+sync "
                                         "is logged as a warning and counted")
    # Ledger storage and checkpoints.
    entry_log_size_limit: int = _key("entryLogSizeLimit", 1 << 30, "bytes: an entry log rolls at this size "
                                     "(1 GiB); the unit that garbage collection deletes or compacts")
    open_file_limit: int = _key("openFileLimit", 1024, "index files kept open (BookKeeper: 20000)")
    flush_interval: int = _key("flushInterval", 60000, "ms between checkpoints (storage synced, lastMark written)")
    flush_entries_threshold: int = _key("flushEntriesThreshold", 200_000, "walkit: checkpoint early once this "
                                        "many entries wait in memory, bounding RAM")
    write_cache_max_size_mb: int = _key("dbStorage_writeCacheMaxSizeMb", 64, "MiB of entries the write cache "
                                        "holds before it is placed in the entry logs, sorted by ledger (every "
                                        "checkpoint places it too); past twice this, adds are written straight "
                                        "to the entry logs (BookKeeper: a quarter of direct memory)")
    flush_entrylog_bytes: int = _key("flushEntrylogBytes", 2 << 20, "bytes a checkpoint writes to a ledger "
                                     "directory's entry log between two syncs of it (0: one sync at its end); small "
                                     "syncs spread the checkpoint's writeback, so journal syncs on the same disk do "
                                     "not wait behind a large one (BookKeeper: 0)")
    index_slot_log_max_size_mb: int = _key("indexSlotLogMaxSizeMb", 32, "walkit: MiB of index slots a ledger "
                                           "directory's slot log holds (8 bytes each, kept in RAM too): a checkpoint "
                                           "of many ledgers appends their slots there instead of writing an index "
                                           "file per ledger; past this, they are written to the index files at once "
                                           "(0: no slot log)")
    # Read caches (bookie/storage/_cache.py): a single read (READ_ENTRY) that goes to an
    # entry log reads the entries after it ahead; log buffers written lately stay in memory.
    read_ahead_cache_max_size_mb: int = _key("dbStorage_readAheadCacheMaxSizeMb", 64, "MiB of entries read ahead "
                                             "by single reads, kept for the reads that follow (0: no read-ahead; "
                                             "BookKeeper: a quarter of direct memory)")
    read_ahead_cache_batch_size: int = _key("dbStorage_readAheadCacheBatchSize", 100, "entries one read-ahead "
                                            "reads (1: no read-ahead)")
    read_ahead_cache_batch_bytes_size: int = _key("dbStorage_readAheadCacheBatchBytesSize", 1 << 20, "bytes one "
                                                  "read-ahead reads at most (1 MiB; <= 0: by count alone, "
                                                  "BookKeeper's default)")
    recent_writes_cache_max_size_mb: int = _key("recentWritesCacheMaxSizeMb", 16, "walkit: MiB of entry-log "
                                                "buffers written lately kept in memory for readers close behind "
                                                "the writers (0: off)")
    # Limits and disk usage: read-only once a ledger disk is fuller than the threshold,
    # writable again once every one is below the low-water mark; checked every interval.
    netty_max_frame_size_bytes: int = _key("nettyMaxFrameSizeBytes", 5 * 1024 * 1024, "bytes: largest wire "
                                           "frame (5 MiB, at least 4096); bounds an entry's size")
    disk_usage_threshold: float = _key("diskUsageThreshold", 0.95, "a ledger disk this full (or fuller) makes "
                                       "the bookie read-only")
    disk_usage_lwm_threshold: float = _key("diskUsageLwmThreshold", 0.90, "a read-only bookie is writable again "
                                           "once every ledger disk is below this")
    disk_check_interval: int = _key("diskCheckInterval", 10000, "ms between disk usage checks")
    # Above this (or diskUsageThreshold, if lower), major compaction pauses (it copies the
    # most); above diskUsageThreshold minor compaction too, unless isForceGCAllowWhenNoSpace.
    disk_usage_warn_threshold: float = _key("diskUsageWarnThreshold", 0.90, "major compaction pauses above it "
                                            "(minor above diskUsageThreshold)")
    # Garbage collection (bookie/gc): every gcWaitTime ms, ledgers deleted from metadata
    # leave this bookie; ledgers whose metadata no longer names it, on their own interval.
    gc_wait_time: int = _key("gcWaitTime", 600000, "ms between garbage collection passes")
    gc_overreplicated_ledger_wait_time: int = _key("gcOverreplicatedLedgerWaitTime", 86400000, "ms between checks "
                                                   "for ledgers whose metadata no longer names this bookie")
    gc_metadata_op_rate_limit: int = _key("gcMetadataOpRateLimit", 1000, "metadata reads per second by the "
                                          "garbage collector")
    # Compaction: entry logs whose live fraction is under the threshold are rewritten
    # (minor: sparse logs, often; major: most logs, daily); interval (s) <= 0 or
    # threshold <= 0 turns that kind off.
    minor_compaction_threshold: float = _key("minorCompactionThreshold", 0.2, "minor compaction rewrites entry "
                                             "logs less live than this (<= 0: off)")
    minor_compaction_interval: int = _key("minorCompactionInterval", 3600, "s between minor compactions (<= 0: off)")
    major_compaction_threshold: float = _key("majorCompactionThreshold", 0.8, "major compaction rewrites entry "
                                             "logs less live than this (<= 0: off)")
    major_compaction_interval: int = _key("majorCompactionInterval", 86400, "s between major compactions "
                                          "(<= 0: off)")
    # walkit: a pass stops after this long and the next one continues (BookKeeper: -1,
    # unbounded, one of its users' complaints); <= 0 means unbounded.
    minor_compaction_max_time_millis: int = _key("minorCompactionMaxTimeMillis", 3600000, "ms: a minor pass stops "
                                                 "there, the next continues (BookKeeper: -1; <= 0: unbounded)")
    major_compaction_max_time_millis: int = _key("majorCompactionMaxTimeMillis", 3600000, "ms: a major pass stops "
                                                 "there, the next continues (BookKeeper: -1; <= 0: unbounded)")
    # Compaction copies at most this many entries (or bytes, with isThrottleByBytes) per second.
    compaction_rate_by_entries: int = _key("compactionRateByEntries", 1000, "entries compaction copies per second")
    compaction_rate_by_bytes: int = _key("compactionRateByBytes", 1000000, "bytes compaction copies per second, "
                                         "with isThrottleByBytes")
    is_throttle_by_bytes: bool = _key("isThrottleByBytes", False, "pace compaction by bytes, not entries")
    is_force_gc_allow_when_no_space: bool = _key("isForceGCAllowWhenNoSpace", False, "let a forced pass (and any "
                                                 "pass on a full disk) compact anyway")
    # Autorecovery (walkit/recovery): this bookie also runs an auditor candidate and a
    # replication worker. A bookie gone lostBookieRecoveryDelay seconds is re-replicated.
    auto_recovery_daemon_enabled: bool = _key("autoRecoveryDaemonEnabled", False, "also run an auditor candidate "
                                              "and a replication worker (autorecovery)")
    lost_bookie_recovery_delay: int = _key("lostBookieRecoveryDelay", 0, "s a bookie must stay away before its "
                                           "ledgers are re-replicated")
    auditor_periodic_check_interval: int = _key("auditorPeriodicCheckInterval", 604800, "s between audits of "
                                                "every fragment's entries on its bookies (<= 0: off)")
    auditor_periodic_bookie_check_interval: int = _key("auditorPeriodicBookieCheckInterval", 86400, "s between "
                                                       "looks for ledgers naming unavailable bookies")
    open_ledger_rereplication_grace_period: int = _key("openLedgerRereplicationGracePeriod", 30000, "ms an open "
                                                       "ledger's live fragment is left to its writer")
    # The admin endpoint (bookie/_http.py): /heartbeat, /metrics, /api/v1/bookie/... on HTTP.
    http_server_enabled: bool = _key("httpServerEnabled", False, "serve the admin endpoint (/heartbeat, /metrics, "
                                     "/api/v1/...)")
    http_server_port: int = _key("httpServerPort", 8000, "the admin endpoint's port (0: any free one)")
    http_server_address: str = _key("httpServerAddress", "127.0.0.1", "the admin endpoint's address")

    def __post_init__(self) -> None:
        self.validate()

    @property
    def advertised_host(self) -> str:
        return self.advertised_address or self.bind_address

    @property
    def effective_bookie_id(self) -> str:
        return self.bookie_id or f"{self.advertised_host}:{self.bookie_port}"

    def validate(self) -> None:
        """Every key checked at load; a ConfigError names the key (``key=...``) and the
        value it refuses, so a bad file is fixed from the message alone. The checks run
        in this order, one concern each; the first key refused is the one reported."""
        _check_types(self)
        _check_directories_and_addresses(self)
        _check_journal_alignment(self)
        _check_bounds(self)
        _check_network(self)
        _check_tls(self)
        _check_disk_usage(self)
        _check_compaction(self)

    @classmethod
    def keys(cls) -> dict[str, str]:
        """BookKeeper key -> attribute name."""
        return {f.metadata["key"]: f.name for f in dataclasses.fields(cls)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> BookieConfig:
        known = cls.keys()
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError("unknown configuration keys", keys=",".join(unknown))
        return cls(**{known[k]: v for k, v in values.items()})

    @classmethod
    def from_toml(cls, path: str) -> BookieConfig:
        """The configuration in TOML file ``path``; ConfigError saying why a file cannot be
        read (no such file, a directory, permission denied) or where its syntax is wrong."""
        try:
            with open(path, "rb") as fh:
                values = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read configuration: {os_reason(exc)}", path=path) from exc
        except tomllib.TOMLDecodeError as exc:
            raise _toml_error(exc, path) from exc
        return cls.from_dict(values)

    def to_dict(self) -> dict[str, Any]:
        return {f.metadata["key"]: getattr(self, f.name) for f in dataclasses.fields(self)}


# --- validation: one check per concern, in the order BookieConfig.validate runs them ----

def _check_types(c: BookieConfig) -> None:
    """Each value of the declared type (an int is no bool; a float may be an int) and
    every float finite."""
    types: dict[str, type | tuple[type, ...]] = {"int": int, "float": (int, float), "bool": bool, "str": str}
    for f in dataclasses.fields(c):
        value = getattr(c, f.name)
        expected = types.get(str(f.type))
        if expected is not None and (not isinstance(value, expected) or (expected is int and isinstance(value, bool))):
            raise ConfigError("wrong type", key=f.metadata["key"], value=repr(value), expected=f.type)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError("must be a finite number", key=f.metadata["key"], value=repr(value))


def _check_directories_and_addresses(c: BookieConfig) -> None:
    """Ledger directories: a non-empty list of distinct paths; the journal directory
    and the addresses set."""
    dirs = c.ledger_directories
    if not isinstance(dirs, list) or not dirs or not all(isinstance(d, str) and d for d in dirs):
        _bad("ledgerDirectories", "must be a non-empty list of paths", dirs)
    if len(set(dirs)) != len(dirs):
        _bad("ledgerDirectories", "lists a directory twice", dirs)
    for key, text in (("journalDirectory", c.journal_directory), ("bindAddress", c.bind_address),
                      ("httpServerAddress", c.http_server_address)):
        if not text:
            _bad(key, "must not be empty", text)


def _check_journal_alignment(c: BookieConfig) -> None:
    """A power of two of at least MIN_ALIGNMENT, and of a whole 4 KiB block for O_DIRECT."""
    a = c.journal_alignment_size
    if a < MIN_ALIGNMENT or a & (a - 1):
        _bad("journalAlignmentSize", f"must be a power of two >= {MIN_ALIGNMENT}", a)
    if c.journal_direct_io and a < 4096:
        _bad("journalAlignmentSize", "must be at least 4096 with journalDirectIO (O_DIRECT writes whole 4 KiB "
             "blocks; BookKeeper's 512 is for buffered journals)", a)


#: Keys whose value must be positive, in the order they are checked.
_POSITIVE = (
    "journalMaxSizeMB", "journalPreAllocSizeMB", "journalBufferedWritesThreshold", "journalSyncWarnMillis",
    "entryLogSizeLimit", "openFileLimit", "flushInterval", "flushEntriesThreshold",
    "dbStorage_writeCacheMaxSizeMb", "nettyMaxFrameSizeBytes", "zkTimeout", "metadataRetryDeadlineMs",
    "maxPendingRequestsPerConnection", "maxPendingAddRequests", "maxPendingAddBytes", "maxLongPolls",
    "maxConnections", "numReadWorkerThreads", "dbStorage_readAheadCacheBatchSize", "diskCheckInterval",
    "gcWaitTime", "gcOverreplicatedLedgerWaitTime", "gcMetadataOpRateLimit", "compactionRateByEntries",
    "compactionRateByBytes", "auditorPeriodicBookieCheckInterval",
)
#: Keys whose value must not be negative (0 turns the thing off), in the order they are checked.
_NOT_NEGATIVE = (
    "journalMaxGroupWaitMSec", "journalBufferedEntriesThreshold", "journalMaxBackups", "journalRecycleFiles",
    "journalZeroFillRateMB", "flushEntrylogBytes", "indexSlotLogMaxSizeMb", "dbStorage_readAheadCacheMaxSizeMb",
    "recentWritesCacheMaxSizeMb", "lostBookieRecoveryDelay", "openLedgerRereplicationGracePeriod",
)


def _check_bounds(c: BookieConfig) -> None:
    """Sizes, counts and intervals: :data:`_POSITIVE` ones positive, then
    :data:`_NOT_NEGATIVE` ones not negative."""
    attribute = BookieConfig.keys()
    for key in _POSITIVE:
        value = getattr(c, attribute[key])
        if value <= 0:
            _bad(key, "must be positive", value)
    for key in _NOT_NEGATIVE:
        value = getattr(c, attribute[key])
        if value < 0:
            _bad(key, "must not be negative", value)


def _check_network(c: BookieConfig) -> None:
    """An advertised host clients can reach, a frame that holds an entry, ports in range,
    a metadata service URI that parses."""
    if c.advertised_host in ("0.0.0.0", "::", "*"):
        _bad("advertisedAddress", f"must be set to the host clients reach when bindAddress is a wildcard "
             f"({c.bind_address}): clients are told the advertised address", c.advertised_address)
    if c.netty_max_frame_size_bytes < 4096:
        _bad("nettyMaxFrameSizeBytes", "must be at least 4096", c.netty_max_frame_size_bytes)
    for key, port in (("bookiePort", c.bookie_port), ("httpServerPort", c.http_server_port)):
        if not 0 <= port <= 65535:
            _bad(key, "must be 0..65535", port)
    if c.metadata_service_uri:
        try:
            parse_metadata_uri(c.metadata_service_uri)
        except WalkitError as exc:
            raise ConfigError("not a metadata service URI (zk://host:port/path or local:///dir): " + str(exc),
                              key="metadataServiceUri") from exc


#: The smallest frame length whose first byte (0x16) is a TLS record's (bookie.server._tls).
_TLS_FIRST_BYTE_FRAME = 0x16000000


def _check_tls(c: BookieConfig) -> None:
    """A certificate and its key together; a trust store to verify clients by; frames
    whose length's first byte cannot be taken for TLS's (bookie.server._tls)."""
    if bool(c.tls_certificate_path) != bool(c.tls_key_store):
        _bad("tlsKeyStore" if c.tls_certificate_path else "tlsCertificatePath",
             "TLS needs both tlsCertificatePath and tlsKeyStore", c.tls_key_store or c.tls_certificate_path)
    if c.tls_certificate_path and c.netty_max_frame_size_bytes >= _TLS_FIRST_BYTE_FRAME:
        _bad("nettyMaxFrameSizeBytes", "with TLS it must stay below 352 MiB (a larger frame's first byte is "
             "TLS's)", c.netty_max_frame_size_bytes)
    if c.tls_client_authentication and not c.tls_trust_store:
        _bad("tlsTrustStore", "tlsClientAuthentication needs it (the CA to verify clients by)", "")


def _check_disk_usage(c: BookieConfig) -> None:
    """Fractions in (0, 1], the low-water mark at most the threshold."""
    if not 0 < c.disk_usage_threshold <= 1:
        _bad("diskUsageThreshold", "must be in (0, 1]", c.disk_usage_threshold)
    if not 0 < c.disk_usage_lwm_threshold <= c.disk_usage_threshold:
        _bad("diskUsageLwmThreshold", f"must be in (0, diskUsageThreshold = {c.disk_usage_threshold}]",
             c.disk_usage_lwm_threshold)
    if not 0 < c.disk_usage_warn_threshold <= 1:  # used as min(warn, diskUsageThreshold)
        _bad("diskUsageWarnThreshold", "must be in (0, 1]", c.disk_usage_warn_threshold)


def _check_compaction(c: BookieConfig) -> None:
    """Thresholds at most 1, minor at most major (<= 0: that compaction off)."""
    minor, major = c.minor_compaction_threshold, c.major_compaction_threshold
    if major > 1:
        _bad("majorCompactionThreshold", "must be at most 1 (<= 0: major compaction off)", major)
    if minor > 1 or (minor > 0 and major > 0 and minor > major):
        _bad("minorCompactionThreshold", f"must be at most 1 and at most majorCompactionThreshold ({major}) "
             "(<= 0: minor compaction off)", minor)


_OS_REASONS = {errno.ENOENT: "no such file", errno.EISDIR: "is a directory", errno.EACCES: "permission denied",
               errno.EPERM: "permission denied", errno.ENOTDIR: "a parent of it is not a directory"}
#: tomllib's messages end in "(at line L, column C)" or "(at end of document)".
_TOML_WHERE = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)$")


def os_reason(exc: OSError) -> str:
    """What is wrong with a path, in a few words (``no such file``, ``is a directory``...)."""
    return _OS_REASONS.get(exc.errno or 0) or (exc.strerror or str(exc)).lower()


def _toml_error(exc: tomllib.TOMLDecodeError, path: str) -> ConfigError:
    """``not valid TOML: <what>`` with the line and column (Python 3.14 has them as
    attributes; before, only in the message)."""
    text = str(exc)
    where = _TOML_WHERE.search(text)
    line = getattr(exc, "lineno", None) or (where.group(1) if where else None)
    column = getattr(exc, "colno", None) or (where.group(2) if where else None)
    what = getattr(exc, "msg", None) or (text[: where.start()] if where else text)
    if line is None and "end of document" in text:
        what += " at the end of the file"
    return ConfigError(f"cannot read configuration: not valid TOML: {what}", path=path, line=line, column=column)


def reference() -> str:
    """Every key as a Markdown table - key, default (as TOML writes it), meaning - the
    configuration reference of docs/operations.md (``python -m bookie --config-reference``)."""
    defaults = BookieConfig().to_dict()
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(BookieConfig):
        key = f.metadata["key"]
        rows.append(f"| `{key}` | `{_toml(defaults[key])}` | {f.metadata['doc']} |")
    return "\n".join(rows) + "\n"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is a JSON string for these values
    return repr(value)
