"""Audit a persistlog log in Spark: who changed what, when, and the state at any moment.

    python examples/audit.py                        # writes a small demo log first
    python examples/audit.py /var/lib/app/state --key user:7
    python examples/audit.py s3://bucket/app/log --storage-option key=... --storage-option secret=...

It reads every retained log of a ``persistlog.ResourceStore`` (records ``{"op", "key",
"value"}``) with the ``persistlog`` Spark data source, local Spark by default, and prints:

1. how many records each log holds, by kind (``snapshot`` records are a rotation's
   enumeration, ``update`` records the app's changes);
2. the history of one key: every put and delete, with its LSN and commit time;
3. the live resources at the middle of the retained history and now, and which keys
   appeared and disappeared in between (``spark_replay.state``).

The ``key`` column shows a string key as itself (``user:7``) and other keys as JSON text;
``key_json`` tells every key apart (``1`` from ``"1"``) and values are JSON text
(``docs/JSON.md``).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from typing import Any

import persistlog
import spark_replay
from persistlog.reading import UsageError, parse_storage_options
from pyspark.sql import functions as sf


def write_demo_log(url: str, updates: int) -> None:
    """A small account store with a few restarts, rotations and deletions."""
    rng = random.Random(1)
    for life in range(3):
        store = persistlog.ResourceStore.open(url, rotate_bytes=None)
        for i in range(updates // 3):
            user = f"user:{rng.randrange(40)}"
            if user in store and rng.random() < 0.15:
                del store[user]
            else:
                balance = store.get(user, {"balance": 0})["balance"]
                store[user] = {"balance": balance + rng.randrange(-50, 100), "life": life}
            if i == updates // 6:
                store.log.rotate()
        store.close()


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?", help="a ResourceStore log (default: write a demo log)")
    parser.add_argument("--key", help="the key to trace, as the key column shows it (default: the busiest key)")
    parser.add_argument("--storage-option", action="append", default=[], metavar="K=V")
    parser.add_argument("--updates", type=int, default=600, help="size of the demo log")
    args = parser.parse_args(argv)
    try:
        storage_options = parse_storage_options(args.storage_option)
    except UsageError as e:
        parser.error(str(e))

    url = args.url
    if url is None:
        url = tempfile.mkdtemp(prefix="audit-demo-") + "/log"
        print(f"writing a demo log at {url}")
        write_demo_log(url, args.updates)
    spark = spark or spark_replay.local_session("persistlog-audit")

    df = spark_replay.read(spark, url, convention="resource", storage_options=storage_options).cache()
    if df.isEmpty():
        print(f"no records at {url}")
        return 1

    print("\n1. records per log")
    df.groupBy("log_seq").pivot("kind", ["snapshot", "update"]).count().orderBy("log_seq").show()

    key = args.key
    if key is None:
        busiest = df.filter(sf.col("kind") == "update").groupBy("key").count().orderBy(sf.desc("count")).first()
        if busiest is None:
            print(f"no update at {url}: no key to trace")
            return 1
        key = busiest["key"]
    print(f"2. history of key {key}")
    (
        df.filter(sf.col("key") == key)
        .select("lsn", "commit_time", "log_seq", "kind", "op", "value")
        .orderBy("lsn")
        .show(20, truncate=False)
    )

    print("3. live resources, then and now")
    replayable = df.filter(sf.col("base_log").isNotNull()).agg(sf.min("lsn"), sf.max("lsn")).first()
    assert replayable is not None  # an aggregate without grouping has one row
    middle = (replayable[0] + replayable[1]) // 2
    then = spark_replay.state(df, as_of_lsn=middle).select("key", "key_json", "value")
    now = spark_replay.state(df).select("key", "key_json", "value")
    print(f"as of LSN {middle}: {then.count()} keys; now (LSN {replayable[1]}): {now.count()} keys")
    # Joined on the lossless key: "key" alone shows 1 and "1" alike.
    gone = then.join(now, "key_json", "left_anti").orderBy("key")
    new = now.join(then, "key_json", "left_anti").orderBy("key")
    print(f"deleted since: {[r['key'] for r in gone.collect()]}")
    print(f"created since: {[r['key'] for r in new.collect()]}")
    df.unpersist()
    return 0


if __name__ == "__main__":
    sys.exit(main())
