"""Spark replay speed: the ``persistlog`` data source against Spark's own JSON reader.

``run(n_records)`` writes the same records twice -- as a persistlog log (public API) and as
JSON lines (each line the record's JSON text, as the ``record`` column holds it) -- then
times a ``noop`` write of every column of each, in one local Spark session:

* ``spark.read.format("persistlog").load(log)`` (default columns), and
* ``spark.read.schema(<explicit>).json(lines)``.

Each is warmed up once, then timed ``REPEATS`` times alternately; the best run counts (the
other engineers' processes share the two cores). Figures: rows/s of each, their ratio
(target >= 1.0), and bytes on disk of each. Run alone: ``python bench/spark_bench.py [N]``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("bench")

REPEATS = 3
# The harness's small record ({"op": "put", "key": i, "value": "v" * 16}), here with a
# nested value so both readers have some structure to walk.
JSON_SCHEMA = "op STRING, key BIGINT, value STRUCT<name: STRING, n: BIGINT, score: DOUBLE, tags: ARRAY<STRING>>"


def records(n: int) -> list[dict[str, Any]]:
    return [
        {"op": "put", "key": i, "value": {"name": f"user-{i}", "n": i, "score": i / 8, "tags": ["a", "b"]}}
        for i in range(n)
    ]


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _write_log(url: str, recs: list[dict[str, Any]]) -> None:
    import persistlog

    lg = persistlog.open(url, lambda emit: None, rotate_bytes=None)
    for i in range(0, len(recs), 4096):
        lg.update_many(recs[i : i + 4096])
    lg.close()


def _write_json(path: str, recs: list[dict[str, Any]]) -> None:
    from persistlog._format.jsonify import to_json

    with open(path, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(to_json(r))
            f.write("\n")


def _best(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _alternate(persistlog_read: Callable[[], None], json_read: Callable[[], None]) -> dict[str, list[float]]:
    """Both readers warmed up once, then timed ``REPEATS`` times alternately."""
    persistlog_read()
    json_read()
    times: dict[str, list[float]] = {"persistlog": [], "json": []}
    for _ in range(REPEATS):
        times["persistlog"].append(_best(persistlog_read))
        times["json"].append(_best(json_read))
    return times


def run(n_records: int) -> dict[str, Any]:
    """Rows/s of both readers into a noop write, their ratio, and their bytes on disk."""
    import spark_replay

    root = tempfile.mkdtemp(prefix="spark-bench-")
    try:
        recs = records(n_records)
        log_url = os.path.join(root, "log")
        json_path = os.path.join(root, "records.jsonl")
        _write_log(log_url, recs)
        _write_json(json_path, recs)
        del recs
        spark = spark_replay.local_session("persistlog-bench", master="local[*]")
        spark.sparkContext.setLogLevel("ERROR")
        try:
            def persistlog_read() -> None:
                spark.read.format("persistlog").load(log_url).write.format("noop").mode("overwrite").save()

            def json_read() -> None:
                spark.read.schema(JSON_SCHEMA).json(json_path).write.format("noop").mode("overwrite").save()

            times = _alternate(persistlog_read, json_read)
            count = spark.read.format("persistlog").load(log_url).count()
            assert count == n_records, (count, n_records)
        finally:
            spark.stop()
        pl_rate = n_records / min(times["persistlog"])
        json_rate = n_records / min(times["json"])
        result = {
            "records": n_records,
            "persistlog_rows_per_s": round(pl_rate),
            "json_rows_per_s": round(json_rate),
            "ratio_vs_json": round(pl_rate / json_rate, 3),
            "persistlog_bytes": _dir_bytes(log_url),
            "json_bytes": os.path.getsize(json_path),
        }
        log.info("spark: %s", result)
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_shapes(shapes: list[tuple[str, list[dict[str, Any]], str]]) -> dict[str, dict[str, float]]:
    """For each ``(name, records, json_schema)``: rows/s of the persistlog source (a log
    written with ``update()`` per record, so ~1 MiB batches) and of Spark's JSON reader
    with that explicit schema, best of ``REPEATS`` alternate runs, in one session."""
    import spark_replay

    root = tempfile.mkdtemp(prefix="spark-shapes-")
    out: dict[str, dict[str, float]] = {}
    try:
        paths = {}
        for name, recs, _schema in shapes:
            log_url, json_path = os.path.join(root, f"{name}-log"), os.path.join(root, f"{name}.jsonl")
            import persistlog

            lg = persistlog.open(log_url, lambda emit: None, rotate_bytes=None)
            for r in recs:
                lg.update(r)
            lg.close()
            _write_json(json_path, recs)
            paths[name] = (log_url, json_path, len(recs))
        spark = spark_replay.local_session("persistlog-bench-shapes", master="local[*]")
        spark.sparkContext.setLogLevel("ERROR")
        try:
            for name, _recs, schema in shapes:
                log_url, json_path, n = paths[name]

                def persistlog_read() -> None:
                    spark.read.format("persistlog").load(log_url).write.format("noop").mode("overwrite").save()

                def json_read() -> None:
                    spark.read.schema(schema).json(json_path).write.format("noop").mode("overwrite").save()

                times = _alternate(persistlog_read, json_read)
                out[name] = {
                    "records": n,
                    "persistlog_rows_per_s": n / min(times["persistlog"]),
                    "json_rows_per_s": n / min(times["json"]),
                    "persistlog_spread": (max(times["persistlog"]) - min(times["persistlog"])) / min(times["persistlog"]),
                    "json_spread": (max(times["json"]) - min(times["json"])) / min(times["json"]),
                }
                log.info("spark shape %s: %s", name, out[name])
        finally:
            spark.stop()
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000), indent=2))
