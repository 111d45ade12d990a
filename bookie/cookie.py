"""Cookies: a stamp in every bookie directory that says whose and which disk it is.

Theory of operation
-------------------
A :class:`Cookie` names the bookie id, the journal dir, the ordered ledger dirs and the
cluster instance id. The file ``COOKIE`` (format in ``docs/format.md``, "Cookie": a
binary header with magic, version, body length and CRC32C, then a JSON body) is written
into the journal dir and every ledger dir when a bookie starts for the first time.

Guarantees: :func:`check_or_write_cookies` refuses to start (``CookieError``) when a
directory lost its cookie while others kept theirs — a wiped or replaced disk whose
data the bookie would otherwise silently not have — when a directory holds data but no
directory has a cookie, and when any cookie names another bookie, another directory
list (order matters: a ledger lives in dir ``ledger_id % len(dirs)``) or another
cluster. :meth:`Cookie.verify_matches` is the one comparison, shared with the check
against the cookie kept in the metadata store.

Assumptions: cookies are written with ``write_atomic`` (tmp, sync, rename, fsync dir),
so each file is whole or absent. Recovery: none is automatic. A crash in the middle of
the very first start can leave some directories with a cookie and some without; the
bookie then refuses to start, like for a wiped disk, and an operator who knows the
bookie never stored anything removes the ``COOKIE`` files.

The cluster keeps a copy in ``cookies/<id>`` (:func:`encode_for_metadata`,
:func:`decode_from_metadata`): these same bytes in a walkit-format cluster; in a
BookKeeper-format cluster BookKeeper's text cookie (version 5: bookie id, journal dir,
ledger dirs, instance id; no index dirs), so BookKeeper's tools read it as a Java
bookie's. The disks keep this module's format in both cases.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, fields

from crc32c import crc32c

from bookie.fs import FileSystem, parent_dir, write_atomic
from walkit.errors import CookieError, CorruptionError, FormatError, FormatVersionError, WalkitError

__all__ = ["Cookie", "COOKIE_FILE", "check_or_write_cookies", "read_cookie", "encode_for_metadata",
           "decode_from_metadata"]

COOKIE_FILE = "COOKIE"
_MAGIC = b"WKCOOKIE"
_VERSION = 1  # 1: first format (binary header, JSON body)
_HEADER = struct.Struct("<8sHHII")  # magic, version, reserved, body length, crc32c(body)
_MAX_BODY = 64 << 10  # bound checked before reading the body
#: Names that do not count as data when deciding whether a directory is new.
_NOT_DATA = frozenset({COOKIE_FILE + ".tmp", "lost+found", "LOCK"})  # LOCK: the server's flock file


@dataclass(frozen=True)
class Cookie:
    bookie_id: str
    journal_dir: str
    ledger_dirs: tuple[str, ...]
    instance_id: str | None = None

    def directories(self) -> list[str]:
        """Every directory that holds a copy (the journal dir first, no repeats)."""
        return list(dict.fromkeys([self.journal_dir, *self.ledger_dirs]))

    def verify_matches(self, other: Cookie, **context: object) -> None:
        """Raise ``CookieError`` naming the first field that differs, what to do about it,
        and both values (``where="metadata"``: ``other`` is the cluster's copy)."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if mine != theirs:
                remedy = _METADATA_REMEDY if context.get("where") == "metadata" else _REMEDIES[f.name]
                raise CookieError(
                    f"cookie {f.name} differs: {remedy}", expected=_show(mine), found=_show(theirs), **context
                )

    def encode(self) -> bytes:
        body = json.dumps(
            {
                "bookie_id": self.bookie_id,
                "journal_dir": self.journal_dir,
                "ledger_dirs": list(self.ledger_dirs),
                "instance_id": self.instance_id,
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        return _HEADER.pack(_MAGIC, _VERSION, 0, len(body), crc32c(body)) + body

    @classmethod
    def decode(cls, raw: bytes, *, path: str = "") -> Cookie:
        """The cookie; CorruptionError / FormatError when it is damaged or foreign,
        FormatVersionError when it is intact (magic, length and CRC hold) but of a
        version this code does not read."""
        version, body = _check_header(raw, path)
        return FormatVersionError.reader(_READERS, version, "cookie", path=path)(body, path)


#: What an operator does when the disks' cookie (found=) differs from the configuration's
#: (expected=), by field: in the message, so the refused start's one log line says it.
_REMEDIES = {
    "bookie_id": "the bookie id (bookieId, or <advertisedAddress or bindAddress>:<bookiePort> without one) is not "
                 "the one these disks were set up with: restore the settings that gave the id found (or set bookieId "
                 "to it), or mount this bookie's own disks; to reuse the disks for a new bookie, run `walkit recover "
                 "--bookie <found> --metadata URI` first, then empty the directories",
    "journal_dir": "journalDirectory is not the one these disks were set up with: restore it (a bookie's "
                   "directories cannot change)",
    "ledger_dirs": "ledgerDirectories (paths and order) are not the ones these disks were set up with: restore them "
                   "as found (a bookie's directories cannot change; to grow, add bookies)",
    "instance_id": "these disks belong to another cluster (found) than the one metadataServiceUri names "
                   "(expected; None: it is unset), or that cluster was initialised again: point the bookie at its "
                   "own cluster",
}
_METADATA_REMEDY = (
    "the cluster holds another cookie (found) for this bookie id than its disks (expected): another bookie uses "
    "this id (give this one its own bookieId), or these directories were set up anew (restore the old ones); "
    "compare with `walkit bookie cookie get --conf FILE --metadata URI`; a new bookie meant to take the id over: "
    "`walkit recover --bookie ID --metadata URI`, then `walkit bookie cookie delete --bookie ID --metadata URI`")


def _check_header(raw: bytes, path: str) -> tuple[int, bytes]:
    """The version and body of an intact cookie (magic, length and CRC checked)."""
    if len(raw) < _HEADER.size:
        raise CorruptionError("cookie truncated", path=path, size=len(raw))
    magic, version, _, length, crc = _HEADER.unpack_from(raw)
    if magic != _MAGIC:
        raise FormatError("not a cookie", path=path, magic=magic.hex())
    if not 0 < length <= _MAX_BODY or len(raw) != _HEADER.size + length:
        raise CorruptionError("cookie length invalid", path=path, length=length, size=len(raw))
    body = raw[_HEADER.size :]
    if crc32c(body) != crc:
        raise CorruptionError("cookie CRC mismatch", path=path)
    return version, body


def _decode_v1(body: bytes, path: str) -> Cookie:
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptionError("cookie body is not JSON", path=path) from exc
    return _from_json(obj, path)


def _from_json(obj: object, path: str) -> Cookie:
    keys = {"bookie_id", "journal_dir", "ledger_dirs", "instance_id"}
    if not isinstance(obj, dict) or set(obj) != keys:
        raise CorruptionError("cookie body has the wrong fields", path=path)
    dirs, instance = obj["ledger_dirs"], obj["instance_id"]
    ok = (
        isinstance(obj["bookie_id"], str)
        and isinstance(obj["journal_dir"], str)
        and isinstance(dirs, list)
        and all(isinstance(d, str) for d in dirs)
        and (instance is None or isinstance(instance, str))
    )
    if not ok:
        raise CorruptionError("cookie field has the wrong type", path=path)
    return Cookie(obj["bookie_id"], obj["journal_dir"], tuple(dirs), instance)


#: Cookie version -> the decoder of an intact cookie's body.
_READERS: dict[int, Callable[[bytes, str], Cookie]] = {1: _decode_v1}


def _show(value: object) -> str:
    return ",".join(value) if isinstance(value, tuple) else repr(value)


def _norm(path: str) -> str:
    return path.rstrip("/") or "/"


def _read_cookie(fs: FileSystem, d: str) -> Cookie | None:
    path = f"{d}/{COOKIE_FILE}"
    if not fs.exists(path):
        return None
    f = fs.open(path)
    try:
        size = f.size()
        if size > _HEADER.size + _MAX_BODY:
            raise CorruptionError("cookie too large", path=path, size=size)
        return Cookie.decode(f.pread(size, 0), path=path)
    finally:
        f.close()


def read_cookie(fs: FileSystem, directory: str) -> Cookie | None:
    """The cookie in ``directory`` (None: it has none); CorruptionError / FormatError
    when it is damaged (for tools: ``walkit bookie cookie get``)."""
    return _read_cookie(fs, directory)


def _require_empty(fs: FileSystem, d: str) -> None:
    data = [n for n in fs.listdir(d) if n not in _NOT_DATA] if fs.exists(d) else []
    if data:
        raise CookieError("directory holds data but no cookie", dir=d, found=",".join(data[:3]))


def _write_cookie(fs: FileSystem, d: str, cookie: Cookie) -> None:
    if not fs.exists(d):
        fs.makedirs(d)
        fs.fsync_dir(parent_dir(d))
    write_atomic(fs, f"{d}/{COOKIE_FILE}", cookie.encode())


def check_or_write_cookies(
    fs: FileSystem,
    bookie_id: str,
    journal_dir: str,
    ledger_dirs: list[str],
    instance_id: str | None,
    before_stamp: Callable[[], None] = lambda: None,
) -> Cookie:
    """Check every directory's cookie against the configuration, or stamp a new bookie.
    ``before_stamp`` runs before a new bookie's directories are stamped and may refuse
    (raise): the server refuses empty disks under an id its cluster already knows."""
    expected = Cookie(bookie_id, _norm(journal_dir), tuple(_norm(d) for d in ledger_dirs), instance_id)
    dirs = expected.directories()
    found = {d: _read_cookie(fs, d) for d in dirs}
    present = [d for d in dirs if found[d] is not None]
    if not present:
        for d in dirs:
            _require_empty(fs, d)
        before_stamp()
        for d in dirs:
            _write_cookie(fs, d, expected)
        return expected
    missing = [d for d in dirs if found[d] is None]
    if missing:
        raise CookieError(
            "missing cookie: directory was wiped or replaced?", dir=missing[0], cookie_in=present[0]
        )
    for d, cookie in found.items():
        if cookie is not None:
            expected.verify_matches(cookie, dir=d)
    return expected


def encode_for_metadata(cookie: Cookie, cluster_format: str) -> bytes:
    """The bytes the cluster keeps in ``cookies/<id>``: this module's encoding, or
    BookKeeper's text cookie in a BookKeeper-format cluster."""
    if cluster_format == "bookkeeper":
        from walkit.metadata import BkCookie

        return BkCookie(cookie.bookie_id, cookie.journal_dir, cookie.ledger_dirs, cookie.instance_id).encode()
    return cookie.encode()


def decode_from_metadata(data: bytes, cluster_format: str, *, bookie_id: str) -> Cookie:
    """The cookie the cluster keeps for ``bookie_id``, as walkit's fields. CookieError
    when it cannot be read, or (BookKeeper) names index dirs apart from its ledger dirs:
    a Java bookie's, which walkit cannot be (it has no index dirs)."""
    if cluster_format != "bookkeeper":
        try:
            return Cookie.decode(data, path=f"metadata cookies/{bookie_id}")
        except WalkitError as exc:
            raise CookieError("unreadable cookie in metadata", bookie=bookie_id) from exc
    from walkit.metadata import BkCookie

    try:
        theirs = BkCookie.decode(data)
    except WalkitError as exc:
        raise CookieError("unreadable BookKeeper cookie in metadata", bookie=bookie_id) from exc
    if theirs.index_dirs is not None and theirs.index_dirs != theirs.ledger_dirs:
        raise CookieError("the cluster's cookie for this bookie id names index dirs apart from its ledger dirs: it "
                          "is a Java bookie's (walkit has no index dirs); give this bookie its own bookieId",
                          bookie=bookie_id, found=",".join(theirs.index_dirs))
    return Cookie(theirs.bookie_id, theirs.journal_dirs, tuple(_norm(d) for d in theirs.ledger_dirs),
                  theirs.instance_id)

