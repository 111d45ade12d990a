"""bookie: walkit's storage server.

``Bookie(config)`` is the core (journal, ledger storage, checkpoints, restart); the
network server comes on top of it. See docs/architecture.md.
"""

from bookie._bookie import LAST_ENTRY, Bookie
from bookie._config import BookieConfig

__all__ = ["Bookie", "BookieConfig", "LAST_ENTRY"]
