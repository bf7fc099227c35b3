"""``emit.many(records)``: snapshot records written a chunk at a time, with ``emit``'s
meaning (snapshot kind, order, encoded at the call, refused after the enumeration)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import persistlog
from childproc import run_json
from tests.persistlog.follower_harness import drain

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20) | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=8,
)


def _state_after(url: str) -> dict[str, Any]:
    state: dict[str, Any] = {}
    persistlog.restore(url, replay=lambda r: state.__setitem__(r["key"], r["value"]), missing_ok=False)
    return state


def _kinds(url: str, last_lsn: int) -> list[tuple[str, str]]:
    f = persistlog.follow(url, lambda r: None)
    try:
        batches = drain(f, last_lsn)
    finally:
        f.stop()
    return [(r["key"], kind) for fb in batches for r, kind in zip(fb.records, fb.kinds)]


# Calls of emit / emit.many: a call is a list of records, emitted one by one or in one many().
calls = st.lists(st.tuples(st.booleans(), st.lists(values, max_size=1100)), min_size=1, max_size=4)


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=calls)
def test_emit_many_writes_what_emit_writes_in_order(tmp_path_factory: pytest.TempPathFactory, calls: list[tuple[bool, list[Any]]]) -> None:
    url = str(tmp_path_factory.mktemp("log") / "log")
    expected: dict[str, Any] = {}
    order: list[str] = []
    for c, (_, records) in enumerate(calls):
        for i, value in enumerate(records):
            expected[f"{c}.{i}"] = value
            order.append(f"{c}.{i}")

    def enumerate_all(emit: persistlog.Emit) -> None:
        for c, (many, records) in enumerate(calls):
            batch = [{"key": f"{c}.{i}", "value": v} for i, v in enumerate(records)]
            if many:
                emit.many(batch)
            else:
                for record in batch:
                    emit(record)
        assert emit.count == len(order)

    lg = persistlog.open(url, enumerate_all, rotate_bytes=None)
    last = lg.update({"key": "after", "value": 1})
    lg.close()
    assert _state_after(url) == {**expected, "after": 1}
    pairs = _kinds(url, last)
    assert pairs == [(k, "snapshot") for k in order] + [("after", "update")]


@pytest.mark.parametrize("n", [0, 1, 1023, 1024, 1025, 2049])
def test_emit_many_across_chunk_boundaries(tmp_path: Path, n: int) -> None:
    url = str(tmp_path / "log")
    records = [{"key": f"k{i}", "value": i} for i in range(n)]
    lg = persistlog.open(url, lambda emit: emit.many(iter(records)), rotate_bytes=None)
    assert lg.stats()["snapshot_records"] == n
    lg.close()
    assert _state_after(url) == {f"k{i}": i for i in range(n)}


def test_records_changed_after_emit_many_are_logged_as_they_were(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    record: dict[str, Any] = {"key": "a", "value": [1]}

    def enumerate_all(emit: persistlog.Emit) -> None:
        emit.many([record])
        record["value"].append(2)  # the app reuses its objects once the call returned
        record["key"] = "b"

    persistlog.open(url, enumerate_all, rotate_bytes=None).close()
    assert _state_after(url) == {"a": [1]}


@pytest.mark.parametrize("bad", ["records", b"records", {"key": "a"}, 42])
def test_emit_many_refuses_what_is_not_an_iterable_of_records(tmp_path: Path, bad: Any) -> None:
    url = str(tmp_path / "log")
    with pytest.raises(persistlog.EnumerateError) as raised:
        persistlog.open(url, lambda emit: emit.many(bad))
    cause = raised.value.__cause__
    assert isinstance(cause, TypeError) and "emit.many()" in str(cause), cause


def test_a_record_that_cannot_be_logged_fails_the_rotation_and_keeps_the_last_snapshot(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = str(tmp_path / "log")
    state = {f"k{i}": i for i in range(1200)}
    broken = False

    def enumerate_all(emit: persistlog.Emit) -> None:
        chunk = [{"key": k, "value": v} for k, v in state.items()]
        if broken:
            chunk[1100]["value"] = object()  # not loggable, in the second chunk of 1,024
        emit.many(chunk)

    lg = persistlog.open(url, enumerate_all, rotate_bytes=None)
    lg.update({"key": "u", "value": 1})
    broken = True
    with caplog.at_level(logging.ERROR, logger="persistlog"), pytest.raises(persistlog.EnumerateError) as raised:
        lg.rotate()
    assert isinstance(raised.value.__cause__, TypeError)
    assert "object" in str(raised.value.__cause__)
    lg.close()
    assert _state_after(url) == {**state, "u": 1}


def test_a_record_nested_too_deep_is_named_as_emit_names_it(tmp_path: Path) -> None:
    deep: Any = 0
    for _ in range(300):
        deep = [deep]
    with pytest.raises(persistlog.EnumerateError) as raised:
        persistlog.open(str(tmp_path / "log"), lambda emit: emit.many([{"key": "a", "value": 1}, deep]))
    assert isinstance(raised.value.__cause__, ValueError)
    assert "deep" in str(raised.value.__cause__)


def test_emit_many_after_the_enumeration_returned_is_refused(tmp_path: Path) -> None:
    kept: list[persistlog.Emit] = []
    lg = persistlog.open(str(tmp_path / "log"), kept.append)
    with pytest.raises(RuntimeError, match="after enumerate_all returned"):
        kept[0].many([{"key": "a"}])
    with pytest.raises(RuntimeError, match="after enumerate_all returned"):
        kept[0]({"key": "a"})
    lg.close()


def test_resource_store_rotation_emits_every_key_once_as_a_snapshot(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    store = persistlog.ResourceStore.open(url, rotate_bytes=None)
    for i in range(1300):
        store[("k", i)] = {"n": i}
    del store[("k", 7)]
    store.close(rotate=True)
    again = persistlog.ResourceStore.open(url, rotate_bytes=None)
    assert dict(again) == {("k", i): {"n": i} for i in range(1300) if i != 7}
    again.close()



def run_mixed_plan(url: str, plan: list[tuple[str, int]], batch_bytes: int) -> dict[str, Any]:
    """Rotate a log whose enumeration runs ``plan``: emits, and updates from inside
    enumerate_all between them, so that batches mix the two kinds. The kind of each record
    read back, the kinds expected, and the Log's counts."""
    expected: list[list[str]] = []
    lg: persistlog.Log | None = None

    def enumerate_all(emit: persistlog.Emit) -> None:
        if lg is None:
            return  # the opening enumeration: no state yet
        for c, (call, n) in enumerate(plan):
            records = [{"key": f"{c}.{i}", "value": "v" * (i % 7)} for i in range(n)]
            expected.extend([r["key"], "snapshot" if call in ("emit", "many") else "update"] for r in records)
            if call == "emit":
                for r in records:
                    emit(r)
            elif call == "many":
                emit.many(records)
            elif call == "update":
                for r in records:
                    lg.update(r)
            else:
                lg.update_many(records)

    lg = persistlog.open(url, enumerate_all, rotate_bytes=None, batch_bytes=batch_bytes)
    lg.rotate()
    last = lg.update({"key": "after", "value": ""})
    lg.close()
    stats = lg.stats()
    return {
        "kinds": [list(pair) for pair in _kinds(url, last)],
        "expected": expected + [["after", "update"]],
        "counts": [stats["snapshot_records"], stats["updates"]],
    }


# An enumeration's calls (emit, emit.many) with updates from inside it between them.
mixed_plans = st.lists(
    st.tuples(st.sampled_from(["emit", "many", "update", "update_many"]), st.integers(min_value=1, max_value=40)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=mixed_plans, batch_bytes=st.sampled_from([64, 300, 1 << 20]))
def test_batches_mixing_snapshot_records_and_updates_keep_each_records_kind(
    tmp_path_factory: pytest.TempPathFactory, plan: list[tuple[str, int]], batch_bytes: int
) -> None:
    out = run_mixed_plan(str(tmp_path_factory.mktemp("log") / "log"), plan, batch_bytes)
    assert out["kinds"] == out["expected"]
    snapshots = sum(n for call, n in plan if call in ("emit", "many"))
    assert out["counts"] == [snapshots, len(out["expected"]) - snapshots]


MIXED_WORKLOAD = """
import json, sys
sys.path[:0] = [sys.argv[3], sys.argv[3] + "/tests"]
from tests.persistlog.write.test_emit_many import run_mixed_plan

print(json.dumps(run_mixed_plan(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[4]))))
"""

FIXED_PLANS = [
    [["emit", 3], ["many", 5], ["update", 2], ["many", 4], ["emit", 1], ["update_many", 3], ["many", 30]],
    [["update", 1], ["emit", 40], ["update_many", 2], ["emit", 2], ["many", 1], ["update", 1]],
    [["many", 40], ["many", 40], ["update", 1], ["many", 40], ["emit", 40]],
]


@pytest.mark.slow
@pytest.mark.parametrize("batch_bytes", [64, 300, 1 << 20])
def test_without_the_accelerator_mixed_batches_keep_each_records_kind(tmp_path: Path, batch_bytes: int) -> None:
    root = str(Path(__file__).resolve().parents[3])
    for k, plan in enumerate(FIXED_PLANS):
        pure = run_json(MIXED_WORKLOAD, str(tmp_path / f"pure{k}"), json.dumps(plan), root, str(batch_bytes),
                        hide=["persistlog._cbor_json"])
        assert pure["kinds"] == pure["expected"]
        snapshots = sum(n for call, n in plan if call in ("emit", "many"))
        assert pure["counts"] == [snapshots, len(pure["expected"]) - snapshots]
