"""Keep a Parquet table up to date with a live log: Spark Structured Streaming, exactly once.

    python examples/live_table.py                     # a demo store written while it runs
    python examples/live_table.py /var/lib/app/state --out /tmp/live --seconds 60

A streaming query tails the log of a ``persistlog.ResourceStore`` (``spark.readStream
.format("persistlog")``) and appends every record to ``OUT/events`` as it is written,
across rotations. The query is stopped halfway and started again from its checkpoint, as
a redeployed job would be: the table still holds every record exactly once. At the end the
table's state (``spark_replay.state``) is compared with what the store holds.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from typing import Any

import persistlog
import spark_replay


class DemoWriter(threading.Thread):
    """A store of 30 counters updated 40 times a second and rotated every few seconds."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        # Retention must leave a stopped query the logs it has not read yet: keep plenty.
        self.store = persistlog.ResourceStore.open(url, rotate_bytes=None, retain=20)
        self.halt = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.halt.is_set():
            key = f"counter:{i % 30}"
            if i % 11 == 10:
                self.store.pop(key, None)
            else:
                self.store[key] = {"hits": self.store.get(key, {"hits": 0})["hits"] + 1}
            if i % 200 == 199:
                self.store.log.rotate()
            i += 1
            time.sleep(0.025)

    def finish(self) -> dict[Any, Any]:
        self.halt.set()
        self.join()
        state = self.store.to_dict()
        self.store.close()
        return state


def start(spark: Any, url: str, out: str) -> Any:
    return (
        spark.readStream.format("persistlog")
        .option("convention", "resource")
        .load(url)
        .writeStream.format("parquet")
        .option("path", f"{out}/events")
        .option("checkpointLocation", f"{out}/checkpoint")
        .trigger(processingTime="0.5 seconds")
        .start()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?", help="a ResourceStore log (default: a demo store written meanwhile)")
    parser.add_argument("--out", help="where the table and the checkpoint go (default: a temporary directory)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the query runs in all")
    args = parser.parse_args(argv)

    out = args.out or tempfile.mkdtemp(prefix="live-table-")
    url = args.url or os.path.join(out, "log")
    writer = DemoWriter(url) if args.url is None else None
    if writer is not None:
        writer.start()
    spark = spark_replay.local_session("persistlog-live-table")
    spark.sparkContext.setLogLevel("ERROR")

    query = start(spark, url, out)
    time.sleep(args.seconds / 2)
    query.stop()
    print(f"stopped the query after {args.seconds / 2:g}s; starting it again from {out}/checkpoint")
    query = start(spark, url, out)
    time.sleep(args.seconds / 2)
    expected = writer.finish() if writer is not None else None
    query.processAllAvailable()  # everything written so far, then stop
    query.stop()

    events = spark.read.parquet(f"{out}/events")
    lsns = sorted(r["lsn"] for r in events.select("lsn").collect())
    logs = sorted(r["log_seq"] for r in events.select("log_seq").distinct().collect())
    print(f"{out}/events: {len(lsns)} rows, LSN {lsns[0]}..{lsns[-1]}, logs {logs[0]}..{logs[-1]}")
    exact = lsns == list(range(lsns[0], lsns[-1] + 1))
    print("every record exactly once:", "yes" if exact else "NO")
    live = {
        (rec := json.loads(r["record"]))["key"]: rec["value"]
        for r in spark_replay.state(events).select("record").collect()
    }
    print(f"live keys in the table's state: {len(live)}")
    if expected is not None:
        print("the table's state matches the store:", "yes" if live == expected else "NO")
        exact = exact and live == expected
    spark.stop()
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
