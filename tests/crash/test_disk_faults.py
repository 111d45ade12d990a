"""Disk faults (issue 18): a disk that really fills, and an fsync that fails.

What each test proves:

1. MemFS (its ``capacity`` is a full disk): the journal refuses a batch it has no room
   for (ENOSPC) and lives on - its preallocation shrinks to the batch on a nearly full
   disk, a roll that finds no room is tried again - and replays exactly what it
   acknowledged; the ledger storage keeps entries in memory while a log buffer or an
   index file cannot be written, flushes them once there is room and never fails for it.
2. A failed fsync is never retried and trusted ("fsyncgate": MemFS, like Linux, forgets
   the dirty pages of a failed sync): the storage fails, the bookie is failed, the
   checkpoint mark stays behind what was not flushed, and a restart after a power cut
   replays everything acknowledged.
3. A serving bookie (in-process, on MemFS) whose journal fdatasync or checkpoint sync
   fails turns read-only for good: registered under ``readonly``, ``failed`` in
   ``/api/v1/bookie/info``, ``walkit_bookie_failed`` 1, an ERROR naming the directory,
   reads served, the operator cannot make it writable; writers move on by ensemble
   change and lose nothing; a restart (after a power cut) makes it writable again with
   everything it acknowledged.
4. Bookie processes on real small file systems - the ledger directory on a tmpfs, the
   journal on a tmpfs, both on one ext4 image on a loop device: the bookie meets ENOSPC
   (``diskUsageThreshold`` 1.0, so the periodic check cannot see it first), turns
   read-only, keeps serving reads, writers move on, nothing acknowledged is lost, and it
   is writable again once space is freed (by GC after ledger deletions, or by the
   operator), and after a restart it still has everything.
5. MemFS: a fence or a ledger's first add that the full journal refuses changes nothing
   - the requester gets ENOSPC, normal adds are not refused as fenced, no key is kept,
   in memory or after a power cut - and retried once there is room it takes effect; an
   add framed while its ledger's first (refused) add was pending carries the key again;
   a fence on its way already refuses normal adds.
6. MemFS: a bookie whose disks are still full at restart (after a shutdown, or a power
   cut that leaves an entry log without usage file and entries to replay) starts, serves
   every entry and fence it held, refuses writes for space, takes them once there is
   room, and a later restart has everything.
7. Bookie processes restarted with the journal disk (tmpfs), the ledger disk (tmpfs,
   after a kill) or both (ext4, after a kill) filled to the last block: the bookie comes
   up registered read-only, logs why, serves its entries, turns writable by itself once
   the space is freed and takes adds; a restart then has everything.
8. Real small file systems (ext4 with blocks reserved for root, a tmpfs short of
   inodes): ``walkit bookie info``, ``walkit bookie gc --status``,
   ``/api/v1/bookie/info`` and the storage's file system show the disk usage the
   read-only check compares with ``diskUsageThreshold``.

The process tests need root (mount, losetup) and skip with the reason otherwise;
``WALKIT_SLOW=1`` runs them on larger disks.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import itertools
import json
import logging
import os
import random
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

import walkit
from bookie import Bookie
from bookie.fs import is_no_space
from bookie.fs.mem import MemFS, _MemFile
from bookie.fs.real import RealFS
from bookie.native import io_error
from bookie.journal import Journal, JournalConfig, LogMark, highest_mark, journal_name, replay
from bookie.server import BookieServer
from bookie.storage import LedgerStorage
from bookie.storage._format import RECORD_HEADER
from support.bookie import KEY, client_of, config, entry, in_process, run
from support.disk import MIB, fill, loop_ext4, tmpfs, usage
from support.gc import bookie_ids_registered, delete_ledgers, payload, read_from_bookie, wait_until
from support.journal import Recorder
from walkit.cli import main
from walkit.client import BookieClient
from walkit.errors import LedgerFencedError, StorageError, UnauthorizedError, WalkitError
from walkit.metadata import LedgerMetadata

pytestmark = pytest.mark.timeout(300)
T = TypeVar("T")

KIB = 1024
SLOW = bool(os.environ.get("WALKIT_SLOW"))


# -- 1. a full disk, on the in-memory twin ------------------------------------------------------------

@pytest.mark.parametrize(("error", "full"), [
    (io_error(errno.ENOSPC, "pwrite"), True), (io_error(errno.ENOSPC, "fallocate"), True),
    (io_error(errno.EDQUOT, "pwritev"), True), (OSError(errno.ENOSPC, "MemFS"), True),
    (io_error(errno.ENOSPC, "fdatasync"), False), (io_error(errno.ENOSPC, "fsync_dir"), False),
    (io_error(errno.EIO, "pwrite"), False), (ValueError("not I/O"), False),
], ids=["pwrite", "fallocate", "quota", "memfs", "fdatasync", "fsync_dir", "eio", "other"])
def test_a_full_disk_is_a_refused_write_never_a_failed_sync(error: BaseException, full: bool) -> None:
    assert is_no_space(error) is full



def _journal(fs: MemFS, **kw: Any) -> Journal:
    kw.setdefault("prealloc_size", MIB)
    j = Journal(fs, JournalConfig("/j", **kw))
    j.start()
    return j


def _log(j: Journal, ledger: int, entry_id: int, data: bytes) -> Future[None]:
    fut: Future[None] = Future()

    def done(err: BaseException | None, f: Future[None]) -> None:
        if err is None:
            f.set_result(None)
        else:
            f.set_exception(err)

    j.log_entry(ledger, entry_id, data, done, fut)
    return fut


def _error(fut: Future[Any]) -> BaseException | None:
    try:
        fut.result(10)
    except BaseException as exc:  # noqa: BLE001 - the error is the answer
        return exc
    return None


def _replayed_entries(fs: MemFS) -> list[tuple[int, int, bytes]]:
    target = Recorder()
    replay(fs, "/j", None, target)
    return [(r[1], r[2], r[3]) for r in target.records if r[0] == "entry"]


def _fill_journal(j: Journal, ledger: int, size: int) -> tuple[list[tuple[int, int, bytes]], BaseException]:
    """Entries one by one until one is refused: (the acknowledged ones, the refusal)."""
    acked: list[tuple[int, int, bytes]] = []
    for e in range(10_000):
        data = bytes([e % 251]) * size
        err = _error(_log(j, ledger, e, data))
        if err is not None:
            return acked, err
        acked.append((ledger, e, data))
    raise AssertionError("the journal never found the disk full")


@pytest.mark.parametrize("where", ["batch", "roll", "end"])
def test_journal_refuses_what_the_disk_has_no_room_for_and_lives_on(where: str) -> None:
    fs = MemFS()
    if where == "batch":  # a 1 MiB preallocation step never fits; the batches do, until the disk is full
        j = _journal(fs)
        fs.capacity = fs.used_bytes() + 200 * KIB
    elif where == "roll":  # the file fills (max_size) and the next file's header does not fit
        j = _journal(fs, max_size=64 * KIB, prealloc_size=64 * KIB)
        fs.capacity = fs.used_bytes() + 64 * KIB
    else:  # 8 KiB batches after the 4 KiB header: the 8th, which would end the file past max_size, does
        # not fit - refused, and framing goes back to this file's seed (replay reads what follows it)
        j = _journal(fs, max_size=64 * KIB, prealloc_size=16 * KIB)
        fs.capacity = fs.used_bytes() + 60 * KIB
    told: list[BaseException] = []
    j.on_no_space = told.append
    acked, err = _fill_journal(j, 1, 7 * KIB if where == "end" else 10 * KIB)
    assert is_no_space(err), f"refused with {err!r}, not ENOSPC"
    assert j.failed is None, f"a full disk killed the journal: {j.failed!r}"
    assert told and j.stats.no_space >= 1
    assert len(acked) >= 5, f"only {len(acked)} entries fitted in 200 KiB: the preallocation step did not shrink"
    fs.capacity = None  # space freed: the same journal takes entries again (and rolls, for "roll")
    more = [(2, e, b"after %d" % e) for e in range(5)]
    for ledger, e, data in more:
        assert _error(_log(j, ledger, e, data)) is None
    assert j.failed is None
    j.shutdown()
    assert _replayed_entries(fs) == acked + more, "replay must give exactly the acknowledged entries, in order"


def test_journal_starts_without_its_file_on_a_full_disk() -> None:
    """A journal disk still full at restart: the journal starts without its new file
    (``on_no_space`` told), refuses records with ENOSPC while the disk stays full, and the
    first batch after space is freed makes the file; replay gives exactly what was
    acknowledged. The file's id is above every one in the directory and ``min_id``."""
    fs = MemFS()
    j = _journal(fs)
    before = [(1, e, b"before %d" % e) for e in range(3)]
    assert all(_error(_log(j, *rec)) is None for rec in before)
    j.shutdown()
    fs.capacity = fs.used_bytes()
    told: list[BaseException] = []
    j = Journal(fs, JournalConfig("/j", prealloc_size=MIB))
    j.on_no_space = told.append
    assert j.start(min_id=2) == LogMark(2, 4096), "the marks point where this run's records will begin"
    assert told and is_no_space(told[0]) and fs.listdir("/j") == [journal_name(1)], "no file made, none left"
    assert is_no_space(_error(_log(j, 2, 0, b"refused"))) and j.failed is None
    fs.capacity = None
    after = [(2, e, b"after %d" % e) for e in range(3)]
    assert all(_error(_log(j, *rec)) is None for rec in after)
    j.shutdown()
    assert fs.listdir("/j") == [journal_name(1), journal_name(2)]
    assert _replayed_entries(fs) == before + after
    j = Journal(fs, JournalConfig("/j", prealloc_size=MIB))
    assert j.start(min_id=9).journal_id == 9, "min_id: the bookie's mark may name a file never made"
    j.shutdown()


def _storage(fs: MemFS, **kw: Any) -> LedgerStorage:
    s = LedgerStorage(fs, ["/d"], write_buffer_size=4 * KIB, **kw)
    s.open()
    return s


def test_storage_keeps_entries_while_a_log_buffer_cannot_be_written() -> None:
    fs = MemFS()
    s = _storage(fs)
    told: list[BaseException] = []
    s.on_no_space = told.append
    fs.capacity = fs.used_bytes() + 32 * KIB
    stored = {e: bytes([e]) * (2 * KIB) for e in range(40)}  # 80 KiB: the buffer cannot be written out
    for e, data in stored.items():
        s.add_entry(1, e, data)  # never refused: the entry waits in the write cache
    with pytest.raises(OSError) as info:
        s.flush()  # places them: the records that do not fit wait in the log buffer
    assert info.value.errno == errno.ENOSPC and s.failure is None
    assert told and is_no_space(told[0])
    assert s._cache.count() == 0 and s.pending_index_entries() == len(stored)  # placed, waiting in the buffer
    s.add_entry(2, 0, b"more")  # an add while a buffer waits for room: the bookie is told again
    assert len(told) >= 2 and s.get_entry(2, 0) == b"more"
    stored_2 = {0: b"more"}
    assert all(s.get_entry(1, e) == data for e, data in stored.items()), "entries waiting in memory are readable"
    fs.capacity = None
    s.flush()
    s.close()
    s.open()  # from disk only
    assert all(s.get_entry(1, e) == data for e, data in stored.items()) and s.get_entry(2, 0) == stored_2[0]
    s.close()


def test_storage_undoes_a_flush_whose_index_does_not_fit() -> None:
    fs = MemFS()
    s = _storage(fs)
    s.add_entry(1, 0, b"old")
    s.flush()
    stored = {(ledger, e): b"L%dE%d" % (ledger, e) for ledger in (1, 2) for e in range(1, 4)}
    for (ledger, e), data in stored.items():
        s.add_entry(ledger, e, data)
    placed = sum(RECORD_HEADER.size + len(data) for data in stored.values())  # what the flush adds to log 1
    fs.capacity = fs.used_bytes() + placed  # the log's records fit exactly; ledger 2's new index file does not
    with pytest.raises(OSError) as info:
        s.flush()
    assert is_no_space(info.value) and s.failure is None
    assert all(d.writer is not None and not d.writer._buf for d in s._dirs), "the log was written: the index failed"
    assert s.pending_index_entries() == len(stored), "the undone flush gave its slots back"
    assert all(s.get_entry(*k) == data for k, data in stored.items())
    fs.capacity = None
    synced_dirs: list[str] = []
    fsync_dir = fs.fsync_dir
    fs.fsync_dir = lambda path: (synced_dirs.append(path), fsync_dir(path))[1]  # type: ignore[method-assign]
    s.flush()
    # the undone flush made bucket 02 but never made it durable in index/: the retry does
    assert synced_dirs[-2:] == ["/d/current/index/02", "/d/current/index"], synced_dirs
    assert s.pending_index_entries() == 0
    s.close()
    s.open()
    assert all(s.get_entry(*k) == data for k, data in stored.items()) and s.get_entry(1, 0) == b"old"
    assert not [n for n in fs.listdir("/d/current/index/02") if n.endswith(".tmp")]
    s.close()


# -- 2. a failed fsync is never retried -----------------------------------------------------------------

def test_a_failed_checkpoint_sync_fails_the_bookie_and_keeps_the_mark(tmp_path: Path) -> None:
    fs = MemFS()
    cfg = config(tmp_path, flush_interval=3_600_000)  # checkpoints only when the test asks
    b = Bookie(cfg, fs=fs)
    failures: list[Any] = []
    b.on_failed = failures.append
    b.start()
    acked = {e: entry(1, e) for e in range(20)}
    for e, data in acked.items():
        b.add_entry(1, e, KEY, data).result(10)
    ledgers = list(cfg.ledger_directories)
    mark = highest_mark(fs, ledgers)
    fs.fail_next_sync()  # the entry log's sync, the first of the checkpoint
    with pytest.raises(OSError):
        b.checkpoint()
    assert b.failure is not None and failures == [b.failure]
    assert b.failure.directory == ledgers[0] and b.failure.describe()["errno"] == errno.EIO
    assert highest_mark(fs, ledgers) == mark, "the mark moved past a flush that failed"
    with pytest.raises(StorageError):  # never retried (a retry would "succeed": the pages are forgotten)
        b.checkpoint()
    assert highest_mark(fs, ledgers) == mark
    assert all(b.read_entry(1, e) == data for e, data in acked.items()), "reads go on"
    assert isinstance(_error(b.add_entry(1, 20, KEY, entry(1, 20))), WalkitError)
    b.shutdown()
    fs.crash(random.Random(5))  # power cut: the entry log's unsynced bytes may be gone
    b2 = Bookie(cfg, fs=fs)
    b2.start()  # replays the journal from the old mark
    try:
        assert b2.failure is None
        assert all(b2.read_entry(1, e) == data for e, data in acked.items())
        b2.add_entry(1, 20, KEY, entry(1, 20)).result(10)
    finally:
        b2.shutdown()


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC], ids=["eio", "enospc"])
def test_a_mark_that_cannot_be_written(tmp_path: Path, err: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """EIO while writing ``lastMark`` fails the bookie (its disk is failing); ENOSPC only
    fails that checkpoint. Either way the mark stays where it was."""
    fs = MemFS()
    cfg = config(tmp_path, flush_interval=3_600_000)
    b = Bookie(cfg, fs=fs)
    b.start()
    try:
        b.add_entry(1, 0, KEY, entry(1, 0)).result(10)
        mark = highest_mark(fs, list(cfg.ledger_directories))

        def broken(*args: Any) -> None:
            raise OSError(err, "injected")

        with monkeypatch.context() as patch:
            patch.setattr("bookie._checkpoints.write_mark", broken)
            with pytest.raises(OSError):
                b.checkpoint()
        assert highest_mark(fs, list(cfg.ledger_directories)) == mark
        if err == errno.EIO:
            assert b.failure is not None and b.failure.directory == cfg.ledger_directories[0]
        else:
            assert b.failure is None
            assert b.checkpoint() > mark, "a checkpoint after the disk has room moves the mark"
    finally:
        b.shutdown()


# -- 3. a serving bookie whose fsync fails -----------------------------------------------------------

FAST: dict[str, Any] = {"add_timeout": 10.0, "read_timeout": 10.0, "connect_timeout": 5.0, "session_timeout": 10.0}


def _ensemble_with(bk: walkit.BookKeeper, bookie_id: str, size: int = 2) -> Any:
    """A new ledger (E = Qw = Qa = ``size``) whose ensemble has ``bookie_id``."""
    for _ in range(50):
        lh = bk.create_ledger(size, size, size)
        if bookie_id in lh.metadata.ensembles[0][1]:
            return lh
        lh.close()
    raise AssertionError(f"no ensemble with {bookie_id} in 50 tries")


def _add_all(lh: Any, datas: list[bytes]) -> dict[int, bytes]:
    futs = [(data, lh.add_entry_async(data)) for data in datas]
    return {fut.result(60): data for data, fut in futs}


def _moved_on(meta: LedgerMetadata, bookie_id: str) -> bool:
    return len(meta.ensembles) > 1 and bookie_id not in meta.ensembles[-1][1]


def _read_back(bk: walkit.BookKeeper, ledger_id: int, acked: dict[int, bytes]) -> None:
    got = {e.entry_id: e.data for e in bk.open_ledger(ledger_id).read(0, max(acked))}
    lost = [e for e, data in acked.items() if got.get(e) != data]
    assert not lost, f"ledger {ledger_id}: acknowledged entries lost or changed: {lost[:10]}"


def _http(port: int, method: str, path: str, body: Any = None) -> Any:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body).encode())
        data = conn.getresponse().read()
        return data if path == "/metrics" else json.loads(data)
    finally:
        conn.close()


@pytest.mark.parametrize("fault", ["journal", "checkpoint"])
def test_fsync_failure_makes_a_serving_bookie_read_only_until_restarted(
        tmp_path: Path, fault: str, caplog: pytest.LogCaptureFixture) -> None:
    mem = MemFS()

    def on_server(i: int, server: BookieServer) -> None:
        if i == 0:  # bookie 0's disks are the in-memory twin (the fault injector)
            server._fs = mem
            server._disk_usage = lambda path: 0.1

    options = {"http_server_enabled": True, "http_server_port": 0, "disk_check_interval": 500,
               "flush_interval": 200 if fault == "checkpoint" else 3_600_000}
    caplog.set_level(logging.ERROR, logger="bookie")
    with walkit.LocalCluster(tmp_path / "cluster", bookies=3, bookie_options=options, session_timeout=5.0,
                             on_server=on_server) as c, c.client(**FAST) as bk:
        b0, uri = c.bookie_ids[0], c.metadata_uri
        server = c.server(0)
        lh = _ensemble_with(bk, b0)
        acked = _add_all(lh, [b"before %d" % i for i in range(20)])
        mem.fail_next_sync()
        if fault == "checkpoint":  # nothing in flight: the next checkpoint's entry-log sync fails
            wait_until(lambda: server.failure is not None, 10, "the checkpoint failed")
        acked.update(_add_all(lh, [b"after %d" % i for i in range(20)]))
        wait_until(lambda: b0 in bookie_ids_registered(uri)[1], 10, "registered read-only")
        failure = server.failure
        assert failure is not None and server.readonly
        where = c.data_dir / "bookie-0" / ("journal" if fault == "journal" else "ledgers")
        assert failure.directory == str(where) and getattr(failure.error, "errno", None) == errno.EIO
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "bookie" in r.name]
        assert any(str(where) in m and "read-only" in m for m in errors), f"no ERROR naming {where}: {errors}"
        info = _http(server.http_port, "GET", "/api/v1/bookie/info")
        assert info["state"] == "readonly" and info["failed"]["directory"] == str(where)
        assert b"walkit_bookie_failed 1.0" in _http(server.http_port, "GET", "/metrics")
        assert _http(server.http_port, "PUT", "/api/v1/bookie/state/readonly", {"readonly": False})["readonly"]
        assert b0 in bookie_ids_registered(uri)[1], "the operator cannot make a failed bookie writable"
        assert lh.ensemble_changes >= 1 and _moved_on(lh.metadata, b0), "the writer did not move on"
        on_b0 = read_from_bookie(c, 0, [(lh.ledger_id, e) for e in range(20)])  # reads are served
        assert all(b"before %d" % e in data for (_, e), data in on_b0.items())
        lh.close()
        _read_back(bk, lh.ledger_id, acked)
        c.kill_bookie(0)
        mem.crash(random.Random(11))  # and a power cut: only what was synced survives
        c.restart_bookie(0)
        server = c.server(0)
        assert server.failure is None and not server.readonly
        wait_until(lambda: b0 in bookie_ids_registered(uri)[0], 10, "registered writable after the restart")
        on_b0 = read_from_bookie(c, 0, [(lh.ledger_id, e) for e in range(20)])
        assert all(b"before %d" % e in data for (_, e), data in on_b0.items()), "an acknowledged entry was lost"
        lh2 = bk.create_ledger(3, 3, 3)
        _read_back(bk, lh2.ledger_id, _add_all(lh2, [b"again %d" % i for i in range(10)]))


# -- 4. bookie processes on real small file systems --------------------------------------------------------

BODY = 64 * KIB
PROCESS_BASE: dict[str, Any] = {
    "gc_wait_time": 1000, "entry_log_size_limit": 256 * KIB, "flush_interval": 200,
    "journal_max_group_wait_msec": 0.5, "journal_pre_alloc_size_mb": 1, "journal_max_size_mb": 4,
    "journal_max_backups": 1, "journal_recycle_files": 1,
    # 1.0: the periodic check turns the bookie read-only only at exactly 100 %, so the
    # bookie meets ENOSPC itself; lwm: writable again once space is freed
    "disk_usage_threshold": 1.0, "disk_usage_warn_threshold": 0.9,
}


@contextlib.contextmanager
def _small_disks(case: str, root: Path) -> Iterator[Path]:
    """Bookie 0's journal and/or ledger directory on a small file system (symlinks into
    its mount point, which also has room for another tenant's file); yields the mount.
    Where only the journal's disk is small, the ledgers get a roomy tmpfs of their own:
    on the host's disk, a host more than ``disk_usage_lwm_threshold`` full would keep
    the bookie read-only after the journal's disk is freed (as it did on CI)."""
    if case == "ledgers":
        disk, names = tmpfs(root / "disk", (48 if SLOW else 24) * MIB), ("ledgers",)
    elif case == "journal":
        disk, names = tmpfs(root / "disk", 16 * MIB), ("journal",)
    else:  # journal and ledgers on one ext4 image on a loop device
        disk, names = loop_ext4(root / "disk", (64 if SLOW else 32) * MIB, root / "ext4.img"), ("journal", "ledgers")
    with contextlib.ExitStack() as stack:
        mnt = stack.enter_context(disk)
        bookie0 = root / "cluster" / "bookie-0"
        bookie0.mkdir(parents=True)
        targets = {name: mnt / name for name in names}
        if case == "journal":
            targets["ledgers"] = stack.enter_context(tmpfs(root / "ledger-disk", 512 * MIB)) / "ledgers"
        for name, target in targets.items():
            target.mkdir()
            (bookie0 / name).symlink_to(target)
        yield mnt


class _Writer:
    """Ledgers (E = Qw = Qa = 2 of 3 bookies) written until ``stop()``, and one ledger
    (``lead``) with bookie 0 in its first ensemble written all along: every entry
    acknowledged is remembered."""

    def __init__(self, bk: walkit.BookKeeper, bookie_id: str) -> None:
        self.bk = bk
        self.lead = _ensemble_with(bk, bookie_id)
        self.acked: dict[int, dict[int, bytes]] = {}
        self.closed: list[int] = []

    def ledger(self, n: int) -> None:
        lh = self.bk.create_ledger(2, 2, 2)
        datas = [payload(lh.ledger_id, e, BODY) for e in range(n)]
        lead = [payload(self.lead.ledger_id, 1000 + e, 4 * KIB) for e in range(2)]
        futs = [(lh, d, lh.add_entry_async(d)) for d in datas] + [(self.lead, d, self.lead.add_entry_async(d))
                                                                  for d in lead]
        for handle, data, fut in futs:
            self.acked.setdefault(handle.ledger_id, {})[fut.result(60)] = data
        lh.close()
        self.closed.append(lh.ledger_id)

    def read_back(self, ledgers: list[int]) -> None:
        for ledger_id in ledgers:
            _read_back(self.bk, ledger_id, self.acked[ledger_id])


@pytest.mark.parametrize("case", ["ledgers", "journal", "both-ext4"])
def test_a_real_full_disk(tmp_path: Path, case: str) -> None:
    lwm = 0.7 if case == "both-ext4" else 0.8
    options = {**PROCESS_BASE, "disk_usage_lwm_threshold": lwm,
               # the journal's disk is freed by the operator, which only the periodic check sees
               "disk_check_interval": 500 if case == "journal" else 60_000}
    with contextlib.ExitStack() as stack:
        mnt = stack.enter_context(_small_disks(case, tmp_path))
        filler = fill(mnt, 3 * MIB) if case == "journal" else None  # another tenant took the journal's disk
        c = stack.enter_context(walkit.LocalCluster(tmp_path / "cluster", 3, processes=True, session_timeout=10.0,
                                                    bookie_options=options))
        bk = stack.enter_context(c.client(**{**FAST, "add_timeout": 30.0}))
        b0, uri = c.bookie_ids[0], c.metadata_uri
        log = c.data_dir / "bookie-0" / "bookie.log"
        w = _Writer(bk, b0)

        def readonly() -> bool:
            return b0 in bookie_ids_registered(uri)[1]

        limit = 40 * (64 if SLOW else 32) * MIB  # far more than the small disk holds
        while not readonly():
            assert sum(map(len, w.acked.values())) * BODY < limit, f"never read-only; disk {usage(mnt):.0%} used"
            w.ledger(16)
        text = log.read_text(errors="replace")
        assert "no space left in" in text or "No space left" in text, "read-only without meeting ENOSPC"
        assert "failed: I/O error" not in text, f"a full disk made the bookie failed: {text[-3000:]}"
        w.ledger(16)  # writers go on with two bookies
        for _ in range(4):
            w.ledger(4)
        assert _moved_on(w.lead.metadata, b0), "the writer of a ledger on bookie 0 did not move on"
        w.read_back(w.closed)  # nothing acknowledged is lost
        first = w.lead.metadata.ensembles[1][0]
        on_b0 = read_from_bookie(c, 0, [(w.lead.ledger_id, e) for e in range(first)])
        assert len(on_b0) == first, "a read-only bookie serves reads"
        # give the space back: GC after deletions, or the operator
        if filler is not None:
            filler.unlink()
        else:
            delete_ledgers(bk, w.closed)
        took = wait_until(lambda: b0 in bookie_ids_registered(uri)[0], 60, "writable again",
                          detail=lambda: f"disk {usage(mnt):.0%} used; log: {log.read_text(errors='replace')[-2000:]}")
        lh = bk.create_ledger(3, 3, 3)  # bookie 0 takes writes again
        fresh = _add_all(lh, [payload(lh.ledger_id, e, BODY) for e in range(16)])
        lh.close()
        _read_back(bk, lh.ledger_id, fresh)
        w.lead.close()
        c.restart_bookie(0)  # and everything it acknowledged is durable
        on_b0 = read_from_bookie(c, 0, [(w.lead.ledger_id, e) for e in range(first)]
                                 + [(lh.ledger_id, e) for e in fresh])
        assert len(on_b0) == first + len(fresh)
        kept = [w.lead.ledger_id] + ([] if filler is None else w.closed)
        w.read_back(kept)
        print(f"{case}: read-only after {len(w.closed)} ledgers, writable again {took:.1f}s after freeing space")


# -- 5. a master key or a fence the journal has no room for changes nothing (MemFS) ---------------------

def _full_bookie(tmp_path: Path, fs: MemFS) -> Bookie:
    """A started bookie on ``fs`` that has ledger 1 (entries 0-2, key ``KEY``) and whose
    journal then found its disk full: ledger 9's entries used the journal's reserved
    space up, and ``fs`` grows no more (until the test gives ``capacity`` back)."""
    b = Bookie(config(tmp_path, flush_interval=3_600_000, journal_pre_alloc_size_mb=1), fs=fs)
    b.start()
    for e in range(3):
        b.add_entry(1, e, KEY, entry(1, e)).result(10)
    fs.capacity = fs.used_bytes()  # the journal's reserved step is all the room left
    ids = iter(range(1000))
    for size in (64 * KIB, 1):  # large entries, then the smallest batches (one block) use it up
        if not any(_error(b.add_entry(9, e, KEY, entry(9, e, bytes(size)))) for e in itertools.islice(ids, 300)):
            raise AssertionError("the journal never found the disk full")
    return b


def _power_off(fs: MemFS, b: Bookie) -> None:
    """Cut the power under a running bookie: only what was synced survives."""
    fs.arm_crash(after_ops=0)
    with contextlib.suppress(OSError, WalkitError):
        b.shutdown()
    fs.crash(random.Random(7))


def test_a_fence_the_journal_refuses_leaves_the_ledger_unfenced(tmp_path: Path) -> None:
    """A fencing read on a full journal disk: the reader gets the ENOSPC; the ledger is as
    if the fence never came - normal adds are not refused as fenced, nothing is stored
    for a ledger never seen - and a fence retried once there is room fences it, for good
    (a power cut and a restart later too)."""
    fs = MemFS()
    b = _full_bookie(tmp_path, fs)
    cfg = b.config
    for ledger in (1, 2):  # 2: never seen (its key would be journaled with the fence)
        err = _error(b.fence(ledger, KEY))
        assert err is not None and is_no_space(err), f"ledger {ledger}: fence refused with {err!r}, not ENOSPC"
        assert not b.is_fenced(ledger)
    assert not b.storage.has_ledger(2), "a refused fence of an unknown ledger stored its state"
    err = _error(b.add_entry(1, 3, KEY, entry(1, 3)))
    assert err is not None and is_no_space(err), f"after a refused fence an add is refused for space, not {err!r}"
    fs.capacity = None  # space freed
    b.add_entry(1, 3, KEY, entry(1, 3)).result(10)  # not fenced: a normal add is accepted
    b.add_entry(2, 0, b"writer-key", entry(2, 0)).result(10)  # no key was stored by the refused fence
    b.fence(1, KEY).result(10)  # the retried fence
    assert isinstance(_error(b.add_entry(1, 4, KEY, entry(1, 4))), LedgerFencedError)
    _power_off(fs, b)
    b2 = Bookie(cfg, fs=fs)
    b2.start()
    try:
        assert b2.is_fenced(1) and not b2.is_fenced(2), "the retried fence is durable, the refused one never was"
        assert isinstance(_error(b2.add_entry(1, 4, KEY, entry(1, 4))), LedgerFencedError)
        assert [b2.read_entry(1, e) for e in range(4)] == [entry(1, e) for e in range(4)]
        assert b2.storage.master_key(2) == b"writer-key"
    finally:
        b2.shutdown()


def test_a_first_add_the_journal_refuses_stores_no_master_key(tmp_path: Path) -> None:
    """The first add of a ledger on a full journal disk: the writer gets the ENOSPC and
    the bookie keeps no key for the ledger (in memory or after a restart), so the add
    that comes once there is room sets it."""
    fs = MemFS()
    b = _full_bookie(tmp_path, fs)
    cfg = b.config
    err = _error(b.add_entry(3, 0, KEY, entry(3, 0)))
    assert err is not None and is_no_space(err), f"refused with {err!r}, not ENOSPC"
    assert b.storage.master_key(3) is None, "the refused first add's key stayed in storage, not in the journal"
    fs.capacity = None
    b.add_entry(3, 0, b"second-key", entry(3, 0)).result(10)
    assert isinstance(_error(b.add_entry(3, 1, KEY, entry(3, 1))), UnauthorizedError)
    _power_off(fs, b)
    b2 = Bookie(cfg, fs=fs)
    b2.start()
    try:
        assert b2.storage.master_key(3) == b"second-key" and b2.read_entry(3, 0) == entry(3, 0)
    finally:
        b2.shutdown()


def test_an_add_after_a_refused_first_add_carries_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ledger 5's first add (64 KiB) is refused for space while a second, small add of it
    waits in the next batch - which fits. That batch must carry the MASTER_KEY record
    again: a key stays pending, journaled with each batch, until one of its records is
    durable; else the journal would hold an entry of a ledger without its key."""
    fs = MemFS()
    b = _full_bookie(tmp_path, fs)
    journal_dir = b.config.journal_directory
    fs.capacity = fs.used_bytes() + 8 * KIB  # room for a small batch, not for the first add's
    entered, release = threading.Event(), threading.Event()
    allocate = _MemFile.allocate

    def held(self: _MemFile, offset: int, length: int) -> None:
        if self.path.startswith(journal_dir) and not entered.is_set():
            entered.set()  # the first add's batch is closed and reserving: hold it there
            release.wait(10)
        allocate(self, offset, length)

    monkeypatch.setattr(_MemFile, "allocate", held)
    first = b.add_entry(5, 0, KEY, entry(5, 0, bytes(64 * KIB)))
    assert entered.wait(10), "the first add's batch never reserved space"
    second = b.add_entry(5, 1, KEY, entry(5, 1))
    release.set()
    err = _error(first)
    assert err is not None and is_no_space(err), f"the first add: {err!r}"
    assert _error(second) is None and b.storage.master_key(5) == KEY
    b.shutdown()
    target = Recorder()
    replay(fs, journal_dir, None, target)
    mine = [r[:3] for r in target.records if r[1] == 5]
    assert mine == [("master_key", 5, KEY), ("entry", 5, 1)], f"ledger 5 in the journal: {mine}"


def test_adds_are_refused_as_fenced_while_a_fence_is_on_its_way(tmp_path: Path) -> None:
    """From the moment a FENCE record is framed, normal adds are refused (one admitted
    then could be acknowledged after the fence); recovery adds pass."""
    fs = MemFS()
    b = Bookie(config(tmp_path, flush_interval=3_600_000), fs=fs)
    b.start()
    try:
        b.add_entry(1, 0, KEY, entry(1, 0)).result(10)
        b.journal.sync_delay = 0.5  # the fence's batch takes a while to be durable
        fence = b.fence(1, KEY)
        assert not fence.done() and b.is_fenced(1) and not b.storage.is_fenced(1), "fenced in storage once durable"
        assert isinstance(_error(b.add_entry(1, 1, KEY, entry(1, 1))), LedgerFencedError)
        recovery = b.add_entry(1, 1, KEY, entry(1, 1), recovery=True)
        b.journal.sync_delay = 0.0
        assert fence.result(10) is None and recovery.result(10) is None and b.is_fenced(1)
    finally:
        b.shutdown()


# -- 6. a bookie whose disks are still full at restart (MemFS) ------------------------------------------

@pytest.mark.parametrize("stop", ["shutdown", "power-cut"])
def test_a_bookie_starts_on_full_disks_and_is_writable_once_there_is_room(tmp_path: Path, stop: str) -> None:
    """Its journal and ledger disks full at restart (MemFS: one capacity for both), a
    bookie still starts: replay needs no new space, the journal starts without its new
    file, the checkpoint at start is skipped for space, ``on_no_space`` names the journal
    directory. It serves every entry and fence it held, refuses writes for space - and
    takes them once there is room, without a restart; a later restart has everything."""
    fs = MemFS()
    cfg = config(tmp_path, flush_interval=3_600_000, journal_pre_alloc_size_mb=1, entry_log_size_limit=64 * KIB)
    b = Bookie(cfg, fs=fs)
    b.start()
    acked = {(1, e): entry(1, e, bytes([e]) * 4000) for e in range(40)}
    for (ledger, e), data in acked.items():
        b.add_entry(ledger, e, KEY, data).result(10)
        if e == 29:
            b.checkpoint()  # entry logs rolled and flushed; the active one has no usage file yet
    b.fence(2, KEY).result(10)
    if stop == "shutdown":
        b.shutdown()
    else:  # the start rebuilds the active log's usage and replays the last entries - on a full disk
        _power_off(fs, b)
    fs.capacity = fs.used_bytes()
    told: list[str] = []
    b2 = Bookie(cfg, fs=fs)
    b2.on_no_space = lambda directory, exc: told.append(directory)
    b2.start()
    try:
        assert b2.failure is None and cfg.journal_directory in told
        assert all(b2.read_entry(*k) == data for k, data in acked.items()), "a bookie on a full disk serves reads"
        assert b2.is_fenced(2)
        for fut in (b2.add_entry(1, 40, KEY, entry(1, 40)), b2.fence(3, KEY)):
            err = _error(fut)
            assert err is not None and is_no_space(err), f"a write on a full disk: {err!r}"
        assert not b2.is_fenced(3)
        fs.capacity = None  # space freed
        b2.add_entry(1, 40, KEY, entry(1, 40)).result(10)
        acked[(1, 40)] = entry(1, 40)
        b2.checkpoint()
    finally:
        b2.shutdown()
    b3 = Bookie(cfg, fs=fs)
    b3.start()
    try:
        assert all(b3.read_entry(*k) == data for k, data in acked.items())
        assert b3.is_fenced(2) and not b3.is_fenced(3)
    finally:
        b3.shutdown()


# -- 7. bookie processes whose disk is still full at restart -----------------------------------------------

def _on_bookie(c: walkit.LocalCluster, i: int, call: Callable[[BookieClient], Awaitable[T]]) -> T:
    """``call(client)`` on a connection of bookie ``i``'s own (its answer, or its error)."""

    async def run() -> T:
        client = await BookieClient.connect(*c.bookie_address(i))
        try:
            return await call(client)
        finally:
            await client.close()

    return asyncio.run(run())


def _wire_error(c: walkit.LocalCluster, call: Callable[[BookieClient], Awaitable[Any]]) -> BaseException | None:
    try:
        _on_bookie(c, 0, call)
    except WalkitError as exc:
        return exc
    return None


@pytest.mark.parametrize(("case", "stop"), [("journal", "stop"), ("ledgers", "kill"), ("both-ext4", "kill")])
def test_a_bookie_restarted_on_a_full_disk_starts_read_only(tmp_path: Path, case: str, stop: str) -> None:
    """Stop bookie 0 (or kill it: then the start also rebuilds its active entry log's
    usage and replays what was not checkpointed), fill its journal disk, its ledger disk
    or the one ext4 disk of both to the last block, start it: it comes up - registered
    read-only, the log saying why - and serves every entry it held; once the space is
    given back it turns writable by itself (the disk check) and takes adds; a restart
    after that still has everything. Where the journal's disk is full, a fencing read
    over the wire gets the ENOSPC and fences nothing: once writable the bookie still
    takes the ledger's normal adds, and a fence retried then holds across a restart."""
    options = {**PROCESS_BASE, "disk_usage_lwm_threshold": 0.8, "disk_check_interval": 500}
    direct = 1 << 40  # a ledger written to bookie 0 alone, over the wire, with KEY
    with contextlib.ExitStack() as stack:
        mnt = stack.enter_context(_small_disks(case, tmp_path))
        c = stack.enter_context(walkit.LocalCluster(tmp_path / "cluster", 3, processes=True, session_timeout=10.0,
                                                    bookie_options=options))
        bk = stack.enter_context(c.client(**FAST))
        b0, uri = c.bookie_ids[0], c.metadata_uri
        log = c.data_dir / "bookie-0" / "bookie.log"
        lh = bk.create_ledger(3, 3, 3)
        acked = _add_all(lh, [payload(lh.ledger_id, e, 4 * KIB) for e in range(32)])
        lh.close()
        _on_bookie(c, 0, lambda b: b.add_entry(direct, 0, KEY, entry(direct, 0)))
        if stop == "stop":
            c.stop_bookie(0)
        else:  # after a checkpoint: its active entry log is on disk, without a usage file
            ledgers = [str(c.data_dir / "bookie-0" / "ledgers")]
            wait_until(lambda: (highest_mark(RealFS(), ledgers) or LogMark(0, 0)) > LogMark(1, 4096), 10,
                       "a checkpoint")
            c.kill_bookie(0)
        filler = fill(mnt, 0)
        c.restart_bookie(0)  # raised before: no room for the new journal file, or for the lastMark
        wait_until(lambda: b0 in bookie_ids_registered(uri)[1], 30, "registered read-only",
                   detail=lambda: log.read_text(errors="replace")[-2000:])
        text = log.read_text(errors="replace")
        assert "no space left in" in text, f"the log does not say why it is read-only: {text[-2000:]}"
        assert "failed: I/O error" not in text, f"a full disk made the bookie failed: {text[-3000:]}"
        on_b0 = read_from_bookie(c, 0, [(lh.ledger_id, e) for e in acked])
        assert all(acked[e] in data for (_, e), data in on_b0.items()), "a bookie started on a full disk serves reads"
        journal_full = case != "ledgers"
        if journal_full:
            err = _wire_error(c, lambda b: b.read_entry(direct, 0, fence=True, master_key=KEY))
            assert err is not None and "No space left" in str(err), f"a fencing read on a full journal: {err!r}"
        filler.unlink()
        wait_until(lambda: b0 in bookie_ids_registered(uri)[0], 30, "writable again",
                   detail=lambda: f"disk {usage(mnt):.0%} used; log: {log.read_text(errors='replace')[-2000:]}")
        lh2 = bk.create_ledger(3, 3, 3)  # bookie 0 takes writes again
        fresh = _add_all(lh2, [payload(lh2.ledger_id, e, 4 * KIB) for e in range(16)])
        lh2.close()
        if journal_full:  # the refused fence fenced nothing; retried, it holds
            _on_bookie(c, 0, lambda b: b.add_entry(direct, 1, KEY, entry(direct, 1)))
            _on_bookie(c, 0, lambda b: b.read_entry(direct, 1, fence=True, master_key=KEY))
        c.restart_bookie(0)
        if journal_full:
            err = _wire_error(c, lambda b: b.add_entry(direct, 2, KEY, entry(direct, 2)))
            assert isinstance(err, LedgerFencedError), f"the retried fence did not survive the restart: {err!r}"
        keys = [(lh.ledger_id, e) for e in acked] + [(lh2.ledger_id, e) for e in fresh]
        on_b0 = read_from_bookie(c, 0, keys)
        both = {(lh.ledger_id, e): d for e, d in acked.items()} | {(lh2.ledger_id, e): d for e, d in fresh.items()}
        assert all(both[k] in data for k, data in on_b0.items()) and len(on_b0) == len(both)


# -- 8. one figure for a disk's usage, wherever it is shown -------------------------------------------------

def _cli_json(*args: str) -> Any:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*args, "--json"]) == 0
    return json.loads(out.getvalue())


@contextlib.contextmanager
def _half_full_disk(case: str, root: Path) -> Iterator[tuple[Path, float]]:
    """A small file system, used to a known level the ``df`` way of counting would not
    show: yields (mount, that level; a bookie's own files add a little). An ext4 disk
    with a fifth of its blocks reserved for root, filled but for 3 MiB: used / (used +
    available) leaves the reserve out, the bookie counts it as used (an unprivileged
    writer cannot have it). A tmpfs with room to spare but three quarters of its inodes
    taken: no new file fits once they are gone."""
    if case == "ext4-reserved":
        with loop_ext4(root / "disk", 16 * MIB, root / "ext4.img", reserved_percent=20) as mnt:
            fill(mnt, 3 * MIB)
            st = os.statvfs(mnt)
            yield mnt, 1 - 3 * MIB / (st.f_blocks * st.f_frsize)
    else:
        with tmpfs(root / "disk", 8 * MIB, inodes=256) as mnt:
            for i in range(192):
                (mnt / f"file-{i}").touch()
            yield mnt, 192 / 256


@pytest.mark.parametrize("case", ["ext4-reserved", "tmpfs-inodes"])
def test_every_report_of_a_disks_usage_is_the_figure_read_only_mode_uses(tmp_path: Path, case: str) -> None:
    """``walkit bookie info``, ``walkit bookie gc --status``, ``/api/v1/bookie/info``
    and the storage's file system report the very figure the disk check compares with
    ``diskUsageThreshold``: (total - usable) / total of the file system (BookKeeper's),
    or the share of its inodes when more of those are used (issue 35)."""
    with _half_full_disk(case, tmp_path) as (mnt, level):
        ledgers = mnt / "ledgers"
        cfg = config(tmp_path, ledger_directories=[str(ledgers)], http_server_enabled=True, http_server_port=0)

        async def body() -> None:
            async with in_process(cfg) as server:
                loop = asyncio.get_running_loop()
                threshold = server.disk_usage_of(str(ledgers))
                http = await loop.run_in_executor(None, _http, server.http_port, "GET", "/api/v1/bookie/info")
                client = await client_of(server)
                gc = await client.admin("gc.status")  # what `walkit bookie gc --status` prints
                await client.close()
                info = _cli_json("bookie", "info", "--ledger-dir", str(ledgers))
                figures = {"threshold": threshold, "storage": RealFS().disk_usage(str(ledgers)),
                           "http": http["ledger_directories"][0]["usage"], "gc": gc["disk_usage"],
                           "info": info["directories"][0]["disk"]["used_fraction"]}
                assert threshold == pytest.approx(level, abs=0.05), figures
                assert {k: round(v, 4) for k, v in figures.items()} == dict.fromkeys(figures, round(threshold, 4))

        run(body)
