"""A log set read as one table: every log's rows with ``log_key``, ``state()`` per log and
key, the replay job over a set (README, "Many logs: LogSet").

The planner and partition reader run without Spark first (as an executor would, partitions
through pickle); two small tests then run the same on the run's one Spark session.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from conftest_s3 import MotoRequests

import persistlog
from persistlog._format.jsonify import from_json
from spark_replay._options import ReadOptions
from spark_replay._plan import LogPartition, LogToPlan, SetPartition, plan
from spark_replay._scan import read_set
from spark_replay._schema import arrow_schema, ddl

# Keys a Spark partition path or a shard name could trip over.
KEYS = ["7", "007", "queue/a/b", "100%", "日本", ".dot", "a b", "LOGSET"] + [f"q{i}" for i in range(12)]


def write_set(root: Path, keys: list[str] = KEYS) -> dict[str, tuple[list[Any], dict[Any, Any]]]:
    """Each key's log: ResourceStore records, a rotation for some, deletes for some. Returns
    what a restore of each log replays and the live state it leaves."""
    with persistlog.LogSet(root, rotate_records=7) as logset:
        for n, key in enumerate(keys):
            store: dict[Any, Any] = {}

            def enumerate_all(emit: Any, store: dict[Any, Any] = store) -> None:
                for k, v in list(store.items()):
                    emit({"op": "put", "key": k, "value": v})

            lg = logset.open(key, enumerate_all)
            for i in range(3 + n):
                k = i % 4
                if i % 5 == 4:
                    lg.update({"op": "del", "key": k})
                    store.pop(k, None)
                else:
                    lg.update({"op": "put", "key": k, "value": {"log": key, "i": i}})
                    store[k] = {"log": key, "i": i}
    out: dict[str, tuple[list[Any], dict[Any, Any]]] = {}
    reader = persistlog.LogSet(root, create=False)
    for key in keys:
        records: list[Any] = []
        reader.restore(key, records.append)
        live: dict[Any, Any] = {}
        for r in records:
            if r["op"] == "put":
                live[r["key"]] = r["value"]
            else:
                live.pop(r["key"], None)
        out[key] = (records, live)
    return out


def test_a_set_is_planned_at_once_and_packed_into_few_tasks(tmp_path: Path) -> None:
    root = tmp_path / "set"
    expected = write_set(root)
    persistlog.LogSet(root).open("opened, never written", lambda emit: None).close()
    (root / "ff" / "no%20log%20here").mkdir(parents=True)  # not this key's shard: skipped
    opts = replace(ReadOptions.parse({"path": str(root), "convention": "resource", "min_partitions": "2"}), log_set=True)
    parts = plan(opts)
    assert parts and all(isinstance(p, SetPartition) for p in parts)
    assert len(parts) <= 2  # small logs share tasks
    rows: list[dict[str, Any]] = []
    for part in parts:
        for batch in read_set(pickle.loads(pickle.dumps(part)), "records"):
            assert batch.schema == arrow_schema("records", "resource", log_set=True)
            rows.extend(pa.Table.from_batches([batch]).to_pylist())
    by_key: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_key.setdefault(row["log_key"], []).append(row)
    # Logs whose restore starts at a rotation hold older logs too (logs="all"): compare
    # each key's newest complete log on, where restore starts.
    latest = replace(opts, logs="latest")
    latest_rows = [r for p in plan(latest) for b in read_set(p, "records") for r in pa.Table.from_batches([b]).to_pylist()]
    for key, (records, _live) in expected.items():
        mine = sorted((r for r in latest_rows if r["log_key"] == key), key=lambda r: r["lsn"])
        assert [from_json(r["record"]) for r in mine] == records, key
        assert [r["lsn"] for r in by_key[key]] == sorted(r["lsn"] for r in by_key[key])
    assert set(by_key) == set(KEYS)  # the key that holds no log adds nothing
    # One log keeps its schema: no log_key column.
    assert "log_key" not in ddl("records", "resource") and ddl("records", "resource", True).startswith("log_key STRING NOT NULL, ")


@pytest.mark.slow
def test_a_set_on_s3_reads_without_spark_as_restore_replays_it(s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    root = f"s3://{s3_bucket}/queues"
    with persistlog.LogSet(root, storage_options=s3_storage_options) as logset:
        for i in range(6):
            lg = logset.open(f"q/{i}", lambda emit: None)
            lg.update_many([{"op": "put", "key": j, "value": i} for j in range(i + 1)])
    opts = replace(
        ReadOptions.parse({"path": root, "storage_options": json.dumps(s3_storage_options)}), log_set=True
    )
    rows = [r for p in plan(opts) for b in read_set(pickle.loads(pickle.dumps(p)), "records") for r in pa.Table.from_batches([b]).to_pylist()]
    got: dict[str, list[Any]] = {}
    for r in sorted(rows, key=lambda r: r["lsn"]):
        got.setdefault(r["log_key"], []).append(from_json(r["record"]))
    assert got == {f"q/{i}": [{"op": "put", "key": j, "value": i} for j in range(i + 1)] for i in range(6)}


@pytest.mark.slow
def test_planning_a_set_on_s3_sizes_segments_from_the_listings(
    s3_bucket: str, s3_storage_options: dict[str, Any], s3_requests: MotoRequests
) -> None:
    """The driver lists each key's log once and takes the segments' sizes from that
    listing: no HEAD per segment (nor any request per object beyond the start of each log)."""
    root = f"s3://{s3_bucket}/tenants"
    with persistlog.LogSet(root, storage_options=s3_storage_options) as logset:
        for i in range(4):
            lg = logset.open(f"t{i}", lambda emit: None)
            for j in range(3):
                lg.update({"op": "put", "key": j, "value": i}, sync=True)  # an object per sync
    opts = replace(
        ReadOptions.parse({"path": root, "storage_options": json.dumps(s3_storage_options)}), log_set=True
    )
    s3_requests.take()
    parts = plan(opts)
    seen = s3_requests.take()
    assert [r for r in seen if r[0] == "HEAD"] == []
    segments = sum(len(u.segments()) for p in parts for u in p.units if isinstance(u, LogPartition))
    assert segments >= 4 * 3
    rows = [r for p in parts for b in read_set(p, "records") for r in pa.Table.from_batches([b]).to_pylist()]
    assert sorted((r["log_key"], from_json(r["record"])["key"]) for r in rows) == sorted(
        (f"t{i}", j) for i in range(4) for j in range(3)
    )


@pytest.mark.spark
def test_spark_reads_a_set_as_one_table_and_state_is_per_log(spark: Any, tmp_path: Path) -> None:
    import spark_replay

    root = tmp_path / "set"
    expected = write_set(root)
    df = spark.read.format("persistlog").option("convention", "resource").option("logs", "latest").load(str(root))
    assert df.columns[0] == "log_key" and df.schema["log_key"].nullable is False
    rows = df.select("log_key", "lsn", "record").collect()
    got: dict[str, list[tuple[int, Any]]] = {}
    for r in rows:
        got.setdefault(r["log_key"], []).append((r["lsn"], from_json(r["record"])))
    assert {k: [rec for _lsn, rec in sorted(v, key=lambda x: x[0])] for k, v in got.items()} == {
        k: records for k, (records, _live) in expected.items()
    }
    live = spark_replay.state(spark.read.format("persistlog").option("convention", "resource").load(str(root)))
    assert live.columns[:3] == ["log_key", "key", "key_json"]
    state: dict[str, dict[Any, Any]] = {}
    for r in live.select("log_key", "key_json", "value").collect():
        state.setdefault(r["log_key"], {})[from_json(r["key_json"])] = from_json(r["value"])
    assert state == {k: lv for k, (_records, lv) in expected.items() if lv}
    with pytest.raises(ValueError, match="LSNs are per log"):
        spark_replay.state(df, as_of_lsn=3)
    # A single log of the set reads as before: no log_key.
    one = persistlog.LogSet(root).url("q3")
    assert "log_key" not in spark.read.format("persistlog").load(one).columns
    # Streaming a set is refused, clearly.
    query = spark.readStream.format("persistlog").load(str(root)).writeStream.format("noop").start()
    try:
        with pytest.raises(Exception, match="streaming a log set is not supported yet"):
            query.processAllAvailable()
    finally:
        query.stop()


@pytest.mark.spark
def test_the_replay_job_takes_a_set(spark: Any, tmp_path: Path) -> None:
    from spark_replay._job import main

    root = tmp_path / "set"
    expected = write_set(root, KEYS[:10])
    out = tmp_path / "out"
    stdout = io.StringIO()
    assert main([str(root), "--out", str(out), "-q"], spark=spark, stdout=stdout) == 0, stdout.getvalue()
    text = stdout.getvalue()
    assert "10 log(s) of a log set" in text and "(by log_key, log_seq)" in text, text
    partitioning = ds.partitioning(pa.schema([("log_key", pa.string()), ("log_seq", pa.int64())]), flavor="hive")
    events = ds.dataset(str(out / "events"), format="parquet", partitioning=partitioning).to_table()
    assert sorted(set(events.column("log_key").to_pylist())) == sorted(KEYS[:10])
    assert events.num_rows == spark.read.format("persistlog").load(str(root)).count()
    assert all(p.name.startswith("log_seq=") for p in (out / "events" / "log_key=7").iterdir() if p.is_dir())
    state = ds.dataset(str(out / "state"), format="parquet").to_table().to_pylist()
    got: dict[str, dict[Any, Any]] = {}
    for r in state:
        got.setdefault(r["log_key"], {})[from_json(r["key_json"])] = from_json(r["value"])
    assert got == {k: lv for k, (_records, lv) in expected.items() if lv}
    assert main([str(root), "--out", str(tmp_path / "o2"), "--as-of-lsn", "2", "-q"], spark=spark, stdout=io.StringIO()) == 2
    assert main([str(root), "--out", str(tmp_path / "o3"), "--follow", "-q"], spark=spark, stdout=io.StringIO()) == 2


def test_a_task_reads_small_logs_in_one_pass_as_the_driver_would_plan_them(tmp_path: Path) -> None:
    """Small local logs are left to the task to plan (LogToPlan) and read in one pass: the
    same rows, base_log included, as the ranges the driver's survey gives."""
    root = tmp_path / "set"
    write_set(root, KEYS[:6])
    # A log whose older logs retention deleted: it starts with a snapshot, and only its rows
    # from the complete marker on can start a replay.
    with persistlog.LogSet(root, rotate_records=4, retain=1) as logset:
        state: dict[int, int] = {}

        def enumerate_all(emit: Any) -> None:
            for k, v in state.items():
                emit({"op": "put", "key": k, "value": v})

        lg = logset.open("retained", enumerate_all)
        for i in range(10):
            state[i % 3] = i
            lg.update({"op": "put", "key": i % 3, "value": i})
    opts = replace(ReadOptions.parse({"path": str(root), "convention": "resource"}), log_set=True)
    parts = [pickle.loads(pickle.dumps(p)) for p in plan(opts)]
    units = [u for p in parts for u in p.units]
    assert any(isinstance(u, LogToPlan) and u.whole() is not None for u in units)
    surveyed = [
        SetPartition(tuple(r for u in p.units for r in (u.partitions() if isinstance(u, LogToPlan) else [u])))
        for p in parts
    ]

    def rows(tasks: list[SetPartition]) -> list[dict[str, Any]]:
        got = [r for p in tasks for b in read_set(p, "records") for r in pa.Table.from_batches([b]).to_pylist()]
        return sorted(got, key=lambda r: (r["log_key"], r["log_seq"], r["lsn"]))

    one_pass, planned = rows(parts), rows(surveyed)
    assert one_pass == planned
    retained = [r for r in one_pass if r["log_key"] == "retained"]
    assert len({r["log_seq"] for r in retained}) == 1 and retained[0]["lsn"] > 1
    complete = max(r["lsn"] for r in retained if r["kind"] == "snapshot")
    assert {r["base_log"] for r in retained if r["lsn"] < complete} == {None}
    assert {r["base_log"] for r in retained if r["lsn"] >= complete} == {retained[0]["log_seq"]}
    # A log bigger than WHOLE_LOG_BYTES, or read with bounds, takes the survey.
    bounded = replace(opts, to_lsn=3)
    assert all(u.whole() is None for p in plan(bounded) for u in p.units if isinstance(u, LogToPlan))


def test_a_small_log_that_follows_a_declared_gap_is_read_as_the_driver_plans_it(tmp_path: Path) -> None:
    """A key whose only log says in its header that it follows a gap (a secondary's writer
    declared it; here the writer died before that log held a record): the task meets the
    header, plans the log as the driver would, and the set reads as the driver's plan reads
    it, with no error."""
    from crashsim import CrashSim
    from secondary_crashes import crash_with_secondary_behind, restart_and_crash_on_the_secondary

    from persistlog._format import constants as F

    sec_url, acked = crash_with_secondary_behind("local", tmp_path, CrashSim(), lease_ttl=0.4)
    restart_and_crash_on_the_secondary("local", tmp_path, sec_url, acked)
    newest = max(p[0] for p in map(F.parse_segment_name, os.listdir(sec_url)) if p is not None)
    root = tmp_path / "set"
    logset = persistlog.LogSet(root)
    for key, seqs in (("after-gap", {newest}), ("whole", None)):
        target = Path(logset.url(key))
        target.mkdir(parents=True)
        for src in Path(sec_url).iterdir():
            parsed = F.parse_segment_name(src.name)
            if parsed is not None and (seqs is None or parsed[0] in seqs):
                shutil.copy(src, target / src.name)
    opts = replace(ReadOptions.parse({"path": str(root), "convention": "resource"}), log_set=True)
    parts = plan(opts)
    gap_unit = next(u for p in parts for u in p.units if u.log_key == "after-gap")
    assert isinstance(gap_unit, LogToPlan) and gap_unit.whole() is not None
    surveyed = [
        SetPartition(tuple(r for u in p.units for r in (u.partitions() if isinstance(u, LogToPlan) else [u])))
        for p in parts
    ]

    def rows(tasks: list[SetPartition]) -> list[tuple[Any, ...]]:
        got = [r for p in tasks for b in read_set(p, "records") for r in pa.Table.from_batches([b]).to_pylist()]
        return sorted((r["log_key"], r["log_seq"], r["lsn"], r["base_log"], r["record"]) for r in got)

    one_pass = rows(parts)
    assert one_pass == rows(surveyed)
    assert {r[0] for r in one_pass} == {"whole"}  # nothing after the gap is complete yet
