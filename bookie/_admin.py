"""The ADMIN requests a bookie serves (the op: :mod:`walkit.protocol._admin`).

``gc.status``   the garbage collector's status (:meth:`bookie.gc.GarbageCollector.status`)
                and whether the bookie is read-only;
``gc.run``      ``{"compact": null | "minor" | "major"}``: ask for a forced pass, answered at
                once with its number (poll ``gc.status`` until ``passes`` reaches it);
``ledger.replicate``  copy entries this bookie holds to another bookie (recovery,
                :mod:`bookie._replicate`);
``ledger.entries``  ``{"ledger": L, "first": a, "last": b}`` (at most 65,536 ids): the entry ids of
                the range this bookie stores (the auditor's check, a repair of missing copies);
``storage.caches``  the read caches' sizes and hit counts
                (:meth:`bookie.storage.LedgerStorage.cache_stats`);
``bookie.readonly``  ``{"readonly": true | false}``: read-only on the operator's word (whatever
                the disks say; ``walkit decommission``), answered once registered so.

Commands run on the server's read pool; an unknown command or bad arguments raise
InvalidArgumentError (EBADREQ with the reason). They see the server only as an
:class:`AdminTarget`: its core, configuration and loop, its read-only state, the
operator's flag (the one thing written here) and the disk check that applies it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any, Protocol

from bookie._bookie import Bookie
from bookie._config import BookieConfig
from bookie._replicate import replicate
from walkit.errors import InvalidArgumentError

__all__ = ["COMMANDS", "AdminTarget", "run_command"]

COMMANDS = ("gc.status", "gc.run", "ledger.replicate", "ledger.entries", "storage.caches", "bookie.readonly")
_MAX_RANGE = 65536
_REGISTER_TIMEOUT = 60.0


class AdminTarget(Protocol):
    """What the commands need of a bookie server (:class:`bookie.server.BookieServer`)."""

    #: Read-only on the operator's word (``bookie.readonly`` writes it).
    forced_readonly: bool

    @property
    def config(self) -> BookieConfig: ...

    @property
    def bookie(self) -> Bookie | None: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def readonly(self) -> bool: ...

    def check_disks(self) -> Coroutine[Any, Any, None]:
        """Re-evaluate read-only mode (disks, ``forced_readonly``) and register so."""
        ...


def run_command(server: AdminTarget, command: str, raw_args: bytes) -> dict[str, Any]:
    """Run ``command`` for ``server`` (on a read-pool thread)."""
    try:
        args = json.loads(raw_args)
    except ValueError as exc:
        raise InvalidArgumentError("admin arguments are not JSON", command=command) from exc
    if not isinstance(args, dict):
        raise InvalidArgumentError("admin arguments must be a JSON object", command=command)
    bookie, loop = server.bookie, server.loop
    assert bookie is not None
    if command == "gc.status":
        return {**bookie.gc.status(), "readonly": server.readonly}
    if command == "gc.run":
        compact = args.get("compact")
        if compact not in (None, "minor", "major"):
            raise InvalidArgumentError("compact must be null, minor or major", compact=repr(compact))
        return {"pass": bookie.gc.request(compact)}
    if command == "ledger.replicate":
        return replicate(bookie, server.config, loop, args)
    if command == "ledger.entries":
        ledger_id, first, last = args.get("ledger"), args.get("first"), args.get("last")
        if not (type(ledger_id) is int and type(first) is int and type(last) is int
                and 0 <= first <= last < first + _MAX_RANGE):
            raise InvalidArgumentError("ledger.entries needs a ledger and a range of at most 65536 ids",
                                       ledger=repr(ledger_id)[:40], first=repr(first)[:40], last=repr(last)[:40])
        assert isinstance(ledger_id, int) and isinstance(first, int) and isinstance(last, int)
        return {"entries": bookie.storage.stored_entries(ledger_id, first, last)}
    if command == "storage.caches":
        return bookie.storage.cache_stats()
    if command == "bookie.readonly":
        if type(args.get("readonly")) is not bool:
            raise InvalidArgumentError("bookie.readonly needs readonly: true or false")
        server.forced_readonly = args["readonly"]
        asyncio.run_coroutine_threadsafe(server.check_disks(), loop).result(_REGISTER_TIMEOUT)
        return {"readonly": server.readonly, "forced": server.forced_readonly}
    raise InvalidArgumentError("unknown admin command", command=command, known=",".join(COMMANDS))
