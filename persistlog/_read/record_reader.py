"""``RecordReader``: the record at an LSN of a live destination, read from storage.

A reader that keeps only LSNs in memory (a :class:`persistlog.Queue` keeps one per
message) reads each record back when it needs it. Reads usually ask for LSNs in
increasing order, so the reader keeps a cursor (log, segment, byte offset, LSN of the
batch there) and scans forward from it through :class:`LogScanner`, the one decoder path,
asking storage for small chunks: the cost of a read is the batches between the cursor
and the record, not the log. An LSN behind the cursor, or in another log, is located
first: the newest log, and its newest segment, whose header starts at or before it.

What it keeps: the cursor, the listing of logs it last made, and nothing of any record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from destinations import Destination

from .._errors import CorruptLogError, DestinationError
from .._format import constants as F
from .._format.crypt import Keyring
from .._format.chain import OFFLOAD_BYTES
from .._format.decoder import (
    CheckedBatch,
    Damage,
    check_payload,
    checked_run,
    parse_batch_header,
    parse_segment_header,
    split_records,
)
from .._format.shared_values import ValueTable
from .reader import Batch, LogScanner, list_logs

logger = logging.getLogger("persistlog")

#: What one read of storage asks for at least: a few small batches, not the rest of a
#: segment (a scan's 4 MiB), since a point read usually stops at the first batch.
POINT_READ_CHUNK = 16 * 1024
#: What a read for a record of known size asks for beyond that size: its batch's header,
#: link and framing, and a few small batches before it (a queue's acknowledgements).
SIZED_READ_MARGIN = 2 * 1024

# (log seq, segment number, byte offset of a batch, LSN that batch starts at); at a
# segment's start (offset 0) the LSN the segment starts at, or None where not known.
_Cursor = tuple[int, int, int, int | None]


class RecordNotWritten(LookupError):
    """The LSN is past what storage holds (still in the writer's buffer, or never given)."""


class RecordReader:
    """Reads single records of the log at ``dest`` by LSN (see the module docstring).

    ``loads`` decodes a record (a Codec's). ``written()`` is called once when an LSN is
    past what storage holds, to write the writer's buffer out (``Log.sync``); None when
    every LSN asked for is on storage already (logs read after their writer closed them).
    Not thread-safe: its owner serialises calls.
    """

    __slots__ = (
        "dest", "_loads", "_written", "_chunk", "_cursor", "_logs", "_first_lsns", "_keys", "_values", "_chained",
    )

    def __init__(
        self,
        dest: Destination,
        loads: Callable[[bytes], Any],
        written: Callable[[], None] | None = None,
        read_chunk: int = POINT_READ_CHUNK,
        keys: Keyring | None = None,
    ) -> None:
        self.dest = dest
        self._keys = keys  # an encrypted log's (None: a sealed batch raises KeyUnavailableError)
        # The values a log shares (format version 3) up to where the last read stopped.
        self._values: ValueTable | None = None
        self._loads = loads
        self._written = written
        self._chunk = read_chunk
        self._cursor: _Cursor | None = None
        self._logs: dict[int, list[tuple[int, str]]] = {}
        self._first_lsns: dict[tuple[int, int], int] = {}
        # (log seq, whether its batches carry a link): the batch checks in C need it; known
        # from the log's segment header or a batch of it read here.
        self._chained: tuple[int, bool] | None = None

    def seed(self, seq: int, first_lsn: int) -> None:
        """Start at the beginning of log ``seq``, which starts at ``first_lsn`` (its writer
        just made it): the first read scans from there without listing the destination
        or reading a segment header. Anything not found there is located as usual
        (:meth:`record` lists again before it gives up)."""
        self._cursor = (seq, 0, 0, first_lsn)
        self._logs = {seq: [(0, F.segment_name(seq, 0))]}
        self._first_lsns.clear()

    def forget(self) -> None:
        """Drop the cursor and the listing (the writer rotated: the next read locates)."""
        self._cursor = None
        self._logs = {}
        self._first_lsns = {}

    def record(self, lsn: int, size: int | None = None) -> Any:
        """The record at ``lsn``. :class:`RecordNotWritten` if storage does not hold it
        even after ``written()``; :class:`CorruptLogError` for damage on the way;
        :class:`DestinationError` if it cannot be read. ``size``, the bytes the record
        is known to hold about (a queue's message body), sizes the read from the cursor:
        a 2 KiB body takes a 4 KiB read, not a 16 KiB one (cheaper to copy), and a 1 MiB
        body one read, not two; a wrong size costs a second read, never a wrong record."""
        found = self._read_on(lsn, self._chunk if size is None else size + SIZED_READ_MARGIN)
        if found is not None:
            return found[0]
        for attempt in range(3):
            try:
                found = self._scan_for(lsn)
            except FileNotFoundError:
                found = None  # retention deleted what the cursor pointed at: locate again
                self.forget()
            if found is not None:
                return found[0]
            if attempt == 0:
                self.forget()  # a new segment or log since the listing
            elif self._written is not None:
                self._written()
                self.forget()
            else:
                break
        raise RecordNotWritten(f"{self.dest.url} holds no record at LSN {lsn}")

    # -- reading on from the cursor -----------------------------------------------------

    def _read_on(self, lsn: int, chunk: int) -> tuple[Any] | None:
        """The record at ``lsn`` when it lies in the cursor's segment after the cursor: the
        batches from there decoded one after another from one read (a second for a batch
        longer than it; control batches stepped over). None for anything else (another
        segment or log, the end of what is written, damage): :meth:`_scan_for` sorts that out and
        reports damage where it is."""
        cursor = self._cursor
        if cursor is None or cursor[3] is None or cursor[3] > lsn:
            return None
        seq, segment, offset, first = cursor
        name = F.segment_name(seq, segment)
        base, buf = offset, b""
        if offset == 0:
            # A segment's start (a seeded reader's): its header, checked to be the one
            # the cursor expects, then the batches after it, from the same read.
            buf = self._read(name, 0, chunk)
            try:
                head = parse_segment_header(buf)
            except Damage:
                return None
            if (head.seq, head.segment, head.first_lsn) != (seq, segment, first):
                return None
            self._chained = (seq, head.version >= F.CHAINED_VERSION)
            offset = F.SEGMENT_HEADER_SIZE
        # The batches ahead checked in C in one call (checked_run), and how many were
        # taken; the first one it does not vouch for is checked here, and so is every
        # batch of a log whose chaining is not known yet.
        run: list[CheckedBatch] = []
        taken = 0
        while True:
            lo = offset - base
            if taken == len(run):
                if len(buf) - lo < F.BATCH_HEADER_SIZE:
                    base, buf, lo = offset, self._read(name, offset, chunk), 0
                chained = self._chained
                if chained is not None and chained[0] == seq:
                    window_end = base + len(buf)
                    run, taken = checked_run(buf, base, offset, window_end, window_end, None, chained[1], OFFLOAD_BYTES), 0
            raw: bytes | None = None  # the payload, once checked
            if taken < len(run):
                _, header, raw, _, _ = run[taken]  # checked in C, payload and all
                taken += 1
            else:
                try:
                    header = parse_batch_header(buf[lo:lo + F.BATCH_HEADER_SIZE], offset)
                except Damage:
                    return None
            if header.first_lsn != first:
                return None
            if raw is None:
                self._chained = (seq, header.linked)  # every batch of a log has a link, or none
            if header.kind == F.KIND_CONTROL:
                # It takes no LSN (the log header, a signed checkpoint): stepped over by
                # its size. One in a log that shares values is left to a scan, which
                # keeps the table of values in step.
                if self._values is not None:
                    return None
                offset += header.size
                continue
            values = self._values
            if values is not None and not values.resume(seq, segment, offset):
                values = None  # a batch that shares values is read by a scan, which primes
            if values is not None:
                values.reading(seq, segment, offset)
            if raw is None:
                if len(buf) - lo < header.size:
                    base, buf, lo = offset, self._read(name, offset, max(header.size, chunk)), 0
                    if len(buf) < header.size:
                        return None
                try:
                    raw = check_payload(header, buf[lo + F.BATCH_HEADER_SIZE:lo + header.size], offset, self._keys,
                                        values)
                except Damage:
                    return None
            if values is not None:
                values.read_to(seq, segment, offset + header.size)
            end, after = offset + header.size, first + header.count
            if after <= lsn:
                offset, first = end, after
                self._cursor = (seq, segment, offset, first)
                continue
            try:
                records = split_records(header, raw, offset, self._loads)[0]
            except Damage:
                return None  # the scan reports it, where it is
            self._cursor = (seq, segment, end, after) if lsn == after - 1 else (seq, segment, offset, first)
            return (records[lsn - first],)

    def _read(self, name: str, offset: int, length: int) -> bytes:
        try:
            return self.dest.read(name, offset, length)
        except FileNotFoundError:
            return b""  # retention deleted it: the scan locates the record again
        except OSError as e:
            raise DestinationError(f"cannot read {self.dest.url}/{name}: {e}") from e

    # -- scanning ----------------------------------------------------------------------

    def _scan_for(self, lsn: int) -> tuple[Any] | None:
        cursor = self._cursor
        if cursor is None or cursor[3] is None or cursor[3] > lsn:
            cursor = self._locate(lsn)
            if cursor is None:
                return None
        while True:
            seq, segment, offset, first = cursor
            segments = self._logs.get(seq) or self._listing().get(seq)
            if not segments:
                return None
            scanner = LogScanner(
                self.dest, seq, segments, start=(segment, offset, first if offset else None), tail_ok=True,
                read_chunk=self._chunk, keys=self._keys, values=self._values,
            )
            for batch in scanner:
                self._values = scanner.values
                if batch.is_control:
                    continue
                count = batch.header.count
                if batch.first_lsn + count <= lsn:
                    cursor = (seq, batch.segment, batch.end, batch.first_lsn + count)
                    continue
                if batch.first_lsn > lsn:
                    raise self._corrupt(f"no record at LSN {lsn}: the batch after it starts at {batch.first_lsn}", batch)
                after = batch.first_lsn + count
                self._cursor = (
                    (seq, batch.segment, batch.end, after) if lsn == after - 1 else (seq, batch.segment, batch.offset, batch.first_lsn)
                )
                try:
                    return (batch.records(self._loads)[lsn - batch.first_lsn],)
                except Damage as d:  # checksums held, the records do not decode
                    raise self._corrupt(d.reason, batch) from None
            self._cursor = cursor
            st = scanner.state
            if not (st.sealed or st.fence is not None):
                return None
            later = [s for s in self._listing() if s > seq]
            if not later:
                return None
            cursor = (later[0], 0, 0, None)

    def _corrupt(self, reason: str, batch: Batch) -> CorruptLogError:
        return CorruptLogError(
            reason, destination=self.dest.url, log=batch.log,
            segment=F.segment_name(batch.log, batch.segment), offset=batch.offset,
        )

    def _listing(self) -> dict[int, list[tuple[int, str]]]:
        self._logs = list_logs(self.dest)
        return self._logs

    def _first_lsn(self, seq: int, number: int, name: str) -> int:
        """The LSN segment ``number`` of log ``seq`` starts at (its header, read once)."""
        known = self._first_lsns.get((seq, number))
        if known is not None:
            return known
        try:
            head = parse_segment_header(self.dest.read(name, 0, F.SEGMENT_HEADER_SIZE))
        except Damage as d:
            raise CorruptLogError(d.reason, destination=self.dest.url, log=seq, segment=name, offset=d.offset) from None
        except FileNotFoundError:
            raise
        except OSError as e:
            raise DestinationError(f"cannot read {self.dest.url}/{name}: {e}") from e
        self._first_lsns[(seq, number)] = head.first_lsn
        return head.first_lsn

    def _locate(self, lsn: int) -> _Cursor | None:
        """The start of the newest segment, of the newest log, that starts at or before
        ``lsn`` (None if none does)."""
        logs = self._listing()
        for seq in sorted(logs, reverse=True):
            segments = logs[seq]
            if not segments or self._first_lsn(seq, *segments[0]) > lsn:
                continue
            for number, name in reversed(segments):
                if self._first_lsn(seq, number, name) <= lsn:
                    return (seq, number, 0, None)
        return None
