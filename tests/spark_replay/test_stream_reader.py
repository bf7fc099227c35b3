"""The streaming reader driven as Spark drives it, without Spark: offsets, admission control,
partitions and the reads of each partition (partitions and the reader go through a pickle
round trip, as they do to reach executors).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import time
from datetime import datetime, timezone
from typing import Any

from pathlib import Path

import pyarrow as pa
import pytest
from crashsim import CrashSim
from kv_app import App, restore_state
from log_histories import batch_spans, change_batch, flip_byte, segment_paths, unseal
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows
from faults import FaultPlan
from threads import wait_until
from secondary_crashes import (
    crash_with_secondary_behind,
    restart_and_crash_on_the_secondary,
    steps,
    write_the_secondary_whole_again,
)

import persistlog
import persistlog._format.constants
from destinations import open_destination
from persistlog._write.retention import apply_retention
from persistlog._format.jsonify import from_json
from persistlog._errors import CorruptLogError, LogNotFoundError, PositionError, ResetRequired
from spark_replay._options import StreamOptions
from spark_replay._schema import arrow_schema
from spark_replay._stream import PersistLogStreamReader
from spark_replay._tail import Position, Tail


def stream_reader(url: str, **options: Any) -> PersistLogStreamReader:
    return PersistLogStreamReader(StreamOptions.parse({"path": url, **{k: str(v) for k, v in options.items()}}))


def micro_batch(reader: PersistLogStreamReader, start: dict[str, Any], limit: Any = None) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """One trigger: the end offset, the rows of the micro-batch and its partition count."""
    end = reader.latestOffset(start, limit or reader.getDefaultReadLimit())
    # Offsets are JSON in Spark's checkpoint: they must survive the round trip unchanged.
    assert json.loads(json.dumps(end)) == end
    parts = [pickle.loads(pickle.dumps(p)) for p in reader.partitions(start, end)]
    executor = pickle.loads(pickle.dumps(reader))
    batches = [b for p in parts for b in executor.read(p)]
    schema = arrow_schema("records", reader.opts.read.convention)
    rows = pa.Table.from_batches(batches, schema=schema).to_pylist() if batches else []
    reader.commit(end)
    return end, rows, len(parts)


def first_position(reader: PersistLogStreamReader) -> dict[str, Any]:
    """Where the stream starts: the end of its first micro-batch, which moves (reading
    nothing) from the initial offset to the place ``startingPosition`` means now."""
    initial = reader.initialOffset()
    end, rows, parts = micro_batch(reader, initial)
    assert rows == [] and parts == 0
    return end


def drain(reader: PersistLogStreamReader, start: dict[str, Any], limit: Any = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Triggers until nothing is new; every row, in order."""
    rows: list[dict[str, Any]] = []
    while True:
        end, got, _ = micro_batch(reader, start, limit)
        if end == start:
            return end, rows
        rows += got
        start = end


class Store:
    """A ResourceStore writing ``n`` puts at a time, each its own batch."""

    def __init__(self, url: str, **options: Any) -> None:
        self.url = url
        self.store = persistlog.ResourceStore.open(url, rotate_bytes=None, **options)
        self.n = 0

    def put(self, n: int) -> None:
        for _ in range(n):
            self.store[f"k{self.n % 17}"] = {"n": self.n}
            self.n += 1
            self.store.log.sync()

    def put_rotate_put(self, before: int, after: int) -> Store:
        self.put(before)
        self.store.log.rotate()
        self.put(after)
        return self

    @property
    def last_lsn(self) -> int:
        return int(self.store.log.next_lsn) - 1

    def close(self) -> None:
        self.store.close()


def resource_state(rows: list[dict[str, Any]]) -> dict[Any, Any]:
    """The state the rows of a stream rebuild (rows of the resource convention)."""
    state: dict[Any, Any] = {}
    for r in rows:
        if r["op"] == "put":
            state[from_json(r["key_json"])] = from_json(r["value"])
        else:
            state.pop(from_json(r["key_json"]), None)
    return state


def lsns(rows: list[dict[str, Any]]) -> list[int]:
    return [r["lsn"] for r in rows]


def test_restore_then_every_new_record_across_rotations_and_a_restart(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    w = Store(url).put_rotate_put(30, 10)
    reader = stream_reader(url, convention="resource")
    start = first_position(reader)
    # restore: from the newest complete log, which a rotation just made.
    assert start["log"] == 2
    end, rows = drain(reader, start)
    first = rows[0]["lsn"]
    w.put(5)
    w.store.log.rotate()
    w.put(7)
    # A restarted query: a fresh reader, the checkpointed offset.
    reader = stream_reader(url, convention="resource")
    end, more = drain(reader, end)
    rows += more
    assert lsns(rows) == list(range(first, w.last_lsn + 1))
    assert {r["log_seq"] for r in rows} == {2, 3}
    # base_log: null during log 2's enumeration, then the log whose snapshot is complete.
    assert rows[0]["base_log"] is None and rows[-1]["base_log"] == 3
    w.close()


def test_starting_positions(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    w = Store(url).put_rotate_put(10, 5)
    earliest = stream_reader(url, startingPosition="earliest")
    _, rows = drain(earliest, earliest.initialOffset())
    assert lsns(rows) == list(range(1, w.last_lsn + 1))
    assert all(r["base_log"] == 1 for r in rows if r["log_seq"] == 1)  # the first log ever
    latest = stream_reader(url, startingPosition="latest")
    at = first_position(latest)
    assert drain(latest, at)[1] == []
    before = w.last_lsn
    w.put(3)
    got = drain(latest, at)[1]
    assert lsns(got) == [before + 1, before + 2, before + 3]
    # The stream holds none of log 2's snapshot: its rows cannot rebuild a state.
    assert {r["base_log"] for r in got} == {None}
    cursor = f"{at['log']}:{at['segment']}:{at['offset']}:{at['next_lsn']}"
    for given in (cursor, json.dumps({k: at[k] for k in ("log", "segment", "offset", "next_lsn")})):
        r = stream_reader(url, startingPosition=given)
        # A cursor is a place already; the chain head there is not given with it.
        assert r.initialOffset() == {k: v for k, v in at.items() if k != "head"}
        assert lsns(drain(r, r.initialOffset())[1]) == [before + 1, before + 2, before + 3]
    with pytest.raises(ValueError, match="startingPosition"):
        stream_reader(url, startingPosition="yesterday").initialOffset()
    w.close()


def write_batches(url: str, sizes: list[int], rotate_after: int | None = None, **options: Any) -> list[datetime]:
    """A log of ``sizes[i]`` records per batch (``{"i": lsn}``), rotated after batch
    ``rotate_after``; the time just before each batch was committed."""
    lg = persistlog.open(url, lambda emit: None, rotate_bytes=None, durability="flush", **options)
    before: list[datetime] = []
    n = 0
    for i, size in enumerate(sizes):
        time.sleep(0.002)
        before.append(datetime.now(timezone.utc))
        time.sleep(0.002)
        lg.update_many([{"i": n + k + 1} for k in range(size)])
        lg.sync()
        n += size
        if i == rotate_after:
            lg.rotate(wait=True)
    lg.close()
    return before


def test_starting_position_by_lsn_and_time_uses_the_seek(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    before = write_batches(url, [10, 10, 5], rotate_after=1)
    every = [r.lsn for r in persistlog.read(url) if r.kind == "update"]
    # An LSN inside a batch: the stream starts with that record, as persistlog.read does.
    for given in ("5", 5, " 5 "):
        r = stream_reader(url, startingPosition=given)
        got = drain(r, first_position(r))[1]
        assert lsns(got) == [lsn for lsn in every if lsn >= 5]
    # It holds none of log 1 before LSN 5: no row of log 1 can rebuild a state; log 2's
    # rows can from its snapshot's end on, as in a batch read from LSN 5.
    assert {row["base_log"] for row in got if row["log_seq"] == 1} == {None}
    assert got[-1]["base_log"] == 2
    # LSN 1 is the start of the first log ever: the same as earliest.
    r, e = stream_reader(url, startingPosition="1"), stream_reader(url, startingPosition="earliest")
    from_one, earliest = drain(r, first_position(r))[1], drain(e, e.initialOffset())[1]
    assert [(row["lsn"], row["base_log"]) for row in from_one] == [(row["lsn"], row["base_log"]) for row in earliest]
    # A time: from the first batch committed at or after it (an ISO string, or the text
    # Spark makes of an aware datetime).
    for given in (before[1].isoformat(), str(before[1]), before[1].isoformat().replace("+00:00", "Z")):
        r = stream_reader(url, startingPosition=given)
        assert lsns(drain(r, first_position(r))[1])[0] == 11
    # The LSN the next record takes: the stream starts at the end and waits there.
    end_lsn = every[-1] + 1
    r = stream_reader(url, startingPosition=str(end_lsn))
    at = first_position(r)
    assert drain(r, at)[1] == []
    lg = persistlog.open(url, lambda emit: None, replay=lambda record: None)
    lg.update_many([{"i": "a"}, {"i": "b"}])
    lg.close()
    got = drain(r, at)[1]
    assert [from_json(row["record"]) for row in got] == [{"i": "a"}, {"i": "b"}]
    assert got[0]["lsn"] >= end_lsn


def test_a_starting_position_that_is_not_there_names_what_is(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    write_batches(url, [10, 10, 5], rotate_after=0, retain=1)
    held = [r.lsn for r in persistlog.read(url)]
    for given in (str(held[-1] + 2), "1", "2000-01-01T00:00:00Z"):
        reader = stream_reader(url, startingPosition=given)
        with pytest.raises(PositionError, match=f"holds LSNs {held[0]}..{held[-1]}") as e:
            first_position(reader)
        assert not isinstance(e.value, CorruptLogError)
    for bad in ("0", "-3", "5x", "2026-11-27T05:00:00", "tomorrow", "1:2:3"):
        with pytest.raises(ValueError, match="startingPosition must be restore, earliest, latest, an LSN"):
            stream_reader(url, startingPosition=bad)
    with pytest.raises(LogNotFoundError):
        first_position(stream_reader(str(tmp_path / "no-log"), startingPosition="3"))


@pytest.mark.parametrize("where", ["latest", "restore", "earliest"])
def test_a_query_restarted_before_its_first_commit_starts_where_it_first_did(tmp_path: Any, where: str) -> None:
    # Spark checkpoints where micro-batches end, not where the first one starts: after a
    # restart it asks for the initial offset again, when the log has moved on.
    url = str(tmp_path / "log")
    w = Store(url)
    w.put(3)
    reader = stream_reader(url, startingPosition=where)
    initial = reader.initialOffset()
    begun = reader.latestOffset(initial, ReadAllAvailable())
    w.put(2)
    end = reader.latestOffset(begun, ReadAllAvailable())
    rows = [r for p in reader.partitions(begun, end) for b in reader.read(p) for r in b.to_pylist()]
    w.store.log.rotate()  # restore, earliest and latest now mean other places
    again = stream_reader(url, startingPosition=where)
    assert again.initialOffset() == initial and again.partitions(initial, begun) == []
    assert [r for p in again.partitions(begun, end) for b in again.read(p) for r in b.to_pylist()] == rows
    assert rows
    w.close()


def test_a_stream_waits_for_the_first_log_only_when_told_to(tmp_path: Any) -> None:
    with pytest.raises(LogNotFoundError, match="does not exist"):
        stream_reader(str(tmp_path / "mistyped")).initialOffset()
    url = str(tmp_path / "log")
    os.mkdir(url)  # a service about to write its first log
    plain = stream_reader(url)
    with pytest.raises(LogNotFoundError, match="it is empty; .*waitForLog"):
        micro_batch(plain, plain.initialOffset())
    with pytest.raises(ValueError, match="waitforlog"):
        stream_reader(url, waitForLog="sometimes")
    reader = stream_reader(url, waitForLog="true")
    start = reader.initialOffset()
    assert micro_batch(reader, start)[0] == start
    w = Store(url)
    w.put(4)
    end, rows, _ = micro_batch(reader, start)
    assert rows == [] and end != start  # an empty micro-batch moves to the log's start
    assert lsns(drain(reader, end)[1]) == [1, 2, 3, 4]
    w.close()


@pytest.mark.parametrize("limit", ["records", "bytes"])
def test_admission_control(tmp_path: Any, limit: str) -> None:
    url = str(tmp_path / "log")
    w = Store(url)
    w.put(60)
    if limit == "records":
        reader = stream_reader(url, startingPosition="earliest", maxRecordsPerTrigger=7)
        assert reader.getDefaultReadLimit() == ReadMaxRows(7)
    else:
        reader = stream_reader(url, startingPosition="earliest", maxBytesPerTrigger=1000)
        assert reader.getDefaultReadLimit() == ReadMaxBytes(1000)
    start = first_position(reader)
    sizes, rows = [], []
    while True:
        end, got, _ = micro_batch(reader, start)
        if end == start:
            break
        sizes.append(len(got))
        rows += got
        start = end
    assert lsns(rows) == list(range(1, 61))
    if limit == "records":
        assert sizes == [7] * 8 + [4]
    else:
        assert 1 < len(sizes) < 60 and max(sizes) < 60
    # Spark asks for everything (Trigger.AvailableNow, ReadAllAvailable): the limit is off.
    reader = stream_reader(url, startingPosition="earliest", maxRecordsPerTrigger=7)
    assert len(micro_batch(reader, first_position(reader), ReadAllAvailable())[1]) == 60
    w.close()


def test_trigger_available_now_reads_what_exists_when_the_query_starts(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    w = Store(url, segment_bytes=4096)
    w.put(40)
    reader = stream_reader(url, startingPosition="earliest", maxRecordsPerTrigger=9)
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    last = w.last_lsn
    w.put(10)  # after the start: not for this run
    w.store.log.rotate()
    assert lsns(drain(reader, start)[1]) == list(range(1, last + 1))
    w.close()


@pytest.mark.slow
def test_a_micro_batch_is_split_at_batch_boundaries(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    lg = persistlog.open(url, lambda emit: None, rotate_bytes=None)
    for i in range(3000):
        lg.update({"i": i, "pad": os.urandom(1000).hex()}, sync=i % 10 == 9)
    lg.close()
    reader = stream_reader(url, startingPosition="earliest", max_partition_bytes="1m")
    end, rows, parts = micro_batch(reader, first_position(reader))
    assert parts >= 3  # over 3 MiB of log at 1 MiB a partition
    assert lsns(rows) == list(range(1, 3001))
    assert micro_batch(reader, end)[0] == end


def test_retention_gap_fails_naming_the_cursor_and_the_option(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    w = Store(url, retain=1)
    w.put(5)
    reader = stream_reader(url, startingPosition="earliest")
    start = reader.initialOffset()
    end, rows = drain(reader, start)
    w.put(3)  # read by nobody: the query is down while retention deletes log 1
    for _ in range(3):
        w.store.log.rotate()
    w.put(2)
    cursor = f"{end['log']}:{end['segment']}:{end['offset']}:{end['next_lsn']}"
    restarted = stream_reader(url, startingPosition="earliest")
    with pytest.raises(ResetRequired) as e:
        restarted.latestOffset(end, ReadAllAvailable())
    assert cursor in str(e.value) and "onRetentionGap=restore" in str(e.value)
    assert "LSN 6" in str(e.value)
    # Opting in: the stream goes on from the newest complete log, whose rows rebuild the state.
    lenient = stream_reader(url, onRetentionGap="restore", convention="resource")
    jump = lenient.latestOffset(end, ReadAllAvailable())
    assert jump["restored"] and jump["log"] == 4
    assert lenient.partitions(end, jump) == []
    rows = drain(lenient, jump)[1]
    assert {r["log_seq"] for r in rows} == {4} and rows[-1]["lsn"] == w.last_lsn
    w.close()


def test_a_stream_after_its_log_was_deleted_whole_goes_on_when_nothing_is_missing(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    w = Store(url, retain=1)
    w.put(5)
    w.store.log.rotate()
    reader = stream_reader(url, startingPosition="earliest")
    end, rows = drain(reader, reader.initialOffset())
    assert end["log"] == 2
    w.store.log.rotate()  # log 3 starts where the cursor stands; retention deletes log 2
    w.put(2)
    assert not os.path.exists(os.path.join(url, persistlog._format.constants.segment_name(2, 0)))
    more = drain(stream_reader(url), end)[1]
    assert lsns(more) == list(range(end["next_lsn"], w.last_lsn + 1))
    w.close()


@pytest.mark.parametrize("on_gap", ["fail", "restore"])
def test_a_micro_batch_whose_records_retention_deletes_before_the_executors_read_them(tmp_path: Any, on_gap: str) -> None:
    """The driver planned the micro-batch; retention deleted its log before the executors
    read it. ``fail``: the read fails naming the cursor and the option. ``restore``: the
    micro-batch keeps what it could read (nothing here), and the stream goes on from the
    newest complete log, whose rows rebuild the state."""
    url = str(tmp_path / "log")
    w = Store(url, retain=1)
    w.put(5)
    reader = stream_reader(url, startingPosition="earliest", convention="resource", onRetentionGap=on_gap)
    start = first_position(reader)
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = [pickle.loads(pickle.dumps(p)) for p in reader.partitions(start, end)]
    assert parts and end["log"] == 1
    w.store.log.rotate()  # log 2 complete: retention (retain=1) deletes log 1
    wait_until(lambda: not os.path.exists(os.path.join(url, persistlog._format.constants.segment_name(1, 0))))
    executor = pickle.loads(pickle.dumps(reader))
    if on_gap == "fail":
        with pytest.raises(ResetRequired) as e:
            [b for p in parts for b in executor.read(p)]
        cursor = f"{start['log']}:{start['segment']}:{start['offset']}:{start['next_lsn']}"
        assert cursor in str(e.value) and "deleted by retention" in str(e.value)
        assert "onRetentionGap=restore" in str(e.value)
        w.close()
        return
    assert [b for p in parts for b in executor.read(p)] == []
    jump = reader.latestOffset(end, ReadAllAvailable())
    assert jump["restored"] and jump["log"] == 2
    assert reader.partitions(end, jump) == []
    w.put(3)
    rows = drain(reader, jump)[1]
    assert {r["log_seq"] for r in rows} == {2} and rows[-1]["lsn"] == w.last_lsn
    assert resource_state(rows) == w.store.to_dict()
    w.close()


def test_a_log_deleted_as_the_driver_walks_it_is_a_retention_gap(clean_memory_fs: None) -> None:
    """Retention deletes the log between the walk's look at its size and its read: the
    stream's retention gap, naming the cursor and the option, never a FileNotFoundError."""
    w = Store("memory://walk-race/log", retain=10).put_rotate_put(5, 5)
    w.store.log.rotate()
    w.close()
    dest = open_destination("memory://walk-race/log")
    plan = FaultPlan().call_before("cat_file", lambda: apply_retention(dest, [3], 1, 3))
    tail = Tail(open_destination("faulty://walk-race/log", target_protocol="memory", faults=plan))
    with pytest.raises(ResetRequired) as e:
        tail.walk(Position(persistlog.Cursor(1, 0, 0, 1), 1))
    assert plan.fired and persistlog._format.constants.segment_name(1, 0) not in dest.list()
    assert "1:0:0:1" in str(e.value) and "deleted by retention" in str(e.value)
    assert "onRetentionGap=restore" in str(e.value)


class CountingList:
    """Counts the listings a destination serves (the calls that cost a LIST remotely)."""

    def __init__(self, dest: Any) -> None:
        self.calls = 0
        self._list = dest.list
        dest.list = self

    def __call__(self, *args: Any, **kwargs: Any) -> list[str]:
        self.calls += 1
        return self._list(*args, **kwargs)  # type: ignore[no-any-return]


def test_idle_and_growing_polls_never_list_locally(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    w = Store(url, segment_bytes=4096)
    w.put(5)
    reader = stream_reader(url)
    end, _ = drain(reader, reader.initialOffset())
    lists = CountingList(reader.tail.dest)
    for _ in range(20):
        assert micro_batch(reader, end)[0] == end
    w.put(100)  # new segments
    w.store.log.rotate()  # a new log
    w.put(3)
    end, rows = drain(reader, end)
    assert len(rows) >= 103 and rows[-1]["lsn"] == w.last_lsn
    assert lists.calls == 0
    w.close()


@pytest.mark.slow
def test_idle_polls_on_s3_send_no_list(s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    url = f"s3://{s3_bucket}/app/log"
    so = {"storage_options": json.dumps(s3_storage_options)}
    w = Store(url, storage_options=s3_storage_options)
    w.put(5)
    reader = stream_reader(url, **so)
    end, _ = drain(reader, reader.initialOffset())
    stats = reader.tail.dest.stats  # type: ignore[attr-defined]
    before = stats()
    for _ in range(10):
        assert micro_batch(reader, end)[0] == end
    idle = {k: v - before[k] for k, v in stats().items()}
    assert idle["LIST"] == 0 and idle["GET"] == 0
    assert idle["HEAD"] <= 2 * 10  # the next segment and the next log, per poll
    w.put(6)  # six segment objects
    w.store.log.rotate()
    w.put(2)
    before = stats()
    end, rows = drain(reader, end)
    assert rows[-1]["lsn"] == w.last_lsn and len(rows) >= 8
    assert stats()["LIST"] == before["LIST"]
    w.close()


def closed_log(url: str, n: int) -> str:
    """A store of ``n`` puts, closed; the path of its last segment."""
    w = Store(url)
    w.put(n)
    w.close()
    return segment_paths(url)[-1]


def test_a_torn_tail_is_waited_on_then_dropped_when_a_new_log_follows(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    last = closed_log(url, 6)
    unseal(last)  # as if the writer had died ...
    with open(last, "rb") as f:
        data = f.read()
    offset, size, _kind = batch_spans(last)[-1]
    with open(last, "ab") as f:
        f.write(data[offset: offset + size // 2])  # ... halfway through a batch
    reader = stream_reader(url, startingPosition="earliest")
    end, rows = drain(reader, reader.initialOffset())
    assert lsns(rows) == list(range(1, 7))
    w = Store(url)  # restores (dropping the torn tail) and starts log 2 at LSN 7
    w.put(2)
    more = drain(reader, end)[1]
    assert lsns(more) == list(range(7, w.last_lsn + 1))
    w.close()


def test_damage_in_the_middle_of_a_segment_fails_the_stream(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    path = closed_log(url, 6)
    offset, _size, _kind = batch_spans(path)[3]
    flip_byte(path, offset + 20)
    reader = stream_reader(url, startingPosition="earliest")
    with pytest.raises(CorruptLogError) as e:
        drain(reader, reader.initialOffset())
    assert (e.value.segment, e.value.offset) == (os.path.basename(path), offset)


def test_a_restarted_query_plans_the_micro_batch_its_checkpoint_left_unfinished(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    w = Store(url, segment_bytes=4096).put_rotate_put(40, 30)
    first = stream_reader(url, startingPosition="earliest", maxRecordsPerTrigger=50, max_partition_bytes="64k")
    start = first_position(first)
    end, rows, _ = micro_batch(first, start)
    # The query died after checkpointing [start, end) but before committing it: a new
    # driver plans the same range without having walked it.
    again = stream_reader(url, startingPosition="earliest", maxRecordsPerTrigger=50, max_partition_bytes="64k")
    parts = again.partitions(start, end)
    redone = [r for p in parts for b in again.read(p) for r in b.to_pylist()]
    assert redone == rows and 0 < len(rows) <= 50
    w.close()


@pytest.mark.parametrize("on_gap", ["fail", "restore"])
def test_a_gap_declared_on_a_secondary_is_waited_on_then_failed_or_restored_past(tmp_path: Path, on_gap: str) -> None:
    # The secondary was behind when its writer died; the restarted writer's first log there
    # declares the gap. The stream reads the history before it, then waits: nothing after
    # the gap rebuilds a state until a log after it is complete.
    sec_url, acked = crash_with_secondary_behind("local", tmp_path, CrashSim(), lease_ttl=0.4)
    reader = stream_reader(sec_url, startingPosition="earliest", convention="resource", onRetentionGap=on_gap)
    end, rows = drain(reader, reader.initialOffset())
    before = restore_state(sec_url)[0]
    restart_and_crash_on_the_secondary("local", tmp_path, sec_url, acked)
    assert restore_state(sec_url)[1].after_gap
    assert drain(reader, end) == (end, [])

    app = write_the_secondary_whole_again(str(tmp_path / "primary"), sec_url, acked + 1, 5)
    restored, res = restore_state(sec_url)
    assert restored == app.data and not res.after_gap
    if on_gap == "fail":
        with pytest.raises(ResetRequired) as e:
            reader.latestOffset(end, ReadAllAvailable())
        message = str(e.value)
        cursor = f"{end['log']}:{end['segment']}:{end['offset']}:{end['next_lsn']}"
        assert cursor in message and "declared" in message and "onRetentionGap=restore" in message
        assert f"log {end['log'] + 1} " in message
        return
    jump = reader.latestOffset(end, ReadAllAvailable())
    assert jump["restored"] and jump["log"] > end["log"] + 1
    assert reader.partitions(end, jump) == []
    after = drain(reader, jump)[1]
    assert {r["log_seq"] for r in after} == {jump["log"]}
    assert resource_state(rows) == before and resource_state(after) == restored


@pytest.mark.parametrize("on_gap", ["fail", "restore"])
def test_a_stream_of_a_secondary_that_missed_whole_logs_fails_or_restores_past_them(tmp_path: Path, on_gap: str) -> None:
    primary, sec = str(tmp_path / "primary"), str(tmp_path / "secondary")
    app = App()
    app.log = persistlog.open(primary, app.enumerate_all, concurrent_enumeration=True, secondaries=[sec])
    steps(app, 1, 5)
    app.log.close()
    reader = stream_reader(sec, startingPosition="earliest", convention="resource", onRetentionGap=on_gap)
    end, rows = drain(reader, reader.initialOffset())
    assert resource_state(rows) == app.data

    # Two rotations while the secondary is not there: its next log skips their numbers.
    app = App(restore_state(primary)[0])
    app.log = persistlog.open(primary, app.enumerate_all, concurrent_enumeration=True)
    steps(app, 6, 5)
    app.log.rotate()
    app.log.rotate()
    app.log.close()
    app = App(restore_state(primary)[0])
    app.log = persistlog.open(primary, app.enumerate_all, concurrent_enumeration=True, secondaries=[sec])
    steps(app, 11, 5)
    app.log.close()
    restored, res = restore_state(sec)
    assert restored == app.data and not res.after_gap
    seqs = sorted(int(name.split("-")[0]) for name in os.listdir(sec) if name.endswith(".plog"))
    assert seqs[0] == end["log"] and seqs[1] > end["log"] + 1

    restarted = stream_reader(sec, convention="resource", onRetentionGap=on_gap)
    if on_gap == "fail":
        with pytest.raises(ResetRequired) as e:
            restarted.latestOffset(end, ReadAllAvailable())
        assert "declared" in str(e.value) and f"log {seqs[1]} " in str(e.value)
        return
    jump = restarted.latestOffset(end, ReadAllAvailable())
    assert jump["restored"] and jump["log"] == seqs[-1]
    assert resource_state(drain(restarted, jump)[1]) == restored


def test_a_log_that_does_not_continue_the_one_before_without_declaring_a_gap_is_corruption(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    w = Store(url).put_rotate_put(6, 2)
    w.close()
    first = segment_paths(url)[0]
    unseal(first)
    offset, _size, _kind = [s for s in batch_spans(first) if s[2] != persistlog._format.constants.KIND_CONTROL][-1]
    with open(first, "r+b") as f:
        f.truncate(offset)  # log 1 lost its last record, and log 2 says nothing of it
    reader = stream_reader(url, startingPosition="earliest", onRetentionGap="restore")
    with pytest.raises(CorruptLogError, match="its end was lost"):
        drain(reader, reader.initialOffset())


# -- the hash chain across micro-batches and logs ---------------------------------------------


def record_spans(path: str) -> list[tuple[int, int]]:
    """``(offset, size)`` of the record batches of a segment file."""
    return [(o, n) for o, n, kind in batch_spans(path) if kind != persistlog._format.constants.KIND_CONTROL]


def without_head(offset: dict[str, Any]) -> dict[str, Any]:
    """The offset as a version that did not keep the chain head checkpointed it."""
    return {k: v for k, v in offset.items() if k != "head"}


def test_offsets_carry_the_chain_head_where_they_stand(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    w = Store(url, segment_bytes=4096).put_rotate_put(30, 20)
    reader = stream_reader(url, startingPosition="earliest", maxRecordsPerTrigger=7)
    start = first_position(reader)
    rows: list[dict[str, Any]] = []
    while True:
        end, got, _ = micro_batch(reader, start)
        if end == start:
            break
        rows += got
        # The hash of the batch just before the cursor, as stored.
        name = persistlog._format.constants.segment_name(end["log"], end["segment"])
        with open(os.path.join(url, name), "rb") as f:
            data = f.read(end["offset"])
        before = [(o, n) for o, n, _kind in batch_spans(os.path.join(url, name)) if o + n == end["offset"]]
        assert len(before) == 1
        assert end["head"] == hashlib.sha256(data[before[0][0]:]).hexdigest()
        start = end
    assert lsns(rows) == list(range(1, w.last_lsn + 1))
    w.close()
    # An unchained log has no head to carry.
    plain = str(tmp_path / "plain")
    w = Store(plain, hash_chain=False).put_rotate_put(5, 3)
    reader = stream_reader(plain, startingPosition="earliest", maxRecordsPerTrigger=2)
    end, rows = drain(reader, first_position(reader))
    assert lsns(rows) == list(range(1, w.last_lsn + 1)) and "head" not in end
    w.close()


def open_with_two_records(url: str) -> Any:
    """A log (chained) left open, holding ``{"i": 1}`` and ``{"i": 2}`` in one batch."""
    lg = persistlog.open(url, lambda emit: None, rotate_bytes=None)
    lg.update_many([{"i": 1}, {"i": 2}])
    lg.sync()
    return lg


def test_a_batch_changed_at_the_end_of_a_micro_batch_fails_the_next_one(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    lg = open_with_two_records(url)
    reader = stream_reader(url, startingPosition="earliest")
    first = micro_batch(reader, first_position(reader))[0]
    lg.update({"i": 3})
    lg.sync()
    path = segment_paths(url)[-1]
    changed, _size = record_spans(path)[-1]
    change_batch(path, changed)  # 3 becomes 2, its checksums fixed
    end, rows, _ = micro_batch(reader, first)
    assert [r["record"] for r in rows] == ['{"i":2}']  # what the micro-batch read is not what was written
    lg.update({"i": 4})  # linked to the hash the batch had when it was written
    lg.sync()
    after, _size = record_spans(path)[-1]
    # An offset from a version that did not keep the chain head takes the link as given.
    old = stream_reader(url, startingPosition="earliest")
    assert [r["record"] for r in micro_batch(old, without_head(end))[1]] == ['{"i":4}']
    with pytest.raises(CorruptLogError, match="hash chain broken") as e:
        micro_batch(reader, end)
    assert (e.value.log, e.value.segment, e.value.offset) == (1, os.path.basename(path), after)
    assert "where the scan started" in str(e.value)
    lg.close()


def test_a_batch_changed_after_the_driver_walked_it_fails_the_micro_batch(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    lg = open_with_two_records(url)
    reader = stream_reader(url, startingPosition="earliest")
    start = first_position(reader)
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    path = segment_paths(url)[-1]
    change_batch(path, record_spans(path)[-1][0])  # as the executors are about to read it
    executor = pickle.loads(pickle.dumps(reader))
    with pytest.raises(CorruptLogError, match="the driver's walk found") as e:
        [b for p in reader.partitions(start, end) for b in executor.read(p)]
    assert (e.value.log, e.value.segment, e.value.offset) == (1, os.path.basename(path), end["offset"])
    lg.close()


def test_a_batch_changed_before_a_seal_that_starts_a_micro_batch(tmp_path: Any) -> None:
    """The micro-batch after the changed batch holds no record of its log, only the seal
    (linked to the head that log had): the seal is read for its link."""
    url = str(tmp_path / "log")
    lg = open_with_two_records(url)
    path = segment_paths(url)[-1]
    change_batch(path, record_spans(path)[-1][0])
    reader = stream_reader(url, startingPosition="earliest")
    end = micro_batch(reader, first_position(reader))[0]
    lg.rotate(wait=True)
    lg.update({"i": 3})
    lg.sync()
    seal = batch_spans(path)[-1][0]
    assert micro_batch(stream_reader(url), without_head(end))[1] != []
    with pytest.raises(CorruptLogError, match="hash chain broken") as e:
        micro_batch(reader, end)
    assert (e.value.log, e.value.segment, e.value.offset) == (1, os.path.basename(path), seal)
    lg.close()


def test_a_batch_changed_at_the_end_of_an_unsealed_log_fails_where_the_next_log_starts(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    w = Store(url).put_rotate_put(6, 2)
    w.close()
    first, second = segment_paths(url)
    unseal(first)  # as if the writer had died after starting log 2
    change_batch(first, record_spans(first)[-1][0])
    reader = stream_reader(url, startingPosition="earliest")
    with pytest.raises(CorruptLogError, match="hash chain broken") as e:
        drain(reader, reader.initialOffset())
    assert (e.value.log, e.value.segment, e.value.offset) == (2, os.path.basename(second), 40)
    assert "the log before it ends at chain head" in str(e.value)


def test_a_next_log_that_links_elsewhere_fails_where_it_starts(tmp_path: Any) -> None:
    """Log 2 relinked from another head, every link after its first consistent and every
    checksum fixed: only the seam between the logs can tell."""
    from tests.persistlog import tamper

    url = str(tmp_path / "log")
    w = Store(url).put_rotate_put(6, 2)
    last = w.last_lsn
    w.close()
    segments = tamper.load(url)
    tamper.relink([s for s in segments if s.seq == 2], head=bytes(32))
    tamper.save(url, segments)
    second = segment_paths(url)[1]
    reader = stream_reader(url, startingPosition="earliest")
    with pytest.raises(CorruptLogError, match="hash chain broken") as e:
        drain(reader, reader.initialOffset())
    assert (e.value.log, e.value.segment, e.value.offset) == (2, os.path.basename(second), 40)
    # Read from log 2's start (the stream does not read log 1), its first link is taken as given.
    rows = drain(reader, {"log": 2, "segment": 0, "offset": 0, "next_lsn": 7})[1]
    assert lsns(rows) == list(range(7, last + 1))
