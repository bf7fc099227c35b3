"""Spark reads a log whose snapshot shares values (format version 3) as the records logged,
each partition resolving the references its batches make, also one that starts inside the
log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import persistlog
from destinations import open_destination
from persistlog._format import constants as F
from persistlog._format.jsonify import from_json
from persistlog._read.reader import LogScanner, list_logs

BIG = [b"\x07" * 300 + bytes(range(40)), ("payload %d " % 7) * 40, "é" * 130]


@pytest.mark.spark
def test_spark_shows_the_values(spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    recs = [{"k": i, "queue": [BIG[i % 3], {"m": BIG[(i + 1) % 3]}, i]} for i in range(150)]
    lg = persistlog.open(url, lambda emit: [emit(r) for r in recs], segment_bytes=4096, batch_bytes=2048)
    lg.rotate(wait=True)
    lg.update({"k": "u", "queue": [BIG[0]]})
    lg.close()
    dest = open_destination(url)
    segments = list_logs(dest)[2]
    assert len(segments) >= 3
    assert any(b.header.flags & F.FLAG_SHARED for b in LogScanner(dest, 2, segments))
    df = spark.read.format("persistlog").option("min_partitions", 6).load(url)
    rows = df.select("log_seq", "lsn", "record").collect()
    got = [from_json(r["record"]) for r in sorted(rows, key=lambda r: r["lsn"]) if r["log_seq"] == 2]
    assert got == recs + [{"k": "u", "queue": [BIG[0]]}]
