"""A writer's ``max_pending_adds`` slots given back by the client's loop without the lock
(walkit/client/_submit.py, ``Slots.give_back``): what is given back is taken again once
``free`` runs out, a thread waiting for a slot is woken by it - however the two threads
interleave - and a release past the limit still raises."""

from __future__ import annotations

import threading

import pytest

from walkit.client._submit import Slots


def test_slots_given_back_are_taken_once_free_runs_out() -> None:
    slots = Slots(2, threading.Lock())
    assert slots.acquire(False) and slots.acquire(False) and not slots.acquire(False)
    slots.give_back(2)
    assert slots.free == 0  # not folded yet: only a taker that finds none free folds
    assert slots.acquire(False) and slots.acquire(False) and not slots.acquire(False)
    slots.give_back(1)
    slots.release()  # the locked way and the loop's way together
    assert slots.acquire(False) and slots.acquire(False) and not slots.acquire(False)


def test_a_release_past_the_limit_counts_what_was_given_back() -> None:
    slots = Slots(2, threading.Lock())
    assert slots.acquire(False)
    slots.give_back(1)
    with pytest.raises(ValueError):
        slots.release()


def test_a_waiting_taker_is_woken_by_what_the_loop_gives_back() -> None:
    """A thread taking 5,000 slots of 2, one at a time, against a "loop" thread giving
    each back as soon as it sees it taken: the taker waits again and again, and is never
    left waiting (a lost wake-up would stop it: the loop has nothing more to give)."""
    slots, rounds = Slots(2, threading.Lock()), 5000
    taken = threading.Semaphore(0)
    done = threading.Event()

    def taker() -> None:
        for _ in range(rounds):
            assert slots.acquire()
            taken.release()
        done.set()

    def loop() -> None:
        for _ in range(rounds):
            assert taken.acquire(timeout=10)
            slots.give_back(1)

    threads = [threading.Thread(target=taker, daemon=True), threading.Thread(target=loop, daemon=True)]
    for thread in threads:
        thread.start()
    assert done.wait(30), "a thread waiting for a slot was not woken by give_back"
    for thread in threads:
        thread.join(10)
    assert slots.acquire(False) and slots.acquire(False) and not slots.acquire(False)
