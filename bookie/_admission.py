"""Admission: which adds (and keyed writes) a bookie takes, and which it refuses why.

Theory of operation
-------------------
An add is admitted when its arguments are in range (ledger id, entry id, a master key of
1..64 bytes, a payload no larger than the bookie's entry limit), the entry's header names
the same ledger and entry, its master key is the ledger's (the first key a ledger gets
is its key), and the ledger is not fenced - or the add is a recovery add. Everything here
is a decision over the ledger's state as :meth:`bookie._records.LedgerRecords.look` sees
it (durable state and the records still on their way to the journal). The one thing it
does besides deciding is to make the MASTER_KEY record of a ledger whose key is not
durable yet (:func:`admit_key`), which the caller journals with the adds or drops; for a
batch of adds that record puts the key in storage ahead of the entries
(:meth:`bookie._records.LedgerRecords.key_record`), and it is made at the decision, not
after it, so that a storage unable to take the key (it failed) refuses that very add with
its error, as it would refuse the entry.

Why the decision holds until the adds are journaled: the caller holds the bookie lock
from the look to the journal's framing, and only under that lock are adds, keys and
fences framed - so no fence or other key can come between what admission saw and the
journal. A pending fence refuses normal adds at once (an add admitted after the fence
was framed could be acknowledged after it, which fencing forbids); a pending key is the
ledger's key, and is journaled again with each batch until one of its records is
durable (:mod:`bookie._records`).

The batch form (:func:`admit_batch`) is the server's hot path: one combined test per add,
and only an add that fails it goes through the checks that name the fault; a ledger's
key and fence are looked up once per run of adds of that ledger with the same key, and a
batch that spans ledgers looks them all up at once first. A refusal touches only its own
add.
"""

from __future__ import annotations

import struct
from itertools import repeat
from operator import attrgetter, eq
from typing import Protocol, TypeVar

from bookie._faults import as_walkit_error
from bookie._records import LedgerRecords, LedgerView
from bookie.journal import Record
from bookie.storage import MAX_ENTRY_ID
from walkit.errors import (
    EntryTooLargeError,
    InvalidArgumentError,
    LedgerFencedError,
    UnauthorizedError,
    WalkitError,
)
from walkit.protocol import ENTRY_HEADER, parse_entry_header

__all__ = ["A", "AddRequest", "admit_batch", "admit_key", "check_entry", "check_lac", "check_ledger"]

_MAX_LEDGER_ID = (1 << 63) - 1
_MAX_KEY = 64
_HEADER_IDS = struct.Struct(">Qq")  # the ledger and entry id an entry's header starts with
_HEADER_SIZE = ENTRY_HEADER.size
_LEDGER_ID, _ENTRY_ID = attrgetter("ledger_id"), attrgetter("entry_id")
_MASTER_KEY, _DATA = attrgetter("master_key"), attrgetter("data")
_INT, _BYTES = {int}, {bytes}
#: Adds in a batch from which the C loops of :func:`_clean_run` pay (fewer: the loop is cheaper).
RUN_MIN = 32


class AddRequest(Protocol):
    """What :meth:`bookie.Bookie.add_batch_cb` reads of an add (an ADD_ENTRY request has it)."""

    @property
    def ledger_id(self) -> int: ...

    @property
    def entry_id(self) -> int: ...

    @property
    def master_key(self) -> bytes: ...

    @property
    def data(self) -> bytes: ...

    @property
    def recovery(self) -> bool: ...


A = TypeVar("A", bound=AddRequest)


def check_ledger(ledger_id: int, master_key: bytes) -> None:
    """Refuse a ledger id or master key out of range (InvalidArgumentError)."""
    if not isinstance(ledger_id, int) or not 0 <= ledger_id <= _MAX_LEDGER_ID:
        raise InvalidArgumentError("ledger id out of range", ledger=ledger_id)
    if not isinstance(master_key, bytes) or not 0 < len(master_key) <= _MAX_KEY:
        raise InvalidArgumentError("master key must be 1..64 bytes", ledger=ledger_id)


def check_lac(ledger_id: int, lac: int) -> None:
    """Refuse an explicit LAC out of range (InvalidArgumentError)."""
    if not isinstance(lac, int) or not -1 <= lac <= _MAX_LEDGER_ID:
        raise InvalidArgumentError("explicit LAC out of range", ledger=ledger_id, lac=lac)


def check_entry(ledger_id: int, entry_id: int, payload: bytes, max_size: int) -> None:
    """Refuse an entry id out of range, a payload over ``max_size`` bytes, or an entry
    whose header names another entry."""
    if not isinstance(entry_id, int) or not 0 <= entry_id <= MAX_ENTRY_ID:
        raise InvalidArgumentError("entry id out of range", ledger=ledger_id, entry=entry_id, max=MAX_ENTRY_ID)
    if len(payload) > max_size:
        raise EntryTooLargeError(
            "entry too large", ledger=ledger_id, entry=entry_id, size=len(payload), limit=max_size
        )
    header = parse_entry_header(payload)
    if header.ledger_id != ledger_id or header.entry_id != entry_id:
        raise InvalidArgumentError(
            "entry header names another entry", ledger=ledger_id, entry=entry_id,
            header_ledger=header.ledger_id, header_entry=header.entry_id,
        )


def admit_key(ledgers: LedgerRecords, ledger_id: int, master_key: bytes, seen: dict[int, LedgerView] | None,
              records: list[Record]) -> bool:
    """Refuse a key other than the ledger's; return whether the ledger is fenced (or a
    fence is on its way). The ledger's first key - and a key not durable yet - is
    appended to ``records`` as a MASTER_KEY record, for the caller to journal or
    :meth:`LedgerRecords.drop`. ``seen`` (given for a batch of adds, whose entries
    go to storage with the key) remembers each ledger's state across the adds of the
    batch (the bookie lock is held), so a batch looks at a ledger once and journals
    its key once."""
    state = seen.get(ledger_id) if seen is not None else None
    if state is None:
        state = ledgers.look(ledger_id)
    key, durable, fenced = state
    if key is None or (not durable and key == master_key):
        records.append(ledgers.key_record(ledger_id, master_key, with_entries=seen is not None))
        state = (master_key, True, fenced)  # journaled with this batch: once is enough
    elif key != master_key:
        raise UnauthorizedError("master key does not match", ledger=ledger_id)
    if seen is not None:
        seen[ledger_id] = state
    return fenced


def admit_batch(ledgers: LedgerRecords, adds: list[A], max_size: int, refused: list[tuple[BaseException, A]],
                records: list[Record]) -> tuple[list[A], list[tuple[int, int, bytes]]]:
    """The adds that pass every check, and their ``(ledger id, entry id, payload)``
    for storage and journal; the refused ones go to ``refused`` with their error, the
    MASTER_KEY records to journal with the admitted ones to ``records``. One combined
    test per add; only an add that fails it goes through the checks that name the fault
    (:func:`check_ledger`, :func:`check_entry`, which refuse it - or pass it, e.g. an
    ``int`` subclass). The key and fence of a ledger are looked up once per run of adds
    of that ledger with the same key (only this thread can add to them meanwhile: the
    caller holds the bookie lock); a batch that spans ledgers looks them all up at once
    first. The usual batch of :data:`RUN_MIN` adds or more - one ledger, one key, every
    add passing the combined test, the ledger not fenced - is decided by C loops over it
    (:func:`_clean_run`), with the same outcome as the loop of :func:`_admit_each`."""
    ids = list(map(_LEDGER_ID, adds))  # C loops (no turn of this one per add): one ledger is the usual batch
    one_ledger = not ids or ids.count(ids[0]) == len(ids)
    seen: dict[int, LedgerView] = {} if one_ledger else ledgers.look_many(
        set(ids) if set(map(type, ids)) == _INT else {ledger_id for ledger_id in ids if type(ledger_id) is int})
    if not one_ledger:
        entries = _clean_many(ledgers, adds, ids, max_size, seen, records) if len(adds) >= RUN_MIN else None
        if entries is None:
            return _admit_each(ledgers, adds, max_size, refused, records, seen, (-1, b"", False))
        return list(adds), entries
    run = _clean_run(adds, ids, max_size) if len(adds) >= RUN_MIN else None
    if run is None:
        return _admit_each(ledgers, adds, max_size, refused, records, seen, (-1, b"", False))
    ledger_id, key = ids[0], adds[0].master_key
    try:
        fenced = admit_key(ledgers, ledger_id, key, seen, records)
    except (WalkitError, OSError) as exc:  # the loop's first turn; the next add looks again, as there
        refused.append((as_walkit_error(exc), adds[0]))
        return _admit_each(ledgers, adds[1:], max_size, refused, records, seen, (-1, b"", False))
    if fenced:  # only recovery adds pass: one by one
        return _admit_each(ledgers, adds, max_size, refused, records, seen, (ledger_id, key, True))
    entry_ids, datas = run
    return list(adds), list(zip(repeat(ledger_id, len(adds)), entry_ids, datas))


def _clean_run(adds: list[A], ids: list[int], max_size: int) -> tuple[list[int], list[bytes]] | None:
    """``(entry ids, payloads)`` of ``adds`` (all of ledger ``ids[0]``) when every add
    passes :func:`_admit_each`'s combined test and all have one key; else None."""
    n, ledger_id = len(adds), ids[0]
    keys = list(map(_MASTER_KEY, adds))
    key = keys[0]
    if not (type(ledger_id) is int and 0 <= ledger_id <= _MAX_LEDGER_ID and type(key) is bytes
            and 0 < len(key) <= _MAX_KEY and keys.count(key) == n and set(map(type, ids)) == _INT
            and set(map(type, keys)) == _BYTES):
        return None
    entry_ids, datas = list(map(_ENTRY_ID, adds)), list(map(_DATA, adds))
    if set(map(type, entry_ids)) != _INT or set(map(type, datas)) != _BYTES or min(entry_ids) < 0 \
            or max(entry_ids) > MAX_ENTRY_ID:
        return None
    sizes = list(map(len, datas))
    if min(sizes) < _HEADER_SIZE or max(sizes) > max_size:
        return None
    if not all(map(eq, map(_HEADER_IDS.unpack_from, datas), zip(repeat(ledger_id, n), entry_ids))):
        return None
    return entry_ids, datas


def _clean_many(ledgers: LedgerRecords, adds: list[A], ids: list[int], max_size: int, seen: dict[int, LedgerView],
                records: list[Record]) -> list[tuple[int, int, bytes]] | None:
    """The entries of ``adds`` - a batch of several ledgers (``ids``), looked up into
    ``seen`` - when every add passes :func:`_admit_each`'s combined test, each ledger
    comes with one key, which is its key, and none is fenced; else None (nothing
    refused: the caller decides the batch an add at a time). The tests are C loops over
    the batch, and :func:`admit_key` runs once per ledger rather than once per change of
    ledger (a batch of round-robin writers changes ledger at every add): it is called,
    in the order the ledgers first appear, only for a ledger whose durable key is not
    the one given (a new ledger's MASTER_KEY record goes to ``records`` as the loop
    would put it there; ``seen`` remembers it, so the loop, if it follows, does not
    make it again)."""
    keys = list(map(_MASTER_KEY, adds))
    if set(map(type, ids)) != _INT or set(map(type, keys)) != _BYTES or min(ids) < 0 or max(ids) > _MAX_LEDGER_ID:
        return None
    key_sizes = list(map(len, keys))
    if min(key_sizes) < 1 or max(key_sizes) > _MAX_KEY:
        return None
    entry_ids, datas = list(map(_ENTRY_ID, adds)), list(map(_DATA, adds))
    if set(map(type, entry_ids)) != _INT or set(map(type, datas)) != _BYTES or min(entry_ids) < 0 \
            or max(entry_ids) > MAX_ENTRY_ID:
        return None
    sizes = list(map(len, datas))
    if min(sizes) < _HEADER_SIZE or max(sizes) > max_size:
        return None
    if not all(map(eq, map(_HEADER_IDS.unpack_from, datas), zip(ids, entry_ids))):
        return None
    key_of = dict(zip(ids, keys))  # each ledger's last key, in the order the ledgers first appear
    if not all(map(eq, map(key_of.__getitem__, ids), keys)):
        return None  # a ledger with two keys in the batch
    if all(map(eq, map(seen.get, key_of), zip(key_of.values(), repeat(True), repeat(False)))):
        return list(zip(ids, entry_ids, datas))  # every ledger known, with that durable key, not fenced: C loops
    for ledger_id, key in key_of.items():
        state = seen.get(ledger_id)
        if state is not None and state[1] and not state[2] and state[0] == key:
            continue  # its durable key, not fenced: what admit_key would say, without a record
        try:
            if admit_key(ledgers, ledger_id, key, seen, records):
                return None  # fenced: only recovery adds pass
        except (WalkitError, OSError):
            return None  # refused: the loop refuses each of its adds, naming why
    return list(zip(ids, entry_ids, datas))


def _admit_each(ledgers: LedgerRecords, adds: list[A], max_size: int, refused: list[tuple[BaseException, A]],
                records: list[Record], seen: dict[int, LedgerView],
                last: tuple[int, bytes, bool]) -> tuple[list[A], list[tuple[int, int, bytes]]]:
    """:func:`admit_batch`'s loop, an add at a time; ``last``: the ledger and key whose
    state was looked at last, and whether it is fenced (``-1``: none yet)."""
    admitted: list[A] = []
    entries: list[tuple[int, int, bytes]] = []
    header_ids = _HEADER_IDS.unpack_from
    last_ledger, last_key, fenced = last
    for add in adds:
        ledger_id, entry_id, key, data = add.ledger_id, add.entry_id, add.master_key, add.data
        try:
            if not (
                type(ledger_id) is int and type(entry_id) is int and type(key) is bytes and type(data) is bytes
                and 0 <= ledger_id <= _MAX_LEDGER_ID and 0 <= entry_id <= MAX_ENTRY_ID
                and 0 < len(key) <= _MAX_KEY and _HEADER_SIZE <= len(data) <= max_size
                and header_ids(data) == (ledger_id, entry_id)
            ):
                check_ledger(ledger_id, key)
                check_entry(ledger_id, entry_id, data, max_size)
            if ledger_id != last_ledger or key != last_key:
                last_ledger = -1
                fenced = admit_key(ledgers, ledger_id, key, seen, records)
                last_ledger, last_key = ledger_id, key
            if fenced and not add.recovery:
                raise LedgerFencedError("ledger is fenced", ledger=ledger_id, entry=entry_id)
        except (WalkitError, OSError) as exc:
            refused.append((as_walkit_error(exc), add))
            continue
        admitted.append(add)
        entries.append((ledger_id, entry_id, data))
    return admitted, entries
