"""BookKeeper's ``bk_server.conf``: the Java properties grammar (bookie/_properties.py) and
what a walkit bookie makes of each key (bookie/_bk_conf.py)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookie import BookieConfig
from bookie._bk_conf import MAPPED, REFUSED, from_properties, load, load_config
from bookie._main import main as bookie_main
from bookie._properties import load_configuration, load_properties, split_list
from walkit.errors import ConfigError, WalkitError

GOLDEN = Path(__file__).parent / "golden" / "bookkeeper" / "bk_server.conf"


# --- the grammar: java.util.Properties.load -------------------------------------------------

def test_separators_equals_colon_and_whitespace() -> None:
    text = "a=1\nb: 2\nc 3\nd\t=\t4\ne :5\nf   g h\n"
    assert load_properties(text) == {"a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "g h"}


def test_comments_blank_lines_and_leading_whitespace() -> None:
    text = "# a comment\n! another\n   # indented comment\n\n  \t\f  key = value\n#not=this\n"
    assert load_properties(text) == {"key": "value"}


def test_key_without_value_and_empty_key() -> None:
    assert load_properties("lonely\nempty=\n=v\n") == {"lonely": "", "empty": "", "": "v"}


def test_trailing_whitespace_of_a_value_is_kept_by_java() -> None:
    assert load_properties("k = v  \n") == {"k": "v  "}
    assert load_configuration("k = v  \n") == {"k": ["v"]}  # Commons Configuration trims


def test_continuation_lines() -> None:
    text = "fruits  apple, banana, \\\n        pear, \\\n   kiwi\nnext=1\n"
    assert load_properties(text) == {"fruits": "apple, banana, pear, kiwi", "next": "1"}
    assert load_properties("motor\\\n   cycle=yes\n") == {"motorcycle": "yes"}  # in the key too
    assert load_properties("k=a\\\n# not a comment here\n") == {"k": "a# not a comment here"}
    assert load_properties("k=end\\") == {"k": "end"}  # a backslash before the end of the file


def test_an_even_number_of_backslashes_does_not_continue() -> None:
    assert load_properties("k=v\\\\\nn=1\n") == {"k": "v\\", "n": "1"}
    assert load_properties("k=v\\\\\\\nmore\n") == {"k": "v\\more"}


def test_line_terminators_cr_lf_crlf() -> None:
    assert load_properties("a=1\rb=2\r\nc=3\nd=\\\r\n  4") == {"a": "1", "b": "2", "c": "3", "d": "4"}


def test_escapes() -> None:
    text = "tab=a\\tb\nnl=a\\nb\ncr=\\r\nff=\\f\nuni=\\u00e9\\u4E2D\nother=\\x\\y\\\\\n"
    assert load_properties(text) == {"tab": "a\tb", "nl": "a\nb", "cr": "\r", "ff": "\f", "uni": "é中",
                                     "other": "xy\\"}


def test_escaped_separators_in_keys() -> None:
    text = "e\\=mc2=yes\nkey\\:x: 1\nkey\\ with\\ spaces = v\n\\#notcomment=2\n"
    assert load_properties(text) == {"e=mc2": "yes", "key:x": "1", "key with spaces": "v", "#notcomment": "2"}


def test_separator_characters_in_a_value_need_no_escape() -> None:
    assert load_properties("url = zk://h:2181/ledgers=x:y\n") == {"url": "zk://h:2181/ledgers=x:y"}


@pytest.mark.parametrize("bad", ["k=\\u12", "k=\\u12zz", "k=\\u"])
def test_a_malformed_unicode_escape_is_an_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="uXXXX"):
        load_properties(bad)


def test_the_last_of_a_repeated_key_wins_for_java_and_accumulates_for_commons() -> None:
    assert load_properties("k=1\nk=2\n") == {"k": "2"}
    assert load_configuration("k=1\nk=2,3\n") == {"k": ["1", "2", "3"]}


def test_commons_lists_split_at_unescaped_commas_and_trim() -> None:
    assert load_configuration("ledgerDirectories=/a, /b ,/c\n") == {"ledgerDirectories": ["/a", "/b", "/c"]}
    assert split_list("a\\,b,c") == ["a,b", "c"]
    assert split_list("a\\\\,b") == ["a\\", "b"]
    assert split_list("") == [""]


# --- a writer (here only) and the round trip ------------------------------------------------

def _escape(text: str, key: bool) -> str:
    out = []
    for i, c in enumerate(text):
        if c in "\\=:#!" or (c == " " and (key or i == 0)) or c == ",":
            out.append("\\" + c)
        elif c in "\t\n\r\f":
            out.append({"\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}[c])
        elif ord(c) < 0x20 or ord(c) > 0x7e:
            out.append("".join(f"\\u{u:04x}" for u in _utf16(c)))
        else:
            out.append(c)
    return "".join(out)


def _utf16(c: str) -> list[int]:
    data = c.encode("utf-16-be")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]


def _write(pairs: dict[str, str], wrap: int) -> str:
    lines = []
    for k, v in pairs.items():
        line = f"{_escape(k, True)} = {_escape(v, False)}"
        if wrap and len(line) > wrap:  # continuation lines, cut outside an escape
            cut = line.rfind(" ", 0, wrap)
            if cut > 0 and line[cut - 1] != "\\" and line[cut + 1:cut + 2] not in ("", " "):
                line = line[:cut + 1] + "\\\n    " + line[cut + 1:]
        lines.append(line)
    return "# written by the test\n" + "\n".join(lines) + "\n"


_TEXT = st.text(st.characters(codec="utf-8"), max_size=30)


@given(st.dictionaries(_TEXT, _TEXT, max_size=8), st.sampled_from([0, 12, 40]))
def test_round_trip_through_a_writer(pairs: dict[str, str], wrap: int) -> None:
    assert load_properties(_write(pairs, wrap)) == pairs


@given(st.lists(_TEXT.map(str.strip).filter(lambda s: s == s.strip("".join(map(chr, range(0x21))))),
                min_size=1, max_size=5))
def test_round_trip_of_a_commons_list(items: list[str]) -> None:
    text = "k = " + ",".join(_escape(i, False) for i in items) + "\n"
    assert load_configuration(text) == {"k": items}


# --- the mapping ------------------------------------------------------------------------------

#: The keys set in BookKeeper 4.18's bk_server.conf, by what walkit makes of them.
GOLDEN_HONOURED = {"bookiePort", "httpServerEnabled", "httpServerPort", "ledgerDirectories", "metadataServiceUri",
                   "zkTimeout"}
GOLDEN_MAPPED = {"journalDirectories", "httpServerHost", "zkServers"}
GOLDEN_IGNORED = {
    "extraServerComponents", "httpServerClass", "httpServerTlsEnable", "httpServerKeyStorePath",
    "httpServerKeyStorePassword", "httpServerTrustStorePath", "httpServerTrustStorePassword",
    "gcEntryLogMetadataCacheEnabled", "zkEnableSecurity", "statsProviderClass", "stickyReadSEnabled",
    "reorderReadSequenceEnabled", "storageserver.grpc.port", "dlog.bkcEnsembleSize", "dlog.bkcWriteQuorumSize",
    "dlog.bkcAckQuorumSize", "storage.range.store.dirs", "storage.serve.readonly.tables",
    "storage.cluster.controller.schedule.interval.ms",
}


def test_bookkeepers_default_conf_every_key_honoured_mapped_or_ignored() -> None:
    conf = load_configuration(GOLDEN.read_text(encoding="iso-8859-1"))
    assert set(conf) == GOLDEN_HONOURED | GOLDEN_MAPPED | GOLDEN_IGNORED
    assert GOLDEN_HONOURED <= set(BookieConfig.keys()) and GOLDEN_MAPPED <= set(MAPPED)
    config, ignored = load_config(conf)
    assert set(ignored) == GOLDEN_IGNORED
    assert config.bookie_port == 3181 and config.zk_timeout == 10000 and config.http_server_enabled is False
    assert config.http_server_port == 8080 and config.http_server_address == "0.0.0.0"
    assert config.journal_directory == "/tmp/bk-txn" and config.ledger_directories == ["/tmp/bk-data"]
    assert config.metadata_service_uri == "zk+hierarchical://localhost:2181/ledgers"  # wins over zkServers


def test_bookkeepers_commented_keys_walkit_refuses_have_a_reason() -> None:
    """Keys the default conf names (commented out) whose values walkit cannot honour."""
    text = GOLDEN.read_text(encoding="iso-8859-1")
    for key in REFUSED:
        assert re.search(rf"^#\s*{key}\s*=", text, flags=re.M), key
        with pytest.raises(ConfigError, match=key) as raised:
            load_config({key: ["anything"]})
        assert raised.value.context["key"] == key and "walkit" in str(raised.value)


@pytest.mark.parametrize("key, value, why", [
    ("ledgerStorageClass", "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage", "own ledger storage"),
    ("ledgerStorageClass", "org.apache.bookkeeper.bookie.SortedLedgerStorage", "own ledger storage"),
    ("journalFormatVersionToWrite", "6", "journal format"),
    ("fileInfoFormatVersionToWrite", "1", "index files"),
    ("bookiePort", "three", "not an integer"),
    ("journalSyncData", "yes", "not a boolean"),
    ("diskUsageThreshold", "most", "not a number"),
    ("journalDirectories", "/a,/b", "one journal"),
    ("bookieId", "a,b", "one value expected"),
])
def test_a_refused_value_names_the_key_and_the_value(key: str, value: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as raised:
        load_config(load_configuration(f"{key}={value}\n"))
    assert raised.value.context["key"] == key and str(raised.value.context["value"]) == value
    assert key in str(raised.value) and value in str(raised.value)


def test_tls_stores_are_pem_or_refused_when_given() -> None:
    """BookKeeper's default store type is JKS: walkit bookies read PEM only, so another
    type is refused for a store that is given, and ignored for one that is not."""
    pem = load_configuration("tlsKeyStoreType=PEM\ntlsKeyStore=/k.pem\ntlsCertificatePath=/c.pem\n"
                             "tlsTrustStoreType=pem\ntlsTrustStore=/ca.pem\n")
    config, ignored = load_config(pem)
    assert (config.tls_key_store, config.tls_trust_store) == ("/k.pem", "/ca.pem")
    assert {"tlsKeyStoreType", "tlsTrustStoreType"} <= set(ignored)
    for key, store in (("tlsKeyStoreType", "tlsKeyStore"), ("tlsTrustStoreType", "tlsTrustStore")):
        with pytest.raises(ConfigError, match="PEM files only") as raised:
            load_config(load_configuration(f"{key}=JKS\n{store}=/s.jks\ntlsCertificatePath=/c.pem\n"
                                           "tlsKeyStore=/k.pem\n"))
        assert raised.value.context["key"] == key and raised.value.context["value"] == "JKS"
    assert load_config(load_configuration("tlsKeyStoreType=JKS\ntlsTrustStoreType=JKS\n"))[0].tls_key_store == ""


def test_an_out_of_range_value_is_refused_by_the_usual_checks() -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(load_configuration("bookiePort=70000\n"))
    assert raised.value.context["key"] == "bookiePort"


def test_types_as_java_reads_them() -> None:
    config, ignored = load_config(load_configuration(
        "journalSyncData=FALSE\njournalDirectIO=True\ndiskUsageThreshold=0.97\njournalMaxGroupWaitMSec=3\n"
        "journalAlignmentSize=+4096\nbookieId=\nledgerDirectories=/x, /y\nmetadataRetryDeadlineMs=5000\n"))
    assert config.journal_sync_data is False and config.journal_direct_io is True
    assert config.disk_usage_threshold == 0.97 and config.journal_max_group_wait_msec == 3.0
    assert config.journal_alignment_size == 4096 and config.bookie_id == "" and ignored == []
    assert config.ledger_directories == ["/x", "/y"] and config.metadata_retry_deadline_ms == 5000


def test_metadata_service_uri_from_zk_servers_and_semicolons() -> None:
    config, _ = load_config(load_configuration("zkServers=z1:2181,z2:2181\nzkLedgersRootPath=/bk/ledgers\n"))
    assert config.metadata_service_uri == "zk://z1:2181,z2:2181/bk/ledgers"
    config, _ = load_config(load_configuration("zkServers=z1:2181\n"))
    assert config.metadata_service_uri == "zk://z1:2181/ledgers"
    config, _ = load_config(load_configuration("metadataServiceUri=zk://z1:2181;z2:2181/ledgers\n"))
    assert config.metadata_service_uri == "zk://z1:2181,z2:2181/ledgers"


def test_journal_directories_wins_over_journal_directory_as_in_bookkeeper() -> None:
    config, _ = load_config(load_configuration("journalDirectory=/old\njournalDirectories=/new\n"))
    assert config.journal_directory == "/new"
    config, _ = load_config(load_configuration("journalDirectory=/old\njournalDirectories=\n"))
    assert config.journal_directory == "/old"


def test_ignored_keys_are_logged_once_naming_every_one(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "bk_server.conf"
    path.write_text("bookiePort=3181\nnumAddWorkerThreads=8\nbyteBufAllocatorSizeMax=1\nstatsProviderClass=x\n")
    with caplog.at_level(logging.WARNING, logger="bookie"):
        config = load(str(path))
    assert config.bookie_port == 3181
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    for key in ("numAddWorkerThreads", "byteBufAllocatorSizeMax", "statsProviderClass"):
        assert key in warnings[0]
    assert "bookiePort" not in warnings[0]


def test_no_warning_when_every_key_is_known(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "bk.properties"
    path.write_text("bookiePort=3181\njournalDirectories=/j\n")
    with caplog.at_level(logging.WARNING, logger="bookie"):
        assert from_properties(str(path)).journal_directory == "/j"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# --- choosing the format ------------------------------------------------------------------------

def test_format_by_extension_and_content(tmp_path: Path) -> None:
    toml = tmp_path / "bookie.toml"
    toml.write_text('bookiePort = 4000\nledgerDirectories = ["/l"]\n')
    assert load(str(toml)).bookie_port == 4000
    conf = tmp_path / "bk_server.conf"
    conf.write_text("bookiePort = 4001\n")  # also valid TOML, but .conf is properties
    assert load(str(conf)).bookie_port == 4001
    other = tmp_path / "bookie.cfg"
    other.write_text('bookiePort = 4002\n')
    assert load(str(other)).bookie_port == 4002  # TOML
    other.write_text("bookiePort: 4003\nledgerDirectories=/a,/b\n")  # not TOML: properties
    assert load(str(other)).ledger_directories == ["/a", "/b"]


def test_neither_toml_nor_properties_is_a_clear_error(tmp_path: Path) -> None:
    other = tmp_path / "bookie.cfg"
    other.write_text("this is [not a configuration\n")
    with pytest.raises(ConfigError, match="neither TOML .* nor Java properties"):
        load(str(other))
    with pytest.raises(ConfigError, match="no such file"):
        load(str(tmp_path / "missing.conf"))


def test_python_m_bookie_refuses_a_bad_bk_server_conf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "bk_server.conf"
    conf.write_text("ledgerStorageClass=org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage\n")
    assert bookie_main(["--conf", str(conf)]) == 2
    assert "ConfigError: ledgerStorageClass = 'org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage'" in (
        capsys.readouterr().err)
    assert issubclass(ConfigError, WalkitError)
