"""What a lost bookie held, and who else holds it: pure functions over ledger metadata.

A fragment (first entry, ensemble) of a ledger with ensemble size E and write quorum Qw
stores entry ``e`` on ``ensemble[(e + i) % E]`` for ``i < Qw``; so the bookie at position
``p`` holds the entries ``e`` of the fragment with ``(p - e) % E < Qw``, and every other
member of an entry's write set holds a copy of it. Every fragment of a closed ledger is
planned, and every fragment but the last of a ledger still open (or in recovery): its
entries are fixed (the next fragment starts after them) and the writer accepts another
bookie in them (its compare-and-sets check only its own, last fragment). The last fragment of an open
ledger belongs to its writer, which replaces a failed bookie by itself with an ensemble
change (:func:`held_by_writer` tells when a lost bookie is still in it).

How a fragment's copies travel (:func:`copy_path`): pushed by a surviving bookie
(``"push"``, ADMIN ``ledger.replicate``) when every bookie that may be asked for a copy
and the target are walkit bookies and a bookie can check the ledger's digest with the
master key it holds (:data:`walkit.metadata.BOOKIE_CHECKED_DIGESTS`); else copied by
the recovering client itself (``"client"``, :mod:`walkit.recovery._client_copy`), which
checks each copy with the ledger's entry codec - a Java bookie has no ADMIN ops, and
only the password opens ``bk-hmac``'s digest.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from walkit.errors import NotEnoughBookiesError
from walkit.metadata import BOOKIE_CHECKED_DIGESTS, LedgerMetadata, LedgerState

__all__ = ["CopyPath", "FragmentWork", "lost_fragments", "held_by_writer", "held_entries", "sources",
           "choose_target", "count_held", "copy_path", "asked_sources"]

CopyPath = Literal["push", "client"]


@dataclass(frozen=True)
class FragmentWork:
    """The share of one fragment that the lost bookie held."""

    ledger_id: int
    first: int  # the fragment's first entry (its key in the ensembles)
    last: int  # its last entry (first - 1: an empty fragment)
    position: int  # the lost bookie's position in the ensemble
    ensemble: tuple[str, ...]
    write_quorum: int
    digest: str
    #: the ledger's clear password where the metadata keeps one (a BookKeeper-format
    #: cluster's ``bk-*`` ledgers): what a client copy checks digests and writes with
    password: bytes | None = field(default=None, repr=False)

    @property
    def lost(self) -> str:
        return self.ensemble[self.position]


def lost_fragments(meta: LedgerMetadata, bookie: str) -> list[FragmentWork]:
    """The fragments whose ensemble names ``bookie``, but the last one of a ledger not
    closed (its writer's)."""
    out: list[FragmentWork] = []
    for index, (first, ensemble) in enumerate(meta.ensembles):
        last = meta.fragment_end(index)
        if bookie in ensemble and last is not None:
            out.append(FragmentWork(meta.ledger_id, first, last, ensemble.index(bookie), ensemble,
                                    meta.write_quorum, meta.digest, meta.bk_password))
    return out


def held_by_writer(meta: LedgerMetadata, bookie: str) -> bool:
    """Whether ``bookie`` is in the last fragment of a ledger not closed: that share is
    its writer's to replace (or the ledger's recoverer's), not re-replication's."""
    return meta.state is not LedgerState.CLOSED and bookie in meta.ensembles[-1][1]


def held_entries(work: FragmentWork, start: int | None = None) -> Iterator[int]:
    """The entries of the fragment the lost bookie held, ascending, from ``start`` on."""
    size = len(work.ensemble)
    e = work.first if start is None else max(start, work.first)
    while e <= work.last:
        if (work.position - e) % size < work.write_quorum:
            yield e
        e += 1


def count_held(work: FragmentWork) -> int:
    """How many entries :func:`held_entries` yields (without walking them)."""
    size, n = len(work.ensemble), work.last - work.first + 1
    if n <= 0:
        return 0
    full, rest = divmod(n, size)
    count = full * work.write_quorum
    return count + sum(1 for e in range(work.first + full * size, work.last + 1)
                       if (work.position - e) % size < work.write_quorum)


def sources(work: FragmentWork, entry_id: int) -> list[str]:
    """The other bookies of the entry's write set, in write-set order."""
    size = len(work.ensemble)
    write_set = [work.ensemble[(entry_id + i) % size] for i in range(work.write_quorum)]
    return [b for b in write_set if b != work.lost]


def asked_sources(work: FragmentWork) -> set[str]:
    """Every bookie some entry the lost bookie held may be copied from: the members of
    those entries' write sets but the lost one (write sets repeat every E entries)."""
    size = len(work.ensemble)
    starts = range(work.first, min(work.last, work.first + size - 1) + 1)
    return {b for e in starts if (work.position - e) % size < work.write_quorum for b in sources(work, e)}


def copy_path(work: FragmentWork, kinds: Mapping[str, str], target: str, last_resort: str | None = None) -> CopyPath:
    """How the fragment's copies travel to ``target`` (module docstring). ``kinds``: the
    kind ("walkit" or "bookkeeper") of each bookie registered now; a source not in it is
    not running and is not asked. ``last_resort``: a bookie asked after the sources (a
    bookie being decommissioned)."""
    asked = {b for b in asked_sources(work) if b in kinds} | ({last_resort} if last_resort else set())
    walkit_only = all(kinds.get(b) == "walkit" for b in asked | {target})
    return "push" if walkit_only and work.digest in BOOKIE_CHECKED_DIGESTS else "client"


def choose_target(work: FragmentWork, meta: LedgerMetadata, writable: Sequence[str], wanted: str | None = None,
                  rng: random.Random | None = None) -> str:
    """A bookie to hold the fragment's lost copies: ``wanted`` if given (it must not be
    in the fragment's ensemble already), else a writable bookie outside the ensemble,
    at random as an ensemble change picks one - preferring bookies in no fragment of
    the ledger, so its copies spread."""
    if wanted is not None:
        if wanted in work.ensemble:
            raise NotEnoughBookiesError("the target is in the fragment's ensemble already", ledger=work.ledger_id,
                                        first_entry=work.first, target=wanted)
        return wanted
    candidates = sorted(b for b in writable if b not in work.ensemble)
    if not candidates:
        raise NotEnoughBookiesError("no writable bookie outside the fragment's ensemble", ledger=work.ledger_id,
                                    first_entry=work.first, writable=len(writable))
    used = {b for _, ensemble in meta.ensembles for b in ensemble}
    fresh = [b for b in candidates if b not in used]
    return (rng or random).choice(fresh or candidates)
