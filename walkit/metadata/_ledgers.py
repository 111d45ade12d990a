"""The ledger manager: ledger ids, and ledger metadata kept under its layout's paths.

Theory of operation
-------------------
A BookKeeper-format cluster (``ClusterInfo.format``) keeps BookKeeper 4.18's records at
its manager's paths and draws ids from BookKeeper's own generators
(:mod:`walkit.metadata._bk_ledgers`: ``bk-*`` digests only, the clear password kept);
everything below about CAS, lost replies, listing, watches and deletes holds for both
formats, and the rest of this docstring describes walkit's own ids and bytes.

Ids. An id is the sequence number of an ephemeral sequential node
``<root>/idgen/HOB-<hob:010d>/ID-<seq>``: the store makes the number unique under its
parent, so ``hob * LOW_LIMIT + seq`` is unique across all processes and all clients of
the cluster (BookKeeper's long id generator works the same way). A manager takes
``id_range`` (64) numbers at once - one transaction of that many creates, which the
store applies together, so they are consecutive and no other taker's number falls
between them - and hands them out from memory: one store call per 64 ledgers, not two
per ledger. The nodes are deleted with the next range's transaction (or go with the
session: a range whose reply was lost - the driver retried, or gave up and it landed
later - leaves its nodes until then, which costs nothing but their rows; the numbers
are never handed out); a taker of one number at a time (an older walkit) shares the
bucket safely. A sequence number at or past ``LOW_LIMIT`` (2^31 - 1, where ZooKeeper's
32-bit counter ends) moves every generator to the next "high-order bucket": the ids
cover the whole 63-bit space and only grow within a bucket. The ``HOB-`` parents hold
nothing but ``ID-`` nodes, so another child can never take a number.

Metadata. A ledger's :class:`LedgerMetadata` is stored at :func:`ledger_path` for the
cluster's layout, encoded as ``docs/format.md`` describes (creations made at once by
several threads go in one transaction: :mod:`walkit.metadata._creates`); the node's version is the
compare-and-set token of every change (:meth:`write` takes the version read,
:meth:`update` is the read-modify-CAS loop). Listing walks the tree in id order one
directory at a time (:func:`iter_ledger_ids`), so it never holds more than one
directory's names (10,000 at most in the hierarchical layout).

A connection lost after the store applied a write but before its reply came makes the
driver's retry fail (node exists, version moved) although the write landed. For
:meth:`create` the node is read back: our own bytes (they carry the ledger's fresh
random salt, like BookKeeper's creator token) mean success. :meth:`write` cannot tell
its own landed write from a twin made by another writer from the same version, so it
reports the conflict; :meth:`update` then re-reads and ``change`` finds its change
already made (returns None or an equal value): that is the way to make changes that
survive lost replies. A retried :meth:`delete` whose first attempt landed says
NoSuchLedgerError.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator

from walkit.errors import (
    FormatError,
    FormatVersionError,
    InvalidArgumentError,
    LedgerExistsError,
    MetadataError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
    NoSuchLedgerError,
)
from walkit.metadata._creates import CreateJoiner
from walkit.metadata._cluster import ClusterInfo, cluster_path
from walkit.metadata._ledger import LedgerMetadata
from walkit.metadata import _bk_ledgers, _bk_paths
from walkit.metadata._paths import MAX_LEDGER_ID
from walkit.metadata._retry import ATTEMPTS, retry_cas
from walkit.metadata._store import ANY_VERSION, Create, Delete, MetadataStore, Stat, Watch

__all__ = ["LedgerManager", "LOW_LIMIT"]

LOW_LIMIT = (1 << 31) - 1  # sequence numbers per high-order bucket
_HOB = "HOB-"
_ID = "ID-"
UPDATE_ATTEMPTS = ATTEMPTS


class _Refused(Exception):
    """A MetadataVersionError an update's ``change`` raised itself (it refuses what it
    found), carried past the retry of lost compare-and-sets."""

    def __init__(self, error: MetadataVersionError) -> None:
        super().__init__(str(error))
        self.error = error
ID_RANGE = 64  # ledger ids taken from the store at a time


class LedgerManager:
    """Ids and metadata of the ledgers of one cluster (thread-safe, as its store)."""

    def __init__(self, store: MetadataStore, cluster: ClusterInfo, *, low_limit: int = LOW_LIMIT,
                 id_range: int = ID_RANGE) -> None:
        """``low_limit`` (sequence numbers per bucket) exists for tests that cross
        buckets quickly; every manager of one cluster must use the same value (a
        BookKeeper-format cluster ignores it: its ids follow BookKeeper's generators).
        ``id_range``: ids taken from the store at a time (1: one store call per id)."""
        if not 1 <= low_limit <= LOW_LIMIT:
            raise InvalidArgumentError("low_limit out of range", low_limit=low_limit, max=LOW_LIMIT)
        if not 1 <= id_range <= 1024:
            raise InvalidArgumentError("id_range out of range", id_range=id_range, min=1, max=1024)
        self.id_range = id_range
        self._store = store
        self._cluster = cluster
        self._root = cluster.root
        self._idgen = cluster_path(cluster.root, "idgen")
        self._low_limit = low_limit
        self._hob: int | None = None  # the bucket ids come from; found on first use
        self._ids_lock = threading.Lock()
        self._creates = CreateJoiner(store)  # concurrent creations: one transaction
        self._ids: collections.deque[int] = collections.deque()  # taken from the store, not handed out
        self._spent: list[str] = []  # the last range's id nodes, deleted with the next range's creation
        self._bk = cluster.format == "bookkeeper"
        self._bk_ids = _bk_ledgers.BkIdGenerator(store, cluster, id_range) if self._bk else None

    @property
    def cluster(self) -> ClusterInfo:
        return self._cluster

    def path(self, ledger_id: int) -> str:
        return _bk_paths.ledger_path(self._root, ledger_id, self._cluster.layout)

    # -- ids ----------------------------------------------------------------------

    def new_ledger_id(self) -> int:
        """A ledger id no other call, in any process, has been or will be given. Ids are
        taken :attr:`id_range` at a time (:meth:`_take_range`, one store transaction) and
        handed out from memory, in ascending order; those not handed out when the manager
        is dropped are never used by anyone (gaps, as BookKeeper's id ranges leave)."""
        with self._ids_lock:
            while not self._ids:
                if self._bk_ids is not None:
                    self._ids.extend(self._bk_ids.take())
                else:
                    self._take_range()
            return self._ids.popleft()

    def _take_range(self) -> None:
        """(``_ids_lock`` held) ``id_range`` sequence numbers of the current bucket in one
        transaction: that many ephemeral sequential creates, which the store applies
        together, so their numbers are consecutive; the previous range's nodes are
        deleted in the same transaction (a number, once drawn, is never drawn again:
        the nodes are not needed after that, and any left go with the session)."""
        hob = self._current_hob()
        while True:
            bucket = f"{self._idgen}/{_HOB}{hob:010d}"
            spent = [Delete(path) for path in self._spent]
            ops: list[Create | Delete] = [*spent, *[Create(f"{bucket}/{_ID}", ephemeral=True, sequential=True)]
                                          * self.id_range]
            try:
                created = self._store.transaction(ops)[len(spent):]
            except NoNodeError as exc:
                failed = exc.context.get("op_index")
                if isinstance(failed, int) and failed < len(spent):  # one went with an expired session
                    self._drop_spent()
                else:  # a new bucket
                    with contextlib.suppress(NodeExistsError):
                        self._store.create(bucket)
                continue
            self._spent = [str(path) for path in created]
            seqs = [int(str(path).rsplit("/", 1)[1].removeprefix(_ID)) for path in created]
            usable = [hob * self._low_limit + seq for seq in seqs if 0 <= seq < self._low_limit]
            if usable:
                self._hob = hob
                self._ids.extend(i for i in usable if i <= MAX_LEDGER_ID)
                if not self._ids:
                    raise MetadataError("ledger ids exhausted", root=self._root, hob=hob)
                return
            hob = max(hob + 1, self._highest_hob())  # this bucket is full: on to the next

    def _drop_spent(self) -> None:
        """The previous range's nodes one by one (some are gone already)."""
        for path in self._spent:
            with contextlib.suppress(NoNodeError):
                self._store.delete(path)
        self._spent = []

    def _current_hob(self) -> int:
        if self._hob is None:
            self._hob = self._highest_hob()
        return self._hob

    def _highest_hob(self) -> int:
        hobs = [int(n[len(_HOB):]) for n in self._store.children(self._idgen)
                if n.startswith(_HOB) and n[len(_HOB):].isdigit()]
        return max(hobs, default=0)

    # -- metadata -----------------------------------------------------------------

    def create(self, metadata: LedgerMetadata) -> int:
        """Store a new ledger's metadata; returns its version. LedgerExistsError if the
        id is taken."""
        path, data = self.path(metadata.ledger_id), self._encode(metadata)
        try:
            self._creates.create(path, data)
        except NodeExistsError as exc:
            if self._landed(path, data, 0):
                return 0
            raise LedgerExistsError("ledger already exists", ledger=metadata.ledger_id, path=path) from exc
        return 0

    def _landed(self, path: str, data: bytes, version: int) -> bool:
        """Whether a create that failed after a retry was in fact ours, applied before
        its reply was lost with the connection: the node holds exactly our bytes at the
        version our create made (a fresh random salt: nobody else's bytes match)."""
        try:
            current, stat = self._store.get(path)
        except NoNodeError:
            return False
        return current == data and stat.version == version

    def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """The metadata and its version. NoSuchLedgerError, FormatError."""
        path = self.path(ledger_id)
        try:
            data, stat = self._store.get(path)
        except NoNodeError as exc:
            raise NoSuchLedgerError("no such ledger", ledger=ledger_id, path=path) from exc
        return self._decode(ledger_id, path, data, stat), stat.version

    def _encode(self, metadata: LedgerMetadata) -> bytes:
        return _bk_ledgers.encode(metadata, self._root) if self._bk else metadata.encode()

    def _decode(self, ledger_id: int, path: str, data: bytes, stat: Stat | None) -> LedgerMetadata:
        try:
            meta = _bk_ledgers.decode(ledger_id, data, stat) if self._bk else LedgerMetadata.decode(data)
        except FormatVersionError as exc:  # a newer walkit's ledger: neither read nor written here
            raise FormatVersionError.unreadable("ledger metadata", exc.version, exc.known, ledger=ledger_id,
                                                path=path) from exc
        except FormatError as exc:
            raise FormatError("unreadable ledger metadata", ledger=ledger_id, path=path, reason=str(exc)) from exc
        if meta.ledger_id != ledger_id:
            raise FormatError("ledger metadata names another ledger", ledger=ledger_id, path=path,
                              found=meta.ledger_id)
        return meta

    def write(self, metadata: LedgerMetadata, version: int) -> int:
        """Replace the metadata if its version is still ``version``; the new version.
        MetadataVersionError when someone else changed it first."""
        path = self.path(metadata.ledger_id)
        if version < 0:
            raise InvalidArgumentError("a ledger metadata write needs the version it read", ledger=metadata.ledger_id,
                                       version=version)
        data = self._encode(metadata)
        try:
            return self._store.set(path, data, version).version
        except NoNodeError as exc:
            raise NoSuchLedgerError("no such ledger", ledger=metadata.ledger_id, path=path) from exc

    def update(self, ledger_id: int, change: Callable[[LedgerMetadata], LedgerMetadata | None],
               *, attempts: int = UPDATE_ATTEMPTS) -> tuple[LedgerMetadata, int]:
        """Read, ``change``, compare-and-set; again on a conflict (at most ``attempts``
        times). ``change`` returns the new metadata, or None to leave it as it is (it
        sees the latest metadata each time, so it decides again after a conflict; the
        retries wait as :mod:`walkit.metadata._retry` says)."""

        def attempt() -> tuple[LedgerMetadata, int]:
            current, version = self.read(ledger_id)
            try:
                new = change(current)
            except MetadataVersionError as exc:  # the change's own verdict: not a lost set, not retried
                raise _Refused(exc) from exc
            if new is None or new == current:
                return current, version
            if new.ledger_id != ledger_id:
                raise InvalidArgumentError("an update cannot change the ledger id", ledger=ledger_id,
                                           new=new.ledger_id)
            return new, self.write(new, version)

        try:
            return retry_cas(attempt, "ledger metadata", attempts=attempts, ledger=ledger_id)
        except _Refused as refused:
            raise refused.error from None

    def delete(self, ledger_id: int, version: int = ANY_VERSION) -> None:
        """Remove the metadata (only at ``version`` unless ANY_VERSION); in a
        BookKeeper-format cluster, its directories left empty too (as BookKeeper)."""
        path = self.path(ledger_id)
        try:
            self._store.delete(path, version)
        except NoNodeError as exc:
            raise NoSuchLedgerError("no such ledger", ledger=ledger_id, path=path) from exc
        if self._bk and self._cluster.layout != "flat":  # as BookKeeper: its empty directories go too
            _bk_ledgers.prune_parents(self._store, self._root, path)

    def exists(self, ledger_id: int) -> bool:
        return self._store.exists(self.path(ledger_id)) is not None

    def ledger_ids(self) -> Iterator[int]:
        """Every ledger id, ascending, listed lazily one directory at a time. Ledgers
        created or deleted during the walk may or may not be seen."""
        return _bk_paths.iter_ledger_ids(self._root, self._children, self._cluster.layout)

    def sync(self) -> None:
        """Make the next reads see every ledger created or deleted before this call."""
        self._store.sync(self._root)

    def ledger_ranges(self, before_call: Callable[[], object] | None = None) -> Iterator[tuple[int, int, list[int]]]:
        """``(first, last, ids)`` per directory of ledger nodes, ascending and disjoint
        (:func:`iter_ledger_ranges`): garbage collection compares a bookie's ledgers
        with the store's one range at a time. A store error (connection, session)
        propagates; a directory deleted during the walk lists as empty.
        ``before_call()`` runs before each listing (a rate limiter)."""
        def children(path: str) -> list[str]:
            if before_call is not None:
                before_call()
            return self._children(path)

        return _bk_paths.iter_ledger_ranges(self._root, children, self._cluster.layout)

    def _children(self, path: str) -> list[str]:
        try:
            return self._store.children(path)
        except NoNodeError:
            return []  # a directory deleted while we walk

    def watch(self, ledger_id: int, callback: Callable[[LedgerMetadata | None, int], None]) -> Watch:
        """Call back now and after every change: (metadata, version), or (None, -1)
        once the ledger is deleted."""
        path = self.path(ledger_id)

        def on_change(data: bytes | None, stat: Stat | None) -> None:
            if data is None or stat is None:
                callback(None, -1)
            else:
                callback(self._decode(ledger_id, path, data, stat), stat.version)

        return self._store.watch_data(path, on_change)
