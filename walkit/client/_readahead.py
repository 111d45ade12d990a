"""Reading a segment's entries ahead of the records handed out (replay).

Theory of operation
-------------------
A replay hands records to the application on its own thread while the entries come
from the client's loop. Read chunk by chunk and waited for, the two take turns: the
bookies and the loop sit idle while the application consumes a chunk, and the
application waits while the next one is read. :func:`read_ahead` keeps the next chunk's
read under way while the current one is handed out, so the bookies' work (other
processes), the loop's and the application's overlap.

Chunks are sized by bytes, not only by count: the first is small (a log's entries may
hold a record each or a megabyte of them), then each holds as many entries as fit in
about :data:`CHUNK_BYTES` at the size of the largest entry of the chunk before, between 1
and :data:`MAX_CHUNK` entries. At most two chunks are held at once - the one handed out
and the one being read - so a replay of entries of about one size holds about
``2 * CHUNK_BYTES`` (one entry at least). Sizes are only known once read: the chunk
read while entries grow from small to large may hold up to :data:`MAX_CHUNK` of the
large ones (as every chunk could before read-ahead); the chunks after it are small
again. (Byte-bounded reads on the bookies would bound that one too.) A read that fails
raises when its chunk is reached, as a plain read would; a replay abandoned half-way
(the generator closed) cancels the read under way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from walkit.client import Entry, LoopThread, ReadState

__all__ = ["read_ahead", "CHUNK_BYTES", "MAX_CHUNK"]

CHUNK_BYTES = 8 << 20  # a chunk's target size
MAX_CHUNK = 256  # entries per chunk at most
FIRST_CHUNK = 16  # entries in the first chunk: their size sizes the next ones


def read_ahead(loop: LoopThread, state: ReadState, first: int, last: int,
               waited: Callable[[float], None] | None = None) -> Iterator[list[Entry]]:
    """Entries ``first..last`` of ``state``'s ledger in chunks, in order, the next
    chunk's read under way while the caller works on the current one. ``waited(s)`` is
    told how long each chunk was waited for."""
    count = FIRST_CHUNK
    start = first
    end = min(last, start + count - 1)
    pending = loop.submit(state.read(start, end))
    try:
        while True:
            began = time.monotonic()
            entries = loop.result(pending)
            if waited is not None:
                waited(time.monotonic() - began)
            start = end + 1
            if start <= last:
                largest = max([len(e.data) for e in entries], default=0)
                count = max(1, min(MAX_CHUNK, CHUNK_BYTES // max(1, largest)))
                end = min(last, start + count - 1)
                pending = loop.submit(state.read(start, end))
            yield entries
            if start > last:
                return
    finally:
        if not pending.done():
            pending.cancel()
