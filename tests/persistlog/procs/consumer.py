"""A process running named consumers of one log, killed by SIGKILL by ``test_consumers.py``.

``python consumer.py CONFIG_JSON`` with ``url``, ``names`` (the consumers), ``commit_interval``
and ``pause`` (seconds each handler sleeps per batch, so that a kill lands mid-stream). Each
line on stdout is one ``os.write``, made inside the handler before it returns:

    S name next_lsn        the consumer starts at this position (its committed one, or the
                           start of the newest complete log)
    D name first last      the handler got the records with these LSNs
    R name reason          the consumer reset
    X message              an unexpected error
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import persistlog


def out(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main() -> None:
    cfg = json.loads(sys.argv[1])
    group = persistlog.consumers(cfg["url"], commit_interval=cfg["commit_interval"], poll_interval=0.01)
    for name in cfg["names"]:

        def on_batch(batch: persistlog.FollowedBatch, name: str = name) -> None:
            out(f"D {name} {batch.first_lsn} {batch.last_lsn}")
            time.sleep(cfg["pause"])

        consumer = group.add(name, on_batch=on_batch, on_reset=lambda why, name=name: out(f"R {name} {why}"))
        out(f"S {name} {consumer.position.next_lsn if consumer.position else 0}")
    group.start()
    while True:
        time.sleep(1)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        out("X " + traceback.format_exc().replace("\n", " | "))
        raise
