"""The streaming reader of the ``persistlog`` source: ``spark.readStream.format("persistlog")``.

Offsets are follower cursors (:class:`persistlog.Cursor`: log, segment, byte offset, next
LSN) serialised as JSON, with the ``base_log`` of the next record, so a query restarted
from its checkpoint resumes exactly after the last committed record and its rows carry the
same ``base_log`` as if it had never stopped; in a chained log, with the hash chain's head
there (``head``), so that the next micro-batch checks the link of its first batch. The driver finds each micro-batch's end by
walking batch headers (:mod:`spark_replay._tail`); the executors read the partitions with
the batch source's reader, so rows, schema and options are the batch source's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from destinations import Destination, open_destination

from persistlog import Cursor, DestinationError, PersistLogError, ResetRequired
from persistlog.reading import (
    RESYNC_ATTEMPTS, RetentionGap, SegmentGone, outrun, retention_gap, segment_name, no_log,
)
from ._options import StreamOptions, starting_position
from ._plan import LogPartition, split_bytes
from ._tail import GAP_OPTIONS, Mark, Position, Tail, earliest_position, end_cursor, restore_position

logger = logging.getLogger("spark_replay")

#: The key of the initial offset, which names where the stream starts (see initialOffset).
STARTING = "startingPosition"


class PersistLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver and reads them on the executors.

    One instance lives on the driver for the life of a query (Spark keeps it in a Python
    worker), so the destination stays open and the walk of the last micro-batch is kept
    for planning its partitions. Executors get a copy without either.
    """

    def __init__(self, options: StreamOptions) -> None:
        self.opts = options
        self._dest: Destination | None = None
        self._tail: Tail | None = None
        self._walked: tuple[dict[str, Any], list[Mark]] | None = None
        self._until: Cursor | None = None
        # The range the executors read last (onRetentionGap=restore): its end, its marks.
        self._reading: tuple[dict[str, Any], list[Mark]] | None = None
        # A micro-batch whose range could not be planned again (onRetentionGap=restore):
        # the next offset goes on from the newest complete log.
        self._gap: ResetRequired | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors only call read(): no live connection, no driver state.
        return {"opts": self.opts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["opts"])  # type: ignore[misc]

    @property
    def tail(self) -> Tail:
        if self._tail is None:
            self._dest = open_destination(self.opts.read.url, **self.opts.read.storage_options)
            self._tail = Tail(self._dest)
        return self._tail

    # -- offsets ----------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        # Spark does not checkpoint where the first micro-batch starts: it asks again after
        # a restart, when restore, earliest and latest mean other places. So the initial
        # offset only names the choice; the first micro-batch (empty) moves to the place it
        # means then, and that end is checkpointed.
        where = self.opts.starting_position
        start = starting_position(where)
        if isinstance(start, Cursor):
            return Position(start).offset()
        if not self.tail.dest.exists():
            # A mistyped path must not wait forever for a log that will never come.
            raise no_log(self.tail.dest, "check the path given to load()")
        return {STARTING: where}

    def _start(self, where: str) -> Position | None:
        """Where ``restore``, ``earliest`` or ``latest`` is now (None: no log yet), looked
        for again when retention deletes the log it names as it is read."""
        for _attempt in range(RESYNC_ATTEMPTS):
            try:
                return self._position(where)
            except FileNotFoundError as e:
                if isinstance(e, PersistLogError):
                    raise
                logger.info("stream of %s: %s; looking for the %s position again", self.opts.read.url, e, where)
        raise outrun(self.opts.read.url, RESYNC_ATTEMPTS)

    def _position(self, where: str) -> Position | None:
        dest = self.tail.dest
        if where == "restore":
            return restore_position(dest)
        if where == "earliest":
            return earliest_position(dest)
        if where == "latest":
            return self.tail.latest_position()
        position = starting_position(where)
        if isinstance(position, (int, datetime)):
            return self.tail.seek_position(position)
        raise ValueError(f"not a starting position: {where!r}")

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records is not None:
            return ReadMaxRows(self.opts.max_records)
        if self.opts.max_bytes is not None:
            return ReadMaxBytes(self.opts.max_bytes)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if STARTING in start:
            first = self._start(str(start[STARTING]))
            if first is None:
                if not self.opts.wait_for_log:
                    raise no_log(self.tail.dest, 'check the path given to load(), or set .option("waitForLog", '
                                 '"true") to wait for a writer to make one')
                logger.info("no log at %s yet: the stream starts at the first one", self.opts.read.url)
                return start
            logger.info("stream of %s starts at %s (%s)", self.opts.read.url, first.cursor, start[STARTING])
            return first.offset()
        max_records = max_bytes = None
        if not isinstance(limit, ReadAllAvailable):
            # Spark passes the limit getDefaultReadLimit() made; both options apply.
            max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else self.opts.max_records
            max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else self.opts.max_bytes
        pos = Position.from_offset(start)
        gap = self._gap_before(start)
        if gap is not None:
            return self._restore_after_gap(gap)
        try:
            marks = self.tail.walk(pos, max_records=max_records, max_bytes=max_bytes, until=self._until)
        except ResetRequired as e:
            if self.opts.on_retention_gap != "restore":
                raise
            return self._restore_after_gap(e)
        if marks[-1].records == 0:
            # Nothing to read (control batches only): no micro-batch.
            return start
        self._walked = (start, marks)
        return marks[-1].position.offset()

    def _restore_after_gap(self, gap: ResetRequired) -> dict[str, Any]:
        restart = self._start("restore")
        if restart is None:
            raise gap
        logger.warning("%s; onRetentionGap=restore: continuing from log %d", gap, restart.cursor.log)
        return replace(restart, restored=True).offset()

    def prepareForTriggerAvailableNow(self) -> None:
        # No log yet: nothing to read (a log appearing later is after the start).
        self._until = end_cursor(self.tail.dest) or Cursor(0, 0, 0, 0)

    def _gap_before(self, start: dict[str, Any]) -> ResetRequired | None:
        """A retention gap in the micro-batch that ended at ``start`` (onRetentionGap=
        restore): its range could not be planned again, or its executors may have found
        segments deleted (they keep the rows they read and stop). Spark runs one
        micro-batch at a time, so the one before is done when the next offset is asked for
        (``commit`` comes later: after that offset is checkpointed)."""
        gap, self._gap = self._gap, None
        reading, self._reading = self._reading, None
        if gap is None and reading is not None and reading[0] == start:
            gap = self._deleted_while_read(reading[1])
        return gap

    def _deleted_while_read(self, marks: list[Mark]) -> ResetRequired | None:
        """Whether retention deleted a segment of the range the marks span, so that its
        records may be missing, and the micro-batch does not hold the newest complete log
        from its start (whose rows rebuild the state). A segment deleted just after it was
        read counts too: the stream cannot tell."""
        first, last = marks[0].position.cursor, marks[-1].position.cursor
        # Retention deletes the oldest log first and a log's last segment first: while the
        # last segment the range read of its first log is there, all it read is there.
        number = max(m.position.cursor.segment for m in marks[:-1] if m.position.cursor.log == first.log)
        try:
            self.tail.dest.size(segment_name(first.log, number))
            return None
        except FileNotFoundError:
            pass
        newest = self._start("restore")
        if newest is not None and first.log < newest.cursor.log <= last.log:
            logger.warning("retention at %s deleted log %d segment %d while a micro-batch read it: "
                        "rows of it may be missing, but the micro-batch holds complete log %d "
                        "from its start, whose rows rebuild the state", self.opts.read.url,
                        first.log, number, newest.cursor.log)
            return None
        return ResetRequired(
            f"retention at {self.opts.read.url} deleted log {first.log} segment {number} while "
            f"the micro-batch from cursor {first} read it: records of it may be missing"
        )

    def commit(self, end: dict[str, Any]) -> None:
        if self._walked is not None and self._walked[0] != end and not _within(self._walked[1], end):
            self._walked = None

    def stop(self) -> None:
        if self._dest is not None:
            self._dest.close()
        self._dest = self._tail = None

    # -- planning and reading ---------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if STARTING in start or end.get("restored") or start == end:
            return []
        try:
            marks = self._marks(start, end)
        except ResetRequired as e:
            # A micro-batch planned before a stop (or whose read failed) whose records
            # retention deleted since: none of them can be read now.
            if self.opts.on_retention_gap != "restore":
                raise
            logger.warning("%s; onRetentionGap=restore: the micro-batch reads nothing", e)
            self._gap = e
            return []
        if self.opts.on_retention_gap == "restore" and len(marks) > 1:
            self._reading = (end, marks)
        return stream_partitions(marks, self.opts)

    def _marks(self, start: dict[str, Any], end: dict[str, Any]) -> list[Mark]:
        target = Position.from_offset(end)
        if self._walked is not None and self._walked[0] == start:
            marks = self._walked[1]
        else:
            # A restarted query plans the micro-batch its checkpoint left unfinished.
            marks = self.tail.walk(Position.from_offset(start), until=target.cursor)
        kept = [m for m in marks if _at_or_before(m.position.cursor, target.cursor)]
        if not kept or kept[-1].position.cursor != target.cursor:
            raise ResetRequired(
                f"cannot read {self.opts.read.url} from cursor {Position.from_offset(start).cursor} "
                f"to {target.cursor}: the log no longer holds that range"
            )
        return kept

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from ._scan import read_records

        assert isinstance(partition, LogPartition)
        try:
            yield from read_records(partition)
        except DestinationError as e:
            gone = e.__cause__
            gap = _deleted(partition, gone) if isinstance(gone, SegmentGone) else None
            if gap is None:
                raise
            segment, offset, next_lsn = partition.start
            assert next_lsn is not None  # a stream's partitions start where a walk stood
            what = (
                f"cannot read the micro-batch of {partition.url} from cursor "
                f"{Cursor(partition.seq, segment, offset, next_lsn)}: {gap} while the "
                f"micro-batch read it, so records of log {partition.seq} are missing"
            )
            if self.opts.on_retention_gap != "restore":
                raise ResetRequired(f"{what}. {GAP_OPTIONS}") from e
            # The driver sees the deletion once the micro-batch is done (_gap_before).
            logger.warning("%s; onRetentionGap=restore: the stream goes on from the newest "
                        "complete log", what)


def _deleted(part: LogPartition, gone: SegmentGone) -> RetentionGap | None:
    """Whether retention deleted what a partition was reading (CorruptLogError: a segment
    missing in the middle of a log)."""
    dest = open_destination(part.url, **part.storage_options)
    try:
        return retention_gap(dest, gone.seq, gone.segment)
    finally:
        dest.close()


def _at_or_before(a: Cursor, b: Cursor) -> bool:
    return (a.log, a.segment, a.offset) <= (b.log, b.segment, b.offset)


def _within(marks: list[Mark], offset: dict[str, Any]) -> bool:
    return any(m.position.offset() == offset for m in marks)


def stream_partitions(marks: list[Mark], opts: StreamOptions) -> list[LogPartition]:
    """Partitions of the range the marks span: per log, cut at marks about every
    ``split_bytes`` (so at batch boundaries, as the batch source cuts), ranges without a
    record left out unless they start where the walk knew the chain head (the start of
    the micro-batch, of a log): the link there is checked by reading them."""
    if len(marks) < 2:
        return []
    target = split_bytes(marks[-1].nbytes - marks[0].nbytes, opts.read)
    parts: list[LogPartition] = []
    i = 0
    while i < len(marks) - 1:
        seq = marks[i].position.cursor.log
        j = i
        while j + 1 < len(marks) and marks[j + 1].position.cursor.log == seq:
            j += 1
        a = i
        for k in range(i + 1, j + 1):
            if k == j or marks[k].nbytes - marks[a].nbytes >= target:
                if marks[k].records > marks[a].records or marks[a].position.head is not None:
                    parts.append(_partition(marks, a, k, opts))
                a = k
        i = j + 1
    return parts


def _partition(marks: list[Mark], a: int, b: int, opts: StreamOptions) -> LogPartition:
    first, last = marks[a].position, marks[b].position
    seq = first.cursor.log
    base_from: int | None = None
    if first.base == seq:
        base_from = 0
    else:
        base_from = next((m.complete_lsn for m in marks[a + 1: b + 1] if m.complete_lsn is not None), None)
    ro = opts.read
    return LogPartition(
        url=ro.url,
        storage_options=ro.storage_options,
        seq=seq,
        last_segment=last.cursor.segment,
        missing=(),
        start=(first.cursor.segment, first.cursor.offset, first.cursor.next_lsn),
        end=(last.cursor.segment, last.cursor.offset),
        next_log_lsn=None,
        first_link=first.head,
        end_head=last.head,
        base_from=base_from,
        prev_base=first.base,
        from_lsn=first.from_lsn,
        to_lsn=None,
        recovery="strict",
        convention=ro.convention,
        view="records",
        nbytes=marks[b].nbytes - marks[a].nbytes,
        tail_ok=True,
        key_provider=ro.key_provider,
    )
