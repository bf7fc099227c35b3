"""The scenarios of the original design and the contract details of docs/DESIGN.md,
each against a real Log on a real directory."""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import cbor2
import pytest
from plhelpers import (
    app_batches,
    App,
    apply,
    batch_offsets,
    crash,
    fill_disk,
    is_complete_log,
    is_sealed_log,
    log_seqs,
    prefix_states,
    restore_state,
    segment_files,
    truncate,
    wait_until,
)
from threads import run_threads

import persistlog
from persistlog import _encoder
from persistlog import _format as F

# -- restarts and retention -------------------------------------------------------------


@pytest.mark.parametrize("retain", [1, 2, 3])
def test_reopen_many_times_keeps_retain_complete_logs(tmp_path: Any, retain: int) -> None:
    url = str(tmp_path / "log")
    state: dict[Any, Any] = {}
    completed = 0
    for cycle in range(30):
        restored, result = restore_state(url)
        assert restored == state, cycle
        assert result.found == (cycle > 0)
        app = App(restored)
        lg = app.open(url, retain=retain, durability="flush" if cycle % 2 else "buffered")
        completed += 1
        assert lg.seq == (log_seqs(url)[-1])
        for i in range(cycle % 4 + 1):
            app.put(f"k{(cycle + i) % 6}", [cycle, i])
        if cycle % 5 == 0:
            app.delete(f"k{cycle % 6}")
        if cycle % 7 == 3:
            lg.rotate()
            completed += 1
            app.put("after-rotate", cycle)
        if cycle % 9 == 8:
            app.fail_enumerate = RuntimeError("no enumeration this time")
            with pytest.raises(persistlog.EnumerateError):
                lg.rotate()
            app.put("after-failed-rotate", cycle)
        lg.close()
        state = dict(app.data)
        seqs = log_seqs(url)
        complete = [s for s in seqs if is_complete_log(url, s)]
        # Exactly `retain` complete logs, counting those of earlier processes; anything
        # older than the oldest of them is gone, anything newer (incomplete) stays.
        assert len(complete) == min(retain, completed), (cycle, seqs, complete)
        assert seqs[0] == complete[0], (cycle, seqs, complete)
        assert seqs == list(range(seqs[0], seqs[-1] + 1))
        assert all(is_sealed_log(url, s) for s in seqs)
    assert restore_state(url)[0] == state


# -- crashes during rotation ------------------------------------------------------------


def test_enumerate_raising_during_open_fails_the_open_and_keeps_the_last_state(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, durability="fsync")
    app.put("b", 2)
    lg.close()
    bad = App({"a": 1, "b": 2})
    bad.fail_enumerate = KeyError("broken")
    with pytest.raises(persistlog.EnumerateError) as info:
        bad.open(log_dir)
    assert isinstance(info.value.__cause__, KeyError)
    # Nothing was lost, nothing stays locked, and the incomplete log is sealed.
    state, result = restore_state(log_dir)
    assert state == {"a": 1, "b": 2} and result.complete and result.logs == [1, 2]
    assert is_sealed_log(log_dir, 2) and not is_complete_log(log_dir, 2)
    good = App(state)
    good.open(log_dir).close()
    assert restore_state(log_dir)[0] == state


def test_process_dying_mid_snapshot_keeps_the_last_complete_log(tmp_path: Any) -> None:
    """The directory as it is while an enumeration is half done is what a crash leaves."""
    url = str(tmp_path / "log")
    app = App({f"r{i}": i for i in range(20)})
    lg = app.open(url, durability="fsync", batch_bytes=1)
    app.put("r0", "changed")
    halfway, release = threading.Event(), threading.Event()
    emitted: list[int] = []

    def enumerate_all(emit: Any) -> None:
        for i, (k, v) in enumerate(sorted(app.data.items(), key=lambda kv: str(kv[0]))):
            emit({"op": "put", "key": k, "value": v})
            emitted.append(i)
            if i == 9:
                halfway.set()
                release.wait(10)

    lg._rotator.enumerate_all = enumerate_all  # the app's callback for the next rotation
    lg.rotate(wait=False)
    assert halfway.wait(10)
    app.put("r1", "during the snapshot")  # an update interleaved with the snapshot
    crashed = str(tmp_path / "crashed")
    shutil.copytree(url, crashed)  # the disk at this moment
    release.set()
    lg.close()
    os.remove(os.path.join(crashed, "LOCK"))
    state, result = restore_state(crashed)
    assert state == app.data
    assert result.complete and result.logs == [1, 2]
    assert not is_complete_log(crashed, 2) and is_sealed_log(crashed, 1)
    assert len(emitted) == 20


def test_interrupted_rotation_new_log_created_old_not_sealed(tmp_path: Any) -> None:
    """A crash between creating log N+1 and sealing log N (rotation step 1 to 2)."""
    url = str(tmp_path / "log")
    app = App({"a": 1})
    lg = app.open(url, durability="fsync", retain=5)
    app.put("b", 2)
    app.fail_enumerate = RuntimeError("stop before anything is emitted")
    with pytest.raises(persistlog.EnumerateError):
        lg.rotate()  # log 2 exists; log 1 sealed
    crash(lg)
    # Undo the seal of log 1: the state of the disk had the crash come before the seal.
    seg1 = [p for p in segment_files(url) if os.path.basename(p).startswith(F.segment_name(1, 0)[:20])][-1]
    seal_offset = [o for o, _, k in batch_offsets(seg1) if k == F.KIND_CONTROL][-1]
    truncate(seg1, seal_offset)
    assert not is_sealed_log(url, 1)
    state, result = restore_state(url)
    assert state == {"a": 1, "b": 2} and result.logs == [1, 2] and not result.torn_tails
    # A writer continues from there.
    app2 = App(state)
    lg2 = app2.open(url)
    assert lg2.seq == 3
    app2.put("c", 3)
    lg2.close()
    assert restore_state(url)[0] == {"a": 1, "b": 2, "c": 3}


def test_interrupted_rotation_complete_but_current_not_moved(tmp_path: Any) -> None:
    """A crash after log N+1's marker is durable but before CURRENT moved (step 4 to 5)."""
    url = str(tmp_path / "log")
    app = App({"a": 1})
    lg = app.open(url, durability="fsync", retain=1)
    app.put("b", 2)
    lg.rotate()
    app.put("c", 3)
    lg.close()
    assert log_seqs(url) == [2]
    with open(os.path.join(url, "CURRENT"), "wb") as f:
        f.write(_encoder.pointer(1))  # CURRENT still names the log retention just deleted
    state, result = restore_state(url)
    assert state == app.data and result.logs == [2]
    # And with the old log still there, CURRENT naming it: both are replayed, same state.
    url2 = str(tmp_path / "log2")
    app = App({"a": 1})
    lg = app.open(url2, durability="fsync", retain=3)
    app.put("b", 2)
    lg.rotate()
    app.delete("a")
    lg.close()
    with open(os.path.join(url2, "CURRENT"), "wb") as f:
        f.write(_encoder.pointer(1))
    state, result = restore_state(url2)
    assert state == app.data == {"b": 2} and result.logs == [1, 2]


def test_old_logs_stay_until_current_names_a_newer_complete_log(log_dir: str) -> None:
    """docs/DESIGN.md invariant 4: retention deletes old logs only after the newer complete log's
    pointer is durable. Here CURRENT cannot be replaced (a directory took its name)."""
    app = App({"a": 1})
    lg = app.open(log_dir, retain=1, durability="fsync")
    current = os.path.join(log_dir, "CURRENT")
    os.remove(current)
    os.makedirs(os.path.join(current, "blocker"))  # os.replace onto it fails
    app.put("b", 2)
    assert lg.rotate() == 2  # complete, but its pointer could not be written
    app.put("c", 3)
    lg.close()
    assert log_seqs(log_dir) == [1, 2]  # log 1 kept: CURRENT never named log 2
    state, result = restore_state(log_dir)  # an unreadable CURRENT is no obstacle
    assert state == app.data and result.logs == [2]
    shutil.rmtree(current)
    lg = App(state).open(log_dir, retain=1)  # the pointer moves again: retention resumes
    lg.close()
    assert log_seqs(log_dir) == [3]


def test_rotation_under_concurrent_updates(tmp_path: Any) -> None:
    """Threads update their own resources while rotations run back to back; the restored
    state is exactly the final state (after a close, and after a crash)."""
    for round_, ending in enumerate(["close", "crash", "close"]):
        url = str(tmp_path / f"log{round_}")
        app = App({f"t9-{i}": i for i in range(30)})
        lg = app.open(url, durability="fsync" if ending == "crash" else "buffered",
                      rotate_records=50, batch_bytes=256, segment_bytes=8192)
        errors: list[BaseException] = []
        counts = [0] * 4

        def worker(t: int) -> None:
            try:
                for n in range(300):
                    key = f"t{t}-{n % 13}"
                    if n % 7 == 3:
                        app.delete(key)
                    else:
                        app.put(key, [t, n])
                    counts[t] = n + 1
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        rotations = 0
        while any(t.is_alive() for t in threads) or rotations < 15:
            lg.rotate()  # back to back, for as long as the updaters run
            rotations += 1
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert lg.stats()["rotations"] >= 16
        if ending == "close":
            lg.close()
        else:
            crash(lg)
        state, result = restore_state(url)
        assert state == app.data, (ending, counts)
        assert result.complete


def test_enumerate_raising_in_rotate(log_dir: str) -> None:
    errors: list[BaseException] = []
    app = App({"a": 1})
    lg = app.open(log_dir, durability="fsync", on_error=errors.append, retain=2)
    app.put("b", 2)
    boom = ZeroDivisionError("enumeration broke")
    app.fail_enumerate = boom
    with pytest.raises(persistlog.EnumerateError) as info:
        lg.rotate(wait=True)
    assert info.value.__cause__ is boom
    assert errors == [boom]
    stats = lg.stats()
    assert stats["rotation_failures"] == 1 and stats["rotations"] == 1
    assert "enumeration broke" in stats["last_error"]
    assert stats["log_seq"] == 2 and stats["complete_logs"] == [1]
    assert not stats["failed"]
    # Writing continues, in the incomplete log.
    app.put("c", 3)
    assert restore_state(log_dir)[0] == app.data
    # The next rotation succeeds, with a new log.
    app.fail_enumerate = None
    assert lg.rotate() == 3
    app.put("d", 4)
    stats = lg.stats()
    assert stats["rotations"] == 2 and stats["complete_logs"][-1] == 3
    lg.close()
    state, result = restore_state(log_dir)
    assert state == app.data and result.logs == [3]


# -- one writer -------------------------------------------------------------------------


def test_second_writer_gets_writer_conflict(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir)
    with pytest.raises(persistlog.WriterConflict) as info:
        persistlog.open(log_dir, lambda emit: None)
    assert str(os.getpid()) in str(info.value)  # names the holder
    code = "import sys, persistlog\npersistlog.open(sys.argv[1], lambda emit: None)\n"
    proc = subprocess.run([sys.executable, "-c", code, log_dir], capture_output=True, text=True)
    assert proc.returncode != 0 and "WriterConflict" in proc.stderr
    app.put("b", 2)  # the holder is unaffected
    lg.close()
    assert restore_state(log_dir)[0] == {"a": 1, "b": 2}
    assert log_seqs(log_dir) == [1]  # the conflicting writers created nothing


def test_stale_lock_of_a_killed_process_is_recoverable(log_dir: str) -> None:
    code = (
        "import sys, time, persistlog\n"
        "lg = persistlog.open(sys.argv[1], lambda emit: emit({'op': 'put', 'key': 'a', 'value': 1}),"
        " durability='fsync')\n"
        "lg.update({'op': 'put', 'key': 'b', 'value': 2})\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, log_dir], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == b"ready\n"
        with pytest.raises(persistlog.WriterConflict) as info:
            persistlog.open(log_dir, lambda emit: None)
        assert str(proc.pid) in str(info.value)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    with open(os.path.join(log_dir, "LOCK"), "rb") as f:
        assert str(proc.pid).encode() in f.read()  # the dead owner's record is still there
    state, _ = restore_state(log_dir)
    assert state == {"a": 1, "b": 2}
    app = App(state)
    app.open(log_dir).close()
    assert restore_state(log_dir)[0] == state


# -- failures ---------------------------------------------------------------------------


def test_primary_write_failure_fails_the_log_for_good(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, durability="flush")
    app.put("b", 2)
    ops: list[tuple[Any, ...]] = []
    fill_disk(lg)
    with pytest.raises(persistlog.LogFailedError) as info:
        app.put("c", 3)
    ops.append(("put", "c", 3))
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == 28
    for call in (
        lambda: lg.update({"op": "put", "key": "d", "value": 4}),
        lambda: lg.update({"op": "put", "key": "d", "value": 4}, sync=True),
        lambda: lg.update_many([{"op": "put", "key": "d", "value": 4}]),
        lg.sync,
        lg.rotate,
        lambda: lg.rotate(wait=False),
    ):
        with pytest.raises(persistlog.LogFailedError):
            call()
    stats = lg.stats()
    assert stats["failed"] and "No space left" in stats["last_error"]
    assert stats["destinations"][0]["healthy"] is False
    lg.close()  # lets go of the destination without pretending to seal
    with pytest.raises(persistlog.LogFailedError):
        lg.update({"op": "put", "key": "e", "value": 5})
    state, result = restore_state(log_dir)
    base = {"a": 1, "b": 2}
    assert state in prefix_states(base, ops)  # "c" may or may not have reached the disk
    assert state.get("b") == 2
    App(state).open(log_dir).close()  # the directory is not wedged


def test_repeated_failed_opens_never_wedge_a_directory(log_dir: str) -> None:
    app = App({"a": 1})
    app.open(log_dir).close()
    for i in range(8):
        bad = App({"a": 1})
        bad.fail_enumerate = RuntimeError(f"attempt {i}")
        with pytest.raises(persistlog.EnumerateError):
            bad.open(log_dir, retain=1)
    with pytest.raises(ValueError):
        persistlog.open(log_dir, lambda emit: None, durability="sometimes")
    with pytest.raises(TypeError):
        persistlog.open(log_dir, "not callable")  # type: ignore[arg-type]
    holder = App({"a": 1})
    lg = holder.open(log_dir)
    with pytest.raises(persistlog.WriterConflict):
        App({}).open(log_dir)
    lg.close()
    state, result = restore_state(log_dir)
    assert state == {"a": 1} and result.complete
    good = App(state)
    lg = good.open(log_dir, retain=1)
    good.put("b", 2)
    lg.close()
    assert restore_state(log_dir)[0] == {"a": 1, "b": 2}
    assert len([s for s in log_seqs(log_dir) if is_complete_log(log_dir, s)]) == 1


# -- destinations and paths -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_sibling_directories_never_mix(tmp_path: Any, kind: str, clean_memory_fs: None) -> None:
    if kind == "local":
        first, second = str(tmp_path / "x" / "log"), str(tmp_path / "x" / "log2")
    else:
        first, second = "memory://x/log", "memory://x/log2"
    apps = []
    for url, tag in ((first, "one"), (second, "two")):
        app = App({tag: 0})
        lg = app.open(url, retain=1)
        for i in range(3):
            app.put(f"{tag}{i}", i)
            lg.rotate()  # retention runs in each: it must not touch the sibling
        lg.close()
        apps.append(app)
    for url, app in zip((first, second), apps, strict=True):
        assert restore_state(url)[0] == app.data
    assert restore_state(first)[0] == apps[0].data  # after the sibling's retention too


@pytest.mark.parametrize("name", ["with space/log dir", "dots.in.name/log.v1.d", ".hidden/.log", "ünïcode/log"])
def test_paths_with_dots_and_spaces(tmp_path: Any, name: str) -> None:
    url = str(tmp_path / name)
    app = App({"a": 1})
    lg = app.open(url, durability="fsync")
    app.put("b.c d", "e f.g")
    lg.rotate()
    lg.close()
    assert restore_state(url)[0] == app.data
    assert restore_state("file://" + url)[0] == app.data


# -- the update API ---------------------------------------------------------------------


class Unregistered:
    pass


def _cyclic() -> list[Any]:
    x: list[Any] = [1]
    x.append(x)
    return x


@pytest.mark.parametrize(
    "bad",
    [object(), Unregistered(), lambda: 1, datetime.datetime(2024, 1, 1), {"nested": [1, {"deep": object()}]},
     {"key": {1, 2}, "fn": print}, _cyclic()],
    ids=["object", "class", "lambda", "naive datetime", "deeply nested", "builtin function", "cyclic"],
)
def test_unencodable_records_raise_type_error_before_anything_is_written(log_dir: str, bad: Any) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, durability="flush")
    app.put("b", 2)
    before = lg.next_lsn
    size = sum(os.path.getsize(p) for p in segment_files(log_dir))
    with pytest.raises(TypeError):
        lg.update({"op": "put", "key": "x", "value": bad})
    with pytest.raises(TypeError):
        lg.update({"op": "put", "key": "y", "value": bad}, sync=True)
    with pytest.raises(TypeError):  # the whole call is refused, good records too
        lg.update_many([{"op": "put", "key": "g1", "value": 1}, {"op": "put", "key": "x", "value": bad},
                        {"op": "put", "key": "g2", "value": 2}])
    assert lg.next_lsn == before
    assert sum(os.path.getsize(p) for p in segment_files(log_dir)) == size
    app.put("c", 3)  # the Log is still fine
    lg.sync()
    assert restore_state(log_dir)[0] == {"a": 1, "b": 2, "c": 3}
    assert lg.next_lsn == before + 1
    lg.close()


def test_update_many_returns_the_last_lsn_and_logs_in_order(log_dir: str) -> None:
    app = App({})
    lg = app.open(log_dir, durability="fsync")
    first = lg.next_lsn
    last = lg.update_many({"op": "put", "key": i % 3, "value": i} for i in range(10))
    assert last == first + 9
    assert lg.update_many([]) is None  # nothing logged, no LSN
    lg.close()
    assert restore_state(log_dir)[0] == {0: 9, 1: 7, 2: 8}


# -- durability modes -------------------------------------------------------------------


def _on_disk(url: str) -> dict[Any, Any]:
    """What another reader (other file descriptors) finds right now."""
    return restore_state(url)[0]


def test_durability_buffered_holds_records_until_flush(log_dir: str) -> None:
    app = App({})
    lg = app.open(log_dir, durability="buffered", flush_interval=3600.0)
    app.put("a", 1)
    assert _on_disk(log_dir) == {}  # still in the process: buffered mode promised nothing
    lg.sync()
    assert _on_disk(log_dir) == {"a": 1}
    assert lg.durable_lsn == lg.next_lsn - 1
    app.put("b", 2, sync=True)  # per-call sync in buffered mode
    assert _on_disk(log_dir) == {"a": 1, "b": 2}
    assert lg.durable_lsn == lg.next_lsn - 1
    lg.close()


def test_durability_buffered_reaches_the_os_on_the_timer(log_dir: str) -> None:
    app = App({})
    lg = app.open(log_dir, durability="buffered", flush_interval=0.05)
    app.put("a", 1)
    wait_until(lambda: _on_disk(log_dir) == {"a": 1}, describe="the flush timer")
    lg.close()


def test_durability_flush_reaches_the_os_before_update_returns(log_dir: str) -> None:
    app = App({})
    lg = app.open(log_dir, durability="flush", flush_interval=3600.0)
    syncs = lg.stats()["syncs"]
    for i in range(20):
        app.put(i, i)
        assert _on_disk(log_dir) == app.data  # read through other descriptors
    assert lg.stats()["syncs"] == syncs  # written, not synced
    assert lg.durable_lsn < lg.next_lsn - 1
    lg.sync()
    assert lg.durable_lsn == lg.next_lsn - 1
    lg.close()


def test_durability_fsync_is_durable_before_update_returns(log_dir: str) -> None:
    app = App({})
    lg = app.open(log_dir, durability="fsync", flush_interval=3600.0)
    for i in range(10):
        syncs = lg.stats()["syncs"]
        lsn = app.put(i, i)
        assert lg.durable_lsn >= lsn
        assert lg.stats()["syncs"] == syncs + 1
        assert _on_disk(log_dir) == app.data
    lg.close()


def test_fsync_group_commit_shares_syncs(log_dir: str) -> None:
    lg = persistlog.open(log_dir, lambda emit: None, durability="fsync")
    before = lg.stats()
    barrier = threading.Barrier(8)

    def work(t: int) -> None:
        barrier.wait()
        for i in range(100):
            lsn = lg.update({"op": "put", "key": f"{t}-{i}", "value": i})
            assert lg.durable_lsn >= lsn

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = lg.stats()
    assert after["updates"] - before["updates"] == 800
    assert after["syncs"] - before["syncs"] <= 800
    lg.close()
    assert len(restore_state(log_dir)[0]) == 800


# -- triggers ---------------------------------------------------------------------------


def test_trigger_rotate_bytes(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, rotate_bytes=4096, durability="flush")
    for i in range(60):
        app.put(i % 5, "x" * 100)
    wait_until(lambda: lg.stats()["rotations"] >= 2, describe="a size-triggered rotation")
    lg.close()
    assert restore_state(log_dir)[0] == app.data


def test_trigger_rotate_records(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, rotate_records=10, rotate_bytes=None, durability="flush")
    for i in range(9):
        app.put(i, i)
    time.sleep(0.2)
    assert lg.stats()["rotations"] == 1  # the open's only
    app.put("tenth", 10)
    wait_until(lambda: lg.stats()["rotations"] == 2, describe="a count-triggered rotation")
    lg.close()
    assert restore_state(log_dir)[0] == app.data


def test_trigger_rotate_interval(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, rotate_interval=0.2, rotate_bytes=None, flush_interval=0.02)
    wait_until(lambda: lg.stats()["rotations"] >= 3, describe="interval rotations")
    lg.close()
    assert restore_state(log_dir)[0] == app.data


def test_triggers_off_means_no_rotation(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, rotate_bytes=None, durability="flush")
    for i in range(300):
        app.put(i % 9, "y" * 200)
    time.sleep(0.2)
    assert lg.stats()["rotations"] == 1 and lg.seq == 1
    lg.close()


def test_trigger_explicit_rotate(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir)
    assert lg.seq == 1
    assert lg.rotate() == 2 and lg.seq == 2
    assert lg.rotate(wait=False) is None
    wait_until(lambda: lg.stats()["rotations"] == 3, describe="the requested rotation")
    lg.close()
    assert log_seqs(log_dir) == [2, 3]


def test_trigger_rotate_on_signal(log_dir: str) -> None:
    previous = signal.getsignal(signal.SIGUSR1)
    app = App({"a": 1})
    lg = app.open(log_dir, rotate_on_signal=signal.SIGUSR1, flush_interval=0.01)
    assert signal.getsignal(signal.SIGUSR1) is not previous
    os.kill(os.getpid(), signal.SIGUSR1)
    wait_until(lambda: lg.stats()["rotations"] == 2, describe="a signal-triggered rotation")
    lg.close()
    assert signal.getsignal(signal.SIGUSR1) is previous
    assert restore_state(log_dir)[0] == app.data


def test_rotate_on_signal_needs_the_main_thread(log_dir: str) -> None:
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            persistlog.open(log_dir, lambda emit: None, rotate_on_signal=signal.SIGUSR2)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=opener)
    t.start()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], ValueError)
    persistlog.open(log_dir, lambda emit: None).close()  # nothing was left locked


def test_open_starts_a_new_complete_log(log_dir: str) -> None:
    for seq in (1, 2, 3):
        app = App(restore_state(log_dir)[0] or {"a": 1})
        lg = app.open(log_dir, retain=5)
        assert lg.seq == seq and is_complete_log(log_dir, seq)
        assert app.enumerations == 1
        lg.close()


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
    os.makedirs(missing)
    assert not persistlog.restore(missing, seen.append).found  # empty counts as missing
    with pytest.raises(persistlog.LogNotFoundError):
        persistlog.restore(missing, seen.append, missing_ok=False)
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


# -- ResourceStore ----------------------------------------------------------------------


def test_resource_store_three_lines_and_restart(log_dir: str) -> None:
    store = persistlog.ResourceStore.open(log_dir)
    store["user:1"] = {"name": "Ada"}
    store.close()

    with persistlog.ResourceStore.open(log_dir, durability="fsync") as store:
        assert store.to_dict() == {"user:1": {"name": "Ada"}}
        assert store.restored is not None and store.restored.found
        store["user:2"] = {"name": "Grace"}
        store["n"] = 1
        del store["user:1"]
        with pytest.raises(KeyError):
            del store["missing"]
        assert sorted(store) == ["n", "user:2"] and len(store) == 2 and "n" in store
        assert store.get("nope", 5) == 5
        store.log.rotate()
        store["n"] = 2
    state, _ = restore_state(log_dir)
    assert state == {"user:2": {"name": "Grace"}, "n": 2}
    with persistlog.ResourceStore.open(log_dir) as store:
        assert store.to_dict() == state
        assert store.log.seq == 4


def test_resource_store_concurrent_writers_and_rotations(log_dir: str) -> None:
    store = persistlog.ResourceStore.open(log_dir, rotate_records=40, durability="flush")

    def work(t: int) -> None:
        for i in range(150):
            store[f"{t}:{i % 11}"] = i
            if i % 5 == 0:
                store.pop(f"{t}:{(i + 3) % 11}", None)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for _ in range(5):
        store.log.rotate()
    for t in threads:
        t.join()
    expected = store.to_dict()
    store.close()
    assert restore_state(log_dir)[0] == expected
    with persistlog.ResourceStore.open(log_dir) as again:
        assert again.to_dict() == expected


def test_resource_store_compound_operations_are_atomic(log_dir: str) -> None:
    """pop, setdefault, popitem and update hold the store's lock throughout: with fsyncs
    releasing the GIL mid-operation, two threads never both pop one key, setdefault
    never sets a key twice, and the log replays to exactly the store."""
    store = persistlog.ResourceStore.open(log_dir, durability="fsync")
    store.update({k: k for k in range(60)})
    popped: list[list[int]] = [[] for _ in range(6)]
    defaults: list[dict[int, int]] = [{} for _ in range(6)]

    def work(t: int) -> None:
        for k in range(60):
            if store.pop(k, None) is not None:
                popped[t].append(k)
            defaults[t][k + 100] = store.setdefault(k + 100, t)

    assert run_threads(work, 6) == []
    assert sorted(k for ks in popped for k in ks) == list(range(60))  # each key popped once
    for k in range(100, 160):
        assert len({d[k] for d in defaults}) == 1  # every thread saw the one value set
    key, value = store.popitem()
    assert (key, value) == (159, defaults[0][159])  # the last key set
    expected = store.to_dict()
    assert sorted(expected) == list(range(100, 159))
    assert store.values() == [expected[k] for k in store.keys()]
    updates = store.log.stats()["updates"]
    store.close()
    assert updates == 60 + 60 + 60 + 1  # puts, pops, one setdefault per key, popitem
    assert restore_state(log_dir)[0] == expected
    store = persistlog.ResourceStore.open(log_dir)
    store.clear()
    assert len(store) == 0
    store.close()
    assert restore_state(log_dir)[0] == {}


# -- Codec ------------------------------------------------------------------------------


@dataclasses.dataclass
class Order:
    id: int
    total: str
    lines: list[Any] = dataclasses.field(default_factory=list)


def test_codec_registered_dataclass_round_trip(log_dir: str) -> None:
    codec = persistlog.Codec()
    codec.register("shop.Order", Order)
    lg = persistlog.open(log_dir, lambda emit: emit(Order(1, "9.99")), codec=codec, durability="fsync")
    lg.update(Order(2, "1.00", [Order(3, "0.5")]))
    lg.close()
    seen: list[Any] = []
    persistlog.restore(log_dir, seen.append, codec=codec)
    assert seen == [Order(1, "9.99"), Order(2, "1.00", [Order(3, "0.5")])]
    # Without the registration the records stay neutral tags: no class is ever built.
    raw: list[Any] = []
    persistlog.restore(log_dir, raw.append)
    assert all(isinstance(r, cbor2.CBORTag) and r.tag == 27 for r in raw)
    assert raw[0].value[0] == "shop.Order"
    # A reader whose codec maps the name to something else of its own is fine too; another
    # registered name does not make it construct this one.
    other = persistlog.Codec()
    other.register("shop.Other", Order)
    raw = []
    persistlog.restore(log_dir, raw.append, codec=other)
    assert all(isinstance(r, cbor2.CBORTag) for r in raw)


def test_codec_unregistered_class_is_a_type_error_at_update(log_dir: str) -> None:
    codec = persistlog.Codec()
    codec.register("shop.Order", Order)
    lg = persistlog.open(log_dir, lambda emit: None, codec=codec)
    before = lg.next_lsn
    with pytest.raises(TypeError, match="Unregistered|register"):
        lg.update({"x": Unregistered()})
    assert lg.next_lsn == before
    lg.close()
    with pytest.raises(TypeError):
        codec.register("plain", Unregistered)  # not a dataclass, no encode/decode
    with pytest.raises(ValueError):
        codec.register("shop.Order", Order)  # the name is taken


def test_codec_unknown_tags_stay_inert(log_dir: str) -> None:
    lg = persistlog.open(log_dir, lambda emit: None, durability="fsync")
    lg.update(cbor2.CBORTag(35, "^(a+)+$"))  # a regular expression: never compiled
    lg.update(cbor2.CBORTag(36, "Content-Type: text/plain\n\nhello"))  # MIME: never parsed
    lg.update(cbor2.CBORTag(50000, {"x": 1}))
    lg.update(cbor2.CBORTag(27, ["os.system", ["echo pwned"]]))  # never constructed
    lg.close()
    seen: list[Any] = []
    persistlog.restore(log_dir, seen.append)
    assert [type(r) for r in seen] == [cbor2.CBORTag] * 4
    assert [r.tag for r in seen] == [35, 36, 50000, 27]
    assert seen[0].value == "^(a+)+$"
    assert list(seen[3].value[:1]) == ["os.system"] and list(seen[3].value[1]) == ["echo pwned"]


def test_codec_custom_encode_decode(log_dir: str) -> None:
    class Money:
        def __init__(self, cents: int) -> None:
            self.cents = cents

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Money) and other.cents == self.cents

    codec = persistlog.Codec()
    codec.register("Money", Money, encode=lambda m: m.cents, decode=Money)
    lg = persistlog.open(log_dir, lambda emit: None, codec=codec)
    lg.update({"price": Money(250)})
    lg.close()
    seen: list[Any] = []
    persistlog.restore(log_dir, seen.append, codec=codec)
    assert seen == [{"price": Money(250)}]


def test_replay_of_records_in_lsn_order_with_apply(log_dir: str) -> None:
    """The helper the other tests rely on agrees with ResourceStore's convention."""
    state: dict[Any, Any] = {}
    for r in ({"op": "put", "key": 1, "value": "a"}, {"op": "del", "key": 1}, {"op": "put", "key": 2, "value": "b"}):
        apply(state, r)
    assert state == {2: "b"}


# -- limits at the edges: oversize calls, deep records, bad metadata ---------------------


def test_update_many_larger_than_a_batch_is_refused_whole(log_dir: str) -> None:
    lg = persistlog.open(log_dir, lambda emit: None, durability="fsync", rotate_bytes=None)
    lg.update({"op": "put", "key": "before", "value": 1})
    big = "x" * (22 * 1024 * 1024)
    with pytest.raises(ValueError, match="exceeds the .* bytes one batch holds"):
        lg.update_many([{"op": "put", "key": k, "value": big} for k in "abc"])
    del big
    lg.update({"op": "put", "key": "after", "value": 2})
    lg.close()
    state, result = restore_state(log_dir)
    assert state == {"before": 1, "after": 2}
    assert result.records == 2  # nothing of the refused call was written


def test_big_update_many_is_one_batch_even_beside_buffered_records(log_dir: str) -> None:
    """A call that does not fit beside what is buffered goes into a batch of its own
    (what was buffered is written first), so a crash cannot keep half of it."""
    lg = persistlog.open(
        log_dir, lambda emit: None, rotate_bytes=None, flush_interval=3600.0, batch_bytes=32 * 1024 * 1024
    )
    buffered = lg.update_many([{"op": "put", "key": i, "value": "s" * (1 << 20)} for i in range(25)])
    chunk = "y" * (15 * 1024 * 1024)
    last = lg.update_many([{"op": "put", "key": k, "value": chunk} for k in "abc"])
    lg.close()
    del chunk
    assert app_batches(log_dir) == [(1, buffered), (last - 2, 3)]


def test_deeply_nested_records_are_read_back(log_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Readers accept any depth cbor2's encoder can write (FORMAT.md, "Records"), as writers
    # did before they refused records deeper than MAX_RECORD_DEPTH: such a writer is this
    # one without its depth check.
    def unchecked(self: persistlog.Codec, fp: Any) -> Callable[[Any], int]:
        encode = self.encoder(fp).encode
        return lambda record: (encode(record), fp.tell())[1]

    monkeypatch.setattr(persistlog.Codec, "record_encoder", unchecked)
    lg = persistlog.open(log_dir, lambda emit: None, durability="fsync")
    depths = (199, 200, 201, 1000, 3000)
    for depth in depths:
        value: Any = 1
        for _ in range(depth):
            value = [value]
        lg.update({"op": "put", "key": depth, "value": value})
    lg.close()
    state, _ = restore_state(log_dir)
    assert sorted(state) == list(depths)


def test_open_with_unencodable_metadata_is_a_type_error(log_dir: str) -> None:
    with pytest.raises(TypeError):
        persistlog.open(log_dir, lambda emit: None, metadata=object())
