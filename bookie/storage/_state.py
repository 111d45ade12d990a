"""The per-ledger state API of the ledger storage (master key, fence, explicit LAC).

Theory of operation
-------------------
:class:`LedgerStates` holds one :class:`~bookie.storage._index.LedgerState` per ledger
in RAM (a few dozen bytes each — never anything per entry) behind the storage's lock.
A setter changes the state and marks it dirty; the next flush writes the index-file
header, so the state is durable once a flush that started after the setter returned
has completed (until then the journal holds it). Setters create the ledger if it is
absent, as ``add_entry`` does: journal replay may meet a fence or a LAC before any
entry of a ledger. Queries of an absent ledger answer as for a fresh one (no key, not
fenced, no LAC), except :meth:`LedgerStates.last_entry_id`, which raises.

It also keeps the storage's lifecycle flags: not yet open, open, or *failed* after an
I/O error on the write path — then every write raises ``StorageError`` (with the first
failure as ``__cause__``) until the storage is reopened from what is on disk, and
``on_failure`` is told once. A full disk (:func:`bookie.fs.is_no_space`: a write or
create refused with ENOSPC, never a failed sync) does not fail the storage: what was not
written stays in memory and is written by a later flush; ``on_no_space`` is told.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from types import TracebackType

from bookie.fs import is_no_space

from bookie.storage._format import MAX_LEDGER_ID, MAX_MASTER_KEY
from bookie.storage._index import LedgerState
from walkit.errors import InvalidArgumentError, NoSuchLedgerError, StorageError, UsageError

__all__ = ["LedgerStates"]

log = logging.getLogger("bookie.storage")

_MIN_LAC = -1


class LedgerStates:
    """Per-ledger state and lifecycle; the base of ``LedgerStorage``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[int, LedgerState] = {}
        #: Ledgers whose header changed since it was last handed to a flush.
        self._dirty: set[int] = set()
        self._failure: BaseException | None = None
        self._is_open = False
        #: ``with self._failing:`` - any error inside (but a full disk) leaves the storage failed.
        self._failing = _Failing(self)
        #: ``on_failure(error)``: called once when an I/O error failed the storage (any thread).
        self.on_failure: Callable[[BaseException], None] | None = None
        #: ``on_no_space(error)``: a write found the disk full (the storage did not fail).
        self.on_no_space: Callable[[BaseException], None] | None = None

    @property
    def failure(self) -> BaseException | None:
        """The I/O error that failed the storage (None: it has not failed)."""
        return self._failure

    def _latch(self, exc: BaseException) -> None:
        """An error on the write path: the storage fails (unless the disk is just full)."""
        if is_no_space(exc):
            self._report(self.on_no_space, exc)
        elif self._failure is None:
            self._failure = exc
            self._report(self.on_failure, exc)

    @staticmethod
    def _report(listener: Callable[[BaseException], None] | None, exc: BaseException) -> None:
        if listener is not None:
            try:
                listener(exc)
            except Exception:  # noqa: BLE001 - a listener must not change what the storage does
                log.exception("ledger storage: listener raised")

    # --- per-ledger state -----------------------------------------------------------
    def set_master_key(self, ledger_id: int, key: bytes) -> None:
        """Store the ledger's master key (creating the ledger if absent)."""
        if len(key) > MAX_MASTER_KEY:
            raise InvalidArgumentError("master key too long", ledger=ledger_id, length=len(key))
        key = bytes(key)
        with self._lock:
            state = self._writable_state(ledger_id)
            if state.master_key != key:
                state.master_key = key
                self._dirty.add(ledger_id)

    def clear_master_key(self, ledger_id: int) -> None:
        """Forget the ledger's master key (the bookie takes back a key it stored with a
        ledger's first entries when the journal refused the key's record)."""
        with self._lock:
            state = self._readable_state(ledger_id)
            if state is not None and state.master_key is not None:
                self._check_writable()
                state.master_key = None
                self._dirty.add(ledger_id)

    def master_key(self, ledger_id: int) -> bytes | None:
        with self._lock:
            state = self._readable_state(ledger_id)
            return state.master_key if state is not None else None

    def key_and_fence(self, ledger_id: int) -> tuple[bytes | None, bool]:
        """``(master key, fenced)`` in one look: a writer checks both on every add."""
        with self._lock:
            state = self._readable_state(ledger_id)
            return (None, False) if state is None else (state.master_key, state.fenced)

    def keys_and_fences(self, ledger_ids: Iterable[int]) -> dict[int, tuple[bytes | None, bool]]:
        """:meth:`key_and_fence` of several ledgers under one lock (a batch of adds)."""
        with self._lock:
            self._check_open()
            get = self._states.get
            out: dict[int, tuple[bytes | None, bool]] = {}
            for ledger_id in ledger_ids:
                state = get(ledger_id)
                out[ledger_id] = (None, False) if state is None else (state.master_key, state.fenced)
            return out

    def set_fenced(self, ledger_id: int) -> bool:
        """Fence the ledger; True if it was not fenced before."""
        with self._lock:
            state = self._writable_state(ledger_id)
            if state.fenced:
                return False
            state.fenced = True
            self._dirty.add(ledger_id)
            return True

    def is_fenced(self, ledger_id: int) -> bool:
        with self._lock:
            state = self._readable_state(ledger_id)
            return state is not None and state.fenced

    def set_explicit_lac(self, ledger_id: int, lac: int) -> None:
        if not _MIN_LAC <= lac <= MAX_LEDGER_ID:
            raise InvalidArgumentError("explicit LAC out of range", ledger=ledger_id, lac=lac)
        with self._lock:
            state = self._writable_state(ledger_id)
            if state.explicit_lac != lac:
                state.explicit_lac = lac
                self._dirty.add(ledger_id)

    def explicit_lac(self, ledger_id: int) -> int | None:
        with self._lock:
            state = self._readable_state(ledger_id)
            return state.explicit_lac if state is not None else None

    def has_ledger(self, ledger_id: int) -> bool:
        with self._lock:
            return self._readable_state(ledger_id) is not None

    def ledgers(self) -> list[int]:
        with self._lock:
            self._check_open()
            return sorted(self._states)

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest stored entry id (-1 when the ledger has no entry)."""
        with self._lock:
            return self._existing_state(ledger_id).last_entry_id

    # --- helpers (call with the lock held) --------------------------------------------
    def _readable_state(self, ledger_id: int) -> LedgerState | None:
        self._check_open()
        return self._states.get(ledger_id)

    def _existing_state(self, ledger_id: int) -> LedgerState:
        state = self._readable_state(ledger_id)
        if state is None:
            raise NoSuchLedgerError("ledger not stored", ledger=ledger_id)
        return state

    def _writable_state(self, ledger_id: int) -> LedgerState:
        if not 0 <= ledger_id <= MAX_LEDGER_ID:
            raise InvalidArgumentError("ledger id out of range", ledger=ledger_id)
        self._check_writable()
        state = self._states.get(ledger_id)
        if state is None:
            state = self._states[ledger_id] = LedgerState(ledger_id)
            self._dirty.add(ledger_id)
        return state

    def _check_open(self) -> None:
        if not self._is_open:
            raise UsageError("ledger storage is not open")

    def _check_writable(self) -> None:
        self._check_open()
        if self._failure is not None:
            raise StorageError(
                "ledger storage failed earlier; reopen it to recover", cause=repr(self._failure)
            ) from self._failure


class _Failing:
    """Context manager: an error inside leaves the storage failed (the first error is
    kept). A plain class, not ``@contextmanager``: it guards every add."""

    __slots__ = ("_states",)

    def __init__(self, states: LedgerStates) -> None:
        self._states = states

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            self._states._latch(exc)
