"""A torture run's writer in a process of its own, so that it can be SIGKILLed.

``python tests/support/torture/writer.py <metadata-uri> <writer-number> <seed>`` opens the log
``torture`` for writing and appends records (``harness.pump``) until its stdin
ends, then closes the log; when the log fails (fenced, too few bookies) it exits 3. It reports on stdout, one line per event, times from the
system-wide monotonic clock (comparable with the parent's):

    open <t>                                  the open completed
    sent <seq> <seed> <t>                     record seq is about to be appended
    ack <seq> <segment> <entry> <slot> <t>    record seq acknowledged at that LSN
    fail <seq> <error...>                     record seq failed
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

import walkit
from support.torture.plan import CLIENT
from support.torture.workload import open_log, pump
from walkit.errors import WalkitError


def main(uri: str, number: int, seed: int) -> int:
    lock = threading.Lock()

    def emit(*words: object) -> None:
        with lock:
            sys.stdout.write(" ".join(map(str, words)) + "\n")
            sys.stdout.flush()

    stop = threading.Event()
    with walkit.BookKeeper(uri, **CLIENT) as bk:
        wal = open_log(bk)
        emit("open", repr(time.monotonic()))
        def until_stdin_ends() -> None:
            sys.stdin.read()
            stop.set()

        threading.Thread(target=until_stdin_ends, daemon=True).start()
        pump(wal, seed, number, stop, lambda s, d: emit("sent", s, seed, repr(time.monotonic())),
             lambda s, lsn, at: emit("ack", s, *lsn, repr(at)), lambda s, e: emit("fail", s, e.replace("\n", " ")))
        failed = not stop.is_set()  # pump returns early only when the log failed
        with contextlib.suppress(WalkitError):
            wal.close()
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
