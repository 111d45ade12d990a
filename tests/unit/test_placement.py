"""The NotEnoughBookiesError of a placement that cannot be made (walkit/client/_placement.py):
what the ledger needs, what is writable, who was left out and why, and the remedy - one
line, a pure function of what was asked and what the bookie list held."""

from __future__ import annotations

import pytest

from walkit.client._placement import Placement, shortage
from walkit.errors import BookieError, NotEnoughBookiesError

A, B, C, D, E = (f"10.0.0.{i}:3181" for i in range(1, 6))
START = "start more bookies (a cluster of ensemble_size + 1 = {} lets a ledger lose one and keep writing)"


def _change(ensemble: tuple[str, ...], failed: set[str], qw: int = 3, qa: int = 2) -> Placement:
    return Placement(len(ensemble), qw, qa, ledger=7, ensemble=ensemble, failed=frozenset(failed))


@pytest.mark.parametrize("want, writable, message", [
    # the plugin's old trap: E=3 on 3 bookies, one killed (its registration gone)
    (_change((A, B, C), {A}), {B, C},
     "not enough writable bookies outside the ledger's ensemble to replace its failed bookie; " + START.format(4)
     + " or use a smaller ensemble, e.g. ensemble_size=2, write_quorum=2, ack_quorum=2 (ledger=7 ensemble_size=3 "
       "write_quorum=3 ack_quorum=2 needed=1 writable=2 in_ensemble=10.0.0.2:3181,10.0.0.3:3181 "
       "failed=10.0.0.1:3181)"),
    # partitioned, still registered: writable, yet excluded as failed
    (_change((A, B, C), {A}), {A, B, C},
     "not enough writable bookies outside the ledger's ensemble to replace its failed bookie; " + START.format(4)
     + " or use a smaller ensemble, e.g. ensemble_size=2, write_quorum=2, ack_quorum=2 (ledger=7 ensemble_size=3 "
       "write_quorum=3 ack_quorum=2 needed=1 writable=3 in_ensemble=10.0.0.2:3181,10.0.0.3:3181 "
       "failed=10.0.0.1:3181)"),
    # a new ledger larger than the cluster: striped quorums kept where they fit
    (Placement.new_ledger(5, 3, 2), {A, B, C, D},
     "not enough writable bookies for a new ledger; " + START.format(6)
     + " or use a smaller ensemble, e.g. ensemble_size=3, write_quorum=3, ack_quorum=2 (ensemble_size=5 "
       "write_quorum=3 ack_quorum=2 needed=5 writable=4)"),
    # no smaller ensemble that still replicates: start bookies, only
    (Placement.new_ledger(3, 3, 2), {A, B},
     "not enough writable bookies for a new ledger; " + START.format(4)
     + " (ensemble_size=3 write_quorum=3 ack_quorum=2 needed=3 writable=2)"),
    (Placement.new_ledger(2, 2, 2), set(),
     "not enough writable bookies for a new ledger; " + START.format(3)
     + " (ensemble_size=2 write_quorum=2 ack_quorum=2 needed=2 writable=0)"),
    # two members failed at once, one bookie to spare
    (_change((A, B, C, D), {A, B}, qw=4, qa=3), {C, D, E},
     "not enough writable bookies outside the ledger's ensemble to replace its failed bookie; " + START.format(5)
     + " or use a smaller ensemble, e.g. ensemble_size=3, write_quorum=3, ack_quorum=3 (ledger=7 ensemble_size=4 "
       "write_quorum=4 ack_quorum=3 needed=2 writable=3 in_ensemble=10.0.0.3:3181,10.0.0.4:3181 "
       "failed=10.0.0.1:3181,10.0.0.2:3181)"),
])
def test_the_message_says_what_is_missing_and_what_to_do(want: Placement, writable: set[str], message: str) -> None:
    error = shortage(want, frozenset(writable))
    assert isinstance(error, NotEnoughBookiesError) and isinstance(error, BookieError)
    assert str(error) == message and "\n" not in message
    assert error.context["needed"] == want.needed and error.context["writable"] == len(writable)


def test_a_placement_knows_what_to_choose_and_what_to_leave_out() -> None:
    new = Placement.new_ledger(3, 3, 2)
    assert (new.needed, new.exclude) == (3, frozenset())
    change = _change((A, B, C), {A, D})  # D failed in an earlier fragment: still never chosen again
    assert (change.needed, change.exclude) == (1, frozenset({A, B, C, D}))
