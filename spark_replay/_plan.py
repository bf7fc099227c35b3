"""Planning a read on the driver: which logs, which byte ranges, and what each task needs.

The driver lists the destination once and reads little: the start of each log's first
segment, once (``walk_headers``: its first LSN, for ``from_lsn``/``to_lsn`` pruning and the
log-to-log chain check; its header, which says whether it follows a gap; and, where the
snapshot is small, its snapshot-complete marker, which tells from which LSN a replay
starting at that log gives the full state), the batch headers further on only where the
marker was not in that read, and the batch headers of segments larger than a partition
(to split them at batch boundaries). A partition holds at most
``max_partition_bytes``, and less when the whole read is small, so that every core gets a
share (``min_partitions``, as Spark's file sources split files). Payloads are only
read for control batches, which are small; everything else is checked by the executors,
through the same :class:`persistlog.reading.LogScanner` that restore uses.

A partition is a contiguous range of one log: from ``start`` (segment, offset, LSN at that
offset or None at a segment start) up to ``end`` (exclusive; None for the end of the log).
Small neighbouring segments are packed into one partition up to that size, so that an object store holding one small object per flush does not become one task per
object.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from pyspark.sql.datasource import InputPartition

from destinations import Destination, open_destination

from persistlog import CorruptLogError, DestinationError, LogNotFoundError, LogSet
from persistlog.reading import (
    FIRST_LSN,
    SEGMENT_HEADER_SIZE,
    WALK_CHUNK,
    HeaderWalk,
    ReplayPlan,
    ScanStart,
    gc_pause,
    gone_since,
    list_logs,
    list_logs_sized,
    no_log,
    read_pointer,
    replay_plan,
    segment_name,
    walk_headers,
)
from ._options import MIN_SPLIT_BYTES, ReadOptions

logger = logging.getLogger("spark_replay")

# Remote size look-ups and header walks are latency-bound: overlap them.
IO_THREADS = 16
# Logs of a set surveyed at once (each of them then overlaps its own reads).
SET_THREADS = 16
# What opening, planning and scanning one more log costs a task beside its bytes, as bytes
# it could have read instead (about 0.3 ms, the time of ~40 KiB of small records): a set
# of many small logs is spread over every core, as a big log is.
LOG_COST_BYTES = 48 * 1024
# A set's logs up to this size are read in one pass with no survey: the task holds the
# log's batches until its end says from where its rows can start a replay.
WHOLE_LOG_BYTES = 1024 * 1024

T = TypeVar("T")
R = TypeVar("R")


@dataclass(repr=False)
class LogPartition(InputPartition):
    """One task's share of a read. Picklable: plain values only, no live connection.

    Segment names are rebuilt from ``last_segment`` and ``missing`` so that a log of many
    thousands of small objects does not ship its whole listing with every task.
    """

    url: str
    storage_options: dict[str, Any]
    seq: int
    last_segment: int
    missing: tuple[int, ...]
    start: ScanStart
    end: tuple[int, int] | None
    #: First LSN of the next log, checked against where this log ends (None: no check).
    next_log_lsn: int | None
    #: Rows of this log from this LSN on can start a replay (None: none can).
    base_from: int | None
    #: The newest earlier log of the read that can start a replay.
    prev_base: int | None
    from_lsn: int | None
    to_lsn: int | None
    recovery: str
    convention: str
    view: str
    nbytes: int = 0
    #: The range ends before the live end of its log (a stream's micro-batch): a batch
    #: being written after ``end`` is not a torn tail.
    tail_ok: bool = False
    #: The log's key when it is one log of a log set (rows then carry it): None otherwise.
    log_key: str | None = None
    #: Option ``keyProvider``: the importable name of the key provider of an encrypted
    #: log, never a key (each executor imports it: :mod:`spark_replay._keys`).
    key_provider: str | None = None
    #: The hash link of the next log's first batch, checked against the chain head where
    #: this log ends (None: no check; with ``next_log_lsn``, for the last range of a log).
    next_log_link: bytes | None = None
    #: What the first batch of the range must link to: the chain head the driver's walk
    #: found where a stream's micro-batch or a log in it starts (None: taken as given).
    first_link: bytes | None = None
    #: The chain head the driver's walk found where the range ends (the end of a stream's
    #: micro-batch, which the next one's first link is checked against): a scan that
    #: reaches the end of the data there must end at it (None: no check).
    end_head: bytes | None = None
    #: The log CURRENT named when the driver listed the log (0: none), read before the
    #: listing: damage met in a log that CURRENT has moved past since is retention
    #: deleting it under the read (:func:`deleted_under`). None: not noted (a listing
    #: of one log, which retention cannot be deleting: :func:`listed_noted`; a stream's
    #: micro-batch, which meets retention its own way).
    current: int | None = None

    def __repr__(self) -> str:
        # Never print storage options: they may hold credentials.
        end = "end" if self.end is None else f"{self.end[0]}:{self.end[1]}"
        key = "" if self.log_key is None else f"key={self.log_key!r}, "
        return (
            f"LogPartition({key}log={self.seq}, {self.start[0]}:{self.start[1]}..{end}, "
            f"~{self.nbytes} bytes)"
        )

    def segments(self) -> list[tuple[int, str]]:
        """``(number, name)`` of every segment of the log as listed when planning."""
        missing = set(self.missing)
        return [
            (n, segment_name(self.seq, n))
            for n in range(self.last_segment + 1)
            if n not in missing
        ]


@dataclass
class _Log:
    seq: int
    segments: list[tuple[int, str]]
    missing: tuple[int, ...] = ()
    sizes: list[int] = field(default_factory=list)
    first_lsn: int | None = None
    complete_lsn: int | None = None
    #: The walk of the start of its first segment (None: segment 0 is missing).
    start: HeaderWalk | None = None
    walks: dict[int, HeaderWalk] = field(default_factory=dict)


def _pool(n: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(1, min(IO_THREADS, n)), thread_name_prefix="persistlog-plan")


def _start_of(
    dest: Destination, seq: int, segments: list[tuple[int, str]], sizes: dict[str, int], recovery: str
) -> HeaderWalk | None:
    """One read of the start of the log's first segment: its first LSN, its header (does it
    follow a gap?) and, in a log whose snapshot is small, its complete marker."""
    number, name = segments[0]
    if number != 0:
        return None
    walk = walk_headers(dest, seq, 0, name, sizes[name], limit=WALK_CHUNK)
    if walk.first_lsn is None and walk.damage is not None and recovery == "strict":
        raise CorruptLogError(walk.damage.reason, destination=dest.url, log=seq, segment=name, offset=0)
    return walk


def _sizes(dest: Destination, lg: _Log, opts: ReadOptions, sizes: dict[str, int]) -> None:
    """Every segment's size (and the check that no segment is missing); ``sizes`` are
    those the listing gave, by name."""
    numbers = [n for n, _ in lg.segments]
    missing = tuple(sorted(set(range(numbers[-1] + 1)) - set(numbers)))
    if missing:
        # Same classification as LogScanner: strict fails now, skip reads what is there.
        if opts.recovery == "strict":
            raise CorruptLogError(
                f"segment(s) {list(missing)} missing from the log",
                destination=dest.url, log=lg.seq, segment=lg.segments[-1][1], offset=0,
            )
        logger.warning("log %d at %s lacks segment(s) %s", lg.seq, dest.url, list(missing))
    lg.missing = missing
    lg.sizes = [sizes[name] for _, name in lg.segments]


def _survey(dest: Destination, lg: _Log, split_bytes: int) -> None:
    """The complete marker, and batch offsets of segments bigger than ``split_bytes``."""
    for (number, name), size in zip(lg.segments, lg.sizes):
        whole = size > split_bytes
        find = lg.complete_lsn is None
        if not (whole or find):
            continue
        if number == 0 and not whole and lg.start is not None and lg.start.done:
            walk = lg.start  # the start of the log was walked to its marker or its end
        else:
            walk = walk_headers(dest, lg.seq, number, name, size, whole=whole)
        lg.walks[number] = walk
        if find and walk.complete_lsn is not None:
            lg.complete_lsn = walk.complete_lsn


def split_bytes(total: int, opts: ReadOptions) -> int:
    """Bytes per partition: at most ``max_partition_bytes``, and small enough to give every
    core a share of a small read (as Spark's file sources split files)."""
    share = -(-total // opts.min_partitions)
    return min(opts.max_partition_bytes, max(MIN_SPLIT_BYTES, share))


def _units(lg: _Log, target: int, max_bytes: int) -> list[tuple[int, int, int | None, int]]:
    """``(segment, offset, LSN or None, bytes)`` pieces, in order: whole segments, and
    batch-aligned slices of segments bigger than ``target``, none over ``max_bytes``."""
    units: list[tuple[int, int, int | None, int]] = []
    for (number, _name), size in zip(lg.segments, lg.sizes):
        walk = lg.walks.get(number)
        if size <= target or walk is None or not walk.batches:
            units.append((number, 0, None, size))
            continue
        # Equal shares, cut at the first batch past each share's end (and never more than
        # max_bytes, unless one batch alone is bigger).
        pieces = -(-size // target)
        share = size / pieces
        start, start_lsn, acc, cut_at = 0, None, SEGMENT_HEADER_SIZE, share
        for offset, lsn, bsize in walk.batches:
            if offset > start and (offset >= cut_at or acc + bsize > max_bytes):
                units.append((number, start, start_lsn, offset - start))
                start, start_lsn, acc = offset, lsn, 0
                while cut_at <= offset:
                    cut_at += share
            acc += bsize
        units.append((number, start, start_lsn, size - start))
    return units


def plan(opts: ReadOptions) -> list[LogPartition] | list[SetPartition]:
    """The partitions of a read, in log and LSN order (for a log set, in key order)."""
    if opts.log_set:
        return plan_set(opts)
    dest = open_destination(opts.url, **opts.storage_options)
    try:
        listing, sizes, current = listed_noted(dest)
        with retention_checked(dest, listing, current):
            read = _survey_log(dest, opts, (listing, sizes), current)
            parts = _partitions_of(read, opts, split_bytes(read.nbytes, opts))
        logger.info(
            "planned %d partition(s) over %d log(s) at %s (%s bytes)",
            len(parts), len(read.kept), opts.url, sum(p.nbytes for p in parts),
        )
        return parts
    except FileNotFoundError as e:
        raise _vanished(e, opts.url) from e
    finally:
        dest.close()


def _vanished(e: FileNotFoundError, url: str) -> Exception:
    if isinstance(e, LogNotFoundError):
        return e
    return deleted_while_read(url, f"a file vanished while the read was planned: {e}")


def deleted_while_read(url: str, what: str) -> DestinationError:
    """The error of a read that retention deleted files under (``what`` says which and how
    it showed): not damage, and a read started again reads what is left."""
    return DestinationError(
        f"logs at {url} were deleted while being read (retention by a running writer?): {what}; read again"
    )


def listed_noted(dest: Destination) -> tuple[dict[int, list[tuple[int, str]]], dict[str, int], int | None]:
    """The logs at ``dest`` and their segments' sizes (:func:`_listed_sized`), and the log
    CURRENT named before that listing (0: none), for :func:`deleted_under`.

    Retention deletes a log only once CURRENT names a later log, which is there before
    CURRENT names it and stays while the older one is deleted: a listing that shows one
    log shows none being deleted, and needs no CURRENT (None). One that shows more is
    taken again after a read of CURRENT."""
    listed = _listed_sized(dest)
    if len(listed[0]) < 2:
        return (*listed, None)
    current = read_pointer(dest) or 0
    return (*_listed_sized(dest), current)


def deleted_under(
    dest: Destination, listing: dict[int, list[tuple[int, str]]], current: int | None, damaged: int | None
) -> str | None:
    """How retention has been deleting logs of ``listing`` (taken after CURRENT named
    ``current``) under a read that found damage in log ``damaged``, if it has: a segment
    listed is gone now, or CURRENT has moved past ``damaged`` since. Retention deletes a
    log's segments last first once CURRENT moved past it, so a listing taken meanwhile
    shows the log cut short while every segment it lists is still there
    (:func:`persistlog.reading.gone_since`, which followers ask too). None: the damage
    is real (or ``current`` is None: not noted)."""
    if not listing or current is None:
        return None
    gone = gone_since(dest, ReplayPlan(listing, min(listing), False, current), damaged)
    if gone is None:
        return None
    if gone.segment > listing[gone.seq][-1][0]:  # after the log's last listed segment
        return f"CURRENT has moved past log {gone.seq} since the read listed it"
    return f"log {gone.seq} segment {gone.segment} is gone"


@contextmanager
def retention_checked(
    dest: Destination, listing: dict[int, list[tuple[int, str]]], current: int | None
) -> Iterator[None]:
    """Damage met inside: ``CorruptLogError`` as raised, unless retention was deleting the
    damaged log under the read (:func:`deleted_under`): then the error that says so."""
    try:
        yield
    except CorruptLogError as e:
        how = deleted_under(dest, listing, current, e.log)
        if how is None:
            raise
        raise deleted_while_read(dest.url, f"{how}, and the read found: {e}") from e


@dataclass
class _LogRead:
    """One log's read as surveyed, before it is cut into partitions."""

    dest: Destination
    seqs: list[int]
    gaps: set[int]
    logs: list[_Log]
    kept: list[_Log]
    next_first: dict[int, int | None]
    expect_complete: bool
    #: CURRENT as read before the listing (:func:`listed_noted`).
    current: int | None

    @property
    def nbytes(self) -> int:
        return sum(sum(lg.sizes) for lg in self.kept)


def _survey_log(
    dest: Destination,
    opts: ReadOptions,
    listed: tuple[dict[int, list[tuple[int, str]]], dict[str, int]],
    current: int | None,
) -> _LogRead:
    """Which logs of ``dest`` the read takes, checked, with their segments' sizes.

    ``listed`` is the listing and the segments' sizes (by name) (:func:`_listed_sized`),
    taken after CURRENT named ``current``. The start of each log's first segment is read
    once, here: its first LSN, whether it follows a gap, and (where the snapshot is small)
    its complete marker."""
    listing, sizes = listed
    if not listing:
        # As the replay job and restore(missing_ok=False) say it: a mistyped path must not
        # read as an empty history.
        raise no_log(dest, "check the path given to load()")
    seqs = sorted(listing)
    expect_complete = False
    if opts.logs == "latest":
        rp = replay_plan(dest)
        assert rp.start is not None
        seqs = [s for s in seqs if s >= rp.start]
        expect_complete = rp.complete
    starts = dict(zip(seqs, _map(lambda s: _start_of(dest, s, listing[s], sizes, opts.recovery), seqs)))
    # Logs whose writer declared that they do not continue the log before them (on a
    # secondary that was detached or behind): no replay reaches across one.
    gaps = {seq for seq, start in starts.items() if start is not None and start.after_gap}
    for a, b in zip(seqs, seqs[1:]):
        if b != a + 1 and b not in gaps:
            raise CorruptLogError(
                f"log {a + 1} is missing between logs {a} and {b}", destination=dest.url, log=a + 1
            )
    logs = [_Log(seq, listing[seq], start=starts[seq]) for seq in seqs]
    for lg in logs:
        lg.first_lsn = lg.start.first_lsn if lg.start is not None else None
    next_first: dict[int, int | None] = {
        lg.seq: (logs[i + 1].first_lsn if i + 1 < len(logs) else None) for i, lg in enumerate(logs)
    }
    kept = [
        lg
        for lg in logs
        if not (opts.from_lsn is not None and (nf := next_first[lg.seq]) is not None and nf <= opts.from_lsn)
        and not (opts.to_lsn is not None and lg.first_lsn is not None and lg.first_lsn > opts.to_lsn)
    ]
    _map(lambda lg: _sizes(dest, lg, opts, sizes), kept)
    return _LogRead(dest, seqs, gaps, logs, kept, next_first, expect_complete, current)


def _listed_sized(dest: Destination) -> tuple[dict[int, list[tuple[int, str]]], dict[str, int]]:
    """The logs at ``dest`` and every listed segment's size, by name: locally a stat of
    each segment only; remotely from the listing itself (no request per segment)."""
    if not dest.appendable:
        return list_logs_sized(dest)
    listing = list_logs(dest)
    return listing, {name: dest.size(name) for segments in listing.values() for _n, name in segments}


def _map(fn: Callable[[T], R], items: list[T]) -> list[R]:
    """``fn`` over ``items``, overlapped on a pool when there is more than one."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with _pool(len(items)) as pool:
        return list(pool.map(fn, items))


def _partitions_of(read: _LogRead, opts: ReadOptions, target: int, log_key: str | None = None) -> list[LogPartition]:
    """A surveyed log's partitions of about ``target`` bytes (the read's share per task)."""
    dest, seqs, gaps, logs, kept, next_first = read.dest, read.seqs, read.gaps, read.logs, read.kept, read.next_first
    _map(lambda lg: _survey(dest, lg, target), kept)
    last_gap = max(gaps & {lg.seq for lg in kept}, default=None)
    if last_gap is not None and all(lg.complete_lsn is None for lg in kept if lg.seq >= last_gap):
        # As restore does: nothing from the last gap on is complete yet, so none of it
        # continues a state this read can build.
        logger.info("%s: log(s) from %d on follow a gap and none is complete yet: not read", dest.url, last_gap)
        kept = [lg for lg in kept if lg.seq < last_gap]
    for i, lg in enumerate(logs[1:]):
        if lg.seq in gaps:
            next_first[logs[i].seq] = None
    # The next log's first link, where its first LSN is checked too: the chain across logs.
    next_link = {
        lg.seq: nxt.start.first_link
        for lg, nxt in zip(logs, logs[1:])
        if next_first[lg.seq] is not None and nxt.start is not None
    }
    if read.expect_complete and kept and kept[0].seq == seqs[0] and kept[0].complete_lsn is None:
        if opts.recovery == "strict":
            raise CorruptLogError(
                "CURRENT names this log but it has no snapshot-complete marker",
                destination=dest.url, log=seqs[0],
            )
    parts: list[LogPartition] = []
    prev_base: int | None = None
    for lg in kept:
        if lg.seq in gaps:
            prev_base = None
        from_start = opts.from_lsn is None or (lg.first_lsn is not None and opts.from_lsn <= lg.first_lsn)
        base_from: int | None = None
        if from_start and lg.first_lsn is not None:
            base_from = replay_base(lg.first_lsn, lg.complete_lsn)
        parts.extend(
            _partitions(lg, opts, dest.url, target, (next_first[lg.seq], next_link.get(lg.seq)), base_from, prev_base, log_key,
                        read.current)
        )
        if base_from is not None:
            prev_base = lg.seq
    return parts


def replay_base(first_lsn: int, complete_lsn: int | None) -> int | None:
    """From which LSN on the rows of a log that starts at ``first_lsn`` (and whose snapshot
    ends at ``complete_lsn``) can start a replay (None: none can)."""
    # The first log ever holds the whole history: any point in it can be replayed.
    return 0 if first_lsn == FIRST_LSN else complete_lsn


def _partitions(
    lg: _Log,
    opts: ReadOptions,
    url: str,
    target: int,
    next_log: tuple[int | None, bytes | None],
    base_from: int | None,
    prev_base: int | None,
    log_key: str | None,
    current: int | None,
) -> list[LogPartition]:
    """The ranges of log ``lg``; ``next_log`` is the first LSN and first link of the log
    after it (checked by the last range)."""
    units = _units(lg, target, opts.max_partition_bytes)
    groups: list[list[tuple[int, int, int | None, int]]] = []
    total = 0
    for unit in units:
        if groups and total + unit[3] <= target:
            groups[-1].append(unit)
            total += unit[3]
        else:
            groups.append([unit])
            total = unit[3]
    parts = []
    for i, group in enumerate(groups):
        first = group[0]
        end = (groups[i + 1][0][0], groups[i + 1][0][1]) if i + 1 < len(groups) else None
        parts.append(
            LogPartition(
                url=url,
                storage_options=opts.storage_options,
                seq=lg.seq,
                last_segment=lg.segments[-1][0],
                missing=lg.missing,
                start=(first[0], first[1], first[2]),
                end=end,
                next_log_lsn=next_log[0] if end is None else None,
                next_log_link=next_log[1] if end is None else None,
                base_from=base_from,
                prev_base=prev_base,
                from_lsn=opts.from_lsn,
                to_lsn=opts.to_lsn,
                recovery=opts.recovery,
                convention=opts.convention,
                view=opts.view,
                nbytes=sum(u[3] for u in group),
                log_key=log_key,
                key_provider=opts.key_provider,
                current=current,
            )
        )
    return parts


# -- a log set: every log's partitions, planned at once, packed into tasks -----------------


@dataclass(repr=False)
class LogToPlan:
    """A small local log of a set, listed and sized on the driver and planned by the task
    that reads it (its start walked, its ranges cut): what the driver would plan, planned
    on the executors, in parallel, and beside the read of the same bytes.

    Only logs no bigger than a task's share are left so: they never need splitting, so
    the driver's packing of tasks by bytes is the same as if it had planned them."""

    url: str
    log_key: str
    opts: ReadOptions
    listing: dict[int, list[tuple[int, str]]]
    sizes: dict[str, int]
    target: int
    nbytes: int
    #: CURRENT as the driver read it before the listing (:attr:`LogPartition.current`).
    current: int | None

    def __repr__(self) -> str:
        # Never print storage options (in opts): they may hold credentials.
        return f"LogToPlan(key={self.log_key!r}, {len(self.listing)} log(s), ~{self.nbytes} bytes)"

    def whole(self) -> LogPartition | None:
        """The range of a small log that a task reads in one pass, before it knows from
        where its rows can start a replay (``base_from`` is then set from what the scan
        found: :func:`replay_base`); None when the log takes the survey.

        That is a strict read of all of one log of at most ``WHOLE_LOG_BYTES`` whose
        segments are all there, with no LSN bounds: nothing a survey would find can then
        drop or cut the range (a log whose header says it follows a gap is the one
        exception, and the reader turns to :meth:`partitions` when it meets one)."""
        o = self.opts
        if (
            len(self.listing) != 1
            or self.nbytes > WHOLE_LOG_BYTES
            or (o.recovery, o.logs, o.view) != ("strict", "all", "records")
            or o.from_lsn is not None
            or o.to_lsn is not None
        ):
            return None
        ((seq, segments),) = self.listing.items()
        if [n for n, _name in segments] != list(range(len(segments))):
            return None
        return LogPartition(
            url=self.url, storage_options=o.storage_options, seq=seq, last_segment=segments[-1][0],
            missing=(), start=(0, 0, None), end=None, next_log_lsn=None, base_from=None,
            prev_base=None, from_lsn=None, to_lsn=None, recovery=o.recovery,
            convention=o.convention, view=o.view, nbytes=self.nbytes, log_key=self.log_key,
            key_provider=o.key_provider, current=self.current,
        )

    def partitions(self) -> list[LogPartition]:
        """The log's ranges, as :func:`plan_set` plans a log it surveys itself."""
        dest = open_destination(self.url, **self.opts.storage_options)
        try:
            with retention_checked(dest, self.listing, self.current):
                read = _survey_log(dest, self.opts, (self.listing, self.sizes), self.current)
                return _partitions_of(read, self.opts, self.target, self.log_key)
        except FileNotFoundError as e:
            raise _vanished(e, dest.url) from e
        finally:
            dest.close()


@dataclass(repr=False)
class SetPartition(InputPartition):
    """One task's share of a log set: ranges of its logs, planned on the driver, and small
    local logs planned by the task (:class:`LogToPlan`), read in turn (a small log is one
    range, read whole)."""

    units: tuple[LogPartition | LogToPlan, ...] = ()

    @property
    def nbytes(self) -> int:
        return sum(u.nbytes for u in self.units)

    def __repr__(self) -> str:
        logs = len({u.log_key for u in self.units})
        return f"SetPartition({len(self.units)} range(s) of {logs} log(s), ~{self.nbytes} bytes)"

    def ranges(self) -> Iterator[LogPartition]:
        """Every range this task reads, in order."""
        for unit in self.units:
            if isinstance(unit, LogToPlan):
                yield from unit.partitions()
            else:
                yield unit


@dataclass
class _Listed:
    """A key's log as listed (and, locally, sized) on the driver, not yet surveyed."""

    key: str
    dest: Destination
    listing: dict[int, list[tuple[int, str]]]
    sizes: dict[str, int]
    current: int | None

    @property
    def nbytes(self) -> int:
        return sum(self.sizes.values())


def plan_set(opts: ReadOptions) -> list[SetPartition]:
    """The partitions of a read of every log of the log set at ``opts.url``.

    The keys are listed shard by shard (``LogSet.keys``), then each key's directory is
    listed, with its segments' sizes (from the listing itself on a remote store: no request
    per segment). On a remote store each key's log is then surveyed here as a read of one
    log is, once (the start of each of its logs read: first LSN, gap, complete marker),
    ``SET_THREADS`` keys at once. Locally the listing's sizes come with
    it (a stat each), and a log no bigger than a task's share is left to the task that
    reads it to survey (:class:`LogToPlan`): the per-log Python then runs on every core
    rather than on the driver alone. The share per task is worked out from the bytes of
    the whole set; a log bigger than a share is surveyed here and cut into ranges. Tasks
    take ranges in key order up to the share, so that a set of many small logs is spread
    over every core as a big log is.
    """
    logset = LogSet(opts.url, create=False, storage_options=opts.storage_options)
    logs = list(logset.logs())
    single = replace(opts, log_set=False)
    root = open_destination(opts.url, **opts.storage_options)
    local = root.appendable
    root.close()

    def listed(key_url: tuple[str, str]) -> _Listed | None:
        key, url = key_url
        dest = open_destination(url, **opts.storage_options)
        try:
            listing, sizes, current = listed_noted(dest)
            if not listing:
                logger.info("%s: key %r holds no log yet: nothing to read", opts.url, key)
                dest.close()
                return None
            return _Listed(key, dest, listing, sizes, current)
        except FileNotFoundError as e:
            dest.close()
            raise _vanished(e, dest.url) from e
        except BaseException:
            dest.close()
            raise

    def survey(item: _Listed) -> tuple[str, _LogRead]:
        try:
            with retention_checked(item.dest, item.listing, item.current):
                return item.key, _survey_log(item.dest, single, (item.listing, item.sizes), item.current)
        except FileNotFoundError as e:
            raise _vanished(e, item.dest.url) from e

    units: list[LogPartition | LogToPlan] = []
    nbytes = 0
    found: list[_Listed] = []
    # Thousands of small objects per thousand logs: the cyclic GC is paused meanwhile, as
    # during a replay (it would scan the driver's whole heap over and over).
    with gc_pause.during_replay(), _closing(found):
        found.extend(item for item in _map_logs(listed, logs, local) if item is not None)
        if local:
            # Sizes are known: the share per task, and which logs a task surveys itself.
            target = split_bytes(sum(item.nbytes + LOG_COST_BYTES for item in found if item.nbytes), opts)
            small = {item.key for item in found if item.nbytes <= target}
            reads = [survey(item) for item in found if item.key not in small]
        else:
            reads = _map_logs(survey, found, local)
            target = split_bytes(sum(read.nbytes + LOG_COST_BYTES for _key, read in reads if read.nbytes), opts)
            small = set()
        surveyed = dict(reads)

        def ranges(item: _Listed) -> list[LogPartition] | list[LogToPlan]:
            if item.key in small:
                if not item.nbytes:
                    return []
                return [LogToPlan(item.dest.url, item.key, single, item.listing, item.sizes, target, item.nbytes,
                                  item.current)]
            read = surveyed[item.key]
            if not read.nbytes:
                return []
            try:
                with retention_checked(read.dest, item.listing, item.current):
                    return _partitions_of(read, single, target, item.key)
            except FileNotFoundError as e:
                raise _vanished(e, read.dest.url) from e

        for planned in _map_logs(ranges, found, local):
            units.extend(planned)
            nbytes += sum(u.nbytes for u in planned)
    # Equal shares of the whole cost, each task cut where its share ends: as many tasks as
    # the target asks for, none a small remainder that would run alone after the others.
    costs = [u.nbytes + LOG_COST_BYTES for u in units]
    share = sum(costs) / max(1, -(-sum(costs) // target))
    tasks: list[SetPartition] = []
    done, bound = 0, share
    for unit, cost in zip(units, costs):
        if not tasks or done >= bound:
            tasks.append(SetPartition())
            while bound <= done:
                bound += share
        tasks[-1].units += (unit,)
        done += cost
    logger.info(
        "planned %d partition(s) over %d log(s) at %s (%s bytes)",
        len(tasks), len({u.log_key for u in units}), opts.url, nbytes,
    )
    return tasks


@contextmanager
def _closing(found: list[_Listed]) -> Iterator[None]:
    """Close the destination of every log listed, however planning ends."""
    try:
        yield
    finally:
        for item in found:
            item.dest.close()


def _map_logs(fn: Callable[[T], R], items: list[T], local: bool) -> list[R]:
    """``fn`` over the logs of a set: one after the other locally (each call is a few
    system calls, which threads would only slow down), ``SET_THREADS`` at once remotely."""
    if local or len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(min(SET_THREADS, len(items)), thread_name_prefix="persistlog-plan-set") as pool:
        return list(pool.map(fn, items))
