"""walkit.examples.kvstore (the store ``walkit demo`` runs): failover by snapshot + replay
keeps every acknowledged change, snapshots with truncation keep the replay short, and the
old primary is fenced."""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

import walkit
from walkit.errors import WriterFencedError
from walkit.examples import kvstore as kv


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[walkit.LocalCluster]:
    with walkit.LocalCluster(tmp_path_factory.mktemp("kv"), bookies=3) as c:
        yield c


@pytest.fixture
def bk(cluster: walkit.LocalCluster) -> Iterator[walkit.BookKeeper]:
    with cluster.client() as client:
        yield client


def _random_changes(store: Any, model: dict[str, str], n: int, rng: random.Random) -> None:
    """``n`` random changes, half of them pipelined; ``model`` gets the acknowledged ones."""
    pending: list[tuple[Future[walkit.LSN], Any]] = []
    for i in range(n):
        key = f"k{rng.randrange(40)}"
        change = kv.Change(kv.Op.DELETE, key) if rng.random() < 0.25 else kv.Change(kv.Op.SET, key, f"v{i}")
        if i % 2:
            pending.append((store.submit(change), change))
        else:
            for fut, earlier in pending:
                fut.result()
                earlier.apply(model)
            pending.clear()
            store.submit(change).result()
            change.apply(model)
    for fut, earlier in pending:
        fut.result()
        earlier.apply(model)


def test_records_round_trip() -> None:
    for change in (kv.Change(kv.Op.SET, "k", "v"), kv.Change(kv.Op.SET, "ключ", ""), kv.Change(kv.Op.DELETE, "k")):
        assert kv.Change.decode(change.encode()) == change
    with pytest.raises(walkit.errors.InvalidArgumentError):
        kv.Change.decode(b"\x02\x00\x01kv")  # a delete has nothing after the key
    data = {"a": "1", "b": "2"}
    assert kv.decode_snapshot(kv.encode_snapshot(data, walkit.LSN(1, 2, 3))) == (data, walkit.LSN(1, 2, 3))


def test_set_get_delete_apply_once_acknowledged(bk: walkit.BookKeeper) -> None:
    with kv.KVStore.open(bk, "basic") as store:
        first = store.set("a", "1")
        assert store.get("a") == "1" and store.last_lsn == first
        second = store.delete("a")
        assert second > first and store.get("a") is None and store.items() == {}


def test_failover_keeps_every_acknowledged_change(bk: walkit.BookKeeper) -> None:
    rng = random.Random(7)
    model: dict[str, str] = {}
    primary = kv.KVStore.open(bk, "failover", snapshot_every=25)
    _random_changes(primary, model, 300, rng)
    assert primary.items() == model
    # the primary "crashes": it is never closed; a standby takes over
    with kv.KVStore.open(bk, "failover", snapshot_every=25) as standby:
        assert standby.items() == model
        assert standby.recovery.snapshot_lsn is not None  # it started from a snapshot
        assert standby.last_lsn == primary.last_lsn
        standby.set("after", "failover")
    with kv.KVStore.open(bk, "failover") as again:
        assert again.items() == {**model, "after": "failover"}


def test_old_primary_is_fenced(bk: walkit.BookKeeper) -> None:
    primary = kv.KVStore.open(bk, "fenced")
    primary.set("x", "1")
    with kv.KVStore.open(bk, "fenced") as standby:
        with pytest.raises(WriterFencedError):
            primary.set("x", "zombie")
        with pytest.raises(WriterFencedError):  # and for good
            primary.delete("x")
        assert primary.get("x") == "1"  # a refused change is never applied
        assert standby.get("x") == "1"
        standby.set("y", "2")
    with walkit.WriteAheadLog.reader(bk, "fenced") as reader:
        state, _ = kv.recover(reader)
    assert state == {"x": "1", "y": "2"}  # nothing of the fenced writer's landed
    primary.close()  # a fenced store closes quietly: it has nothing left to finish


def test_snapshots_and_truncation_keep_replay_short(bk: walkit.BookKeeper) -> None:
    rng = random.Random(11)
    model: dict[str, str] = {}
    with kv.KVStore.open(bk, "short", snapshot_every=50, roll_bytes=2048) as primary:
        _random_changes(primary, model, 620, rng)
        primary.flush()
        assert primary.snapshots_taken >= 2 and primary.snapshot_error is None
    with walkit.WriteAheadLog.reader(bk, "short") as reader:
        meta = reader.metadata()
        snapshot = reader.latest_snapshot()
        assert snapshot is not None
        everything = sum(1 for _ in reader.replay(after=snapshot.lsn))  # before it: truncated away
    assert meta.truncated is not None  # old segments are gone
    assert everything < 620 // 2  # what is left of the log is a fraction of what was written
    with kv.KVStore.open(bk, "short", snapshot_every=50) as standby:
        assert standby.items() == model
        assert standby.recovery.snapshot_lsn is not None
        assert standby.recovery.replayed < 50  # the changes after the last snapshot only
