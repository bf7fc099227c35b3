"""Structured Streaming with local Spark: a query tails a ResourceStore that keeps writing
and rotating, is stopped and restarted from its checkpoint, and its Parquet output holds
every record exactly once and rebuilds the writer's state.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

import persistlog
import spark_replay


class Writer(threading.Thread):
    """A ResourceStore updated (and rotated) on a thread until stopped."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(daemon=True)
        self.store = persistlog.ResourceStore.open(url, rotate_bytes=None, retain=50, **options)
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.n = 0
        self.rotations = 0

    def burst(self, n: int) -> None:
        for _ in range(n):
            if self.n % 5 == 4:
                self.store.pop(f"k{self.n % 13}", None)
            else:
                self.store[f"k{self.n % 13}"] = {"n": self.n, "tag": f"t{self.n % 3}"}
            self.n += 1
        self.store.log.sync()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.burst(5)
                if self.n % 150 < 5:  # about every 3 s
                    self.store.log.rotate()
                    self.rotations += 1
                time.sleep(0.1)
        except BaseException as e:  # reported by the test
            self.error = e

    def finish(self) -> tuple[dict[Any, Any], int]:
        self.halt.set()
        self.join(30)
        assert self.error is None, self.error
        state, last = self.store.to_dict(), int(self.store.log.next_lsn) - 1
        self.store.close()
        return state, last


def start_query(spark: Any, url: str, out: str, options: dict[str, str]) -> Any:
    df = spark.readStream.format("persistlog").options(**options).load(url)
    return (
        df.writeStream.format("parquet")
        .option("path", f"{out}/events")
        .option("checkpointLocation", f"{out}/checkpoint")
        .trigger(processingTime="0.5 seconds")
        .start()
    )


def wait_rows(spark: Any, out: str, at_least: int, timeout: float = 90) -> None:
    """Wait for the table to grow (read without Spark, so as not to slow the query down;
    the checks at the end read it as Spark commits it)."""
    import pyarrow.dataset as ds

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ds.dataset(f"{out}/events", format="parquet").count_rows() >= at_least:
                return
        except (OSError, ValueError):  # nothing yet, or a file being written
            pass
        time.sleep(0.5)
    raise AssertionError(f"fewer than {at_least} rows in {out}/events after {timeout}s")


def check_exactly_once(spark: Any, url: str, out: str, options: dict[str, str]) -> None:
    spark_replay.register(spark)
    w = Writer(url, **({"storage_options": json.loads(options["storage_options"])} if "storage_options" in options else {}))
    w.burst(20)
    w.start()
    q = start_query(spark, url, out, options)
    try:
        wait_rows(spark, out, 60)
    finally:
        q.stop()
    stopped_at = w.n
    time.sleep(1.5)  # the writer goes on (and rotates) while the query is down
    assert w.n > stopped_at
    q = start_query(spark, url, out, options)
    try:
        # At least two rotations while the query runs, however fast or slow this machine.
        deadline = time.monotonic() + 120
        while w.rotations < 2 and w.error is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert w.rotations >= 2, w.error
        wait_rows(spark, out, w.n + 20)
        final_state, last_lsn = w.finish()
        q.processAllAvailable()
    finally:
        q.stop()
    events = spark.read.parquet(f"{out}/events")
    lsns = sorted(r["lsn"] for r in events.select("lsn").collect())
    assert len(lsns) == len(set(lsns)), "a record was written twice"
    assert lsns == list(range(lsns[0], last_lsn + 1)), "a record is missing"
    assert events.select("log_seq").distinct().count() >= 3  # rotations during the query
    live = {
        (rec := json.loads(r["record"]))["key"]: rec["value"]
        for r in spark_replay.state(events).select("record").collect()
    }
    assert live == final_state


def test_stream_follows_a_rotating_store_exactly_once_across_a_restart(spark: Any, tmp_path: Any) -> None:
    check_exactly_once(spark, str(tmp_path / "log"), str(tmp_path / "out"), {"convention": "resource"})


def test_stream_from_s3_exactly_once_across_a_restart(
    spark: Any, tmp_path: Any, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    options = {"convention": "resource", "storage_options": json.dumps(s3_storage_options)}
    check_exactly_once(spark, f"s3://{s3_bucket}/app/log", str(tmp_path / "out"), options)


def test_stream_options_are_checked(spark: Any, tmp_path: Any) -> None:
    spark_replay.register(spark)
    with pytest.raises(Exception, match="for batch reads"):
        spark.readStream.format("persistlog").option("logs", "latest").load(str(tmp_path)).writeStream.format(
            "memory"
        ).queryName("bad").start().processAllAvailable()
