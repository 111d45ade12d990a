"""RealFS on both bookie.native backends, and agreement with its twin MemFS.

``tmp_path`` is on ext4 (O_DIRECT honoured). /dev/shm is tmpfs: before Linux 6.6 it
refused O_DIRECT, since then it grants it, so that test checks RealFS against what the
running kernel says and the refusal itself is injected into the backend's open.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bookie import native
from bookie.fs import FileSystem, read_all, write_atomic
from bookie.fs.mem import MemFS
from bookie.fs.real import ALIGNMENT, RealFS
from walkit.errors import NativeIOError
from support.native import refuse_direct

PAGE = ALIGNMENT


@pytest.fixture(params=["native", "python"])
def rfs(request: pytest.FixtureRequest) -> RealFS:
    try:
        return RealFS(native.get_backend(request.param))
    except ImportError as exc:
        if native.MODE == "require":
            raise
        pytest.skip(str(exc))


@pytest.fixture
def shm_dir() -> Iterator[str]:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    path = tempfile.mkdtemp(prefix="walkit-test-", dir="/dev/shm")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def kernel_grants_o_direct(directory: str) -> bool:
    path = os.path.join(directory, ".probe")
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644))
        return True
    except OSError as exc:
        assert exc.errno == errno.EINVAL
        return False
    finally:
        if os.path.exists(path):
            os.remove(path)


def fs_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "bookie.fs" and r.levelno == logging.WARNING]



# --- O_DIRECT and its fallback ------------------------------------------------------
def test_direct_file_on_ext4(rfs: RealFS, tmp_path: Path) -> None:
    f = rfs.open(str(tmp_path / "j.txn"), create=True, direct=True)
    buf = rfs.alloc_buffer(2 * PAGE)
    try:
        assert f.direct
        buf.view[:11] = b"hello world"
        assert f.pwrite(buf.view, 0) == 2 * PAGE
        f.sync()
        assert f.size() == 2 * PAGE
        assert f.pread(5, 6) == b"world"  # unaligned read of a direct file
        assert f.pread(10, 2 * PAGE - 3) == bytes(3)
    finally:
        f.close()
        buf.close()


def test_unaligned_write_to_direct_file_is_einval(rfs: RealFS, tmp_path: Path) -> None:
    f = rfs.open(str(tmp_path / "j"), create=True, direct=True)
    buf = rfs.alloc_buffer(2 * PAGE)
    try:
        for data, offset in ((buf.view[:100], 0), (buf.view[:PAGE], 512)):
            with pytest.raises(NativeIOError) as info:
                f.pwrite(data, offset)
            assert info.value.errno == errno.EINVAL
        assert f.size() == 0
    finally:
        f.close()
        buf.close()


def test_dev_shm_follows_the_kernel(rfs: RealFS, shm_dir: str,
                                    caplog: pytest.LogCaptureFixture) -> None:
    granted = kernel_grants_o_direct(shm_dir)
    f = rfs.open(os.path.join(shm_dir, "a"), create=True, direct=True)
    try:
        assert f.direct is granted
        assert len(fs_warnings(caplog)) == (0 if granted else 1)
    finally:
        f.close()


def test_refused_direct_warns_once_per_directory(rfs: RealFS, shm_dir: str,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    refuse_direct(monkeypatch, rfs.backend)
    other = os.path.join(shm_dir, "other")
    rfs.makedirs(other)
    files = [rfs.open(os.path.join(d, name), create=True, direct=True)
             for d, name in ((shm_dir, "a"), (shm_dir, "b"), (other, "c"))]
    try:
        assert [f.direct for f in files] == [False, False, False]
        warnings = fs_warnings(caplog)
        assert len(warnings) == 2
        assert shm_dir in warnings[0] and "O_DIRECT" in warnings[0]
        assert "buffered" in warnings[0] and other in warnings[1]
        files[0].pwrite(b"not aligned", 3)  # a buffered file takes any write
        files[0].sync()
        assert files[0].pread(100, 0) == bytes(3) + b"not aligned"
        RealFS(rfs.backend).open(os.path.join(shm_dir, "d"), create=True, direct=True).close()
        assert len(fs_warnings(caplog)) == 3  # once per RealFS instance
    finally:
        for f in files:
            f.close()


# --- files --------------------------------------------------------------------------
def test_allocate_and_truncate(rfs: RealFS, tmp_path: Path) -> None:
    f = rfs.open(str(tmp_path / "e.log"), create=True)
    try:
        f.pwrite(b"abc", 0)
        f.allocate(0, 2 * PAGE)
        assert f.size() == 2 * PAGE
        assert f.pread(2 * PAGE, 0) == b"abc" + bytes(2 * PAGE - 3)
        f.truncate(2)
        assert f.size() == 2 and f.pread(10, 0) == b"ab"
    finally:
        f.close()


def test_closed_file_refuses_io(rfs: RealFS, tmp_path: Path) -> None:
    f = rfs.open(str(tmp_path / "x"), create=True, direct=True)
    f.close()
    f.close()  # idempotent
    for call in (lambda: f.pwrite(b"", 0), lambda: f.pread(1, 0), f.sync, f.size):
        with pytest.raises(ValueError):
            call()


def test_alloc_buffer_is_aligned(rfs: RealFS) -> None:
    buf = rfs.alloc_buffer(3 * PAGE)
    try:
        assert len(buf) == 3 * PAGE
        assert ctypes.addressof(ctypes.c_char.from_buffer(buf.view)) % PAGE == 0
    finally:
        buf.close()


# --- names --------------------------------------------------------------------------
def test_names(rfs: RealFS, tmp_path: Path) -> None:
    d = str(tmp_path / "a" / "b")
    rfs.makedirs(d)
    rfs.makedirs(d)  # idempotent
    rfs.open(f"{d}/2.log", create=True).close()
    rfs.open(f"{d}/1.log", create=True).close()
    assert rfs.listdir(d) == ["1.log", "2.log"]
    rfs.rename(f"{d}/1.log", f"{d}/2.log")  # replaces
    assert rfs.listdir(d) == ["2.log"] and not rfs.exists(f"{d}/1.log")
    rfs.remove(f"{d}/2.log")
    rfs.fsync_dir(d)
    assert rfs.listdir(d) == [] and rfs.exists(d)
    assert rfs.listdir(str(tmp_path / "a")) == ["b"]


@pytest.mark.parametrize("op", ["open", "remove", "rename", "listdir", "fsync_dir"])
def test_missing_names_are_enoent(rfs: RealFS, tmp_path: Path, op: str) -> None:
    missing = str(tmp_path / "nope")
    calls: dict[str, Callable[[], object]] = {
        "open": lambda: rfs.open(missing), "remove": lambda: rfs.remove(missing),
        "rename": lambda: rfs.rename(missing, missing + "2"),
        "listdir": lambda: rfs.listdir(missing), "fsync_dir": lambda: rfs.fsync_dir(missing),
    }
    with pytest.raises(NativeIOError) as info:
        calls[op]()
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOENT
    assert missing in str(info.value)


def test_disk_usage(rfs: RealFS, tmp_path: Path) -> None:
    """BookKeeper's (total - usable) / total, blocks reserved for root counted as used
    (tests/crash/test_disk_faults.py shows it on real small file systems)."""
    usage = rfs.disk_usage(str(tmp_path))
    total, _used, free = shutil.disk_usage(tmp_path)
    assert 0.0 < usage < 1.0
    assert usage >= 1 - free / total - 0.01


# --- the twin agrees ----------------------------------------------------------------
def scenario(fs: FileSystem, root: str) -> list[object]:
    """A small workload; returns what it observed, which must not depend on ``fs``."""
    seen: list[object] = []
    d = f"{root}/ledgers"
    fs.makedirs(d)
    f = fs.open(f"{d}/0000000000000001.log", create=True, direct=True)
    buf = fs.alloc_buffer(PAGE)
    buf.view[:5] = b"entry"
    f.pwrite(buf.view, 0)
    f.sync()
    f.allocate(0, 3 * PAGE)
    seen += [f.size(), f.pread(8, 2), f.pread(4, 3 * PAGE - 2)]
    buf.view[:4] = b"more"
    seen.append(f.pwritev_sync([buf.view, buf.view], PAGE))
    seen += [f.size(), f.pread(6, PAGE - 2)]
    with pytest.raises(OSError) as info:  # unaligned on a direct file
        f.pwritev_sync([buf.view[:100]], 0)
    seen.append(info.value.errno)
    f.truncate(PAGE)
    seen.append(f.size())
    f.close()
    buf.close()
    write_atomic(fs, f"{d}/cookie", b"v1")
    write_atomic(fs, f"{d}/cookie", b"v2")
    fs.rename(f"{d}/0000000000000001.log", f"{d}/0000000000000002.log")
    fs.fsync_dir(d)
    seen += [fs.listdir(d), read_all(fs, f"{d}/cookie"), fs.exists(f"{d}/cookie.tmp")]
    fs.remove(f"{d}/cookie")
    seen += [fs.listdir(d), fs.exists(f"{d}/cookie"), fs.exists(d)]
    for bad in (lambda: fs.open(f"{d}/cookie"), lambda: fs.remove(f"{d}/cookie"),
                lambda: fs.open(f"{root}/no/dir", create=True)):
        with pytest.raises(OSError) as info:
            bad()
        seen.append(info.value.errno)
    return seen


def test_memfs_and_realfs_agree(rfs: RealFS, tmp_path: Path) -> None:
    mem = scenario(MemFS(), "/data")
    assert mem[-3:] == [errno.ENOENT] * 3
    assert scenario(rfs, str(tmp_path)) == mem


# --- pwritev_sync on the crashable twin ---------------------------------------------
def test_memfs_pwritev_sync_is_a_write_then_a_sync() -> None:
    """Two operations, as the calls in a row: the fault hooks and the crash points apply
    to each step, and a crash between them can still tear the unsynced write."""
    import random

    fs = MemFS()
    fs.makedirs("/d")
    f = fs.open("/d/j", create=True)
    assert f.pwritev_sync([memoryview(b"a" * 1024)], 0) == 1024
    fs.crash(None)  # drops everything unsynced: nothing was
    f = fs.open("/d/j", create=True)
    fs.fsync_dir("/d")
    assert f.pwritev_sync([memoryview(b"a" * 1024)], 0) == 1024
    fs.crash(None)
    assert read_all(fs, "/d/j") == b"a" * 1024

    f = fs.open("/d/j")
    ops = fs.mutating_ops
    f.pwritev_sync([memoryview(b"b" * 512), memoryview(b"c" * 1024)], 1024)
    assert fs.mutating_ops == ops + 2

    fs.fail_next_write()
    with pytest.raises(OSError):
        f.pwritev_sync([memoryview(b"x" * 512)], 2560)
    assert f.size() == 2560  # the write failed; nothing was written nor synced
    fs.fail_next_sync()
    with pytest.raises(OSError):
        f.pwritev_sync([memoryview(b"y" * 512)], 2560)
    assert f.size() == 3072  # written, not synced

    fs.arm_crash(after_ops=2)  # the write goes through, the sync dies
    with pytest.raises(OSError):
        f.pwritev_sync([memoryview(b"z" * 2048)], 3072)
    assert fs.dead
    torn = set()
    for seed in range(40):  # unsynced sectors are kept or lost sector by sector
        g = MemFS()
        g.makedirs("/d")
        h = g.open("/d/j", create=True)
        g.fsync_dir("/d")
        h.pwritev_sync([memoryview(b"s" * 512)], 0)
        g.arm_crash(after_ops=2)
        with pytest.raises(OSError):
            h.pwritev_sync([memoryview(b"t" * 2048)], 512)
        g.crash(random.Random(seed))
        torn.add(read_all(g, "/d/j"))
    assert b"s" * 512 in torn and b"s" * 512 + b"t" * 2048 in torn
    assert any(len(t) == 2560 and t.count(b"t") < 2048 for t in torn), "some crash tears the write"


# --- syncfs ----------------------------------------------------------------------------
def test_a_syncer_where_the_backend_has_syncfs(rfs: RealFS, tmp_path: Path) -> None:
    """The shim's backend gives a syncer on Linux 5.8 or later (its syncfs reports
    writeback errors); the pure-Python one never does. A closed syncer refuses to sync."""
    syncer = rfs.open_syncer(str(tmp_path))
    if not rfs.backend.has_syncfs:
        assert syncer is None and (rfs.backend.name == "python" or not native._kernel_at_least(5, 17))
        return
    assert syncer is not None
    f = rfs.open(str(tmp_path / "f"), create=True)
    f.pwrite(b"x" * 100, 0)
    syncer.sync()
    f.close()
    syncer.close()
    with pytest.raises(NativeIOError) as caught:
        syncer.sync()
    assert caught.value.errno == errno.EBADF and caught.value.context["op"] == "syncfs"
    syncer.close()  # twice: nothing


def test_python_backend_has_no_syncfs() -> None:
    backend = native.get_backend("python")
    assert not backend.has_syncfs
    with pytest.raises(NativeIOError) as caught:
        backend.syncfs(0)
    assert caught.value.errno == errno.ENOSYS


@pytest.mark.parametrize(("sysname", "release", "expected"), [
    ("Linux", "5.16.20", False), ("Linux", "5.17.0", True), ("Linux", "6.18.44-fc-v657", True),
    ("Linux", "4.19.0-26-amd64", False), ("Linux", "weird", False), ("Darwin", "23.1.0", False),
])
def test_kernel_version_for_syncfs(monkeypatch: pytest.MonkeyPatch, sysname: str, release: str,
                                   expected: bool) -> None:
    uname = os.uname_result((sysname, "host", release, "#1", "x86_64"))
    monkeypatch.setattr(native.os, "uname", lambda: uname)
    assert native._kernel_at_least(5, 17) is expected


def test_no_syncer_on_file_systems_whose_syncfs_is_not_trusted(tmp_path: Path) -> None:
    """The file system type comes from the mount table (the longest mount point that
    holds the path; of two on one point the later); syncers only on the listed types,
    and none from a shim built before syncfs was in it."""
    from bookie.fs import real

    table = tmp_path / "mountinfo"
    table.write_text(
        "22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        "30 22 0:26 / /mnt/fuse rw - fuse.sshfs host:/x rw\n"
        "31 22 0:27 / /mnt/my\\040disk rw - xfs /dev/vdb rw\n"
        "32 22 0:28 / /mnt/nfs rw - nfs4 host:/e rw\n"
        "33 32 0:29 / /mnt/nfs rw - tmpfs tmpfs rw\n")
    assert real.file_system_type("/var/lib/x", str(table)) == "ext4"
    assert real.file_system_type("/mnt/fuse/a/b", str(table)) == "fuse.sshfs"
    assert real.file_system_type("/mnt/my disk/ledgers", str(table)) == "xfs"
    assert real.file_system_type("/mnt/nfs", str(table)) == "tmpfs"  # mounted over the nfs one
    assert real.file_system_type("/mnt/fusex", str(table)) == "ext4"
    assert real.file_system_type("/x", str(tmp_path / "none")) is None
    assert "fuse.sshfs" not in real.SYNCFS_TYPES and "nfs4" not in real.SYNCFS_TYPES
    try:
        backend = native.get_backend("native")
    except ImportError:
        pytest.skip("no C shim")

    class OldShim:  # an extension built before wk_syncfs
        def __getattr__(self, name: str) -> Any:
            if name == "wk_syncfs":
                raise AttributeError(name)
            return getattr(backend._lib, name)  # type: ignore[attr-defined]

    old = type(backend)(backend._ffi, OldShim())  # type: ignore[attr-defined]
    assert not old.has_syncfs and RealFS(old).open_syncer(str(tmp_path)) is None


def test_memfs_syncer_makes_everything_durable() -> None:
    """MemFS's syncer is syncfs: every file's bytes and every name survive a power cut;
    a failed one forgets the dirty sectors (as Linux does) and raises."""
    fs = MemFS()
    fs.makedirs("/a/b")
    f, g = fs.open("/a/f", create=True), fs.open("/a/b/g", create=True)
    f.pwrite(b"f" * 1000, 0)
    g.pwrite(b"g" * 10, 0)
    fs.rename("/a/b/g", "/a/b/h")
    syncer = fs.open_syncer("/a")
    assert syncer is not None
    syncer.sync()
    f.pwrite(b"late", 0)  # after the sync: may go
    fs.fail_next_sync()
    with pytest.raises(OSError):
        syncer.sync()
    fs.crash(random.Random(3))
    assert read_all(fs, "/a/f") == b"f" * 1000 and read_all(fs, "/a/b/h") == b"g" * 10
    assert not fs.exists("/a/b/g")
    assert MemFS(syncfs=False).open_syncer("/") is None
    with pytest.raises(FileNotFoundError):
        fs.open_syncer("/nowhere")


def test_faulty_syncer_fails_for_any_armed_directory_of_its_tree() -> None:
    """FaultyFS fails a syncer's sync when a directory above, at or under its own is
    armed (syncfs reports any file's failed writeback); a directory beside it is not."""
    from bookie.fs.faulty import FaultyFS

    for armed, fails in (("/r/d/sub", True), ("/r/d", True), ("/r", True), ("/r/other", False)):
        fs = FaultyFS(MemFS())
        fs.makedirs("/r/d/sub")
        syncer = fs.open_syncer("/r/d")
        assert syncer is not None
        fs.fail_syncs(armed, 1)
        if fails:
            with pytest.raises(NativeIOError):
                syncer.sync()
        else:
            syncer.sync()
        assert fs.failed == fails
