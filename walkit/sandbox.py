"""``walkit sandbox``: a :class:`~walkit.LocalCluster` in the foreground, for other processes.

It prints, one ``key=value`` per line on stdout (flushed), what a client needs::

    metadata_uri=local:///.../metadata
    bookie.0=127.0.0.1:40123
    ...
    ready

and then waits. SIGINT or SIGTERM stops the bookies gracefully (adds in flight answered,
checkpointed) and the process exits 0. A signal that arrives while the cluster is still
starting is kept and acted on as soon as the start is over. Without ``--data`` the
cluster lives in a temporary directory, removed at the end.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["run_sandbox"]


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@contextlib.contextmanager
def _directory(data: str | None) -> Iterator[str]:
    if data is not None:
        yield data
        return
    with tempfile.TemporaryDirectory(prefix="walkit-sandbox-") as tmp:
        yield tmp


def run_sandbox(data: str | None, bookies: int = 3, processes: bool = False) -> int:
    """Run the cluster until SIGINT/SIGTERM; the exit code (0: stopped cleanly)."""
    from walkit import LocalCluster

    stop = threading.Event()
    with _stop_on_signals(stop), _directory(data) as directory:
        with LocalCluster(directory, bookies=bookies, processes=processes) as cluster:
            print(f"metadata_uri={cluster.metadata_uri}", flush=True)
            for i, bookie_id in enumerate(cluster.bookie_ids):
                print(f"bookie.{i}={bookie_id}", flush=True)
            print(f"data_dir={cluster.data_dir}", flush=True)
            print("ready", flush=True)
            while not stop.wait(0.5):  # a bounded wait: the signal handler runs between waits
                pass
            print("stopping", file=sys.stderr, flush=True)
    return 0
