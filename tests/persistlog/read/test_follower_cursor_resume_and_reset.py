"""Follower cursors: resuming at random points applies each record once; a follower that
fell behind retention, or whose cursor is ahead of the log, resets through ``on_reset``."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import pytest

import persistlog
from kv_app import apply
from threads import wait_until
from follower_harness import Where, Writer, check_chain, drain, where


# -- cursor resume ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12])
def test_cursor_resume_at_random_points_applies_each_record_once(where: Where, seed: int) -> None:
    """Stop the follower at random points (mid-segment, mid-object, at a seal, before any
    batch), persist ``str(cursor)``, resume a new follower from it: the LSNs applied are
    gapless and never repeat, and the state equals the writer's."""
    rng = random.Random(seed)
    if where.kind == "s3" and seed != 11:
        pytest.skip("one seed is enough on S3")
    # flush mode: one batch per update; a long flush interval puts many batches in each
    # object-store segment, so that stops land in the middle of objects.
    w = Writer(where.url, where.so, durability="flush", segment_bytes=4096, retain=50, flush_interval=30)
    state: dict[str, Any] = {}
    saved: str | None = None
    last: int | None = None
    stops = 0
    rounds = 6 if where.kind == "s3" else 12
    try:
        for round_ in range(rounds):
            w.random_ops(rng, rng.randrange(5, 40))
            if rng.random() < 0.3:
                w.log.rotate()
                w.random_ops(rng, rng.randrange(0, 5))
            w.log.sync()
            target = w.last_lsn
            # Follow to the end in several legs, each stopped after a random number of batches.
            while True:
                cursor: Any = saved
                if saved is not None and rng.random() < 0.5:
                    cursor = persistlog.Cursor.from_dict(json.loads(persistlog.Cursor.parse(saved).to_json()))
                f = where.follow(lambda r: apply(state, r), cursor=cursor)
                leg: list[persistlog.FollowedBatch] = []
                want = rng.randrange(0, 6)
                if want:
                    guard = threading.Timer(20, f.stop)
                    guard.start()
                    for fb in f:
                        leg.append(fb)
                        if len(leg) >= want or fb.last_lsn >= target:
                            break
                    guard.cancel()
                    assert leg, f"follower yielded nothing (error {f.error!r})"
                last = check_chain(leg, last)
                if f.cursor is not None:
                    saved = str(f.cursor)
                f.stop()
                stops += 1
                assert f.resets == 0
                if last == target:
                    break
            assert state == w.data, f"round {round_}"
    finally:
        w.close()
    assert stops > rounds


def test_cursor_roundtrip_and_bad_cursors() -> None:
    c = persistlog.Cursor(3, 1, 4096, 77)
    assert persistlog.Cursor.parse(str(c)) == c
    assert persistlog.Cursor.from_dict(c.to_dict()) == c
    assert persistlog.Cursor.from_dict(json.loads(c.to_json())) == c
    for bad in ["", "1:2:3", "1:2:3:x", "-1:0:0:1", "1:2:3:4:5"]:
        with pytest.raises(ValueError):
            persistlog.Cursor.parse(bad)
    with pytest.raises(ValueError):
        persistlog.Cursor.from_dict({"log": 1})
    with pytest.raises(TypeError):
        persistlog.follow("memory://x/never", lambda r: None, cursor=12)  # type: ignore[arg-type]


# -- retention overrun, cursors ahead -------------------------------------------------------


def _overrun(w: Writer, where: Where, seq: int, retain: int) -> None:
    """Rotate until log ``seq`` is gone from the destination (retention may run late)."""
    for i in range(retain + 1):
        w.put(f"r{i}", i)
        w.log.rotate()
    w.put("after", 1, sync=True)
    wait_until(lambda: seq not in where.log_seqs(), 20, lambda: f"log {seq} still at {where.names()}")


@pytest.mark.slow
def test_retention_overrun_resets_through_on_reset(where: Where) -> None:
    w = Writer(where.url, where.so, retain=1, **where.open_options)
    try:
        for i in range(30):
            w.put(f"k{i % 9}", i)
        w.log.rotate()
        w.delete("k1")
        w.put("k2", "x", sync=True)
        state: dict[str, Any] = {}
        f = where.follow(lambda r: apply(state, r))
        check_chain(drain(f, w.last_lsn), None)
        saved = str(f.cursor)
        f.stop()
        assert state == w.data
        _overrun(w, where, persistlog.Cursor.parse(saved).log, retain=1)

        # Without a hook: ResetRequired, and nothing applied.
        bare = where.follow(lambda r: apply(state, r), cursor=saved)
        with pytest.raises(persistlog.ResetRequired):
            bare.poll()
        bare.stop()

        # With a hook: the app clears its state, the follower re-syncs from the newest
        # complete log and carries on.
        resets: list[int] = []

        def on_reset() -> None:
            resets.append(1)
            state.clear()

        f2 = where.follow(lambda r: apply(state, r), cursor=saved, on_reset=on_reset)
        batches = drain(f2, w.last_lsn)
        assert resets == [1] and f2.resets == 1
        assert state == w.data
        check_chain(batches, None)
        w.put("later", 2, sync=True)
        check_chain(drain(f2, w.last_lsn), batches[-1].last_lsn)
        assert state == w.data and resets == [1]
        f2.stop()
    finally:
        w.close()


@pytest.mark.slow
def test_follower_left_unpolled_past_retention_resets(where: Where) -> None:
    """The same follower object, not polled while retention deletes the logs after its
    position (it had read its log to the seal), resets on its next poll instead of
    reporting corruption."""
    w = Writer(where.url, where.so, retain=1, **where.open_options)
    w.put("a", 1)
    w.log.rotate()
    w.put("b", 2)
    w.close()  # seals the log
    state: dict[str, Any] = {}
    resets: list[int] = []
    f = where.follow(lambda r: apply(state, r), on_reset=lambda: (resets.append(1), state.clear()))
    drain(f, w.last_lsn)
    assert f.poll() == 0
    seq = f.cursor.log  # type: ignore[union-attr]
    w2 = Writer(where.url, where.so, restore=True, retain=1, **where.open_options)
    try:
        w2.put("c", 3)
        _overrun(w2, where, seq + 1, retain=1)
        assert seq not in where.log_seqs()
        drain(f, w2.last_lsn)
        assert resets == [1]
        assert state == w2.data
        f.stop()
    finally:
        w2.close()


@pytest.mark.slow
def test_cursor_ahead_of_the_log_resets(where: Where) -> None:
    w = Writer(where.url, where.so, **where.open_options)
    try:
        for i in range(10):
            w.put(f"k{i}", i)
        w.log.sync()
        state: dict[str, Any] = {}
        f = where.follow(lambda r: apply(state, r))
        drain(f, w.last_lsn)
        cur = f.cursor
        assert cur is not None
        f.stop()
        size = where.dest().size(f"{cur.log:020d}-{cur.segment:010d}.plog")
        ahead = [
            persistlog.Cursor(cur.log + 5, 0, 40, cur.next_lsn + 100),  # a log that does not exist yet
            persistlog.Cursor(cur.log, cur.segment + 3, 120, cur.next_lsn + 50),  # a segment that does not
            persistlog.Cursor(cur.log, cur.segment, size + 1000, cur.next_lsn + 10),  # past the end
        ]
        for c in ahead:
            with pytest.raises(persistlog.ResetRequired):
                where.follow(lambda r: None, cursor=c).poll()
            fresh: dict[str, Any] = {"junk": 1}
            resets: list[int] = []
            f2 = where.follow(lambda r: apply(fresh, r), cursor=str(c),
                              on_reset=lambda: (resets.append(1), fresh.clear()))
            drain(f2, w.last_lsn)
            assert resets == [1], c
            assert fresh == w.data, c
            f2.stop()
    finally:
        w.close()


def test_a_cursor_inside_a_batch_is_the_position_until_a_record_after_it_is_applied(tmp_path: Any) -> None:
    """Handed a cursor inside a batch, the follower scans from the batch's start but its
    ``cursor`` stays the one handed in until a record after it is applied: an app (or a
    consumer group) saving it meanwhile must not go back to the batch's start."""
    url = str(tmp_path / "log")
    lg = persistlog.open(url, lambda emit: None)
    last = lg.update_many([{"op": "put", "key": f"k{i}", "value": i} for i in range(10)])
    assert last is not None
    lg.close()
    batch = next(fb for fb in drain(persistlog.follow(url), last) if len(fb.records) == 10)
    inside = batch.record_cursor(batch.first_lsn + 3)  # after the batch's fourth record

    def refuse(record: Any) -> None:
        raise RuntimeError("the app cannot take it yet")

    f = persistlog.follow(url, refuse, cursor=inside)
    with pytest.raises(RuntimeError):
        f.poll()
    assert f.cursor == inside, (str(f.cursor), str(inside))
    f.stop()
    got: list[Any] = []
    g = persistlog.follow(url, got.append, cursor=inside)
    g.poll()
    g.stop()
    assert [r["value"] for r in got] == list(range(4, 10))


@pytest.mark.parametrize("error", [FileNotFoundError("the app's own file"), PermissionError("the app's own")])
@pytest.mark.parametrize("batch", [False, True], ids=["replay", "replay_batch"])
def test_an_apps_own_os_error_in_replay_is_passed_on_never_taken_for_storage(
    tmp_path: Any, error: OSError, batch: bool
) -> None:
    """An OSError the app's replay raises is the app's: poll() raises it as it is, with no
    reset and no DestinationError, and the next poll resumes at the record it failed on."""
    url = str(tmp_path / "log")
    with persistlog.open(url, lambda emit: None) as lg:
        for i in range(5):
            lg.update({"op": "put", "key": f"k{i}", "value": i})
    got: list[Any] = []
    fail = [True]
    resets: list[int] = []

    def take(record: Any) -> None:
        if record["key"] == "k2" and fail[0]:
            fail[0] = False
            raise error
        got.append(record["key"])

    options: dict[str, Any] = {"replay_batch": lambda rs: [take(r) for r in rs]} if batch else {"replay": take}
    follower = persistlog.follow(url, on_reset=lambda: resets.append(1), **options)
    with pytest.raises(type(error)) as info:
        follower.poll()
    assert info.value is error and not resets and follower.resets == 0
    follower.poll()
    assert not resets
    assert got[-3:] == ["k2", "k3", "k4"] and got.count("k2") == 1
