"""The cluster layout in the metadata store, and ``walkit init``.

Under the cluster root (``/ledgers`` by default, as BookKeeper's ``zkLedgersRootPath``):

- ``INSTANCEID``: a random UUID naming this cluster; bookies keep it in their cookies so
  a disk can never join another cluster;
- ``LAYOUT``: ``walkit-layout 1\\nledgers <hierarchical|flat>\\n`` - how ledger paths
  are laid out; a client that cannot use it refuses the cluster;
- ``available/``, ``available/readonly/``: bookie registrations (ephemeral);
- ``cookies/``: one persistent cookie per bookie; ``idgen/``: ledger-id generation.

:func:`init_cluster` creates all of it in one transaction, so concurrent inits agree on
one instance id; running it again is a no-op that checks the layout.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from typing import Literal

from walkit.errors import ClusterLayoutError, NodeExistsError, NoNodeError
from walkit.metadata._paths import LAYOUTS, Layout
from walkit.metadata._store import Create, MetadataStore, check_path

__all__ = ["ClusterInfo", "ClusterFormat", "init_cluster", "read_cluster", "cluster_path", "CLUSTER_DIRS"]

_LAYOUT_HEADER = "walkit-layout 1"
CLUSTER_DIRS = ("available", "available/readonly", "cookies", "idgen")
# Which records a cluster writes: walkit's own (docs/format.md), or Apache BookKeeper's
# (its LAYOUT, ledger metadata, registrations and cookies: docs/bookkeeper.md).
ClusterFormat = Literal["walkit", "bookkeeper"]


@dataclass(frozen=True)
class ClusterInfo:
    root: str
    instance_id: str
    layout: Layout
    format: ClusterFormat = "walkit"


def cluster_path(root: str, name: str) -> str:
    """``<root>/<name>`` (also for the root "/")."""
    return f"{'' if root == '/' else root}/{name}"


def _encode_layout(layout: Layout) -> bytes:
    return f"{_LAYOUT_HEADER}\nledgers {layout}\n".encode()


def _decode_layout(raw: bytes, root: str) -> Layout:
    lines = raw.decode("utf-8", errors="replace").split("\n")
    if len(lines) != 3 or lines[0] != _LAYOUT_HEADER or lines[2] != "" or not lines[1].startswith("ledgers "):
        raise ClusterLayoutError("unknown cluster LAYOUT: this walkit cannot use the cluster", root=root, layout=repr(raw[:80]))
    layout = lines[1].removeprefix("ledgers ")
    if layout not in LAYOUTS:
        raise ClusterLayoutError("unknown ledger layout in LAYOUT", root=root, layout=layout)
    return layout


def read_cluster(store: MetadataStore, root: str) -> ClusterInfo:
    """The cluster at ``root``; ClusterLayoutError when there is none or it is unusable."""
    check_path(root)
    try:
        instance, _ = store.get(cluster_path(root, "INSTANCEID"))
        layout_raw, _ = store.get(cluster_path(root, "LAYOUT"))
    except NoNodeError as exc:
        raise ClusterLayoutError("no walkit cluster here: run `walkit init --metadata URI`", root=root) from exc
    try:
        instance_id = str(uuid.UUID(instance.decode("ascii")))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ClusterLayoutError("INSTANCEID is not a UUID", root=root) from exc
    return ClusterInfo(root, instance_id, _decode_layout(layout_raw, root))


def init_cluster(store: MetadataStore, root: str, layout: Layout | None = None) -> ClusterInfo:
    """Create the layout at ``root`` if it is not there (idempotent, safe to race).
    ``layout`` None: hierarchical for a new cluster, whatever an existing one has."""
    check_path(root)
    if layout is not None and layout not in LAYOUTS:
        raise ClusterLayoutError("unknown ledger layout", layout=layout, known=",".join(LAYOUTS))
    if store.exists(cluster_path(root, "INSTANCEID")) is None:
        _create(store, root, layout or "hierarchical")
    info = read_cluster(store, root)
    if layout is not None and info.layout != layout:
        raise ClusterLayoutError(
            "the cluster exists with another ledger layout", root=root, existing=info.layout, requested=layout
        )
    return info


def _create(store: MetadataStore, root: str, layout: Layout) -> None:
    # NodeExistsError below means a concurrent init got there first: read_cluster then
    # checks what it made (one transaction, so it is all there or none of it is).
    if root != "/" and store.exists(root) is None:
        with contextlib.suppress(NodeExistsError):
            store.create(root, make_parents=True)
    ops = [Create(cluster_path(root, d)) for d in CLUSTER_DIRS]
    ops += [Create(cluster_path(root, "LAYOUT"), _encode_layout(layout)),
            Create(cluster_path(root, "INSTANCEID"), str(uuid.uuid4()).encode())]
    with contextlib.suppress(NodeExistsError):
        store.transaction(ops)
