"""The end of a loop iteration that submitted adds (bookie/server/_writes.py
``Writes.kick_journal``): answers held for it that wait on no fsync are written before
the journal is kicked, since an idle journal's kick writes and syncs on the loop's own
thread (an inline flush) and the loop answers nobody meanwhile."""

from __future__ import annotations

import collections
from types import SimpleNamespace
from typing import Any

from bookie.server._writes import Writes


class _Polls:
    def any_waiting(self) -> bool:
        return False


class _Conn:
    peer = "127.0.0.1:1"

    def __init__(self, log: list[str], name: str) -> None:
        self._log, self._name = log, name

    def flush(self) -> None:
        self._log.append(f"answers of {self._name} written")


class _Bookie:
    def __init__(self, log: list[str]) -> None:
        self._log = log

    def add_batch_cb(self, adds: list[Any], cb: Any, defer: bool = False) -> None:
        self._log.append(f"{len(adds)} adds framed")

    def kick_journal(self, inline: bool) -> None:
        self._log.append(f"journal kicked (inline={inline})")


def _writes(log: list[str], *, inline: bool = True) -> tuple[Writes, Any]:
    loop = SimpleNamespace(_ready=collections.deque(), call_soon=lambda fn, *a: loop._ready.append((fn, a)))
    host = SimpleNamespace(config=SimpleNamespace(journal_inline_flush=inline), bookie=_Bookie(log),
                           bookie_id="bookie-1", loop=loop)
    return Writes(host, _Polls()), loop  # type: ignore[arg-type]


def test_answers_held_by_a_read_callback_are_written_before_its_adds_inline_flush() -> None:
    """A read callback that brought an add and answered a poll (woken by the LAC the add
    carries) or a read from memory: that answer leaves before the add's write + sync."""
    log: list[str] = []
    writes, loop = _writes(log)
    reader = _Conn(log, "the reader")
    writes.reading()
    writes.submit_adds([SimpleNamespace(ledger_id=1, entry_id=5)], lambda err, adds: None)  # type: ignore[list-item]
    assert writes.write_later(reader)  # held for the end of the callback
    writes.read_done()  # the last callback of the iteration: the kick runs now
    assert log == ["1 adds framed", "answers of the reader written", "journal kicked (inline=True)"]
    assert not loop._ready and not writes.unflushed


def test_a_scheduled_kick_writes_what_callbacks_held_before_kicking() -> None:
    """Other connections still to be read: the kick runs at the next iteration's start,
    and the answers held by the callbacks before it go out first too; with nothing held,
    the kick writes nothing of its own before the journal."""
    log: list[str] = []
    writes, loop = _writes(log)
    loop._ready.append((lambda: None, ()))  # another connection's read is still to run
    writes.reading()
    writes.submit_adds([SimpleNamespace(ledger_id=1, entry_id=5)], lambda err, adds: None)  # type: ignore[list-item]
    writes.write_later(_Conn(log, "connection A"))
    writes.read_done()
    assert log == ["1 adds framed"], "nothing is written before the iteration's last read"
    loop._ready.popleft()
    fn, args = loop._ready.popleft()
    fn(*args)
    assert log == ["1 adds framed", "answers of connection A written", "journal kicked (inline=True)"]

    log.clear()
    writes.reading()
    writes.submit_adds([SimpleNamespace(ledger_id=1, entry_id=6)], lambda err, adds: None)  # type: ignore[list-item]
    writes.read_done()
    assert log == ["1 adds framed", "journal kicked (inline=True)"]
