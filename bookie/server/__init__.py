"""The bookie's network server: walkit's wire protocol - and BookKeeper's v3 and v2 on
the same port, through the same request path (issue 37) - over asyncio, on top of
:class:`~bookie.Bookie`.

The package's modules, one job each (each starts with its own theory of operation):

* :mod:`bookie.server._server`      :class:`BookieServer`: lifecycle (start, stop,
  registration) and the read-only transitions; owns what the parts share.
* :mod:`bookie.server._connection`  one client connection: its dialect picked by its
  first frame, bytes in, requests dispatched under flow control (back-pressure,
  pipelining), answers coalesced out.
* :mod:`bookie.server._admission`   whether an add is taken on or refused at once, and
  why (a pure decision: stopping, read-only, too many adds in flight).
* :mod:`bookie.server._writes`      the journal hand-off: adds and WRITE_LACs to the
  core, group-commit completions answered back on the loop.
* :mod:`bookie.server._reads`       reads (entry, range, LAC, info, ADMIN) on the read
  pool, or from memory on the loop.
* :mod:`bookie.server._long_poll`   long-poll reads parked until the LAC moves or
  their time is up.
* :mod:`bookie.server._disk_watch`  disk usage against the marks, ENOSPC and I/O
  failures: when to turn read-only and back.
* :mod:`bookie.server._tls`         TLS both ways it starts: from the first byte
  (walkit's clients, told apart by that byte) or by BookKeeper's START_TLS.
* :mod:`bookie.server._startup`     what start claims and checks before serving: TLS,
  directory locks, the bookie id, the cookie.
* :mod:`bookie.server._answers`     what the parts need of a connection to answer it,
  and the error answers.
* :mod:`bookie.server._hooks`       :class:`ServerHooks`, the seam where a harness
  stands between the bookie and the world (the disk, the endpoint, the reads).
"""

from __future__ import annotations

from bookie.fs.real import disk_usage
from bookie.server._hooks import ServerHooks
from bookie.server._long_poll import MAX_POLL_TIMEOUT_MS
from bookie.server._server import BookieServer
from bookie.server._startup import server_ssl_context

__all__ = ["BookieServer", "MAX_POLL_TIMEOUT_MS", "ServerHooks", "disk_usage", "server_ssl_context"]
