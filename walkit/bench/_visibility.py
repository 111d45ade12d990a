"""Tail visibility, as ``walkit bench read`` and ``walkit bench wal`` measure it: a writer
appends on one client; a reader on another client (in this process: one clock) follows
the log with ``tail()``; per record, the time from ``append`` returning (durable on a
quorum, E=3 Qw=3 Qa=2) to the tail handing the record over, counted once the reader is
open and following (its open is not the steady state measured)."""

from __future__ import annotations

import threading
import time
from typing import Any

from walkit.bench._common import latency_percentiles
from walkit.client import BookKeeper
from walkit.errors import UsageError
from walkit.wal import LSN, WriteAheadLog

__all__ = ["visibility", "CASE_SECONDS"]

CASE_SECONDS = 15.0  # the most a case takes: fewer samples at slow rates


class _Tail:
    """A reader on a client of its own following log ``name``: when each record came."""

    def __init__(self, bk: BookKeeper, name: str, after: LSN | None) -> None:
        self.seen: dict[bytes, int] = {}
        self._reader = WriteAheadLog.reader(bk, name)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(after,), name="bench-tail", daemon=True)
        self._thread.start()

    def _run(self, after: LSN | None) -> None:
        clock, seen = time.perf_counter_ns, self.seen
        try:
            for _lsn, record in self._reader.tail(after, poll_timeout=0.2):
                seen[record] = clock()
                if self._stop.is_set():
                    return
        except UsageError:  # closed under it: the case is over
            if not self._stop.is_set():
                raise

    def wait_for(self, record: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while record not in self.seen:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the tail did not see {record!r} within {timeout} s")
            time.sleep(0.0005)

    def close(self) -> None:
        self._stop.set()
        self._reader.close()
        self._thread.join(10)


def visibility(writer_bk: BookKeeper, reader_bk: BookKeeper, name: str, interval: float,
                samples: int, roll_records: int | None = None) -> dict[str, Any]:
    """Appends every ``interval`` s (0: back to back): from ``append`` returning to the tail
    handing the record over, per record; with ``roll_records``, the log rolls to a new
    segment every that many records (the tail learns of each from the log node's watch)."""
    count = min(samples, max(10, int(CASE_SECONDS / interval))) if interval else samples
    clock = time.perf_counter_ns
    roll_bytes = None if roll_records is None else roll_records * len(b"visible 0000")
    with WriteAheadLog.open(writer_bk, name, ensemble_size=3, write_quorum=3, ack_quorum=2,
                            roll_bytes=roll_bytes) as wal:
        start = wal.append(b"start")
        tail = _Tail(reader_bk, name, start)
        try:
            wal.append(b"warm-up")  # measured once the reader is open and following (not its open)
            tail.wait_for(b"warm-up", 30)
            returned: dict[bytes, int] = {}
            for i in range(count):
                record = b"visible %04d" % i
                wal.append(record)
                returned[record] = clock()
                if interval:
                    time.sleep(interval)
            tail.wait_for(b"visible %04d" % (count - 1), 30)
            segments = len(wal.metadata().segments)
        finally:
            tail.close()
    delays = [max(0, tail.seen[r] - t) for r, t in returned.items()]
    return {"interval_ms": round(interval * 1000, 1), "samples": count, "roll_records": roll_records,
            "segments": segments} | latency_percentiles(delays)
