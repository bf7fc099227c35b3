"""A log's history by position: what changed between two points, and the state at one.

    python examples/history.py                          # writes a small demo log first
    python examples/history.py /var/lib/app/state --from-lsn 1200 --to-lsn 1300 --at-lsn 1250
    python examples/history.py /var/lib/app/state --since 2026-11-26T09:00:00Z

For a ``persistlog.ResourceStore`` log (records ``{"op", "key", "value"}``) it prints:

1. what the logs hold: the oldest and newest LSN and their commit times;
2. every change between the two positions (``persistlog.read``: found from headers, so
   the start costs a few reads however long the log), with its LSN, commit time and kind;
3. the live resources as of ``--at-lsn`` (``persistlog.restore(to_lsn=...)``: the newest
   complete log at or before it, replayed up to it).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from datetime import datetime, timezone
from typing import Any

import persistlog


def write_demo_log(url: str, updates: int) -> None:
    """A small account store with a restart and a few rotations."""
    rng = random.Random(7)
    for life in range(2):
        store = persistlog.ResourceStore.open(url, rotate_bytes=None)
        for i in range(updates // 2):
            user = f"user:{rng.randrange(20)}"
            store[user] = {"balance": rng.randrange(1000), "life": life}
            if i % (updates // 6) == 0:
                store.log.rotate()
        store.close()


def when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="milliseconds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", help="a ResourceStore log (default: a demo log in a temporary directory)")
    parser.add_argument("--from-lsn", type=int, help="first LSN to show (default: the middle of the history)")
    parser.add_argument("--to-lsn", type=int, help="show up to this LSN, inclusive (default: 10 records)")
    parser.add_argument("--since", type=datetime.fromisoformat, help="show what was committed at or after this time")
    parser.add_argument("--at-lsn", type=int, help="show the state as of this LSN (default: --to-lsn)")
    parser.add_argument("--updates", type=int, default=600, help="size of the demo log")
    args = parser.parse_args(argv)
    url = args.url or tempfile.mkdtemp(prefix="persistlog-history-") + "/accounts"
    if args.url is None:
        write_demo_log(url, args.updates)

    oldest = persistlog.Cursor.earliest(url)
    records = list(persistlog.read(url, oldest))
    if not records:
        print(f"{url} holds no record yet")
        return 0
    print(f"{url}: LSNs {records[0].lsn}..{records[-1].lsn}, committed "
          f"{when(records[0].commit_time)} .. {when(records[-1].commit_time)}")

    start: Any = args.since or args.from_lsn or (records[0].lsn + records[-1].lsn) // 2
    stop = args.to_lsn + 1 if args.to_lsn is not None else None
    shown = 0
    try:
        for r in persistlog.read(url, start, stop):
            print(f"  {r.lsn:>8}  {when(r.commit_time)}  {r.kind:<8}  {r.record}")
            shown += 1
            if stop is None and args.since is None and shown == 10:
                break
    except persistlog.PositionError as e:
        print(f"cannot read from {start}: {e}", file=sys.stderr)
        return 2

    at = args.at_lsn or args.to_lsn or records[-1].lsn
    state: dict[Any, Any] = {}

    def apply(record: dict[str, Any]) -> None:
        if record["op"] == "put":
            state[record["key"]] = record["value"]
        else:
            state.pop(record["key"], None)

    result = persistlog.restore(url, apply, to_lsn=at)
    print(f"state as of LSN {result.last_lsn} (from log(s) {result.logs}): {len(state)} resources")
    for key in sorted(state)[:5]:
        print(f"  {key}: {state[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
