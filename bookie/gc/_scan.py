"""Scan and compare: which of a bookie's ledgers the metadata store no longer has.

Theory of operation
-------------------
The bookie's ledgers are taken once, sorted, *before* the store is listed, so a ledger
created after the scan started is never a candidate (its metadata may not be listed yet,
but the bookie did not hold it then). The store is walked one directory of ledger nodes
at a time (:meth:`walkit.metadata.LedgerManager.ledger_ranges`): each gives the id range
it covers and the ids it holds, and the bookie's ledgers of that range that it does not
hold are candidates, as are those between ranges. So memory is one directory (at most
10,000 ids in the hierarchical layout), never the whole ledger set, and a scan of
millions of ledgers is a merge of two ordered streams.

A candidate is only that: the collector deletes it after a direct read of its node says
it is not there (after a ``sync``, so a lagging ZooKeeper follower cannot hide it), and
a store that cannot answer keeps it (:mod:`bookie.gc._collector`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from walkit.metadata import LedgerMetadata, LedgerState

__all__ = ["unlisted", "is_overreplicated"]


def unlisted(local: Sequence[int], ranges: Iterable[tuple[int, int, list[int]]]) -> Iterator[int]:
    """The ids of ``local`` (ascending) that no range lists (ranges ascending, disjoint)."""
    i, n = 0, len(local)
    for first, last, ids in ranges:
        listed = set(ids)
        while i < n and local[i] <= last:
            if local[i] < first or local[i] not in listed:
                yield local[i]
            i += 1
    yield from local[i:]


def is_overreplicated(meta: LedgerMetadata, bookie_id: str) -> bool:
    """A closed ledger none of whose fragments names ``bookie_id``: what this bookie
    holds of it is a copy nobody reads (an ensemble change or a re-replication moved
    it). An open ledger is never judged: its writer may still change the ensemble."""
    if meta.state is not LedgerState.CLOSED:
        return False
    return all(bookie_id not in ensemble for _, ensemble in meta.ensembles)
