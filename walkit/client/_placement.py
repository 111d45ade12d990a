"""What a choice of bookies is for, and what to tell the application when it cannot be made.

:meth:`walkit.client._core.ClientCore.choose_bookies` picks bookies for a
:class:`Placement`: the ensemble of a new ledger, or the replacements of the failed
members of an open ledger's ensemble (an ensemble change). When too few writable bookies
are left it raises the :class:`~walkit.errors.NotEnoughBookiesError` that
:func:`shortage` builds - a pure function of the placement and of the writable bookies
seen, so that its text is tested without a cluster.

The error says what the ledger needs, what is writable, which writable bookies were
left out and why (in the ensemble already, or failed), and the remedy. The rule behind
the remedy: a ledger keeps writing through the loss of one of its bookies only if a
writable bookie is left outside its ensemble to replace it - ``ensemble_size + 1``
bookies for one loss. With BookKeeper's defaults (E=3 Qw=3 Qa=2, a WriteAheadLog's too)
a cluster of 3 bookies stops writing at the first loss; 4 keep it going.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Set

from walkit.errors import NotEnoughBookiesError
from walkit.metadata import LedgerMetadata

__all__ = ["Placement", "shortage"]


@dataclasses.dataclass(frozen=True)
class Placement:
    """Bookies wanted for a ledger of ``ensemble_size`` / ``write_quorum`` /
    ``ack_quorum``: its whole ensemble (``ledger`` None, a new ledger) or replacements of
    the ``failed`` members of ledger ``ledger``'s current ``ensemble``."""

    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ledger: int | None = None
    ensemble: tuple[str, ...] = ()
    failed: frozenset[str] = frozenset()

    @classmethod
    def new_ledger(cls, ensemble_size: int, write_quorum: int, ack_quorum: int) -> Placement:
        return cls(ensemble_size, write_quorum, ack_quorum)

    @classmethod
    def replacing(cls, meta: LedgerMetadata, ensemble: tuple[str, ...], failed: Set[str]) -> Placement:
        """Replacements of the members of ``ensemble`` (``meta``'s last) in ``failed``."""
        return cls(meta.ensemble_size, meta.write_quorum, meta.ack_quorum, meta.ledger_id, ensemble,
                   frozenset(failed))

    @property
    def needed(self) -> int:
        """How many bookies to choose."""
        if self.ledger is None:
            return self.ensemble_size
        return sum(1 for b in self.ensemble if b in self.failed)

    @property
    def exclude(self) -> frozenset[str]:
        """Bookies not to choose: the ensemble's members, failed or not."""
        return self.failed.union(self.ensemble)


def shortage(want: Placement, writable: Collection[str]) -> NotEnoughBookiesError:
    """The error for ``want`` when only ``writable`` bookies are writable (too few of them
    outside ``want.exclude``): one line, what happened, the remedy, then key=value context."""
    in_ensemble = [b for b in want.ensemble if b in writable and b not in want.failed]
    context = {"ensemble_size": want.ensemble_size, "write_quorum": want.write_quorum,
               "ack_quorum": want.ack_quorum, "needed": want.needed, "writable": len(writable),
               "in_ensemble": ",".join(in_ensemble) or None, "failed": ",".join(sorted(want.failed)) or None}
    what = "for a new ledger" if want.ledger is None else "outside the ledger's ensemble to replace its failed bookie"
    remedy = _remedy(want, len(set(writable) | want.failed))
    return NotEnoughBookiesError(f"not enough writable bookies {what}; {remedy}", ledger=want.ledger, **context)


def _remedy(want: Placement, cluster: int) -> str:
    """Start bookies, or (when it fits a cluster of ``cluster`` bookies with one to spare
    and still replicates) use a smaller ensemble."""
    size = want.ensemble_size
    text = f"start more bookies (a cluster of ensemble_size + 1 = {size + 1} lets a ledger lose one and keep writing)"
    smaller = min(size - 1, cluster - 1)
    if smaller < 2:  # an ensemble of one bookie is no replication: do not suggest it
        return text
    qw = min(want.write_quorum, smaller)
    return f"{text} or use a smaller ensemble, e.g. ensemble_size={smaller}, write_quorum={qw}, " \
           f"ack_quorum={min(want.ack_quorum, qw)}"
