"""Crashes of a writer with a secondary, shared by the core and Spark tests.

The app (``kv_app.App``) sets key ``k{n % 7}`` and ``last`` to ``n`` at step ``n``, so any
state says which prefix of the updates it is the result of (:func:`is_prefix`).
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

from crashsim import CrashSim, quiet_crash_threads
from kv_app import App, restore_state
from threads import wait_until

import persistlog


def steps(app: App, first: int, count: int) -> None:
    """Updates ``first .. first+count-1``: key ``n`` is set to ``n`` and ``last`` to ``n``."""
    for n in range(first, first + count):
        app.put(f"k{n % 7}", n)
        app.put("last", n)


def is_prefix(state: dict[str, Any]) -> int:
    """The step ``state`` is the result of (failing the test if it is no such state)."""
    n = state.get("last", 0)
    expected: dict[str, Any] = {}
    for i in range(1, n + 1):
        expected[f"k{i % 7}"] = i
        expected["last"] = i
    assert state == expected, f"not the state after a prefix of the updates: {sorted(state.items())[:10]}"
    return int(n)


def write_point(kind: str) -> str:
    return "before:append.write segment" if kind == "local" else "before:put segment"


def secondary_site(
    kind: str, tmp_path: Path, sim: CrashSim, s3: tuple[str, dict[str, Any]] | None = None
) -> tuple[str, tuple[str, dict[str, Any]]]:
    """``(plain url, (url, options) through the simulated machine)`` of the secondary: a
    local directory, a fresh ``memory://`` one, or (kind ``"s3"``) ``s3 = (url, options)``."""
    if kind == "local":
        path = str(tmp_path / "secondary")
        return path, sim.local(path, label="secondary")
    if kind == "s3":
        assert s3 is not None, "an S3 secondary needs s3=(url, storage_options)"
        return s3[0], sim.remote(s3[0], s3[1], label="secondary")
    url = f"memory://sec-{uuid.uuid4().hex[:10]}/log"
    return url, sim.remote(url, label="secondary")


def crash_with_secondary_behind(
    kind: str, tmp_path: Path, sim: CrashSim, lease_ttl: float, s3: tuple[str, dict[str, Any]] | None = None
) -> tuple[str, int]:
    """A writer whose secondary stalls after step 20 dies at step 50: the secondary is 30
    steps behind, and (on an object store) still leased by the dead writer for up to
    ``lease_ttl``. Returns the secondary's plain URL and the last acknowledged step."""
    primary = str(tmp_path / "primary")
    sec_url, sec = secondary_site(kind, tmp_path, sim, s3)
    sec_options = s3[1] if s3 is not None else {}
    hold, release = threading.Event(), threading.Event()
    sim.on(write_point(kind), lambda label, point: hold.is_set() and release.wait(10), times=1 << 30,
           label="secondary")
    app = App()
    url, so = sim.local(primary)
    app.log = persistlog.open(url, app.enumerate_all, concurrent_enumeration=True, storage_options=so, secondaries=[sec],
                              durability="fsync", lease_ttl=lease_ttl, flush_interval=0.01)
    steps(app, 1, 20)
    wait_until(lambda: restore_state(sec_url, storage_options=sec_options)[0].get("last") == 20, 10,
               "the secondary catching up")
    hold.set()
    steps(app, 21, 30)
    time.sleep(0.05)
    sim.crash()
    release.set()
    sim.abandon(app.log)
    return sec_url, 50




def restart_and_crash_on_the_secondary(kind: str, tmp_path: Path, sec_url: str, acked: int) -> None:
    """A new writer restores the primary and opens with the secondary; the machine dies
    right after that writer's first log segment reached the secondary (on an object store
    its first segment object is the fence it puts after the dead writer's log)."""
    sim = CrashSim()
    if kind == "local":
        sim.crash_at("after:create segment", label="secondary")
    else:
        sim.crash_at("after:put segment", nth=2, label="secondary")
    url, so = sim.local(str(tmp_path / "primary"))
    state, _ = restore_state(url, storage_options=so)  # through the URL it then opens
    assert is_prefix(state) == acked
    app = App(state)
    sec = sim.local(sec_url, label="secondary") if kind == "local" else sim.remote(sec_url, label="secondary")
    with quiet_crash_threads():
        try:
            app.log = persistlog.open(url, app.enumerate_all, concurrent_enumeration=True, storage_options=so, secondaries=[sec],
                                      durability="fsync", lease_ttl=0.4)
            wait_until(lambda: sim.frozen, 10, "the crash on the secondary")
        except BaseException:  # noqa: BLE001 - the simulated crash, however it surfaces
            assert sim.frozen
        if app.log is not None:
            sim.abandon(app.log)


def write_the_secondary_whole_again(primary: str, sec_url: str, first: int, count: int) -> App:
    """A writer that restores the primary and writes steps ``first ..`` with the secondary
    attached, then closes: the secondary holds a complete log after its gap again."""
    state, _ = restore_state(primary)
    app = App(state)
    app.log = persistlog.open(primary, app.enumerate_all, concurrent_enumeration=True, secondaries=[sec_url])
    steps(app, first, count)
    app.log.close()
    return app
