"""Planning a read on the driver: which logs, which byte ranges, and what each task needs.

The driver lists the destination once and reads little: each log's first segment header
(its first LSN, for ``from_lsn``/``to_lsn`` pruning and the log-to-log chain check), the
batch headers of each log up to its snapshot-complete marker (which tells from which LSN a
replay starting at that log gives the full state), and the batch headers of segments
larger than a partition (to split them at batch boundaries). A partition holds at most
``max_partition_bytes``, and less when the whole read is small, so that every core gets a
share (``min_partitions``, as Spark's file sources split files). Payloads are only
read for control batches, which are small; everything else is checked by the executors,
through the same :class:`persistlog._reader.LogScanner` that restore uses.

A partition is a contiguous range of one log: from ``start`` (segment, offset, LSN at that
offset or None at a segment start) up to ``end`` (exclusive; None for the end of the log).
Small neighbouring segments are packed into one partition up to that size, so that an object store holding one small object per flush does not become one task per
object.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from pyspark.sql.datasource import InputPartition

from destinations import Destination, open_destination
from persistlog import _format as F
from persistlog._decoder import (
    Damage,
    check_payload,
    control_records,
    parse_batch_header,
    parse_segment_header,
)
from persistlog._errors import CorruptLogError, DestinationError, LogNotFoundError
from persistlog._log_set import LogSet
from persistlog._reader import ScanStart, SegmentBytes, declares_gap, list_logs
from persistlog._restore import plan as restore_plan

from ._options import MIN_SPLIT_BYTES, ReadOptions

log = logging.getLogger("spark_replay")

# Reads while walking headers: small, since most of a window is payload we skip.
WALK_CHUNK = 64 * 1024
# Remote size look-ups and header walks are latency-bound: overlap them.
IO_THREADS = 16
# Logs of a set surveyed at once (each of them then overlaps its own reads).
SET_THREADS = 16
# What opening, planning and scanning one more log costs a task beside its bytes, as bytes
# it could have read instead (about 0.3 ms, the time of ~40 KiB of small records): a set
# of many small logs is spread over every core, as a big log is.
LOG_COST_BYTES = 48 * 1024

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
            (n, F.segment_name(self.seq, n))
            for n in range(self.last_segment + 1)
            if n not in missing
        ]


@dataclass
class _Walk:
    first_lsn: int | None = None
    complete_lsn: int | None = None
    # (offset, first LSN, size) of every batch, when the segment was walked whole.
    batches: list[tuple[int, int, int]] | None = None


@dataclass
class _Log:
    seq: int
    segments: list[tuple[int, str]]
    missing: tuple[int, ...] = ()
    sizes: list[int] = field(default_factory=list)
    first_lsn: int | None = None
    complete_lsn: int | None = None
    walks: dict[int, _Walk] = field(default_factory=dict)


def _walk_segment(
    dest: Destination, seq: int, number: int, name: str, size: int, *, find_marker: bool, whole: bool
) -> _Walk:
    """Batch headers of one segment, stopping at the complete marker unless ``whole``.

    Damage ends the walk quietly: the executors scan every byte and report it precisely.
    """
    walk = _Walk(batches=[] if whole else None)
    w = SegmentBytes(dest, name, size, chunk=WALK_CHUNK)
    try:
        sh = parse_segment_header(w.get(0, F.SEGMENT_HEADER_SIZE))
        if sh.seq != seq or sh.segment != number:
            return walk
        walk.first_lsn = sh.first_lsn
        pos = F.SEGMENT_HEADER_SIZE
        while pos < size:
            h = parse_batch_header(w.get(pos, F.BATCH_HEADER_SIZE), pos)
            if pos + h.size > size:
                break
            if walk.batches is not None:
                walk.batches.append((pos, h.first_lsn, h.size))
            if find_marker and h.kind == F.KIND_CONTROL and walk.complete_lsn is None:
                raw = check_payload(h, w.get(pos + F.BATCH_HEADER_SIZE, h.stored_len), pos)
                if any(c["t"] == F.CONTROL_COMPLETE for c in control_records(h, raw, pos)):
                    walk.complete_lsn = h.first_lsn - 1
                    if not whole:
                        break
            pos += h.size
    except Damage as d:
        log.debug("planning stopped walking %s/%s at %d: %s", dest.url, name, d.offset, d.reason)
    return walk


def _pool(n: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(1, min(IO_THREADS, n)), thread_name_prefix="persistlog-plan")


def _first_lsn(dest: Destination, seq: int, segments: list[tuple[int, str]], recovery: str) -> int | None:
    number, name = segments[0]
    if number != 0:
        return None
    try:
        sh = parse_segment_header(dest.read(name, 0, F.SEGMENT_HEADER_SIZE))
    except Damage as d:
        if recovery == "strict":
            raise CorruptLogError(d.reason, destination=dest.url, log=seq, segment=name, offset=0) from None
        return None
    if sh.seq != seq or sh.segment != 0:
        if recovery == "strict":
            raise CorruptLogError(
                f"segment header says log {sh.seq} segment {sh.segment}",
                destination=dest.url, log=seq, segment=name, offset=0,
            )
        return None
    return sh.first_lsn


def _sizes(dest: Destination, lg: _Log, opts: ReadOptions) -> None:
    """Every segment's size (and the check that no segment is missing)."""
    numbers = [n for n, _ in lg.segments]
    missing = tuple(sorted(set(range(numbers[-1] + 1)) - set(numbers)))
    if missing:
        # Same classification as LogScanner: strict fails now, skip reads what is there.
        if opts.recovery == "strict":
            raise CorruptLogError(
                f"segment(s) {list(missing)} missing from the log",
                destination=dest.url, log=lg.seq, segment=lg.segments[-1][1], offset=0,
            )
        log.warning("log %d at %s lacks segment(s) %s", lg.seq, dest.url, list(missing))
    lg.missing = missing
    if dest.appendable:
        lg.sizes = [dest.size(name) for _, name in lg.segments]
    else:
        lg.sizes = _map(dest.size, [name for _, name in lg.segments])


def _survey(dest: Destination, lg: _Log, split_bytes: int) -> None:
    """The complete marker, and batch offsets of segments bigger than ``split_bytes``."""
    for (number, name), size in zip(lg.segments, lg.sizes):
        whole = size > split_bytes
        find = lg.complete_lsn is None
        if not (whole or find):
            continue
        walk = _walk_segment(dest, lg.seq, number, name, size, find_marker=find, whole=whole)
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
        start, start_lsn, acc, cut_at = 0, None, F.SEGMENT_HEADER_SIZE, share
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
        read = _survey_log(dest, opts)
        parts = _partitions_of(read, opts, split_bytes(read.nbytes, opts))
        log.info(
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
    return DestinationError(
        f"a file vanished while planning the read of {url} (retention by a running writer?): {e}"
    )


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

    @property
    def nbytes(self) -> int:
        return sum(sum(lg.sizes) for lg in self.kept)


def _survey_log(dest: Destination, opts: ReadOptions) -> _LogRead:
    """Which logs of ``dest`` the read takes, checked, with their segments' sizes."""
    listing = list_logs(dest)
    if not listing:
        # As the replay job and restore(missing_ok=False) say it: a mistyped path must not
        # read as an empty history.
        where = "the location does not exist" if not dest.exists() else "it holds no log"
        raise LogNotFoundError(f"no persistlog log at {dest.url} ({where}); check the path given to load()")
    seqs = sorted(listing)
    expect_complete = False
    if opts.logs == "latest":
        rp = restore_plan(dest)
        assert rp.start is not None
        seqs = [s for s in seqs if s >= rp.start]
        expect_complete = rp.complete
    # Logs whose writer declared that they do not continue the log before them (on a
    # secondary that was detached or behind): no replay reaches across one.
    gaps = {seq for seq, d in zip(seqs, _map(lambda s: declares_gap(dest, listing[s]), seqs)) if d}
    for a, b in zip(seqs, seqs[1:]):
        if b != a + 1 and b not in gaps:
            raise CorruptLogError(
                f"log {a + 1} is missing between logs {a} and {b}", destination=dest.url, log=a + 1
            )
    logs = [_Log(seq, listing[seq]) for seq in seqs]
    firsts = _map(lambda lg: _first_lsn(dest, lg.seq, lg.segments, opts.recovery), logs)
    for lg, first in zip(logs, firsts):
        lg.first_lsn = first
    next_first: dict[int, int | None] = {
        lg.seq: (logs[i + 1].first_lsn if i + 1 < len(logs) else None) for i, lg in enumerate(logs)
    }
    kept = [
        lg
        for lg in logs
        if not (opts.from_lsn is not None and (nf := next_first[lg.seq]) is not None and nf <= opts.from_lsn)
        and not (opts.to_lsn is not None and lg.first_lsn is not None and lg.first_lsn > opts.to_lsn)
    ]
    _map(lambda lg: _sizes(dest, lg, opts), kept)
    return _LogRead(dest, seqs, gaps, logs, kept, next_first, expect_complete)


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
        log.info("%s: log(s) from %d on follow a gap and none is complete yet: not read", dest.url, last_gap)
        kept = [lg for lg in kept if lg.seq < last_gap]
    for i, lg in enumerate(logs[1:]):
        if lg.seq in gaps:
            next_first[logs[i].seq] = None
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
            # The first log ever holds the whole history: any point in it can be replayed.
            base_from = 0 if lg.first_lsn == F.FIRST_LSN else lg.complete_lsn
        parts.extend(_partitions(lg, opts, dest.url, target, next_first[lg.seq], base_from, prev_base, log_key))
        if base_from is not None:
            prev_base = lg.seq
    return parts


def _partitions(
    lg: _Log,
    opts: ReadOptions,
    url: str,
    target: int,
    next_log_lsn: int | None,
    base_from: int | None,
    prev_base: int | None,
    log_key: str | None,
) -> list[LogPartition]:
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
                next_log_lsn=next_log_lsn if end is None else None,
                base_from=base_from,
                prev_base=prev_base,
                from_lsn=opts.from_lsn,
                to_lsn=opts.to_lsn,
                recovery=opts.recovery,
                convention=opts.convention,
                view=opts.view,
                nbytes=sum(u[3] for u in group),
                log_key=log_key,
            )
        )
    return parts


# -- a log set: every log's partitions, planned at once, packed into tasks -----------------


@dataclass(frozen=True)
class LaterLog:
    """A small log of a set that its task surveys itself (``plan_log``) before reading it:
    what it costs to plan is spent on the executors, beside the reads, not on the driver."""

    key: str
    url: str
    nbytes: int


@dataclass(repr=False)
class SetPartition(InputPartition):
    """One task's share of a log set, read in turn: ranges of logs planned on the driver
    (``LogPartition``) and whole small logs the task plans itself (``LaterLog``)."""

    opts: ReadOptions
    target: int
    units: tuple[LogPartition | LaterLog, ...] = ()

    @property
    def nbytes(self) -> int:
        return sum(u.nbytes for u in self.units)

    def __repr__(self) -> str:
        later = sum(isinstance(u, LaterLog) for u in self.units)
        return (
            f"SetPartition({len(self.units) - later} range(s), {later} whole log(s), "
            f"~{self.nbytes} bytes)"
        )

    def ranges(self) -> Iterator[LogPartition]:
        """Every range this task reads, in order (whole logs planned as they come)."""
        for unit in self.units:
            if isinstance(unit, LogPartition):
                yield unit
            else:
                yield from plan_log(unit.key, unit.url, self.opts, self.target)


def plan_log(key: str, url: str, opts: ReadOptions, target: int) -> list[LogPartition]:
    """The ranges of one log of a set, ``target`` bytes each at most (``opts`` are the
    read's, for one log); none when the key's directory holds no log yet (an open that
    failed, a key being created)."""
    dest = open_destination(url, **opts.storage_options)
    try:
        return _partitions_of(_survey_log(dest, opts), opts, target, key)
    except LogNotFoundError:
        log.info("%s: key %r holds no log yet: nothing to read", opts.url, key)
        return []
    except FileNotFoundError as e:
        raise _vanished(e, url) from e
    finally:
        dest.close()


def _log_bytes(dest: Destination) -> int:
    """Bytes of every segment of every log at ``dest`` (0: no log)."""
    listing = list_logs(dest)
    names = [name for segments in listing.values() for _n, name in segments]
    if dest.appendable:
        return sum(dest.size(name) for name in names)
    return sum(_map(dest.size, names))


def plan_set(opts: ReadOptions) -> list[SetPartition]:
    """The partitions of a read of every log of the log set at ``opts.url``.

    The keys are listed shard by shard (``LogSet.keys``) and each log's bytes are counted
    (one listing and its segments' sizes; on a remote store ``SET_THREADS`` logs at once);
    the share per task is worked out from the bytes of the whole set. A log within one
    share is read whole by one task, which plans it itself (``LaterLog``): planning a log
    costs some reads of headers, which a set of many small logs would otherwise make the
    driver do one log after the other. A bigger log is planned here, as a read of one log
    is, and cut into ranges. Tasks take logs and ranges in key order up to the share.
    """
    logset = LogSet(opts.url, create=False, storage_options=opts.storage_options)
    keys = list(logset.keys())
    single = replace(opts, log_set=False)
    root = open_destination(opts.url, **opts.storage_options)
    local = root.appendable
    root.close()

    def size(key: str) -> int:
        dest = open_destination(logset.url(key), **opts.storage_options)
        try:
            return _log_bytes(dest)
        except FileNotFoundError as e:
            raise _vanished(e, dest.url) from e
        finally:
            dest.close()

    sizes = _map_logs(size, keys, local)
    target = split_bytes(sum(n + LOG_COST_BYTES for n in sizes if n), opts)
    big = [key for key, n in zip(keys, sizes) if n + LOG_COST_BYTES > target]
    ranges = dict(zip(big, _map_logs(lambda key: plan_log(key, logset.url(key), single, target), big, local)))
    units: list[LogPartition | LaterLog] = []
    for key, n in zip(keys, sizes):
        if n:
            units.extend(ranges[key] if key in ranges else [LaterLog(key, logset.url(key), n)])
    # Equal shares of the whole cost, each task cut where its share ends: as many tasks as
    # the target asks for, none a small remainder that would run alone after the others.
    costs = [u.nbytes + LOG_COST_BYTES for u in units]
    share = sum(costs) / max(1, -(-sum(costs) // target))
    tasks: list[SetPartition] = []
    done, bound = 0, share
    for unit, cost in zip(units, costs):
        if not tasks or done >= bound:
            tasks.append(SetPartition(single, target))
            while bound <= done:
                bound += share
        tasks[-1].units += (unit,)
        done += cost
    log.info(
        "planned %d partition(s) over %d log(s) at %s (%s bytes; %d log(s) planned by their tasks)",
        len(tasks), sum(1 for n in sizes if n), opts.url, sum(sizes),
        sum(isinstance(u, LaterLog) for t in tasks for u in t.units),
    )
    return tasks


def _map_logs(fn: Callable[[str], R], keys: list[str], local: bool) -> list[R]:
    """``fn`` over the keys of a set: one after the other locally (each call is a few
    system calls, which threads would only slow down), ``SET_THREADS`` at once remotely."""
    if local or len(keys) <= 1:
        return [fn(key) for key in keys]
    with ThreadPoolExecutor(min(SET_THREADS, len(keys)), thread_name_prefix="persistlog-plan-set") as pool:
        return list(pool.map(fn, keys))
