"""The resource columns people filter on: ``key`` as the key itself, ``key_json`` lossless."""

from __future__ import annotations

import pathlib
from typing import Any

import cbor2
import pytest

import persistlog
import spark_replay
from persistlog._format.jsonify import from_json

# Keys of every kind; 1, "1" and True must stay three keys.
KEYS: list[Any] = ["user:3", 1, "1", True, None, 'caf\u00e9 "q"', [1, "a"]]


def _write(url: str, tagged: bool) -> None:
    """One put of each key, a delete of "user:3" and a put back; with ``tagged`` every
    batch holds a value the C path leaves to Python (a tag), so both paths are read."""
    extra = {"tag": cbor2.CBORTag(4000, 1)} if tagged else {}
    with persistlog.open(url, lambda emit: None, durability="flush") as lg:
        lg.update_many([{"op": "put", "key": k, "value": {"n": i, **extra}} for i, k in enumerate(KEYS)])
        lg.update_many([{"op": "del", "key": "user:3"}, {"op": "put", "key": "user:3", "value": 9, **extra}])


@pytest.mark.spark
@pytest.mark.parametrize("tagged", [False, True], ids=["c_path", "python_path"])
def test_a_string_key_is_itself_and_key_json_tells_keys_apart(spark: Any, tmp_path: pathlib.Path, tagged: bool) -> None:
    url = str(tmp_path / "log")
    _write(url, tagged)
    df = spark.read.format("persistlog").option("convention", "resource").load(url)
    assert df.filter(df.key == "user:3").count() == 3
    rows = df.select("lsn", "op", "key", "key_json").collect()
    got = [(r["op"], r["key"], r["key_json"]) for r in sorted(rows, key=lambda r: r["lsn"])]
    assert got[: len(KEYS)] == [
        ("put", "user:3", '"user:3"'),
        ("put", "1", "1"),
        ("put", "1", '"1"'),
        ("put", "true", "true"),
        ("put", "null", "null"),
        ("put", 'caf\u00e9 "q"', '"caf\u00e9 \\"q\\""'),
        ("put", '[1,"a"]', '[1,"a"]'),
    ]
    live = spark_replay.state(df)
    assert live.columns[:2] == ["key", "key_json"]
    state = {r["key_json"]: (r["key"], from_json(r["value"])) for r in live.collect()}
    # Three keys show as "1" or "true" in `key` but stay apart by key_json.
    assert len(state) == len(KEYS)
    assert state['"user:3"'] == ("user:3", 9)
    assert state["1"][0] == state['"1"'][0] == "1"
    assert state["1"][1]["n"] == 1 and state['"1"'][1]["n"] == 2 and state["true"][1]["n"] == 3


@pytest.mark.spark
def test_state_of_an_empty_point_keeps_the_columns(spark: Any, tmp_path: pathlib.Path) -> None:
    url = str(tmp_path / "log")
    with persistlog.open(url, lambda emit: None) as lg:
        lg.update({"op": "put", "key": "a", "value": 1})
        lg.update({"op": "del", "key": "a"})
    df = spark_replay.read(spark, url, convention="resource")
    live = spark_replay.state(df)
    assert live.count() == 0
    assert live.columns[:2] == ["key", "key_json"] and "value" in live.columns


@pytest.mark.spark
def test_loading_a_missing_path_fails_clearly(spark: Any, tmp_path: pathlib.Path) -> None:
    missing = str(tmp_path / "no-such-log")
    with pytest.raises(Exception, match="no persistlog log at .*no-such-log.*does not exist"):
        spark.read.format("persistlog").load(missing).count()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(Exception, match="no persistlog log at .*empty.*is empty"):
        spark.read.format("persistlog").load(str(empty)).collect()
    (empty / "notes.txt").write_text("not a log")
    with pytest.raises(Exception, match=r"no persistlog log at .*empty.*holds 1 other file \(notes.txt\)"):
        spark.read.format("persistlog").load(str(empty)).collect()


@pytest.mark.spark
def test_read_takes_a_path(spark: Any, tmp_path: pathlib.Path) -> None:
    url = tmp_path / "log"
    with persistlog.ResourceStore.open(url) as store:
        store["a"] = 1
    df = spark_replay.read(spark, url, convention="resource")
    assert [r["key"] for r in df.collect()] == ["a"]
    assert spark_replay.corrupt_report(spark, url).count() == 0
