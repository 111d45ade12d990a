"""Recycled journal files: retired journals are reused for new ids, so appends overwrite
written blocks. The earlier life's bytes stay behind the new tail; replay must end there
quietly (no torn tail, no corruption), and power cuts at any point must lose nothing
acknowledged and invent nothing."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from bookie.fs import read_all
from bookie.fs.mem import MemFS, PowerLoss
from bookie.journal import GroupCommitPolicy, Journal, JournalConfig, JournalHeader, replay
from support.journal import Recorder
from walkit.errors import CorruptionError, WalkitError

KIB = 1024
D = "/j"


def config(**kw: Any) -> JournalConfig:
    base: dict[str, Any] = dict(max_size=64 * KIB, prealloc_size=16 * KIB, buffer_size=16 * KIB, max_backups=0, recycle_files=2)
    base.update(kw)
    return JournalConfig(D, policy=GroupCommitPolicy(flush_when_queue_empty=True), **base)


def write_and_wait(j: Journal, ledger: int, first: int, count: int, size: int = 3000) -> list[tuple[int, int, bytes]]:
    """Add entries one batch at a time (each waits for its ack); return what was written."""
    done = threading.Semaphore(0)
    out = []
    for e in range(first, first + count):
        data = random.Random(e).randbytes(size)
        j.log_entry(ledger, e, data, lambda err, ctx: done.release(), None)
        assert done.acquire(timeout=10), "an entry was never acknowledged"
        out.append((ledger, e, data))
    return out


def entries(fs: MemFS, mark: Any = None) -> list[tuple[int, int, bytes]]:
    target = Recorder()
    report = replay(fs, D, mark, target)
    assert not report.torn, f"a recycled file's old bytes were taken for a torn tail: {report.torn}"
    return [(r[1], r[2], r[3]) for r in target.records if r[0] == "entry"]


def test_retired_files_are_reused_and_their_old_bytes_ignored() -> None:
    fs = MemFS()
    j = Journal(fs, config())
    j.start()
    written = write_and_wait(j, 1, 0, 60)  # ~180 KiB: several 64 KiB files
    assert j.stats.rolls >= 2
    mark = j.last_mark()
    j.gc(mark)
    names = fs.listdir(D)
    free = [n for n in names if n.endswith(".txn.free")]
    assert len(free) == 2, f"expected 2 recycled files (recycle_files=2), found {names}"
    later = write_and_wait(j, 1, 60, 30)  # rolls into the free files
    j.shutdown()
    live = sorted(n for n in fs.listdir(D) if n.endswith(".txn"))
    headers = {n: JournalHeader.decode(read_all(fs, f"{D}/{n}")[:64]) for n in live}
    recycled = [h for h in headers.values() if h.previous_id]
    assert recycled, f"no journal was recycled: {headers}"
    assert all(h.previous_id < h.journal_id for h in recycled)
    assert entries(fs, mark) == later, "replay from the mark differs from what was written after it"
    assert written[-1] not in entries(fs, mark)


def test_a_restart_after_recycling_replays_cleanly_twice() -> None:
    fs = MemFS()
    j = Journal(fs, config())
    j.start()
    write_and_wait(j, 1, 0, 40)
    mark = j.last_mark()
    j.gc(mark)
    later = write_and_wait(j, 2, 0, 40)
    j.shutdown()
    assert entries(fs, mark) == later
    assert entries(fs, mark) == later, "a second replay differs: the first one changed the files"
    j2 = Journal(fs, config())
    j2.start()
    more = write_and_wait(j2, 3, 0, 5)
    j2.shutdown()
    assert entries(fs, mark) == later + more


def test_crash_between_rename_and_header_rewrite_is_not_corruption() -> None:
    """The free file got its new name but still carries its old header and frames."""
    fs = MemFS()
    j = Journal(fs, config())
    j.start()
    write_and_wait(j, 1, 0, 40)
    mark = j.last_mark()
    j.gc(mark)
    j.shutdown()
    free = sorted(n for n in fs.listdir(D) if n.endswith(".free"))
    last = max(int(n[:16], 16) for n in fs.listdir(D) if n.endswith(".txn"))
    fs.rename(f"{D}/{free[0]}", f"{D}/{last + 1:016x}.txn")
    target = Recorder()
    report = replay(fs, D, mark, target)  # must not raise CorruptionError
    assert [t.journal_id for t in report.torn] == [last + 1], "the renamed file's old life must be dropped as torn"
    assert all(r[0] != "entry" or r[1] != 1 or r[2] < 40 for r in target.records)


@pytest.mark.parametrize("seed", range(120))
def test_power_cuts_with_recycling(seed: int) -> None:
    rng = random.Random(seed)
    fs = MemFS()
    acked: dict[tuple[int, int], bytes] = {}
    submitted: dict[tuple[int, int], bytes] = {}
    retired: set[tuple[int, int]] = set()  # acked before a gc: a bookie has them in ledger storage
    lock = threading.Lock()
    next_entry = 0
    for generation in range(3):
        j = Journal(fs, config(max_size=rng.choice([24, 48, 96]) * KIB, recycle_files=rng.choice([1, 2, 3])))
        try:
            j.start()
        except PowerLoss:
            fs.crash(rng)
            continue
        fs.arm_crash(after_ops=rng.randint(5, 120))

        def ack(err: BaseException | None, key: tuple[int, int]) -> None:
            if err is None:
                with lock:
                    acked[key] = submitted[key]

        try:
            for _ in range(rng.randint(20, 200)):
                key = (rng.randint(1, 3), next_entry)
                next_entry += 1
                submitted[key] = rng.randbytes(rng.choice([10, 500, 3000, 9000]))
                j.log_entry(key[0], key[1], submitted[key], ack, key)
                if rng.random() < 0.05:
                    mark = j.last_mark()  # read the mark first: what is acked by now lies before it
                    with lock:
                        retired.update(acked)
                    j.gc(mark)
        except (WalkitError, OSError):
            pass
        j.shutdown()
        fs.crash(rng)
        target = Recorder()
        try:
            replay(fs, "/j", None, target)
        except CorruptionError as exc:  # pragma: no cover - the failure being tested for
            pytest.fail(f"seed={seed} generation={generation}: power cut read as corruption: {exc}")
        got = {(r[1], r[2]): r[3] for r in target.records if r[0] == "entry"}
        for key, data in got.items():
            assert submitted.get(key) == data, f"seed={seed}: replay invented or garbled entry {key}"
        lost = [k for k in acked if k not in got and k not in retired]
        assert not lost, f"seed={seed} generation={generation}: acknowledged entries lost: {lost[:5]}"


def test_a_new_journal_id_is_above_the_free_files_ids() -> None:
    """Every journal retired (two kept free): the next journal must not take the id -
    and so the CRC seed - of a free file's earlier life."""
    fs = MemFS()
    j = Journal(fs, config())
    j.start()
    write_and_wait(j, 1, 0, 40)
    j.shutdown()
    j.gc(type(j.last_mark())(j.current_journal_id + 1, 0))
    assert not [n for n in fs.listdir(D) if n.endswith(".txn")], fs.listdir(D)
    free_ids = sorted(int(n[:16], 16) for n in fs.listdir(D) if n.endswith(".free"))
    j2 = Journal(fs, config())
    j2.start()
    assert j2.current_journal_id > max(free_ids)
    later = write_and_wait(j2, 2, 0, 5)
    j2.shutdown()
    assert entries(fs) == later, "replay read frames of a free file's earlier life"


def test_a_recycled_file_with_nothing_written_yet_ends_cleanly() -> None:
    """A roll into a recycled file right before shutdown: its new life is empty, and the
    earlier life's bytes right after the header must not read as a torn tail."""
    fs = MemFS()
    j = Journal(fs, config(max_size=16 * KIB))  # a header + 3 one-entry batches per file
    j.start()
    write_and_wait(j, 1, 0, 3)
    wait_for_journal(j, 2)
    j.gc(j.last_mark())  # journal 1 becomes a free file
    write_and_wait(j, 1, 3, 3)  # fills journal 2; the roll takes the free file
    wait_for_journal(j, 3)
    j.shutdown()  # nothing was written into journal 3's new life
    header = JournalHeader.decode(read_all(fs, f"{D}/{j.current_journal_id:016x}.txn")[:64])
    assert header.previous_id == 1, f"the test did not roll into the recycled file: {header}"
    report = replay(fs, D, None, Recorder())
    assert not report.torn, f"an empty recycled life was taken for a torn tail: {report.torn}"


def wait_for_journal(j: Journal, journal_id: int) -> None:
    deadline = time.monotonic() + 5
    while j.current_journal_id != journal_id:
        assert time.monotonic() < deadline, f"journal {journal_id} was never opened (at {j.current_journal_id})"
        time.sleep(0.001)
