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
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support.bookkeeper import JVM_FLAGS, JavaCluster

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


def _wait_for(zk: Any, root: str, want: Callable[[dict[str, bytes]], bool], proc: subprocess.Popen[bytes],
              log: Path, timeout: float = 60.0) -> dict[str, bytes]:
    deadline = time.monotonic() + timeout
    while True:
        tree = _dump(zk, root)
        if want(tree):
            return tree
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"AutoRecoveryMain: not seen (exit {proc.poll()})\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def test_auditor_vote_and_underreplication_mark(java_cluster: JavaCluster) -> None:
    """AutoRecoveryMain on the first bookie's conf is elected auditor; the last bookie
    stops; the auditor marks every ledger that had it under-replicated (with two bookies
    left, no E=3 ledger can be re-replicated, so the mark stays)."""
    peer = java_cluster.peer()
    try:
        ledger = peer.create()
        peer.add(ledger, [b"one", b"two"], pipelined=False)
        peer.close_ledger(ledger)
    finally:
        peer.close()
    root, first, last = java_cluster.root, java_cluster.bookies[0], java_cluster.bookies[-1]
    log = java_cluster.directory / "autorecovery.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(["java", *JVM_FLAGS, "-cp", java_cluster.classpath,
                                 "org.apache.bookkeeper.replication.AutoRecoveryMain", "--conf", str(first.conf)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    election = f"{root}/underreplication/auditorelection"
    try:
        tree = _wait_for(java_cluster.zk, root, lambda t: bool(t.get(election)), proc, log)
        last.stop()
        mark_path = _bk_paths_ur(root, ledger)
        tree = _wait_for(java_cluster.zk, root, lambda t: mark_path in t, proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    votes = sorted(p for p in tree if p.startswith(election + "/V_"))
    records = {"auditorelection": tree[election], "auditor-vote": tree[votes[0]], "underreplication-mark": tree[mark_path]}
    locks = sorted(p for p in tree if p.startswith(f"{root}/underreplication/locks/urL"))
    if locks:
        records["underreplication-lock"] = tree[locks[0]]
    manifest = {"root": root, "auditor": first.bookie_id, "lost": last.bookie_id, "ledger": ledger,
                "votes": [v[len(root):] for v in votes], "mark": mark_path[len(root):],
                "paths": sorted(p[len(root):] or "/" for p in tree)}
    if os.environ.get("WALKIT_BK_GOLDEN"):
        directory = Path(os.environ["WALKIT_BK_GOLDEN"]) / "auditor"
        _save(directory, records, manifest)
    from walkit.metadata import _bk_paths, _bk_records

    vote = _bk_records.BookieNote.decode(records["auditor-vote"])
    assert vote == _bk_records.BookieNote(first.bookie_id) and vote.encode() == records["auditor-vote"]
    elected = _bk_records.BookieNote.decode(records["auditorelection"])
    assert elected == vote and elected.encode() == records["auditorelection"]
    assert _bk_paths.vote_sequence(votes[0].rsplit("/", 1)[1]) >= 0
    mark = _bk_records.UrMark.decode(records["underreplication-mark"])
    assert last.bookie_id in mark.replicas and mark.encode() == records["underreplication-mark"]
    assert _bk_paths.parse_ur_path(root, mark_path) == ledger
    if "underreplication-lock" in records:
        assert _bk_records.BookieNote.decode(records["underreplication-lock"]).encode() == records["underreplication-lock"]


def _bk_paths_ur(root: str, ledger: int) -> str:
    from walkit.metadata import _bk_paths

    return _bk_paths.ur_path(root, ledger)
