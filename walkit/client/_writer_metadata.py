"""What a ledger's writer records in the ledger's metadata, each a compare-and-set on
the metadata store (blocking: run on a metadata thread of the client): a new fragment
after an ensemble change (:func:`write_ensemble`), the close (:func:`write_close`) and
a recoverer's close (:func:`write_recovered`).

Theory of operation
-------------------
Each write is ``LedgerManager.update`` with a change function: the store's current
metadata is read, the change decides from it, and the write is conditional on the
version read (retried on a conflict with a fresh read). So every decision below is made
on what the store holds at the instant it is overwritten, never on the writer's copy.

* The writer owns only its ledger's *last* fragment. Re-replication may replace a
  bookie of an earlier fragment while the ledger is open, so a write accepts any
  metadata whose fragments start where the writer's do and whose last fragment is the
  writer's (:func:`check_own_fragment`), and keeps those replacements.
* A ledger some recoverer took (IN_RECOVERY) or closed is not the writer's any more
  (:func:`check_writable`): LedgerFencedError / LedgerClosedError, never an overwrite.
* A reply lost after the write landed makes the retry find the write already there:
  the same new fragment, or CLOSED at the same last entry and length. That is success
  (the change returns None: nothing written), as in BookKeeper; anything else is an
  error, so two writers' closes can never both succeed at different points.
* A recoverer closes IN_RECOVERY -> CLOSED with the fragments it wrote itself from the
  one it started in on, the earlier ones as the store has them now; a ledger another
  recoverer closed first stays as the store has it (the first close decided).
"""

from __future__ import annotations

import dataclasses

from walkit.errors import LedgerClosedError, LedgerFencedError, MetadataVersionError
from walkit.metadata import LedgerManager, LedgerMetadata, LedgerState

__all__ = ["check_own_fragment", "check_writable", "write_close", "write_ensemble", "write_recovered"]


def check_writable(current: LedgerMetadata, ledger_id: int) -> None:
    if current.state is LedgerState.IN_RECOVERY:
        raise LedgerFencedError("ledger is being recovered by another client", ledger=ledger_id)
    if current.state is LedgerState.CLOSED:
        raise LedgerClosedError("ledger was closed", ledger=ledger_id, last_entry=current.last_entry_id)


def check_own_fragment(current: LedgerMetadata, ours: LedgerMetadata) -> None:
    """The store's fragments start where the writer's do and its last fragment is the
    writer's (earlier ones may name other bookies: re-replication replaced one)."""
    if current.ensembles[-1] != ours.ensembles[-1] or \
            [f for f, _ in current.ensembles] != [f for f, _ in ours.ensembles]:
        raise MetadataVersionError("ledger ensembles changed under their writer", ledger=current.ledger_id)


def write_ensemble(ledgers: LedgerManager, ours: LedgerMetadata, start: int,
                   new: tuple[str, ...]) -> tuple[LedgerMetadata, int]:
    """(Metadata thread) CAS the new fragment ``start: new`` in."""
    ledger_id = ours.ledger_id

    def change(current: LedgerMetadata) -> LedgerMetadata | None:
        check_writable(current, ledger_id)
        if current.ensembles[-1] == (start, new):
            return None  # our own write, whose reply was lost
        check_own_fragment(current, ours)
        return current.with_ensemble(start, new)

    return ledgers.update(ledger_id, change)


def write_close(ledgers: LedgerManager, ours: LedgerMetadata, lac: int, length: int) -> tuple[LedgerMetadata, int]:
    """(Metadata thread) OPEN -> CLOSED; a conflict is resolved as BookKeeper does:
    closed by someone else at the same point is success, anything else an error."""
    ledger_id = ours.ledger_id

    def change(current: LedgerMetadata) -> LedgerMetadata | None:
        if current.state is LedgerState.CLOSED and current.last_entry_id == lac and current.length == length:
            return None
        check_writable(current, ledger_id)
        check_own_fragment(current, ours)
        return current.closed(lac, length)

    return ledgers.update(ledger_id, change)


def write_recovered(ledgers: LedgerManager, ours: LedgerMetadata, lac: int,
                    length: int) -> tuple[LedgerMetadata, int]:
    """(Metadata thread) IN_RECOVERY -> CLOSED with the ensembles recovery used from
    the fragment it started in on; earlier fragments as the store has them now
    (re-replication may have changed them meanwhile). A ledger another recoverer
    closed first stays as it is: the store decided."""
    ledger_id = ours.ledger_id

    def change(current: LedgerMetadata) -> LedgerMetadata | None:
        if current.state is LedgerState.CLOSED:
            return None
        if current.state is not LedgerState.IN_RECOVERY:
            raise MetadataVersionError("ledger left recovery under its recoverer", ledger=ledger_id,
                                       state=current.state.name)
        keep = len(current.ensembles) - 1  # every fragment before the one recovery started in
        if [f for f, _ in current.ensembles] != [f for f, _ in ours.ensembles[:keep + 1]]:
            raise MetadataVersionError("ledger fragments changed under their recoverer", ledger=ledger_id)
        ensembles = (*current.ensembles[:keep], *ours.ensembles[keep:])
        return dataclasses.replace(current.closed(lac, length), ensembles=ensembles)

    return ledgers.update(ledger_id, change)
