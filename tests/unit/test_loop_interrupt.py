"""Ctrl-C in ``for item in loop.iterate(agen)`` (a replay's or a tail's records): a
KeyboardInterrupt may be raised at any bytecode of the consumer's thread. Wherever it
comes, the client's loop must go on (nothing it needs left held by the consumer) and the
consumer must get the interrupt at once; the sequence is closed on the loop - at once,
or (an interrupt inside the clean-up's own first bytecodes) when the client closes.

The interrupt is raised by a trace function at the k-th bytecode of the consumer, for
every k from the first step to the end of the loop's clean-up (walkit/client/_loop.py,
``_Steps``): before the fix, one k left a ``concurrent.futures.Future``'s lock held by
the consumer and the loop blocked for good on it (``walkit log tail`` hung on Ctrl-C).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import AsyncGenerator
from types import FrameType
from typing import Any

import pytest

from walkit.client import LoopThread


class _Seen:
    def __init__(self) -> None:
        self.started = False
        self.closed = threading.Event()


async def _numbers(seen: _Seen) -> AsyncGenerator[int, None]:
    seen.started = True
    try:
        n = 0
        while True:
            await asyncio.sleep(0.001 if n % 2 else 0)  # a step that waits, one that does not
            yield n
            n += 1
    finally:
        seen.closed.set()


def _consume_interrupted_at(loop: LoopThread, k: int, seen: _Seen) -> str:
    """Take three items, a KeyboardInterrupt raised at the consumer's k-th bytecode;
    "interrupted", "lost" (Python dropped it), or "done" when there were fewer than k."""
    ops = 0
    fired = False

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal ops, fired
        if event == "opcode":
            ops += 1
            if ops == k:
                fired = True
                raise KeyboardInterrupt  # (a trace function that raises is unset)
        return local

    def every_frame(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return local

    outcome = ["stuck"]

    def consume() -> None:
        sys.settrace(every_frame)
        try:
            items = loop.iterate(_numbers(seen))
            try:
                for n in items:
                    if n == 2:
                        break
            finally:
                items.close()  # type: ignore[attr-defined]  # here: an exception where it is freed is lost
            outcome[0] = "done"
        except KeyboardInterrupt:
            outcome[0] = "interrupted"
        finally:
            sys.settrace(None)

    consumer = threading.Thread(target=consume)
    consumer.start()
    consumer.join(5)
    assert not consumer.is_alive(), f"the consumer interrupted at bytecode {k} did not return"
    if not fired:
        return "done"
    return "lost" if outcome[0] == "done" else outcome[0]  # lost: raised in a weakref callback, as Python does


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the ones Python drops
def test_an_interrupt_at_any_bytecode_of_the_consumer_leaves_the_loop_running() -> None:
    loop = LoopThread("interrupt-test")
    sequences: list[_Seen] = []
    try:
        for k in range(1, 100_000):
            seen = _Seen()
            sequences.append(seen)
            outcome = _consume_interrupted_at(loop, k, seen)
            began = time.monotonic()
            loop.run(asyncio.sleep(0), timeout=5)  # the loop goes on: nothing it needs is held
            assert time.monotonic() - began < 2, f"the loop was stuck after an interrupt at bytecode {k}"
            if outcome == "done":
                assert seen.closed.wait(5)
                break
    finally:
        loop.stop()
    assert len(sequences) > 300  # every bytecode of three steps and a clean-up, one at a time
    assert all(s.closed.is_set() for s in sequences if s.started)
