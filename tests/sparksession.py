"""The test run's one local Spark session (Spark starts once, in about ten seconds)."""

from __future__ import annotations

import warnings
from typing import Any


def shared_session() -> Any:
    """A ``local[2]`` session with the ``persistlog`` source registered; every caller in
    the run gets the same one."""
    import spark_replay

    with warnings.catch_warnings():
        # PySpark's optional-dependency probes (pandas) warn at session start.
        warnings.simplefilter("ignore")
        session = spark_replay.local_session(
            "persistlog-tests",
            master="local[2]",
            conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
        )
    session.sparkContext.setLogLevel("ERROR")
    return session
