"""Under-replication markers, the auditor's seat and the off switch, in the metadata store.

:class:`UnderReplication` is the one place the cluster's format picks the records: a
walkit-format cluster keeps walkit's own (below); a BookKeeper-format cluster keeps
BookKeeper 4.18's own tree under ``<root>/underreplication``
(:mod:`walkit.metadata._bk_underreplication`: its marks, locks, auditor election and
``disable`` switch, shared with Java auditors, workers and BookieShell). Both answer the
same operations with the same :class:`~walkit.metadata._marker.Marker`.

Layout of a walkit-format cluster, under its root, made on first use::

    underreplication/ledgers/L<ledger id:019d>         a marker: JSON {"bookies": [...], "since": ms}
    underreplication/ledgers/L<ledger id:019d>/lock    ephemeral: the worker re-replicating it
    underreplication/auditor                           ephemeral: the auditor's id
    underreplication/disable                           exists: auditor and workers idle

Theory of operation
-------------------
The auditor *marks* a ledger with the bookies that lack copies of it (merged into an
existing marker by CAS). A worker *locks* a marker by creating its ephemeral ``lock``
child: one worker per marker at a time, and a worker that dies releases it with its
session. A worker that repaired a ledger *completes* the marker: one transaction checks
the marker's version (a bookie the auditor added meanwhile keeps it for another round)
and deletes lock and marker. A marker whose ledger is gone is *dropped*. The auditor's
seat is an ephemeral node too: whoever creates it audits until its session ends, and the
other candidates take it over then.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from walkit.errors import MetadataVersionError, NodeExistsError, NoNodeError
from walkit.metadata._bk_underreplication import BkUnderReplication
from walkit.metadata._cluster import ClusterInfo, walkit_path
from walkit.metadata._marker import Marker
from walkit.metadata._store import Check, Delete, MetadataStore

__all__ = ["Marker", "UnderReplication"]

_PREFIX = "L"


class UnderReplication:
    """The markers, seat and switch of one cluster, in its format's records (thread-safe,
    as its store)."""

    def __init__(self, store: MetadataStore, info: ClusterInfo) -> None:
        self._impl: BkUnderReplication | _WalkitMarkers = (
            BkUnderReplication(store, info.root) if info.format == "bookkeeper" else _WalkitMarkers(store, info))

    def mark(self, ledger_id: int, bookies: Iterable[str]) -> None:
        """``ledger_id`` lacks the copies ``bookies`` should hold (merged with a marker there)."""
        self._impl.mark(ledger_id, bookies)

    def ledgers(self) -> list[int]:
        """The ledgers marked, ascending."""
        return self._impl.ledgers()

    def read(self, ledger_id: int) -> Marker | None:
        return self._impl.read(ledger_id)

    def lock(self, ledger_id: int, owner: str) -> bool:
        """Take the marker (False: another worker has it, or the marker is gone)."""
        return self._impl.lock(ledger_id, owner)

    def unlock(self, ledger_id: int) -> None:
        self._impl.unlock(ledger_id)

    def complete(self, marker: Marker) -> bool:
        """Delete a repaired marker (and its lock) unless it changed since it was read;
        False: it changed (kept, unlocked, for another round)."""
        return self._impl.complete(marker)

    def is_marked(self, ledger_id: int) -> bool:
        """Whether the ledger waits for (or is under) re-replication: garbage collection
        never takes a copy of it as over-replicated meanwhile."""
        return self._impl.is_marked(ledger_id)

    def drop(self, ledger_id: int) -> None:
        """Delete a marker whatever it says (its ledger is gone)."""
        self._impl.drop(ledger_id)

    def disabled(self) -> bool:
        return self._impl.disabled()

    def set_disabled(self, disabled: bool) -> None:
        self._impl.set_disabled(disabled)

    def lost_bookie_recovery_delay(self, configured: float) -> float:
        """The seconds an auditor waits before it audits a lost bookie: ``configured`` in a
        walkit-format cluster (nothing stored); in a BookKeeper-format cluster BookKeeper's
        shared ``lostBookieRecoveryDelay`` (whole seconds), made from ``configured`` if absent."""
        return self._impl.lost_bookie_recovery_delay(configured)

    def auditor(self) -> str | None:
        """The auditor's name, None: nobody audits."""
        return self._impl.auditor()

    def take_seat(self, owner: str) -> bool:
        """Whether ``owner`` (this store's session) is the auditor, taking the seat if free."""
        return self._impl.take_seat(owner)

    def leave_seat(self) -> None:
        self._impl.leave_seat()


class _WalkitMarkers:
    """walkit's own markers (see the module docstring)."""

    def __init__(self, store: MetadataStore, info: ClusterInfo) -> None:
        self._store = store
        self._base = walkit_path(info, "underreplication")
        self._ledgers = f"{self._base}/ledgers"
        self._auditor = f"{self._base}/auditor"
        self._disable = f"{self._base}/disable"

    def _path(self, ledger_id: int) -> str:
        return f"{self._ledgers}/{_PREFIX}{ledger_id:019d}"

    def _ensure(self) -> None:
        if self._store.exists(self._ledgers) is None:
            try:
                self._store.create(self._ledgers, make_parents=True)
            except NodeExistsError:
                pass

    # --- markers ------------------------------------------------------------------------
    def mark(self, ledger_id: int, bookies: Iterable[str]) -> None:
        """``ledger_id`` lacks the copies ``bookies`` should hold (merged with a marker there)."""
        wanted = set(bookies)
        self._ensure()
        path = self._path(ledger_id)
        while True:
            current = self.read(ledger_id)
            if current is None:
                data = json.dumps({"bookies": sorted(wanted), "since": int(time.time() * 1000)}).encode()
                try:
                    self._store.create(path, data)
                    return
                except NodeExistsError:
                    continue
            if wanted <= current.bookies:
                return
            data = json.dumps({"bookies": sorted(current.bookies | wanted), "since": int(current.since * 1000)}).encode()
            try:
                self._store.set(path, data, current.version)
                return
            except (MetadataVersionError, NoNodeError):
                continue

    def ledgers(self) -> list[int]:
        """The ledgers marked, ascending."""
        try:
            names = self._store.children(self._ledgers)
        except NoNodeError:
            return []
        return sorted(int(n[len(_PREFIX):]) for n in names if n.startswith(_PREFIX) and n[len(_PREFIX):].isdigit())

    def read(self, ledger_id: int) -> Marker | None:
        path = self._path(ledger_id)
        try:
            data, stat = self._store.get(path)
        except NoNodeError:
            return None
        try:
            body = json.loads(data)
            bookies, since = frozenset(str(b) for b in body["bookies"]), float(body["since"]) / 1000.0
        except (ValueError, KeyError, TypeError):
            bookies, since = frozenset(), 0.0  # unreadable: a worker repairs what the metadata says is missing
        locked_by: str | None
        try:
            locked_by = self._store.get(f"{path}/lock")[0].decode("utf-8", "replace")
        except NoNodeError:
            locked_by = None
        return Marker(ledger_id, bookies, since, stat.version, locked_by)

    def lock(self, ledger_id: int, owner: str) -> bool:
        """Take the marker (False: another worker has it, or the marker is gone)."""
        try:
            self._store.create(f"{self._path(ledger_id)}/lock", owner.encode(), ephemeral=True)
            return True
        except NodeExistsError:
            stat = self._store.exists(f"{self._path(ledger_id)}/lock")
            return stat is not None and stat.ephemeral_owner == self._store.session_id
        except NoNodeError:
            return False

    def unlock(self, ledger_id: int) -> None:
        try:
            self._store.delete(f"{self._path(ledger_id)}/lock")
        except NoNodeError:
            pass

    def complete(self, marker: Marker) -> bool:
        """Delete a repaired marker (and its lock) unless it changed since it was read;
        False: it changed (kept, unlocked, for another round)."""
        path = self._path(marker.ledger_id)
        try:
            self._store.transaction([Check(path, marker.version), Delete(f"{path}/lock"), Delete(path)])
            return True
        except (MetadataVersionError, NoNodeError):
            self.unlock(marker.ledger_id)
            return False

    def is_marked(self, ledger_id: int) -> bool:
        """Whether the ledger waits for (or is under) re-replication: garbage collection
        never takes a copy of it as over-replicated meanwhile (a worker copies entries to
        a bookie before the metadata names it)."""
        return self._store.exists(self._path(ledger_id)) is not None

    def drop(self, ledger_id: int) -> None:
        """Delete a marker whatever it says (its ledger is gone)."""
        try:
            self._store.delete(self._path(ledger_id), recursive=True)
        except NoNodeError:
            pass

    # --- switch, delay and seat ------------------------------------------------------------
    def lost_bookie_recovery_delay(self, configured: float) -> float:
        return configured

    def disabled(self) -> bool:
        return self._store.exists(self._disable) is not None

    def set_disabled(self, disabled: bool) -> None:
        try:
            if disabled:
                self._store.create(self._disable, make_parents=True)
            else:
                self._store.delete(self._disable)
        except (NodeExistsError, NoNodeError):
            pass

    def auditor(self) -> str | None:
        try:
            return self._store.get(self._auditor)[0].decode("utf-8", "replace")
        except NoNodeError:
            return None

    def take_seat(self, owner: str) -> bool:
        """Whether ``owner`` (this store's session) is the auditor, taking the seat if free."""
        try:
            self._store.create(self._auditor, owner.encode(), ephemeral=True, make_parents=True)
            return True
        except NodeExistsError:
            stat = self._store.exists(self._auditor)
            return stat is not None and stat.ephemeral_owner == self._store.session_id

    def leave_seat(self) -> None:
        stat = self._store.exists(self._auditor)
        if stat is not None and stat.ephemeral_owner == self._store.session_id:
            try:
                self._store.delete(self._auditor)
            except NoNodeError:
                pass
