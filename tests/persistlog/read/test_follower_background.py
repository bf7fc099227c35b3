"""Background followers (``start()``): keeping up, reporting the replay's error, and the
kind of each followed record."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import persistlog
from kv_app import apply
from threads import wait_until
from follower_harness import Writer, drain


# -- background mode -------------------------------------------------------------------


def test_background_follower_keeps_up_and_reports_its_error(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    w = Writer(url, segment_bytes=4096, retain=10)  # no retention overrun: no reset hook here
    batches: list[list[Any]] = []
    state: dict[str, Any] = {}

    def replay_batch(records: list[Any]) -> None:
        batches.append(records)
        for r in records:
            apply(state, r)

    with pytest.raises(persistlog.CorruptLogError):  # leaving the block raises it too
        with persistlog.follow(url, replay_batch=replay_batch, poll_interval=0.01) as f:
            assert f.wait_caught_up(10)
            rng = random.Random(3)
            for r in range(3):
                w.random_ops(rng, 150)
                w.log.rotate()
            w.log.sync()
            wait_until(lambda: state == w.data, 20, lambda: f"follower at {f.cursor}, writer at {w.last_lsn}")
            assert f.wait_caught_up(10)
            assert f.lag().records == 0
            assert f.applied_records == sum(map(len, batches)) and f.error is None
            # Damage behind the writer's back stops the thread; the error is kept.
            w.close()
            nxt = Path(url) / f"{w.log.seq + 1:020d}-{0:010d}.plog"
            nxt.write_bytes(b"\x13" * 200)  # a "next log" whose segment header is garbage
            wait_until(lambda: f.error is not None, 10, "the follower to stop on the damage")
            assert isinstance(f.error, persistlog.CorruptLogError)
            with pytest.raises(persistlog.CorruptLogError):
                f.wait_caught_up(1)
            with pytest.raises(persistlog.CorruptLogError):
                f.stop()
            with pytest.raises(persistlog.CorruptLogError):
                f.lag()
    with pytest.raises(TypeError):
        persistlog.follow(url, apply, replay_batch=replay_batch)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        persistlog.follow(url, poll_interval=0)


def test_background_follower_whose_replay_raised_says_so(tmp_path: Path) -> None:
    """Like ``Future.result()``: once the replay callback raised on the background thread,
    ``wait_caught_up()``, ``lag()`` and ``stop()`` raise the app's own exception instead of
    reporting a follower that is caught up with no lag."""
    url = str(tmp_path / "log")
    w = Writer(url, retain=10)
    w.random_ops(random.Random(5), 20)
    w.log.sync()

    class ReplayBug(Exception):
        pass

    def replay(record: Any) -> None:
        if record.get("key") == "poison":
            raise ReplayBug("cannot apply the poison record")

    f = persistlog.follow(url, replay, poll_interval=0.01).start()
    assert f.wait_caught_up(10)
    w.log.update({"op": "put", "key": "poison", "value": 1}, sync=True)
    wait_until(lambda: f.error is not None, 10, "the follower to stop on the replay error")
    with pytest.raises(ReplayBug):
        f.wait_caught_up(0.1)
    with pytest.raises(ReplayBug):
        f.lag()
    with pytest.raises(ReplayBug):
        f.stop()
    # Leaving a with block raises it as well, unless the block itself is raising.
    with pytest.raises(ReplayBug):
        with f:
            pass
    with pytest.raises(KeyError):
        with f:
            raise KeyError("the block's own error wins")
    w.close()


def test_followed_batches_carry_each_records_kind(tmp_path: Path) -> None:
    """Snapshot records (from an enumeration) and updates, even mixed in one batch, come
    with their kind."""
    url = str(tmp_path / "log")
    holder: dict[str, persistlog.Log] = {}

    def enumerate_all(emit: Any) -> None:
        emit({"op": "put", "key": "s1", "value": 1})
        if "lg" in holder:  # an update between two snapshot records: a mixed batch
            holder["lg"].update({"op": "put", "key": "u-during", "value": 2})
        emit({"op": "put", "key": "s2", "value": 3})

    lg = persistlog.open(url, enumerate_all, rotate_bytes=None, flush_interval=3600.0)
    holder["lg"] = lg
    lg.update({"op": "put", "key": "u1", "value": 4})
    lg.rotate()
    last = lg.update({"op": "put", "key": "u2", "value": 5})
    lg.close()
    f = persistlog.follow(url, lambda r: None)
    batches = drain(f, last)
    f.stop()
    assert all(len(fb.kinds) == len(fb.records) for fb in batches)
    pairs = [(r["key"], kind) for fb in batches for r, kind in zip(fb.records, fb.kinds)]
    assert pairs[-4:] == [("s1", "snapshot"), ("u-during", "update"), ("s2", "snapshot"), ("u2", "update")]
    assert any(set(fb.kinds) == {"snapshot", "update"} for fb in batches), "no mixed batch was made"


def test_a_follower_of_a_location_with_no_log_says_so(tmp_path: Any) -> None:
    """A mistyped path is not a healthy, caught-up replica."""
    follower = persistlog.follow(str(tmp_path / "typo"), lambda r: None)
    follower.start()
    with pytest.raises(persistlog.LogNotFoundError, match="wait_for_log=True"):
        follower.wait_caught_up(10)
    with pytest.raises(persistlog.LogNotFoundError):
        follower.stop()


def test_wait_for_log_waits_for_a_writer_to_make_one(tmp_path: Any) -> None:
    url = str(tmp_path / "later")
    seen: list[Any] = []
    follower = persistlog.follow(url, seen.append, wait_for_log=True, poll_interval=0.01)
    follower.start()
    assert follower.wait_caught_up(10) and seen == []
    log = persistlog.open(url, lambda emit: None)
    log.update({"k": 1})
    log.close()
    wait_until(lambda: seen == [{"k": 1}])
    follower.stop()
