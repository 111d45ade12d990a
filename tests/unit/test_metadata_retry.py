"""The one retry policy for a metadata change that lost its compare-and-set
(walkit/metadata/_retry.py): retried with random waits under a growing cap, bounded, a
clear error when it gives up, nothing but a lost compare-and-set retried; and writers
contending for one node of a real store all land."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from walkit.errors import MetadataVersionError, WriterFencedError
from walkit.metadata import LocalMetadataStore, retry_cas
from walkit.metadata import _retry


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The waits retry_cas would sleep, recorded instead of slept."""
    recorded: list[float] = []
    monkeypatch.setattr(_retry, "_nap", recorded.append)
    yield recorded


def _losing(times: int) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def change() -> str:
        calls.append(len(calls))
        if len(calls) <= times:
            raise MetadataVersionError("version moved", attempt=len(calls))
        return "landed"

    return calls, change


def test_a_lost_compare_and_set_is_made_again_after_a_random_wait_under_a_growing_cap(waits: list[float]) -> None:
    calls, change = _losing(8)
    assert retry_cas(change, "the node") == "landed"
    assert len(calls) == 9 and len(waits) == 8
    for i, wait in enumerate(waits):  # full jitter: uniform below FIRST_WAIT * 2^i, at most MAX_WAIT
        assert 0 <= wait <= min(_retry.MAX_WAIT, _retry.FIRST_WAIT * 2**i), (i, waits)
    assert len(set(waits)) > 1, f"the waits are random, not in lock step: {waits}"
    assert max(waits[5:]) > _retry.FIRST_WAIT, f"the cap grows: {waits}"


def test_giving_up_says_what_kept_changing(waits: list[float]) -> None:
    calls, change = _losing(1000)
    with pytest.raises(MetadataVersionError) as info:
        retry_cas(change, "log metadata (a test)", attempts=7, log="orders")
    assert len(calls) == 7 and len(waits) == 6
    error = info.value
    assert "log metadata (a test) kept changing: gave up after 7 attempts" in str(error)
    assert error.context["attempts"] == 7 and error.context["log"] == "orders" and "seconds" in error.context
    assert isinstance(error.__cause__, MetadataVersionError) and error.__cause__.context["attempt"] == 7


def test_only_a_lost_compare_and_set_is_retried(waits: list[float]) -> None:
    calls: list[int] = []

    def fenced() -> None:
        calls.append(1)
        raise WriterFencedError("another writer opened the log", log="orders")

    with pytest.raises(WriterFencedError):
        retry_cas(fenced, "log metadata")
    assert calls == [1] and waits == []


def test_writers_contending_for_one_node_all_land(tmp_path: Path) -> None:
    store = LocalMetadataStore(str(tmp_path / "metadata"), create=True)
    store.create("/counter", b"0")
    errors: list[BaseException] = []

    def increment() -> None:
        data, stat = store.get("/counter")
        store.set("/counter", b"%d" % (int(data) + 1), stat.version)

    def writer() -> None:
        try:
            for _ in range(25):
                retry_cas(increment, "the counter")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors[0]
        assert store.get("/counter")[0] == b"200"
    finally:
        store.close()
