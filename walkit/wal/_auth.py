"""Who may change a log: its password, checked before anything of the log moves.

Theory of operation
-------------------
A log's ledgers (segments, snapshots) all carry the password of the writers that made
them; a bookie refuses an add or a fence without the matching master key, and a ledger's
metadata keeps a salted verifier of it. Opening a log for writing, though, changes the
*log's* node first: the epoch moves, and the writer that held it is deposed at its next
metadata change. So the log node keeps a verifier of its own (``"auth"`` in the node,
docs/format.md), and every path that changes the node on behalf of someone who named a
password checks it first, in the same read that precedes the compare-and-set:

* a writer's open (the epoch bump, then fencing the last segments), and a reader's
  ``hold`` or ``cursor`` (which keep records from retention) check
  :func:`check_password` against the node they read; a wrong password is
  :class:`~walkit.errors.UnauthorizedError` and nothing was written;
* a node written before logs had a verifier (``auth`` absent) is checked against its
  ledgers instead, newest first (the last segments, then snapshots): the first one whose
  metadata still exists decides. A log with no ledger left to ask has nothing to check
  against and is taken as it is. The writer that opens such a node writes the verifier
  with its epoch bump, so from then on the node answers on its own;
* everything else that changes the node - appends, rolls, snapshots, truncation,
  retention - is done by a writer that passed this check, and each change first checks
  that the epoch is still its own.

The verifier is HMAC-SHA256 keyed with the password over a context and a random 16-byte
salt, like ledger metadata version 2's (a log password is an access secret the
application draws, not a human password: docs/architecture.md, "Ledger passwords").
Administrative paths that name no password - ``delete_log``, namespace defaults, ``walkit
ledger delete``, ``walkit recover``/``decommission`` - are the metadata store's writers'
to use, as the architecture says: they fence nothing and never move an epoch.
"""

from __future__ import annotations

import base64
import hmac
import os
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from walkit.errors import FormatError, InvalidArgumentError, NoSuchLedgerError, UnauthorizedError

__all__ = ["LogAuth", "check_password"]

_CONTEXT = b"walkit log password\x00"
SALT_SIZE = 16
HASH_SIZE = 32
SCHEME = "hmac-sha256"


class LogAuth(NamedTuple):
    """A log's password verifier: ``HMAC-SHA256(password, context + salt)``."""

    salt: bytes
    hash: bytes

    @classmethod
    def of(cls, password: bytes) -> LogAuth:
        """A new verifier of ``password`` (fresh salt)."""
        if not isinstance(password, bytes):
            raise InvalidArgumentError("password must be bytes", type=type(password).__name__)
        salt = os.urandom(SALT_SIZE)
        return cls(salt, _digest(password, salt))

    def matches(self, password: bytes) -> bool:
        """True if ``password`` is the log's (constant-time comparison)."""
        return hmac.compare_digest(_digest(password, self.salt), self.hash)

    def to_json(self) -> dict[str, str]:
        return {"scheme": SCHEME, "salt": _b64(self.salt), "hash": _b64(self.hash)}

    @classmethod
    def from_json(cls, body: Any, path: str) -> LogAuth:
        if not isinstance(body, dict) or body.get("scheme") != SCHEME:
            raise FormatError("unknown log password scheme", path=path,
                              scheme=repr(body.get("scheme") if isinstance(body, dict) else body)[:40])
        salt, digest = base64.b64decode(body["salt"], validate=True), base64.b64decode(body["hash"], validate=True)
        if len(salt) != SALT_SIZE or len(digest) != HASH_SIZE:
            raise FormatError("log password verifier of the wrong size", path=path, salt=len(salt),
                              hash=len(digest))
        return cls(salt, digest)


def _digest(password: bytes, salt: bytes) -> bytes:
    return hmac.digest(password, _CONTEXT + salt, "sha256")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def check_password(auth: LogAuth | None, ledgers: Iterator[int], password: bytes,
                   ledger_password_ok: Callable[[int, bytes], bool], **ctx: object) -> None:
    """(Blocking: metadata) Raise UnauthorizedError unless ``password`` is the log's.
    ``auth``: the node's verifier (None: a node from before verifiers, checked against
    ``ledgers``, newest first, with ``ledger_password_ok``, which raises
    NoSuchLedgerError for a ledger that is gone)."""
    if not isinstance(password, bytes):
        raise InvalidArgumentError("password must be bytes", type=type(password).__name__)
    if auth is not None:
        if not auth.matches(password):
            raise UnauthorizedError("wrong password for log", **ctx)
        return
    for ledger_id in ledgers:
        try:
            ok = ledger_password_ok(ledger_id, password)
        except NoSuchLedgerError:
            continue
        if not ok:
            raise UnauthorizedError("wrong password for log (its ledgers have another)", ledger=ledger_id, **ctx)
        return
