"""Bookie configuration: BookKeeper's key names and defaults, loadable from TOML.

Attributes are snake_case; the TOML keys are BookKeeper's (``journalMaxGroupWaitMSec``,
``ledgerDirectories``, ...). Keys that walkit adds are marked "walkit" below.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from typing import Any

from walkit.errors import ConfigError

__all__ = ["BookieConfig"]


def _key(key: str, default: Any) -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"key": key})
    return field(default=default, metadata={"key": key})


@dataclass
class BookieConfig:
    # Identity and network. The id names the cookie and the registration.
    bookie_id: str = _key("bookieId", "")  # default: "<bindAddress>:<bookiePort>"
    bookie_port: int = _key("bookiePort", 3181)
    bind_address: str = _key("bindAddress", "127.0.0.1")  # walkit: loopback unless told otherwise
    # The host clients reach (the id's host and the registered endpoint); needed when
    # bindAddress is a wildcard such as 0.0.0.0.
    advertised_address: str = _key("advertisedAddress", "")
    # Metadata: "" runs without (no registration, no cookie in metadata: tests, benchmarks).
    metadata_service_uri: str = _key("metadataServiceUri", "")
    zk_timeout: int = _key("zkTimeout", 10000)  # ms: the metadata session timeout
    # Server limits: reading pauses on a connection past this many requests in flight
    # (walkit), and adds past the bookie-wide bound are answered ETOOMANYREQUESTS.
    max_pending_requests_per_connection: int = _key("maxPendingRequestsPerConnection", 10000)
    max_pending_add_requests: int = _key("maxPendingAddRequests", 100000)
    max_pending_add_bytes: int = _key("maxPendingAddBytes", 256 << 20)  # walkit: entry bytes in flight
    max_long_polls: int = _key("maxLongPolls", 100000)  # walkit: parked long-poll reads, bookie-wide
    max_connections: int = _key("maxConnections", 1024)  # walkit
    num_read_worker_threads: int = _key("numReadWorkerThreads", 4)
    # TLS (PEM files; off when tlsCertificatePath is empty).
    tls_certificate_path: str = _key("tlsCertificatePath", "")
    tls_key_store: str = _key("tlsKeyStore", "")  # the private key, PEM
    tls_trust_store: str = _key("tlsTrustStore", "")  # CA certificates to verify clients by
    tls_client_authentication: bool = _key("tlsClientAuthentication", False)
    # Directories.
    journal_directory: str = _key("journalDirectory", "/tmp/bk-txn")
    ledger_directories: list[str] = _key("ledgerDirectories", ["/tmp/bk-data"])
    # Journal group commit: wait at most 2 ms or 512 KiB to batch many entries per fsync.
    journal_max_group_wait_msec: float = _key("journalMaxGroupWaitMSec", 2.0)
    journal_buffered_writes_threshold: int = _key("journalBufferedWritesThreshold", 512 * 1024)
    journal_buffered_entries_threshold: int = _key("journalBufferedEntriesThreshold", 0)
    # walkit: true (BookKeeper: false); our sync thread groups while it is busy, so
    # waiting on an idle disk only adds latency (bookie/journal/_policy.py).
    journal_flush_when_queue_empty: bool = _key("journalFlushWhenQueueEmpty", True)
    # Journal files: 2 GiB files, zero-filled 16 MiB ahead, 5 kept behind the mark.
    journal_max_size_mb: int = _key("journalMaxSizeMB", 2048)
    journal_pre_alloc_size_mb: int = _key("journalPreAllocSizeMB", 16)
    journal_max_backups: int = _key("journalMaxBackups", 5)
    # walkit: retired journals kept for reuse, so appends overwrite written blocks
    # instead of converting fresh (fallocated) extents at every fdatasync.
    journal_recycle_files: int = _key("journalRecycleFiles", 2)
    # walkit: 4 KiB, the O_DIRECT alignment of today's disks (BookKeeper's default is 512).
    journal_alignment_size: int = _key("journalAlignmentSize", 4096)
    journal_sync_data: bool = _key("journalSyncData", True)  # false: ack before fdatasync
    journal_direct_io: bool = _key("journalDirectIO", True)  # walkit: O_DIRECT when allowed
    journal_sync_warn_millis: int = _key("journalSyncWarnMillis", 1000)  # walkit: log a slower write+sync
    # Ledger storage and checkpoints.
    entry_log_size_limit: int = _key("entryLogSizeLimit", 1 << 30)
    open_file_limit: int = _key("openFileLimit", 1024)  # index files kept open (BK: 20000)
    flush_interval: int = _key("flushInterval", 60000)  # ms between checkpoints
    # walkit: checkpoint early once this many entries wait in memory, bounding RAM.
    flush_entries_threshold: int = _key("flushEntriesThreshold", 200_000)
    # Limits and disk usage: read-only once a ledger disk is fuller than the threshold,
    # writable again once every one is below the low-water mark; checked every interval.
    netty_max_frame_size_bytes: int = _key("nettyMaxFrameSizeBytes", 5 * 1024 * 1024)
    disk_usage_threshold: float = _key("diskUsageThreshold", 0.95)
    disk_usage_lwm_threshold: float = _key("diskUsageLwmThreshold", 0.90)
    disk_check_interval: int = _key("diskCheckInterval", 10000)  # ms
    # Above this (or diskUsageThreshold, if lower), major compaction pauses (it copies the
    # most); above diskUsageThreshold minor compaction too, unless isForceGCAllowWhenNoSpace.
    disk_usage_warn_threshold: float = _key("diskUsageWarnThreshold", 0.90)
    # Garbage collection (bookie/gc): every gcWaitTime ms, ledgers deleted from metadata
    # leave this bookie; ledgers whose metadata no longer names it, on their own interval.
    gc_wait_time: int = _key("gcWaitTime", 600000)  # ms
    gc_overreplicated_ledger_wait_time: int = _key("gcOverreplicatedLedgerWaitTime", 86400000)  # ms
    gc_metadata_op_rate_limit: int = _key("gcMetadataOpRateLimit", 1000)  # metadata reads per second
    # Compaction: entry logs whose live fraction is under the threshold are rewritten
    # (minor: sparse logs, often; major: most logs, daily); interval (s) <= 0 or
    # threshold <= 0 turns that kind off.
    minor_compaction_threshold: float = _key("minorCompactionThreshold", 0.2)
    minor_compaction_interval: int = _key("minorCompactionInterval", 3600)  # s
    major_compaction_threshold: float = _key("majorCompactionThreshold", 0.8)
    major_compaction_interval: int = _key("majorCompactionInterval", 86400)  # s
    # walkit: a pass stops after this long and the next one continues (BookKeeper: -1,
    # unbounded, one of its users' complaints); <= 0 means unbounded.
    minor_compaction_max_time_millis: int = _key("minorCompactionMaxTimeMillis", 3600000)
    major_compaction_max_time_millis: int = _key("majorCompactionMaxTimeMillis", 3600000)
    # Compaction copies at most this many entries (or bytes, with isThrottleByBytes) per second.
    compaction_rate_by_entries: int = _key("compactionRateByEntries", 1000)
    compaction_rate_by_bytes: int = _key("compactionRateByBytes", 1000000)
    is_throttle_by_bytes: bool = _key("isThrottleByBytes", False)
    is_force_gc_allow_when_no_space: bool = _key("isForceGCAllowWhenNoSpace", False)
    # Autorecovery (walkit/recovery): this bookie also runs an auditor candidate and a
    # replication worker. A bookie gone lostBookieRecoveryDelay seconds is re-replicated.
    auto_recovery_daemon_enabled: bool = _key("autoRecoveryDaemonEnabled", False)
    lost_bookie_recovery_delay: int = _key("lostBookieRecoveryDelay", 0)  # s
    auditor_periodic_check_interval: int = _key("auditorPeriodicCheckInterval", 604800)  # s; <= 0: off
    auditor_periodic_bookie_check_interval: int = _key("auditorPeriodicBookieCheckInterval", 86400)  # s
    open_ledger_rereplication_grace_period: int = _key("openLedgerRereplicationGracePeriod", 30000)  # ms
    # The admin endpoint (bookie/_http.py): /heartbeat, /metrics, /api/v1/bookie/... on HTTP.
    http_server_enabled: bool = _key("httpServerEnabled", False)
    http_server_port: int = _key("httpServerPort", 8000)  # 0: any free port
    http_server_address: str = _key("httpServerAddress", "127.0.0.1")

    def __post_init__(self) -> None:
        self.validate()

    @property
    def advertised_host(self) -> str:
        return self.advertised_address or self.bind_address

    @property
    def effective_bookie_id(self) -> str:
        return self.bookie_id or f"{self.advertised_host}:{self.bookie_port}"

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            types: dict[str, type | tuple[type, ...]] = {"int": int, "float": (int, float), "bool": bool, "str": str}
            expected = types.get(str(f.type))
            if expected is not None and (not isinstance(value, expected) or (expected is int and isinstance(value, bool))):
                raise ConfigError("wrong type", key=f.metadata["key"], value=repr(value), expected=f.type)
        dirs = self.ledger_directories
        if not isinstance(dirs, list) or not dirs or not all(isinstance(d, str) and d for d in dirs):
            raise ConfigError("ledgerDirectories must be a non-empty list of paths", value=self.ledger_directories)
        if len(set(self.ledger_directories)) != len(self.ledger_directories):
            raise ConfigError("ledgerDirectories lists a directory twice", value=self.ledger_directories)
        a = self.journal_alignment_size
        if a < 512 or a & (a - 1):
            raise ConfigError("journalAlignmentSize must be a power of two >= 512", value=a)
        positive = {
            "journalMaxSizeMB": self.journal_max_size_mb,
            "journalPreAllocSizeMB": self.journal_pre_alloc_size_mb,
            "journalBufferedWritesThreshold": self.journal_buffered_writes_threshold,
            "entryLogSizeLimit": self.entry_log_size_limit,
            "openFileLimit": self.open_file_limit,
            "flushInterval": self.flush_interval,
            "flushEntriesThreshold": self.flush_entries_threshold,
            "nettyMaxFrameSizeBytes": self.netty_max_frame_size_bytes,
            "zkTimeout": self.zk_timeout,
            "maxPendingRequestsPerConnection": self.max_pending_requests_per_connection,
            "maxPendingAddRequests": self.max_pending_add_requests,
            "maxPendingAddBytes": self.max_pending_add_bytes,
            "maxLongPolls": self.max_long_polls,
            "maxConnections": self.max_connections,
            "numReadWorkerThreads": self.num_read_worker_threads,
            "diskCheckInterval": self.disk_check_interval,
            "gcWaitTime": self.gc_wait_time,
            "gcOverreplicatedLedgerWaitTime": self.gc_overreplicated_ledger_wait_time,
            "gcMetadataOpRateLimit": self.gc_metadata_op_rate_limit,
            "compactionRateByEntries": self.compaction_rate_by_entries,
            "compactionRateByBytes": self.compaction_rate_by_bytes,
            "auditorPeriodicBookieCheckInterval": self.auditor_periodic_bookie_check_interval,
        }
        for key, value in positive.items():
            if value <= 0:
                raise ConfigError("must be positive", key=key, value=value)
        if min(self.journal_max_group_wait_msec, self.journal_buffered_entries_threshold, self.journal_max_backups,
               self.journal_recycle_files) < 0:
            raise ConfigError("journal thresholds must not be negative")
        if not self.bookie_id and self.advertised_host in ("", "0.0.0.0", "::", "*"):
            raise ConfigError("bindAddress is a wildcard: set advertisedAddress (or bookieId) to the host clients reach",
                              bindAddress=self.bind_address)
        if self.netty_max_frame_size_bytes < 4096:
            raise ConfigError("nettyMaxFrameSizeBytes must be at least 4096", value=self.netty_max_frame_size_bytes)
        if not 0 <= self.bookie_port <= 65535:
            raise ConfigError("bookiePort must be 0..65535", value=self.bookie_port)
        if not 0 <= self.http_server_port <= 65535:
            raise ConfigError("httpServerPort must be 0..65535", value=self.http_server_port)
        if self.journal_sync_warn_millis <= 0:
            raise ConfigError("must be positive", key="journalSyncWarnMillis", value=self.journal_sync_warn_millis)
        if bool(self.tls_certificate_path) != bool(self.tls_key_store):
            raise ConfigError("TLS needs both tlsCertificatePath and tlsKeyStore",
                              certificate=self.tls_certificate_path, key=self.tls_key_store)
        if self.tls_client_authentication and not self.tls_trust_store:
            raise ConfigError("tlsClientAuthentication needs tlsTrustStore (the CA to verify clients by)")
        if not 0 < self.disk_usage_lwm_threshold <= self.disk_usage_threshold <= 1:
            raise ConfigError(
                "need 0 < diskUsageLwmThreshold <= diskUsageThreshold <= 1",
                lwm=self.disk_usage_lwm_threshold, threshold=self.disk_usage_threshold,
            )
        if not 0 < self.disk_usage_warn_threshold <= 1:  # used as min(warn, diskUsageThreshold)
            raise ConfigError("need 0 < diskUsageWarnThreshold <= 1", warn=self.disk_usage_warn_threshold)
        if self.lost_bookie_recovery_delay < 0 or self.open_ledger_rereplication_grace_period < 0:
            raise ConfigError("autorecovery delays must not be negative",
                              lostBookieRecoveryDelay=self.lost_bookie_recovery_delay,
                              openLedgerRereplicationGracePeriod=self.open_ledger_rereplication_grace_period)
        minor, major = self.minor_compaction_threshold, self.major_compaction_threshold
        if not (minor <= 1 and major <= 1 and (minor <= 0 or major <= 0 or minor <= major)):
            raise ConfigError("compaction thresholds must be at most 1, minor below major",
                              minorCompactionThreshold=minor, majorCompactionThreshold=major)

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
        try:
            with open(path, "rb") as fh:
                values = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError("cannot read configuration", path=path) from exc
        return cls.from_dict(values)

    def to_dict(self) -> dict[str, Any]:
        return {f.metadata["key"]: getattr(self, f.name) for f in dataclasses.fields(self)}
