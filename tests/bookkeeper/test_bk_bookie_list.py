"""``walkit bookie list`` and walkit's bookie listing on a real BookKeeper 4.18.2 cluster
(issue 37): Java bookies (writable, forced read-only, a legacy empty registration) and a
walkit bookie side by side, each with the kind its registration says."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.bookie import config, in_process, run
from support.bookkeeper import JavaBookie, JavaCluster
from support.zk import ZooKeeperServer
from walkit.cli import main as walkit_main
from walkit.client import Endpoint, parse_endpoint
from walkit.metadata import connect, read_registration

pytestmark = pytest.mark.bookkeeper

LEGACY = "127.0.0.1:1"  # a pre-4.12 registration: empty data, the id is the address


@pytest.fixture(scope="module")
def mixed(bk_classpath: str, zk_server: ZooKeeperServer) -> Iterator[tuple[JavaCluster, JavaBookie]]:
    """Two writable Java bookies, and a third forced read-only."""
    cluster = JavaCluster(bk_classpath, zk_server.hosts, bookies=2)
    readonly = JavaBookie(bk_classpath, cluster.metadata_uri, cluster.zk, cluster.root,
                          cluster.directory / "readonly")
    try:
        with readonly.conf.open("a") as conf:
            conf.write("forceReadOnlyBookie=true\n")
        readonly._znode = f"{cluster.root}/available/readonly/{readonly.bookie_id}"  # where it registers
        readonly.start()
        yield cluster, readonly
    finally:
        readonly.stop()
        cluster.stop()


def test_walkit_lists_java_bookies_writable_and_readonly_with_their_kinds(
        mixed: tuple[JavaCluster, JavaBookie], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster, readonly = mixed
    java = {b.bookie_id for b in cluster.bookies}
    with connect(cluster.metadata_uri, read_only=True) as walkit_view:
        assert walkit_view.info.format == "bookkeeper"
        assert walkit_view.bookies().writable == java and walkit_view.bookies().readonly == {readonly.bookie_id}
        for bookie in cluster.bookies:  # a Java bookie's own BookieServiceInfo
            data = read_registration(walkit_view.store, walkit_view.info, bookie.bookie_id)
            assert parse_endpoint(bookie.bookie_id, data, walkit_view.info.format) == Endpoint(
                "127.0.0.1", bookie.port, False, "bookkeeper")
    cluster.zk.create(f"{cluster.root}/available/{LEGACY}", b"", ephemeral=True)
    walkit_cfg = config(tmp_path / "walkit", bookie_id="", metadata_service_uri=cluster.metadata_uri)

    async def with_a_walkit_bookie() -> str:
        async with in_process(walkit_cfg) as server:
            loop = asyncio.get_running_loop()

            def cli(*args: str) -> int:  # off the loop: the bookie answers on it, and the CLI runs its own
                return int(walkit_main([*args, "--metadata", cluster.metadata_uri]))

            capsys.readouterr()
            assert await loop.run_in_executor(None, cli, "bookie", "list", "--json") == 0
            listed = json.loads(capsys.readouterr().out)
            assert listed == {"writable": sorted(java | {LEGACY, server.bookie_id}), "readonly": [readonly.bookie_id],
                              "kinds": {**{b: "bookkeeper" for b in java | {LEGACY, readonly.bookie_id}},
                                        server.bookie_id: "walkit"}}
            assert await loop.run_in_executor(None, cli, "bookie", "gc", "--json", "--bookie", server.bookie_id) == 0
            assert json.loads(capsys.readouterr().out)[server.bookie_id]["bookie"] == server.bookie_id
            some_java = min(java)
            assert await loop.run_in_executor(None, cli, "bookie", "gc", "--json", "--bookie", some_java) == 1
            assert "no walkit GC commands" in json.loads(capsys.readouterr().out)[some_java]["error"]
            assert await loop.run_in_executor(None, cli, "bookie", "list") == 0
            return str(server.bookie_id)

    walkit_id = run(with_a_walkit_bookie)
    lines = capsys.readouterr().out.splitlines()
    assert f"{walkit_id}\tavailable\twalkit" in lines and f"{readonly.bookie_id}\treadonly\tbookkeeper" in lines
    assert f"{LEGACY}\tavailable\tbookkeeper" in lines
    assert len(lines) == len(java) + 3
