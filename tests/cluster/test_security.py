"""Security checks (issue 7): bookies listen on 127.0.0.1 unless configured otherwise,
and ZooKeeper digest ACLs keep walkit's nodes to the holders of its credentials.

TLS refusing a wrong certificate is tested where TLS is: tests/cluster/test_bookie_server.py
(``test_tls_round_trip_and_refused_certificates``: a client that trusts another CA, or
names another host, is refused; ``test_tls_refuses_a_client_certificate_from_another_ca``)
and tests/process/test_bookie_process.py (``test_tls_bookie_process``); the in-process default
bind is ``test_binds_loopback_by_default`` in tests/cluster/test_bookie_server.py."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import walkit
from bookie import BookieConfig
from support.bookie import config, in_process, run
from walkit.errors import InvalidArgumentError, MetadataError
from walkit.metadata import open_metadata_store
from support.zk import ZooKeeperServer

pytestmark = pytest.mark.timeout(180)


def _listening(port: int) -> set[str]:
    """The local addresses with a TCP socket listening on ``port`` (from /proc/net/tcp{,6})."""
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                # /proc prints each 32-bit word in host (little-endian) order
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.add(socket.inet_ntop(family, words))
    return found


def test_bookie_processes_listen_on_loopback_only(tmp_path: Path) -> None:
    assert BookieConfig().bind_address == "127.0.0.1"
    with walkit.LocalCluster(tmp_path / "cluster", bookies=2, processes=True, session_timeout=2.0) as cluster:
        for i in range(2):
            assert _listening(cluster.bookie_address(i)[1]) == {"127.0.0.1"}, f"bookie {i}"


def test_a_configured_bind_address_is_honoured(tmp_path: Path) -> None:
    async def body() -> None:
        cfg = config(tmp_path, bind_address="0.0.0.0", advertised_address="127.0.0.1")
        async with in_process(cfg) as server:
            assert _listening(server.port) == {"0.0.0.0"}

    run(body)


# -- ZooKeeper digest ACLs -----------------------------------------------------------------------------------

def test_zookeeper_digest_acls_keep_strangers_out(tmp_path: Path, zk_server: ZooKeeperServer) -> None:
    root = f"/acl-{uuid.uuid4().hex}/ledgers"
    uri = f"zk://walkit:s3cret@{zk_server.hosts}{root}"
    with walkit.LocalCluster(tmp_path / "cluster", bookies=3, metadata_uri=uri, session_timeout=2.0) as cluster:
        with cluster.client() as bk:  # every walkit operation works under the ACL
            lh = bk.create_ledger(3, 2, 2)
            lh.add_entry(b"guarded")
            lh.close()
            assert [e.data for e in bk.open_ledger(lh.ledger_id).read(0, 0)] == [b"guarded"]
        for stranger_uri in (f"zk://{zk_server.hosts}{root}", f"zk://walkit:wrong@{zk_server.hosts}{root}"):
            stranger = open_metadata_store(stranger_uri)
            try:
                attempts: list[Callable[[], object]] = [
                    lambda: stranger.get(root), lambda: stranger.children(root), lambda: stranger.set(root, b"vandal"),
                    lambda: stranger.delete(root, recursive=True), lambda: stranger.create(f"{root}/intruder", b"")]
                for attempt in attempts:
                    with pytest.raises(MetadataError, match="NoAuth"):
                        attempt()
            finally:
                stranger.close()
        with cluster.client() as bk:  # and nothing was changed by them
            assert [e.data for e in bk.open_ledger(lh.ledger_id).read(0, 0)] == [b"guarded"]


def test_zookeeper_credentials_are_checked_and_kept_out_of_errors(zk_server: ZooKeeperServer) -> None:
    for bad in ("walkit@", "walkit:@", ":pw@"):
        with pytest.raises(InvalidArgumentError) as caught:
            open_metadata_store(f"zk://{bad}{zk_server.hosts}/x")
        assert "pw" not in str(caught.value).replace("password", "")
    store = open_metadata_store(f"zk://walkit:s3cret@{zk_server.hosts}/x")
    try:
        assert store.hosts == zk_server.hosts
    finally:
        store.close()
