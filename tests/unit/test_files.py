"""walkit._files.write_atomic: the plain-os atomic replace LocalCluster and walkit export
share (the bookie's own files use bookie.fs.write_atomic, through its seam)."""

from __future__ import annotations

from pathlib import Path

import pytest

from walkit._files import write_atomic


def test_write_atomic_creates_then_replaces(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_atomic(path, "one\n")
    assert path.read_text() == "one\n"
    write_atomic(path, "two, é\n")
    assert path.read_bytes() == "two, é\n".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temporary file left


def test_write_atomic_over_a_stale_temporary_file(tmp_path: Path) -> None:
    (tmp_path / ".state.json.tmp").write_text("half of an earlier wri")  # a crash before the rename
    write_atomic(tmp_path / "state.json", "new\n")
    assert (tmp_path / "state.json").read_text() == "new\n"
    assert not (tmp_path / ".state.json.tmp").exists()


def test_write_atomic_failure_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_atomic(path, "old\n")
    (tmp_path / ".state.json.tmp").mkdir()  # the temporary file cannot be opened
    with pytest.raises(OSError):
        write_atomic(path, "new\n")
    assert path.read_text() == "old\n"
