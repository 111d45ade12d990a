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

The process tests need root (mount, losetup) and skip with the reason otherwise;
``WALKIT_SLOW=1`` runs them on larger disks.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

import walkit
from bookie import Bookie
from bookie.fs import is_no_space
from bookie.fs.mem import MemFS
from bookie.native import io_error
from bookie.journal import Journal, JournalConfig, highest_mark, replay
from bookie.server import BookieServer
from bookie.storage import LedgerStorage
from bookie_support import KEY, config, entry
from disk_support import MIB, fill, loop_ext4, tmpfs, usage
from gc_support import bookie_ids_registered, delete_ledgers, payload, read_from_bookie, wait_until
from journal_support import Recorder
from walkit.errors import StorageError, WalkitError
from walkit.metadata import LedgerMetadata

pytestmark = pytest.mark.timeout(300)

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


@pytest.mark.parametrize("where", ["batch", "roll"])
def test_journal_refuses_what_the_disk_has_no_room_for_and_lives_on(where: str) -> None:
    fs = MemFS()
    if where == "batch":  # a 1 MiB preallocation step never fits; the batches do, until the disk is full
        j = _journal(fs)
        fs.capacity = fs.used_bytes() + 200 * KIB
    else:  # the file fills (max_size) and the next file's header does not fit
        j = _journal(fs, max_size=64 * KIB, prealloc_size=64 * KIB)
        fs.capacity = fs.used_bytes() + 64 * KIB
    told: list[BaseException] = []
    j.on_no_space = told.append
    acked, err = _fill_journal(j, 1, 10 * KIB)
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
        s.add_entry(1, e, data)  # never refused: the record waits in the buffer
    assert told and is_no_space(told[0]) and s.failure is None
    with pytest.raises(OSError) as info:
        s.flush()
    assert info.value.errno == errno.ENOSPC and s.failure is None
    assert all(s.get_entry(1, e) == data for e, data in stored.items()), "entries waiting in memory are readable"
    fs.capacity = None
    s.flush()
    s.close()
    s.open()  # from disk only
    assert all(s.get_entry(1, e) == data for e, data in stored.items())
    s.close()


def test_storage_undoes_a_flush_whose_index_does_not_fit() -> None:
    fs = MemFS()
    s = _storage(fs)
    s.add_entry(1, 0, b"old")
    s.flush()
    stored = {(ledger, e): b"L%dE%d" % (ledger, e) for ledger in (1, 2) for e in range(1, 4)}
    for (ledger, e), data in stored.items():
        s.add_entry(ledger, e, data)
    buffered = sum(len(d.writer._buf) for d in s._dirs if d.writer is not None)
    fs.capacity = fs.used_bytes() + buffered  # the log buffer fits exactly; ledger 2's new index file does not
    with pytest.raises(OSError) as info:
        s.flush()
    assert is_no_space(info.value) and s.failure is None
    assert s.pending_index_entries() == len(stored), "the undone flush gave its slots back"
    assert all(s.get_entry(*k) == data for k, data in stored.items())
    fs.capacity = None
    s.flush()
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
            patch.setattr("bookie._bookie.write_mark", broken)
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
    its mount point, which also has room for another tenant's file); yields the mount."""
    if case == "ledgers":
        disk, names = tmpfs(root / "disk", (48 if SLOW else 24) * MIB), ("ledgers",)
    elif case == "journal":
        disk, names = tmpfs(root / "disk", 16 * MIB), ("journal",)
    else:  # journal and ledgers on one ext4 image on a loop device
        disk, names = loop_ext4(root / "disk", (64 if SLOW else 32) * MIB, root / "ext4.img"), ("journal", "ledgers")
    with disk as mnt:
        bookie0 = root / "cluster" / "bookie-0"
        bookie0.mkdir(parents=True)
        for name in names:
            (mnt / name).mkdir()
            (bookie0 / name).symlink_to(mnt / name)
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
