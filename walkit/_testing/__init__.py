"""The machinery behind :mod:`walkit.testing` (the pytest plugin): a fault-injecting
cluster, the partitionable proxy in front of each bookie, and a ZooKeeper server."""

from walkit._testing._cluster import FaultyCluster
from walkit._testing._proxy import PartitionableProxy
from walkit._testing._zookeeper import ZooKeeperServer, ensure_zookeeper, zookeeper_missing

__all__ = ["FaultyCluster", "PartitionableProxy", "ZooKeeperServer", "ensure_zookeeper", "zookeeper_missing"]
