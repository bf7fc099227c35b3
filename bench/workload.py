"""What the benchmarks feed persistlog and how they time it: records, scratch space, clocks.

Every throughput figure uses the same small record, built before the clock starts::

    {"op": "put", "key": i, "value": "v" * 16}     # 32 bytes of CBOR

so that persistlog and the baselines it is compared with encode exactly the same objects.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

log = logging.getLogger("bench")

T = TypeVar("T")

SMALL_VALUE = "v" * 16
SMALL_RECORD_SHAPE = '{"op": "put", "key": i, "value": "v" * 16}'

#: A clock every process on the machine shares (Linux CLOCK_MONOTONIC is system-wide), so
#: a writer process and a follower process can subtract each other's readings.
SHARED_CLOCK = time.CLOCK_MONOTONIC


def shared_now() -> float:
    return time.clock_gettime(SHARED_CLOCK)


def small_records(n: int) -> list[dict[str, Any]]:
    return [{"op": "put", "key": i, "value": SMALL_VALUE} for i in range(n)]


def chunks(records: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [records[i : i + size] for i in range(0, len(records), size)]


def no_enumeration(emit: Callable[[Any], None]) -> None:
    """The enumerate callback of an app with no live resources yet."""


@dataclass
class Scratch:
    """What one run shares between benchmarks: a directory for their files and services
    (the moto server) started on first use; all of it goes away when the run ends."""

    root: str
    _services: dict[str, Any] = field(default_factory=dict)
    _stack: ExitStack = field(default_factory=ExitStack)

    def service(self, name: str, start: Callable[[], AbstractContextManager[T]]) -> T:
        """The service ``name``, entering ``start()`` the first time it is asked for."""
        if name not in self._services:
            self._services[name] = self._stack.enter_context(start())
        return cast(T, self._services[name])

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def fresh(self, name: str) -> str:
        """A path that does not exist yet (an earlier use of ``name`` is removed)."""
        path = self.path(name)
        shutil.rmtree(path, ignore_errors=True)
        if os.path.exists(path):
            os.unlink(path)
        return path


@contextmanager
def scratch(parent: str | None = None) -> Iterator[Scratch]:
    root = tempfile.mkdtemp(prefix="persistlog-bench-", dir=parent)
    s = Scratch(root)
    try:
        with s._stack:
            yield s
    finally:
        shutil.rmtree(root, ignore_errors=True)


def dir_bytes(path: str) -> int:
    """Bytes in every regular file under ``path`` (or of ``path`` itself)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for top, _dirs, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(top, name))
    return total


def request_counts(dest: object) -> dict[str, int]:
    """Requests a destination (a Log's or a Follower's ``dest``) sent so far, by kind:
    object stores count them, a local directory sends none."""
    stats = getattr(dest, "stats", None)
    return dict(stats()) if callable(stats) else {}


def timed(fn: Callable[[], Any]) -> float:
    """Seconds ``fn()`` took."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cpu_timed(fn: Callable[[], Any]) -> float:
    """CPU seconds (every thread of this process) ``fn()`` took: unlike wall time, not
    stretched by other processes' work on a shared machine. For work that does not wait
    (decoding, encoding, page-cache reads), it is the wall time of an idle machine."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and every live process under it (a local
    Spark's JVM and its Python workers), with what their finished children used once
    reaped: read from ``/proc``, so Linux only. Work spread over other processes counts,
    and unlike wall time it is not stretched by other processes' work on a shared machine."""
    ticks = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    used: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # Fields after the command name (which may hold spaces): state, ppid, ...; utime,
        # stime, cutime and cstime are fields 14-17 of the whole line.
        fields = stat[stat.rindex(")") + 2 :].split()
        parent[int(entry)] = int(fields[1])
        used[int(entry)] = sum(int(x) for x in fields[11:15])
    mine = {os.getpid()}
    grew = True
    while grew:
        below = {pid for pid, ppid in parent.items() if ppid in mine} - mine
        mine |= below
        grew = bool(below)
    return sum(used[pid] for pid in mine if pid in used) / ticks


def interleaved(runs: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Call each of ``runs`` (returning its own seconds) ``repeats`` times, round-robin, so
    that noise from other work on the machine spreads over all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(repeats):
        for name, run in runs.items():
            seconds = run()
            times[name].append(seconds)
            log.debug("  %s run %d: %.3fs", name, i + 1, seconds)
    return times


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of already sorted values."""
    if not sorted_values:
        return float("nan")
    rank = math.ceil(p / 100 * len(sorted_values))
    return float(sorted_values[max(0, min(len(sorted_values), rank) - 1)])


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/p99.9/max in milliseconds, plus the count."""
    s = sorted(seconds)
    return {
        "count": len(s),
        "p50_ms": percentile(s, 50) * 1e3,
        "p90_ms": percentile(s, 90) * 1e3,
        "p99_ms": percentile(s, 99) * 1e3,
        "p999_ms": percentile(s, 99.9) * 1e3,
        "max_ms": (s[-1] if s else float("nan")) * 1e3,
        "min_ms": (s[0] if s else float("nan")) * 1e3,
    }


@dataclass
class Config:
    """Workload sizes of one run; ``--quick`` shrinks every one of them."""

    quick: bool = False
    records: int = 1_000_000
    repeats: int = 5
    fsync_seconds: float = 4.0
    fsync_threads: int = 32
    live_resources: int = 1_000_000
    restore_gib: float = 2.0
    bytes_records: int = 200_000
    s3_records: int = 300_000
    s3_sync_seconds: float = 4.0
    s3_sync_threads: int = 16
    paced_rate: float = 1000.0
    paced_seconds: float = 10.0
    idle_seconds: float = 60.0
    lag_samples: int = 500
    lag_interval: float = 0.01
    shape_records: int = 500_000
    shapes: tuple[str, ...] = ("old", "flat", "nested", "wide")
    heap_objects: int = 1_000_000
    restart_keys: int = 1_000_000
    restart_updates: int = 5_000_000
    many_logs: int = 10_000
    many_idle_seconds: float = 10.0
    queues: int = 10_000
    queue_pending_mb: float = 100.0
    queue_seconds: float = 10.0
    tmpdir: str | None = None
    moto_in_process: bool = False

    @classmethod
    def quick_run(cls) -> Config:
        return cls(
            quick=True,
            records=200_000,
            repeats=3,
            fsync_seconds=1.5,
            live_resources=100_000,
            restore_gib=0.25,
            bytes_records=50_000,
            s3_records=100_000,
            s3_sync_seconds=1.5,
            paced_seconds=4.0,
            idle_seconds=10.0,
            lag_samples=150,
            shape_records=100_000,
            restart_keys=100_000,
            restart_updates=500_000,
            queues=1000,
            queue_pending_mb=10.0,
            queue_seconds=4.0,
            many_logs=1000,
        )
