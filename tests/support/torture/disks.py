"""Real small disks for the torture runs' ``disk-full`` fault (processes kind).

Theory of operation
-------------------
A bookie that a plan will fill gets its two directories on file systems of their own
before the cluster starts: its journal on an ext4 image on a loop device (O_DIRECT
works there, as on the machine's disk), its ledger directory on a size-limited tmpfs
(buffered I/O: the bookie's fallback). ``bookie-N/journal`` and ``bookie-N/ledgers``
are symlinks into the mounts, so the bookie sees ordinary directories, and the mounts
have room beside them for another tenant's file.

``fill(N, how)`` makes that tenant take every free byte of the journal's disk, the
ledgers' disk or both: the bookie meets ENOSPC on its next reservation or write (or its
disk check sees the disk full) and must turn read-only, lose nothing and serve reads;
``free(N)`` deletes the tenant's files and the bookie must come back writable by itself.
:meth:`SmallDisks.release` unmounts everything; a run killed before it gets there is
cleaned by its parent (``support.disk.release_mounts`` on the run's directory).

The sizes are far more than a bookie writes in a torture run (journals roll at
``JOURNAL_MB`` and are deleted behind each checkpoint; GC deletes dead entry logs), so
the disks fill only when the plan says so.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from support.disk import MIB, MountError, detach, fill, mount_loop_ext4, mount_tmpfs, unmount, usage

JOURNAL_DISK = 256 * MIB
LEDGER_DISK = 256 * MIB
JOURNAL_MB = 16  # journalMaxSizeMB of torture bookies, so that the journal disk is never filled by journals
TENANT = "tenant"  # the other tenant's file at the root of each small disk


class SmallDisks:
    """The small disks of bookies ``victims`` of the cluster in ``cluster_dir``, mounted
    under ``root``."""

    def __init__(self, root: Path, cluster_dir: Path, victims: set[int]) -> None:
        self._root, self._cluster_dir = root, cluster_dir
        self._mounts: dict[int, dict[str, Path]] = {}  # bookies on small disks: their mounts
        self._mounted: list[Path] = []
        self._devices: list[str] = []
        self.unavailable = ""  # why no small disk could be mounted ("" when they were)
        for i in sorted(victims):
            try:
                self._prepare(i)
            except MountError as exc:
                self.unavailable = str(exc)
                break

    def _prepare(self, i: int) -> None:
        journal, ledgers = self._root / f"bookie-{i}-journal", self._root / f"bookie-{i}-ledgers"
        self._devices.append(mount_loop_ext4(journal, JOURNAL_DISK, self._root / f"bookie-{i}-journal.img"))
        self._mounted.append(journal)
        mount_tmpfs(ledgers, LEDGER_DISK)
        self._mounted.append(ledgers)
        bookie = self._cluster_dir / f"bookie-{i}"
        bookie.mkdir(parents=True, exist_ok=True)
        mounts = {"journal": journal, "ledgers": ledgers}
        for name, mount in mounts.items():
            (mount / name).mkdir()
            (bookie / name).symlink_to(mount / name)
        self._mounts[i] = mounts

    def fill(self, i: int, how: str) -> str:
        """Another tenant takes every free byte of bookie ``i``'s journal disk, ledger
        disk or both (``how``)."""
        if i not in self._mounts:
            return f"left alone: no small disk ({self.unavailable or 'not planned'})"
        names = ("journal", "ledgers") if how == "both" else (how,)
        done = []
        for name in names:
            mount = self._mounts[i][name]
            try:
                size = fill(mount, 0, TENANT).stat().st_size
            except OSError as exc:  # the disk filled under the tenant's own write: it is full
                size = (mount / TENANT).stat().st_size if (mount / TENANT).exists() else 0
                done.append(f"{name} disk filled ({exc.strerror})")
                continue
            done.append(f"{name} disk filled ({size / MIB:.0f} MiB taken, {usage(mount):.0%} used)")
        return ", ".join(done)

    def free(self, i: int) -> str:
        """The tenant's files on bookie ``i``'s disks are deleted."""
        if i not in self._mounts:
            return "nothing to do"
        freed = 0
        for mount in self._mounts[i].values():
            tenant = mount / TENANT
            if tenant.exists():
                freed += tenant.stat().st_size
                tenant.unlink()
        return f"{freed / MIB:.0f} MiB given back"

    def free_all(self) -> list[str]:
        return [f"bookie {i}: {self.free(i)}" for i in self._mounts if any(
            (m / TENANT).exists() for m in self._mounts[i].values())]

    def release(self) -> None:
        """Unmount every small disk and detach its loop device (the cluster has stopped)."""
        for mount in self._mounted:
            unmount(mount)
        for device in self._devices:
            detach(device)
        for image in self._root.glob("*.img"):
            with contextlib.suppress(OSError):
                os.unlink(image)
        self._mounts.clear()
        self._mounted.clear()
        self._devices.clear()
