"""The per-ledger state API of the ledger storage (master key, fence, explicit LAC).

Theory of operation
-------------------
:class:`LedgerStates` reads and sets the one :class:`~bookie.storage._index.LedgerState`
per ledger that the shared state holds in RAM (:class:`bookie.storage._shared.StorageShared`;
a few dozen bytes each — never anything per entry), under the storage's lock.
A setter changes the state and marks it dirty; the next flush writes the index-file
header, so the state is durable once a flush that started after the setter returned
has completed (until then the journal holds it). Setters create the ledger if it is
absent, as ``add_entry`` does: journal replay may meet a fence or a LAC before any
entry of a ledger. Queries of an absent ledger answer as for a fresh one (no key, not
fenced, no LAC), except :meth:`LedgerStates.last_entry_id`, which raises.

It also answers for the storage's lifecycle, whose flags live with the rest of the
shared state (:class:`bookie.storage._shared.StorageShared`): not yet open, open, or
*failed* after an I/O error on the write path — then every write raises ``StorageError``
(with the first failure as ``__cause__``) until the storage is reopened from what is on
disk, and ``on_failure`` is told once. A full disk (:func:`bookie.fs.is_no_space`: a
write or create refused with ENOSPC, never a failed sync) does not fail the storage:
what was not written stays in memory and is written by a later flush; ``on_no_space``
is told.
"""

from __future__ import annotations

from collections.abc import Iterable

from bookie.storage._format import MAX_LEDGER_ID, MAX_MASTER_KEY
from bookie.storage._shared import Listener, StorageShared
from walkit.errors import InvalidArgumentError

__all__ = ["LedgerStates"]

_MIN_LAC = -1


class LedgerStates:
    """Per-ledger state and lifecycle over the shared state; the base of ``LedgerStorage``."""

    def __init__(self, shared: StorageShared) -> None:
        self._shared = shared

    @property
    def failure(self) -> BaseException | None:
        """The I/O error that failed the storage (None: it has not failed)."""
        return self._shared.failure

    @property
    def on_failure(self) -> Listener | None:
        """``on_failure(error)``: called once when an I/O error failed the storage (any thread)."""
        return self._shared.on_failure

    @on_failure.setter
    def on_failure(self, listener: Listener | None) -> None:
        self._shared.on_failure = listener

    @property
    def on_no_space(self) -> Listener | None:
        """``on_no_space(error)``: a write found the disk full (the storage did not fail)."""
        return self._shared.on_no_space

    @on_no_space.setter
    def on_no_space(self, listener: Listener | None) -> None:
        self._shared.on_no_space = listener

    # --- per-ledger state -----------------------------------------------------------
    def set_master_key(self, ledger_id: int, key: bytes) -> None:
        """Store the ledger's master key (creating the ledger if absent)."""
        sh = self._shared
        if len(key) > MAX_MASTER_KEY:
            raise InvalidArgumentError("master key too long", ledger=ledger_id, length=len(key))
        key = bytes(key)
        with sh.lock:
            state = sh.writable_state(ledger_id)
            if state.master_key != key:
                state.master_key = key
                sh.dirty.add(ledger_id)

    def clear_master_key(self, ledger_id: int) -> None:
        """Forget the ledger's master key (the bookie takes back a key it stored with a
        ledger's first entries when the journal refused the key's record)."""
        sh = self._shared
        with sh.lock:
            state = sh.readable_state(ledger_id)
            if state is not None and state.master_key is not None:
                sh.check_writable()
                state.master_key = None
                sh.dirty.add(ledger_id)

    def master_key(self, ledger_id: int) -> bytes | None:
        sh = self._shared
        with sh.lock:
            state = sh.readable_state(ledger_id)
            return state.master_key if state is not None else None

    def key_and_fence(self, ledger_id: int) -> tuple[bytes | None, bool]:
        """``(master key, fenced)`` in one look: a writer checks both on every add."""
        sh = self._shared
        with sh.lock:
            state = sh.readable_state(ledger_id)
            return (None, False) if state is None else (state.master_key, state.fenced)

    def keys_and_fences(self, ledger_ids: Iterable[int]) -> dict[int, tuple[bytes | None, bool]]:
        """:meth:`key_and_fence` of several ledgers under one lock (a batch of adds)."""
        sh = self._shared
        with sh.lock:
            sh.check_open()
            get = sh.states.get
            out: dict[int, tuple[bytes | None, bool]] = {}
            for ledger_id in ledger_ids:
                state = get(ledger_id)
                out[ledger_id] = (None, False) if state is None else (state.master_key, state.fenced)
            return out

    def set_fenced(self, ledger_id: int) -> bool:
        """Fence the ledger; True if it was not fenced before."""
        sh = self._shared
        with sh.lock:
            state = sh.writable_state(ledger_id)
            if state.fenced:
                return False
            state.fenced = True
            sh.dirty.add(ledger_id)
            return True

    def is_fenced(self, ledger_id: int) -> bool:
        sh = self._shared
        with sh.lock:
            state = sh.readable_state(ledger_id)
            return state is not None and state.fenced

    def set_explicit_lac(self, ledger_id: int, lac: int) -> None:
        sh = self._shared
        if not _MIN_LAC <= lac <= MAX_LEDGER_ID:
            raise InvalidArgumentError("explicit LAC out of range", ledger=ledger_id, lac=lac)
        with sh.lock:
            state = sh.writable_state(ledger_id)
            if state.explicit_lac != lac:
                state.explicit_lac = lac
                sh.dirty.add(ledger_id)

    def explicit_lac(self, ledger_id: int) -> int | None:
        sh = self._shared
        with sh.lock:
            state = sh.readable_state(ledger_id)
            return state.explicit_lac if state is not None else None

    def has_ledger(self, ledger_id: int) -> bool:
        sh = self._shared
        with sh.lock:
            return sh.readable_state(ledger_id) is not None

    def ledgers(self) -> list[int]:
        sh = self._shared
        with sh.lock:
            sh.check_open()
            return sorted(sh.states)

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest stored entry id (-1 when the ledger has no entry)."""
        sh = self._shared
        with sh.lock:
            return sh.existing_state(ledger_id).last_entry_id
