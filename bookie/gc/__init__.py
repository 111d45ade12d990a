"""Garbage collection of a bookie: deleted ledgers leave its disks, sparse entry logs
are compacted, and space comes back (read-only bookies turn writable again).

- :mod:`bookie.gc._collector`: the thread and its passes (theory of operation there);
- :mod:`bookie.gc._scan`: the bookie's ledgers against the metadata store, range by range;
- :mod:`bookie.gc._compactor`: one entry log compacted within a pace and a time budget;
- :mod:`bookie.gc._policy`: pure decisions (rate limits, candidates, suspension).

The storage's own side (entry-log usage, crash-safe relocation and removal) is in
:mod:`bookie.storage._usage` and :mod:`bookie.storage._reclaim`.
"""

from bookie.gc._collector import GarbageCollector, GcMetadata, PassStats
from bookie.gc._policy import RateLimiter

__all__ = ["GarbageCollector", "GcMetadata", "PassStats", "RateLimiter"]
