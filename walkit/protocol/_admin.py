"""Administrative requests on the bookie wire protocol: ADMIN (op 6), sans-IO.

An operator tool asks a bookie to do or report something that is not ledger data:
``gc.status``, ``gc.run`` (``walkit bookie gc``). The request names a command and carries
JSON arguments; the answer carries a JSON document, or is an ordinary error response
(EBADREQ for an unknown command or bad arguments)::

    request body:   command length u8 | command (ASCII, [a-z0-9._-], 1..64) | arguments (JSON)
    response body:  result (JSON)

The frame header is :mod:`walkit.protocol._codec`'s; these are the body codecs it
dispatches to. JSON keeps the operator surface open to new commands without a new op
for each; the data path never goes through here.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from walkit.errors import InvalidArgumentError

__all__ = ["AdminRequest", "AdminResponse", "MAX_ADMIN_BODY", "enc_admin", "dec_admin", "enc_admin_resp",
           "dec_admin_resp"]

MAX_ADMIN_BODY = 1 << 20  # bytes of JSON either way
_COMMAND = re.compile(r"[a-z0-9._-]{1,64}")
_U64 = 2**64 - 1
_REQ = struct.Struct(">IBBHQB")  # length, version, kind, flags, request id, command length
_RESP = struct.Struct(">IBBHQ")
_OP = 6


def _check_id(request_id: object) -> None:
    if not isinstance(request_id, int) or isinstance(request_id, bool) or not 0 <= request_id <= _U64:
        raise InvalidArgumentError("invalid request_id", value=repr(request_id))


def _check_body(name: str, body: object) -> None:
    if not isinstance(body, bytes) or len(body) > MAX_ADMIN_BODY:
        raise InvalidArgumentError(f"invalid {name}: bytes of at most {MAX_ADMIN_BODY}", type=type(body).__name__)


@dataclass(frozen=True)
class AdminRequest:
    command: str
    args: bytes = b"{}"  # a JSON object
    request_id: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.command, str) or not _COMMAND.fullmatch(self.command):
            raise InvalidArgumentError("invalid admin command", command=repr(self.command)[:80])
        _check_body("args", self.args)
        _check_id(self.request_id)


@dataclass(frozen=True)
class AdminResponse:
    body: bytes  # a JSON document
    request_id: int = 0

    def __post_init__(self) -> None:
        _check_body("body", self.body)
        _check_id(self.request_id)


def enc_admin(r: AdminRequest, rid: int, version: int) -> bytes:
    cmd = r.command.encode("ascii")
    return _REQ.pack(13 + len(cmd) + len(r.args), version, _OP, 0, rid, len(cmd)) + cmd + r.args


def enc_admin_resp(r: AdminResponse, rid: int, version: int) -> bytes:
    return _RESP.pack(12 + len(r.body), version, 0x80 | _OP, 0, rid) + r.body


def dec_admin(frame: bytes, n: int, flags: int, rid: int) -> AdminRequest:
    """``frame`` is the frame after its length (``n`` bytes, header included)."""
    if flags:
        raise InvalidArgumentError(f"flags 0x{flags:x} not allowed on ADMIN")
    if n < 14 or n < 13 + frame[12]:
        raise InvalidArgumentError(f"ADMIN body of {n - 12} bytes is shorter than its command")
    end = 13 + frame[12]
    try:
        command = frame[13:end].decode("ascii")
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError("admin command is not ASCII") from exc
    return AdminRequest(command, frame[end:n], rid)


def dec_admin_resp(frame: bytes, n: int, rid: int) -> AdminResponse:
    return AdminResponse(frame[12:n], rid)
