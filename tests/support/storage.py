"""The storage tests' places and file systems: ``env`` runs a test on MemFS and on the real
file system (``Env`` makes and tracks the LedgerStorages it opens), ``preads`` counts the
reads of MemFS files, and ``TearingFS`` is a MemFS whose power cuts also tear the index
header sectors being written (the crash models of tests/crash/test_storage.py and
tests/crash/test_gc_crash.py)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from bookie.fs import File, FileSystem, Syncer
from bookie.fs.mem import MemFS, _MemFile
from bookie.storage._format import INDEX_HEADER_SIZE
from bookie.storage import LedgerStorage
from walkit.errors import StorageError


@dataclass
class Env:
    fs: FileSystem
    root: str
    ndirs: int = 2
    opened: list[LedgerStorage] = field(default_factory=list)

    @property
    def dirs(self) -> list[str]:
        return [f"{self.root}/ledgers{i}" for i in range(self.ndirs)]

    def storage(self, **kw: int) -> LedgerStorage:
        s = LedgerStorage(self.fs, self.dirs, **kw)
        s.open()
        self.opened.append(s)
        return s

    def index_path(self, ledger: int) -> str:
        return f"{self.dirs[ledger % self.ndirs]}/current/index/{ledger & 0xff:02x}/{ledger:016x}.idx"

    def log_path(self, log_id: int, d: int = 0) -> str:
        return f"{self.dirs[d]}/current/logs/{log_id:016x}.log"

    def logs(self, d: int = 0) -> list[str]:
        logs = f"{self.dirs[d]}/current/logs"
        return [f"{logs}/{n}" for n in self.fs.listdir(logs) if n.endswith(".log")]


def _real_fs() -> FileSystem:
    real = pytest.importorskip("bookie.fs.real")
    fs: FileSystem = real.RealFS()
    return fs


@pytest.fixture(params=["mem", "real"])
def env(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[Env]:
    e = Env(MemFS(), "/b") if request.param == "mem" else Env(_real_fs(), str(tmp_path))
    yield e
    for s in e.opened:
        try:
            s.close()
        except (OSError, StorageError):
            pass


@pytest.fixture
def preads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """``(path, size)`` of every pread of a MemFS file from now on."""
    calls: list[tuple[str, int]] = []
    original = _MemFile.pread

    def counting(self: _MemFile, size: int, offset: int) -> bytes:
        calls.append((self.path, size))
        return original(self, size, offset)

    monkeypatch.setattr(_MemFile, "pread", counting)
    return calls


def patch(fs: FileSystem, path: str, offset: int, data: bytes) -> None:
    f = fs.open(path)
    try:
        f.pwrite(data, offset)
        f.sync()
    finally:
        f.close()


class _RecordingFile:
    """A MemFS file that reports header writes of index files to its TearingFS."""

    def __init__(self, fs: TearingFS, inner: File) -> None:
        self._fs, self._inner = fs, inner
        self.path, self.direct = inner.path, inner.direct

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> int:
        if self.path.endswith(".idx") and offset < INDEX_HEADER_SIZE:
            self._fs.unsynced_headers.add((self.path, offset - offset % 512))
        return self._inner.pwrite(data, offset)

    def sync(self) -> None:
        self._inner.sync()
        self._fs.unsynced_headers = {u for u in self._fs.unsynced_headers if u[0] != self.path}

    def pread(self, size: int, offset: int) -> bytes:
        return self._inner.pread(size, offset)

    def truncate(self, size: int) -> None:
        self._inner.truncate(size)

    def allocate(self, offset: int, length: int) -> None:
        self._inner.allocate(offset, length)

    def size(self) -> int:
        return self._inner.size()

    def close(self) -> None:
        self._inner.close()


class _RecordingSyncer:
    """A MemFS syncer that tells its TearingFS that every header is synced."""

    def __init__(self, fs: TearingFS, inner: Syncer) -> None:
        self._fs, self._inner = fs, inner

    def sync(self) -> None:
        self._inner.sync()
        self._fs.unsynced_headers = set()

    def close(self) -> None:
        self._inner.close()


class TearingFS(MemFS):
    """MemFS whose power cuts also tear index header sectors that were being written
    (MemFS never tears inside a sector; real disks may leave one unreadable)."""

    def __init__(self, *, syncfs: bool = True) -> None:
        super().__init__(syncfs=syncfs)
        self.unsynced_headers: set[tuple[str, int]] = set()

    def open(  # type: ignore[override]  # wraps MemFS's files
        self, path: str, *, create: bool = False, direct: bool = False
    ) -> File:
        return _RecordingFile(self, super().open(path, create=create, direct=direct))

    def open_syncer(self, path: str) -> Syncer | None:  # type: ignore[override]  # wraps MemFS's
        inner = super().open_syncer(path)
        return None if inner is None else _RecordingSyncer(self, inner)

    def crash(self, rng: random.Random | None = None) -> None:
        super().crash(rng)
        torn, self.unsynced_headers = self.unsynced_headers, set()
        for path, sector in sorted(torn):
            if rng is not None and rng.random() < 0.5 and self.exists(path):
                start = sector + rng.randrange(0, 200)
                patch(self, path, start, rng.randbytes(rng.randint(1, 300)))
