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
    AuthMessage,
    BkErrorResponse,
    BkRequest,
    BkResponse,
    ErrorResponse,
    ForceLedger,
    ForceLedgerResponse,
    GetBookieInfo,
    Op,
    ReadEntry,
    ReadLac,
    ReadRange,
    Request,
    Response,
    StartTls,
    Status,
    WriteLac,
    status_for,
)

__all__ = ["AUTH_DISABLED_PLUGIN", "Peer", "answer_at_once", "error_response", "failed", "op_of"]

#: AuthProviderFactoryFactory.AUTHENTICATION_DISABLED_PLUGIN_NAME: what a BookKeeper bookie
#: without an auth provider answers every AUTH with (payload AuthToken.NULL, empty)
AUTH_DISABLED_PLUGIN = "AuthDisabledPlugin"


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

    def respond(self, response: Response | BkResponse) -> None:
        """Answer one dispatched request."""

    def respond_added(self, reqs: list[AddEntry]) -> None:
        """Answer several durable adds."""

    def flush(self) -> None:
        """Write the answers queued (once per loop iteration)."""


_OPS: dict[type, Op] = {AddEntry: Op.ADD_ENTRY, ReadEntry: Op.READ_ENTRY, ReadLac: Op.READ_LAC,
                        WriteLac: Op.WRITE_LAC, GetBookieInfo: Op.GET_BOOKIE_INFO, AdminRequest: Op.ADMIN,
                        ReadRange: Op.READ_RANGE}


def op_of(req: Request | BkRequest) -> Op:
    """The walkit op of ``req`` (INVALID for a BookKeeper-only request)."""
    return _OPS.get(type(req), Op.INVALID)


def answer_at_once(req: ForceLedger | AuthMessage | StartTls) -> BkResponse:
    """The answer to a BookKeeper-only request that needs neither disk nor pool:

    * FORCE_LEDGER: EOK at once. BookKeeper's client asks it to make durable the adds
      it has been answered (deferred-sync writes); a walkit bookie answers an add only
      after the fdatasync covering it returned, so every add answered is durable
      already, and adds still in flight are not the force's to cover.
    * AUTH: what BookKeeper's bookie without an auth provider answers
      (BookieRequestProcessor): the plug-in name "AuthDisabledPlugin" and an empty
      payload, whatever the client sent; its client then counts itself authenticated.
    * START_TLS that cannot be served: EBADREQ, as BookKeeper's bookie without TLS
      configured answers it (a bookie with TLS upgrades a plain connection instead:
      :mod:`bookie.server._tls`)."""
    if isinstance(req, ForceLedger):
        return ForceLedgerResponse(req.ledger_id, req.request_id)
    if isinstance(req, AuthMessage):
        return AuthMessage(AUTH_DISABLED_PLUGIN, b"", req.request_id)
    return BkErrorResponse(Op.INVALID, Status.EBADREQ, message="START_TLS: no TLS to start (not configured, "
                           "already TLS, or other requests in flight)",
                           request_id=req.request_id, request=req)


def error_response(op: Op, ledger_id: int, entry_id: int, request_id: int, exc: BaseException) -> ErrorResponse:
    return ErrorResponse(op, status_for(exc), ledger_id, entry_id, str(exc)[:1024], request_id)


def failed(req: Request | BkRequest, exc: BaseException) -> ErrorResponse:
    """The error answer to ``req`` (its ledger and entry when it names them); to a
    BookKeeper-only request a :class:`BkErrorResponse` its codec encodes."""
    if type(req) not in _OPS:
        return BkErrorResponse(Op.INVALID, status_for(exc), getattr(req, "ledger_id", 0), -1, str(exc)[:1024],
                               req.request_id, request=req)
    return error_response(op_of(req), getattr(req, "ledger_id", 0), getattr(req, "entry_id", -1),
                          req.request_id, exc)
