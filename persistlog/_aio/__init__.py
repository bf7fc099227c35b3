"""The asyncio face: AsyncLog, its commit thread, ``async for`` over followers and consumers."""
