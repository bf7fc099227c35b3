"""S3 through a moto server: a secondary's cost, group commit of PUTs, requests.

The moto server runs in a child process by default (``--moto-in-process`` puts it on a
thread of the bench process, where it competes with persistlog for the GIL as no real S3
would). Run as a script, this module is that child: it prints ``host:port`` and serves
until its stdin closes.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import persistlog

from core import sync_rate
from figures import Figure, at_most, info, vs_baseline
from workload import Config, Scratch, interleaved, median, no_enumeration, request_counts, small_records, timed

log = logging.getLogger("bench")

AREA = "s3"
_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@dataclass
class Moto:
    """A running moto S3 server and a bucket on it."""

    endpoint: str
    bucket: str

    @property
    def options(self) -> dict[str, Any]:
        """storage_options reaching the server (no region: moto does not need one)."""
        return {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": self.endpoint}}

    def url(self, prefix: str) -> str:
        """A fresh ``s3://`` destination URL under ``prefix``."""
        return f"s3://{self.bucket}/{prefix}-{uuid.uuid4().hex[:8]}"


@contextmanager
def _moto_thread() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    os.environ.update(_CREDENTIALS)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextmanager
def _moto_child() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, **_CREDENTIALS},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"the moto server child exited ({proc.wait()}) before serving")
        yield f"http://{line}"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def moto_server(in_process: bool) -> Iterator[Moto]:
    """Start a moto S3 server on 127.0.0.1 (free port) with one bucket."""
    import fsspec

    with (_moto_thread() if in_process else _moto_child()) as endpoint:
        moto = Moto(endpoint, f"bench-{uuid.uuid4().hex[:12]}")
        fsspec.filesystem("s3", **moto.options).call_s3("create_bucket", Bucket=moto.bucket)
        log.info("moto S3 server at %s (%s)", endpoint, "thread" if in_process else "child process")
        yield moto


def shared_moto(cfg: Config, s: Scratch) -> Moto:
    """The run's moto server, started on first use."""
    return s.service("moto", lambda: moto_server(cfg.moto_in_process))


# -- a secondary's cost ------------------------------------------------------------------


def secondary_cost(cfg: Config, s: Scratch) -> list[Figure]:
    """Buffered update() into a local primary, alone and with an S3 secondary attached."""
    moto = shared_moto(cfg, s)
    records = small_records(cfg.s3_records)
    n = len(records)
    drains: list[float] = []

    def run(secondary: bool) -> float:
        extra: dict[str, Any] = {"secondaries": [(moto.url("secondary"), moto.options)]} if secondary else {}
        lg = persistlog.open(s.fresh("log-primary"), no_enumeration, **extra)
        update = lg.update
        start = time.perf_counter()
        for r in records:
            update(r)
        lg.sync()
        seconds = time.perf_counter() - start
        closing = timed(lg.close)
        if secondary:
            drains.append(closing)
        return seconds

    log.info("s3 secondary: %d buffered updates, local alone vs with an S3 secondary, %d rounds", n, cfg.repeats)
    times = interleaved({"local": lambda: run(False), "secondary": lambda: run(True)}, cfg.repeats)
    rate = {name: n / median(t) for name, t in times.items()}
    raw = {"records": n, "seconds": times, "rates": rate, "close_seconds_with_secondary": drains}
    return [
        vs_baseline("update() buffered + S3 secondary", AREA, rate["secondary"], rate["local"], "local alone", "rec/s", 0.8, raw),
        info("  close() draining the S3 secondary", AREA, median(drains), "s"),
    ]


# -- group commit of PUTs ------------------------------------------------------------------


def sync_puts(cfg: Config, s: Scratch) -> list[Figure]:
    moto = shared_moto(cfg, s)
    threads = cfg.s3_sync_threads
    log.info("s3 sync: update(sync=True) to an S3 primary, 1 and %d threads, %.1fs each", threads, cfg.s3_sync_seconds)
    one = sync_rate(moto.url("sync-1"), 1, cfg.s3_sync_seconds, storage_options=moto.options)
    many = sync_rate(moto.url("sync-n"), threads, cfg.s3_sync_seconds, storage_options=moto.options)
    return [
        vs_baseline(f"S3 update(sync=True), {threads} threads", AREA, many["rate"], one["rate"], "1 thread", "rec/s", 10.0,
                    {"one_thread": one, "threads": many}),
        info(f"  records per PUT, {threads} threads", AREA, round(many["records_per_sync"], 2), "rec"),
    ]


# -- requests ------------------------------------------------------------------------------


def _paced_updates(lg: persistlog.Log, rate: float, seconds: float) -> int:
    """``update()`` at ``rate`` per second for ``seconds``; returns how many were made."""
    start = time.perf_counter()
    n = 0
    while True:
        due = start + n / rate
        now = time.perf_counter()
        if due - start >= seconds:
            return n
        if due > now:
            time.sleep(due - now)
        lg.update({"op": "put", "key": n, "value": "v" * 16})
        n += 1


def requests(cfg: Config, s: Scratch) -> list[Figure]:
    """Requests per 1,000 paced updates at the default flush interval, and what an idle log
    (and an idle follower of it) sends while nothing happens."""
    moto = shared_moto(cfg, s)
    idle_url = moto.url("idle")
    idle = persistlog.open(idle_url, no_enumeration, storage_options=moto.options)
    for i in range(100):
        idle.update({"op": "put", "key": i, "value": "v" * 16})
    idle.sync()
    time.sleep(0.1)
    idle_start = time.perf_counter()
    idle_before = request_counts(idle.dest)
    log.info("s3 requests: watching an idle log for %.0fs while a second log takes %.0f updates/s for %.0fs",
             cfg.idle_seconds, cfg.paced_rate, cfg.paced_seconds)

    busy = persistlog.open(moto.url("paced"), no_enumeration, storage_options=moto.options)
    before = request_counts(busy.dest)
    updates = _paced_updates(busy, cfg.paced_rate, cfg.paced_seconds)
    # Counted before the closing sync(): what the flush timer alone sent while updates flowed.
    busy_requests = {k: v - before[k] for k, v in request_counts(busy.dest).items()}
    flush_interval = busy.dest.default_flush_interval
    busy.close()

    follower = persistlog.follow(idle_url, replay=lambda r: None, storage_options=moto.options)
    follower.poll()
    follower_before = request_counts(follower.dest)
    follower_start = time.perf_counter()
    follower.start()
    time.sleep(max(0.0, cfg.idle_seconds - (time.perf_counter() - idle_start)))
    idle_seconds = time.perf_counter() - idle_start
    idle_requests = {k: v - idle_before[k] for k, v in request_counts(idle.dest).items()}
    follower.stop()
    follower_seconds = time.perf_counter() - follower_start
    follower_requests = {k: v - follower_before[k] for k, v in request_counts(follower.dest).items()}
    idle.close()

    per_1000 = sum(busy_requests.values()) * 1000 / max(1, updates)
    # One PUT per flush interval is what the timer should cost while updates keep coming.
    expected_per_1000 = 1000 / (cfg.paced_rate * flush_interval)
    raw = {
        "paced": {"rate": cfg.paced_rate, "updates": updates, "requests": busy_requests, "flush_interval": flush_interval},
        "idle_log": {"seconds": idle_seconds, "requests": idle_requests},
        "idle_follower": {"seconds": follower_seconds, "requests": follower_requests, "polls": follower.polls},
    }
    minute = 60.0 / follower_seconds
    return [
        info(f"S3 requests per 1000 updates @ {cfg.paced_rate:.0f}/s, flush {flush_interval:g}s", AREA,
             round(per_1000, 2), "req", round(expected_per_1000, 2), "1 PUT per flush", raw=raw),
        info(f"  PUTs while updating for {cfg.paced_seconds:.0f}s", AREA, busy_requests.get("PUT", 0), "req",
             round(cfg.paced_seconds / flush_interval), "1 per flush"),
        at_most(f"LIST calls by an idle log in {idle_seconds:.0f}s", AREA, idle_requests.get("LIST", 0), 0, "req"),
        info(f"  all requests by the idle log in {idle_seconds:.0f}s", AREA, sum(idle_requests.values()), "req"),
        info("  idle follower LIST calls per minute", AREA, round(follower_requests.get("LIST", 0) * minute), "req"),
    ]


BENCHMARKS: dict[str, Callable[[Config, Scratch], Sequence[Figure]]] = {
    "secondary": secondary_cost,
    "sync": sync_puts,
    "requests": requests,
}


def _serve() -> None:
    """The moto server child: print ``host:port``, serve until stdin closes."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with _moto_thread() as endpoint:
        print(endpoint.removeprefix("http://"), flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    _serve()
