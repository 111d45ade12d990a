"""Shared by the I/O tests: make a backend behave like a file system without O_DIRECT."""

from __future__ import annotations

import errno

import pytest

from bookie import native


def refuse_direct(monkeypatch: pytest.MonkeyPatch, backend: native.Backend) -> None:
    """Make ``backend`` open like a file system without O_DIRECT (EINVAL at open)."""
    real_open = backend._open

    def refusing(path: str, create: bool, direct: bool, readonly: bool) -> int:
        if direct:
            raise native.io_error(errno.EINVAL, "open", path=path)
        return real_open(path, create, direct, readonly)

    monkeypatch.setattr(backend, "_open", refusing)
