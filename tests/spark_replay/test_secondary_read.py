"""Spark reading a secondary after a crash: the same state restore gives, never an error.

The secondary was behind when its writer died, and the restarted writer died right after
its first log reached it: that log follows a gap the writer declared. Spark, like restore,
reads up to the gap; once a log after the gap is complete, from that log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from crashsim import CrashSim
from kv_app import restore_state
from secondary_crashes import (
    crash_with_secondary_behind,
    restart_and_crash_on_the_secondary,
    write_the_secondary_whole_again,
)

import spark_replay
from persistlog._format.jsonify import from_json

pytestmark = pytest.mark.spark


def spark_state(spark: Any, url: str, **options: Any) -> dict[Any, Any]:
    df = spark_replay.read(spark, url, convention="resource", **options)
    return {from_json(r["key_json"]): from_json(r["value"]) for r in spark_replay.state(df).collect()}


def test_spark_reads_a_secondary_after_a_crash_as_restore_does(spark: Any, tmp_path: Path) -> None:
    sec_url, acked = crash_with_secondary_behind("local", tmp_path, CrashSim(), lease_ttl=0.4)
    restart_and_crash_on_the_secondary("local", tmp_path, sec_url, acked)
    restored, res = restore_state(sec_url)
    assert res.after_gap
    assert spark_state(spark, sec_url) == restored
    assert spark_state(spark, sec_url, logs="latest") == restored

    # A writer that gets the secondary whole again: Spark reads from the complete log
    # after the gap, and the history before it stays readable on its own.
    app = write_the_secondary_whole_again(str(tmp_path / "primary"), sec_url, acked + 1, 5)
    restored, res = restore_state(sec_url)
    assert restored == app.data and not res.after_gap
    assert spark_state(spark, sec_url) == restored
    assert spark_state(spark, sec_url, logs="latest") == restored
