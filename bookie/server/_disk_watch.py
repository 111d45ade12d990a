"""The disk watch: when a bookie's disks (or its health) say it must turn read-only, and
when it may turn writable again.

Theory of operation
-------------------
Every ``diskCheckInterval`` (:meth:`DiskWatch.watch`) the fullest ledger disk (blocks or
inodes, as ``disk_usage`` reports it) is compared with ``diskUsageThreshold``; above it
the bookie turns read-only (:meth:`DiskWatch.disks_full`); it turns writable again once
every disk is below ``diskUsageLwmThreshold`` (hysteresis between the two marks). The
check runs at once, not at the next interval, whenever garbage collection gave space
back (:meth:`space_freed`), so a bookie that GC saves from a full disk comes back.

A write that meets a full disk (ENOSPC) before the check noticed makes the bookie
read-only at once (:meth:`no_space`), and that directory (the journal's too) is checked
with the ledger disks until it is below ``diskUsageLwmThreshold``. A bookie whose journal
or storage met an I/O error (:meth:`bookie_failed`) turns read-only for good.

Going read-only takes effect at once, from whatever thread noticed (the flag is a plain
bool the loop reads per add: the worst case is a few adds admitted just before, which
the core still journals correctly); the registration follows on the loop
(:meth:`check_soon` schedules the server's ``check_disks``, which owns that transition).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Protocol

from bookie._bookie import BookieFailure
from bookie._config import BookieConfig
from walkit.logs import context

__all__ = ["DiskHost", "DiskWatch"]

log = logging.getLogger("bookie.server")


class DiskHost(Protocol):
    """What the disk watch needs of the server."""

    readonly: bool

    @property
    def config(self) -> BookieConfig: ...

    @property
    def bookie_id(self) -> str: ...

    @property
    def loop(self) -> Any: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def failure(self) -> BookieFailure | None: ...

    def disk_usage_of(self, directory: str) -> float: ...

    def check_disks(self) -> Coroutine[Any, Any, None]: ...


class DiskWatch:
    """Disk usage against the marks, for one server (see the module docstring)."""

    def __init__(self, host: DiskHost) -> None:
        self._host = host
        #: Directories a write found full (ENOSPC), watched until below diskUsageLwmThreshold.
        self.full_dirs: set[str] = set()

    def disks_full(self, readonly: bool) -> bool:
        """Whether the bookie should be read-only now (hysteresis between the marks), by
        the fullest of its ledger disks - and of any other directory whose disk was found
        full by a write (the journal's), until that one is below the low-water mark."""
        host = self._host
        c, disk_usage = host.config, host.disk_usage_of
        for d in list(self.full_dirs):
            if disk_usage(d) < c.disk_usage_lwm_threshold:
                self.full_dirs.discard(d)
        usage, fullest = max((disk_usage(d), d) for d in {*c.ledger_directories, *self.full_dirs})
        if not readonly and usage >= c.disk_usage_threshold:
            log.warning("bookie %s: disk of %s is %.1f%% full (threshold %.1f%%): read-only", host.bookie_id,
                        fullest, usage * 100, c.disk_usage_threshold * 100,
                        extra=context(bookie=host.bookie_id, directory=fullest))
            return True
        if readonly and usage < c.disk_usage_lwm_threshold:
            if host.failure is None:
                log.info("bookie %s: disks at most %.1f%% full: writable again", host.bookie_id, usage * 100,
                         extra=context(bookie=host.bookie_id))
            return False
        return readonly

    def bookie_failed(self, failure: BookieFailure) -> None:
        """The core met an I/O error (any thread; the core logged it): read-only for good."""
        self._host.readonly = True  # adds are refused from now on; the registration follows
        self.check_soon()

    def no_space(self, directory: str, exc: BaseException) -> None:
        """A write found ``directory``'s disk full before the disk check did (any thread):
        read-only now; the disk check makes it writable again once there is room."""
        host = self._host
        self.full_dirs.add(directory)  # checked by the disk check until below the low-water mark
        if host.readonly:
            return
        host.readonly = True
        log.warning("bookie %s: no space left in %s (%s): read-only until its disk is below %.0f%%", host.bookie_id,
                    directory, exc, host.config.disk_usage_lwm_threshold * 100,
                    extra=context(bookie=host.bookie_id, directory=directory))
        self.check_soon()

    def space_freed(self) -> None:
        """GC gave space back (its thread): check the disks now, not at the next interval."""
        self.check_soon()

    def check_soon(self) -> None:
        """Run the server's ``check_disks`` on the loop (from any thread), unless stopping."""
        host = self._host
        loop = host.loop
        if loop is None or host.stopping or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(lambda: loop.create_task(host.check_disks()))
        except RuntimeError:  # the loop closed meanwhile
            pass

    async def watch(self) -> None:
        """Check every ``diskCheckInterval`` (a task of the server's, cancelled by stop)."""
        while True:
            await asyncio.sleep(self._host.config.disk_check_interval / 1000.0)
            await self._host.check_disks()
