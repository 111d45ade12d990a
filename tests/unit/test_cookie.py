"""Cookies: stamping a new bookie, catching wiped, swapped and foreign directories."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from crc32c import crc32c

from bookie.cookie import COOKIE_FILE, Cookie, check_or_write_cookies
from bookie.fs import FileSystem, read_all, write_atomic
from bookie.fs.mem import MemFS
from walkit.errors import CookieError, CorruptionError, FormatError, StorageError


@dataclass
class Env:
    fs: FileSystem
    root: str

    @property
    def journal(self) -> str:
        return f"{self.root}/journal"

    @property
    def ledgers(self) -> list[str]:
        return [f"{self.root}/l0", f"{self.root}/l1"]

    def check(
        self,
        bookie_id: str = "bk1:3181",
        instance: str | None = "inst-1",
        journal: str | None = None,
        ledgers: list[str] | None = None,
    ) -> Cookie:
        return check_or_write_cookies(
            self.fs, bookie_id, journal or self.journal, ledgers or self.ledgers, instance
        )

    def touch(self, path: str, data: bytes = b"x") -> None:
        f = self.fs.open(path, create=True)
        f.pwrite(data, 0)
        f.close()


@pytest.fixture(params=["mem", "real"])
def env(request: pytest.FixtureRequest, tmp_path: object) -> Env:
    if request.param == "mem":
        return Env(MemFS(), "/bk")
    real = pytest.importorskip("bookie.fs.real")
    return Env(real.RealFS(), str(tmp_path))


def test_new_bookie_is_stamped_then_accepted(env: Env) -> None:
    cookie = env.check()
    assert cookie == Cookie("bk1:3181", env.journal, tuple(env.ledgers), "inst-1")
    for d in [env.journal, *env.ledgers]:
        assert Cookie.decode(read_all(env.fs, f"{d}/{COOKIE_FILE}")) == cookie
    env.touch(f"{env.journal}/0000000000000001.txn")
    assert env.check(journal=env.journal + "/", ledgers=[d + "/" for d in env.ledgers]) == cookie


def test_shared_journal_and_ledger_dir(env: Env) -> None:
    cookie = env.check(journal=env.ledgers[0])
    assert cookie.directories() == env.ledgers
    assert env.check(journal=env.ledgers[0]) == cookie


def test_wiped_directory_is_refused(env: Env) -> None:
    env.check()
    env.fs.remove(f"{env.ledgers[1]}/{COOKIE_FILE}")
    with pytest.raises(CookieError, match=rf"missing cookie.*dir={env.ledgers[1]}"):
        env.check()


def test_added_directory_is_refused(env: Env) -> None:
    env.check()
    with pytest.raises(CookieError, match=rf"missing cookie.*dir={env.root}/l2"):
        env.check(ledgers=[*env.ledgers, f"{env.root}/l2"])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda e: e.check(bookie_id="bk2:3181"), "bookie_id"),
        (lambda e: e.check(instance="inst-2"), "instance_id"),
        (lambda e: e.check(instance=None), "instance_id"),
        (lambda e: e.check(ledgers=list(reversed(e.ledgers))), "ledger_dirs"),
        (lambda e: e.check(journal=e.root + "/j2"), "missing cookie"),
    ],
    ids=["bookie_id", "instance_id", "no_instance_id", "reordered", "other_journal"],
)
def test_foreign_cookie_is_refused(env: Env, change: Callable[[Env], Cookie], field: str) -> None:
    env.check()
    pattern = field if " " in field else f"cookie {field} differs.*expected=.*found="
    with pytest.raises(CookieError, match=pattern):
        change(env)


def test_swapped_disk_from_another_bookie(env: Env) -> None:
    env.check()
    other = Cookie("bk9:3181", env.journal, tuple(env.ledgers), "inst-1")
    write_atomic(env.fs, f"{env.ledgers[0]}/{COOKIE_FILE}", other.encode())
    with pytest.raises(CookieError, match=rf"bookie_id differs.*found='bk9:3181' dir={env.ledgers[0]}"):
        env.check()


def test_data_without_any_cookie_is_refused(env: Env) -> None:
    env.fs.makedirs(env.ledgers[0])
    env.touch(f"{env.ledgers[0]}/lastMark")
    with pytest.raises(CookieError, match="holds data but no cookie"):
        env.check()
    assert not env.fs.exists(f"{env.journal}/{COOKIE_FILE}")


def test_leftover_tmp_is_not_data(env: Env) -> None:
    env.fs.makedirs(env.journal)
    env.touch(f"{env.journal}/{COOKIE_FILE}.tmp", b"half")
    assert env.check().bookie_id == "bk1:3181"


def test_verify_matches_is_the_one_comparison() -> None:
    a = Cookie("bk1", "/j", ("/l0", "/l1"), "i")
    a.verify_matches(Cookie("bk1", "/j", ("/l0", "/l1"), "i"))
    with pytest.raises(CookieError, match="ledger_dirs differs.*expected=/l0,/l1 found=/l0 where=zk"):
        a.verify_matches(Cookie("bk1", "/j", ("/l0",), "i"), where="zk")
    with pytest.raises(CookieError, match="journal_dir"):
        a.verify_matches(Cookie("bk1", "/j2", ("/l0", "/l1"), "i"))


@pytest.mark.parametrize(
    ("other", "where", "remedy"),
    [
        (Cookie("bk9", "/j", ("/l0",), "i"), None,
         r"bookie_id differs: .*bookieId.*bookiePort.*restore.*`walkit recover --bookie "),
        (Cookie("bk1", "/j9", ("/l0",), "i"), None, r"journal_dir differs: .*journalDirectory.*restore"),
        (Cookie("bk1", "/j", ("/l9",), "i"), None, r"ledger_dirs differs: .*ledgerDirectories.*order.*restore"),
        (Cookie("bk1", "/j", ("/l0",), "i9"), None, r"instance_id differs: .*another cluster.*metadataServiceUri"),
        (Cookie("bk1", "/j", ("/l9",), "i"), "metadata",
         r"ledger_dirs differs: .*cluster.*another bookie.*bookieId.*`walkit bookie cookie get "),
    ],
    ids=["bookie_id", "journal_dir", "ledger_dirs", "instance_id", "metadata"],
)
def test_a_mismatch_says_what_to_do(other: Cookie, where: str | None, remedy: str) -> None:
    """Which field differs, both values, and the operator's way out - in the one line a
    refused start logs."""
    mine = Cookie("bk1", "/j", ("/l0",), "i")
    with pytest.raises(CookieError, match=remedy) as err:
        mine.verify_matches(other, where=where)
    assert "expected=" in str(err.value) and "found=" in str(err.value)


# --- the format: one driver, many corruptors ------------------------------------------------
_GOOD = Cookie("bk1", "/j", ("/l0",), None).encode()


def _with_body(body: bytes) -> bytes:
    return struct.pack("<8sHHII", b"WKCOOKIE", 1, 0, len(body), crc32c(body)) + body


CORRUPTORS: list[tuple[str, Callable[[bytes], bytes], type[StorageError]]] = [
    ("truncated header", lambda raw: raw[:10], CorruptionError),
    ("truncated body", lambda raw: raw[:-1], CorruptionError),
    ("bad magic", lambda raw: b"XKCOOKIE" + raw[8:], FormatError),
    ("newer version", lambda raw: raw[:8] + b"\x02" + raw[9:], FormatError),
    ("flipped body byte", lambda raw: raw[:-2] + b"X" + raw[-1:], CorruptionError),
    ("zero length", lambda raw: _with_body(b""), CorruptionError),
    ("not json", lambda raw: _with_body(b"{nope"), CorruptionError),
    ("not utf-8", lambda raw: _with_body(b"\xff\xfe"), CorruptionError),
    ("missing field", lambda raw: _with_body(b'{"bookie_id":"b"}'), CorruptionError),
    ("wrong type", lambda raw: _with_body(
        b'{"bookie_id":1,"instance_id":null,"journal_dir":"/j","ledger_dirs":["/l"]}'), CorruptionError),
]


@pytest.mark.parametrize(("name", "corrupt", "error"), CORRUPTORS, ids=[c[0] for c in CORRUPTORS])
def test_damaged_cookie(name: str, corrupt: Callable[[bytes], bytes], error: type[StorageError]) -> None:
    with pytest.raises(error):
        Cookie.decode(corrupt(_GOOD), path="/x/COOKIE")


def test_damaged_cookie_file_stops_the_check(env: Env) -> None:
    env.check()
    path = f"{env.ledgers[0]}/{COOKIE_FILE}"
    write_atomic(env.fs, path, read_all(env.fs, path)[:-3])
    with pytest.raises(CorruptionError, match="COOKIE"):
        env.check()


def test_oversized_cookie_is_not_read(env: Env) -> None:
    env.check()
    path = f"{env.ledgers[0]}/{COOKIE_FILE}"
    write_atomic(env.fs, path, bytes(200_000))
    with pytest.raises(CorruptionError, match="too large"):
        env.check()


def test_round_trip() -> None:
    c = Cookie("bk1:3181", "/j", ("/a", "/b"), "inst")
    assert Cookie.decode(c.encode()) == c
    assert Cookie.decode(Cookie("b", "/j", (), None).encode()).instance_id is None
