"""The ledger client's options (walkit/client/_config.py): bad values are refused with a
clear InvalidArgumentError that names them, before any client exists."""

from __future__ import annotations

from typing import Any

import pytest

from walkit import ClientConfig
from walkit.errors import InvalidArgumentError


@pytest.mark.parametrize("value", [-0.001, 61, True, "0.5", None])
def test_idle_lac_delay_must_be_seconds_from_0_to_60(value: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="idle_lac_delay") as raised:
        ClientConfig(idle_lac_delay=value)
    assert raised.value.context.get("value") == value  # (a None is left out of the context)


@pytest.mark.parametrize("value", [0, 0.0005, 2, 60.0])
def test_idle_lac_delay_takes_seconds(value: float) -> None:
    assert ClientConfig(idle_lac_delay=value).idle_lac_delay == value


def test_the_idle_lac_waits_half_a_millisecond_by_default() -> None:
    assert ClientConfig().idle_lac_delay == 0.0005


def test_an_unknown_option_is_named() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown client option") as raised:
        ClientConfig.of(None, {"idle_lac_dealy": 0.001})
    assert raised.value.context["options"] == "idle_lac_dealy"
