"""Manual recovery of a lost bookie (``walkit recover``, walkit/recovery, bookie/_replicate.py)
on real bookie processes, both metadata drivers: a bookie SIGKILLed and its disks wiped,
then recovered, then a second original member lost too - every acknowledged entry still
reads back; dry run, target, resume, a damaged replica skipped, an open ledger's live
fragment left to its writer (the ones behind it recovered), and the pure planning functions."""

from __future__ import annotations

import asyncio
import collections
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import walkit
from support.client import client, index_of, local_cluster
from support.metadata import Driver, driver  # noqa: F401  (fixture)
from walkit.client import BookieClient
from walkit.errors import WalkitError
from walkit.metadata import LedgerMetadata, LedgerState, connect
from walkit.protocol import encode_entry, master_key
from walkit.recovery import FragmentWork, held_by_writer, held_entries, lost_fragments, recover
from walkit.recovery._plan import choose_target, count_held, sources

pytestmark = pytest.mark.timeout(240)

Data = dict[tuple[int, int], bytes]


def _write(bk: walkit.BookKeeper, n_ledgers: int, entries: int, rng: random.Random) -> tuple[Data, dict[int, bytes]]:
    data: Data = {}
    passwords: dict[int, bytes] = {}
    for i in range(n_ledgers):
        password = b"pw-%d" % i
        lh = bk.create_ledger(3, 3, 2, password=password, digest="mac" if i % 2 else "crc32c")
        for e in range(entries):
            value = rng.randbytes(rng.randint(1, 600))
            lh.add_entry(value)
            data[(lh.ledger_id, e)] = value
        lh.close()
        passwords[lh.ledger_id] = password
    return data, passwords


def _lose(cluster: walkit.LocalCluster, i: int) -> str:
    """SIGKILL bookie ``i`` and wipe its directories: gone for good."""
    bookie = cluster.bookie_ids[i]
    cluster.kill_bookie(i)
    shutil.rmtree(cluster.data_dir / f"bookie-{i}")
    return bookie


def _all_metadata(uri: str) -> list[LedgerMetadata]:
    with connect(uri) as cluster:
        return [cluster.ledgers.read(lid)[0] for lid in cluster.ledgers.ledger_ids()]


def _copies(cluster: walkit.LocalCluster, meta: LedgerMetadata) -> dict[str, set[int]]:
    """For each bookie of the ledger's ensembles, the entries it holds (read straight from it)."""
    held: dict[str, set[int]] = {}

    async def go() -> None:
        for first, ensemble in meta.ensembles:
            for bookie in ensemble:
                client_ = await BookieClient.connect(*cluster.bookie_address(index_of(cluster, bookie)))
                try:
                    for e in range(first, meta.last_entry_id + 1):
                        try:
                            await client_.read_entry(meta.ledger_id, e)
                            held.setdefault(bookie, set()).add(e)
                        except WalkitError:
                            pass
                finally:
                    await client_.close()

    asyncio.run(go())
    return held


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "walkit.cli", *args], capture_output=True, text=True, timeout=180)


def test_a_lost_bookie_is_recovered_and_a_second_loss_loses_nothing(tmp_path: Path, driver: Driver) -> None:
    rng = random.Random(7)
    with local_cluster(tmp_path, driver, bookies=5, processes=True) as cluster, client(cluster) as bk:
        data, passwords = _write(bk, 8, 60, rng)
        with walkit.WriteAheadLog.open(cluster.metadata_uri, "recovered", ensemble_size=3, write_quorum=3,
                                       ack_quorum=2) as log:
            records = [log.append(b"record-%d" % i) for i in range(300)]
        # a bookie that holds fragments: placement is random, and a bookie may be in no
        # ensemble at all (CI once lost bookie 0 and found nothing to recover)
        lost = _lose(cluster, index_of(cluster, _all_metadata(cluster.metadata_uri)[0].ensembles[0][1][0]))
        dry = json.loads(_cli("recover", "--metadata", cluster.metadata_uri, "--bookie", lost, "--dry-run",
                              "--json").stdout)
        assert dry["dry_run"] and dry["fragments"] > 0 and dry["entries_copied"] == 0
        assert any(lost in ens for m in _all_metadata(cluster.metadata_uri) for _, ens in m.ensembles)
        done = _cli("recover", "--metadata", cluster.metadata_uri, "--bookie", lost, "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["fragments_replaced"] == dry["fragments"] and report["entries_copied"] == dry["entries"]
        assert report["failures"] == [] and report["open_ledgers"] == []
        for meta in _all_metadata(cluster.metadata_uri):
            assert all(lost not in ens for _, ens in meta.ensembles), meta
            if meta.ledger_id in passwords:  # every bookie of the write set holds its entries again
                held = _copies(cluster, meta)
                for e in range(meta.last_entry_id + 1):
                    for bookie in meta.write_set(e):
                        assert e in held.get(bookie, set()), (meta.ledger_id, e, bookie)
        again = recover(cluster.metadata_uri, lost)
        assert (again.fragments, again.entries_copied) == (0, 0)  # nothing left: resumable, idempotent
        second = next(i for i, b in enumerate(cluster.bookie_ids) if b != lost and cluster.is_running(i))
        _lose(cluster, second)
        for (ledger_id, e), value in data.items():
            if e == 0:
                rh = bk.open_ledger(ledger_id, password=passwords[ledger_id])
                got = [entry.data for entry in rh.read(0, rh.last_add_confirmed)]
                assert got == [data[(ledger_id, i)] for i in range(len(got))] and len(got) == 60
        with walkit.WriteAheadLog.open(cluster.metadata_uri, "recovered") as log:
            assert [lsn for lsn, _ in log.replay()] == records


def test_target_and_failures_are_reported(tmp_path: Path, driver: Driver) -> None:
    rng = random.Random(8)
    with local_cluster(tmp_path, driver, bookies=4, processes=True) as cluster, client(cluster) as bk:
        data, passwords = _write(bk, 3, 20, rng)
        metas = _all_metadata(cluster.metadata_uri)
        lost = metas[0].ensembles[0][1][0]
        outside = [b for b in cluster.bookie_ids if all(b not in ens for m in metas for _, ens in m.ensembles)]
        _lose(cluster, index_of(cluster, lost))
        inside = next(b for b in metas[0].ensembles[0][1] if b != lost)
        refused = _cli("recover", "--metadata", cluster.metadata_uri, "--bookie", lost, "--target", inside)
        assert refused.returncode == 1 and "FAILED ledger" in refused.stdout and "in the fragment's ensemble" in \
            refused.stdout
        if outside:
            report = recover(cluster.metadata_uri, lost, target=outside[0])
            assert report.failures == [] and set(report.targets) == {outside[0]}
        bad = _cli("recover", "--metadata", cluster.metadata_uri, "--bookie", lost, "--target", "nobody:1")
        assert bad.returncode == 2 and "not a registered writable bookie" in bad.stderr and "Traceback" not in bad.stderr


def test_a_damaged_replica_is_skipped_for_another(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=5, processes=True) as cluster, client(cluster) as bk:
        lh = bk.create_ledger(3, 3, 2, password=b"secret")
        values = [b"value-%d" % e for e in range(30)]
        for v in values:
            lh.add_entry(v)
        lh.close()
        meta = lh.metadata
        ensemble = meta.ensembles[0][1]
        lost, first_source = ensemble[0], ensemble[1]
        # entry 0's write set is the whole ensemble: put a copy whose digest fails on its first source
        good = encode_entry(meta.ledger_id, 0, -1, len(values[0]), values[0], digest="crc32c",
                            key=master_key(b"secret"))
        damaged = good[:-1] + bytes([good[-1] ^ 0xFF])

        async def damage() -> None:
            c = await BookieClient.connect(*cluster.bookie_address(index_of(cluster, first_source)))
            await c.add_entry(meta.ledger_id, 0, master_key(b"secret"), damaged, recovery=True)
            await c.close()

        asyncio.run(damage())
        _lose(cluster, index_of(cluster, lost))
        report = recover(cluster.metadata_uri, lost)
        assert report.failures == [] and report.entries_copied == count_held(lost_fragments(meta, lost)[0])
        target = next(iter(report.targets))

        async def read_target() -> bytes:
            c = await BookieClient.connect(*cluster.bookie_address(index_of(cluster, target)))
            try:
                return (await c.read_entry(meta.ledger_id, 0)).data
            finally:
                await c.close()

        assert asyncio.run(read_target()) == good  # the intact copy, bytes unchanged


def _readonly(cluster: walkit.LocalCluster, bookie: str) -> None:
    """Make a running bookie read-only (ADMIN ``bookie.readonly``): its adds fail, its data stays."""

    async def go() -> None:
        c = await BookieClient.connect(*cluster.bookie_address(index_of(cluster, bookie)))
        try:
            await c.admin("bookie.readonly", {"readonly": True})
        finally:
            await c.close()

    asyncio.run(go())


def _quiet(bk: walkit.BookKeeper, bookie: str, timeout: float = 10.0) -> None:
    """Until ``bookie`` answered every request of the client: an add completes at Qa acks,
    and the third one failing after a kill would make the idle writer change its ensemble
    (a failed bookie is replaced at once) - these tests lose a bookie the writer holds."""
    deadline = time.monotonic() + timeout
    client = bk.client._core.pool._clients.get(bookie)
    while client is not None and client.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)


def test_an_open_ledgers_live_fragment_is_left_to_its_writer_and_the_ones_behind_it_recovered(
        tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=5, processes=True) as cluster, client(cluster) as bk:
        lh = bk.create_ledger(3, 3, 2, password=b"w")
        for i in range(10):
            lh.add_entry(b"e%d" % i)
        lost = lh.metadata.ensembles[0][1][2]
        _quiet(bk, lost)
        _lose(cluster, index_of(cluster, lost))
        report = recover(cluster.metadata_uri, lost)  # its only fragment is the writer's
        assert report.open_ledgers == [lh.ledger_id] and report.fragments == 0
        assert _all_metadata(cluster.metadata_uri)[0].ensembles == lh.metadata.ensembles
        for i in range(10, 20):  # the writer goes on: its ensemble change replaces the lost bookie
            lh.add_entry(b"e%d" % i)
        assert lost in lh.metadata.ensembles[0][1] and lost not in lh.metadata.ensembles[-1][1]
        report = recover(cluster.metadata_uri, lost)  # the fragment behind the writer: replaced, ledger open
        assert report.open_ledgers == [] and report.fragments_replaced == 1 and report.failures == []
        (meta,) = _all_metadata(cluster.metadata_uri)
        assert meta.state is LedgerState.OPEN and not any(lost in ens for _, ens in meta.ensembles)
        _readonly(cluster, meta.ensembles[1][1][0])  # the writer changes its ensemble again, then closes
        for i in range(20, 30):
            lh.add_entry(b"e%d" % i)
        lh.close()
        (final,) = _all_metadata(cluster.metadata_uri)
        assert final.state is LedgerState.CLOSED and final.last_entry_id == 29 and len(final.ensembles) == 3
        assert final.ensembles[0] == meta.ensembles[0]  # the recovered fragment, kept by the writer
        rh = bk.open_ledger(lh.ledger_id, password=b"w")
        assert [e.data for e in rh.read(0, 29)] == [b"e%d" % i for i in range(30)]
        held = _copies(cluster, final)
        for e in range(final.ensembles[1][0]):  # the recovered fragment has all its copies
            assert all(e in held[b] for b in final.write_set(e)), e


def test_a_recovery_stopped_halfway_finishes_without_redoing_replaced_fragments(tmp_path: Path,
                                                                                driver: Driver) -> None:
    rng = random.Random(9)
    with local_cluster(tmp_path, driver, bookies=5, processes=True) as cluster, client(cluster) as bk:
        _write(bk, 6, 10, rng)
        # the bookie in the most ensembles (placement is random: bookie 0 may hold one fragment only)
        held = collections.Counter(b for m in _all_metadata(cluster.metadata_uri) for _, ens in m.ensembles
                                   for b in ens)
        lost = _lose(cluster, index_of(cluster, held.most_common(1)[0][0]))
        total = recover(cluster.metadata_uri, lost, dry_run=True).fragments
        assert total >= 4, total  # 6 ensembles of 3 of 5 bookies: the busiest is in at least 4

        class Stop(Exception):
            pass

        class StopAfterTwo:
            def __init__(self) -> None:
                self.fragments = 0

            def start(self, fragments: int, entries: int) -> None:
                return None

            def advance(self, fragments: int, entries: int) -> None:
                self.fragments += fragments
                if self.fragments == 2:
                    raise Stop()

        with pytest.raises(Stop):
            recover(cluster.metadata_uri, lost, progress=StopAfterTwo())
        rest = recover(cluster.metadata_uri, lost)
        assert rest.fragments == total - 2 and rest.fragments_replaced == total - 2 and rest.failures == []
        assert all(lost not in ens for m in _all_metadata(cluster.metadata_uri) for _, ens in m.ensembles)


# --- planning (pure) -------------------------------------------------------------------------------------------
def _meta(ensembles: tuple[tuple[int, tuple[str, ...]], ...], last: int, e: int = 3, qw: int = 2) -> LedgerMetadata:
    meta = LedgerMetadata.create(1, ensembles[0][1], write_quorum=qw, ack_quorum=qw, password=b"", ctime=0)
    for first, bookies in ensembles[1:]:
        meta = meta.with_ensemble(first, bookies)
    return meta.closed(last, 0) if last >= -1 else meta


def test_held_entries_follow_striping() -> None:
    meta = _meta(((0, ("a", "b", "c")), (6, ("a", "d", "c"))), 11)
    works = lost_fragments(meta, "b")
    assert [(w.first, w.last, w.position) for w in works] == [(0, 5, 1)]
    # E=3, Qw=2: entry e is on ensemble[e % 3] and ensemble[(e + 1) % 3]; b (position 1) holds e % 3 in (0, 1)
    assert list(held_entries(works[0])) == [0, 1, 3, 4] and count_held(works[0]) == 4
    assert sources(works[0], 0) == ["a"] and sources(works[0], 1) == ["c"]
    (a1, a2) = lost_fragments(meta, "a")
    assert (a1.first, a1.last, a2.first, a2.last) == (0, 5, 6, 11)
    for w in (a1, a2):
        assert count_held(w) == len(list(held_entries(w)))
    assert lost_fragments(_meta(((0, ("a", "b", "c")),), -2), "a") == []  # open: left to its writer
    assert held_by_writer(_meta(((0, ("a", "b", "c")),), -2), "a")
    two = _meta(((0, ("a", "b", "c")), (6, ("a", "d", "c"))), -2)  # open, a fragment behind the writer's
    assert [(w.first, w.last) for w in lost_fragments(two, "b")] == [(0, 5)] and not held_by_writer(two, "b")
    assert [(w.first, w.last) for w in lost_fragments(two, "a")] == [(0, 5)] and held_by_writer(two, "a")
    assert not held_by_writer(meta, "a")  # closed
    empty = lost_fragments(_meta(((0, ("a", "b", "c")),), -1), "a")
    assert [list(held_entries(w)) for w in empty] == [[]]


def test_choose_target() -> None:
    meta = _meta(((0, ("a", "b", "c")), (6, ("a", "d", "c"))), 11)
    work: FragmentWork = lost_fragments(meta, "b")[0]
    rng = random.Random(1)
    assert choose_target(work, meta, ["a", "c", "d", "e"], rng=rng) == "e"  # in no fragment: preferred
    assert choose_target(work, meta, ["a", "c", "d"], rng=rng) == "d"  # in another fragment only: allowed
    with pytest.raises(WalkitError):
        choose_target(work, meta, ["a", "c"], rng=rng)
    with pytest.raises(WalkitError):
        choose_target(work, meta, ["a", "c", "d"], wanted="c")
    assert choose_target(work, meta, [], wanted="z") == "z"
    assert LedgerState.CLOSED is meta.state


def test_decommission_moves_everything_off_a_running_bookie(tmp_path: Path, driver: Driver) -> None:
    rng = random.Random(10)
    with local_cluster(tmp_path, driver, bookies=5, processes=True) as cluster, client(cluster) as bk:
        data, passwords = _write(bk, 5, 40, rng)
        leaving = _all_metadata(cluster.metadata_uri)[0].ensembles[0][1][0]
        i = index_of(cluster, leaving)
        open_one = bk.create_ledger(3, 3, 2, password=b"open")
        open_one.add_entry(b"x")
        named_open = leaving in open_one.metadata.ensembles[0][1]
        first = _cli("decommission", "--metadata", cluster.metadata_uri, "--bookie", leaving)
        with connect(cluster.metadata_uri) as md:
            assert leaving in md.bookies().readonly  # no new ensemble picks it
        assert all(leaving not in ens for m in _all_metadata(cluster.metadata_uri)
                   if m.state is LedgerState.CLOSED for _, ens in m.ensembles)
        if named_open:
            assert first.returncode == 1 and "still needed" in first.stdout
        open_one.close()
        final = _cli("decommission", "--metadata", cluster.metadata_uri, "--bookie", leaving)
        assert final.returncode == 0 and "can now be stopped and removed" in final.stdout, final.stdout + final.stderr
        _lose(cluster, i)  # gone: nothing was lost with it
        for ledger_id, password in passwords.items():
            rh = bk.open_ledger(ledger_id, password=password)
            assert [e.data for e in rh.read(0, 39)] == [data[(ledger_id, e)] for e in range(40)]
        stopped = _cli("decommission", "--metadata", cluster.metadata_uri, "--bookie", leaving)
        # a clear refusal either way: its registration gone ("not running") or still there for a
        # session timeout (it cannot be reached)
        assert stopped.returncode == 2 and "Traceback" not in stopped.stderr
        assert "not running" in stopped.stderr or "cannot connect to bookie" in stopped.stderr
