"""``ServerHooks``: the seam where a harness stands between a bookie and the world.

Theory of operation
-------------------
A production bookie uses the real disk, registers its own address and answers reads
with the bytes it stored. A test harness (``walkit.testing``'s fault injection) wants to
stand in between at exactly three places, and this object names them - nothing else of
the server is reachable through it, and it holds no test logic itself:

* ``disk``: a file system standing in for the real disk over the *same* directories (a
  wrapper of :class:`~bookie.fs.real.RealFS`, e.g. one whose syncs can be made to fail).
  The bookie uses it instead of the real disk and still locks its directories, as it
  does for the real disk. (A file system given as ``BookieServer(fs=...)`` that is not
  the real disk keeps no files in the directories, which are then not locked.)
* ``endpoint(port)``: the ``host:port`` registered for clients instead of
  ``<advertised host>:<port>`` (a proxy in front of the bookie).
* ``read(ledger, entry, data)``: the bytes a READ_ENTRY, a long poll's answer and each
  entry of a READ_RANGE are answered with instead of ``data`` (what the bookie stored).
  While it is set every read goes through the read pool (the in-memory fast path would
  bypass it), as a harness inspecting each read expects.

Set the hooks before :meth:`BookieServer.start` (``disk`` and ``endpoint`` are read
there); ``read`` may be set or cleared at any time (it is read per answer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from bookie.fs import FileSystem

__all__ = ["ServerHooks"]


@dataclasses.dataclass
class ServerHooks:
    """Where a harness stands between the bookie and the world (all None in production)."""

    disk: FileSystem | None = None
    endpoint: Callable[[int], str] | None = None
    read: Callable[[int, int, bytes], bytes] | None = None
