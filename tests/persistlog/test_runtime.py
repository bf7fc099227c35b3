"""The process's runtime (``persistlog/_runtime.py``): many open Logs share one timer thread
and a few workers, an idle Log wakes nothing, and a job never runs on two workers at once."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

import persistlog
from childproc import run_json
from persistlog import _runtime
from persistlog._runtime import Job, runtime, workers_from_env
from threads import run_threads, wait_until

# 200 logs in a fresh interpreter: threads before and after opening them, and what the
# runtime did while they stayed idle (counted by the runtime, not timed).
_MANY_LOGS = """
import json, os, sys, tempfile, threading, time
import persistlog
from persistlog._runtime import runtime

n, idle = int(sys.argv[1]), float(sys.argv[2])
before = threading.active_count()
root = tempfile.mkdtemp()
logs = []
for i in range(n):
    durability = "flush" if i % 2 else "buffered"
    lg = persistlog.open(os.path.join(root, f"log-{i}"), lambda emit: None, durability=durability)
    lg.update({"op": "put", "key": i})  # buffered ones arm a flush, flush ones write at once
    logs.append(lg)
threads = threading.active_count()
rt = runtime()
time.sleep(0.5)  # the buffered logs' flushes (0.1 s) run out
wakeups, runs = rt.timer_wakeups, rt.runs
time.sleep(idle)
woke, ran = rt.timer_wakeups - wakeups, rt.runs - runs
for lg in logs:
    lg.close()
restored = []
for i in range(n):
    persistlog.restore(os.path.join(root, f"log-{i}"), restored.append)
print(json.dumps({"before": before, "threads": threads, "workers": rt.workers, "woke": woke, "ran": ran,
                  "restored": len(restored)}))
"""


@pytest.mark.slow
def test_two_hundred_open_logs_share_a_few_threads_and_wake_nothing_while_idle() -> None:
    r = run_json(_MANY_LOGS, "200", "2.0")
    # The timer thread and the workers, whatever the number of logs.
    assert r["threads"] <= r["before"] + r["workers"] + 1, r
    # Idle logs (nothing pending, local: no lease, no interval trigger) schedule nothing:
    # the timer sleeps through, the workers run nothing.
    assert r["woke"] <= 1 and r["ran"] == 0, r
    assert r["restored"] == 200


def test_a_job_never_runs_on_two_workers_at_once_and_reruns_when_asked_meanwhile() -> None:
    running = 0
    most = 0
    runs = 0
    lock = threading.Lock()

    def body() -> float | None:
        nonlocal running, most, runs
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.002)
        with lock:
            running -= 1
            runs += 1
        return None

    job = runtime().job(body, "test-serial")

    def ask(i: int) -> None:
        for _ in range(50):
            job.run_soon()
            time.sleep(0.001)

    assert run_threads(ask, 4) == []
    job.run_soon()
    wait_until(lambda: job.wait_idle(1) and runs > 0 and running == 0, describe="the last run")
    time.sleep(0.05)
    assert most == 1
    # Asked while it ran: it ran again after (not once per request, and not never).
    assert 1 < runs <= 4 * 50 + 1


def test_jobs_run_in_the_order_of_their_times_and_a_cancelled_one_never_runs() -> None:
    ran: list[str] = []
    done = threading.Event()

    def note(name: str) -> Job:
        def body() -> None:
            ran.append(name)
            if name == "last":
                done.set()

        return runtime().job(body, f"test-{name}")

    now = time.monotonic()
    jobs = {name: note(name) for name in ("second", "first", "cancelled", "last")}
    jobs["second"].run_at(now + 0.10)
    jobs["first"].run_at(now + 0.05)
    jobs["first"].run_at(now + 0.30)  # a later time does not put an earlier one off
    jobs["cancelled"].run_at(now + 0.15)
    jobs["last"].run_at(now + 0.20)
    jobs["cancelled"].cancel()
    assert done.wait(10)
    assert ran == ["first", "second", "last"]


def test_wait_idle_waits_for_the_run_under_way() -> None:
    inside = threading.Event()
    release = threading.Event()

    def body() -> None:
        inside.set()
        release.wait(10)

    job = runtime().job(body, "test-idle")
    job.run_soon()
    assert inside.wait(10)
    assert not job.wait_idle(0.05)
    job.cancel()  # a run under way goes on
    threading.Timer(0.1, release.set).start()
    assert job.wait_idle(10)


def test_long_jobs_leave_a_worker_for_short_ones() -> None:
    rt = runtime()
    release = threading.Event()
    started: list[int] = []

    def long_body(i: int) -> Any:
        def body() -> None:
            started.append(i)
            release.wait(20)

        return body

    longs = [rt.job(long_body(i), f"test-long-{i}", long=True) for i in range(rt.workers)]
    try:
        for job in longs:
            job.run_soon()
        wait_until(lambda: len(started) == rt.workers - 1, describe="as many long jobs as the limit")
        short = threading.Event()
        rt.job(lambda: short.set(), "test-short").run_soon()
        assert short.wait(10), "a short job waited for the long ones"
        time.sleep(0.05)
        assert len(started) == rt.workers - 1  # the last long one waits for a slot
    finally:
        release.set()
    wait_until(lambda: len(started) == rt.workers, describe="the last long job, once a slot is free")


def test_the_worker_count_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    monkeypatch.delenv(_runtime.WORKERS_ENV, raising=False)
    assert workers_from_env() == _runtime.DEFAULT_WORKERS
    monkeypatch.setenv(_runtime.WORKERS_ENV, "8")
    assert workers_from_env() == 8
    monkeypatch.setenv(_runtime.WORKERS_ENV, "1")
    assert workers_from_env() == _runtime.MIN_WORKERS
    monkeypatch.setenv(_runtime.WORKERS_ENV, "many")
    assert workers_from_env() == _runtime.DEFAULT_WORKERS
    assert "is not a number" in caplog.text


def test_a_forked_child_gets_a_runtime_of_its_own(log_dir: str) -> None:
    parent = runtime()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only os._exit leaves it
        status = 1
        try:
            rt = runtime()
            lg = persistlog.open(log_dir, lambda emit: None)
            lg.update({"op": "put", "key": 1})
            wait_until(lambda: lg.stats()["batches"] > 0, describe="the child's flush")  # by its runtime
            lg.close()
            status = 0 if rt is not parent and all(t.is_alive() for t in rt.threads) else 2
        finally:
            os.write(write, bytes([status]))
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"\x00"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert runtime() is parent
    records: list[Any] = []
    persistlog.restore(log_dir, records.append)
    assert records == [{"op": "put", "key": 1}]


@pytest.mark.slow
def test_the_timer_polls_only_while_a_signal_trigger_is_installed(log_dir: str) -> None:
    rt = runtime()
    lg = persistlog.open(log_dir, lambda emit: None, rotate_on_signal=signal.SIGUSR2)
    try:
        before = rt.timer_wakeups
        time.sleep(5 * _runtime.SIGNAL_POLL)
        assert rt.timer_wakeups - before >= 3
    finally:
        lg.close()
    time.sleep(_runtime.SIGNAL_POLL)  # the poll under way ends
    before = rt.timer_wakeups
    time.sleep(5 * _runtime.SIGNAL_POLL)
    assert rt.timer_wakeups - before <= 2
