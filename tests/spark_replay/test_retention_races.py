"""The batch source racing retention: a log that retention deletes while Spark reads it is
"deleted while being read" (``DestinationError``: read again), never ``CorruptLogError``.

The race forced here: the driver read CURRENT (log 4) before the listing it plans from
(having listed two logs: a listing of one log needs no CURRENT); just after, the writer
moved CURRENT to log 5 and retention deleted log 4's later segments but not yet its first
(last segment first). The listing shows log 4 cut short, every segment it lists still
there when the partitions read it: log 4 then "ends before" log 5 starts. The planner and
the partition readers run in this process, as the driver and the executors would.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from faults import FaultPlan

import persistlog
from destinations import open_destination
from persistlog._format import constants as F
from persistlog._write.retention import apply_retention
from persistlog._write.segment_writer import move_pointer
from spark_replay._options import ReadOptions
from spark_replay._plan import LogPartition, SetPartition, plan
from spark_replay._scan import read_problems, read_records, read_set


def _write_logs(url: str) -> int:
    """Logs 1 to 5 at ``url``, several segment objects each, sealed; CURRENT names log 4
    and retention (retain=1) deleted logs 1 to 3. Returns the last LSN."""
    state: dict[str, Any] = {}

    def enumerate_all(emit: Any) -> None:
        for k, v in list(state.items()):
            emit({"op": "put", "key": k, "value": v})

    lg = persistlog.open(url, enumerate_all, segment_bytes=4096, retain=10, rotate_bytes=None)
    for seq in range(1, 6):
        if seq > 1:
            lg.rotate()
        for i in range(60):
            state[f"k{i % 11}"] = [seq, i, "v" * 60]
            lg.update({"op": "put", "key": f"k{i % 11}", "value": state[f"k{i % 11}"]})
            if i % 15 == 14:
                lg.sync()  # a new segment object
    last = lg.next_lsn - 1
    lg.close()
    _retention_moves_to(url, 4)
    return last


def _retention_moves_to(url: str, seq: int) -> None:
    """What a writer does once log ``seq`` is complete: CURRENT names it, then retention
    (retain=1) deletes every older log, last segment first."""
    dest = open_destination(url)
    assert move_pointer(dest, seq)
    apply_retention(dest, [seq], 1, seq)


def _segments(url: str, seq: int) -> list[str]:
    return sorted(n for n in open_destination(url).list() if (F.parse_segment_name(n) or (None,))[0] == seq)


def _cut_short(url: str, seq: int, move_to: int | None) -> None:
    """Log ``seq`` loses every segment but its first, last first, as retention deletes it
    (after moving CURRENT to ``move_to``, if given)."""
    dest = open_destination(url)
    names = _segments(url, seq)
    assert len(names) >= 2
    if move_to is not None:
        assert move_pointer(dest, move_to)
    for name in reversed(names[1:]):
        dest.delete(name)


def _faulty(url: str) -> str:
    return url.replace("memory://", "faulty://", 1)


def _options(url: str, plan_: FaultPlan, **extra: str) -> ReadOptions:
    opts = ReadOptions.parse({"path": _faulty(url), **extra})
    return replace(opts, storage_options={"target_protocol": "memory", "faults": plan_})


def _read(parts: list[Any], reader: Any = read_records) -> Iterator[Any]:
    for p in parts:
        if isinstance(p, SetPartition):
            yield from read_set(p, "records")
        else:
            yield from reader(p)


@pytest.mark.parametrize("view", ["records", "corrupt"])
def test_a_log_cut_short_by_retention_under_way_at_the_listing_is_deleted_not_corrupt(
    clean_memory_fs: None, view: str
) -> None:
    """Before: ``CorruptLogError`` "log 4 ends before LSN x but log 5 starts at LSN y"
    (strict), or that damage listed in the corrupt view."""
    url = "memory://race/log"
    _write_logs(url)
    plan_ = FaultPlan().call_after("cat_file", lambda: _cut_short(url, 4, move_to=5), path="race/log/CURRENT")
    opts = _options(url, plan_, **({"recovery": "skip"} if view == "corrupt" else {}))
    parts = plan(opts)
    assert plan_.fired
    with pytest.raises(persistlog.DestinationError, match="deleted while being read") as e:
        list(_read(parts, read_problems if view == "corrupt" else read_records))
    message = str(e.value)
    assert "CURRENT has moved past log 4" in message and "read again" in message
    assert "log 4 ends before LSN" in message  # what the read found, and why it is not damage
    assert all(isinstance(p, LogPartition) and p.current == 4 for p in parts)


def test_a_log_cut_short_while_current_stays_is_corruption(clean_memory_fs: None) -> None:
    """The same cut with CURRENT still naming log 4: real damage, reported as such."""
    url = "memory://race/log"
    _write_logs(url)
    plan_ = FaultPlan().call_after("cat_file", lambda: _cut_short(url, 4, move_to=None), path="race/log/CURRENT")
    parts = plan(_options(url, plan_))
    assert plan_.fired
    with pytest.raises(persistlog.CorruptLogError, match="log 4 ends before LSN") as e:
        list(_read(parts))
    assert e.value.log == 4


def _write_set(root: str) -> str:
    """A set of one key whose log is logs 4 (CURRENT) and 5, as :func:`_write_logs`."""
    with persistlog.LogSet(root) as logset:
        url = logset.url("tenant")
    _write_logs(url)
    return url


@pytest.mark.parametrize("cut_current", [True, False], ids=["retention", "damage"])
def test_a_set_log_cut_short_by_retention_is_deleted_and_real_damage_stays_corrupt(
    clean_memory_fs: None, cut_current: bool
) -> None:
    """The same race in a log of a set: the driver reads each key's CURRENT before it
    lists that key's log, and its tasks tell retention from damage as a log's do."""
    root = "memory://raceset/root"
    url = _write_set(root)
    key_dir = url.split("://", 1)[1]
    plan_ = FaultPlan().call_after(
        "cat_file", lambda: _cut_short(url, 4, move_to=5 if cut_current else None), path=f"{key_dir}/CURRENT"
    )
    opts = replace(_options(root, plan_), log_set=True)
    parts = plan(opts)  # (the fault plan in the storage options does not pickle)
    assert plan_.fired and parts
    if cut_current:
        with pytest.raises(persistlog.DestinationError, match="deleted while being read"):
            list(_read(parts))
    else:
        with pytest.raises(persistlog.CorruptLogError, match="log 4 ends before LSN"):
            list(_read(parts))


@pytest.mark.parametrize("moved", [True, False], ids=["retention", "damage"])
def test_a_small_local_log_of_a_set_planned_by_its_task_tells_retention_from_damage(tmp_path: Path, moved: bool) -> None:
    """A local set's small log is planned by the task that reads it, from the driver's
    listing and the CURRENT the driver read before it: log 4 was listed cut short while
    CURRENT named it; CURRENT then names log 5 when the task reads (the writer moved on
    and its retention is deleting log 4), or still log 4 (real damage)."""
    root = tmp_path / "set"
    url = _write_set(str(root))
    _cut_short(url, 4, move_to=None)
    opts = replace(ReadOptions.parse({"path": str(root)}), log_set=True)
    parts = [pickle.loads(pickle.dumps(p)) for p in plan(opts)]
    assert [type(u).__name__ for p in parts for u in p.units] == ["LogToPlan"]
    if moved:
        assert move_pointer(open_destination(url), 5)
        with pytest.raises(persistlog.DestinationError, match="CURRENT has moved past log 4"):
            list(_read(parts))
    else:
        with pytest.raises(persistlog.CorruptLogError, match="log 4 ends before LSN"):
            list(_read(parts))


def test_current_is_read_before_a_listing_of_more_than_one_log_only(clean_memory_fs: None) -> None:
    """A listing of one log needs no CURRENT (no log of it can be one retention is deleting:
    a later log would be there); one of two logs is taken again after a read of CURRENT,
    and that second listing is the one planned from."""
    url = "memory://race/log"
    _write_logs(url)  # logs 4 and 5
    current_reads: list[int] = []
    plan_ = FaultPlan()
    for nth in range(1, 4):
        plan_.call_before("cat_file", lambda: current_reads.append(plan_.calls["ls"]), nth=nth, path="race/log/CURRENT")
    parts = plan(_options(url, plan_))
    assert current_reads == [1]  # after the first listing, before the second
    assert plan_.calls["ls"] == 2 and {p.current for p in parts} == {4}

    single = "memory://race/single"
    lg = persistlog.open(single, lambda emit: None)
    lg.update({"op": "put", "key": 1, "value": 1})
    lg.close()
    seen: list[int] = []
    plan_ = FaultPlan().call_before("cat_file", lambda: seen.append(1), path="race/single/CURRENT")
    parts = plan(_options(single, plan_))
    assert seen == [] and plan_.calls["ls"] == 1 and {p.current for p in parts} == {None}
