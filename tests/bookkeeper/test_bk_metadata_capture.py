"""BookKeeper 4.18.2's own ZooKeeper records, read with walkit's decoders (walkit/metadata/_bk_*.py).

A Java client creates three ledgers (closed CRC32C, closed HMAC with a password, one left
open), BookieShell initialises the under-replication tree, and every znode under the cluster
root is read back: each record is decoded and, where BookKeeper's encoding is
deterministic, re-encoded byte for byte. With ``WALKIT_BK_GOLDEN=<dir>`` the records are
also saved there (how tests/unit/golden/bookkeeper/ was made; its README.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from support.bookkeeper import JavaCluster

pytestmark = pytest.mark.bookkeeper


def _dump(zk: Any, path: str) -> dict[str, bytes]:
    """Every znode under ``path`` (``path`` included) -> its data."""
    found = {path: zk.get(path)[0] or b""}
    for child in zk.get_children(path):
        found.update(_dump(zk, f"{path}/{child}"))
    return found


def _save(directory: Path, records: dict[str, bytes], manifest: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in records.items():
        (directory / name).write_bytes(data)
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def test_decode_and_reencode_bookkeepers_own_znodes(java_cluster: JavaCluster) -> None:
    peer = java_cluster.peer()
    try:
        closed = peer.create()
        peer.add(closed, [b"alpha", b"beta", b"gamma"], pipelined=False)
        peer.close_ledger(closed)
        hmac = peer.create(ensemble=2, write_quorum=2, ack_quorum=1, digest="MAC", password="s3cret")
        peer.add(hmac, [b"one"], pipelined=False)
        peer.close_ledger(hmac)
        still_open = peer.create()
        peer.add(still_open, [b"x", b"y"], pipelined=False)
        java_cluster.shell("listunderreplicated")
        tree = _dump(java_cluster.zk, java_cluster.root)
    finally:
        peer.close()
    root = java_cluster.root
    bookie = java_cluster.bookies[0].bookie_id
    ledgers = {"ledger-closed": closed, "ledger-hmac": hmac, "ledger-open": still_open}
    records = {name: tree[f"{root}/00/0000/L{lid:04d}"] for name, lid in ledgers.items()}
    records.update({
        "LAYOUT": tree[f"{root}/LAYOUT"], "INSTANCEID": tree[f"{root}/INSTANCEID"],
        "cookie": tree[f"{root}/cookies/{bookie}"], "registration": tree[f"{root}/available/{bookie}"],
        "underreplication-LAYOUT": tree[f"{root}/underreplication/LAYOUT"],
    })
    manifest = {"root": root, "bookie": bookie, "ledgers": ledgers, "bookies": [b.bookie_id for b in java_cluster.bookies],
                "paths": sorted(p[len(root):] or "/" for p in tree),
                "empty": sorted(p[len(root):] or "/" for p, d in tree.items() if not d)}
    if os.environ.get("WALKIT_BK_GOLDEN"):
        _save(Path(os.environ["WALKIT_BK_GOLDEN"]), records, manifest)
    from walkit.metadata import _bk_ledger, _bk_paths, _bk_records

    for name, lid in ledgers.items():
        meta = _bk_ledger.decode_ledger_metadata(records[name])
        assert meta.encode() == records[name], name
        walkit, password = meta.to_walkit(lid)
        assert password == (b"s3cret" if name == "ledger-hmac" else b"")
        assert walkit.ledger_id == lid and set(walkit.ensembles[0][1]) <= set(manifest["bookies"])
        assert _bk_paths.parse_ledger_path(root, _bk_paths.ledger_path(root, lid, "hierarchical"), "hierarchical") == lid
    layout = _bk_records.Layout.decode(records["LAYOUT"])
    assert layout.manager == "hierarchical" and layout.encode() == records["LAYOUT"]
    assert _bk_records.InstanceId.decode(records["INSTANCEID"]).encode() == records["INSTANCEID"]
    cookie = _bk_records.BkCookie.decode(records["cookie"])
    assert cookie.bookie_id == bookie and cookie.encode() == records["cookie"]
    assert cookie.instance_id == records["INSTANCEID"].decode()
    info = _bk_records.BookieServiceInfo.decode(records["registration"])
    assert info.encode() == records["registration"]
    assert any(e.port == java_cluster.bookies[0].port for e in info.endpoints)
    ur = _bk_records.UrLayout.decode(records["underreplication-LAYOUT"])
    assert ur == _bk_records.UrLayout() and ur.encode() == records["underreplication-LAYOUT"]
