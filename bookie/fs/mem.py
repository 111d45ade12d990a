"""An in-memory file system that can crash.

It keeps, for every file, the bytes that were synced next to the bytes written since,
and for every directory the names that were made durable by ``fsync_dir``.
:meth:`MemFS.crash` is a power cut: each 512-byte sector written since the last sync
is kept or lost at random (a seeded ``random.Random``), a grown file may keep its new
size with zeros where sectors were lost, and names not made durable disappear (or come
back, for removed and renamed ones). Directories themselves are durable once made.

:meth:`MemFS.arm_crash` makes the machine die after a number of mutating operations:
that operation and every later one raise :class:`PowerLoss` until ``crash()`` - so a
workload running on several threads stops at an exact, reproducible point.
:meth:`fail_next_write` and :meth:`fail_next_sync` inject a single EIO (the next sync of
a file, a directory or the whole file system through a syncer). A failed sync
behaves as Linux's does: the dirty sectors it was to write are forgotten (the bytes stay
readable, as in the page cache, but a later sync that succeeds does not make them
durable) - so code that retries a failed fsync and trusts it loses data at ``crash()``.
:attr:`MemFS.capacity` (bytes, None: unlimited) is a full disk: a write, truncate or
reservation that would grow the files past it fails with ENOSPC, and
:meth:`MemFS.disk_usage` reports the fraction used.
"""

from __future__ import annotations

import errno
import random
import threading
from dataclasses import dataclass, field

from bookie.fs import SECTOR, parent_dir

__all__ = ["MemFS", "PowerLoss"]


class PowerLoss(OSError):
    """The simulated machine lost power: nothing more reaches the disk."""

    def __init__(self) -> None:
        super().__init__(errno.EIO, "simulated power loss")


@dataclass
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    synced: bytearray = field(default_factory=bytearray)
    #: sector indexes written (or truncated) since the last sync
    dirty: set[int] = field(default_factory=set)

    def touch(self, start: int, end: int) -> None:
        self.dirty.update(range(start // SECTOR, (end + SECTOR - 1) // SECTOR))

    def sync(self) -> None:
        self._adopt(self.dirty, keep_new=lambda _: True, size=len(self.data))

    def settle(self, rng: random.Random | None) -> None:
        """Decide what a power cut leaves of the unsynced bytes."""
        if rng is None:
            self.dirty.clear()
        else:
            size = len(self.data) if rng.random() < 0.5 else len(self.synced)
            self._adopt(self.dirty, keep_new=lambda _: rng.random() < 0.5, size=size)
        self.data = bytearray(self.synced)

    def _adopt(self, sectors: set[int], keep_new: object, size: int) -> None:
        old_len = len(self.synced)
        if size > old_len:
            self.synced.extend(bytes(size - old_len))
        for sec in sorted(sectors):
            a = sec * SECTOR
            if a >= size:
                continue
            b = min(a + SECTOR, size)
            if keep_new(sec):  # type: ignore[operator]
                chunk = self.data[a:b]
                self.synced[a : a + len(chunk)] = chunk
                if len(chunk) < b - a:
                    self.synced[a + len(chunk) : b] = bytes(b - a - len(chunk))
            elif a >= old_len:
                self.synced[a:b] = bytes(b - a)
        del self.synced[size:]
        self.dirty.clear()


class _MemBuffer:
    def __init__(self, size: int) -> None:
        self._buf = bytearray(size)
        self._view = memoryview(self._buf)

    @property
    def view(self) -> memoryview:
        return self._view

    def __len__(self) -> int:
        return len(self._buf)

    def close(self) -> None:
        self._view.release()


class _MemFile:
    def __init__(self, fs: MemFS, path: str, inode: _Inode, direct: bool) -> None:
        self._fs = fs
        self._inode = inode
        self._epoch = fs._epoch
        self.path = path
        self.direct = direct
        self._closed = False

    def _check(self) -> None:
        if self._closed:
            raise ValueError(f"I/O on closed file {self.path}")
        if self._epoch != self._fs._epoch:
            raise PowerLoss()

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> int:
        with self._fs._lock:
            self._check()
            self._fs._mutate("write")
            return self._write_at(data, offset)

    def _write_at(self, data: bytes | bytearray | memoryview, offset: int) -> int:
        n = len(data)
        if self.direct and (offset % self._fs.alignment or n % self._fs.alignment):
            raise OSError(errno.EINVAL, f"unaligned O_DIRECT write offset={offset} len={n}")
        d = self._inode.data
        self._fs._check_room(offset + n - len(d))
        if len(d) < offset:
            d.extend(bytes(offset - len(d)))
        d[offset : offset + n] = data
        self._inode.touch(offset, offset + n)
        return n

    def pwritev(self, buffers: list[memoryview], offset: int) -> int:
        """Gathered write: one operation (one crash point), bytes kept in order."""
        with self._fs._lock:
            self._check()
            self._fs._mutate("write")
            self._fs._check_room(offset + sum(len(b) for b in buffers) - len(self._inode.data))
            pos = offset
            for b in buffers:
                pos += self._write_at(b, pos)
            return pos - offset

    def pwritev_sync(self, buffers: list[memoryview], offset: int, datasync: bool = True) -> int:
        """``pwritev`` then ``sync``: two operations (two crash points), exactly as
        the two calls in a row - a crash between them can tear the write."""
        n = self.pwritev(buffers, offset)
        self.sync()  # MemFS has no metadata apart from the size: fsync == fdatasync
        return n

    def pread(self, size: int, offset: int) -> bytes:
        with self._fs._lock:
            self._check()
            return bytes(self._inode.data[offset : offset + size])

    def sync(self) -> None:
        with self._fs._lock:
            self._check()
            try:
                self._fs._mutate("sync")
            except PowerLoss:
                raise
            except OSError:  # as Linux: the failed writeback's pages count as clean now
                self._inode.dirty.clear()
                raise
            self._inode.sync()

    def truncate(self, size: int) -> None:
        with self._fs._lock:
            self._check()
            self._fs._mutate("write")
            d = self._inode.data
            self._fs._check_room(size - len(d))
            self._inode.touch(min(size, len(d)), max(size, len(d)))
            if size < len(d):
                del d[size:]
            else:
                d.extend(bytes(size - len(d)))

    def allocate(self, offset: int, length: int) -> None:
        with self._fs._lock:
            self._check()
            self._fs._mutate("write")
            end, d = offset + length, self._inode.data
            self._fs._check_room(end - len(d))
            if len(d) < end:
                self._inode.touch(len(d), end)
                d.extend(bytes(end - len(d)))

    def size(self) -> int:
        with self._fs._lock:
            self._check()
            return len(self._inode.data)

    def close(self) -> None:
        self._closed = True


class _MemSyncer:
    """syncfs(2) of a MemFS: every file's bytes and every name durable."""

    def __init__(self, fs: MemFS, path: str) -> None:
        self._fs = fs
        self._epoch = fs._epoch
        self.path = path
        self._closed = False

    def sync(self) -> None:
        fs = self._fs
        with fs._lock:
            if self._closed:
                raise ValueError(f"sync through a closed syncer of {self.path}")
            if self._epoch != fs._epoch:
                raise PowerLoss()
            inodes = {id(i): i for i in fs._names.values()}.values()
            try:
                fs._mutate("sync")
            except PowerLoss:
                raise
            except OSError:  # as Linux: the failed writeback's pages count as clean now
                for inode in inodes:
                    inode.dirty.clear()
                raise
            for inode in inodes:
                inode.sync()
            fs._durable = dict(fs._names)

    def close(self) -> None:
        self._closed = True


class MemFS:
    """In-memory :class:`bookie.fs.FileSystem` with crash and fault injection;
    ``syncfs=False`` offers no syncer (as a machine without syncfs(2))."""

    def __init__(self, *, alignment: int = 4096, direct_ok: bool = True, zero_fill_pays: bool = False,
                 syncfs: bool = True) -> None:
        self.alignment = alignment
        self.direct_ok = direct_ok
        self.syncfs = syncfs
        #: Off by default: a journal zero filler's writes would take part in the fault
        #: injection below (the next write, the crash after N operations) at moments no
        #: test controls; its own tests turn it on.
        self.zero_fill_pays = zero_fill_pays
        self.usage = 0.1
        #: Bytes the files may hold in all (None: no limit): a full disk (ENOSPC).
        self.capacity: int | None = None
        self._lock = threading.RLock()
        self._names: dict[str, _Inode] = {}
        self._durable: dict[str, _Inode] = {}
        self._dirs: set[str] = {"/"}
        self._epoch = 0
        self._ops = 0
        self._crash_at: int | None = None
        self._dead = False
        self._fail_write = 0
        self._fail_sync = 0

    # --- fault injection -------------------------------------------------------------
    def arm_crash(self, after_ops: int) -> None:
        """Die at the ``after_ops``-th mutating operation from now."""
        with self._lock:
            self._crash_at = self._ops + after_ops

    @property
    def dead(self) -> bool:
        return self._dead

    @property
    def mutating_ops(self) -> int:
        return self._ops

    def fail_next_write(self, count: int = 1) -> None:
        self._fail_write += count

    def fail_next_sync(self, count: int = 1) -> None:
        self._fail_sync += count

    def crash(self, rng: random.Random | None = None) -> None:
        """Power cut: keep what was durable; tear unsynced sectors with ``rng`` (or
        drop all of them when ``rng`` is None). Open files become unusable."""
        with self._lock:
            self._epoch += 1
            self._dead = False
            self._crash_at = None
            self._fail_write = self._fail_sync = 0
            seen: set[int] = set()
            for inode in list(self._names.values()) + list(self._durable.values()):
                if id(inode) not in seen:
                    seen.add(id(inode))
                    inode.settle(rng)
            self._names = dict(self._durable)

    def _mutate(self, kind: str) -> None:
        if self._dead:
            raise PowerLoss()
        self._ops += 1
        if self._crash_at is not None and self._ops >= self._crash_at:
            self._dead = True
            raise PowerLoss()
        if kind == "write" and self._fail_write:
            self._fail_write -= 1
            raise OSError(errno.EIO, "injected write failure")
        if kind == "sync" and self._fail_sync:
            self._fail_sync -= 1
            raise OSError(errno.EIO, "injected sync failure")

    def used_bytes(self) -> int:
        """Bytes held by the files that have a name (what :attr:`capacity` limits)."""
        with self._lock:
            return sum(len(inode.data) for inode in {id(i): i for i in self._names.values()}.values())

    def _check_room(self, growth: int) -> None:
        if self.capacity is not None and growth > 0 and self.used_bytes() + growth > self.capacity:
            raise OSError(errno.ENOSPC, "No space left on device (MemFS capacity)")

    # --- FileSystem -------------------------------------------------------------------
    @staticmethod
    def _norm(path: str) -> str:
        return "/" + "/".join(p for p in path.split("/") if p)

    def open(self, path: str, *, create: bool = False, direct: bool = False) -> _MemFile:
        path = self._norm(path)
        with self._lock:
            inode = self._names.get(path)
            if inode is None:
                if not create:
                    raise FileNotFoundError(errno.ENOENT, "no such file", path)
                if parent_dir(path) not in self._dirs:
                    raise FileNotFoundError(errno.ENOENT, "no such directory", path)
                self._mutate("write")
                inode = self._names[path] = _Inode()
            return _MemFile(self, path, inode, direct and self.direct_ok)

    def alloc_buffer(self, size: int) -> _MemBuffer:
        return _MemBuffer(size)

    def exists(self, path: str) -> bool:
        path = self._norm(path)
        with self._lock:
            return path in self._names or path in self._dirs

    def listdir(self, path: str) -> list[str]:
        path = self._norm(path)
        with self._lock:
            if path not in self._dirs:
                raise FileNotFoundError(errno.ENOENT, "no such directory", path)
            names = {p.rsplit("/", 1)[1] for p in self._names if parent_dir(p) == path}
            names |= {d.rsplit("/", 1)[1] for d in self._dirs if d != "/" and parent_dir(d) == path}
            return sorted(names)

    def makedirs(self, path: str) -> None:
        path = self._norm(path)
        with self._lock:
            parts = [p for p in path.split("/") if p]
            for i in range(1, len(parts) + 1):
                self._dirs.add("/" + "/".join(parts[:i]))

    def remove(self, path: str) -> None:
        path = self._norm(path)
        with self._lock:
            if path not in self._names:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
            self._mutate("write")
            del self._names[path]

    def rename(self, src: str, dst: str) -> None:
        src, dst = self._norm(src), self._norm(dst)
        with self._lock:
            if src not in self._names:
                raise FileNotFoundError(errno.ENOENT, "no such file", src)
            self._mutate("write")
            self._names[dst] = self._names.pop(src)

    def fsync_dir(self, path: str) -> None:
        path = self._norm(path)
        with self._lock:
            self._mutate("sync")
            for p in [p for p in self._durable if parent_dir(p) == path]:
                del self._durable[p]
            for p, inode in self._names.items():
                if parent_dir(p) == path:
                    self._durable[p] = inode

    def open_syncer(self, path: str) -> _MemSyncer | None:
        path = self._norm(path)
        with self._lock:
            if path not in self._dirs:
                raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        return _MemSyncer(self, path) if self.syncfs else None

    def disk_usage(self, path: str) -> float:
        if self.capacity is not None:
            return min(1.0, self.used_bytes() / self.capacity) if self.capacity else 1.0
        return self.usage
