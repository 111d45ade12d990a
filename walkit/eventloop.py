"""Which event loop walkit runs on: the standard library's or uvloop's (issue 38).

Theory of operation
-------------------
walkit makes its own event loops: the client's loop thread (:class:`walkit.client.LoopThread`,
also under a :class:`~walkit.LocalCluster`'s in-process bookies and ``walkit.testing``'s
proxies) and the bookie process's main loop (``python -m bookie``, ``asyncio.Runner``).
Both take them from :func:`new_event_loop` / :func:`loop_factory`, which read
``WALKIT_EVENT_LOOP`` each time a loop is made (a bookie process started by a
LocalCluster inherits the variable, so one setting covers the client and its bookies):

* ``asyncio`` - the standard library's own loop (``asyncio.SelectorEventLoop``: epoll),
  whatever event-loop policy the application set;
* ``uvloop`` - uvloop's (libuv); :class:`~walkit.errors.ConfigError` when uvloop is not
  installed (``pip install 'walkit[uvloop]'``);
* ``auto`` (the default, also when the variable is unset or empty) - the loop the
  application's own event-loop policy makes, when it set one (``asyncio.set_event_loop_policy(
  uvloop.EventLoopPolicy())`` gets uvloop, as before this setting existed); otherwise
  :data:`AUTO`, the loop that won the A/B on this project's benchmarks
  (docs/performance.md, "Event loops: asyncio or uvloop"), or the standard one when that
  is uvloop and uvloop is not installed.

Any other value is a :class:`~walkit.errors.ConfigError` naming it, raised where the loop
is made (a client's construction; a bookie's start, which then exits 2).

What walkit assumes of a loop: the asyncio event-loop API, stream transports that offer
``asyncio.Transport``'s methods (uvloop's do, without subclassing it: walkit casts,
never checks with ``isinstance``), and ``asyncio.BufferedProtocol``. One difference it
allows for: uvloop starts reading a new connection after ``connection_made`` returns, so
a ``pause_reading`` made in it does not hold (``walkit._testing._proxy``).
"""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Callable

from walkit.errors import ConfigError

__all__ = ["AUTO", "CHOICES", "ENV_VAR", "describe", "loop_factory", "new_event_loop", "setting"]

ENV_VAR = "WALKIT_EVENT_LOOP"
CHOICES = ("auto", "asyncio", "uvloop")
#: ``auto``'s loop when the application set no event-loop policy: the A/B's winner
#: (docs/performance.md, "Event loops: asyncio or uvloop").
AUTO = "asyncio"

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def setting() -> str:
    """``WALKIT_EVENT_LOOP``: ``auto`` (also unset or empty), ``asyncio`` or ``uvloop``."""
    value = os.environ.get(ENV_VAR, "").strip().lower() or "auto"
    if value not in CHOICES:
        raise ConfigError(f"{ENV_VAR} must be auto, asyncio or uvloop", value=os.environ.get(ENV_VAR))
    return value


def loop_factory() -> LoopFactory:
    """What makes the loop :func:`setting` asks for (``asyncio.Runner(loop_factory=...)``)."""
    chosen = setting()
    if chosen == "auto":
        if _application_set_a_policy():
            return asyncio.new_event_loop
        return _uvloop_factory() if AUTO == "uvloop" and _has_uvloop() else asyncio.SelectorEventLoop
    if chosen == "uvloop":
        return _uvloop_factory()
    return asyncio.SelectorEventLoop


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of the kind :func:`setting` asks for."""
    return loop_factory()()


def describe(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop``, ``asyncio``, or the module and class of another loop (for logs and reports)."""
    kind = type(loop)
    if kind.__module__.split(".")[0] == "uvloop":
        return "uvloop"
    if kind.__module__.split(".")[0] == "asyncio":
        return "asyncio"
    return f"{kind.__module__}.{kind.__qualname__}"


def _application_set_a_policy() -> bool:
    """Whether the process runs an event-loop policy other than the standard library's."""
    with warnings.catch_warnings():  # Python 3.14 deprecates policies (3.16 drops them)
        warnings.simplefilter("ignore", DeprecationWarning)
        return type(asyncio.get_event_loop_policy()) is not asyncio.DefaultEventLoopPolicy


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def _uvloop_factory() -> LoopFactory:
    try:
        import uvloop
    except ImportError as exc:
        raise ConfigError(f"{ENV_VAR}=uvloop but uvloop is not installed: pip install 'walkit[uvloop]', "
                          f"or set {ENV_VAR}=asyncio or auto", reason=str(exc)) from exc
    factory: LoopFactory = uvloop.new_event_loop
    return factory
