"""Followers racing retention: a log that retention deletes under a follower is a retention
gap (a reset through ``on_reset``, or ``ResetRequired``), also while a reset reads the log
it starts again from; never a raw ``OSError``, never a hole. A segment missing in the middle
of a log that is still there is corruption, without a reset."""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import persistlog
from persistlog._format import constants as F
from persistlog._write.retention import apply_retention
from persistlog._write.segment_writer import move_pointer
from kv_app import apply
from faults import FaultPlan
from follower_harness import Where, Writer, check_chain, drain, make_where


@pytest.fixture(params=["local", "s3"])
def racing_where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    return make_where(request.param, request, tmp_path)


# -- a writer rotating fast with retain=1, a slow follower ------------------------------------

KEYS = 300
PER_CALL = 50


class History:
    """What the racing writer logged: the last LSN and the first value of each
    ``update_many``. Values count up and value ``n`` goes to key ``k{n % KEYS}``, so the
    record at any LSN, and the state at any LSN, are known."""

    def __init__(self) -> None:
        self.firsts: list[int] = []
        self.lasts: list[int] = []

    def add(self, last_lsn: int, first_value: int) -> None:
        self.firsts.append(first_value)
        self.lasts.append(last_lsn)

    def knows(self, lsn: int) -> bool:
        """Whether every call up to ``lsn`` is recorded (the writer records after logging)."""
        return bool(self.lasts) and self.lasts[-1] >= lsn

    def expected(self, lsn: int, kind: str, key: str) -> int:
        """The value the record at ``lsn`` must carry: an update's own, or for a snapshot
        record the value its key had at that point of the history."""
        i = bisect_left(self.lasts, lsn)
        in_call = i < len(self.lasts) and self.lasts[i] - PER_CALL < lsn
        if kind == "update":
            assert in_call, f"no update_many wrote LSN {lsn}"
            return self.firsts[i] + lsn - (self.lasts[i] - PER_CALL + 1)
        assert not in_call and i > 0, f"snapshot record at LSN {lsn}, inside or before the updates"
        newest = self.firsts[i - 1] + PER_CALL - 1
        return newest - (newest - int(key[1:])) % KEYS


class Racer(threading.Thread):
    """``update_many`` of PER_CALL puts in a loop, in bursts of BURST rotations with a
    pause after each: a slow follower falls behind in every burst, and the pause lets the
    reset that follows finish (each re-sync retention outruns takes a rotation, and a
    burst has fewer than RESYNC_ATTEMPTS)."""

    BURST = 3
    PAUSE = 0.3

    def __init__(self, w: Writer, history: History) -> None:
        super().__init__(daemon=True)
        self.w, self.history = w, history
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        n = 0
        try:
            while not self.halt.is_set():
                until = self.w.log.seq + self.BURST
                while self.w.log.seq < until and not self.halt.is_set():
                    last = self.w.put_many([(f"k{(n + j) % KEYS}", n + j) for j in range(PER_CALL)])
                    self.history.add(last, n)
                    n += PER_CALL
                self.halt.wait(self.PAUSE)
        except BaseException as e:  # reported by the test
            self.error = e


class Replica:
    """The follower's app: a dict, cleared on reset, and what it was given, in order:
    each followed batch (LSNs, and every record checked against the history) and each
    reset (None)."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.state: dict[str, Any] = {}
        self.events: list[persistlog.FollowedBatch | None] = []
        self.unchecked: list[tuple[int, str, Any]] = []
        self.wrong: list[str] = []

    def replay_batch(self, records: list[Any]) -> None:
        time.sleep(0.002 + 0.00002 * len(records))  # a slow replica
        for r in records:
            apply(self.state, r)

    def on_reset(self) -> None:
        self.state.clear()
        self.events.append(None)

    def took(self, fb: persistlog.FollowedBatch) -> None:
        self.events.append(persistlog.FollowedBatch([], fb.first_lsn, fb.last_lsn, fb.commit_time, fb.cursor))  # LSNs only
        assert fb.last_lsn - fb.first_lsn + 1 == len(fb.records) == len(fb.kinds)
        for i, (record, kind) in enumerate(zip(fb.records, fb.kinds)):
            self.unchecked.append((fb.first_lsn + i, kind, record))
        self.check(final=False)

    def check(self, final: bool) -> None:
        keep = []
        for lsn, kind, record in self.unchecked:
            if not final and not self.history.knows(lsn):
                keep.append((lsn, kind, record))
                continue
            want = self.history.expected(lsn, kind, record["key"])
            if record != {"op": "put", "key": record["key"], "value": want} or want % KEYS != int(record["key"][1:]):
                self.wrong.append(f"LSN {lsn} ({kind}): {record}, expected value {want}")
        self.unchecked = keep

    def chains(self) -> list[list[persistlog.FollowedBatch]]:
        """The batches between resets."""
        runs: list[list[persistlog.FollowedBatch]] = [[]]
        for e in self.events:
            if e is None:
                runs.append([])
            else:
                runs[-1].append(e)
        return runs


def _follow_until(f: persistlog.Follower, replica: Replica, done: Callable[[persistlog.FollowedBatch], bool], timeout: float) -> None:
    guard = threading.Timer(timeout, f.stop)
    guard.start()
    try:
        for fb in f:
            replica.took(fb)
            if done(fb):
                return
    finally:
        guard.cancel()
    raise AssertionError(f"the follower stopped at {f.cursor} (error {f.error!r})")


@pytest.mark.slow
def test_slow_follower_resets_whenever_retention_deletes_what_it_reads(racing_where: Where) -> None:
    """The race of a follower behind a writer rotating every 64 KiB with retain=1: the
    follower's log, and the log each reset starts again from, are deleted as it reads them.
    It never raises; every record it applies is the record the writer logged at that LSN
    (a snapshot record carries its key's value at its LSN), without a hole between two
    resets; and it ends holding the writer's state."""
    where = racing_where
    w = Writer(where.url, where.so, rotate_bytes=64 * 1024, retain=1, **where.open_options)
    history = History()
    replica = Replica(history)
    racer = Racer(w, history)
    racer.start()
    f = where.follow(replay_batch=replica.replay_batch, on_reset=replica.on_reset)
    started = time.monotonic()
    try:
        _follow_until(f, replica, lambda fb: (time.monotonic() - started > 2.5 and f.resets >= 2)
                      or time.monotonic() - started > 15, timeout=40)
    finally:
        racer.halt.set()
        racer.join(30)
    assert racer.error is None, racer.error
    w.close()
    if f.cursor is None or f.cursor.next_lsn <= w.last_lsn:  # not applied all yet
        _follow_until(f, replica, lambda fb: fb.last_lsn == w.last_lsn, timeout=40)
    f.stop()
    replica.check(final=True)
    assert not replica.wrong, replica.wrong[:5]
    assert f.resets == replica.events.count(None) >= 1
    for run in replica.chains():
        lsns = [(fb.first_lsn, fb.last_lsn) for fb in run]
        assert all(b[0] == a[1] + 1 for a, b in zip(lsns, lsns[1:])), f"a hole or a repeat in {lsns}"
    assert replica.state == w.data


# -- the exact race points ------------------------------------------------------------------


def _write_logs(w: Writer, seqs: range, records: int = 60) -> None:
    """Fill logs ``seqs`` (the first is the writer's current log), several segments each."""
    for seq in seqs:
        if seq != seqs[0]:
            w.log.rotate()
        assert w.log.seq == seq
        for i in range(records):
            w.put(f"k{i % 11}", [seq, i, "v" * 60])
            if i % 15 == 14:
                w.log.sync()  # a new segment object on object stores


def _retention_moves_to(where: Where, seq: int) -> None:
    """What a writer does once log ``seq`` is complete: CURRENT names it, then retention
    (retain=1) deletes every older log, last segment first."""
    dest = where.dest()
    assert move_pointer(dest, seq)
    apply_retention(dest, [seq], 1, seq)
    assert where.log_seqs()[0] == seq


@pytest.mark.slow
def test_a_reset_survives_retention_deleting_the_log_it_starts_again_from(racing_where: Where) -> None:
    """The cursor's log is gone: the follower resets and reads the newest complete log;
    retention deletes that one too after the reset applied some of it: a second reset,
    from the next complete log. Before, the second deletion escaped as FileNotFoundError."""
    where = racing_where
    w = Writer(where.url, where.so, segment_bytes=4096, retain=10, **where.open_options)
    _write_logs(w, range(1, 4))
    w.log.sync()
    f = where.follow(lambda r: None)
    drain(f, w.last_lsn)
    saved = f.cursor
    f.stop()
    assert saved is not None and saved.log == 3
    _write_logs(w, range(3, 6))
    w.close()
    # CURRENT as it was before log 5 completed; retention left log 4 and log 5.
    _retention_moves_to(where, 4)
    assert len([n for n in where.names() if n.startswith(f"{4:020d}")]) >= 2

    state: dict[str, Any] = {}
    resets: list[int] = []

    def replay(record: Any) -> None:
        if len(resets) == 1 and not state:  # the reset's first record, of log 4
            _retention_moves_to(where, 5)
        apply(state, record)

    def on_reset() -> None:
        resets.append(1)
        state.clear()

    f = where.follow(replay, cursor=saved, on_reset=on_reset)
    batches = drain(f, w.last_lsn)
    f.stop()
    assert f.resets == len(resets) == 2
    assert state == w.data
    after = [fb for fb in batches if fb.cursor.log == 5]
    assert after and check_chain(after, None) == w.last_lsn


def _five_logs(where: Where) -> Writer:
    """Logs 1 to 5 at ``where`` (memory://), several segments each, sealed."""
    w = Writer(where.url, segment_bytes=4096, retain=10, **where.open_options)
    _write_logs(w, range(1, 6))
    w.close()
    return w


def _follow_through_faults(where: Where, plan: FaultPlan, **options: Any) -> persistlog.Follower:
    url = where.url.replace("memory://", "faulty://", 1)
    return persistlog.follow(url, storage_options={"target_protocol": "memory", "faults": plan}, **options)


# A follower's sync reads CURRENT, lists the logs, then reads the log it picked: its second
# read is where it opens that log.
OPENING_THE_LOG = 2


def test_log_deleted_between_listing_and_reading_before_anything_applied(clean_memory_fs: None, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The first sync listed the logs and picked the newest complete one; retention deletes
    it before the follower read a record of it: the follower starts again from the next
    complete log, without a reset (nothing was applied), so even without on_reset."""
    where = make_where("memory", request, tmp_path)
    w = _five_logs(where)
    _retention_moves_to(where, 4)
    plan = FaultPlan().call_before("cat_file", lambda: _retention_moves_to(where, 5), nth=OPENING_THE_LOG)
    state: dict[str, Any] = {}
    f = _follow_through_faults(where, plan, replay=lambda r: apply(state, r))
    assert f.poll() > 0
    assert plan.fired and f.resets == 0
    assert state == w.data and f.cursor is not None and f.cursor.log == 5
    assert f.cursor.next_lsn == w.last_lsn + 1


def test_segment_missing_in_the_middle_of_a_live_log_is_corruption_not_a_reset(clean_memory_fs: None, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A segment of the newest log (CURRENT names it) vanishes after the listing while the
    segments after it stay: damage, reported as such, and the app's state is not reset."""
    where = make_where("memory", request, tmp_path)
    _five_logs(where)
    second = F.segment_name(5, 1)
    assert second in where.names() and F.segment_name(5, 2) in where.names()
    plan = FaultPlan().call_before("cat_file", lambda: where.dest().delete(second), nth=OPENING_THE_LOG)
    resets: list[int] = []
    f = _follow_through_faults(where, plan, replay=lambda r: None, on_reset=lambda: resets.append(1))
    with pytest.raises(persistlog.CorruptLogError) as e:
        f.poll()
    assert plan.fired
    assert e.value.log == 5 and e.value.segment == second
    assert resets == [] and f.resets == 0


def test_log_cut_short_by_retention_under_way_at_the_listing_is_a_reset_not_corruption(clean_memory_fs: None, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The sync read CURRENT (log 4); before its listing, the writer moved CURRENT to log 5
    and retention deleted log 4's later segments but not yet its first: the listing shows
    log 4 ending early, without its seal, and log 5 starting after it. That is retention
    under way (every segment listed is still there when the scan ends): the follower
    starts again from log 5, and reports no damage (before: "no snapshot-complete
    marker", or with the marker in the first segment, "LSNs missing from its end")."""
    where = make_where("memory", request, tmp_path)
    w = _five_logs(where)
    _retention_moves_to(where, 4)
    fourth = sorted(n for n in where.names() if n.startswith(f"{4:020d}"))
    assert len(fourth) >= 3

    def retention_under_way() -> None:
        dest = where.dest()
        assert move_pointer(dest, 5)
        for name in reversed(fourth[1:]):  # last segment first, as retention does
            dest.delete(name)

    plan = FaultPlan().call_before("ls", retention_under_way)
    state: dict[str, Any] = {}
    resets: list[int] = []

    def on_reset() -> None:
        resets.append(1)
        state.clear()

    f = _follow_through_faults(where, plan, replay=lambda r: apply(state, r), on_reset=on_reset)
    f.poll()
    f.poll()
    assert plan.fired
    assert f.resets == len(resets) <= 1  # one if it applied some of log 4 first
    assert state == w.data and f.cursor is not None and f.cursor.log == 5
    assert f.cursor.next_lsn == w.last_lsn + 1
