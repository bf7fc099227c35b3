"""How far a follower trails its writer, and how fast it catches up.

Lag is measured across processes: a writer child (this module run as a script) calls
``update(sync=True)`` at a steady pace and notes, on the machine-wide monotonic clock, when
each call returned; the follower, in the bench process, notes when it applied each record.
Lag = applied - returned, per record (negative when the follower saw the bytes before the
writer's sync returned).
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
from typing import Any

import persistlog

import s3
from figures import Figure, at_most, info, vs_baseline
from workload import (
    Config,
    Scratch,
    chunks,
    interleaved,
    latency_summary,
    median,
    no_enumeration,
    request_counts,
    shared_now,
    small_records,
    timed,
)

log = logging.getLogger("bench")

AREA = "follower"
S3_LAG_MARGIN_MS = 500.0


def _lag(url: str, cfg: Config, storage_options: dict[str, Any] | None, sync: bool) -> dict[str, Any]:
    """Lag of a follower (default poll interval) behind a writer child, per record."""
    n = cfg.lag_samples
    applied: dict[int, float] = {}
    done = threading.Event()

    def replay(r: Any) -> None:
        applied[r["key"]] = shared_now()
        if len(applied) >= n:
            done.set()

    # Started before the writer child makes the log: it waits for one.
    follower = persistlog.follow(url, replay=replay, storage_options=storage_options, wait_for_log=True)
    requests_before = request_counts(follower.dest)
    follower.start()
    try:
        cmd = [sys.executable, os.path.abspath(__file__), "--writer", url, "--samples", str(n),
               "--interval", str(cfg.lag_interval)]
        if storage_options is not None:
            cmd += ["--storage-options", json.dumps(storage_options)]
        if not sync:
            cmd.append("--buffered")
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=n * cfg.lag_interval + 120)
        if proc.returncode != 0:
            raise RuntimeError(f"writer child failed ({proc.returncode}): {proc.stderr[-2000:]}")
        writer = json.loads(proc.stdout.strip().splitlines()[-1])
        if not done.wait(30):
            raise RuntimeError(f"follower applied {len(applied)} of {n} records ({follower.error!r})")
    finally:
        follower.stop()
    follower_requests = {k: v - requests_before.get(k, 0) for k, v in request_counts(follower.dest).items()}
    lags = [applied[i] - t for i, t in enumerate(writer["returned"])]
    tenth = max(1, n // 10)
    return {
        "samples": n,
        "interval": cfg.lag_interval,
        "sync": sync,
        "poll_interval": follower.poll_interval,
        "dest_default_flush_interval": writer["flush_interval"],
        "polls": follower.polls,
        "follower_requests": follower_requests,
        "writer_requests": writer["requests"],
        **latency_summary(lags),
        # A follower slower than its writer falls further behind as the run goes on.
        "p50_ms_first_tenth": latency_summary(lags[:tenth])["p50_ms"],
        "p50_ms_last_tenth": latency_summary(lags[-tenth:])["p50_ms"],
    }


def lag_local(cfg: Config, s: Scratch) -> list[Figure]:
    log.info("follower lag, local directory: %d update(sync=True) every %.0f ms", cfg.lag_samples, cfg.lag_interval * 1e3)
    r = _lag(s.fresh("log-follow"), cfg, None, sync=True)
    return [
        at_most("follower lag, local: p50", AREA, r["p50_ms"], 20.0, "ms", raw=r),
        at_most("follower lag, local: p99", AREA, r["p99_ms"], 100.0, "ms"),
        info("  follower lag, local: max", AREA, r["max_ms"], "ms"),
    ]


def lag_s3(cfg: Config, s: Scratch) -> list[Figure]:
    moto = s3.shared_moto(cfg, s)
    log.info("follower lag, S3: %d update(sync=True) every %.0f ms", cfg.lag_samples, cfg.lag_interval * 1e3)
    synced = _lag(moto.url("follow"), cfg, moto.options, sync=True)
    log.info("follower lag, S3: %d buffered update() every %.0f ms", cfg.lag_samples, cfg.lag_interval * 1e3)
    buffered = _lag(moto.url("follow-buffered"), cfg, moto.options, sync=False)
    limit = synced["dest_default_flush_interval"] * 1e3 + S3_LAG_MARGIN_MS
    return [
        at_most("follower lag, S3 sync=True: p99", AREA, synced["p99_ms"], limit, "ms", raw={"sync": synced, "buffered": buffered}),
        info("  follower lag, S3 sync=True: p50", AREA, synced["p50_ms"], "ms"),
        info("  follower lag, S3 buffered: p99", AREA, buffered["p99_ms"], "ms", synced["dest_default_flush_interval"] * 1e3, "flush interval"),
        info("  S3 sync=True lag p50, last tenth of the run", AREA, synced["p50_ms_last_tenth"], "ms",
             synced["p50_ms_first_tenth"], "first tenth"),
        info("  follower requests per segment PUT", AREA,
             round(sum(synced["follower_requests"].values()) / max(1, synced["writer_requests"].get("PUT", 0)), 2), "req"),
    ]


def catch_up(cfg: Config, s: Scratch) -> list[Figure]:
    """Following a finished log from scratch against restoring it, into the same dict."""
    records = small_records(cfg.records)
    n = len(records)
    url = s.fresh("log-catchup")
    lg = persistlog.open(url, no_enumeration)
    for b in chunks(records, 1000):
        lg.update_many(b)
    lg.close()
    del records

    def per_record() -> tuple[dict[Any, Any], Callable[[Any], None]]:
        state: dict[Any, Any] = {}

        def replay(r: Any) -> None:
            state[r["key"]] = r["value"]

        return state, replay

    def per_batch() -> tuple[dict[Any, Any], Callable[[list[Any]], None]]:
        state: dict[Any, Any] = {}

        def replay_batch(rs: list[Any]) -> None:
            for r in rs:
                state[r["key"]] = r["value"]

        return state, replay_batch

    def follow(kind: str) -> float:
        state, fn = per_record() if kind == "replay" else per_batch()
        f = persistlog.follow(url, **{kind: fn})
        start = time.perf_counter()
        applied = 0
        while applied < n:
            applied += f.poll()
        seconds = time.perf_counter() - start
        f.stop()
        if len(state) != n:
            raise RuntimeError(f"follower rebuilt {len(state)} keys, expected {n}")
        return seconds

    def restore(kind: str) -> float:
        state, fn = per_record() if kind == "replay" else per_batch()
        seconds = timed(lambda: persistlog.restore(url, **{kind: fn}))
        if len(state) != n:
            raise RuntimeError(f"restore rebuilt {len(state)} keys, expected {n}")
        return seconds

    log.info("follower catch-up: %d records, %d rounds", n, cfg.repeats)
    times = interleaved(
        {
            "restore replay": lambda: restore("replay"),
            "follow replay": lambda: follow("replay"),
            "restore replay_batch": lambda: restore("replay_batch"),
            "follow replay_batch": lambda: follow("replay_batch"),
        },
        cfg.repeats,
    )
    rate = {name: n / median(t) for name, t in times.items()}
    raw = {"records": n, "seconds": times, "rates": rate}
    return [
        vs_baseline("follower catch-up, replay=", AREA, rate["follow replay"], rate["restore replay"], "restore", "rec/s", 0.9, raw),
        vs_baseline("follower catch-up, replay_batch=", AREA, rate["follow replay_batch"], rate["restore replay_batch"],
                    "restore", "rec/s", 0.9),
    ]


# S3 Standard list prices per 1,000 requests (us-east-1): LIST as PUT, HEAD as GET.
PRICE_PER_1000 = {"LIST": 0.005, "PUT": 0.005, "HEAD": 0.0004, "GET": 0.0004}
SECONDS_PER_YEAR = 365 * 86_400


def idle_s3(cfg: Config, s: Scratch) -> list[Figure]:
    """An idle follower of an S3 log (its writer open, nothing new): requests per poll,
    counted by the follower's destination (every attempt it sends), and their price for
    100 followers over a year."""
    moto = s3.shared_moto(cfg, s)
    url = moto.url("follow-idle")
    lg = persistlog.open(url, no_enumeration, storage_options=moto.options)
    try:
        for i in range(200):
            lg.update({"i": i})
        lg.sync()
        lg.rotate()
        lg.update({"i": -1})
        lg.sync()
        # An s3fs instance of its own: the writer's requests are not the follower's.
        follower = persistlog.follow(url, lambda r: None, storage_options={**moto.options, "skip_instance_cache": True})
        while follower.poll():
            pass
        seconds = 5.0 if cfg.quick else 30.0
        log.info("follower idle on S3: %.0f s at the default poll interval (%.2f s)", seconds, follower.poll_interval)
        before, polls = request_counts(follower.dest), follower.polls
        follower.start()
        time.sleep(seconds)
        follower.stop()
        sent = {k: v - before.get(k, 0) for k, v in request_counts(follower.dest).items()}
        polls = follower.polls - polls
    finally:
        lg.close()
    per_poll = sum(sent.values()) / max(1, polls)
    per_year = sum(n * PRICE_PER_1000.get(k, 0.0) / 1000 for k, n in sent.items()) / seconds * SECONDS_PER_YEAR * 100
    raw = {"seconds": seconds, "polls": polls, "requests": sent, "poll_interval": follower.poll_interval}
    return [
        at_most("idle S3 follower: LIST per poll", AREA, sent.get("LIST", 0) / max(1, polls), 0.0, "req", raw=raw),
        at_most("idle S3 follower: requests per poll", AREA, per_poll, 2.0, "req"),
        info(f"  idle S3 followers: 100 for a year, {polls} polls in {seconds:.0f} s", AREA, per_year, "$"),
    ]


BENCHMARKS: dict[str, Callable[[Config, Scratch], Sequence[Figure]]] = {
    "idle_s3": idle_s3,
    "lag_local": lag_local,
    "lag_s3": lag_s3,
    "catchup": catch_up,
}


def _writer(url: str, samples: int, interval: float, storage_options: dict[str, Any] | None, sync: bool) -> None:
    """The writer child: ``samples`` updates, one every ``interval`` seconds; prints when
    each returned (shared clock) as JSON."""
    lg = persistlog.open(url, no_enumeration, storage_options=storage_options)
    returned: list[float] = []
    try:
        time.sleep(0.5)  # let the follower find the new log before the clock starts
        start = time.perf_counter()
        for i in range(samples):
            due = start + i * interval
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            lg.update({"op": "put", "key": i, "value": "v" * 16}, sync=sync)
            returned.append(shared_now())
        flush_interval = lg.dest.default_flush_interval
    finally:
        lg.close()
    print(json.dumps({"returned": returned, "flush_interval": flush_interval, "requests": request_counts(lg.dest)}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the writer child of the follower-lag benchmarks")
    parser.add_argument("--writer", metavar="URL", required=True)
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--storage-options", type=json.loads, default=None)
    parser.add_argument("--buffered", action="store_true", help="update() without sync=True")
    a = parser.parse_args()
    _writer(a.writer, a.samples, a.interval, a.storage_options, sync=not a.buffered)
