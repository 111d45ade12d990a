"""A SparkSession with the ``walkit`` format registered, set up for one machine.

For ``local[...]`` masters everything stays on loopback: the driver binds and
advertises 127.0.0.1 (``SPARK_LOCAL_IP`` too), the UI is off, memory is small, and the
Python workers are this interpreter (``PYSPARK_PYTHON``), the one that has walkit and
pyarrow installed. Other masters get only what is asked for: a cluster's executors
must reach the driver on a real address.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from walkit.spark._source import WalkitDataSource

__all__ = ["register", "spark_session"]

_LOCAL_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",  # walkit export draws its own bar
    "spark.sql.shuffle.partitions": "4",  # tiny aggregations here; Spark's 200 only costs task start-ups
}


def register(spark: SparkSession) -> None:
    """Make ``format("walkit")`` known to ``spark`` (idempotent)."""
    spark.dataSource.register(WalkitDataSource)


def spark_session(master: str = "local[*]", app_name: str = "walkit", *, driver_memory: str = "512m",
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """``SparkSession.builder...getOrCreate()`` with the walkit format registered."""
    os.environ["PYSPARK_PYTHON"] = os.environ.get("PYSPARK_PYTHON") or sys.executable
    builder = SparkSession.builder.master(master).appName(app_name)
    if master.startswith("local"):
        os.environ["SPARK_LOCAL_IP"] = os.environ.get("SPARK_LOCAL_IP") or "127.0.0.1"
        builder = builder.config("spark.driver.memory", driver_memory)
        for key, value in _LOCAL_CONF.items():
            builder = builder.config(key, value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark
