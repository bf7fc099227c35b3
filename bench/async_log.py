"""The asyncio face: group commit among tasks on one loop, the loop's lag meanwhile, and
buffered ``await update()`` against the sync ``update()`` loop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import persistlog

from core import sync_rate
from figures import Figure, at_most, info, vs_baseline
from workload import Config, Scratch, interleaved, latency_summary, median, no_enumeration, small_records

log = logging.getLogger("bench")

AREA = "asyncio"
TASKS = 256
#: How often the lag probe asks to wake: its lateness is the loop's lag.
TICK = 0.001


def fsync_tasks(url: str, tasks: int, seconds: float) -> dict[str, Any]:
    """``tasks`` tasks on one loop each awaiting ``update()`` in turn for ``seconds``, in
    fsync mode; the rate, records per fsync and the loop's lag meanwhile (a task asking to
    wake every millisecond, measuring how late it woke)."""

    async def main() -> dict[str, Any]:
        alog = await persistlog.open_async(url, no_enumeration, durability="fsync")
        record = {"op": "put", "key": 0, "value": "v" * 16}
        counts = [0] * tasks
        lags: list[float] = []
        running = True

        async def writer(i: int) -> None:
            update = alog.update
            n = 0
            while running:
                await update(record)
                n += 1
            counts[i] = n

        async def probe() -> None:
            while running:
                lags.append(await lateness())

        syncs = alog.stats()["syncs"]
        cpu = time.process_time()
        loop_cpu = time.thread_time()  # asyncio.run() runs the loop on this thread
        began = time.perf_counter()
        work = [asyncio.create_task(writer(i)) for i in range(tasks)] + [asyncio.create_task(probe())]
        await asyncio.sleep(seconds)
        running = False
        await asyncio.gather(*work)
        elapsed = time.perf_counter() - began
        cpu = time.process_time() - cpu
        loop_cpu = time.thread_time() - loop_cpu
        syncs = alog.stats()["syncs"] - syncs
        await alog.close()
        total = sum(counts)
        return {
            "tasks": tasks,
            "records": total,
            "seconds": elapsed,
            "rate": total / elapsed,
            "syncs": syncs,
            "records_per_sync": total / max(1, syncs),
            # Every thread's CPU (the loop's and the commit thread's) per awaited record.
            "cpu_us_per_record": cpu / max(1, total) * 1e6,
            "loop_cpu_us_per_record": loop_cpu / max(1, total) * 1e6,
            "loop_lag": latency_summary(lags),
        }

    return asyncio.run(main())


async def lateness() -> float:
    """How late the loop woke a task that asked to sleep ``TICK``."""
    asked = time.perf_counter()
    await asyncio.sleep(TICK)
    return max(0.0, time.perf_counter() - asked - TICK)


def idle_lag(seconds: float) -> dict[str, float]:
    """The lag of a loop with nothing else to do: what the machine's load alone costs."""

    async def main() -> list[float]:
        end = time.perf_counter() + seconds
        lags = []
        while time.perf_counter() < end:
            lags.append(await lateness())
        return lags

    return latency_summary(asyncio.run(main()))


def group_commit(cfg: Config, s: Scratch) -> list[Figure]:
    log.info("asyncio group commit: 1 and %d tasks, %.1fs each", TASKS, cfg.fsync_seconds)
    one = fsync_tasks(s.fresh("alog-fsync-1"), 1, cfg.fsync_seconds)
    idle = idle_lag(cfg.fsync_seconds)
    many = fsync_tasks(s.fresh("alog-fsync-n"), TASKS, cfg.fsync_seconds)
    threads = sync_rate(s.fresh("log-fsync-threads"), cfg.fsync_threads, cfg.fsync_seconds, durability="fsync")
    lag = many["loop_lag"] | {"idle_loop": idle}
    return [
        vs_baseline(
            f"asyncio fsync mode, {TASKS} tasks await update()", AREA, many["rate"], one["rate"],
            "1 task", "rec/s", 30.0, {"one_task": one, "tasks": many},
        ),
        info(f"  records per fsync, {TASKS} tasks", AREA, round(many["records_per_sync"], 2), "rec"),
        at_most(f"  CPU per awaited record, {TASKS} tasks", AREA, many["cpu_us_per_record"] / 1e3, 0.004, "ms",
                one["cpu_us_per_record"] / 1e3, "1 task"),
        info(f"  the loop thread's share of it", AREA, many["loop_cpu_us_per_record"] / 1e3, "ms"),
        info(f"  {TASKS} tasks vs the sync Log's group commit", AREA, many["rate"], "rec/s", threads["rate"],
             f"{cfg.fsync_threads} threads", {"threads": threads}),
        at_most(f"  loop lag p99 during {TASKS} tasks", AREA, lag["p99_ms"], 10.0, "ms",
                idle["p99_ms"], "idle loop", raw=lag),
    ]


def buffered(cfg: Config, s: Scratch) -> list[Figure]:
    """``await alog.update()`` one by one from a task against ``Log.update()`` in a plain
    loop, both buffered, each ending with ``sync()``; opening and closing are not timed."""
    records = small_records(cfg.records)
    n = len(records)

    def sync_run() -> float:
        lg = persistlog.open(s.fresh("log-sync"), no_enumeration)
        try:
            update = lg.update
            began = time.perf_counter()
            for r in records:
                update(r)
            lg.sync()
            return time.perf_counter() - began
        finally:
            lg.close()

    def async_run() -> float:
        async def main() -> float:
            alog = await persistlog.open_async(s.fresh("alog-buffered"), no_enumeration)
            try:
                update = alog.update
                began = time.perf_counter()
                for r in records:
                    await update(r)
                await alog.sync()
                return time.perf_counter() - began
            finally:
                await alog.close()

        return asyncio.run(main())

    log.info("asyncio buffered: %d records, %d rounds", n, cfg.repeats)
    runs: dict[str, Callable[[], float]] = {"sync": sync_run, "async": async_run}
    times = interleaved(runs, cfg.repeats)
    rate = {name: n / median(t) for name, t in times.items()}
    return [
        vs_baseline("asyncio buffered await update()", AREA, rate["async"], rate["sync"], "sync update()",
                    "rec/s", 0.5, {"records": n, "seconds": times, "rates": rate}),
    ]


BENCHMARKS: dict[str, Callable[[Config, Scratch], Sequence[Figure]]] = {
    "tasks_fsync": group_commit,
    "buffered": buffered,
}
