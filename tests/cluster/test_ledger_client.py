"""The ledger client (walkit.BookKeeper) on an in-process LocalCluster, on both metadata
drivers: quorum writes, striping, digests, ensemble change, fencing and recovery, reads
and tailing (issue 5)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import walkit
from support.client import FAST, client, hang_single_reads, index_of, local_cluster, raw_add, stored_on
from support.metadata import Driver, driver, wait_for  # noqa: F401  (fixture)
from walkit.errors import (
    DigestMismatchError,
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    UnauthorizedError,
)
from walkit.client._bookie_client import BookieClient
from walkit.client._read import LedgerReader
from walkit.metadata import LedgerState

pytestmark = pytest.mark.timeout(120)


def test_create_add_read_close_delete(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver) as cluster, client(cluster) as bk:
        lh = bk.create_ledger(custom_metadata={"app": b"kv"})
        assert lh.metadata.state is LedgerState.OPEN and len(lh.metadata.ensembles[0][1]) == 3
        assert [lh.add_entry(b"entry-%d" % i) for i in range(20)] == list(range(20))
        assert lh.last_add_confirmed == 19
        assert [e.data for e in lh.read(5, 7)] == [b"entry-5", b"entry-6", b"entry-7"]
        lh.close()
        meta = bk.ledger_metadata(lh.ledger_id)
        assert meta.state is LedgerState.CLOSED and meta.last_entry_id == 19
        assert meta.length == sum(len(b"entry-%d" % i) for i in range(20)) == lh.length
        assert meta.custom == {"app": b"kv"}
        with pytest.raises(LedgerClosedError):
            lh.add_entry(b"after close")
        rh = bk.open_ledger(lh.ledger_id)
        assert rh.is_closed and rh.last_add_confirmed == 19 and rh.length == meta.length
        assert [(e.ledger_id, e.entry_id, e.data) for e in rh.read(0, 19)] == [
            (lh.ledger_id, i, b"entry-%d" % i) for i in range(20)]
        with pytest.raises(NoSuchEntryError):
            list(rh.read(19, 20))
        with pytest.raises(InvalidArgumentError):
            list(rh.read(3, 2))
        assert lh.ledger_id in list(bk.list_ledgers())
        bk.delete_ledger(lh.ledger_id)
        assert lh.ledger_id not in list(bk.list_ledgers())
        with pytest.raises(NoSuchLedgerError):
            bk.open_ledger(lh.ledger_id)
        with pytest.raises(NoSuchLedgerError):
            bk.delete_ledger(lh.ledger_id)


def test_a_create_with_the_bookies_known_runs_on_the_callers_thread(tmp_path: Path, driver: Driver,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the bookie list is watched and the chosen bookies' endpoints are known, the
    sync create goes neither through the client's loop nor a metadata thread; otherwise
    (a stale list) it does, as before; either way the writer is one the client's close
    fails, and it writes."""
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        first = bk.create_ledger(3, 3, 2)  # reads the list, learns the endpoints: through the loop
        first.add_entry(b"a")
        hops: list[object] = []
        real_run = bk.client.run
        monkeypatch.setattr(bk.client, "run", lambda coro: hops.append(coro) or real_run(coro))
        fast = bk.create_ledger(3, 3, 2, password=b"pw")
        assert hops == [] and fast.add_entry(b"b") == 0
        assert fast.ledger_id in set(bk.list_ledgers())
        bk.client._core._writable_at -= 3600  # a stale list: read again, on the loop
        slow = bk.create_ledger(3, 3, 2)
        assert len(hops) == 1 and slow.add_entry(b"c") == 0
        assert fast._writer in set(bk.client._core.writers) and slow._writer in set(bk.client._core.writers)
        with pytest.raises(InvalidArgumentError):
            bk.create_ledger(2, 3, 2)  # checked before anything is chosen
        for handle in (first, fast, slow):
            handle.close()


def test_bad_arguments_are_refused_clearly(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        for e, qw, qa in ((3, 4, 2), (3, 2, 3), (3, 3, 0), (0, 0, 0)):
            with pytest.raises(InvalidArgumentError):
                bk.create_ledger(e, qw, qa)
        with pytest.raises(InvalidArgumentError):
            bk.create_ledger(digest="md5")
        with pytest.raises(NotEnoughBookiesError) as caught:
            bk.create_ledger(4, 3, 2)
        message = str(caught.value)  # what the ledger needs, what is writable, and what to do
        assert "\n" not in message and "for a new ledger; start more bookies" in message
        assert "e.g. ensemble_size=2, write_quorum=2, ack_quorum=2" in message
        assert "(ensemble_size=4 write_quorum=3 ack_quorum=2 needed=4 writable=3)" in message
        with pytest.raises(InvalidArgumentError):
            walkit.BookKeeper(cluster.metadata_uri, no_such_option=1)
        lh = bk.create_ledger()
        with pytest.raises(InvalidArgumentError):
            lh.add_entry("text")  # type: ignore[arg-type]
        with pytest.raises(walkit.errors.EntryTooLargeError):
            lh.add_entry(b"x" * (6 << 20))
        largest = bk.config.max_frame_size - 256 - 32 - 4  # frame overhead, entry header, CRC32C
        with pytest.raises(walkit.errors.EntryTooLargeError):
            lh.add_entry_async(b"x" * (largest + 1))
        with pytest.raises(walkit.errors.EntryTooLargeError):
            lh.add_entry_async(bytearray(largest + 1))
        assert lh.add_entry(b"still fine") == 0
        assert lh.add_entry(b"x" * largest) == 1 and lh.add_entry(memoryview(b"y")) == 2


def test_pipelined_adds_complete_in_order_from_many_threads(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver) as cluster, client(cluster) as bk:
        lh = bk.create_ledger()
        order: list[int] = []
        futures = []
        lock = threading.Lock()

        def writer(t: int) -> None:
            for i in range(200):
                with lock:  # ids follow submission order; record it with the data
                    fut = lh.add_entry_async(b"t%d-%d" % (t, i))
                    futures.append((fut, b"t%d-%d" % (t, i)))
                    # (under the lock: added to a future already done, it runs at once)
                    fut.add_done_callback(lambda f: order.append(f.result()))

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ids = [f.result(timeout=30) for f, _ in futures]
        assert sorted(ids) == list(range(800))
        assert order == list(range(800))  # completions come in entry order
        data = {e.entry_id: e.data for e in lh.read(0, 799)}
        assert all(data[f.result()] == payload for f, payload in futures)


def test_many_threads_writing_round_robin_over_many_ledgers_lose_no_add(tmp_path: Path, driver: Driver) -> None:
    """The hand-offs a writer of many ledgers takes without a lock (walkit/client/
    _add_queue.py, ClientCore.schedule, Slots.give_back): 8 threads write round-robin over
    60 ledgers, each ledger's window 4 adds (so takers wait for slots the loop gives back
    while others schedule writers the loop is taking). Every add completes, each ledger's
    in entry order, and every entry reads back as written."""
    threads, ledgers, per_thread = 8, 60, 600
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster, max_pending_adds=4) as bk:
        handles = [bk.create_ledger(3, 3, 2) for _ in range(ledgers)]
        sent: list[list[tuple[Any, bytes]]] = [[] for _ in range(ledgers)]
        locks = [threading.Lock() for _ in range(ledgers)]
        done: list[list[int]] = [[] for _ in range(ledgers)]

        def writer(t: int) -> None:
            for i in range(per_thread):
                k = (t * 7 + i) % ledgers
                payload = b"t%d-%d" % (t, i)
                with locks[k]:  # a ledger's ids follow its submission order: record it with the data
                    fut = handles[k].add_entry_async(payload)
                    sent[k].append((fut, payload))
                    # under the lock: a callback added to a future already done runs here and
                    # now, so added after the next add's it could record the two swapped
                    fut.add_done_callback(lambda f, k=k: done[k].append(f.result()))

        workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        assert not any(w.is_alive() for w in workers)
        for k, lh in enumerate(handles):
            ids = [f.result(timeout=60) for f, _ in sent[k]]
            assert ids == list(range(len(ids)))
            assert done[k] == ids  # completions in entry order
            assert [e.data for e in lh.read(0, len(ids) - 1)] == [p for _, p in sent[k]]
        assert sum(len(s) for s in sent) == threads * per_thread


def test_striping_puts_each_entry_on_its_write_set(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=5) as cluster, client(cluster) as bk:
        lh = bk.create_ledger(ensemble_size=5, write_quorum=3, ack_quorum=2)
        for i in range(10):
            lh.add_entry(b"%d" % i)
        # pipelined: the loop takes them in batches, sent one call per bookie (walkit/client/_add_batch.py)
        assert [f.result(timeout=30) for f in [lh.add_entry_async(b"%d" % i) for i in range(10, 300)]] \
            == list(range(10, 300))
        lh.close()
        ensemble = lh.metadata.ensembles[0][1]
        for i in range(300):
            expected = {ensemble[(i + k) % 5] for k in range(3)}
            holders = {b for b in ensemble if stored_on(cluster, b, lh.ledger_id, i)}
            assert holders == expected, i
        assert [e.data for e in bk.open_ledger(lh.ledger_id).read(0, 299)] == [b"%d" % i for i in range(300)]


@pytest.mark.parametrize("digest", ["crc32c", "mac", "none"])
def test_digests_and_passwords(tmp_path: Path, driver: Driver, digest: str) -> None:
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        lh = bk.create_ledger(digest=digest, password=b"secret")
        for i in range(5):
            lh.add_entry(b"d%d" % i)
        lh.close()
        with pytest.raises(UnauthorizedError):
            bk.open_ledger(lh.ledger_id, password=b"wrong")
        rh = bk.open_ledger(lh.ledger_id, password=b"secret")
        assert [e.data for e in rh.read(0, 4)] == [b"d%d" % i for i in range(5)]


def _corrupt_reads(cluster: walkit.LocalCluster, bookie_id: str) -> None:
    """Make an in-process bookie return its entries (READ_ENTRY and READ_RANGE) with one
    payload byte flipped."""
    cluster.server(index_of(cluster, bookie_id)).hooks.read = lambda ledger, entry, data: data[:-1] + bytes(
        [data[-1] ^ 0xFF])


def test_a_corrupting_bookie_is_skipped_and_all_corrupt_is_an_error(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        lh = bk.create_ledger()
        for i in range(10):
            lh.add_entry(b"payload-%d" % i)
        lh.close()
        ensemble = lh.metadata.ensembles[0][1]
        _corrupt_reads(cluster, ensemble[0])
        _corrupt_reads(cluster, ensemble[1])
        rh = bk.open_ledger(lh.ledger_id)
        assert [e.data for e in rh.read(0, 9)] == [b"payload-%d" % i for i in range(10)]
        _corrupt_reads(cluster, ensemble[2])
        with pytest.raises(DigestMismatchError):
            list(rh.read(0, 0))


def test_speculative_read_goes_to_the_next_replica(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster, read_timeout=30.0) as bk:
        lh = bk.create_ledger(3, 2, 2)  # striped: read entry by entry
        lh.add_entry(b"zero")
        lh.close()
        release = threading.Event()
        hang_single_reads(cluster, lh.metadata.write_set(0)[0], release)  # only the first replica hangs
        try:
            rh = bk.open_ledger(lh.ledger_id)
            assert [e.data for e in rh.read(0, 0)] == [b"zero"]
            assert not release.is_set()  # answered while the first replica still hangs
        finally:
            release.set()


def test_killed_bookie_during_writes_changes_the_ensemble_and_loses_nothing(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=4) as cluster, client(cluster) as bk:
        lh = bk.create_ledger()
        victim = lh.metadata.ensembles[0][1][1]
        futures = [lh.add_entry_async(b"a%d" % i) for i in range(300)]
        futures[100].result(timeout=30)
        cluster.kill_bookie(index_of(cluster, victim))
        futures += [lh.add_entry_async(b"a%d" % i) for i in range(300, 600)]
        assert [f.result(timeout=60) for f in futures] == list(range(600))
        wait_for(lambda: lh.ensemble_changes >= 1, 10)  # Qa acks need not wait for the change
        last = lh.metadata.ensembles[-1]
        assert victim not in last[1] and len(lh.metadata.ensembles) >= 2 and last[0] <= 600
        assert lh.add_entry(b"a600") == 600  # after the change: on the new ensemble
        lh.close()
        rh = bk.open_ledger(lh.ledger_id)
        assert [e.data for e in rh.read(0, 600)] == [b"a%d" % i for i in range(601)]
        replacement = next(b for b in last[1] if b not in lh.metadata.ensembles[0][1])
        assert stored_on(cluster, replacement, lh.ledger_id, 600)


class _SlowUpdates:
    """A client's ledger manager whose compare-and-sets take ``delay`` seconds more, and
    run ``before(ledger_id, change)`` first (the test's own metadata change landing
    just before the client's)."""

    def __init__(self, inner: Any, delay: float = 0.0, before: Any = None) -> None:
        self._inner, self.delay, self.before = inner, delay, before

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def update(self, ledger_id: int, change: Any) -> Any:
        time.sleep(self.delay)
        if self.before is not None:
            self.before(ledger_id, change)
        return self._inner.update(ledger_id, change)


def test_adds_acknowledged_during_an_ensemble_change_reach_the_replacement(tmp_path: Path, driver: Driver) -> None:
    # The change's metadata write is slow: adds keep reaching Qa on the two survivors while it runs.
    # Each entry of the new fragment must still go to the replacement before it completes.
    with local_cluster(tmp_path, driver, bookies=4) as cluster, client(cluster) as bk:
        lh = bk.create_ledger(3, 3, 2)
        core = bk.client._core
        core.ledgers = _SlowUpdates(core.ledgers, delay=0.5)
        victim = lh.metadata.ensembles[0][1][0]
        futures = [lh.add_entry_async(b"a%d" % i) for i in range(200)]
        futures[50].result(timeout=30)
        cluster.kill_bookie(index_of(cluster, victim))
        deadline = time.monotonic() + 30
        while lh.ensemble_changes == 0 and time.monotonic() < deadline:  # adds all through the change
            futures += [lh.add_entry_async(b"a%d" % i) for i in range(len(futures), len(futures) + 20)]
            time.sleep(0.002)
        futures += [lh.add_entry_async(b"a%d" % i) for i in range(len(futures), len(futures) + 100)]
        n = len(futures)
        assert [f.result(timeout=60) for f in futures] == list(range(n))
        lh.close()
        first, ensemble = lh.metadata.ensembles[-1]
        assert victim not in ensemble and first < n - 100
        (replacement,) = set(ensemble) - set(lh.metadata.ensembles[0][1])
        assert [e for e in range(first, n) if not stored_on(cluster, replacement, lh.ledger_id, e)] == []


def test_the_writer_keeps_an_earlier_fragment_re_replicated_under_it(tmp_path: Path, driver: Driver) -> None:
    # Re-replication (walkit.recovery) puts another bookie into a fragment behind the writer's:
    # the writer's next ensemble change and its close accept that and keep it; a change to
    # its own (last) fragment is still refused.
    with local_cluster(tmp_path, driver, bookies=6) as cluster, client(cluster) as bk:
        lh = bk.create_ledger(3, 3, 2)
        for i in range(10):
            lh.add_entry(b"e%d" % i)
        first_ensemble = lh.metadata.ensembles[0][1]
        cluster.kill_bookie(index_of(cluster, first_ensemble[0]))
        for i in range(10, 20):
            lh.add_entry(b"e%d" % i)
        wait_for(lambda: len(lh.metadata.ensembles) == 2, 10)
        live = lh.metadata.ensembles[1][1]
        spare = next(b for b in cluster.bookie_ids if b not in first_ensemble and b not in live)
        md = bk.client._core.ledgers
        md.update(lh.ledger_id, lambda m: m.replace_bookie(0, first_ensemble[0], spare))  # as recovery would
        # Entries in the second fragment before the next kill: the first failure may be
        # noticed only once entries 10-19 were acknowledged by the other two (a loaded
        # machine), and then the second fragment starts at entry 20 - a change with
        # nothing written in that fragment yet would replace it rather than add a third
        for i in range(20, 25):
            lh.add_entry(b"e%d" % i)
        cluster.kill_bookie(index_of(cluster, live[1]))
        for i in range(25, 35):
            lh.add_entry(b"e%d" % i)
        wait_for(lambda: len(lh.metadata.ensembles) == 3, 10)
        lh.close()
        meta = bk.ledger_metadata(lh.ledger_id)
        assert meta.state is LedgerState.CLOSED and meta.last_entry_id == 34
        assert meta.ensembles[0] == (0, (spare, *first_ensemble[1:])) and meta.ensembles[1][1] == live
        lh2 = bk.create_ledger(3, 3, 2)
        lh2.add_entry(b"x")
        own = lh2.metadata.ensembles[0][1]
        other = next(b for b in cluster.bookie_ids if b not in own and cluster.bookie_ids.index(b) not in
                     (index_of(cluster, first_ensemble[0]), index_of(cluster, live[1])))
        md.update(lh2.ledger_id, lambda m: m.replace_bookie(0, own[0], other))  # the writer's own fragment
        with pytest.raises(walkit.errors.MetadataVersionError):
            lh2.close()


def test_a_recoverer_keeps_an_earlier_fragment_re_replicated_while_it_recovered(tmp_path: Path,
                                                                                driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=5) as cluster:
        with client(cluster) as writer_bk:
            lh = writer_bk.create_ledger(3, 3, 2, password=b"r")
            for i in range(10):
                lh.add_entry(b"e%d" % i)
            first_ensemble = lh.metadata.ensembles[0][1]
            cluster.kill_bookie(index_of(cluster, first_ensemble[2]))
            for i in range(10, 20):
                lh.add_entry(b"e%d" % i)
            wait_for(lambda: len(lh.metadata.ensembles) == 2, 10)
            live = lh.metadata.ensembles[1][1]
        # the writer is gone (its client closed without closing the ledger)
        spare = next(b for b in cluster.bookie_ids if b not in first_ensemble and b not in live)
        with client(cluster) as bk:
            core = bk.client._core
            landed: list[bool] = []

            def replace_first(ledger_id: int, change: Any) -> None:
                meta, _ = slow._inner.read(ledger_id)
                if meta.state is LedgerState.IN_RECOVERY and not landed:
                    slow._inner.update(ledger_id, lambda m: m.replace_bookie(0, first_ensemble[2], spare))
                    landed.append(True)

            slow = core.ledgers = _SlowUpdates(core.ledgers, before=replace_first)
            rh = bk.open_ledger(lh.ledger_id, password=b"r")
            assert landed and rh.is_closed and rh.last_add_confirmed == 19
            meta = bk.ledger_metadata(lh.ledger_id)
            assert meta.ensembles == ((0, (first_ensemble[0], first_ensemble[1], spare)), (meta.ensembles[1][0], live))


def test_read_only_bookie_is_replaced(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=4) as cluster, client(cluster) as bk:
        lh = bk.create_ledger()
        lh.add_entry(b"before")
        victim = lh.metadata.ensembles[0][1][0]
        cluster.set_read_only(index_of(cluster, victim))
        assert [lh.add_entry(b"after-%d" % i) for i in range(5)] == [1, 2, 3, 4, 5]
        wait_for(lambda: victim not in lh.metadata.ensembles[-1][1], 10)  # Qa acks need not wait for it
        lh.close()
        assert [e.data for e in bk.open_ledger(lh.ledger_id).read(0, 1)] == [b"before", b"after-0"]


def test_not_enough_bookies_fails_the_writer(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        lh = bk.create_ledger()
        assert lh.add_entry(b"ok") == 0
        cluster.kill_bookie(0)
        confirmed = 0
        ensemble = lh.metadata.ensembles[-1][1]
        with pytest.raises(NotEnoughBookiesError) as caught:
            for i in range(1, 1000):  # an add may still reach Qa before the failed change
                confirmed = lh.add_entry(b"%d" % i)
                time.sleep(0.01)
        message = str(caught.value)  # one line: needs, writable, who is left out and why, the remedy
        survivors = ",".join(b for b in ensemble if b != cluster.bookie_ids[0])
        assert "\n" not in message and message.startswith(
            "not enough writable bookies outside the ledger's ensemble to replace its failed bookie; "
            "start more bookies (a cluster of ensemble_size + 1 = 4 lets a ledger lose one and keep writing) "
            "or use a smaller ensemble, e.g. ensemble_size=2, write_quorum=2, ack_quorum=2 (")
        assert message.endswith(f"(ledger={lh.ledger_id} ensemble_size=3 write_quorum=3 ack_quorum=2 needed=1 "
                                f"writable=2 in_ensemble={survivors} failed={cluster.bookie_ids[0]})")
        depths = []
        for _ in range(3):  # the same error each time, its traceback not growing with each raise
            with pytest.raises(NotEnoughBookiesError) as again:
                lh.add_entry(b"writer is done")
            assert again.value is caught.value
            depths.append(len(traceback.extract_tb(again.value.__traceback__)))
        assert depths[0] == depths[1] == depths[2] <= 3, depths
        lh.close()  # the ledger is closed at what was confirmed
        meta = bk.ledger_metadata(lh.ledger_id)
        assert meta.state is LedgerState.CLOSED and meta.last_entry_id == confirmed


def test_recovery_fences_the_writer_and_keeps_every_acknowledged_entry(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver) as cluster, client(cluster) as writer_bk, client(cluster) as bk:
        lh = writer_bk.create_ledger(password=b"pw")
        acked = [lh.add_entry(b"w%d" % i) for i in range(50)]
        in_flight = [lh.add_entry_async(b"w%d" % i) for i in range(50, 80)]
        rh = bk.open_ledger(lh.ledger_id, password=b"pw")
        assert rh.is_closed and rh.last_add_confirmed >= acked[-1]
        settled = [f.exception(timeout=30) is None for f in in_flight]
        done = [50 + i for i, ok in enumerate(settled) if ok]
        assert rh.last_add_confirmed >= max(done, default=49)
        assert [e.data for e in rh.read(0, rh.last_add_confirmed)] == [
            b"w%d" % i for i in range(rh.last_add_confirmed + 1)]
        with pytest.raises(LedgerFencedError):
            lh.add_entry(b"old writer")
        try:  # closing the fenced handle succeeds only if recovery ended exactly at its LAC
            lh.close()
            closed_as_written = True
        except (LedgerFencedError, LedgerClosedError):
            closed_as_written = False
        assert closed_as_written == (lh.last_add_confirmed == rh.last_add_confirmed)
        assert bk.ledger_metadata(lh.ledger_id).last_entry_id == rh.last_add_confirmed


def test_recovery_of_an_empty_ledger(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        lh = bk.create_ledger()
        rh = bk.open_ledger(lh.ledger_id)
        assert rh.is_closed and rh.last_add_confirmed == -1 and rh.length == 0
        with pytest.raises(LedgerFencedError):
            lh.add_entry(b"too late")


def test_a_client_that_recovers_its_own_ledger_fences_its_writer_quietly(
        tmp_path: Path, driver: Driver, caplog: pytest.LogCaptureFixture) -> None:
    """Recovering a ledger this same client still writes (the README's example) ends
    that writer at once: its next add fails with LedgerFencedError without a bookie
    telling it, and nothing warns that "another client recovered it" - none did. A
    writer that another client fences still warns."""
    with local_cluster(tmp_path, driver) as cluster, client(cluster) as bk, client(cluster) as other:
        lh = bk.create_ledger(password=b"pw")
        lh.add_entry(b"x")
        with caplog.at_level(logging.INFO, logger="walkit"):
            rh = bk.open_ledger(lh.ledger_id, password=b"pw")
            with pytest.raises(LedgerFencedError, match="this client recovered it"):
                lh.add_entry(b"late")
        assert rh.is_closed and rh.last_add_confirmed == 0
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        assert any("its own client recovers it" in r.getMessage() for r in caplog.records)
        caplog.clear()
        theirs = other.create_ledger(password=b"pw")
        theirs.add_entry(b"x")
        bk.open_ledger(theirs.ledger_id, password=b"pw")
        with caplog.at_level(logging.WARNING, logger="walkit"):
            with pytest.raises(LedgerFencedError, match="another client recovered it"):
                theirs.add_entry(b"late")
        assert any("another client recovered it" in r.getMessage() for r in caplog.records)


def test_recovery_of_a_crashed_writer_with_entries_on_few_bookies(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=3) as cluster:
        with client(cluster) as writer_bk:
            lh = writer_bk.create_ledger()
            for i in range(10):
                lh.add_entry(b"e%d" % i)
            meta = lh.metadata
        ensemble = list(meta.ensembles[0][1])
        length = sum(len(b"e%d" % i) for i in range(10))
        # entry 10 reached two bookies (it may have been acknowledged: recovery must keep it);
        # entry 11 reached one (it was not: recovery may keep it or not)
        raw_add(cluster, meta, 10, b"e10", 9, length + 3, ensemble[:2])
        raw_add(cluster, meta, 11, b"e11", 10, length + 6, ensemble[2:])
        with client(cluster) as bk:
            rh = bk.open_ledger(meta.ledger_id)
            assert rh.is_closed and rh.last_add_confirmed in (10, 11)
            last = rh.last_add_confirmed
            assert [e.data for e in rh.read(0, last)] == [b"e%d" % i for i in range(last + 1)]
            assert rh.length == length + 3 * (last - 9)
            # recovery re-added what it found past the highest LAC (10, carried by entry 11)
            # to the whole write set; entries up to that LAC were confirmed (on Qa bookies)
            for bookie in ensemble:
                assert all(stored_on(cluster, bookie, meta.ledger_id, e) for e in range(11, last + 1))


def test_ensemble_change_during_recovery(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=4) as cluster:
        with client(cluster) as writer_bk:
            lh = writer_bk.create_ledger()
            for i in range(5):
                lh.add_entry(b"e%d" % i)
            meta = lh.metadata
        ensemble = list(meta.ensembles[0][1])
        spare = next(b for b in cluster.bookie_ids if b not in ensemble)
        length = sum(len(b"e%d" % i) for i in range(5))
        for i in range(5, 8):  # acknowledged by two bookies, never reached the third
            length += 3
            raw_add(cluster, meta, i, b"e%d" % i, i - 1, length, ensemble[:2])
        cluster.kill_bookie(index_of(cluster, ensemble[2]))
        with client(cluster) as bk:
            rh = bk.open_ledger(meta.ledger_id)
            assert rh.is_closed and rh.last_add_confirmed == 7
            final = bk.ledger_metadata(meta.ledger_id)
            assert ensemble[2] not in final.ensembles[-1][1] and spare in final.ensembles[-1][1]
            assert [e.data for e in rh.read(0, 7)] == [b"e%d" % i for i in range(8)]
            assert all(stored_on(cluster, spare, meta.ledger_id, e) for e in range(final.ensembles[-1][0], 8))


def test_two_recoverers_at_once_agree(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=3) as cluster:
        with client(cluster) as writer_bk:
            lh = writer_bk.create_ledger()
            for i in range(30):
                lh.add_entry_async(b"e%d" % i)
            lh.add_entry(b"e30")
            meta = lh.metadata
        raw_add(cluster, meta, 31, b"e31", 30, sum(len(b"e%d" % i) for i in range(32)),
                list(meta.ensembles[0][1][:1]))
        results: list[object] = [None, None]

        def recover(slot: int) -> None:
            with client(cluster) as bk:
                rh = bk.open_ledger(meta.ledger_id)
                results[slot] = (rh.last_add_confirmed, rh.length, [e.data for e in rh.read(0, rh.last_add_confirmed)])

        threads = [threading.Thread(target=recover, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert results[0] is not None and results[0] == results[1]
        with client(cluster) as bk:
            final = bk.ledger_metadata(meta.ledger_id)
        assert final.state is LedgerState.CLOSED and (final.last_entry_id, final.length) == results[0][:2]  # type: ignore[index]


def test_reader_without_recovery_tails_the_writer(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster, idle_lac=False) as bk, \
            client(cluster) as reader_bk:
        lh = bk.create_ledger()
        lh.add_entry(b"first")
        lh.add_entry(b"second")
        rh = reader_bk.open_ledger(lh.ledger_id, recovery=False)
        assert not rh.is_closed and rh.last_add_confirmed == 0  # entry 1's LAC rides on entry 2
        seen: list[bytes] = []
        follower = threading.Thread(target=lambda: seen.extend(e.data for e in rh.follow(0, poll_timeout=0.5)))
        follower.start()
        for i in range(2, 20):
            lh.add_entry(b"e%d" % i)
            time.sleep(0.005)
        assert rh.wait_for_lac(0, 5.0) >= 1
        lh.close()  # the last entry becomes readable through the close
        follower.join(30)
        assert not follower.is_alive()
        assert seen == [b"first", b"second"] + [b"e%d" % i for i in range(2, 20)]
        assert rh.is_closed and rh.last_add_confirmed == 19
        lh.add_entry  # the writer stays usable for reads
        assert [e.data for e in lh.read(19, 19)] == [b"e19"]


def test_wait_for_lac_times_out_without_news(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster, idle_lac=False) as bk:
        lh = bk.create_ledger()
        lh.add_entry(b"a")
        lh.add_entry(b"b")
        rh = bk.open_ledger(lh.ledger_id, recovery=False)
        assert rh.wait_for_lac(0, 0.3) == 0
        lh.add_entry(b"c")
        assert rh.wait_for_lac(0, 5.0) == 1
        assert rh.read_last_add_confirmed() == 1


def _write_lacs(cluster: walkit.LocalCluster) -> int:
    """WRITE_LAC requests the cluster's 3 bookies answered."""
    return sum(cluster.server(i).stats.responses[("write_lac", "EOK")] for i in range(3))


def test_an_idle_writer_publishes_its_lac_at_once(tmp_path: Path, driver: Driver) -> None:
    """With idle_lac, the last entry of a burst is visible to a reader on another client
    without a later append or a timer - to a long poll and to READ_LAC (a reader that
    opens the ledger) alike: the writer sends WRITE_LAC the moment it goes idle, once,
    to the Qa bookies that acknowledged the entry. With idle_lac=False it does not (as
    BookKeeper: its LAC rides on the next entry)."""
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster, idle_lac=True) as bk, \
            client(cluster) as reader_bk:
        lh = bk.create_ledger()
        lh.add_entry(b"a")
        rh = reader_bk.open_ledger(lh.ledger_id, recovery=False)
        for i in range(1, 4):
            time.sleep(0.3)  # idle: nothing after this entry will carry its LAC
            lh.add_entry(b"%d" % i)
            assert rh.wait_for_lac(i - 1, 5.0) == i, "the idle writer's last entry is not visible"
            assert [e.data for e in rh.read(i, i)] == [b"%d" % i]
            for _ in range(5):  # READ_LAC's coverage (2 answers of 3) always includes one that knows
                assert reader_bk.open_ledger(lh.ledger_id, recovery=False).last_add_confirmed == i
        time.sleep(0.3)
        assert _write_lacs(cluster) == 4 * 2, "one WRITE_LAC per idle period to each of the Qa bookies that acked"
        time.sleep(0.5)
        assert _write_lacs(cluster) == 4 * 2, "an idle writer kept sending its LAC"
        with client(cluster, idle_lac=False) as off:
            plain = off.create_ledger()  # idle_lac=False: the LAC rides on the next entry
            for i in range(3):
                plain.add_entry(b"%d" % i)
                time.sleep(0.05)
            time.sleep(0.3)
            assert _write_lacs(cluster) == 4 * 2


def test_an_appender_that_does_not_stop_sends_no_idle_lac(tmp_path: Path, driver: Driver) -> None:
    """A writer adding one entry at a time, back to back, sends its idle LAC only after
    its first add (it had not yet seen a short idle spell): from then on the idle LAC
    waits ``idle_lac_delay`` and the next add carries it (walkit/client/_writer_lac.py).
    Once it stops, its last entry's LAC goes out once, to the bookies that acknowledged
    it, and a reader sees the last entry. With a delay of 0 the LAC leaves at every
    add's completion."""
    with local_cluster(tmp_path, driver, bookies=3) as cluster, \
            client(cluster, idle_lac=True, idle_lac_delay=2.0) as bk, client(cluster) as reader_bk:
        lh = bk.create_ledger()
        for i in range(30):
            assert lh.add_entry(b"%d" % i) == i
        rh = reader_bk.open_ledger(lh.ledger_id, recovery=False)
        assert rh.last_add_confirmed == 28  # entry 29's LAC rides on no entry yet
        time.sleep(0.2)
        first = _write_lacs(cluster)
        assert first in (2, 3), f"WRITE_LACs of a writer adding back to back: {first}, not only its first add's"
        assert rh.wait_for_lac(28, 10.0) == 29, "the stopped writer's last entry is not visible"
        deadline = time.monotonic() + 5
        while _write_lacs(cluster) < first + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert _write_lacs(cluster) - first in (2, 3), "one WRITE_LAC to each bookie that acknowledged the last entry"
    with local_cluster(tmp_path / "at-once", driver, bookies=3) as cluster, \
            client(cluster, idle_lac=True, idle_lac_delay=0) as bk:
        lh = bk.create_ledger()
        for i in range(10):
            lh.add_entry(b"%d" % i)
        deadline = time.monotonic() + 5
        while _write_lacs(cluster) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert 20 <= _write_lacs(cluster) <= 30, "at once: the LAC of every add, to the bookies that acked it"


def test_a_follower_gets_the_entry_with_the_poll(tmp_path: Path, driver: Driver,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A long poll names the entry after the poller's LAC and a bookie that holds it
    sends it along: a follower of a writer that appends one entry at a time reads each
    one without a READ_ENTRY of its own."""
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster, idle_lac=True) as bk, \
            client(cluster) as reader_bk:
        lh = bk.create_ledger()
        lh.add_entry(b"0")
        rh = reader_bk.open_ledger(lh.ledger_id, recovery=False)
        follower = rh.follow(0, poll_timeout=5.0)
        assert next(follower).data == b"0"
        own_reads: list[int] = []
        real = LedgerReader.read_entry

        def spy(self: LedgerReader, entry_id: int, **kw: Any) -> Any:
            own_reads.append(entry_id)
            return real(self, entry_id, **kw)

        monkeypatch.setattr(LedgerReader, "read_entry", spy)
        reads, runs = reader_bk.client._core.stats.reads, reader_bk.client._core.stats.range_reads
        for i in range(1, 6):
            waiting = threading.Timer(0.2, lh.add_entry, (b"%d" % i,))
            waiting.start()
            assert next(follower).data == b"%d" % i
            waiting.join()
        assert own_reads == [], f"entries read on their own after the poll: {own_reads}"
        assert reader_bk.client._core.stats.range_reads == runs, "entries read in runs after the poll"
        assert reader_bk.client._core.stats.reads - reads == 5  # each counted as a read
        monkeypatch.undo()
        lh.add_entry(b"6")  # a burst: the poll brings the first entry, a read the rest
        lh.add_entry(b"7")
        lh.close()
        assert [e.data for e in follower] == [b"6", b"7"]


def test_a_plain_ledgers_idle_lac_yields_to_a_crowd(tmp_path: Path, driver: Driver) -> None:
    """idle_lac=None (the default): a plain ledger written now and then publishes its LAC
    when it goes idle, so its tailing reader sees each entry; writers of the same client
    going idle within a millisecond of each other (many ledgers written at once) send
    none - their LACs ride on their next entries."""
    if driver.spec.driver != "local":
        pytest.skip("client logic: one driver is enough")
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk, \
            client(cluster) as reader_bk:
        lh = bk.create_ledger()
        lh.add_entry(b"0")
        rh = reader_bk.open_ledger(lh.ledger_id, recovery=False)
        for i in range(1, 4):
            time.sleep(0.05)  # now and then
            lh.add_entry(b"%d" % i)
            assert rh.wait_for_lac(i - 1, 10.0) == i, "a plain ledger's last entry is not visible"
        time.sleep(0.2)
        alone = _write_lacs(cluster)
        assert 4 * 2 <= alone <= 4 * 3, f"{alone} WRITE_LACs for 4 adds now and then"
        crowd = [bk.create_ledger() for _ in range(20)]
        for r in range(3):  # round-robin, one add in flight per ledger: a crowd going idle
            futures = [h.add_entry_async(b"%d" % r) for h in crowd]
            assert [f.result(10) for f in futures] == [r] * len(crowd)
        time.sleep(0.2)
        assert _write_lacs(cluster) - alone <= 3 * 3, "a crowd of writers sent idle LACs"


def test_a_long_poll_learns_the_lac_an_add_carries_as_it_arrives(tmp_path: Path, driver: Driver) -> None:
    """A bookie with long polls waiting on a ledger publishes the LAC an add carries as
    the add arrives (bookie/server/_writes.py ``_publish_carried``), not once that add is
    durable: a writer appending back to back sends no idle LAC, and its reader sees each
    entry when the next one arrives. Here the next add is durable nowhere (held on every
    bookie) and the poll is answered anyway."""
    if driver.spec.driver != "local":
        pytest.skip("bookie logic: one driver is enough")
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster, idle_lac=False) as bk, \
            client(cluster) as reader_bk:
        lh = bk.create_ledger()
        for i in range(3):
            lh.add_entry(b"%d" % i)
        rh = reader_bk.open_ledger(lh.ledger_id, recovery=False)
        assert rh.last_add_confirmed == 1  # entry 2's LAC rides on no entry yet
        seen: list[int] = []
        poller = threading.Thread(target=lambda: seen.append(rh.wait_for_lac(1, 20.0)))
        poller.start()
        deadline = time.monotonic() + 10
        while not all(cluster.server(i).polls.waiting_on(lh.ledger_id) for i in range(3)):
            assert time.monotonic() < deadline, "the reader's long polls never parked"
            time.sleep(0.01)
        release = threading.Event()
        hold_entry(cluster, lh.metadata.ensembles[0][1], 3, release)  # entry 3: durable nowhere until released
        try:
            held = lh.add_entry_async(b"3")  # carries LAC 2
            poller.join(15)
            assert seen == [2], f"the poll did not learn the LAC entry 3 carries: {seen}"
            assert not held.done()
        finally:
            release.set()
        assert held.result(10) == 3
        assert [e.data for e in rh.read(2, 2)] == [b"2"]
        # a stranger's add (another master key) carrying a LAC far ahead publishes nothing
        poller = threading.Thread(target=lambda: seen.append(rh.wait_for_lac(3, 1.0)))
        poller.start()
        deadline = time.monotonic() + 10
        while not all(cluster.server(i).polls.waiting_on(lh.ledger_id) for i in range(3)):
            assert time.monotonic() < deadline, "the reader's long polls never parked"
            time.sleep(0.01)
        with pytest.raises(UnauthorizedError):
            raw_add(cluster, lh.metadata, 4, b"forged", 50, 100, list(lh.metadata.ensembles[0][1]),
                    password=b"not the writer's")
        poller.join(15)
        assert seen[-1] == 3, f"a stranger's add moved the LAC the polls saw: {seen}"
        assert max(cluster.server(i).bookie.read_lac(lh.ledger_id) for i in range(3)) <= 3  # type: ignore[union-attr]  # not 50


def test_explicit_lac_makes_the_last_entry_visible(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=3) as cluster, \
            client(cluster, explicit_lac_interval=0.05, idle_lac=False) as bk:
        lh = bk.create_ledger()
        for i in range(3):
            lh.add_entry(b"%d" % i)
        rh = bk.open_ledger(lh.ledger_id, recovery=False)
        deadline = time.monotonic() + 10
        while rh.read_last_add_confirmed() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rh.last_add_confirmed == 2
        assert [e.data for e in rh.read(2, 2)] == [b"2"]


def test_reads_reconnect_to_a_restarted_bookie(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        lh = bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3)
        for i in range(5):
            lh.add_entry(b"%d" % i)
        lh.close()
        rh = bk.open_ledger(lh.ledger_id)
        assert len(list(rh.read(0, 4))) == 5
        for i in range(3):
            cluster.restart_bookie(i)
        assert [e.data for e in rh.read(0, 4)] == [b"%d" % i for i in range(5)]


def test_asyncio_client(tmp_path: Path, driver: Driver) -> None:
    import asyncio

    import walkit.aio

    with local_cluster(tmp_path, driver, bookies=3) as cluster:

        async def main() -> None:
            async with await walkit.aio.connect(cluster.metadata_uri, read_timeout=2.0) as bk:
                lh = await bk.create_ledger(password=b"p")
                assert await lh.add_entry(b"zero") == 0
                futures = [await lh.add_entry_async(b"%d" % i) for i in range(1, 200)]
                assert await asyncio.gather(*futures) == list(range(1, 200))
                assert [e.data for e in await lh.read(0, 1)] == [b"zero", b"1"]
                tail = await bk.open_ledger(lh.ledger_id, password=b"p", recovery=False)
                follow = tail.follow(0, poll_timeout=0.3)
                first = await follow.__anext__()
                assert first.data == b"zero"
                await lh.close()
                rest = [e.data async for e in follow]
                assert rest == [b"%d" % i for i in range(1, 200)]
                rh = await bk.open_ledger(lh.ledger_id, password=b"p")
                assert rh.is_closed and rh.last_add_confirmed == 199
                assert len([e async for e in rh.read(0, 199)]) == 200
                assert lh.ledger_id in await bk.list_ledgers()
                assert (await bk.ledger_metadata(lh.ledger_id)).last_entry_id == 199
                await bk.delete_ledger(lh.ledger_id)
                with pytest.raises(NoSuchLedgerError):
                    await bk.open_ledger(lh.ledger_id)

        asyncio.run(asyncio.wait_for(main(), 60))


def test_tls_bookies(tmp_path: Path, driver: Driver) -> None:
    from support.bookie import make_certificates

    if driver.spec.driver != "local":
        pytest.skip("TLS does not depend on the metadata driver")
    certs = make_certificates(tmp_path)
    options = {"tls_certificate_path": certs["cert"], "tls_key_store": certs["key"]}
    with local_cluster(tmp_path, driver, bookies=3, bookie_options=options) as cluster:
        with client(cluster, tls_ca_file=certs["ca"]) as bk:
            lh = bk.create_ledger()
            assert [lh.add_entry(b"%d" % i) for i in range(3)] == [0, 1, 2]
            lh.close()
            assert [e.data for e in bk.open_ledger(lh.ledger_id).read(0, 2)] == [b"0", b"1", b"2"]
        with client(cluster, tls_ca_file=certs["stranger"]) as bk:
            # every bookie fails verification: each is dropped and none is left to replace it
            with pytest.raises(NotEnoughBookiesError):
                lh = bk.create_ledger()
                lh.add_entry(b"unverified bookie")


def hold_entry(cluster: Any, members: Sequence[str], entry_id: int, release: threading.Event) -> None:
    """The in-process bookies ``members`` hold their answer to ``entry_id`` until ``release``
    is set (up to 30 s); every other add goes through."""
    for member in members:
        bookie = cluster.server(index_of(cluster, member)).bookie
        assert bookie is not None
        real = bookie.add_batch_cb

        def held(adds: list, cb: object, defer: bool = False, real=real) -> None:  # type: ignore[no-untyped-def,type-arg]
            if any(a.entry_id == entry_id for a in adds):  # submitted later from another thread: not deferred
                threading.Thread(target=lambda: (release.wait(30), real(adds, cb))).start()
            else:
                real(adds, cb, defer=defer)

        bookie.add_batch_cb = held


def test_an_add_future_cannot_be_cancelled_and_the_writer_goes_on(tmp_path: Path, driver: Driver) -> None:
    if driver.spec.driver != "local":
        pytest.skip("writer logic: one driver is enough")
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        lh = bk.create_ledger()
        lh.add_entry(b"first")
        release = threading.Event()
        hold_entry(cluster, lh.metadata.ensembles[0][1][:2], 1, release)  # entry 1 waits on both; later go through
        futures = [lh.add_entry_async(b"e%d" % i) for i in range(1, 4)]
        time.sleep(0.3)
        assert not futures[1].cancel() and futures[1].running()  # the add is under way: it is written anyway
        release.set()
        assert [f.result(timeout=10) for f in futures] == [1, 2, 3]
        assert not futures[1].cancelled()
        assert lh.add_entry(b"later") == 4
        lh.close()


def test_closing_the_client_fails_adds_in_flight_and_later_use(tmp_path: Path, driver: Driver) -> None:
    if driver.spec.driver != "local":
        pytest.skip("client lifecycle: one driver is enough")
    with local_cluster(tmp_path, driver, bookies=3) as cluster:
        bk = cluster.client(**FAST)
        lh = bk.create_ledger()
        lh.add_entry(b"zero")
        held: list[tuple[list, object]] = []  # type: ignore[type-arg]
        for member in lh.metadata.ensembles[0][1]:  # no bookie answers the next adds (yet)
            server = cluster.server(index_of(cluster, member))
            assert server.bookie is not None
            server.bookie.add_batch_cb = lambda adds, cb, defer=False: held.append((adds, cb))  # type: ignore[method-assign,assignment,misc]
        pending = [lh.add_entry_async(b"never acknowledged") for _ in range(3)]
        wait_for(lambda: len(held) >= 3, 10)
        bk.close()
        for fut in pending:
            with pytest.raises(walkit.errors.UsageError):
                fut.result(timeout=10)
        with pytest.raises(walkit.errors.UsageError):
            lh.add_entry(b"after close")
        assert isinstance(lh.add_entry_async(b"after close").exception(timeout=10), walkit.errors.UsageError)
        with pytest.raises(walkit.errors.UsageError):
            bk.create_ledger()
        for adds, cb in held:  # let the bookies finish, so that they stop promptly
            cb(walkit.errors.BookieShutdownError("test over"), adds)  # type: ignore[operator]
        meta = cluster.client(**FAST)
        try:  # nothing rewrote the ensemble on the way out
            assert meta.ledger_metadata(lh.ledger_id).ensembles == lh.metadata.ensembles
        finally:
            meta.close()


def test_a_follower_of_a_dead_ensemble_waits_instead_of_spinning(tmp_path: Path, driver: Driver) -> None:
    if driver.spec.driver != "local":
        pytest.skip("reader logic: one driver is enough")
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        lh = bk.create_ledger()
        lh.add_entry(b"a")
        lh.add_entry(b"b")
        rh = bk.open_ledger(lh.ledger_id, recovery=False)
        for i in range(3):
            cluster.kill_bookie(i)
        reads = 0
        ledgers = bk.client._core.ledgers
        real = ledgers.read

        def counted(ledger_id: int) -> object:
            nonlocal reads
            reads += 1
            return real(ledger_id)

        ledgers.read = counted  # type: ignore[method-assign,assignment]
        lac = rh.last_add_confirmed
        for _ in range(3):
            assert rh.wait_for_lac(lac, 0.3) == lac
        assert reads <= 3  # one metadata look per poll that brought nothing, not hundreds


def test_quick_future_is_a_concurrent_future_with_lock_free_reads() -> None:
    import asyncio

    from walkit.client._submit import QuickFuture

    done, failed, waiting, untouched = (QuickFuture[int]() for _ in range(4))
    assert isinstance(done, concurrent.futures.Future) and not done.done() and done._cv is None
    assert done.running() and not done.cancel() and not done.cancelled()  # under way from the start
    with pytest.raises(concurrent.futures.TimeoutError):
        waiting.result(timeout=0.01)
    seen: list[int] = []
    done.add_done_callback(lambda f: seen.append(f.result()))
    timer = threading.Timer(0.05, done.set_result, (0,))  # entry 0: a falsy result
    timer.start()
    assert done.result(timeout=10) == 0 and done.done()  # a waiter made the condition, and was woken
    timer.join(10)
    assert seen == [0]
    done.add_done_callback(lambda f: seen.append(f.result() + 1))  # on a finished future: at once
    assert seen == [0, 1]
    with pytest.raises(concurrent.futures.InvalidStateError):
        done.set_result(9)
    assert done.result() == 0
    failed.set_exception(LedgerFencedError("fenced"))
    assert failed.done() and isinstance(failed.exception(), LedgerFencedError)
    with pytest.raises(LedgerFencedError):
        failed.result()
    untouched.set_result(7)  # nobody waited: no condition was ever made
    assert untouched._cv is None and untouched.result() == 7 and "returned int" in repr(untouched)
    finished, pending = concurrent.futures.wait([done, failed, waiting], timeout=0.01)
    assert finished == {done, failed} and pending == {waiting}
    threading.Timer(0.05, waiting.set_exception, (LedgerFencedError("later"),)).start()
    finished, pending = concurrent.futures.wait([waiting], timeout=10)  # wait()'s own waiter is told
    assert finished == {waiting} and not pending
    assert [f.result() for f in concurrent.futures.as_completed([done, untouched])] in ([0, 7], [7, 0])

    async def awaited() -> int:
        later = QuickFuture[int]()
        asyncio.get_running_loop().call_later(0.01, later.set_result, 5)
        return await asyncio.wrap_future(later)

    assert asyncio.run(awaited()) == 5


def test_a_quick_future_raises_a_shared_error_with_a_traceback_of_its_own() -> None:
    """A writer's error fails many futures (every pending add, then every later one): each
    result() raises it from the caller's frames alone, not piled onto those of the raises
    before; its message and cause are untouched. A foreign exception (a bug) keeps its
    traceback."""
    from walkit.client._submit import QuickFuture

    def raised(error: BaseException) -> BaseException:
        try:
            raise error
        except BaseException as exc:
            return exc

    cause = OSError("connection reset")
    error = NotEnoughBookiesError("too few", ledger=7)
    error.__cause__ = cause
    futures = [QuickFuture[int]() for _ in range(4)]
    for fut in futures:
        fut.set_exception(raised(error))
    depths = []
    for fut in futures:
        with pytest.raises(NotEnoughBookiesError) as caught:
            fut.result()
        assert caught.value is error and caught.value.__cause__ is cause and str(error) == "too few (ledger=7)"
        depths.append(len(traceback.extract_tb(caught.value.__traceback__)))
    assert depths == [2] * 4, depths  # this test's frame and QuickFuture.result's
    bug = raised(KeyError("bug"))
    buggy = QuickFuture[int]()
    buggy.set_exception(bug)
    with pytest.raises(KeyError) as caught_bug:
        buggy.result()
    assert "raised" in [frame.name for frame in traceback.extract_tb(caught_bug.value.__traceback__)]


def test_quick_future_wakes_every_kind_of_waiter_under_races() -> None:
    """Completions racing the first waiter (which makes the condition): nobody is left asleep."""
    from walkit.client._submit import QuickFuture

    for round_ in range(300):
        fut = QuickFuture[int]()
        got: list[object] = []
        waiters = [threading.Thread(target=lambda: got.append(fut.result(timeout=10))),
                   threading.Thread(target=lambda: got.append(fut.exception(timeout=10))),
                   threading.Thread(target=lambda: fut.add_done_callback(lambda f: got.append(f.result()))),
                   threading.Thread(target=lambda: got.append(
                       len(concurrent.futures.wait([fut], timeout=10).done)))]
        for w in waiters[: round_ % 4 + 1]:
            w.start()
        fut.set_result(round_)
        for w in waiters[: round_ % 4 + 1]:
            w.join(10)
        assert sorted(map(repr, got)) == sorted(map(repr, [round_, None, round_, 1][: round_ % 4 + 1])), round_


def test_slots_count_under_the_lock_and_wake_waiters() -> None:
    from walkit.client._submit import Slots

    lock = threading.Lock()
    slots = Slots(2, lock)
    assert slots.acquire() and slots.acquire(blocking=False) and not slots.acquire(blocking=False)
    assert slots._freed is None  # no condition until somebody waits (one writer of 10,000 never does)
    got: list[bool] = []
    waiters = [threading.Thread(target=lambda: got.append(slots.acquire())) for _ in range(2)]
    for t in waiters:
        t.start()
    time.sleep(0.1)
    assert got == []  # both wait for a slot
    slots.release(2)  # one release of two slots wakes both
    for t in waiters:
        t.join(10)
    assert got == [True, True] and slots.free == 0
    slots.release(2)
    with pytest.raises(ValueError):
        slots.release()
    with lock:
        assert slots.take_locked(blocking=False) and slots.free == 1
        slots.release_locked()
    assert slots.free == 2


def test_max_pending_adds_blocks_the_producer_until_an_add_completes(tmp_path: Path, driver: Driver) -> None:
    if driver.spec.driver != "local":
        pytest.skip("writer logic: one driver is enough")
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster, max_pending_adds=2) as bk:
        lh = bk.create_ledger()
        lh.add_entry(b"zero")
        release = threading.Event()
        hold_entry(cluster, lh.metadata.ensembles[0][1], 1, release)  # no bookie answers entry 1 until released
        first = [lh.add_entry_async(b"one"), lh.add_entry_async(b"two")]
        third: list[object] = []
        producer = threading.Thread(target=lambda: third.append(lh.add_entry_async(b"three")))
        producer.start()
        time.sleep(0.3)
        assert producer.is_alive() and not third  # both slots taken: the third add waits
        release.set()
        producer.join(10)
        assert [f.result(timeout=10) for f in first] == [1, 2] and len(third) == 1
        fut = third[0]
        assert isinstance(fut, concurrent.futures.Future) and fut.result(timeout=10) == 3
        assert lh.add_entry(b"four") == 4
        lh.close()


# -- one wake-up of the client's loop for the adds of many ledgers ----------------------------------


def test_adds_to_many_ledgers_share_one_wake_up_and_one_flush_per_bookie(tmp_path: Path, driver: Driver,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """While the client's loop is busy, adds submitted to 40 ledgers (round-robin, as an
    application keeping many logs does) queue their writers once each: one wake-up of
    the loop sends them all, and each bookie connection is flushed once for all of them
    (it was one wake-up and one flush per ledger). Their batches are queued together: one
    ``queue_add_groups`` per bookie connection for all 40 writers, each writer's frames in
    its entries' order (it was one ``queue_adds`` per writer and bookie). Every add
    completes, in each ledger's order, and reads back."""
    if driver.spec.driver != "local":
        pytest.skip("client logic: one driver is enough")
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        handles = [bk.create_ledger(3, 3, 2) for _ in range(40)]
        for h in handles:  # connections made: the batches' path (BookiePool.ready)
            assert h.add_entry(b"%d/warm" % h.ledger_id) == 0
        core = bk.client._core
        calls: list[Any] = []
        flushed: list[set[str]] = []
        grouped: list[list[tuple[int, list[int]]]] = []
        real_call, real_flush = core.loop.call, core.pool.flush
        real_groups = BookieClient.queue_add_groups

        def counting_groups(self: BookieClient, groups: Any, relay: Any) -> None:
            grouped.append([(ledger_id, [add.entry_id for add in adds]) for ledger_id, _, _, adds in groups])
            real_groups(self, groups, relay)

        monkeypatch.setattr(BookieClient, "queue_add_groups", counting_groups)

        def counting_call(fn: Any, *args: Any) -> None:
            calls.append(fn)
            real_call(fn, *args)

        def counting_flush(bookies: Any) -> None:
            flushed.append(set(bookies))
            real_flush(bookies)

        core.loop.call = counting_call  # type: ignore[method-assign]
        core.pool.flush = counting_flush  # type: ignore[method-assign]
        busy, release = threading.Event(), threading.Event()
        real_call(lambda: (busy.set(), release.wait(10)))
        assert busy.wait(10)
        futures = [(h, r, h.add_entry_async(b"%d/%d" % (h.ledger_id, r))) for r in range(1, 4) for h in handles]
        release.set()
        for h, r, fut in futures:
            assert fut.result(30) == r
        assert len(calls) == 1, f"{len(calls)} wake-ups of the loop for {len(futures)} adds to 40 ledgers"
        assert flushed[0] == set(cluster.bookie_ids), f"first flush: {flushed[0]}"
        assert len(flushed) == 1, f"{len(flushed)} flushes for one wake-up"
        expected = sorted((h.ledger_id, [1, 2, 3]) for h in handles)
        assert len(grouped) == 3 and all(sorted(groups) == expected for groups in grouped), grouped
        for h in handles:
            assert [e.data for e in h.read(1, 3)] == [b"%d/%d" % (h.ledger_id, r) for r in range(1, 4)]


def test_one_timeout_sweep_watches_every_writer_with_adds_in_flight(tmp_path: Path, driver: Driver) -> None:
    """Add timeouts of all writers are checked by one timer of the client, armed once
    while any writer has adds in flight (it was a timer per writer, armed again for
    nearly every add once writers idle between adds); a writer leaves it once idle, the
    timer stops with the last one, and an add still times out: a bookie that stops
    answering is replaced in every ledger it was in."""
    if driver.spec.driver != "local":
        pytest.skip("client logic: one driver is enough")
    with local_cluster(tmp_path, driver, bookies=4) as cluster, client(cluster, add_timeout=1.0) as bk:
        handles = [bk.create_ledger(3, 3, 3) for _ in range(40)]
        core = bk.client._core
        armed: list[Any] = []

        def count_timers() -> None:
            loop = asyncio.get_running_loop()
            real = loop.call_later

            def counting(delay: float, fn: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
                armed.append(getattr(fn, "__name__", fn))
                return real(delay, fn, *args, **kw)

            loop.call_later = counting  # type: ignore[method-assign]

        core.loop.run(_in_loop(count_timers))
        for r in range(5):  # each ledger idle between its adds: round-robin, one at a time
            for h in handles:
                assert h.add_entry(b"%d" % r) == r
        sweeps = armed.count("_sweep_timeouts")
        writers = [name for name in armed if name in ("check_timeouts", "_check_timeouts", "_send_lac")]
        assert 1 <= sweeps <= 20 and not writers, f"timers armed for 200 adds: {sweeps} sweeps, writers' {writers}"
        deadline = time.monotonic() + 5
        while (core._sweep is not None or core._watched) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert core._sweep is None and not core._watched, "the sweep outlived the adds in flight"
        silent = handles[0].metadata.ensembles[0][1][0]
        release = threading.Event()
        hold_entry(cluster, [silent], 5, release)  # it answers no add of entry 5
        try:
            with_silent = [h for h in handles if silent in h.metadata.ensembles[-1][1]]
            futures = [h.add_entry_async(b"after") for h in with_silent]  # each needs 3 acks: a new ensemble
            assert [f.result(20) for f in futures] == [5] * len(with_silent)
            assert all(silent not in h.metadata.ensembles[-1][1] for h in with_silent)
        finally:
            release.set()


async def _in_loop(fn: Any) -> None:
    fn()


def test_adds_queued_when_the_loop_is_gone_fail_instead_of_hanging(tmp_path: Path, driver: Driver) -> None:
    """If waking the loop fails (the client closed under a submitting thread), the add
    that tried raises UsageError and every add queued with it by other threads fails
    with it too - none is left waiting for a loop that will never take it - and each
    gives its slot back."""
    if driver.spec.driver != "local":
        pytest.skip("client logic: one driver is enough")
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        first, second = bk.create_ledger(3, 3, 2), bk.create_ledger(3, 3, 2)
        core = bk.client._core
        real_call = core.loop.call
        busy, release = threading.Event(), threading.Event()
        real_call(lambda: (busy.set(), release.wait(10)))
        assert busy.wait(10)
        queued = first.add_entry_async(b"queued")  # wakes the (busy) loop: its wake-up is pending
        core._ready_scheduled = False  # as if the loop had taken the wake-up but not yet the writers

        def closed(fn: Any, *args: Any) -> None:
            raise walkit.errors.UsageError("client is closed")

        core.loop.call = closed  # type: ignore[method-assign]
        try:
            with pytest.raises(walkit.errors.UsageError):
                second.add_entry_async(b"refused")
            with pytest.raises(walkit.errors.UsageError):
                queued.result(5)
            assert not core._ready and not core._ready_scheduled
            assert first._writer.slots.free == first._writer.slots.limit
            assert second._writer.slots.free == second._writer.slots.limit
        finally:
            core.loop.call = real_call  # type: ignore[method-assign]
            release.set()


def test_a_stopped_client_does_not_time_out_the_adds_it_sent_before_the_stop(tmp_path: Path, driver: Driver) -> None:
    """The client's loop does not run for longer than add_timeout (as when the process is
    SIGSTOPped) while an add is out and its answers are not in yet: when it runs again,
    that add is not timed out on the bookies that have not answered - it gets
    add_timeout afresh - so the answers arriving just after count, no bookie is dropped
    and the add completes (before: both were dropped, and with no spare bookie the
    writer failed with NotEnoughBookiesError)."""
    if driver.spec.driver != "local":
        pytest.skip("writer logic: one driver is enough")
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster, add_timeout=1.0) as bk:
        lh = bk.create_ledger(3, 3, 2)
        lh.add_entry(b"first")
        ensemble = list(lh.metadata.ensembles[0][1])
        release = threading.Event()
        hold_entry(cluster, ensemble, 1, release)  # entry 1's answers wait on every bookie
        fut = lh.add_entry_async(b"second")
        time.sleep(0.2)  # sent, unanswered
        core = bk.client._core
        core.loop.call(time.sleep, 2.5)  # the loop stops for 2.5 s (add_timeout: 1 s)
        threading.Timer(2.9, release.set).start()  # the answers come just after it runs again
        assert fut.result(10) == 1
        assert lh.add_entry(b"third") == 2
        assert list(lh.metadata.ensembles[-1][1]) == ensemble and len(lh.metadata.ensembles) == 1, \
            "a bookie was dropped for an add timed out while the client was stopped"


def test_placement_chooses_from_the_watched_bookie_list(tmp_path: Path, driver: Driver,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first choice a client chooses from the bookie lists it watches: no store
    read per create; a bookie turned read-only leaves the choice once the watch tells; a
    bookie that just joined is chosen at once when the list without it is too short; a
    list older than BOOKIE_LIST_MAX_AGE is read from the store again."""
    from walkit.client import _core

    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        bk.create_ledger(3, 3, 2).close()
        core = bk.client._core
        reads: list[int] = []
        listing = core.cluster.bookies

        def counted() -> Any:
            reads.append(1)
            return listing()

        monkeypatch.setattr(core.cluster, "bookies", counted)
        for _ in range(5):
            bk.create_ledger(3, 3, 2).close()
        assert reads == [], "creates chose from the watched list"
        added = cluster.add_bookie()
        joined = cluster.bookie_ids[added]
        lh = bk.create_ledger(4, 4, 2)  # needs the new bookie, watch event or not
        assert joined in lh.metadata.ensembles[0][1]
        lh.close()
        cluster.set_read_only(0)
        wait_for(lambda: core._writable is not None and cluster.bookie_ids[0] not in core._writable)
        for _ in range(10):
            lh = bk.create_ledger(3, 3, 2)
            assert cluster.bookie_ids[0] not in lh.metadata.ensembles[0][1]
            lh.close()
        reads.clear()
        monkeypatch.setattr(_core, "BOOKIE_LIST_MAX_AGE", 0.0)
        bk.create_ledger(3, 3, 2).close()
        assert reads, "a list older than the maximum age is read again"
        watch = core._bookie_watch
        assert watch is not None
        cancelled: list[int] = []
        cancel = watch.cancel
        monkeypatch.setattr(watch, "cancel", lambda: (cancelled.append(1), cancel()))
    assert core._bookie_watch is None and cancelled == [1], "closing the client cancels its watch"


@pytest.mark.walkit_cluster(bookies=3)
def test_an_add_in_flight_keeps_two_objects_for_the_cyclic_gc(walkit_cluster: Any) -> None:
    """An add in flight holds its future and its own record, nothing else the cyclic
    GC tracks (no set of bookies, no tuple or bound method per request): at 10^5 adds a
    second the GC's passes, and how many adds live long enough to reach its oldest
    generation, are what a pipelined writer pays beyond its own work. Counted with
    every bookie of the ensemble partitioned, so that 500 adds stay in flight.

    The bookies and the metadata store run in this process and make a few dozen objects
    of their own meanwhile (statements, weak references, locks; up to 64 seen in CI), so
    the count is by type: what an add keeps shows as 500 new objects of one type, and no
    type but the two an add holds may gain even half that many."""
    import collections
    import gc

    bk = walkit_cluster.client(**FAST)
    try:
        lh = bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        lh.add_entry(b"first")  # connections made, the writer warm
        for i in range(3):
            walkit_cluster.partition(i)
        gc.collect()
        alive = gc.get_objects()  # held until the count: no id of theirs is reused meanwhile
        before, queue = {id(o) for o in alive}, lh._writer.queue._incoming
        futures = [lh.add_entry_async(b"x" * 100) for _ in range(500)]
        wait_for(lambda: not lh._writer.queue._incoming, timeout=10)  # sent: each in the writer's pending
        assert lh._writer.queue._incoming is queue  # the same list: a fresh one per take would outlive it (10,000 ledgers)
        gc.collect()
        new = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}"
                                  for o in gc.get_objects() if id(o) not in before)
        per_add = {name: count for name, count in new.items() if count >= 250}
        assert per_add == {"walkit.client._add_queue.Add": 500, "walkit.client._submit.QuickFuture": 500}, \
            f"tracked objects new while 500 adds are in flight: {new.most_common(8)}"
        del alive
        for i in range(3):
            walkit_cluster.heal(i)
        assert [f.result(timeout=30) for f in futures] == list(range(1, 501))
    finally:
        bk.close()


def test_a_pass_over_many_ledgers_striped_sends_each_bookie_only_its_entries(tmp_path: Path, driver: Driver,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """E=3 Qw=2: the runs a pass over 20 writers queues to a bookie hold, for each
    ledger, just the entries whose write set has that bookie, in order (one
    ``queue_add_groups`` per bookie for the pass); every add completes and reads back."""
    if driver.spec.driver != "local":
        pytest.skip("client logic: one driver is enough")
    with local_cluster(tmp_path, driver, bookies=3) as cluster, client(cluster) as bk:
        handles = [bk.create_ledger(3, 2, 2) for _ in range(20)]
        for h in handles:  # connections made: the batches' path (BookiePool.ready)
            assert h.add_entry(b"warm") == 0
        core = bk.client._core
        grouped: dict[str, list[tuple[int, list[int]]]] = {}
        real_groups = BookieClient.queue_add_groups

        def counting_groups(self: BookieClient, groups: Any, relay: Any) -> None:
            bookie = next(b for b, c in core.pool._clients.items() if c is self)
            assert bookie not in grouped, "one call per bookie for the pass"
            grouped[bookie] = [(ledger_id, [add.entry_id for add in adds]) for ledger_id, _, _, adds in groups]
            real_groups(self, groups, relay)

        monkeypatch.setattr(BookieClient, "queue_add_groups", counting_groups)
        busy, release = threading.Event(), threading.Event()
        core.loop.call(lambda: (busy.set(), release.wait(10)))
        assert busy.wait(10)
        futures = [(h, r, h.add_entry_async(b"%d/%d" % (h.ledger_id, r))) for r in range(1, 7) for h in handles]
        release.set()
        assert [fut.result(30) for _, _, fut in futures] == [r for _, r, _ in futures]
        for bookie in cluster.bookie_ids:
            expected = []
            for h in handles:
                ensemble = h.metadata.ensembles[-1][1]
                index = ensemble.index(bookie)
                expected.append((h.ledger_id, [e for e in range(1, 7) if (index - e) % 3 < 2]))
            assert sorted(grouped[bookie]) == sorted(expected), bookie
        for h in handles:
            assert [e.data for e in h.read(1, 6)] == [b"%d/%d" % (h.ledger_id, r) for r in range(1, 7)]
