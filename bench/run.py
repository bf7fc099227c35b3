"""persistlog's benchmark harness: ``make bench`` (full, ~30 min) or ``bench/run.py --quick``.

Every figure is a ratio (or a limit) measured in this process, in this run, against its
baseline, so that a slower or busier machine moves both sides alike. The table goes to
stdout; progress goes to stderr through ``logging``; raw results go to ``bench/results/``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import async_log
import consumers
import core
import follower
import handover
import logset
import many_logs
import positions
import queues
import s3
import shapes
import shared_values
import spark_stream
from figures import Figure, info, save, table, vs_baseline
from workload import Config, Scratch, scratch

log = logging.getLogger("bench")

Benchmark = Callable[[Config, Scratch], Sequence[Figure]]

#: spark_bench.py's own target: the persistlog data source at least as fast as Spark's JSON reader.
SPARK_MIN_RATIO = 1.0

GROUPS: dict[str, dict[str, Benchmark]] = {
    "core": core.BENCHMARKS,
    "s3": s3.BENCHMARKS,
    "follower": follower.BENCHMARKS,
    "handover": handover.BENCHMARKS,
    "consumers": consumers.BENCHMARKS,
    "shapes": shapes.BENCHMARKS,
    "asyncio": async_log.BENCHMARKS,
    # logset.spark runs with the Spark benchmarks (full runs, --spark, --only logset).
    "logset": logset.BENCHMARKS,
    "many": many_logs.BENCHMARKS,
    "positions": positions.BENCHMARKS,
    "queues": queues.BENCHMARKS,
    "shared": shared_values.BENCHMARKS,
    # Named spark.*: run with the other Spark benchmark (not in --quick unless --spark).
    "spark": spark_stream.BENCHMARKS,
}


def spark_benchmark() -> Benchmark | None:
    """``bench/spark_bench.py``'s ``run(n_records) -> dict``, if that module is there."""
    try:
        import spark_bench  # type: ignore[import-not-found,unused-ignore]
    except ImportError as e:
        if getattr(e, "name", None) != "spark_bench":
            log.warning("bench/spark_bench.py does not import: %s", e)
        return None
    run: Callable[[int], dict[str, Any]] = spark_bench.run

    def spark(cfg: Config, s: Scratch) -> list[Figure]:
        n = 50_000 if cfg.quick else 200_000
        log.info("spark: spark_bench.run(%d)", n)
        result = run(n)
        figures: list[Figure] = []
        rows, json_rows = result.get("persistlog_rows_per_s"), result.get("json_rows_per_s")
        if isinstance(rows, (int, float)) and isinstance(json_rows, (int, float)):
            figures.append(vs_baseline("Spark replay (persistlog source)", "spark", rows, json_rows,
                                       "Spark JSON reader", "rec/s", SPARK_MIN_RATIO))
        shown = {"persistlog_rows_per_s", "json_rows_per_s", "ratio_vs_json"} if figures else set()
        figures += [
            info(f"  spark: {key}", "spark", float(value), "")
            for key, value in result.items()
            if key not in shown and isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
        if figures:
            figures[0].raw = dict(result)
        return figures

    return spark


def _matches(wanted: str, name: str) -> bool:
    group, short = name.split(".")
    if wanted in GROUPS or wanted == "spark":
        return wanted == group  # a group's name is not also a benchmark of another group
    return wanted in (name, short)


def selected(only: list[str], with_spark: bool) -> list[tuple[str, Benchmark]]:
    """``(group.name, benchmark)`` pairs to run, in order; ``only`` names groups or
    benchmarks (``core``, ``core.restore`` or just ``restore``)."""
    everything = [(f"{g}.{name}", bench) for g, benches in GROUPS.items() for name, bench in benches.items()]
    spark = spark_benchmark()
    if spark is not None:
        everything.append(("spark.run", spark))
    if not only:
        return [(name, b) for name, b in everything if with_spark or "spark" not in name.split(".")]
    unknown = [o for o in only if not any(_matches(o, name) for name, _ in everything)]
    if unknown:
        known = sorted({name.split(".")[0] for name, _ in everything} | {name for name, _ in everything})
        raise SystemExit(f"unknown benchmark(s) {unknown}; known: {', '.join(known)}")
    return [(name, b) for name, b in everything if any(_matches(o, name) for o in only)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller workloads (~6 minutes)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this group or benchmark (repeatable, or comma-separated)")
    parser.add_argument("--restore-gib", type=float, default=None,
                        help="size of the log for the restore-memory figure (default 2, 0.25 with --quick)")
    parser.add_argument("--idle-seconds", type=float, default=None,
                        help="how long the idle S3 log is watched for LIST calls (default 60, 10 with --quick)")
    parser.add_argument("--shapes", default=None, metavar="LIST",
                        help=f"record shapes of the shapes group, comma-separated (default: {','.join(shapes.SHAPES)})")
    parser.add_argument("--shape-records", type=int, default=None,
                        help="records per shape (default 500000, 100000 with --quick)")
    parser.add_argument("--many-logs", type=int, default=None,
                        help="logs held open at once by the many group (default 10000, 1000 with --quick)")
    parser.add_argument("--queues", type=int, default=None,
                        help="queues of the queues group (default 10000, 1000 with --quick)")
    parser.add_argument("--spark", action=argparse.BooleanOptionalAction, default=None,
                        help="run bench/spark_bench.py if present (default: yes, except with --quick)")
    parser.add_argument("--moto-in-process", action="store_true",
                        help="run the moto S3 server as a thread of this process instead of a child process")
    parser.add_argument("--tmpdir", default=None, help="where scratch logs go (default: the system's)")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results/*.json")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    for noisy in ("persistlog", "destinations", "werkzeug", "botocore", "s3fs", "aiobotocore", "moto"):
        logging.getLogger(noisy).setLevel(logging.WARNING if not args.verbose else logging.INFO)

    cfg = Config.quick_run() if args.quick else Config()
    if args.restore_gib is not None:
        cfg.restore_gib = args.restore_gib
    if args.idle_seconds is not None:
        cfg.idle_seconds = args.idle_seconds
    if args.shapes is not None:
        unknown = sorted(set(args.shapes.split(",")) - set(shapes.SHAPES))
        if unknown:
            parser.error(f"unknown shape(s) {unknown}; known: {', '.join(shapes.SHAPES)}")
        cfg.shapes = tuple(args.shapes.split(","))
    if args.shape_records is not None:
        cfg.shape_records = args.shape_records
    if args.many_logs is not None:
        cfg.many_logs = args.many_logs
    if args.queues is not None:
        cfg.queues = args.queues
    cfg.tmpdir = args.tmpdir
    cfg.moto_in_process = args.moto_in_process
    only = [o for entry in args.only for o in entry.split(",") if o]
    with_spark = args.spark if args.spark is not None else not args.quick
    benches = selected(only, with_spark)

    log.info("running %s (%s)", ", ".join(n for n, _ in benches), "quick" if cfg.quick else "full")
    figures: list[Figure] = []
    failed: list[str] = []
    began = time.perf_counter()
    with scratch(cfg.tmpdir) as s:
        for name, bench in benches:
            t0 = time.perf_counter()
            try:
                figures.extend(bench(cfg, s))
            except Exception:
                log.error("benchmark %s failed:\n%s", name, traceback.format_exc())
                failed.append(name)
            log.info("%s done in %.1fs", name, time.perf_counter() - t0)
    seconds = time.perf_counter() - began

    print()
    print(table(figures))
    missed = [f.name for f in figures if f.passed is False]
    print()
    print(f"{len(figures)} figures in {seconds:.0f}s ({'quick' if cfg.quick else 'full'} run); "
          f"{sum(f.passed is True for f in figures)} targets met, {len(missed)} missed"
          + (f"; benchmarks that failed to run: {', '.join(failed)}" if failed else ""))
    print("Shared 2-core machine: figures are noisy; compare ratios, not absolute rates.")
    if not args.no_save:
        options = {k: v for k, v in vars(cfg).items()} | {"only": only, "spark": with_spark}
        path = save(figures, options, seconds)
        print(f"raw results: {path}")
    # Missed targets are findings, not errors; a benchmark that could not run is an error.
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
