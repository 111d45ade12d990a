"""Becoming a log's single writer: the claim of its epoch, the fence, the first segment.

Theory of operation
-------------------
Opening for writing makes the caller the single writer: it bumps the epoch in the log
node (a compare-and-set; a new log's node is made with epoch 1 already claimed), opens
the last two segments with recovery - which fences the previous writer's ledger and
closes it at what was acknowledged - creates a new ledger and appends it as the next
segment (a compare-and-set that first checks the epoch is still ours). The previous
writer's next add fails with EFENCED; its next metadata change sees the new epoch;
either way it gets :class:`WriterFencedError` and is done for good.

Nothing moves for a wrong password: it is checked against the node (or the segments'
ledgers, for a log an older walkit made) before the epoch is bumped. The options are
checked before anything is read (:meth:`OpenRequest.make`), on the caller's side.

A segment whose ledger was made but whose addition to the node failed is settled
(:func:`walkit.wal._node.settle`): its ledger is deleted only if the node surely never
names it - a write whose reply was lost may have landed, and deleting a segment the log
names would lose its records (:func:`discard_segment`, also used by rolls).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from walkit.client import BookKeeper, LedgerWriter
from walkit.errors import InvalidArgumentError, MetadataVersionError, NoSuchLedgerError, WalkitError, WriterFencedError
from walkit.logs import context
from walkit.metadata import ledger_digest, retry_cas
from walkit.wal._auth import LogAuth
from walkit.wal._format import LogMetadata, LogSettings, Retention, Segment
from walkit.wal._node import LogNode, settle
from walkit.wal._records import DEFAULT_MAX_RECORD_BYTES, check_max_record_bytes

__all__ = ["Claimed", "OpenRequest", "claim", "client_of", "discard_segment", "new_segment_ledger"]

log = logging.getLogger("walkit.wal._log")  # the logger these lines always had

#: Seconds an idle log's last record may look stale to readers when the client's
#: ``idle_lac`` is False (otherwise the writer publishes its LAC once it is idle: walkit/client/_writer_lac.py).
EXPLICIT_LAC_INTERVAL = 0.1


def client_of(client_or_uri: BookKeeper | str) -> tuple[BookKeeper, bool]:
    """The client a log handle runs on, and whether the handle owns it (made from a URI)."""
    if isinstance(client_or_uri, BookKeeper):
        return client_or_uri, False
    if isinstance(client_or_uri, str):
        return BookKeeper(client_or_uri), True
    raise InvalidArgumentError("expected a walkit.BookKeeper or a metadata URI", type=type(client_or_uri).__name__)


@dataclass(frozen=True)
class OpenRequest:
    """``WriteAheadLog.open``'s arguments, checked: ``asked`` the settings a new log
    takes, ``policy`` the retention settings every open writes."""

    node: LogNode
    password: bytes
    asked: dict[str, Any]
    policy: dict[str, Any]
    max_entry_bytes: int
    max_inflight_entries: int
    max_record_bytes: int

    @classmethod
    def make(cls, bk: BookKeeper, name: str, *, namespace: str = "default", password: bytes = b"",
             ensemble_size: int | None = None, write_quorum: int | None = None, ack_quorum: int | None = None,
             roll_bytes: int | None = None, roll_seconds: float | None = None, max_entry_bytes: int = 1 << 20,
             max_inflight_entries: int = 4, retention: Retention | Mapping[str, Any] | None = None,
             snapshots_kept: int | None = None, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> OpenRequest:
        """The checks of an open, made now (they block on nothing)."""
        node = LogNode(bk.client.cluster, namespace, name)
        check_max_record_bytes(max_record_bytes)
        if not 1 <= max_inflight_entries <= 1024 or not 1024 <= max_entry_bytes <= 4 << 20:
            raise InvalidArgumentError("max_inflight_entries in 1..1024, max_entry_bytes in 1 KiB..4 MiB",
                                       max_inflight_entries=max_inflight_entries, max_entry_bytes=max_entry_bytes)
        if max_inflight_entries > bk.config.max_pending_adds:
            raise InvalidArgumentError("max_inflight_entries exceeds the client's max_pending_adds",
                                       max_inflight_entries=max_inflight_entries,
                                       max_pending_adds=bk.config.max_pending_adds)
        frame_room = bk.config.max_frame_size - 512  # frame and entry headers, digest, batch header
        if max_entry_bytes > frame_room:
            raise InvalidArgumentError("max_entry_bytes does not fit the client's max_frame_size",
                                       max_entry_bytes=max_entry_bytes, max_frame_size=bk.config.max_frame_size)
        asked = {k: v for k, v in (("ensemble_size", ensemble_size), ("write_quorum", write_quorum),
                                   ("ack_quorum", ack_quorum), ("roll_bytes", roll_bytes),
                                   ("roll_seconds", roll_seconds)) if v is not None}
        policy: dict[str, Any] = {}
        if retention is not None:
            policy["retention"] = Retention.of(retention)
        if snapshots_kept is not None:
            policy["snapshots_kept"] = snapshots_kept
        if policy:
            LogSettings.of(policy)  # checked now, before anything changes
        return cls(node, password, asked, policy, max_entry_bytes, max_inflight_entries, max_record_bytes)


@dataclass(frozen=True)
class Claimed:
    """What an open left: the node as claimed, the writer's epoch and first segment."""

    meta: LogMetadata
    epoch: int
    segment: Segment
    writer: LedgerWriter


def _claim_epoch(bk: BookKeeper, request: OpenRequest) -> tuple[LogMetadata, int]:
    """(Blocking) make the node claimed by us, or bump the epoch of the one there."""
    node, password, policy = request.node, request.password, request.policy
    settings = LogSettings.of({**node.namespace_defaults(), **request.asked, **policy})
    made = node.create(settings, password)
    if made is not None:  # a new log: made with epoch 1, no second write to claim it
        return made, 0

    def bump() -> tuple[LogMetadata, int]:
        meta, version = node.read()
        node.check_password(bk.ledger_metadata, meta, password)  # nothing moves for a wrong password
        bumped = dataclasses.replace(meta, epoch=meta.epoch + 1, auth=meta.auth or LogAuth.of(password),
                                     settings=dataclasses.replace(meta.settings, **policy))
        return bumped, node.write(bumped, version)

    return retry_cas(bump, "log metadata (claiming its epoch)", log=node.name)


def _add_first_segment(node: LogNode, meta: LogMetadata, version: int, segment: Segment) -> None:
    """(Blocking) append ``segment`` to the node while the epoch of ``meta`` holds."""
    known = [(meta, version)]  # the node as the claim left it: the first try writes over it unread

    def add_segment() -> None:
        if known:
            mine, mine_version = known.pop()
            with contextlib.suppress(MetadataVersionError):  # written since (or our own write, retried)
                node.write(dataclasses.replace(mine, segments=(*mine.segments, segment)), mine_version)
                return
        current, current_version = node.read()
        if segment in current.segments:
            return  # our own write, whose reply was lost
        if current.epoch != meta.epoch:
            raise WriterFencedError("another writer opened the log", log=node.name, epoch=meta.epoch,
                                    current=current.epoch)
        node.write(dataclasses.replace(current, segments=(*current.segments, segment)), current_version)

    retry_cas(add_segment, "log metadata (adding a segment)", log=node.name)


async def new_segment_ledger(bk: BookKeeper, node: LogNode, settings: LogSettings, password: bytes) -> LedgerWriter:
    """(Client loop) the ledger of a new segment of the log (not named by the node yet)."""
    return await bk.client.create(settings.ensemble_size, settings.write_quorum, settings.ack_quorum,
                                          ledger_digest(bk.client.cluster.info), password, {"walkit.log": f"{node.namespace}/{node.name}".encode()})


async def claim(bk: BookKeeper, request: OpenRequest) -> Claimed:
    """(Client loop) become the log's single writer (module docstring)."""
    client = bk.client
    node, password = request.node, request.password
    meta, version = await client.metadata(_claim_epoch, bk, request)
    for segment in meta.segments[-2:]:  # fence and close what a previous writer left open
        try:
            await client.open(segment.ledger_id, password, True)
        except NoSuchLedgerError:
            log.warning("log %s: segment %d's ledger %d is gone", node.name, segment.seq, segment.ledger_id,
                        extra=context(log=node.name, namespace=node.namespace, ledger=segment.ledger_id))
    writer = await new_segment_ledger(bk, node, meta.settings, password)
    segment = Segment(meta.segments[-1].seq + 1 if meta.segments else 1, writer.ledger_id)
    try:
        await client.metadata(_add_first_segment, node, meta, version, segment)
    except BaseException:
        await discard_segment(bk, node, writer, segment)
        raise
    writer.lacs.idle = client.config.idle_lac is not False  # on unless the client turned it off
    writer.lacs.yields = False  # a log's tail is what a log is for: never yields to a crowd
    if not writer.lacs.idle:
        writer.lacs.interval = client.config.explicit_lac_interval or EXPLICIT_LAC_INTERVAL
    log.info("log %s/%s: writer epoch %d, segment %d (ledger %d)", node.namespace, node.name, meta.epoch,
             segment.seq, writer.ledger_id,
             extra=context(log=node.name, namespace=node.namespace, ledger=writer.ledger_id))
    return Claimed(meta, meta.epoch, segment, writer)


async def discard_segment(bk: BookKeeper, node: LogNode, writer: LedgerWriter, segment: Segment) -> None:
    """A new segment could not be added to the log: close its ledger, and delete it only
    if the segment is surely not in the log (its records would be lost with it)."""
    with contextlib.suppress(WalkitError):
        await writer.close()
    client = bk.client
    if await client.metadata(settle, node, lambda meta: segment in meta.segments) is False:
        with contextlib.suppress(WalkitError):
            await client.metadata(client.ledgers.delete, writer.ledger_id)
    else:
        log.warning("log %s: ledger %d kept: it is, or may be, segment %d of the log", node.name,
                    writer.ledger_id, segment.seq,
                    extra=context(log=node.name, namespace=node.namespace, ledger=writer.ledger_id))
