"""An asyncio key-value service whose state lives in a dict and survives crashes.

    python examples/async_kv.py /tmp/akv-state --port 7070

    printf '%s\\n' '{"op": "put", "key": "user:1", "value": {"name": "Ada"}}' | nc -q1 localhost 7070
    # {"ok": true, "lsn": 2}                         (sent once the change is on disk)
    printf '%s\\n' '{"op": "get", "key": "user:1"}' | nc -q1 localhost 7070
    # {"ok": true, "value": {"name": "Ada"}}

One JSON request per line, one JSON answer per line: ``put`` (key, value), ``get`` (key),
``del`` (key), ``keys``, ``stats``. Every connection is a task on one event loop; nothing
blocks the loop. ``persistlog.restore_async`` rebuilds the dict, ``persistlog.open_async``
opens the log with ``durability="fsync"``: a change is answered only once it is on disk,
and the changes of all the connections waiting at the same moment share one fsync. A
``kill -9`` at any moment loses nothing that was answered. SIGTERM or Ctrl-C closes the
log cleanly.

The concurrency contract, the asyncio way: a change is logged and applied holding its
key's lock (an ``asyncio.Lock``, one per stripe of keys), and ``enumerate_all``, which
persistlog calls on one of its worker threads, takes the same locks through the loop while it
emits the keys they guard (``asyncio.run_coroutine_threadsafe``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import persistlog

T = TypeVar("T")
STRIPES = 256


class KV:
    """The state (a dict), its locks and its log."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.data: dict[str, Any] = {}
        self.locks = [asyncio.Lock() for _ in range(STRIPES)]
        self.log: persistlog.AsyncLog | None = None

    def replay(self, record: dict[str, Any]) -> None:
        if record["op"] == "put":
            self.data[record["key"]] = record["value"]
        else:
            self.data.pop(record["key"], None)

    async def change(self, record: dict[str, Any]) -> int:
        """Log a change, then apply it; returns once it is durable."""
        assert self.log is not None
        async with self.locks[hash(record["key"]) % STRIPES]:
            try:
                lsn = await self.log.update(record)
            except asyncio.CancelledError:
                self.replay(record)  # the client left, but the record is in the log
                raise
            self.replay(record)
            return lsn

    # -- on a persistlog worker thread -----------------------------------------------

    def enumerate_all(self, emit: Callable[[Any], None]) -> None:
        keys = self._on_loop(self._keys())
        stripes: dict[int, list[str]] = {}
        for key in keys:
            stripes.setdefault(hash(key) % STRIPES, []).append(key)
        for stripe, members in stripes.items():
            values = self._on_loop(self._hold(stripe, members))
            try:
                for key, value in values:
                    emit({"op": "put", "key": key, "value": value})
            finally:
                self.loop.call_soon_threadsafe(self.locks[stripe].release)

    def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _keys(self) -> list[str]:
        # Listed with no change in flight: a key being created now was logged into the
        # previous log, and must be in this one's enumeration.
        for lock in self.locks:
            await lock.acquire()
        try:
            return list(self.data)
        finally:
            for lock in self.locks:
                lock.release()

    async def _hold(self, stripe: int, keys: list[str]) -> list[tuple[str, Any]]:
        await self.locks[stripe].acquire()  # released by enumerate_all once emitted
        return [(k, self.data[k]) for k in keys if k in self.data]


async def answer(kv: KV, request: Any) -> dict[str, Any]:
    if not isinstance(request, dict) or not isinstance(request.get("key", ""), str):
        return {"ok": False, "error": "a request is a JSON object with a string key"}
    op = request.get("op")
    if op == "put" and "key" in request and "value" in request:
        return {"ok": True, "lsn": await kv.change({"op": "put", "key": request["key"], "value": request["value"]})}
    if op == "del" and "key" in request:
        return {"ok": True, "lsn": await kv.change({"op": "del", "key": request["key"]})}
    if op == "get" and "key" in request:
        if request["key"] in kv.data:
            return {"ok": True, "value": kv.data[request["key"]]}
        return {"ok": False, "error": "no such key"}
    if op == "keys":
        return {"ok": True, "keys": sorted(kv.data)}
    if op == "stats":
        assert kv.log is not None
        return {"ok": True, "stats": kv.log.stats()}
    return {"ok": False, "error": f"unknown request {request!r}"}


async def serve(kv: KV, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while line := await reader.readline():
            try:
                reply = await answer(kv, json.loads(line))
            except json.JSONDecodeError as e:
                reply = {"ok": False, "error": f"not JSON: {e}"}
            except TypeError as e:  # a value the log cannot encode
                reply = {"ok": False, "error": str(e)}
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="where the state lives (a directory, s3://...)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7070, help="0 picks a free port")
    parser.add_argument("--durability", default="fsync", choices=("buffered", "flush", "fsync"))
    parser.add_argument("--rotate-records", type=int, default=None, help="start a new log after this many changes")
    args = parser.parse_args(argv)

    loop = asyncio.get_running_loop()
    kv = KV(loop)
    # Restored before anything is served; the replay runs on a worker thread meanwhile.
    await persistlog.restore_async(args.url, kv.replay)
    print(f"restored {len(kv.data)} keys from {args.url}", flush=True)
    kv.log = await persistlog.open_async(
        args.url, kv.enumerate_all, durability=args.durability, rotate_records=args.rotate_records,
        concurrent_enumeration=True,  # the stripe locks keep the concurrency contract
    )
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = await asyncio.start_server(lambda r, w: serve(kv, r, w), args.host, args.port)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"listening on {host}:{port} (durability={args.durability})", flush=True)
    async with server:
        await stop.wait()
    await kv.log.close()
    print(f"closed cleanly with {len(kv.data)} keys", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
