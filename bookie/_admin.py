"""The ADMIN requests a bookie serves (the op: :mod:`walkit.protocol._admin`).

``gc.status``   the garbage collector's status (:meth:`bookie.gc.GarbageCollector.status`)
                and whether the bookie is read-only;
``gc.run``      ``{"compact": null | "minor" | "major"}``: ask for a forced pass, answered at
                once with its number (poll ``gc.status`` until ``passes`` reaches it);
``ledger.replicate``  copy entries this bookie holds to another bookie (recovery,
                :mod:`bookie._replicate`).

Commands run on the server's read pool; an unknown command or bad arguments raise
InvalidArgumentError (EBADREQ with the reason).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from bookie._bookie import Bookie
from bookie._config import BookieConfig
from bookie._replicate import replicate
from walkit.errors import InvalidArgumentError

__all__ = ["COMMANDS", "run_command"]

COMMANDS = ("gc.status", "gc.run", "ledger.replicate")


def run_command(bookie: Bookie, config: BookieConfig, loop: asyncio.AbstractEventLoop, readonly: bool,
                command: str, raw_args: bytes) -> dict[str, Any]:
    try:
        args = json.loads(raw_args)
    except ValueError as exc:
        raise InvalidArgumentError("admin arguments are not JSON", command=command) from exc
    if not isinstance(args, dict):
        raise InvalidArgumentError("admin arguments must be a JSON object", command=command)
    if command == "gc.status":
        return {**bookie.gc.status(), "readonly": readonly}
    if command == "gc.run":
        compact = args.get("compact")
        if compact not in (None, "minor", "major"):
            raise InvalidArgumentError("compact must be null, minor or major", compact=repr(compact))
        return {"pass": bookie.gc.request(compact)}
    if command == "ledger.replicate":
        return replicate(bookie, config, loop, args)
    raise InvalidArgumentError("unknown admin command", command=command, known=",".join(COMMANDS))
