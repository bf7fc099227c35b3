"""The asyncio process ``test_crash.py`` kills with SIGKILL: crash_child.py's app on an event loop.

``python crash_child_async.py URL SEED TASKS MODE``, with crash_child.py's lines on stdout
(``I``/``A``/``O``/``E+``/``E-``/``C+``/``C-``/``X``; ``t`` is a task number here). It
restores URL with ``restore_async``, opens it with ``open_async(durability="fsync")`` and
small rotation triggers, and runs TASKS updater tasks on one loop, each owning its keys
and holding its own ``asyncio.Lock`` while it logs and applies a change; the enumeration
(on the rotation thread) takes those locks through the loop. ``A`` is written once the
awaited ``update()`` returned: the change is acknowledged durable.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import sys
import time
import traceback
from typing import Any

from crash_child import log_options, out
import kv_app

import persistlog


async def main() -> None:
    url, seed, ntasks, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    data: dict[str, Any] = {}
    locks = [asyncio.Lock() for _ in range(ntasks)]

    apply = functools.partial(kv_app.apply, data)
    await persistlog.restore_async(url, apply)

    def owner(key: str) -> int:
        return int(key[1: key.index("k")])

    async def list_keys() -> list[str]:
        # No change in flight: one being made now was logged into the old log.
        for lock in locks:
            await lock.acquire()
        keys = sorted(data)
        for lock in locks:
            lock.release()
        return keys

    async def hold(key: str) -> Any:
        lock = locks[owner(key)] if owner(key) < len(locks) else None
        if lock is not None:
            await lock.acquire()
        return lock, data.get(key)

    def enumerate_all(emit: Any) -> None:
        out("E+")
        keys = asyncio.run_coroutine_threadsafe(list_keys(), loop).result()
        for key in keys:
            lock, value = asyncio.run_coroutine_threadsafe(hold(key), loop).result()
            try:
                if value is not None:
                    emit({"op": "put", "key": key, "value": value})
            finally:
                if lock is not None:
                    loop.call_soon_threadsafe(lock.release)
            if mode == "enum":
                time.sleep(0.004)
        out("E-")

    options = log_options(rng)

    async def open_log() -> persistlog.AsyncLog:
        alog = await persistlog.open_async(url, enumerate_all, concurrent_enumeration=True, **options)
        out(f"O {alog.seq} {alog.next_lsn}")
        return alog

    state = {"log": await open_log()}
    gate = asyncio.Condition()
    paused = False
    active = 0

    async def worker(t: int) -> None:
        nonlocal active
        wrng = random.Random(seed * 100 + t)
        j = 0
        while True:
            async with gate:
                await gate.wait_for(lambda: not paused)
                active += 1
            try:
                key = f"t{t}k{wrng.randrange(5)}"
                async with locks[t]:
                    if wrng.random() < 0.2:
                        record: dict[str, Any] = {"op": "del", "key": key}
                        out(f"I {t} {j} del {key} -")
                    else:
                        record = {"op": "put", "key": key, "value": f"v{t}.{j}"}
                        out(f"I {t} {j} put {key} {record['value']}")
                    lsn = await state["log"].update(record)
                    apply(record)
                out(f"A {t} {j} {lsn}")
                j += 1
            finally:
                async with gate:
                    active -= 1
                    gate.notify_all()
            if wrng.random() < 0.1:
                await asyncio.sleep(0.001)

    workers = [asyncio.create_task(guard(worker(t))) for t in range(ntasks)]  # noqa: F841 - kept alive
    while True:
        await asyncio.sleep(rng.uniform(0.002, 0.02))
        roll = rng.random()
        alog = state["log"]
        if mode == "close" and roll < 0.5 or roll < 0.05:
            async with gate:
                paused = True
                await gate.wait_for(lambda: active == 0)
            out("C+")
            await alog.close()
            out("C-")
            await persistlog.restore_async(url, lambda r: None)  # what the next open asks of this process
            state["log"] = await open_log()
            async with gate:
                paused = False
                gate.notify_all()
        elif roll < 0.3:
            await alog.rotate(wait=rng.random() < 0.5)


async def guard(coro: Any) -> None:
    try:
        await coro
    except BaseException as e:  # report, then die loudly
        out("X " + repr(e).replace("\n", " "))
        traceback.print_exc()
        os._exit(3)


if __name__ == "__main__":
    asyncio.run(guard(main()))
