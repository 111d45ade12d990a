"""API misuse (issue 7): each wrong call raises the documented WalkitError subclass
(walkit/errors.py), and nothing is lost or half-written: the ledger and the log used
around the misuse stay readable and writable, with exactly the entries added."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import walkit
from walkit import LSN, WriteAheadLog
from walkit.errors import (
    EntryTooLargeError,
    InvalidArgumentError,
    LedgerClosedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NoSuchLogError,
    UnauthorizedError,
    UsageError,
    WalkitError,
)
from walkit.testing import FaultyCluster

pytestmark = pytest.mark.timeout(180)

FAST = {"add_timeout": 2.0, "read_timeout": 2.0, "speculative_read_timeout": 0.2}
PASSWORD = b"right"


class World:
    """What the misuses are aimed at: a client, an open ledger, a closed one, a log."""

    def __init__(self, cluster: FaultyCluster) -> None:
        self.bk = cluster.client(**FAST)
        self.ledger = self.bk.create_ledger(3, 2, 2, password=PASSWORD)
        self.ledger.add_entry(b"first")
        closed = self.bk.create_ledger(3, 2, 2, password=PASSWORD)
        closed.add_entry(b"only")
        closed.close()
        self.closed = closed
        self.wal = WriteAheadLog.open(self.bk, "misuse", ensemble_size=3, write_quorum=2, ack_quorum=2)
        self.wal.append(b"record 0")
        self.uri = cluster.metadata_uri
        self.limit = self.bk.config.max_frame_size


def _closed_client(w: World) -> None:
    other = walkit.BookKeeper(w.uri)
    other.close()
    other.create_ledger()


def _closed_log(w: World) -> None:
    wal = WriteAheadLog.open(w.bk, "misuse-closed")
    wal.close()
    wal.append(b"late")


def _closed_reader(w: World) -> None:
    reader = WriteAheadLog.reader(w.bk, "misuse")
    reader.close()
    next(iter(reader.replay()))


MISUSES: list[tuple[str, Callable[[World], Any], type[WalkitError]]] = [
    ("quorums out of order", lambda w: w.bk.create_ledger(2, 3, 2), InvalidArgumentError),
    ("ack quorum of zero", lambda w: w.bk.create_ledger(3, 3, 0), InvalidArgumentError),
    ("quorum not an int", lambda w: w.bk.create_ledger("3", 3, 2), InvalidArgumentError),
    ("password not bytes", lambda w: w.bk.create_ledger(password="pw"), InvalidArgumentError),
    ("negative ledger id", lambda w: w.bk.open_ledger(-1, PASSWORD), InvalidArgumentError),
    ("unknown ledger: open", lambda w: w.bk.open_ledger(10**12, PASSWORD), NoSuchLedgerError),
    ("unknown ledger: delete", lambda w: w.bk.delete_ledger(10**12), NoSuchLedgerError),
    ("wrong password", lambda w: w.bk.open_ledger(w.ledger.ledger_id, b"wrong"), UnauthorizedError),
    ("wrong password, no recovery", lambda w: w.bk.open_ledger(w.ledger.ledger_id, b"wrong", recovery=False),
     UnauthorizedError),
    ("entry not bytes", lambda w: w.ledger.add_entry("text"), InvalidArgumentError),
    ("entry over the frame limit", lambda w: w.ledger.add_entry(bytes(w.limit)), EntryTooLargeError),
    ("add to a closed handle", lambda w: w.closed.add_entry(b"late"), LedgerClosedError),
    ("read with first > last", lambda w: list(w.ledger.read(1, 0)), InvalidArgumentError),
    ("read past the LAC", lambda w: list(w.ledger.read(0, 10**6)), NoSuchEntryError),
    ("closed client", _closed_client, UsageError),
    ("record not bytes", lambda w: w.wal.append(7), InvalidArgumentError),
    ("record over max_record_bytes", lambda w: w.wal.append(bytes((64 << 20) + 1)), InvalidArgumentError),
    ("append to a closed log", _closed_log, UsageError),
    ("read a closed reader", _closed_reader, UsageError),
    ("unknown log", lambda w: WriteAheadLog.reader(w.bk, "no-such-log"), NoSuchLogError),
    ("bad log name", lambda w: WriteAheadLog.open(w.bk, "a/b"), InvalidArgumentError),
    ("replay after a non-LSN", lambda w: list(w.wal.replay(after="1/0/0")), InvalidArgumentError),
    ("snapshot past the last record", lambda w: w.wal.snapshot(b"state", LSN(10**6, 0, 0)), InvalidArgumentError),
]


@pytest.mark.walkit_cluster(bookies=3)
def test_misuse_raises_the_documented_error_and_loses_nothing(walkit_cluster: FaultyCluster) -> None:
    w = World(walkit_cluster)
    added, appended = [b"first"], [b"record 0"]
    for name, misuse, expected in MISUSES:
        with pytest.raises(expected) as caught:
            misuse(w)
        assert type(caught.value) is expected, f"{name}: {type(caught.value).__name__}, not {expected.__name__}"
        assert type(WalkitError.from_code(caught.value.code)) is expected, f"{name}: its code names another class"
        added.append(f"after {name}".encode())
        w.ledger.add_entry(added[-1])  # still writable after each misuse
        appended.append(f"after {name}".encode())
        w.wal.append(appended[-1])
    assert [e.data for e in w.ledger.read(0, len(added) - 1)] == added
    w.ledger.close()
    reopened = w.bk.open_ledger(w.ledger.ledger_id, PASSWORD)
    assert [e.data for e in reopened.read(0, reopened.last_add_confirmed)] == added
    assert [e.data for e in w.bk.open_ledger(w.closed.ledger_id, PASSWORD).read(0, 0)] == [b"only"]
    w.wal.close()
    with WriteAheadLog.reader(w.bk, "misuse") as reader:
        assert [record for _, record in reader.replay()] == appended
