"""The one door to the operating system's file I/O: the C shim or its pure-Python twin.

Theory of operation
-------------------
Two backends offer the same syscall-shaped functions on file descriptors:

* ``native`` - ``bookie._native``, the cffi extension built from ``native/*.c``. Calls
  release the GIL (cffi API mode), write from any buffer without copying
  (``ffi.from_buffer``) and loop on short writes and EINTR in C.
* ``python`` - ``os.pwrite``, ``os.fdatasync``, ``os.posix_fallocate`` ... and
  ``mmap``-backed buffers (anonymous mappings are page-aligned, hence O_DIRECT-ready).

``WALKIT_NATIVE`` picks the default backend when this module is imported: ``auto``
(the shim if it imports, else Python), ``require`` (the shim or ImportError) or
``off`` (Python; the shim is never loaded). :func:`get_backend` builds either one by
name, so tests run the same cases on both in one process.

Guarantees: every failure, from either backend, is a :class:`walkit.errors.NativeIOError`
that keeps ``errno`` (it is an ``OSError``) and says ``op``, ``path``, ``fd``,
``offset`` and ``length`` where they apply. :meth:`Backend.open_file` asks for
O_DIRECT and, when the file system refuses it (EINVAL at open, as older tmpfs does),
opens the file buffered and says so. This is the only module that imports
``bookie._native``; nothing above it sees ``ffi`` or a raw ``OSError``.
"""

from __future__ import annotations

import errno
import importlib
import mmap
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from bookie.fs import AlignedBuffer
from walkit.errors import ConfigError, NativeIOError

__all__ = [
    "BACKEND", "ENV_VAR", "HAS_NATIVE", "HAS_O_DIRECT", "MODE", "Backend", "BufferLike",
    "alloc_aligned", "close", "default_backend", "fallocate", "fdatasync", "file_size",
    "fsync_dir", "ftruncate", "get_backend", "io_error", "open_file", "pread",
    "pread_into", "pwrite", "pwritev", "pwritev_sync", "select_backend", "translating",
]

BufferLike = bytes | bytearray | memoryview | mmap.mmap

ENV_VAR = "WALKIT_NATIVE"
#: The platform has O_DIRECT at all (Linux); a given file system may still refuse it.
HAS_O_DIRECT: bool = hasattr(os, "O_DIRECT")
FILE_MODE = 0o644  # new files: rw-r--r--, as BookKeeper's journal and entry logs
_IOV_BATCH = 1024  # IOV_MAX on Linux


def io_error(err: int, op: str, **context: object) -> NativeIOError:
    """The walkit error for ``errno`` ``err`` during ``op``."""
    return NativeIOError(err, f"{op} failed: {os.strerror(err)}", op=op, **context)


class translating:  # noqa: N801 - used like contextlib.suppress
    """``with translating("rename", path=p):`` an ``OSError`` raised inside becomes
    :class:`NativeIOError` (errno kept, ``raise ... from``). Given ``paths`` (fd to
    path), a missing ``path`` is looked up from ``fd``. A class, not a generator:
    it sits on every write of the Python backend."""

    __slots__ = ("_context", "_op", "_paths")

    def __init__(self, op: str, paths: Mapping[int, str] | None = None,
                 **context: object) -> None:
        self._op, self._paths, self._context = op, paths, context

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, OSError) and not isinstance(exc, NativeIOError):
            err = exc.errno or errno.EIO
            raise _error(err, self._op, self._paths, dict(self._context)) from exc


def _error(err: int, op: str, paths: Mapping[int, str] | None,
           context: dict[str, object]) -> NativeIOError:
    """``io_error`` with ``path`` first, found from ``fd`` in ``paths`` if not given."""
    path, fd = context.pop("path", None), context.pop("fd", None)
    if path is None and paths is not None and isinstance(fd, int):
        path = paths.get(fd)
    return io_error(err, op, path=path, fd=fd, **context)


def _kernel_at_least(major: int, minor: int) -> bool:
    """Whether this is Linux ``major.minor`` or later."""
    if os.uname().sysname != "Linux":
        return False
    numbers = [int(n) for n in os.uname().release.split("-")[0].split(".")[:2] if n.isdigit()]
    return len(numbers) == 2 and (numbers[0], numbers[1]) >= (major, minor)


class Backend(ABC):
    """File I/O on descriptors. Offsets are absolute; every method may raise
    :class:`NativeIOError`. Subclasses implement the abstract primitives."""

    name: str

    def __init__(self) -> None:
        self._paths: dict[int, str] = {}  # fd -> path, for error context only

    def open_file(self, path: str, *, create: bool = False, direct: bool = False,
                  readonly: bool = False) -> tuple[int, bool]:
        """Open ``path`` (read-write unless ``readonly``); returns ``(fd, direct)``
        where ``direct`` says whether O_DIRECT was granted."""
        if direct and HAS_O_DIRECT:
            try:
                return self._remember(self._open(path, create, True, readonly), path), True
            except NativeIOError as exc:
                if exc.errno != errno.EINVAL:
                    raise
        return self._remember(self._open(path, create, False, readonly), path), False

    def close(self, fd: int) -> None:
        self._paths.pop(fd, None)
        self._close(fd)

    def file_size(self, fd: int) -> int:
        with translating("fstat", self._paths, fd=fd):
            return os.fstat(fd).st_size

    def _remember(self, fd: int, path: str) -> int:
        self._paths[fd] = path
        return fd

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    # --- primitives ---------------------------------------------------------------
    @abstractmethod
    def _open(self, path: str, create: bool, direct: bool, readonly: bool) -> int:
        """open(2) with these options; returns the fd."""

    @abstractmethod
    def _close(self, fd: int) -> None:
        """close(2)."""

    @abstractmethod
    def pwrite(self, fd: int, data: BufferLike, offset: int) -> int:
        """Write all of ``data`` at ``offset``; returns its length."""

    @abstractmethod
    def pwritev(self, fd: int, buffers: Sequence[BufferLike], offset: int) -> int:
        """Write the buffers back to back at ``offset``; returns the total length."""

    @abstractmethod
    def pwritev_sync(self, fd: int, buffers: Sequence[BufferLike], offset: int,
                     datasync: bool = True) -> int:
        """``pwritev`` then ``fdatasync`` (``datasync``) or ``fsync``: a group commit in
        one call (the native backend releases the GIL once for both). Nothing is synced
        when the write fails; the error's ``op`` says which step failed."""

    @abstractmethod
    def pread(self, fd: int, size: int, offset: int) -> bytes:
        """Read up to ``size`` bytes (fewer only at end of file)."""

    @abstractmethod
    def pread_into(self, fd: int, buffer: BufferLike, offset: int) -> int:
        """Read into a writable ``buffer`` (an aligned one for O_DIRECT); returns the count."""

    @abstractmethod
    def fdatasync(self, fd: int) -> None:
        """Make the bytes and the size written so far durable (not the name)."""

    @abstractmethod
    def fallocate(self, fd: int, offset: int, length: int) -> None:
        """Reserve zero-filled space; the size grows to at least ``offset + length``."""

    @abstractmethod
    def ftruncate(self, fd: int, size: int) -> None:
        """Set the size: cut, or extend with zeros."""

    @abstractmethod
    def fsync_dir(self, path: str) -> None:
        """Make the directory's entries (creates, renames, removes) durable."""

    @abstractmethod
    def alloc_aligned(self, size: int, align: int = 4096) -> AlignedBuffer:
        """A zero-filled buffer whose start is ``align``-aligned."""

    #: Whether :meth:`syncfs` is there and reports what failed (the shim, on Linux 5.17 or
    #: later: before 5.8 syncfs(2) returned 0 whatever failed, before 5.17 it ignored the
    #: file system's own sync - an ext4 journal commit, an XFS log force - that makes new
    #: names and sizes durable).
    has_syncfs = False

    def syncfs(self, fd: int) -> None:
        """syncfs(2) of the file system holding ``fd``: every file's data, size and
        names durable at once. A writeback error of that file system since ``fd`` was
        opened (or since the last syncfs through it) raises, once."""
        raise io_error(errno.ENOSYS, "syncfs", fd=fd)


class _AlignedBuffer:
    """An :class:`bookie.fs.AlignedBuffer`. ``close`` drops this handle's view; the
    memory itself goes when the last view of it (slices included) is gone, so a slice
    that outlives ``close`` never points at freed memory."""

    __slots__ = ("view",)

    def __init__(self, owner: Any, size: int) -> None:  # an mmap or a cffi buffer
        #: the buffer's bytes: an attribute, not a property (read at every journal flush)
        self.view: memoryview = memoryview(owner).cast("B")[:size]

    def __len__(self) -> int:
        return len(self.view)

    def close(self) -> None:
        self.view.release()


def _byte_view(data: BufferLike) -> memoryview:
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _advance(views: list[memoryview], n: int) -> list[memoryview]:
    """Drop the first ``n`` bytes from a list of views."""
    i = 0
    while n and n >= len(views[i]):
        n -= len(views[i])
        i += 1
    rest = views[i:]
    if n:
        rest[0] = rest[0][n:]
    return rest


class _PythonBackend(Backend):
    """The ``os`` module; buffers are anonymous mmaps (page-aligned)."""

    name = "python"

    def _os(self, op: str, fd: int | None = None, **context: object) -> translating:
        return translating(op, self._paths, fd=fd, **context)

    def _open(self, path: str, create: bool, direct: bool, readonly: bool) -> int:
        flags = os.O_CLOEXEC | (os.O_RDONLY if readonly else os.O_RDWR)
        flags |= (os.O_CREAT if create else 0) | (os.O_DIRECT if direct else 0)
        with self._os("open", path=path):
            return os.open(path, flags, FILE_MODE)

    def _close(self, fd: int) -> None:
        with self._os("close", fd):
            os.close(fd)

    def pwrite(self, fd: int, data: BufferLike, offset: int) -> int:
        view = _byte_view(data)
        done = 0
        with self._os("pwrite", fd, offset=offset, length=len(view)):
            while done < len(view):
                n = os.pwrite(fd, view[done:], offset + done)
                if n == 0:
                    raise OSError(errno.EIO, "pwrite made no progress")
                done += n
        return done

    def pwritev(self, fd: int, buffers: Sequence[BufferLike], offset: int) -> int:
        views = [v for v in map(_byte_view, buffers) if len(v)]
        total = 0
        with self._os("pwritev", fd, offset=offset, length=sum(map(len, views))):
            while views:
                n = os.pwritev(fd, views[:_IOV_BATCH], offset + total)
                if n == 0:
                    raise OSError(errno.EIO, "pwritev made no progress")
                total += n
                views = _advance(views, n)
        return total

    def pwritev_sync(self, fd: int, buffers: Sequence[BufferLike], offset: int,
                     datasync: bool = True) -> int:
        total = self.pwritev(fd, buffers, offset)
        if datasync:
            self.fdatasync(fd)
        else:
            with self._os("fsync", fd):
                os.fsync(fd)
        return total

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        with self._os("pread", fd, offset=offset, length=size):
            return os.pread(fd, size, offset)

    def pread_into(self, fd: int, buffer: BufferLike, offset: int) -> int:
        view = _byte_view(buffer)
        with self._os("pread", fd, offset=offset, length=len(view)):
            return os.preadv(fd, [view], offset)

    def fdatasync(self, fd: int) -> None:
        with self._os("fdatasync", fd):
            os.fdatasync(fd)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        with self._os("fallocate", fd, offset=offset, length=length):
            os.posix_fallocate(fd, offset, length)

    def ftruncate(self, fd: int, size: int) -> None:
        with self._os("ftruncate", fd, length=size):
            os.ftruncate(fd, size)

    def fsync_dir(self, path: str) -> None:
        with self._os("fsync_dir", path=path):
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def alloc_aligned(self, size: int, align: int = 4096) -> AlignedBuffer:
        if align <= 0 or align & (align - 1) or mmap.PAGESIZE % align:
            raise io_error(errno.EINVAL, "alloc_aligned", length=size, align=align)
        return _AlignedBuffer(mmap.mmap(-1, max(size, 1)), size)


class _NativeBackend(Backend):
    """``bookie._native`` through cffi; ``lib`` calls return ``>= 0`` or ``-errno``."""

    name = "native"

    def __init__(self, ffi: Any, lib: Any) -> None:
        super().__init__()
        self._ffi, self._lib = ffi, lib
        # an extension built before wk_syncfs existed (an editable install not rebuilt) has none
        self.has_syncfs = _kernel_at_least(5, 17) and hasattr(lib, "wk_syncfs")

    def _check(self, rc: int, op: str, fd: int | None = None, **context: object) -> int:
        if rc < 0:
            raise _error(-rc, op, self._paths, {"fd": fd, **context})
        return rc

    def _open(self, path: str, create: bool, direct: bool, readonly: bool) -> int:
        lib = self._lib
        flags = (lib.WK_OPEN_CREATE if create else 0) | (lib.WK_OPEN_DIRECT if direct else 0)
        flags |= lib.WK_OPEN_READONLY if readonly else 0
        return self._check(lib.wk_open(os.fsencode(path), flags, FILE_MODE), "open", path=path)

    def _close(self, fd: int) -> None:
        self._check(self._lib.wk_close(fd), "close", fd)

    def pwrite(self, fd: int, data: BufferLike, offset: int) -> int:
        with self._ffi.from_buffer(data) as ptr:  # no copy: points into ``data``
            rc = self._lib.wk_pwrite(fd, ptr, len(ptr), offset)
            return self._check(rc, "pwrite", fd, offset=offset, length=len(ptr))

    def pwritev(self, fd: int, buffers: Sequence[BufferLike], offset: int) -> int:
        ffi = self._ffi
        ptrs = [ffi.from_buffer(b) for b in buffers]
        try:
            lens = [len(p) for p in ptrs]
            rc = self._lib.wk_pwritev(fd, ffi.new("void *[]", ptrs), ffi.new("size_t[]", lens),
                                      len(ptrs), offset)
        finally:
            for p in ptrs:
                ffi.release(p)
        return self._check(rc, "pwritev", fd, offset=offset, length=sum(lens))

    def pwritev_sync(self, fd: int, buffers: Sequence[BufferLike], offset: int,
                     datasync: bool = True) -> int:
        ffi, lib = self._ffi, self._lib
        ptrs = list(map(ffi.from_buffer, buffers))  # C loops: no list comprehension's call per flush
        failed_sync = ffi.new("int *")
        try:
            lens = list(map(len, ptrs))
            rc = lib.wk_pwritev_sync(fd, ffi.new("void *[]", ptrs), ffi.new("size_t[]", lens),
                                     len(ptrs), offset, lib.WK_SYNC_DATA if datasync else 0,
                                     failed_sync)
        finally:
            for p in ptrs:
                ffi.release(p)
        if rc < 0 and failed_sync[0]:
            self._check(rc, "fdatasync" if datasync else "fsync", fd)
        return self._check(rc, "pwritev", fd, offset=offset, length=sum(lens))

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        buf = self._ffi.new("char[]", size)
        n = self._check(self._lib.wk_pread(fd, buf, size, offset), "pread", fd,
                        offset=offset, length=size)
        data: bytes = self._ffi.buffer(buf, n)[:]
        return data

    def pread_into(self, fd: int, buffer: BufferLike, offset: int) -> int:
        with self._ffi.from_buffer(buffer, require_writable=True) as ptr:
            rc = self._lib.wk_pread(fd, ptr, len(ptr), offset)
            return self._check(rc, "pread", fd, offset=offset, length=len(ptr))

    def fdatasync(self, fd: int) -> None:
        self._check(self._lib.wk_fdatasync(fd), "fdatasync", fd)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        rc = self._lib.wk_fallocate(fd, offset, length)
        self._check(rc, "fallocate", fd, offset=offset, length=length)

    def ftruncate(self, fd: int, size: int) -> None:
        self._check(self._lib.wk_ftruncate(fd, size), "ftruncate", fd, length=size)

    def fsync_dir(self, path: str) -> None:
        self._check(self._lib.wk_fsync_dir(os.fsencode(path)), "fsync_dir", path=path)

    def syncfs(self, fd: int) -> None:
        self._check(self._lib.wk_syncfs(fd), "syncfs", fd)

    def alloc_aligned(self, size: int, align: int = 4096) -> AlignedBuffer:
        ffi, lib = self._ffi, self._lib
        out = ffi.new("void **")
        self._check(lib.wk_aligned_alloc(out, size, align), "alloc_aligned",
                    length=size, align=align)
        # ffi.gc frees with wk_free once unreachable; ffi.buffer and every memoryview
        # (slices too) keep it reachable, so the memory outlives all its views.
        ptr = ffi.gc(ffi.cast("char *", out[0]), lib.wk_free, size=size)
        return _AlignedBuffer(ffi.buffer(ptr, size), size)


def _import_shim() -> Any:
    return importlib.import_module("bookie._native")


def get_backend(name: str) -> Backend:
    """A new backend by name, ``"native"`` or ``"python"``. ``"native"`` raises
    ImportError when the extension is not built or ``WALKIT_NATIVE=off``."""
    if name == "python":
        return _PythonBackend()
    if name != "native":
        raise ConfigError("unknown I/O backend, expected native or python", backend=name)
    if MODE == "off":
        raise ImportError(f"the native I/O backend is disabled ({ENV_VAR}=off)")
    try:
        shim = _import_shim()
    except ImportError as exc:
        raise ImportError(
            f"bookie._native (walkit's C I/O shim) is not built: {exc}. Build it with "
            f"`pip install -e .` (needs a C compiler), or set {ENV_VAR}=auto or off "
            f"to use the pure-Python backend") from exc
    return _NativeBackend(shim.ffi, shim.lib)


def select_backend(mode: str) -> Backend:
    """The backend ``WALKIT_NATIVE=mode`` asks for (``auto``, ``require`` or ``off``)."""
    if mode == "off":
        return get_backend("python")
    if mode == "require":
        return get_backend("native")
    if mode != "auto":
        raise ConfigError(f"{ENV_VAR} must be auto, require or off", value=mode)
    try:
        return get_backend("native")
    except ImportError:
        return get_backend("python")


#: The value of ``WALKIT_NATIVE`` at import (``auto`` when unset).
MODE: str = os.environ.get(ENV_VAR, "").strip().lower() or "auto"
_DEFAULT: Backend = select_backend(MODE)
#: ``"native"`` or ``"python"``: the backend the module-level functions use.
BACKEND: str = _DEFAULT.name
#: The C shim is loaded and serves the module-level functions.
HAS_NATIVE: bool = BACKEND == "native"


def default_backend() -> Backend:
    """The backend chosen by ``WALKIT_NATIVE`` (what the module functions use)."""
    return _DEFAULT


open_file = _DEFAULT.open_file
close = _DEFAULT.close
pwrite = _DEFAULT.pwrite
pwritev = _DEFAULT.pwritev
pwritev_sync = _DEFAULT.pwritev_sync
pread = _DEFAULT.pread
pread_into = _DEFAULT.pread_into
fdatasync = _DEFAULT.fdatasync
fallocate = _DEFAULT.fallocate
ftruncate = _DEFAULT.ftruncate
file_size = _DEFAULT.file_size
fsync_dir = _DEFAULT.fsync_dir
alloc_aligned = _DEFAULT.alloc_aligned
