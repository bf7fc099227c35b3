"""Finding what follows a reader's cursor by asking for the names that may come next.

A log grows by segments numbered without gaps, and logs follow one another by seq, so what
may follow segment ``s`` of log ``n`` is segment ``s+1`` of log ``n`` (unless log ``n`` is
sealed) and then segment 0 of log ``n+1``, nothing else. Readers that tail a log (followers,
the Spark stream's driver) ask for those two names (a size check each: a ``stat`` locally,
a ``HEAD`` on an object store) instead of listing: an idle poll costs at most two requests
and never a ``LIST``, whose price grows with the listing and is billed per request.

Two things the names alone cannot show. A secondary whose writer was detached goes on
with a later log number (a log declaring ``after_gap``); and retention may delete the logs
a slow reader stands in. So once every ``SKIP_CHECK_SECONDS`` a poll reads CURRENT in the
place of one probe (still two requests): if CURRENT names a log past the next one, a
listing says what is there (:meth:`SegmentProbe.skipped_log`).
"""

from __future__ import annotations

import time

from destinations import Destination

from .._format import constants as F
from .cursor import Cursor
from .reader import SegmentGone, list_logs, read_pointer

#: How often an idle reader reads CURRENT, looking for a later log that skipped the next
#: number (one that follows a gap on a secondary) or for retention having moved past it.
SKIP_CHECK_SECONDS = 5.0

# Sizes of objects remembered (objects never change once written), at most this many.
_SIZES_KEPT = 64


def next_segments(cur: Cursor, sealed: bool) -> list[tuple[str, Cursor]]:
    """The segments that may come right after the cursor's, in the order they are taken,
    each with the cursor at its start: the log's next segment (none once the log is sealed),
    then the next log's first. Anything else after the cursor's segment is a gap."""
    after = [] if sealed else [(F.segment_name(cur.log, cur.segment + 1), Cursor(cur.log, cur.segment + 1, 0, cur.next_lsn))]
    after.append((F.segment_name(cur.log + 1, 0), Cursor(cur.log + 1, 0, 0, cur.next_lsn)))
    return after


class SegmentProbe:
    """Asks a destination for the segments that may follow a cursor; remembers the sizes
    of objects it saw (they never change) and when CURRENT was last read."""

    def __init__(self, dest: Destination) -> None:
        self.dest = dest
        self._object_sizes: dict[str, int] = {}
        # At the first poll too: a reader resuming before a skipped number finds it at once.
        self._next_skip_check = 0.0
        #: Whether the last :meth:`following` left the next log unprobed (see there).
        self.deferred = False
        # What CURRENT named at this poll's check (None: not read, missing or damaged).
        self._pointer: int | None = None

    def size(self, name: str) -> int:
        """The segment's size (``FileNotFoundError`` when it is not there); an object's
        size is asked for once."""
        if self.dest.appendable:
            return self.dest.size(name)
        size = self._object_sizes.get(name)
        if size is None:
            size = self.dest.size(name)
            if len(self._object_sizes) >= _SIZES_KEPT:
                self._object_sizes.clear()
            self._object_sizes[name] = size
        return size

    def exists(self, name: str) -> bool:
        try:
            self.size(name)
        except FileNotFoundError:
            return False
        return True

    def following(self, cur: Cursor, sealed: bool) -> tuple[str, Cursor] | None:
        """The first of :func:`next_segments` that is there, with the cursor at its start;
        None when neither is yet. At most two requests: when the CURRENT check is due it
        comes in the place of one probe. A sealed log has one name to probe, so both are
        made; otherwise the next log's probe is made only if CURRENT names a log past the
        cursor's, and ``deferred`` says it was left for the next poll, which the reader
        makes at once (so one poll in ``SKIP_CHECK_SECONDS`` becomes two: "nothing new"
        is said only by a poll that asked for both names)."""
        self._pointer = None
        self.deferred = False
        check = time.monotonic() >= self._next_skip_check
        for name, nxt in next_segments(cur, sealed):
            if nxt.log != cur.log and check:
                self._next_skip_check = time.monotonic() + SKIP_CHECK_SECONDS
                self._pointer = read_pointer(self.dest)
                if not sealed and (self._pointer is None or self._pointer <= cur.log):
                    self.deferred = True
                    continue
            if self.exists(name):
                return name, nxt
        return None

    def check_again(self) -> None:
        """Read CURRENT at the next poll (after a gap was found, say)."""
        self._next_skip_check = 0.0

    def skipped_log(self, cur: Cursor) -> tuple[int, list[tuple[int, str]]] | None:
        """After :meth:`following` found nothing: the next log there and its segments, when
        it skipped numbers after the cursor's log (it must then declare a gap, or a log is
        missing). Lists only when this poll's CURRENT names a log past the next one.
        Raises :class:`SegmentGone` when the cursor's log is gone (retention moved past a
        reader that fell behind)."""
        pointer, self._pointer = self._pointer, None
        if pointer is None or pointer <= cur.log + 1:
            return None
        logs = list_logs(self.dest)
        if cur.log not in logs:
            raise SegmentGone(self.dest.url, cur.log, cur.segment)
        later = [seq for seq in logs if seq > cur.log]
        if not later or min(later) == cur.log + 1:
            return None  # the next log is there now: the next poll takes it
        return min(later), logs[min(later)]


__all__ = ["SKIP_CHECK_SECONDS", "SegmentProbe", "next_segments"]
