"""The ledger manager on every driver: ids, metadata CRUD with CAS, ordered listing."""

from __future__ import annotations

import multiprocessing
import time
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from support.metadata import Driver, ExpirableStore, StoreSpec, driver, open_store, store, wait_for
from walkit.errors import (
    FormatError,
    InvalidArgumentError,
    LedgerExistsError,
    MetadataError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from walkit.metadata import LedgerManager, LedgerMetadata, LedgerState, init_cluster, ledger_path, ledger_path_prefixes
from walkit.metadata._paths import LEGACY_LIMIT, MAX_LEDGER_ID
from walkit.metadata._store import Create, Delete

__all__ = ["driver", "store"]  # fixtures used by name

ROOT = "/ledgers"
T = TypeVar("T")


def manager_on(store: ExpirableStore, layout: str = "hierarchical", **kwargs: Any) -> LedgerManager:
    return LedgerManager(store, init_cluster(store, ROOT, layout), **kwargs)  # type: ignore[arg-type]


def meta(ledger_id: int, **custom: bytes) -> LedgerMetadata:
    return LedgerMetadata.create(ledger_id, ("b1:3181", "b2:3181", "b3:3181"), write_quorum=2, ack_quorum=2,
                                 password=b"pw", ctime=1_700_000_000_000, custom=custom)


# -- ids ---------------------------------------------------------------------------------


def test_ids_unique_across_threads_and_managers(driver: Driver) -> None:
    managers = [manager_on(driver.make_store()) for _ in range(2)]
    ids: list[int] = []
    lock = threading.Lock()

    def work(m: LedgerManager) -> None:
        got = [m.new_ledger_id() for _ in range(50)]
        with lock:
            ids.extend(got)

    threads = [threading.Thread(target=work, args=(managers[i % 2],)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 300 and len(set(ids)) == 300
    assert all(0 <= i < LEGACY_LIMIT for i in ids)


def id_worker(spec: StoreSpec, count: int, out: Any, gate: Any) -> None:
    store = open_store(spec, session_timeout=10.0)
    try:
        manager = LedgerManager(store, init_cluster(store, ROOT))
        gate.wait(timeout=120)  # start together so the generators really contend
        out.put([manager.new_ledger_id() for _ in range(count)])
    finally:
        store.close()


def test_ids_unique_across_ten_processes(driver: Driver) -> None:
    """The issue's bar: 10 processes × 1,000 ids, all distinct."""
    init_cluster(driver.make_store(), ROOT)
    ctx = multiprocessing.get_context("spawn")
    out, gate = ctx.Queue(), ctx.Barrier(10)
    procs = [ctx.Process(target=id_worker, args=(driver.spec, 1000, out, gate)) for _ in range(10)]
    for proc in procs:
        proc.start()
    try:
        batches = [out.get(timeout=180) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0] * 10
    ids = [i for batch in batches for i in batch]
    assert len(ids) == 10_000 and len(set(ids)) == 10_000
    for batch in batches:
        assert batch == sorted(batch), "one generator's ids only grow"


def test_full_bucket_moves_every_generator_to_the_next(driver: Driver) -> None:
    """With 7 numbers per bucket the generators must cross many buckets; ids stay
    unique, grow per generator, and fill the 63-bit space past one bucket."""
    managers = [manager_on(driver.make_store(), low_limit=7) for _ in range(3)]
    ids: list[list[int]] = [[] for _ in managers]

    def work(k: int) -> None:
        ids[k] = [managers[k].new_ledger_id() for _ in range(40)]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for batch in ids for i in batch]
    assert len(set(every)) == 120
    assert all(batch == sorted(batch) for batch in ids)
    hobs = driver.make_store().children(f"{ROOT}/idgen")
    assert len(hobs) > 3 and all(h.startswith("HOB-") for h in hobs)


class CountingStore:
    """Counts the store calls a manager makes."""

    def __init__(self, store: ExpirableStore) -> None:
        self._store = store
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if callable(attr) and name in ("create", "get", "set", "delete", "exists", "children", "transaction"):
            def counted(*args: Any, **kwargs: Any) -> Any:
                self.calls += 1
                return attr(*args, **kwargs)
            return counted
        return attr


def test_ids_come_in_ranges_one_transaction_each(driver: Driver) -> None:
    """``id_range`` ids per store call, ascending; the previous range's nodes go with the
    next range's transaction (one deleted meanwhile, as an expiry would, is tolerated);
    the rest go with the session. A taker of one number at a time (an older walkit)
    drawing between two ranges gets a number no range holds."""
    s = driver.make_store()
    counting = CountingStore(s)
    m = LedgerManager(counting, init_cluster(s, ROOT), id_range=8)  # type: ignore[arg-type]
    bucket = f"{ROOT}/idgen/HOB-0000000000"
    ids = [m.new_ledger_id() for _ in range(8)]
    first_calls = counting.calls
    assert first_calls <= 4 and len(s.children(bucket)) == 8, \
        "one range: one transaction (and, on first use, the bucket found and made)"
    single = s.create(f"{bucket}/ID-", ephemeral=True, sequential=True)  # an older taker, between two ranges
    s.delete(f"{bucket}/{s.children(bucket)[0]}")  # one of the first range's nodes, gone with an expiry
    ids += [m.new_ledger_id() for _ in range(8)]
    assert len(s.children(bucket)) == 8 + 1, "the first range's nodes deleted with the second's creation"
    assert int(single.rsplit("-", 1)[1]) not in ids
    assert len(set(ids)) == 16 and ids == sorted(ids) and ids[8] > ids[7] + 1
    before = counting.calls
    ids.append(m.new_ledger_id())
    assert counting.calls - before == 1 and len(s.children(bucket)) == 8 + 1
    s.delete(single)
    s.close()
    assert driver.make_store().children(bucket) == [], "the last range's nodes went with the session"


def test_bad_low_limit_is_refused(store: ExpirableStore) -> None:
    with pytest.raises(InvalidArgumentError):
        manager_on(store, low_limit=0)


# -- metadata -----------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["hierarchical", "flat"])
@pytest.mark.parametrize("ledger_id", [0, 12345, LEGACY_LIMIT, MAX_LEDGER_ID])
def test_create_read_write_delete(store: ExpirableStore, layout: str, ledger_id: int) -> None:
    m = manager_on(store, layout)
    first = meta(ledger_id)
    assert m.create(first) == 0
    assert m.read(ledger_id) == (first, 0)
    assert store.exists(ledger_path(ROOT, ledger_id, layout)) is not None  # type: ignore[arg-type]
    with pytest.raises(LedgerExistsError):
        m.create(meta(ledger_id))
    closed = first.closed(last_entry_id=9, length=100)
    assert m.write(closed, 0) == 1
    with pytest.raises(MetadataVersionError):
        m.write(first.with_state(LedgerState.IN_RECOVERY), 0)  # a stale version loses
    assert m.read(ledger_id) == (closed, 1)
    with pytest.raises(MetadataVersionError):
        m.delete(ledger_id, version=0)
    m.delete(ledger_id, version=1)
    assert not m.exists(ledger_id)
    with pytest.raises(NoSuchLedgerError):
        m.read(ledger_id)
    with pytest.raises(NoSuchLedgerError):
        m.delete(ledger_id)
    with pytest.raises(NoSuchLedgerError):
        m.write(closed, 1)


def test_write_needs_a_version(store: ExpirableStore) -> None:
    m = manager_on(store)
    m.create(meta(1))
    with pytest.raises(InvalidArgumentError):
        m.write(meta(1), -1)


def test_concurrent_updates_lose_nothing(driver: Driver) -> None:
    managers = [manager_on(driver.make_store()) for _ in range(3)]
    managers[0].create(meta(7))

    def add_key(m: LedgerManager, key: str) -> None:
        def change(current: LedgerMetadata) -> LedgerMetadata:
            custom = dict(current.custom, **{key: b"x"})
            return LedgerMetadata(**{**current.__dict__, "custom_metadata": tuple(sorted(custom.items()))})

        m.update(7, change)

    threads = [threading.Thread(target=add_key, args=(managers[i % 3], f"k{i}")) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final, version = managers[0].read(7)
    assert sorted(final.custom) == sorted(f"k{i}" for i in range(12))
    assert version == 12


def test_update_that_changes_nothing_does_not_write(store: ExpirableStore) -> None:
    m = manager_on(store)
    m.create(meta(3))
    assert m.update(3, lambda current: None) == (meta(3).__class__.decode(m.read(3)[0].encode()), 0)
    assert m.read(3)[1] == 0


def test_update_gives_up_after_bounded_attempts(driver: Driver) -> None:
    m = manager_on(driver.make_store())
    other = manager_on(driver.make_store())
    m.create(meta(4))

    def meddle(current: LedgerMetadata) -> LedgerMetadata:
        fresh, version = other.read(4)
        other.write(fresh.with_state(LedgerState.IN_RECOVERY if fresh.state is LedgerState.OPEN else LedgerState.OPEN),
                    version)
        return current.closed(0, 1)

    with pytest.raises(MetadataVersionError, match="kept changing"):
        m.update(4, meddle, attempts=3)


def test_a_change_that_refuses_with_a_version_error_is_not_retried(store: ExpirableStore) -> None:
    m = manager_on(store)
    m.create(meta(6))
    calls: list[int] = []

    def refuse(current: LedgerMetadata) -> LedgerMetadata:
        calls.append(1)
        raise MetadataVersionError("fragments changed under the writer", ledger=6)

    with pytest.raises(MetadataVersionError, match="fragments changed under the writer"):
        m.update(6, refuse)
    assert calls == [1], "the change's own verdict is final, not a lost compare-and-set"


def test_unreadable_metadata_is_a_clear_error(store: ExpirableStore) -> None:
    m = manager_on(store)
    m.create(meta(5))
    store.set(m.path(5), b"garbage")
    with pytest.raises(FormatError) as info:
        m.read(5)
    assert info.value.context["ledger"] == 5
    store.set(m.path(5), meta(6).encode())
    with pytest.raises(FormatError, match="another ledger"):
        m.read(5)


def test_watch_sees_changes_and_deletion(driver: Driver) -> None:
    m = manager_on(driver.make_store())
    seen: list[tuple[LedgerState | None, int]] = []
    m.create(meta(8))
    watch = m.watch(8, lambda md, version: seen.append((md.state if md else None, version)))
    _, version = m.update(8, lambda cur: cur.with_state(LedgerState.IN_RECOVERY))
    wait_for(lambda: (LedgerState.IN_RECOVERY, 1) in seen)
    m.delete(8)
    wait_for(lambda: seen[-1] == (None, -1))
    watch.cancel()
    assert seen[0] == (LedgerState.OPEN, 0)


# -- listing ------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["hierarchical", "flat"])
def test_list_in_id_order_across_path_forms(store: ExpirableStore, layout: str) -> None:
    m = manager_on(store, layout)
    wanted = [0, 9, 10_000, 99_999_999, LEGACY_LIMIT - 1, LEGACY_LIMIT, 10**12, MAX_LEDGER_ID]
    for ledger_id in reversed(wanted):
        m.create(meta(ledger_id))
    assert list(m.ledger_ids()) == wanted
    m.delete(10_000)
    assert list(m.ledger_ids()) == [i for i in wanted if i != 10_000]


LOTS = 100_000
BATCH = 1_000


def _bulk_create(store: ExpirableStore, ids: range) -> None:
    """LOTS ledger nodes fast: parents first, then transactions of BATCH creates."""
    dirs = sorted({p for i in ids for p in ledger_path_prefixes(ROOT, i)})
    store.transaction([Create(d) for d in dirs if store.exists(d) is None])
    for at in range(0, len(ids), BATCH):
        store.transaction([Create(ledger_path(ROOT, i), b"x") for i in ids[at:at + BATCH]])


def _bulk_delete(store: ExpirableStore, ids: range) -> None:
    for at in range(0, len(ids), BATCH):
        store.transaction([Delete(ledger_path(ROOT, i)) for i in ids[at:at + BATCH]])


@pytest.fixture
def hundred_thousand(driver: Driver) -> Iterator[tuple[ExpirableStore, LedgerManager]]:
    store = driver.make_store(session_timeout=10.0)  # big transactions can delay pings past a short lease
    m = manager_on(store)
    ids = range(LOTS)
    _bulk_create(store, ids)
    try:
        yield store, m
    finally:
        _bulk_delete(store, ids)  # keep the shared ZooKeeper small for the tests after


def test_hundred_thousand_ledgers_listed_in_order_with_bounded_memory(
        hundred_thousand: tuple[ExpirableStore, LedgerManager]) -> None:
    store, m = hundred_thousand
    listed_dirs: list[int] = []
    inner = m._children  # count how many names each directory listing holds

    def counting(path: str) -> list[str]:
        names = inner(path)
        listed_dirs.append(len(names))
        return names

    m._children = counting  # type: ignore[method-assign]
    tracemalloc.start()
    try:
        expected = 0
        for ledger_id in m.ledger_ids():
            assert ledger_id == expected
            expected += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert expected == LOTS
    assert len(listed_dirs) == 12, "root, 00, then one listing per 10,000 ledgers"
    tracemalloc.start()
    try:
        everything = [f"L{i:010d}" for i in range(LOTS)]  # what holding every name would cost
        _, whole = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del everything
    assert peak < whole / 3, (peak, whole)


def test_first_ids_come_before_the_walk_ends(store: ExpirableStore) -> None:
    """Iteration is lazy: the first id needs only the first directories."""
    m = manager_on(store)
    for ledger_id in (0, 10_000, 20_000, LEGACY_LIMIT):
        m.create(meta(ledger_id))
    calls: list[str] = []
    inner = m._children

    def counting(path: str) -> list[str]:
        calls.append(path)
        return inner(path)

    m._children = counting  # type: ignore[method-assign]
    it = m.ledger_ids()
    assert next(it) == 0
    assert calls == [ROOT, f"{ROOT}/00", f"{ROOT}/00/0000"]
    assert list(it) == [10_000, 20_000, LEGACY_LIMIT]


def test_a_create_that_landed_before_its_reply_was_lost_is_a_success(store: ExpirableStore) -> None:
    """What a driver retry after a lost reply looks like: the first attempt landed, the
    retry finds the node made by our own bytes."""
    m = manager_on(store)
    first = meta(11)
    store.create(m.path(11), first.encode(), make_parents=True)  # the attempt whose reply was lost
    assert m.create(first) == 0
    with pytest.raises(LedgerExistsError):
        m.create(meta(11))  # same id, other bytes (another salt): someone else's ledger


def test_twin_writes_from_one_version_conflict_and_update_converges(driver: Driver) -> None:
    """Two writers making the same change from the same version: exactly one write wins;
    the loser's update re-reads, finds its change made, and succeeds without writing."""
    a, b = manager_on(driver.make_store()), manager_on(driver.make_store())
    a.create(meta(12))
    current, version = a.read(12)
    recovering = current.with_state(LedgerState.IN_RECOVERY)
    assert a.write(recovering, version) == 1
    with pytest.raises(MetadataVersionError):
        b.write(recovering, version)

    def to_recovery(md: LedgerMetadata) -> LedgerMetadata | None:
        return None if md.state is LedgerState.IN_RECOVERY else md.with_state(LedgerState.IN_RECOVERY)

    assert b.update(12, to_recovery) == (recovering, 1)


class SequenceAt:
    """A store whose next sequential create under idgen gets ``seq`` (as a counter near
    its end would), then behaves normally."""

    def __init__(self, store: ExpirableStore, seqs: list[int]) -> None:
        self._store = store
        self._seqs = seqs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def transaction(self, ops: list[Any]) -> list[Any]:
        results = self._store.transaction(ops)
        for i, op in enumerate(ops):
            if isinstance(op, Create) and op.sequential and "/idgen/" in op.path and self._seqs:
                self._store.delete(results[i])
                results[i] = self._store.create(op.path + f"{self._seqs.pop(0):010d}", ephemeral=True)
        return results


@pytest.mark.parametrize(("start", "in_bucket_0"), [(-(1 << 31), 0), (LEGACY_LIMIT, 0), (LEGACY_LIMIT - 2, 2)])
def test_a_spent_or_wrapped_counter_moves_to_the_next_bucket(store: ExpirableStore, start: int,
                                                             in_bucket_0: int) -> None:
    """ZooKeeper's counter ends at 2^31 - 1 and wraps to negative numbers; a range that
    reaches the end gives the numbers before it, then the next bucket's."""
    m = LedgerManager(SequenceAt(store, [start + k for k in range(8)]), init_cluster(store, ROOT),  # type: ignore[arg-type]
                      id_range=4)
    ids = [m.new_ledger_id() for _ in range(in_bucket_0 + 1)]
    assert ids[:in_bucket_0] == [LEGACY_LIMIT - 2, LEGACY_LIMIT - 1][:in_bucket_0]
    assert ids[-1] >= LEGACY_LIMIT, "then the ids come from bucket 1"
    assert "HOB-0000000001" in store.children(f"{ROOT}/idgen")


def test_a_bad_id_range_is_refused(store: ExpirableStore) -> None:
    for bad in (0, 1025):
        with pytest.raises(InvalidArgumentError, match="id_range"):
            LedgerManager(store, init_cluster(store, ROOT), id_range=bad)


def test_exhausted_id_space_is_a_clear_error(store: ExpirableStore) -> None:
    info = init_cluster(store, ROOT)
    store.create(f"{ROOT}/idgen/HOB-{(MAX_LEDGER_ID // LEGACY_LIMIT) + 1:010d}")
    with pytest.raises(MetadataError, match="exhausted"):
        LedgerManager(store, info).new_ledger_id()


# -- creations joined into one transaction (walkit/metadata/_creates.py) -------------------


class _Gate:
    """A store whose first plain create waits until ``others`` creations queue behind it,
    counting the creates and transactions that reach the real store."""

    def __init__(self, store: ExpirableStore, others: int) -> None:
        self.store, self.others = store, others
        self.creates = self.transactions = 0
        self.manager: LedgerManager | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def create(self, path: str, data: bytes = b"", **kw: Any) -> str:
        if "/idgen/" not in path and self.creates == 0 and self.manager is not None:
            self.creates += 1
            wait_for(lambda: len(self.manager._creates._waiting) >= self.others, 10)  # type: ignore[union-attr]
        elif "/idgen/" not in path:
            self.creates += 1
        return str(self.store.create(path, data, **kw))

    def transaction(self, ops: list[Any]) -> list[Any]:
        if any("/idgen/" not in op.path for op in ops):
            self.transactions += 1
        return list(self.store.transaction(ops))


def _at_once(call: Callable[[T], object], items: list[T]) -> dict[T, BaseException | None]:
    """``call(item)`` for every item, each on a thread of its own, all at once: per
    item, what it raised (None: nothing)."""
    outcome: dict[T, BaseException | None] = {}

    def one(item: T) -> None:
        try:
            call(item)
            outcome[item] = None
        except BaseException as exc:  # noqa: BLE001 - reported
            outcome[item] = exc

    threads = [threading.Thread(target=one, args=(item,)) for item in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcome


def _create_together(m: LedgerManager, metas: list[LedgerMetadata]) -> dict[int, BaseException | None]:
    return {md.ledger_id: exc for md, exc in _at_once(m.create, metas).items()}


def test_concurrent_creations_go_in_one_transaction(driver: Driver) -> None:
    store = driver.make_store()
    gate = _Gate(store, others=5)
    m = manager_on(gate)  # type: ignore[arg-type]
    m.create(meta(1))  # the parent directories exist from here on
    gate.creates, gate.transactions, gate.manager = 0, 0, m
    metas = [meta(i) for i in range(2, 8)]
    assert _create_together(m, metas) == {i: None for i in range(2, 8)}
    assert (gate.creates, gate.transactions) == (1, 1)  # the first alone, the five behind it together
    assert m._creates.joined - m._creates.groups >= 4
    for md in metas:
        assert m.read(md.ledger_id) == (md, 0)


def test_a_group_that_fails_is_made_one_by_one_with_each_ones_own_answer(driver: Driver) -> None:
    store = driver.make_store()
    gate = _Gate(store, others=4)
    m = manager_on(gate)  # type: ignore[arg-type]
    m.create(meta(1))
    landed, taken = meta(3), meta(4)
    store.create(m.path(3), landed.encode())  # ours, its reply lost
    store.create(m.path(4), meta(4).encode())  # someone else's (another salt)
    gate.creates, gate.transactions, gate.manager = 0, 0, m
    metas = [meta(2), landed, taken, meta(5), meta(10_000 * 3)]  # the last: a parent directory to make
    made = [metas[0], landed, metas[3], metas[4]]
    outcome = _create_together(m, metas)
    assert isinstance(outcome.pop(4), LedgerExistsError)
    assert outcome == {2: None, 3: None, 5: None, 30_000: None}
    assert gate.transactions == 1 and gate.creates == 1 + 4  # the group refused, then each alone
    for md in made:
        assert m.read(md.ledger_id) == (md, 0)


class _SlowStore:
    """A store whose first plain create waits until ``queued`` creations wait behind it
    (then fails with ``error``, if given); it records every group it is sent."""

    def __init__(self, queued: int, error: Exception | None = None) -> None:
        self.queued, self.error = queued, error
        self.joiner: Any = None
        self.creates: list[str] = []
        self.groups: list[list[str]] = []
        self.lock = threading.Lock()

    def create(self, path: str, data: bytes, make_parents: bool = False) -> str:
        with self.lock:
            first = not self.creates
            self.creates.append(path)
        if first:
            wait_for(lambda: len(self.joiner._waiting) >= self.queued, 10)
            if self.error is not None:
                raise self.error
        return path

    def transaction(self, ops: list[Any]) -> list[Any]:
        self.groups.append([op.path for op in ops])
        if self.error is not None:
            raise self.error
        return [op.path for op in ops]


def _join(joiner: Any, paths: list[str], data: bytes = b"x") -> dict[str, BaseException | None]:
    return _at_once(lambda path: joiner.create(path, data), paths)


def test_an_unanswering_store_fails_the_group_and_every_creation_queued_behind_it_at_once() -> None:
    from walkit.errors import MetadataUnavailableError
    from walkit.metadata._creates import CreateJoiner

    store = _SlowStore(queued=7, error=MetadataUnavailableError("down", path="/n"))
    store.joiner = joiner = CreateJoiner(store, max_ops=4)  # type: ignore[arg-type]
    outcome = _join(joiner, [f"/n{i}" for i in range(8)])
    assert all(isinstance(e, MetadataUnavailableError) for e in outcome.values()) and len(outcome) == 8
    assert len(store.creates) == 1 and store.groups == []  # one wait for all eight: no transaction, none alone
    assert joiner._waiting == [] and not joiner._leading


def test_groups_stay_within_their_count_and_bytes_and_every_creation_is_made() -> None:
    from walkit.metadata._creates import CreateJoiner

    store = _SlowStore(queued=99)
    store.joiner = joiner = CreateJoiner(store, max_ops=64, max_bytes=1000)  # type: ignore[arg-type]
    outcome = _join(joiner, [f"/n{i}" for i in range(100)], data=b"d" * 30)
    assert outcome == {f"/n{i}": None for i in range(100)}
    made = store.creates + [p for g in store.groups for p in g]
    assert sorted(made) == sorted(f"/n{i}" for i in range(100))  # each once
    assert all(2 <= len(g) <= 1000 // 30 for g in store.groups), [len(g) for g in store.groups]
    assert joiner.groups == 1 + len(store.groups) and joiner.joined == 100


def test_a_node_larger_than_a_group_goes_alone() -> None:
    from walkit.metadata._creates import CreateJoiner

    store = _SlowStore(queued=2)
    store.joiner = joiner = CreateJoiner(store, max_ops=64, max_bytes=100)  # type: ignore[arg-type]
    outcome = _join(joiner, ["/a", "/b", "/c"], data=b"d" * 150)
    assert outcome == {"/a": None, "/b": None, "/c": None}
    assert store.groups == [] and sorted(store.creates) == ["/a", "/b", "/c"]
