"""The history of a torture run and the checker that judges it (pure: no I/O, no walkit).

A run records what every writer sent (:meth:`History.sent`), what came back for it
(:meth:`History.acked` with its LSN, or :meth:`History.failed`), when each writer's
``open`` completed (:meth:`History.opened`), and every read: the records a tail or a
replay returned, in order (:meth:`History.read`). After the run, :func:`check` compares
that history with the *reference*: the log as a fresh reader replays it once every
fault is lifted and the last writer's segment is recovered.

What the checker reports (:class:`Anomaly` kinds; docs/reliability.md explains each):

``lost``                an acknowledged record is not in the reference log
``altered``             the reference holds other bytes at an acknowledged record's LSN
``lsn-reused``          two acknowledged records were given the same LSN
``ack-order``           a writer's acknowledgments are not in its send order (LSNs)
``ack-after-failover``  a writer got an acknowledgment after a newer writer's open completed,
                        or (ledgers) for an entry past the end its ledger was recovered at
``phantom``             a read returned bytes no writer ever sent
``duplicate``           a read returned one record twice
``read-order``          a read's LSNs do not strictly increase
``gap``                 a read returned an acknowledged record but skipped an earlier one
``divergence``          a read is not a prefix of the reference (a returned record went away,
                        changed, or moved: the log flip-flopped)
``missed``              a read that should have seen everything lacks an acknowledged record

Ledgers are recorded in the same shape (docs/reliability.md): ledger k is writer k and
its entry e the record at (k, e, 0). A recovery open that fenced a ledger is recorded
with :meth:`History.fenced`: the fenced writer may still see acknowledgments arrive for
entries the recovery found and kept (their bookies had them before the fence; the
answers were in flight), but never for an entry past the recovered end.

A failed append is an unknown outcome (as BookKeeper's LedgerFenced or a timeout): the
record may or may not be in the log, and either is fine, but once read it must stay.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable, Sequence

Lsn = tuple[int, int, int]  # (segment, entry, slot), ordered as walkit.LSN

__all__ = ["Lsn", "Append", "Read", "Anomaly", "History", "check", "late_acknowledgments"]


@dataclasses.dataclass
class Append:
    """One record a writer sent; ``lsn`` / ``acked_at`` once acknowledged, ``error`` once failed."""

    writer: int
    seq: int
    payload: bytes
    sent_at: float
    lsn: Lsn | None = None
    acked_at: float | None = None
    error: str | None = None


@dataclasses.dataclass
class Read:
    """What one tail or replay returned, in order. ``complete``: it ran once every
    acknowledged record was durable and readable, so it must hold all of them."""

    reader: str
    kind: str  # "tail", "replay" or "final"
    started_at: float
    records: list[tuple[Lsn, bytes]] = dataclasses.field(default_factory=list)
    complete: bool = False
    errors: list[str] = dataclasses.field(default_factory=list)

    def wait_for(self, count: int, timeout: float) -> bool:
        """Whether the read (a tail's, still running) holds ``count`` records within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while len(self.records) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(self.records) >= count


@dataclasses.dataclass(frozen=True)
class Anomaly:
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


class History:
    """Thread-safe recorder of one run (writers' callbacks and readers' threads call it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.appends: dict[tuple[int, int], Append] = {}
        self.opened_at: dict[int, float] = {}
        self.fences: list[tuple[int, float, Lsn]] = []  # (writer, when, last record kept)
        self.reads: list[Read] = []

    def opened(self, writer: int, at: float) -> None:
        with self._lock:
            self.opened_at[writer] = at

    def fenced(self, writer: int, at: float, last: Lsn) -> None:
        """A recovery open of ``writer``'s ledger returned at ``at``, the ledger closed
        with ``last`` as its last record (entry id -1 when empty)."""
        with self._lock:
            self.fences.append((writer, at, last))

    def sent(self, writer: int, seq: int, payload: bytes, at: float) -> None:
        with self._lock:
            self.appends[(writer, seq)] = Append(writer, seq, payload, at)

    def acked(self, writer: int, seq: int, lsn: Lsn, at: float) -> None:
        with self._lock:
            append = self.appends[(writer, seq)]
            append.lsn, append.acked_at = lsn, at

    def failed(self, writer: int, seq: int, error: str) -> None:
        with self._lock:
            self.appends[(writer, seq)].error = error

    def read(self, reader: str, kind: str, at: float) -> Read:
        """A new read; the reader appends to its ``records`` (only its own thread does)."""
        read = Read(reader, kind, at)
        with self._lock:
            self.reads.append(read)
        return read

    def acknowledged(self) -> list[Append]:
        with self._lock:
            return sorted((a for a in self.appends.values() if a.lsn is not None), key=lambda a: a.lsn or (0, 0, 0))

    def counts(self) -> dict[str, int]:
        with self._lock:
            appends = list(self.appends.values())
        return {"sent": len(appends), "acked": sum(a.lsn is not None for a in appends),
                "failed": sum(a.error is not None for a in appends),
                "unknown": sum(a.lsn is None and a.error is None for a in appends)}


def check(history: History, reference: Read) -> list[Anomaly]:
    """Every anomaly of ``history`` against the ``reference`` log (empty: the run is clean)."""
    acked = history.acknowledged()
    payloads = {a.payload for a in history.appends.values()}
    anomalies = [*_check_acks(acked, reference), *_check_failover(history)]
    for read in [reference, *history.reads]:
        anomalies += _check_read(read, acked, payloads, reference)
    return anomalies


def _check_acks(acked: Sequence[Append], reference: Read) -> Iterable[Anomaly]:
    at = {lsn: data for lsn, data in reference.records}
    seen: dict[Lsn, Append] = {}
    last_of_writer: dict[int, Append] = {}
    for a in sorted(acked, key=lambda a: (a.writer, a.seq)):
        assert a.lsn is not None
        if a.lsn in seen:
            yield Anomaly("lsn-reused", f"{_name(a)} and {_name(seen[a.lsn])} both acknowledged at {_lsn(a.lsn)}")
        seen[a.lsn] = a
        previous = last_of_writer.get(a.writer)
        if previous is not None and previous.lsn is not None and previous.lsn >= a.lsn:
            yield Anomaly("ack-order", f"{_name(a)} acknowledged at {_lsn(a.lsn)}, not after "
                                       f"{_name(previous)} at {_lsn(previous.lsn)}")
        last_of_writer[a.writer] = a
        if a.lsn not in at:
            yield Anomaly("lost", f"{_name(a)} acknowledged at {_lsn(a.lsn)} is not in the log "
                                  f"({len(reference.records)} records)")
        elif at[a.lsn] != a.payload:
            yield Anomaly("altered", f"{_name(a)} acknowledged at {_lsn(a.lsn)}: the log holds "
                                     f"{at[a.lsn][:24]!r} instead of {a.payload[:24]!r}")


def _check_failover(history: History) -> Iterable[Anomaly]:
    for a in history.appends.values():
        if a.acked_at is None:
            continue
        for newer, opened in history.opened_at.items():
            if newer > a.writer and a.acked_at > opened:
                yield Anomaly("ack-after-failover", f"{_name(a)} acknowledged at {_lsn(a.lsn)} "
                                                    f"{a.acked_at - opened:.3f} s after writer {newer} opened")
                break
    for a, late, last in _after_fences(history):
        if a.lsn is not None and a.lsn > last:
            yield Anomaly("ack-after-failover", f"{_name(a)} acknowledged at {_lsn(a.lsn)} {late:.3f} s "
                                                f"after a recovery closed its ledger at {_lsn(last)}")


def late_acknowledgments(history: History) -> list[Append]:
    """Acknowledgments that came after a recovery open of their ledger returned, for
    records inside the recovered ledger: allowed (the entry was on Qa bookies before the
    fence, only the answers were late), and counted in the report."""
    return [a for a, _, last in _after_fences(history) if a.lsn is not None and a.lsn <= last]


def _after_fences(history: History) -> Iterable[tuple[Append, float, Lsn]]:
    """Each acknowledgment that came after the first recovery open of its writer's
    ledger returned, with how long after (seconds) and the recovered last record."""
    first: dict[int, tuple[float, Lsn]] = {}
    for writer, at, last in history.fences:
        if writer not in first or at < first[writer][0]:
            first[writer] = (at, last)
    for a in history.appends.values():
        fence = first.get(a.writer)
        if fence is not None and a.acked_at is not None and a.acked_at > fence[0]:
            yield a, a.acked_at - fence[0], fence[1]


def _check_read(read: Read, acked: Sequence[Append], payloads: set[bytes], reference: Read) -> Iterable[Anomaly]:
    where = f"{read.kind} read by {read.reader}"
    yield from _check_sequence(read, where, payloads)
    yield from _check_gaps(read, where, acked)
    if read is reference:
        return  # what it lacks is "lost"
    yield from _check_prefix(read, where, reference)
    if read.complete:
        returned = {lsn for lsn, _ in read.records}
        missing = [a for a in acked if a.lsn not in returned]
        if missing:
            yield Anomaly("missed", f"{where} lacks {len(missing)} acknowledged records, the first "
                                    f"{_name(missing[0])} at {_lsn(missing[0].lsn)}")


def _check_sequence(read: Read, where: str, payloads: set[bytes]) -> Iterable[Anomaly]:
    seen: set[bytes] = set()
    previous: Lsn | None = None
    for i, (lsn, data) in enumerate(read.records):
        if data not in payloads:
            yield Anomaly("phantom", f"{where}: record {i} at {_lsn(lsn)} was never sent: {data[:24]!r}")
        if data in seen:
            yield Anomaly("duplicate", f"{where}: record {i} at {_lsn(lsn)} returned twice: {data[:24]!r}")
        seen.add(data)
        if previous is not None and lsn <= previous:
            yield Anomaly("read-order", f"{where}: record {i} at {_lsn(lsn)} after {_lsn(previous)}")
        previous = lsn


def _check_gaps(read: Read, where: str, acked: Sequence[Append]) -> Iterable[Anomaly]:
    """An acknowledged record read means every acknowledged record before it was read."""
    returned = {lsn for lsn, _ in read.records}
    last_acked_read = max((a.lsn for a in acked if a.lsn in returned), default=None)
    if last_acked_read is None:
        return
    skipped = [a for a in acked if a.lsn is not None and a.lsn < last_acked_read and a.lsn not in returned]
    if skipped:
        yield Anomaly("gap", f"{where}: returned {_lsn(last_acked_read)} but skipped {len(skipped)} acknowledged "
                             f"records, the first {_name(skipped[0])} at {_lsn(skipped[0].lsn)}")


def _check_prefix(read: Read, where: str, reference: Read) -> Iterable[Anomaly]:
    for i, (lsn, data) in enumerate(read.records):
        if i >= len(reference.records):
            yield Anomaly("divergence", f"{where}: record {i} at {_lsn(lsn)} is past the end of the log "
                                        f"({len(reference.records)} records)")
            return
        ref_lsn, ref_data = reference.records[i]
        if (lsn, data) != (ref_lsn, ref_data):
            yield Anomaly("divergence", f"{where}: record {i} is {_lsn(lsn)} {data[:24]!r}, the log has "
                                        f"{_lsn(ref_lsn)} {ref_data[:24]!r}")
            return


def _name(a: Append) -> str:
    return f"writer {a.writer} record {a.seq}"


def _lsn(lsn: Lsn | None) -> str:
    return "-" if lsn is None else "/".join(map(str, lsn))
