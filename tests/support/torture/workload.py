"""The WAL workload of a torture run: writers (a thread, or a child process that can be
SIGKILLed) appending with a window of futures, a tail reader, a periodic replayer, and
:class:`Workload`, which replaces failed writers and judges the history at the end."""

from __future__ import annotations

import contextlib
import functools
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import IO, Protocol

from support.torture import TESTS, child_env
from support.torture.history import History, Lsn, Read
from support.torture.plan import CLIENT, ENSEMBLE, ENTRY_BYTES, LARGE_EVERY, LOG, QA, QW, REPLAY_EVERY, ROLL_SECONDS, WINDOW
from support.torture.repair import summary_of
import walkit
from walkit import LSN, WriteAheadLog
from walkit.errors import UsageError, WalkitError
from walkit.wal._format import FRAGMENT_HEAD_SIZE


def payload(seed: int, writer: int, seq: int) -> bytes:
    """The record ``seq`` of ``writer`` in run ``seed``: unique, 1 byte to 2 KiB of noise, or
    (about one in ``LARGE_EVERY``, chosen by a stream of its own) more than an entry
    holds, up to three entries' worth."""
    rng = random.Random(f"{seed}/{writer}/{seq}")
    head = f"w{writer}s{seq}:".encode()
    if random.Random(f"{seed}/{writer}/{seq}/large").randrange(LARGE_EVERY) == 0:
        return head + rng.randbytes(rng.randint(ENTRY_BYTES - 15, 3 * (ENTRY_BYTES - FRAGMENT_HEAD_SIZE) - len(head)))
    return head + rng.randbytes(rng.randint(1, 2048))


# -- writers ---------------------------------------------------------------------------------------

def pump(wal: WriteAheadLog, seed: int, writer: int, stop: threading.Event,
         on_sent: Callable[[int, bytes], None], on_ack: Callable[[int, Lsn, float], None],
         on_fail: Callable[[int, str], None]) -> None:
    """Append records with ``WINDOW`` futures in flight until ``stop`` or the log fails."""
    window = threading.BoundedSemaphore(WINDOW)
    failed = threading.Event()

    def done(seq: int, fut: Future[LSN]) -> None:
        at = time.monotonic()
        error = fut.exception()
        if error is None:
            lsn = fut.result()
            on_ack(seq, (lsn.segment, lsn.entry, lsn.slot), at)
        else:
            on_fail(seq, f"{type(error).__name__}: {str(error)[:200]}")
            failed.set()
        window.release()

    seq = 0
    while not stop.is_set() and not failed.is_set():
        if not window.acquire(timeout=0.1):
            continue
        seq += 1
        data = payload(seed, writer, seq)
        on_sent(seq, data)
        try:
            fut = wal.append_async(data)
        except WalkitError as exc:
            on_fail(seq, f"{type(exc).__name__}: {str(exc)[:200]}")
            return
        fut.add_done_callback(functools.partial(done, seq))


def open_log(bk: walkit.BookKeeper, attempts: int = 5) -> WriteAheadLog:
    """Become the writer, trying again while faults make the open fail."""
    for attempt in range(attempts):
        try:
            return WriteAheadLog.open(bk, LOG, ensemble_size=ENSEMBLE, write_quorum=QW, ack_quorum=QA,
                                      roll_seconds=ROLL_SECONDS, max_entry_bytes=ENTRY_BYTES)
        except WalkitError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


class Writer(Protocol):
    number: int

    def alive(self) -> bool: ...

    def client(self) -> walkit.BookKeeper | None: ...

    def close(self) -> None: ...

    def crash(self) -> None: ...


class ThreadWriter:
    """A writer in this process, on a client of its own."""

    def __init__(self, number: int, uri: str, seed: int, history: History) -> None:
        self.number = number
        self._history = history
        self._stop = threading.Event()
        self._bk = walkit.BookKeeper(uri, **CLIENT)
        try:
            self._wal = open_log(self._bk)
        except BaseException:
            self._bk.close()
            raise
        history.opened(number, time.monotonic())
        self._thread = threading.Thread(target=pump, name=f"torture-writer-{number}", daemon=True, args=(
            self._wal, seed, number, self._stop, lambda s, d: history.sent(number, s, d, time.monotonic()),
            lambda s, lsn, at: history.acked(number, s, lsn, at), lambda s, e: history.failed(number, s, e)))
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def client(self) -> walkit.BookKeeper | None:
        return self._bk

    def close(self) -> None:
        """Stop appending, wait for what is in flight, close the log and the client."""
        self._stop.set()
        self._thread.join(30)
        with contextlib.suppress(WalkitError):
            self._wal.close()
        self._bk.close()

    def crash(self) -> None:
        """Stop appending and close the client under the log (its segment stays open)."""
        self._stop.set()
        self._thread.join(30)
        with contextlib.suppress(WalkitError):
            self._bk.close()


class ChildWriter:
    """A writer in a child process (tests/support/torture/writer.py) that reports on its stdout."""

    def __init__(self, number: int, uri: str, seed: int, history: History) -> None:
        self.number = number
        self._history = history
        self._opened = threading.Event()
        self._proc = subprocess.Popen([sys.executable, "-m", "support.torture.writer", uri, str(number), str(seed)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      cwd=TESTS, env=child_env())
        self._reader = threading.Thread(target=self._read, name=f"torture-child-{number}", daemon=True)
        self._reader.start()
        if not self._opened.wait(60) or self._proc.poll() is not None and not self._opened.is_set():
            self.crash()
            raise WalkitError("writer process did not open the log", writer=number)

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._handle(line.decode(errors="replace").split())
        self._opened.set()  # an exit before the open wakes the constructor too

    def _handle(self, words: list[str]) -> None:
        h, n = self._history, self.number
        try:
            if words[0] == "open":
                h.opened(n, float(words[1]))
                self._opened.set()
            elif words[0] == "sent":
                seq = int(words[1])
                h.sent(n, seq, payload(int(words[2]), n, seq), float(words[3]))
            elif words[0] == "ack":
                h.acked(n, int(words[1]), (int(words[2]), int(words[3]), int(words[4])), float(words[5]))
            elif words[0] == "fail":
                h.failed(n, int(words[1]), " ".join(words[2:]))
        except (IndexError, ValueError, KeyError):
            return  # the torn last line of a killed process

    def alive(self) -> bool:
        return self._proc.poll() is None

    def client(self) -> walkit.BookKeeper | None:
        return None

    def close(self) -> None:
        stdin: IO[bytes] | None = self._proc.stdin
        with contextlib.suppress(OSError):
            if stdin is not None:
                stdin.close()  # EOF: stop, flush, close the log, exit
        try:
            self._proc.wait(60)
        except subprocess.TimeoutExpired:
            self.crash()
        self._reader.join(10)

    def crash(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(signal.SIGKILL)
        self._proc.wait(30)
        self._reader.join(10)


# -- readers ---------------------------------------------------------------------------------------

class Tail:
    """A reader thread that tails the log from its start, resuming after its last record
    when a read fails."""

    def __init__(self, uri: str, history: History) -> None:
        self._bk = walkit.BookKeeper(uri, **CLIENT)
        self._reader = WriteAheadLog.reader(self._bk, LOG)
        self.read = history.read("tail", "tail", time.monotonic())
        self._thread = threading.Thread(target=self._run, name="torture-tail", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        after: LSN | None = None
        while True:
            try:
                for lsn, record in self._reader.tail(after, poll_timeout=0.5):
                    self.read.records.append(((lsn.segment, lsn.entry, lsn.slot), record))
                    after = lsn
            except UsageError:
                return  # closed
            except WalkitError as exc:
                self.read.errors.append(summary_of(exc))
                time.sleep(0.2)

    def catch_up(self, count: int, timeout: float) -> bool:
        return self.read.wait_for(count, timeout)

    def close(self) -> None:
        self._reader.close()
        self._thread.join(30)
        self._bk.close()


def replay_once(bk: walkit.BookKeeper, read: Read) -> None:
    """Replay the whole log into ``read`` (an error ends it: what came before stands)."""
    try:
        with WriteAheadLog.reader(bk, LOG) as reader:
            for lsn, record in reader.replay():
                read.records.append(((lsn.segment, lsn.entry, lsn.slot), record))
    except WalkitError as exc:
        read.errors.append(summary_of(exc))


class Replayer:
    """Replays the whole log every ``REPLAY_EVERY`` seconds."""

    def __init__(self, uri: str, history: History) -> None:
        self._bk = walkit.BookKeeper(uri, **CLIENT)
        self._history = history
        self._stop = threading.Event()
        self.count = 0
        self._thread = threading.Thread(target=self._run, name="torture-replay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(REPLAY_EVERY):
            replay_once(self._bk, self._history.read("replayer", "replay", time.monotonic()))
            self.count += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self._bk.close()


# -- the workload ------------------------------------------------------------------------------------

class Workload:
    """One writer at a time (replaced when it fails or on failover), a tail, a replayer."""

    def __init__(self, uri: str, seed: int, history: History, in_process: bool) -> None:
        self._uri, self._seed, self._history = uri, seed, history
        self._kind: type[ThreadWriter] | type[ChildWriter] = ThreadWriter if in_process else ChildWriter
        self._lock = threading.Lock()
        self._numbers = 0
        self.notes: list[str] = []
        self._stop = threading.Event()
        self._writer: Writer | None = self._open()
        self.tail = Tail(uri, history)
        self.replayer = Replayer(uri, history)
        self._supervisor = threading.Thread(target=self._supervise, name="torture-supervisor", daemon=True)
        self._supervisor.start()

    @property
    def writers(self) -> int:
        return self._numbers

    def _open(self) -> Writer:
        self._numbers += 1
        return self._kind(self._numbers, self._uri, self._seed, self._history)

    def current_client(self) -> walkit.BookKeeper | None:
        writer = self._writer
        return writer.client() if writer is not None else None

    def _supervise(self) -> None:
        """A writer whose log failed is replaced (after a pause, as an application would)."""
        while not self._stop.wait(0.2):
            with self._lock:
                writer = self._writer
                if writer is None or writer.alive() or self._stop.is_set():
                    continue
                self.notes.append(f"writer {writer.number} failed; opening writer {self._numbers + 1}")
                writer.crash()
                self._writer = None
                self._writer = self._try_open()

    def _try_open(self) -> Writer | None:
        try:
            return self._open()
        except WalkitError as exc:
            self.notes.append(f"writer {self._numbers} could not open: {summary_of(exc)}")
            return None

    def failover(self, how: str) -> str:
        """Replace the writer: ``kill-first`` (SIGKILL, then open), ``overlap-then-kill``
        / ``overlap-then-close`` (open while the old one appends, then kill / close it)."""
        with self._lock:
            old = self._writer
            if how == "kill-first" and old is not None:
                old.crash()
            self._writer = None
            self._writer = self._try_open()
            if how != "kill-first" and old is not None:
                time.sleep(0.3)  # the old writer keeps appending against the fence
                old.crash()
            new = self._writer.number if self._writer is not None else "none"
            return f"writer {old.number if old else 'none'} -> {new}"

    def finish(self) -> None:
        """Stop the supervisor and close the last writer gracefully."""
        self._stop.set()
        self._supervisor.join(60)
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def recover(self) -> None:
        """A fresh writer opens (fencing and closing whatever is left open) and closes."""
        with self._lock:
            self._numbers += 1
            number = self._numbers
        with walkit.BookKeeper(self._uri, **CLIENT) as bk:
            open_log(bk, attempts=10).close()
        self._history.opened(number, time.monotonic())
