"""Planning and reading partitions without Spark: the logic every executor runs.

``read_all`` plans a read and runs each partition's reader in this process, exactly as
Spark's driver and executors would (partitions go through a pickle round trip).
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import cbor2
import pyarrow as pa
import pytest
from log_histories import batch_spans, flip_byte, restored_records, segment_paths, unseal, write_store_history

import persistlog
from persistlog._format import constants as F
from persistlog._format.jsonify import from_json
from spark_replay._options import ReadOptions
from spark_replay._plan import LogPartition, plan
from spark_replay._scan import read_problems, read_records
from spark_replay._schema import arrow_schema


def read_all(url: str, **options: Any) -> tuple[list[dict[str, Any]], list[LogPartition]]:
    opts = ReadOptions.parse({"path": url, **{k: str(v) for k, v in options.items()}})
    parts = [pickle.loads(pickle.dumps(p)) for p in plan(opts)]
    batches = [b for p in parts for b in read_records(p)]
    schema = arrow_schema("records", opts.convention)
    for b in batches:
        assert b.schema == schema
    rows = pa.Table.from_batches(batches, schema=schema).to_pylist() if batches else []
    return rows, parts


def problems(url: str, **options: Any) -> list[tuple[Any, ...]]:
    opts = ReadOptions.parse({"path": url, "recovery": "skip", **{k: str(v) for k, v in options.items()}})
    return [row for p in plan(opts) for row in read_problems(p)]


def same_records(rows: list[dict[str, Any]], records: list[Any]) -> bool:
    canon = [cbor2.dumps(from_json(r["record"]), canonical=True) for r in rows]
    return canon == [cbor2.dumps(r, canonical=True) for r in records]


def write_log(url: str, n: int, *, rotate_every: int | None = None, sync_each: bool = False, **options: Any) -> None:
    """``n`` ResourceStore-style puts over 50 keys; ``sync_each`` makes every update its own
    batch (and, remotely, its own segment object)."""
    live: dict[int, Any] = {}

    def enumerate_all(emit: Any) -> None:
        for k, v in list(live.items()):
            emit({"op": "put", "key": k, "value": v})

    lg = persistlog.open(url, enumerate_all, rotate_bytes=None, **options)
    for i in range(n):
        live[i % 50] = {"i": i, "pad": "x" * 40}
        lg.update({"op": "put", "key": i % 50, "value": live[i % 50]}, sync=sync_each)
        if rotate_every and i and i % rotate_every == 0:
            lg.rotate()
    lg.close()


# -- options -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options,message",
    [
        ({}, "give the log URL"),
        ({"path": "x", "colour": "red"}, "unknown persistlog option"),
        ({"path": "x", "logs": "some"}, "logs must be one of"),
        ({"path": "x", "from_lsn": "abc"}, "integer LSN"),
        ({"path": "x", "to_lsn": "0"}, ">= 1"),
        ({"path": "x", "from_lsn": "9", "to_lsn": "3"}, "before from_lsn"),
        ({"path": "x", "max_partition_bytes": "lots"}, "byte count"),
        ({"path": "x", "max_partition_bytes": "1k"}, "at least"),
        ({"path": "x", "storage_options": "{bad"}, "JSON object"),
        ({"path": "x", "storage_options": "[1]"}, "JSON object"),
        ({"path": "x", "convention": "mine"}, "convention must be"),
        ({"path": "x", "recovery": "lenient"}, "recovery must be"),
    ],
)
def test_bad_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReadOptions.parse(options)


def test_options_are_case_insensitive_and_sizes_take_units() -> None:
    opts = ReadOptions.parse({"PATH": "u", "Max_Partition_Bytes": "64MiB", "LOGS": "Latest"})
    assert (opts.url, opts.max_partition_bytes, opts.logs) == ("u", 64 << 20, "latest")


# -- what a read yields ------------------------------------------------------------------------


def test_latest_read_yields_exactly_what_restore_replays(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    write_store_history(url, rounds=3)
    rows, _ = read_all(url, logs="latest", convention="resource")
    assert rows and same_records(rows, restored_records(url))
    lsns = [r["lsn"] for r in rows]
    assert lsns == list(range(lsns[0], lsns[0] + len(lsns)))  # every LSN, in order
    for r in rows:
        record = from_json(r["record"])
        assert r["op"] == record["op"]
        assert from_json(r["key_json"]) == record["key"]
        assert r["key"] == (record["key"] if isinstance(record["key"], str) else r["key_json"])
        assert (r["value"] is None) == (record["op"] == "del")


def test_all_logs_read_every_retained_log_in_lsn_order(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    write_store_history(url, rounds=3, retain=3)
    rows, parts = read_all(url)
    seqs = sorted({F.parse_segment_name(n)[0] for n in os.listdir(url) if F.parse_segment_name(n)})  # type: ignore[index]
    assert sorted({r["log_seq"] for r in rows}) == seqs
    lsns = [r["lsn"] for r in rows]
    assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns)
    # Rows of the oldest log before its snapshot completed cannot start a replay.
    oldest = [r for r in rows if r["log_seq"] == seqs[0]]
    assert oldest[0]["base_log"] is None or seqs[0] == 1
    assert rows[-1]["base_log"] is not None


def test_genesis_log_is_a_replay_base_from_its_first_record(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    write_log(url, 30)
    rows, _ = read_all(url)
    assert rows[0]["lsn"] == 1 and all(r["base_log"] == 1 for r in rows)


def test_from_and_to_lsn_select_a_range(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    write_log(url, 400, rotate_every=100, retain=10)
    everything, _ = read_all(url)
    some, parts = read_all(url, from_lsn=250, to_lsn=320)
    assert [r["lsn"] for r in some] == list(range(250, 321))
    pick = ("log_seq", "lsn", "kind", "record")
    assert [[r[k] for k in pick] for r in some] == [
        [r[k] for k in pick] for r in everything if 250 <= r["lsn"] <= 320
    ]
    # Logs wholly before from_lsn are not planned at all.
    assert min(p.seq for p in parts) == some[0]["log_seq"] > 1
    # A log cut by from_lsn cannot start a replay: its snapshot is not in the frame.
    assert all(r["base_log"] != some[0]["log_seq"] for r in some)


@pytest.mark.slow
def test_big_segments_split_at_batch_boundaries(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    # Many small batches in one big segment.
    write_log(url, 3000, segment_bytes=16 << 20, durability="flush")
    whole, one = read_all(url, max_partition_bytes="64m")
    split, parts = read_all(url, max_partition_bytes="64k")
    assert len(one) == 1 and len(parts) > 3
    assert split == whole
    starts = {(p.start[0], p.start[1]) for p in parts}
    spans = {off for off, _, _ in batch_spans(segment_paths(url)[0])}
    assert all(off == 0 or off in spans for _, off in starts)
    assert all(p.start[2] is not None for p in parts if p.start[1])
    assert all(p.nbytes <= 64 * 1024 for p in parts)


@pytest.mark.slow
def test_small_remote_segments_are_packed(clean_memory_fs: None) -> None:
    url = "memory://packed/log"
    write_log(url, 800, sync_each=True)  # one object per sync
    segments = [n for n in persistlog_names(url) if F.parse_segment_name(n)]
    rows, parts = read_all(url)
    assert len(segments) > 100 and len(parts) == 1
    assert same_records(rows, restored_records(url))
    rows64, parts64 = read_all(url, max_partition_bytes="64k")
    assert rows64 == rows and len(parts64) > 1


def persistlog_names(url: str) -> list[str]:
    from destinations import open_destination

    return open_destination(url).list()


def test_partitions_pickle_small_and_never_show_credentials(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    write_log(url, 10)
    (part,) = plan(ReadOptions.parse({"path": url}))
    part.storage_options = {"secret": "hunter2"}
    assert "hunter2" not in repr(part)
    assert len(pickle.dumps(part)) < 1024


def test_a_destination_without_logs_is_an_error(tmp_path: Any) -> None:
    with pytest.raises(persistlog.LogNotFoundError, match="does not exist"):
        read_all(str(tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(persistlog.LogNotFoundError, match="it is empty"):
        read_all(str(tmp_path / "empty"))


# -- damage ----------------------------------------------------------------------------------


def test_torn_tail_of_an_unsealed_log_is_dropped_like_restore(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    write_log(url, 300, rotate_every=120, durability="flush")
    last = segment_paths(url)[-1]
    end = unseal(last)
    offset, size, _kind = batch_spans(last)[-1]
    assert offset + size == end
    with open(last, "r+b") as f:
        f.truncate(offset + size // 2)
    expected = restored_records(url)
    rows, _ = read_all(url, logs="latest")
    assert same_records(rows, expected)
    torn = [p for p in problems(url) if p[5] == "torn"]
    assert len(torn) == 1 and torn[0][3] == offset


def corrupt_middle_batch(url: str) -> tuple[str, int]:
    path = segment_paths(url)[0]
    app = [(off, size) for off, size, kind in batch_spans(path) if kind != F.KIND_CONTROL]
    off, size = app[len(app) // 2]
    flip_byte(path, off + size - 1)  # last payload byte: the payload checksum fails
    return path, off


def test_corrupt_batch_fails_strict_reads_with_its_location(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    write_log(url, 300, durability="flush")
    path, off = corrupt_middle_batch(url)
    with pytest.raises(persistlog.CorruptLogError) as info:
        read_all(url)
    e = info.value
    assert (e.log, e.segment, e.offset) == (1, os.path.basename(path), off)
    assert "checksum" in e.reason


def test_corrupt_batch_is_skipped_and_reported_in_skip_mode(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    write_log(url, 300, durability="flush")
    path, off = corrupt_middle_batch(url)
    rows, _ = read_all(url, recovery="skip")
    assert same_records(rows, restored_records(url, recovery="skip"))
    assert len(rows) == 300 - 1  # one record per batch in flush mode
    report = problems(url)
    assert [(p[2], p[3], p[5]) for p in report] == [(os.path.basename(path), off, "skipped")]


def test_missing_log_between_two_others_is_corruption(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    write_log(url, 100, rotate_every=30, retain=10)
    middle = [p for p in segment_paths(url) if F.parse_segment_name(os.path.basename(p))[0] == 2]  # type: ignore[index]
    for p in middle:
        os.remove(p)
    with pytest.raises(persistlog.CorruptLogError, match="log 2 is missing"):
        read_all(url)
