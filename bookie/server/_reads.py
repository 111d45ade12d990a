"""Reads: the requests that may touch the disk, run on the read pool and answered
through the loop.

Theory of operation
-------------------
READ_ENTRY, READ_RANGE, READ_LAC, GET_BOOKIE_INFO, ADMIN (:mod:`bookie._admin`) and
BookKeeper's GET_LIST_OF_ENTRIES_OF_LEDGER may block on the disk, so the loop never
runs them: :meth:`ReadPool.in_pool` submits the
work to the server's small thread pool (``numReadWorkerThreads``) and the answer - or
the error any failure becomes - is handed back with ``call_soon_threadsafe`` to the
connection, which is only ever touched on the loop. A pool already shut down (the
server is stopping) answers at once with the error.

A READ_ENTRY of an entry memory still holds (read ahead, or still in its log's buffer:
:meth:`~bookie.Bookie.read_memory`) is answered on the loop instead (:meth:`from_memory`)
- unless a read hook (:class:`~bookie.server._hooks.ServerHooks`) is set, which must see
every read.

A READ_RANGE is answered with the consecutive entries the bookie stores from the first
one asked for (:meth:`bookie.storage.LedgerStorage.get_entries`: a few preads for the
whole range), within the request's byte limit and ``nettyMaxFrameSizeBytes`` for the
whole answer; the first entry is always sent (EIO when it alone does not fit a frame,
as READ_ENTRY answers an entry too big to return).

A fencing READ_ENTRY first fences (the FENCE record is journaled and synced), then reads
(:meth:`fenced_read`): once the reader hears the answer, the fence is durable and later
normal adds are refused with EFENCED; RECOVERY_ADD still passes.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
from collections.abc import Callable
from typing import Any, Protocol

from bookie._admin import AdminTarget, run_command
from bookie._bookie import LAST_ENTRY
from bookie.server._answers import Peer, error_response, failed, op_of
from bookie.server._hooks import ServerHooks
from walkit.errors import InvalidArgumentError, NoSuchEntryError
from walkit.protocol import (
    AdminRequest,
    AdminResponse,
    BkRequest,
    BookieInfoResponse,
    GetBookieInfo,
    GetListOfEntries,
    ListOfEntriesResponse,
    Op,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadLacResponse,
    ReadRange,
    ReadRangeResponse,
    Request,
    Response,
    encode_availability,
    parse_entry_header,
    range_response_size,
)

__all__ = ["ReadHost", "ReadPool"]


class ReadHost(AdminTarget, Protocol):
    """What the reads need of the server (and the ADMIN commands, :mod:`bookie._admin`)."""

    @property
    def hooks(self) -> ServerHooks: ...

    @property
    def read_executor(self) -> concurrent.futures.Executor: ...


class ReadPool:
    """The server's reads (see the module docstring)."""

    def __init__(self, host: ReadHost) -> None:
        self._host = host
        #: ledger -> the body of its last BookKeeper WRITE_LAC (in memory, as BookKeeper's
        #: bookie keeps its explicit LAC; written by the loop, read by READ_LAC on the pool)
        self.lac_bodies: dict[int, bytes] = {}

    def in_pool(self, conn: Peer, req: Request | BkRequest, fn: Callable[[Any], Any], arg: Any) -> None:
        """Run ``fn(arg)`` on the read pool; its response (or error) goes to ``conn``."""
        loop = self._host.loop

        def done(fut: Any) -> None:
            try:
                response = fut.result()
            except BaseException as exc:  # every failure becomes an error response
                response = failed(req, exc)
            loop.call_soon_threadsafe(conn.respond, response)

        try:
            self._host.read_executor.submit(fn, arg).add_done_callback(done)
        except RuntimeError as exc:  # the pool is shut down: we are stopping
            conn.respond(error_response(op_of(req), 0, -1, req.request_id, exc))

    def fenced_read(self, conn: Peer, req: ReadEntry) -> None:
        """Fence the ledger (journaled and synced), then read on the pool."""
        bookie, loop = self._host.bookie, self._host.loop
        assert bookie is not None

        def fenced(err: BaseException | None, _: Any) -> None:  # sync thread
            if err is None:
                loop.call_soon_threadsafe(self.in_pool, conn, req, self.read_entry, req)
            else:
                loop.call_soon_threadsafe(
                    conn.respond, error_response(Op.READ_ENTRY, req.ledger_id, req.entry_id, req.request_id, err))

        bookie.fence_cb(req.ledger_id, req.master_key, fenced, None)

    def from_memory(self, req: ReadEntry) -> Response | None:
        """A READ_ENTRY answered on the loop when memory holds all it needs (an entry read
        ahead or still in its log's buffer: :meth:`~bookie.Bookie.read_memory`); None:
        the read pool answers it."""
        bookie = self._host.bookie
        if self._host.hooks.read is not None or req.entry_id < 0 or bookie is None:
            return None
        found = bookie.read_memory(req.ledger_id, req.entry_id)
        if found is None:
            return None
        return ReadEntryResponse(req.ledger_id, req.entry_id, found[1], found[0], req.request_id)

    # -- on the pool ------------------------------------------------------------------------
    def read_lac(self, req: ReadLac) -> Response:
        bookie = self._host.bookie
        assert bookie is not None
        lac = bookie.read_lac(req.ledger_id)
        if not req.with_last_entry:
            return ReadLacResponse(req.ledger_id, lac, req.request_id)
        try:  # BookKeeper's READ_LAC: the last entry too (its reader checks the digest)
            last = bookie.read_entry(req.ledger_id, LAST_ENTRY)
        except (NoSuchEntryError, InvalidArgumentError):  # no entry stored yet
            last = b""
        return ReadLacResponse(req.ledger_id, lac, req.request_id, last, self.lac_bodies.get(req.ledger_id, b""))

    def bookie_info(self, req: GetBookieInfo) -> Response:
        free = total = 0
        seen: set[int] = set()
        for d in self._host.config.ledger_directories:
            dev = os.stat(d).st_dev
            if dev in seen:
                continue
            seen.add(dev)
            usage = shutil.disk_usage(d)
            free += usage.free
            total += usage.total
        return BookieInfoResponse(free, total, self._host.readonly, req.request_id)

    def entries_of(self, req: GetListOfEntries) -> ListOfEntriesResponse:
        """BookKeeper's GET_LIST_OF_ENTRIES_OF_LEDGER: the entries stored here, from the
        index alone (:meth:`bookie.Bookie.stored_entries`), as AvailabilityOfEntriesOfLedger
        bytes; ENOLEDGER for a ledger this bookie does not hold, as BookKeeper's."""
        bookie = self._host.bookie
        assert bookie is not None
        return ListOfEntriesResponse(req.ledger_id, encode_availability(bookie.stored_entries(req.ledger_id)),
                                     req.request_id)

    def admin(self, req: AdminRequest) -> Response:
        """An operator command (:mod:`bookie._admin`)."""
        assert self._host.bookie is not None
        result = run_command(self._host, req.command, req.args)
        return AdminResponse(json.dumps(result).encode(), req.request_id)

    def read_entry(self, req: ReadEntry) -> Response:
        bookie, hook = self._host.bookie, self._host.hooks.read
        assert bookie is not None
        data = bookie.read_entry(req.ledger_id, req.entry_id)
        entry_id = parse_entry_header(data).entry_id if req.entry_id < 0 else req.entry_id
        if hook is not None:
            data = hook(req.ledger_id, entry_id, data)
        return ReadEntryResponse(req.ledger_id, entry_id, bookie.read_lac(req.ledger_id), data, req.request_id)

    def read_range(self, req: ReadRange) -> Response:
        """The stored entries from ``req.first_entry`` on, consecutive: at most ``req.count``
        and ``req.max_bytes`` of entries, in a frame of at most nettyMaxFrameSizeBytes (the
        first entry always: alone too big for a frame, it is answered EIO by
        :meth:`~walkit.protocol.ServerConnection.send`, as a READ_ENTRY of it would be)."""
        bookie, hook = self._host.bookie, self._host.hooks.read
        assert bookie is not None
        max_frame = self._host.config.netty_max_frame_size_bytes
        entries = bookie.read_entries(req.ledger_id, req.first_entry, req.count,
                                      min(req.max_bytes, max_frame - range_response_size(0, 1)))
        if hook is not None:
            entries = [hook(req.ledger_id, req.first_entry + i, data) for i, data in enumerate(entries)]
        return ReadRangeResponse(req.ledger_id, req.first_entry, bookie.read_lac(req.ledger_id),
                                 _within_frame(entries, max_frame), req.request_id)


def _within_frame(entries: list[bytes], max_frame: int) -> tuple[bytes, ...]:
    """The longest prefix of ``entries`` whose READ_RANGE answer fits ``max_frame`` bytes
    (the first entry always)."""
    size = len(entries[0])
    for n in range(1, len(entries)):
        size += len(entries[n])
        if range_response_size(size, n + 1) > max_frame:
            return tuple(entries[:n])
    return tuple(entries)
