"""An asyncio app for the AsyncLog tests: ``examples/async_kv.py``'s state and locks.

The example holds docs/asyncio.md's recipe for the concurrency contract (each change is
logged and applied holding its key's stripe lock, an ``asyncio.Lock``; the enumeration, on
the rotation thread, takes the same locks through the loop), so the tests exercise the
code users copy. This adds the tests' conveniences: ``put``/``delete``, a count of
enumerations and a hook after each emitted record.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import persistlog

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from async_kv import KV  # noqa: E402


class AsyncApp(KV):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.enumerations = 0
        self.on_emit: Callable[[], None] = lambda: None  # e.g. a pause, to widen the window

    async def open(self, url: str, **options: Any) -> persistlog.AsyncLog:
        options.setdefault("concurrent_enumeration", True)  # the stripe locks keep the contract
        self.log = await persistlog.open_async(url, self.enumerate_all, **options)
        return self.log

    async def put(self, key: Any, value: Any) -> int:
        return await self.change({"op": "put", "key": key, "value": value})

    async def delete(self, key: Any) -> int:
        return await self.change({"op": "del", "key": key})

    def enumerate_all(self, emit: Callable[[Any], None]) -> None:
        self.enumerations += 1

        def emit_then_hook(record: Any) -> None:
            emit(record)
            self.on_emit()

        super().enumerate_all(emit_then_hook)
