"""BookKeeper-format clusters in walkit's metadata layer: reading BookKeeper's LAYOUT and
INSTANCEID, making them (``init_cluster(format="bookkeeper")``), its URI forms, and where
walkit keeps its own nodes there. On the local store: the tree is the same on ZooKeeper
(tests/cluster/test_bk_ledgers.py, tests/bookkeeper/test_bk_cluster_metadata.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from walkit.errors import ClusterLayoutError, InvalidArgumentError
from walkit.metadata import (
    ClusterInfo,
    LocalMetadataStore,
    MetadataURI,
    connect,
    init_cluster,
    parse_metadata_uri,
    read_cluster,
    walkit_path,
)
from walkit.metadata._bk_records import Layout

GOLDEN = Path(__file__).parent / "golden" / "bookkeeper"
ROOT = "/ledgers"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalMetadataStore]:
    s = LocalMetadataStore(str(tmp_path / "meta"), create=True)
    try:
        yield s
    finally:
        s.close()


def _tree(store: LocalMetadataStore, path: str) -> dict[str, bytes]:
    found = {path: store.get(path)[0]}
    for child in store.children(path):
        found.update(_tree(store, f"{path}/{child}"))
    return found


def _bk_cluster(store: LocalMetadataStore, layout: bytes, instance: bytes = b"5f3c1e1a-8f54-4c1b-9d7e-6c2e1f0a9b11"
                ) -> None:
    store.create(ROOT)
    store.create(f"{ROOT}/LAYOUT", layout)
    store.create(f"{ROOT}/INSTANCEID", instance)


def test_bookkeepers_own_layout_and_instance_id_are_a_bookkeeper_cluster(store: LocalMetadataStore) -> None:
    _bk_cluster(store, (GOLDEN / "LAYOUT").read_bytes(), (GOLDEN / "INSTANCEID").read_bytes())
    info = read_cluster(store, ROOT)
    assert info == ClusterInfo(ROOT, (GOLDEN / "INSTANCEID").read_text(), "hierarchical", "bookkeeper")


@pytest.mark.parametrize("manager", ["hierarchical", "flat", "longhierarchical"])
def test_each_manager_walkit_drives(store: LocalMetadataStore, manager: str) -> None:
    _bk_cluster(store, Layout.for_manager(manager).encode())
    assert read_cluster(store, ROOT).layout == manager


@pytest.mark.parametrize(("layout", "named"), [
    (Layout.for_manager("legacyhierarchical").encode(), "LegacyHierarchicalLedgerManagerFactory"),
    (b"2\norg.example.MyLedgerManagerFactory:1", "org.example.MyLedgerManagerFactory"),
    (b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:2", "version"),
    (b"7\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1", "neither walkit's nor BookKeeper's"),
    (b"walkit-layout 1\nledgers longhierarchical\n", "unknown ledger layout"),
])
def test_a_manager_walkit_cannot_drive_is_refused_by_name(store: LocalMetadataStore, layout: bytes,
                                                          named: str) -> None:
    _bk_cluster(store, layout)
    with pytest.raises(ClusterLayoutError, match=named):
        read_cluster(store, ROOT)


def test_layout_version_1_is_read(store: LocalMetadataStore) -> None:
    _bk_cluster(store, b"1\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:1\n")
    assert read_cluster(store, ROOT).layout == "flat"


def test_a_bookkeeper_instance_id_must_be_one_printable_word(store: LocalMetadataStore) -> None:
    _bk_cluster(store, Layout.for_manager("hierarchical").encode(), b"")
    with pytest.raises(ClusterLayoutError, match="INSTANCEID"):
        read_cluster(store, ROOT)


@pytest.mark.parametrize("manager", ["hierarchical", "flat", "longhierarchical"])
def test_init_makes_exactly_what_bookkeepers_init_makes(store: LocalMetadataStore, manager: str) -> None:
    info = init_cluster(store, ROOT, manager, format="bookkeeper")  # type: ignore[arg-type]
    assert info.format == "bookkeeper" and info.layout == manager
    tree = _tree(store, ROOT)
    # BookKeeper 4.18's ZKRegistrationManager.initNewCluster: the root, available/,
    # available/readonly/, INSTANCEID, then its LayoutManager's LAYOUT; nothing else.
    assert sorted(tree) == [ROOT, f"{ROOT}/INSTANCEID", f"{ROOT}/LAYOUT", f"{ROOT}/available",
                            f"{ROOT}/available/readonly"]
    assert tree[f"{ROOT}/LAYOUT"] == Layout.for_manager(manager).encode()
    assert tree[f"{ROOT}/INSTANCEID"] == info.instance_id.encode()
    if manager == "hierarchical":
        assert tree[f"{ROOT}/LAYOUT"] == (GOLDEN / "LAYOUT").read_bytes()
    assert tree[ROOT] == tree[f"{ROOT}/available"] == tree[f"{ROOT}/available/readonly"] == b""


def test_init_again_is_a_no_op_and_checks_format_and_layout(store: LocalMetadataStore) -> None:
    first = init_cluster(store, ROOT, format="bookkeeper")
    assert first.layout == "hierarchical"
    assert init_cluster(store, ROOT, format="bookkeeper") == first
    with pytest.raises(ClusterLayoutError, match="another format"):
        init_cluster(store, ROOT)
    with pytest.raises(ClusterLayoutError, match="another ledger layout"):
        init_cluster(store, ROOT, "flat", format="bookkeeper")


def test_walkit_format_is_unchanged(store: LocalMetadataStore) -> None:
    info = init_cluster(store, ROOT)
    assert info.format == "walkit"
    assert store.get(f"{ROOT}/LAYOUT")[0] == b"walkit-layout 1\nledgers hierarchical\n"
    assert sorted(store.children(ROOT)) == ["INSTANCEID", "LAYOUT", "available", "cookies", "idgen"]
    with pytest.raises(ClusterLayoutError, match="another format"):
        init_cluster(store, ROOT, format="bookkeeper")
    with pytest.raises(ClusterLayoutError, match="unknown ledger layout"):
        init_cluster(store, "/other", "longhierarchical")  # type: ignore[arg-type]


def test_walkits_own_nodes_of_a_bookkeeper_cluster_are_below_a_node_bookkeeper_skips() -> None:
    walkit = ClusterInfo(ROOT, "x", "hierarchical")
    bookkeeper = ClusterInfo(ROOT, "x", "hierarchical", "bookkeeper")
    assert walkit_path(walkit, "logs") == "/ledgers/logs"
    assert walkit_path(bookkeeper, "logs") == "/ledgers/ID-walkit/logs"
    # AbstractZkLedgerManager.isSpecialZnode: every name starting with "ID-" is skipped
    assert walkit_path(bookkeeper, "logs").split("/")[2].startswith("ID-")


@pytest.mark.parametrize(("uri", "want"), [
    ("zk+hierarchical://h1:2181;h2:2181/ledgers", MetadataURI("zk", "h1:2181,h2:2181", "/ledgers", "hierarchical")),
    ("zk+flat://h1:2181/bk/ledgers", MetadataURI("zk", "h1:2181", "/bk/ledgers", "flat")),
    ("zk+longhierarchical://h1:2181/ledgers", MetadataURI("zk", "h1:2181", "/ledgers", "longhierarchical")),
    ("zk://h1:2181/ledgers", MetadataURI("zk", "h1:2181", "/ledgers", None)),
])
def test_bookkeepers_metadata_service_uris(uri: str, want: MetadataURI) -> None:
    assert parse_metadata_uri(uri) == want


def test_an_unknown_manager_in_the_scheme_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="scheme"):
        parse_metadata_uri("zk+legacyhierarchical://h:1/ledgers")


def test_connect_checks_the_schemes_manager_against_the_cluster(tmp_path: Path) -> None:
    s = LocalMetadataStore(str(tmp_path / "m"), create=True)
    init_cluster(s, ROOT, "flat", format="bookkeeper")
    s.close()
    with connect(f"local://{tmp_path / 'm'}") as cluster:
        assert (cluster.info.format, cluster.info.layout) == ("bookkeeper", "flat")
    with pytest.raises(ClusterLayoutError, match="layout"):
        connect(f"local+hierarchical://{tmp_path / 'm'}")
    with connect(f"local+flat://{tmp_path / 'm'}") as cluster:
        assert cluster.info.layout == "flat"


def test_walkit_init_format_bookkeeper_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from walkit.cli import main

    uri = f"local+flat://{tmp_path}/md"
    assert main(["init", "--metadata", uri, "--format", "bookkeeper"]) == 0
    first = capsys.readouterr().out
    assert "format: bookkeeper, ledger layout: flat" in first
    assert main(["init", "--metadata", uri, "--format", "bookkeeper"]) == 0
    assert capsys.readouterr().out == first, "init is idempotent: same cluster, same instance id"
    assert main(["init", "--metadata", uri]) == 2  # a walkit cluster asked of a BookKeeper one: clear error
    assert "another format" in capsys.readouterr().err
    s = LocalMetadataStore(f"{tmp_path}/md")
    try:
        assert s.get(f"{ROOT}/LAYOUT")[0] == Layout.for_manager("flat").encode()
        assert sorted(s.children(ROOT)) == ["INSTANCEID", "LAYOUT", "available"]
    finally:
        s.close()
    assert main(["init", "--metadata", f"local+longhierarchical://{tmp_path}/other"]) == 2
    assert "unknown ledger layout" in capsys.readouterr().err
