"""Reading a ledger's entries ahead of what the caller is handed (``ReadHandle.read``,
a WriteAheadLog's replay, sync or asyncio).

Theory of operation
-------------------
A sequential read hands entries (or their records) to the application on its own thread
(or its own event loop) while the entries come from the client's loop. Read chunk by
chunk and waited for, the two take turns: the bookies and the loop sit idle while the
application consumes a chunk, and the application waits while the next one is read.
:func:`read_chunks` (an async generator on the client's loop) keeps the next chunk's
read under way while the current one is handed out, so the bookies' work (other
processes), the loop's and the application's overlap. :func:`read_ahead` hands its
chunks to a thread (``LoopThread.iterate``); an asyncio consumer iterates it with
``LoopThread.aiterate``, and a WAL replay wraps it in its own generator of segments.

Chunks are bounded by bytes, not by count (a log's entries may hold a record each or a
megabyte of them): each is a prefix of what is left, read until its entries hold
:data:`CHUNK_BYTES` (:data:`FIRST_CHUNK_BYTES` for the first, so that a replay starts
soon), one entry at least (``ReadState.read`` with ``max_bytes``; entries read one by
one, on striped ledgers, stop at a count sized by the entries seen before). At most two
chunks are held at once - the one handed out and the one being read - so a read holds
about ``2 * CHUNK_BYTES`` plus the runs in flight (``read_batches_in_flight *
read_batch_bytes``). A read that fails raises when its chunk is reached, as a plain read
would; a read abandoned half-way (the generator closed) cancels the read under way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Iterator

from walkit.client._loop import LoopThread
from walkit.client._read import Entry
from walkit.client._read_state import ReadState

__all__ = ["read_ahead", "read_chunks", "CHUNK_BYTES", "FIRST_CHUNK_BYTES"]

CHUNK_BYTES = 8 << 20  # a chunk's size
FIRST_CHUNK_BYTES = 256 << 10  # the first chunk's: the first entries come quickly


def read_ahead(loop: LoopThread, state: ReadState, first: int, last: int,
               waited: Callable[[float], None] | None = None) -> Iterator[list[Entry]]:
    """Entries ``first..last`` of ``state``'s ledger in chunks, in order, the next
    chunk's read under way while the caller (another thread) works on the current one.
    ``waited(s)`` is told how long each chunk was waited for."""
    return loop.iterate(read_chunks(state, first, last), waited)


async def read_chunks(state: ReadState, first: int, last: int) -> AsyncGenerator[list[Entry], None]:
    """(Client loop) entries ``first..last`` in chunks, in order; while a chunk is out
    (the generator suspended), the next one is being read. Closed early, it cancels that
    read."""
    pending = asyncio.ensure_future(state.read(first, last, FIRST_CHUNK_BYTES))
    try:
        while True:
            entries = await pending
            start = entries[-1].entry_id + 1
            if start <= last:
                pending = asyncio.ensure_future(state.read(start, last, CHUNK_BYTES))
            yield entries
            if start > last:
                return
    finally:
        if not pending.done():
            pending.cancel()
        elif not pending.cancelled():
            pending.exception()  # a read ahead that failed after its consumer left: nobody is told
