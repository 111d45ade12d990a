"""The cluster layout in the metadata store, and ``walkit init``.

A cluster is walkit's own format or Apache BookKeeper 4.18's (``ClusterInfo.format``);
:func:`read_cluster` tells them apart by the ``LAYOUT`` record.

walkit's own, under the cluster root (``/ledgers`` by default, as BookKeeper's
``zkLedgersRootPath``):

- ``INSTANCEID``: a random UUID naming this cluster; bookies keep it in their cookies so
  a disk can never join another cluster;
- ``LAYOUT``: ``walkit-layout 1\\nledgers <hierarchical|flat>\\n`` - how ledger paths
  are laid out; a client that cannot use it refuses the cluster;
- ``available/``, ``available/readonly/``: bookie registrations (ephemeral);
- ``cookies/``: one persistent cookie per bookie; ``idgen/``: ledger-id generation.

BookKeeper's (docs/format.md, "A BookKeeper-format cluster"): ``LAYOUT`` is BookKeeper's
record (``_bk_records.Layout``: layout version 2, the ledger manager factory class and
its version 1), ``INSTANCEID`` a UUID, and BookKeeper's ``init`` makes nothing else but
the root, ``available/`` and ``available/readonly/`` (cookies, ``idgen``,
``underreplication`` appear when used). The managers walkit drives are ``hierarchical``
(BookKeeper's default), ``flat`` and ``longhierarchical``; another factory class (the
legacy hierarchical one, MS, a custom class) or a manager version other than 1 is a
ClusterLayoutError naming it. Its ``underreplication`` tree is BookKeeper's, shared with
walkit's autorecovery (``_bk_underreplication``); walkit's own nodes of such a cluster
(WAL namespaces) live below :data:`BK_WALKIT_NODE`, a child of the root whose
name starts with ``ID-``: BookKeeper's ``AbstractZkLedgerManager.isSpecialZnode`` counts
every such name as an id-generator node, so its ledger iterators, BookieShell
``listledgers`` and the bookies' garbage collector skip it without a word under every
manager, and ``metaformat``/``nukeexistingcluster`` remove it with the ledgers it refers
to. :func:`walkit_path` names them for either format.

:func:`init_cluster` creates all of it in one transaction, so concurrent inits agree on
one instance id; running it again is a no-op that checks the layout and the format.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from typing import Literal, cast

from walkit.errors import ClusterLayoutError, FormatError, NodeExistsError, NoNodeError
from walkit.metadata import _bk_records
from walkit.metadata._paths import LAYOUTS
from walkit.metadata._store import Create, MetadataStore, check_path

__all__ = ["ClusterInfo", "ClusterFormat", "ClusterLayout", "CLUSTER_LAYOUTS", "init_cluster", "read_cluster",
           "cluster_path", "walkit_path", "ledger_digest", "CLUSTER_DIRS", "BK_CLUSTER_DIRS", "BK_WALKIT_NODE"]

_LAYOUT_HEADER = "walkit-layout 1"
CLUSTER_DIRS = ("available", "available/readonly", "cookies", "idgen")
BK_CLUSTER_DIRS = ("available", "available/readonly")  # what BookKeeper 4.18's init makes
BK_WALKIT_NODE = "ID-walkit"  # walkit's own nodes in a BookKeeper cluster (see the docstring)
_BK_MANAGER_VERSION = 1  # every ZooKeeper ledger manager factory of 4.18 is at version 1
# Which records a cluster writes: walkit's own (docs/format.md), or Apache BookKeeper's
# (its LAYOUT, ledger metadata, registrations and cookies: docs/bookkeeper.md).
ClusterFormat = Literal["walkit", "bookkeeper"]
FORMATS: tuple[ClusterFormat, ...] = ("walkit", "bookkeeper")
# How ledger paths are laid out: walkit's two layouts, and BookKeeper's long-only one.
ClusterLayout = Literal["hierarchical", "flat", "longhierarchical"]
CLUSTER_LAYOUTS: tuple[ClusterLayout, ...] = ("hierarchical", "flat", "longhierarchical")


@dataclass(frozen=True)
class ClusterInfo:
    root: str
    instance_id: str
    layout: ClusterLayout
    format: ClusterFormat = "walkit"


def cluster_path(root: str, name: str) -> str:
    """``<root>/<name>`` (also for the root "/")."""
    return f"{'' if root == '/' else root}/{name}"


def walkit_path(info: ClusterInfo, name: str) -> str:
    """Where walkit keeps its own node ``name`` (not a BookKeeper record) in the cluster:
    ``<root>/<name>``, or ``<root>/ID-walkit/<name>`` in a BookKeeper-format cluster."""
    if info.format == "bookkeeper":
        return cluster_path(info.root, f"{BK_WALKIT_NODE}/{name}")
    return cluster_path(info.root, name)


def ledger_digest(info: ClusterInfo) -> str:
    """The digest walkit's own writers (the WAL's segments and snapshots) give their
    ledgers in this cluster: ``crc32c``, or ``bk-crc32c`` in a BookKeeper-format cluster
    (which keeps BookKeeper ledgers only)."""
    return "bk-crc32c" if info.format == "bookkeeper" else "crc32c"


def _encode_layout(layout: ClusterLayout) -> bytes:
    return f"{_LAYOUT_HEADER}\nledgers {layout}\n".encode()


def _decode_layout(raw: bytes, root: str) -> ClusterLayout:
    lines = raw.decode("utf-8", errors="replace").split("\n")
    if len(lines) != 3 or lines[0] != _LAYOUT_HEADER or lines[2] != "" or not lines[1].startswith("ledgers "):
        raise ClusterLayoutError("unknown cluster LAYOUT: this walkit cannot use the cluster", root=root, layout=repr(raw[:80]))
    layout = lines[1].removeprefix("ledgers ")
    if layout not in LAYOUTS:
        raise ClusterLayoutError("unknown ledger layout in LAYOUT", root=root, layout=layout)
    return cast(ClusterLayout, layout)


def _decode_bk_layout(raw: bytes, root: str) -> ClusterLayout:
    """The manager of BookKeeper's LAYOUT ``raw``; ClusterLayoutError if walkit cannot
    drive it (the record unreadable, another factory class or manager version)."""
    try:
        layout = _bk_records.Layout.decode(raw)
    except FormatError as exc:
        raise ClusterLayoutError("unknown cluster LAYOUT: this walkit cannot use the cluster (neither walkit's nor "
                                 "BookKeeper's)", root=root,
                                 layout=repr(raw[:80]), reason=str(exc)[:200]) from exc
    manager = layout.manager
    if manager not in CLUSTER_LAYOUTS:
        raise ClusterLayoutError("BookKeeper ledger manager walkit cannot drive", root=root,
                                 factory=layout.manager_class, known=",".join(CLUSTER_LAYOUTS))
    if layout.manager_version != _BK_MANAGER_VERSION:
        raise ClusterLayoutError("BookKeeper ledger manager version walkit does not know", root=root,
                                 factory=layout.manager_class, version=layout.manager_version)
    return manager


def _decode_instance(raw: bytes, root: str, format: ClusterFormat) -> str:
    try:
        if format == "bookkeeper":
            return _bk_records.InstanceId.decode(raw).value
        return str(uuid.UUID(raw.decode("ascii")))
    except (UnicodeDecodeError, ValueError, FormatError) as exc:
        raise ClusterLayoutError("INSTANCEID is not a UUID", root=root, format=format) from exc


def read_cluster(store: MetadataStore, root: str) -> ClusterInfo:
    """The cluster at ``root`` (walkit's format or BookKeeper's); ClusterLayoutError when
    there is none or it is unusable."""
    check_path(root)
    try:
        instance, _ = store.get(cluster_path(root, "INSTANCEID"))
        layout_raw, _ = store.get(cluster_path(root, "LAYOUT"))
    except NoNodeError as exc:
        raise ClusterLayoutError("no walkit cluster here: run `walkit init --metadata URI`", root=root) from exc
    if layout_raw.startswith(_LAYOUT_HEADER.encode()):
        return ClusterInfo(root, _decode_instance(instance, root, "walkit"), _decode_layout(layout_raw, root))
    layout = _decode_bk_layout(layout_raw, root)
    return ClusterInfo(root, _decode_instance(instance, root, "bookkeeper"), layout, "bookkeeper")


def init_cluster(store: MetadataStore, root: str, layout: ClusterLayout | None = None, *,
                 format: ClusterFormat = "walkit") -> ClusterInfo:
    """Create the layout at ``root`` if it is not there (idempotent, safe to race).
    ``layout`` None: hierarchical for a new cluster, whatever an existing one has.
    ``format``: walkit's records or BookKeeper 4.18's (exactly what its ``init`` makes);
    an existing cluster of the other format is a ClusterLayoutError."""
    check_path(root)
    if format not in FORMATS:
        raise ClusterLayoutError("unknown cluster format", format=format, known=",".join(FORMATS))
    known = CLUSTER_LAYOUTS if format == "bookkeeper" else LAYOUTS
    if layout is not None and layout not in known:
        raise ClusterLayoutError("unknown ledger layout for this cluster format", layout=layout, format=format,
                                 known=",".join(known))
    if store.exists(cluster_path(root, "INSTANCEID")) is None:
        _create(store, root, layout or "hierarchical", format)
    info = read_cluster(store, root)
    if info.format != format:
        raise ClusterLayoutError("the cluster exists in another format", root=root, existing=info.format,
                                 requested=format)
    if layout is not None and info.layout != layout:
        raise ClusterLayoutError(
            "the cluster exists with another ledger layout", root=root, existing=info.layout, requested=layout
        )
    return info


def _create(store: MetadataStore, root: str, layout: ClusterLayout, format: ClusterFormat) -> None:
    # NodeExistsError below means a concurrent init got there first: read_cluster then
    # checks what it made (one transaction, so it is all there or none of it is).
    if root != "/" and store.exists(root) is None:
        with contextlib.suppress(NodeExistsError):
            store.create(root, make_parents=True)
    ops: list[Create] = []
    if format == "bookkeeper":
        ops += [Create(cluster_path(root, d)) for d in BK_CLUSTER_DIRS]
        ops += [Create(cluster_path(root, "INSTANCEID"), _bk_records.InstanceId(str(uuid.uuid4())).encode()),
                Create(cluster_path(root, "LAYOUT"), _bk_records.Layout.for_manager(layout).encode())]
    else:
        ops += [Create(cluster_path(root, d)) for d in CLUSTER_DIRS]
        ops += [Create(cluster_path(root, "LAYOUT"), _encode_layout(layout)),
                Create(cluster_path(root, "INSTANCEID"), str(uuid.uuid4()).encode())]
    with contextlib.suppress(NodeExistsError):
        store.transaction(ops)
