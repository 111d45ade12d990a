"""BookKeeper 4.18's ZooKeeper metadata formats (walkit/metadata/_bk_ledger.py, _bk_records.py,
_bk_paths.py): golden bytes BookKeeper wrote (tests/unit/golden/bookkeeper/, captured by
tests/bookkeeper/test_bk_metadata_capture.py), round trips, properties, bad input."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from walkit.errors import FormatError, FormatVersionError, InvalidArgumentError, WalkitError
from walkit.metadata import LedgerMetadata, LedgerState
from walkit.metadata import _bk_ledger, _bk_paths, _bk_records
from walkit.metadata._bk_ledger import BkLedgerMetadata, ctoken_of, decode_ledger_metadata, from_walkit, salt_for
from walkit.metadata._bk_records import (BkCookie, BookieNote, BookieServiceInfo, Endpoint, InstanceId, Layout,
                                         UrLayout, UrMark)

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GOLDEN = Path(__file__).parent / "golden" / "bookkeeper"
MANIFEST: dict[str, Any] = json.loads((GOLDEN / "manifest.json").read_text())
GOLDEN_FILES = {"INSTANCEID", "LAYOUT", "cookie", "ledger-closed", "ledger-hmac", "ledger-open", "manifest.json",
                "registration", "underreplication-LAYOUT", "README.md", "auditor",
                "bk_server.conf"}  # BookKeeper's default configuration: tests/unit/test_bk_conf.py
AUDITOR: dict[str, Any] = json.loads((GOLDEN / "auditor" / "manifest.json").read_text())
B1, B2, B3 = MANIFEST["bookies"]


def golden(name: str) -> bytes:
    return (GOLDEN / name).read_bytes()


# --- golden bytes: BookKeeper's own ---------------------------------------------------------


def test_the_golden_files_are_all_here() -> None:
    assert {p.name for p in GOLDEN.iterdir()} == GOLDEN_FILES


@pytest.mark.parametrize("name", ["ledger-closed", "ledger-hmac", "ledger-open"])
def test_golden_ledger_metadata_round_trips_byte_for_byte(name: str) -> None:
    data = golden(name)
    meta = decode_ledger_metadata(data)
    assert meta.format_version == 3 and meta.encode() == data
    walkit, password = meta.to_walkit(MANIFEST["ledgers"][name], ctime=123, salt=bytes(16))
    assert walkit.ctime == 123  # 4.18 stores no ctime by default: the caller's (the znode's) is used
    back = from_walkit(walkit, password, store_ctime=False, ctoken=meta.ctoken)
    assert back == meta and back.encode() == data


def test_golden_ledger_contents() -> None:
    closed = decode_ledger_metadata(golden("ledger-closed"))
    assert closed == BkLedgerMetadata(
        write_quorum=3, ensemble_size=3, length=14, state=LedgerState.CLOSED, last_entry_id=2,
        segments=((0, (B2, B3, B1)),), digest="CRC32C", password=b"", ack_quorum=2, ctoken=0)
    assert len(b"alpha" + b"beta" + b"gamma") == closed.length
    hmac_ledger, password = decode_ledger_metadata(golden("ledger-hmac")).to_walkit(1)
    assert password == b"s3cret" and hmac_ledger.digest == "bk-hmac" and hmac_ledger.check_password(b"s3cret")
    assert hmac_ledger.bk_password == b"s3cret"
    assert (hmac_ledger.ensemble_size, hmac_ledger.write_quorum, hmac_ledger.ack_quorum) == (2, 2, 1)
    still_open = decode_ledger_metadata(golden("ledger-open"))
    assert still_open.state is LedgerState.OPEN and still_open.last_entry_id == -1 and still_open.length == 0
    assert still_open.ctoken is not None and still_open.ctoken > 0


def test_golden_layout_instance_cookie_registration() -> None:
    layout = Layout.decode(golden("LAYOUT"))
    assert layout == Layout.for_manager("hierarchical") and layout.manager == "hierarchical"
    assert layout.encode() == golden("LAYOUT") == b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    instance = InstanceId.decode(golden("INSTANCEID"))
    assert instance.encode() == golden("INSTANCEID") and len(instance.value) == 36
    cookie = BkCookie.decode(golden("cookie"))
    assert cookie.encode() == golden("cookie") and cookie.version == 5
    assert cookie.bookie_id == MANIFEST["bookie"] and cookie.instance_id == instance.value
    assert cookie.journal_dirs.endswith("/journal") and len(cookie.ledger_dirs) == 1 and cookie.index_dirs is None
    info = BookieServiceInfo.decode(golden("registration"))
    port = int(MANIFEST["bookie"].rsplit(":", 1)[1])
    assert info == BookieServiceInfo((Endpoint("bookie", port, "127.0.0.1", "bookie-rpc"),))
    assert info.encode() == golden("registration")
    assert UrLayout.decode(golden("underreplication-LAYOUT")) == UrLayout()
    assert UrLayout().encode() == golden("underreplication-LAYOUT")


def test_golden_auditor_vote_election_lock_and_mark() -> None:
    assert {p.name for p in (GOLDEN / "auditor").iterdir()} == {
        "auditor-vote", "auditorelection", "underreplication-lock", "underreplication-mark", "manifest.json"}
    vote = BookieNote.decode(golden("auditor/auditor-vote"))
    assert vote == BookieNote(AUDITOR["auditor"]) and vote.encode() == golden("auditor/auditor-vote")
    assert BookieNote.decode(golden("auditor/auditorelection")) == vote
    assert vote.encode() == golden("auditor/auditorelection")
    lock = BookieNote.decode(golden("auditor/underreplication-lock"))
    assert lock.bookie_id and lock.encode() == golden("auditor/underreplication-lock")  # the worker's host name
    mark = UrMark.decode(golden("auditor/underreplication-mark"))
    assert mark.replicas == (AUDITOR["lost"],) and mark.ctime is not None and mark.ctime > 1_600_000_000_000
    assert mark.encode() == golden("auditor/underreplication-mark")
    assert _bk_paths.ur_path("/", AUDITOR["ledger"]) == AUDITOR["mark"]
    assert _bk_paths.parse_ur_path("/", AUDITOR["mark"]) == AUDITOR["ledger"]
    assert [_bk_paths.vote_sequence(v.rsplit("/", 1)[1]) for v in AUDITOR["votes"]] == [0]
    assert all(v.startswith(_bk_paths.election_path("/") + "/") for v in AUDITOR["votes"])
    assert _bk_paths.ur_lock_path("/", AUDITOR["ledger"]) in AUDITOR["paths"]


def test_golden_tree_paths() -> None:
    paths = set(MANIFEST["paths"])
    for lid in MANIFEST["ledgers"].values():
        path = _bk_paths.ledger_path("/", lid, "hierarchical")
        assert path in paths and _bk_paths.parse_ledger_path("/", path, "hierarchical") == lid
    assert {"/idgen", "/available/readonly", "/underreplication/ledgers", "/underreplication/locks"} <= paths
    assert _bk_paths.idgen_prefix("/", "hierarchical") == "/idgen/ID-"


# --- ledger metadata ------------------------------------------------------------------------


def _walkit_meta(**kw: Any) -> LedgerMetadata:
    meta = LedgerMetadata.create(7, ("a:1", "b:2", "c:3"), write_quorum=2, ack_quorum=2, password=b"pw",
                                 ctime=1_700_000_000_000, digest=kw.pop("digest", "bk-crc32c"),
                                 custom={"app": b"\x00\xff", "walkit.log": b"orders"})
    return meta


def test_walkit_to_bookkeeper_and_back() -> None:
    meta = _walkit_meta().with_ensemble(5, ("a:1", "d:4", "c:3")).closed(9, 1000)
    assert meta.bk_password == b"pw"  # create() keeps a bk-* ledger's password
    bk = from_walkit(meta)
    assert bk.password == b"pw" and bk.digest == "CRC32C" and bk.ctime == meta.ctime
    assert bk.ctoken == ctoken_of(meta.password_salt) and 0 <= bk.ctoken < 2**63  # a fresh salt: a new token
    assert [c[0] for c in bk.custom] == ["app", "walkit.log"]  # customMetadata carries walkit's own
    again, password = decode_ledger_metadata(bk.encode()).to_walkit(7, salt=meta.password_salt)
    assert password == b"pw" and again == meta
    reread, _ = decode_ledger_metadata(bk.encode()).to_walkit(7)
    assert reread.password_salt == salt_for(bk.ctoken) and ctoken_of(reread.password_salt) == bk.ctoken
    assert from_walkit(reread).encode() == bk.encode()  # written back unchanged, cToken included
    assert decode_ledger_metadata(bk.encode()).to_walkit(7)[0] == reread  # two reads: equal values


@pytest.mark.parametrize("digest, bk", [("bk-crc32", "CRC32"), ("bk-crc32c", "CRC32C"), ("bk-hmac", "HMAC"),
                                        ("bk-dummy", "DUMMY")])
def test_digest_mapping(digest: str, bk: str) -> None:
    meta = _walkit_meta(digest=digest)
    assert from_walkit(meta, b"pw").digest == bk
    assert decode_ledger_metadata(from_walkit(meta, b"pw").encode()).to_walkit(7)[0].digest == digest


@pytest.mark.parametrize("digest", ["crc32c", "mac", "none"])
def test_walkits_own_digests_have_no_bookkeeper_record(digest: str) -> None:
    meta = _walkit_meta(digest=digest)
    assert meta.bk_password is None  # a walkit ledger never keeps its password
    with pytest.raises(InvalidArgumentError, match="bk-") as info:
        from_walkit(meta, b"pw")
    assert info.value.context["digest"] == digest


def test_wrong_password_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="password"):
        from_walkit(_walkit_meta(), b"not it")


def test_the_clear_password_is_checked_and_kept_for_bk_ledgers_only() -> None:
    meta = _walkit_meta()
    with pytest.raises(InvalidArgumentError, match="verifier"):
        dataclasses.replace(meta, bk_password=b"other")
    with pytest.raises(InvalidArgumentError, match="only a BookKeeper"):
        dataclasses.replace(_walkit_meta(digest="crc32c"), bk_password=b"pw")
    assert b"pw" not in meta.encode() and "pw" not in repr(meta)  # never in walkit's bytes, nor in logs
    assert LedgerMetadata.decode(meta.encode()).bk_password is None


def test_version_2_text_round_trip_and_no_ctoken() -> None:
    bk = from_walkit(_walkit_meta(), b"pw", format_version=2)
    data = bk.encode()
    assert data.startswith(b"BookieMetadataFormatVersion\t2\nquorumSize: 2\nensembleSize: 3\n")
    assert b"cToken" not in data and decode_ledger_metadata(data) == bk


def test_version_2_as_bookkeeper_4_8_wrote_it() -> None:
    text = (b"BookieMetadataFormatVersion\t2\nquorumSize: 2\nensembleSize: 2\nlength: 10\nlastEntryId: 4\n"
            b"state: CLOSED\nsegment {\n  ensembleMember: \"h1:3181\"\n  ensembleMember: \"h2:3181\"\n"
            b"  firstEntryId: 0\n}\ndigestType: HMAC\npassword: \"\\001secret\"\nackQuorumSize: 2\n"
            b"ctime: 1500000000000\ncustomMetadata {\n  key: \"k\"\n  value: \"v\"\n}\n")
    meta = decode_ledger_metadata(text)
    assert meta.format_version == 2 and meta.password == b"\x01secret" and meta.custom == (("k", b"v"),)
    walkit, _ = meta.to_walkit(9)
    assert walkit.ctime == 1500000000000 and walkit.last_entry_id == 4 and walkit.custom == {"k": b"v"}


def test_version_1_text() -> None:
    closed = b"BookieMetadataFormatVersion\t1\n2\n3\n100\n0\ta:1\tb:2\tc:3\n5\ta:1\td:4\tc:3\n9\tCLOSED"
    meta = decode_ledger_metadata(closed)
    assert meta.state is LedgerState.CLOSED and meta.last_entry_id == 9 and meta.length == 100
    assert meta.segments == ((0, ("a:1", "b:2", "c:3")), (5, ("a:1", "d:4", "c:3")))
    with pytest.raises(FormatError, match="reader must name them"):
        meta.to_walkit(1)  # no password, no digest type kept: BookKeeper takes both from the reader
    walkit, password = meta.to_walkit(1, digest="bk-hmac", password=b"pw")
    assert walkit.ack_quorum == 2 and walkit.digest == "bk-hmac" and password == b"pw"  # no Qa before 4.3: Qa = Qw
    assert walkit.bk_password is None and walkit.check_password(b"pw")  # the record keeps none
    rewritten = from_walkit(walkit)
    assert rewritten.password is None and rewritten.digest is None  # written back: still neither
    with pytest.raises(FormatError, match="bk-"):
        meta.to_walkit(1, digest="mac", password=b"pw")
    recovering = decode_ledger_metadata(b"BookieMetadataFormatVersion\t1\n1\n1\n0\n0\ta:1\n-102\tCLOSED")
    assert recovering.state is LedgerState.IN_RECOVERY
    with pytest.raises(InvalidArgumentError):
        meta.encode()  # read, never written


BAD_LEDGERS = [
    b"", b"BookieMetadataFormatVersion", b"BookieMetadataFormatVersion\t3", b"BookieMetadataFormatVersion\tx\n",
    b"BookieMetadataFormatVersion\t3\n", b"BookieMetadataFormatVersion\t3\n\x05\x08\x01",  # cut
    b"BookieMetadataFormatVersion\t3\n\x02\x08\x01",  # required fields missing
    b"BookieMetadataFormatVersion\t3\n\xff\xff\xff\xff\xff\xff",
    b"BookieMetadataFormatVersion\t2\nquorumSize: 2\n",  # required fields missing
    b"BookieMetadataFormatVersion\t2\nnot text format",
    b"BookieMetadataFormatVersion\t1\nx\n",
    b"WKLEDGER\x02\x00",
]


@pytest.mark.parametrize("data", BAD_LEDGERS)
def test_bad_ledger_metadata_is_a_format_error(data: bytes) -> None:
    with pytest.raises(FormatError):
        decode_ledger_metadata(data)


def test_unknown_version_is_a_version_error() -> None:
    with pytest.raises(FormatVersionError):
        decode_ledger_metadata(b"BookieMetadataFormatVersion\t4\n\x00")


def test_trailing_bytes_are_refused() -> None:
    data = golden("ledger-closed")
    with pytest.raises(FormatError, match="length") as info:
        decode_ledger_metadata(data + b"\x00")
    assert info.value.context["available"] == info.value.context["length"] + 1


def test_metadata_walkit_cannot_hold_is_a_format_error() -> None:
    bad = BkLedgerMetadata(write_quorum=3, ensemble_size=2, length=0, state=LedgerState.OPEN,
                           segments=((0, ("a:1", "b:2")),), digest="CRC32C", password=b"")
    with pytest.raises(FormatError, match="cannot hold"):
        decode_ledger_metadata(bad.encode()).to_walkit(4)
    no_digest = BkLedgerMetadata(write_quorum=1, ensemble_size=1, length=0, state=LedgerState.OPEN,
                                 segments=((0, ("a:1",)),), password=b"pw")
    assert no_digest.to_walkit(4)[0].digest == "bk-crc32"  # a password without a digest type: the enum's default


BOOKIE = st.from_regex(r"[a-z0-9.]{1,12}:[0-9]{1,5}", fullmatch=True)


@st.composite
def bk_records(draw: st.DrawFn) -> BkLedgerMetadata:
    size = draw(st.integers(1, 5))
    firsts = sorted(draw(st.sets(st.integers(1, 2**40), max_size=3)))
    segments = tuple((first, tuple(draw(st.lists(BOOKIE, min_size=size, max_size=size, unique=True))))
                     for first in [0, *firsts])
    state = draw(st.sampled_from(list(LedgerState)))
    opt = st.none() | st.integers(-(2**63), 2**63 - 1)
    return BkLedgerMetadata(
        write_quorum=draw(st.integers(1, size)), ensemble_size=size, length=draw(st.integers(0, 2**63 - 1)),
        state=state, segments=segments, last_entry_id=draw(opt),
        digest=draw(st.none() | st.sampled_from(["CRC32", "HMAC", "CRC32C", "DUMMY"])),
        password=draw(st.none() | st.binary(max_size=20)), ack_quorum=draw(st.none() | st.integers(1, size)),
        ctime=draw(opt), custom=tuple(draw(st.dictionaries(st.text(max_size=8), st.binary(max_size=8))).items()),
        ctoken=draw(opt), format_version=draw(st.sampled_from([2, 3])))


@FAST
@given(bk_records())
def test_property_encode_decode_round_trip(meta: BkLedgerMetadata) -> None:
    expected = BkLedgerMetadata(**{**meta.__dict__, "ctoken": None}) if meta.format_version == 2 else meta
    assert decode_ledger_metadata(meta.encode()) == expected


@FAST
@given(st.binary(max_size=120))
def test_property_garbage_raises_only_format_errors(tail: bytes) -> None:
    for head in (b"", b"BookieMetadataFormatVersion\t3\n", b"BookieMetadataFormatVersion\t2\n",
                 b"BookieMetadataFormatVersion\t1\n"):
        try:
            decode_ledger_metadata(head + tail)
        except FormatError:
            pass


@FAST
@given(st.integers(0, 300), st.integers(0, 255))
def test_property_mutated_golden_raises_only_format_errors(at: int, byte: int) -> None:
    data = bytearray(golden("ledger-open"))
    data[at % len(data)] = byte
    try:
        decode_ledger_metadata(bytes(data))
    except FormatError:
        pass


# --- paths ----------------------------------------------------------------------------------


@pytest.mark.parametrize("manager, lid, path", [
    ("flat", 7, "/ledgers/L0000000007"),
    ("hierarchical", 7, "/ledgers/00/0000/L0007"),
    ("hierarchical", 2**31 - 2, "/ledgers/21/4748/L3646"),
    ("hierarchical", 2**31 - 1, "/ledgers/000/0000/0021/4748/L3647"),
    ("longhierarchical", 7, "/ledgers/000/0000/0000/0000/L0007"),
    ("longhierarchical", 2**63 - 1, "/ledgers/922/3372/0368/5477/L5807"),
])
def test_ledger_paths(manager: _bk_paths.Manager, lid: int, path: str) -> None:
    assert _bk_paths.ledger_path("/ledgers", lid, manager) == path
    assert _bk_paths.parse_ledger_path("/ledgers", path, manager) == lid


@FAST
@given(st.integers(0, 2**63 - 1), st.sampled_from(_bk_paths.MANAGERS))
def test_property_paths_round_trip(lid: int, manager: _bk_paths.Manager) -> None:
    assert _bk_paths.parse_ledger_path("/l", _bk_paths.ledger_path("/l", lid, manager), manager) == lid
    assert _bk_paths.parse_ur_path("/l", _bk_paths.ur_path("/l", lid)) == lid


@pytest.mark.parametrize("path", ["/ledgers/000/0000/0000/0000/L007", "/ledgers/000/0000/0000/0000/0007",
                                  "/other/000/0000/0000/0000/L0007", "/ledgers/00/0000/L0007",
                                  "/ledgers/000/0000/0000/00000/L007", "/ledgers/000/0000/0000/0000/L000x"])
def test_not_long_ledger_paths(path: str) -> None:
    assert _bk_paths.parse_ledger_path("/ledgers", path, "longhierarchical") is None


def test_id_generation_paths() -> None:
    prefix = _bk_paths.idgen_prefix("/ledgers")
    assert prefix == "/ledgers/idgen/ID-" and _bk_paths.idgen_prefix("/ledgers", "flat") == "/ledgers/ID-"
    assert _bk_paths.id_from_idgen(prefix, prefix + "0000000042") == 42
    for overflow in ("2147483647", "-2147483648"):
        with pytest.raises(InvalidArgumentError, match="exhausted"):
            _bk_paths.id_from_idgen(prefix, prefix + overflow)
    with pytest.raises(FormatError):
        _bk_paths.id_from_idgen(prefix, "/ledgers/idgen/XX-0000000001")
    long_prefix = _bk_paths.long_idgen_prefix("/ledgers", 1)
    assert long_prefix == "/ledgers/idgen-long/HOB-0000000001/ID-"
    assert _bk_paths.long_id_from_idgen("/ledgers", 1, long_prefix + "0000000005") == (1 << 32) | 5
    assert _bk_paths.split_long_id((3 << 32) | 9) == (3, 9)
    assert _bk_paths.parse_hob("HOB-0000000003") == 3 and _bk_paths.parse_hob("HOB-3") is None


def test_underreplication_and_election_paths() -> None:
    lid = 0x0001_0002_0003_0004
    assert _bk_paths.ur_path("/ledgers", lid) == f"/ledgers/underreplication/ledgers/0001/0002/0003/0004/urL{lid:010d}"
    assert _bk_paths.ur_lock_path("/ledgers", 7) == "/ledgers/underreplication/locks/urL0000000007"
    assert _bk_paths.election_path("/ledgers") == "/ledgers/underreplication/auditorelection"
    assert _bk_paths.vote_sequence("V_0000000012") == 12
    with pytest.raises(FormatError):
        _bk_paths.vote_sequence("X_1")
    assert _bk_paths.parse_ur_path("/ledgers", "/ledgers/underreplication/ledgers/0/0/0/7/urL0000000007") is None


def test_bad_arguments_are_invalid_argument_errors() -> None:
    with pytest.raises(InvalidArgumentError):
        _bk_paths.ledger_path("/l", -1, "longhierarchical")
    with pytest.raises(InvalidArgumentError):
        _bk_paths.ledger_path("/l", 1, "ms")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        _bk_paths.ledger_path("l/", 1, "longhierarchical")


# --- small records --------------------------------------------------------------------------


def test_layouts_of_every_manager() -> None:
    for name in _bk_records.MANAGER_CLASSES:
        layout = Layout.for_manager(name)
        assert Layout.decode(layout.encode()) == layout and layout.manager == name
    assert Layout.decode(b"2\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:1\n").manager == "flat"
    assert Layout.decode(b"1\ncom.example.Mine:3").manager is None


@pytest.mark.parametrize("data", [b"", b"3\nx:1", b"2\n", b"2\nx", b"2\nx:y", b"two\nx:1", b"2\nx:1:2", b"\xff"])
def test_bad_layouts(data: bytes) -> None:
    with pytest.raises(FormatError):
        Layout.decode(data)


def test_cookie_versions_and_index_dirs() -> None:
    cookie = BkCookie("h:3181", "/j1,/j2", ("/l1", "/l2"), "id-1", ("/i1",))
    data = cookie.encode()
    assert data == (b'5\nbookieHost: "h:3181"\njournalDir: "/j1,/j2"\nledgerDirs: "2\\t/l1\\t/l2"\n'
                    b'instanceId: "id-1"\nindexDirs: "1\\t/i1"\n')
    assert BkCookie.decode(data) == cookie
    v4 = BkCookie.decode(b'4\nbookieHost: "h:3181"\njournalDir: "/j"\nledgerDirs: "1\\t/l"\n')
    assert v4 == BkCookie("h:3181", "/j", ("/l",), version=4)
    assert BkCookie.decode(b"3\nh:3181\n/j\n1\t/l\n") == BkCookie("h:3181", "/j", ("/l",), version=3)


@pytest.mark.parametrize("data", [b"", b"x\n", b"6\n", b"5\nbookieHost: \"h\"\n", b"5\nnonsense",
                                  b'5\nbookieHost: "h"\njournalDir: "/j"\nledgerDirs: "2\\t/l"\n', b"3\nh\n"])
def test_bad_cookies(data: bytes) -> None:
    with pytest.raises(FormatError):
        BkCookie.decode(data)


def test_instance_ids() -> None:
    assert InstanceId.decode(b"abc").value == "abc"
    for bad in (b"", b" abc", b"abc\n", b"\xff"):
        with pytest.raises(FormatError):
            InstanceId.decode(bad)


def test_registrations() -> None:
    info = BookieServiceInfo((Endpoint("bookie", 3181, "h", "bookie-rpc", ("tls",), ("x",)),
                              Endpoint("http", 8080, "h", "http")), (("a", "1"), ("b", "2")))
    assert BookieServiceInfo.decode(info.encode()) == info
    assert BookieServiceInfo.decode(b"") == BookieServiceInfo()  # pre-4.12 bookies register empty data
    for bad in (b"\x32\x05\x0a", b"\x32\x00", b"\xff"):
        with pytest.raises(FormatError):
            BookieServiceInfo.decode(bad)


def test_underreplication_marks_votes_and_locks() -> None:
    mark = UrMark(("127.0.0.1:3181", "127.0.0.1:3182"), 1_700_000_000_000)
    assert mark.encode() == b'replica: "127.0.0.1:3181"\nreplica: "127.0.0.1:3182"\nctime: 1700000000000\n'
    assert UrMark.decode(mark.encode()) == mark and UrMark.decode(b'replica: "a:1"\n') == UrMark(("a:1",))
    vote = BookieNote("127.0.0.1:3181")
    assert vote.encode() == b'bookieId: "127.0.0.1:3181"\n' and BookieNote.decode(vote.encode()) == vote
    assert BookieNote.decode(b"") == BookieNote()
    for bad in (b"replica: 3", b"ctime: \"x\"", b"\xff", b"bogus: 1"):
        with pytest.raises(FormatError):
            UrMark.decode(bad)
    with pytest.raises(FormatError):
        UrLayout.decode(b'type: "BASIC"\n')


@FAST
@given(st.lists(st.text(max_size=10), max_size=4), st.none() | st.integers(-(2**63), 2**63 - 1),
       st.none() | st.text(max_size=10))
def test_property_text_records_round_trip(replicas: list[str], ctime: int | None, bookie: str | None) -> None:
    assert UrMark.decode(UrMark(tuple(replicas), ctime).encode()) == UrMark(tuple(replicas), ctime)
    assert BookieNote.decode(BookieNote(bookie).encode()) == BookieNote(bookie)


@FAST
@given(st.binary(max_size=80))
def test_property_record_decoders_raise_only_walkit_errors(data: bytes) -> None:
    decoders = (Layout.decode, InstanceId.decode, BkCookie.decode, BookieServiceInfo.decode, UrLayout.decode,
                UrMark.decode, BookieNote.decode)
    for decode in decoders:
        try:
            decode(data)
        except WalkitError as exc:
            assert isinstance(exc, FormatError), (decode, exc)


# --- generated code -------------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools not installed")
def test_generated_meta_pb2_matches_the_proto() -> None:
    from walkit.protocol import gen_proto

    assert gen_proto.META_OUTPUT.read_text(encoding="utf-8") == gen_proto.generate(
        gen_proto.META_PROTO, gen_proto.META_OUTPUT), "run: python -m walkit.protocol.gen_proto"


def test_field_numbers_are_bookkeepers() -> None:
    fields = {f.name: f.number for f in _bk_ledger.pb.LedgerMetadataFormat.DESCRIPTOR.fields}
    assert fields == {"quorumSize": 1, "ensembleSize": 2, "length": 3, "lastEntryId": 4, "state": 5, "segment": 6,
                      "digestType": 7, "password": 8, "ackQuorumSize": 9, "ctime": 10, "customMetadata": 11,
                      "cToken": 12}
    endpoint = {f.name: f.number for f in _bk_records.pb.BookieServiceInfoFormat.Endpoint.DESCRIPTOR.fields}
    assert endpoint == {"id": 1, "port": 2, "host": 3, "protocol": 4, "auth": 5, "extensions": 6}


@pytest.mark.parametrize("version", [b"--2", b"-", b"", b"\xd9\xa3", b"\xc2\xb2", b"2x", b"\x1c"])
def test_a_layout_whose_version_is_no_decimal_is_a_format_error(version: bytes) -> None:
    """The LAYOUT's version line: a decimal (blanks around it allowed, as str.strip takes
    them), else FormatError - never int()'s ValueError (it was for "\x1c0", a control
    character str.strip takes and int() does not, found by
    test_property_record_decoders_raise_only_walkit_errors; two minus signs; Unicode digits)."""
    data = version + b"\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    with pytest.raises(FormatError, match="not a number"):
        Layout.decode(data)
    for blank in (b" 2 ", b"\x1c2"):
        assert Layout.decode(blank + b"\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1").layout_version == 2
