"""A log's metadata node and the names it lives under.

Theory of operation
-------------------
A log is a node ``<root>/logs/<namespace>/<name>`` (:class:`~walkit.wal._format.LogMetadata`):
the writer epoch, the segments (ledgers, in order, numbered from 1), the snapshots and
settings. :class:`LogNode` reads it and writes it, every write a compare-and-set on the
version read: two changes made from the same read never both land. Its calls block
(metadata round trips): run them off the client's loop (``LedgerClient.metadata``).

:func:`settle` turns a change whose outcome is unknown (its reply lost, or it gave up
while still on its way) into a firm answer - the only ground on which a ledger the change
would have named may be deleted.

Names: a new log's or namespace's name follows :data:`NAME_RULES`; names an earlier
walkit allowed stay reachable (:func:`check_name`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from walkit.errors import FormatError, InvalidArgumentError, NodeExistsError, NoNodeError, NoSuchLogError, WalkitError
from walkit.logs import context
from walkit.metadata import Cluster, LedgerMetadata, check_bookie_id, retry_cas, walkit_path
from walkit.wal._auth import LogAuth, check_password
from walkit.wal._format import LogMetadata, LogSettings

__all__ = ["NAME_RULES", "LogNode", "check_name", "is_plain_name", "settle"]

log = logging.getLogger("walkit.wal._log")  # the logger these lines always had

#: What a new log's or namespace's name may hold: letters and digits (any script), and
#: ``. _ - : @ + =``; 1 to 255 characters, not starting with ".". Names that pass stay
#: one word in every listing, a shell argument without quotes, and a node name.
NAME_RULES = "1-255 letters, digits and . _ - : @ + =, not starting with '.'"
_NAME_PUNCTUATION = frozenset("._-:@+=")


def is_plain_name(value: object) -> bool:
    """True if ``value`` follows :data:`NAME_RULES`."""
    return (isinstance(value, str) and 0 < len(value) <= 255 and not value.startswith(".")
            and all(c.isalnum() or c in _NAME_PUNCTUATION for c in value))


def check_name(kind: str, value: str, *, new: bool = False) -> str:
    """``value`` as a name of ``kind`` ("log", "namespace"). A name given to make
    something ``new`` follows :data:`NAME_RULES`; one that may name an existing node
    only has to be a node name (logs made by an earlier walkit stay reachable)."""
    if new and not is_plain_name(value):
        raise InvalidArgumentError(f"invalid {kind} name: use {NAME_RULES}", name=repr(value)[:300])
    try:
        return check_bookie_id(value)  # the same rules: one non-empty node name
    except InvalidArgumentError:
        raise InvalidArgumentError(f"invalid {kind} name: use {NAME_RULES}", name=repr(value)[:300]) from None


class LogNode:
    """The log's metadata node (blocking calls: run them off the client loop)."""

    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        self.store = cluster.store
        self.namespace = check_name("namespace", namespace)
        self.name = check_name("log", name)
        self.ns_path = walkit_path(cluster.info, f"logs/{namespace}")
        self.path = f"{self.ns_path}/{name}"
        self.holds_path = walkit_path(cluster.info, f"logholds/{namespace}/{name}")

    def read(self) -> tuple[LogMetadata, int]:
        try:
            data, stat = self.store.get(self.path)
        except NoNodeError:
            raise NoSuchLogError("no such log", namespace=self.namespace, log=self.name) from None
        return LogMetadata.decode(data, self.path), stat.version

    def namespace_defaults(self) -> dict[str, Any]:
        try:
            data, _ = self.store.get(self.ns_path)
        except NoNodeError:
            return {}
        try:
            return dict(json.loads(data or b"{}"))
        except (ValueError, TypeError) as exc:
            raise FormatError("unreadable namespace defaults", path=self.ns_path, reason=str(exc)[:200]) from exc

    def create(self, settings: LogSettings, password: bytes) -> LogMetadata | None:
        """Make the node of a new log, its epoch 1 claimed by the caller (a writer
        opening it) with a verifier of its password: the node made (at version 0), or
        None when it exists (already, or made by another writer at the same time: the
        caller checks the password and bumps the epoch)."""
        meta = LogMetadata(1, (), (), None, settings, auth=LogAuth.of(password))
        if not (is_plain_name(self.namespace) and is_plain_name(self.name)) and self.store.exists(self.path):
            return None  # made by an earlier walkit, whose names had fewer rules: it stays reachable
        check_name("namespace", self.namespace, new=True)
        check_name("log", self.name, new=True)
        try:
            self.store.create(self.path, meta.encode(), make_parents=True)
        except NodeExistsError:
            return None
        return meta

    def write(self, meta: LogMetadata, version: int) -> int:
        return self.store.set(self.path, meta.encode(), version).version

    def check_password(self, ledger_metadata: Callable[[int], LedgerMetadata], meta: LogMetadata,
                       password: bytes) -> None:
        """(Blocking) UnauthorizedError unless ``password`` is the log's: before anything
        of the log changes on its bearer's behalf (walkit/wal/_auth.py)."""
        def ledger_ok(ledger_id: int, candidate: bytes) -> bool:
            return ledger_metadata(ledger_id).check_password(candidate)

        check_password(meta.auth, meta.ledgers_newest_first(), password, ledger_ok,
                       namespace=self.namespace, log=self.name)


def settle(node: LogNode, present: Callable[[LogMetadata], bool]) -> bool | None:
    """After a change to the log node failed, whether it is in: True, False (and never
    will be), or None (the metadata store cannot tell now).

    A failed change may still have landed: its reply was lost, or it was retried and a
    later attempt failed. Reading the node is not enough to say "no": a write whose
    connection dropped can still be committed after the read. So a "no" is made final by
    writing the node back unchanged at the version read: every write that expected an
    older version can never apply. Only a final "no" lets the caller delete what the
    change would have named (a segment's or a snapshot's ledger); anything else keeps it.
    (Blocking: run it off the client loop.)"""

    def decide() -> bool:
        meta, version = node.read()
        if present(meta):
            return True
        node.write(meta, version)
        return False

    try:
        return retry_cas(decide, "log metadata (settling a failed change)", log=node.name)
    except WalkitError as exc:
        log.warning("log %s: cannot tell whether a failed metadata change landed: %s", node.name, exc,
                    extra=context(log=node.name, namespace=node.namespace))
        return None
