"""What the public calls accept and refuse: argument types, paths, trigger bounds."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import cbor2
import pytest

import persistlog
from kv_app import apply, restore_state
from log_files import _scanners


def _nothing(emit: Any) -> None:
    pass


def _updates_per_log(url: str) -> dict[int, int]:
    """Update records of each log at ``url`` (snapshot records not counted)."""
    counts: dict[int, int] = {}
    for scanner in _scanners(url):
        n = 0
        for batch in scanner:
            if not batch.is_control:
                n += sum(1 for k in batch.records_and_kinds(cbor2.loads)[1] if k == "update")
        counts[scanner.seq] = n
    return counts


# -- update_many ---------------------------------------------------------------------------


@pytest.mark.parametrize("records", ["abc", b"abc", bytearray(b"ab"), {"op": "put", "key": 1}])
def test_update_many_refuses_a_string_bytes_or_a_mapping(log_dir: str, records: Any) -> None:
    with persistlog.open(log_dir, _nothing) as lg:
        before = lg.next_lsn
        with pytest.raises(TypeError, match="update_many"):
            lg.update_many(records)
        assert lg.next_lsn == before
        lg.update({"n": 1})
    state: list[Any] = []
    persistlog.restore(log_dir, state.append)
    assert state == [{"n": 1}]


def test_update_many_refuses_what_is_not_iterable(log_dir: str) -> None:
    with persistlog.open(log_dir, _nothing) as lg:
        with pytest.raises(TypeError, match="iterable"):
            lg.update_many(42)  # type: ignore[arg-type]


def test_update_many_of_nothing_returns_none_and_writes_nothing(log_dir: str) -> None:
    with persistlog.open(log_dir, _nothing) as lg:
        assert lg.update({"n": 1}) == lg.next_lsn - 1
        before = lg.next_lsn
        assert lg.update_many([]) is None
        assert lg.update_many(iter(())) is None
        assert lg.next_lsn == before


def test_update_many_still_takes_any_iterable(log_dir: str) -> None:
    with persistlog.open(log_dir, _nothing) as lg:
        last = lg.update_many(({"n": i} for i in range(3)))
        assert last == lg.next_lsn - 1
        lg.update_many(({"n": 3},))
    got: list[Any] = []
    persistlog.restore(log_dir, got.append)
    assert got == [{"n": i} for i in range(4)]


# -- sync must be a bool -------------------------------------------------------------------


@pytest.mark.parametrize("sync", ["yes", 1, 0, None, "False"])
def test_sync_must_be_a_bool(log_dir: str, sync: Any) -> None:
    with persistlog.open(log_dir, _nothing) as lg:
        before = lg.next_lsn
        with pytest.raises(TypeError, match="sync must be True or False"):
            lg.update({"n": 1}, sync=sync)
        with pytest.raises(TypeError, match="sync must be True or False"):
            lg.update_many([{"n": 1}], sync=sync)
        assert lg.next_lsn == before
        lg.update({"n": 2}, sync=True)
        lg.update({"n": 3}, sync=False)
    got: list[Any] = []
    persistlog.restore(log_dir, got.append)
    assert got == [{"n": 2}, {"n": 3}]


# -- paths ---------------------------------------------------------------------------------


class _Dir:
    """An os.PathLike that is not a pathlib.Path."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return self.path


@pytest.mark.parametrize("wrap", [pathlib.Path, _Dir], ids=["Path", "PathLike"])
def test_every_url_argument_takes_an_os_pathlike(tmp_path: pathlib.Path, wrap: Any) -> None:
    primary, second, third = tmp_path / "p", tmp_path / "s", tmp_path / "t"
    store = persistlog.ResourceStore.open(wrap(str(primary)), secondaries=[wrap(str(second))])
    store["a"] = 1
    store.log.add_destination(wrap(str(third)))
    store["b"] = 2
    store.close()
    for where in (primary, second, third):
        state, result = restore_state(wrap(str(where)))  # type: ignore[arg-type]
        assert state == {"a": 1, "b": 2}, where
        assert result.found
    follower = persistlog.follow(wrap(str(primary)), lambda r: None)
    assert follower.poll() >= 2
    fourth = tmp_path / "f"
    with persistlog.ResourceStore.open(wrap(str(primary)), secondaries=[(wrap(str(fourth)), None)]) as again:
        assert again.to_dict() == {"a": 1, "b": 2}
    assert restore_state(str(fourth))[0] == {"a": 1, "b": 2}


@pytest.mark.parametrize("bad", [b"/tmp/x", 42, None, ["/tmp/x"]])
def test_a_url_of_another_type_is_a_type_error(tmp_path: pathlib.Path, bad: Any) -> None:
    with pytest.raises(TypeError, match="os.PathLike"):
        persistlog.restore(bad)
    with pytest.raises(TypeError, match="os.PathLike"):
        persistlog.open(bad, _nothing)
    with pytest.raises(TypeError, match="os.PathLike"):
        persistlog.follow(bad, print)
    with pytest.raises(TypeError, match="os.PathLike"):
        persistlog.ResourceStore.open(bad)
    with persistlog.open(str(tmp_path / "log"), _nothing) as lg:
        with pytest.raises(TypeError):
            lg.add_destination(bad)


def test_an_empty_url_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        persistlog.restore("")


# -- rotation triggers overshoot by about one batch at most ----------------------------------


def test_rotate_records_cuts_fast_buffered_updates_into_several_logs(log_dir: str) -> None:
    state: dict[Any, Any] = {}

    def enumerate_all(emit: Any) -> None:
        for k, v in list(state.items()):
            emit({"op": "put", "key": k, "value": v})

    with persistlog.open(log_dir, enumerate_all, rotate_records=1000, rotate_bytes=None, retain=100) as lg:
        for i in range(5000):
            record = {"op": "put", "key": i % 50, "value": i}
            lg.update(record)
            apply(state, record)
    # The batch that crosses the trigger is cut at it, and the writer waits for the switch.
    # (Later logs may hold more: a trigger crossed while a log's own enumeration is still
    # being written, which a tight loop starving the rotation thread makes likely, waits.)
    counts = _updates_per_log(log_dir)
    assert sum(counts.values()) == 5000
    assert len(counts) >= 2, counts
    assert counts[1] == 1000, counts
    restored, _ = restore_state(log_dir)
    assert restored == state


def test_rotate_bytes_overshoots_by_at_most_one_batch(log_dir: str) -> None:
    batch_bytes = 4096
    rotate_bytes = 64 * 1024
    value = "x" * 100
    with persistlog.open(log_dir, _nothing, rotate_bytes=rotate_bytes, batch_bytes=batch_bytes, retain=100) as lg:
        for i in range(4000):
            lg.update({"k": i, "v": value})
    from destinations import open_destination
    from persistlog._read.reader import list_logs

    dest = open_destination(log_dir)
    sizes = {seq: sum(dest.size(name) for _, name in segs) for seq, segs in list_logs(dest).items()}
    dest.close()
    assert len(sizes) >= 2, sizes
    # The first log's snapshot is empty: the size trigger counts all of it.
    assert rotate_bytes <= sizes[1] <= rotate_bytes + batch_bytes, sizes


def test_rotate_records_counts_batches_of_update_many(log_dir: str) -> None:
    with persistlog.open(log_dir, _nothing, rotate_records=100, rotate_bytes=None, retain=100) as lg:
        for i in range(50):
            lg.update_many([{"n": i, "j": j} for j in range(10)])
    counts = _updates_per_log(log_dir)
    assert len(counts) >= 2, counts
    assert counts[1] == 100, counts


# -- ResourceStore.update is one batch -------------------------------------------------------


def test_resource_store_update_is_one_batch_all_or_none(log_dir: str) -> None:
    # "flush": every call is written as its own batch before it returns.
    with persistlog.ResourceStore.open(log_dir, durability="flush") as store:
        store["keep"] = 0
        with pytest.raises(TypeError):
            store.update({"a": 1, "b": object(), "c": 3})
        assert store.to_dict() == {"keep": 0}
        store.update({"a": 1, "b": 2}, c=3)
        store.update([("d", 4), ("a", 5)])
        assert store.to_dict() == {"keep": 0, "a": 5, "b": 2, "c": 3, "d": 4}
        store.update()
    batches = [b.header.count for sc in _scanners(log_dir) for b in sc if not b.is_control]
    assert batches == [1, 3, 2]  # "keep", then each update() whole
    state, _ = restore_state(log_dir)
    assert state == {"keep": 0, "a": 5, "b": 2, "c": 3, "d": 4}


def test_metadata_holding_a_codec_registered_object_is_refused_before_anything_is_written(tmp_path: pathlib.Path) -> None:
    # The log header holds metadata as plain CBOR (readers decode it without the codec).
    codec = persistlog.Codec()

    @codec.register("app.Meta")
    @dataclasses.dataclass
    class Meta:
        n: int

    url = tmp_path / "log"
    with pytest.raises(TypeError, match="metadata must be a plain CBOR value"):
        persistlog.open(url, lambda emit: None, codec=codec, metadata={"m": Meta(1)})
    assert not url.exists() or not [p for p in url.iterdir() if p.suffix == ".plog"]
    persistlog.open(url, lambda emit: None, codec=codec, metadata={"m": 1}).close()


def test_a_secondary_given_as_a_two_item_list_is_a_url_and_its_options(tmp_path: pathlib.Path) -> None:
    """JSON has no tuples: a config file's ``[url, options]`` pair works as the tuple does."""
    import json

    entries = json.loads(json.dumps([[str(tmp_path / "backup"), {"auto_mkdir": True}]]))
    log = persistlog.open(str(tmp_path / "log"), lambda emit: None, secondaries=entries)
    log.update({"k": 1})
    log.close()
    records: list[Any] = []
    persistlog.restore(str(tmp_path / "backup"), records.append)
    assert records == [{"k": 1}]
