"""The ``walkit bench`` benchmarks, one module each; results and the commands that
produced them are in docs/performance.md.

``journal``  ``walkit bench journal``: the group-commit journal against the disk's own
             floor (O_DIRECT 4 KiB write + fdatasync, raw sequential 1 MiB writes)
``bookie``   ``walkit bench bookie``: adds per second, latency and CPU per add through one
             connection to one bookie process
``ledger``   ``walkit bench ledger``: the ledger client (E=3 Qw=3 Qa=2, bookie processes):
             sequential add latency, pipelined adds per second, CPU per entry
``wal``      ``walkit bench wal``: the WriteAheadLog's appends (100 B / 1 KiB records)
             against a fdatasync'd file and SQLite
``read``     ``walkit bench read``: replay of a log written beforehand (cold and hot, batched
             and one record per entry) and tail visibility
``scale``    ``walkit bench scale``: cost as the data grows - rate over up to 10,000 ledgers,
             bookie RSS per ledger, restart, recovery and WAL failover against size
``gc``       ``walkit bench gc``: a GC pass over up to 1,000,000 ledgers in metadata (time,
             peak memory) and compaction (MB/s rewritten, a writer's add latency meanwhile)
``recovery`` ``walkit bench recovery``: a lost bookie's share re-replicated by ``walkit recover``
             and by autorecovery (MB/s), a concurrent writer's latency meanwhile
``metadata`` ``walkit bench metadata``: ledger creates, closes, opens and deletes per second on
             ``local://`` and ZooKeeper beside the store's own, WriteAheadLogs opened for writing
``bookkeeper`` ``walkit bench bookkeeper``: walkit against Apache BookKeeper 4.18.2 (Java bookies
             and client, its defaults and tuned for low latency) on the same machine: add
             latency, adds/s, reads, tail visibility, many ledgers; ``_bookkeeper_java`` holds
             BookKeeper's classpath, Java bookies and the Java bench peer (``java/``)
``spark``    ``walkit bench spark``: records/s read by Spark vs. the WAL's own replay()
             (needs walkit[spark]; imported only when that benchmark runs)

``_common`` holds what they share (a cluster of bookie processes, CPU meters from /proc,
the in-flight window loop, latency percentiles). Nothing is imported here: each command
imports its own module.
"""
