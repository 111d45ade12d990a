"""What the server's parts need of a client connection - to answer it - and the error
answers they send.

Theory of operation
-------------------
A request is answered exactly once, on the event loop, by whichever part of the server
finished it: the journal hand-off (:mod:`bookie.server._writes`), the read pool
(:mod:`bookie.server._reads`), the long polls (:mod:`bookie.server._long_poll`).
They see a connection only as a :class:`Peer`: ``respond`` (one answer, which also
frees the request's slot in the connection's flow control), ``respond_added`` (the
answers of a group of durable adds), ``flush`` (write what is queued) and the set of its
parked long polls. Any failure becomes an :class:`~walkit.protocol.ErrorResponse`
(:func:`error_response`) with the status the exception maps to: nothing is dropped, so
the connection's in-flight count stays exact.
"""

from __future__ import annotations

from typing import Any, Protocol

from walkit.protocol import (
    AddEntry,
    AdminRequest,
    ErrorResponse,
    GetBookieInfo,
    Op,
    ReadEntry,
    ReadLac,
    ReadRange,
    Request,
    Response,
    WriteLac,
    status_for,
)

__all__ = ["Peer", "error_response", "failed", "op_of"]


class Peer(Protocol):
    """A client connection as the server's parts answer it (on the loop only)."""

    @property
    def peer(self) -> str:
        """The client's address (for logs)."""
        ...

    @property
    def waiters(self) -> set[Any]:
        """The long polls parked for this connection (:mod:`bookie.server._long_poll`)."""
        ...

    def respond(self, response: Response) -> None:
        """Answer one dispatched request."""

    def respond_added(self, reqs: list[AddEntry]) -> None:
        """Answer several durable adds."""

    def flush(self) -> None:
        """Write the answers queued (once per loop iteration)."""


def op_of(req: Request) -> Op:
    return {AddEntry: Op.ADD_ENTRY, ReadEntry: Op.READ_ENTRY, ReadLac: Op.READ_LAC, WriteLac: Op.WRITE_LAC,
            GetBookieInfo: Op.GET_BOOKIE_INFO, AdminRequest: Op.ADMIN, ReadRange: Op.READ_RANGE}[type(req)]


def error_response(op: Op, ledger_id: int, entry_id: int, request_id: int, exc: BaseException) -> ErrorResponse:
    return ErrorResponse(op, status_for(exc), ledger_id, entry_id, str(exc)[:1024], request_id)


def failed(req: Request, exc: BaseException) -> ErrorResponse:
    """The error answer to ``req`` (its ledger and entry when it names them)."""
    return error_response(op_of(req), getattr(req, "ledger_id", 0), getattr(req, "entry_id", -1),
                          req.request_id, exc)
