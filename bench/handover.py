"""Handing a log over between live processes (``open(..., handover=True)``).

``time``: a ``ResourceStore`` of 10,000 live keys, written by a child process under a
steady load (flush mode, about 500 updates/s), is asked for by the bench process; the
figure is the time from the new writer's ``ResourceStore.open(..., handover=True)`` call
to its first acknowledged update (the old writer notices the request, seals a fresh
snapshot, lets go; the new one restores that snapshot and opens without an enumeration).
Local disk (target <= 1 s) and S3 through moto (target <= 2 s), three rounds each, the
slowest reported. ``soak``: ``examples/rolling_deploy.py`` replacing a service under load
100 times (20 with ``--quick``), every acknowledged increment restored, none counted twice.

Run as a script it is the old writer (``--old URL --keys N [--options JSON]``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import persistlog

from figures import Figure, at_most, info
from s3 import shared_moto
from workload import Config, Scratch

log = logging.getLogger("bench")

AREA = "handover"
KEYS = 10_000
ROUNDS = 3
PACE = 500.0  # the old writer's updates per second
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _old_writer(url: str, keys: int, options: dict[str, Any] | None) -> None:
    """The live writer: fill ``keys`` keys if the store is new, then update them at
    ``PACE`` a second until handed over."""
    store = persistlog.ResourceStore.open(url, durability="flush", handover=True, storage_options=options)
    if len(store) < keys:
        store.update({f"k{i}": {"n": i, "name": "x" * 32} for i in range(keys)})
    print("ready", flush=True)
    i = 0
    try:
        while True:
            store[f"k{i % keys}"] = {"n": i, "name": "x" * 32}
            i += 1
            time.sleep(1 / PACE)
    except persistlog.HandedOver:
        print(f"handed over after {i} updates", flush=True)
    store.close()


def _round(url: str, options: dict[str, Any] | None) -> float:
    """One handover: a child writer under load, taken over by this process; seconds from
    the request to the first acknowledged update."""
    cmd = [sys.executable, os.path.abspath(__file__), "--old", url, "--keys", str(KEYS)]
    if options is not None:
        cmd += ["--options", json.dumps(options)]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO})
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the old writer did not start ({child.wait()})")
        time.sleep(0.5)  # under load for a while
        began = time.perf_counter()
        store = persistlog.ResourceStore.open(url, durability="flush", handover=True, storage_options=options)
        store["probe"] = 1
        took = time.perf_counter() - began
        if len(store) != KEYS + 1:
            raise RuntimeError(f"the new writer holds {len(store)} keys, expected {KEYS + 1}")
        store.close()
        if child.wait(60) != 0:
            raise RuntimeError(f"the old writer exited with {child.returncode}")
        return took
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def handover_time(cfg: Config, s: Scratch) -> list[Figure]:
    figures: list[Figure] = []
    for where in ("local", "s3"):
        if where == "s3":
            moto = shared_moto(cfg, s)
            url, options, limit = moto.url("handover"), moto.options, 2.0
        else:
            url, options, limit = s.fresh("handover"), None, 1.0
        log.info("handover, %s: %d keys, %d rounds", where, KEYS, ROUNDS)
        times = [_round(url, options) for _ in range(ROUNDS)]
        figures.append(at_most(f"{where}: request to first acknowledged update, {KEYS // 1000}k keys (slowest)",
                               AREA, max(times), limit, "s", raw={"seconds": times}))
    return figures


def soak(cfg: Config, s: Scratch) -> list[Figure]:
    generations = 20 if cfg.quick else 100
    log.info("handover soak: examples/rolling_deploy.py, %d generations", generations)
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", "rolling_deploy.py"), s.fresh("rolling"),
         "--generations", str(generations), "--seconds", "0.3"],
        capture_output=True, text=True, timeout=60 + 10 * generations, env={**os.environ, "PYTHONPATH": REPO},
    )
    m = re.search(r"(\d+) acknowledged increments over \d+ generations; lost (\d+), counted twice (\d+)", proc.stdout)
    if proc.returncode not in (0, 1) or m is None:
        raise RuntimeError(f"rolling_deploy.py failed ({proc.returncode}): {proc.stderr[-2000:]}")
    ready = [float(x) for x in re.findall(r"ready (\d+) ms after asking", proc.stdout)]
    raw = {"generations": generations, "acknowledged": int(m.group(1)), "ready_ms": ready}
    return [
        at_most(f"soak: {generations} handovers under load, acknowledged updates lost", AREA,
                int(m.group(2)) + int(m.group(3)), 0, "", raw=raw),
        info("  acknowledged increments over the soak", AREA, int(m.group(1)), ""),
        info("  slowest handover of the soak (process start-up excluded)", AREA, max(ready) / 1000, "s"),
    ]


BENCHMARKS: dict[str, Callable[[Config, Scratch], Sequence[Figure]]] = {
    "time": handover_time,
    "soak": soak,
}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--old", metavar="URL", required=True)
    parser.add_argument("--keys", type=int, default=KEYS)
    parser.add_argument("--options", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    _old_writer(args.old, args.keys, json.loads(args.options) if args.options else None)
