"""A restart after ``close(rotate=True)``: the log that close wrote holds a fresh snapshot
and nothing after it (its seal says so with ``complete_lsn``), so an ``open()`` that
replays it starts the next log without enumerating the same state again. Every other
open enumerates, as before: after ``restore()`` then ``open()`` (the app may have changed
its state in between), with secondaries, with other metadata, with updates after the
snapshot, with ``discard_existing``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

import persistlog
from destinations import open_destination
from persistlog._format import constants
from persistlog._read.reader import list_logs, newest_seal


class Counted:
    """A dict of resources whose ``enumerate_all`` counts its calls."""

    def __init__(self) -> None:
        self.state: dict[int, Any] = {}
        self.enumerations = 0

    def enumerate_all(self, emit: Callable[[Any], None]) -> None:
        self.enumerations += 1
        for k, v in list(self.state.items()):
            emit({"k": k, "v": v})

    def apply(self, record: Any) -> None:
        self.state[record["k"]] = record["v"]

    def put(self, lg: persistlog.Log, k: int, v: Any) -> None:
        lg.update({"k": k, "v": v})
        self.state[k] = v


def restored_state(url: str) -> dict[int, Any]:
    got: dict[int, Any] = {}
    persistlog.restore(url, lambda r: got.__setitem__(r["k"], r["v"]))
    return got


def seal_of_newest(url: str) -> dict[str, Any] | None:
    dest = open_destination(url)
    try:
        return newest_seal(dest, list_logs(dest))
    finally:
        dest.close()


def written_with_rotating_close(url: str, n: int = 30, **options: Any) -> dict[int, Any]:
    """A log of ``n`` updates over 10 keys, closed with ``close(rotate=True)``."""
    app = Counted()
    lg = persistlog.open(url, app.enumerate_all, concurrent_enumeration=True, **options)
    for i in range(n):
        app.put(lg, i % 10, i)
    lg.close(rotate=True)
    return app.state


def test_open_after_close_rotate_starts_without_enumerating(log_dir: str) -> None:
    expected = written_with_rotating_close(log_dir)
    app = Counted()
    lg = persistlog.open(log_dir, app.enumerate_all, concurrent_enumeration=True, replay=app.apply)
    assert app.enumerations == 0
    assert app.state == expected
    assert lg.restored is not None and lg.restored.logs == [2] and lg.restored.records == 10
    app.put(lg, 99, "after")
    lg.close()
    # The snapshot of log 2 stays the restore point, and log 3 goes on from it.
    assert restored_state(log_dir) == app.state
    result = persistlog.restore(log_dir, lambda r: None)
    assert (result.logs, result.records, result.complete) == ([2, 3], 11, True)
    # Log 3 holds updates and no snapshot: the next open enumerates.
    again = Counted()
    persistlog.open(log_dir, again.enumerate_all, replay=again.apply).close()
    assert again.enumerations == 1 and again.state == app.state


@pytest.mark.slow
def test_a_store_reopened_after_close_rotate_replays_the_snapshot_once(tmp_path: Any) -> None:
    url = str(tmp_path / "store")
    store = persistlog.ResourceStore.open(url)
    for i in range(500):
        store[i % 20] = {"n": i}
    store.close(rotate=True)
    for _ in range(3):
        again = persistlog.ResourceStore.open(url)
        assert again.restored is not None and again.restored.records == 20
        assert again.to_dict() == {k: {"n": 480 + k} for k in range(20)}
        again.close(rotate=True)


def test_the_seal_says_where_the_snapshot_ended(log_dir: str) -> None:
    app = Counted()
    lg = persistlog.open(log_dir, app.enumerate_all, concurrent_enumeration=True)
    for i in range(5):
        app.put(lg, i, i)
    lg.rotate()
    app.put(lg, 7, 7)
    lg.close()
    seal = seal_of_newest(log_dir)
    # Log 2's snapshot took LSNs 6-10; the update after it took 11.
    assert seal is not None and seal["next_lsn"] == 12 and seal[constants.SEAL_COMPLETE_LSN] == 11
    # Reopened, log 3 enumerates the 6 keys (LSNs 12-17); the rotating close's log 4 holds
    # them again (18-23) and nothing after.
    app2 = Counted()
    persistlog.open(log_dir, app2.enumerate_all, replay=app2.apply).close(rotate=True)
    seal = seal_of_newest(log_dir)
    assert seal is not None and seal[constants.SEAL_COMPLETE_LSN] == seal["next_lsn"] == 24


def test_a_log_that_never_completed_seals_without_complete_lsn(log_dir: str) -> None:
    fail = {"on": False}

    def enumerate_all(emit: Callable[[Any], None]) -> None:
        if fail["on"]:
            raise ValueError("no")

    lg = persistlog.open(log_dir, enumerate_all)
    fail["on"] = True
    with pytest.raises(persistlog.EnumerateError):
        lg.rotate()
    lg.close()
    seal = seal_of_newest(log_dir)
    assert seal is not None and constants.SEAL_COMPLETE_LSN not in seal


def test_restore_then_open_enumerates_what_the_app_holds_now(log_dir: str) -> None:
    written_with_rotating_close(log_dir)
    app = Counted()
    persistlog.restore(log_dir, app.apply)
    # A migration in memory between restore() and open() is kept by open's enumeration.
    app.state = {k: {"migrated": v} for k, v in app.state.items()}
    lg = persistlog.open(log_dir, app.enumerate_all, concurrent_enumeration=True)
    assert app.enumerations == 1
    lg.close()
    assert restored_state(log_dir) == app.state


@pytest.mark.parametrize("why", ["updates after the snapshot", "other metadata", "secondaries", "discard_existing"])
def test_open_enumerates_when_the_newest_log_cannot_serve(tmp_path: Any, why: str) -> None:
    url = str(tmp_path / "log")
    expected = written_with_rotating_close(url, metadata={"schema": 1})
    options: dict[str, Any] = {"metadata": {"schema": 1}}
    if why == "updates after the snapshot":
        app = Counted()
        lg = persistlog.open(url, app.enumerate_all, concurrent_enumeration=True, replay=app.apply, **options)
        app.put(lg, 5, "late")
        lg.close()
        expected = app.state
    elif why == "other metadata":
        options["metadata"] = {"schema": 2}
    elif why == "secondaries":
        options["secondaries"] = [str(tmp_path / "secondary")]
    else:
        options["discard_existing"] = True
    app = Counted()
    lg = persistlog.open(url, app.enumerate_all, concurrent_enumeration=True, replay=app.apply, **options)
    assert app.enumerations == 1 and app.state == expected
    lg.close()
    assert restored_state(url) == expected


def test_a_secondary_seals_with_complete_lsn_too(tmp_path: Any) -> None:
    url, secondary = str(tmp_path / "primary"), str(tmp_path / "secondary")
    written_with_rotating_close(url, secondaries=[secondary])
    primary_seal, secondary_seal = seal_of_newest(url), seal_of_newest(secondary)
    assert primary_seal is not None and primary_seal[constants.SEAL_COMPLETE_LSN] == primary_seal["next_lsn"]
    assert secondary_seal == primary_seal


def test_retention_keeps_the_snapshot_the_next_log_needs(log_dir: str) -> None:
    written_with_rotating_close(log_dir, retain=1)
    app = Counted()
    lg = persistlog.open(log_dir, app.enumerate_all, concurrent_enumeration=True, replay=app.apply, retain=1)
    for i in range(20):
        app.put(lg, i, -i)
    lg.sync()
    assert restored_state(log_dir) == app.state  # log 2 (the snapshot) is still there
    lg.rotate()  # log 4 completes: logs 2 and 3 may go now
    app.put(lg, 50, 50)
    lg.close()
    assert restored_state(log_dir) == app.state
    dest = open_destination(log_dir)
    try:
        assert sorted(list_logs(dest)) == [4]
    finally:
        dest.close()


_CHILD = textwrap.dedent("""
    import sys
    import persistlog

    state = {}
    lg = persistlog.open(sys.argv[1], lambda emit: [emit({"k": k, "v": v}) for k, v in state.items()],
                         replay=lambda r: state.__setitem__(r["k"], r["v"]), durability="fsync")
    assert lg.restored is not None and lg.restored.logs == [2], lg.restored
    for i in range(100, 100000):
        lg.update({"k": i, "v": i})
        state[i] = i
        print(i, flush=True)
""")


@pytest.mark.slow
def test_a_crash_after_opening_without_enumerating_loses_no_durable_update(log_dir: str) -> None:
    expected = written_with_rotating_close(log_dir)
    child = subprocess.Popen([sys.executable, "-c", _CHILD, log_dir], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert child.stdout is not None
    acknowledged = [int(child.stdout.readline()) for _ in range(50)]
    child.send_signal(signal.SIGKILL)
    child.wait()
    got = restored_state(log_dir)
    for k in acknowledged:
        assert got[k] == k
    assert {k: v for k, v in got.items() if k < 100} == expected
    # Whatever else came back is a prefix of the child's updates, without holes.
    later = sorted(k for k in got if k >= 100)
    assert later == list(range(100, 100 + len(later)))
