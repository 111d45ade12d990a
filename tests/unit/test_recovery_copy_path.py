"""Which way a fragment's copies travel (walkit.recovery._plan.copy_path, pure): pushed by a
walkit bookie when every bookie that may be asked and the target are walkit bookies and
a bookie can check the digest; copied by the client otherwise (issue 37)."""

from __future__ import annotations

import pytest

from walkit.metadata import BK_DIGESTS, BOOKIE_CHECKED_DIGESTS
from walkit.recovery._plan import FragmentWork, asked_sources, copy_path

ENSEMBLE = ("a:1", "b:1", "c:1", "d:1", "e:1")


def _work(digest: str = "bk-crc32c", position: int = 0, write_quorum: int = 2, last: int = 99) -> FragmentWork:
    return FragmentWork(7, 0, last, position, ENSEMBLE, write_quorum, digest)


def _kinds(java: tuple[str, ...] = (), gone: tuple[str, ...] = ("a:1",)) -> dict[str, str]:
    kinds = {b: "bookkeeper" if b in java else "walkit" for b in (*ENSEMBLE, "t:1", "u:1") if b not in gone}
    kinds["u:1"] = "bookkeeper"
    return kinds


def test_asked_sources_are_the_write_set_neighbours_of_the_lost_bookie() -> None:
    # E=5, Qw=2: a (position 0) holds entries whose write set starts at e (a, b) or d... (e, a)
    assert asked_sources(_work()) == {"b:1", "e:1"}
    assert asked_sources(_work(write_quorum=3)) == {"b:1", "c:1", "d:1", "e:1"}
    assert asked_sources(_work(last=0)) == {"b:1"}  # one entry: its write set only
    assert asked_sources(_work(last=-1)) == set()  # an empty fragment


@pytest.mark.parametrize("digest", ["crc32c", "mac", "none", "bk-crc32", "bk-crc32c", "bk-dummy"])
def test_walkit_bookies_push_what_a_bookie_can_check(digest: str) -> None:
    assert copy_path(_work(digest), _kinds(), "t:1") == "push"


def test_bk_hmac_goes_by_the_client_even_between_walkit_bookies() -> None:
    assert "bk-hmac" not in BOOKIE_CHECKED_DIGESTS and set(BK_DIGESTS) - set(BOOKIE_CHECKED_DIGESTS) == {"bk-hmac"}
    assert copy_path(_work("bk-hmac"), _kinds(), "t:1") == "client"


def test_a_java_target_or_asked_source_makes_it_a_client_copy() -> None:
    assert copy_path(_work(), _kinds(), "u:1") == "client"  # the target is a Java bookie
    assert copy_path(_work(), _kinds(java=("b:1",)), "t:1") == "client"  # a source that may be asked is
    # a Java bookie of the ensemble that holds none of the lost share is never asked
    assert copy_path(_work(), _kinds(java=("c:1",)), "t:1") == "push"
    # a Java source that is not running is not asked either
    assert copy_path(_work(), _kinds(java=("b:1",), gone=("a:1", "b:1")), "t:1") == "push"


def test_a_java_last_resort_makes_it_a_client_copy() -> None:
    kinds = _kinds(java=("a:1",), gone=())
    assert copy_path(_work(), kinds, "t:1") == "push"  # the lost Java bookie is not among the sources
    assert copy_path(_work(), kinds, "t:1", last_resort="a:1") == "client"
    assert copy_path(_work(), _kinds(gone=()), "t:1", last_resort="a:1") == "push"


def test_an_unregistered_target_is_not_taken_for_a_walkit_bookie() -> None:
    assert copy_path(_work(), _kinds(), "nobody:1") == "client"
