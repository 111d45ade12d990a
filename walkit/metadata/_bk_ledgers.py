"""The ledgers of a BookKeeper-format cluster: BookKeeper 4.18's id generators and records.

Theory of operation
-------------------
:class:`~walkit.metadata._ledgers.LedgerManager` keeps a BookKeeper-format cluster's
ledgers where and as BookKeeper's own ledger manager does, so Java clients, bookies and
BookieShell share them with walkit; this module is the BookKeeper half of it.

Records (:func:`encode`, :func:`decode`): a ledger znode is BookKeeper's record
(``_bk_ledger``: formats 1, 2 and 3 read, 3 written) at the manager's path
(``_bk_paths``). Only ``bk-*`` digests have such a record: a walkit digest is refused
with an InvalidArgumentError before anything is written. The record keeps the ledger's
clear password (``LedgerMetadata.bk_password``) and its creator token, carried through
the walkit value's salt so a value read and written back keeps it; a record without a
ctime (4.18 stores none by default) reads with the znode's creation time, as BookKeeper
does, and one without a password (a 4.0/4.1 client's) as ``bk-crc32`` with the empty
password (BookKeeper takes both from its reader).

Deletes: as BookKeeper's hierarchical and long-hierarchical managers do
(``ZkUtils.asyncDeleteFullPathOptimistic``), the ledger's directories left empty are
removed after it, innermost first, up to the first one that still holds something
(:func:`prune_parents`; flat has none). Racing a create there is safe: a create makes
its parents again (BookKeeper's ``createFullPathOptimistic``, walkit's ``make_parents``).

Ids (:class:`BkIdGenerator`), exactly as 4.18's generators, so Java clients and walkit
never hand out one id twice:

* ``hierarchical`` and ``longhierarchical`` (``LongZkLedgerIdGenerator`` over a
  ``ZkLedgerIdGenerator``): while ``<root>/idgen-long`` does not exist, the 31-bit
  generator - an EPHEMERAL_SEQUENTIAL ``<root>/idgen/ID-``, the id the counter ZooKeeper
  appends. A counter at or past ``Integer.MAX_VALUE`` (2^31 - 1) is an overflow: then
  ``idgen-long`` is created and from then on (for every client: Java checks it exists)
  ids come from the long generator: the highest ``idgen-long/HOB-<high:010d>`` directory
  (``HOB-0000000001`` is made when there is none), an EPHEMERAL_SEQUENTIAL ``ID-`` below
  it, id ``high << 32 | counter``; a counter overflow there makes ``HOB-<high + 1>``.
* ``flat`` (``ZkLedgerIdGenerator`` alone): ``<root>/ID-``; an overflow ends the ids
  (BookKeeper's ``LedgerIdOverflowException``), a MetadataError here.

Every id is a counter ZooKeeper drew from the same parents BookKeeper's clients draw
from, so it is unique however the two interleave. walkit draws ``id_range`` counters in
one transaction (BookKeeper one per ledger) and hands them out from memory: still
unique, the unused rest of a range are gaps (BookKeeper leaves gaps too). The drawn
``ID-`` nodes are deleted with the next range's transaction (BookKeeper deletes each at
once); left ones are ephemeral and go with the session, and BookKeeper's iterators skip
``ID-`` names and its HOB clean-up ignores a directory still holding them.
"""

from __future__ import annotations

import contextlib

from walkit.errors import InvalidArgumentError, MetadataError, NodeExistsError, NoNodeError, NotEmptyError
from walkit.metadata import _bk_paths
from walkit.metadata._bk_ledger import decode_ledger_metadata, from_walkit
from walkit.metadata._cluster import ClusterInfo, cluster_path
from walkit.metadata._ledger import LedgerMetadata
from walkit.metadata._store import Create, Delete, MetadataStore, Stat

__all__ = ["BkIdGenerator", "encode", "decode", "check_bk_ledger", "prune_parents", "NO_PASSWORD_DIGEST"]

NO_PASSWORD_DIGEST = "bk-crc32"  # a record keeping no password: read as BookKeeper's default digest
_LONG_NODE = "idgen-long"


def check_bk_ledger(meta: LedgerMetadata, root: str) -> None:
    """InvalidArgumentError unless ``meta`` is a ledger a BookKeeper cluster can keep."""
    if not meta.is_bookkeeper:
        raise InvalidArgumentError("a BookKeeper-format cluster keeps BookKeeper ledgers only: use a bk-* digest "
                                   "(bk-crc32, bk-crc32c, bk-hmac, bk-dummy)", ledger=meta.ledger_id,
                                   digest=meta.digest, root=root)


def encode(meta: LedgerMetadata, root: str) -> bytes:
    """The znode value of ``meta``: BookKeeper's format 3 (the record 4.18 writes)."""
    check_bk_ledger(meta, root)
    return from_walkit(meta).encode()


def decode(ledger_id: int, data: bytes, stat: Stat | None) -> LedgerMetadata:
    """walkit's value of a BookKeeper ledger znode (format 1, 2 or 3); FormatError."""
    record = decode_ledger_metadata(data)
    ctime = 0 if stat is None else int(stat.ctime * 1000)
    meta, _ = record.to_walkit(ledger_id, ctime=ctime, digest=NO_PASSWORD_DIGEST, password=b"")
    return meta


def prune_parents(store: MetadataStore, root: str, path: str) -> None:
    """Delete the directories above the deleted ledger node ``path`` (below ``root``)
    while they are empty; one that is not, or is gone, ends it."""
    parent = path.rsplit("/", 1)[0]
    while parent.startswith(f"{'' if root == '/' else root}/") and parent != root:
        stat = store.exists(parent)
        if stat is None or stat.num_children:
            return
        try:
            store.delete(parent)
        except (NoNodeError, NotEmptyError):
            return
        parent = parent.rsplit("/", 1)[0]


class BkIdGenerator:
    """BookKeeper 4.18's ledger ids for one cluster, ``id_range`` drawn at a time (the
    caller serialises calls of :meth:`take`)."""

    def __init__(self, store: MetadataStore, cluster: ClusterInfo, id_range: int) -> None:
        self._store = store
        self._root = cluster.root
        self._manager: _bk_paths.Manager = cluster.layout
        self._range = id_range
        self._long_path = cluster_path(cluster.root, _LONG_NODE)
        self._long: bool | None = None  # idgen-long exists (None: not looked yet)
        self._spent: list[str] = []  # the last range's ID- nodes, deleted with the next range's draw

    def take(self) -> list[int]:
        """The next ids, ascending (at least one)."""
        if self._manager == "flat":
            return self._take_short()
        if self._long is None:
            self._long = self._store.exists(self._long_path) is not None
        if not self._long:
            ids = self._take_short()
            if ids:
                return ids
            with contextlib.suppress(NodeExistsError):  # 31 bits spent: on to 63, for every client
                self._store.create(self._long_path)
            self._long = True
        return self._take_long()

    def _take_short(self) -> list[int]:
        """Ids of the 31-bit generator ([] when it overflowed; flat: MetadataError)."""
        prefix = _bk_paths.idgen_prefix(self._root, self._manager)
        ids = []
        for created in self._draw(prefix):
            with contextlib.suppress(InvalidArgumentError):  # an overflowed counter is no id
                ids.append(_bk_paths.id_from_idgen(prefix, created))
        if not ids and self._manager == "flat":
            raise MetadataError("ledger ids exhausted: the flat ledger manager has 31-bit ids only",
                                root=self._root)
        return ids

    def _take_long(self) -> list[int]:
        while True:
            high = self._highest_hob()
            prefix = _bk_paths.long_idgen_prefix(self._root, high)
            ids = []
            for created in self._draw(prefix):
                with contextlib.suppress(InvalidArgumentError):
                    ids.append(_bk_paths.long_id_from_idgen(self._root, high, created))
            if ids:
                return ids
            if high >= _bk_paths.INT_MAX:
                raise MetadataError("ledger ids exhausted", root=self._root, high=high)
            self._make(f"{self._long_path}/{_bk_paths.hob_name(high + 1)}")  # this HOB is full

    def _highest_hob(self) -> int:
        """The highest ``HOB-`` directory (``HOB-0000000001`` made when there is none)."""
        highs = [h for h in map(_bk_paths.parse_hob, self._children(self._long_path)) if h is not None]
        if highs:
            return max(highs)
        self._make(f"{self._long_path}/{_bk_paths.hob_name(1)}")
        return 1

    def _children(self, path: str) -> list[str]:
        try:
            return self._store.children(path)
        except NoNodeError:
            return []

    def _make(self, path: str) -> None:
        with contextlib.suppress(NodeExistsError):
            self._store.create(path, make_parents=True)

    def _draw(self, prefix: str) -> list[str]:
        """``id_range`` EPHEMERAL_SEQUENTIAL creates of ``prefix`` in one transaction (the
        previous range's nodes deleted in it); their paths. The parent is made when it
        is missing, as BookKeeper's ``createFullPathOptimistic`` does."""
        parent = prefix.rsplit("/", 1)[0]
        while True:
            spent = [Delete(path) for path in self._spent]
            ops: list[Create | Delete] = [*spent, *[Create(prefix, ephemeral=True, sequential=True)] * self._range]
            try:
                created = [str(p) for p in self._store.transaction(ops)[len(spent):]]
            except NoNodeError as exc:
                failed = exc.context.get("op_index")
                if isinstance(failed, int) and failed < len(spent):  # gone with an expired session
                    self._drop_spent()
                else:
                    self._make(parent)
                continue
            self._spent = created
            return created

    def _drop_spent(self) -> None:
        for path in self._spent:
            with contextlib.suppress(NoNodeError):
                self._store.delete(path)
        self._spent = []

