"""A follower process: ``python follower.py CONFIG_JSON``.

Follows ``url`` by iterating :func:`persistlog.follow`, applying every record to a dict and
checking through each :class:`persistlog.FollowedBatch` that LSNs arrive gapless and never
twice (a reset, reported through ``on_reset``, starts the chain again). A watcher thread
writes ``progress`` (last applied LSN, resets) every 50 ms; when the file ``stop`` appears
it stops the follower, which then writes ``out``: state, LSN checks, request counts.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from typing import Any

import kv_app
import persistlog
from results import dump


def main() -> None:
    cfg = json.loads(sys.argv[1])
    state: dict[str, Any] = {}
    info: dict[str, Any] = {"last_lsn": 0, "resets": 0, "lsn_errors": [], "batches": 0, "records": 0}

    apply = functools.partial(kv_app.apply, state)
    def on_reset() -> None:
        state.clear()
        info["resets"] += 1
        info["last_lsn"] = 0

    follower = persistlog.follow(
        cfg["url"], apply, on_reset=on_reset, poll_interval=cfg.get("poll", 0.01),
        storage_options=cfg.get("storage_options") or None,
        wait_for_log=True,  # started before (or while) the writer makes its first log
    )
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            dump(cfg["progress"], {k: info[k] for k in ("last_lsn", "resets", "batches", "records")})
            if os.path.exists(cfg["stop"]):
                follower.stop()  # the iteration below ends after its current poll
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    for fb in follower:
        expected = info["last_lsn"] + 1
        if info["last_lsn"] and fb.first_lsn != expected:
            info["lsn_errors"].append([expected, fb.first_lsn, fb.last_lsn])
        if fb.last_lsn - fb.first_lsn + 1 != len(fb.records):
            info["lsn_errors"].append(["count", fb.first_lsn, fb.last_lsn, len(fb.records)])
        info["last_lsn"] = fb.last_lsn
        info["batches"] += 1
        info["records"] += len(fb.records)
    done.set()
    stats = follower.dest.stats() if hasattr(follower.dest, "stats") else None
    dump(cfg["out"], {**info, "state": state, "cursor": str(follower.cursor), "stats": stats,
                      "polls": follower.polls})


if __name__ == "__main__":
    main()
