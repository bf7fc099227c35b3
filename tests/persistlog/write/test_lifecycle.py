"""The Log's lifecycle on ordinary paths: opening over records, calls that would wait for
themselves, logs left open at exit or dropped unclosed."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import warnings
import weakref
from pathlib import Path
from collections.abc import Callable
from typing import Any

import pytest

import persistlog
from destinations import open_destination
from persistlog._read.reader import last_segment_state, list_logs
from persistlog._runtime import runtime
from log_files import is_sealed_log
from threads import wait_until


# -- calls from inside enumerate_all --------------------------------------------------------


@pytest.mark.parametrize("call", ["rotate", "close", "add_destination"])
def test_waiting_calls_from_inside_enumerate_all_raise_at_once(log_dir: str, tmp_path: Any, call: str) -> None:
    """rotate(), close() and add_destination() wait for the rotation; from the rotation
    thread itself they would wait forever, so they raise RuntimeError at once."""
    seen: list[BaseException | str] = []
    lg: persistlog.Log | None = None
    calls: dict[str, Callable[[persistlog.Log], Any]] = {
        "rotate": lambda lg: lg.rotate(),
        "close": lambda lg: lg.close(),
        "add_destination": lambda lg: lg.add_destination(str(tmp_path / "second")),
    }

    def enumerate_all(emit: Callable[[Any], None]) -> None:
        emit({"op": "put", "key": "a", "value": 1})
        if lg is not None and not seen:
            try:
                calls[call](lg)
            except BaseException as e:  # noqa: BLE001 - recorded for the test to check
                seen.append(e)
            else:
                seen.append("returned")

    lg = persistlog.open(log_dir, enumerate_all)
    rotating = threading.Thread(target=lg.rotate, daemon=True)
    rotating.start()
    rotating.join(20)
    assert not rotating.is_alive(), f"{call}() from inside enumerate_all hung"
    assert len(seen) == 1 and isinstance(seen[0], RuntimeError), seen
    assert "enumerate_all" in str(seen[0])
    # The log is unharmed: it rotates again, and goes on.
    assert lg.rotate() == lg.seq
    lg.update({"op": "put", "key": "b", "value": 2})
    lg.close()
    records: list[Any] = []
    persistlog.restore(log_dir, records.append)
    assert records == [{"op": "put", "key": "a", "value": 1}, {"op": "put", "key": "b", "value": 2}]


# -- opening over records nobody restored ---------------------------------------------------


def _put(i: int) -> dict[str, Any]:
    return {"op": "put", "key": f"k{i}", "value": i}


def _state_of(records: list[Any]) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for r in records:
        if r["op"] == "put":
            state[r["key"]] = r["value"]
        else:
            state.pop(r["key"], None)
    return state


def _write(url: str, n: int, **options: Any) -> None:
    lg = persistlog.open(url, lambda emit: None, **options)
    for i in range(n):
        lg.update(_put(i))
    lg.close()


def test_open_over_records_nobody_restored_is_refused(log_dir: str) -> None:
    _write(log_dir, 5)
    for _ in range(3):  # refusing writes nothing: the real state is never retained away
        with pytest.raises(persistlog.ExistingLogError, match="replay=") as info:
            persistlog.open(log_dir, lambda emit: None, retain=1)
        assert isinstance(info.value, persistlog.PersistLogError)
        assert "restore" in str(info.value) and "discard_existing=True" in str(info.value)
    records: list[Any] = []
    persistlog.restore(log_dir, records.append)
    assert _state_of(records) == {f"k{i}": i for i in range(5)}
    # The lock was let go each time: another writer may open.
    persistlog.open(log_dir, lambda emit: None, discard_existing=True).close()


def test_open_with_replay_restores_first(log_dir: str) -> None:
    _write(log_dir, 5)
    state: dict[str, Any] = {}

    def enumerate_all(emit: Callable[[Any], None]) -> None:
        for k, v in list(state.items()):
            emit({"op": "put", "key": k, "value": v})

    lg = persistlog.open(log_dir, enumerate_all, replay=lambda r: state.update(_state_of([r])))
    assert state == {f"k{i}": i for i in range(5)}
    assert isinstance(lg.restored, persistlog.RestoreResult)
    assert lg.restored.found and lg.restored.records == 5
    lg.update(_put(9))
    state["k9"] = 9
    lg.close()
    batches: list[list[Any]] = []
    lg = persistlog.open(log_dir, enumerate_all, replay_batch=batches.append, retain=1)
    assert _state_of([r for b in batches for r in b]) == state
    lg.close()
    with pytest.raises(TypeError, match="not both"):
        persistlog.open(log_dir, enumerate_all, replay=print, replay_batch=print)
    # Without replay= there is nothing restored to report.
    lg = persistlog.open(str(Path(log_dir) / "fresh"), enumerate_all)
    assert lg.restored is None
    lg.close()


def test_restore_then_open_in_the_same_process_stays_valid(log_dir: str) -> None:
    _write(log_dir, 5)
    records: list[Any] = []
    persistlog.restore(log_dir + "/", records.append)  # the same directory, spelled otherwise
    lg = persistlog.open(log_dir, lambda emit: [emit(r) for r in records])
    lg.update(_put(7))
    lg.close()
    # Written since the restore: that restore no longer covers what is there.
    with pytest.raises(persistlog.ExistingLogError):
        persistlog.open(log_dir, lambda emit: None)
    records = []
    persistlog.restore(log_dir, records.append)
    persistlog.open(log_dir, lambda emit: [emit(r) for r in records]).close()
    # Another writer writing between the restore and the open is caught too.
    persistlog.restore(log_dir, lambda r: None)
    _write(log_dir, 1, discard_existing=True)
    with pytest.raises(persistlog.ExistingLogError):
        persistlog.open(log_dir, lambda emit: None)


def test_discard_existing_starts_over_on_purpose(log_dir: str) -> None:
    _write(log_dir, 5)
    lg = persistlog.open(log_dir, lambda emit: emit(_put(100)), discard_existing=True, retain=1)
    lg.close()
    records: list[Any] = []
    persistlog.restore(log_dir, records.append)
    assert records == [_put(100)]


def test_resource_store_open_restores_first(log_dir: str) -> None:
    s = persistlog.ResourceStore.open(log_dir)
    s["a"] = 1
    s.close()
    s = persistlog.ResourceStore.open(log_dir)
    assert s.to_dict() == {"a": 1} and s.restored is not None and s.restored.records == 1
    s.close()


# -- logs left open -------------------------------------------------------------------------

_LEFT_OPEN = """
import json, sys, threading, time, persistlog
url, so, kind, ending = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
if kind == "store":
    s = persistlog.ResourceStore.open(url, storage_options=so)
    put = s.__setitem__
else:
    lg = persistlog.open(url, lambda emit: None, storage_options=so)   # buffered, the default
    put = lambda key, value: lg.update({"op": "put", "key": key, "value": value})
for i in range(10):
    put(f"user:{i}", {"n": i})
if ending == "thread":  # the main thread ends; a thread of the app logs on
    def later():
        time.sleep(0.5)
        for i in range(10, 20):
            put(f"user:{i}", {"n": i})
    threading.Thread(target=later).start()
elif ending == "exit3":
    raise SystemExit(3)
elif ending == "interrupt":
    raise KeyboardInterrupt  # Ctrl-C, unwinding to the interpreter's exit
"""

#: How the script ends: its exit status, how many records it logged.
_ENDINGS = {"end": (0, 10), "exit3": (3, 10), "thread": (0, 20), "interrupt": (-2, 10)}


def _persistlog_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """persistlog's threads started since ``before`` was taken, but those every Log shares:
    the process's runtime, and the workers of fsspec's event loop
    (``destinations/_loop_executor.py``); whatever earlier tests left running is not the
    test's own Log's."""
    shared = set(runtime().threads)
    return [t for t in threading.enumerate()
            if t.name.startswith("persistlog-") and not t.name.startswith("persistlog-fsspec")
            and t not in shared | before]


@pytest.mark.slow
@pytest.mark.parametrize("where,kind,ending", [
    ("local", "log", "end"), ("local", "log", "exit3"), ("local", "store", "end"), ("local", "store", "exit3"),
    ("local", "log", "thread"), ("local", "log", "interrupt"),
    pytest.param("s3", "log", "end", marks=pytest.mark.s3), pytest.param("s3", "store", "exit3", marks=pytest.mark.s3),
    pytest.param("s3", "log", "thread", marks=pytest.mark.s3), pytest.param("s3", "log", "interrupt", marks=pytest.mark.s3),
])
def test_a_script_that_never_closes_keeps_what_it_logged(
    log_dir: str, request: pytest.FixtureRequest, where: str, kind: str, ending: str
) -> None:
    """A script ending (raising SystemExit, or KeyboardInterrupt) without close(): the
    interpreter's exit writes the buffered records and seals the log, once the app's
    threads have ended (what a thread logs after the main thread's end is kept too), and
    lets the lock go. On S3 too, where the seal is a PUT made after ``concurrent.futures``
    stopped its executors (``destinations/_loop_executor.py``)."""
    so = None
    if where == "s3":
        log_dir = f"s3://{request.getfixturevalue('s3_bucket')}/left-open"
        so = request.getfixturevalue("s3_storage_options")
    status, count = _ENDINGS[ending]
    proc = subprocess.run([sys.executable, "-c", _LEFT_OPEN, log_dir, json.dumps(so), kind, ending],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == status, proc.stderr
    assert "failed" not in proc.stderr, proc.stderr
    records: list[Any] = []
    result = persistlog.restore(log_dir, records.append, storage_options=so)
    assert _state_of(records) == {f"user:{i}": {"n": i} for i in range(count)}
    dest = open_destination(log_dir, **(so or {}))
    seq = result.logs[-1]
    assert result.torn_tail is None and last_segment_state(dest, seq, list_logs(dest)[seq]).sealed
    # The lock was let go: the app opens again at once.
    if kind == "store":
        s = persistlog.ResourceStore.open(log_dir, storage_options=so)
        assert len(s) == count
        s.close()
    else:
        persistlog.open(log_dir, lambda emit: None, replay=lambda r: None, storage_options=so).close()


@pytest.mark.slow
@pytest.mark.parametrize("with_secondary", [False, True], ids=["alone", "with_secondary"])
def test_a_log_collected_unclosed_warns_and_keeps_its_records(log_dir: str, tmp_path: Any, with_secondary: bool) -> None:
    # A secondary's thread must not keep the Log alive either.
    secondaries = [str(tmp_path / "secondary")] if with_secondary else None
    before = set(threading.enumerate())
    lg = persistlog.open(log_dir, lambda emit: None, flush_interval=3600, secondaries=secondaries)
    for i in range(10):
        lg.update(_put(i))  # buffered: only in the Log's memory
    ref = weakref.ref(lg)
    with pytest.warns(ResourceWarning, match="never closed"):
        del lg
        # The rotation job may still hold it for a moment after open() returned.
        wait_until(lambda: gc.collect() >= 0 and ref() is None, 20, "the Log to be collected")
    wait_until(lambda: not _persistlog_threads(before), 20, "the Log to be closed and its threads to end")
    records: list[Any] = []
    result = persistlog.restore(log_dir, records.append)
    assert records == [_put(i) for i in range(10)]
    assert is_sealed_log(log_dir, result.logs[-1])
    if secondaries:
        copied: list[Any] = []
        persistlog.restore(secondaries[0], copied.append)
        assert copied == records
    persistlog.open(log_dir, lambda emit: None, replay=lambda r: None).close()  # the lock is free


@pytest.mark.slow
def test_nothing_keeps_an_unreferenced_log_alive(log_dir: str) -> None:
    """Neither the exit registry nor the Log's jobs (flush, rotation) and threads (group
    commit) hold it: a dropped Log is collected, and its threads end."""
    before = set(threading.enumerate())
    store = persistlog.ResourceStore.open(log_dir, durability="fsync", rotate_interval=3600)
    workers = [threading.Thread(target=lambda i=i: store.__setitem__(f"k{i}", i)) for i in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    ref = weakref.ref(store.log)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del store, workers
        wait_until(lambda: gc.collect() >= 0 and ref() is None, 20, "the Log to be collected")
    wait_until(lambda: not _persistlog_threads(before), 20, "the Log to be closed and its threads to end")
    s = persistlog.ResourceStore.open(log_dir)
    assert s.to_dict() == {f"k{i}": i for i in range(8)}
    s.close()
