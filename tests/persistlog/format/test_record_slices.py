"""Records decoded in slices: the boundary finder agrees with cbor2, never reads past its
bytes and never changes what damage is reported; every reader hands out the same records
as decoding each batch whole did; replay_batch gets slices; the GC pause; a follower
resumes inside a batch; ``close(rotate=True)``."""

from __future__ import annotations

import datetime
import decimal
import gc
import io
import os
import struct
import uuid
from collections.abc import Callable
from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

import persistlog
from persistlog._format import decoder
from persistlog._format import constants as F
from persistlog._format.decoder import BatchHeader, Damage, record_slices, split_records

record_bounds = pytest.importorskip("persistlog._cbor_json").record_bounds

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "golden", "v1")

# -- records ----------------------------------------------------------------------------

_scalars = (
    st.none() | st.booleans() | st.integers(-(2**64), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=20) | st.binary(max_size=20)
)
#: What the boundary finder vouches for: the CBOR every ordinary record is made of.
plain_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.text(max_size=8) | st.integers(-5, 5), inner, max_size=5),
    max_leaves=20,
)
#: And what it leaves to cbor2: tags (dates, decimals, big integers, sets, unknown tags).
tagged_values = st.recursive(
    _scalars | st.datetimes(timezones=st.just(datetime.timezone.utc)) | st.decimals(allow_nan=False)
    | st.uuids() | st.integers(2**64, 2**70)
    # Tags cbor2 gives no meaning to (1004, a date string, it decodes: and may refuse).
    | st.builds(cbor2.CBORTag, st.integers(1005, 2000), st.text(max_size=4))
    | st.just(float("nan")),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)

loads = persistlog.Codec().loads


def encoded(records: list[Any], canonical: bool = False) -> tuple[bytes, list[int]]:
    """The records as a CBOR sequence, and where each starts. Canonical CBOR writes each
    float in the shortest of half, single and double precision that holds it."""
    items = [cbor2.dumps(r, canonical=canonical) for r in records]
    starts, at = [], 0
    for item in items:
        starts.append(at)
        at += len(item)
    return b"".join(items), starts


def header_for(kind: int, count: int, raw: bytes) -> BatchHeader:
    return BatchHeader(len(raw), len(raw), count, kind, 1, 0, 0)


def as_bytes(records: list[Any]) -> list[bytes]:
    """Decoded records compared by their encoding (NaN compares equal to itself there)."""
    return [cbor2.dumps(r) for r in records]


def sliced(header: BatchHeader, raw: bytes, slice_bytes: int = 1) -> tuple[list[Any], bytes | None, int]:
    """Every record, the bitmap and the number of slices ``record_slices`` gave."""
    slices = record_slices(header, raw, 0, loads, slice_bytes)
    records: list[Any] = []
    n = 0
    for first, part in slices:
        assert first == len(records)
        records += part
        n += 1
    return records, slices.bitmap, n


def verdict(fn: Callable[[], Any]) -> Any:
    """``fn()``'s records as bytes, or the reason of the Damage it raised."""
    try:
        records, bitmap = fn()
    except Damage as d:
        return ("damage", d.reason, d.offset)
    return as_bytes(records), bitmap


# -- the boundary finder ----------------------------------------------------------------


@pytest.mark.slow
@given(st.lists(plain_values, max_size=30), st.integers(1, 300))
def test_bounds_agree_with_cbor2_on_plain_records(records: list[Any], slice_bytes: int) -> None:
    raw, starts = encoded(records)
    got = record_bounds(raw, len(records), 0, slice_bytes)
    assert got is not None
    indices, offsets = got
    assert indices[0] == 0 and indices[-1] == len(records) and offsets[-1] == len(raw)
    assert offsets[:-1] == [starts[i] for i in indices[:-1]]
    ends = starts[1:] + [len(raw)]
    for i in range(len(indices) - 2):  # every slice but the last: just past slice_bytes
        lo, hi = indices[i], indices[i + 1]
        assert offsets[i + 1] - offsets[i] >= slice_bytes
        assert ends[hi - 2] - starts[lo] < slice_bytes if hi - lo > 1 else True


@pytest.mark.slow
@given(st.lists(tagged_values, max_size=20), st.integers(1, 100))
def test_bounds_are_right_or_absent_on_any_records(records: list[Any], slice_bytes: int) -> None:
    raw, starts = encoded(records)
    got = record_bounds(raw, len(records), 0, slice_bytes)
    if got is not None:
        indices, offsets = got
        assert offsets == [starts[i] for i in indices[:-1]] + [len(raw)]
        assert indices[-1] == len(records)


def same(a: Any, b: Any) -> bool:
    """Equal values of exactly the same types, all the way down (1 == 1.0 == True is not
    enough: a decoder must give the types cbor2 gives)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(ka, kb) and same(a[ka], b[kb]) for ka, kb in zip(a, b))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (a != a and b != b)
    return bool(a == b)


@pytest.mark.slow
@given(st.lists(plain_values | tagged_values, max_size=25), st.integers(1, 300), st.booleans())
def test_slices_built_in_c_are_the_values_cbor2_builds(records: list[Any], slice_bytes: int, canonical: bool) -> None:
    raw, _ = encoded(records, canonical)
    header = header_for(F.KIND_UPDATE, len(records), raw)
    got, _bitmap, _n = sliced(header, raw, slice_bytes)
    assert same(got, cbor2.loads(b"\x9f" + raw + b"\xff"))
    # Shared strings are the same objects, and still the same values.
    again, _bitmap, _n = sliced(header, raw, slice_bytes)
    assert same(again, got)


def test_half_and_single_floats_and_the_widest_integers() -> None:
    raw = b"".join([b"\xf9\x3c\x00", b"\xf9\x7c\x00", b"\xf9\x00\x01", b"\xfa\x3f\xc0\x00\x00",
                    b"\x3b" + b"\xff" * 8, b"\x1b" + b"\xff" * 8, b"\x3b\x7f" + b"\xff" * 7])
    got = sliced(header_for(F.KIND_UPDATE, 7, raw), raw, 1)[0]
    assert same(got, cbor2.loads(b"\x9f" + raw + b"\xff"))
    assert got[:2] == [1.0, float("inf")] and got[4] == -(2**64) and got[6] == -(2**63)


def test_shared_strings_are_shared_and_long_ones_are_not() -> None:
    raw, _ = encoded([{"op": "put", "v": "x" * 40}, {"op": "put", "v": "x" * 40}])
    a, b = sliced(header_for(F.KIND_UPDATE, 2, raw), raw, 1000)[0]
    assert list(a)[0] is list(b)[0] and a["op"] is b["op"]
    assert a["v"] == b["v"] and a["v"] is not b["v"]


def test_tags_and_indefinite_lengths_are_left_to_cbor2() -> None:
    for value in (datetime.datetime(2025, 1, 1, tzinfo=datetime.timezone.utc), decimal.Decimal("1.5"),
                  uuid.uuid4(), {1, 2}, 2**70, cbor2.undefined):
        raw = cbor2.dumps({"v": value})
        assert (record_bounds(raw, 1, 0, 10) is None) == (value is not cbor2.undefined)
    assert record_bounds(b"\x9f\x01\xff", 1, 0, 10) is None
    assert record_bounds(b"\x7f\x61a\xff", 1, 0, 10) is None
    assert record_bounds(b"\x62\xc3\x28", 1, 0, 10) is None  # invalid UTF-8


@pytest.mark.slow
@given(st.lists(plain_values, min_size=1, max_size=20))
def test_bounds_never_read_past_their_bytes(records: list[Any]) -> None:
    # The bytes after the cut are the rest of valid records: a finder reading past the
    # end of its buffer would find them and vouch for the cut payload.
    raw, _ = encoded(records)
    view = memoryview(raw)
    for cut in range(len(raw)):
        assert record_bounds(view[:cut], len(records), 0, 16) is None


def test_bounds_refuse_impossible_counts() -> None:
    raw = cbor2.dumps([1, 2, 3])
    assert record_bounds(raw, 2, 0, 16) is None  # fewer items than the count
    assert record_bounds(raw + raw, 1, 0, 16) is None  # bytes after the last item
    assert record_bounds(raw, -1, 0, 16) is None
    assert record_bounds(raw, 1, 2, 16) is None
    assert record_bounds(b"\x9b" + b"\xff" * 8, 1, 0, 16) is None  # a 2**64-item array
    assert record_bounds(b"\x81" * 300 + b"\x00", 1, 0, 16) is None  # deeper than the finder goes
    assert record_bounds(b"", 0, 0, 16) == ([0], [0])


# -- record_slices against decoding whole -----------------------------------------------


@pytest.mark.slow
@given(st.lists(plain_values | tagged_values, max_size=25), st.integers(1, 200),
       st.sampled_from([F.KIND_UPDATE, F.KIND_SNAPSHOT, F.KIND_MIXED]))
def test_slices_give_the_records_decoding_whole_gives(records: list[Any], slice_bytes: int, kind: int) -> None:
    raw, _ = encoded(records)
    if kind == F.KIND_MIXED:
        bitmap = bytes((i * 37) & 0xFF for i in range((len(records) + 7) >> 3))
        raw = cbor2.dumps(bitmap) + raw
    header = header_for(kind, len(records), raw)
    whole, whole_bitmap = split_records(header, raw, 0, loads)
    got, bitmap, _n = sliced(header, raw, slice_bytes)
    assert as_bytes(got) == as_bytes(whole) and bitmap == whole_bitmap


@pytest.mark.slow
@given(st.lists(plain_values, min_size=1, max_size=15), st.data(),
       st.sampled_from([F.KIND_UPDATE, F.KIND_MIXED]))
def test_damage_is_reported_as_decoding_whole_reports_it(records: list[Any], data: Any, kind: int) -> None:
    raw, _ = encoded(records)
    if kind == F.KIND_MIXED:
        raw = cbor2.dumps(b"\x05" * ((len(records) + 7) >> 3)) + raw
    how = data.draw(st.sampled_from(["cut", "flip", "insert", "count"]))
    at = data.draw(st.integers(0, len(raw) - 1))
    count = len(records)
    if how == "cut":
        raw = raw[:at]
    elif how == "flip":
        raw = raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255))]) + raw[at + 1:]
    elif how == "insert":
        raw = raw[:at] + data.draw(st.binary(min_size=1, max_size=3)) + raw[at:]
    else:
        count += data.draw(st.sampled_from([-1, 1]))
    header = header_for(kind, count, raw)
    whole = verdict(lambda: split_records(header, raw, 0, loads))
    by_slices = verdict(lambda: sliced(header, raw, 7)[:2])
    assert by_slices == whole


def test_without_the_boundary_finder_a_batch_is_one_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    records = [{"k": i, "v": "x" * 40} for i in range(100)]
    raw, _ = encoded(records)
    header = header_for(F.KIND_UPDATE, len(records), raw)
    assert sliced(header, raw, 64)[2] > 10
    monkeypatch.setattr(decoder, "_record_bounds", None)
    got, _bitmap, n = sliced(header, raw, 64)
    assert n == 1 and got == records


# -- the readers ------------------------------------------------------------------------


def _write(url: str, records: list[Any]) -> None:
    lg = persistlog.open(url, lambda emit: None)
    lg.update_many(records)  # one batch
    lg.close()


def test_replay_batch_gets_a_big_batch_in_slices_in_order(log_dir: str) -> None:
    records = [{"op": "put", "k": i, "v": {"name": "x" * 32, "n": i}} for i in range(5000)]
    _write(log_dir, records)
    calls: list[list[Any]] = []
    result = persistlog.restore(log_dir, replay_batch=calls.append)
    assert result.records == 5000 and len(calls) > 10
    assert [r for c in calls for r in c] == records

    followed: list[list[Any]] = []
    f = persistlog.follow(log_dir, replay_batch=followed.append)
    assert f.poll() == 5000
    f.stop()
    assert len(followed) > 10 and [r for c in followed for r in c] == records


def test_replay_runs_with_the_cyclic_gc_paused(log_dir: str) -> None:
    _write(log_dir, [{"k": i} for i in range(10)])
    seen: list[bool] = []
    assert gc.isenabled()
    persistlog.restore(log_dir, lambda r: seen.append(gc.isenabled()))
    assert seen == [False] * 10 and gc.isenabled()

    def boom(r: Any) -> None:
        raise KeyError("app bug")

    with pytest.raises(KeyError):
        persistlog.restore(log_dir, boom)
    assert gc.isenabled()
    gc.disable()
    try:
        persistlog.restore(log_dir, lambda r: None)
        assert not gc.isenabled()  # an app that runs without the GC keeps it off
    finally:
        gc.enable()


@pytest.mark.parametrize("mode", ["replay", "replay_batch"])
def test_a_follower_resumes_after_the_records_a_failing_replay_took(log_dir: str, mode: str) -> None:
    records = [{"k": i, "v": "x" * 40} for i in range(3000)]
    _write(log_dir, records)
    applied: list[Any] = []
    fail = {"at": 1234}

    def take(rs: list[Any]) -> None:
        # All or nothing, as a replay_batch that raises takes nothing of its list.
        if any(r["k"] == fail["at"] for r in rs):
            fail["at"] = -1
            raise RuntimeError("app was busy")
        applied.extend(rs)

    kwargs: dict[str, Any] = {"replay_batch": take} if mode == "replay_batch" else {"replay": lambda r: take([r])}
    f = persistlog.follow(log_dir, **kwargs)
    with pytest.raises(RuntimeError):
        f.poll()
    f.poll()
    f.stop()
    assert applied == records  # each record exactly once, in order


# -- golden files: every reader as before ------------------------------------------------


def _golden_cases() -> list[str]:
    return sorted(name[: -len(".plog")] for name in os.listdir(GOLDEN) if name.endswith(".plog"))


def _codec(case: str) -> persistlog.Codec:
    from test_golden import CASES

    return CASES[case][1] or persistlog.Codec()


@pytest.mark.parametrize("case", _golden_cases())
def test_golden_logs_read_the_same_slice_by_slice(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Restore, follow and dump on every golden log, in one-record slices, give what the
    whole-batch decoder gives (the recorded expectation for restore)."""
    import json

    from test_golden import render

    from persistlog.cli import main

    path = os.path.join(GOLDEN, f"{case}.plog")
    codec = _codec(case)
    with open(os.path.join(GOLDEN, f"{case}.json")) as fh:
        expected = json.load(fh)["restore"]["records"]

    def readers() -> tuple[list[Any], list[Any], str]:
        restored: list[Any] = []
        persistlog.restore(path, replay_batch=restored.extend, codec=codec)
        followed: list[Any] = []
        f = persistlog.follow(path, replay_batch=followed.extend, codec=codec)
        f.poll()
        f.stop()
        out = io.StringIO()
        from contextlib import redirect_stderr, redirect_stdout

        with redirect_stdout(out), redirect_stderr(io.StringIO()):
            main(["dump", path, "--json", "--control"])
        return restored, followed, out.getvalue()

    monkeypatch.setattr(decoder, "SLICE_BYTES", 1)
    restored, followed, dumped = readers()
    assert render(restored) == expected and render(followed) == expected
    monkeypatch.setattr(decoder, "_record_bounds", None)
    assert readers()[2] == dumped


@pytest.mark.slow
@pytest.mark.parametrize("case", _golden_cases())
def test_golden_logs_read_the_same_in_the_spark_reader(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Spark reader's Python path (the C JSON path turned off), in one-record slices,
    gives the rows it gives decoding each batch whole."""
    pytest.importorskip("pyarrow")
    import pyarrow as pa

    from persistlog._format import jsonify
    from spark_replay import _scan
    from spark_replay._options import ReadOptions
    from spark_replay._plan import plan
    from spark_replay._schema import arrow_schema

    path = os.path.join(GOLDEN, f"{case}.plog")
    monkeypatch.setattr(jsonify, "_c_records", None)
    monkeypatch.setattr(_scan, "texts_from_cbor", lambda payload, count: None)
    monkeypatch.setattr(_scan, "resource_texts_from_cbor", lambda payload, count: None)

    def rows(convention: str) -> list[dict[str, Any]]:
        opts = ReadOptions.parse({"path": path, "convention": convention})
        batches = [b for p in plan(opts) for b in _scan.read_records(p)]
        return pa.Table.from_batches(batches, schema=arrow_schema("records", convention)).to_pylist()

    monkeypatch.setattr(decoder, "SLICE_BYTES", 1)
    sliced_rows = [rows("raw"), rows("resource")]
    monkeypatch.setattr(decoder, "_record_bounds", None)
    assert [rows("raw"), rows("resource")] == sliced_rows
    assert sliced_rows[0]


# -- close(rotate=True) -----------------------------------------------------------------


def test_close_rotate_leaves_one_fresh_snapshot(tmp_path: Any) -> None:
    counts = {}
    for rotate in (False, True):
        url = str(tmp_path / f"store-{rotate}")
        store = persistlog.ResourceStore.open(url)
        for i in range(2000):
            store[i % 50] = {"n": i}
        del store[0]
        store.close(rotate=rotate)
        again = persistlog.ResourceStore.open(url)
        assert again.to_dict() == {k: {"n": 1950 + k} for k in range(1, 50)}
        assert again.restored is not None
        counts[rotate] = again.restored.records
        again.close()
    assert counts[True] == 49 and counts[False] > 2000


def test_close_rotate_closes_even_when_the_enumeration_fails(log_dir: str) -> None:
    fail = {"on": False}

    def enumerate_all(emit: Callable[[Any], None]) -> None:
        if fail["on"]:
            raise ValueError("enumeration broke")

    lg = persistlog.open(log_dir, enumerate_all)
    lg.update({"k": 1})
    fail["on"] = True
    with pytest.raises(persistlog.EnumerateError):
        lg.close(rotate=True)
    got: list[Any] = []
    persistlog.restore(log_dir, got.append)
    assert got == [{"k": 1}]
    persistlog.open(log_dir, lambda emit: None).close()  # the lock was released
