"""An asyncio app for the AsyncLog tests: a dict of resources changed by tasks on one loop.

It follows README.md's asyncio recipe for the concurrency contract: each change is logged
and applied holding its key's stripe lock (an ``asyncio.Lock``); the enumeration, which
runs on the Log's rotation thread, takes the same locks through the loop (all of them to
list the keys, so no change is in flight; then one stripe at a time while it emits that
stripe's keys). A task cancelled while its record is being written still applies the
change: the record is in the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import persistlog

T = TypeVar("T")

STRIPES = 64


class AsyncApp:
    def __init__(self, loop: asyncio.AbstractEventLoop, state: dict[Any, Any] | None = None) -> None:
        self.loop = loop
        self.data: dict[Any, Any] = dict(state or {})
        self.locks = [asyncio.Lock() for _ in range(STRIPES)]
        self.alog: persistlog.AsyncLog | None = None
        self.enumerations = 0
        self.on_emit: Callable[[], None] = lambda: None  # e.g. a pause, to widen the window

    async def open(self, url: str, **options: Any) -> persistlog.AsyncLog:
        self.alog = await persistlog.open_async(url, self.enumerate_all, **options)
        return self.alog

    def _lock(self, key: Any) -> asyncio.Lock:
        return self.locks[hash(key) % STRIPES]

    async def change(self, record: dict[str, Any], sync: bool | None = None) -> int:
        """Log ``record`` (``{"op": "put"|"del", "key", "value"}``), then apply it."""
        assert self.alog is not None
        async with self._lock(record["key"]):
            try:
                lsn = await self.alog.update(record, sync=sync)
            except asyncio.CancelledError:
                self._apply(record)  # the record is in the log: memory follows it
                raise
            self._apply(record)
        return lsn

    async def put(self, key: Any, value: Any, sync: bool | None = None) -> int:
        return await self.change({"op": "put", "key": key, "value": value}, sync)

    async def delete(self, key: Any, sync: bool | None = None) -> int:
        return await self.change({"op": "del", "key": key}, sync)

    def _apply(self, record: dict[str, Any]) -> None:
        if record["op"] == "put":
            self.data[record["key"]] = record["value"]
        else:
            self.data.pop(record["key"], None)

    # -- on the rotation thread ---------------------------------------------------------

    def enumerate_all(self, emit: Callable[[Any], None]) -> None:
        self.enumerations += 1
        keys = self._on_loop(self._keys())
        stripes: dict[int, list[Any]] = {}
        for key in keys:
            stripes.setdefault(hash(key) % STRIPES, []).append(key)
        for stripe, members in sorted(stripes.items()):
            values = self._on_loop(self._hold(stripe, members))
            try:
                for key, value in values:
                    emit({"op": "put", "key": key, "value": value})
                    self.on_emit()
            finally:
                self.loop.call_soon_threadsafe(self.locks[stripe].release)

    def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _keys(self) -> list[Any]:
        """Every key, listed while no change is in flight: one being made now was logged
        into the old log and must be in this list."""
        for lock in self.locks:
            await lock.acquire()
        try:
            return list(self.data)
        finally:
            for lock in self.locks:
                lock.release()

    async def _hold(self, stripe: int, keys: list[Any]) -> list[tuple[Any, Any]]:
        """Take a stripe's lock (released by the enumeration) and read its live keys."""
        await self.locks[stripe].acquire()
        return [(k, self.data[k]) for k in keys if k in self.data]
