"""Many open logs in one process: threads, idle CPU, file descriptors, open and close time.

A service that keeps one log per tenant, shard or resource holds hundreds or thousands of
Logs open at once, most of them idle at any moment. What each open Log costs while it
does nothing is what this group measures, in a child process of its own (so that the
threads and descriptors counted are the logs' alone, not the bench run's):

1. open ``n`` logs, each at a fresh local directory, with
   ``persistlog.open(url_i, enumerate_all_i, durability="flush")`` (log i's snapshot holds
   ``{"id": i}``), timing the opens; then one ``update()`` per log (``{"n": 7 * i}``);
2. count the process's threads, open file descriptors and resident memory;
3. leave the logs idle for ``idle_seconds`` and read the CPU time the process used
   meanwhile (``psutil``'s ``cpu_times``, user + system, all threads);
4. close them all, then open each again with ``replay=`` into a fresh state (a restart),
   timing both, and count the logs whose restored state is not exactly what was logged.

Run as a script it is that child (``--child N --root DIR --idle-seconds S``), and prints
its figures as one JSON line; ``python bench/many_logs.py --logs N`` runs one round and
prints the figures without the bench table.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from figures import Figure, at_most, info
from workload import Config, Scratch

log = logging.getLogger("bench")

AREA = "many"
#: Where many open logs should get to: this many threads and file descriptors at most,
#: this share of one core while idle, and, for TARGET_LOGS logs (pro rata for another
#: count), this long to open them all, and to close them and reopen them with a restore.
TARGET_LOGS = 10_000
MAX_THREADS = 16
MAX_FDS = 1_100
MAX_IDLE_CPU_PERCENT = 2.0
MAX_OPEN_SECONDS = 30.0
MAX_RESTART_SECONDS = 60.0
#: App threads of the second round, which opens, closes and reopens the logs from a pool.
POOL_THREADS = 8


def child(n: int, root: str, idle_seconds: float, threads: int = 1) -> dict[str, Any]:
    """Open ``n`` logs under ``root``, give each some state, leave them idle, close them,
    reopen them with a restore and check every state; the figures. ``threads`` app threads
    open, close and reopen the logs (each its share, in a pool)."""
    import psutil

    import persistlog

    me = psutil.Process()
    threads_before = me.num_threads()
    fds_before = me.num_fds()
    rss_before = me.memory_info().rss
    urls = [os.path.join(root, f"log-{i}") for i in range(n)]

    def snapshot_of(state: dict[str, int]) -> Callable[[Callable[[Any], None]], None]:
        def enumerate_all(emit: Callable[[Any], None]) -> None:
            for k, v in state.items():
                emit({"k": k, "v": v})
        return enumerate_all

    # Log i's state: {"id": i} from its first snapshot, then {"n": 7 * i} by one update.
    states: list[dict[str, int]] = [{"id": i} for i in range(n)]
    pool = ThreadPoolExecutor(threads)

    def each(fn: Callable[[int], Any]) -> list[Any]:
        return list(pool.map(fn, range(n))) if threads > 1 else [fn(i) for i in range(n)]

    load_before = os.getloadavg()
    started = time.perf_counter()
    logs: list[persistlog.Log] = each(
        lambda i: persistlog.open(urls[i], snapshot_of(states[i]), durability="flush"))
    open_seconds = time.perf_counter() - started
    started = time.perf_counter()
    for i, lg in enumerate(logs):
        lg.update({"k": "n", "v": 7 * i})
        states[i]["n"] = 7 * i
    update_seconds = time.perf_counter() - started
    time.sleep(0.5)  # whatever the opening started settles
    process_threads = me.num_threads() - (threads if threads > 1 else 0)  # the pool's aside
    fds = me.num_fds()
    rss = me.memory_info().rss
    cpu0 = me.cpu_times()
    wall0 = time.perf_counter()
    time.sleep(idle_seconds)
    cpu1 = me.cpu_times()
    wall = time.perf_counter() - wall0
    idle_cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    started = time.perf_counter()
    each(lambda i: logs[i].close())
    close_seconds = time.perf_counter() - started
    # A restart: every log restored into a fresh state and opened again.
    restored: list[dict[str, int]] = [{} for _ in range(n)]

    def reopen(i: int) -> persistlog.Log:
        state = restored[i]
        return persistlog.open(urls[i], snapshot_of(state), durability="flush",
                               replay=lambda r: state.__setitem__(r["k"], r["v"]))

    started = time.perf_counter()
    logs = each(reopen)
    reopen_seconds = time.perf_counter() - started
    wrong = sum(1 for i in range(n) if restored[i] != states[i])
    reopened_fds = me.num_fds()
    started = time.perf_counter()
    each(lambda i: logs[i].close())
    second_close_seconds = time.perf_counter() - started
    pool.shutdown()
    return {
        "logs": n,
        "app_threads": threads,
        "threads_before": threads_before,
        "threads": process_threads,
        "python_threads": threading.active_count(),
        "fds_before": fds_before,
        "fds": fds,
        "reopened_fds": reopened_fds,
        "rss_before_mib": rss_before / 2**20,
        "rss_mib": rss / 2**20,
        "open_seconds": open_seconds,
        "update_seconds": update_seconds,
        "close_seconds": close_seconds,
        "reopen_seconds": reopen_seconds,
        "second_close_seconds": second_close_seconds,
        "states_wrong": wrong,
        "idle_seconds": wall,
        "idle_cpu_seconds": idle_cpu,
        "idle_cpu_percent": 100.0 * idle_cpu / wall if wall > 0 else 0.0,
        # The machine's load (1-minute average) when the child started and ended: the
        # times above follow it on a shared machine.
        "load_before": load_before[0],
        "load_after": os.getloadavg()[0],
    }


def run_child(n: int, root: str, idle_seconds: float, threads: int = 1) -> dict[str, Any]:
    """:func:`child` in a fresh interpreter (this one's environment, so the same persistlog)."""
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", str(n), "--root", root,
         "--idle-seconds", str(idle_seconds), "--threads", str(threads)],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the many-logs child failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def figures_of(r: dict[str, Any]) -> list[Figure]:
    n = r["logs"]
    scale = n / TARGET_LOGS  # the time targets are for TARGET_LOGS logs: pro rata
    per_log = 1e3 / n
    restart = r["close_seconds"] + r["reopen_seconds"]
    return [
        at_most(f"threads, {n:,} open logs", AREA, r["threads"], MAX_THREADS, "",
                r["threads_before"], "before opening", raw=r),
        at_most(f"file descriptors, {n:,} open logs", AREA, r["fds"], MAX_FDS, "",
                r["fds_before"], "before opening"),
        at_most(f"idle CPU, {n:,} open logs", AREA, round(r["idle_cpu_percent"], 2), MAX_IDLE_CPU_PERCENT,
                "% core"),
        at_most(f"open() of {n:,} logs", AREA, round(r["open_seconds"], 2),
                round(MAX_OPEN_SECONDS * scale, 2), "s"),
        at_most(f"close() + reopen with restore of {n:,} logs", AREA, round(restart, 2),
                round(MAX_RESTART_SECONDS * scale, 2), "s"),
        at_most(f"logs restored to another state, of {n:,}", AREA, r["states_wrong"], 0, ""),
        info(f"RSS, {n:,} open logs", AREA, round(r["rss_mib"] - r["rss_before_mib"], 1), "MiB"),
        info(f"open() per log, {n:,} logs", AREA, r["open_seconds"] * per_log, "ms"),
        info(f"update() + flush per log, round robin, {n:,} logs", AREA, r["update_seconds"] * per_log, "ms"),
        info(f"close() per log, {n:,} logs", AREA, r["close_seconds"] * per_log, "ms"),
        info(f"reopen with restore per log, {n:,} logs", AREA, r["reopen_seconds"] * per_log, "ms"),
        info("  load average (1 min) at start / end", AREA, round(r["load_before"], 1), "",
             round(r["load_after"], 1), "at the end"),
    ]


def pool_figures_of(r: dict[str, Any]) -> list[Figure]:
    """The same logs opened, closed and reopened by a pool of app threads: their syncs
    overlap (information: how an app opening many logs at start should do it)."""
    n, t = r["logs"], r["app_threads"]
    return [
        info(f"open() of {n:,} logs from {t} threads", AREA, round(r["open_seconds"], 2), "s", raw=r),
        info(f"close() + reopen with restore of {n:,} logs from {t} threads", AREA,
             round(r["close_seconds"] + r["reopen_seconds"], 2), "s"),
        info(f"  close / reopen with restore, {t} threads", AREA, round(r["close_seconds"], 2), "s",
             round(r["reopen_seconds"], 2), "reopen"),
        info(f"logs restored to another state, of {n:,}, {t} threads", AREA, r["states_wrong"], ""),
        info(f"threads / file descriptors, {n:,} open logs, {t} app threads (theirs aside)", AREA, r["threads"], "",
             r["fds"], "fds"),
        info(f"RSS, {n:,} open logs, {t} threads", AREA, round(r["rss_mib"] - r["rss_before_mib"], 1), "MiB"),
        info(f"idle CPU, {n:,} open logs, {t} threads", AREA, round(r["idle_cpu_percent"], 2), "% core"),
        info("  load average (1 min) at start / end", AREA, round(r["load_before"], 1), "",
             round(r["load_after"], 1), "at the end"),
    ]


def many_open_logs(cfg: Config, s: Scratch) -> list[Figure]:
    """Threads, descriptors, memory, idle CPU, open and restart time of ``cfg.many_logs``
    open logs, opened one by one; then opened by a pool of app threads."""
    n = cfg.many_logs
    idle = cfg.many_idle_seconds
    log.info("many logs: %d logs opened with durability='flush', idle %gs", n, idle)
    figures = figures_of(run_child(n, s.fresh("many"), idle))
    log.info("many logs: %d logs opened by %d app threads", n, POOL_THREADS)
    return figures + pool_figures_of(run_child(n, s.fresh("many-pool"), idle, POOL_THREADS))


BENCHMARKS: dict[str, Callable[[Config, Scratch], Sequence[Figure]]] = {
    "logs": many_open_logs,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", type=int, metavar="N", help="run as the child: open N logs")
    parser.add_argument("--root", help="where the child's logs go")
    parser.add_argument("--logs", type=int, default=1000, help="logs to open (one round, no table)")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=1, help="app threads opening and closing the logs")
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.root, args.idle_seconds, args.threads)))
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="many-logs-") as root:
        r = run_child(args.logs, root, args.idle_seconds, args.threads)
        print(json.dumps(r, indent=2), flush=True)  # before the (long) removal of the logs


if __name__ == "__main__":
    main()
