"""walkit.eventloop (issue 38): WALKIT_EVENT_LOOP picks the loop the client's thread and a
bookie process run on; unknown values and an absent uvloop are clear errors."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator

import pytest

from walkit import eventloop
from walkit.client import LoopThread
from walkit.errors import ConfigError

try:
    import uvloop
except ImportError:  # walkit[test] installs it; without it only its cases are skipped
    uvloop = None

needs_uvloop = pytest.mark.skipif(uvloop is None, reason="uvloop is not installed (walkit[test] declares it)")


@pytest.fixture
def uvloop_policy() -> Iterator[None]:
    """uvloop's event-loop policy for the test, the one before restored afterwards."""
    assert uvloop is not None
    before = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(before)


def _made(monkeypatch: pytest.MonkeyPatch, value: str | None) -> str:
    """The kind of loop :func:`walkit.eventloop.new_event_loop` makes with ``WALKIT_EVENT_LOOP=value``."""
    if value is None:
        monkeypatch.delenv(eventloop.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(eventloop.ENV_VAR, value)
    loop = eventloop.new_event_loop()
    try:
        return eventloop.describe(loop)
    finally:
        loop.close()


@pytest.mark.parametrize(("value", "expected"), [(None, "auto"), ("", "auto"), (" AUTO ", "auto"),
                                                 ("asyncio", "asyncio"), ("UVLoop", "uvloop")])
def test_the_setting_is_read_case_and_space_blind(monkeypatch: pytest.MonkeyPatch, value: str | None,
                                                  expected: str) -> None:
    if value is None:
        monkeypatch.delenv(eventloop.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(eventloop.ENV_VAR, value)
    assert eventloop.setting() == expected


@pytest.mark.parametrize("value", ["tokio", "uv", "asyncio,uvloop", "1"])
def test_an_unknown_value_is_a_config_error_naming_it(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(eventloop.ENV_VAR, value)
    for make in (eventloop.setting, eventloop.new_event_loop, lambda: LoopThread("t")):
        with pytest.raises(ConfigError, match=f"WALKIT_EVENT_LOOP must be auto, asyncio or uvloop.*value={value}"):
            make()


def test_auto_without_a_policy_is_the_ab_winner(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _made(monkeypatch, None) == _made(monkeypatch, "auto") == eventloop.AUTO


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eventloop, "AUTO", "uvloop")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert _made(monkeypatch, "auto") == "asyncio"


def test_uvloop_asked_for_but_missing_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    monkeypatch.setenv(eventloop.ENV_VAR, "uvloop")
    with pytest.raises(ConfigError, match=r"WALKIT_EVENT_LOOP=uvloop but uvloop is not installed: pip install"):
        eventloop.loop_factory()


@needs_uvloop
def test_each_choice_makes_its_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _made(monkeypatch, "asyncio") == "asyncio"
    assert _made(monkeypatch, "uvloop") == "uvloop"
    monkeypatch.setattr(eventloop, "AUTO", "uvloop")
    assert _made(monkeypatch, "auto") == "uvloop"


@needs_uvloop
@pytest.mark.usefixtures("uvloop_policy")
def test_auto_follows_the_applications_policy_and_asyncio_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """An application that set uvloop's policy gets uvloop under auto, as before the
    setting existed; WALKIT_EVENT_LOOP=asyncio is the standard library's loop regardless."""
    assert _made(monkeypatch, "auto") == "uvloop"
    assert _made(monkeypatch, "asyncio") == "asyncio"


@needs_uvloop
def test_the_clients_loop_thread_runs_the_chosen_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("uvloop", "asyncio"):
        monkeypatch.setenv(eventloop.ENV_VAR, value)
        thread = LoopThread("t", stop_at_exit=False)
        try:
            assert eventloop.describe(thread.loop) == value
            assert thread.run(asyncio.sleep(0, "ran")) == "ran"
        finally:
            thread.stop()


def test_describe_names_other_loops_by_module_and_class() -> None:
    class Other(asyncio.SelectorEventLoop):
        pass

    loop = Other()
    try:
        assert eventloop.describe(loop) == f"{__name__}.test_describe_names_other_loops_by_module_and_class.<locals>.Other"
    finally:
        loop.close()
