"""The handles applications hold: :class:`LedgerHandle` (the writer) and
:class:`ReadHandle` (a reader), synchronous and thread-safe. The asyncio flavours in
``walkit.aio`` drive the same cores (:class:`LedgerWriter`, :class:`ReadState`). A handle
holds the :class:`~walkit.client.LedgerClient` it runs on, never the ``BookKeeper``."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from concurrent.futures import Future
from types import TracebackType

from walkit.client._client import LedgerClient
from walkit.client._entry_codec import entry_digest_size
from walkit.client._read import Entry
from walkit.client._read_state import ReadState, check_range
from walkit.client._readahead import read_ahead
from walkit.client._writer import LedgerWriter
from walkit.errors import EntryTooLargeError, InvalidArgumentError, LedgerClosedError, UsageError, WalkitError
from walkit.metadata import LedgerMetadata

__all__ = ["LedgerHandle", "ReadHandle", "ReadState", "Entry", "check_payload", "check_range", "largest_entry"]

_FRAME_OVERHEAD = 256  # frame header, ids, master key: well above what an ADD_ENTRY adds
_ENTRY_HEADER = 32


# a digest's size by its name, looked up once per name (an unknown name raises, and is not kept)
_digest_size = functools.lru_cache(maxsize=64)(entry_digest_size)


def largest_entry(max_frame_size: int, digest: str) -> int:
    """The largest entry (bytes) of a ``digest`` ledger that fits in a frame of ``max_frame_size``."""
    return max_frame_size - _FRAME_OVERHEAD - _ENTRY_HEADER - _digest_size(digest)


def check_payload(data: object, max_frame_size: int, digest: str) -> bytes:
    """``data`` as the ``bytes`` of an entry of a ``digest`` ledger (InvalidArgumentError
    when it is not bytes-like; EntryTooLargeError when its frame would pass ``max_frame_size``)."""
    if data.__class__ is bytes:  # the usual case: taken as it is (bytes() would give it back)
        payload: bytes = data
    elif isinstance(data, (bytes, bytearray, memoryview)):
        payload = bytes(data)
    else:
        raise InvalidArgumentError("an entry is bytes", type=type(data).__name__)
    limit = largest_entry(max_frame_size, digest)
    if len(payload) > limit:
        raise EntryTooLargeError("entry too large for the frame limit", size=len(payload), limit=limit)
    return payload


class _Handle:
    def __init__(self, client: LedgerClient) -> None:
        self._client = client
        self._loop = client.loop

    def _iter_read(self, state: ReadState, first: int, last: int) -> Iterator[Entry]:
        check_range(state.reader.ledger_id, first, last, state.lac)
        for entries in read_ahead(self._loop, state, first, last):
            yield from entries


class LedgerHandle(_Handle):
    """The single writer of a ledger (from :meth:`BookKeeper.create_ledger`)."""

    def __init__(self, client: LedgerClient, writer: LedgerWriter) -> None:
        super().__init__(client)
        self._writer = writer
        self._closed = False
        # the largest entry check_payload takes (config and digest are the ledger's for good)
        self._largest = largest_entry(client.config.max_frame_size, writer.meta.digest)

    @property
    def ledger_id(self) -> int:
        return self._writer.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._writer.meta

    @property
    def last_add_confirmed(self) -> int:
        return self._writer.lac

    @property
    def length(self) -> int:
        """Bytes of the entries up to the LAC."""
        return self._writer.lac_length

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def ensemble_changes(self) -> int:
        return self._writer.ensemble_changes

    def add_entry_async(self, data: bytes) -> Future[int]:
        """Queue an entry; the future gives its id once it and every lower entry are
        durable on Qa bookies (futures complete in entry order). Waits while
        ``max_pending_adds`` adds are in flight. The future fails with the writer's error
        (LedgerFencedError, NotEnoughBookiesError, ...): then no later add succeeds."""
        if self._closed:
            raise LedgerClosedError("ledger handle is closed", ledger=self.ledger_id)
        if data.__class__ is bytes and len(data) <= self._largest:  # check_payload's answer, without the call
            return self._writer.submit(data)
        return self._writer.submit(check_payload(data, self._client.config.max_frame_size, self._writer.meta.digest))

    def add_entry(self, data: bytes) -> int:
        """Add an entry and wait until it (and every lower one) is durable on Qa
        bookies; its entry id."""
        if self._loop.in_loop():
            raise UsageError("add_entry blocks: not from the client's loop thread; use add_entry_async")
        return self._loop.lone_run(self.add_entry_async, data).result()  # alone: run here

    def read(self, first: int, last: int) -> Iterator[Entry]:
        """Entries ``first``..``last`` (up to the LAC), in order."""
        writer = self._writer
        state = self._client.read_state(writer.meta, writer.codec, writer.version, writer.lac)
        return self._iter_read(state, first, last)

    def close(self) -> None:
        """Wait for pending adds, then record the ledger CLOSED at its LAC. Raises the
        writer's error when the ledger could not be closed as written (fenced)."""
        if self._closed:
            return
        self._closed = True
        self._loop.run(self._writer.close())

    def __enter__(self) -> LedgerHandle:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
            return
        with contextlib.suppress(WalkitError):  # the error in flight says more than a failed close
            self.close()


class ReadHandle(_Handle):
    """A reader of a ledger (from :meth:`BookKeeper.open_ledger`); closed ledgers are
    read to their end, open ones up to the LAC, and followed as it advances."""

    def __init__(self, client: LedgerClient, state: ReadState) -> None:
        super().__init__(client)
        self._state = state
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("read handle is closed", ledger=self.ledger_id)

    @property
    def ledger_id(self) -> int:
        return self._state.reader.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._state.metadata

    @property
    def last_add_confirmed(self) -> int:
        return self._state.lac

    @property
    def is_closed(self) -> bool:
        return self._state.closed

    @property
    def length(self) -> int:
        """The ledger's length in bytes once closed (0 before)."""
        return self._state.length

    def read(self, first: int, last: int) -> Iterator[Entry]:
        self._check_open()
        return self._iter_read(self._state, first, last)

    def read_last_add_confirmed(self) -> int:
        """Ask the bookies (and metadata, for a close) for the LAC now."""
        self._check_open()
        return self._loop.run(self._state.read_lac())

    def wait_for_lac(self, previous: int, timeout: float) -> int:
        """Long poll: the LAC once it passes ``previous``, or the LAC as it is after
        ``timeout`` seconds."""
        self._check_open()
        return self._loop.run(self._state.wait_lac(previous, timeout))

    def follow(self, start: int = 0, *, poll_timeout: float = 1.0) -> Iterator[Entry]:
        """Entries from ``start`` on as they become readable (the LAC passes them); ends
        after the last entry once the ledger is closed."""
        if not isinstance(start, int) or start < 0:
            raise InvalidArgumentError("follow starts at an entry id >= 0", start=start)
        next_id, limit = start, self._client.config.read_parallelism * 4
        while True:
            self._check_open()
            batch = self._loop.run(self._state.follow_step(next_id, poll_timeout, limit))
            if batch is None:
                return
            for entry in batch:
                next_id = entry.entry_id + 1
                yield entry

    def close(self) -> None:
        """End this handle's use (a reader holds nothing on the bookies)."""
        self._closed = True

    def __enter__(self) -> ReadHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

