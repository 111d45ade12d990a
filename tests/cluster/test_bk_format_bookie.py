"""A walkit bookie in a BookKeeper-format cluster (issue 37): it registers as a
BookKeeper 4.18 bookie does (BookieServiceInfo under ``available/``, ``available/readonly/``
when read-only), writes BookKeeper's cookie in ``cookies/<id>`` and refuses to start
when it differs; clients read its registration back. The cluster is made by
``init_cluster(format="bookkeeper")`` on the embedded store (no Java needed here;
tests/bookkeeper/test_java_client_on_walkit.py has BookKeeper's own tools look at it)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from bookie.cookie import read_cookie as read_disk_cookie
from bookie.fs.real import RealFS
from support.bookie import KEY, client_of, config, entry, in_process, run
from walkit.cli import main as walkit_main
from walkit.client import Endpoint, parse_endpoint
from walkit.client import connect as walkit_connect
from walkit.errors import ConfigError, CookieError
from walkit.metadata import (
    LedgerMetadata,
    LocalMetadataStore,
    connect,
    init_cluster,
    read_cookie,
    read_registration,
    write_cookie,
)
from walkit.metadata._bk_paths import ur_path
from walkit.metadata._bk_records import BkCookie, BookieServiceInfo, UrMark
from walkit.metadata._bk_records import Endpoint as BkEndpoint

ROOT = "/ledgers"


@pytest.fixture
def uri(tmp_path: Path) -> str:
    store = LocalMetadataStore(str(tmp_path / "md"), create=True)
    try:
        info = init_cluster(store, ROOT, format="bookkeeper")
        assert info.format == "bookkeeper"
        assert store.exists(f"{ROOT}/cookies") is None  # BookKeeper's init does not make it
    finally:
        store.close()
    return f"local://{tmp_path / 'md'}"


def test_registration_cookie_and_readonly_as_bookkeeper_has_them(uri: str, tmp_path: Path) -> None:
    cfg = config(tmp_path / "b", bookie_id="", metadata_service_uri=uri, http_server_enabled=True,
                 http_server_port=0)

    async def go() -> None:
        async with in_process(cfg) as server:
            bookie_id = server.bookie_id
            assert bookie_id == f"127.0.0.1:{server.port}"  # BookKeeper's default id: the address
            with connect(uri) as cluster:
                assert cluster.info.format == "bookkeeper"
                data = read_registration(cluster.store, cluster.info, bookie_id)
                assert data is not None and cluster.store.exists(f"{ROOT}/available/{bookie_id}") is not None
                info = BookieServiceInfo.decode(data)
                assert info.endpoints == (BkEndpoint("bookie", server.port, "127.0.0.1", "bookie-rpc"),
                                          BkEndpoint("httpserver", server.http_port, "127.0.0.1", "http"))
                assert dict(info.properties) == {"walkit.protocol": "1", "walkit.tls": "false"}
                assert parse_endpoint(bookie_id, data, cluster.info.format) == Endpoint("127.0.0.1", server.port)
                loop = asyncio.get_running_loop()
                with walkit_connect(uri) as client:  # the client's own resolution (ClientCore._registration_of)
                    core = client.client._core
                    assert await loop.run_in_executor(None, core._registration_of, bookie_id) == Endpoint(
                        "127.0.0.1", server.port, False, "walkit")
                    assert await loop.run_in_executor(None, core._read_ahead, [bookie_id, "gone:1"]) == {
                        bookie_id: Endpoint("127.0.0.1", server.port, False, "walkit"),
                        "gone:1": Endpoint("gone", 1, False, "bookkeeper")}  # unregistered: a legacy id
                assert cluster.bookies().writable == {bookie_id}
                cookie, _ = read_cookie(cluster.store, cluster.info, bookie_id) or (b"", 0)
                assert BkCookie.decode(cookie) == BkCookie(
                    bookie_id, str(tmp_path / "b" / "journal"), (str(tmp_path / "b" / "ledgers"),),
                    cluster.info.instance_id)
                disks = read_disk_cookie(RealFS(), str(tmp_path / "b" / "journal"))  # walkit's own stays
                assert disks is not None and disks.instance_id == cluster.info.instance_id

                server.forced_readonly = True
                await server.check_disks()
                assert cluster.bookies().readonly == {bookie_id} and not cluster.bookies().writable
                assert cluster.store.get(f"{ROOT}/available/readonly/{bookie_id}")[0] == data
            server.forced_readonly = False
            await server.check_disks()
            cfg_again = dataclasses.replace(cfg, bookie_id=bookie_id, bookie_port=server.port)
        with connect(uri) as cluster:
            assert not cluster.bookies().writable and not cluster.bookies().readonly  # deregistered
        async with in_process(cfg_again) as server:  # a restart: the cookie in metadata matches
            assert server.registered and server.bookie_id == bookie_id

    run(go)


@pytest.mark.parametrize("change, field", [
    ({"instance_id": "another-cluster"}, "instance_id"),
    ({"journal_dirs": "/elsewhere/journal"}, "journal_dir"),
    ({"ledger_dirs": ("/elsewhere/ledgers",)}, "ledger_dirs"),
])
def test_a_bookkeeper_cookie_that_differs_refuses_the_start(uri: str, tmp_path: Path, change: dict[str, object],
                                                          field: str, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(tmp_path / "b", bookie_id="bk-bookie", metadata_service_uri=uri)

    async def go() -> None:
        async with in_process(cfg) as server:
            assert server.registered
        with connect(uri) as cluster:
            data, version = read_cookie(cluster.store, cluster.info, "bk-bookie") or (b"", 0)
            other = dataclasses.replace(BkCookie.decode(data), **change)  # type: ignore[arg-type]
            write_cookie(cluster.store, cluster.info, "bk-bookie", other.encode(), version)
        with pytest.raises(CookieError, match=f"cookie {field} differs: the cluster holds another cookie"):
            async with in_process(cfg):
                pass
        with connect(uri) as cluster:
            assert not cluster.bookies().writable  # refused before it registered

    run(go)
    capsys.readouterr()
    assert walkit_main(["bookie", "cookie", "get", "--journal-dir", cfg.journal_directory, "--ledger-dir",
                        *cfg.ledger_directories, "--metadata", uri, "--json"]) == 1
    shown = json.loads(capsys.readouterr().out)["metadata"]  # BookKeeper's cookie, read as walkit's fields
    assert shown["cookie"]["bookie_id"] == "bk-bookie" and field in shown["error"] and shown["compared"] is None


def test_walkit_bookie_cookie_get_reads_the_bookkeeper_cookie(uri: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(tmp_path / "b", bookie_id="bk-bookie", metadata_service_uri=uri)

    async def go() -> None:
        async with in_process(cfg):
            pass

    run(go)
    capsys.readouterr()
    assert walkit_main(["bookie", "cookie", "get", "--journal-dir", cfg.journal_directory, "--ledger-dir",
                        *cfg.ledger_directories, "--metadata", uri, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["metadata"]
    assert shown["compared"] == "the same as the disks'" and shown["error"] is None
    assert shown["cookie"]["ledger_dirs"] == list(cfg.ledger_directories)


def test_after_a_session_expiry_the_same_registration_comes_back(uri: str, tmp_path: Path) -> None:
    cfg = config(tmp_path / "b", bookie_id="", metadata_service_uri=uri)

    async def go() -> None:
        async with in_process(cfg) as server:
            server.forced_readonly = True
            await server.check_disks()  # the mode wanted last is the one restored
            path = f"{ROOT}/available/readonly/{server.bookie_id}"
            with connect(uri) as cluster:
                data, _ = cluster.store.get(path)
                assert dict(BookieServiceInfo.decode(data).properties)["walkit.protocol"] == "1"
                store = server._cluster.store  # the bookie's own session
                old = store.session_id
                store.expire_session()
                deadline = asyncio.get_running_loop().time() + 15
                while (stat := cluster.store.exists(path)) is None or stat.ephemeral_owner == old:
                    assert asyncio.get_running_loop().time() < deadline, "not re-registered"
                    await asyncio.sleep(0.05)
                assert stat.ephemeral_owner == store.session_id != old
                assert cluster.store.get(path)[0] == data  # BookieServiceInfo, walkit marker included
                assert cluster.store.exists(f"{ROOT}/available/{server.bookie_id}") is None
                assert not server.lost_registration

    run(go)


@pytest.mark.parametrize("bookie_id", ["bad id", "ReadOnly", "bookié"])
def test_an_id_bookkeeper_cannot_parse_is_refused_before_the_disks_are_stamped(uri: str, tmp_path: Path,
                                                                              bookie_id: str) -> None:
    cfg = config(tmp_path / "b", bookie_id=bookie_id, metadata_service_uri=uri)

    async def go() -> None:
        with pytest.raises(ConfigError, match="bookieId is not one BookKeeper accepts"):
            async with in_process(cfg):
                pass

    run(go)
    assert read_disk_cookie(RealFS(), cfg.journal_directory) is None
    with connect(uri) as cluster:
        assert read_cookie(cluster.store, cluster.info, "bad id") is None and not cluster.bookies().writable


def test_a_cluster_without_available_readonly_gets_it_when_a_bookie_turns_read_only(uri: str, tmp_path: Path) -> None:
    """BookKeeper's bookies make ``available/readonly`` on demand; older trees may lack it."""
    with connect(uri) as cluster:
        cluster.store.delete(f"{ROOT}/available/readonly")
        assert cluster.bookies().readonly == frozenset()  # listing copes with its absence
    cfg = config(tmp_path / "b", bookie_id="", metadata_service_uri=uri)

    async def go() -> None:
        async with in_process(cfg) as server:
            with connect(uri) as cluster:
                assert cluster.bookies().writable == {server.bookie_id}
                server.forced_readonly = True
                await server.check_disks()
                assert server.readonly and cluster.bookies().readonly == {server.bookie_id}
                assert not cluster.bookies().writable

    run(go)


def test_gc_drops_over_replicated_bookkeeper_ledgers_unless_bookkeeper_marked_them(uri: str, tmp_path: Path) -> None:
    """The over-replication step on BookKeeper's records: a closed ledger whose ensemble
    does not name this bookie goes, one that names it stays, and one a Java auditor marked
    under-replicated (``urL`` mark) stays while marked."""
    cfg = config(tmp_path / "b", bookie_id="", metadata_service_uri=uri, gc_wait_time=200,
                 gc_overreplicated_ledger_wait_time=200)

    async def go() -> None:
        async with in_process(cfg) as server:
            assert server.bookie is not None
            loop = asyncio.get_running_loop()
            with connect(uri) as cluster:
                m = cluster.ledgers
                others, ours = ("127.0.0.1:1", "127.0.0.1:2"), (server.bookie_id, "127.0.0.1:1")
                ids = {}
                for name, ensemble in (("elsewhere", others), ("here", ours), ("marked", others)):
                    lid = await loop.run_in_executor(None, m.new_ledger_id)
                    meta = LedgerMetadata.create(lid, ensemble, write_quorum=2, ack_quorum=2, password=b"pw",
                                                 ctime=1_700_000_000_000, digest="bk-crc32c")
                    await loop.run_in_executor(None, m.create, meta)
                    await loop.run_in_executor(None, m.update, lid, lambda md: md.closed(1, 20))
                    ids[name] = lid
                cluster.store.create(ur_path(ROOT, ids["marked"]), UrMark(("127.0.0.1:2",)).encode(),
                                     make_parents=True)
                client = await client_of(server)
                try:
                    for lid in ids.values():
                        for e in range(2):
                            await client.add_entry(lid, e, KEY, entry(lid, e))
                finally:
                    await client.close()
                deadline = loop.time() + 20
                while ids["elsewhere"] in server.bookie.ledgers():
                    assert loop.time() < deadline, server.bookie.gc.status()
                    await asyncio.sleep(0.05)
                passes = server.bookie.gc.status()["passes"]
                while server.bookie.gc.status()["passes"] < passes + 2:
                    await asyncio.sleep(0.05)
                assert {ids["here"], ids["marked"]} <= set(server.bookie.ledgers())
                status = server.bookie.gc.status()
                assert status["totals"]["overreplicated_removed"] == 1 and not status["last_pass"]["cut_short"]

    run(go)
