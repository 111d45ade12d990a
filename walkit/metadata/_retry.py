"""The metadata layer's retry policy: a change that lost its compare-and-set, and a
store call that did not reach a live session.

Theory of operation
-------------------
Every change to a metadata node - a ledger's (ensemble change, close, recovery), a
WriteAheadLog's (epoch claim on open, a segment added on a roll, a snapshot recorded, a
truncation) - is read, change, compare-and-set at the version read. Losing the set
(:class:`~walkit.errors.MetadataVersionError`) means another client changed the node in
between: the change is made again on what is there now (it decides again: it may find
its work done, or refuse). Retried at once, writers contending for one node collide again
in lock step; so before each new attempt :func:`retry_cas` waits a random time below an
exponentially growing cap - "full jitter" (tenacity's ``wait_random_exponential``): below
:data:`FIRST_WAIT` (1 ms) after the first loss, doubling up to :data:`MAX_WAIT` (100 ms).
It gives up after :data:`ATTEMPTS` (100) attempts or :data:`DEADLINE` (30 s), whichever
comes first, with a MetadataVersionError that names what kept changing, the attempts made
and the seconds spent.

Only a lost compare-and-set is retried here. Any other error ends the loop at once: an
unreachable store is its driver's to wait out (``metadata_retry_deadline``), and an error
the change raises (a writer fenced, a bad argument) is its answer. Blocking (it sleeps):
callers on an event loop run it on a metadata thread, as every store call is run.

A ZooKeeper call whose request did not reach a live session (connection loss, a
timed-out operation, a session expiry) is sent again by :func:`retry_until` - the same
tenacity machinery, bounded by the call's deadline instead of a count: it waits
``first_wait`` (50 ms for ZooKeeper) after the first failure, doubling up to ``max_wait``
(1 s), and gives up - the store's MetadataUnavailableError, raised from the last
failure - as soon as the next attempt would start at or after the deadline, so a call
never outlives ``retry_deadline``. Its waits are deterministic (no jitter): the callers
are different calls of one client waiting for the same server, not writers racing for
one node. Only the failures named are retried; anything else ends it at once.

The other retries of the metadata layer use tenacity too and live beside what they
retry, because what they wait for is not a conflict: a bookie's registration
(:mod:`walkit.metadata._registration`) looks again at once after a transaction that lost
a race (100 times at most), waits for a node another live session holds every 0.1 s
(jittered) up to its ``wait``, and registers again after a session expiry with
exponential backoff up to ``metadataRetryDeadlineMs``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import tenacity

from walkit.errors import MetadataVersionError

__all__ = ["ATTEMPTS", "DEADLINE", "FIRST_WAIT", "MAX_WAIT", "retry_cas", "retry_until"]

ATTEMPTS = 100  # attempts of one change at most
DEADLINE = 30.0  # seconds of attempts at most
FIRST_WAIT = 0.001  # seconds: the cap of the first wait (random below it), doubled after each loss
MAX_WAIT = 0.1  # seconds: the largest cap

T = TypeVar("T")
_nap = time.sleep  # how a wait is spent (a test records them instead)


def retry_cas(change: Callable[[], T], what: str, *, attempts: int = ATTEMPTS, **context: object) -> T:
    """``change()`` (a read, a decision and a compare-and-set), made again while it loses
    the compare-and-set, as the module docstring says; its result. ``what`` names the
    node in the error raised when it gives up (with ``context``)."""
    started = time.monotonic()
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(MetadataVersionError),
        wait=tenacity.wait_random_exponential(multiplier=FIRST_WAIT, max=MAX_WAIT),
        stop=tenacity.stop_after_attempt(attempts) | tenacity.stop_after_delay(DEADLINE),
        sleep=lambda seconds: _nap(seconds),
    )
    try:
        return retrying(change)
    except tenacity.RetryError as exc:
        made = exc.last_attempt.attempt_number
        raise MetadataVersionError(f"{what} kept changing: gave up after {made} attempts", attempts=made,
                                   seconds=round(time.monotonic() - started, 3),
                                   **context) from exc.last_attempt.exception()


def retry_until(call: Callable[[], T], *, retry_on: tuple[type[BaseException], ...], deadline: float,
                first_wait: float, max_wait: float, gave_up: Callable[[], Exception]) -> T:
    """``call()``, made again while it raises one of ``retry_on``, ``first_wait`` seconds
    after the first failure and twice as long after each next one (``max_wait`` at
    most), until the next attempt would start at or after ``deadline`` (monotonic): then
    ``gave_up()`` is raised from the last failure. Its result; any other error at once."""
    wait = tenacity.wait_exponential(multiplier=first_wait, max=max_wait)

    def past_deadline(state: tenacity.RetryCallState) -> bool:
        return time.monotonic() + wait(state) >= deadline

    retrying = tenacity.Retrying(retry=tenacity.retry_if_exception_type(retry_on), wait=wait, stop=past_deadline,
                                 sleep=time.sleep)
    try:
        return retrying(call)
    except tenacity.RetryError as exc:
        raise gave_up() from exc.last_attempt.exception()
