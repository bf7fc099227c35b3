"""Following a log on the driver of a streaming query: where the records are, not what they say.

The driver decides where each micro-batch ends and splits it into partitions; the executors
read those with the batch source's reader. Deciding needs the batch boundaries and their
LSNs, so the driver walks batch headers only. Payloads are read for control batches alone,
which are small: a snapshot-complete marker changes ``base_log``, a seal ends the log.

New segments and logs are found as a follower finds them, by asking for the names that
may come next (:class:`persistlog.reading.SegmentProbe`) rather than by listing: an idle
poll costs a size check of a growing local segment and two requests on an object store
(whose objects never change, so their sizes are remembered), never a ``LIST``. A listing
happens only when the cursor's segment is gone, to say what retention left, or when
CURRENT names a log past the next one.

The end of a live local segment may hold a batch being written: the walk waits for it. Once
a later segment or log exists that end is final, and the follower's rules decide between a
torn tail (dropped, as restore drops it) and corruption (raised).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from destinations import Destination
from persistlog import CorruptLogError, Cursor, LogNotFoundError, PersistLogError, ResetRequired
from persistlog.reading import (
    BATCH_HEADER_SIZE,
    BatchHeader,
    CONTROL_COMPLETE,
    CONTROL_FENCE,
    CONTROL_SEAL,
    FIRST_LSN,
    KIND_CONTROL,
    OPAQUE,
    SEAL_CHAIN,
    SEGMENT_HEADER_SIZE,
    Damage,
    LogScanner,
    SegmentBytes,
    SegmentProbe,
    check_payload,
    control_records,
    declares_gap,
    first_lsn,
    gap_closed,
    head_after,
    list_logs,
    next_segments,
    parse_batch_header,
    parse_segment_header,
    read_pointer,
    replay_plan,
    retention_gap,
    seek,
    segment_name,
)

logger = logging.getLogger("spark_replay")

# Reads while walking headers: small, since most of a window is payload we skip.
WALK_CHUNK = 64 * 1024
# A walk remembers a batch boundary at least this often, for cutting partitions.
MARK_BYTES = 256 * 1024
#: What a query that cannot go on past a retention gap may do (the end of its message).
GAP_OPTIONS = (
    "Set option onRetentionGap=restore to continue from the newest complete log (its rows "
    "rebuild the state), or start a new query with startingPosition=restore."
)


@dataclass(frozen=True)
class Position:
    """A stream offset: the follower cursor of the next record, and what the rows after it
    need to know about the history before it.

    ``base`` is the ``base_log`` of the next record (the newest log of the stream whose
    snapshot was complete by then); ``sealed`` says the cursor's log ended there;
    ``restored`` marks where a stream continued after a retention gap. A stream started at
    an LSN or a time (``startingPosition``) may start inside a batch: ``from_lsn`` is then
    its first record's LSN (the cursor stands at the batch), and ``entered`` names the log
    it started in after that log's first record, whose snapshot-complete marker does not
    make the stream's rows of it a base (they lack what came before the start).

    ``head`` is the hash chain's head at the cursor (chained logs): the hash of the batch
    before it, or at the start of a log the head the log before it ends at. The first
    batch read from the cursor must link to it. None: not known (a stream started inside a
    log, an offset from a version that did not keep it) or not chained; that link is then
    taken as given.
    """

    cursor: Cursor
    base: int | None = None
    sealed: bool = False
    restored: bool = False
    from_lsn: int | None = None
    entered: int | None = None
    head: bytes | None = None

    def offset(self) -> dict[str, Any]:
        """The JSON object Spark checkpoints."""
        d: dict[str, Any] = self.cursor.to_dict()
        if self.base is not None:
            d["base_log"] = self.base
        if self.sealed:
            d["sealed"] = True
        if self.restored:
            d["restored"] = True
        if self.from_lsn is not None:
            d["from_lsn"] = self.from_lsn
        if self.entered is not None:
            d["entered"] = self.entered
        if self.head is not None:
            d["head"] = self.head.hex()
        return d

    @classmethod
    def from_offset(cls, offset: dict[str, Any]) -> Position:
        base, from_lsn, entered = offset.get("base_log"), offset.get("from_lsn"), offset.get("entered")
        head = offset.get("head")
        return cls(
            Cursor.from_dict(offset),
            None if base is None else int(base),
            bool(offset.get("sealed")),
            bool(offset.get("restored")),
            None if from_lsn is None else int(from_lsn),
            None if entered is None else int(entered),
            None if head is None else bytes.fromhex(str(head)),
        )


@dataclass(frozen=True)
class Mark:
    """A batch boundary a walk passed, with the log bytes and records walked up to it."""

    position: Position
    nbytes: int
    records: int
    #: Set right after a snapshot-complete marker: the LSN from which rows of this log
    #: have ``base_log`` equal to the log.
    complete_lsn: int | None = None


@dataclass
class _Limits:
    records: int | None = None
    nbytes: int | None = None
    #: Walk no further than this cursor (the end of a planned micro-batch, or the end of
    #: the data when ``Trigger.AvailableNow`` started).
    until: Cursor | None = None

    def beyond(self, seq: int, segment: int, offset: int) -> bool:
        u = self.until
        return u is not None and (seq, segment, offset) >= (u.log, u.segment, u.offset)


@dataclass
class _Head:
    """The chain head where a walk stands: ``known`` (from a seal, or the position the walk
    started at or entered a log at), or else the last batch that moved it, hashed only when
    asked for (one read of one batch, mostly from the walk's window already)."""

    known: bytes | None = None
    #: The window over its segment, its offset and its size.
    batch: tuple[SegmentBytes, int, int] | None = None

    def passed(self, data: SegmentBytes, offset: int, header: BatchHeader, kinds: set[str], seal_chain: Any) -> None:
        """The walk passed the batch at ``offset`` (its control records' ``kinds``): a seal
        names the head and leaves it, a fence leaves it, any other batch moves it (a batch
        without a link: no head, the log is not chained)."""
        if CONTROL_SEAL in kinds:
            self.known, self.batch = (seal_chain if isinstance(seal_chain, bytes) else None), None
        elif CONTROL_FENCE not in kinds:
            self.known, self.batch = None, ((data, offset, header.size) if header.linked else None)

    def resolve(self) -> bytes | None:
        """The head: the hash of the last batch that moved it, read again if needed (None
        when its segment is gone: the link after it is taken as given)."""
        if self.batch is not None:
            data, offset, size = self.batch
            self.batch = None
            try:
                raw = data.get(offset, size)
            except FileNotFoundError as e:
                if isinstance(e, PersistLogError):
                    raise
                raw = b""
            self.known = head_after(raw) if len(raw) == size else None
        return self.known


class _Stop(Exception):
    """A limit was reached: the walk ends at the last mark."""


class _DeclaredGap(Exception):
    """The next log follows a gap its writer declared (a secondary that was detached or
    behind): the walk cannot go on into it."""

    def __init__(self, seq: int, segment: str) -> None:
        super().__init__(seq, segment)
        self.seq = seq
        self.segment = segment


def log_start(dest: Destination, seq: int, segments: list[tuple[int, str]]) -> Position:
    """The position before the first record of log ``seq``. The first log ever holds the
    whole history, so its rows can rebuild the state from the start."""
    number, name = segments[0]
    if number != 0:
        raise CorruptLogError(f"log starts at segment {number}, segment 0 is missing", destination=dest.url, log=seq, segment=name)
    first = first_lsn(dest, name)
    if first is None:
        raise CorruptLogError("damaged segment header", destination=dest.url, log=seq, segment=name, offset=0)
    return Position(Cursor(seq, 0, 0, first), seq if first == FIRST_LSN else None)


def restore_position(dest: Destination) -> Position | None:
    """Where a restore starts: the newest complete log (None: no log yet)."""
    p = replay_plan(dest)
    if p.start is None:
        return None
    return log_start(dest, p.start, p.logs[p.start])


def earliest_position(dest: Destination) -> Position | None:
    """The start of the oldest retained log (None: no log yet)."""
    logs = list_logs(dest)
    if not logs:
        return None
    seq = min(logs)
    return log_start(dest, seq, logs[seq])


def end_cursor(dest: Destination) -> Cursor | None:
    """The end of the data now: the size of the newest log's last segment (its LSN unknown,
    so 0); None when there is no log."""
    logs = list_logs(dest)
    if not logs:
        return None
    seq = max(logs)
    number, name = logs[seq][-1]
    return Cursor(seq, number, dest.size(name), 0)


class Tail:
    """Walks a destination's logs forward from a :class:`Position`."""

    def __init__(self, dest: Destination) -> None:
        self.dest = dest
        # Finds the segments that follow by their names, as followers do; remembers the
        # sizes of objects (they never change once written).
        self._probe = SegmentProbe(dest)
        # The chain head where the current walk stands.
        self._head = _Head()

    def latest_position(self) -> Position | None:
        """The end of the newest log as it is now (None: no log yet)."""
        logs = list_logs(self.dest)
        if not logs:
            return None
        seq = max(logs)
        number, name = logs[seq][-1]
        first = first_lsn(self.dest, name)
        if first is None:
            raise CorruptLogError("damaged segment header", destination=self.dest.url, log=seq, segment=name, offset=0)
        end = self.walk(Position(Cursor(seq, number, 0, first)))[-1].position
        # The stream holds none of the history before this point: no row of it can
        # rebuild the state from a log, whatever markers the walk passed.
        return replace(end, base=None)

    def seek_position(self, position: int | datetime) -> Position | None:
        """Where a stream started at an LSN or a commit time starts (None: no log yet),
        found by persistlog's seek (:func:`persistlog.reading.seek`): a position the logs do
        not hold raises :class:`PositionError`, naming what they hold. Before a log's first
        record it is that log's start; at the end, :meth:`latest_position`; inside a log
        the stream holds none of the history before it (no row of that log can rebuild
        the state)."""
        try:
            view, place = seek(self.dest, position)
        except LogNotFoundError:
            return None
        if place.lsn == view.first_lsn(place.log):
            return log_start(self.dest, place.log, view.logs[place.log])
        if place.at_end:
            return self.latest_position()
        cursor = Cursor(place.log, place.segment, place.offset, place.batch_lsn)
        return Position(cursor, from_lsn=place.lsn if place.lsn != place.batch_lsn else None, entered=place.log)

    def walk(
        self,
        start: Position,
        *,
        max_records: int | None = None,
        max_bytes: int | None = None,
        until: Cursor | None = None,
    ) -> list[Mark]:
        """The marks from ``start`` (the first mark) to as far as the data and the limits
        go. At least one record batch is taken whatever the limits, so that a stream always
        moves. Raises :class:`ResetRequired` when retention deleted what ``start`` needs,
        or when the walk stands before a log that follows a declared gap and a log from it
        on is complete (until then the walk waits there, as a follower does). The last
        mark's position carries the chain head there (chained logs), so that the walk from
        it checks the link of the batch it reads first; so do positions at a log's start."""
        limits = _Limits(max_records, max_bytes, until)
        self._head = _Head(start.head)
        marks = [Mark(start, 0, 0)]
        pos = start
        try:
            while True:
                nxt = self._walk_segment(pos, marks, limits)
                if nxt is None:
                    break
                u = limits.until
                if u is not None and (nxt.cursor.log, nxt.cursor.segment) > (u.log, u.segment):
                    break
                pos = nxt
                marks.append(Mark(pos, marks[-1].nbytes, marks[-1].records))
        except _Stop:
            pass
        except _DeclaredGap as g:
            # What was walked before the gap is read first; the next poll starts at the gap.
            if marks[-1].records == 0 and gap_closed(self.dest, g.seq):
                cur = marks[-1].position.cursor
                raise ResetRequired(
                    f"cannot go on with the stream of {self.dest.url} from cursor {cur}: log {g.seq} "
                    f"({g.segment}) follows a gap its writer declared in this secondary's history "
                    f"(it was detached or behind), so it does not continue log {cur.log}, read to LSN "
                    f"{cur.next_lsn}. Set option onRetentionGap=restore to continue from the newest "
                    "complete log after the gap (its rows rebuild the state), or start a new query "
                    "with startingPosition=restore."
                ) from None
        end = marks[-1]
        if end.position.head is None:
            head = self._head.resolve()
            if head is not None:
                marks[-1] = replace(end, position=replace(end.position, head=head))
        return marks

    # -- one segment ----------------------------------------------------------------------

    def _walk_segment(self, pos: Position, marks: list[Mark], limits: _Limits) -> Position | None:
        """Walk the rest of the cursor's segment, appending marks; return the position at
        the start of the segment that follows, if there is one yet."""
        walked, head = len(marks), replace(self._head)
        try:
            return self._walk_on(pos, marks, limits)
        except FileNotFoundError as e:
            if isinstance(e, PersistLogError):
                raise
            # This segment, or the one after it, vanished under the walk: retention is
            # deleting the cursor's log (it deletes a log's segments last first, and
            # whole logs oldest first). Nothing of it is taken.
            del marks[walked:]
            self._head = head
            return self._after_gap(pos)

    def _walk_on(self, pos: Position, marks: list[Mark], limits: _Limits) -> Position | None:
        cur = pos.cursor
        name = segment_name(cur.log, cur.segment)
        # Look for what follows before sizing this segment: a successor seen now means
        # the size read next holds every record of this segment.
        following = self._following(pos)
        if pos.sealed and following is not None:
            return self._enter(pos, following)
        size = self._size(name, cur)
        end, damaged = self._batches(pos, name, size, marks, limits)
        # Objects never grow: what the walk could not take there is never "in progress".
        if end < size and (following is not None or damaged or not self.dest.appendable):
            if self._check_rest(marks[-1].position.cursor, name, final=following is not None):
                return None  # a batch landed as the walk read: walk it at the next poll
        if following is None:
            if marks[-1].position.cursor == cur:
                self._check_skipped(pos)
            return None
        return self._enter(marks[-1].position, following)

    def _check_skipped(self, pos: Position) -> None:
        """Nothing follows the cursor under the names that may come next. A secondary that
        was detached while the writer rotated goes on with a later number, in a log that
        declares the gap: the probe's look at CURRENT tells it is there."""
        cur = pos.cursor
        skipped = self._probe.skipped_log(cur)
        if skipped is None:
            return
        seq, segments = skipped
        if declares_gap(self.dest, segments):
            self._probe.check_again()  # the poll after the records walked before it raises
            raise _DeclaredGap(seq, segments[0][1])
        raise CorruptLogError(
            f"log {cur.log + 1} is missing between logs {cur.log} and {seq}", destination=self.dest.url, log=cur.log + 1
        )

    def _following(self, pos: Position) -> tuple[str, Cursor] | None:
        return self._probe.following(pos.cursor, pos.sealed)

    def _size(self, name: str, cur: Cursor) -> int:
        size = self._probe.size(name)
        if cur.offset > size:
            raise ResetRequired(
                f"cannot follow {self.dest.url} from cursor {cur}: it is past the end of {name} ({size} bytes)"
            )
        return size

    def _enter(self, pos: Position, following: tuple[str, Cursor]) -> Position:
        """The position at the start of the following segment, after the chain check."""
        name, nxt = following
        cur = pos.cursor
        if nxt.log != cur.log and not pos.sealed:
            first = first_lsn(self.dest, name)
            if first is not None and first != cur.next_lsn:
                if declares_gap(self.dest, [(0, name)]):
                    raise _DeclaredGap(nxt.log, name)
                raise CorruptLogError(
                    f"log {nxt.log} starts at LSN {first}, but log {cur.log} ends at LSN {cur.next_lsn} "
                    "(its end was lost: the stream cannot continue without a gap)",
                    destination=self.dest.url, log=nxt.log, segment=name, offset=0,
                )
        if nxt.log == cur.log:
            return Position(replace(nxt, next_lsn=cur.next_lsn), pos.base, entered=pos.entered)
        # The first batch of the next log links to the head this log ends at: the seal's,
        # or (a log its writer did not seal) the hash of its last batch. A header that
        # declares a gap is not checked against it (LogScanner knows).
        return Position(replace(nxt, next_lsn=cur.next_lsn), pos.base, head=self._head.resolve())

    def _batches(
        self, pos: Position, name: str, size: int, marks: list[Mark], limits: _Limits
    ) -> tuple[int, bool]:
        """Walk batch headers from the cursor to ``size``; return where the walk stopped and
        whether it stopped at something other than a batch not fully written yet."""
        cur = pos.cursor
        seq, number = cur.log, cur.segment
        data = SegmentBytes(self.dest, name, size, chunk=WALK_CHUNK)
        p, next_lsn, base, sealed = cur.offset, cur.next_lsn, pos.base, pos.sealed
        if sealed:
            return size, False
        try:
            if p == 0:
                if size < SEGMENT_HEADER_SIZE:
                    return 0, False
                self._check_segment_header(data, seq, number, next_lsn, name)
                p = SEGMENT_HEADER_SIZE
            kept_bytes, tentative = marks[-1].nbytes, False
            while p < size:
                if limits.beyond(seq, number, p):
                    raise _Stop
                header = parse_batch_header(data.get(p, BATCH_HEADER_SIZE), p)
                if p + header.size > size:
                    return p, False
                if header.first_lsn != next_lsn:
                    raise CorruptLogError(
                        f"batch starts at LSN {header.first_lsn}, expected {next_lsn}",
                        destination=self.dest.url, log=seq, segment=name, offset=p,
                    )
                complete = False
                if header.kind == KIND_CONTROL:
                    raw = check_payload(header, data.get(p + BATCH_HEADER_SIZE, header.stored_len), p)
                    controls = control_records(header, raw, p)
                    kinds = {c["t"] for c in controls}
                    seal_chain = next((c.get(SEAL_CHAIN) for c in controls if c["t"] == CONTROL_SEAL), None)
                    complete = CONTROL_COMPLETE in kinds and base != seq and pos.entered != seq
                    sealed = CONTROL_SEAL in kinds
                    records = 0
                else:
                    records, kinds, seal_chain = header.count, set(), None
                    taken = marks[-1].records - marks[0].records
                    if taken and (
                        (limits.records is not None and taken + records > limits.records)
                        or (limits.nbytes is not None and marks[-1].nbytes + header.size > limits.nbytes)
                    ):
                        raise _Stop
                self._head.passed(data, p, header, kinds, seal_chain)
                p += header.size
                next_lsn += header.lsn_count
                if complete:
                    base = seq
                at = Position(Cursor(seq, number, p, next_lsn), base, sealed, entered=pos.entered)
                mark = Mark(at, marks[-1].nbytes + header.size, marks[-1].records + records,
                            header.first_lsn - 1 if complete else None)
                # marks[-1] is always where the walk stands. Boundaries are kept now and
                # then (partitions are cut there), and after every marker.
                if tentative and not (complete or sealed) and mark.nbytes - kept_bytes < MARK_BYTES:
                    marks[-1] = mark
                else:
                    if tentative:
                        kept_bytes = marks[-1].nbytes
                    marks.append(mark)
                    tentative = not (complete or sealed)
                    if not tentative:
                        kept_bytes = mark.nbytes
                if sealed:
                    return size, False
        except Damage as d:
            return p, not d.torn_shape
        return p, False

    def _check_segment_header(self, data: SegmentBytes, seq: int, number: int, next_lsn: int, name: str) -> None:
        try:
            sh = parse_segment_header(data.get(0, SEGMENT_HEADER_SIZE))
        except Damage as d:
            raise CorruptLogError(d.reason, destination=self.dest.url, log=seq, segment=name, offset=0) from None
        if sh.seq != seq or sh.segment != number:
            raise CorruptLogError(
                f"segment header says log {sh.seq} segment {sh.segment}",
                destination=self.dest.url, log=seq, segment=name, offset=0,
            )
        if sh.first_lsn != next_lsn:
            raise CorruptLogError(
                f"segment starts at LSN {sh.first_lsn}, expected {next_lsn}",
                destination=self.dest.url, log=seq, segment=name, offset=0,
            )

    def _check_rest(self, cur: Cursor, name: str, *, final: bool) -> bool:
        """Classify what the header walk could not take, by the follower's rules: a write
        in progress (waited for), a torn tail of a segment that became final (dropped), or
        corruption (raised). True when a whole batch is there now."""
        following = [n for n, _ in next_segments(cur, False)]
        more = final and self._probe.exists(following[0])
        scanner = LogScanner(
            self.dest, cur.log, [(cur.segment, name)],
            start=(cur.segment, cur.offset, cur.next_lsn),
            tail_ok=not final and self.dest.appendable,
            more_segments=more,
            keys=OPAQUE,  # where the batch ends, not what it holds: encrypted logs too
        )
        for _batch in scanner:
            return True
        torn = scanner.state.torn
        if torn is not None:
            logger.warning("dropped torn tail of %s log %d: %d bytes at %s:%d (%s)",
                        self.dest.url, cur.log, torn.length, torn.segment, torn.offset, torn.reason)
        return False

    # -- retention --------------------------------------------------------------------------

    def _after_gap(self, pos: Position) -> Position | None:
        """The cursor's segment is gone. Nothing is lost if the next log starts exactly
        where the cursor stands; anything else is a gap (:func:`retention_gap` says
        whether retention made it; a segment missing in the middle of a log is damage)."""
        cur = pos.cursor
        logs = list_logs(self.dest)
        if cur.log + 1 in logs and cur.log not in logs:
            if self._first_lsn(segment_name(cur.log + 1, 0)) == cur.next_lsn:
                return Position(Cursor(cur.log + 1, 0, 0, cur.next_lsn), pos.base, head=self._head.resolve())
        gap = retention_gap(self.dest, cur.log, cur.segment)
        if logs:
            oldest = min(logs)
            first = self._first_lsn(segment_name(oldest, 0))
            left = f"the oldest log left is {oldest}" + (f", from LSN {first}" if first is not None else "")
        else:
            left = "no log is left"
        raise ResetRequired(
            f"cannot resume the stream of {self.dest.url} from cursor {cur}: log {cur.log} segment "
            f"{cur.segment} is gone ({'deleted by retention' if gap else 'not there'}) and {left}, "
            f"so records from LSN {cur.next_lsn} on are missing. {GAP_OPTIONS}"
        )

    def _first_lsn(self, name: str) -> int | None:
        """:func:`first_lsn`, None for a segment that is gone too."""
        try:
            return first_lsn(self.dest, name)
        except FileNotFoundError:
            return None
