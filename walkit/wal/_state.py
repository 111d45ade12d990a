"""What a log's writer shares with its snapshots and retention passes.

Theory of operation
-------------------
A :class:`WriterState` is the part of a writer that ``walkit/wal/_snapshots.py`` and
``walkit/wal/_retention.py`` read and edit, and nothing more: the log node, the writer's
epoch, settings and password, the open segment (moved on by rolls) and what it holds,
the ledgers of snapshots under way, the closed segments' facts cache and the ledgers
the log no longer names but which are not deleted yet. The writer (walkit/wal/_writer.py)
owns it and hands it to them, so they never see the writer itself.

Every change to the log node goes through :meth:`WriterState.change`, which applies it
only while the node's epoch is still this writer's: a writer that was fenced (another
opened the log) learns it at its next change, as :class:`WriterFencedError`, and never
writes over the new writer's node. Who touches what: ``segment`` and ``segment_bytes``
are written on the client's loop (appends, rolls) and read by a retention pass on a
metadata thread (a stale read only keeps a segment one pass longer); the sets and the
cache are used under the writer's ``admin`` lock (snapshots, truncations and passes run
one at a time), except that a snapshot names its ledger in ``writing_snapshots`` before
the node does - so a pass never takes a pending name that is still being written.
"""

from __future__ import annotations

from collections.abc import Callable

from walkit.client import BookKeeper
from walkit.errors import WriterFencedError
from walkit.wal._format import LogMetadata, LogSettings, Segment
from walkit.wal._node import LogNode

__all__ = ["WriterState"]


class WriterState:
    """A writer's state as its snapshots and retention passes see it (module docstring)."""

    def __init__(self, bk: BookKeeper, node: LogNode, password: bytes, epoch: int, settings: LogSettings,
                 segment: Segment) -> None:
        self.bk = bk  # what a Snapshot handle reads its ledger through
        self.client = bk.client
        self.node = node
        self.password = password
        self.epoch = epoch
        self.settings = settings
        self.segment = segment  # the open segment
        self.segment_bytes = 0  # what the open segment holds (its ledger's length lags)
        self.writing_snapshots: set[int] = set()  # ledgers of this writer's snapshots under way
        self.segment_facts: dict[int, tuple[int, bool, float | None]] = {}  # closed ledgers' (length, closed, ctime)
        self.undeleted: set[int] = set()  # ledgers the log no longer names, not deleted yet (retried by passes)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def namespace(self) -> str:
        return self.node.namespace

    def change(self, change: Callable[[LogMetadata], LogMetadata]) -> None:
        """(Metadata thread) CAS ``change(meta)`` into the log node if our epoch holds."""
        current, version = self.node.read()
        if current.epoch != self.epoch:
            raise WriterFencedError("another writer opened the log", log=self.name, epoch=self.epoch,
                                    current=current.epoch)
        new = change(current)
        if new != current:
            self.node.write(new, version)
