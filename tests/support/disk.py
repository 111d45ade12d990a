"""Small real file systems for the tests: a size-limited tmpfs and an ext4 image on a
loop device, mounted on a directory and always unmounted (and the loop device detached)
at the end, even when the test fails. Where mounting is impossible (no root, no loop
device, no mkfs.ext4) the test is skipped with the reason."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

MIB = 1 << 20


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60)


class MountError(Exception):
    """A small file system could not be made or mounted here (the reason says why)."""


def _need(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            raise MountError(f"no {tool} command: cannot make a small file system")


def unmount(target: Path) -> None:
    """Unmount ``target``; lazily when something still holds it (a bookie process the
    test could not stop), so the teardown never leaves a mount behind."""
    if _run("umount", str(target)).returncode != 0:
        _run("umount", "-l", str(target))


def mount_tmpfs(target: Path, size: int, inodes: int | None = None) -> None:
    """Mount a tmpfs of ``size`` bytes (and ``inodes`` inodes: None, the kernel's
    default) on ``target`` (made if missing), or MountError."""
    _need("mount", "umount")
    target.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (f",nr_inodes={inodes}" if inodes is not None else "")
    done = _run("mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target))
    if done.returncode != 0:
        raise MountError(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")


def mount_loop_ext4(target: Path, size: int, image: Path, reserved_percent: int = 0) -> str:
    """Mount an ext4 file system of ``size`` bytes (by default no reserved blocks: root
    and the disk check see the same free space) kept in the file ``image``, through a
    loop device, on ``target``; returns the device, for :func:`detach`. On MountError
    nothing is left attached (the image file stays, for the caller to remove)."""
    _need("mount", "umount", "losetup", "mkfs.ext4")
    target.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(size)
    made = _run("mkfs.ext4", "-q", "-F", "-m", str(reserved_percent), str(image))
    if made.returncode != 0:
        raise MountError(f"mkfs.ext4 failed: {made.stderr.strip()}")
    attached = _run("losetup", "--find", "--show", str(image))
    if attached.returncode != 0:
        raise MountError(f"cannot attach a loop device here (needs root and /dev/loop*): {attached.stderr.strip()}")
    device = attached.stdout.strip()
    mounted = _run("mount", "-t", "ext4", device, str(target))
    if mounted.returncode != 0:
        detach(device)
        raise MountError(f"cannot mount an ext4 loop device here: {mounted.stderr.strip()}")
    return device


def detach(device: str) -> None:
    _run("losetup", "-d", device)


def release_mounts(root: Path) -> list[str]:
    """Unmount every file system mounted under ``root`` (deepest first) and detach every
    loop device whose image lies under it: what a run killed before its own teardown
    left behind. Returns what it released."""
    root = root.resolve()
    released = []
    with open("/proc/self/mounts") as f:
        points = [line.split()[1].replace("\\040", " ") for line in f]
    for point in sorted((p for p in points if Path(p).is_relative_to(root)), key=len, reverse=True):
        unmount(Path(point))
        released.append(point)
    listing = _run("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE") if shutil.which(
        "losetup") else None
    for line in (listing.stdout.splitlines() if listing is not None and listing.returncode == 0 else []):
        name, _, back = line.strip().partition(" ")
        if back.strip() and Path(back.strip().removesuffix(" (deleted)")).is_relative_to(root):
            detach(name)
            released.append(name)
    return released


@contextlib.contextmanager
def tmpfs(target: Path, size: int, inodes: int | None = None) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes (and ``inodes`` inodes) on ``target`` (made if
    missing); the test is skipped where none can be mounted."""
    try:
        mount_tmpfs(target, size, inodes)
    except MountError as exc:
        pytest.skip(str(exc))
    try:
        yield target
    finally:
        unmount(target)


@contextlib.contextmanager
def loop_ext4(target: Path, size: int, image: Path, reserved_percent: int = 0) -> Iterator[Path]:
    """An ext4 file system of ``size`` bytes in the file ``image`` on a loop device,
    mounted on ``target`` (:func:`mount_loop_ext4`); unmounted, detached and the image
    removed at the end. The test is skipped where none can be mounted."""
    try:
        try:
            device = mount_loop_ext4(target, size, image, reserved_percent)
        except MountError as exc:
            pytest.skip(str(exc))
        try:
            yield target
        finally:
            unmount(target)
            detach(device)
    finally:
        image.unlink(missing_ok=True)


def fill(directory: Path, leave: int, name: str = "filler") -> Path:
    """A file in ``directory`` that takes all of its file system's free space but
    ``leave`` bytes (another tenant of the disk); remove it to give the space back.
    With ``leave=0`` the disk is full to the last block: the file takes what it can, and
    more after each fsync (ext4 gives back the metadata blocks it reserved for delayed
    allocation once the data is written)."""
    path = directory / name
    with open(path, "wb", buffering=0) as f:
        _write(f, max(0, shutil.disk_usage(directory).free - leave), until_full=not leave)
        os.fsync(f.fileno())
        while not leave and _write(f, MIB, until_full=True):
            os.fsync(f.fileno())
    return path


def _write(f: BinaryIO, size: int, *, until_full: bool) -> int:
    """Append ``size`` bytes; how many. With ``until_full`` fewer when the disk fills:
    the writes halve down to 512 bytes, so the last free blocks of a page are taken too."""
    chunk = memoryview(b"\xa5" * MIB)
    step, done = MIB, 0
    while done < size:
        try:
            n = f.write(chunk[: min(step, size - done)])
        except OSError as exc:
            if exc.errno != errno.ENOSPC or not until_full:
                raise
            if step <= 512:
                break
            step //= 2
            continue
        done += n or 0
    return done


def usage(path: Path) -> float:
    """The fraction of ``path``'s file system in use (as the bookie's disk check sees it)."""
    from bookie.fs.real import disk_usage

    return disk_usage(str(path))
