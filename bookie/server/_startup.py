"""What a bookie claims and checks before it serves: its TLS context, its directories'
locks, its id and its cookie.

Theory of operation
-------------------
:meth:`BookieServer.start` binds first (so the port, and with it the default bookie id,
is known), then on an executor thread: locks its directories, connects to the metadata
store, starts the core and checks the bookie's identity against the cluster before it
registers. Each step here stops the start with an error naming what to fix, *before*
anything that could hurt data happens:

* :func:`lock_directories`: an exclusive ``flock`` on ``<dir>/LOCK`` of the journal and
  every ledger directory (released when the process ends, even by kill -9): a second
  process started on the same disks by mistake stops here, before it touches the journal.
* :func:`check_picked_port`: ``bookiePort = 0`` without a bookieId names a port chosen
  at each start; disks an earlier start stamped under another id are refused here, with
  the setting to give.
* :func:`refuse_known_id` (before empty disks are stamped): a cluster that already knows
  this id means the bookie's data was wiped - an empty bookie answering "no such entry"
  for what it acknowledged could let a recovery lose data.
* :func:`check_cookie`: the disks' cookie must be the one in metadata (a new bookie
  stores its own); in a BookKeeper-format cluster the one in metadata is BookKeeper's
  text cookie (:mod:`bookie.cookie`), while the disks keep walkit's.

In a BookKeeper-format cluster :func:`check_bookkeeper_id` first refuses an id
BookKeeper's own code would not parse. What the bookie then registers is :func:`service_info`: walkit's JSON, or BookKeeper's
service info in a BookKeeper-format cluster.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import ssl
from collections.abc import Callable
from typing import Any

from bookie._config import BookieConfig, os_reason
from bookie.cookie import Cookie, decode_from_metadata, encode_for_metadata
from bookie.cookie import read_cookie as read_disk_cookie
from bookie.fs import FileSystem
from walkit.errors import BookieError, ConfigError, CookieError, WalkitError
from walkit.logs import context

__all__ = ["autorecovery_for", "check_bookkeeper_id", "check_cookie", "check_picked_port", "lock_directories",
           "marked_under_replicated", "refuse_known_id", "server_ssl_context", "service_info"]

log = logging.getLogger("bookie.server")


def server_ssl_context(config: BookieConfig) -> ssl.SSLContext:
    """TLS for the server from the PEM files of the configuration."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(config.tls_certificate_path, config.tls_key_store)
    if config.tls_trust_store:
        ctx.load_verify_locations(config.tls_trust_store)
    ctx.verify_mode = ssl.CERT_REQUIRED if config.tls_client_authentication else ssl.CERT_NONE
    return ctx


def lock_directories(config: BookieConfig) -> list[int]:
    """An exclusive lock on each directory (``<dir>/LOCK``, released when the process
    ends, even by kill -9); the descriptors, to close at shutdown."""
    keyed = [("journalDirectory", config.journal_directory)] + [
        ("ledgerDirectories", d) for d in config.ledger_directories]
    locks: list[int] = []
    try:
        for key, d in keyed:
            fd = _open_lock_file(key, d)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                os.close(fd)
                raise BookieError("directory in use by another bookie process", dir=d) from exc
            locks.append(fd)
    except BaseException:
        for fd in locks:
            os.close(fd)
        raise
    return locks


def _open_lock_file(key: str, directory: str) -> int:
    """``<directory>/LOCK``, open, with the directory made if missing; a ConfigError
    naming configuration key ``key`` and the path when the directory cannot be used (a
    file is there, no permission...), instead of a bare ``[Errno 17] File exists``."""
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError as exc:
        raise ConfigError(f"{key} is a file, not a directory", key=key, path=directory) from exc
    except OSError as exc:
        raise ConfigError(f"{key} cannot be created: {os_reason(exc)}", key=key, path=directory) from exc
    try:
        return os.open(os.path.join(directory, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError(f"{key} cannot be used: {os_reason(exc)}", key=key, path=directory) from exc


def check_picked_port(fs: FileSystem, config: BookieConfig, bookie_id: str, port: int) -> None:
    """``bookiePort = 0`` without a bookieId: the id names the port this start got,
    another at every start. Disks an earlier start stamped are refused here, with
    the port (or id) to give, rather than as a cookie mismatch. (Not refused on new
    disks: LocalCluster starts a bookie so, then gives the port it got every time.)"""
    stamped = read_disk_cookie(fs, config.journal_directory)
    if stamped is None:
        log.info("bookie id %s names a port chosen at this start (bookiePort = 0, no bookieId): later starts "
                 "must set bookiePort = %d (or this bookieId)", bookie_id, port, extra=context(bookie=bookie_id))
    elif stamped.bookie_id != bookie_id:
        stamped_port = stamped.bookie_id.rpartition(":")[2]
        fix = f"bookiePort = {stamped_port}, or " if stamped_port.isdigit() else ""
        raise ConfigError(f"bookiePort must not be 0 here (without a bookieId): the bookie id names the port, "
                          f"and would change at every start; these disks are bookie {stamped.bookie_id}'s: "
                          f"set {fix}bookieId = \"{stamped.bookie_id}\" (then any port will do)",
                          key="bookiePort", bookie=bookie_id, disks=stamped.bookie_id)


def refuse_known_id(cluster: Any, bookie_id: str) -> None:
    """Before empty disks become this bookie's: the cluster must not know its id yet."""
    from walkit.metadata import read_cookie

    if read_cookie(cluster.store, cluster.info, bookie_id) is not None:
        raise CookieError(
            "this bookie's disks are empty but the cluster knows its id: its data was wiped or its disks "
            "replaced, and an empty bookie answering \"no such entry\" for what it acknowledged could let "
            "a recovery lose data; re-replicate what it held (`walkit recover --bookie ID`), then either "
            "start it under a new bookieId or drop its old cookie (`walkit bookie cookie delete --bookie "
            "ID --metadata URI`)", bookie=bookie_id)


def check_cookie(cluster: Any, mine: Cookie, bookie_id: str) -> None:
    """The disks' cookie must be the one in metadata; a new bookie stores its own (a
    create: a racing start loses with NodeExistsError). In a BookKeeper-format cluster
    the one in metadata is BookKeeper's text cookie (:func:`bookie.cookie.encode_for_metadata`),
    so BookKeeper's tools (``cookie_get``...) see a walkit bookie as one of theirs; it is
    compared field by field with the disks' own (walkit's, which stays on the disks) and
    any difference refuses the start, as BookKeeper's bookie does."""
    from walkit.metadata import read_cookie, write_cookie

    fmt = cluster.info.format
    stored = read_cookie(cluster.store, cluster.info, bookie_id)
    if stored is None:
        write_cookie(cluster.store, cluster.info, bookie_id, encode_for_metadata(mine, fmt), None)
        return
    mine.verify_matches(decode_from_metadata(stored[0], fmt, bookie_id=bookie_id), where="metadata")


#: What BookKeeper's ``BookieId`` accepts (its check, read as Java reads the class: ``:-_``
#: is the range ':' to '_'), "readonly" in any case excepted.
_BK_ID = re.compile(r"[a-zA-Z0-9:-_.\-]+")


def check_bookkeeper_id(cluster: Any, bookie_id: str) -> None:
    """In a BookKeeper-format cluster the id must be one BookKeeper's ``BookieId`` accepts:
    its client, bookies and tools parse every registration and ensemble member, and one
    they refuse would break them, not just this bookie. ConfigError naming the key."""
    if cluster.info.format == "bookkeeper" and (not _BK_ID.fullmatch(bookie_id) or bookie_id.lower() == "readonly"):
        raise ConfigError("bookieId is not one BookKeeper accepts in its cluster (letters, digits, '.', '-' and "
                          "':' to '_' in ASCII; not \"readonly\")", key="bookieId", bookie=bookie_id)


def service_info(cluster: Any, config: BookieConfig, endpoint: str, tls: bool, http_port: int) -> bytes:
    """What the bookie registers (:mod:`walkit.metadata._service_info`): walkit's JSON,
    or in a BookKeeper-format cluster BookKeeper's service info with the data port as its
    ``bookie-rpc`` endpoint (with the extension ``tls`` when it serves TLS), the admin
    endpoint (``http_port`` 0: off) and the walkit marker."""
    from walkit.metadata import encode_service_info
    from walkit.protocol import PROTOCOL_VERSION

    http = (config.http_server_address, http_port) if http_port else None
    return encode_service_info(cluster.info.format, endpoint, tls=tls, protocol=PROTOCOL_VERSION, http=http)


def marked_under_replicated(cluster: Any) -> Callable[[int], bool]:
    """Whether a ledger is marked under-replicated (GC never takes it as over-replicated
    meanwhile): the cluster's markers, walkit's or, in a BookKeeper-format cluster,
    BookKeeper's own (set by either kind's auditor)."""
    from walkit.metadata import UnderReplication

    marked: Callable[[int], bool] = UnderReplication(cluster.store, cluster.info).is_marked
    return marked


def autorecovery_for(config: BookieConfig, bookie_id: str) -> Any:
    """The auditor candidate and replication worker of this bookie (walkit/recovery): a
    ``walkit.recovery.AutoRecovery``, not started yet."""
    from walkit.recovery import AutoRecovery, AutoRecoveryConfig

    c = config
    recovery_config = AutoRecoveryConfig(
        lost_bookie_recovery_delay=c.lost_bookie_recovery_delay,
        auditor_periodic_check_interval=c.auditor_periodic_check_interval,
        auditor_periodic_bookie_check_interval=c.auditor_periodic_bookie_check_interval,
        open_ledger_rereplication_grace_period=c.open_ledger_rereplication_grace_period / 1000.0)
    return AutoRecovery(c.metadata_service_uri, bookie_id, recovery_config, session_timeout=c.zk_timeout / 1000.0,
                        retry_deadline=c.metadata_retry_deadline_ms / 1000.0, tls_ca=c.tls_trust_store)
