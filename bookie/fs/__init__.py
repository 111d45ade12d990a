"""The file-system seam under the journal and the ledger storage.

Theory of operation
-------------------
Everything the bookie persists goes through a :class:`FileSystem`. Two implementations
exist and the same code and tests run on both:

* :class:`bookie.fs.real.RealFS` - the machine's disk, through :mod:`bookie.native`
  (the cffi shim or its pure-Python twin), with O_DIRECT where the file system allows it;
* :class:`bookie.fs.mem.MemFS` - an in-memory twin that remembers what was synced and
  can :meth:`~bookie.fs.mem.MemFS.crash` (unsynced bytes are dropped or torn, unsynced
  directory entries vanish) or fail the next write or sync, so crash tests can run by the
  thousand.

The contract the storage code may rely on (and no more):

* ``File.sync()`` (fdatasync) makes the file's bytes and size durable, not its name;
* a new name (create, rename, remove) is durable only after ``fsync_dir`` of its parent;
* a write that was not synced may be lost whole, lost in part, or kept - in any mix of
  512-byte sectors; a single sector is never torn;
* ``FileSystem.open_syncer(path)``, where there is one, gives a :class:`Syncer` whose
  ``sync()`` makes every file and name of the file system holding ``path`` durable at
  once (Linux syncfs(2)): one call instead of a sync per file, for a checkpoint that
  wrote thousands of index files.
"""

from __future__ import annotations

import errno
from typing import Protocol, runtime_checkable

__all__ = ["File", "FileSystem", "AlignedBuffer", "SECTOR", "Syncer", "is_no_space"]

#: The smallest unit a crash cannot tear (and the unit MemFS tears by).
SECTOR = 512


@runtime_checkable
class AlignedBuffer(Protocol):
    """A writable buffer whose start is aligned for O_DIRECT I/O."""

    @property
    def view(self) -> memoryview:
        """A writable byte view of the whole buffer (format ``B``)."""
        ...

    def __len__(self) -> int: ...

    def close(self) -> None: ...


class File(Protocol):
    """An open file. Offsets are absolute; there is no file position."""

    path: str
    #: True when opened with O_DIRECT: writes must be aligned in offset, length and memory.
    direct: bool

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> int: ...

    def pwritev(self, buffers: list[memoryview], offset: int) -> int:
        """Write the buffers back to back from ``offset`` in one call."""
        ...

    def pwritev_sync(self, buffers: list[memoryview], offset: int, datasync: bool = True) -> int:
        """``pwritev`` then ``sync`` (fdatasync; fsync when not ``datasync``) in one call:
        a group commit. Same durability and crash semantics as the two calls in a row
        (a crash between them may tear the write); nothing is synced if the write
        fails. RealFS's native backend releases the GIL once for both."""
        ...

    def pread(self, size: int, offset: int) -> bytes: ...

    def sync(self) -> None:
        """fdatasync: the data and the size written so far are durable."""
        ...

    def truncate(self, size: int) -> None: ...

    def allocate(self, offset: int, length: int) -> None:
        """Reserve zero-filled space (fallocate, mode 0: the size grows)."""
        ...

    def size(self) -> int: ...

    def close(self) -> None: ...


class Syncer(Protocol):
    """A handle on one file system, kept open while files are written through it."""

    def sync(self) -> None:
        """Make the data, sizes and names of every file of the file system durable -
        as ``sync()`` of each file and ``fsync_dir`` of each directory would. A write
        of that file system that failed in the background since the syncer's last
        ``sync`` - or since it was opened, or before that if no syncfs reported it yet -
        makes it raise, once: after that, as after any failed sync, what was written
        may be gone."""
        ...

    def close(self) -> None: ...


class FileSystem(Protocol):
    """Paths are plain strings; directories are created with ``makedirs``."""

    #: Alignment (bytes) of O_DIRECT I/O on this file system.
    alignment: int
    #: Whether zeros written ahead of a journal's tail pay off: on a real file system
    #: fallocated space is unwritten extents that the first write into them converts
    #: (bookie/journal/_zero.py); in memory there is nothing to convert.
    zero_fill_pays: bool

    def open(self, path: str, *, create: bool = False, direct: bool = False) -> File:
        """Open read-write. ``direct`` asks for O_DIRECT; where the file system refuses
        it the file is opened buffered and ``File.direct`` is False."""
        ...

    def alloc_buffer(self, size: int) -> AlignedBuffer: ...

    def exists(self, path: str) -> bool: ...

    def listdir(self, path: str) -> list[str]: ...

    def makedirs(self, path: str) -> None: ...

    def remove(self, path: str) -> None: ...

    def rename(self, src: str, dst: str) -> None:
        """Atomic replace of ``dst`` (durable after ``fsync_dir`` of the parent)."""
        ...

    def fsync_dir(self, path: str) -> None: ...

    def open_syncer(self, path: str) -> Syncer | None:
        """A :class:`Syncer` for the file system holding the directory ``path``, or None
        where there is none (each file is then synced on its own)."""
        ...

    def disk_usage(self, path: str) -> float:
        """Fraction (0..1) of the file system holding ``path`` that is used."""
        ...


_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_SYNC_OPS = frozenset({"fdatasync", "fsync", "fsync_dir", "syncfs"})


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc`` is a write, create or reservation the file system refused for
    lack of space (ENOSPC, EDQUOT): nothing was promised, and the same bytes may be
    written again once there is room. Never a failed sync: an fsync that reports
    ENOSPC (NFS, thin provisioning) may have dropped dirty pages, like any failed
    fsync - retrying it would report success for data that is gone ("fsyncgate")."""
    if not isinstance(exc, OSError) or exc.errno not in _NO_SPACE:
        return False
    context = getattr(exc, "context", None)
    return not (isinstance(context, dict) and context.get("op") in _SYNC_OPS)


def read_all(fs: FileSystem, path: str) -> bytes:
    """Read a whole (small) file through the seam."""
    f = fs.open(path)
    try:
        return f.pread(f.size(), 0)
    finally:
        f.close()


def parent_dir(path: str) -> str:
    head, _, _ = path.rstrip("/").rpartition("/")
    return head or "/"


def write_atomic(fs: FileSystem, path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` durably: write ``.tmp``, sync, rename, sync dir.

    After a crash the file holds either the old or the new bytes, never a mix."""
    tmp = path + ".tmp"
    f = fs.open(tmp, create=True)
    try:
        f.truncate(0)
        f.pwrite(data, 0)
        f.sync()
    finally:
        f.close()
    fs.rename(tmp, path)
    fs.fsync_dir(parent_dir(path))
