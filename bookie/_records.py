"""A ledger's state records - master key, fence, explicit LAC - and what the bookie holds
of them while they are on their way to the journal.

Theory of operation
-------------------
A ledger's master key, fence flag and explicit LAC live in the ledger storage, which
checkpoints persist and journal replay rebuilds - so the storage must hold what the
journal holds. The bookie therefore puts a FENCE or LAC record's state in storage in the
record's journal callback, only once its fdatasync returned; the journal moves its
settled mark (what a checkpoint takes) past a batch only after the batch's callbacks, so
no checkpoint covers a record whose state is not in storage yet. A MASTER_KEY record's
key goes to storage the same way - or, when it comes with the ledger's entries, together
with them (entries go to storage before the journal: a checkpoint must not persist a
ledger's entries without its key), and is taken back if its record is refused. So a
record the journal refuses (a full disk: ENOSPC) or fails leaves the ledger's state as
it was: the requester gets the error, and a restart finds the same state. (Entries of
a refused add may stay in storage, unacknowledged, as any unacknowledged entry may.)

An explicit LAC that comes for a ledger whose key is durable is the exception: it is
published (:meth:`LedgerRecords.publish_lac`) as soon as its record is framed, without
waiting for a flush - see that method for why this is safe.

From framing to settling, a master key or a fence is *pending* here, and admission
(:meth:`LedgerRecords.look`) sees it:

* a pending fence refuses normal adds at once (LedgerFencedError): an add admitted after
  the fence was framed could be acknowledged after the fence was, which fencing forbids.
  Once the fence is refused, normal adds pass again;
* a pending key is the ledger's key for admission (another key is refused), and it is
  journaled again with each later batch of that ledger's adds until one of its records
  is durable: the journal refuses whole batches, but a later, smaller one may fit, and
  its entries must not reach the journal without their ledger's key before them.

Several records of one ledger may be in flight: each is counted, and the pending state
goes when the last one is settled, whichever way. Settling takes this module's lock
around the storage update, as :meth:`LedgerRecords.look` does around its reads, so
admission never sees a state between the two. A state the storage cannot take (it
failed: the bookie is read-only until restarted, and replay applies the record) stays
pending, so admission still sees it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bookie.journal import FENCE_RECORD, KEY_RECORD, LAC_RECORD, Record
from bookie.storage import LedgerStorage
from walkit.errors import WalkitError
from walkit.logs import context

__all__ = ["LedgerRecords", "LedgerView"]

log = logging.getLogger("bookie")

Callback = Callable[[BaseException | None, Any], None]
#: ``(key or None, whether that key is durable, fenced or a fence pending)``
LedgerView = tuple[bytes | None, bool, bool]


@dataclass(slots=True)
class _PendingKey:
    key: bytes
    count: int = 0  # MASTER_KEY records in flight
    durable: bool = False  # one of them is
    early: bool = False  # put in storage with the ledger's entries, before it was durable


class LedgerRecords:
    """Makes the state records of ledgers and settles them (see the module docstring)."""

    def __init__(self, storage: LedgerStorage) -> None:
        self._storage = storage
        self._lock = threading.Lock()
        self._keys: dict[int, _PendingKey] = {}
        self._fences: dict[int, int] = {}  # ledger -> FENCE records in flight

    def look(self, ledger_id: int) -> LedgerView:
        """The ledger as admission must see it: durable state and pending state."""
        with self._lock:
            stored, fenced = self._storage.key_and_fence(ledger_id)
            if not (self._keys or self._fences):
                return stored, stored is not None, fenced
            pending = self._keys.get(ledger_id)
            fenced = fenced or ledger_id in self._fences
        if pending is not None:
            return pending.key, pending.durable, fenced
        return stored, stored is not None, fenced

    def look_many(self, ledger_ids: Iterable[int]) -> dict[int, LedgerView]:
        """:meth:`look` of several ledgers, taking each lock once (the distinct ledgers of
        a batch of adds: round-robin writers send one add per ledger)."""
        with self._lock:
            stored = self._storage.keys_and_fences(ledger_ids)
            keys, fences = self._keys, self._fences
            if not (keys or fences):
                return {lid: (key, key is not None, fenced) for lid, (key, fenced) in stored.items()}
            views: dict[int, LedgerView] = {}
            for lid, (key, fenced) in stored.items():
                pending = keys.get(lid)
                fenced = fenced or lid in fences
                views[lid] = (key, key is not None, fenced) if pending is None else (pending.key, pending.durable, fenced)
            return views

    # --- records ---------------------------------------------------------------------
    def key_record(self, ledger_id: int, key: bytes, *, with_entries: bool) -> Record:
        """A MASTER_KEY record; the key is pending until it is settled. ``with_entries``:
        the ledger's entries go to storage now, and the key with them."""
        with self._lock:
            pending = self._keys.get(ledger_id) or _PendingKey(key)
            if with_entries and not pending.early and self._storage.master_key(ledger_id) is None:
                self._storage.set_master_key(ledger_id, key)
                pending.early = True
            pending.count += 1
            self._keys[ledger_id] = pending
        return (KEY_RECORD, ledger_id, 0, key, self._key_done, ledger_id)

    def fence_record(self, ledger_id: int, cb: Callback, ctx: Any) -> Record:
        """A FENCE record; ``cb(err, ctx)`` once it is settled (the flag in storage first)."""
        with self._lock:
            self._fences[ledger_id] = self._fences.get(ledger_id, 0) + 1
        return (FENCE_RECORD, ledger_id, 0, b"", self._fence_done, (ledger_id, cb, ctx))

    def lac_record(self, ledger_id: int, lac: int, cb: Callback, ctx: Any) -> Record:
        """A LAC record; ``cb(err, ctx)`` once it is settled (the LAC in storage first)."""
        return (LAC_RECORD, ledger_id, lac, b"", self._lac_done, (ledger_id, lac, cb, ctx))

    @staticmethod
    def drop(records: list[Record], error: BaseException) -> None:
        """Settle records the journal never took (their callbacks get ``error``)."""
        for _, _, _, _, cb, ctx in records:
            if cb is not None:
                cb(error, ctx)

    # --- callbacks (the journal's sync thread, or whoever saw a record refused) ---------
    def _key_done(self, err: BaseException | None, ledger_id: int) -> None:
        with self._lock:
            pending = self._keys[ledger_id]
            if err is None:
                if not self._apply(self._storage.set_master_key, ledger_id, pending.key):
                    return
                pending.durable = True
            pending.count -= 1
            if pending.count == 0:
                del self._keys[ledger_id]
                if pending.early and not pending.durable:  # refused: take back the key
                    self._apply(self._storage.clear_master_key, ledger_id)

    def _fence_done(self, err: BaseException | None, ctx: tuple[int, Callback, Any]) -> None:
        ledger_id, cb, cb_ctx = ctx
        with self._lock:
            if err is not None or self._apply(self._storage.set_fenced, ledger_id):
                count = self._fences.pop(ledger_id)
                if count > 1:
                    self._fences[ledger_id] = count - 1
        cb(err, cb_ctx)

    def _lac_done(self, err: BaseException | None, ctx: tuple[int, int, Callback, Any]) -> None:
        ledger_id, lac, cb, cb_ctx = ctx
        if err is None:
            with self._lock:  # read-modify-write, as :meth:`publish_lac` does on another thread
                self._apply(self._raise_lac, ledger_id, lac)
        cb(err, cb_ctx)

    def publish_lac(self, ledger_id: int, lac: int) -> None:
        """Raise the ledger's explicit LAC in storage now, before its LAC record is
        durable. Unlike a key or a fence, an explicit LAC is no state of this bookie's
        own: it says which entries Qa bookies acknowledged, which stays true whatever
        becomes of its record. A checkpoint may persist it before its record is durable,
        and a crash before either leaves the LAC the last stored entry carries, both
        true; readers keep the highest LAC they saw."""
        with self._lock:
            self._apply(self._raise_lac, ledger_id, lac)

    def _raise_lac(self, ledger_id: int, lac: int) -> None:
        current = self._storage.explicit_lac(ledger_id)
        self._storage.set_explicit_lac(ledger_id, max(lac, -1 if current is None else current))

    @staticmethod
    def _apply(change: Callable[..., Any], ledger_id: int, *args: Any) -> bool:
        """Change the ledger's state in storage; False when the storage cannot."""
        try:
            change(ledger_id, *args)
            return True
        except (WalkitError, OSError) as exc:
            log.warning("ledger %d: its state in ledger storage could not follow the journal (%s); journal replay"
                        " sets it right at the next start", ledger_id, exc, extra=context(ledger=ledger_id))
            return False
