"""An under-replication marker as read back: one value type for both cluster formats.

Theory of operation
-------------------
:class:`Marker` is what :class:`~walkit.metadata._underreplication.UnderReplication`
returns whichever tree holds the marks (walkit's own JSON markers, or BookKeeper's
``UnderreplicatedLedgerFormat`` marks in ``_bk_underreplication``): the ledger, the bookies
whose copies are missing, when it was marked, the store version a completion checks, and
who holds its lock. It lives apart so both implementations build it without importing
each other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Marker"]


@dataclass(frozen=True)
class Marker:
    ledger_id: int
    bookies: frozenset[str]
    since: float  # seconds since the epoch when marked (0.0: not recorded)
    version: int  # the marker node's data version (a completion checks it)
    locked_by: str | None  # the lock holder's name, None: not locked
