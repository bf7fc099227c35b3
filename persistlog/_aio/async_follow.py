"""``async for batch in follower``: a Follower driven from an event loop.

Every read (probes, sizes, segment bytes) and the decoding run on the loop's default
executor, one batch per hand-off, so memory stays bounded by the largest batch as when
iterating; the wait between polls is an ``asyncio.sleep`` on the loop. Only the loop's
default executor is used: no thread is held while the follower is idle.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._read.follower import FollowedBatch, Follower


async def followed_batches(follower: Follower) -> AsyncIterator[FollowedBatch]:
    """What ``iter(follower)`` yields, polled off the loop; see :meth:`Follower.__aiter__`."""
    loop = asyncio.get_running_loop()
    while not follower._stop.is_set():
        polled = follower._poll_once()
        got = False
        done = False
        try:
            while True:
                fb = await loop.run_in_executor(None, next, polled, None)
                if fb is None:
                    done = True
                    break
                if not got:
                    got = True
                    follower._caught_up.clear()
                yield fb
        finally:
            # Left mid-poll (break, error, cancellation): end the poll off the loop.
            if not done and isinstance(polled, Generator):
                await loop.run_in_executor(None, polled.close)
        if not got and follower._caught_up_now():
            await asyncio.sleep(follower.poll_interval)
