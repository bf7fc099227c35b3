"""Checking a cursor handed to a follower before it resumes from it.

A follower's own cursors stand at batch boundaries, and their LSN is the first LSN of the
batch there. A cursor may also stand at a batch with an LSN *inside* it: the cursor right
after record k of a batch holding k and k+1 is the batch's place with LSN k+1 (what
``persistlog tail`` prints for every record). Resuming from it skips the batch's records
below that LSN. Anything else is a bad cursor, a :class:`ValueError` that names the nearest
batch boundaries: an offset that is not where a batch starts (reading there would look like
a damaged log), or an LSN the batch there does not hold.
"""

from __future__ import annotations

import bisect

from destinations import Destination

from .._format import constants as F
from .._format.crypt import OPAQUE
from .._format.decoder import Damage, parse_batch_header
from .reader import LogScanner


def records_to_skip(dest: Destination, log: int, segment: int, offset: int, next_lsn: int) -> int:
    """How many records of the batch at ``offset`` of log ``log`` segment ``segment`` a
    cursor with ``next_lsn`` resumes after (0 at a batch's first record, at a segment's
    start and at the end of what is written, which the follower handles as before).

    Raises ``ValueError`` for a cursor that names no batch boundary or an LSN outside the
    batch there, and ``FileNotFoundError`` when the segment is gone (retention: the
    follower resets or raises :class:`ResetRequired`).
    """
    if offset == 0:
        return 0
    name = F.segment_name(log, segment)
    size = dest.size(name)
    if offset + F.BATCH_HEADER_SIZE > size:
        return 0  # at the end (or a seal trailer): nothing there to resume inside
    where = f"cursor {log}:{segment}:{offset}:{next_lsn}"
    try:
        header = parse_batch_header(dest.read(name, offset, F.BATCH_HEADER_SIZE), offset)
    except Damage:
        if offset in _boundaries(dest, log, segment):
            return 0  # damage where a batch should start: the follower reports it
        raise ValueError(f"{where}: offset {offset} is not a batch boundary of {name} "
                         f"({_nearest(dest, log, segment, offset)})") from None
    first, count = header.first_lsn, header.lsn_count
    if next_lsn == first:
        return 0
    if first < next_lsn < first + count:
        return next_lsn - first
    held = f"LSNs {first}..{first + count - 1}" if count else f"control records only (next LSN {first})"
    raise ValueError(f"{where}: the batch at offset {offset} of {name} holds {held}, not LSN {next_lsn}")


def _boundaries(dest: Destination, log: int, segment: int) -> list[int]:
    """Where batches start and end in one segment (and where damage starts: a boundary
    too, which the follower then reports as it finds it), read by the one reader."""
    name = F.segment_name(log, segment)
    scanner = LogScanner(dest, log, [(segment, name)], recovery="skip", start=(segment, 0, None), tail_ok=True,
                         keys=OPAQUE)
    found = {F.SEGMENT_HEADER_SIZE}
    for batch in scanner:
        found.update((batch.offset, batch.end))
    found.update(sk.offset for sk in scanner.state.skipped)
    return sorted(found)


def _nearest(dest: Destination, log: int, segment: int, offset: int) -> str:
    points = _boundaries(dest, log, segment)
    i = bisect.bisect_left(points, offset)
    near = [f"{points[i - 1]}"] if i else []
    if i < len(points):
        near.append(f"{points[i]}")
    return "the nearest boundaries are at offsets " + " and ".join(near) if near else "it holds no batch"


__all__ = ["records_to_skip"]
