"""Reading journals back: replay at restart, torn tails, corruption and repair.

Theory of operation
-------------------
Replay starts at the LastLogMark and walks frame by frame through that journal file and
every later one, handing each record to a :class:`ReplayTarget`. It stops in a file at
the first position that is not a valid frame. What that position means:

* only zeros follow (and no later file has frames): the clean end of the journal;
* other bytes follow, but no valid flush start (an aligned frame flagged
  ``FLAG_FLUSH_START``) and no frame in a later file: a **torn tail** - the last flush
  did not reach the disk whole. Nothing in it was acknowledged (acks follow the
  fdatasync), so the file is truncated there, durably, and the tail is reported;
* in a recycled file (see ``_format``), a zero block: the terminator written after every
  batch, so the clean end of this life (the earlier life's bytes follow);
* valid data follows: **corruption** of bytes that were synced, and maybe acknowledged.
  Replay raises :class:`~walkit.errors.CorruptionError` and the bookie refuses to start;
  :func:`repair_journal` keeps a ``.broken`` copy and truncates at the bad frame, a
  decision an operator takes knowingly.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from bookie.fs import File, FileSystem
from bookie.journal._format import (
    ENTRY_PREFIX,
    FLAG_FLUSH_START,
    FRAME_HEADER,
    LAC_BODY,
    LEDGER_PREFIX,
    MAX_FRAME_BODY,
    MIN_ALIGNMENT,
    FrameType,
    JournalHeader,
    frame_seed,
    journal_name,
    parse_frame,
    parse_journal_name,
)
from bookie.journal._mark import LogMark
from bookie.journal._files import list_journals
from walkit.errors import CorruptionError, FormatError, FormatVersionError, InvalidArgumentError

__all__ = ["ReplayTarget", "ReplayReport", "TornTail", "replay", "repair_journal", "RepairResult", "scan_journal"]

log = logging.getLogger("bookie.journal")

_WINDOW = 8 << 20


class ReplayTarget(Protocol):
    def replay_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None: ...

    def replay_master_key(self, ledger_id: int, key: bytes) -> None: ...

    def replay_fence(self, ledger_id: int) -> None: ...

    def replay_lac(self, ledger_id: int, lac: int) -> None: ...


@dataclass(frozen=True)
class TornTail:
    journal_id: int
    offset: int
    dropped_bytes: int


@dataclass
class ReplayReport:
    files: list[int] = field(default_factory=list)
    records: int = 0
    entries: int = 0
    torn: list[TornTail] = field(default_factory=list)


@dataclass(frozen=True)
class _Stop:
    """Where a scan of one file stopped: ``offset`` of the first invalid frame."""

    offset: int
    size: int


class _Reader:
    """Windowed reads of one file (journals can be far larger than memory wants)."""

    def __init__(self, f: File) -> None:
        self.f = f
        self.size = f.size()
        self._start = 0
        self._data = memoryview(b"")

    def window(self, pos: int, need: int) -> tuple[memoryview, int]:
        """A view holding at least ``need`` bytes from ``pos`` (fewer at EOF) and the
        index of ``pos`` inside it."""
        end = self._start + len(self._data)
        if not (self._start <= pos and pos + need <= end):
            self._start = pos
            self._data = memoryview(self.f.pread(max(need, _WINDOW), pos))
        return self._data, pos - self._start


def _frames(r: _Reader, start: int, stop: list[_Stop], seed: int) -> Iterator[tuple[int, int, memoryview]]:
    """Valid frames from ``start``: (type, flags, body). Appends where it stopped."""
    pos = start
    hs = FRAME_HEADER.size
    while True:
        view, i = r.window(pos, hs)
        if len(view) - i < hs:
            break
        length = FRAME_HEADER.unpack_from(view, i)[4]
        if length > MAX_FRAME_BODY or pos + hs + length > r.size:
            break
        view, i = r.window(pos, hs + length)
        parsed = parse_frame(view, i, len(view), seed)
        if parsed is None:
            break
        ftype, flags, _ = parsed
        yield ftype, flags, view[i + hs : i + hs + length]
        pos += hs + length
    stop.append(_Stop(pos, r.size))


def _valid_flush_after(r: _Reader, pos: int, alignment: int, seed: int) -> int | None:
    """Offset of a valid flush start at an aligned offset beyond ``pos``, if any."""
    off = (pos // alignment + 1) * alignment
    hs = FRAME_HEADER.size
    while off + hs <= r.size:
        view, i = r.window(off, hs)
        if view[i + 5] & FLAG_FLUSH_START and view[i + 4]:
            length = FRAME_HEADER.unpack_from(view, i)[4]
            if length <= MAX_FRAME_BODY:
                view, i = r.window(off, hs + length)
                if parse_frame(view, i, len(view), seed) is not None:
                    return off
        off += alignment
    return None


def _all_zero(r: _Reader, pos: int, end: int | None = None) -> bool:
    """Whether bytes [pos, end) (default: to the end of the file) are all zero."""
    end = r.size if end is None else min(end, r.size)
    while pos < end:
        view, i = r.window(pos, 1)
        chunk = view[i : i + end - pos]
        if chunk.tobytes().strip(b"\x00"):
            return False
        pos += len(chunk)
    return True


def _open_journal(fs: FileSystem, directory: str, jid: int) -> tuple[File, JournalHeader | None]:
    path = f"{directory}/{journal_name(jid)}"
    f = fs.open(path)
    try:
        header: JournalHeader | None = JournalHeader.decode(f.pread(64, 0), path=path)
    except FormatVersionError:  # another walkit's journal: never replayed, never truncated as if torn
        f.close()
        raise
    except FormatError:
        header = None
    if header is not None and header.journal_id != jid:
        header = None  # renamed for recycling, header not rewritten yet: nothing of this id
    return f, header


def scan_journal(fs: FileSystem, directory: str, jid: int, start: int | None = None) -> tuple[list[tuple[int, int, bytes]], _Stop, int]:
    """All valid frames of one file (for tools and tests): (type, flags, body), the stop
    position, and the file's alignment (0 when the header is damaged)."""
    f, header = _open_journal(fs, directory, jid)
    try:
        if header is None:
            return [], _Stop(0, f.size()), 0
        stop: list[_Stop] = []
        r = _Reader(f)
        frames = [(t, fl, bytes(b)) for t, fl, b in _frames(r, start or header.alignment, stop, frame_seed(jid))]
        return frames, stop[0], header.alignment
    finally:
        f.close()


def _file_has_frames(fs: FileSystem, directory: str, jid: int) -> bool:
    f, header = _open_journal(fs, directory, jid)
    try:
        if header is None:
            return False
        stop: list[_Stop] = []
        return next(_frames(_Reader(f), header.alignment, stop, frame_seed(jid)), None) is not None
    finally:
        f.close()


def _apply(target: ReplayTarget, ftype: int, body: memoryview) -> bool:
    """Hand one record to the target; True for an entry."""
    if ftype == FrameType.ENTRY:
        ledger_id, entry_id = ENTRY_PREFIX.unpack_from(body)
        target.replay_entry(ledger_id, entry_id, bytes(body[ENTRY_PREFIX.size :]))
        return True
    if ftype == FrameType.MASTER_KEY:
        (ledger_id,) = LEDGER_PREFIX.unpack_from(body)
        target.replay_master_key(ledger_id, bytes(body[LEDGER_PREFIX.size :]))
    elif ftype == FrameType.FENCE:
        target.replay_fence(LEDGER_PREFIX.unpack_from(body)[0])
    elif ftype == FrameType.LAC:
        target.replay_lac(*LAC_BODY.unpack_from(body))
    return False


def replay(fs: FileSystem, directory: str, start: LogMark | None, target: ReplayTarget) -> ReplayReport:
    """Replay every journal record from ``start`` (None: from the first file)."""
    report = ReplayReport()
    if not fs.exists(directory):
        return report
    ids = [j for j in list_journals(fs, directory) if start is None or j >= start.journal_id]
    for n, jid in enumerate(ids):
        f, header = _open_journal(fs, directory, jid)
        try:
            report.files.append(jid)
            first = header.alignment if header else 0
            begin = start.offset if (start is not None and jid == start.journal_id and header) else first
            stop: list[_Stop] = []
            r = _Reader(f)
            if header is not None:
                for ftype, _, body in _frames(r, max(begin, first), stop, frame_seed(jid)):
                    if ftype != FrameType.PADDING:
                        report.records += 1
                        report.entries += _apply(target, ftype, body)
            end = stop[0] if stop else _Stop(0, r.size)
            later = header is not None and any(_file_has_frames(fs, directory, j) for j in ids[n + 1 :])
            _judge_end(f, r, jid, end, header, later, report)
        finally:
            f.close()
    return report


def _judge_end(f: File, r: _Reader, jid: int, end: _Stop, header: JournalHeader | None, later: bool, report: ReplayReport) -> None:
    """Decide what the first invalid position of a file means (module docstring)."""
    if header is None:
        _judge_headerless(f, r, jid, report)
        return
    if header.previous_id and _all_zero(r, end.offset, end.offset + header.alignment):
        return  # a recycled file's terminator: what follows is its earlier life
    follows = _valid_flush_after(r, end.offset, header.alignment, frame_seed(jid))
    if follows is not None or (later and not _all_zero(r, end.offset)):
        raise _corruption(f, jid, end.offset, follows)
    if not _all_zero(r, end.offset):
        _truncate_torn(f, jid, end, report)


def _judge_headerless(f: File, r: _Reader, jid: int, report: ReplayReport) -> None:
    """A file whose header is damaged or missing: data after it is corruption (it was
    synced after the header); otherwise it was torn at creation and holds nothing. The
    alignment is unknown, so flush starts are looked for at every multiple of the
    smallest one the format allows (every allowed alignment is a multiple of it)."""
    follows = _valid_flush_after(r, 0, MIN_ALIGNMENT, frame_seed(jid))
    if follows is not None:
        raise _corruption(f, jid, 0, follows)
    if not _all_zero(r, 0):
        _truncate_torn(f, jid, _Stop(0, r.size), report)


def _corruption(f: File, jid: int, offset: int, follows: int | None) -> CorruptionError:
    return CorruptionError(
        "journal is damaged before data that was synced after it; refusing to start "
        "(`walkit journal repair` keeps a .broken copy and truncates there)",
        path=f.path, journal=jid, offset=offset, valid_data_at=follows,
    )


def _truncate_torn(f: File, jid: int, end: _Stop, report: ReplayReport) -> None:
    tail = TornTail(jid, end.offset, end.size - end.offset)
    log.warning("journal %s: torn tail of %d bytes at offset %d truncated", f.path, tail.dropped_bytes, tail.offset)
    f.truncate(end.offset)
    f.sync()
    report.torn.append(tail)


@dataclass(frozen=True)
class RepairResult:
    path: str
    broken_copy: str
    truncated_at: int
    dropped_bytes: int


def repair_journal(fs: FileSystem, path: str) -> RepairResult:
    """Keep ``path + '.broken'`` and truncate ``path`` at its first invalid frame."""
    directory, _, name = path.rpartition("/")
    jid = parse_journal_name(name)
    if jid is None:
        raise InvalidArgumentError("not a journal file name (<id: 16 hex digits>.txn)", path=path)
    if not fs.exists(path):
        raise InvalidArgumentError("no such journal file", path=path)
    _, stop, _ = scan_journal(fs, directory, jid)  # first: a journal it refuses gets no .broken copy
    _copy(fs, path, path + ".broken")
    f = fs.open(path)
    try:
        f.truncate(stop.offset)
        f.sync()
    finally:
        f.close()
    fs.fsync_dir(directory)
    return RepairResult(path, path + ".broken", stop.offset, stop.size - stop.offset)


def _copy(fs: FileSystem, src: str, dst: str) -> None:
    s = fs.open(src)
    d = fs.open(dst, create=True)
    try:
        d.truncate(0)
        pos, size = 0, s.size()
        while pos < size:
            chunk = s.pread(min(_WINDOW, size - pos), pos)
            d.pwrite(chunk, pos)
            pos += len(chunk)
        d.sync()
    finally:
        s.close()
        d.close()
