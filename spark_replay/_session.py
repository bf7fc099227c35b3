"""A Spark session that works on a laptop with no configuration."""

from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql import SparkSession


def local_session(
    app_name: str = "persistlog-replay", master: str = "local[*]", conf: dict[str, Any] | None = None
) -> SparkSession:
    """A local Spark session bound to the loopback interface, with ``persistlog`` registered.

    Executors run the same Python as this process (an editable install or a virtualenv is
    therefore visible to them), the UI is off and shuffles are small: tuned for one
    machine. On a cluster use ``spark-submit`` (or your own builder) and call
    :func:`spark_replay.register`.
    """
    from . import register

    # Spark reads these when its JVM starts: only effective before the first session.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(max(2, os.cpu_count() or 2)))
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
