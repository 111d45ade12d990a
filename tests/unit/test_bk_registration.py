"""A walkit bookie's registration and cookie in a BookKeeper-format cluster (issue 37):
the service info bytes (walkit/metadata/_service_info.py), the client's reading of both
formats (``parse_endpoint``) and the BookKeeper cookie check (bookie/server/_startup.py),
on an embedded store whose ClusterInfo says "bookkeeper"."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bookie.cookie import Cookie
from bookie.server._startup import check_cookie, marked_under_replicated, refuse_known_id, service_info
from support.bookie import config
from walkit.client import Endpoint, parse_endpoint
from walkit.errors import BookieUnavailableError, CookieError, FormatError, InvalidArgumentError
from walkit.metadata import ClusterInfo, LocalMetadataStore, UnderReplication, read_cookie, write_cookie
from walkit.metadata._bk_paths import ur_path
from walkit.metadata._bk_records import BkCookie, BookieServiceInfo
from walkit.metadata._bk_records import Endpoint as BkEndpoint
from walkit.metadata._service_info import WALKIT_PROTOCOL, ServiceInfo, decode_service_info, encode_service_info

GOLDEN = Path(__file__).parent / "golden" / "bookkeeper"
JAVA_BOOKIE = json.loads((GOLDEN / "manifest.json").read_text())["bookie"]


def test_walkit_format_is_the_json_it_always_was() -> None:
    data = encode_service_info("walkit", "127.0.0.1:3181", tls=True, protocol=1, http=("127.0.0.1", 8000))
    assert json.loads(data) == {"endpoint": "127.0.0.1:3181", "tls": True, "protocol": 1}
    assert parse_endpoint("b1", data) == Endpoint("127.0.0.1", 3181, True, "walkit")
    assert parse_endpoint("b1", data, "walkit") == parse_endpoint("b1", data)
    assert parse_endpoint("10.0.0.1:3181", None) == Endpoint("10.0.0.1", 3181, False, "walkit")
    assert parse_endpoint("[::1]:3181", b"") == Endpoint("::1", 3181, False, "walkit")
    java = b'{"endpoint": "10.0.0.2:3181", "kind": "bookkeeper"}'  # a Java bookie named in a walkit cluster
    assert parse_endpoint("j", java) == Endpoint("10.0.0.2", 3181, False, "bookkeeper")
    with pytest.raises(BookieUnavailableError, match="unreadable"):
        parse_endpoint("j", b'{"endpoint": "10.0.0.2:3181", "kind": "java"}')


def test_bookkeeper_format_is_bookie_service_info_with_the_walkit_marker() -> None:
    data = encode_service_info("bookkeeper", "127.0.0.1:3181", tls=False, protocol=1, http=("127.0.0.1", 8080))
    info = BookieServiceInfo.decode(data)
    assert info.endpoints == (BkEndpoint("bookie", 3181, "127.0.0.1", "bookie-rpc"),
                              BkEndpoint("httpserver", 8080, "127.0.0.1", "http"))
    assert dict(info.properties) == {"walkit.protocol": "1", "walkit.tls": "false"}
    assert parse_endpoint("127.0.0.1:3181", data, "bookkeeper") == Endpoint("127.0.0.1", 3181, False, "walkit")
    tls = encode_service_info("bookkeeper", "[::1]:4000", tls=True, protocol=1)
    assert len(BookieServiceInfo.decode(tls).endpoints) == 1  # no admin endpoint: none registered
    assert parse_endpoint("b", tls, "bookkeeper") == Endpoint("::1", 4000, True, "walkit")
    with pytest.raises(InvalidArgumentError):
        encode_service_info("bookkeeper", "no-port", tls=False, protocol=1)


def test_the_documented_bytes() -> None:  # docs/format.md, "What a walkit bookie writes ..."
    expected = (b"\x32\x22" b"\x0a\x06bookie" b"\x10\xed\x18" b"\x1a\x09127.0.0.1" b"\x22\x0abookie-rpc"
                b"\x3a\x14" b"\x0a\x0fwalkit.protocol" b"\x12\x011"
                b"\x3a\x13" b"\x0a\x0awalkit.tls" b"\x12\x05false")
    assert encode_service_info("bookkeeper", "127.0.0.1:3181", tls=False, protocol=1) == expected


def test_a_java_bookies_registration_is_kind_bookkeeper() -> None:
    java = (GOLDEN / "registration").read_bytes()  # what BookKeeper 4.18.2's bookie wrote
    host, port = JAVA_BOOKIE.rsplit(":", 1)
    assert parse_endpoint(JAVA_BOOKIE, java, "bookkeeper") == Endpoint(host, int(port), False, "bookkeeper")
    # a walkit marker only counts in the properties; "walkit.tls" without it is not TLS
    odd = BookieServiceInfo((BkEndpoint("bookie", 1, "h", "bookie-rpc"),), (("walkit.tls", "true"),)).encode()
    assert decode_service_info("bookkeeper", "x", odd) == ServiceInfo("h", 1, False, False)
    # a Java bookie with TLS lists the extension "tls" on its bookie-rpc endpoint (BookieService.publishInfo)
    java_tls = BookieServiceInfo((BkEndpoint("bookie", 1, "h", "bookie-rpc", extensions=("tls",)),)).encode()
    assert decode_service_info("bookkeeper", "x", java_tls) == ServiceInfo("h", 1, True, False)
    # legacy (pre-4.12) empty data: the id is the address
    assert parse_endpoint("10.1.2.3:3181", b"", "bookkeeper") == Endpoint("10.1.2.3", 3181, False, "bookkeeper")
    assert parse_endpoint("10.1.2.3:3181", None, "bookkeeper").kind == "bookkeeper"


@pytest.mark.parametrize("data", [
    b"\xff\x00garbage",
    BookieServiceInfo((BkEndpoint("httpserver", 8080, "h", "http"),), ((WALKIT_PROTOCOL, "1"),)).encode(),
    BookieServiceInfo((BkEndpoint("bookie", 0, "h", "bookie-rpc"),)).encode(),
    BookieServiceInfo((BkEndpoint("bookie", 3181, "", "bookie-rpc"),)).encode(),
])
def test_unusable_bookkeeper_registrations_are_refused(data: bytes) -> None:
    with pytest.raises(FormatError):
        decode_service_info("bookkeeper", "b", data)
    with pytest.raises(BookieUnavailableError, match="unreadable bookie registration"):
        parse_endpoint("b", data, "bookkeeper")


def test_unusable_ids_and_walkit_registrations_are_refused() -> None:
    for bookie_id, fmt in (("walkit-0", "walkit"), ("walkit-0", "bookkeeper"), ("h:0", "bookkeeper")):
        with pytest.raises(BookieUnavailableError, match="not host:port"):
            parse_endpoint(bookie_id, None, fmt)  # type: ignore[arg-type]
    for data in (b"{", b'{"tls": true}', b'{"endpoint": "nohost"}', b"[1]", b'"h:1"', b"3"):
        with pytest.raises(BookieUnavailableError, match="unreadable"):
            parse_endpoint("b", data, "walkit")
    with pytest.raises(BookieUnavailableError):  # BookKeeper bytes in a walkit cluster: not JSON
        parse_endpoint("b", encode_service_info("bookkeeper", "h:1", tls=False, protocol=1), "walkit")


# --- the bookie's side: what it registers, its cookie, GC's under-replication marks -----------


@pytest.fixture
def bk_cluster(tmp_path: Path) -> Iterator[Any]:
    """A BookKeeper-format cluster's store and info, as a bookie's ``Cluster`` has them."""
    store = LocalMetadataStore(str(tmp_path / "md"), create=True)
    try:
        store.create("/ledgers/cookies", make_parents=True)
        info = ClusterInfo("/ledgers", str(uuid.uuid4()), "hierarchical", format="bookkeeper")
        yield SimpleNamespace(store=store, info=info)
    finally:
        store.close()


def _cookie(instance_id: str, ledger_dirs: tuple[str, ...] = ("/d/l1", "/d/l2"), journal: str = "/d/j",
            bookie_id: str = "127.0.0.1:3181") -> Cookie:
    return Cookie(bookie_id, journal, ledger_dirs, instance_id)


def test_the_bookie_registers_bookkeepers_service_info(bk_cluster: Any, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    cfg = config(tmp_path, http_server_address="127.0.0.2")
    data = service_info(bk_cluster, cfg, "127.0.0.1:3181", False, 8123)
    assert decode_service_info("bookkeeper", "127.0.0.1:3181", data) == ServiceInfo("127.0.0.1", 3181)
    assert BookieServiceInfo.decode(data).endpoints[1] == BkEndpoint("httpserver", 8123, "127.0.0.2", "http")
    assert not caplog.records
    tls = BookieServiceInfo.decode(service_info(bk_cluster, cfg, "h:1", True, 0))
    assert tls.endpoints == (BkEndpoint("bookie", 1, "h", "bookie-rpc", extensions=("tls",)),)  # as BookieService
    assert not caplog.records  # Java clients reach a TLS bookie too (START_TLS): nothing to warn of
    walkit = SimpleNamespace(store=bk_cluster.store, info=ClusterInfo("/w", "i", "hierarchical"))
    assert json.loads(service_info(walkit, cfg, "h:1", True, 8123)) == {"endpoint": "h:1", "tls": True, "protocol": 1}


def test_bookkeeper_cookie_is_written_once_then_checked(bk_cluster: Any) -> None:
    mine = _cookie(bk_cluster.info.instance_id)
    check_cookie(bk_cluster, mine, mine.bookie_id)  # a new bookie: stores BookKeeper's cookie
    data, version = read_cookie(bk_cluster.store, bk_cluster.info, mine.bookie_id) or (b"", -1)
    assert data.startswith(b"5\n") and b'bookieHost: "127.0.0.1:3181"' in data
    assert BkCookie.decode(data) == BkCookie("127.0.0.1:3181", "/d/j", ("/d/l1", "/d/l2"), bk_cluster.info.instance_id)
    check_cookie(bk_cluster, mine, mine.bookie_id)  # a restart: the same, nothing written
    assert read_cookie(bk_cluster.store, bk_cluster.info, mine.bookie_id) == (data, version)
    with pytest.raises(CookieError, match="knows its id"):  # before empty disks are stamped
        refuse_known_id(bk_cluster, mine.bookie_id)


@pytest.mark.parametrize("theirs, field", [
    (BkCookie("127.0.0.1:3181", "/d/j", ("/d/l1", "/d/l2"), "another-instance"), "instance_id"),
    (BkCookie("127.0.0.1:3181", "/d/j", ("/d/l2", "/d/l1"), None), "ledger_dirs"),
    (BkCookie("127.0.0.1:3181", "/d/j1,/d/j2", ("/d/l1", "/d/l2"), None), "journal_dir"),
    (BkCookie("127.0.0.1:3181", "/d/j", ("/d/l1", "/d/l2"), None, ("/d/i",)), "index dirs"),
])
def test_a_bookkeeper_cookie_that_differs_refuses_the_start(bk_cluster: Any, theirs: BkCookie, field: str) -> None:
    instance = bk_cluster.info.instance_id
    if theirs.instance_id is None:
        theirs = BkCookie(theirs.bookie_id, theirs.journal_dirs, theirs.ledger_dirs, instance, theirs.index_dirs)
    write_cookie(bk_cluster.store, bk_cluster.info, theirs.bookie_id, theirs.encode(), None)
    with pytest.raises(CookieError, match=field):
        check_cookie(bk_cluster, _cookie(instance), theirs.bookie_id)


def test_a_cookie_with_trailing_slashes_matches_and_an_unreadable_one_refuses(bk_cluster: Any) -> None:
    instance = bk_cluster.info.instance_id
    java = BkCookie("127.0.0.1:3181", "/d/j", ("/d/l1/", "/d/l2"), instance)
    write_cookie(bk_cluster.store, bk_cluster.info, java.bookie_id, java.encode(), None)
    check_cookie(bk_cluster, _cookie(instance), java.bookie_id)
    write_cookie(bk_cluster.store, bk_cluster.info, java.bookie_id, b"not a cookie", 0)
    with pytest.raises(CookieError, match="unreadable BookKeeper cookie"):
        check_cookie(bk_cluster, _cookie(instance), java.bookie_id)


def test_gc_sees_bookkeepers_under_replication_marks_and_walkits(bk_cluster: Any) -> None:
    marked = marked_under_replicated(bk_cluster)
    assert not marked(12345)
    bk_cluster.store.create(ur_path("/ledgers", 12345), b"", make_parents=True)  # a Java auditor's mark
    assert marked(12345) and not marked(12346)
    UnderReplication(bk_cluster.store, bk_cluster.info).mark(12346, ["127.0.0.1:1"])  # walkit's auditor's
    assert marked(12346) and not marked(12347)
    assert bk_cluster.store.exists(ur_path("/ledgers", 12346)) is not None, "walkit marks in BookKeeper's tree"
