"""Re-replication, bookie side: a bookie copies entries it holds to another bookie.

Theory of operation
-------------------
Recovery (``walkit recover``, :mod:`walkit.recovery`) puts back the copies a lost
bookie held. It cannot write them itself: a bookie accepts an entry only with the
ledger's master key, which is derived from the ledger's password and stored nowhere
but on the bookies (never in the metadata), and entries with a ``mac`` digest cannot
be verified without it. So recovery asks a *surviving* bookie of the entry's write set
(ADMIN ``ledger.replicate``, :mod:`bookie._admin`) to push the entries to the target:

1. the source reads each asked entry from its storage (the bytes as stored: header,
   digest, payload) and verifies it - header ids, and the digest with the ledger's digest
   type and the master key it stores; an entry it lacks is reported ``missing``, one that
   fails the check ``bad`` (the caller asks another replica for those). The digests it
   can check are :data:`walkit.metadata.BOOKIE_CHECKED_DIGESTS`: walkit's (``mac`` with
   the master key) and BookKeeper's ``bk-crc32``, ``bk-crc32c`` (walkit's ``crc32c``
   bytes) and ``bk-dummy`` (walkit's ``none``), which need no key. ``bk-hmac`` is not
   one: its MAC key is SHA-1 of "mac" and the password, which the master key (SHA-1 of
   "ledger" and the password) does not give; such ledgers are copied by the recovering
   client, which has the password (:mod:`walkit.recovery._client_copy`);
2. it sends the verified ones to the target as RECOVERY_ADDs with that master key, all
   pipelined on one connection; the target stores them as any add (journaled, durable
   when answered) and learns the master key if the ledger is new to it;
3. it answers with what was copied (durable on the target), missing, bad or failed.

So the key never leaves the bookies, the bytes are never re-encoded, and a replica that
fails its digest is never copied. The caller bounds a request (entries and bytes).
"""

from __future__ import annotations

import asyncio
from typing import Any

from bookie._bookie import Bookie
from bookie._config import BookieConfig
from walkit.errors import (
    CorruptionError,
    DigestMismatchError,
    InvalidArgumentError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ProtocolError,
    WalkitError,
)
from walkit.metadata import BOOKIE_CHECKED_DIGESTS
from walkit.protocol import BkDigestType, EntryHeader, bk_decode_entry, decode_entry

__all__ = ["replicate", "MAX_ENTRIES"]

MAX_ENTRIES = 1024  # entries in one request
_TIMEOUT = 120.0  # seconds for one request's pushes


def replicate(bookie: Bookie, config: BookieConfig, loop: asyncio.AbstractEventLoop, args: dict[str, Any]
              ) -> dict[str, Any]:
    """Serve ``ledger.replicate`` (on a read-pool thread): ``args`` has ``ledger``,
    ``entries`` (ids), ``digest``, ``target`` ("host:port") and ``tls``."""
    ledger_id, entries, digest, target, tls = _parse(args)
    key = bookie.storage.master_key(ledger_id) if bookie.storage.has_ledger(ledger_id) else None
    if key is None:
        raise NoSuchLedgerError("ledger not on this bookie (or without a master key)", ledger=ledger_id,
                                bookie=config.effective_bookie_id)
    checked: list[tuple[int, bytes]] = []
    missing: list[int] = []
    bad: list[int] = []
    for entry_id in entries:
        try:
            data = bookie.read_entry(ledger_id, entry_id)
            header = _checked(data, digest, key)
        except (NoSuchEntryError, NoSuchLedgerError):
            missing.append(entry_id)
            continue
        except (DigestMismatchError, ProtocolError, CorruptionError):  # damaged here: another replica's copy
            bad.append(entry_id)
            continue
        if (header.ledger_id, header.entry_id) != (ledger_id, entry_id):
            bad.append(entry_id)
            continue
        checked.append((entry_id, data))
    host, _, port = target.rpartition(":")
    ssl_context = _ssl(config) if tls else None
    push = asyncio.run_coroutine_threadsafe(_push(host, int(port), ssl_context, ledger_id, key, checked), loop)
    copied, failed = push.result(_TIMEOUT)
    return {"copied": copied, "missing": missing, "bad": bad, "failed": failed}


async def _push(host: str, port: int, ssl_context: Any, ledger_id: int, key: bytes,
                entries: list[tuple[int, bytes]]) -> tuple[list[int], dict[str, str]]:
    from walkit.client import BookieClient

    copied: list[int] = []
    failed: dict[str, str] = {}
    if not entries:
        return copied, failed
    try:
        client = await BookieClient.connect(host, port, ssl_context=ssl_context, server_hostname=host)
    except WalkitError as exc:
        return copied, {str(e): str(exc) for e, _ in entries}
    try:
        futures = [client.add_entry_nowait(ledger_id, e, key, data, recovery=True) for e, data in entries]
        results = await asyncio.gather(*futures, return_exceptions=True)
    finally:
        await client.close()
    for (entry_id, _), result in zip(entries, results):
        if isinstance(result, BaseException):
            failed[str(entry_id)] = str(result)
        else:
            copied.append(entry_id)
    return copied, failed


def _parse(args: dict[str, Any]) -> tuple[int, list[int], str, str, bool]:
    ledger_id, entries, digest = args.get("ledger"), args.get("entries"), args.get("digest")
    target, tls = args.get("target"), args.get("tls", False)
    ints = isinstance(entries, list) and all(type(e) is int and e >= 0 for e in entries)
    if type(ledger_id) is not int or ledger_id < 0 or not ints or not entries or len(entries) > MAX_ENTRIES:
        raise InvalidArgumentError("ledger.replicate needs a ledger id and 1..1024 entry ids",
                                   ledger=repr(ledger_id)[:40])
    if digest not in BOOKIE_CHECKED_DIGESTS:
        raise InvalidArgumentError("a bookie cannot check this digest", digest=repr(digest)[:40],
                                   checked=",".join(BOOKIE_CHECKED_DIGESTS))
    if not isinstance(target, str) or not target.rpartition(":")[2].isdigit() or type(tls) is not bool:
        raise InvalidArgumentError("ledger.replicate needs a target host:port", target=repr(target)[:80])
    assert isinstance(ledger_id, int) and isinstance(entries, list)
    return ledger_id, entries, digest, target, tls


# BookKeeper digests a bookie checks, by the walkit digest whose bytes they are (None: CRC32's own code)
_BK_AS_WALKIT = {"bk-crc32c": "crc32c", "bk-dummy": "none", "bk-crc32": None}


def _checked(data: bytes, digest: str, key: bytes) -> EntryHeader:
    """The header of a stored entry whose digest checks (DigestMismatchError if not)."""
    if digest not in _BK_AS_WALKIT:
        return decode_entry(data, digest=digest, key=key)[0]
    same = _BK_AS_WALKIT[digest]
    if same is not None:
        return decode_entry(data, digest=same, key=b"")[0]
    fields, _ = bk_decode_entry(bytes(data), digest=BkDigestType.CRC32)
    return EntryHeader._make(fields)


def _ssl(config: BookieConfig) -> Any:
    from walkit.client import client_ssl_context

    return client_ssl_context(config.tls_trust_store, certificate=config.tls_certificate_path,
                              key=config.tls_key_store)
