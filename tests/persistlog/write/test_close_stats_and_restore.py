"""Closing (waiting for a running enumeration, racing updates, failing rotations that
never started), ``stats()``, and the restore contract (a missing destination, no complete
log, whole batches to ``replay_batch``)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
from kv_app import App, restore_state
from log_files import is_complete_log, is_sealed_log, log_seqs, segment_files
from threads import wait_until

import persistlog


# -- close, stats, restore contract ------------------------------------------------------


def test_close_waits_for_a_running_enumeration_then_seals(log_dir: str) -> None:
    app = App({"a": 1, "b": 2})
    lg = app.open(log_dir, durability="fsync")
    inside, release = threading.Event(), threading.Event()
    original = app.enumerate_all

    def slow(emit: Any) -> None:
        inside.set()
        release.wait(10)
        original(emit)

    lg._rotator.enumerate_all = slow  # the app's callback for the next rotation
    lg.rotate(wait=False)
    assert inside.wait(10)
    app.put("c", 3)
    closer = threading.Thread(target=lg.close)
    closer.start()
    time.sleep(0.3)
    assert closer.is_alive()  # still waiting for the enumeration
    release.set()
    closer.join(10)
    assert not closer.is_alive() and lg.closed
    assert is_complete_log(log_dir, 2) and is_sealed_log(log_dir, 2)
    state, result = restore_state(log_dir)
    assert state == app.data and result.logs == [2]
    with pytest.raises(persistlog.LogClosedError):
        app.put("d", 4)
    with pytest.raises(RuntimeError):  # LogClosedError is a RuntimeError too
        lg.sync()
    lg.close()  # idempotent


@pytest.mark.parametrize("durability", ["buffered", "flush", "fsync"])
def test_close_racing_updates_loses_nothing_and_invents_nothing(tmp_path: Any, durability: str) -> None:
    """Every update() that returned while close() ran is in the sealed log; every one that
    raised LogClosedError is not."""
    for trial in range(6):
        url = str(tmp_path / f"log{trial}")
        lg = persistlog.open(url, lambda emit: None, durability=durability, flush_interval=3600.0)
        accepted: set[tuple[int, int]] = set()
        refused: set[tuple[int, int]] = set()
        barrier = threading.Barrier(5)

        def spam(t: int) -> None:
            barrier.wait()
            for i in range(1 << 30):
                try:
                    lg.update([t, i])
                except persistlog.LogClosedError:
                    refused.add((t, i))
                    return
                accepted.add((t, i))

        threads = [threading.Thread(target=spam, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        barrier.wait()
        time.sleep(0.002 * trial)
        lg.close()
        for t in threads:
            t.join(30)
        logged: set[tuple[int, int]] = set()
        persistlog.restore(url, lambda r: logged.add(tuple(r)))
        assert accepted <= logged, f"{len(accepted - logged)} accepted updates were dropped"
        assert not refused & logged, f"{len(refused & logged)} refused updates are in the log"
        assert len(refused) == 4


def test_close_fails_rotations_that_never_started_with_log_closed_error(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir)
    inside, release = threading.Event(), threading.Event()
    original = app.enumerate_all

    def slow(emit: Any) -> None:
        inside.set()
        release.wait(10)
        original(emit)

    lg._rotator.enumerate_all = slow
    lg.rotate(wait=False)  # runs, blocked in its enumeration
    assert inside.wait(10)
    outcome: list[BaseException | int | None] = []

    def waiter() -> None:
        try:
            outcome.append(lg.rotate(wait=True))  # queued behind it
        except BaseException as e:
            outcome.append(e)

    w = threading.Thread(target=waiter)
    w.start()
    wait_until(lambda: len(lg._rotator._queue) == 2, describe="the queued rotation")
    closer = threading.Thread(target=lg.close)
    closer.start()
    wait_until(lambda: lg._rotator._stop, describe="close to begin")
    release.set()
    closer.join(10)
    w.join(10)
    [e] = outcome
    assert isinstance(e, persistlog.LogClosedError), e
    assert is_complete_log(log_dir, 2) and log_seqs(log_dir) == [1, 2]
    assert restore_state(log_dir)[0] == app.data


def test_stats_content(log_dir: str) -> None:
    app = App({"a": 1, "b": 2})
    lg = app.open(log_dir, durability="fsync")
    s = lg.stats()
    assert s["snapshot_records"] == 2 and s["updates"] == 0
    assert s["rotations"] == 1 and s["complete_logs"] == [1] and s["log_seq"] == 1
    assert s["durability"] == "fsync" and not s["failed"] and not s["closed"]
    assert s["last_error"] is None
    wait_until(lambda: lg.stats()["rotating"] is False, describe="retention after the open")
    assert s["next_lsn"] == 3 and s["durable_lsn"] == 2
    assert s["last_rotation"]["seq"] == 1 and s["last_rotation"]["snapshot_records"] == 2
    assert s["destinations"][0]["url"] == log_dir and s["destinations"][0]["role"] == "primary"
    for i in range(5):
        app.put(i, i)
    s = lg.stats()
    assert s["updates"] == 5 and s["next_lsn"] == 8 and s["durable_lsn"] == 7
    assert s["syncs"] >= 5 and s["batches"] >= 5
    assert s["bytes"] > 0 and s["log_bytes"] == sum(os.path.getsize(p) for p in segment_files(log_dir))
    assert s["records_per_sync"] > 0
    lg.close()
    assert lg.stats()["closed"]


def test_restore_of_a_missing_destination(tmp_path: Any) -> None:
    missing = str(tmp_path / "nothing" / "here")
    seen: list[Any] = []
    result = persistlog.restore(missing, seen.append)
    assert not result.found and not result.complete and seen == [] and result.logs == []
    assert result.next_lsn == 1 and result.last_lsn == 0
    assert not os.path.exists(missing)  # restore never creates
    with pytest.raises(persistlog.LogNotFoundError) as info:
        persistlog.restore(missing, seen.append, missing_ok=False)
    assert isinstance(info.value, FileNotFoundError)
    # A mistyped path says what is there: the URL, and that nothing is.
    assert str(info.value) == f"no persistlog log at {missing}: the directory does not exist"
    os.makedirs(missing)
    assert not persistlog.restore(missing, seen.append).found  # empty counts as missing
    with pytest.raises(persistlog.LogNotFoundError, match=r": it is empty$"):
        persistlog.restore(missing, seen.append, missing_ok=False)
    with pytest.raises(persistlog.LogNotFoundError, match=r": the directory does not exist$"):
        list(persistlog.read(missing + "-typo"))
    with pytest.raises(TypeError):
        persistlog.restore(missing)  # neither replay nor replay_batch


def test_no_complete_log_replays_everything_and_says_so(log_dir: str) -> None:
    bad = App({"a": 1, "b": 2, "c": 3})
    bad.fail_enumerate = RuntimeError("first enumeration fails after one record")
    with pytest.raises(persistlog.EnumerateError):
        bad.open(log_dir)
    state, result = restore_state(log_dir)
    assert result.found and not result.complete
    assert len(state) == 1 and state.items() <= bad.data.items()  # what was emitted
    again = App({"a": 1, "b": 2, "c": 3})
    again.fail_enumerate = RuntimeError("again")
    with pytest.raises(persistlog.EnumerateError):
        again.open(log_dir)
    state, result = restore_state(log_dir)
    assert not result.complete and result.logs == [1, 2]
    good = App({"a": 1, "b": 2, "c": 3})
    good.open(log_dir).close()
    state, result = restore_state(log_dir)
    assert result.complete and state == good.data and result.logs == [3]


def test_replay_batch_gets_whole_batches(log_dir: str) -> None:
    app = App({})
    lg = app.open(log_dir, durability="buffered", flush_interval=3600.0)
    lg.update_many([{"op": "put", "key": i, "value": i} for i in range(5)])
    lg.sync()
    app.put("x", 1, sync=True)
    lg.close()
    batches: list[list[Any]] = []
    result = persistlog.restore(log_dir, replay_batch=batches.append)
    assert [len(b) for b in batches] == [5, 1] and result.records == 6
    with pytest.raises(TypeError):
        persistlog.restore(log_dir, replay=print, replay_batch=print)
