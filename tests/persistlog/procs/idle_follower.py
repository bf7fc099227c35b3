"""Measures an idle follower's CPU: ``python idle_follower.py URL SECONDS``.

Catches up with the log at URL, then follows it on its background thread for SECONDS of
wall time while nothing is written, and prints JSON: CPU seconds of this process during
that time, the wall time, and the polls made.
"""

from __future__ import annotations

import json
import sys
import time

import persistlog


def main() -> None:
    url, seconds = sys.argv[1], float(sys.argv[2])
    applied = []
    follower = persistlog.follow(url, applied.append)
    while follower.poll():
        pass
    follower.start()
    polls0 = follower.polls
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(seconds)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    polls = follower.polls - polls0
    follower.stop()
    print(json.dumps({"cpu": cpu, "wall": wall, "polls": polls, "applied": len(applied),
                      "error": repr(follower.error) if follower.error else None}))


if __name__ == "__main__":
    main()
