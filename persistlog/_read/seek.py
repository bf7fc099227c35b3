"""Finding a position in the logs of a destination without reading what lies before it.

A position is the oldest retained record, an LSN, or a commit time. Logs are found by name,
segments by their 40-byte headers (each names the LSN its first record takes), records by
batch headers (first LSN, count, commit time): a seek reads one listing, the first bytes of
O(log n) logs and segments (binary search), and the batch headers of one segment, never a
payload. Where a position is not held (before what retention left, past the end, inside a
gap a secondary's writer declared) it raises :class:`PositionError` naming what is there.

Commit times are the writer's wall clock, one per batch (``FORMAT.md``, "Batch"); a time
seek takes them as non-decreasing, as one writer writes them. Where a clock stepped back,
a time names the first batch at or after it in the segment the search lands in.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from destinations import Destination

from .._errors import CorruptLogError, LogNotFoundError, PositionError
from .._format import constants as F
from .._format.decoder import BatchHeader, Damage, parse_batch_header, parse_segment_header
from .reader import RESYNC_ATTEMPTS, SegmentBytes, declares_gap, list_logs, no_log, outrun

# Reads while walking batch headers of a local segment: most of a window is payload the
# walk skips, so windows are small; objects are read whole in one GET (SegmentBytes.open).
WALK_CHUNK = 64 * 1024

Logs = dict[int, list[tuple[int, str]]]


@dataclass(frozen=True)
class Place:
    """Where a position is: the batch holding LSN ``lsn`` starts at ``offset`` of segment
    ``segment`` of log ``log`` and its first LSN is ``batch_lsn`` (offset 0: the segment's
    start, whose header names ``batch_lsn``). ``at_end`` when nothing is written at
    ``lsn`` yet: ``offset`` is then where the next batch will go."""

    log: int
    segment: int
    offset: int
    lsn: int
    batch_lsn: int
    at_end: bool = False

    @property
    def scan_start(self) -> tuple[int, int, int]:
        """Where a :class:`~persistlog._read.reader.LogScanner` resumes to read from here."""
        return self.segment, self.offset, self.batch_lsn


def utc_micros(when: datetime) -> int:
    """``when`` (a timezone-aware datetime) in microseconds since the Unix epoch."""
    if not isinstance(when, datetime):
        raise TypeError(f"a time position must be a datetime, not {type(when).__name__}")
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"a time position must be timezone-aware (e.g. tzinfo=timezone.utc), not {when!r}")
    delta = when - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _iso(us: int | None) -> str:
    if us is None:
        return "unknown"
    return datetime.fromtimestamp(us / 1e6, timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class _Walked:
    """What a walk of one segment's batch headers found up to where it stopped."""

    end: int  # offset where the walk stopped (the end of the last whole batch)
    next_lsn: int  # the LSN due there
    last_commit_us: int | None
    damaged: bool  # stopped at a header that does not parse, not at the end of the data


class LogView:
    """The logs at a destination from one listing, read header by header and remembered."""

    def __init__(self, dest: Destination) -> None:
        self.dest = dest
        self.logs: Logs = list_logs(dest)
        if not self.logs:
            raise no_log(dest)
        self.seqs = sorted(self.logs)
        self._heads: dict[str, tuple[int, int | None]] = {}

    # -- what the first bytes of a segment say -------------------------------------------------

    def _head(self, seq: int, number: int, name: str) -> tuple[int, int | None]:
        """``(first LSN, commit time of its first batch or None)`` of one segment."""
        got = self._heads.get(name)
        if got is None:
            data = self.dest.read(name, 0, F.SEGMENT_HEADER_SIZE + F.BATCH_HEADER_SIZE)
            try:
                sh = parse_segment_header(data[:F.SEGMENT_HEADER_SIZE])
            except Damage as d:
                raise CorruptLogError(d.reason, destination=self.dest.url, log=seq, segment=name, offset=0) from None
            if sh.seq != seq or sh.segment != number:
                raise CorruptLogError(f"segment header says log {sh.seq} segment {sh.segment}",
                                      destination=self.dest.url, log=seq, segment=name, offset=0)
            commit: int | None = None
            try:
                commit = parse_batch_header(data[F.SEGMENT_HEADER_SIZE:], F.SEGMENT_HEADER_SIZE).commit_us
            except Damage:
                pass  # no whole batch yet (a segment just created), or damage a read reports
            got = self._heads[name] = (sh.first_lsn, commit)
        return got

    def first_lsn(self, seq: int, index: int = 0) -> int:
        number, name = self.logs[seq][index]
        return self._head(seq, number, name)[0]

    def first_commit(self, seq: int, index: int = 0) -> int | None:
        number, name = self.logs[seq][index]
        return self._head(seq, number, name)[1]

    # -- batch headers ------------------------------------------------------------------------

    def batches(self, seq: int, number: int, name: str, walked: _Walked | None = None
                ) -> Iterator[tuple[int, BatchHeader]]:
        """``(offset, header)`` of every whole batch of a segment, payloads unread. When it
        ends, ``walked`` (if given) says where and why."""
        first, _commit = self._head(seq, number, name)
        if self.dest.appendable:
            seg = SegmentBytes(self.dest, name, self.dest.size(name), chunk=WALK_CHUNK)
        else:
            seg = SegmentBytes.open(self.dest, name, 0)
        pos, next_lsn, damaged, commit = F.SEGMENT_HEADER_SIZE, first, False, None
        while pos + F.BATCH_HEADER_SIZE <= seg.size:
            try:
                header = parse_batch_header(seg.get(pos, F.BATCH_HEADER_SIZE), pos)
            except Damage:
                damaged = True
                break
            if pos + header.size > seg.size:
                break  # a batch being written (or torn): the end of what is there
            yield pos, header
            next_lsn = header.first_lsn + header.lsn_count
            commit = header.commit_us
            pos += header.size
        # What follows a seal batch is its 16-byte trailer, short of a header: the end too.
        if walked is not None:
            walked.end, walked.next_lsn, walked.last_commit_us, walked.damaged = pos, next_lsn, commit, damaged

    # -- what is there ------------------------------------------------------------------------

    def is_last(self, seq: int, index: int) -> bool:
        return seq == self.seqs[-1] and index == len(self.logs[seq]) - 1

    def end(self) -> tuple[Place, int | None]:
        """The end of the newest log (where the next batch goes) and the commit time of its
        last batch."""
        seq = self.seqs[-1]
        for index in range(len(self.logs[seq]) - 1, -1, -1):
            number, name = self.logs[seq][index]
            walked = _Walked(0, 0, None, False)
            for _ in self.batches(seq, number, name, walked):
                pass
            if walked.last_commit_us is not None or index == 0:
                last = self.logs[seq][-1]
                if index != len(self.logs[seq]) - 1:  # later segments hold no batch yet
                    return Place(seq, last[0], 0, walked.next_lsn, walked.next_lsn, True), walked.last_commit_us
                return Place(seq, number, walked.end, walked.next_lsn, walked.next_lsn, True), walked.last_commit_us
        raise AssertionError("unreachable: a log has segment 0")

    def earliest(self) -> Place:
        seq = self.seqs[0]
        number, _name = self.logs[seq][0]
        if number != 0:
            raise CorruptLogError(f"log starts at segment {number}, segment 0 is missing",
                                  destination=self.dest.url, log=seq, segment=self.logs[seq][0][1], offset=0)
        first = self.first_lsn(seq)
        return Place(seq, 0, 0, first, first)

    def not_held(self, what: str) -> PositionError:
        """The error for a position that is not here, naming what is."""
        first = self.earliest()
        end, last_us = self.end()
        first_us = self.first_commit(first.log)
        last_lsn = end.lsn - 1
        if last_lsn < first.lsn:
            held = f"it holds no record yet (the next takes LSN {end.lsn})"
        else:
            held = (f"it holds LSNs {first.lsn}..{last_lsn}, committed {_iso(first_us)} .. {_iso(last_us)}"
                    f" (logs {self.seqs[0]}..{self.seqs[-1]})")
        return PositionError(
            f"{what} at {self.dest.url}: {held}",
            first_lsn=first.lsn, last_lsn=last_lsn,
            first_time=None if first_us is None else first_us / 1e6,
            last_time=None if last_us is None else last_us / 1e6,
        )

    # -- seeking ------------------------------------------------------------------------------

    def _last_at_or_before(self, n: int, key: object, count: int) -> int:
        """The last index ``i`` in ``0..count-1`` with ``key(i) <= n`` (0 if none)."""
        lo, hi = 0, count - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            k = key(mid)  # type: ignore[operator]
            if k is not None and k <= n:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def at_lsn(self, n: int) -> Place:
        """The place of LSN ``n``: the end when ``n`` is the LSN the next record takes."""
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"an LSN position must be an int, not {type(n).__name__}")
        if n < F.FIRST_LSN:
            raise ValueError(f"LSNs start at {F.FIRST_LSN}, not {n}")
        earliest = self.earliest()
        if n < earliest.lsn:
            raise self.not_held(f"LSN {n} is before the oldest record retention left")
        i = self._last_at_or_before(n, lambda k: self.first_lsn(self.seqs[k]), len(self.seqs))
        seq = self.seqs[i]
        segments = self.logs[seq]
        j = self._last_at_or_before(n, lambda k: self.first_lsn(seq, k), len(segments))
        number, name = segments[j]
        walked = _Walked(0, 0, None, False)
        for offset, header in self.batches(seq, number, name, walked):
            if header.first_lsn <= n < header.first_lsn + header.lsn_count:
                return Place(seq, number, offset, n, header.first_lsn)
        if self.is_last(seq, j):
            # (An end that does not parse there is a write in progress or a torn tail,
            # which a read from before it judges.)
            if n == walked.next_lsn:
                return Place(seq, number, walked.end, n, n, True)
            raise self.not_held(f"LSN {n} is past the end (the next record takes LSN {walked.next_lsn})")
        if walked.damaged or j != len(segments) - 1:
            raise CorruptLogError(f"segment ends at LSN {walked.next_lsn} before the next one starts",
                                  destination=self.dest.url, log=seq, segment=name, offset=walked.end)
        nxt = self.seqs[i + 1]
        if nxt == seq + 1 and not declares_gap(self.dest, self.logs[nxt]):
            raise CorruptLogError(
                f"log {seq} ends at LSN {walked.next_lsn} but log {nxt} starts at LSN {self.first_lsn(nxt)}",
                destination=self.dest.url, log=seq, segment=name, offset=walked.end)
        raise self.not_held(
            f"LSN {n} lies in a gap the writer declared: log {seq} ends before LSN {walked.next_lsn} and "
            f"log {nxt} starts at LSN {self.first_lsn(nxt)}")

    def at_time(self, t_us: int) -> Place:
        """The place of the first batch committed at or after ``t_us`` (µs since the
        epoch): the end when none is yet."""
        earliest = self.earliest()
        first_us = self.first_commit(earliest.log)
        if first_us is not None and t_us < first_us:
            if earliest.lsn != F.FIRST_LSN:
                raise self.not_held(f"{_iso(t_us)} is before the oldest record retention left")
            return earliest
        # The last segment whose first batch was committed before t: the first batch at or
        # after t is in it or after it.
        before = t_us - 1
        i = self._last_at_or_before(before, lambda k: self.first_commit(self.seqs[k]), len(self.seqs))
        seq = self.seqs[i]
        j = self._last_at_or_before(before, lambda k: self.first_commit(seq, k), len(self.logs[seq]))
        for k in range(i, len(self.seqs)):
            s = self.seqs[k]
            if k > i and (s != self.seqs[k - 1] + 1 or declares_gap(self.dest, self.logs[s])):
                break  # the logs after a gap continue nothing read so far
            for index, (number, name) in enumerate(self.logs[s]):
                if s == seq and index < j:
                    continue
                for offset, header in self.batches(s, number, name):
                    if header.commit_us >= t_us:
                        if offset == F.SEGMENT_HEADER_SIZE:
                            return Place(s, number, 0, header.first_lsn, header.first_lsn)
                        return Place(s, number, offset, header.first_lsn, header.first_lsn)
        return self.end()[0]


def seek(dest: Destination, position: int | datetime | None) -> tuple[LogView, Place]:
    """The place of ``position`` (an LSN, an aware datetime, or None for the oldest
    retained record) and the view it was found in; looked for again when retention
    deletes what the search was reading."""
    t_us = utc_micros(position) if isinstance(position, datetime) else None
    for _attempt in range(RESYNC_ATTEMPTS):
        view = LogView(dest)
        try:
            if position is None:
                return view, view.earliest()
            if isinstance(position, datetime):
                assert t_us is not None
                return view, view.at_time(t_us)
            return view, view.at_lsn(position)
        except FileNotFoundError as e:
            if isinstance(e, LogNotFoundError):
                raise
    raise outrun(dest.url, RESYNC_ATTEMPTS)


def lsn_at_time(dest: Destination, when: datetime) -> int:
    """The LSN of the last record committed at or before ``when`` (``FIRST_LSN - 1``
    when none was and nothing was deleted). Raises :class:`PositionError` for a time
    before the oldest record retention left."""
    _view, place = seek(dest, when + timedelta(microseconds=1))
    return place.lsn - 1


__all__ = ["LogView", "Place", "WALK_CHUNK", "lsn_at_time", "seek", "utc_micros"]
