"""Reading by position: the first record after an LSN in the middle of a large log.

``persistlog.read(url, lsn)`` finds the log by a binary search over its logs' first segment
headers, the segment by one over that log's segment headers, then walks batch headers in
that one segment. The baseline is what reading from an LSN cost before: a scan from the
oldest log, checking every batch (CRC, no record decoded) until the one holding it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from itertools import islice

import persistlog
from figures import Figure, at_most, info
from workload import Config, Scratch, dir_bytes, median, no_enumeration

log = logging.getLogger("bench")

AREA = "positions"
#: The target: the first record after an LSN in the middle of a ~1 GB log, page cache warm.
FIRST_RECORD_MS = 50.0
RECORD_BYTES = 1000
BATCH_BYTES = 64 * 1024  # ~256 batches per 16 MiB segment: a walk of headers has work to do


def _write(url: str, gib: float) -> int:
    """A log of about ``gib`` GiB (default segment and rotation sizes, every log retained);
    its last LSN."""
    n = int(gib * (1 << 30) / (RECORD_BYTES + 20))
    pad = "x" * RECORD_BYTES
    lg = persistlog.open(url, no_enumeration, batch_bytes=BATCH_BYTES, retain=1000)  # every log kept
    update = lg.update
    for i in range(n):
        update({"i": i, "p": pad})
    lg.close()
    return n


def _scan_to(url: str, lsn: int) -> None:
    """The baseline: every batch from the oldest log checked until the one holding ``lsn``."""
    from destinations import open_destination
    from persistlog._read.reader import LogScanner, list_logs

    dest = open_destination(url)
    for seq, segments in list_logs(dest).items():
        for batch in LogScanner(dest, seq, segments):
            if not batch.is_control and batch.first_lsn + batch.header.count > lsn:
                return


def first_record(cfg: Config, s: Scratch) -> list[Figure]:
    gib = 0.125 if cfg.quick else 1.0
    url = s.fresh("log-positions")
    log.info("positions: writing a log of about %.2f GiB", gib)
    last = _write(url, gib)
    size = dir_bytes(url)
    segments = len([n for n in os.listdir(url) if n.endswith(".plog")])
    lsns = [last // 2 + k * 7919 for k in range(-5, 6)]

    def seek(lsn: int) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            got = next(persistlog.read(url, lsn))
            seconds = time.perf_counter() - start
            assert got.lsn == lsn
            return seconds
        return run

    times = [seek(lsn)() for lsn in lsns]
    first_ms = median(times) * 1e3
    start = time.perf_counter()
    _scan_to(url, last // 2)
    scan_ms = (time.perf_counter() - start) * 1e3
    at_ms = median([_timed_cursor(url, lsn) for lsn in lsns]) * 1e3
    raw = {"log_bytes": size, "segments": segments, "records": last, "lsns": lsns,
           "first_record_ms": [t * 1e3 for t in times], "scan_ms": scan_ms}
    return [
        at_most(f"read(url, mid LSN): first record, {size / 2**30:.2f} GiB log", AREA, first_ms,
                FIRST_RECORD_MS, "ms", scan_ms, "scan to it", raw=raw),
        info("  Cursor.at_lsn(url, mid LSN)", AREA, at_ms, "ms"),
        info("  next 1,000 records after it", AREA, _next_thousand(url, last // 2) * 1e3, "ms"),
    ]


def _timed_cursor(url: str, lsn: int) -> float:
    start = time.perf_counter()
    persistlog.Cursor.at_lsn(url, lsn)
    return time.perf_counter() - start


def _next_thousand(url: str, lsn: int) -> float:
    start = time.perf_counter()
    got = list(islice(persistlog.read(url, lsn), 1000))
    seconds = time.perf_counter() - start
    assert len(got) == 1000
    return seconds


BENCHMARKS: dict[str, Callable[[Config, Scratch], Sequence[Figure]]] = {
    "first_record": first_record,
}
