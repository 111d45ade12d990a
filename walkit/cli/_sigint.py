"""Ctrl-C for a command that runs until it is interrupted (``walkit log tail``).

Theory of operation
-------------------
Python's own SIGINT handler raises KeyboardInterrupt in the main thread at whatever
bytecode it is running. A client's blocking call there waits in library code that is not
safe against that: ``concurrent.futures.Future.result`` enters the future's Condition in
Python (``threading.Condition.__enter__``), and a KeyboardInterrupt raised just after
the lock is taken, before the ``with`` knows of it, leaves the lock held - the client's
loop thread then blocks for good the next time it touches that future, and every wait
of the clean-up runs into its timeout (a ``log tail`` that did not end on Ctrl-C). And
Python runs its handlers between bytecodes: a signal that comes just before the main
thread blocks in such a wait (a lock's acquire, which only an EINTR cuts) stays pending
until the wait ends - a tail's wait for its next record, which may never come. A
KeyboardInterrupt raised inside a weakref callback or a finalizer that happens to run on
the main thread is printed ("Exception ignored in ...") and lost.

So the work runs on a thread of its own (:func:`run_until_interrupted`) and SIGINT is
never raised anywhere: the handler only notes it. The main thread waits in ``select`` on
a pipe that the work writes to when it ends and that is the signal module's wake-up fd:
the C-level handler writes to it at once, whichever thread the signal reaches, so a
signal that came before the wait began is still seen. The main thread then asks the
work to stop, from plain code, and waits for it
to finish cleanly; a further Ctrl-C meanwhile changes nothing (the clean-up is not cut
short). A SIGINT before the handler is installed (interpreter start-up, imports) ends the
process as Python does.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = ["run_until_interrupted"]


class _Wake:
    """The main thread's wait: until the work ends or SIGINT comes (a pipe both write to)."""

    def __init__(self) -> None:
        self.interrupted = False
        self.ended = False
        self._read, self._write = os.pipe()
        for fd in (self._read, self._write):
            os.set_blocking(fd, False)

    def wait(self) -> None:
        while not (self.interrupted or self.ended):  # a handler runs as soon as select returns
            select.select([self._read], [], [])
            with contextlib.suppress(BlockingIOError):
                os.read(self._read, 512)

    def end(self) -> None:
        """(The work's thread) the work is over."""
        self.ended = True
        with contextlib.suppress(BlockingIOError):  # full: the main thread wakes all the same
            os.write(self._write, b"\0")

    def on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.interrupted = True  # never raises: nothing is cut anywhere

    @contextlib.contextmanager
    def handling_sigint(self) -> Iterator[None]:
        """SIGINT noted by :meth:`on_sigint`, the C-level handler writing to the pipe."""
        with contextlib.ExitStack() as undo:
            undo.callback(os.close, self._read)
            undo.callback(os.close, self._write)
            undo.callback(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, self.on_sigint))
            undo.callback(signal.set_wakeup_fd, signal.set_wakeup_fd(self._write, warn_on_full_buffer=False))
            yield


def run_until_interrupted(work: Callable[[], None], stop: Callable[[], None], name: str) -> bool:
    """Run ``work()`` on a thread called ``name`` until it returns or SIGINT comes; on
    SIGINT, call ``stop()`` (here, not in the signal handler) and wait for ``work`` to
    return. Whether SIGINT came; what ``work`` raised is raised here."""
    wake = _Wake()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the main thread
            failed.append(exc)
        finally:
            wake.end()

    with wake.handling_sigint():
        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        wake.wait()
        if wake.interrupted:
            stop()
        thread.join()
    if failed:
        raise failed[0]
    return wake.interrupted
