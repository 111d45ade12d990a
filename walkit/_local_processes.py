"""A local cluster's bookies as child processes: ``python -m bookie --conf <dir>/bookie.toml``.

Theory of operation
-------------------
:class:`ProcessRunner` starts each bookie of a :class:`~walkit.LocalCluster` as a child
process on the configuration it writes for that start, its stdout and stderr appended to
``<dir>/bookie.log``. The start is complete when the part of the log written since that
launch says "serving on" (the id and port it got; the admin endpoint is logged before);
a child that exits first, or says nothing in time, failed to start, and the error quotes
the end of its log. The child imports the very bookie and walkit this process runs
(PYTHONPATH).

A kill is SIGKILL (the registration goes at the metadata session's expiry, as after a
real crash); a stop is SIGTERM and a wait of up to STOP_TIMEOUT for a clean exit, then a
kill. :meth:`ProcessRunner.close` kills what is left, so no orphan bookie outlives a
cluster that was never stopped.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from walkit._local_state import STOP_TIMEOUT, Slot, Started, make_dir, port_taken, toml, write_atomically
from walkit.errors import BookieError, BookieUnavailableError, WalkitError

if TYPE_CHECKING:
    from bookie import BookieConfig

__all__ = ["ProcessRunner"]

_SERVING = re.compile(r"bookie (\S+) serving on \S+:(\d+)")
_ADMIN = re.compile(r"admin endpoint on http://\S+:(\d+)/")  # logged before "serving on"
_LOG_TAIL = 3000  # characters of a bookie's log quoted in an error


class ProcessRunner:
    """``python -m bookie --conf <dir>/bookie.toml`` per bookie."""

    def __init__(self) -> None:
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._log_from: dict[int, int] = {}

    def launch(self, slot: Slot, config: BookieConfig) -> None:
        conf = slot.conf
        make_dir(slot.directory)
        write_atomically(conf, "# written by walkit.LocalCluster for this start\n" + toml(config))
        log_path = slot.directory / "bookie.log"
        try:
            self._log_from[slot.index] = log_path.stat().st_size if log_path.exists() else 0
            with open(log_path, "ab") as log:
                self._procs[slot.index] = subprocess.Popen(
                    [sys.executable, "-m", "bookie", "--conf", str(conf)], stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, env=_child_env())
        except OSError as exc:
            raise BookieError("cannot start the bookie process", bookie=slot.index, reason=str(exc)) from exc

    def wait_started(self, slot: Slot, timeout: float) -> Started:
        proc = self._procs[slot.index]
        deadline = time.monotonic() + timeout
        while True:
            log = self._log(slot)
            found = _SERVING.search(log)
            if found:
                admin = _ADMIN.search(log, 0, found.start())
                return Started(found.group(1), int(found.group(2)), int(admin.group(1)) if admin else 0)
            if proc.poll() is not None:
                self._procs.pop(slot.index)
                raise self._start_failed(slot, f"bookie process exited with {proc.returncode}")
            if time.monotonic() > deadline:
                self.kill(slot)
                raise BookieUnavailableError("bookie process did not start serving in time", bookie=slot.index,
                                             timeout=timeout, log=self._tail(slot))
            time.sleep(0.05)

    def _start_failed(self, slot: Slot, what: str) -> WalkitError:
        tail = self._tail(slot)
        if slot.port and "address already in use" in tail.lower():
            return port_taken(slot)
        return BookieError(what, bookie=slot.index, log=tail)

    def _log(self, slot: Slot) -> str:
        """What the bookie logged since its latest launch."""
        with open(slot.directory / "bookie.log", "rb") as fh:
            fh.seek(self._log_from.get(slot.index, 0))
            return fh.read().decode(errors="replace")

    def _tail(self, slot: Slot) -> str:
        return "\n" + self._log(slot)[-_LOG_TAIL:]

    def pid(self, slot: Slot) -> int:
        """The process id of running bookie ``slot``."""
        return self._procs[slot.index].pid

    def running(self, slot: Slot) -> bool:
        proc = self._procs.get(slot.index)
        return proc is not None and proc.poll() is None

    def kill(self, slot: Slot) -> None:
        proc = self._procs.pop(slot.index)
        proc.kill()
        proc.wait(STOP_TIMEOUT)

    def stop(self, slots: list[Slot]) -> None:
        procs = {s.index: (s, self._procs.pop(s.index)) for s in slots if s.index in self._procs}
        for _, proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        errors = [error for slot, proc in procs.values() if (error := self._reap(slot, proc)) is not None]
        if errors:
            raise errors[0]

    def _reap(self, slot: Slot, proc: subprocess.Popen[bytes]) -> WalkitError | None:
        try:
            code = proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return BookieError("bookie process did not stop in time: killed", bookie=slot.index, log=self._tail(slot))
        if code != 0:
            return BookieError("bookie process did not stop cleanly", bookie=slot.index, exit_code=code,
                               log=self._tail(slot))
        return None

    def close(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._procs.clear()


def _child_env() -> dict[str, str]:
    """The child imports the very bookie and walkit this process runs."""
    import bookie

    root = str(Path(bookie.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=root + (os.pathsep + path if path else ""))

