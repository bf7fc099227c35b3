"""Reading segment files byte by byte in tests, through the project's one decoder."""

from __future__ import annotations

from persistlog import _decoder
from persistlog import _format as F


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
            h = _decoder.parse_batch_header(data[pos : pos + F.BATCH_HEADER_SIZE], pos)
        except _decoder.Damage:
            break
        if pos + h.size > len(data):
            break
        out.append((pos, h.size, h.kind))
        pos += h.size
    return out
