"""Putting framed batches of one log onto one destination, segment by segment.

Two strategies, picked by the destination's kind:

* :class:`AppendSegments` grows a local segment file by append, fsyncs on demand and rolls
  to a new segment at a size limit (syncing the old one first, so segments become durable
  in order);
* :class:`ObjectSegments` keeps batches in memory and writes each flush as a new immutable,
  create-only segment object, so an object store never sees an append or an overwrite.

Both are used under the Log's I/O lock: no method here is called concurrently.
"""

from __future__ import annotations

import logging
import time

from destinations import AppendFile, Destination

from . import _encoder
from . import _format as F

log = logging.getLogger("persistlog")


def now_us() -> int:
    """Commit times: microseconds since the Unix epoch."""
    return time.time_ns() // 1000


def seal_batch(next_lsn: int) -> bytes:
    """The control batch that ends a log whose successor starts at ``next_lsn``."""
    return _encoder.control_batch([{"t": F.CONTROL_SEAL, "next_lsn": next_lsn}], next_lsn, now_us())


def move_pointer(dest: Destination, seq: int) -> bool:
    """Point CURRENT at complete log ``seq``; False (logged) if that failed.

    CURRENT is a hint, so a failure is not fatal, but retention must wait for a move that
    succeeds (old logs go only once a newer complete log *and its pointer* are durable).
    """
    try:
        dest.replace(F.CURRENT_NAME, _encoder.pointer(seq))
    except OSError as e:
        log.warning("could not move %s/CURRENT to log %d: %s", dest.url, seq, e)
        return False
    return True


class SegmentWriter:
    """The writing end of one log at one destination."""

    def __init__(self, dest: Destination, seq: int, segment_bytes: int) -> None:
        self.dest = dest
        self.seq = seq
        self.segment_bytes = segment_bytes
        self.segment = -1
        self.bytes_written = 0
        self.sealed = False

    def start(self, first_lsn: int, header_batch: bytes) -> None:
        """Create segment 0 holding the log header; durable when this returns."""
        raise NotImplementedError

    def append(self, data: bytes, first_lsn: int, next_lsn: int) -> None:
        """Add batches covering LSNs ``[first_lsn, next_lsn)``."""
        raise NotImplementedError

    def flush(self) -> None:
        """Hand what was appended to the storage (the OS, or a PUT)."""

    def sync(self) -> None:
        """Make everything appended durable."""
        raise NotImplementedError

    def seal(self, seal_batch: bytes) -> None:
        """Write the seal batch and trailer, durably, and close."""
        raise NotImplementedError

    def close(self) -> None:
        """Let go of handles without sealing (the log stays open-ended)."""


class AppendSegments(SegmentWriter):
    def __init__(self, dest: Destination, seq: int, segment_bytes: int) -> None:
        super().__init__(dest, seq, segment_bytes)
        self._file: AppendFile | None = None
        self._size = 0

    def _open_segment(self, number: int, first_lsn: int, first_batch: bytes = b"") -> None:
        name = F.segment_name(self.seq, number)
        head = _encoder.segment_header(self.seq, number, first_lsn)
        self.dest.create(name, head + first_batch)
        self._file = self.dest.open_append(name)
        self._size = len(head) + len(first_batch)
        self.segment = number
        self.bytes_written += self._size

    def start(self, first_lsn: int, header_batch: bytes) -> None:
        self._open_segment(0, first_lsn, header_batch)

    def append(self, data: bytes, first_lsn: int, next_lsn: int) -> None:
        assert self._file is not None
        if self._size >= self.segment_bytes:
            # Durable in order: the full segment is synced before its successor exists.
            self._file.sync()
            self._file.close()
            self._open_segment(self.segment + 1, first_lsn)
        self._file.write(data)
        self._size += len(data)
        self.bytes_written += len(data)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def sync(self) -> None:
        if self._file is not None:
            self._file.sync()

    def seal(self, seal_batch: bytes) -> None:
        assert self._file is not None
        trailer = _encoder.seal_trailer(self._size)
        self._file.write(seal_batch + trailer)
        self._size += len(seal_batch) + len(trailer)
        self._file.sync()
        self.sealed = True
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class ObjectSegments(SegmentWriter):
    def __init__(self, dest: Destination, seq: int, segment_bytes: int) -> None:
        super().__init__(dest, seq, segment_bytes)
        self._pending: list[bytes] = []
        self._pending_first_lsn = 0
        self._next_lsn = 0

    def _put(self, extra: bytes = b"", trailer: bool = False) -> None:
        number = self.segment + 1
        head = _encoder.segment_header(self.seq, number, self._pending_first_lsn)
        body = b"".join(self._pending)
        tail = b""
        if trailer:
            tail = extra + _encoder.seal_trailer(len(head) + len(body))
        elif extra:
            body += extra
        data = head + body + tail
        self.dest.create(F.segment_name(self.seq, number), data)
        self.segment = number
        self.bytes_written += len(data)
        self._pending = []
        self._pending_first_lsn = self._next_lsn

    def start(self, first_lsn: int, header_batch: bytes) -> None:
        self._pending_first_lsn = self._next_lsn = first_lsn
        self._pending = [header_batch]
        self._put()

    def append(self, data: bytes, first_lsn: int, next_lsn: int) -> None:
        if not self._pending:
            self._pending_first_lsn = first_lsn
        self._pending.append(data)
        self._next_lsn = next_lsn

    @property
    def pending_bytes(self) -> int:
        return sum(len(p) for p in self._pending)

    def flush(self) -> None:
        if self._pending:
            self._put()

    def sync(self) -> None:
        self.flush()

    def seal(self, seal_batch: bytes) -> None:
        if not self._pending:
            self._pending_first_lsn = self._next_lsn
        self._put(seal_batch, trailer=True)
        self.sealed = True


def segment_writer(dest: Destination, seq: int, segment_bytes: int) -> SegmentWriter:
    cls = AppendSegments if dest.appendable else ObjectSegments
    return cls(dest, seq, segment_bytes)
