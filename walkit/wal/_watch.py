"""A tailing reader's ear on the log's metadata node: woken by the store's watch.

Theory of operation
-------------------
A tail follows the open segment by long poll (the bookies tell it of new entries at
once); what it learns from the log's node is that the log moved on - a roll added the
next segment, a new writer opened one after recovering the old - or that it was
truncated. Between two such changes there is nothing to read there, so instead of
reading the node every half second, a tail with nothing left waits on a
:class:`NodeWatch`: the store's data watch (ZooKeeper's, or the embedded store's) calls
back with the node's version on every change, and :meth:`NodeWatch.wait_past` returns as
soon as the version is past the one the tail read - a new segment is seen within the
store's notification latency, not a poll interval later. A tail runs on the client's
event loop (for the sync and the asyncio reader alike), so its waits are asyncio
futures: :meth:`NodeWatch.changed_past`, which :meth:`NodeWatch.wait_past` awaits.

A watch may lag or stop (a lost session, a store between connections): the wait is
bounded (the caller's ``timeout``), after which the tail reads the node anyway, as it
did before watches.

The same watch cuts short a tail's long poll on a segment (:meth:`NodeWatch.changed_past`,
an asyncio future): a roll or a new writer closes the segment in metadata, and a close
that adds no entry does not move the bookies' LAC, so no bookie would answer the poll
before its timeout. When the node moves, the tail re-reads the segment's metadata and,
finding it closed and read to its end, goes on to the next segment at once.

The store's watch runs while a tail runs (started by the first, stopped with the last
one or when the reader closes, so an abandoned tail leaves no watch behind); its
callback only records the version and wakes waiters (it runs on a store thread and must
not call the store, so it hands each wake-up to the waiter's loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from walkit.metadata import MetadataStore, Stat, Watch

__all__ = ["NodeWatch"]


class NodeWatch:
    """The version of one node as the store's watch last reported it (-1: no such node;
    versions only grow while the node lives - a node deleted and made again between two
    reports may be seen at a lower version, which only delays a wake-up to the caller's
    timeout). The store's watch runs while some tail holds it (:meth:`acquire`)."""

    def __init__(self, store: MetadataStore, path: str) -> None:
        self._lock = threading.Lock()
        self._version: int | None = None  # None: no report (since the watch started)
        self._watch: Watch | None = None
        self._holders = 0
        self._closed = False
        self._store = store
        self._path = path
        #: tails waiting in :meth:`wait_past` now (a test looks)
        self.waiting = 0
        #: (version, loop, future) of the asyncio waiters (changed_past)
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def version(self) -> int | None:
        with self._lock:
            return self._version

    def acquire(self) -> None:
        """A tail needs the watch: start the store's watch unless one runs (blocking: the
        store reports the node at once)."""
        with self._lock:
            self._holders += 1
            if self._watch is not None or self._closed or self._holders > 1:
                return
        watch = self._store.watch_data(self._path, self._report)  # not under the lock: it calls back now
        with self._lock:
            if self._closed or self._holders == 0 or self._watch is not None:
                extra: Watch | None = watch
            else:
                self._watch, extra = watch, None
        if extra is not None:
            extra.cancel()

    def release(self) -> None:
        """A tail is done with the watch: the store's watch stops with the last one."""
        with self._lock:
            self._holders -= 1
            if self._holders > 0:
                return
            watch, self._watch, self._version = self._watch, None, None
        if watch is not None:
            watch.cancel()

    async def wait_past(self, version: int, timeout: float) -> bool:
        """(On an event loop) wait until the node's version is past ``version`` (a change
        since it was read) or the node is gone, at most ``timeout`` seconds, or until
        :meth:`close`; whether it changed (False: the time ran out, or closed). Hold the
        watch meanwhile."""
        moved = self.changed_past(version)
        with self._lock:
            self.waiting += 1
        try:
            await asyncio.wait((moved,), timeout=timeout)
        finally:
            moved.cancel()
            with self._lock:
                self.waiting -= 1
        with self._lock:
            return self._moved_past(version) and not self._closed

    def changed_past(self, version: int) -> asyncio.Future[None]:
        """(On an event loop) a future done once the node's version is past ``version``
        or the node is gone, or the watch is closed: a tail's long poll on a segment is
        cut short by it, since a roll or a new writer may have closed that segment
        without the bookies' LAC moving. Hold the watch meanwhile; cancel the future when
        done with it."""
        loop = asyncio.get_running_loop()
        moved: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._waiters = [w for w in self._waiters if not w[2].done()]  # the ones given up
            if self._moved_past(version) or self._closed:
                moved.set_result(None)
            else:
                self._waiters.append((version, loop, moved))
        return moved

    def close(self) -> None:
        """For good (the reader closed): the store's watch stops and every waiter wakes."""
        with self._lock:
            self._closed = True
            watch, self._watch = self._watch, None
            woken = [(loop, moved) for _, loop, moved in self._waiters]
            self._waiters = []
        if watch is not None:
            watch.cancel()
        _wake(woken)

    def _moved_past(self, version: int) -> bool:
        """(Lock held) the node changed after ``version``, or is gone."""
        return self._version is not None and (self._version > version or self._version == -1)

    def _report(self, data: bytes | None, stat: Stat | None) -> None:
        with self._lock:
            self._version = -1 if stat is None else stat.version
            woken = [(loop, moved) for version, loop, moved in self._waiters if self._moved_past(version)]
            self._waiters = [w for w in self._waiters if not self._moved_past(w[0])]
        _wake(woken)


def _wake(waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]) -> None:
    for loop, moved in waiters:
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits there any more
            loop.call_soon_threadsafe(_settle, moved)


def _settle(moved: asyncio.Future[None]) -> None:
    if not moved.done():
        moved.set_result(None)
