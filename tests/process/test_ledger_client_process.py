"""The ledger client against real bookie processes (LocalCluster(processes=True)), on
both metadata drivers: a bookie SIGKILLed during writes loses no acknowledged entry,
and a writer process SIGKILLed mid-stream is recovered with every acknowledged entry."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

import walkit
from support.client import FAST, client, index_of, local_cluster
from support.metadata import Driver, driver, wait_for  # noqa: F401  (fixture)
from walkit.errors import LedgerFencedError
from walkit.metadata import LedgerState

pytestmark = pytest.mark.timeout(180)


def test_bookie_process_killed_during_writes_loses_no_acknowledged_entry(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=4, processes=True) as cluster, client(cluster) as bk:
        lh = bk.create_ledger()
        victim = lh.metadata.ensembles[0][1][0]
        futures = [lh.add_entry_async(b"p%d" % i) for i in range(500)]
        futures[50].result(timeout=30)
        cluster.kill_bookie(index_of(cluster, victim))  # SIGKILL
        futures += [lh.add_entry_async(b"p%d" % i) for i in range(500, 1000)]
        acked = [f.result(timeout=60) for f in futures]
        assert acked == list(range(1000))
        wait_for(lambda: lh.ensemble_changes >= 1, 20)  # Qa acks from the others need not wait for it
        lh.close()
        assert victim not in lh.metadata.ensembles[-1][1]
        rh = bk.open_ledger(lh.ledger_id)
        assert [e.data for e in rh.read(0, 999)] == [b"p%d" % i for i in range(1000)]


def _writer(uri: str, out: Any) -> None:
    bk = walkit.BookKeeper(uri, **FAST)
    lh = bk.create_ledger(password=b"w")
    out.put(("ledger", lh.ledger_id))

    def report(fut: Any) -> None:
        if fut.exception() is None:
            out.put(("acked", fut.result()))

    i = 0
    while True:  # until SIGKILL
        lh.add_entry_async(b"r%d" % i).add_done_callback(report)
        i += 1
        if i % 50 == 0:
            time.sleep(0.002)


def test_writer_process_killed_mid_stream_is_recovered(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=3, processes=True) as cluster:
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        proc = ctx.Process(target=_writer, args=(cluster.metadata_uri, out))
        proc.start()
        try:
            kind, ledger_id = out.get(timeout=60)
            assert kind == "ledger"
            acked: list[int] = []
            while len(acked) < 2000:
                kind, value = out.get(timeout=60)
                acked.append(value)
        finally:
            proc.kill()
            proc.join(30)
        while not out.empty():  # acknowledgements that were reported before the kill
            acked.append(out.get()[1])
        with client(cluster) as bk:
            rh = bk.open_ledger(ledger_id, password=b"w")
            assert rh.is_closed and rh.last_add_confirmed >= max(acked)
            entries = list(rh.read(0, rh.last_add_confirmed))
            assert [e.data for e in entries] == [b"r%d" % i for i in range(rh.last_add_confirmed + 1)]
            meta = bk.ledger_metadata(ledger_id)
            assert meta.state is LedgerState.CLOSED and meta.length == sum(len(e.data) for e in entries)


def test_second_writer_fences_the_first_across_processes(tmp_path: Path, driver: Driver) -> None:
    with local_cluster(tmp_path, driver, bookies=3, processes=True) as cluster:
        with client(cluster) as first, client(cluster) as second:
            lh = first.create_ledger()
            for i in range(10):
                lh.add_entry(b"%d" % i)
            rh = second.open_ledger(lh.ledger_id)
            assert rh.last_add_confirmed == 9
            with pytest.raises(LedgerFencedError):
                lh.add_entry(b"fenced")
