"""``FaultyFS``: any :class:`bookie.fs.FileSystem` whose syncs can be made to fail.

Theory of operation
-------------------
A disk that starts failing answers ``fdatasync`` with EIO. Linux then marks the dirty
pages clean and drops the error, so a retried sync "succeeds" over data that never
reached the disk (PostgreSQL's "fsyncgate"). :class:`FaultyFS` wraps a real (or any)
file system and, once :meth:`FaultyFS.fail_syncs` is armed for a directory, fails the
next syncs of files under it with EIO (``NativeIOError``, as the native backend raises
it), as a failing disk would:

* ``File.sync()`` raises (whatever was written since the last good sync stays where the
  inner file system put it: this models the error, not the lost pages);
* ``File.pwritev_sync()`` (the journal's write + fdatasync in one call) raises *before*
  writing: the batch never reaches the file, as if its pages were dropped - the case a
  bookie that trusted a retried sync would get wrong;
* a :class:`~bookie.fs.Syncer`'s ``sync()`` (syncfs of the whole file system) raises when
  a directory above, at or under its own is armed: the failed writeback may be any file's.

Only syncs fail; reads, writes and directory operations pass through unchanged. It is
test machinery (``walkit.testing.FaultyCluster.fail_sync`` arms it on a serving bookie,
which it reaches as ``ServerHooks.disk`` of :mod:`bookie.server`: the server itself
knows nothing of it), kept beside :mod:`bookie.fs.mem` because both are twins of the
same seam.
"""

from __future__ import annotations

import errno
import os
import threading

from bookie import native
from bookie.fs import AlignedBuffer, File, FileSystem, Syncer

__all__ = ["FaultyFS"]


class _FaultyFile:
    """A file of :class:`FaultyFS`: the inner file, with syncs that may fail."""

    def __init__(self, fs: FaultyFS, inner: File, path: str) -> None:
        self._fs, self._inner, self.path = fs, inner, path
        self.direct: bool = inner.direct

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> int:
        return self._inner.pwrite(data, offset)

    def pwritev(self, buffers: list[memoryview], offset: int) -> int:
        return self._inner.pwritev(buffers, offset)

    def pwritev_sync(self, buffers: list[memoryview], offset: int, datasync: bool = True) -> int:
        self._fs._check_sync(self.path, "pwritev_sync")
        return self._inner.pwritev_sync(buffers, offset, datasync)

    def pread(self, size: int, offset: int) -> bytes:
        return self._inner.pread(size, offset)

    def sync(self) -> None:
        self._fs._check_sync(self.path, "fdatasync")
        self._inner.sync()

    def truncate(self, size: int) -> None:
        self._inner.truncate(size)

    def allocate(self, offset: int, length: int) -> None:
        self._inner.allocate(offset, length)

    def size(self) -> int:
        return self._inner.size()

    def close(self) -> None:
        self._inner.close()


class _FaultySyncer:
    def __init__(self, fs: FaultyFS, inner: Syncer, path: str) -> None:
        self._fs, self._inner, self.path = fs, inner, path

    def sync(self) -> None:
        self._fs._check_sync(self.path, "syncfs", tree=True)
        self._inner.sync()

    def close(self) -> None:
        self._inner.close()


class FaultyFS:
    """``inner`` (a FileSystem) with :meth:`fail_syncs`. Thread-safe."""

    def __init__(self, inner: FileSystem) -> None:
        self.inner = inner
        self.alignment = inner.alignment
        self.zero_fill_pays = inner.zero_fill_pays
        self._lock = threading.Lock()
        self._armed: dict[str, int] = {}  # directory -> syncs still to fail
        self.failed = 0  # syncs failed so far

    def fail_syncs(self, directory: str, count: int = 1) -> None:
        """Fail the next ``count`` syncs of files under ``directory`` with EIO
        (``count`` 0 disarms it)."""
        key = os.path.normpath(directory)
        with self._lock:
            if count > 0:
                self._armed[key] = count
            else:
                self._armed.pop(key, None)

    def _check_sync(self, path: str, op: str, *, tree: bool = False) -> None:
        """Fail this sync of ``path`` if a directory above it is armed (``tree``: a sync
        of the whole file system through the directory ``path``, failed by any armed
        directory above, at or under it)."""
        with self._lock:
            for directory, left in self._armed.items():
                if path.startswith(directory + os.sep) or tree and (
                        directory == path or directory.startswith(path + os.sep)):
                    if left <= 1:
                        del self._armed[directory]
                    else:
                        self._armed[directory] = left - 1
                    self.failed += 1
                    break
            else:
                return
        raise native.io_error(errno.EIO, op, path=path, injected=True)

    # -- the FileSystem protocol: everything else passes through ---------------------------
    def open(self, path: str, *, create: bool = False, direct: bool = False) -> File:
        return _FaultyFile(self, self.inner.open(path, create=create, direct=direct), path)

    def alloc_buffer(self, size: int) -> AlignedBuffer:
        return self.inner.alloc_buffer(size)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

    def makedirs(self, path: str) -> None:
        self.inner.makedirs(path)

    def remove(self, path: str) -> None:
        self.inner.remove(path)

    def rename(self, src: str, dst: str) -> None:
        self.inner.rename(src, dst)

    def fsync_dir(self, path: str) -> None:
        self.inner.fsync_dir(path)

    def open_syncer(self, path: str) -> Syncer | None:
        inner = self.inner.open_syncer(path)
        return None if inner is None else _FaultySyncer(self, inner, os.path.normpath(path))

    def disk_usage(self, path: str) -> float:
        return self.inner.disk_usage(path)
