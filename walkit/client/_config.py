"""The ledger client's options (``walkit.BookKeeper(uri, **options)``).

Defaults follow BookKeeper's client where they make sense for Python bookies on a LAN
(``reference/bookkeeper.md`` §1.2-1.3); where walkit differs the comment says why.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from walkit.errors import InvalidArgumentError
from walkit.metadata import RETRY_DEADLINE
from walkit.protocol import DEFAULT_MAX_FRAME_SIZE, MIN_MAX_FRAME_SIZE

__all__ = ["ClientConfig"]


@dataclass(frozen=True)
class ClientConfig:
    # A bookie that has not answered an add or read in this long is failed for that
    # request (BookKeeper: addEntryTimeoutSec = readEntryTimeoutSec = 5 s).
    add_timeout: float = 5.0
    read_timeout: float = 5.0
    # A read not answered by one replica after this long is also sent to the next one.
    # BookKeeper waits 2 s; walkit's bookies answer in milliseconds, so a replica silent
    # for 0.5 s is a slow or failing one and the next replica is the faster bet.
    speculative_read_timeout: float = 0.5
    connect_timeout: float = 5.0
    # Send the LAC on its own (WRITE_LAC) when it advanced and no entry carried it for
    # this long; 0 = off, as in BookKeeper (explicitLacInterval).
    explicit_lac_interval: float = 0.0
    # When a writer's last pending add completes (it goes idle), send that LAC at once
    # (WRITE_LAC to the bookies that acknowledged the entry, which publish it without an
    # fsync), so a tailing reader sees the last entry without waiting for the next one
    # (walkit; BookKeeper has only the timer above). Off: the LAC rides on the next
    # entry. None: on for WriteAheadLog writers (tailing is what a log is for), and for a
    # plain ledger's writer unless another writer of the client went idle within 1 ms (a
    # client writing many ledgers at once: there it would cost two requests per add).
    idle_lac: bool | None = None
    # A writer whose last idle spell was shorter than this (seconds: it appends back to
    # back) lets its idle LAC wait this long, and an add meanwhile carries the LAC on its
    # entry instead: a writer appending one record at a time sends no WRITE_LAC at all,
    # where at once it sent two per append; the last entry of such a run is seen this
    # much later. After a longer spell, at once; 0: always (walkit/client/_writer_lac.py).
    idle_lac_delay: float = 0.0005
    # Metadata session timeout (seconds; zkTimeout).
    session_timeout: float = 10.0
    # A metadata call (ledger create / open / delete, ensemble change, WAL open, roll,
    # snapshot) waits this long for an unreachable ZooKeeper or a locked local:// store,
    # then fails with MetadataUnavailableError (walkit; BookKeeper retries by count).
    metadata_retry_deadline: float = RETRY_DEADLINE
    # Open the metadata store read-only (walkit; the inspection commands): ledgers open
    # without recovery and read, nothing in metadata changes (create, delete, recovery:
    # MetadataReadOnlyError), and a local:// store needs no write access and gets no session.
    metadata_read_only: bool = False
    # Wire frames past this size are refused (nettyMaxFrameSizeBytes).
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    # Entries read at once by one read() / follow(), and looked ahead during recovery.
    read_parallelism: int = 64
    recovery_read_parallelism: int = 16
    # Sequential reads of a ledger whose bookies each hold every entry (E = Qw) ask for
    # runs of entries (READ_RANGE): each run at most this many bytes of entries (and what
    # fits in max_frame_size), this many runs in flight per read (walkit; BookKeeper's
    # batch reads, BP-62, bound a batch by count and bytes too).
    read_batch_bytes: int = 1 << 20
    read_batches_in_flight: int = 4
    # False: read entry by entry (READ_ENTRY) even where runs could be used (a benchmark's
    # A/B; bookies that do not know READ_RANGE are found out without it).
    range_reads: bool = True
    # Adds of one handle in flight at most: add_entry_async blocks the caller (sync API)
    # or waits (asyncio API) past it, so memory stays bounded under a fast producer.
    max_pending_adds: int = 10_000
    # Apache BookKeeper bookies (registered with kind "bookkeeper") are spoken to in
    # BookKeeper's v3 (protobuf) dialect, or in v2 (binary) when this is on
    # (BookKeeper's useV2WireProtocol). v2 has no long polls (polled instead) nor LAC writes.
    use_v2_wire_protocol: bool = False
    # TLS: the CA that signed the bookies' certificates, and the client's own
    # certificate/key when bookies ask for one. To walkit bookies that registered with
    # TLS, TLS from the first byte; to Apache BookKeeper bookies, whenever the CA is set,
    # START_TLS first (as BookKeeper's client with TLS configured), then TLS.
    tls_ca_file: str = ""
    tls_certificate: str = ""
    tls_key: str = ""

    def __post_init__(self) -> None:
        for name in ("add_timeout", "read_timeout", "speculative_read_timeout", "connect_timeout",
                     "session_timeout", "metadata_retry_deadline"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise InvalidArgumentError("client option must be a positive number of seconds", option=name,
                                           value=value)
        if not isinstance(self.explicit_lac_interval, (int, float)) or self.explicit_lac_interval < 0:
            raise InvalidArgumentError("explicit_lac_interval must be >= 0 (0: off)", value=self.explicit_lac_interval)
        if not isinstance(self.idle_lac_delay, (int, float)) or isinstance(self.idle_lac_delay, bool) or \
                not 0 <= self.idle_lac_delay <= 60:
            raise InvalidArgumentError("idle_lac_delay is seconds, 0 to 60 (0: at once)", value=self.idle_lac_delay)
        for flag in ("range_reads", "metadata_read_only", "use_v2_wire_protocol"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidArgumentError("client option is True or False", option=flag, value=getattr(self, flag))
        if self.idle_lac is not None and not isinstance(self.idle_lac, bool):
            raise InvalidArgumentError("idle_lac is True, False or None", value=self.idle_lac)
        for name in ("read_parallelism", "recovery_read_parallelism", "max_pending_adds", "read_batch_bytes",
                     "read_batches_in_flight"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgumentError("client option must be an int >= 1", option=name, value=value)
        if not isinstance(self.max_frame_size, int) or self.max_frame_size < MIN_MAX_FRAME_SIZE:
            raise InvalidArgumentError("max_frame_size too small", value=self.max_frame_size, min=MIN_MAX_FRAME_SIZE)

    @classmethod
    def of(cls, base: ClientConfig | None, options: dict[str, Any]) -> ClientConfig:
        """``base`` (or the defaults) with ``options`` applied; unknown names are refused."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidArgumentError("unknown client option", options=",".join(unknown), known=",".join(sorted(known)))
        return dataclasses.replace(base or cls(), **options)
