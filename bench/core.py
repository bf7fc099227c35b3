"""The local write path, group commit, restore, rotation and bytes on disk.

Run as a script only as the child of :func:`restore_memory` (``--rss-child URL``), which
restores a big log in a fresh process so that its peak RSS is the restore's alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import persistlog

import baselines
from figures import Figure, at_least, at_most, info, vs_baseline
from workload import (
    SMALL_RECORD_SHAPE,
    Config,
    Scratch,
    chunks,
    cpu_timed,
    dir_bytes,
    interleaved,
    latency_summary,
    median,
    no_enumeration,
    request_counts,
    small_records,
    timed,
)

log = logging.getLogger("bench")

AREA = "core"
MANY_BATCH = 1000
MiB = 1024 * 1024


#: A fixed bench key: encryption on vs off costs the same whatever the key.
_BENCH_KEYS = {"bench": bytes(range(32))}


def _persistlog_run(path: str, body: Callable[[persistlog.Log], None], **options: Any) -> float:
    """Open a fresh log at ``path`` (not timed), time ``body(log)``, close (not timed)."""
    lg = persistlog.open(path, no_enumeration, **options)
    try:
        return timed(lambda: body(lg))
    finally:
        lg.close()


# -- write throughput ----------------------------------------------------------------------


def write_throughput(cfg: Config, s: Scratch) -> list[Figure]:
    """update() one by one and update_many() in 1000s against the naive loop, sqlite3 and
    JSON lines, each ending with its data durable."""
    records = small_records(cfg.records)
    batches = chunks(records, MANY_BATCH)
    n = len(records)

    def updates(lg: persistlog.Log) -> None:
        update = lg.update
        for r in records:
            update(r)
        lg.sync()

    def many(lg: persistlog.Log) -> None:
        update_many = lg.update_many
        for b in batches:
            update_many(b)
        lg.sync()

    def baseline(write: Callable[[Sequence[Any], str], None], name: str) -> Callable[[], float]:
        def run() -> float:
            path = s.fresh(name)  # removing the last run's file is not timed
            return timed(lambda: write(records, path))

        return run

    log.info("write throughput: %d records %s, %d rounds", n, SMALL_RECORD_SHAPE, cfg.repeats)
    times = interleaved(
        {
            "naive": baseline(baselines.naive_write, "naive.bin"),
            "update": lambda: _persistlog_run(s.fresh("log-update"), updates),
            "update_unchained": lambda: _persistlog_run(s.fresh("log-update-unchained"), updates, hash_chain=False),
            "update_encrypted": lambda: _persistlog_run(
                s.fresh("log-update-encrypted"), updates, key_provider=_BENCH_KEYS.get, key_id="bench"
            ),
            "update_many": lambda: _persistlog_run(s.fresh("log-many"), many),
            "sqlite": baseline(baselines.sqlite_write, "kv.sqlite"),
            "jsonl": baseline(baselines.jsonl_write, "kv.jsonl"),
        },
        cfg.repeats,
    )
    rate = {name: n / median(t) for name, t in times.items()}
    raw = {"records": n, "record": SMALL_RECORD_SHAPE, "seconds": times, "rates": rate}
    return [
        vs_baseline("update() buffered, 1 thread", AREA, rate["update"], rate["naive"], "naive loop", "rec/s", 1.0, raw),
        vs_baseline(f"update_many() x{MANY_BATCH}", AREA, rate["update_many"], rate["naive"], "naive loop", "rec/s", 1.5),
        vs_baseline("update() with the hash chain", AREA, rate["update"], rate["update_unchained"],
                    "hash_chain=False", "rec/s", 0.95),
        vs_baseline("update() encrypted (AES-256-GCM)", AREA, rate["update_encrypted"], rate["update"],
                    "not encrypted", "rec/s", 0.85),
        info("sqlite3 executemany write (WAL)", AREA, rate["sqlite"], "rec/s", rate["naive"], "naive loop"),
        info("JSON lines write", AREA, rate["jsonl"], "rec/s", rate["naive"], "naive loop"),
    ]


# -- group commit ------------------------------------------------------------------------


def sync_rate(url: str, threads: int, seconds: float, **options: Any) -> dict[str, Any]:
    """``threads`` threads calling ``update(sync=True)`` for ``seconds`` on a log opened with
    ``options``; the rate, and how many records each sync (fsync or PUT) carried."""
    lg = persistlog.open(url, no_enumeration, **options)
    counts = [0] * threads
    stop = threading.Event()
    start = threading.Barrier(threads + 1)
    record = {"op": "put", "key": 0, "value": "v" * 16}

    def worker(i: int) -> None:
        update = lg.update
        start.wait()
        n = 0
        while not stop.is_set():
            update(record, sync=True)
            n += 1
        counts[i] = n

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    before = lg.stats()
    requests_before = request_counts(lg.dest)
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - began
    after = lg.stats()
    requests = {k: v - requests_before.get(k, 0) for k, v in request_counts(lg.dest).items()}
    lg.close()
    total = sum(counts)
    syncs = after["syncs"] - before["syncs"]
    return {
        "threads": threads,
        "records": total,
        "seconds": elapsed,
        "rate": total / elapsed,
        "syncs": syncs,
        "records_per_sync": total / max(1, syncs),
        "stats_records_per_sync": after["records_per_sync"],
        "requests": requests,
    }


def group_commit(cfg: Config, s: Scratch) -> list[Figure]:
    log.info("group commit: 1 and %d threads, %.1fs each", cfg.fsync_threads, cfg.fsync_seconds)
    one = sync_rate(s.fresh("log-fsync-1"), 1, cfg.fsync_seconds, durability="fsync")
    many = sync_rate(s.fresh("log-fsync-n"), cfg.fsync_threads, cfg.fsync_seconds, durability="fsync")
    return [
        vs_baseline(
            f"fsync mode, {cfg.fsync_threads} threads update(sync=True)", AREA, many["rate"], one["rate"],
            "1 thread", "rec/s", 20.0, {"one_thread": one, "threads": many},
        ),
        info(f"  records per fsync, {cfg.fsync_threads} threads", AREA, round(many["records_per_sync"], 2), "rec"),
    ]


# -- restore -------------------------------------------------------------------------------


def restore_speed(cfg: Config, s: Scratch) -> list[Figure]:
    """Restore into a dict (per record and per batch) against sqlite3 and JSON lines reading
    the same records back in order. The sqlite3 baseline stores each record as persistlog
    logs it (one CBOR blob per row); a table shredded into key and value columns, which
    decodes less per row, is reported beside it."""
    records = small_records(cfg.records)
    n = len(records)
    url = s.fresh("log-restore")
    unchained = s.fresh("log-restore-unchained")
    encrypted = s.fresh("log-restore-encrypted")
    keys: dict[str, Any] = {"key_provider": _BENCH_KEYS.get, "key_id": "bench"}
    for where, options in ((url, {}), (unchained, {"hash_chain": False}), (encrypted, keys)):
        lg = persistlog.open(where, no_enumeration, **options)
        for b in chunks(records, MANY_BATCH):
            lg.update_many(b)
        lg.close()
    baselines.sqlite_write(records, s.fresh("restore.sqlite"))
    baselines.sqlite_write_records(records, s.fresh("restore-records.sqlite"))
    baselines.jsonl_write(records, s.fresh("restore.jsonl"))
    del records

    def by_record() -> float:
        state: dict[Any, Any] = {}

        def replay(r: Any) -> None:
            state[r["key"]] = r["value"]

        return _restore_seconds(url, n, replay=replay)

    def by_record_unchained() -> float:
        state: dict[Any, Any] = {}

        def replay(r: Any) -> None:
            state[r["key"]] = r["value"]

        return _restore_seconds(unchained, n, replay=replay)

    def by_record_encrypted() -> float:
        state: dict[Any, Any] = {}

        def replay(r: Any) -> None:
            state[r["key"]] = r["value"]

        return _restore_seconds(encrypted, n, replay=replay, key_provider=_BENCH_KEYS.get)

    def by_batch() -> float:
        state: dict[Any, Any] = {}

        def replay_batch(rs: list[Any]) -> None:
            for r in rs:
                state[r["key"]] = r["value"]

        return _restore_seconds(url, n, replay_batch=replay_batch)

    log.info("restore: %d records, %d rounds", n, cfg.repeats)
    times = interleaved(
        {
            "replay": by_record,
            "replay_unchained": by_record_unchained,
            "replay_encrypted": by_record_encrypted,
            "replay_batch": by_batch,
            "sqlite": lambda: timed(lambda: baselines.sqlite_read_records(s.path("restore-records.sqlite"))),
            "sqlite_kv": lambda: timed(lambda: baselines.sqlite_read(s.path("restore.sqlite"))),
            "jsonl": lambda: timed(lambda: baselines.jsonl_read(s.path("restore.jsonl"))),
        },
        cfg.repeats,
    )
    rate = {name: n / median(t) for name, t in times.items()}
    raw = {"records": n, "seconds": times, "rates": rate}
    return [
        at_least("restore replay= into a dict", AREA, rate["replay"], 1e6, "rec/s", raw),
        vs_baseline("restore replay= vs sqlite3", AREA, rate["replay"], rate["sqlite"], "sqlite3", "rec/s", 1.5),
        vs_baseline("restore replay= with the hash chain", AREA, rate["replay"], rate["replay_unchained"],
                    "hash_chain=False", "rec/s", 0.95),
        vs_baseline("restore replay= encrypted (AES-256-GCM)", AREA, rate["replay_encrypted"], rate["replay"],
                    "not encrypted", "rec/s", 0.85),
        at_least("restore replay_batch= into a dict", AREA, rate["replay_batch"], 1e6, "rec/s"),
        vs_baseline("restore replay_batch= vs sqlite3", AREA, rate["replay_batch"], rate["sqlite"], "sqlite3", "rec/s", 1.5),
        info("restore replay= vs sqlite3 key/value columns", AREA, rate["replay"], "rec/s",
             rate["sqlite_kv"], "sqlite3 kv"),
        info("JSON lines read back", AREA, rate["jsonl"], "rec/s", rate["sqlite"], "sqlite3"),
        *_one_record_batches(cfg, s),
    ]


#: CPU per batch that a restore of one-record batches may cost (the target of the checks in C).
ONE_RECORD_BATCH_MS = 0.004


def _one_record_batches(cfg: Config, s: Scratch) -> list[Figure]:
    """Restore of a flush-mode log of one-record batches, where the cost per batch is all
    there is: the decoder's checks in C (the C accelerator's run of checked
    batches) against the Python checks alone, CPU time, the same log, interleaved."""
    from persistlog._format import decoder

    n = 20_000 if cfg.quick else 50_000
    url = s.fresh("log-restore-one-record-batches")
    lg = persistlog.open(url, no_enumeration, durability="flush")
    for i in range(n):
        lg.update({"op": "put", "key": i})
    lg.close()
    in_c = decoder._checked_batches

    def restore(checks: Any) -> Callable[[], float]:
        def run() -> float:
            decoder._checked_batches = checks
            try:
                result: list[persistlog.RestoreResult] = []
                seconds = cpu_timed(lambda: result.append(persistlog.restore(url, lambda r: None)))
            finally:
                decoder._checked_batches = in_c
            if result[0].records != n:
                raise RuntimeError(f"restore of {url} replayed {result[0].records} records, expected {n}")
            return seconds

        return run

    log.info("restore of one-record batches: %d batches, %d rounds", n, cfg.repeats)
    times = interleaved({"c": restore(in_c), "python": restore(None)}, cfg.repeats)
    rate = {name: n / median(t) for name, t in times.items()}  # records (and batches) per CPU second
    raw = {"batches": n, "cpu_seconds": times, "built": in_c is not None}
    return [
        vs_baseline("restore of one-record batches, CPU: checks in C", AREA, rate["c"], rate["python"],
                    "Python checks alone", "rec/s", 2.0, raw),
        at_most("  CPU per one-record batch restored", AREA, 1e3 / rate["c"], ONE_RECORD_BATCH_MS, "ms",
                1e3 / rate["python"], "Python checks alone"),
    ]


def _restore_seconds(url: str, expect: int, **replay: Any) -> float:
    result: list[persistlog.RestoreResult] = []
    seconds = timed(lambda: result.append(persistlog.restore(url, **replay)))
    if result[0].records != expect:
        raise RuntimeError(f"restore of {url} replayed {result[0].records} records, expected {expect}")
    return seconds


# -- rotation under load -------------------------------------------------------------------


class _Updater:
    """A thread calling ``update()`` until stopped, timing every call: flat out, or paced
    at ``rate`` calls per second (sleeping in between, as a service handling requests
    would)."""

    def __init__(self, lg: persistlog.Log, keys: int, rate: float | None = None) -> None:
        self.lg = lg
        self.keys = keys
        self.rate = rate
        self.latencies = array("d")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-updater")
        self.seconds = 0.0

    def _run(self) -> None:
        update = self.lg.update
        clock = time.perf_counter
        lat = self.latencies
        keys = self.keys
        interval = 1.0 / self.rate if self.rate else 0.0
        i = 0
        start = clock()
        while not self._stop.is_set():
            if interval:
                wait = start + i * interval - clock()
                if wait > 0:
                    time.sleep(wait)
            record = {"op": "put", "key": i % keys, "value": "u" * 16}
            t0 = clock()
            update(record)
            lat.append(clock() - t0)
            i += 1
        self.seconds = clock() - start

    def __enter__(self) -> _Updater:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


PACED_RATE = 20_000.0


def _rotation_run(lg: persistlog.Log, live: int, rate: float | None) -> dict[str, Any]:
    """update() latency for a second without rotation, then during ``rotate()``."""
    with _Updater(lg, live, rate) as quiet:
        time.sleep(1.0)
    with _Updater(lg, live, rate) as busy:
        rotate_seconds = timed(lambda: lg.rotate(wait=True))
    return {
        "rate": rate or "flat out",
        "rotate_seconds": rotate_seconds,
        "last_rotation": lg.stats()["last_rotation"],
        "updates_during_rotation": len(busy.latencies),
        "update_rate_during_rotation": len(busy.latencies) / busy.seconds,
        "update_rate_without_rotation": len(quiet.latencies) / quiet.seconds,
        "during_rotation": latency_summary(busy.latencies),
        "without_rotation": latency_summary(quiet.latencies),
    }


def rotation_latency(cfg: Config, s: Scratch) -> list[Figure]:
    """update() latency in one thread while rotate() enumerates ``live_resources`` records,
    with the updater paced at 20k/s (the target) and flat out."""
    n = cfg.live_resources
    state: dict[int, str] = {}

    def enumerate_all(emit: Callable[[Any], None]) -> None:
        for k, v in state.items():
            emit({"op": "put", "key": k, "value": v})

    lg = persistlog.open(s.fresh("log-rotation"), enumerate_all, rotate_bytes=None)
    state.update((i, "v" * 16) for i in range(n))
    try:
        log.info("rotation: update() latency without, then during, an enumeration of %d resources (paced %.0f/s)", n, PACED_RATE)
        paced = _rotation_run(lg, n, PACED_RATE)
        log.info("rotation: the same with the updater flat out")
        flat = _rotation_run(lg, n, None)
    finally:
        lg.close()
    raw = {"live_resources": n, "paced": paced, "flat_out": flat}
    p, f = paced["during_rotation"], flat["during_rotation"]
    pq, fq = paced["without_rotation"], flat["without_rotation"]
    return [
        at_most(f"update() p99 during rotation, {n // 1000}k live, {PACED_RATE / 1000:.0f}k/s", AREA, p["p99_ms"], 5.0, "ms",
                pq["p99_ms"], "no rotation", raw),
        info("  the same, p99.9", AREA, p["p999_ms"], "ms", pq["p999_ms"], "no rotation"),
        info("  rotate() wall time, paced updater", AREA, paced["rotate_seconds"], "s"),
        info("  update() p99 during rotation, flat out", AREA, f["p99_ms"], "ms", fq["p99_ms"], "no rotation"),
        info("  the same, p99.9", AREA, f["p999_ms"], "ms", fq["p999_ms"], "no rotation"),
        info("  rotate() wall time, flat-out updater", AREA, flat["rotate_seconds"], "s"),
        info("  updates during rotation, flat out", AREA, flat["update_rate_during_rotation"], "rec/s",
             flat["update_rate_without_rotation"], "no rotation"),
    ]


# -- the enumeration's cost -----------------------------------------------------------------

ENUM_CHUNK = 1000


def _go_record(i: int) -> dict[str, Any]:
    """The Go original's nested record, as a ResourceStore-style put."""
    return {"op": "put", "key": i, "value": {"name": "n" * 32, "n": i}}


def enumeration_cost(cfg: Config, s: Scratch) -> list[Figure]:
    """CPU per record of a rotation's enumeration (``rotate()`` over live resources emitting
    one record each: ``emit`` per record, and ``emit.many`` per chunk of 1,000) against
    ``update_many(1000)`` of the same records, and ``ResourceStore.close(rotate=True)``'s
    CPU per key; interleaved runs, the best of each."""
    n = max(cfg.live_resources // 2, 10_000)
    records = [_go_record(i) for i in range(n)]

    def update_many_run() -> float:
        lg = persistlog.open(s.fresh("enum-update-many"), no_enumeration, rotate_bytes=None)
        try:
            return cpu_timed(lambda: [lg.update_many(c) for c in chunks(records, ENUM_CHUNK)])
        finally:
            lg.close()

    def rotate_run(many: bool) -> float:
        def enumerate_all(emit: persistlog.Emit) -> None:
            if many:
                for c in chunks(records, ENUM_CHUNK):
                    emit.many(c)
            else:
                for r in records:
                    emit(r)

        lg = persistlog.open(s.fresh("enum-rotate"), no_enumeration, rotate_bytes=None)
        lg.close()
        lg = persistlog.open(s.fresh("enum-rotate"), enumerate_all, rotate_bytes=None, discard_existing=True)
        try:
            return cpu_timed(lambda: lg.rotate(wait=True))
        finally:
            lg.close()

    def store_close_run() -> float:
        store = persistlog.ResourceStore.open(s.fresh("enum-store"), rotate_bytes=None)
        store.update((r["key"], r["value"]) for r in records)
        return cpu_timed(lambda: store.close(rotate=True))

    log.info("enumeration: %d records, update_many(%d) vs rotate() with emit / emit.many, store close(rotate=True)", n, ENUM_CHUNK)
    times = interleaved(
        {"update_many": update_many_run, "emit": lambda: rotate_run(False), "emit_many": lambda: rotate_run(True),
         "store_close": store_close_run},
        repeats=3,
    )
    best = {k: min(v) for k, v in times.items()}
    per_us = {k: v / n * 1e6 for k, v in best.items()}
    raw = {"records": n, "cpu_seconds": times, "us_per_record": per_us}
    rate = {k: n / v for k, v in best.items()}
    return [
        vs_baseline(f"rotation: emit.many, {n // 1000}k live (CPU)", AREA, rate["emit_many"], rate["update_many"],
                    f"update_many({ENUM_CHUNK})", "rec/s", 1.0, raw),
        info(f"  rotation: emit per record (CPU)", AREA, rate["emit"], "rec/s", rate["update_many"], f"update_many({ENUM_CHUNK})"),
        at_most(f"ResourceStore.close(rotate=True), {n // 1000}k keys, CPU per key", AREA, best["store_close"] / n * 1e3,
                0.001, "ms", raw=raw),
    ]


# -- restore memory ------------------------------------------------------------------------

BIG_VALUE_BYTES = 4000


def _write_big_log(url: str, target_bytes: int) -> int:
    """A log of about ``target_bytes`` of 4 KB records in one log (no rotation)."""
    value = os.urandom(BIG_VALUE_BYTES)
    per_batch = 256
    lg = persistlog.open(url, no_enumeration, rotate_bytes=None)
    n = 0
    try:
        while lg.stats()["log_bytes"] < target_bytes:
            lg.update_many([{"op": "put", "key": n + i, "value": value} for i in range(per_batch)])
            n += per_batch
    finally:
        lg.close()
    return n


def restore_memory(cfg: Config, s: Scratch) -> list[Figure]:
    """Peak RSS of a fresh process restoring a ``restore_gib`` log with O(1) app state."""
    url = s.fresh("log-big")
    target = int(cfg.restore_gib * 1024 * MiB)
    log.info("restore memory: writing a %.2f GiB log", cfg.restore_gib)
    began = time.perf_counter()
    written = _write_big_log(url, target)
    write_seconds = time.perf_counter() - began
    on_disk = dir_bytes(url)
    log.info("restore memory: %d records, %.0f MiB on disk in %.1fs; restoring in a child", written, on_disk / MiB, write_seconds)
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--rss-child", url],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"restore child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    s.fresh("log-big")  # 2 GiB: give the disk back now
    if child["records"] != written:
        raise RuntimeError(f"child restored {child['records']} records, expected {written}")
    peak = child["peak_rss"] / MiB
    raw = {**child, "log_bytes": on_disk, "write_seconds": write_seconds, "records_written": written}
    return [
        at_most(
            f"restore {on_disk / 1024 / MiB:.2f} GiB: peak RSS - state", AREA, peak - child["state_bytes"] / MiB,
            64.0, "MiB", child["rss_before"] / MiB, "RSS before restore", raw,
        ),
        info("  growth of RSS during restore", AREA, (child["peak_rss"] - child["rss_before"]) / MiB, "MiB"),
        info("  big-record restore rate", AREA, child["records"] / child["seconds"], "rec/s"),
        info("  big-record log write rate (update_many)", AREA, on_disk / MiB / write_seconds, "MiB/s"),
    ]


def peak_rss() -> int:
    """This process's peak RSS in bytes: ``VmHWM`` on Linux, because ``ru_maxrss`` keeps
    the peak of the parent that forked this process; ``ru_maxrss`` elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _rss_child(url: str) -> None:
    """Restore ``url`` counting records and bytes only, then print the RSS figures as JSON."""
    counts = [0, 0]

    def replay(r: Any) -> None:
        counts[0] += 1
        counts[1] += len(r["value"])

    rss_before = peak_rss()
    start = time.perf_counter()
    result = persistlog.restore(url, replay=replay)
    seconds = time.perf_counter() - start
    peak = peak_rss()
    print(json.dumps({
        "records": result.records,
        "value_bytes": counts[1],
        "seconds": seconds,
        "rss_before": rss_before,
        "peak_rss": peak,
        "state_bytes": sys.getsizeof(counts) + sum(sys.getsizeof(c) for c in counts),
    }))


# -- bytes on disk -------------------------------------------------------------------------


def bytes_per_record(cfg: Config, s: Scratch) -> list[Figure]:
    records = small_records(cfg.bytes_records)
    n = len(records)
    sizes: dict[str, float] = {}
    for compression in (None, "gzip", "zstd"):
        url = s.fresh(f"log-bytes-{compression}")
        lg = persistlog.open(url, no_enumeration, compression=compression)
        for b in chunks(records, MANY_BATCH):
            lg.update_many(b)
        lg.close()
        sizes[str(compression or "plain")] = dir_bytes(url) / n
    baselines.naive_write(records, s.fresh("bytes.bin"))
    sizes["naive"] = dir_bytes(s.path("bytes.bin")) / n
    baselines.jsonl_write(records, s.fresh("bytes.jsonl"))
    sizes["jsonl"] = dir_bytes(s.path("bytes.jsonl")) / n
    db = s.fresh("bytes.sqlite")
    baselines.sqlite_write(records, db)
    baselines.sqlite_checkpoint(db)
    sizes["sqlite"] = (dir_bytes(db) + sum(dir_bytes(db + x) for x in ("-wal", "-shm") if os.path.exists(db + x))) / n
    raw = {"records": n, "record": SMALL_RECORD_SHAPE, "bytes_per_record": sizes, "batch": MANY_BATCH}
    plain = sizes["plain"]
    return [
        info("bytes/record: persistlog plain", AREA, round(plain, 2), "B/rec", sizes["naive"], "naive loop", raw),
        info("bytes/record: persistlog gzip", AREA, round(sizes["gzip"], 2), "B/rec", plain, "plain"),
        info("bytes/record: persistlog zstd", AREA, round(sizes["zstd"], 2), "B/rec", plain, "plain"),
        info("bytes/record: JSON lines", AREA, round(sizes["jsonl"], 2), "B/rec", plain, "plain"),
        info("bytes/record: sqlite3", AREA, round(sizes["sqlite"], 2), "B/rec", plain, "plain"),
    ]


BENCHMARKS: dict[str, Callable[[Config, Scratch], Sequence[Figure]]] = {
    "write": write_throughput,
    "fsync": group_commit,
    "restore": restore_speed,
    "rotation": rotation_latency,
    "enumeration": enumeration_cost,
    "memory": restore_memory,
    "bytes": bytes_per_record,
}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rss-child", metavar="URL", required=True)
    _rss_child(parser.parse_args().rss_child)
