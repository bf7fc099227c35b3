"""The Spark streaming source: end-to-end latency while tailing, and the speed of catching up.

* ``stream_latency``: a writer updates a local log 20 times a second (each update synced,
  carrying its wall-clock time); a query started at ``latest`` with a 500 ms trigger hands
  each micro-batch to ``foreachBatch``, which notes for every row how long ago its record
  was written. Targets: max <= 5 s, p50 <= 1.5 s. Counted once a first record arrived
  (the query's start-up, the executors' Python workers included, is not latency).
* ``stream_catchup``: the same logs (several, rotated) read by the batch source and by a
  stream starting at ``earliest`` with ``Trigger.AvailableNow``, each into a ``noop`` sink;
  rows/s of the stream against the batch source (target >= 0.8x). The stream's rate is
  the time of its micro-batches that read (planning from the header walk, reading,
  committing offsets);
  with the query's one-off start-up (its Python worker, the checkpoint) included it is
  shown beside it.
* Beside the latency, the same measurement on Spark's built-in ``rate`` source: the cost
  of a micro-batch on this machine whatever the source.

Run alone: ``python bench/spark_stream.py``.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from figures import Figure, at_most, info, vs_baseline
from workload import Config, Scratch

log = logging.getLogger("bench")

TRIGGER = "0.5 seconds"
CATCHUP_MIN_RATIO = 0.8
LATENCY_MAX_S = 5.0
LATENCY_P50_S = 1.5


@contextmanager
def _session() -> Iterator[Any]:
    import spark_replay

    spark = spark_replay.local_session("persistlog-stream-bench", master="local[*]")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()


def _spark(s: Scratch) -> Any:
    return s.service("spark-stream-session", _session)


def _foreach_batch_latencies(
    s: Scratch, df: Any, name: str, age: Callable[[Any, float], float | None], warm_up: Callable[[], None],
    workload: Callable[[], int | None],
) -> tuple[list[float], int]:
    """Run ``df`` into ``foreachBatch`` at a 500 ms trigger and note ``age(row, now)`` of
    every row it hands over (None: a warm-up row): after a warm-up (``warm_up()`` every 0.5 s until rows arrive:
    the query's start, the executors' Python workers), during ``workload()``, and until
    the number of rows it returns has arrived. Returns the ages and the micro-batch count."""
    latencies: list[float] = []
    batches: list[int] = []
    lock = threading.Lock()

    def each(frame: Any, batch_id: int) -> None:
        rows = frame.collect()
        now = time.time()
        with lock:
            batches.append(len(rows))
            latencies.extend(a for a in (age(r, now) for r in rows) if a is not None)

    query = (
        df.writeStream.foreachBatch(each)
        .option("checkpointLocation", s.fresh(name))
        .trigger(processingTime=TRIGGER)
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with lock:
                if latencies:
                    latencies.clear()
                    break
            warm_up()
            time.sleep(0.5)
        expected = workload()
        deadline = time.monotonic() + 60
        while expected is not None and time.monotonic() < deadline:
            with lock:
                if len(latencies) >= expected:
                    break
            time.sleep(0.1)
    finally:
        query.stop()
    with lock:
        if expected is not None and len(latencies) != expected:
            raise RuntimeError(f"the stream delivered {len(latencies)} of {expected} records")
        return list(latencies), len(batches)


def _record_age(row: Any, now: float) -> float | None:
    record = json.loads(row["record"])
    return None if "warm_up" in record else now - float(record["t"])


def stream_latency(cfg: Config, s: Scratch) -> Sequence[Figure]:
    import persistlog

    spark = _spark(s)
    url = s.fresh("stream-latency-log")
    seconds = 10.0 if cfg.quick else 30.0
    lg = persistlog.open(url, lambda emit: None, rotate_bytes=None)

    def write() -> int:
        n = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            lg.update({"t": time.time()}, sync=True)
            n += 1
            time.sleep(0.05)
        return n

    try:
        # The starting position is fixed once the query runs: the warm-up writes until a
        # record arrives.
        df = spark.readStream.format("persistlog").option("startingPosition", "latest").load(url).select("record")
        latencies, batches = _foreach_batch_latencies(
            s, df, "stream-latency-checkpoint", _record_age, lambda: lg.update({"warm_up": True}, sync=True), write,
        )
    finally:
        lg.close()
    rate = spark.readStream.format("rate").option("rowsPerSecond", 20).load().select("timestamp")
    floor, _ = _foreach_batch_latencies(
        s, rate, "stream-rate-checkpoint", lambda r, now: now - r["timestamp"].timestamp(),
        lambda: None, lambda: time.sleep(seconds),
    )
    worst, p50 = max(latencies), statistics.median(latencies)
    raw = {"records": len(latencies), "micro_batches": batches,
           "p90_s": round(sorted(latencies)[int(0.9 * len(latencies))], 3),
           "rate_source_max_s": round(max(floor), 3), "rate_source_p50_s": round(statistics.median(floor), 3)}
    log.info("stream latency: max %.3fs p50 %.3fs over %d records, %d micro-batches", worst, p50, len(latencies), batches)
    return [
        at_most("Spark stream latency, max (500 ms trigger)", "stream", worst, LATENCY_MAX_S, "s", raw=raw),
        at_most("Spark stream latency, p50 (500 ms trigger)", "stream", p50, LATENCY_P50_S, "s"),
        info("  Spark's own rate source, same sink: max", "stream", max(floor), "s"),
        info("  Spark's own rate source, same sink: p50", "stream", statistics.median(floor), "s"),
    ]


def _write_logs(url: str, n: int, logs: int) -> None:
    import persistlog

    lg = persistlog.open(url, lambda emit: None, rotate_bytes=None, retain=logs + 1)
    per = n // logs
    for k in range(logs):
        recs = [{"op": "put", "key": i, "value": {"name": f"user-{i}", "n": i, "tags": ["a", "b"]}} for i in range(k * per, (k + 1) * per)]
        for i in range(0, len(recs), 4096):
            lg.update_many(recs[i: i + 4096])
        if k + 1 < logs:
            lg.rotate()
    lg.close()


def stream_catchup(cfg: Config, s: Scratch) -> Sequence[Figure]:
    spark = _spark(s)
    n = 200_000 if cfg.quick else 800_000
    url = s.fresh("stream-catchup-log")
    _write_logs(url, n, 4)

    def batch() -> float:
        t = time.perf_counter()
        spark.read.format("persistlog").load(url).write.format("noop").mode("overwrite").save()
        return time.perf_counter() - t

    def stream() -> tuple[float, float]:
        """Seconds from start() to the end, and seconds spent in micro-batches reading."""
        checkpoint = tempfile.mkdtemp(prefix="ckpt-", dir=s.root)
        t = time.perf_counter()
        query = (
            spark.readStream.format("persistlog").option("startingPosition", "earliest").load(url)
            .writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        took = time.perf_counter() - t
        rows = sum(p["numInputRows"] for p in query.recentProgress)
        if rows != n:
            raise RuntimeError(f"the stream read {rows} rows of {n}")
        # The first micro-batch reads nothing (it fixes the starting position): start-up.
        return took, sum(p["durationMs"]["triggerExecution"] for p in query.recentProgress if p["numInputRows"]) / 1000

    batch(), stream()  # warm up: Python workers, JIT
    times: dict[str, list[float]] = {"batch": [], "stream": [], "stream_batches": []}
    for _ in range(2 if cfg.quick else 3):
        times["batch"].append(batch())
        whole, batches = stream()
        times["stream"].append(whole)
        times["stream_batches"].append(batches)
    batch_rate = n / min(times["batch"])
    stream_rate = n / min(times["stream_batches"])
    whole_rate = n / min(times["stream"])
    log.info("stream catch-up: %.0f rows/s (%.0f with query start), batch %.0f rows/s", stream_rate, whole_rate, batch_rate)
    return [
        vs_baseline("Spark stream catch-up from earliest", "stream", stream_rate, batch_rate,
                    "batch source", "rec/s", CATCHUP_MIN_RATIO, raw={"records": n, "logs": 4, **times}),
        info("  stream catch-up, query start-up included", "stream", whole_rate, "rec/s", batch_rate, "batch source"),
    ]


BENCHMARKS = {
    "stream_latency": stream_latency,
    "stream_catchup": stream_catchup,
}


if __name__ == "__main__":
    import sys

    from figures import table
    from workload import scratch

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cfg = Config.quick_run() if "--quick" in sys.argv else Config()
    with scratch(None) as sc:
        figures = [f for bench in BENCHMARKS.values() for f in bench(cfg, sc)]
    print(table(figures))
    os._exit(0)  # the JVM's non-daemon threads must not hold the exit
