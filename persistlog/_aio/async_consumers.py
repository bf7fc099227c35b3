"""``async for batch in consumer``: a named consumer served to an event loop.

The group's poller thread stays the one reader of the log. Its handler for such a consumer
hands each batch to the loop (one at a time) and waits there until the
loop's ``async for`` asks for the next batch, which says the body finished the one before:
only then does the consumer's position move past it, as with a handler that returned. So
an ``async for`` body that raises or breaks out, or a task that is cancelled, leaves the
position before the batch it was in, and committing never stores a batch the loop did not
finish. While the loop works on a batch the poller waits, as it waits for any handler.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

from .._read.follower import FollowedBatch

# How often a poller waiting for the loop looks whether the iteration went away.
_LOOK = 0.1


class LoopClosed(Exception):
    """The ``async for`` over a consumer ended: the batch it had not finished stays untaken."""


class LoopHandoff:
    """The handler of a consumer iterated from ``loop`` (poller side), and the iteration
    itself (loop side)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, stopping: threading.Event) -> None:
        self.loop = loop
        self._stopping = stopping  # the group's: a poller being stopped waits no more
        # One batch at most in it: the poller hands the next only once this one is finished.
        self._queue: asyncio.Queue[FollowedBatch] = asyncio.Queue()
        self._finished = threading.Event()  # the loop asked for the batch after the last one
        self._iterating = False
        self._gone = threading.Event()  # the iteration ended (or the loop closed)

    def __call__(self, batch: FollowedBatch) -> None:
        """On the poller thread: hand ``batch`` over and wait until the loop finished it."""
        self._finished.clear()
        try:
            # Not waiting for the loop to take it: a loop that called a blocking stop() of
            # the group never would.
            self.loop.call_soon_threadsafe(self._queue.put_nowait, batch)
        except RuntimeError as e:  # the loop is closed
            raise LoopClosed(f"the event loop of this consumer is gone: {e}") from None
        while not self._finished.wait(_LOOK):
            if self._gone.is_set() or self.loop.is_closed():
                raise LoopClosed("the async for over this consumer ended before it finished a batch")
            if self._stopping.is_set():
                raise LoopClosed("the group stopped while the loop worked on a batch")

    async def batches(self) -> AsyncIterator[FollowedBatch]:
        """On the loop: each batch, once the one before was finished."""
        if self._iterating:
            raise RuntimeError("this consumer is iterated already")
        self._iterating = True
        try:
            while True:
                batch = await self._queue.get()
                yield batch
                self._finished.set()
        finally:
            self._gone.set()


__all__ = ["LoopClosed", "LoopHandoff"]
