"""The journal's flush claim (bookie.journal._claim): one flush at a time, and the
wake-ups of its release - the thread waiting for the flush to end, and nobody else."""

from __future__ import annotations

import threading

import pytest

from bookie.journal._claim import FlushClaim


def test_release_with_nobody_waiting_notifies_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    """An inline flush (claim, write, release) with the journal thread parked elsewhere
    makes no Python-level notify: the idle condition is notified only when waited on."""
    claim = FlushClaim()
    notified: list[str] = []
    monkeypatch.setattr(claim._idle, "notify_all", lambda: notified.append("idle"))
    for _ in range(3):
        assert claim.claim()
        assert not claim.claim()  # one flush at a time
        assert claim.busy
        claim.release()
        assert not claim.busy
    assert notified == []


def test_release_wakes_the_thread_waiting_for_the_flush() -> None:
    claim = FlushClaim()
    assert claim.claim()
    entered = threading.Event()
    result: list[bool] = []

    def dead() -> bool:
        entered.set()
        return False

    waiter = threading.Thread(target=lambda: result.append(claim.wait_idle(dead)), daemon=True)
    waiter.start()
    assert entered.wait(5)
    for _ in range(500):  # until it waits (its count is taken under the claim's lock)
        with claim._lock:
            if claim._idle_waiters:
                break
        threading.Event().wait(0.01)
    assert claim._idle_waiters == 1
    claim.release()
    waiter.join(5)
    assert not waiter.is_alive() and result == [True]
    assert claim._idle_waiters == 0
    assert not claim.wait_idle(lambda: False)  # nothing in flight: no wait


def test_wait_idle_ends_when_the_journal_dies_and_a_release_wakes_it() -> None:
    claim = FlushClaim()
    assert claim.claim()
    dying = threading.Event()
    waiter = threading.Thread(target=claim.wait_idle, args=(dying.is_set,), daemon=True)
    waiter.start()
    for _ in range(500):
        with claim._lock:
            if claim._idle_waiters:
                break
        threading.Event().wait(0.01)
    dying.set()
    claim.stop()  # the journal thread ended: every waiter wakes and sees the death
    waiter.join(5)
    assert not waiter.is_alive()
