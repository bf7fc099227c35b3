"""Reading segment files byte by byte in tests, through the project's one decoder, and
framing a batch by hand."""

from __future__ import annotations

import struct
import time
import zlib

from persistlog._format import decoder
from persistlog._format import constants as F


def batch_offsets(segment_path: str) -> list[tuple[int, int, int]]:
    """``(offset, size, kind)`` of every intact batch in a segment file, in order."""
    with open(segment_path, "rb") as f:
        return _intact_batches(f.read(), F.SEGMENT_HEADER_SIZE)


def batch_spans(data: bytes, start: int = F.SEGMENT_HEADER_SIZE) -> list[tuple[int, int]]:
    """``(offset, end)`` of every intact batch in segment bytes from ``start``, in order."""
    return [(pos, pos + size) for pos, size, _kind in _intact_batches(data, start)]


def _intact_batches(data: bytes, pos: int) -> list[tuple[int, int, int]]:
    out = []
    while pos + F.BATCH_HEADER_SIZE <= len(data):
        try:
            h = decoder.parse_batch_header(data[pos : pos + F.BATCH_HEADER_SIZE], pos)
        except decoder.Damage:
            break
        if pos + h.size > len(data):
            break
        out.append((pos, h.size, h.kind))
        pos += h.size
    return out


def update_batch_by_hand(payload: bytes, count: int, first_lsn: int) -> bytes:
    """An update batch of an unchained log framed after docs/FORMAT.md by hand: its
    checksums right, its payload as given (say, bytes that are not CBOR)."""
    head = struct.pack("<IIIH2sQqI", len(payload), len(payload), count, 0, b"PB", first_lsn,
                       time.time_ns() // 1000, zlib.crc32(payload))
    return head + struct.pack("<I", zlib.crc32(head)) + payload
