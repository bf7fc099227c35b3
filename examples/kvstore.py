"""A key-value service whose state lives in a dict and survives crashes.

    python examples/kvstore.py /tmp/kv-state --port 8080

    curl -X PUT localhost:8080/kv/user:1 -d '{"name": "Ada"}'     # 204 once durable
    curl localhost:8080/kv/user:1                                  # {"name": "Ada"}
    curl -X DELETE localhost:8080/kv/user:1
    curl localhost:8080/kv                                         # every key
    curl localhost:8080/stats                                      # the log's counters

Everything persistent is one line: ``persistlog.ResourceStore.open(url)`` restores the dict
from the log, opens the log for writing and rotates it when it grows; each assignment is
logged before it is applied. With ``durability="fsync"`` a request is answered only once
its change is on disk (concurrent requests share fsyncs), so a ``kill -9`` at any moment
loses nothing that was acknowledged. SIGTERM or Ctrl-C closes the log cleanly.

The URL may be any persistlog destination: a directory, ``s3://bucket/prefix``...
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import persistlog


class Handler(BaseHTTPRequestHandler):
    """JSON over HTTP on top of the store; ``server.store`` is the ResourceStore."""

    server: KVServer

    def _send(self, status: int, body: Any = None) -> None:
        data = b"" if body is None else json.dumps(body).encode() + b"\n"
        self.send_response(status)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _key(self) -> str | None:
        prefix = "/kv/"
        return self.path[len(prefix):] if self.path.startswith(prefix) and len(self.path) > len(prefix) else None

    def do_GET(self) -> None:  # noqa: N802 - the http.server naming
        store = self.server.store
        if self.path == "/kv":
            self._send(HTTPStatus.OK, store.to_dict())
        elif self.path == "/stats":
            self._send(HTTPStatus.OK, store.log.stats())
        elif (key := self._key()) is not None and key in store:
            self._send(HTTPStatus.OK, store[key])
        else:
            self._send(HTTPStatus.NOT_FOUND, {"error": "no such key"})

    def do_PUT(self) -> None:  # noqa: N802
        key = self._key()
        if key is None:
            self._send(HTTPStatus.NOT_FOUND, {"error": "PUT /kv/<key>"})
            return
        try:
            value = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        except ValueError:
            self._send(HTTPStatus.BAD_REQUEST, {"error": "the body must be JSON"})
            return
        # Logged (durably, in fsync mode) before it is applied, then acknowledged.
        self.server.store[key] = value
        self._send(HTTPStatus.NO_CONTENT)

    def do_DELETE(self) -> None:  # noqa: N802
        key = self._key()
        try:
            del self.server.store[key]
        except KeyError:
            self._send(HTTPStatus.NOT_FOUND, {"error": "no such key"})
            return
        self._send(HTTPStatus.NO_CONTENT)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep the example's output to what it is about


class KVServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: persistlog.ResourceStore) -> None:
        super().__init__(address, Handler)
        self.store = store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="where the state lives (a directory, s3://...)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument("--durability", default="fsync", choices=("buffered", "flush", "fsync"))
    parser.add_argument("--rotate-mb", type=float, default=64, help="start a new log after this much")
    args = parser.parse_args(argv)

    store = persistlog.ResourceStore.open(
        args.url, durability=args.durability, rotate_bytes=int(args.rotate_mb * 1024 * 1024)
    )
    restored = store.restored
    assert restored is not None
    print(
        f"restored {len(store)} keys from {restored.records} records (logs {restored.logs or '-'}"
        f"{', dropped a torn tail' if restored.torn_tail else ''})",
        flush=True,
    )
    server = KVServer((args.host, args.port), store)

    def shut_down(signum: int, frame: object) -> None:
        # serve_forever() must be stopped from another thread than the one it runs in.
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, shut_down)
    signal.signal(signal.SIGINT, shut_down)
    port = server.server_address[1]  # the one the OS picked, given --port 0
    print(f"listening on http://{args.host}:{port}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        store.close()  # seals the log: the next start reads where it ended in two small reads
    print(f"closed cleanly with {len(store)} keys", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
