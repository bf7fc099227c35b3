"""The process ``test_crash.py`` kills with SIGKILL: an app writing a log with fsync durability.

``python crash_child.py URL SEED THREADS MODE``. It restores and opens URL with
``durability="fsync"`` and small rotation triggers, and runs THREADS updater threads, each
owning its own keys. Every event goes to stdout as one line (one ``os.write``, so lines
from threads never interleave):

    I t j op key value   thread t is about to log its j-th change
    A t j lsn            update() returned: the change is acknowledged durable
    O seq next_lsn       a Log is open (its first log complete)
    E+ / E-              an enumeration starts / ends
    C+ / C-              a close starts / ends (the main thread closes and reopens)
    X message            an unexpected error (the parent fails the test)

MODE ``enum`` makes each enumeration slow (the parent kills during it); ``close`` closes and
reopens often (the parent kills while sealing); anything else rotates often.
"""

from __future__ import annotations

import functools
import os
import random
import sys
import threading
import time
import traceback
from typing import Any


def out(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main() -> None:
    url, seed, nthreads, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    import kv_app
    import persistlog

    rng = random.Random(seed)
    data: dict[str, Any] = {}
    locks = [threading.Lock() for _ in range(10)]  # one per thread number, any round

    apply = functools.partial(kv_app.apply, data)

    def owner(key: str) -> int:
        return int(key[1: key.index("k")])

    def enumerate_all(emit: Any) -> None:
        out("E+")
        # List the resources while no change is in flight: a resource being created right
        # now was logged into the old log and must be in this list (the app's contract).
        for lock in locks:
            lock.acquire()
        keys = sorted(data)
        for lock in locks:
            lock.release()
        for key in keys:
            with locks[owner(key)]:
                if key in data:
                    emit({"op": "put", "key": key, "value": data[key]})
            if mode == "enum":
                time.sleep(0.004)
        out("E-")

    options = log_options(rng)

    def open_log() -> persistlog.Log:
        # Every open restores first (the state is what the log holds), then starts a log.
        data.clear()
        # Per-key locks around each change and each emit: the concurrency contract.
        lg = persistlog.open(url, enumerate_all, replay=apply, concurrent_enumeration=True, **options)
        out(f"O {lg.seq} {lg.next_lsn}")
        return lg

    state = {"log": open_log()}
    gate = threading.Condition()
    paused = False
    active = 0

    def worker(t: int) -> None:
        nonlocal active
        wrng = random.Random(seed * 100 + t)
        j = 0
        while True:
            with gate:
                while paused:
                    gate.wait()
                active += 1
            try:
                key = f"t{t}k{wrng.randrange(5)}"
                with locks[t]:
                    if wrng.random() < 0.2:
                        out(f"I {t} {j} del {key} -")
                        lsn = state["log"].update({"op": "del", "key": key})
                        data.pop(key, None)
                    else:
                        value = f"v{t}.{j}"
                        out(f"I {t} {j} put {key} {value}")
                        lsn = state["log"].update({"op": "put", "key": key, "value": value})
                        data[key] = value
                out(f"A {t} {j} {lsn}")
                j += 1
            finally:
                with gate:
                    active -= 1
                    gate.notify_all()
            if wrng.random() < 0.1:
                time.sleep(0.001)

    for t in range(nthreads):
        threading.Thread(target=guard(worker), args=(t,), daemon=True).start()

    while True:
        time.sleep(rng.uniform(0.002, 0.02))
        roll = rng.random()
        lg = state["log"]
        if mode == "close" and roll < 0.5 or roll < 0.05:
            with gate:
                paused = True
                while active:
                    gate.wait()
            out("C+")
            lg.close()
            out("C-")
            state["log"] = open_log()
            with gate:
                paused = False
                gate.notify_all()
        elif roll < 0.3:
            lg.rotate(wait=rng.random() < 0.5)


def log_options(rng: random.Random) -> dict[str, Any]:
    """fsync durability and small, random rotation triggers and segments."""
    return dict(
        durability="fsync",
        rotate_records=rng.choice([5, 12, 30]),
        rotate_bytes=rng.choice([None, 3000, 9000]),
        segment_bytes=4096,
        retain=rng.choice([1, 2, 3]),
        compression=rng.choice([None, "gzip"]),
    )


def guard(fn: Any) -> Any:
    def run(*args: Any) -> None:
        try:
            fn(*args)
        except BaseException as e:  # report, then die loudly
            out("X " + repr(e).replace("\n", " "))
            traceback.print_exc()
            os._exit(3)

    return run


if __name__ == "__main__":
    guard(main)()
