"""A bounded LRU of open file handles that are safe to share between threads.

Theory of operation
-------------------
Index files and entry logs are opened on demand and kept open in an LRU bounded by a
capacity, so a bookie holding a million ledgers never holds a million descriptors.
Several threads may use the same handle at once (``pread``/``pwrite`` take absolute
offsets). A handle in use is *pinned*: eviction skips it, and :meth:`HandleCache.discard`
of a pinned handle only detaches it — the last user closes it. So a handle is never
closed under a thread that is reading or writing through it; the price is that the
cache may exceed its capacity for as long as more handles than that are pinned.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from bookie.fs import File

__all__ = ["HandleCache"]

K = TypeVar("K", bound=Hashable)


@dataclass
class _Handle:
    file: File
    refs: int = 0
    detached: bool = False


class HandleCache(Generic[K]):
    """``opener(key, create)`` opens the file of ``key``; at most ``capacity`` stay open."""

    def __init__(self, opener: Callable[[K, bool], File], capacity: int) -> None:
        self._opener = opener
        self._capacity = max(1, capacity)
        self._lock = threading.Lock()
        self._open: OrderedDict[K, _Handle] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    @contextmanager
    def use(self, key: K, *, create: bool = False) -> Iterator[File]:
        """Pin the handle of ``key`` (opening it if needed) for the ``with`` block."""
        handle = self._acquire(key, create)
        try:
            yield handle.file
        finally:
            self._release(handle)

    def discard(self, key: K) -> None:
        """Forget ``key``'s handle; it is closed now, or by its last user."""
        with self._lock:
            handle = self._open.pop(key, None)
            if handle is not None:
                self._retire(handle)

    def close_all(self) -> None:
        with self._lock:
            handles = list(self._open.values())
            self._open.clear()
            for handle in handles:
                self._retire(handle)

    def _acquire(self, key: K, create: bool) -> _Handle:
        with self._lock:
            handle = self._open.get(key)
            if handle is None:
                handle = self._open[key] = _Handle(self._opener(key, create))
            self._open.move_to_end(key)
            handle.refs += 1
            self._evict()
            return handle

    def _release(self, handle: _Handle) -> None:
        with self._lock:
            handle.refs -= 1
            if handle.refs == 0 and handle.detached:
                handle.file.close()

    def _evict(self) -> None:
        while len(self._open) > self._capacity:
            victim = next((k for k, h in self._open.items() if h.refs == 0), None)
            if victim is None:
                return
            self._open.pop(victim).file.close()

    @staticmethod
    def _retire(handle: _Handle) -> None:
        if handle.refs == 0:
            handle.file.close()
        else:
            handle.detached = True
