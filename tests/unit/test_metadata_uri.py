"""Metadata service URIs choose the driver, location, root and ledger layout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from walkit.errors import ClusterLayoutError, InvalidArgumentError, NoMetadataStoreError
from walkit.metadata import LocalMetadataStore, MetadataURI, connect, open_metadata_store, parse_metadata_uri


@pytest.mark.parametrize(
    ("uri", "want"),
    [
        ("zk://127.0.0.1:2181/ledgers", MetadataURI("zk", "127.0.0.1:2181", "/ledgers", None)),
        ("zk+flat://h1:2181,h2:2182/bk/ledgers", MetadataURI("zk", "h1:2181,h2:2182", "/bk/ledgers", "flat")),
        ("zk+hierarchical://h:1/", MetadataURI("zk", "h:1", "/ledgers", "hierarchical")),
        ("zk+hierarchical://h1:2181;h2:2181;h3/ledgers", MetadataURI("zk", "h1:2181,h2:2181,h3", "/ledgers",
                                                                      "hierarchical")),  # BookKeeper's ';'
        ("zk://user:pw@h1:1,[::1]:2/l", MetadataURI("zk", "user:pw@h1:1,[::1]:2", "/l", None)),
        ("local:///var/lib/walkit/md", MetadataURI("local", "/var/lib/walkit/md", "/ledgers", None)),
        ("local+flat:///d", MetadataURI("local", "/d", "/ledgers", "flat")),
    ],
)
def test_parse(uri: str, want: MetadataURI) -> None:
    assert parse_metadata_uri(uri) == want


@pytest.mark.parametrize(
    "uri", ["etcd://h:2379/x", "zk+tree://h:1/l", "zk:///ledgers", "local://host/dir", "local://", "nonsense", "zk://h:1/a//b",
            "zk://h:2181;;h2:2181/l", "zk://h:port/l", "zk://h:0/l", "zk://h:70000/l", "zk://:2181/l"]
)
def test_bad_uris_are_clear_errors(uri: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_metadata_uri(uri)


def test_open_local(tmp_path: Path) -> None:
    store = open_metadata_store(f"local://{tmp_path}/md", session_timeout=2, create=True)
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
        # zk://: one parameter, accepted and changing nothing (kazoo sessions that only read)
        reader = open_metadata_store(f"zk://{hosts}/ledgers", session_timeout=2, read_only=True)
        try:
            assert reader.get("/uri-test")[0] == b"x"
        finally:
            reader.close()
        assert store.get("/uri-test")[0] == b"x"
        store.delete("/uri-test")
    finally:
        store.close()


# -- a local:// store is made only where that is asked for (issue 35) --------------------------

_OPENS: dict[str, Callable[[str], object]] = {
    "open_metadata_store": lambda uri: open_metadata_store(uri),
    "open_metadata_store read-only": lambda uri: open_metadata_store(uri, read_only=True),
    "connect": lambda uri: connect(uri),
    "connect read-only": lambda uri: connect(uri, read_only=True),
    "LocalMetadataStore": lambda uri: LocalMetadataStore(parse_metadata_uri(uri).location),
}


@pytest.mark.parametrize("how", list(_OPENS))
@pytest.mark.parametrize("exists", [False, True], ids=["no-directory", "empty-directory"])
def test_a_local_store_that_is_not_there_is_an_error_and_nothing_is_made(tmp_path: Path, how: str,
                                                                         exists: bool) -> None:
    typo = tmp_path / "mdd"
    if exists:
        typo.mkdir()
    uri = f"local://{typo}"
    with pytest.raises(NoMetadataStoreError) as err:
        _OPENS[how](uri)
    assert isinstance(err.value, ClusterLayoutError)  # what callers of connect() already handle
    text = str(err.value)
    assert text.startswith(f"no metadata store at {typo}") and f"walkit init --metadata local://{typo}" in text
    assert err.value.context["file"] == str(typo / "metadata.sqlite")
    assert sorted(tmp_path.iterdir()) == ([typo] if exists else [])
    assert not exists or list(typo.iterdir()) == []


def test_create_makes_the_directory_and_the_store(tmp_path: Path) -> None:
    where = tmp_path / "a" / "b"
    LocalMetadataStore(str(where), create=True).close()
    assert (where / "metadata.sqlite").is_file()
    LocalMetadataStore(str(where)).close()  # there now: opened without create
    with pytest.raises(InvalidArgumentError):
        LocalMetadataStore(str(where), create=True, read_only=True)


def test_walkit_init_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from walkit.cli import main

    uri = f"local://{tmp_path}/md"
    assert main(["init", "--metadata", uri]) == 0  # the command that makes a store
    assert (tmp_path / "md" / "metadata.sqlite").is_file()
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
