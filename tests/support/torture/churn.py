"""Ledger churn in a torture run: scratch ledgers written, read back and deleted, so that
garbage collection has work to do while the checked workloads run under faults.

Theory of operation
-------------------
One thread on a client of its own creates a ledger (E = 3, Qw = 3, Qa = 2), adds
``ENTRIES`` entries of 1 KiB, closes it, reads it back whole and deletes it, again and
again. Its entries share the bookies' entry logs with the WAL's and the ledger
workload's, so once they are deleted those logs fall under the compaction thresholds
and the collector copies the *checked* workloads' live entries to new logs and removes
the old ones - while bookies are killed, partitioned, read-only, and ZooKeeper nodes
die. The checker of those workloads then judges compaction: a record it moved and lost
is a ``lost`` anomaly there.

Faults make churn operations fail; a failed ledger is left for the next round (deleted
when possible). Only one thing is an anomaly here: a read that returns other bytes than
were acknowledged.
"""

from __future__ import annotations

import random
import threading

import walkit
from support.torture.history import Anomaly
from walkit.errors import WalkitError

ENTRIES = 40
PAUSE = 0.05  # seconds between ledgers


class Churn:
    def __init__(self, uri: str, seed: int, options: dict[str, object]) -> None:
        self._uri, self._options = uri, options
        self._rng = random.Random(f"{seed}/churn")
        self._stop = threading.Event()
        self.deleted = 0
        self.failures = 0
        self.anomalies: list[Anomaly] = []
        self._thread = threading.Thread(target=self._run, name="torture-churn", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with walkit.BookKeeper(self._uri, **self._options) as bk:  # type: ignore[arg-type]
            leftovers: list[int] = []
            while not self._stop.wait(PAUSE):
                try:
                    self._one(bk, leftovers)
                except WalkitError:
                    self.failures += 1

    def _one(self, bk: walkit.BookKeeper, leftovers: list[int]) -> None:
        for ledger_id in list(leftovers):
            bk.delete_ledger(ledger_id)
            leftovers.remove(ledger_id)
            self.deleted += 1
        lh = bk.create_ledger(3, 3, 2, password=b"churn")
        leftovers.append(lh.ledger_id)
        written = [self._rng.randbytes(1024) for _ in range(ENTRIES)]
        for data in written:
            lh.add_entry(data)
        lh.close()
        read = [entry.data for entry in lh.read(0, ENTRIES - 1)]
        if read != written:
            bad = next(i for i, (a, b) in enumerate(zip(read, written)) if a != b) if len(read) == len(written) else -1
            self.anomalies.append(Anomaly("wrong", f"churn ledger {lh.ledger_id}: entry {bad} read back differs"))
        bk.delete_ledger(lh.ledger_id)
        leftovers.remove(lh.ledger_id)
        self.deleted += 1

    def stop(self) -> str:
        self._stop.set()
        self._thread.join(60)
        return f"churn: {self.deleted} scratch ledgers written, read back and deleted ({self.failures} rounds failed)"
