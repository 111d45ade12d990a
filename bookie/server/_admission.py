"""Admission of adds: whether the server takes an add on, or refuses it at once and why.

Theory of operation
-------------------
An add is refused on arrival, before it reaches the core, when

1. the server is stopping (``stopping``: EBOOKIESHUTDOWN - the client retries elsewhere),
2. the bookie is read-only and the add is not a recovery add (``readonly``: EREADONLY;
   recovery adds still pass: they complete a recovery that other bookies depend on),
3. ``maxPendingAddRequests`` adds or ``maxPendingAddBytes`` bytes of entries are
   already in flight across all connections (``busy``: ETOOMANYREQUESTS, back-pressure),

in that order of precedence. :func:`refusal` is that decision, pure (state in, reason
out), and the one place it is written: the connection's pump calls it for every add
(it is cheap: a few comparisons) and :func:`refusal_error` turns its reason into the
answer. :class:`AddsInFlight` is the count it reads: raised when an add is admitted,
lowered when its answer is given (on the loop only, so no lock).
"""

from __future__ import annotations

from bookie._config import BookieConfig
from walkit.errors import BookieBusyError, BookieReadOnlyError, BookieShutdownError, WalkitError

__all__ = ["REFUSALS", "AddsInFlight", "refusal", "refusal_error"]

#: Every reason :func:`refusal` may give (the labels of ``walkit_bookie_adds_refused``).
REFUSALS = ("busy", "readonly", "stopping")


class AddsInFlight:
    """Adds admitted and not yet answered, and the bytes of their entries (loop only)."""

    __slots__ = ("count", "bytes")

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0


def refusal(stopping: bool, readonly: bool, recovery: bool, in_flight: AddsInFlight,
            max_adds: int, max_bytes: int) -> str | None:
    """Why an add is refused at once (``"stopping"``, ``"readonly"`` or ``"busy"``), or
    None: admit it."""
    if stopping:
        return "stopping"
    if readonly and not recovery:
        return "readonly"
    if in_flight.count >= max_adds or in_flight.bytes >= max_bytes:
        return "busy"
    return None


def refusal_error(reason: str, bookie_id: str, config: BookieConfig) -> WalkitError:
    """The error an add refused for ``reason`` is answered with."""
    if reason == "stopping":
        return BookieShutdownError("bookie is stopping", bookie=bookie_id)
    if reason == "readonly":
        return BookieReadOnlyError("bookie is read-only", bookie=bookie_id)
    return BookieBusyError("too many adds in flight", limit=config.max_pending_add_requests,
                           bytes_limit=config.max_pending_add_bytes)
