"""Reading walkit logs and ledgers with Apache Spark (the ``walkit[spark]`` extra).

``spark_session()`` starts (or gets) a session with the ``walkit`` format registered
(``register(spark)`` does it for a session of your own); then::

    spark.read.format("walkit").option("metadata", uri).option("log", "orders").load()

gives ``namespace, log, lsn, lsn_key, segment, entry_id, slot, record``: ``lsn`` is
``str(LSN)`` ("segment/entry/slot", what ``after`` / ``until`` and ``LSN.parse``
take), ``lsn_key`` the same zero-padded ("%019d/%019d/%010d") so that it sorts as
LSNs do. ``.option("ledgers", "1,2,3")`` reads raw ledgers (``ledger_id, entry_id,
payload``). ``spark.readStream.format("walkit")`` follows a log with LSN offsets.
``export_log`` is ``walkit export``: Parquet by segment, resumable. Nothing here fences
a writer: every ledger is opened without recovery and the open segment is read to its
LAC. How it works: ``_source`` (the data source), ``_plan`` (pure planning), ``_read``
(the I/O), ``_export``; docs/architecture.md, "Spark". ``walkit bench spark`` is
``walkit.bench.spark``.
"""

from __future__ import annotations

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:  # the extra is optional: say how to get it
    raise ImportError("walkit.spark needs PySpark and pyarrow: pip install 'walkit[spark]'") from exc

from walkit.spark._export import STATE_FILE, ExportResult, export_log, read_state
from walkit.spark._plan import END_SLOT, lsn_key
from walkit.spark._session import register, spark_session
from walkit.spark._source import LEDGER_SCHEMA, LOG_SCHEMA, WalkitDataSource

__all__ = [
    "END_SLOT", "LEDGER_SCHEMA", "LOG_SCHEMA", "STATE_FILE", "ExportResult", "WalkitDataSource", "export_log",
    "lsn_key", "read_state", "register", "spark_session",
]
