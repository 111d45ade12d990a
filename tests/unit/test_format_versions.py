"""Bytes of a format version this walkit does not read: refused, never taken for damage.

A newer walkit's disks or metadata after a downgrade look like this: magic and checksum
intact, a version this code has no decoder for. One driver, many bumpers: a bookie
writes its disks (journal, lastMark, entry log, usage file, index file, cookies) and
stops; a bumper rewrites one file as version 2 with its magic and checksum intact. The
next start must stop with ``FormatVersionError`` naming the file, the version found and
the versions read (``... version 2 is not one this walkit reads (reads: 1)``), and change
nothing on disk: no torn tail truncated, no usage file rebuilt, no log removed. With
the file put back, the same disks start and serve every entry.

Then the same refusal for record batches and ledger metadata, and the rule of WAL log
metadata: keys it does not know survive a read-modify-write, a newer format is read but
never written (docs/format.md, "Format versions").
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c

import walkit
from bookie import Bookie, BookieConfig
from bookie.fs.real import RealFS
from bookie.journal import highest_mark, journal_name, list_journals
from support.metadata import StoreSpec, open_store
from walkit.errors import FormatError, FormatVersionError
from walkit.metadata import LedgerManager, LedgerMetadata, init_cluster
from walkit.protocol import encode_entry
from walkit.wal import LogMetadata, LogSettings, Segment, WriteAheadLog, delete_log
from walkit.wal._format import pack_records, unpack_records

KEY = b"format-versions-master-key-00000"
ENTRIES = 4
TIMEOUT = 20.0


def entry(entry_id: int) -> bytes:
    body = b"entry %d" % entry_id
    return encode_entry(1, entry_id, entry_id - 1, len(body), body)


# --- the bookie's disks ------------------------------------------------------------------------
@dataclass
class Disks:
    root: Path

    @property
    def journal_dir(self) -> Path:
        return self.root / "journal"

    @property
    def ledger_dir(self) -> Path:
        return self.root / "ledgers"

    def config(self) -> BookieConfig:
        return BookieConfig(bookie_id="format-versions:3181", journal_directory=str(self.journal_dir),
                            ledger_directories=[str(self.ledger_dir)], journal_pre_alloc_size_mb=1,
                            journal_max_group_wait_msec=1.0, journal_flush_when_queue_empty=True,
                            flush_interval=3_600_000)

    def files(self) -> dict[str, bytes]:
        return {str(p.relative_to(self.root)): p.read_bytes() for p in sorted(self.root.rglob("*")) if p.is_file()}


@pytest.fixture
def disks(tmp_path: Path) -> Disks:
    """Disks a bookie wrote: entries before and after a checkpoint (journal, lastMark,
    a sealed entry log with its usage file, the ledger's index file, cookies)."""
    d = Disks(tmp_path)
    b = Bookie(d.config(), fs=RealFS())
    b.start()
    try:
        for e in range(ENTRIES):
            assert b.add_entry(1, e, KEY, entry(e)).result(TIMEOUT) is None
            if e == 1:
                b.checkpoint()
    finally:
        b.shutdown()
    return d


def with_version(raw: bytes, base: int, crc_end: int | None, version: int = 2) -> bytes:
    """``raw`` with the u16 version at ``base + 8`` set, and the CRC32C of
    ``raw[base : base + crc_end]`` stored after it again (None: not covered by one)."""
    out = bytearray(raw)
    struct.pack_into("<H", out, base + 8, version)
    if crc_end is not None:
        struct.pack_into("<I", out, base + crc_end, crc32c(bytes(out[base:base + crc_end])))
    return bytes(out)


def _journal(d: Disks) -> Path:
    return d.journal_dir / journal_name(list_journals(RealFS(), str(d.journal_dir))[-1])


def _log(d: Disks) -> Path:
    return d.ledger_dir / "current/logs/0000000000000001.log"


def _index(d: Disks) -> Path:
    return d.ledger_dir / "current/index/01/0000000000000001.idx"


def _valid_copy(raw: bytes) -> int:
    """Offset of an index header copy that holds a header (copy 0 may be zeros)."""
    return 0 if raw[:8] == b"WKLEDIDX" else 512


def _bump(path: Callable[[Disks], Path], crc: Callable[[bytes], int | None],
          base: Callable[[bytes], int] = lambda raw: 0) -> Callable[[Disks], Path]:
    def bump(d: Disks) -> Path:
        p = path(d)
        raw = p.read_bytes()
        at = base(raw)
        p.write_bytes(with_version(raw, at, crc(raw)))
        return p

    return bump


def _bump_log_without_usage(d: Disks) -> Path:
    """The log a newer walkit was writing at a crash (no usage file): rebuilt by reading
    it, were it read - the path on which a torn tail is truncated from the usage."""
    (d.ledger_dir / "current/logs/0000000000000001.use").unlink()
    return _bump(_log, lambda raw: 20)(d)


@dataclass(frozen=True)
class Case:
    name: str
    what: str  # how the error names the format
    bump: Callable[[Disks], Path]


CASES = [
    Case("journal", "journal", _bump(_journal, lambda raw: 32)),
    Case("lastMark", "lastMark", _bump(lambda d: d.ledger_dir / "lastMark", lambda raw: 32)),
    Case("entry log", "entry log", _bump(_log, lambda raw: 20)),
    Case("entry log without usage file", "entry log", _bump_log_without_usage),
    Case("usage file", "entry-log usage file",
         _bump(lambda d: d.ledger_dir / "current/logs/0000000000000001.use", lambda raw: len(raw) - 4)),
    Case("index file", "index file", _bump(_index, lambda raw: 108, _valid_copy)),
    Case("cookie", "cookie", _bump(lambda d: d.ledger_dir / "COOKIE", lambda raw: None)),  # its CRC covers the body
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_newer_file_stops_the_bookie_and_is_left_as_it_is(disks: Disks, case: Case) -> None:
    original = disks.files()
    path = case.bump(disks)
    bumped = disks.files()
    with pytest.raises(FormatVersionError) as info:
        Bookie(disks.config(), fs=RealFS()).start()
    err = info.value
    assert f"{case.what} version 2 is not one this walkit reads (reads: 1)" in str(err), str(err)
    assert str(path) in str(err), f"the error does not name {path}: {err}"
    assert (err.version, err.known) == (2, (1,)) and isinstance(err, FormatError)
    assert disks.files() == bumped, "refusing the file changed the disks"

    for name, raw in original.items():  # put the file back: nothing was lost
        (disks.root / name).write_bytes(raw)
    b = Bookie(disks.config(), fs=RealFS())
    b.start()
    try:
        assert [b.read_entry(1, e) for e in range(ENTRIES)] == [entry(e) for e in range(ENTRIES)]
    finally:
        b.shutdown()


def test_a_version_bump_without_its_checksum_is_damage_not_a_newer_file(disks: Disks) -> None:
    """The version is told from damage by the checksum: a flipped version byte is a
    damaged lastMark (skipped: an older mark or more replay covers it), not a refusal."""
    mark = disks.ledger_dir / "lastMark"
    raw = mark.read_bytes()
    mark.write_bytes(with_version(raw, 0, None))
    assert highest_mark(RealFS(), [str(disks.ledger_dir)]) is None


# --- record batches ----------------------------------------------------------------------------
def test_a_record_batch_of_a_newer_version_is_refused() -> None:
    raw = bytearray(pack_records([b"one", b"two"]))
    raw[4] = 3
    with pytest.raises(FormatVersionError, match=r"record batch version 3 is not one this walkit reads \(reads: 1, 2\)"):
        unpack_records(bytes(raw))


# --- ledger metadata: strict, a newer version neither read nor written -----------------------------
@pytest.fixture
def manager(tmp_path: Path) -> Iterator[LedgerManager]:
    store = open_store(StoreSpec("local", str(tmp_path / "md")))
    try:
        yield LedgerManager(store, init_cluster(store, "/ledgers", "hierarchical"))
    finally:
        store.close()


def _ledger(ledger_id: int) -> LedgerMetadata:
    return LedgerMetadata.create(ledger_id, ("b1:3181", "b2:3181"), write_quorum=2, ack_quorum=2, password=b"pw",
                                 ctime=1_700_000_000_000)


def _reframe(data: bytes, *, version: int = 1, body: dict[str, Any] | None = None) -> bytes:
    """A ledger metadata value with another version or body, its length and CRC intact."""
    text = data[14:-4] if body is None else json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    head = b"WKLEDGER" + struct.pack("<HI", version, len(text)) + text
    return head + struct.pack("<I", crc32c(head))


def test_ledger_metadata_of_a_newer_version_is_neither_read_nor_written(manager: LedgerManager) -> None:
    manager.create(_ledger(5))
    newer = _reframe(manager.read(5)[0].encode(), version=3)
    manager._store.set(manager.path(5), newer)  # noqa: SLF001 - a newer walkit's write
    attempts: list[Callable[[], object]] = [lambda: manager.read(5),
                                            lambda: manager.update(5, lambda m: m.closed(-1, 0))]
    for attempt in attempts:
        with pytest.raises(FormatVersionError) as info:
            attempt()
        assert "ledger metadata version 3 is not one this walkit reads (reads: 1, 2)" in str(info.value)
        assert info.value.context["ledger"] == 5 and info.value.version == 3
    assert manager._store.get(manager.path(5))[0] == newer  # noqa: SLF001


def test_ledger_metadata_with_a_key_it_does_not_know_is_refused_not_dropped(manager: LedgerManager) -> None:
    """Version 1 has exactly its keys: a new key comes with a new version (above), so a
    value with one is refused whole - never read, changed and written back without it."""
    manager.create(_ledger(6))
    raw = manager.read(6)[0].encode()
    extra = _reframe(raw, body={**json.loads(raw[14:-4]), "added_later": 1})
    manager._store.set(manager.path(6), extra)  # noqa: SLF001
    with pytest.raises(FormatError, match="extra=added_later"):
        manager.update(6, lambda m: m.closed(-1, 0))
    assert manager._store.get(manager.path(6))[0] == extra  # noqa: SLF001


# --- WAL log metadata: unknown keys kept, a newer format read but never written ---------------------
_SETTINGS = LogSettings(ensemble_size=3, write_quorum=2, ack_quorum=2)
_META = LogMetadata(epoch=3, segments=(Segment(1, 17),), snapshots=(), truncated=None, settings=_SETTINGS)


def _node(meta: LogMetadata, **changes: Any) -> bytes:
    body = json.loads(meta.encode())
    settings = changes.pop("settings", {})
    body.update(changes)
    body["settings"].update(settings)
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def test_log_metadata_keeps_keys_it_does_not_know_through_a_read_modify_write() -> None:
    raw = _node(_META, retention={"days": 7}, settings={"digest": "mac"})
    meta = LogMetadata.decode(raw, "/ledgers/logs/default/orders")
    assert (meta.epoch, meta.settings, meta.format_version) == (3, _SETTINGS, 1)
    changed = dataclasses.replace(meta, epoch=4, segments=(*meta.segments, Segment(2, 23)))
    body = json.loads(changed.encode())
    assert body["retention"] == {"days": 7} and body["settings"]["digest"] == "mac"
    assert (body["epoch"], body["segments"]) == (4, [[1, 17], [2, 23]])
    assert changed.encode() == _node(dataclasses.replace(_META, epoch=4, segments=changed.segments),
                                     retention={"days": 7}, settings={"digest": "mac"})
    assert LogMetadata.decode(meta.encode(), "x") == meta  # unchanged: the same bytes


def test_log_metadata_of_a_newer_format_is_read_but_never_written() -> None:
    path = "/ledgers/logs/default/orders"
    meta = LogMetadata.decode(_node(_META, format=2, retention=1), path)
    assert (meta.format_version, meta.segments, meta.unknown) == (2, _META.segments, {"retention": 1})
    with pytest.raises(FormatVersionError) as info:
        dataclasses.replace(meta, epoch=4).encode()
    assert "log metadata format version 2 is newer than this walkit writes (writes: 1)" in str(info.value)
    assert f"path={path}" in str(info.value) and info.value.version == 2
    for bad in (0, -1, "2", None, 1.5):
        with pytest.raises(FormatError, match="log metadata"):
            LogMetadata.decode(_node(_META, format=bad), path)


@pytest.fixture
def bk(tmp_path: Path) -> Iterator[walkit.BookKeeper]:
    with walkit.LocalCluster(tmp_path / "cluster", bookies=3, session_timeout=2.0) as cluster:
        client = cluster.client()
        try:
            yield client
        finally:
            client.close()


def _log_node(bk: walkit.BookKeeper, name: str) -> str:
    return f"{bk.client.cluster.info.root}/logs/default/{name}"  # noqa: SLF001


def test_a_log_a_newer_walkit_changed_is_replayed_but_not_taken_over(bk: walkit.BookKeeper) -> None:
    with WriteAheadLog.open(bk, "orders") as wal:
        wal.append(b"before")
    store, path = bk.client.cluster.store, _log_node(bk, "orders")  # noqa: SLF001
    data, _ = store.get(path)
    kept = _node(LogMetadata.decode(data, path), retention={"days": 7})
    store.set(path, kept)
    with WriteAheadLog.open(bk, "orders") as wal:  # same format, a key it does not know: kept
        wal.append(b"after")
    data, _ = store.get(path)
    assert json.loads(data)["retention"] == {"days": 7} and json.loads(data)["epoch"] == 2

    newer = _node(LogMetadata.decode(data, path), format=2)
    store.set(path, newer)
    with WriteAheadLog.reader(bk, "orders") as reader:
        assert [record for _, record in reader.replay()] == [b"before", b"after"]
    with pytest.raises(FormatVersionError, match="log metadata format version 2 is newer than this walkit writes"):
        WriteAheadLog.open(bk, "orders")
    with pytest.raises(FormatVersionError):
        delete_log(bk, "default", "orders")
    assert store.get(path)[0] == newer
