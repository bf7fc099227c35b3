"""Structured Streaming with local Spark: a query tails a ResourceStore that keeps writing
and rotating, is stopped and restarted from its checkpoint, and its Parquet output holds
every record exactly once and rebuilds the writer's state.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import persistlog
import spark_replay
from threads import wait_until


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


def start_query(spark: Any, url: str, out: str, options: dict[str, str],
                each_batch: Callable[[Any, int], None] | None = None) -> Any:
    """A query writing ``out/events`` as Parquet (or through ``each_batch``, foreachBatch)."""
    df = spark.readStream.format("persistlog").options(**options).load(url)
    writer = df.writeStream.option("checkpointLocation", f"{out}/checkpoint").trigger(processingTime="0.5 seconds")
    if each_batch is not None:
        return writer.foreachBatch(each_batch).start()
    return writer.format("parquet").option("path", f"{out}/events").start()


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
    check_events(spark, out, last_lsn, final_state, logs=3)  # rotations during the query


def check_events(spark: Any, out: str, last_lsn: int, final_state: dict[Any, Any], logs: int) -> None:
    """The query's table holds every record up to ``last_lsn`` exactly once, from at least
    ``logs`` logs, and rebuilds ``final_state``."""
    events = spark.read.parquet(f"{out}/events")
    lsns = sorted(r["lsn"] for r in events.select("lsn").collect())
    assert len(lsns) == len(set(lsns)), "a record was written twice"
    assert lsns == list(range(lsns[0], last_lsn + 1)), "a record is missing"
    assert events.select("log_seq").distinct().count() >= logs
    live = {
        (rec := json.loads(r["record"]))["key"]: rec["value"]
        for r in spark_replay.state(events).select("record").collect()
    }
    assert live == final_state


@pytest.mark.spark
def test_stream_follows_a_rotating_store_exactly_once_across_a_restart(spark: Any, tmp_path: Any) -> None:
    check_exactly_once(spark, str(tmp_path / "log"), str(tmp_path / "out"), {"convention": "resource"})


@pytest.mark.spark
def test_stream_from_s3_exactly_once_across_a_restart(
    spark: Any, tmp_path: Any, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    options = {"convention": "resource", "storage_options": json.dumps(s3_storage_options)}
    check_exactly_once(spark, f"s3://{s3_bucket}/app/log", str(tmp_path / "out"), options)


@pytest.mark.spark
def test_stream_options_are_checked(spark: Any, tmp_path: Any) -> None:
    spark_replay.register(spark)
    with pytest.raises(Exception, match="for batch reads"):
        spark.readStream.format("persistlog").option("logs", "latest").load(str(tmp_path)).writeStream.format(
            "memory"
        ).queryName("bad").start().processAllAvailable()


class FastRotation(threading.Thread):
    """A ResourceStore rotating every 64 KiB with retain=1 (every few seconds: 50 keys a
    batch, ten batches a second), until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.store = persistlog.ResourceStore.open(url, rotate_bytes=64 * 1024, retain=1)
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.n = 0
        self.outruns = 0
        self._rotating = threading.Lock()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.store.update({f"k{(self.n + i) % 200}": self.n + i for i in range(50)})
                self.n += 50
                time.sleep(0.1)
        except BaseException as e:  # reported by the test
            self.error = e

    def outrun(self) -> None:
        """Rotate twice now (unless stopping), and wait for retention to delete every log
        before them."""
        with self._rotating:
            if self.halt.is_set():
                return
            self.store.log.rotate()
            self.store.log.rotate()
            newest = self.store.log.seq
            wait_until(lambda: all(int(n[:20]) >= newest - 1 for n in os.listdir(self.url) if n.endswith(".plog")))
            self.outruns += 1

    def finish(self) -> dict[Any, Any]:
        with self._rotating:
            self.halt.set()
        self.join(30)
        assert self.error is None, self.error
        state = self.store.to_dict()
        self.store.close()
        return state


def outrun_parquet(out: str, w: FastRotation) -> Callable[[Any, int], None]:
    """A foreachBatch sink writing Parquet. Before it writes (so before the executors read)
    every other micro-batch, the writer rotates twice: retention deletes what the driver
    planned."""

    def write(df: Any, batch_id: int) -> None:
        if batch_id % 2:
            w.outrun()
        df.write.mode("overwrite").parquet(f"{out}/events/batch={batch_id}")

    return write


@pytest.mark.spark
def test_stream_under_fast_rotation_goes_on_with_on_retention_gap_restore(spark: Any, tmp_path: Any) -> None:
    """Retention deletes logs under the executors of micro-batches (and, as the writer
    rotates, under the driver's walk): with ``onRetentionGap=restore`` the query keeps
    running (each gap logged), writes no record twice, and its rows rebuild the writer's
    state. (What the default does at each of those places: test_stream_reader.py.)"""
    spark_replay.register(spark)
    url, out = str(tmp_path / "log"), str(tmp_path / "out")
    w = FastRotation(url)
    w.start()
    try:
        options = {"convention": "resource", "onRetentionGap": "restore"}
        q = start_query(spark, url, out, options, outrun_parquet(out, w))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and q.isActive and w.outruns < 2:
            time.sleep(0.2)
    finally:
        final_state = w.finish()
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert w.outruns >= 2
    events = spark.read.parquet(f"{out}/events")
    lsns = [r["lsn"] for r in events.select("lsn").collect()]
    assert lsns and len(lsns) == len(set(lsns)), "a record was written twice"
    live = {r["key"]: json.loads(r["value"]) for r in spark_replay.state(events).select("key", "value").collect()}
    assert live == final_state


@pytest.mark.spark
def test_a_stream_sees_one_history_across_a_handover(spark: Any, tmp_path: Any) -> None:
    """A query runs while the log's writer is handed over to another (``handover=True``)
    under load: every record of both writers exactly once, in one LSN order, and the
    state the new writer holds."""
    url, out = str(tmp_path / "log"), str(tmp_path / "out")
    spark_replay.register(spark)
    old = persistlog.ResourceStore.open(url, handover=True, rotate_bytes=None, retain=50)
    told: list[BaseException] = []

    def serve_old() -> None:
        n = 0
        try:
            while True:
                old[f"k{n % 17}"] = {"n": n, "by": "old"}
                n += 1
                time.sleep(0.002)
        except persistlog.HandedOver as e:
            told.append(e)

    serving = threading.Thread(target=serve_old, daemon=True)
    serving.start()
    q = start_query(spark, url, out, {"convention": "resource"})
    try:
        wait_rows(spark, out, 100)
        new = persistlog.ResourceStore.open(url, handover=True, handover_timeout=20, rotate_bytes=None, retain=50)
        serving.join(30)
        assert told and isinstance(told[0], persistlog.HandedOver), "the old writer was not told"
        for n in range(60):
            new[f"k{n % 17}"] = {"n": n, "by": "new"}
        new.log.sync()
        final_state, last_lsn = new.to_dict(), int(new.log.next_lsn) - 1
        new.close()
        old.close()
        wait_rows(spark, out, 160)
        q.processAllAvailable()
    finally:
        q.stop()
    check_events(spark, out, last_lsn, final_state, logs=2)  # the old writer's logs and the new one's


@pytest.mark.spark
def test_a_stream_starts_at_an_lsn_or_a_time(spark: Any, tmp_path: Any) -> None:
    from datetime import datetime, timezone

    spark_replay.register(spark)
    url = str(tmp_path / "log")
    lg = persistlog.open(url, lambda emit: None, rotate_bytes=None)
    lg.update_many([{"i": i} for i in range(1, 11)])
    lg.sync()
    time.sleep(0.01)
    between = datetime.now(timezone.utc)
    time.sleep(0.01)
    lg.update_many([{"i": i} for i in range(11, 21)])
    lg.close()

    def lsns(name: str, start: Any) -> list[int]:
        query = (
            spark.readStream.format("persistlog").option("startingPosition", start).load(url)
            .writeStream.format("memory").queryName(name).trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / name)).start()
        )
        query.awaitTermination(120)
        return [r["lsn"] for r in spark.sql(f"SELECT lsn FROM {name} WHERE kind = 'update' ORDER BY lsn").collect()]

    assert lsns("from_lsn", "7") == [r.lsn for r in persistlog.read(url, 7) if r.kind == "update"]
    assert lsns("from_time", between)[0] == 11  # an aware datetime, as Spark passes it
    for bad, message in (("7x", "startingPosition must be restore, earliest, latest, an LSN"),
                         ("999", "PositionError.*holds LSNs 1..20")):
        query = spark.readStream.format("persistlog").option("startingPosition", bad).load(url).writeStream.format(
            "noop").option("checkpointLocation", str(tmp_path / f"bad-{bad}")).start()
        try:
            with pytest.raises(Exception, match=message):
                query.processAllAvailable()
        finally:
            query.stop()
