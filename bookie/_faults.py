"""Disk faults: what the bookie does when its journal or ledger storage meets an I/O
error or a full disk, and the errors a requester gets for them.

Theory of operation
-------------------
An I/O error in the journal (a failed write or fdatasync) or the ledger storage (a
failed write, sync or directory sync), or in writing the checkpoint mark, makes the
bookie **failed** (:class:`DiskFaults`, :attr:`DiskFaults.failure`, ``on_failed`` told
once, an ERROR naming the directory and the cause): the journal or storage refuses every
later write, nothing is retried (after a failed fsync the data's fate is unknown -
"fsyncgate"), checkpoints stop short of what was not flushed, and only a restart - which
replays the journal from the last mark and so finds out what is durable - makes it
writable again. Reads go on: what was synced is intact. The failure is recorded once,
under a lock of its own - not the bookie's: a failing add holds that lock while the
storage reports - so ``on_failed`` is told exactly once, on the thread that met the
error.

A full disk (ENOSPC on a write or a reservation, never on a sync) is not a failure: the
refused batch or buffer waits, ``on_no_space`` is told (the server turns read-only), and
the bookie is writable again once there is room.

:func:`as_walkit_error` is what a requester gets for whatever refused its request: a
:class:`~walkit.errors.WalkitError` as it is, an ``OSError`` as a ``NativeIOError``
carrying its errno, anything else (a journal thread that died) as a
``BookieShutdownError``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from walkit.errors import BookieShutdownError, NativeIOError, WalkitError
from walkit.logs import context

__all__ = ["BookieFailure", "DiskFaults", "as_walkit_error", "where"]

log = logging.getLogger("bookie")


def as_walkit_error(exc: BaseException) -> WalkitError:
    """The error a requester gets for ``exc`` (see the module docstring)."""
    if isinstance(exc, WalkitError):
        return exc
    err: WalkitError
    if isinstance(exc, OSError):
        err = NativeIOError(exc.errno or 5, f"bookie I/O failed: {exc}")
    else:
        err = BookieShutdownError("journal failed")
    err.__cause__ = exc
    return err


def where(exc: BaseException, directories: Sequence[str]) -> str:
    """The ledger directory an error happened in (all of them when its path is unknown)."""
    path = getattr(exc, "filename", None)
    if isinstance(path, str):
        for d in directories:
            if path == d or path.startswith(d.rstrip("/") + "/"):
                return d
    return ",".join(directories)


@dataclass(frozen=True)
class BookieFailure:
    """What made a bookie failed: the directory (journal or ledger), the error, when."""

    directory: str
    error: BaseException
    since: float  # time.time()

    def describe(self) -> dict[str, Any]:
        """As ``/api/v1/bookie/info`` shows it."""
        return {"directory": self.directory, "error": str(self.error),
                "errno": getattr(self.error, "errno", None), "since": self.since}


class DiskFaults:
    """One bookie's record of its disk faults and the hooks told of them."""

    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        #: The I/O error that made this bookie failed, once one did.
        self.failure: BookieFailure | None = None
        #: ``on_failed(failure)``: called once, on the thread that met the error.
        self.on_failed: Callable[[BookieFailure], None] | None = None
        #: ``on_no_space(directory, error)``: a write found that directory's disk full.
        self.on_no_space: Callable[[str, BaseException], None] | None = None
        self._lock = threading.Lock()

    def failed(self, directory: str, exc: BaseException) -> None:
        """An I/O error failed the journal or the storage: the bookie is failed for good."""
        with self._lock:  # not the bookie lock: a failing add holds it while storage reports
            if self.failure is not None:
                return
            self.failure = BookieFailure(directory, exc, time.time())
        log.error("bookie %s failed: I/O error in %s: %s; it stays read-only (reads are served) until restarted,"
                  " and the restart replays the journal to find out what is durable",
                  self.bookie_id, directory, exc, extra=context(bookie=self.bookie_id, directory=directory))
        if self.on_failed is not None:
            self.on_failed(self.failure)

    def no_space(self, directory: str, exc: BaseException) -> None:
        """A write found ``directory``'s disk full."""
        if self.on_no_space is not None:
            self.on_no_space(directory, exc)
