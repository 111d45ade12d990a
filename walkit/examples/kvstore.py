"""A replicated key-value store on a walkit ``WriteAheadLog``: the example ``walkit demo`` runs.

Theory of operation
-------------------
The state is an in-memory ``dict[str, str]``. A change (set or delete) is encoded as one
log record and appended; only once the log has acknowledged it (durable on a quorum of
bookies) is it applied to the dict, and applied changes are in LSN order: the dict is
always exactly "every record up to ``last_lsn``", no more, no less.

Every ``snapshot_every`` applied changes the dict is copied together with the LSN of the
last change in it; a background thread serializes the copy, stores it as the log's
snapshot and truncates the segments the snapshot makes unnecessary, so the log (and a
recovery's replay) stays about ``snapshot_every`` changes long.

Opening a store makes this process the log's single writer (the previous writer is
fenced: its next append raises ``WriterFencedError``) and rebuilds the dict by
:func:`recover`: load the latest snapshot, replay the records after its LSN.

Record format (big-endian)::

    +--------+----------------+-----------+----------------------+
    | op: u8 | key length u16 | key UTF-8 | value UTF-8 (SET)    |
    +--------+----------------+-----------+----------------------+

    op 1 = SET (the value is the rest of the record), op 2 = DELETE (nothing follows)

Snapshot format: UTF-8 JSON ``{"format": "kvstore-snapshot 1", "lsn": "s/e/x",
"data": {key: value}}``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from types import TracebackType

from walkit import LSN, BookKeeper, LogReader, WriteAheadLog
from walkit.errors import InvalidArgumentError, UsageError, WalkitError

__all__ = ["Change", "KVStore", "Op", "Recovery", "decode_snapshot", "encode_snapshot", "recover"]

_HEADER = struct.Struct(">BH")
SNAPSHOT_FORMAT = "kvstore-snapshot 1"
_LAST_LSN_WAIT = 5.0  # seconds: see _Snapshotter._wait_acknowledged


class Op(enum.IntEnum):
    SET = 1
    DELETE = 2


@dataclasses.dataclass(frozen=True)
class Change:
    """One change of the store, as logged: ``Change(Op.SET, key, value)`` or
    ``Change(Op.DELETE, key)``."""

    op: Op
    key: str
    value: str | None = None

    def encode(self) -> bytes:
        key = self.key.encode()
        if len(key) > 0xFFFF:
            raise InvalidArgumentError("key longer than 65535 bytes", size=len(key))
        value = b"" if self.value is None else self.value.encode()
        return _HEADER.pack(self.op, len(key)) + key + value

    @classmethod
    def decode(cls, record: bytes) -> Change:
        if len(record) < _HEADER.size:
            raise InvalidArgumentError("not a kvstore record: too short", size=len(record))
        op, key_length = _HEADER.unpack_from(record)
        end = _HEADER.size + key_length
        if op not in (Op.SET, Op.DELETE) or end > len(record) or (op == Op.DELETE and end != len(record)):
            raise InvalidArgumentError("not a kvstore record", op=op, size=len(record))
        key = record[_HEADER.size:end].decode()
        return cls(Op(op), key, record[end:].decode() if op == Op.SET else None)

    def apply(self, data: dict[str, str]) -> None:
        if self.op == Op.SET:
            assert self.value is not None
            data[self.key] = self.value
        else:
            data.pop(self.key, None)


def encode_snapshot(data: dict[str, str], lsn: LSN) -> bytes:
    return json.dumps({"format": SNAPSHOT_FORMAT, "lsn": str(lsn), "data": data},
                      separators=(",", ":"), sort_keys=True).encode()


def decode_snapshot(blob: bytes) -> tuple[dict[str, str], LSN]:
    doc = json.loads(blob)
    if not isinstance(doc, dict) or doc.get("format") != SNAPSHOT_FORMAT:
        raise InvalidArgumentError("not a kvstore snapshot", format=repr(doc.get("format") if isinstance(doc, dict)
                                                                        else None))
    return dict(doc["data"]), LSN.parse(doc["lsn"])


@dataclasses.dataclass(frozen=True)
class Recovery:
    """How a store got its state: the snapshot it loaded (None: replayed from the
    start), its size, the records replayed after it, and how long it took."""

    snapshot_lsn: LSN | None
    snapshot_bytes: int
    replayed: int
    last_lsn: LSN | None
    seconds: float


def recover(log: WriteAheadLog | LogReader) -> tuple[dict[str, str], Recovery]:
    """The state the log holds: the latest snapshot plus every record after its LSN."""
    started = time.monotonic()
    data: dict[str, str] = {}
    snapshot = log.latest_snapshot()
    after: LSN | None = None
    size = 0
    if snapshot is not None:
        blob = snapshot.read()
        data, after = decode_snapshot(blob)
        size = len(blob)
        if after != snapshot.lsn:
            raise InvalidArgumentError("snapshot content and metadata disagree", content=str(after),
                                       metadata=str(snapshot.lsn))
    last = after
    replayed = 0
    for lsn, record in log.replay(after):
        Change.decode(record).apply(data)
        last, replayed = lsn, replayed + 1
    return data, Recovery(after, size, replayed, last, time.monotonic() - started)


class KVStore:
    """A key-value store whose every change goes through a write-ahead log first.

    :meth:`open` it (this process becomes the writer), change it with :meth:`set` and
    :meth:`delete` (or their ``_async`` forms, which pipeline), read with :meth:`get`
    and :meth:`items`, :meth:`close` it. Thread-safe."""

    def __init__(self, wal: WriteAheadLog, data: dict[str, str], recovery: Recovery, snapshot_every: int) -> None:
        if snapshot_every < 1:
            raise InvalidArgumentError("snapshot_every must be >= 1", snapshot_every=snapshot_every)
        self.wal = wal
        self.recovery = recovery
        self._data = data
        self._last_lsn = recovery.last_lsn
        self._snapshot_every = snapshot_every
        self._since_snapshot = 0
        self._lock = threading.RLock()  # re-entered when a change is acknowledged before its callback is set
        self._error: WalkitError | None = None
        self._tail: Future[LSN] | None = None  # the latest change submitted
        self._snapshotter = _Snapshotter(wal)

    @classmethod
    def open(cls, client_or_uri: BookKeeper | str, name: str, *, snapshot_every: int = 1000,
             namespace: str = "default", password: bytes = b"", roll_bytes: int | None = None) -> KVStore:
        """Take the store ``name`` over: fence its previous writer, recover its state."""
        wal = WriteAheadLog.open(client_or_uri, name, namespace=namespace, password=password, roll_bytes=roll_bytes)
        try:
            data, recovery = recover(wal)
            return cls(wal, data, recovery, snapshot_every)
        except BaseException:
            wal.close()
            raise

    # -- changes ------------------------------------------------------------------------------
    def set(self, key: str, value: str) -> LSN:
        """Set ``key``; the change's LSN once it is durable (and applied)."""
        return self.set_async(key, value).result()

    def delete(self, key: str) -> LSN:
        """Delete ``key`` (a no-op on the state if it is absent, but logged all the same)."""
        return self.delete_async(key).result()

    def set_async(self, key: str, value: str) -> Future[LSN]:
        return self.submit(Change(Op.SET, key, value))

    def delete_async(self, key: str) -> Future[LSN]:
        return self.submit(Change(Op.DELETE, key))

    def submit(self, change: Change) -> Future[LSN]:
        """Log ``change``; it is applied when the log acknowledges it, in LSN order."""
        record = change.encode()
        applied: Future[LSN] = Future()
        with self._lock:  # appends and their callbacks are set in one order: the log's
            if self._error is not None:
                raise self._error
            fut = self.wal.append_async(record)
            fut.add_done_callback(lambda done: self._acknowledged(change, done, applied))
            self._tail = applied
        return applied

    def _acknowledged(self, change: Change, done: Future[LSN], applied: Future[LSN]) -> None:
        """(The log's callback, in LSN order) apply an acknowledged change, then tell
        its caller: a change whose future is done is in :meth:`items`."""
        error = done.exception() if not done.cancelled() else UsageError("append cancelled")
        lsn = done.result() if error is None else None
        with self._lock:
            if lsn is not None:
                change.apply(self._data)
                self._last_lsn = lsn
                self._since_snapshot += 1
                if self._since_snapshot >= self._snapshot_every:
                    self._since_snapshot = 0
                    self._snapshotter.request(dict(self._data), lsn)
            elif self._error is None:
                self._error = error if isinstance(error, WalkitError) else WalkitError(repr(error))
        if lsn is not None:
            applied.set_result(lsn)
        else:
            applied.set_exception(error)

    # -- reads --------------------------------------------------------------------------------
    def get(self, key: str, default: str | None = None) -> str | None:
        with self._lock:
            return self._data.get(key, default)

    def items(self) -> dict[str, str]:
        """A copy of the whole state."""
        with self._lock:
            return dict(self._data)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def __iter__(self) -> Iterator[str]:
        return iter(self.items())

    @property
    def last_lsn(self) -> LSN | None:
        """The LSN of the last change in the state."""
        with self._lock:
            return self._last_lsn

    @property
    def snapshots_taken(self) -> int:
        return self._snapshotter.taken

    @property
    def snapshot_error(self) -> WalkitError | None:
        """Why the latest snapshot failed, if it did (the store goes on; the log grows)."""
        return self._snapshotter.error

    # -- snapshots and lifecycle ----------------------------------------------------------------
    def snapshot(self) -> LSN | None:
        """Snapshot the state now (after every pending change) and truncate; its LSN."""
        self._wait_applied()
        with self._lock:
            data, lsn = dict(self._data), self._last_lsn
        if lsn is not None:
            self._snapshotter.take(data, lsn)
        return lsn

    def flush(self) -> None:
        """Wait for every pending change and for the pending background snapshot."""
        self._wait_applied()
        self._snapshotter.wait()

    def _wait_applied(self) -> None:
        """Every change submitted so far is applied (or failed: then raise why)."""
        with self._lock:
            tail = self._tail
        if tail is not None:
            tail.exception()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Wait for pending changes and snapshot, then close the log (the store stays)."""
        try:
            if self._error is None:
                self.flush()
        finally:
            self._snapshotter.stop()
            self.wal.close()

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class _Snapshotter:
    """One background thread storing the latest requested snapshot (older requests
    that were not started yet are superseded), then truncating the log behind it."""

    def __init__(self, wal: WriteAheadLog) -> None:
        self._wal = wal
        self._cond = threading.Condition()
        self._job: tuple[dict[str, str], LSN] | None = None
        self._busy = False
        self._stopping = False
        self._take_lock = threading.Lock()
        self._latest: LSN | None = None
        self.taken = 0
        self.error: WalkitError | None = None
        self._thread = threading.Thread(target=self._run, name="kvstore-snapshot", daemon=True)
        self._thread.start()

    def request(self, data: dict[str, str], lsn: LSN) -> None:
        with self._cond:
            self._job = (data, lsn)
            self._cond.notify_all()

    def wait(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._job is None and not self._busy)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._job is not None or self._stopping)
                if self._job is None:
                    return
                job, self._job, self._busy = self._job, None, True
            try:
                self.take(*job)
            except WalkitError as exc:  # e.g. WriterFencedError: the store's next change reports it too
                self.error = exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def take(self, data: dict[str, str], lsn: LSN) -> None:
        with self._take_lock:
            if self._latest is not None and lsn <= self._latest:
                return
            self._wait_acknowledged(lsn)
            self._wal.snapshot(encode_snapshot(data, lsn), lsn)
            self._latest = lsn
            self.taken += 1
            self.error = None
            self._wal.truncate(lsn)

    def _wait_acknowledged(self, lsn: LSN) -> None:
        """``WriteAheadLog.snapshot`` refuses an LSN past ``wal.last_lsn``, and the log
        completes a record's future before it moves ``last_lsn`` (walkit/wal/_writer.py,
        ``_entry_done``): a snapshot taken the instant a change is acknowledged can be
        refused. The LSN is acknowledged, so ``last_lsn`` reaches it a moment later."""
        deadline = time.monotonic() + _LAST_LSN_WAIT
        while True:
            last = self._wal.last_lsn
            if (last is not None and last >= lsn) or time.monotonic() > deadline:
                return
            time.sleep(0.0005)
