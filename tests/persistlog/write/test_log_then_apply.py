"""The *log, then apply* pattern README.md teaches, run as written under rotation.

README's tour logs a change, then applies it to a plain dict, from one thread and with no
lock, and its ``enumerate_all`` copies the dict. A rotation's enumeration must therefore
never read the dict while a logged change is not applied yet: by default a fired trigger's
rotation starts at the app's next call and updates wait for ``enumerate_all``
(docs/DESIGN.md, "Rotation"). Each test restores and compares with the state the app
holds, which has every acknowledged change (docs/DESIGN.md invariant 1).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import persistlog
from persistlog._write import rotation
from readme_code import readme_functions
from threads import wait_until

MODES = ["buffered", "flush", "fsync"]


def readme_app() -> dict[str, Any]:
    """A namespace running README's ``replay``, ``enumerate_all`` and ``change``."""
    ns: dict[str, Any] = {"state": {}, "log": None}
    exec(readme_functions("replay", "enumerate_all", "change"), ns)
    return ns


def restored(url: str) -> dict[str, Any]:
    app = readme_app()
    result = persistlog.restore(url, app["replay"])
    assert result.complete
    return app["state"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_readme_change_under_a_small_record_trigger_restores_every_change(log_dir: str, mode: str) -> None:
    app = readme_app()
    app["log"] = log = persistlog.open(log_dir, app["enumerate_all"], durability=mode, rotate_records=200)
    i = 0
    while log.stats()["rotations"] < 6 and i < 200_000:  # rotations finish in the background
        app["change"]({"op": "put", "key": f"k{i % 700}", "value": i})
        if i % 7 == 0:
            app["change"]({"op": "del", "key": f"k{(i * 3) % 700}"})
        i += 1
    assert log.stats()["rotations"] >= 6
    log.close()
    assert restored(log_dir) == app["state"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_readme_update_many_then_apply_under_a_small_byte_trigger_restores_every_batch(log_dir: str, mode: str) -> None:
    app = readme_app()
    app["log"] = log = persistlog.open(
        log_dir, app["enumerate_all"], durability=mode, rotate_bytes=16 * 1024, batch_bytes=4096
    )
    j = 0
    while log.stats()["rotations"] < 6 and j < 20_000:
        batch = [{"op": "put", "key": f"b{j % 300}-{i}", "value": j} for i in range(50)]
        log.update_many(batch)  # README: "one batch: all or none", then applied
        for record in batch:
            app["replay"](record)
        j += 1
    assert log.stats()["rotations"] >= 6
    log.close()
    assert restored(log_dir) == app["state"]


def test_an_enumeration_reads_the_state_with_the_crossing_change_applied(log_dir: str) -> None:
    """The change that crosses the trigger is in the old log only: the new log's snapshot
    must hold it, so the enumeration starts at the app's next call, after it was applied."""
    app = readme_app()
    seen: list[dict[str, Any]] = []
    enumerate_all = app["enumerate_all"]

    def enumerate_and_record(emit: Any) -> None:
        seen.append(dict(app["state"]))
        enumerate_all(emit)

    app["log"] = log = persistlog.open(log_dir, enumerate_and_record, durability="flush", rotate_records=10)
    for i in range(10):
        app["change"]({"op": "put", "key": f"k{i}", "value": i})
    # The tenth change fired the trigger; nothing runs until the app's next call.
    assert log.stats()["rotation_due"] and len(seen) == 1
    app["change"]({"op": "put", "key": "k10", "value": 10})
    assert len(seen) == 2 and seen[1] == {f"k{i}": i for i in range(10)}
    assert not log.stats()["rotation_due"]
    log.close()
    assert restored(log_dir) == app["state"]


def test_updates_from_other_threads_wait_for_the_enumeration(log_dir: str) -> None:
    """While enumerate_all runs with updates held, a second thread's update() waits."""
    release = threading.Event()
    started = threading.Event()
    order: list[str] = []

    def slow_enumeration(emit: Any) -> None:
        if started.is_set() or not release.is_set():
            started.set()
            release.wait(10)
        order.append("enumerated")

    release.set()
    log = persistlog.open(log_dir, slow_enumeration, durability="flush")
    release.clear()
    order.clear()
    rotating = threading.Thread(target=log.rotate)
    rotating.start()
    assert started.wait(10)

    def writer() -> None:
        log.update({"from": "writer"})
        order.append("updated")

    w = threading.Thread(target=writer)
    w.start()
    w.join(0.3)
    assert w.is_alive() and order == []  # held
    release.set()
    rotating.join(10)
    w.join(10)
    assert order == ["enumerated", "updated"]
    log.close()


def test_an_idle_log_rotates_at_its_next_update_after_an_interval_trigger(log_dir: str) -> None:
    app = readme_app()
    app["log"] = log = persistlog.open(log_dir, app["enumerate_all"], rotate_interval=0.2)
    app["change"]({"op": "put", "key": "a", "value": 1})
    seq = log.seq
    wait_until(lambda: log.stats()["rotation_due"])
    assert log.seq == seq
    app["change"]({"op": "put", "key": "b", "value": 2})
    assert log.seq == seq + 1
    log.close()
    assert restored(log_dir) == {"a": 1, "b": 2}


def test_an_app_holding_its_lock_across_update_gets_enumeration_stalled_not_a_hang(
    log_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An app that takes, in enumerate_all, a lock its update() callers hold needs
    concurrent_enumeration=True; without it the held call gives up with a clear error,
    having logged nothing, and the app goes on."""
    monkeypatch.setattr(rotation, "ENUMERATION_STALL", 0.5)
    lock = threading.Lock()
    state: dict[str, int] = {}

    def enumerate_all(emit: Any) -> None:
        with lock:
            for k, v in list(state.items()):
                emit({"op": "put", "key": k, "value": v})

    log = persistlog.open(log_dir, enumerate_all, durability="flush", rotate_records=5)
    for i in range(5):
        with lock:
            log.update({"op": "put", "key": f"k{i}", "value": i})
            state[f"k{i}"] = i
    before = log.next_lsn
    with pytest.raises(persistlog.EnumerationStalled, match="concurrent_enumeration=True"):
        with lock:
            log.update({"op": "put", "key": "k5", "value": 5})
            state["k5"] = 5
    assert "k5" not in state and log.next_lsn >= before
    # With the app's lock free, the enumeration goes on and the rotation completes.
    wait_until(lambda: log.stats()["rotations"] == 2)
    with lock:
        log.update({"op": "put", "key": "k6", "value": 6})
        state["k6"] = 6
    log.close()
    assert restored(log_dir) == state


def test_the_same_app_with_concurrent_enumeration_keeps_updating_beside_it(log_dir: str) -> None:
    lock = threading.Lock()
    state: dict[str, int] = {}

    def enumerate_all(emit: Any) -> None:
        for k in list(state):
            with lock:
                emit({"op": "put", "key": k, "value": state[k]})

    log = persistlog.open(log_dir, enumerate_all, durability="flush", rotate_records=5, concurrent_enumeration=True)
    i = 0
    while log.stats()["rotations"] < 6 and i < 200_000:
        with lock:
            log.update({"op": "put", "key": f"k{i % 30}", "value": i})
            state[f"k{i % 30}"] = i
        i += 1
    assert log.stats()["rotations"] >= 6
    log.close()
    assert restored(log_dir) == state


def test_concurrent_enumeration_must_be_a_bool_and_resource_store_refuses_it(log_dir: str) -> None:
    with pytest.raises(TypeError, match="concurrent_enumeration"):
        persistlog.open(log_dir, lambda emit: None, concurrent_enumeration="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="concurrent_enumeration"):
        persistlog.ResourceStore.open(log_dir, concurrent_enumeration=False)


@pytest.mark.parametrize("mode", MODES)
def test_readme_asyncio_put_under_a_small_record_trigger_restores_every_change(log_dir: str, mode: str) -> None:
    """README's asyncio tour: tasks ``await alog.update()`` then set the dict, no lock."""
    ns: dict[str, Any] = {"state": {}}
    exec(readme_functions("enumerate_all", "put"), ns)

    async def main() -> int:
        ns["alog"] = alog = await persistlog.open_async(
            log_dir, ns["enumerate_all"], durability=mode, rotate_records=50
        )
        async with alog:
            round_ = 0
            # Bounded by time, not rounds: in buffered mode the loop outruns the rotations
            # (each waits for a quiet point, fsyncs and retention) on a busy machine.
            deadline = time.monotonic() + 60
            while alog.stats()["rotations"] < 4 and time.monotonic() < deadline:
                await asyncio.gather(*(ns["put"](f"k{i}", round_ * 1000 + i) for i in range(120)))
                round_ += 1
            return int(alog.stats()["rotations"])

    rotations = asyncio.run(main())
    assert rotations >= 4
    state: dict[str, Any] = {}
    persistlog.restore(log_dir, lambda r: state.update({r["key"]: r["value"]}))
    assert state == ns["state"]
