"""When a writer sends its LAC on its own (walkit/client/_writer_lac.py, LacPublisher),
on a plain asyncio loop with a stand-in writer: the idle LAC leaves at once after a long
idle spell, waits ``idle_lac_delay`` after a short one (a writer appending back to back),
is cancelled by the next entry that carries it, and leaves once the delay is over when
none comes. The idle spells are timed with a clock the test moves."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from walkit.client import _writer_lac
from walkit.client._config import ClientConfig
from walkit.client._writer_lac import LacPublisher
from walkit.metadata import LedgerState

DELAY = 0.05


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Clock]:
    clock = _Clock()
    monkeypatch.setattr(_writer_lac, "time", clock)
    yield clock


def _writer(sent: list[tuple[str, int]], **config: Any) -> Any:
    """A stand-in LedgerWriter: what LacPublisher reads of it, and a pool that records sends."""
    writer = SimpleNamespace(ledger_id=7, key=b"k", recovery=False, lac=-1, error=None, pending=[],
                             ensemble=["a", "b", "c"], failed=set(),
                             meta=SimpleNamespace(state=LedgerState.OPEN), queue=SimpleNamespace(queued=False),
                             codec=SimpleNamespace(lac_body=lambda ledger, lac: b""))
    pool = SimpleNamespace(request_cb=lambda bookie, req, cb, ctx: sent.append((bookie, req.lac)))
    config.setdefault("idle_lac", True)
    writer.core = SimpleNamespace(config=ClientConfig(**config), pool=pool, last_idle_writer=None, last_idle_at=0.0)
    return writer


def _run(body: Any) -> None:
    asyncio.run(body())


def test_a_writer_that_idles_long_publishes_at_once(clock: _Clock) -> None:
    sent: list[tuple[str, int]] = []

    async def body() -> None:
        writer = _writer(sent, idle_lac_delay=DELAY)
        lacs = LacPublisher(writer, -1)
        for lac in range(3):
            writer.lac = lac
            lacs.went_idle(["a", "b"])
            assert sent[-2:] == [("a", lac), ("b", lac)], "an idle LAC after a long idle spell waited"
            clock.now += 1.0  # a long idle spell, then the next entry
            lacs.carried(lac)
        assert len(sent) == 6

    _run(body)


def test_a_writer_appending_back_to_back_sends_no_idle_lac(clock: _Clock) -> None:
    sent: list[tuple[str, int]] = []

    async def body() -> None:
        writer = _writer(sent, idle_lac_delay=DELAY)
        lacs = LacPublisher(writer, -1)
        writer.lac = 0
        lacs.went_idle(["a", "b"])
        assert sent == [("a", 0), ("b", 0)]  # nothing known of its spells yet: at once
        clock.now += DELAY / 10  # a short spell: the next entry came at once
        lacs.carried(0)
        for lac in range(1, 50):
            writer.lac = lac
            lacs.went_idle(["a", "b"])
            await asyncio.sleep(0)
            clock.now += DELAY / 10
            lacs.carried(lac)  # the next entry carries it: the wait is cancelled
        await asyncio.sleep(DELAY * 3)
        assert sent == [("a", 0), ("b", 0)], "a writer appending back to back sent idle LACs"
        writer.lac = 50
        lacs.went_idle(["b", "c"])  # it stops here
        assert sent == [("a", 0), ("b", 0)]
        await asyncio.sleep(DELAY * 3)
        assert sent == [("a", 0), ("b", 0), ("b", 50), ("c", 50)], "the stopped writer's LAC never left"
        clock.now += 1.0  # after that long spell, the next idle LAC leaves at once again
        lacs.carried(50)
        writer.lac = 51
        lacs.went_idle(["a", "b"])
        assert sent[-2:] == [("a", 51), ("b", 51)]

    _run(body)


def test_no_idle_lac_after_the_writer_failed_or_closed_or_got_an_add(clock: _Clock) -> None:
    sent: list[tuple[str, int]] = []

    async def body() -> None:
        writer = _writer(sent, idle_lac_delay=DELAY)
        lacs = LacPublisher(writer, -1)
        writer.lac = 0
        lacs.went_idle(None)
        clock.now += DELAY / 10
        lacs.carried(0)
        before = len(sent)
        for stop in ("error", "closed", "queued", "stopped"):
            writer.lac += 1
            lacs.went_idle(None)
            if stop == "error":
                writer.error = RuntimeError("failed")
            elif stop == "closed":
                writer.meta.state = LedgerState.CLOSED
            elif stop == "queued":
                writer.queue.queued = True  # an add on its way carries it
            else:
                lacs.stop()  # the writer closes
            await asyncio.sleep(DELAY * 3)
            assert len(sent) == before, f"an idle LAC left after the writer {stop}"
            writer.error, writer.meta.state, writer.queue.queued = None, LedgerState.OPEN, False

    _run(body)


def test_a_delay_of_zero_always_publishes_at_once(clock: _Clock) -> None:
    sent: list[tuple[str, int]] = []

    async def body() -> None:
        writer = _writer(sent, idle_lac_delay=0)
        lacs = LacPublisher(writer, -1)
        for lac in range(5):
            writer.lac = lac
            lacs.went_idle(["a"])
            lacs.carried(lac)  # back to back
        assert sent == [("a", lac) for lac in range(5)]

    _run(body)


def test_a_plain_ledgers_idle_lac_yields_to_a_crowd(clock: _Clock) -> None:
    """idle_lac=None: a writer going idle within CROWD of another writer of the same client
    sends no idle LAC; alone, or after the crowd, it does. A WriteAheadLog's writer
    (``yields`` False) never yields."""
    sent: list[tuple[str, int]] = []

    async def body() -> None:
        a = _writer(sent, idle_lac=None, idle_lac_delay=DELAY)
        b = _writer(sent, idle_lac=None, idle_lac_delay=DELAY)
        b.core = a.core  # one client
        lacs_a, lacs_b = LacPublisher(a, -1), LacPublisher(b, -1)
        assert lacs_a.idle and lacs_a.yields
        a.lac = b.lac = 0
        lacs_a.went_idle(["a"])
        assert sent == [("a", 0)]  # alone
        clock.now += _writer_lac.CROWD / 2
        lacs_b.went_idle(["b"])
        assert sent == [("a", 0)], "a writer going idle in a crowd sent its LAC"
        clock.now += 1.0  # (a long idle spell: no wait for a back-to-back writer either)
        lacs_a.carried(0)
        a.lac = 1
        lacs_a.went_idle(["a"])  # the crowd is gone
        assert sent == [("a", 0), ("a", 1)]
        lacs_b.yields = False  # as a WriteAheadLog sets it
        lacs_b.carried(0)  # (after a long spell)
        clock.now += _writer_lac.CROWD / 2
        b.lac = 1
        lacs_b.went_idle(["b"])  # within CROWD of a's
        assert sent[-1] == ("b", 1), "a log's writer yielded to a crowd"

    _run(body)


def test_idle_lac_false_sends_none(clock: _Clock) -> None:
    sent: list[tuple[str, int]] = []

    async def body() -> None:
        writer = _writer(sent, idle_lac=False, idle_lac_delay=DELAY)
        lacs = LacPublisher(writer, -1)
        for lac in range(3):
            writer.lac = lac
            lacs.went_idle(None)
            clock.now += 1.0
        await asyncio.sleep(DELAY * 2)
        assert sent == []

    _run(body)
