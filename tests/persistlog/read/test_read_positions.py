"""Reading by position (``persistlog.read``, ``Cursor.earliest/at_lsn/at_time``, ``follow``
from a position) and point-in-time restore (``restore(to_lsn=, to_time=)``), checked
against a model of what was written: docs/DESIGN.md, "Reading by position"."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import persistlog
from destinations import open_destination
from persistlog import Cursor, PositionError
from persistlog._read.seek import seek
from hypothesis_profiles import active_profile
from log_files import crash, segment_files
from s3_requests import S3Requests


@dataclass
class Written:
    """A log written by a dict app, and what the app's state was after each update."""

    url: str
    # (LSN of the update, the state right after it), in LSN order.
    states: list[tuple[int, dict[str, int]]] = field(default_factory=list)

    def state_at(self, lsn: int) -> dict[str, int]:
        state: dict[str, int] = {}
        for at, s in self.states:
            if at > lsn:
                break
            state = s
        return state


def write_log(url: str, ops: list[tuple[str, int] | None], *, retain: int = 100, segment_bytes: int = 4096,
              **options: Any) -> Written:
    """Apply ``ops`` (a put of key, value; None: a rotation) through a Log at ``url``."""
    data: dict[str, int] = {}
    written = Written(url)

    def enumerate_all(emit: Any) -> None:
        for k, v in data.items():
            emit({"k": k, "v": v})

    log = persistlog.open(url, enumerate_all, retain=retain, segment_bytes=segment_bytes, **options)
    try:
        for op in ops:
            if op is None:
                log.rotate()
                continue
            k, v = op
            log.update({"k": k, "v": v})
            data[k] = v
            written.states.append((log.next_lsn - 1, dict(data)))
    finally:
        log.close()
    return written


def apply(state: dict[str, int]) -> Any:
    return lambda r: state.__setitem__(r["k"], r["v"])


ops_strategy = st.lists(
    st.one_of(st.none(), st.tuples(st.sampled_from("abcdefg"), st.integers(0, 10**6))),
    min_size=1, max_size=120,
).map(lambda ops: ops + [("z", 0)])


# -- read(start, stop) is a slice of the whole history -----------------------------------------


@active_profile(max_examples=20)
@given(ops=ops_strategy, data=st.data())
def test_read_between_positions_is_the_slice_of_a_full_replay(ops: list[Any], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        written = write_log(f"{tmp}/log", ops, segment_bytes=data.draw(st.sampled_from([4096, 1 << 20])),
                            batch_bytes=data.draw(st.sampled_from([64, 1 << 20])))
        full = list(persistlog.read(written.url))
        assert [r.lsn for r in full] == list(range(1, len(full) + 1))
        # The whole history holds every update the app made, in order, as it made it.
        updates = [r for r in full if r.kind == "update"]
        assert [r.lsn for r in updates] == [lsn for lsn, _ in written.states]
        end = len(full) + 1
        start = data.draw(st.integers(1, end), label="start")
        stop = data.draw(st.integers(start, end + 3), label="stop")
        assert list(persistlog.read(written.url, start, stop)) == full[start - 1: stop - 1]
        # A cursor a record hands out resumes right after it.
        if start < end:
            assert list(persistlog.read(written.url, full[start - 1].cursor)) == full[start:]
            assert list(persistlog.read(written.url, Cursor.at_lsn(written.url, start), stop)) == \
                full[start - 1: stop - 1]
        # A time names the first batch committed at or after it.
        if start < end:
            t = datetime.fromtimestamp(full[start - 1].commit_time, timezone.utc)
            got = list(persistlog.read(written.url, t))
            assert got == [r for r in full if r.commit_time >= full[start - 1].commit_time]
            assert list(persistlog.read(written.url, None, t)) == \
                [r for r in full if r.commit_time < full[start - 1].commit_time]


def test_read_on_an_object_store_finds_the_lsn_by_headers(clean_memory_fs: None) -> None:
    ops: list[Any] = [("a", i) if i % 37 else None for i in range(400)]
    written = write_log("memory://read-pos/log", ops, segment_bytes=4096, batch_bytes=64)
    full = list(persistlog.read(written.url))
    for lsn in (1, 2, 150, 301, len(full)):
        assert [r.lsn for r in persistlog.read(written.url, lsn, lsn + 3)] == \
            list(range(lsn, min(lsn + 3, len(full) + 1)))
    assert Cursor.earliest(written.url) == Cursor(1, 0, 0, 1)


# -- positions that are not there ---------------------------------------------------------------


@pytest.fixture(scope="module")
def retained(tmp_path_factory: pytest.TempPathFactory) -> Written:
    """A log whose retention deleted its oldest logs."""
    url = str(tmp_path_factory.mktemp("retained") / "log")
    ops: list[Any] = []
    for r in range(6):
        ops += [(f"k{i}", r * 100 + i) for i in range(30)] + [None]
    return write_log(url, ops, retain=2)


def test_positions_before_retention_or_past_the_end_are_position_errors(retained: Written) -> None:
    full = list(persistlog.read(retained.url))
    first, last = full[0].lsn, full[-1].lsn
    assert first > 1  # retention deleted the oldest logs
    for bad in (first - 1, last + 2):
        with pytest.raises(PositionError) as e:
            Cursor.at_lsn(retained.url, bad)
        assert isinstance(e.value, ValueError) and not isinstance(e.value, persistlog.CorruptLogError)
        assert (e.value.first_lsn, e.value.last_lsn) == (first, last)
        assert f"LSNs {first}..{last}" in str(e.value) and e.value.first_time is not None
        with pytest.raises(PositionError):
            next(persistlog.read(retained.url, bad))
        with pytest.raises(PositionError):
            persistlog.restore(retained.url, lambda r: None, to_lsn=bad)
    assert "before the oldest record" in str(pytest.raises(PositionError, Cursor.at_lsn, retained.url, 1).value)
    assert "past the end" in str(pytest.raises(PositionError, Cursor.at_lsn, retained.url, last + 5).value)
    # The LSN the next record takes is the end: a follower waits there, a read is empty.
    assert list(persistlog.read(retained.url, last + 1)) == []
    long_ago = datetime(2000, 1, 1, tzinfo=timezone.utc)
    with pytest.raises(PositionError, match="before the oldest record"):
        Cursor.at_time(retained.url, long_ago)
    with pytest.raises(PositionError):
        persistlog.restore(retained.url, lambda r: None, to_time=long_ago)


def test_bad_position_arguments_are_refused_before_reading(tmp_path: Path) -> None:
    url = write_log(str(tmp_path / "log"), [("a", 1)]).url
    with pytest.raises(ValueError, match="timezone-aware"):
        persistlog.read(url, datetime(2020, 1, 1))
    with pytest.raises(TypeError):
        persistlog.read(url, "12")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="LSNs start at 1"):
        Cursor.at_lsn(url, 0)
    with pytest.raises(ValueError, match="before start"):
        next(persistlog.read(url, 2, 1))
    with pytest.raises(TypeError, match="not both"):
        persistlog.restore(url, lambda r: None, to_lsn=1, to_time=datetime.now(timezone.utc))
    with pytest.raises(persistlog.LogNotFoundError):
        Cursor.earliest(str(tmp_path / "nothing"))


def test_a_time_position_before_an_untrimmed_history_is_its_start(tmp_path: Path) -> None:
    url = write_log(str(tmp_path / "log"), [("a", 1), ("b", 2)]).url
    long_ago = datetime(2000, 1, 1, tzinfo=timezone.utc)
    assert Cursor.at_time(url, long_ago) == Cursor.earliest(url)
    assert [r.lsn for r in persistlog.read(url, long_ago)] == [1, 2]
    state: dict[str, int] = {}
    result = persistlog.restore(url, apply(state), to_time=long_ago)
    assert state == {} and result.records == 0
    later = datetime.now(timezone.utc) + timedelta(days=1)
    assert Cursor.at_time(url, later) == Cursor.at_lsn(url, 3)  # the end


# -- followers from a position ------------------------------------------------------------------


def test_follow_from_a_position_replays_the_history_from_there(retained: Written) -> None:
    full = list(persistlog.read(retained.url))
    mid = full[len(full) // 2]
    for cursor, expected in (
        (Cursor.earliest(retained.url), full),
        (Cursor.at_lsn(retained.url, mid.lsn), full[len(full) // 2:]),
        (Cursor.at_time(retained.url, datetime.fromtimestamp(mid.commit_time, timezone.utc)),
         [r for r in full if r.commit_time >= mid.commit_time]),
    ):
        got: list[Any] = []
        f = persistlog.follow(retained.url, got.append, cursor=cursor)
        while f.poll():
            pass
        assert got == [r.record for r in expected]
        assert f.cursor is not None and f.cursor.next_lsn == full[-1].lsn + 1
        f.stop()


# -- point-in-time restore ----------------------------------------------------------------------


@active_profile(max_examples=15)
@given(ops=ops_strategy, data=st.data())
def test_restore_to_an_lsn_is_the_model_state_at_that_lsn(ops: list[Any], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        written = write_log(f"{tmp}/log", ops, retain=data.draw(st.sampled_from([1, 100])))
        full = list(persistlog.read(written.url))
        lsn = data.draw(st.integers(full[0].lsn, full[-1].lsn), label="to_lsn")
        state: dict[str, int] = {}
        try:
            result = persistlog.restore(written.url, apply(state), to_lsn=lsn)
        except PositionError as e:
            # Only when no complete snapshot is left at or before that LSN.
            assert "no complete state" in str(e) and full[0].lsn > 1
            return
        assert state == written.state_at(lsn)
        assert result.last_lsn == lsn and result.next_lsn == lsn + 1


def test_restore_to_a_time_is_the_state_of_every_batch_committed_by_then(retained: Written) -> None:
    full = list(persistlog.read(retained.url))
    for r in (full[len(full) // 3], full[-1]):
        t = datetime.fromtimestamp(r.commit_time, timezone.utc)
        last = max(x.lsn for x in full if x.commit_time <= r.commit_time)
        state: dict[str, int] = {}
        result = persistlog.restore(retained.url, apply(state), to_time=t)
        assert result.last_lsn == last and state == retained.state_at(last)
    # A point-in-time restore is not where the log ends: open() does not build on it.
    persistlog.restore(retained.url, lambda r: None, to_lsn=full[-1].lsn - 1)
    with pytest.raises(persistlog.ExistingLogError):
        persistlog.open(retained.url, lambda emit: None)


def test_a_cursor_into_a_deleted_log_is_a_position_error(retained: Written) -> None:
    with pytest.raises(PositionError, match="which is not there") as e:
        next(persistlog.read(retained.url, Cursor(1, 0, 0, 1)))
    assert e.value.first_lsn > 1


def test_a_torn_tail_is_the_end_not_damage(tmp_path: Path) -> None:
    """A crash left the newest segment ending in zeros: the end is where the intact
    batches end, and positions past it are past the end (docs/FORMAT.md, "Torn tails
    and corruption")."""
    url = str(tmp_path / "log")
    lg = persistlog.open(url, lambda emit: None, durability="flush")
    for i in range(20):
        lg.update({"k": "a", "v": i})
    crash(lg)
    newest = segment_files(url)[-1]
    with open(newest, "ab") as f:
        f.write(b"\0" * 100)
    last = list(persistlog.read(url))[-1].lsn
    assert last == 20 and Cursor.at_lsn(url, 21).next_lsn == 21
    with pytest.raises(PositionError, match="past the end"):
        Cursor.at_lsn(url, 22)


@pytest.mark.slow  # ~20 s: a segment object per update on moto
def test_a_seek_on_s3_reads_headers_not_the_segments_before_it(
    s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    """Counted as sent: one LIST, a handful of small header reads (a binary search over
    the logs, then over the segments of one), and the one segment that holds the LSN."""
    url = f"s3://{s3_bucket}/log"
    ops: list[Any] = []
    for r in range(3):
        ops += [(f"k{i}", r) for i in range(12)] + [None]
    write_log(url, ops, durability="flush", storage_options=s3_storage_options)
    so = {**s3_storage_options, "skip_instance_cache": True}
    full = list(persistlog.read(url, storage_options=so))
    segments = sum(len(s) for s in persistlog._read.reader.list_logs(open_destination(url, **so)).values())
    assert segments > 30  # one object per flush
    lsn = full[len(full) * 2 // 3].lsn
    dest = open_destination(url, **so)
    sent = S3Requests(dest)
    view, place = seek(dest, lsn)
    assert Cursor.from_place(place) == Cursor.at_lsn(url, lsn, storage_options=so)
    assert sent.counts["ListObjectsV2"] == 1
    # log2 of the logs and of one log's segments, each a header read, and the target.
    assert sent.counts["GetObject"] <= 2 * (len(view.seqs).bit_length() + segments.bit_length()) + 2, sent.counts
    assert set(sent.counts) <= {"ListObjectsV2", "GetObject"}
    dest.close()
