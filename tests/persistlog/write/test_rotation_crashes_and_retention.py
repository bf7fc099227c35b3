"""Rotation against a real Log on a real directory: retention across many restarts, and a
rotation interrupted at every stage (an enumeration raising, the process dying mid-snapshot,
a new log created but the old one not sealed, a complete log CURRENT does not name yet)
keeps the last complete log and loses no update."""

from __future__ import annotations

import os
import shutil
import threading
from typing import Any

import pytest
from batches import batch_offsets
from kv_app import App, restore_state
from log_files import crash, is_complete_log, is_sealed_log, log_seqs, segment_files, truncate

import persistlog
from persistlog._format import encoder
from persistlog._format import constants as F


# -- restarts and retention -------------------------------------------------------------


@pytest.mark.slow
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
        f.write(encoder.pointer(1))  # CURRENT still names the log retention just deleted
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
        f.write(encoder.pointer(1))
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


@pytest.mark.slow
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
