"""The raw-ledger workload of a torture run: ledgers written, fenced, recovered and
followed through the ledger API (``walkit.BookKeeper``), on the same cluster and under
the same faults as the WAL workload, recorded as a second
:class:`~support.torture.history.History` and judged by :func:`support.torture.history.check`.

Theory of operation
-------------------
The history's shape is reused: the ledger created k-th (k = 1, 2, ...) is "writer k",
its adds are numbered 1, 2, ... and entry ``e`` of it is the record at LSN ``(k, e, 0)``,
so the log of the run is every ledger's entries in creation order.

Three threads, each on a client of its own:

``writer``     creates ledgers (E = 3, Qw = 3, Qa = 2) one after another and adds unique
               entries with ``WINDOW`` futures in flight, at most ``RATE`` a second.
               A ledger ends when an add fails (LedgerFencedError after a failover, too
               few bookies, timeouts; the handle is then closed if it can be, else left
               open for recovery) or after its planned lifetime of 0.5 to 4 s (closed
               normally). Every future of a ledger completes before the next ledger is
               created: a future that never completes is the ``hung`` anomaly.
``recoverer``  the failover: every 1 to 3 s, and at once when the plan's ``failover``
               fault fires, it opens the writer's current ledger with ``recovery=True``
               (fencing the writer), and recovers any older ledger the writer left open.
               Each recovery open that returned is recorded with
               :meth:`History.fenced` (its time and the recovered last entry).
``follower``   reads the ledgers in creation order with ``open_ledger(recovery=False)``
               and ``follow``: one read across all of them, resuming after its last
               entry when a read fails, moving on once a ledger is closed and read to
               its end.

After the faults (:meth:`LedgerWorkload.finish`, :meth:`LedgerWorkload.judge`): the
writer closes its ledger, every ledger is opened with recovery and read whole in
creation order (the reference), the follower must catch up with it, and a second fresh
client reads every ledger again without recovery.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import random
import threading
import time
from concurrent.futures import Future
from typing import Any

import walkit
from support.torture.history import Anomaly, History, Read, check, late_acknowledgments
from walkit.errors import UsageError, WalkitError

ENSEMBLE, QW, QA = 3, 3, 2
WINDOW = 4  # adds in flight
RATE = 200.0  # adds a second at most: the ledger workload stays cheap next to the WAL's
LIFETIME = (0.5, 4.0)  # seconds a ledger is written before a normal close
FAILOVER_EVERY = (1.0, 3.0)  # seconds between the recoverer's failovers
COMPLETION_TIMEOUT = 60.0  # seconds for every future of a ledger to complete


def ledger_payload(seed: int, ledger: int, seq: int) -> bytes:
    """Add ``seq`` to the ``ledger``-th ledger of run ``seed``: unique, 1 to 512 bytes of noise."""
    rng = random.Random(f"{seed}/ledger/{ledger}/{seq}")
    return f"L{ledger}e{seq}:".encode() + rng.randbytes(rng.randint(1, 512))


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


class Ledgers:
    """The ledgers the writer created, in creation order (shared by the three threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ids: list[int] = []  # ids[k - 1] is ledger number k
        self.current = 0  # the number of the ledger the writer is adding to (0: none)
        self.closed: set[int] = set()  # numbers known closed (by the writer or a recovery)

    def add(self, ledger_id: int) -> int:
        with self._lock:
            self.ids.append(ledger_id)
            self.current = len(self.ids)
            return self.current

    def id_of(self, number: int) -> int | None:
        with self._lock:
            return self.ids[number - 1] if number <= len(self.ids) else None

    def done_with(self, number: int, closed: bool) -> None:
        with self._lock:
            if self.current == number:
                self.current = 0
            if closed:
                self.closed.add(number)

    def to_recover(self) -> tuple[int, list[tuple[int, int]]]:
        """The current ledger's number, and (number, id) of every ledger not known closed."""
        with self._lock:
            return self.current, [(k, lid) for k, lid in enumerate(self.ids, 1) if k not in self.closed]

    def mark_closed(self, number: int) -> None:
        with self._lock:
            self.closed.add(number)


class Writer:
    """Creates ledgers one after another and adds entries to each."""

    def __init__(self, uri: str, seed: int, history: History, ledgers: Ledgers, options: dict[str, Any],
                 notes: list[str]) -> None:
        self._seed, self._history, self._ledgers, self._notes = seed, history, ledgers, notes
        self._rng = random.Random(f"{seed}/ledger-writer")
        self._stop = threading.Event()
        self.bk = walkit.BookKeeper(uri, **options)
        self._thread = threading.Thread(target=self._run, name="torture-ledger-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                handle = self.bk.create_ledger(ENSEMBLE, QW, QA)
            except UsageError:
                return  # the client is closed
            except WalkitError as exc:
                self._notes.append(f"ledger writer could not create a ledger: {_error(exc)}")
                self._stop.wait(0.5)
                continue
            number = self._ledgers.add(handle.ledger_id)
            closed = self._write(handle, number)
            self._ledgers.done_with(number, closed)

    def _write(self, handle: walkit.LedgerHandle, number: int) -> bool:
        """Add entries until the ledger fails, its lifetime ends or the run stops; wait
        for every future; close the handle. True if this writer closed the ledger."""
        history, window, failed = self._history, threading.BoundedSemaphore(WINDOW), threading.Event()
        futures: list[Future[int]] = []

        def done(seq: int, fut: Future[int]) -> None:
            at = time.monotonic()  # on the client's loop thread: record and release only
            error = fut.exception()
            if error is None:
                history.acked(number, seq, (number, fut.result(), 0), at)
            else:
                history.failed(number, seq, _error(error))
                failed.set()
            window.release()

        deadline = time.monotonic() + self._rng.uniform(*LIFETIME)
        next_at, seq = time.monotonic(), 0
        while not self._stop.is_set() and not failed.is_set() and time.monotonic() < deadline:
            if not window.acquire(timeout=0.1):
                continue
            next_at = max(next_at + 1 / RATE, time.monotonic())
            time.sleep(max(0.0, next_at - time.monotonic()))
            seq += 1
            data = ledger_payload(self._seed, number, seq)
            history.sent(number, seq, data, time.monotonic())
            try:
                fut = handle.add_entry_async(data)
            except WalkitError as exc:
                history.failed(number, seq, _error(exc))
                window.release()
                break
            futures.append(fut)
            fut.add_done_callback(functools.partial(done, seq))
        _, hanging = concurrent.futures.wait(futures, timeout=COMPLETION_TIMEOUT)
        if hanging:
            self._notes.append(f"ledger {number}: {len(hanging)} adds not completed after {COMPLETION_TIMEOUT:g} s")
        try:
            handle.close()  # after a failure: closed at the LAC, unless it was fenced
        except WalkitError as exc:
            if not failed.is_set():
                self._notes.append(f"ledger {number} (id {handle.ledger_id}): close failed: {_error(exc)}")
            return False
        return True

    def stop(self) -> None:
        """Stop adding, wait for the last ledger's futures and its close."""
        self._stop.set()
        self._thread.join(COMPLETION_TIMEOUT + 30)

    def close(self) -> None:
        self._stop.set()
        self.bk.close()


class Recoverer:
    """The failover: recovery opens of the writer's ledger, periodic and on demand."""

    def __init__(self, uri: str, seed: int, history: History, ledgers: Ledgers, options: dict[str, Any],
                 notes: list[str]) -> None:
        self._history, self._ledgers, self._notes = history, ledgers, notes
        self._rng = random.Random(f"{seed}/ledger-recoverer")
        self._stop = threading.Event()
        self._now = threading.Event()
        self.failovers = 0
        self.bk = walkit.BookKeeper(uri, **options)
        self._thread = threading.Thread(target=self._run, name="torture-ledger-recoverer", daemon=True)
        self._thread.start()

    def trigger(self) -> None:
        """Fail over now (the plan's ``failover`` fault)."""
        self._now.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._now.wait(self._rng.uniform(*FAILOVER_EVERY))
            self._now.clear()
            if self._stop.is_set():
                return
            current, open_ledgers = self._ledgers.to_recover()
            for number, ledger_id in open_ledgers:  # the writer's, and any it left open
                if self._stop.is_set():
                    return
                handle = recover(self.bk, self._history, number, ledger_id, self._notes, "failover")
                if handle is not None:
                    handle.close()
                    self._ledgers.mark_closed(number)
                    self.failovers += number == current

    def stop(self) -> None:
        self._stop.set()
        self._now.set()
        self._thread.join(60)

    def close(self) -> None:
        self.stop()
        self.bk.close()


def recover(bk: walkit.BookKeeper, history: History, number: int, ledger_id: int, notes: list[str],
            why: str) -> walkit.ReadHandle | None:
    """Open ledger ``number`` with recovery (fencing its writer) and record the fence;
    None (with a note) when the open failed."""
    try:
        handle = bk.open_ledger(ledger_id, recovery=True)
    except WalkitError as exc:
        notes.append(f"{why} of ledger {number} failed: {_error(exc)}")
        return None
    history.fenced(number, time.monotonic(), (number, handle.last_add_confirmed, 0))
    return handle


class Follower:
    """Reads every ledger in creation order as its entries become readable."""

    def __init__(self, uri: str, history: History, ledgers: Ledgers, options: dict[str, Any]) -> None:
        self._ledgers = ledgers
        self._stop = threading.Event()
        self._handle: walkit.ReadHandle | None = None
        self._handle_lock = threading.Lock()
        self.bk = walkit.BookKeeper(uri, **options)
        self.read = history.read("ledger follower", "tail", time.monotonic())
        self._thread = threading.Thread(target=self._run, name="torture-ledger-follower", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        number, next_entry = 1, 0
        while not self._stop.is_set():
            ledger_id = self._ledgers.id_of(number)
            if ledger_id is None:
                self._stop.wait(0.1)
                continue
            try:
                handle = self.bk.open_ledger(ledger_id, recovery=False)
                with self._handle_lock:
                    self._handle = handle
                if self._stop.is_set():
                    return
                for entry in handle.follow(next_entry, poll_timeout=0.5):
                    self.read.records.append(((number, entry.entry_id, 0), entry.data))
                    next_entry = entry.entry_id + 1
                number, next_entry = number + 1, 0  # closed and read to its end
            except WalkitError as exc:
                if self._stop.is_set():
                    return
                self.read.errors.append(_error(exc))
                self._stop.wait(0.2)

    def catch_up(self, count: int, timeout: float) -> bool:
        return self.read.wait_for(count, timeout)

    def close(self) -> None:
        self._stop.set()
        with self._handle_lock:
            if self._handle is not None:
                self._handle.close()  # its follow raises at its next step
        self._thread.join(30)
        self.bk.close()


def read_all(bk: walkit.BookKeeper, history: History, ledgers: list[int], read: Read, notes: list[str], *,
             recovery: bool, attempts: int = 10) -> None:
    """Every ledger of ``ledgers`` whole, in order, into ``read`` (with ``recovery``: each
    opened with recovery first, and the fence recorded); an error after ``attempts``
    tries of one ledger ends the read (what came before stands)."""
    for number, ledger_id in enumerate(ledgers, 1):
        for attempt in range(attempts):
            try:
                handle = (recover(bk, history, number, ledger_id, notes, "final recovery") if recovery
                          else bk.open_ledger(ledger_id, recovery=False))
                if handle is not None:
                    last = handle.last_add_confirmed
                    entries = [((number, e.entry_id, 0), e.data) for e in handle.read(0, last)] if last >= 0 else []
                    handle.close()
                    read.records += entries
                    break
                error = "the recovery open failed"
            except WalkitError as exc:
                error = _error(exc)
            if attempt == attempts - 1:
                read.errors.append(f"ledger {number}: {error}")
                return
            time.sleep(0.5)


class LedgerWorkload:
    """The writer, the recoverer and the follower of one run; ``notes`` says what they met."""

    def __init__(self, uri: str, seed: int, options: dict[str, Any]) -> None:
        self._uri, self._options = uri, options
        self.history = History()
        self.ledgers = Ledgers()
        self.notes: list[str] = []
        self.writer: Writer | None = None
        self.recoverer: Recoverer | None = None
        self.follower: Follower | None = None
        try:
            self.writer = Writer(uri, seed, self.history, self.ledgers, options, self.notes)
            self.recoverer = Recoverer(uri, seed, self.history, self.ledgers, options, self.notes)
            self.follower = Follower(uri, self.history, self.ledgers, options)
        except BaseException:
            self.close()
            raise

    def client(self) -> walkit.BookKeeper | None:
        """The writer's client (whose metadata session a fault may aim at)."""
        return self.writer.bk if self.writer is not None else None

    def failover(self) -> None:
        if self.recoverer is not None:
            self.recoverer.trigger()

    def finish(self) -> None:
        """Stop failing over, then stop the writer (its last ledger closed if it can be)."""
        if self.recoverer is not None:
            self.recoverer.stop()
        if self.writer is not None:
            self.writer.stop()

    def judge(self, catch_up: float = 30.0) -> tuple[list[Anomaly], Read]:
        """After :meth:`finish` with every fault lifted: the reference (every ledger
        recovered and read whole), the follower caught up, a second fresh read; the
        anomalies (their details start with ``ledger:``) and the reference."""
        ids = list(self.ledgers.ids)
        reference = self.history.read("fresh ledger reader 1", "final", time.monotonic())
        with walkit.BookKeeper(self._uri, **self._options) as bk:
            read_all(bk, self.history, ids, reference, self.notes, recovery=True)
        reference.complete = not reference.errors
        follower = self.follower
        assert follower is not None
        if not follower.catch_up(len(reference.records), catch_up):
            self.notes.append(f"ledger follower did not catch up: {len(follower.read.records)} of "
                              f"{len(reference.records)} entries")
        follower.read.complete = True
        follower.close()
        second = self.history.read("fresh ledger reader 2", "final", time.monotonic())
        with walkit.BookKeeper(self._uri, **self._options) as bk:
            read_all(bk, self.history, ids, second, self.notes, recovery=False)
        second.complete = True
        self.history.reads.remove(reference)
        anomalies = check(self.history, reference)
        if reference.errors:
            anomalies.append(Anomaly("missed", f"the reference read failed: {reference.errors[0]}"))
        hung = [a for a in self.history.appends.values() if a.lsn is None and a.error is None]
        if hung:
            anomalies.append(Anomaly("hung", f"{len(hung)} adds never completed, the first ledger {hung[0].writer} "
                                             f"add {hung[0].seq}"))
        return [Anomaly(a.kind, f"ledger: {a.detail}") for a in anomalies], reference

    def late_acks(self) -> int:
        """Acknowledgments that came after a recovery open returned, for entries inside
        the recovered ledger (allowed: see support.torture.history.late_acknowledgments)."""
        return len(late_acknowledgments(self.history))

    def close(self) -> None:
        """Stop every thread and close every client (idempotent, also after a failure)."""
        for part in (self.recoverer, self.writer, self.follower):
            if part is not None:
                with contextlib.suppress(WalkitError):
                    part.close()
