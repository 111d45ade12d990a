"""Under-replication in a BookKeeper-format cluster: BookKeeper 4.18's own tree.

Layout under ``<root>/underreplication`` (what ``ZkLedgerUnderreplicationManager`` and
``ZkLedgerAuditorManager`` keep; docs/format.md, "Under-replication in a BookKeeper-format
cluster")::

    LAYOUT                                   UrLayout text: type "BASIC", version 1
    ledgers/<4 x 16-bit hex>/urL<id:010d>    a mark: UnderreplicatedLedgerFormat (replicas, ctime)
    locks/urL<id:010d>                       ephemeral: the worker re-replicating it (LockDataFormat)
    auditorelection                          data: the elected auditor (AuditorVoteFormat)
    auditorelection/V_<counter>              ephemeral sequential: a candidate's vote
    disable                                  exists (empty): auditors and workers idle
    lostBookieRecoveryDelay                  the auditors' delay, whole seconds as decimal text

Theory of operation
-------------------
The same operations as walkit's own markers (``_underreplication``), on BookKeeper's
records, so a Java auditor, Java replication workers and BookieShell share them with walkit.

*Marks.* :meth:`mark` creates the mark with its parents (``replica`` = the missing
bookies, ``ctime`` = now in ms) or, if one is there, appends the bookies it lacks and sets
``ctime`` again by CAS on its version - what BookKeeper does. A *lock* is
``locks/urL<id>``, ephemeral, holding ``bookieId: <owner>``; taking it first checks that
the mark exists, and checks again after, since a mark and its lock are separate nodes.
:meth:`complete` deletes the mark only at the version read (a replica the auditor added
meanwhile keeps it), then the empty hex directories above it, up to the first one still
holding another mark, then the lock: BookKeeper's ``markLedgerReplicated``. A mark whose
ledger is gone is dropped the same way whatever its version. A lock is released only by
the session that holds it.

*Auditor election.* Each candidate keeps one ephemeral sequential vote ``V_`` under
``auditorelection`` holding ``bookieId: <owner>``; the vote with the lowest counter is
the auditor, who writes its own vote into ``auditorelection``'s data, as BookKeeper's
``AuditorElector`` does. :meth:`take_seat` is the non-blocking form of that election:
cast a vote if this session has none, then report whether it is the lowest. A Java
candidate votes in the same directory with the same format, so a walkit auditor and a
Java one never both act; a candidate that dies takes its vote with its session and the
next in line takes over. A session's votes are found by their ephemeral owner, so any
instance on the same session can leave the seat.

*Delay.* The auditor's ``lostBookieRecoveryDelay`` is the cluster's, in
``lostBookieRecoveryDelay``: the first auditor writes its configured value there if the
node is missing (BookKeeper's ``initializeLostBookieRecoveryDelay``), and every auditor
then uses the node's value, so BookieShell ``lostbookierecoverydelay -set`` reaches walkit's
auditor too.

The tree's ``LAYOUT`` and its ``ledgers``/``locks`` directories are made on first write,
as BookKeeper does; a ``LAYOUT`` of another type or version raises ClusterLayoutError.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from walkit.errors import (
    ClusterLayoutError,
    FormatError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from walkit.metadata._bk_paths import election_path, parse_ur_path, ur_lock_path, ur_path, vote_sequence
from walkit.metadata._bk_records import BookieNote, UrLayout, UrMark
from walkit.metadata._marker import Marker
from walkit.metadata._store import MetadataStore

__all__ = ["BkUnderReplication"]

_DEPTH = 4  # hex directories between ledgers/ and a mark


def _note(data: bytes) -> str:
    """The bookie id a lock or vote names (its raw text if unreadable)."""
    try:
        return BookieNote.decode(data).bookie_id or ""
    except FormatError:
        return bytes(data).decode("utf-8", "replace")


class BkUnderReplication:
    """The marks, locks, election and switch of one BookKeeper-format cluster (thread-safe, as its store)."""

    def __init__(self, store: MetadataStore, root: str) -> None:
        self._store, self._root = store, root
        self._election = election_path(root)
        self._base = self._election.rsplit("/", 1)[0]
        self._ledgers = f"{self._base}/ledgers"
        self._locks = f"{self._base}/locks"
        self._layout = f"{self._base}/LAYOUT"
        self._disable = f"{self._base}/disable"
        self._delay = f"{self._base}/lostBookieRecoveryDelay"
        self._ready = False

    def _create(self, path: str, data: bytes = b"", *, make_parents: bool = False) -> None:
        try:
            self._store.create(path, data, make_parents=make_parents)
        except NodeExistsError:
            pass

    def _ensure(self) -> None:
        """BookKeeper's tree: its LAYOUT checked (or written), ``ledgers`` and ``locks``."""
        if self._ready:
            return
        if self._store.exists(self._base) is None:
            self._create(self._base, make_parents=True)
        while True:
            try:
                data, _ = self._store.get(self._layout)
            except NoNodeError:
                try:
                    self._store.create(self._layout, UrLayout().encode())
                    break
                except NodeExistsError:
                    continue
            try:
                layout = UrLayout.decode(data)
            except FormatError as exc:
                raise ClusterLayoutError("unreadable BookKeeper under-replication LAYOUT", path=self._layout,
                                         layout=repr(bytes(data[:80]))) from exc
            if layout != UrLayout():
                raise ClusterLayoutError("BookKeeper under-replication LAYOUT walkit does not know", path=self._layout,
                                         type=layout.type, version=layout.version)
            break
        for path in (self._ledgers, self._locks):
            if self._store.exists(path) is None:
                self._create(path)
        self._ready = True

    # --- marks -----------------------------------------------------------------------------
    def mark(self, ledger_id: int, bookies: Iterable[str]) -> None:
        """``ledger_id`` lacks the copies ``bookies`` should hold (appended to a mark there)."""
        wanted = sorted(set(bookies))
        path = ur_path(self._root, ledger_id)
        self._ensure()
        while True:
            now = int(time.time() * 1000)
            try:
                data, stat = self._store.get(path)
            except NoNodeError:
                try:
                    self._store.create(path, UrMark(tuple(wanted), now).encode(), make_parents=True)
                    return
                except (NodeExistsError, NoNodeError):  # marked meanwhile, or a parent pruned meanwhile
                    continue
            try:
                replicas = UrMark.decode(data).replicas
            except FormatError:
                replicas = ()  # unreadable: rewritten with what is known to be missing
            added = tuple(b for b in wanted if b not in replicas)
            if not added:
                return
            try:
                self._store.set(path, UrMark(replicas + added, now).encode(), stat.version)
                return
            except (MetadataVersionError, NoNodeError):
                continue

    def ledgers(self) -> list[int]:
        """The ledgers marked, ascending."""
        found: list[int] = []
        level = [self._ledgers]
        for depth in range(_DEPTH + 1):
            below: list[str] = []
            for parent in level:
                try:
                    names = self._store.children(parent)
                except NoNodeError:
                    continue  # pruned meanwhile
                for name in names:
                    child = f"{parent}/{name}"
                    if depth < _DEPTH:
                        below.append(child)
                    elif (ledger_id := parse_ur_path(self._root, child)) is not None:
                        found.append(ledger_id)
            level = below
        return sorted(found)

    def read(self, ledger_id: int) -> Marker | None:
        try:
            data, stat = self._store.get(ur_path(self._root, ledger_id))
        except NoNodeError:
            return None
        try:
            mark = UrMark.decode(data)
            bookies, since = frozenset(mark.replicas), (mark.ctime or 0) / 1000.0
        except FormatError:
            bookies, since = frozenset(), 0.0  # unreadable: a worker repairs what the metadata says is missing
        try:
            locked_by: str | None = _note(self._store.get(ur_lock_path(self._root, ledger_id))[0])
        except NoNodeError:
            locked_by = None
        return Marker(ledger_id, bookies, since, stat.version, locked_by)

    def is_marked(self, ledger_id: int) -> bool:
        return self._store.exists(ur_path(self._root, ledger_id)) is not None

    # --- locks -----------------------------------------------------------------------------
    def _mine(self, path: str) -> bool:
        stat = self._store.exists(path)
        return stat is not None and stat.ephemeral_owner == self._store.session_id

    def lock(self, ledger_id: int, owner: str) -> bool:
        """Take the mark (False: another worker has it, or the mark is gone)."""
        self._ensure()
        if not self.is_marked(ledger_id):
            return False
        lock = ur_lock_path(self._root, ledger_id)
        try:
            self._store.create(lock, BookieNote(owner).encode(), ephemeral=True)
        except NodeExistsError:
            return self._mine(lock) and self.is_marked(ledger_id)
        except NoNodeError:  # locks/ removed under us (a cluster being wiped)
            return False
        if not self.is_marked(ledger_id):  # completed between the look and the lock
            self.unlock(ledger_id)
            return False
        return True

    def unlock(self, ledger_id: int) -> None:
        """Release this session's lock (another worker's is left alone)."""
        lock = ur_lock_path(self._root, ledger_id)
        if self._mine(lock):
            try:
                self._store.delete(lock)
            except NoNodeError:
                pass

    def _prune(self, ledger_id: int) -> None:
        """The hex directories above a deleted mark, deepest first, while empty."""
        path = ur_path(self._root, ledger_id)
        for _ in range(_DEPTH):
            path = path.rsplit("/", 1)[0]
            try:
                self._store.delete(path)
            except NotEmptyError:
                return  # another ledger's mark is below
            except NoNodeError:
                continue

    def complete(self, marker: Marker) -> bool:
        """Delete a repaired mark unless it changed since it was read, then its lock; False:
        it changed (kept, unlocked, for another round) or is gone."""
        try:
            self._store.delete(ur_path(self._root, marker.ledger_id), marker.version)
        except (MetadataVersionError, NoNodeError):
            self.unlock(marker.ledger_id)
            return False
        self._prune(marker.ledger_id)
        self.unlock(marker.ledger_id)
        return True

    def drop(self, ledger_id: int) -> None:
        """Delete a mark whatever it says (its ledger is gone), and its lock."""
        try:
            self._store.delete(ur_path(self._root, ledger_id))
        except NoNodeError:
            pass
        self._prune(ledger_id)
        try:
            self._store.delete(ur_lock_path(self._root, ledger_id))
        except NoNodeError:
            pass

    # --- switch ----------------------------------------------------------------------------
    def disabled(self) -> bool:
        return self._store.exists(self._disable) is not None

    def set_disabled(self, disabled: bool) -> None:
        try:
            if disabled:
                self._ensure()
                self._store.create(self._disable, b"")
            else:
                self._store.delete(self._disable)
        except (NodeExistsError, NoNodeError):
            pass

    # --- the auditor's delay ---------------------------------------------------------------
    def lost_bookie_recovery_delay(self, configured: float) -> float:
        """BookKeeper's shared ``lostBookieRecoveryDelay`` (whole seconds, decimal text),
        made with ``int(configured)`` if absent, as a Java auditor does when it starts;
        BookieShell ``lostbookierecoverydelay -set`` changes it. Unreadable: ``configured``."""
        self._ensure()
        try:
            data, _ = self._store.get(self._delay)
        except NoNodeError:
            self._create(self._delay, str(int(configured)).encode())
            return float(int(configured))
        text = bytes(data).decode("ascii", "replace").strip()
        return float(int(text)) if text.lstrip("-").isdigit() and int(text) >= 0 else configured

    # --- auditor election ------------------------------------------------------------------
    def _votes(self) -> list[str]:
        """The votes' names, lowest counter (the auditor) first."""
        try:
            names = self._store.children(self._election)
        except NoNodeError:
            return []
        ranked: list[tuple[int, str]] = []
        for name in names:
            try:
                ranked.append((vote_sequence(name), name))
            except FormatError:
                continue  # not a vote
        return [name for _, name in sorted(ranked)]

    def _my_votes(self, votes: list[str]) -> list[str]:
        return [name for name in votes if self._mine(f"{self._election}/{name}")]

    def auditor(self) -> str | None:
        """The elected auditor's name (the lowest vote's), None: no candidate."""
        for name in self._votes():
            try:
                return _note(self._store.get(f"{self._election}/{name}")[0])
            except NoNodeError:
                continue  # left meanwhile: the next in line
        return None

    def take_seat(self, owner: str) -> bool:
        """Whether ``owner`` (this store's session) is the auditor: its vote cast if it has
        none, and the lowest."""
        self._ensure()
        if self._store.exists(self._election) is None:
            self._create(self._election)
        votes = self._votes()
        if not self._my_votes(votes):
            self._store.create(f"{self._election}/V_", BookieNote(owner).encode(), ephemeral=True, sequential=True)
            votes = self._votes()
        if not votes or not self._mine(f"{self._election}/{votes[0]}"):
            return False
        note = BookieNote(owner).encode()
        try:
            if self._store.get(self._election)[0] != note:
                self._store.set(self._election, note)
        except NoNodeError:
            return False
        return True

    def leave_seat(self) -> None:
        """Withdraw this session's votes (the next candidate in line becomes the auditor)."""
        for name in self._my_votes(self._votes()):
            try:
                self._store.delete(f"{self._election}/{name}")
            except NoNodeError:
                pass
