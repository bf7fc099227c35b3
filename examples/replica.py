"""A read replica: mirror a primary's state by following its log on S3 or a shared disk.

    python examples/replica.py /shared/kv-state --state /var/lib/replica/state.json
    python examples/replica.py s3://bucket/kv-state -o endpoint_url=http://minio:9000 --state r.json

``persistlog.follow`` restores the primary's newest complete log, then applies each new
batch as the primary writes it, across rotations, without ever writing to the primary's
destination. The replica keeps its copy in a dict (records in the ResourceStore convention,
as ``examples/kvstore.py`` writes them) and, with ``--state``, saves that dict together with
the follower's *cursor* every few seconds and on exit (one atomic file replace). On the next
start it loads both and resumes from the cursor instead of restoring from scratch; if the
primary's retention deleted what the cursor points at, the follower calls ``on_reset``,
the replica clears its dict, and it re-syncs from the newest complete log.

It prints a status line per second (records applied, keys, lag) and a digest of its state
on exit, which ``--until-lsn N`` (exit once LSN N is applied) or ``--idle-exit SECONDS``
(exit once nothing arrived for that long) make useful for scripts and tests. Keys and
values must be JSON-representable to be saved with ``--state``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from typing import Any

import persistlog


class Replica:
    """The mirrored dict, the cursor it corresponds to, and saving both together."""

    def __init__(self, state_file: str | None) -> None:
        self.data: dict[Any, Any] = {}
        self.cursor: str | None = None
        self.state_file = state_file
        self.resets = 0
        self.lock = threading.Lock()

    def load(self) -> None:
        if not self.state_file or not os.path.exists(self.state_file):
            return
        with open(self.state_file) as f:
            saved = json.load(f)
        self.data = dict(saved["data"])
        self.cursor = saved["cursor"]

    def save(self) -> None:
        """Write the dict and the cursor it belongs to in one atomic replace: a replica
        killed at any moment resumes from a matching pair."""
        if not self.state_file:
            return
        with self.lock:
            body = json.dumps({"cursor": self.cursor, "data": self.data})
        directory = os.path.dirname(os.path.abspath(self.state_file))
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".replica-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_file)

    def apply_batch(self, records: list[Any], cursor: persistlog.Cursor) -> None:
        with self.lock:
            for r in records:
                if not isinstance(r, dict):
                    continue  # not a ResourceStore record
                if r.get("op") == "put":
                    self.data[r["key"]] = r.get("value")
                elif r.get("op") == "del":
                    self.data.pop(r["key"], None)
            self.cursor = str(cursor)

    def reset(self) -> None:
        with self.lock:
            self.data.clear()
            self.cursor = None
            self.resets += 1

    def digest(self) -> str:
        with self.lock:
            text = json.dumps(sorted(self.data.items(), key=lambda kv: json.dumps(kv[0])))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def storage_options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="the primary's destination (a directory, s3://...)")
    parser.add_argument("--state", help="save the replica's dict and cursor here, and resume from it")
    parser.add_argument("-o", "--storage-option", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--interval", type=float, default=0.1, help="poll interval in seconds")
    parser.add_argument("--save-every", type=float, default=5.0, help="seconds between saves of --state")
    parser.add_argument("--until-lsn", type=int, help="exit once this LSN is applied")
    parser.add_argument("--idle-exit", type=float, help="exit after this many seconds with nothing new")
    args = parser.parse_args(argv)

    replica = Replica(args.state)
    replica.load()
    if replica.cursor:
        print(f"resuming {len(replica.data)} keys from cursor {replica.cursor}", flush=True)
    follower = persistlog.follow(
        args.url,
        cursor=replica.cursor,
        poll_interval=args.interval,
        on_reset=replica.reset,
        storage_options=storage_options(args.storage_option),
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())

    # Drive the follower from this thread: each item is a batch already decoded, with the
    # cursor just after it, so the dict and the cursor always move together.
    applied = 0
    last_lsn = 0
    last_new = time.monotonic()
    last_save = last_status = time.monotonic()
    done = threading.Event()

    def watchdog() -> None:
        # The follower blocks between polls; stop it from outside when asked to.
        while not done.is_set():
            idle = args.idle_exit is not None and time.monotonic() - last_new > args.idle_exit
            if stop.is_set() or (idle and follower.wait_caught_up(0)):
                follower.stop()
                return
            time.sleep(0.05)

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        for batch in follower:
            replica.apply_batch(batch.records, batch.cursor)
            applied += len(batch.records)
            last_lsn = batch.last_lsn
            now = last_new = time.monotonic()
            if now - last_status >= 1.0:
                lag = follower.lag()
                print(f"applied {applied} records, {len(replica.data)} keys, "
                      f"lag {lag.records} records / {lag.seconds:.2f}s", flush=True)
                last_status = now
            if args.state and now - last_save >= args.save_every:
                replica.save()
                last_save = now
            if args.until_lsn is not None and last_lsn >= args.until_lsn:
                break
    finally:
        done.set()
        follower.stop()
        replica.save()
    if follower.error is not None:
        print(f"follower stopped: {follower.error}", file=sys.stderr)
        return 1
    print(
        f"replica: applied {applied} records up to LSN {last_lsn}; {len(replica.data)} keys; "
        f"resets {replica.resets}; cursor {replica.cursor}; digest {replica.digest()}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
