"""A Log's files at a local destination: finding and inspecting segments, damaging them as
crashes and bad disks do, and ``crash``, a Log abandoned the way a killed process leaves it.

No mocks: a "crash" abandons a real Log the way a killed process would (its threads stop,
its file handles and flock go away, nothing is sealed and bytes still in user space are
lost); torn writes are made by truncating real segment files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import persistlog
from batches import batch_offsets
from persistlog._format import decoder
from persistlog._format import constants as F
from persistlog._write import at_exit as persistlog_exit
from persistlog._write.log import parts_of

# -- crashes ------------------------------------------------------------------------------


def crash(lg: persistlog.Log) -> None:
    """Abandon ``lg`` as if its process had been killed.

    Stops its background threads (waiting for a rotation that is already running: tests
    call this between operations), drops the bytes still in user space (the Log's pending
    batch and the append file's buffer), closes the file descriptors and releases the flock
    without sealing anything. What the OS already has stays: this is a process crash. To
    also lose unsynced OS data (a power loss), cut the newest segment afterwards with
    :func:`truncate`.
    """
    parts = parts_of(lg)
    lg._stop_background()
    parts.rotator.close()
    lg._restore_signal()
    with parts.writer.io_lock:
        # Records still pending in the Log's memory are simply never written.
        sw = parts.writer.current
        f = getattr(sw, "_file", None)
        if f is not None:
            with f._lock:
                f._buffer.clear()
            f.close()
        parts.writer.close_to_updates()
    parts.lease.release()
    lg.dest.close()
    # A killed process seals nothing at its exit.
    lg._close_done = True
    persistlog_exit.forget(lg)


# -- files --------------------------------------------------------------------------------


def segment_files(path: str | os.PathLike[str]) -> list[str]:
    """Full paths of the segment files in ``path``, in (seq, segment) order."""
    names = sorted(n for n in os.listdir(path) if F.parse_segment_name(n) is not None)
    return [os.path.join(path, n) for n in names]


def log_seqs(path: str | os.PathLike[str]) -> list[int]:
    """The seqs of the logs present in ``path``."""
    seqs = {F.parse_segment_name(n)[0] for n in os.listdir(path) if F.parse_segment_name(n)}  # type: ignore[index]
    return sorted(seqs)


def creation_size(segment_path: str) -> int:
    """Bytes a segment held when it was created (durably): its header, plus the log header
    batch for segment 0."""
    with open(segment_path, "rb") as f:
        data = f.read(F.SEGMENT_HEADER_SIZE + F.BATCH_HEADER_SIZE)
    sh = decoder.parse_segment_header(data)
    if sh.segment != 0:
        return F.SEGMENT_HEADER_SIZE
    head = decoder.parse_batch_header(data[F.SEGMENT_HEADER_SIZE:], F.SEGMENT_HEADER_SIZE)
    return F.SEGMENT_HEADER_SIZE + head.size


def durable_floor(segment_path: str) -> int:
    """Bytes of a segment known durable from its own contents: its creation size, or the
    end of its last control batch (the writer syncs right after a snapshot-complete marker,
    which a background rotation may have written after the test's last durable ack)."""
    floor = creation_size(segment_path)
    for offset, size, kind in batch_offsets(segment_path):
        if kind == F.KIND_CONTROL:
            floor = max(floor, offset + size)
    return floor


def segment_sizes(path: str | os.PathLike[str]) -> dict[str, int]:
    """``{segment file name: size}`` right now (files deleted meanwhile are left out)."""
    sizes = {}
    for p in segment_files(path):
        try:
            sizes[os.path.basename(p)] = os.path.getsize(p)
        except FileNotFoundError:
            pass  # retention of a live writer
    return sizes




def fill_disk(lg: persistlog.Log) -> None:
    """Make the primary's current segment file reject writes as a full disk does: its
    descriptor now points at ``/dev/full`` (every write fails with ENOSPC, for real). The
    test process holds a few logs, far under the open-file cache's limit: the descriptor
    stays open, so the swap lasts."""
    f = parts_of(lg).writer.current._file._file  # type: ignore[union-attr]
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        os.dup2(full, f.fileno())
    finally:
        os.close(full)


def _scanners(url: str, only: int | None = None) -> Iterator[Any]:
    """A LogScanner per log at ``url`` (or for log ``only``), in order; iterate each."""
    from destinations import open_destination
    from persistlog._read.reader import LogScanner, list_logs

    dest = open_destination(url)
    for seq, segments in sorted(list_logs(dest).items()):
        if only is None or seq == only:
            yield LogScanner(dest, seq, segments)


def app_batches(url: str) -> list[tuple[int, int]]:
    """``(first LSN, record count)`` of every batch of records at ``url``, in order."""
    return [(b.first_lsn, b.header.count) for sc in _scanners(url) for b in sc if not b.is_control]


def _scanned_state(url: str, seq: int) -> Any:
    (scanner,) = _scanners(url, seq)
    for _batch in scanner:
        pass
    return scanner.state


def is_complete_log(url: str, seq: int) -> bool:
    """Whether log ``seq`` at ``url`` holds its snapshot-complete marker."""
    return bool(_scanned_state(url, seq).complete)


def is_sealed_log(url: str, seq: int) -> bool:
    return bool(_scanned_state(url, seq).sealed)


def truncate(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def flip_bit(path: str, offset: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ (1 << bit)]))
