"""walkit's metadata layer on Apache BookKeeper 4.18.2's own clusters, and BookKeeper on
clusters walkit made (walkit/metadata/_cluster.py, _ledgers.py, _bk_ledgers.py).

One Java cluster (``initnewcluster`` and three Java bookies) per module: walkit connects
to it, reads what the Java client wrote; ``walkit init --format bookkeeper`` makes a tree
equal to what ``initnewcluster`` makes, and BookieShell reads ledgers walkit created there.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from support.bookkeeper import JavaCluster
from support.zk import ZooKeeperServer
from walkit.metadata import connect, init_cluster, open_metadata_store
from walkit.metadata._bk_records import InstanceId, Layout

pytestmark = pytest.mark.bookkeeper


def _dump(zk: Any, path: str) -> dict[str, bytes]:
    found = {path: zk.get(path)[0] or b""}
    for child in zk.get_children(path):
        found.update(_dump(zk, f"{path}/{child}"))
    return found


def test_walkit_connects_to_a_cluster_bookkeeper_made(java_cluster: JavaCluster) -> None:
    with connect(java_cluster.metadata_uri, read_only=True) as cluster:
        assert cluster.info.format == "bookkeeper"
        assert cluster.info.layout == "hierarchical"
        assert cluster.info.root == java_cluster.root
        instance = java_cluster.zk.get(f"{java_cluster.root}/INSTANCEID")[0]
        assert cluster.info.instance_id == InstanceId.decode(instance).value
    plain = java_cluster.metadata_uri.replace("zk+hierarchical://", "zk://")
    with connect(plain, read_only=True) as cluster:
        assert cluster.info.layout == "hierarchical"


def test_walkit_init_makes_what_bookkeepers_init_makes(bk_classpath: str, zk_server: ZooKeeperServer) -> None:
    java = JavaCluster(bk_classpath, zk_server.hosts, bookies=0)  # initnewcluster alone
    try:
        theirs = _dump(java.zk, java.root)
        root = f"/wk-{uuid.uuid4().hex[:12]}/ledgers"
        store = open_metadata_store(f"zk+hierarchical://{zk_server.hosts}{root}")
        try:
            info = init_cluster(store, root, format="bookkeeper")
        finally:
            store.close()
        ours = _dump(java.zk, root)
        java.zk.delete(root.rsplit("/", 1)[0], recursive=True)
    finally:
        java.stop()
    relative = {path[len(java.root):]: data for path, data in theirs.items()}
    mine = {path[len(root):]: data for path, data in ours.items()}
    assert sorted(mine) == sorted(relative) == ["", "/INSTANCEID", "/LAYOUT", "/available", "/available/readonly"]
    assert mine["/LAYOUT"] == relative["/LAYOUT"] == Layout.for_manager("hierarchical").encode()
    assert uuid.UUID(mine["/INSTANCEID"].decode()) and uuid.UUID(relative["/INSTANCEID"].decode())
    assert mine["/INSTANCEID"].decode() == info.instance_id
    assert {k: v for k, v in mine.items() if k != "/INSTANCEID"} == {k: v for k, v in relative.items()
                                                                      if k != "/INSTANCEID"}
