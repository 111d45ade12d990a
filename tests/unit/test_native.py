"""bookie.native on both backends: the same cases against the C shim and pure Python.

The ``native`` case is skipped only when the extension is not built (or
``WALKIT_NATIVE=off``); under ``WALKIT_NATIVE=require`` a missing shim fails instead.
``tmp_path`` is on ext4 here, which honours O_DIRECT and enforces its alignment.
"""

from __future__ import annotations

import array
import ctypes
import errno
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bookie import native
from walkit.errors import ConfigError, NativeIOError
from support.native import refuse_direct

PAGE = 4096


@pytest.fixture(params=["native", "python"])
def backend(request: pytest.FixtureRequest) -> native.Backend:
    try:
        return native.get_backend(request.param)
    except ImportError as exc:
        if native.MODE == "require":
            raise
        pytest.skip(str(exc))


@pytest.fixture
def direct_fd(backend: native.Backend, tmp_path: Path) -> Iterator[int]:
    fd, granted = backend.open_file(str(tmp_path / "direct.bin"), create=True, direct=True)
    assert granted, "tmp_path is expected to be on a file system with O_DIRECT (ext4)"
    yield fd
    backend.close(fd)


def address(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def pattern(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(n))


# --- choosing a backend -----------------------------------------------------------
def test_default_backend_follows_env() -> None:
    built = importlib.util.find_spec("bookie._native") is not None
    expected = {"off": "python", "require": "native"}.get(
        native.MODE, "native" if built else "python")
    assert native.BACKEND == expected == native.default_backend().name
    assert native.HAS_NATIVE is (expected == "native")


def test_select_backend_when_shim_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise ImportError("simulated: no bookie._native")

    monkeypatch.setattr(native, "MODE", "auto")
    monkeypatch.setattr(native, "_import_shim", missing)
    with pytest.raises(ImportError, match="not built"):
        native.select_backend("require")
    assert native.select_backend("auto").name == "python"
    assert native.select_backend("off").name == "python"
    with pytest.raises(ConfigError):
        native.select_backend("sometimes")


def test_off_never_loads_the_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "MODE", "off")
    with pytest.raises(ImportError, match="disabled"):
        native.get_backend("native")


# --- O_DIRECT -----------------------------------------------------------------------
def test_direct_write_sync_read_back(backend: native.Backend, direct_fd: int,
                                     tmp_path: Path) -> None:
    buf = backend.alloc_aligned(2 * PAGE)
    buf.view[:] = pattern(2 * PAGE)
    assert backend.pwrite(direct_fd, buf.view, PAGE) == 2 * PAGE
    backend.fdatasync(direct_fd)
    back = backend.alloc_aligned(3 * PAGE)
    assert backend.pread_into(direct_fd, back.view, 0) == 3 * PAGE
    assert bytes(back.view) == bytes(PAGE) + pattern(2 * PAGE)
    assert (tmp_path / "direct.bin").read_bytes()[PAGE:] == pattern(2 * PAGE)


def test_unaligned_direct_write_is_einval(backend: native.Backend, direct_fd: int) -> None:
    with pytest.raises(NativeIOError) as info:
        backend.pwrite(direct_fd, b"x" * 100, 0)
    assert info.value.errno == errno.EINVAL
    assert "offset=0" in str(info.value) and "length=100" in str(info.value)


def test_refused_direct_falls_back_to_buffered(backend: native.Backend, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_direct(monkeypatch, backend)
    fd, granted = backend.open_file(str(tmp_path / "f"), create=True, direct=True)
    try:
        assert not granted
        assert backend.pwrite(fd, b"buffered is fine", 3) == 16
    finally:
        backend.close(fd)


# --- writes and reads ---------------------------------------------------------------
def test_pwrite_from_slice_of_aligned_buffer(backend: native.Backend, direct_fd: int) -> None:
    buf = backend.alloc_aligned(3 * PAGE)
    buf.view[:] = pattern(3 * PAGE, seed=5)
    backend.pwrite(direct_fd, buf.view[PAGE : 2 * PAGE], 0)
    backend.fdatasync(direct_fd)
    back = backend.alloc_aligned(PAGE)
    backend.pread_into(direct_fd, back.view, 0)
    assert bytes(back.view) == bytes(buf.view[PAGE : 2 * PAGE])


@pytest.mark.parametrize("data", [b"bytes", bytearray(b"bytearray"),
                                  memoryview(b"..memoryview..")[2:-2],
                                  memoryview(array.array("I", [1, 2, 3]))])
def test_pwrite_accepts_any_buffer(backend: native.Backend, tmp_path: Path,
                                   data: native.BufferLike) -> None:
    fd, _ = backend.open_file(str(tmp_path / "f"), create=True)
    try:
        expected = bytes(memoryview(data).cast("B"))
        assert backend.pwrite(fd, data, 10) == len(expected)
        assert backend.pread(fd, 100, 10) == expected
        assert backend.pread(fd, 5, 0) == bytes(5)  # the hole before is zeros
    finally:
        backend.close(fd)


def test_pwritev_many_buffers(backend: native.Backend, tmp_path: Path) -> None:
    parts = [pattern(i % 13, seed=i) for i in range(1500)]  # > IOV_MAX, some empty
    fd, _ = backend.open_file(str(tmp_path / "v"), create=True)
    try:
        total = backend.pwritev(fd, parts, 7)
        assert total == sum(map(len, parts))
        assert backend.pread(fd, total, 7) == b"".join(parts)
        assert backend.pwritev(fd, [], 0) == 0
    finally:
        backend.close(fd)


@pytest.mark.parametrize("datasync", [True, False])
def test_pwritev_sync_writes_then_syncs(backend: native.Backend, tmp_path: Path,
                                        datasync: bool) -> None:
    parts = [pattern(i % 13, seed=i) for i in range(1500)]  # > IOV_MAX, some empty
    fd, _ = backend.open_file(str(tmp_path / "vs"), create=True)
    try:
        total = backend.pwritev_sync(fd, parts, 3, datasync)
        assert total == sum(map(len, parts))
        assert backend.pread(fd, total, 3) == b"".join(parts)
        assert backend.pwritev_sync(fd, [], 0) == 0
    finally:
        backend.close(fd)


def test_pwritev_sync_direct_aligned(backend: native.Backend, direct_fd: int) -> None:
    buf = backend.alloc_aligned(3 * PAGE)
    try:
        buf.view[:] = pattern(3 * PAGE)
        views = [buf.view[:PAGE], buf.view[PAGE:]]
        assert backend.pwritev_sync(direct_fd, views, PAGE) == 3 * PAGE
        back = backend.alloc_aligned(3 * PAGE)
        assert backend.pread_into(direct_fd, back.view, PAGE) == 3 * PAGE
        assert bytes(back.view) == pattern(3 * PAGE)
        with pytest.raises(NativeIOError) as info:  # unaligned: the write fails, no sync
            backend.pwritev_sync(direct_fd, [buf.view[:100]], 0)
        assert info.value.errno == errno.EINVAL and "op=pwritev" in str(info.value)
    finally:
        buf.close()


def test_pwritev_sync_names_the_failed_step(backend: native.Backend, tmp_path: Path) -> None:
    """A write that fails says pwritev; a sync that fails says fdatasync (or fsync)."""
    path = str(tmp_path / "ro")
    backend.close(backend.open_file(path, create=True)[0])
    fd, _ = backend.open_file(path, readonly=True)
    try:
        with pytest.raises(NativeIOError) as info:
            backend.pwritev_sync(fd, [b"x"], 4)
        assert info.value.errno == errno.EBADF
        assert "op=pwritev" in str(info.value) and f"path={path}" in str(info.value)
        # syncing a read-only descriptor is allowed, so an empty write then a sync works
        assert backend.pwritev_sync(fd, [], 0) == 0
    finally:
        backend.close(fd)
    r, w = os.pipe()  # a pipe: pwritev is ESPIPE; fdatasync of a pipe would be EINVAL
    try:
        with pytest.raises(NativeIOError) as info:
            backend.pwritev_sync(w, [b"x"], 0)
        assert info.value.errno == errno.ESPIPE and "op=pwritev" in str(info.value)
    finally:
        os.close(r)
        os.close(w)


def test_pwritev_sync_failed_sync_keeps_errno(backend: native.Backend) -> None:
    """/dev/null takes any write; fdatasync/fsync of it is EINVAL - reported as the sync."""
    fd = os.open("/dev/null", os.O_WRONLY | os.O_CLOEXEC)
    try:
        for datasync, op in ((True, "fdatasync"), (False, "fsync")):
            with pytest.raises(NativeIOError) as info:
                backend.pwritev_sync(fd, [b"abc"], 0, datasync)
            assert info.value.errno == errno.EINVAL, info.value
            assert f"op={op}" in str(info.value)
    finally:
        os.close(fd)


def test_pread_is_short_only_at_eof(backend: native.Backend, tmp_path: Path) -> None:
    fd, _ = backend.open_file(str(tmp_path / "s"), create=True)
    try:
        backend.pwrite(fd, b"0123456789", 0)
        assert backend.pread(fd, 4, 3) == b"3456"
        assert backend.pread(fd, 100, 8) == b"89"
        assert backend.pread(fd, 100, 50) == b""
    finally:
        backend.close(fd)


# --- size: fallocate and ftruncate --------------------------------------------------
def test_fallocate_grows_with_zeros(backend: native.Backend, tmp_path: Path) -> None:
    fd, _ = backend.open_file(str(tmp_path / "a"), create=True)
    try:
        backend.pwrite(fd, b"keep", 0)
        backend.fallocate(fd, 0, 3 * PAGE)
        assert backend.file_size(fd) == 3 * PAGE
        assert backend.pread(fd, 3 * PAGE, 0) == b"keep" + bytes(3 * PAGE - 4)
        backend.fallocate(fd, 0, PAGE)  # never shrinks
        assert backend.file_size(fd) == 3 * PAGE
    finally:
        backend.close(fd)


def test_ftruncate(backend: native.Backend, tmp_path: Path) -> None:
    fd, _ = backend.open_file(str(tmp_path / "t"), create=True)
    try:
        backend.pwrite(fd, b"abcdef", 0)
        backend.ftruncate(fd, 2)
        assert backend.pread(fd, 10, 0) == b"ab"
        backend.ftruncate(fd, 4)
        assert backend.pread(fd, 10, 0) == b"ab\0\0"
    finally:
        backend.close(fd)


# --- directories --------------------------------------------------------------------
def test_fsync_dir(backend: native.Backend, tmp_path: Path) -> None:
    (tmp_path / "new").write_bytes(b"x")
    backend.fsync_dir(str(tmp_path))
    with pytest.raises(NativeIOError) as info:
        backend.fsync_dir(str(tmp_path / "new"))
    assert info.value.errno == errno.ENOTDIR


# --- errors -------------------------------------------------------------------------
def test_open_missing_is_enoent(backend: native.Backend, tmp_path: Path) -> None:
    path = str(tmp_path / "missing")
    with pytest.raises(OSError) as info:
        backend.open_file(path)
    err = info.value
    assert isinstance(err, NativeIOError)
    assert err.errno == errno.ENOENT and err.filename == path
    assert f"path={path}" in str(err) and "op=open" in str(err)
    assert not os.path.exists(path)


def test_errors_on_a_closed_fd_keep_errno(backend: native.Backend, tmp_path: Path) -> None:
    path = str(tmp_path / "c")
    fd, _ = backend.open_file(path, create=True)
    backend.close(fd)
    for call in (lambda: backend.pwrite(fd, b"x", 0), lambda: backend.fdatasync(fd),
                 lambda: backend.pwritev_sync(fd, [b"x"], 0),
                 lambda: backend.pread(fd, 1, 0), lambda: backend.fallocate(fd, 0, 1),
                 lambda: backend.ftruncate(fd, 0), lambda: backend.file_size(fd),
                 lambda: backend.close(fd)):
        with pytest.raises(NativeIOError) as info:
            call()
        assert info.value.errno == errno.EBADF
        assert f"fd={fd}" in str(info.value)


def test_error_names_the_path_of_its_fd(backend: native.Backend, tmp_path: Path) -> None:
    path = str(tmp_path / "ro")
    backend.close(backend.open_file(path, create=True)[0])
    fd, _ = backend.open_file(path, readonly=True)
    try:
        with pytest.raises(NativeIOError) as info:
            backend.pwrite(fd, b"x", 4)
        assert info.value.errno == errno.EBADF
        assert f"path={path}" in str(info.value) and "offset=4" in str(info.value)
    finally:
        backend.close(fd)


# --- aligned buffers ----------------------------------------------------------------
@pytest.mark.parametrize("size", [1, PAGE, 3 * PAGE + 5])
def test_aligned_buffer(backend: native.Backend, size: int) -> None:
    buf = backend.alloc_aligned(size)
    assert len(buf) == size == len(buf.view)
    assert buf.view.format == "B" and not buf.view.readonly
    assert address(buf.view) % PAGE == 0
    assert bytes(buf.view) == bytes(size)
    buf.close()
    with pytest.raises(ValueError):
        buf.view[0]


def test_slice_outlives_close(backend: native.Backend) -> None:
    buf = backend.alloc_aligned(PAGE)
    buf.view[:3] = b"abc"
    head = buf.view[:3]
    buf.close()
    assert bytes(head) == b"abc"  # memory stays until the last view is gone


# --- the journal's vector write on a direct file (bookie.fs.real) ----------------------
def test_direct_vector_write_refuses_any_unaligned_buffer_before_writing(backend: native.Backend,
                                                                        tmp_path: Path) -> None:
    """RealFile checks a whole vector for O_DIRECT (each buffer's start and length, a
    memoryview by its bytes, anything else by its length) in one loop before writing
    it: an unaligned buffer anywhere refuses the write (EINVAL, nothing written), an
    aligned vector is written and synced. A closed file refuses as before."""
    from bookie.fs.real import RealFS

    fs = RealFS(backend)
    f = fs.open(str(tmp_path / "j.bin"), create=True, direct=True)
    assert f.direct, "tmp_path is expected to be on a file system with O_DIRECT (ext4)"
    page = fs.alloc_buffer(2 * PAGE)
    page.view[:] = pattern(2 * PAGE)
    zeros = fs.alloc_buffer(PAGE)
    words = zeros.view.cast("I")  # PAGE bytes, PAGE // 4 items: counted by its bytes
    for vector, offset in (([page.view[:PAGE], page.view[:100]], 0),  # a short last buffer
                           ([page.view[:100], page.view[:PAGE]], 0),  # the next starts unaligned
                           ([page.view[:PAGE]], 100),  # an unaligned offset
                           ([page.view[:PAGE], bytes(PAGE - 1)], 0)):  # bytes, by its length
        with pytest.raises(NativeIOError) as info:
            f.pwritev_sync(vector, offset)
        assert info.value.errno == errno.EINVAL and "unaligned O_DIRECT write" in str(info.value)
    assert f.size() == 0  # refused before anything was written
    assert f.pwritev_sync([page.view[:PAGE], words, page.view[PAGE:]], PAGE) == 3 * PAGE
    assert (tmp_path / "j.bin").read_bytes() == bytes(PAGE) + pattern(2 * PAGE)[:PAGE] + bytes(PAGE) + \
        pattern(2 * PAGE)[PAGE:]
    f.close()
    with pytest.raises(ValueError, match="closed"):
        f.pwritev_sync([page.view[:PAGE]], 0)
    words.release()
    page.close()
    zeros.close()
