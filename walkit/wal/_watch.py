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
store's notification latency, not a poll interval later.

A watch may lag or stop (a lost session, a store between connections): the wait is
bounded (the caller's ``timeout``), after which the tail reads the node anyway, as it
did before watches. The watch is started on the first wait and cancelled with the
reader; its callback only records the version and wakes waiters (it runs on a store
thread and must not call the store).
"""

from __future__ import annotations

import threading

from walkit.metadata import MetadataStore, Stat, Watch

__all__ = ["NodeWatch"]


class NodeWatch:
    """The version of one node as the store's watch last reported it (-1: no such node)."""

    def __init__(self, store: MetadataStore, path: str) -> None:
        self._changed = threading.Condition()
        self._version: int | None = None  # None: no report yet
        self._watch: Watch | None = None
        self._cancelled = False
        self._store = store
        self._path = path

    @property
    def version(self) -> int | None:
        with self._changed:
            return self._version

    def wait_past(self, version: int, timeout: float) -> bool:
        """Wait until the node's version is past ``version`` (a change since it was read)
        or the node is gone, at most ``timeout`` seconds, or until :meth:`cancel`; whether
        it changed (False: the time ran out, or cancelled)."""
        self._start()
        with self._changed:
            return self._changed.wait_for(lambda: self._moved_past(version) or self._cancelled,
                                          timeout) and not self._cancelled

    def _moved_past(self, version: int) -> bool:
        """(Lock held) the node changed after ``version``, or is gone (versions only grow)."""
        return self._version is not None and (self._version > version or self._version == -1)

    def cancel(self) -> None:
        with self._changed:
            self._cancelled = True
            watch, self._watch = self._watch, None
            self._changed.notify_all()
        if watch is not None:
            watch.cancel()

    def _start(self) -> None:
        with self._changed:
            if self._watch is not None or self._cancelled:
                return
        watch = self._store.watch_data(self._path, self._report)  # not under the lock: it calls back now
        with self._changed:
            if self._cancelled or self._watch is not None:
                extra: Watch | None = watch
            else:
                self._watch, extra = watch, None
        if extra is not None:
            extra.cancel()

    def _report(self, data: bytes | None, stat: Stat | None) -> None:
        with self._changed:
            self._version = -1 if stat is None else stat.version
            self._changed.notify_all()
