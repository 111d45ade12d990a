"""Zero-filled space ahead of a new journal file's tail.

Theory of operation
-------------------
Why. A new journal file's space is reserved with ``fallocate``
(:meth:`bookie.journal._files.OpenJournal.reserve`), which ext4 and XFS record as
*unwritten* extents. Every write into an unwritten extent must convert it, and the
fdatasync that follows must commit that change through the file system's own journal:
a second device write and flush behind each batch. For one add at a time that is most of
the difference between a bookie's first journal files and a recycled one
(``journalRecycleFiles``, written in place): ~0.33 vs ~0.22 ms per add and ~175 vs
~125 µs of bookie CPU (docs/performance.md). A bookie's first files are all new, and so is
every file while fewer than ``journalRecycleFiles`` were retired.

What. One thread per journal (``bookie-journal-zero``) writes zeros into the file being
appended to, ahead of its tail: chunks of :data:`CHUNK` bytes with the journal's own kind
of write (O_DIRECT where the journal uses it), never synced (the zeros carry nothing: a
new file's space past the tail reads as zeros whether written or not, so replay cannot
tell and a power cut loses nothing), until :data:`AHEAD` bytes past the tail are written,
paced to ``journalZeroFillRateMB`` so that a busy disk gives it at most that bandwidth.
The journal's batches then land on written blocks, and their fdatasyncs only flush the
device. The filler claims a chunk only while the tail is at least a quarter chunk behind
it - so the first batch of a file, and a journal outrunning the pacing, reserve their
next bytes with fallocate themselves (in chunk-sized steps while the filler goes on past
them) rather than wait for a whole chunk write. Recycled files are not filled (their
blocks are written already), nor are buffered (not O_DIRECT) files: their zeros would be
dirty pages that the journal's own fdatasyncs write out; nor are files of a file system
where it does not pay (``FileSystem.zero_fill_pays``: MemFS, unless asked).

Safety rests on one invariant: **bytes below ``OpenJournal.allocated`` belong to the
journal; the filler writes only at and past it.** The filler claims a chunk starting at
``allocated`` under the file's condition, writes it with the condition released, and only
then moves ``allocated`` past it. A batch reserves its space under the same condition:
when it needs bytes past ``allocated`` while a chunk is being written it waits for that
chunk (and the filler claims no other while a batch waits), then fallocates whatever it
still lacks, as without a filler. So a zero write and a batch never overlap, and zeros
never land on frames, whichever thread runs first.

A file is detached from the filler before the journal closes it (a roll, a shutdown):
detaching waits for the chunk in flight. A zero write that fails (a full disk, an I/O
error) ends zero filling for that file, logged once: the journal goes on with fallocate,
and whatever the failure means for the disk the journal's own writes will find out.
"""

from __future__ import annotations

import logging
import threading

from bookie.fs import AlignedBuffer, FileSystem
from bookie.journal._files import OpenJournal

__all__ = ["ZeroFiller", "CHUNK", "AHEAD"]

log = logging.getLogger("bookie.journal")

CHUNK = 1 << 20  #: bytes of zeros per write
AHEAD = 8 << 20  #: bytes past the tail the filler keeps written


class ZeroFiller:
    """The ``bookie-journal-zero`` thread of one journal (see the module docstring).
    :meth:`attach` gives it the file being appended to (or None), :meth:`stop` ends it."""

    def __init__(self, fs: FileSystem, rate: int, *, alignment: int, chunk: int = 0, ahead: int = 0) -> None:
        self._fs = fs
        self._alignment = alignment
        self._chunk, self._ahead = chunk or CHUNK, ahead or AHEAD
        self._lead = self._chunk // 4
        self._pace = self._chunk / rate  # seconds per chunk at ``rate`` bytes/s
        self._buf: AlignedBuffer = fs.alloc_buffer(self._chunk)  # zero-filled
        self._state = threading.Condition()
        self._file: OpenJournal | None = None
        self._stopping = False
        self._stopped = threading.Event()  # the pacing waits on it: a stop does not wait out a pause
        self._thread: threading.Thread | None = None
        #: zero bytes written, and zero writes that failed (each ended a file's filling)
        self.written = 0
        self.failures = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bookie-journal-zero", daemon=True)
        self._thread.start()

    def attach(self, journal: OpenJournal | None, limit: int) -> None:
        """Fill ``journal`` (a new file) up to ``limit`` bytes from now on, instead of the
        file attached before, which is detached first: once this returns no zero write
        goes to it any more. ``None`` only detaches."""
        with self._state:
            old, self._file = self._file, None
        if old is not None:
            _detach(old)
        # Only O_DIRECT files: buffered zeros would be dirty pages that the journal's own
        # fdatasyncs write out - the very cost the filling is there to take away.
        limit = limit // self._alignment * self._alignment  # O_DIRECT writes whole blocks
        if journal is not None and self._fs.zero_fill_pays and journal.previous_id == 0 and journal.file.direct \
                and limit > journal.allocated:
            with journal.cond:
                journal.zero_limit = limit
                journal.zero_low_water = self._ahead // 2
                journal.zero_step = self._chunk
            with self._state:
                self._file = journal
                self._state.notify_all()

    def stop(self) -> None:
        """Detach the file and end the thread (idempotent)."""
        self.attach(None, 0)
        with self._state:
            self._stopping = True
            self._state.notify_all()
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._buf.close()

    def _run(self) -> None:
        while True:
            with self._state:
                while self._file is None and not self._stopping:
                    self._state.wait()
                if self._stopping:
                    return
                journal = self._file
            assert journal is not None
            done = self._fill(journal)
            with self._state:
                if done and self._file is journal:
                    self._file = None  # filled to its limit, or failed: nothing more to do there

    def _fill(self, f: OpenJournal) -> bool:
        """Write chunks into ``f`` while it is attached; True when the file needs no more
        (its limit reached, or a write failed), False when it was detached."""
        chunk, ahead, lead = self._chunk, self._ahead, self._lead
        while True:
            with f.cond:
                while True:
                    if f.detached:
                        return False
                    if f.allocated >= f.zero_limit:
                        return True
                    if not f.waiters and f.tail + lead <= f.allocated < f.tail + ahead:
                        break
                    # A batch waits to reserve, or enough is written, or the tail is too
                    # near (a batch would soon need the chunk and wait for all of it: the
                    # journal reserves its next bytes itself, and the filler goes on
                    # past them). Woken when the tail comes near or the journal
                    # reserved more (OpenJournal.reserve).
                    f.filler_parked = True
                    f.cond.wait()
                    f.filler_parked = False
                start = f.allocated
                end = min(start + chunk, f.zero_limit)
                f.zeroing = True
            failed: BaseException | None = None
            try:
                f.file.pwrite(self._buf.view[: end - start], start)
            except BaseException as exc:  # noqa: BLE001 - whatever it is, batches must not wait for it
                failed = exc
            finally:
                with f.cond:
                    f.zeroing = False
                    if failed is None:
                        f.allocated = end  # it cannot have moved: a batch needing more waited for this chunk
                    else:
                        f.zero_limit = 0
                    f.cond.notify_all()
            if failed is not None:
                self.failures += 1
                log.warning("journal %s: zero-filling ahead of the tail failed at %d (%s); the journal reserves"
                            " its space with fallocate from now on", f.file.path, start, failed)
                return True
            self.written += end - start
            if self._stopped.wait(self._pace):
                return False


def _detach(f: OpenJournal) -> None:
    """No zero write goes to ``f`` once this returns (the chunk in flight is waited for)."""
    with f.cond:
        f.detached = True
        f.cond.notify_all()
        while f.zeroing:
            f.cond.wait()
