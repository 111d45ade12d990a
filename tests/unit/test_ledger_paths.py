"""Ledger paths: BookKeeper's flat and hierarchical layouts, strict parsing, ordered walks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from walkit.errors import InvalidArgumentError
from walkit.metadata._paths import (
    iter_ledger_ids,
    ledger_path,
    ledger_path_prefixes,
    parse_ledger_path,
)

MAX_ID = (1 << 63) - 1
BOUNDARY = (1 << 31) - 1  # Integer.MAX_VALUE: BookKeeper's switch to the long path

ids = st.one_of(
    st.integers(0, MAX_ID),
    st.integers(BOUNDARY - 1000, BOUNDARY + 1000),
    st.integers(0, 10_000),
    st.sampled_from([0, BOUNDARY - 1, BOUNDARY, BOUNDARY + 1, 1 << 31, MAX_ID]),
)
layouts = st.sampled_from(["hierarchical", "flat"])


@pytest.mark.parametrize(
    ("ledger_id", "layout", "path"),
    [
        (1, "hierarchical", "/ledgers/00/0000/L0001"),
        (0, "hierarchical", "/ledgers/00/0000/L0000"),
        (1234567890, "hierarchical", "/ledgers/12/3456/L7890"),
        (BOUNDARY - 1, "hierarchical", "/ledgers/21/4748/L3646"),
        (BOUNDARY, "hierarchical", "/ledgers/000/0000/0021/4748/L3647"),
        (1 << 31, "hierarchical", "/ledgers/000/0000/0021/4748/L3648"),
        (MAX_ID, "hierarchical", "/ledgers/922/3372/0368/5477/L5807"),
        (1, "flat", "/ledgers/L0000000001"),
        (1 << 31, "flat", "/ledgers/L2147483648"),
        (MAX_ID, "flat", "/ledgers/L9223372036854775807"),
    ],
)
def test_bookkeeper_examples(ledger_id: int, layout: str, path: str) -> None:
    assert ledger_path("/ledgers", ledger_id, layout) == path  # type: ignore[arg-type]
    assert parse_ledger_path("/ledgers", path, layout) == ledger_id  # type: ignore[arg-type]


def test_root_slash_and_prefixes() -> None:
    assert ledger_path("/", 1) == "/00/0000/L0001"
    assert ledger_path_prefixes("/ledgers", 1) == ("/ledgers/00", "/ledgers/00/0000")
    assert ledger_path_prefixes("/ledgers", 5, "flat") == ()
    assert len(ledger_path_prefixes("/x", 1 << 31)) == 4


@pytest.mark.parametrize("root", ["ledgers", "/ledgers/", "//ledgers", ""])
def test_bad_roots(root: str) -> None:
    with pytest.raises(InvalidArgumentError):
        ledger_path(root, 1)


@pytest.mark.parametrize("bad", [-1, 1 << 63, True])
def test_bad_ids(bad: int) -> None:
    with pytest.raises(InvalidArgumentError):
        ledger_path("/ledgers", bad)


def test_bad_layout() -> None:
    with pytest.raises(InvalidArgumentError, match="layout"):
        ledger_path("/ledgers", 1, "longhierarchical")  # type: ignore[arg-type]


@settings(max_examples=500)
@given(ids, layouts)
def test_round_trip(ledger_id: int, layout: str) -> None:
    path = ledger_path("/ledgers", ledger_id, layout)  # type: ignore[arg-type]
    assert parse_ledger_path("/ledgers", path, layout) == ledger_id  # type: ignore[arg-type]
    prefixes = ledger_path_prefixes("/ledgers", ledger_id, layout)  # type: ignore[arg-type]
    assert all(path.startswith(p + "/") for p in prefixes)


@pytest.mark.parametrize(
    ("path", "layout"),
    [
        ("/ledgers/00/0000/L001", "hierarchical"),  # short leaf
        ("/ledgers/00/0000/L00001", "hierarchical"),  # long leaf
        ("/ledgers/00/0000/X0001", "hierarchical"),
        ("/ledgers/00/0000/l0001", "hierarchical"),
        ("/ledgers/00/0000/L0001/", "hierarchical"),
        ("/ledgers/00/0000", "hierarchical"),
        ("/ledgers/0/00000/L0001", "hierarchical"),  # wrong split
        ("/ledgers/99/9999/L9999", "hierarchical"),  # legacy form of a long id
        ("/ledgers/000/0000/0000/0000/L0001", "hierarchical"),  # long form of a small id
        ("/ledgers/000/0000/0021/4748/L3646", "hierarchical"),  # long form just below the boundary
        ("/ledgers/922/3372/0368/5477/L5808", "hierarchical"),  # 2^63
        ("/ledgers/00/0000/L00١1", "hierarchical"),  # non-ASCII digit
        ("/ledgers/available", "hierarchical"),
        ("/ledgers/idgen/ID-0000000001", "hierarchical"),
        ("/other/00/0000/L0001", "hierarchical"),
        ("/ledgersX/00/0000/L0001", "hierarchical"),
        ("/ledgers/00/0000/L0001", "flat"),
        ("/ledgers/L000000001", "flat"),  # 9 digits
        ("/ledgers/L01234567890", "flat"),  # leading zero beyond 10 digits
        ("/ledgers/L+000000001", "flat"),
        ("/ledgers/L 000000001", "flat"),
        ("/ledgers/L9223372036854775808", "flat"),
        ("/ledgers/LAYOUT", "flat"),
        ("/ledgers/L0000000001", "hierarchical"),
    ],
)
def test_parse_rejects_foreign(path: str, layout: str) -> None:
    assert parse_ledger_path("/ledgers", path, layout) is None  # type: ignore[arg-type]


class FakeTree:
    """A store tree built from ledger paths, counting which directories are listed."""

    def __init__(self, root: str, paths: list[str], noise: dict[str, list[str]]) -> None:
        self.kids: dict[str, set[str]] = {root: set()}
        for path in paths:
            self._add(root, path)
        for parent, names in noise.items():
            self.kids.setdefault(parent, set()).update(names)
        self.listed: list[str] = []

    def _add(self, root: str, path: str) -> None:
        parent = root
        for name in path[len(root) + 1:].split("/"):
            self.kids.setdefault(parent, set()).add(name)
            parent = f"{parent}/{name}"
            self.kids.setdefault(parent, set())

    def children(self, path: str) -> list[str]:
        self.listed.append(path)
        names = list(self.kids[path])
        names.reverse()  # a store's order is arbitrary
        return names


NOISE = {
    "/ledgers": ["available", "cookies", "idgen", "LAYOUT", "INSTANCEID", "underreplication", "1", "abc", "0000"],
}


@settings(max_examples=200)
@given(st.sets(ids, max_size=40))
def test_hierarchical_walk_is_sorted_and_reads_only_its_dirs(id_set: set[int]) -> None:
    tree = FakeTree("/ledgers", [ledger_path("/ledgers", i) for i in id_set], NOISE)
    assert list(iter_ledger_ids("/ledgers", tree.children)) == sorted(id_set)
    expected = {"/ledgers"} | {p for i in id_set for p in ledger_path_prefixes("/ledgers", i)}
    assert sorted(tree.listed) == sorted(expected)  # each walked directory once, nothing else


@settings(max_examples=100)
@given(st.sets(ids, min_size=2, max_size=40))
def test_hierarchical_walk_is_lazy(id_set: set[int]) -> None:
    tree = FakeTree("/ledgers", [ledger_path("/ledgers", i) for i in id_set], NOISE)
    walk = iter_ledger_ids("/ledgers", tree.children)
    assert tree.listed == []
    assert next(walk) == min(id_set)
    first = min(id_set)
    assert tree.listed == ["/ledgers", *ledger_path_prefixes("/ledgers", first)]


@settings(max_examples=100)
@given(st.sets(ids, max_size=40))
def test_flat_walk_is_sorted(id_set: set[int]) -> None:
    noise = {"/ledgers": ["available", "L1", "L00000000001", "LAYOUT", "idgen"]}
    tree = FakeTree("/ledgers", [ledger_path("/ledgers", i, "flat") for i in id_set], noise)
    assert list(iter_ledger_ids("/ledgers", tree.children, "flat")) == sorted(id_set)
    assert tree.listed == ["/ledgers"]


def test_walk_skips_stray_leaves_and_empty_dirs() -> None:
    noise = {"/ledgers/00/0000": ["L12", "X0001", "L00١1"], "/ledgers/00": ["0001"], "/ledgers/00/0001": []}
    tree = FakeTree("/ledgers", ["/ledgers/00/0000/L0007"], noise)
    assert list(iter_ledger_ids("/", lambda p: tree.children("/ledgers" + p if p != "/" else "/ledgers"))) == [7]
    assert list(iter_ledger_ids("/ledgers", tree.children)) == [7]
