"""Recovery of lost bookies: the copies a bookie held are put back on other bookies.

- :func:`recover` (``walkit recover``): manual recovery of one lost bookie's fragments
  (but the live one of an open ledger: its writer's), streaming, resumable, with a dry run (:mod:`walkit.recovery._recover`);
- :func:`decommission` (``walkit decommission``): the same for a running bookie, made
  read-only first, until nothing names it;
- :class:`AutoRecovery` (in bookies with ``autoRecoveryDaemonEnabled``, or ``walkit
  autorecovery run``): the auditor marks under-replicated ledgers, workers repair them
  (:mod:`walkit.recovery._autorecovery`, markers in :mod:`walkit.metadata._underreplication`);
- :mod:`walkit.recovery._replicator`: the copy and replace mechanism all of them share;
- :mod:`walkit.recovery._client_copy`: the copies the recovering process makes itself;
- :mod:`walkit.recovery._plan`: what a bookie held, who else holds it, and which way its
  copies travel (pure).

Copies are pushed by surviving walkit bookies (``ledger.replicate``,
:mod:`bookie._replicate`), which verify them with the ledger's master key that only
bookies hold - or, when a Java bookie is a source or the target or the digest is
``bk-hmac``, read, verified with the ledger's entry codec and written as recovery adds
by the recovering process itself, with the password a BookKeeper-format cluster keeps.
"""

from walkit.metadata import Marker, UnderReplication  # the markers live with the metadata layout
from walkit.recovery._autorecovery import AutoRecovery, AutoRecoveryConfig
from walkit.recovery._plan import FragmentWork, count_held, held_by_writer, held_entries, lost_fragments
from walkit.recovery._recover import Progress, RecoveryReport, decommission, recover

__all__ = [
    "AutoRecovery", "AutoRecoveryConfig", "FragmentWork", "Marker", "Progress", "RecoveryReport", "UnderReplication",
    "count_held", "held_by_writer",
    "decommission", "held_entries", "lost_fragments", "recover",
]
