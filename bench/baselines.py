"""What persistlog is compared with, run in the same process on the same records.

* the naive loop: per record ``cbor2.dumps``, an 8-byte header
  ``struct.pack('<II', len, zlib.crc32(b))`` and one ``f.write`` to a local file;
* sqlite3 in WAL mode: ``executemany`` of ``(key, value blob)`` in one transaction, read
  back with ``SELECT key, value FROM kv ORDER BY rowid``; or one CBOR blob per record
  (``log`` table) read back with ``SELECT record ... ORDER BY rowid``;
* the naive loop's file read back record by record (header, CRC, ``cbor2.loads``);
* JSON lines: ``json.dumps`` and one write per record, read back with ``json.loads`` per line.

Every writer ends with its data durable (``fsync``, or sqlite's commit in WAL mode with
``synchronous=FULL``), like persistlog's runs that end with ``log.sync()``. Every reader
rebuilds the same ``{key: value}`` dict as persistlog's replay callbacks do; sqlite's blob
is the CBOR of the value, decoded on the way back.
"""

from __future__ import annotations

import json
import os
import sqlite3
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import cbor2

_header_struct = struct.Struct("<II")
_header = _header_struct.pack
_crc32 = zlib.crc32


def naive_write(records: Sequence[Any], path: str) -> None:
    dumps = cbor2.dumps
    with open(path, "wb") as f:
        write = f.write
        for r in records:
            b = dumps(r)
            write(_header(len(b), _crc32(b)) + b)
        f.flush()
        os.fsync(f.fileno())


def _sqlite_insert(path: str, table: str, insert: str, rows: Iterable[tuple[Any, ...]]) -> None:
    """``rows`` into a durable (WAL, synchronous=FULL) sqlite3 table, in one transaction."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table}")
        with conn:
            conn.executemany(insert, rows)
    finally:
        conn.close()


def sqlite_write(records: Sequence[dict[str, Any]], path: str) -> None:
    dumps = cbor2.dumps
    _sqlite_insert(path, "kv (key INTEGER, value BLOB)", "INSERT INTO kv (key, value) VALUES (?, ?)",
                   ((r["key"], dumps(r["value"])) for r in records))


def sqlite_read(path: str) -> dict[Any, Any]:
    loads = cbor2.loads
    state: dict[Any, Any] = {}
    conn = sqlite3.connect(path)
    try:
        for key, blob in conn.execute("SELECT key, value FROM kv ORDER BY rowid"):
            state[key] = loads(blob)
    finally:
        conn.close()
    return state


def sqlite_write_records(records: Sequence[Any], path: str) -> None:
    """The same records persistlog logs, one CBOR blob per row (a log table in sqlite3)."""
    dumps = cbor2.dumps
    _sqlite_insert(path, "log (record BLOB)", "INSERT INTO log (record) VALUES (?)", ((dumps(r),) for r in records))


def sqlite_read_records(path: str) -> dict[Any, Any]:
    """Read the log table back in order, applying each record as restore's replay does."""
    loads = cbor2.loads
    state: dict[Any, Any] = {}
    conn = sqlite3.connect(path)
    try:
        for (blob,) in conn.execute("SELECT record FROM log ORDER BY rowid"):
            r = loads(blob)
            state[r["key"]] = r["value"]
    finally:
        conn.close()
    return state


def sqlite_read_applying(path: str, apply: Callable[[Any], None]) -> None:
    """The log table read back in order, each record decoded and given to ``apply``:
    the same per-record work as a restore's replay, over sqlite3's ordered read."""
    loads = cbor2.loads
    conn = sqlite3.connect(path)
    try:
        for (blob,) in conn.execute("SELECT record FROM log ORDER BY rowid"):
            apply(loads(blob))
    finally:
        conn.close()


def naive_read(path: str, apply: Callable[[Any], None]) -> None:
    """The naive loop's file read back: per record, its 8-byte header, a CRC check,
    ``cbor2.loads`` and ``apply``."""
    loads = cbor2.loads
    unpack = _header_struct.unpack_from
    with open(path, "rb") as f:
        data = f.read()
    pos, end = 0, len(data)
    while pos < end:
        length, crc = unpack(data, pos)
        body = data[pos + 8 : pos + 8 + length]
        if _crc32(body) != crc:
            raise ValueError(f"naive log damaged at {pos}")
        apply(loads(body))
        pos += 8 + length


def sqlite_checkpoint(path: str) -> None:
    """Fold the WAL into the database file, so its size is the data's size."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def jsonl_write(records: Sequence[Any], path: str) -> None:
    dumps = json.dumps
    with open(path, "w") as f:
        write = f.write
        for r in records:
            write(dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())


def jsonl_read(path: str) -> dict[Any, Any]:
    loads = json.loads
    state: dict[Any, Any] = {}
    with open(path) as f:
        for line in f:
            r = loads(line)
            state[r["key"]] = r["value"]
    return state
