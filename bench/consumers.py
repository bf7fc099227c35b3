"""Many named consumers of one log (``persistlog.consumers``): what 100 of them cost.

Three figures, each against its target, with the same work done by 100 ``follow()``
followers (one thread and one poll loop each) measured in the same run for comparison:

1. idle CPU: 100 consumers of one log, caught up, nothing written, for ``idle`` seconds:
   the process's CPU time (every thread) over wall time, in % of one core;
2. catch-up: ``n`` records already in the log, 100 consumers starting from its start:
   records handed to consumers per second, summed over the consumers (the poller reads
   each batch once); the process's resident memory growth meanwhile;
3. a writer in the same process: ``update()`` paced at ``WRITER_TARGET`` records a
   second for ``seconds``, alone and then beside the 100 consumers that follow it; the
   rate it keeps, as a ratio of its rate alone.

The consumers' handler is ``replay_batch`` counting the records: what is measured is the
delivery, not an app's own work. ``python bench/consumers.py`` runs the group alone.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import persistlog

from figures import Figure, at_least, at_most, info, vs_baseline
from workload import Config, Scratch, no_enumeration, small_records

log = logging.getLogger("bench")

AREA = "consumers"
CONSUMERS = 100
MAX_IDLE_CPU_PERCENT = 2.0
MIN_CATCH_UP_RATE = 1_000_000.0
WRITER_TARGET = 20_000
COMMIT_INTERVAL = 1.0
MIN_WRITER_RATIO = 0.8


class Counter:
    """A consumer's handler: counts what it is handed."""

    def __init__(self) -> None:
        self.records = 0

    def __call__(self, records: list[Any]) -> None:
        self.records += len(records)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Samples the process's resident memory every 10 ms while it runs."""

    def __init__(self) -> None:
        self.start = rss_bytes()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss_bytes())

    def stop(self) -> float:
        """MB grown at the peak."""
        self._stop.set()
        self._thread.join()
        return (self.peak - self.start) / 1e6


class Readers:
    """100 readers of one log: one consumer group, or 100 followers (the baseline)."""

    def __init__(self, url: str, kind: str) -> None:
        self.kind = kind
        self.counters = [Counter() for _ in range(CONSUMERS)]
        if kind == "group":
            self.group = persistlog.consumers(url, commit_interval=COMMIT_INTERVAL)
            for i, c in enumerate(self.counters):
                self.group.add(f"c{i}", replay_batch=c)
            self.group.start()
        else:
            self.followers = [persistlog.follow(url, replay_batch=c).start() for c in self.counters]

    def wait_caught_up(self, timeout: float = 600) -> None:
        if self.kind == "group":
            assert self.group.wait_caught_up(timeout)
        else:
            for f in self.followers:
                assert f.wait_caught_up(timeout)

    def delivered(self) -> int:
        return sum(c.records for c in self.counters)

    def stop(self) -> None:
        if self.kind == "group":
            self.group.stop()
            for c in self.group.consumers:  # the next round starts from the start again
                self.group.remove(c.name, forget=True)
        else:
            for f in self.followers:
                f.stop()


def _log_with(url: str, n: int) -> persistlog.Log:
    lg = persistlog.open(url, no_enumeration, rotate_bytes=None)
    for record in small_records(n):
        lg.update(record)  # batches of the writer's ~1 MiB, as an app writes them
    lg.sync()
    return lg


def idle_cpu(url: str, kind: str, seconds: float) -> float:
    """% of one core the process uses with 100 caught-up readers and nothing written."""
    readers = Readers(url, kind)
    try:
        readers.wait_caught_up()
        time.sleep(COMMIT_INTERVAL + 0.5)  # the commit of the positions caught up is behind us
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(seconds)
        return 100 * (time.process_time() - cpu) / (time.perf_counter() - wall)
    finally:
        readers.stop()


def catch_up(url: str, kind: str, n: int) -> tuple[float, float]:
    """(records per second summed over the readers, MB of resident memory grown)."""
    rss = PeakRss()
    began = time.perf_counter()
    readers = Readers(url, kind)
    try:
        readers.wait_caught_up()
        seconds = time.perf_counter() - began
        assert readers.delivered() == CONSUMERS * n, (readers.delivered(), CONSUMERS * n)
    finally:
        readers.stop()
    return CONSUMERS * n / seconds, rss.stop()


def paced_writer(lg: persistlog.Log, seconds: float, first: int) -> float:
    """Records per second ``update()`` kept when asked for ``WRITER_TARGET`` a second."""
    began = time.perf_counter()
    written = 0
    while True:
        now = time.perf_counter() - began
        if now >= seconds:
            break
        due = int(now * WRITER_TARGET) - written
        for i in range(min(due, 1000)):
            lg.update({"key": first + written + i, "value": "x" * 32})
        written += min(due, 1000)
        if due <= 0:
            time.sleep(0.001)
    return written / (time.perf_counter() - began)


def writer_beside(url: str, kind: str | None, seconds: float) -> float:
    """The paced writer's rate, alone (``kind`` None) or beside 100 readers following it."""
    lg = persistlog.open(url, no_enumeration, rotate_bytes=None)
    readers = Readers(url, kind) if kind is not None else None
    try:
        if readers is not None:
            readers.wait_caught_up()
        return paced_writer(lg, seconds, 0)
    finally:
        if readers is not None:
            readers.stop()
        lg.close()


def run(cfg: Config, s: Scratch) -> list[Figure]:
    n = 100_000 if cfg.quick else 300_000
    idle = 2.0 if cfg.quick else 5.0
    write_seconds = 3.0 if cfg.quick else 6.0
    url = s.fresh("consumers-log")
    lg = _log_with(url, n)
    lg.close()

    log.info("consumers: idle CPU, %d consumers, then %d followers (%.0fs each)", CONSUMERS, CONSUMERS, idle)
    idle_group = idle_cpu(url, "group", idle)
    idle_followers = idle_cpu(url, "followers", idle)

    log.info("consumers: catch-up of %d records by %d consumers", n, CONSUMERS)
    rate_group, rss_group = catch_up(url, "group", n)
    small = n // 10
    url_small = s.fresh("consumers-small")
    _log_with(url_small, small).close()
    log.info("consumers: catch-up of %d records by %d followers", small, CONSUMERS)
    rate_followers, rss_followers = catch_up(url_small, "followers", small)

    log.info("consumers: a writer paced at %d/s, alone and beside %d consumers / followers", WRITER_TARGET, CONSUMERS)
    alone = writer_beside(s.fresh("consumers-writer"), None, write_seconds)
    beside_group = writer_beside(s.fresh("consumers-writer"), "group", write_seconds)
    beside_followers = writer_beside(s.fresh("consumers-writer"), "followers", write_seconds)

    raw: dict[str, Any] = {
        "consumers": CONSUMERS, "records": n, "idle_seconds": idle, "writer_target": WRITER_TARGET,
        "idle_cpu_followers_percent": idle_followers, "catch_up_followers_rate": rate_followers,
        "catch_up_followers_records": small, "writer_beside_followers": beside_followers,
    }
    figures = [
        at_most(f"{CONSUMERS} consumers idle: CPU", AREA, idle_group, MAX_IDLE_CPU_PERCENT, "% core",
                idle_followers, f"{CONSUMERS} follow() followers", raw),
        info(f"{CONSUMERS} follow() followers idle: CPU", AREA, idle_followers, "% core"),
        at_least(f"{CONSUMERS} consumers catch-up (sum)", AREA, rate_group, MIN_CATCH_UP_RATE, "rec/s"),
        info(f"{CONSUMERS} follow() followers catch-up (sum)", AREA, rate_followers, "rec/s"),
        info(f"{CONSUMERS} consumers catch-up: RSS growth", AREA, rss_group, "MB"),
        info(f"{CONSUMERS} follow() followers catch-up: RSS growth", AREA, rss_followers, "MB"),
        vs_baseline(f"writer at {WRITER_TARGET}/s beside {CONSUMERS} consumers", AREA, beside_group, alone,
                    "writer alone", "rec/s", MIN_WRITER_RATIO),
        info(f"writer at {WRITER_TARGET}/s beside {CONSUMERS} followers", AREA, beside_followers, "rec/s",
             alone, "writer alone"),
    ]
    return figures


BENCHMARKS: dict[str, Callable[[Config, Scratch], list[Figure]]] = {"hundred": run}


if __name__ == "__main__":
    import sys

    from figures import table
    from workload import scratch

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    logging.getLogger("persistlog").setLevel(logging.WARNING)
    with scratch() as sc:
        print(table(run(Config.quick_run() if "--quick" in sys.argv else Config(), sc)))
