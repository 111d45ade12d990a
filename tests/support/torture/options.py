"""The torture runs' options as the pytest command line and the environment set them
(the options themselves are added by tests/conftest.py): which seeds, how long each, how
many at once. Here rather than in conftest.py so that a test module can import them
(``conftest`` is not one importable module: each test folder may have its own)."""

from __future__ import annotations

import os

import pytest

__all__ = ["torture_jobs", "torture_seconds", "torture_seeds"]


def _env_number(name: str, default: float) -> float:
    text = os.environ.get(name, "")
    try:
        return float(text) if text else default
    except ValueError:
        raise pytest.UsageError(f"{name} must be a number, not {text!r}") from None


def torture_seeds(config: pytest.Config) -> list[int]:
    chosen: list[int] | None = config.getoption("--torture-seed")
    if chosen:
        return chosen
    count = config.getoption("--torture-seeds")
    first: int = config.getoption("--torture-first-seed")
    return list(range(first, first + (int(_env_number("WALKIT_TORTURE_SEEDS", 12)) if count is None else count)))


def torture_seconds(config: pytest.Config) -> float:
    seconds: float | None = config.getoption("--torture-seconds")
    return _env_number("WALKIT_TORTURE_SECONDS", 20.0) if seconds is None else seconds


def torture_jobs(config: pytest.Config) -> int:
    jobs: int | None = config.getoption("--torture-jobs")
    return int(_env_number("WALKIT_TORTURE_JOBS", 2)) if jobs is None else jobs
