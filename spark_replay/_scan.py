"""Reading one partition on an executor: bytes to Arrow record batches.

Everything goes through persistlog's one reader (:class:`LogScanner`), so damage is
classified exactly as restore classifies it: a torn tail of an unsealed log is dropped;
anything else raises :class:`CorruptLogError` (strict) or is passed over and listed (skip).
Records become JSON text by the rule of ``docs/JSON.md`` (:mod:`persistlog._jsonify`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import pyarrow as pa

from destinations import Destination, open_destination
from persistlog import _format as F
from persistlog._decoder import Damage
from persistlog._errors import CorruptLogError, DestinationError
from persistlog._jsonify import JsonRecords, PlainRecords, plain_loads, to_json
from persistlog._reader import Batch, LogScanner

from ._plan import LogPartition
from ._schema import TIMESTAMP, arrow_schema

log = logging.getLogger("spark_replay")

# Rows per Arrow batch handed to Spark: large enough to amortise the per-batch cost,
# small enough to keep a task's memory flat.
CHUNK_ROWS = 16384

_KIND_NAMES = {F.KIND_UPDATE: "update", F.KIND_SNAPSHOT: "snapshot"}


@dataclass
class Problem:
    """Damage met in a partition: a dropped torn tail or a passed-over corruption."""

    log: int
    segment: int | None
    segment_name: str | None
    offset: int | None
    length: int | None
    kind: str
    reason: str


class _Range:
    """The partition's slice of its log, and the checks at its edges."""

    def __init__(self, dest: Destination, part: LogPartition) -> None:
        self.dest = dest
        self.part = part
        self.problems: list[Problem] = []
        self.scanner = LogScanner(
            dest, part.seq, part.segments(), recovery=part.recovery, start=part.start  # type: ignore[arg-type]
        )

    def contains(self, segment: int, offset: int) -> bool:
        start = self.part.start[:2]
        end = self.part.end
        return start <= (segment, offset) and (end is None or (segment, offset) < end)

    def corrupt(self, reason: str, segment: str | None = None, offset: int | None = None, length: int | None = None) -> None:
        part = self.part
        if part.recovery == "strict":
            raise CorruptLogError(reason, destination=part.url, log=part.seq, segment=segment, offset=offset)
        parsed = F.parse_segment_name(segment) if segment else None
        number = parsed[1] if parsed else None
        self.problems.append(Problem(part.seq, number, segment, offset, length, "skipped", reason))

    def batches(self) -> Iterator[Batch]:
        """The batches inside the range, then the end-of-range checks."""
        part = self.part
        end = part.end
        try:
            for batch in self.scanner:
                if end is not None and (batch.segment, batch.offset) >= end:
                    break
                yield batch
            else:
                self._at_end_of_log()
        except FileNotFoundError as e:
            raise DestinationError(
                f"a segment of log {part.seq} at {part.url} vanished during the read "
                f"(retention by a running writer?): {e}"
            ) from e
        self._collect_scanner_problems()
        if part.start[:2] == (0, 0) and self.scanner.state.header is None:
            self.corrupt("log has no header record", F.segment_name(part.seq, 0), 0)

    def _at_end_of_log(self) -> None:
        st = self.scanner.state
        part = self.part
        if part.next_log_lsn is not None and st.next_lsn is not None and st.next_lsn != part.next_log_lsn:
            self.corrupt(
                f"log {part.seq} ends before LSN {st.next_lsn} but log {part.seq + 1} "
                f"starts at LSN {part.next_log_lsn}",
                F.segment_name(part.seq + 1, 0),
                0,
            )

    def _collect_scanner_problems(self) -> None:
        st = self.scanner.state
        for s in st.skipped:
            parsed = F.parse_segment_name(s.segment)
            number = parsed[1] if parsed else None
            if number is None or self.contains(number, s.offset):
                self.problems.append(Problem(s.log, number, s.segment, s.offset, s.length, "skipped", s.reason))
        if st.torn is not None:
            t = st.torn
            parsed = F.parse_segment_name(t.segment)
            number = parsed[1] if parsed else None
            if number is None or self.contains(number, t.offset):
                self.problems.append(Problem(t.log, number, t.segment, t.offset, t.length, "torn", t.reason))
        st.skipped.clear()


class _Columns:
    """Column values of the rows gathered so far, turned into an Arrow batch on demand."""

    def __init__(self, part: LogPartition) -> None:
        self.part = part
        self.resource = part.convention == "resource"
        self.schema = arrow_schema("records", part.convention)
        self.json = JsonRecords()
        self._reset()

    def _reset(self) -> None:
        self.segments: list[int] = []
        self.lsns: list[int] = []
        self.commits: list[int] = []
        self.kinds: list[str] = []
        self.records: list[str] = []
        self.bases: list[int | None] = []
        self.ops: list[str | None] = []
        self.keys: list[str | None] = []
        self.values: list[str | None] = []

    @property
    def rows(self) -> int:
        return len(self.records)

    def add(self, batch: Batch, lo: int, hi: int) -> None:
        """Rows for records ``[lo, hi)`` of ``batch``."""
        header = batch.header
        kind = _KIND_NAMES.get(header.kind)
        json = self.json
        kinds: Sequence[str] | None
        if kind is None:
            records, kinds = batch.records_and_kinds(json.loads)
        else:
            records, kinds = batch.records(json.loads), None
        # Records with maps keyed by non-strings took the plain decoder: the careful way.
        text = to_json if type(records) is PlainRecords else json.dumps
        if lo or hi != len(records):
            records = records[lo:hi]
            kinds = kinds[lo:hi] if kinds is not None else None
        n = len(records)
        first = batch.first_lsn + lo
        self.segments.extend(repeat(batch.segment, n))
        self.lsns.extend(range(first, first + n))
        self.commits.extend(repeat(header.commit_us, n))
        if kinds is None:
            assert kind is not None
            self.kinds.extend(repeat(kind, n))
        else:
            self.kinds.extend(kinds)
        self.records.extend([text(r) for r in records])
        self._bases(first, n)
        if self.resource:
            self._resource(records, text)

    def _resource(self, records: list[Any], text: Callable[[Any], str]) -> None:
        # The ResourceStore convention, read exactly as ResourceStore replays it.
        ops, keys, values = self.ops, self.keys, self.values
        for r in records:
            op = r.get("op") if isinstance(r, dict) else None
            if op == "put":
                ops.append("put")
                keys.append(text(r.get("key")))
                values.append(text(r.get("value")))
            elif op == "del":
                ops.append("del")
                keys.append(text(r.get("key")))
                values.append(None)
            else:
                ops.append(None)
                keys.append(None)
                values.append(None)

    def _bases(self, first: int, n: int) -> None:
        part = self.part
        base_from = part.base_from
        if base_from is None or first + n - 1 < base_from:
            self.bases.extend(repeat(part.prev_base, n))
        elif first >= base_from:
            self.bases.extend(repeat(part.seq, n))
        else:
            before = base_from - first
            self.bases.extend(repeat(part.prev_base, before))
            self.bases.extend(repeat(part.seq, n - before))

    def flush(self) -> pa.RecordBatch:
        n = self.rows
        cols = [
            pa.repeat(pa.scalar(self.part.seq, pa.int64()), n),
            pa.array(self.segments, pa.int64()),
            pa.array(self.lsns, pa.int64()),
            pa.array(self.commits, TIMESTAMP),
            pa.array(self.kinds, pa.string()),
            pa.array(self.records, pa.string()),
            pa.array(self.bases, pa.int64()),
        ]
        if self.resource:
            cols += [
                pa.array(self.ops, pa.string()),
                pa.array(self.keys, pa.string()),
                pa.array(self.values, pa.string()),
            ]
        self._reset()
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)


def _open(part: LogPartition) -> Destination:
    return open_destination(part.url, **part.storage_options)


def read_records(part: LogPartition) -> Iterator[pa.RecordBatch]:
    """The rows of one partition, as Arrow record batches in LSN order."""
    dest = _open(part)
    try:
        rng = _Range(dest, part)
        cols = _Columns(part)
        from_lsn, to_lsn = part.from_lsn, part.to_lsn
        for batch in rng.batches():
            if batch.is_control:
                continue
            first, n = batch.first_lsn, batch.header.count
            if to_lsn is not None and first > to_lsn:
                break
            lo = 0 if from_lsn is None else max(0, from_lsn - first)
            hi = n if to_lsn is None else min(n, to_lsn - first + 1)
            if lo >= hi:
                continue
            try:
                cols.add(batch, lo, hi)
            except Damage as d:
                rng.corrupt(d.reason, F.segment_name(part.seq, batch.segment), batch.offset, batch.header.size)
                continue
            if cols.rows >= CHUNK_ROWS:
                yield cols.flush()
        if cols.rows:
            yield cols.flush()
        skipped = sum(p.kind == "skipped" for p in rng.problems)
        if skipped:
            log.warning(
                "passed over %d damaged range(s) in log %d at %s; see spark_replay.corrupt_report()",
                skipped, part.seq, part.url,
            )
    finally:
        dest.close()


def read_problems(part: LogPartition) -> Iterator[tuple[Any, ...]]:
    """The damage in one partition (scanned in skip mode), as rows of the corrupt view."""
    dest = _open(part)
    try:
        rng = _Range(dest, part)
        for batch in rng.batches():
            if batch.is_control:
                continue
            try:
                batch.records(_count_only)
            except Damage as d:
                rng.corrupt(d.reason, F.segment_name(part.seq, batch.segment), batch.offset, batch.header.size)
        for p in rng.problems:
            yield (p.log, p.segment, p.segment_name, p.offset, p.length, p.kind, p.reason)
    finally:
        dest.close()


def _count_only(data: bytes) -> Any:
    return plain_loads(data)


def reader_for(view: str) -> Callable[[LogPartition], Iterator[Any]]:
    return read_problems if view == "corrupt" else read_records
