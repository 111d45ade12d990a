"""Small files replaced whole, crash-safely, on the real file system (``os``).

Used by ``walkit.LocalCluster`` (``cluster.json``, each ``bookie.toml``) and ``walkit
export`` (its state file). No walkit imports: every layer may use it. The bookie's own
files (cookies, the journal's log mark, slot log headers) go through its file-system
seam instead, ``bookie.fs.write_atomic``, the same steps on a ``FileSystem`` so that the
in-memory twin can crash between them.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) so that after a crash at any point it holds
    the old text or the new, never part of either.

    Crash safety, step by step:

    1. write ``.<name>.tmp`` beside ``path`` (same directory, so same file system; the
       leading dot hides it from listings and from readers such as Spark that skip dot
       files) - a crash here leaves ``path`` untouched and at worst a stale temporary
       file, which the next write truncates;
    2. ``fsync`` it: its bytes are on the disk before any name points at them - without
       this the rename could reach the disk first and leave ``path`` empty or short;
    3. ``os.replace`` onto ``path``: rename is atomic, a reader (or a recovery) sees
       the old file or the new one;
    4. ``fsync`` the directory: the rename itself is durable, so once this returns a
       crash cannot bring the old text back.

    :raises OSError: as ``open``, ``write``, ``fsync`` or ``rename`` raised it; the
        caller says which file it was writing (``path`` is still the old one).
    """
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
