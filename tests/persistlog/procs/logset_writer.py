"""A process writing to many logs of one LogSet, killed by SIGKILL by ``test_log_set.py``.

``python logset_writer.py CONFIG_JSON`` with ``root``, ``keys`` (how many) and ``seed``. It
opens every key's log with ``durability="fsync"``, restoring it first (a counter per key:
the record ``{"n": n}``, the state the last ``n``), then counts up random keys forever.
Each line on stdout is one ``os.write``:

    O key n      the key's log is open; its restored counter is n (0: none)
    A key n      update({"n": n}) returned for that key: durable
    X message    an unexpected error
"""

from __future__ import annotations

import json
import os
import random
import sys
import traceback
from typing import Any

import persistlog


def out(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main() -> None:
    cfg = json.loads(sys.argv[1])
    rng = random.Random(cfg["seed"])
    counters: dict[str, int] = {}
    logs: dict[str, persistlog.Log] = {}
    logset = persistlog.LogSet(cfg["root"], durability="fsync", rotate_records=5)
    for i in range(cfg["keys"]):
        key = f"queue/{i}"

        def apply(record: Any, key: str = key) -> None:
            counters[key] = record["n"]

        def enumerate_all(emit: Any, key: str = key) -> None:
            if key in counters:
                emit({"n": counters[key]})

        logs[key] = logset.open(key, enumerate_all, replay=apply)
        out(f"O {key} {counters.get(key, 0)}")
    keys = sorted(logs)
    while True:
        key = rng.choice(keys)
        n = counters.get(key, 0) + 1
        logs[key].update({"n": n})
        counters[key] = n
        out(f"A {key} {n}")


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        out("X " + traceback.format_exc().replace("\n", " | "))
        raise
