"""The baton (walkit/client/_baton.py): a lone synchronous caller runs the client's loop
on its own thread and wakes no other; work from any other thread gives the loop back to
the loop thread; SIGINT never lands inside a callback the caller runs; stop while a caller
drives. A plain LoopThread, calls whose futures its callbacks complete; counters, not
timings, say which thread ran what."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from walkit.client import LoopThread
from walkit.client._baton import Baton

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    lt = LoopThread("test-baton", stop_at_exit=False)
    lt.quiet = lambda: True
    try:
        yield lt
    finally:
        lt.stop()


def _baton(lt: LoopThread, tick: float = 3600.0) -> Baton:
    baton = lt._make_baton()
    assert baton is not None
    baton.slice, baton.tick = 3600.0, tick  # the loop thread never takes the loop back by itself here: only when woken
    return baton


def _later(lt: LoopThread, steps: int) -> concurrent.futures.Future[int]:
    """A call that takes ``steps`` more iterations of the loop; its future gives the thread
    that completed it."""
    fut: concurrent.futures.Future[int] = concurrent.futures.Future()

    def step(n: int) -> None:
        if n:
            lt.loop.call_soon(step, n - 1)
        else:
            fut.set_result(threading.get_ident())

    lt.call(step, steps)
    return fut


def _until_parked(baton: Baton, lt: LoopThread) -> None:
    """A first call is handed over; the loop thread parks once it is done."""
    deadline = time.monotonic() + 10
    while baton.state != "parked":
        assert time.monotonic() < deadline, baton.state
        lt.lone_run(_later, lt, 50).result()  # (done before the caller told the loop it is alone: not parked)
        time.sleep(0.001)


def test_a_lone_caller_runs_the_loop_itself_and_wakes_nobody(loop: LoopThread) -> None:
    baton = _baton(loop)
    assert loop.lone_run(_later, loop, 50).result() == loop._thread.ident  # the first one is handed over
    _until_parked(baton, loop)
    iterations, pokes = baton.loop_iterations, baton.pokes
    me = threading.get_ident()
    for steps in range(20):
        assert loop.lone_run(_later, loop, steps).result() == me
        assert baton.state == "parked" and not loop.in_loop()
    assert (baton.loop_iterations, baton.pokes) == (iterations, pokes)
    assert loop.run(asyncio.sleep(0, "still the loop's")) == "still the loop's"  # handed back when asked
    assert baton.state == "loop" and baton.pokes == pokes + 1


def test_work_from_another_thread_takes_the_loop_back(loop: LoopThread) -> None:
    baton = _baton(loop)
    _until_parked(baton, loop)
    started = threading.Event()
    seen: list[Any] = []

    def start() -> concurrent.futures.Future[int]:
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        assert loop.in_loop() and baton.state == "held"
        started.set()
        return fut  # completed by the other thread's call, below

    def other() -> None:
        started.wait(10)
        loop.call(lambda: seen.append(loop.in_loop()))
        loop.call(fut_holder[0].set_result, 7)

    fut_holder: list[concurrent.futures.Future[int]] = []

    def start_kept() -> concurrent.futures.Future[int]:
        fut = start()
        fut_holder.append(fut)
        return fut

    thread = threading.Thread(target=other)
    thread.start()
    assert loop.lone_run(start_kept).result() == 7
    thread.join(10)
    assert baton.state == "loop" and seen == [True]
    assert loop.run(asyncio.sleep(0, 1)) == 1


def test_a_second_caller_gets_the_loop_thread(loop: LoopThread) -> None:
    baton = _baton(loop)
    _until_parked(baton, loop)
    gate = threading.Event()
    results: list[int] = []

    def first() -> concurrent.futures.Future[int]:
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        gate.set()
        loop.loop.call_later(30, fut.set_result, -1)  # done by the second caller's call, below

        def second() -> None:
            results.append(loop.lone_run(_later, loop, 2).result())  # handed over: the loop thread ran it
            loop.call(fut.set_result, 1)

        threading.Thread(target=second).start()
        return fut

    assert loop.lone_run(first).result() == 1
    deadline = time.monotonic() + 10
    while not results:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert results == [loop._thread.ident] and gate.is_set()


def test_sigint_inside_a_callback_waits_for_the_iteration(loop: LoopThread) -> None:
    baton = _baton(loop)
    _until_parked(baton, loop)
    ran: list[str] = []

    def start() -> concurrent.futures.Future[int]:
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()

        def callback() -> None:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C in the middle of a callback the caller runs
            ran.append("after the signal")
            fut.set_result(1)

        loop.call(callback)
        return fut

    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        loop.lone_run(start)
    assert ran == ["after the signal"]  # the callback ran whole; the interrupt came after it
    assert signal.getsignal(signal.SIGINT) is handler
    assert baton.state == "loop" and loop.run(asyncio.sleep(0, 2)) == 2


def test_sigint_while_the_caller_waits_for_its_answer(loop: LoopThread) -> None:
    baton = _baton(loop)
    _until_parked(baton, loop)
    pending: list[concurrent.futures.Future[int]] = []

    def start() -> concurrent.futures.Future[int]:
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        pending.append(fut)
        threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT)).start()
        return fut  # no answer until the test gives one: the caller waits in select

    with pytest.raises(KeyboardInterrupt):
        loop.lone_run(start)
    assert baton.state == "loop"
    loop.call(pending[0].set_result, 3)  # the call goes on, on the loop thread
    assert pending[0].result(10) == 3


def test_stop_while_a_caller_runs_the_loop(loop: LoopThread) -> None:
    baton = _baton(loop)
    _until_parked(baton, loop)
    outcome: list[BaseException] = []
    driving = threading.Event()

    def start() -> concurrent.futures.Future[None]:
        driving.set()
        return loop.submit(asyncio.sleep(3600))  # cancelled by stop

    def caller() -> None:
        try:
            loop.lone_run(start).result()
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    assert driving.wait(10)
    loop.stop()
    thread.join(10)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], concurrent.futures.CancelledError)
    assert baton.closed and loop.stopped


def test_no_baton_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.setenv("WALKIT_EVENT_LOOP", "uvloop")
    lt = LoopThread("test-baton-uvloop", stop_at_exit=False)
    lt.quiet = lambda: True
    try:
        for _ in range(3):
            assert lt.lone_run(_later, lt, 1).result() == lt._thread.ident  # handed over, every time
        assert lt.baton is None
    finally:
        lt.stop()


def test_no_parking_while_a_submitted_coroutine_runs(loop: LoopThread) -> None:
    """Another thread's ``run`` may be waiting for a bookie's answer on a socket: the loop
    thread stays in epoll for it, however alone the synchronous caller is."""
    baton = _baton(loop)
    _until_parked(baton, loop)
    release = asyncio.Event()

    async def waiting() -> str:
        await release.wait()
        return "answered"

    pending = loop.submit(waiting())  # (from this thread: the loop thread takes the loop back)
    for _ in range(20):
        assert loop.lone_run(_later, loop, 50).result() == loop._thread.ident  # handed over, every time
        assert baton.state == "loop"
    loop.call(release.set)
    assert pending.result(10) == "answered"
    _until_parked(baton, loop)


def test_a_call_done_when_started_returns_at_once(loop: LoopThread) -> None:
    """A call whose future is done before the loop runs anything - an add on a writer that
    already failed - returns at once, the baton parked again: the caller does not wait in
    a select that nothing would wake (no timer, nothing ready, no answer owed)."""
    baton = _baton(loop)
    _until_parked(baton, loop)
    iterations, pokes = baton.loop_iterations, baton.pokes

    def failed_already() -> concurrent.futures.Future[int]:
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        fut.set_exception(RuntimeError("the writer failed before"))
        return fut

    got: list[BaseException | None] = []
    caller = threading.Thread(target=lambda: got.append(loop.lone_run(failed_already).exception()))
    caller.start()
    caller.join(10)
    assert not caller.is_alive(), "the lone caller waits in select for nothing"
    assert [str(e) for e in got] == ["the writer failed before"]
    assert baton.state == "parked" and (baton.loop_iterations, baton.pokes) == (iterations, pokes)


def _arming(lt: LoopThread, delay: float, fired: list[int],
            armed: list[asyncio.TimerHandle]) -> concurrent.futures.Future[int]:
    """A lone call that arms a timer (as a writer going idle arms its idle LAC) and is done."""
    fut: concurrent.futures.Future[int] = concurrent.futures.Future()
    armed.append(lt.loop.call_later(delay, lambda: fired.append(threading.get_ident())))
    fut.set_result(threading.get_ident())
    return fut


def _cancelling(lt: LoopThread, armed: list[asyncio.TimerHandle]) -> concurrent.futures.Future[int]:
    """A lone call that cancels the timers armed before it (the next append carried the LAC)."""
    for handle in armed:
        handle.cancel()
    armed.clear()
    fut: concurrent.futures.Future[int] = concurrent.futures.Future()
    fut.set_result(threading.get_ident())
    return fut


def test_a_timer_a_drive_armed_runs_on_the_parked_loop_thread(loop: LoopThread) -> None:
    """A driver parks the baton without waking anyone: the parked loop thread looks every
    ``tick`` and runs a timer that came due meanwhile (a writer's idle LAC after its
    wait), taking the loop back."""
    baton = _baton(loop, tick=0.001)
    _until_parked(baton, loop)
    fired: list[int] = []
    armed: list[asyncio.TimerHandle] = []
    assert loop.lone_run(_arming, loop, 0.02, fired, armed).result() == threading.get_ident()
    assert baton.state == "parked" and not fired  # the driver did not wait for its timer
    _look(baton)
    deadline = time.monotonic() + 10
    while not fired:
        assert time.monotonic() < deadline, "a timer armed by a drive never ran"
        time.sleep(0.001)
    assert fired == [loop._thread.ident] and baton.state == "loop"


def test_a_timer_the_next_drive_cancelled_takes_nothing_back(loop: LoopThread) -> None:
    """Each drive cancels the timer the one before it armed and arms its own (an append
    carries the LAC the one before it owed, and owes its own): the parked loop thread,
    looking every ``tick`` while drives leave such near timers, skips cancelled ones - it
    never runs the loop, whatever their due times were."""
    baton = _baton(loop, tick=0.001)
    _until_parked(baton, loop)
    fired: list[int] = []
    armed: list[asyncio.TimerHandle] = []
    me = threading.get_ident()
    assert loop.lone_run(_arming, loop, 0.005, fired, armed).result() == me
    _look(baton)
    iterations, pokes, looks = baton.loop_iterations, baton.pokes, baton.park_looks
    for _ in range(30):
        assert loop.lone_run(_rearming, loop, 0.005, fired, armed).result() == me
        time.sleep(0.002)  # the loop thread looks meanwhile, before the live one is due
    assert loop.lone_run(_cancelling, loop, armed).result() == me
    time.sleep(0.02)  # past every cancelled timer's due time
    assert fired == [] and baton.state == "parked"
    assert (baton.loop_iterations, baton.pokes) == (iterations, pokes), "a cancelled timer took the loop back"
    assert baton.park_looks - looks >= 15, "the parked loop thread did not look every tick"


def _rearming(lt: LoopThread, delay: float, fired: list[int],
              armed: list[asyncio.TimerHandle]) -> concurrent.futures.Future[int]:
    _cancelling(lt, armed)
    return _arming(lt, delay, fired, armed)


def test_drives_that_leave_no_near_timer_cost_the_loop_thread_no_look(loop: LoopThread) -> None:
    """A plain ledger's lone adds leave no timer due within a slice (the add-timeout sweep
    is seconds away): the parked loop thread waits a whole slice, not a tick."""
    baton = _baton(loop, tick=0.001)
    _until_parked(baton, loop)
    _look(baton)
    looks, me = baton.park_looks, threading.get_ident()
    far: list[asyncio.TimerHandle] = []
    for _ in range(20):
        assert loop.lone_run(_arming, loop, 600.0, [], far).result() == me  # a timer minutes away
        time.sleep(0.002)
    assert baton.park_looks - looks <= 2, "the loop thread looked every tick with no near timer"
    for handle in far:
        loop.call(handle.cancel)


def _look(baton: Baton) -> None:
    """Make the parked loop thread look at the baton now (it reads which wait it takes:
    a slice, or a tick while drives leave near timers), and wait until it did."""
    looks = baton.park_looks
    deadline = time.monotonic() + 10
    while baton.park_looks == looks:
        assert time.monotonic() < deadline, "the parked loop thread never looked"
        with baton._cond:
            baton._cond.notify_all()
        time.sleep(0.001)


def test_a_keyboard_interrupt_at_any_python_step_of_a_call_never_leaves_the_baton_locked(loop: LoopThread) -> None:
    """A KeyboardInterrupt can be raised at any Python step of the caller. Raised at the
    start of ``threading.Condition.__exit__`` (a Python frame) it left the baton's lock
    held, and the loop thread hung waiting for it. Here an interrupt is raised at the first
    ``__exit__`` the baton calls in threading.py, at every lone call: the baton takes its
    lock as the C lock itself, so there is no such call, and the lock stays free."""
    import sys

    baton = _baton(loop)
    _until_parked(baton, loop)
    threading_file = threading.__file__
    raised: list[str] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_filename == threading_file and frame.f_code.co_name == "__exit__" \
                and frame.f_back is not None and frame.f_back.f_code.co_filename.endswith("_baton.py"):
            raised.append(frame.f_code.co_name)
            raise KeyboardInterrupt
        return None

    for steps in range(5):
        sys.settrace(tracer)
        try:
            loop.lone_run(_later, loop, steps).result()
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        free: list[bool] = []

        def take() -> None:
            free.append(baton._lock.acquire(timeout=5))
            if free[-1]:
                baton._lock.release()

        taker = threading.Thread(target=take)
        taker.start()
        taker.join()
        assert free == [True], f"the baton's lock was left held ({raised})"
    assert raised == []
    assert loop.run(asyncio.sleep(0, "alive")) == "alive"
