"""Many logs: a ``persistlog.LogSet`` of small logs, read by Spark and opened and closed.

* ``spark``: the same records written as 1,000 small logs of a set (``LogSet.open``,
  ``update_many``, ``close``) and as one log; ``spark.read.format("persistlog").load(...)``
  of each into a ``noop`` sink, alternately, ``repeats`` times, best run. Target: the set's
  rows/s >= 0.8x the one log's (planning every log on the driver included). Beside it the
  same per CPU second of the whole process tree, and what a log costs beyond the one log's
  records: in all, and of it the Python of the driver's planning and of the executors'
  reading, measured in this process without Spark.
* ``open_close``: opening N logs of a set (each ``LogSet.open`` restores nothing and starts
  a log with an empty enumeration) and holding them all open, then ``LogSet.close()``;
  the same N logs as plain ``persistlog.open`` on N sibling directories, closed one by one,
  is the baseline. Listing the set's keys is shown beside it. For information: what one
  open Log costs today (threads) is what a shared runtime will take away.

Run alone: ``python bench/logset.py [--quick]``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from figures import Figure, info, vs_baseline
from workload import Config, Scratch, median, tree_cpu_seconds

log = logging.getLogger("bench")

SET_LOGS = 1000
SPARK_MIN_RATIO = 0.8


def _records(n: int) -> list[dict[str, Any]]:
    return [{"op": "put", "key": i, "value": {"name": f"user-{i}", "n": i}} for i in range(n)]


def _nothing(emit: Callable[[Any], None]) -> None:
    pass


def _write(s: Scratch, n: int) -> tuple[str, str]:
    """``n`` records as one log and spread evenly over ``SET_LOGS`` logs of a set."""
    import persistlog

    recs = _records(n)
    one = s.fresh("logset-one")
    lg = persistlog.open(one, _nothing, rotate_bytes=None)
    for i in range(0, n, 4096):
        lg.update_many(recs[i : i + 4096])
    lg.close()
    root = s.fresh("logset-set")
    per = -(-n // SET_LOGS)
    with persistlog.LogSet(root, rotate_bytes=None) as logset:
        for k in range(SET_LOGS):
            lg = logset.open(f"queue/{k}", _nothing)
            lg.update_many(recs[k * per : (k + 1) * per])
    return one, root


def spark(cfg: Config, s: Scratch) -> Sequence[Figure]:
    from spark_stream import _spark

    import spark_replay

    n = 100_000 if cfg.quick else 300_000
    one, root = _write(s, n)
    session = _spark(s)
    spark_replay.register(session)

    def read(url: str) -> Callable[[], None]:
        return lambda: session.read.format("persistlog").load(url).write.format("noop").mode("overwrite").save()

    contenders = {"set": read(root), "one": read(one)}
    for _ in range(2):
        for run in contenders.values():
            run()  # warm up: the executors' Python workers, the JVM's JIT
    times: dict[str, list[float]] = {name: [] for name in contenders}
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    # Twice the usual repeats, alternately and in turn first: each read is short, and the
    # machine is shared.
    for i in range(2 * cfg.repeats):
        for name, run in (contenders.items() if i % 2 == 0 else reversed(contenders.items())):
            c0, t0 = tree_cpu_seconds(), time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(tree_cpu_seconds() - c0)
    for url in (root, one):
        assert session.read.format("persistlog").load(url).count() == n, url
    python = _python_seconds(root, one, cfg.repeats)
    set_rate, one_rate = n / min(times["set"]), n / min(times["one"])
    extra = (median(cpu["set"]) - median(cpu["one"])) / SET_LOGS
    raw = {"records": n, "logs": SET_LOGS, "seconds": times, "cpu_seconds": cpu, "python_seconds": python}
    return [
        vs_baseline(f"Spark over a set of {SET_LOGS} logs", "logset", set_rate, one_rate,
                    "the same records in one log", "rec/s", SPARK_MIN_RATIO, raw),
        info(f"  the same, per CPU second (median of {len(cpu['set'])})", "logset", n / median(cpu["set"]),
             "rec/CPU-s", n / median(cpu["one"]), "one log, per CPU second"),
        info("  CPU per log beyond the one log's (process tree)", "logset", extra * 1e6, "us"),
        info("    of it planning on the driver (Python)", "logset", python["plan"] / SET_LOGS * 1e6, "us"),
        info("    of it reading on the executors (Python)", "logset",
             (python["read set"] - python["read one"]) / SET_LOGS * 1e6, "us"),
    ]


def _python_seconds(root: str, one: str, repeats: int) -> dict[str, float]:
    """The Python of a read without Spark, in this process (CPU time, best of ``repeats``
    interleaved runs): the set's planning, and the set's and the one log's partitions read
    as the executors read them. What is left of the difference is the JVM's."""
    from dataclasses import replace

    from spark_replay._options import ReadOptions
    from spark_replay._source import PersistLogReader

    readers = {
        name: PersistLogReader(replace(ReadOptions.parse({"path": url}), log_set=url == root))
        for name, url in (("set", root), ("one", one))
    }
    parts = {name: reader.partitions() for name, reader in readers.items()}

    def read(name: str) -> Callable[[], None]:
        def run() -> None:
            for part in parts[name]:
                for _batch in readers[name].read(part):
                    pass
        return run

    runs = {"plan": lambda: readers["set"].partitions(), "read set": read("set"), "read one": read("one")}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats + 1):
        for name, run in runs.items():
            c0 = time.process_time()
            run()
            best[name] = min(best[name], time.process_time() - c0)
    return best


def _open_close_set(s: Scratch, n: int) -> tuple[float, float, float]:
    import persistlog

    root = s.fresh("logset-open")
    t0 = time.perf_counter()
    logset = persistlog.LogSet(root)
    for k in range(n):
        logset.open(f"queue/{k}", _nothing)
    opened = time.perf_counter() - t0
    t0 = time.perf_counter()
    logset.close()
    closed = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert sum(1 for _ in persistlog.LogSet(root).keys()) == n
    return opened, closed, time.perf_counter() - t0


def _open_close_plain(s: Scratch, n: int) -> tuple[float, float]:
    import persistlog

    flat = s.fresh("logset-flat")
    os.makedirs(flat)
    t0 = time.perf_counter()
    logs = [persistlog.open(os.path.join(flat, f"q{k}"), _nothing) for k in range(n)]
    opened = time.perf_counter() - t0
    t0 = time.perf_counter()
    for lg in logs:
        lg.close()
    return opened, time.perf_counter() - t0


def open_close(cfg: Config, s: Scratch) -> Sequence[Figure]:
    import persistlog

    n = 300 if cfg.quick else SET_LOGS
    runs: dict[str, list[tuple[float, ...]]] = {"set": [], "plain": []}
    for _ in range(max(1, cfg.repeats - 2)):
        runs["set"].append(_open_close_set(s, n))
        runs["plain"].append(_open_close_plain(s, n))
    opened, closed, listed = (min(r[i] for r in runs["set"]) for i in range(3))
    plain_opened, plain_closed = (min(r[i] for r in runs["plain"]) for i in range(2))
    threads_before = threading.active_count()
    logset = persistlog.LogSet(s.fresh("logset-threads"))
    for k in range(50):
        logset.open(f"queue/{k}", _nothing)
    threads = (threading.active_count() - threads_before) / 50
    logset.close()
    raw = {"logs": n, "runs": runs}
    return [
        info(f"LogSet.open of {n} logs, held open", "logset", n / opened, "logs/s", n / plain_opened,
             "persistlog.open, flat dirs", raw),
        info(f"LogSet.close of {n} open logs", "logset", n / closed, "logs/s", n / plain_closed,
             "Log.close one by one"),
        info(f"  LogSet.keys() of {n} logs", "logset", listed * 1e3, "ms"),
        info("  threads per open Log", "logset", threads, ""),
    ]


BENCHMARKS: dict[str, Callable[[Config, Scratch], Sequence[Figure]]] = {
    "spark": spark,
    "open_close": open_close,
}


if __name__ == "__main__":
    import sys

    from figures import table
    from workload import scratch

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    cfg = Config.quick_run() if "--quick" in sys.argv else Config()
    with scratch() as sc:
        figures = [f for bench in BENCHMARKS.values() for f in bench(cfg, sc)]
    print(table(figures))
    os._exit(0)  # the JVM's non-daemon threads must not hold the exit
