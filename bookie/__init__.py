"""bookie: walkit's storage server.

``Bookie(config)`` is the core (journal, ledger storage, checkpoints, restart); the
network server comes on top of it; ``run(args)`` runs one until SIGTERM as ``python -m
bookie`` (and ``walkit bookie start``) asked. See docs/architecture.md.
"""

from bookie._bookie import LAST_ENTRY, Bookie
from bookie._config import BookieConfig
from bookie._main import run

__all__ = ["Bookie", "BookieConfig", "LAST_ENTRY", "run"]
