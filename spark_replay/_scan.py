"""Reading one partition on an executor: bytes to Arrow record batches.

Everything goes through persistlog's one reader (:class:`LogScanner`), so damage is
classified exactly as restore classifies it: a torn tail of an unsealed log is dropped;
anything else raises :class:`CorruptLogError` (strict) or is passed over and listed (skip).
Records become JSON text by the rule of ``docs/JSON.md`` (:func:`persistlog.reading.to_json`).
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NoReturn

import pyarrow as pa
import pyarrow.compute as pc

from destinations import Destination, open_destination

from persistlog import CorruptLogError, DestinationError
from persistlog.reading import (
    CONTROL_CHECKPOINT,
    CONTROL_SEAL,
    HEADER_AFTER_GAP,
    KIND_SNAPSHOT,
    KIND_UPDATE,
    OPAQUE,
    SEAL_CHAIN,
    SEGMENT_HEADER_SIZE,
    Batch,
    Damage,
    JsonRecords,
    Keyring,
    LogScanner,
    PlainRecords,
    gc_pause,
    key_text,
    parse_segment_name,
    plain_loads,
    resource_texts_from_cbor,
    segment_name,
    texts_from_cbor,
    to_json,
)
from ._keys import keys_named
from ._plan import LogPartition, LogToPlan, SetPartition, deleted_under, deleted_while_read, replay_base
from ._schema import TIMESTAMP, arrow_schema

logger = logging.getLogger("spark_replay")

# Rows per Arrow batch handed to Spark: large enough to amortise the per-batch cost,
# small enough to keep a task's memory flat.
CHUNK_ROWS = 16384

_KIND_NAMES = {KIND_UPDATE: "update", KIND_SNAPSHOT: "snapshot"}


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

    def __init__(
        self, dest: Destination, part: LogPartition, keys: Keyring | None = None, listed: LogToPlan | None = None
    ) -> None:
        """``keys``: those of the scan (default: the provider the partition names);
        ``listed``: the driver's listing of the log, its segments' names and sizes (the
        scan then asks the destination for neither)."""
        self.dest = dest
        self.part = part
        self.problems: list[Problem] = []
        self.segments = part.segments() if listed is None else listed.listing[part.seq]
        self.scanner = LogScanner(
            dest, part.seq, self.segments,
            recovery=part.recovery, start=part.start, tail_ok=part.tail_ok, expect_link=part.first_link,
            keys=keys if keys is not None else keys_named(part.key_provider),
            sizes=None if listed is None else listed.sizes,
        )

    def contains(self, segment: int, offset: int) -> bool:
        start = self.part.start[:2]
        end = self.part.end
        return start <= (segment, offset) and (end is None or (segment, offset) < end)

    def corrupt(self, reason: str, segment: str | None = None, offset: int | None = None, length: int | None = None) -> None:
        part = self.part
        if part.recovery == "strict":
            self._fail(CorruptLogError(reason, destination=part.url, log=part.seq, segment=segment, offset=offset))
        parsed = parse_segment_name(segment) if segment else None
        number = parsed[1] if parsed else None
        self.problems.append(Problem(part.seq, number, segment, offset, length, "skipped", reason))

    def batches(self) -> Generator[Batch, None, None]:
        """The batches inside the range, then the end-of-range checks."""
        part = self.part
        end = part.end
        whole = False
        try:
            for batch in self.scanner:
                if end is not None and (batch.segment, batch.offset) >= end:
                    break
                yield batch
            else:
                whole = True
        except FileNotFoundError as e:
            raise deleted_while_read(part.url, f"a segment of log {part.seq} vanished during the read: {e}") from e
        except CorruptLogError as e:
            self._fail(e)
        if whole:
            self._at_end_of_log()
            self._at_end_of_walk()
        self._collect_scanner_problems()
        if part.start[:2] == (0, 0) and self.scanner.state.header is None:
            self.corrupt("log has no header record", segment_name(part.seq, 0), 0)
        if any(p.kind == "skipped" for p in self.problems):
            # Passed over in skip mode: still no damage to report if retention made it.
            found = next(p.reason for p in self.problems if p.kind == "skipped")
            deleted = self._deleted(found)
            if deleted is not None:
                raise deleted

    def _deleted(self, found: str) -> DestinationError | None:
        """The error that says retention was deleting this range's log under the read,
        which is what made it look damaged (``found``: how), if it was
        (:func:`spark_replay._plan.deleted_under`); None when the damage is real or the
        partition does not say what CURRENT was when its log was listed."""
        part = self.part
        if part.current is None:
            return None
        how = deleted_under(self.dest, {part.seq: self.segments}, part.current, part.seq)
        if how is None:
            return None
        return deleted_while_read(part.url, f"{how}, and the read found: {found}")

    def _fail(self, e: CorruptLogError) -> NoReturn:
        """Raise ``e``, or the error that says retention made it (:meth:`_deleted`)."""
        deleted = self._deleted(str(e))
        if deleted is None:
            raise e
        raise deleted from e

    def _at_end_of_log(self) -> None:
        """The checks between this log's end and the next log's start: its first LSN, and
        (chained logs) its first link against this log's chain head, as restore checks
        them; the range before never reads the next log itself."""
        st = self.scanner.state
        part = self.part
        if part.next_log_lsn is not None and st.next_lsn is not None and st.next_lsn != part.next_log_lsn:
            self.corrupt(
                f"log {part.seq} ends before LSN {st.next_lsn} but log {part.seq + 1} "
                f"starts at LSN {part.next_log_lsn}",
                segment_name(part.seq + 1, 0),
                0,
            )
            return
        link = part.next_log_link
        if link is not None and st.chained and st.chain_head is not None and not st.skipped and link != st.chain_head:
            self.corrupt(
                f"hash chain broken between logs {part.seq} and {part.seq + 1}: log {part.seq + 1} "
                f"links to chain head {link.hex()[:16]}, but log {part.seq} ends at {st.chain_head.hex()[:16]} "
                f"(a batch was changed, removed or inserted at the end of log {part.seq}, or a log replaced)",
                segment_name(part.seq + 1, 0),
                SEGMENT_HEADER_SIZE,
            )

    def _at_end_of_walk(self) -> None:
        """A stream's micro-batch read to the end of the data: the chain head there is the
        one the driver's walk found, which the next micro-batch's first link is checked
        against (a batch after the range, had there been one, was checked by its link)."""
        part, st = self.part, self.scanner.state
        walked = part.end_head
        if walked is None or part.end is None or not st.chained or st.chain_head is None or walked == st.chain_head:
            return
        self.corrupt(
            f"hash chain broken: the micro-batch's range of log {part.seq} ends at chain head "
            f"{st.chain_head.hex()[:16]}, but the driver's walk found {walked.hex()[:16]} there (a batch "
            "before it was changed, removed or inserted after the walk)",
            segment_name(part.seq, part.end[0]),
            part.end[1],
        )

    def _collect_scanner_problems(self) -> None:
        st = self.scanner.state
        for s in st.skipped:
            parsed = parse_segment_name(s.segment)
            number = parsed[1] if parsed else None
            if number is None or self.contains(number, s.offset):
                self.problems.append(Problem(s.log, number, s.segment, s.offset, s.length, "skipped", s.reason))
        if st.torn is not None:
            t = st.torn
            parsed = parse_segment_name(t.segment)
            number = parsed[1] if parsed else None
            if number is None or self.contains(number, t.offset):
                self.problems.append(Problem(t.log, number, t.segment, t.offset, t.length, "torn", t.reason))
        st.skipped.clear()


class _Column:
    """One column of the rows gathered so far.

    A batch's rows share most of their values (its log, segment, commit time, kind): such
    values are kept as runs and decoded by Arrow in one call per Arrow batch, since an
    Arrow call per batch costs more than the batch's rows when a set's logs hold a few
    hundred records each. Other values go through a Python list; arrays built elsewhere
    (the C path's text) are kept as chunks.
    """

    def __init__(self, type_: pa.DataType) -> None:
        self.type = type_
        self.chunks: list[pa.Array] = []
        self.pending: list[Any] = []
        # Runs of one value: run i holds run_values[i] up to row run_ends[i] (exclusive).
        self.run_values: list[Any] = []
        self.run_ends: list[int] = []
        # Values stored as 64-bit integers (int64, timestamps in microseconds).
        self.words = pa.types.is_int64(type_) or pa.types.is_timestamp(type_)

    def repeat(self, value: Any, n: int) -> None:
        if n <= 0:
            return
        if self.pending:
            self._cut()
        if self.run_values and self.run_values[-1] == value:
            self.run_ends[-1] += n
        else:
            self.run_values.append(value)
            self.run_ends.append((self.run_ends[-1] if self.run_ends else 0) + n)

    def extend(self, values: Iterable[Any]) -> None:
        if self.run_values:
            self._cut()
        self.pending.extend(values)

    def chunk(self, array: pa.Array) -> None:
        self._cut()
        self.chunks.append(array)

    def _cut(self) -> None:
        if self.pending:
            self.chunks.append(pa.array(self.pending, self.type))
            self.pending = []
        if self.run_values:
            self.chunks.append(self._decoded())
            self.run_values, self.run_ends = [], []

    def _decoded(self) -> pa.Array:
        values, ends = self.run_values, self.run_ends
        if self.words and None not in values:
            # 64-bit values: repeated by the array module, whose repetition is a memory
            # copy, where Arrow's own calls cost ten times more for one run.
            words = array("q")
            start = 0
            for value, end in zip(values, ends):
                words.extend(array("q", (value,)) * (end - start))
                start = end
            return pa.Array.from_buffers(self.type, ends[-1], [None, pa.py_buffer(words)])
        if len(values) == 1 and values[0] is None:
            return pa.nulls(ends[0], self.type)
        runs = pa.RunEndEncodedArray.from_arrays(pa.array(ends, pa.int64()), pa.array(values, self.type))
        return pc.run_end_decode(runs)

    def finish(self) -> pa.Array:
        self._cut()
        chunks, self.chunks = self.chunks, []
        if len(chunks) == 1:
            return chunks[0]
        return pa.concat_arrays(chunks) if chunks else pa.array([], self.type)


class _CountColumn(_Column):
    """A column of runs that count up by one (LSNs): a run is kept as its first value
    less the row it starts at, so that runs that continue each other merge."""

    def count_up(self, first: int, n: int) -> None:
        self.repeat(first - (self.run_ends[-1] if self.run_ends else 0), n)

    def _decoded(self) -> pa.Array:
        rows = self.run_ends[-1]
        return pc.add(super()._decoded(), _row_numbers(rows))


#: 0, 1, 2...: the row numbers a count column adds to its runs, sliced (grown when a
#: batch is longer), one array per process.
_row_numbers_made = pa.array([], pa.int64())


def _row_numbers(rows: int) -> pa.Array:
    """0, 1, ..., ``rows - 1``, as a slice of the process's array of row numbers."""
    global _row_numbers_made
    if len(_row_numbers_made) < rows:
        n = max(rows, 2 * len(_row_numbers_made), CHUNK_ROWS)
        _row_numbers_made = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(array("q", range(n)))])
    return _row_numbers_made.slice(0, rows)


def _strings(n: int, text: bytes, offsets: bytes, valid: bytes | None = None) -> pa.Array:
    """An Arrow string array over the C path's buffers, without a copy."""
    return pa.StringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(text), None if valid is None else pa.py_buffer(valid)
    )


class _Columns:
    """The rows gathered so far, turned into an Arrow batch on demand.

    The text columns (``record``, and ``op``/``key``/``value``) come straight from the CBOR
    bytes when the C accelerator handles the batch (no Python value is ever built), else
    from the decoded records.
    """

    def __init__(self, part: LogPartition) -> None:
        self.part = part
        self.resource = part.convention == "resource"
        self.log_set = part.log_key is not None
        self.schema = arrow_schema("records", part.convention, self.log_set)
        self.json = JsonRecords()
        self.rows = 0
        self.log_keys = _Column(pa.string())
        self.seqs = _Column(pa.int64())
        self.segments = _Column(pa.int64())
        self.lsns = _CountColumn(pa.int64())
        self.commits = _Column(TIMESTAMP)
        self.kinds = _Column(pa.string())
        self.records = _Column(pa.string())
        self.bases = _Column(pa.int64())
        self.ops = _Column(pa.string())
        self.keys = _Column(pa.string())
        self.key_jsons = _Column(pa.string())
        self.values = _Column(pa.string())

    def begin(self, part: LogPartition) -> None:
        """The rows added next come from ``part`` (a task of a log set reads several logs
        into one builder: one Arrow batch for many small logs)."""
        self.part = part

    def add(self, batch: Batch, lo: int, hi: int) -> None:
        """Rows for records ``[lo, hi)`` of ``batch``."""
        header = batch.header
        kind = _KIND_NAMES.get(header.kind)
        if kind is not None and self._from_bytes(batch, lo, hi):
            self._common(batch, lo, hi - lo, kind, None)
            return
        json = self.json
        # JsonRecords.loads refuses maps keyed by other than strings: its own decoding only.
        slices = batch.record_slices(json.loads, plain=False)
        kinds = slices.kinds() if kind is None else None
        for first, records in slices:
            a, b = max(lo, first), min(hi, first + len(records))
            if a >= b:
                continue
            # Records with maps keyed by non-strings took the plain decoder: the careful way.
            text = to_json if type(records) is PlainRecords else json.dumps
            if a != first or b != first + len(records):
                records = records[a - first : b - first]
            self.records.extend([text(r) for r in records])
            self._common(batch, a, len(records), kind, kinds[a:b] if kinds is not None else None)
            if self.resource:
                self._resource(records, text)

    def _from_bytes(self, batch: Batch, lo: int, hi: int) -> bool:
        """The text columns straight from the batch's bytes, if the C path takes it."""
        n = batch.header.count
        columns: list[pa.Array]
        if self.resource:
            got = resource_texts_from_cbor(batch.raw, n)
            if got is None:
                return False
            text, offsets, *rest = got
            columns = [_strings(n, text, offsets)] + [_strings(n, *c) for c in rest]
        else:
            plain = texts_from_cbor(batch.raw, n)
            if plain is None:
                return False
            columns = [_strings(n, *plain)]
        if lo or hi != n:
            columns = [c.slice(lo, hi - lo) for c in columns]
        for target, column in zip((self.records, self.ops, self.keys, self.key_jsons, self.values), columns):
            target.chunk(column)
        return True

    def _common(self, batch: Batch, lo: int, n: int, kind: str | None, kinds: Sequence[str] | None) -> None:
        first = batch.first_lsn + lo
        self.rows += n
        part = self.part
        if self.log_set:
            self.log_keys.repeat(part.log_key, n)
        self.seqs.repeat(part.seq, n)
        self.segments.repeat(batch.segment, n)
        self.lsns.count_up(first, n)
        self.commits.repeat(batch.header.commit_us, n)
        if kinds is None:
            self.kinds.repeat(kind, n)
        else:
            self.kinds.extend(kinds)
        base_from = part.base_from
        if base_from is None or first + n - 1 < base_from:
            self.bases.repeat(part.prev_base, n)
        elif first >= base_from:
            self.bases.repeat(part.seq, n)
        else:
            before = base_from - first
            self.bases.repeat(part.prev_base, before)
            self.bases.repeat(part.seq, n - before)

    def _resource(self, records: list[Any], text: Callable[[Any], str]) -> None:
        # The ResourceStore convention, read exactly as ResourceStore replays it.
        ops, keys, key_jsons = self.ops.pending, self.keys.pending, self.key_jsons.pending
        values = self.values.pending
        for r in records:
            op = r.get("op") if isinstance(r, dict) else None
            if op == "put" or op == "del":
                key = r.get("key")
                key_json = text(key)
                ops.append(op)
                keys.append(key_text(key, key_json))
                key_jsons.append(key_json)
                values.append(text(r.get("value")) if op == "put" else None)
            else:
                ops.append(None)
                keys.append(None)
                key_jsons.append(None)
                values.append(None)

    def flush(self) -> pa.RecordBatch:
        cols = [self.log_keys.finish()] if self.log_set else []
        cols += [
            self.seqs.finish(),
            self.segments.finish(),
            self.lsns.finish(),
            self.commits.finish(),
            self.kinds.finish(),
            self.records.finish(),
            self.bases.finish(),
        ]
        if self.resource:
            cols += [self.ops.finish(), self.keys.finish(), self.key_jsons.finish(), self.values.finish()]
        self.rows = 0
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)


def _open(part: LogPartition) -> Destination:
    return open_destination(part.url, **part.storage_options)


def read_records(part: LogPartition) -> Iterator[pa.RecordBatch]:
    """The rows of one partition, as Arrow record batches in LSN order."""
    cols = _Columns(part)
    yield from _records_into(part, cols)
    if cols.rows:
        yield cols.flush()


def _records_into(part: LogPartition, cols: _Columns) -> Iterator[pa.RecordBatch]:
    """The rows of ``part`` added to ``cols``; a batch whenever ``CHUNK_ROWS`` are there
    (what is left stays in ``cols``)."""
    dest = _open(part)
    try:
        rng = _Range(dest, part)
        yield from _rows_into(rng, rng.batches(), cols)
    finally:
        dest.close()


def _rows_into(rng: _Range, batches: Iterable[Batch], cols: _Columns) -> Iterator[pa.RecordBatch]:
    """The rows of ``batches`` (of ``rng``) added to ``cols``, as :func:`_records_into`."""
    part = rng.part
    cols.begin(part)
    from_lsn, to_lsn = part.from_lsn, part.to_lsn
    for batch in batches:
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
            rng.corrupt(d.reason, segment_name(part.seq, batch.segment), batch.offset, batch.header.size)
            continue
        if cols.rows >= CHUNK_ROWS:
            yield cols.flush()
    skipped = sum(p.kind == "skipped" for p in rng.problems)
    if skipped:
        logger.warning(
            "passed over %d damaged range(s) in log %d at %s; see spark_replay.corrupt_report()",
            skipped, part.seq, part.url,
        )


def _whole_log_into(unit: LogToPlan, part: LogPartition, cols: _Columns) -> Iterator[pa.RecordBatch]:
    """The rows of a small log of a set (``part``: all of it, see :meth:`LogToPlan.whole`),
    scanned once: its batches are held until the scan has checked the whole log and found
    its first LSN and snapshot-complete marker, which say from where its rows can start a
    replay. A log whose header says it follows a gap is planned as the driver plans one."""
    dest = _open(part)
    try:
        rng = _Range(dest, part, listed=unit)
        held: list[Batch] = []
        scan = rng.batches()
        for batch in scan:
            header = rng.scanner.state.header
            if not held and header is not None and header.get(HEADER_AFTER_GAP) is True:
                scan.close()
                break
            held.append(batch)
        else:
            st = rng.scanner.state
            assert st.first_lsn is not None  # a strict scan has raised otherwise
            part.base_from = replay_base(st.first_lsn, st.complete_lsn)  # the task's own copy
            yield from _rows_into(rng, held, cols)
            return
    finally:
        dest.close()
    for p in unit.partitions():
        yield from _records_into(p, cols)


def read_problems(part: LogPartition) -> Iterator[tuple[Any, ...]]:
    """The damage in one partition (scanned in skip mode), as rows of the corrupt view."""
    dest = _open(part)
    try:
        rng = _Range(dest, part)
        for batch in rng.batches():
            if batch.is_control:
                continue
            try:
                for _first, _records in batch.record_slices(_count_only):
                    pass
            except Damage as d:
                rng.corrupt(d.reason, segment_name(part.seq, batch.segment), batch.offset, batch.header.size)
        key = () if part.log_key is None else (part.log_key,)
        for p in rng.problems:
            yield (*key, p.log, p.segment, p.segment_name, p.offset, p.length, p.kind, p.reason)
    finally:
        dest.close()


def read_heads(part: LogPartition) -> Iterator[tuple[Any, ...]]:
    """The signed chain heads in one partition, as rows of the heads view: every signed
    checkpoint and seal, with the log, LSN and chain head it signs and its key's id. The
    range is checked as any read checks it (checksums, links) but payloads stay shut:
    no key is needed. Signatures are not checked here (``persistlog verify
    --public-key`` does, with the public key)."""
    dest = _open(part)
    try:
        rng = _Range(dest, part, keys=OPAQUE)
        key = () if part.log_key is None else (part.log_key,)
        for batch in rng.batches():
            for c in batch.controls or ():
                if "sig" not in c:
                    continue
                if c["t"] == CONTROL_CHECKPOINT:
                    lsn, head = c.get("lsn"), c.get("head")
                elif c["t"] == CONTROL_SEAL:
                    lsn, head = c.get("next_lsn"), c.get(SEAL_CHAIN)
                else:
                    continue
                if not isinstance(lsn, int) or not isinstance(head, bytes) or not isinstance(c.get("key"), str):
                    rng.corrupt(f"{c['t']} record without its LSN, head or key id",
                                segment_name(part.seq, batch.segment), batch.offset, batch.header.size)
                    continue
                yield (*key, part.seq, batch.segment, batch.offset, c["t"], lsn, head.hex(), c["key"])
    finally:
        dest.close()


def _count_only(data: bytes) -> Any:
    return plain_loads(data)


def reader_for(view: str) -> Callable[[LogPartition], Iterator[Any]]:
    if view == "heads":
        return read_heads
    return read_problems if view == "corrupt" else read_records


def read_set(part: SetPartition, view: str) -> Iterator[Any]:
    """The rows of a log set's task: each of its logs' ranges in turn, gathered into Arrow
    batches of up to ``CHUNK_ROWS`` rows whichever logs they come from."""
    # Many small logs make many small objects: the cyclic GC is paused meanwhile, as
    # during a replay.
    with gc_pause.during_replay():
        if view != "records":
            for p in part.ranges():
                yield from reader_for(view)(p)
            return
        cols: _Columns | None = None
        for unit in part.units:
            whole = unit.whole() if isinstance(unit, LogToPlan) else None
            if whole is not None:
                assert isinstance(unit, LogToPlan)
                if cols is None:
                    cols = _Columns(whole)
                yield from _whole_log_into(unit, whole, cols)
                continue
            for p in [unit] if isinstance(unit, LogPartition) else unit.partitions():
                if cols is None:
                    cols = _Columns(p)
                yield from _records_into(p, cols)
        if cols is not None and cols.rows:
            yield cols.flush()
