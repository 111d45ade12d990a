"""Metadata service URIs choose the driver, location, root and ledger layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from walkit.errors import InvalidArgumentError
from walkit.metadata import LocalMetadataStore, MetadataURI, open_metadata_store, parse_metadata_uri


@pytest.mark.parametrize(
    ("uri", "want"),
    [
        ("zk://127.0.0.1:2181/ledgers", MetadataURI("zk", "127.0.0.1:2181", "/ledgers", None)),
        ("zk+flat://h1:2181,h2:2182/bk/ledgers", MetadataURI("zk", "h1:2181,h2:2182", "/bk/ledgers", "flat")),
        ("zk+hierarchical://h:1/", MetadataURI("zk", "h:1", "/ledgers", "hierarchical")),
        ("local:///var/lib/walkit/md", MetadataURI("local", "/var/lib/walkit/md", "/ledgers", None)),
        ("local+flat:///d", MetadataURI("local", "/d", "/ledgers", "flat")),
    ],
)
def test_parse(uri: str, want: MetadataURI) -> None:
    assert parse_metadata_uri(uri) == want


@pytest.mark.parametrize(
    "uri", ["etcd://h:2379/x", "zk+tree://h:1/l", "zk:///ledgers", "local://host/dir", "local://", "nonsense", "zk://h:1/a//b"]
)
def test_bad_uris_are_clear_errors(uri: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_metadata_uri(uri)


def test_open_local(tmp_path: Path) -> None:
    store = open_metadata_store(f"local://{tmp_path}/md", session_timeout=2)
    try:
        assert isinstance(store, LocalMetadataStore)
        store.create("/ledgers")
        assert store.exists("/ledgers") is not None
    finally:
        store.close()


def test_open_zk(zk_server: object) -> None:
    hosts = getattr(zk_server, "hosts")
    store = open_metadata_store(f"zk://{hosts}/ledgers", session_timeout=2)
    try:
        store.create("/uri-test", b"x")
        assert store.get("/uri-test")[0] == b"x"
        store.delete("/uri-test")
    finally:
        store.close()


def test_walkit_init_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from walkit.cli import main

    uri = f"local://{tmp_path}/md"
    assert main(["init", "--metadata", uri]) == 0
    first = capsys.readouterr().out
    assert main(["init", "--metadata", uri]) == 0
    assert capsys.readouterr().out == first, "init is idempotent: same cluster, same instance id"
    assert main(["init", "--metadata", f"local+flat://{tmp_path}/md"]) == 2  # clear error, exit 2
    assert "another ledger layout" in capsys.readouterr().err


def test_passwords_never_appear_in_errors() -> None:
    from walkit.metadata._uri import redact

    assert redact("zk://walkit:s3cret@127.0.0.1:2181/ledgers") == "zk://walkit:***@127.0.0.1:2181/ledgers"
    assert redact("local:///data/md") == "local:///data/md"
    with pytest.raises(InvalidArgumentError) as err:
        parse_metadata_uri("zk+sideways://walkit:s3cret@127.0.0.1:2181/ledgers")
    assert "s3cret" not in str(err.value)
