"""Re-replication by the recovering client itself: read each copy from a live replica,
check it, write it to the target as a recovery add.

Theory of operation
-------------------
The bookie-side push (ADMIN ``ledger.replicate``, :mod:`bookie._replicate`) needs a walkit
bookie at both ends and a digest a bookie can check with the master key it holds. Any
other fragment - an Apache BookKeeper bookie among the sources or as the target (it has
no walkit ADMIN ops), or a ``bk-hmac`` ledger (its MAC key comes from the password, which
no bookie holds) - is copied here, as BookKeeper's own replication worker copies:

1. for each entry the lost bookie held, the first live bookie of its write set (then
   the next; a bookie being decommissioned last) is asked for it with a plain read, over
   the connection of that bookie's kind (walkit's protocol, or BookKeeper's v3 dialect to
   a Java bookie: :class:`~walkit.client.BkBookieClient`); the reads of a chunk go out
   pipelined, one batch per source;
2. each copy is checked with the ledger's entry codec (:class:`~walkit.client.EntryCodec`,
   made from the digest and the clear password the metadata of a BookKeeper-format
   cluster keeps): its digest, and that its header names the ledger and the entry. A
   replica that lacks the entry, fails the check or does not answer is passed over for
   the next; an entry no replica holds intact raises
   :class:`~walkit.errors.ReplicasLostError`;
3. the checked bytes - unchanged, never re-encoded - go to the target as RECOVERY_ADDs
   with the ledger's master key (a fenced or closed ledger accepts them; a target new to
   the ledger learns the key), pipelined; the chunk is done when every add is answered,
   i.e. durable on the target. An add the target refuses raises
   :class:`~walkit.errors.BookieUnavailableError`.

The caller (:class:`~walkit.recovery._replicator.Replicator`) changes the fragment's
ensemble only after every chunk is durable. Without the password (a walkit-format
cluster keeps only a verifier) nothing is copied: :class:`~walkit.errors.UnauthorizedError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from walkit.client import BookieClient, EntryCodec
from walkit.errors import (
    BookieTimeoutError,
    BookieUnavailableError,
    DigestMismatchError,
    ReplicasLostError,
    UnauthorizedError,
    WalkitError,
)
from walkit.recovery._plan import FragmentWork

__all__ = ["codec_of", "copy_chunk", "READ_TIMEOUT"]

READ_TIMEOUT = 30.0  # seconds one source has for a read before the next source is asked
_ADD_TIMEOUT = 120.0  # seconds the target has for a chunk's adds

Connect = Callable[[str], Awaitable[BookieClient]]


def codec_of(work: FragmentWork) -> EntryCodec:
    """The entry codec a client copy of ``work``'s ledger checks and writes with."""
    if work.password is None:
        raise UnauthorizedError("copying through the client needs the ledger's password, which this cluster's "
                                "metadata does not keep (only a BookKeeper-format cluster keeps it)",
                                ledger=work.ledger_id, digest=work.digest)
    return EntryCodec.of(work.digest, work.password)


async def copy_chunk(connect: Connect, work: FragmentWork, codec: EntryCodec, target: str,
                     candidates: Mapping[int, list[str]]) -> int:
    """Copy the entries of ``candidates`` (entry -> the bookies to ask, in order) to
    ``target``; how many were copied (all of them, or it raises)."""
    copies = await _read_all(connect, work, codec, {e: list(c) for e, c in candidates.items()})
    client = await connect(target)
    futures = [client.add_entry_nowait(work.ledger_id, e, codec.master_key, data, recovery=True)
               for e, data in sorted(copies.items())]
    try:
        results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), _ADD_TIMEOUT)
    except asyncio.TimeoutError as exc:
        raise BookieTimeoutError("the target did not answer the copies", ledger=work.ledger_id,
                                 target=target) from exc
    for result in results:
        if isinstance(result, BaseException):
            if not isinstance(result, WalkitError):
                raise result
            raise BookieUnavailableError("the target refused copies", ledger=work.ledger_id, target=target,
                                         reason=str(result)) from result
    return len(copies)


async def _read_all(connect: Connect, work: FragmentWork, codec: EntryCodec,
                    left: dict[int, list[str]]) -> dict[int, bytes]:
    """Each entry's checked copy, from the first of its bookies that has one."""
    copies: dict[int, bytes] = {}
    while left:
        asked: list[tuple[int, str]] = []
        for e, bookies in left.items():
            if not bookies:
                raise ReplicasLostError("no surviving replica holds an intact copy", ledger=work.ledger_id, entry=e,
                                        lost=work.lost)
            asked.append((e, bookies[0]))
        answers = await asyncio.gather(*(_read(connect, work, codec, src, e) for e, src in asked),
                                       return_exceptions=True)
        for (e, src), answer in zip(asked, answers):
            if isinstance(answer, bytes):
                copies[e] = answer
                del left[e]
            elif isinstance(answer, WalkitError):
                left[e].remove(src)  # lacking, damaged or unreachable there: the next one
            else:
                raise answer
    return copies


async def _read(connect: Connect, work: FragmentWork, codec: EntryCodec, source: str, entry_id: int) -> bytes:
    """``source``'s copy of the entry, its digest and ids checked (a WalkitError if not)."""
    client = await connect(source)
    try:
        response = await asyncio.wait_for(client.read_entry(work.ledger_id, entry_id), READ_TIMEOUT)
    except asyncio.TimeoutError as exc:
        raise BookieTimeoutError("no answer to a read", bookie=source, ledger=work.ledger_id,
                                 entry=entry_id) from exc
    data = bytes(response.data)
    header, _ = codec.decode(data)
    if (header.ledger_id, header.entry_id) != (work.ledger_id, entry_id):
        raise DigestMismatchError("a copy names another entry", bookie=source, ledger=work.ledger_id, entry=entry_id,
                                found=f"{header.ledger_id}/{header.entry_id}")
    return data
