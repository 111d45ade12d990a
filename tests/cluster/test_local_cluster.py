"""walkit.LocalCluster: real bookies on 127.0.0.1, in this process or as processes, on the
embedded metadata store or a real ZooKeeper; restarts on the same directory."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import walkit
from bookie import BookieConfig
from support.bookie import KEY, entry, run
from support.metadata import wait_for
from walkit import LocalCluster
from walkit.client import BookieClient
from walkit.errors import (
    BookieReadOnlyError,
    BookieUnavailableError,
    ClusterLayoutError,
    ConfigError,
    InvalidArgumentError,
    UsageError,
)
from walkit.metadata import connect
from walkit.metadata._zk import ZooKeeperStore
from support.zk import ZooKeeperServer

pytestmark = pytest.mark.timeout(120)

SESSION = 2.0  # seconds: a killed bookie leaves the registered set this fast
FAST = {"journal_max_group_wait_msec": 0.5, "flush_interval": 1000}


def _write(cluster: LocalCluster, i: int, ledger: int, count: int = 3) -> None:
    """Entries 0..count-1 of ``ledger`` on bookie ``i``."""

    async def body() -> None:
        client = await BookieClient.connect(*cluster.bookie_address(i))
        await asyncio.gather(*(client.add_entry(ledger, e, KEY, entry(ledger, e)) for e in range(count)))
        await client.close()

    run(body, 30)


def _read(cluster: LocalCluster, i: int, ledger: int, count: int = 3) -> None:
    """Bookie ``i`` holds entries 0..count-1 of ``ledger``, byte for byte."""

    async def body() -> None:
        client = await BookieClient.connect(*cluster.bookie_address(i))
        for e in range(count):
            assert (await client.read_entry(ledger, e)).data == entry(ledger, e)
        await client.close()

    run(body, 30)


def _writable(cluster: LocalCluster) -> frozenset[str]:
    with connect(cluster.metadata_uri) as md:
        return md.bookies().writable


def _registered(cluster: LocalCluster) -> tuple[frozenset[str], frozenset[str]]:
    with connect(cluster.metadata_uri) as md:
        bookies = md.bookies()
        return bookies.writable, bookies.readonly


def _kill_and_restart(cluster: LocalCluster, i: int) -> None:
    """Kill bookie i: it leaves the registered set within the session timeout and stops
    answering; restarted on the same port and id, it is back with its data."""
    ids, address = cluster.bookie_ids, cluster.bookie_address(i)
    cluster.kill_bookie(i)
    assert not cluster.is_running(i)
    wait_for(lambda: ids[i] not in _writable(cluster), timeout=SESSION * 2 + 1)  # plus the reaper's beat
    with pytest.raises(BookieUnavailableError):
        _read(cluster, i, 100 + i)
    cluster.restart_bookie(i)
    assert cluster.is_running(i) and cluster.bookie_ids == ids and cluster.bookie_address(i) == address
    assert _writable(cluster) == set(ids)
    _read(cluster, i, 100 + i)


def _start_kill_restart(cluster: LocalCluster) -> None:
    ids = cluster.bookie_ids
    assert len(set(ids)) == 3 and all(b == f"127.0.0.1:{cluster.bookie_address(i)[1]}" for i, b in enumerate(ids))
    assert _writable(cluster) == set(ids)
    for i in range(3):
        _write(cluster, i, 100 + i)
    _kill_and_restart(cluster, 1)
    for i in range(3):
        _read(cluster, i, 100 + i)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", 3, session_timeout=SESSION, bookie_options=FAST) as c:
        yield c


def test_in_process_start_kill_restart(cluster: LocalCluster, tmp_path: Path) -> None:
    assert cluster.metadata_uri == f"local://{tmp_path / 'cluster' / 'metadata'}"
    assert all((tmp_path / "cluster" / f"bookie-{i}" / d).is_dir() for i in range(3) for d in ("journal", "ledgers"))
    _start_kill_restart(cluster)
    assert cluster.server(1).bookie_id == cluster.bookie_ids[1]

    async def dropped() -> None:  # a kill answers nothing more on open connections
        client = await BookieClient.connect(*cluster.bookie_address(0))
        await asyncio.to_thread(cluster.kill_bookie, 0)
        with pytest.raises(BookieUnavailableError):
            await client.read_entry(100, 0)
        await client.close()

    run(dropped, 30)
    cluster.restart_bookie(0)
    _read(cluster, 0, 100)
    cluster.stop_bookie(2)  # graceful: deregistered at once
    assert not cluster.is_running(2) and cluster.bookie_ids[2] not in _writable(cluster)
    with pytest.raises(UsageError):
        cluster.server(2)
    cluster.restart_bookie(2)
    _read(cluster, 2, 102)


def test_set_read_only_as_the_disk_monitor_would(cluster: LocalCluster) -> None:
    ids = cluster.bookie_ids
    cluster.set_read_only(0)
    assert cluster.server(0).readonly
    assert _registered(cluster) == ({ids[1], ids[2]}, {ids[0]})
    with pytest.raises(BookieReadOnlyError):
        _write(cluster, 0, 7)
    cluster.restart_bookie(0)  # its disks still look full
    assert _registered(cluster) == ({ids[1], ids[2]}, {ids[0]})
    cluster.set_read_only(0, False)
    assert _registered(cluster) == (set(ids), frozenset())
    _write(cluster, 0, 7)
    _read(cluster, 0, 7)


def test_restart_on_the_same_directory(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    with LocalCluster(data, 3, session_timeout=SESSION, bookie_options=FAST) as first:
        ids, uri = first.bookie_ids, first.metadata_uri
        for i in range(3):
            _write(first, i, 200 + i)
        assert first.add_bookie() == 3
        _write(first, 3, 203)
        ids.append(first.bookie_ids[3])
    first.stop()  # idempotent
    assert not first.is_running(0)
    with pytest.raises(UsageError):
        first.restart_bookie(0)

    with LocalCluster(data, 3, session_timeout=SESSION, bookie_options=FAST) as again:  # the added one comes back too
        assert again.bookie_ids == ids and again.metadata_uri == uri
        assert _writable(again) == set(ids)
        for i in range(4):
            _read(again, i, 200 + i)
        state = json.loads((data / "cluster.json").read_text())
        assert [b["bookie_id"] for b in state["bookies"]] == ids

    port = int(ids[0].rsplit(":", 1)[1])
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(ConfigError, match=f"port={port}"):
            LocalCluster(data, 3, session_timeout=SESSION)
    with pytest.raises(ConfigError, match="another metadata service"):
        LocalCluster(data, 3, metadata_uri=f"local://{tmp_path / 'elsewhere'}")


def test_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no_such_option"):
        LocalCluster(tmp_path / "a", bookie_options={"no_such_option": 1})
    with pytest.raises(ConfigError, match="bookie_port.*bookiePort"):  # both names: the attribute's and the key's
        LocalCluster(tmp_path / "b", bookie_options={"bookie_port": 3181})
    with pytest.raises(ConfigError, match="journalMaxGroupWaitMSec"):
        LocalCluster(tmp_path / "c", bookie_options={"journal_max_group_wait_msec": "soon"})
    with pytest.raises(InvalidArgumentError):
        LocalCluster(tmp_path / "d", bookies=-1)
    assert not (tmp_path / "a" / "cluster.json").exists()


def test_another_cluster_in_the_store_is_refused(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", 1, session_timeout=SESSION) as cluster:
        uri = cluster.metadata_uri
    state = json.loads((tmp_path / "c" / "cluster.json").read_text())
    state["instance_id"] = str(uuid.uuid4())
    (tmp_path / "c" / "cluster.json").write_text(json.dumps(state))
    with pytest.raises(ClusterLayoutError):
        LocalCluster(tmp_path / "c", 1, metadata_uri=uri)


def test_client_is_a_bookkeeper_of_the_cluster(cluster: LocalCluster) -> None:
    client = cluster.client()
    try:
        assert isinstance(client, walkit.BookKeeper) and client.metadata_uri == cluster.metadata_uri
    finally:
        client.close()


def _heartbeat(url: str | None) -> bytes:
    assert url is not None
    with urllib.request.urlopen(url + "/heartbeat", timeout=30) as answer:
        return bytes(answer.read())


def _check_conf(cluster: LocalCluster, i: int) -> BookieConfig:
    """Bookie ``i``'s configuration file, as ``walkit bookie start --conf`` reads it, is
    the bookie as it runs: its id, port, directories, metadata, admin port."""
    conf = BookieConfig.from_toml(str(cluster.conf_path(i)))
    assert cluster.conf_path(i) == cluster.data_dir / f"bookie-{i}" / "bookie.toml"
    assert (conf.bookie_id, conf.bookie_port) == (cluster.bookie_ids[i], cluster.bookie_address(i)[1])
    assert conf.journal_directory == str(cluster.data_dir / f"bookie-{i}" / "journal")
    assert conf.metadata_service_uri == cluster.metadata_uri
    url = cluster.admin_url(i)
    assert conf.http_server_enabled == (url is not None)
    if url is not None:
        assert url == f"http://127.0.0.1:{conf.http_server_port}"
    return conf


def test_admin_endpoints_and_each_bookies_configuration_file(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", 2, session_timeout=SESSION,
                      bookie_options={**FAST, "http_server_enabled": True}) as cluster:
        urls = [cluster.admin_url(i) for i in range(2)]
        assert len(set(urls)) == 2 and all(_heartbeat(url) == b"OK\n" for url in urls)  # a free port each
        for i in range(2):
            assert _check_conf(cluster, i).journal_max_group_wait_msec == 0.5
        cluster.kill_bookie(1)
        assert cluster.admin_url(1) is None
        cluster.restart_bookie(1)
        assert _heartbeat(cluster.admin_url(1)) == b"OK\n"
        _check_conf(cluster, 1)
    assert cluster.admin_url(0) is None  # stopped
    assert LocalCluster.remembered_bookies(tmp_path / "cluster") == 2
    assert LocalCluster.remembered_bookies(tmp_path / "elsewhere") == 0
    with LocalCluster(tmp_path / "plain", 1, session_timeout=SESSION) as plain:  # no endpoint unless asked
        assert plain.admin_url(0) is None and not _check_conf(plain, 0).http_server_enabled


def test_processes_start_kill_restart(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", 3, processes=True, session_timeout=SESSION,
                      bookie_options={**FAST, "http_server_enabled": True}) as cluster:
        assert _heartbeat(cluster.admin_url(1)) == b"OK\n"
        _start_kill_restart(cluster)
        assert _heartbeat(cluster.admin_url(1)) == b"OK\n"  # the restarted bookie's endpoint
        conf = (tmp_path / "cluster" / "bookie-1" / "bookie.toml").read_text()
        assert f"bookiePort = {cluster.bookie_address(1)[1]}" in conf and "journalMaxGroupWaitMSec = 0.5" in conf
        for i in range(3):
            _check_conf(cluster, i)
        assert "serving on" in (tmp_path / "cluster" / "bookie-1" / "bookie.log").read_text()
        with pytest.raises(UsageError):
            cluster.server(0)
        with pytest.raises(UsageError):
            cluster.set_read_only(0)
        ids = cluster.bookie_ids
    assert not any(cluster.is_running(i) for i in range(3))
    with connect(cluster.metadata_uri) as md:
        assert md.bookies().writable.isdisjoint(ids)  # stopped gracefully: deregistered


def test_zookeeper_metadata(tmp_path: Path, zk_server: ZooKeeperServer) -> None:
    hosts = zk_server.hosts
    chroot = f"/local-cluster-{uuid.uuid4().hex}"
    admin = ZooKeeperStore(hosts)
    try:
        admin.create(chroot)
    finally:
        admin.close()
    uri = f"zk://{hosts}{chroot}"
    with LocalCluster(tmp_path / "cluster", 3, metadata_uri=uri, session_timeout=SESSION,
                      bookie_options=FAST) as cluster:
        assert cluster.metadata_uri == uri
        _start_kill_restart(cluster)
        ids = cluster.bookie_ids
        cluster.set_read_only(2)
        assert _registered(cluster) == ({ids[0], ids[1]}, {ids[2]})
        with pytest.raises(BookieReadOnlyError):
            _write(cluster, 2, 7)
    with LocalCluster(tmp_path / "cluster", 3, session_timeout=SESSION) as again:  # the URI is remembered
        assert again.metadata_uri == uri and again.bookie_ids == ids
        assert _writable(again) == set(ids)
        _read(again, 0, 100)
