"""Injected storage faults (not crashes): ENOSPC, EIO, short writes, failing fsync, failing
rename, failing delete, slow I/O and failing or flaky PUTs.

Each test drives a real Log through ``tests/crashsim.py`` (or ``tests/faults.py`` for the
fsspec layer), then checks what the app was told, what the Log does next, and what a
restore sees, after a process crash and after a power loss (docs/DESIGN.md invariant 1).
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from crashsim import CrashSim
from threads import run_threads, wait_until
from kv_app import App, apply, restore_state
from crash_matrix import Model, check_prefix

import persistlog
from persistlog import LogFailedError
from persistlog._write.log import parts_of

FSYNC = dict(durability="fsync", segment_bytes=4096, flush_interval=3600.0, rotate_bytes=None, retain=1)
PAD = "p" * 120


class Driver:
    """An app writing puts one by one through a Log, keeping the model as it goes."""

    def __init__(self, lg: persistlog.Log, app: App, model: Model) -> None:
        self.lg, self.app, self.model = lg, app, model
        self.n = 0

    def put(self, sync: bool = False) -> None:
        self.n += 1
        key, value = f"k{self.n % 7}", f"{self.n}:{PAD}"
        self.model.ops.append(("put", key, value))
        self.lg.update({"op": "put", "key": key, "value": value}, sync=sync)
        self.app.data[key] = value
        if sync or self.lg.settings.durability == "fsync":
            self.model.acked = len(self.model.ops)

    def put_until_failure(self, limit: int = 400) -> LogFailedError:
        for _ in range(limit):
            try:
                self.put()
            except LogFailedError as e:
                return e
        raise AssertionError(f"no failure after {limit} updates")


def open_driver(sim: CrashSim, path: Path, **options: Any) -> Driver:
    url, opts = sim.local(path)
    app = App()
    lg = app.open(url, storage_options=opts, **{**FSYNC, **options})
    return Driver(lg, app, Model(acked=0))


def assert_refuses_everything(lg: persistlog.Log) -> None:
    """A failed Log acknowledges nothing more, whatever the call."""
    with pytest.raises(LogFailedError):
        lg.update({"op": "put", "key": "late", "value": 1})
    with pytest.raises(LogFailedError):
        lg.update_many([{"op": "put", "key": "late", "value": 2}])
    with pytest.raises(LogFailedError):
        lg.sync()
    with pytest.raises(LogFailedError):
        lg.rotate()
    assert lg.stats()["failed"] is True


def check_restore(path: Path, model: Model) -> persistlog.RestoreResult:
    state, result = restore_state(str(path))
    problem = check_prefix(model, state)
    assert problem is None, problem
    return result


def check_reopen(path: Path, model: Model) -> None:
    """A new writer continues from what survived and its update is read back."""
    state, _ = restore_state(str(path))
    app = App(state)
    lg = app.open(str(path), durability="fsync", segment_bytes=4096, retain=1)
    lg.update({"op": "put", "key": "next-writer", "value": 1})
    lg.close()
    again, _ = restore_state(str(path))
    assert again == {**state, "next-writer": 1}


# -- fsync ------------------------------------------------------------------------------------


@pytest.mark.parametrize("nth", [2, 9, 30])
@pytest.mark.parametrize("power", ["drop", "zeros", "partial"])
def test_failed_fsync_fails_the_log_and_is_never_retried(tmp_path: Path, nth: int, power: str) -> None:
    """fsync fails once (and, as on Linux, drops the dirty pages): the update is not
    acknowledged, the Log fails, and nothing after it is ever acknowledged; a power loss
    then leaves a prefix holding every acknowledged update."""
    sim = CrashSim(seed=nth)
    # Count only the syncs of the main workload (opening syncs too).
    d = open_driver(sim, tmp_path / "log")
    sim.fsync_fails(nth=nth)
    before = sum(1 for _, p, _ in sim.points if p == "before:append.sync segment")
    err = d.put_until_failure()
    assert isinstance(err.__cause__, OSError) and err.__cause__.errno == errno.EIO
    acked_at_failure = d.model.acked
    syncs_at_failure = sum(1 for _, p, _ in sim.points if p == "before:append.sync segment")
    assert syncs_at_failure - before == nth
    assert_refuses_everything(d.lg)
    assert d.model.acked == acked_at_failure
    d.lg.close()
    # Never retried: no sync reached the file after the failed one.
    assert sum(1 for _, p, _ in sim.points if p == "before:append.sync segment") == syncs_at_failure
    sim.power_loss(power)
    check_restore(tmp_path / "log", d.model)
    check_reopen(tmp_path / "log", d.model)


def test_failed_fsync_during_rotation_fails_rotate(tmp_path: Path) -> None:
    sim = CrashSim()
    d = open_driver(sim, tmp_path / "log")
    for _ in range(5):
        d.put()
    sim.fsync_fails(nth=1)
    with pytest.raises(LogFailedError):
        d.lg.rotate()
    assert_refuses_everything(d.lg)
    d.lg.close()
    sim.power_loss("zeros")
    check_restore(tmp_path / "log", d.model)
    check_reopen(tmp_path / "log", d.model)


@pytest.mark.parametrize("power", ["drop", "zeros", "partial"])
def test_a_power_cut_after_a_clean_close_may_take_the_hints_and_nothing_else(tmp_path: Path, power: str) -> None:
    """CURRENT naming log 1 and CLOSED are written without syncs (docs/DESIGN.md,
    "What opening costs"): a power cut right after a fresh log's open, synced updates and close takes
    both, and restore and the next writer still find every acknowledged update, with no
    damage reported."""
    sim = CrashSim()
    d = open_driver(sim, tmp_path / "log")
    for _ in range(5):
        d.put(sync=True)
    d.lg.close()
    assert (tmp_path / "log" / "CURRENT").exists() and (tmp_path / "log" / "CLOSED").exists()
    sim.power_loss(power)
    assert not (tmp_path / "log" / "CURRENT").exists() and not (tmp_path / "log" / "CLOSED").exists()
    result = check_restore(tmp_path / "log", d.model)
    assert restore_state(str(tmp_path / "log"))[0] == d.app.data  # every update was synced
    assert result.torn_tails == [] and result.skipped == []
    check_reopen(tmp_path / "log", d.model)


# -- writes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
def test_failed_write_fails_the_log(tmp_path: Path, err: int) -> None:
    sim = CrashSim()
    d = open_driver(sim, tmp_path / "log")
    sim.fail_at("before:append.write segment", err, nth=7)
    e = d.put_until_failure()
    assert isinstance(e.__cause__, OSError) and e.__cause__.errno == err
    assert_refuses_everything(d.lg)
    d.lg.close()
    check_restore(tmp_path / "log", d.model)
    sim.power_loss("drop")
    check_restore(tmp_path / "log", d.model)
    check_reopen(tmp_path / "log", d.model)


@pytest.mark.parametrize("keep", [0, 1, 39, 40, 41, 100])
def test_short_write_leaves_a_torn_tail_only(tmp_path: Path, keep: int) -> None:
    """A write that stops short (disk full) leaves part of a batch on disk: the Log fails,
    a restore drops exactly that torn tail, and the next writer continues the chain."""
    sim = CrashSim()
    d = open_driver(sim, tmp_path / "log")
    sim.short_write(keep, nth=5)
    e = d.put_until_failure()
    assert isinstance(e.__cause__, OSError) and e.__cause__.errno == errno.ENOSPC
    assert_refuses_everything(d.lg)
    d.lg.close()
    result = check_restore(tmp_path / "log", d.model)
    if keep:
        assert result.torn_tails, "the partial batch must be reported as a torn tail"
        assert result.torn_tails[-1].length == keep
    check_reopen(tmp_path / "log", d.model)


@pytest.mark.parametrize("nth", [2, 3])
def test_no_space_for_a_new_segment(tmp_path: Path, nth: int) -> None:
    """ENOSPC creating the next segment (a size roll or a rotation) fails the Log cleanly."""
    sim = CrashSim()
    d = open_driver(sim, tmp_path / "log")
    sim.fail_at("before:create segment", errno.ENOSPC, nth=nth - 1)
    with pytest.raises(LogFailedError):
        for i in range(400):
            d.put()
            if i == 30:
                d.lg.rotate()
    assert_refuses_everything(d.lg)
    d.lg.close()
    sim.power_loss("drop")
    check_restore(tmp_path / "log", d.model)
    check_reopen(tmp_path / "log", d.model)


# -- pointer and retention --------------------------------------------------------------------


@pytest.mark.parametrize("point", ["before:replace CURRENT", "after:replace CURRENT"])
def test_failing_pointer_move_is_not_fatal(tmp_path: Path, point: str) -> None:
    """CURRENT is a hint: a failed rename (or its directory fsync) leaves it stale or
    dangling, the rotation still completes, and readers fall back to the logs."""
    sim = CrashSim()
    d = open_driver(sim, tmp_path / "log")
    sim.fail_at(point, errno.EIO, nth=1, times=2)
    for _ in range(3):
        for _ in range(5):
            d.put()
        assert d.lg.rotate() == d.lg.seq
    for _ in range(3):
        d.put()
    d.lg.close()
    state, result = restore_state(str(tmp_path / "log"))
    assert state == d.app.data and result.complete
    check_reopen(tmp_path / "log", d.model)


def test_stats_say_retaining_not_rotating_while_old_logs_go(tmp_path: Path) -> None:
    sim = CrashSim(record=False)
    url, opts = sim.local(tmp_path / "log")
    lg = persistlog.open(url, lambda emit: emit({"op": "put", "key": "k", "value": 1}), storage_options=opts,
                         retain=1, rotate_bytes=None, flush_interval=3600.0)
    deleting = threading.Event()
    release = threading.Event()

    def slow_delete(label: str, point: str) -> None:
        deleting.set()
        release.wait(10)

    wait_until(lambda: not lg.stats()["retaining"], describe="the opening rotation's retention to end")
    sim.on("before:delete segment", slow_delete)
    assert lg.stats()["rotating"] is False
    lg.rotate(wait=False)  # a second complete log: then retain=1 deletes the first
    assert deleting.wait(10)
    stats = lg.stats()
    release.set()
    assert stats["retaining"] is True and stats["rotating"] is False
    wait_until(lambda: not lg.stats()["retaining"], describe="retention to end")
    lg.close()


def test_failing_retention_is_retried_later(tmp_path: Path) -> None:
    sim = CrashSim()
    d = open_driver(sim, tmp_path / "log")
    sim.fail_at("before:delete segment", errno.EIO, nth=1, times=3)
    for _ in range(4):
        for _ in range(5):
            d.put()
        d.lg.rotate()
    from crash_matrix import wait_idle

    wait_idle(d.lg)
    d.lg.close()
    seqs = {n[:20] for n in os.listdir(tmp_path / "log") if n.endswith(".plog")}
    # retain=1: the newest complete log and nothing older, once retention got through.
    assert len(seqs) == 1, sorted(seqs)
    state, result = restore_state(str(tmp_path / "log"))
    assert state == d.app.data and result.complete


# -- slow I/O and group commit ----------------------------------------------------------------


def test_slow_fsync_group_commits_and_loses_nothing(tmp_path: Path) -> None:
    sim = CrashSim(record=False)
    sim.delay_at("before:append.sync segment", 0.005)
    url, opts = sim.local(tmp_path / "log")
    app = App()
    lg = app.open(url, storage_options=opts, **FSYNC)
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for i in range(25):
                key = f"t{t}:{i % 3}"
                with app._lock(key):
                    lg.update({"op": "put", "key": key, "value": i})
                    app.data[key] = i
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    stats = lg.stats()
    lg.close()
    assert stats["updates"] == 150
    assert stats["syncs"] < 150, "concurrent updaters must share fsyncs"
    # Crash right now and cut the power: everything acknowledged is there.
    sim.power_loss("drop")
    state, _ = restore_state(str(tmp_path / "log"))
    assert state == app.data


def test_slow_syncs_gather_the_whole_group(tmp_path: Path) -> None:
    """With syncs as slow as a PUT, the threads one sync released are back before the next
    starts: each sync carries nearly all of them, not half the group in turns."""
    sim = CrashSim(record=False)
    sim.delay_at("before:append.sync segment", 0.005)
    url, opts = sim.local(tmp_path / "log")
    lg = persistlog.open(url, lambda emit: None, storage_options=opts, **FSYNC)
    before = lg.stats()

    def writer(t: int) -> None:
        for i in range(40):
            lg.update({"op": "put", "key": f"t{t}", "value": i})

    assert run_threads(writer, 8) == []
    after = lg.stats()
    lg.close()
    per_sync = (after["updates"] - before["updates"]) / (after["syncs"] - before["syncs"])
    assert per_sync >= 6, f"{per_sync:.2f} records per sync with 8 threads"


def test_failed_group_sync_fails_every_thread_it_covered(tmp_path: Path) -> None:
    """Threads parked on one shared fsync that fails: none of them is told its update is
    durable, the Log fails, and after a power loss exactly the acknowledged updates are
    there."""
    sim = CrashSim(record=False)
    sim.delay_at("before:append.sync segment", 0.02)
    url, opts = sim.local(tmp_path / "log")
    lg = persistlog.open(url, lambda emit: None, storage_options=opts, **FSYNC)
    acked: dict[str, int] = {}

    def writer(t: int) -> None:
        for i in range(1000):
            lg.update({"op": "put", "key": f"t{t}", "value": i, "pad": PAD})
            acked[f"t{t}"] = i

    def fail_soon() -> None:
        wait_until(lambda: lg.stats()["syncs"] >= 5, describe="a few shared syncs")
        sim.fsync_fails(nth=1)

    arm = threading.Thread(target=fail_soon)
    arm.start()
    failures = run_threads(writer, 8)
    arm.join()
    assert all(isinstance(e, LogFailedError) for e in failures), failures
    assert len(failures) == 8, failures
    assert lg.stats()["syncs"] < sum(acked.values()) + len(acked), "syncs were not shared"
    lg.close()
    sim.power_loss("drop")
    state, _ = restore_state(str(tmp_path / "log"))
    # The failed sync lost what it was to make durable: each thread's last acknowledged
    # update is exactly what survives.
    assert state == acked


def test_interrupted_waiter_does_not_strand_the_others(tmp_path: Path) -> None:
    """Ctrl-C in a thread parked for a shared fsync: that thread gets KeyboardInterrupt,
    and every other thread parked with it is still released (none waits forever)."""
    sim = CrashSim(record=False)
    url, opts = sim.local(tmp_path / "log")
    lg = persistlog.open(url, lambda emit: None, storage_options=opts, **FSYNC)
    in_sync = threading.Event()
    release = threading.Event()

    def slow_sync(label: str, point: str) -> None:
        in_sync.set()
        release.wait(10)

    sim.on("before:append.sync segment", slow_sync)
    leader = threading.Thread(target=lg.update, args=({"op": "put", "key": "lead", "value": 0},))
    leader.start()
    assert in_sync.wait(10)
    # The sync is stuck: every update(sync) from here parks. The main thread parks first,
    # so the chain of wake-ups goes through it.
    done: list[int] = []

    def follower(t: int) -> None:
        done.append(lg.update({"op": "put", "key": f"f{t}", "value": t}))

    followers = [threading.Thread(target=follower, args=(t,)) for t in range(4)]

    def interrupt() -> None:
        for t in followers:
            t.start()
        writer = parts_of(lg).writer
        wait_until(lambda: writer._group is not None and len(writer._group._waiters) == 5,
                   describe="five parked threads")
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        time.sleep(0.05)
        release.set()

    # Python's own handler, as in a terminal (a shell starts background jobs with SIGINT ignored).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    helper = threading.Thread(target=interrupt)
    try:
        helper.start()
        with pytest.raises(KeyboardInterrupt):
            lg.update({"op": "put", "key": "main", "value": 1})
    finally:
        helper.join(10)
        signal.signal(signal.SIGINT, previous)
    leader.join(10)
    for t in followers:
        t.join(10)
    assert not any(t.is_alive() for t in [leader, *followers]), "a parked thread was stranded"
    assert len(done) == 4
    lg.close()
    state, _ = restore_state(str(tmp_path / "log"))
    assert {f"f{t}" for t in range(4)} | {"lead"} <= set(state)


# -- secondaries ------------------------------------------------------------------------------


def test_failing_secondary_detaches_and_reattaches(tmp_path: Path) -> None:
    """An fsync failure at a secondary never fails the app; the secondary is re-attached
    with the next rotation and then restores to the same state as the primary."""
    sim = CrashSim(record=False)
    url, opts = sim.local(tmp_path / "primary")
    sec = sim.local(tmp_path / "secondary", label="secondary")
    sim.fail_at("before:append.sync segment", errno.EIO, nth=1, label="secondary")
    sim.fail_at("before:append.write segment", errno.EIO, nth=3, label="secondary")
    app = App()
    lg = app.open(url, storage_options=opts, secondaries=[sec], **FSYNC)
    d = Driver(lg, app, Model())
    for _ in range(20):
        d.put()
    lg.rotate()
    for _ in range(20):
        d.put()
    lg.rotate()
    d.put()
    stats = lg.stats()["destinations"]
    lg.close()
    assert stats[1]["detaches"] >= 1
    assert restore_state(str(tmp_path / "primary"))[0] == app.data
    assert restore_state(str(tmp_path / "secondary"))[0] == app.data


# -- object stores ----------------------------------------------------------------------------


@pytest.mark.usefixtures("clean_memory_fs")
def test_failed_put_fails_the_log(tmp_path: Path) -> None:
    sim = CrashSim(record=False)
    target = f"memory://puts-{uuid.uuid4().hex[:8]}/log"
    url, opts = sim.remote(target)
    sim.fail_at("before:put segment", errno.EIO, nth=6)
    app = App()
    lg = app.open(url, storage_options=opts, **FSYNC)
    d = Driver(lg, app, Model())
    d.put_until_failure()
    assert_refuses_everything(lg)
    lg.close()
    state, _ = restore_state(target)
    assert check_prefix(d.model, state) is None


@pytest.mark.usefixtures("clean_memory_fs")
def test_flaky_puts_are_retried_without_loss() -> None:
    """Dropped connections before and after a PUT landed (tests/faults.py) are retried;
    the app sees nothing and loses nothing."""
    from faults import FaultPlan

    plan = (
        FaultPlan()
        .transient("pipe_file", nth=3)
        .transient("pipe_file", nth=6, after=True)
        .transient("cat_file", nth=2)
        .delay("pipe_file", 0.01, nth=8)
    )
    url = f"faulty://flaky-{uuid.uuid4().hex[:8]}/log"
    app = App()
    lg = app.open(url, storage_options={"target_protocol": "memory", "faults": plan}, **FSYNC)
    state: dict[Any, Any] = {}
    for i in range(12):
        lg.update({"op": "put", "key": f"k{i % 5}", "value": i})
        app.data[f"k{i % 5}"] = i
    lg.close()
    assert plan.fired, "the faults must have been injected"
    persistlog.restore(url, lambda r: apply(state, r), storage_options={"target_protocol": "memory"})
    assert state == app.data


def test_lagging_secondary_after_crashes_restores(tmp_path: Path) -> None:
    """A secondary lags (it completes log 1, then stalls creating log 2) while the primary
    rotates on to log 3; the process dies. The next writer starts log 4, which completes at
    the secondary too, but dies before the secondary's CURRENT moves. The secondary holds
    complete logs 1 and 4 and nothing between: a restore from it must give log 4's state
    (or at least log 1's), not refuse."""
    sim = CrashSim(record=False)
    url, opts = sim.local(tmp_path / "primary")
    sec = sim.local(tmp_path / "secondary", label="secondary")
    gate = threading.Event()
    sim.on("before:create segment", lambda label, point: gate.wait(30), nth=2, label="secondary")
    app = App()
    lg = app.open(url, storage_options=opts, secondaries=[sec], **FSYNC)
    for r in range(2):
        for i in range(5):
            key = f"k{i}"
            lg.update({"op": "put", "key": key, "value": r * 10 + i})
            app.data[key] = r * 10 + i
        lg.rotate()
    sim.crash()
    gate.set()
    sim.abandon(lg)

    sim2 = CrashSim()
    url2, opts2 = sim2.local(tmp_path / "primary")
    sec2 = sim2.local(tmp_path / "secondary", label="secondary")
    sim2.crash_at("before:replace CURRENT", label="secondary")
    state, _ = restore_state(str(tmp_path / "primary"))
    app2 = App(state)
    lg2 = app2.open(url2, storage_options=opts2, secondaries=[sec2], **FSYNC)
    # The secondary's writer thread reaches its pointer move on its own time: wait for it.
    deadline = time.monotonic() + 30
    while sim2.crashed_at is None and time.monotonic() < deadline:
        time.sleep(0.01)
    sim2.abandon(lg2)
    assert sim2.crashed_at is not None, [p for p in sim2.points if p[0] == "secondary"]
    seqs = sorted({int(n[:20]) for n in os.listdir(tmp_path / "secondary") if n.endswith(".plog")})
    assert seqs == [1, 4], seqs
    restored, result = restore_state(str(tmp_path / "secondary"))
    assert restored == app2.data
