"""The machine's disk behind the :class:`bookie.fs.FileSystem` seam.

Theory of operation
-------------------
Every call goes through a :mod:`bookie.native` backend (the C shim or the pure-Python
twin; ``RealFS(backend=...)`` picks one, the default follows ``WALKIT_NATIVE``), so
every failure is a :class:`walkit.errors.NativeIOError` that keeps ``errno``.

O_DIRECT: ``open(direct=True)`` asks for it. A file system that refuses it at open
(EINVAL, as tmpfs did before Linux 6.6) gets a buffered file instead -
``File.direct`` is False, durability still comes from ``sync()`` (fdatasync) - and one
warning per directory per ``RealFS`` on the ``bookie.fs`` logger. A direct file
checks that writes are aligned in offset and length to :data:`ALIGNMENT` before the
kernel does (some file systems accept unaligned direct writes; MemFS does not, and
neither does this), so misaligned code fails on every disk; memory alignment is the
caller's job (:meth:`RealFS.alloc_buffer`).

Reads of a direct file use a second, buffered, read-only descriptor opened on the same
file, so ``pread`` takes any offset and size. Linux keeps the two coherent: a direct
write invalidates the page-cache range it covered, so a read after the write returned
sees it. The price is one extra descriptor per direct file.

Names are durable only after :meth:`RealFS.fsync_dir` of the parent, as the seam says.
"""

from __future__ import annotations

import errno
import logging
import os
import threading

from bookie import native
from bookie.fs import AlignedBuffer

__all__ = ["ALIGNMENT", "SYNCFS_TYPES", "RealFS", "RealSyncer", "disk_usage", "file_system_type"]

#: O_DIRECT alignment of offsets, lengths and buffers (a page: safe on 4Kn disks).
ALIGNMENT = 4096

log = logging.getLogger("bookie.fs")


def _nbytes(data: native.BufferLike) -> int:
    return data.nbytes if isinstance(data, memoryview) else len(data)


class RealFile:
    """An open file on disk; see :class:`bookie.fs.File`."""

    def __init__(self, backend: native.Backend, path: str, fd: int, read_fd: int,
                 direct: bool) -> None:
        self.path = path
        self.direct = direct
        self._backend = backend
        self._fd = fd
        self._read_fd = read_fd  # == fd unless direct
        self._closed = False

    def _live_fd(self) -> int:
        if self._closed:
            raise ValueError(f"I/O on closed file {self.path}")
        return self._fd

    def _check_aligned(self, offset: int, length: int) -> None:
        if offset % ALIGNMENT or length % ALIGNMENT:
            raise native.io_error(errno.EINVAL, "pwrite", path=self.path, offset=offset,
                                  length=length, reason="unaligned O_DIRECT write")

    def _check_vector(self, buffers: list[memoryview], offset: int) -> None:
        """:meth:`_check_aligned` for each buffer of a vector written at ``offset``, in one
        loop (the journal's batch, once per flush: no call per buffer)."""
        pos = offset
        for b in buffers:
            n = b.nbytes if isinstance(b, memoryview) else len(b)
            if pos % ALIGNMENT or n % ALIGNMENT:
                self._check_aligned(pos, n)  # raises
            pos += n

    def pwrite(self, data: native.BufferLike, offset: int) -> int:
        fd = self._live_fd()
        if self.direct:
            self._check_aligned(offset, _nbytes(data))
        return self._backend.pwrite(fd, data, offset)

    def pwritev(self, buffers: list[memoryview], offset: int) -> int:
        fd = self._live_fd()
        if self.direct:
            self._check_vector(buffers, offset)
        return self._backend.pwritev(fd, buffers, offset)

    def pwritev_sync(self, buffers: list[memoryview], offset: int, datasync: bool = True) -> int:
        fd = self._fd if not self._closed else self._live_fd()  # the journal's write: a call less
        if self.direct:
            self._check_vector(buffers, offset)
        return self._backend.pwritev_sync(fd, buffers, offset, datasync)

    def pread(self, size: int, offset: int) -> bytes:
        self._live_fd()
        return self._backend.pread(self._read_fd, size, offset)

    def sync(self) -> None:
        self._backend.fdatasync(self._live_fd())

    def truncate(self, size: int) -> None:
        self._backend.ftruncate(self._live_fd(), size)

    def allocate(self, offset: int, length: int) -> None:
        self._backend.fallocate(self._live_fd(), offset, length)

    def size(self) -> int:
        return self._backend.file_size(self._live_fd())

    def close(self) -> None:
        """Idempotent. Both descriptors are closed even if the first close fails."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._read_fd != self._fd:
                self._backend.close(self._read_fd)
        finally:
            self._backend.close(self._fd)

    def __repr__(self) -> str:
        return f"<RealFile {self.path!r} direct={self.direct} closed={self._closed}>"


#: File systems whose syncfs(2) syncs and reports everything (Linux 5.17 or later).
SYNCFS_TYPES = frozenset({"ext4", "xfs", "btrfs", "f2fs", "tmpfs"})


def file_system_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the file system ``path`` is on (the mount whose point is the
    longest prefix of its real path, from ``mountinfo``); None when unknown."""
    target = os.path.realpath(path)
    best, kind = -1, None
    try:
        with open(mountinfo, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields, sep, rest = line.partition(" - ")
        parts, tail = fields.split(), rest.split()
        if not sep or len(parts) < 5 or not tail:
            continue
        point = parts[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:  # the later of two mounts on one point is the visible one
            best, kind = len(point), tail[0]
    return kind


def disk_usage(path: str) -> float:
    """The fraction (0..1) of the file system of ``path`` in use, as the bookie's disk
    check compares it with ``diskUsageThreshold``; every report of a disk's usage
    (``walkit bookie info``, ``gc.status``, ``/api/v1/bookie/info``, the metrics) shows
    this figure. Of its blocks, BookKeeper's ``(total - usable) / total``: blocks
    reserved for root count as used (``f_bavail``, not ``f_bfree``: the bookie cannot
    have them), which is why it reads higher than ``df``'s used / (used + available);
    or of its inodes, when more of those are used (a file system out of inodes refuses
    new files with ENOSPC too). Of the whole file system, not of walkit's own files."""
    with native.translating("statvfs", path=path):
        st = os.statvfs(path)
    blocks = 1.0 - st.f_bavail / st.f_blocks if st.f_blocks else 1.0
    inodes = 1.0 - st.f_favail / st.f_files if st.f_files else 0.0  # 0 files: no inode limit (btrfs)
    return max(blocks, inodes)


class RealSyncer:
    """:class:`bookie.fs.Syncer` on a descriptor of a directory, open until :meth:`close`
    (syncfs(2) reports the file system's writeback errors since the descriptor was
    opened, and those no syncfs reported before: one opened just before the sync would
    miss those of the writes it covers that a sync through another descriptor took)."""

    def __init__(self, backend: native.Backend, path: str) -> None:
        self._backend = backend
        self.path = path
        self._fd, _ = backend.open_file(path, readonly=True)
        self._closed = False

    def sync(self) -> None:
        if self._closed:
            raise native.io_error(errno.EBADF, "syncfs", path=self.path)
        self._backend.syncfs(self._fd)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._backend.close(self._fd)

    def __repr__(self) -> str:
        return f"<RealSyncer {self.path!r} closed={self._closed}>"


class RealFS:
    """:class:`bookie.fs.FileSystem` on the real disk through a :mod:`bookie.native`
    backend (``None``: the one ``WALKIT_NATIVE`` chose)."""

    alignment = ALIGNMENT
    zero_fill_pays = True

    def __init__(self, backend: native.Backend | None = None) -> None:
        self.backend = backend if backend is not None else native.default_backend()
        self._lock = threading.Lock()
        self._warned_dirs: set[str] = set()

    def open(self, path: str, *, create: bool = False, direct: bool = False) -> RealFile:
        fd, granted = self.backend.open_file(path, create=create, direct=direct)
        if direct and not granted:
            self._warn_buffered(path)
        read_fd = fd
        if granted:
            try:
                read_fd, _ = self.backend.open_file(path, readonly=True)
            except BaseException:
                self.backend.close(fd)
                raise
        return RealFile(self.backend, path, fd, read_fd, granted)

    def _warn_buffered(self, path: str) -> None:
        directory = os.path.dirname(os.path.abspath(path))
        with self._lock:
            if directory in self._warned_dirs:
                return
            self._warned_dirs.add(directory)
        log.warning("O_DIRECT is not available in %s (e.g. tmpfs): using buffered writes "
                    "+ fdatasync there", directory)

    def alloc_buffer(self, size: int) -> AlignedBuffer:
        return self.backend.alloc_aligned(size, ALIGNMENT)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        with native.translating("listdir", path=path):
            return sorted(os.listdir(path))

    def makedirs(self, path: str) -> None:
        with native.translating("makedirs", path=path):
            os.makedirs(path, exist_ok=True)

    def remove(self, path: str) -> None:
        with native.translating("remove", path=path):
            os.remove(path)

    def rename(self, src: str, dst: str) -> None:
        with native.translating("rename", path=src, dst=dst):
            os.replace(src, dst)

    def fsync_dir(self, path: str) -> None:
        self.backend.fsync_dir(path)

    def open_syncer(self, path: str) -> RealSyncer | None:
        """A syncer where the backend has syncfs and ``path`` is on a local file system
        whose syncfs makes everything durable and reports what failed (ext4, XFS,
        btrfs, f2fs; tmpfs, where nothing is durable anyway); None elsewhere - a FUSE or
        network file system may not pass syncfs on to what stores the data."""
        if not self.backend.has_syncfs or file_system_type(path) not in SYNCFS_TYPES:
            return None
        return RealSyncer(self.backend, path)

    def disk_usage(self, path: str) -> float:
        """:func:`disk_usage`: 1.0 means the next allocation by an unprivileged writer
        fails with ENOSPC."""
        return disk_usage(path)
