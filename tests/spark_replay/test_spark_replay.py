"""The ``persistlog`` data source, state reconstruction and the job, on a real local Spark.

One session serves the whole module (see conftest); each test writes its own logs with
the public API and compares Spark's answer with what persistlog itself restores.
"""

from __future__ import annotations

import datetime
import io
import os
from typing import Any

import pyarrow.dataset as ds
import pytest
from pyspark.errors import PythonException
from pyspark.sql import functions as sf
from log_histories import batch_spans, flip_byte, restored_records, segment_paths, store_state, unseal, write_store_history

import persistlog
import spark_replay
from persistlog._format import constants as F
from persistlog._format.jsonify import from_json
from spark_replay._job import main

pytestmark = pytest.mark.spark

COLUMNS = {
    "log_seq": "bigint",
    "segment": "bigint",
    "lsn": "bigint",
    "commit_time": "timestamp",
    "kind": "string",
    "record": "string",
    "base_log": "bigint",
}
RESOURCE_COLUMNS = {**COLUMNS, "op": "string", "key": "string", "key_json": "string", "value": "string"}


def records_of(df: Any) -> list[Any]:
    # Sorted here rather than by Spark: one job instead of a shuffle.
    rows = sorted(df.select("lsn", "record").collect(), key=lambda r: r["lsn"])
    return [from_json(r["record"]) for r in rows]


def as_dict(state_df: Any) -> dict[Any, Any]:
    return {from_json(r["key_json"]): from_json(r["value"]) for r in state_df.select("key_json", "value").collect()}


def expected_at(history: list[tuple[int, dict[Any, Any]]], lsn: int) -> dict[Any, Any]:
    """The store's contents after its last change at or before ``lsn``."""
    state: dict[Any, Any] = {}
    for at, snapshot in history:
        if at > lsn:
            break
        state = snapshot
    return state


def test_frame_has_the_documented_schema_and_equals_restore(spark: Any, tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    write_store_history(url, rounds=2)
    raw = spark.read.format("persistlog").load(url)
    assert dict(raw.dtypes) == COLUMNS
    latest = spark_replay.read(spark, url, logs="latest", convention="resource")
    assert dict(latest.dtypes) == RESOURCE_COLUMNS
    restored = restored_records(url)
    assert records_of(latest) == restored
    # "all" adds the older retained logs in front, and nothing else.
    rows = sorted(raw.collect(), key=lambda r: r["lsn"])
    assert [from_json(r["record"]) for r in rows[-len(restored) :]] == restored
    assert len(rows) > len(restored)
    assert {r["kind"] for r in rows} == {"update", "snapshot"}
    # A destination without logs is an error, not an empty history.
    with pytest.raises(Exception, match="no persistlog log at"):
        spark_replay.read(spark, str(tmp_path / "nothing"), convention="resource").count()


def test_state_equals_the_store_at_many_points_across_rotations_and_retention(spark: Any, tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    history = write_store_history(url, rounds=4, ops_per_round=50, retain=2)
    df = spark_replay.read(spark, url, convention="resource").cache()
    rows = sorted(df.select("log_seq", "lsn", "kind", "base_log", "commit_time").collect(), key=lambda r: r["lsn"])
    replayable = [r for r in rows if r["base_log"] is not None]
    # Points: the newest, the middle of the retained history, a snapshot record of the
    # newest log's enumeration, and the very first replayable record.
    newest_snapshot = [r["lsn"] for r in rows if r["kind"] == "snapshot" and r["log_seq"] == rows[-1]["log_seq"]]
    points = sorted({rows[-1]["lsn"], replayable[len(replayable) // 2]["lsn"], replayable[0]["lsn"]}
                    | set(newest_snapshot[:1]))
    assert len(points) >= 3
    for lsn in points:
        assert as_dict(spark_replay.state(df, as_of_lsn=lsn)) == expected_at(history, lsn), lsn
    # The default point is the newest record: what a ResourceStore restores.
    restored, last_lsn = store_state(url)
    assert as_dict(spark_replay.state(df)) == restored and last_lsn == rows[-1]["lsn"]
    # A time picks the last record committed at or before it.
    mid = replayable[len(replayable) // 2]
    when = mid["commit_time"].replace(tzinfo=datetime.timezone.utc)
    at = spark_replay.resolve_lsn(df, as_of_time=when)
    assert at >= mid["lsn"]
    assert as_dict(spark_replay.state(df, as_of_time=when)) == expected_at(history, at)
    # The naive datetime PySpark itself returned means the session time zone, as in Spark.
    assert spark_replay.resolve_lsn(df, as_of_time=mid["commit_time"]) == at
    # Retention deleted what the first rounds need: say so rather than answer wrongly.
    first_kept = rows[0]["lsn"]
    assert first_kept > history[0][0]
    with pytest.raises(ValueError, match="older than"):
        spark_replay.state(df, as_of_lsn=replayable[0]["lsn"] - 1)
    with pytest.raises(ValueError, match="before the first record"):
        spark_replay.state(df, as_of_lsn=history[0][0])
    df.unpersist()


def test_raw_frames_take_key_and_op_expressions(spark: Any, tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    write_store_history(url, rounds=2, keys=10)
    df = spark.read.format("persistlog").load(url)
    # The message names the function it suggests by its full name (the record is JSON text).
    with pytest.raises(ValueError, match=r"pass key= as a column expression \(e\.g\. "
                       r"pyspark\.sql\.functions\.get_json_object\('record', '\$\.id'\)\)"):
        spark_replay.state(df)
    live = spark_replay.state(
        df,
        key=sf.get_json_object("record", "$.key"),
        op=sf.get_json_object("record", "$.op"),
    )
    restored, _ = store_state(url)
    assert {r["key"] for r in live.collect()} == {str(k) for k in restored}
    assert "record" in live.columns and "op" not in live.columns


def test_log_on_s3_replays(spark: Any, s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    url = f"s3://{s3_bucket}/app/log"
    write_store_history(url, rounds=2, ops_per_round=30, storage_options=s3_storage_options)
    df = spark_replay.read(spark, url, logs="latest", convention="resource", storage_options=s3_storage_options)
    assert records_of(df) == restored_records(url, storage_options=s3_storage_options)
    assert as_dict(spark_replay.state(df)) == store_state(url, storage_options=s3_storage_options)[0]


def test_torn_tail_is_dropped_and_corruption_fails_or_is_reported(spark: Any, tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    write_store_history(url, rounds=2, ops_per_round=40, durability="flush")
    last = segment_paths(url)[-1]
    unseal(last)
    offset, size, _ = batch_spans(last)[-1]
    with open(last, "r+b") as f:
        f.truncate(offset + size // 2)
    assert records_of(spark_replay.read(spark, url, logs="latest")) == restored_records(url)
    torn = spark_replay.corrupt_report(spark, url).collect()
    assert [(r["kind"], r["offset"]) for r in torn] == [("torn", offset)]

    before = spark.read.format("persistlog").load(url).count()
    first = segment_paths(url)[0]
    updates = [(o, s) for o, s, k in batch_spans(first) if k == F.KIND_UPDATE]  # one record each
    bad, bad_size = updates[len(updates) // 2]
    flip_byte(first, bad + bad_size - 1)
    with pytest.raises(PythonException) as info:
        spark.read.format("persistlog").load(url).count()
    message = str(info.value)
    assert "CorruptLogError" in message and f"offset {bad}" in message and os.path.basename(first) in message
    skipped = spark_replay.read(spark, url, recovery="skip")
    assert skipped.count() == before - 1
    report = spark_replay.corrupt_report(spark, url).orderBy("log_seq", "segment", "offset").collect()
    assert [(r["segment_name"], r["offset"], r["kind"]) for r in report] == [
        (os.path.basename(first), bad, "skipped"),
        (os.path.basename(last), offset, "torn"),
    ]


def test_job_writes_events_and_state_as_parquet(spark: Any, tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    history = write_store_history(url, rounds=2, ops_per_round=40, retain=2)
    out = str(tmp_path / "out")
    point = history[len(history) * 3 // 4][0]
    stdout = io.StringIO()
    assert main([url, "--out", out, "--as-of-lsn", str(point), "-q"], spark=spark, stdout=stdout) == 0
    text = stdout.getvalue()
    assert "records:" in text and "keys:" in text and "time range:" in text
    events = ds.dataset(f"{out}/events", format="parquet", partitioning="hive").to_table()
    assert events.num_rows == spark.read.format("persistlog").load(url).count()
    assert sorted(set(events.column("log_seq").to_pylist())) == sorted(
        {F.parse_segment_name(n)[0] for n in os.listdir(url) if F.parse_segment_name(n)}  # type: ignore[index]
    )
    state = ds.dataset(f"{out}/state", format="parquet").to_table().to_pylist()
    assert {from_json(r["key_json"]): from_json(r["value"]) for r in state} == expected_at(history, point)
    # Existing output is refused unless --overwrite; an old point is refused clearly.
    assert main([url, "--out", out, "-q"], spark=spark, stdout=io.StringIO()) == 2
    assert main([url, "--out", out, "--overwrite", "--as-of-lsn", "1", "-q"], spark=spark, stdout=io.StringIO()) == 2


def test_audit_example_runs(spark: Any, tmp_path: Any, capsys: Any) -> None:
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "audit.py")
    spec = importlib.util.spec_from_file_location("audit_example", path)
    assert spec is not None and spec.loader is not None
    audit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(audit)
    url = str(tmp_path / "log")
    audit.write_demo_log(url, 150)
    assert audit.main([url], spark=spark) == 0
    out = capsys.readouterr().out
    assert "1. records per log" in out and "history of key" in out and "created since" in out
