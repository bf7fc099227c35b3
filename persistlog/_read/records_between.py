"""Reading the records of a destination's logs between two positions: ``persistlog.read``.

The start is found by :mod:`persistlog._read.seek` (headers only); from there the one reader,
:class:`~persistlog._read.reader.LogScanner`, reads batch by batch with every check a restore
makes, across segments and logs, and stops at the bound. Memory is one batch. Unlike a
restore, it starts anywhere: what it yields is the log's history from there, not a state
(a log's snapshot records, written by a rotation, come in LSN order like any other).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from destinations import Destination, open_destination

from .._errors import CodecError, CorruptLogError
from .._format.codec import Codec
from .._format.constants import segment_name
from .._format.crypt import Keyring, keyring
from .._format.decoder import Damage
from .cursor import Cursor
from .reader import LogScanner, declares_gap
from .resume import records_to_skip
from .seek import LogView, Place, seek, utc_micros

#: A position: an LSN, an aware datetime (a commit time), a :class:`Cursor`, or None
#: (the oldest retained record as a start, the end as a stop).
Position = int | datetime | Cursor | None


@dataclass(frozen=True, slots=True)
class LoggedRecord:
    """One record :func:`read` yields: the record, where it is and when it was committed.

    ``kind`` is ``"update"`` or ``"snapshot"`` (written by a rotation's enumeration);
    ``commit_time`` is its batch's commit time (seconds since the Unix epoch, the writer's
    wall clock); ``log`` the seq of the log holding it. :attr:`cursor` resumes right after
    it (for :func:`persistlog.follow` or another ``read``).
    """

    lsn: int
    record: Any
    kind: str
    commit_time: float
    log: int
    segment: int
    offset: int
    batch_end: int
    batch_last_lsn: int

    @property
    def cursor(self) -> Cursor:
        """The cursor right after this record."""
        if self.lsn >= self.batch_last_lsn:
            return Cursor(self.log, self.segment, self.batch_end, self.lsn + 1)
        return Cursor(self.log, self.segment, self.offset, self.lsn + 1)


def _stop_lsn(stop: Position) -> int | None:
    """The LSN a stop names (None: no stop, or a time, compared batch by batch)."""
    if isinstance(stop, Cursor):
        return stop.next_lsn
    if isinstance(stop, int):
        return stop
    return None


def _start_place(dest: Destination, start: Position) -> tuple[LogView, Place]:
    if not isinstance(start, Cursor):
        return seek(dest, start)
    view = LogView(dest)
    if not any(number == start.segment for number, _name in view.logs.get(start.log, [])):
        raise view.not_held(f"cursor {start} names log {start.log} segment {start.segment}, which is not there")
    try:
        skip = records_to_skip(dest, start.log, start.segment, start.offset, start.next_lsn)
    except FileNotFoundError:
        raise view.not_held(f"cursor {start} names a segment that is not there") from None
    if start.offset == 0 or skip == 0:
        return view, Place(start.log, start.segment, start.offset, start.next_lsn, start.next_lsn)
    return view, Place(start.log, start.segment, start.offset, start.next_lsn, start.next_lsn - skip)


def read(
    url: str | os.PathLike[str],
    start: Position = None,
    stop: Position = None,
    *,
    storage_options: dict[str, Any] | None = None,
    codec: Codec | None = None,
    key_provider: Callable[[str], Any] | Keyring | None = None,
) -> Iterator[LoggedRecord]:
    """The records at ``url`` from ``start`` up to (not including) ``stop``, in LSN order.

    A position is an LSN (``int``), a commit time (a timezone-aware ``datetime``: the
    first batch committed at or after it), a :class:`Cursor` (one a follower or a record
    handed out, or :meth:`Cursor.at_lsn` ...), or None: the oldest record retained as a
    start, the end of what is written as a stop. The start is found from segment and
    batch headers without reading the records before it; then batches are read and
    checked one by one, across segments and logs (memory: one batch, and the values a log
    of format version 3 shares, at most 32 MiB; a start inside such a log reads the log
    from its first segment once, when a batch read from there shares values). A start the logs
    do not hold (before the oldest record retention left, past the end) raises
    :class:`PositionError` (a ``ValueError``) naming what is there; a stop past the end
    reads to the end. Damage raises :class:`CorruptLogError`, a log that follows a gap
    its writer declared ends the read.

    Records come as :class:`LoggedRecord` (LSN, record, kind, commit time, cursor). The
    generator reads nothing until it is iterated, and holds the destination open until it
    is exhausted or closed. ``key_provider`` is the key provider of an encrypted log, as for
    :func:`persistlog.restore`.
    """
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options must be a dict, not {type(storage_options).__name__}")
    for position, name in ((start, "start"), (stop, "stop")):
        if isinstance(position, datetime):
            utc_micros(position)
        elif not (position is None or isinstance(position, Cursor)
                  or (isinstance(position, int) and not isinstance(position, bool))):
            raise TypeError(f"{name} must be an LSN, a datetime, a Cursor or None, not {type(position).__name__}")
    return _records(url, start, stop, storage_options, codec or Codec(), keyring(key_provider))


def _records(url: str | os.PathLike[str], start: Position, stop: Position,
             storage_options: dict[str, Any] | None, codec: Codec, keys: Keyring | None) -> Iterator[LoggedRecord]:
    dest = open_destination(url, **(storage_options or {}))
    try:
        view, place = _start_place(dest, start)
        stop_lsn = _stop_lsn(stop)
        stop_us = utc_micros(stop) if isinstance(stop, datetime) else None
        if stop_lsn is not None and stop_lsn < place.lsn:
            raise ValueError(f"stop (LSN {stop_lsn}) is before start (LSN {place.lsn})")
        yield from _scan(dest, view, place, stop_lsn, stop_us, codec, keys)
    finally:
        dest.close()


def _scan(dest: Destination, view: LogView, place: Place, stop_lsn: int | None, stop_us: int | None,
          codec: Codec, keys: Keyring | None = None) -> Iterator[LoggedRecord]:
    loads = codec.loads
    logs = view.logs
    seqs = [s for s in view.seqs if s >= place.log]
    expect: int | None = None
    link: bytes | None = None
    for i, seq in enumerate(seqs):
        if i and seq != seqs[i - 1] + 1:
            if declares_gap(dest, logs[seq]):
                return
            raise CorruptLogError(f"log {seqs[i - 1] + 1} is missing between logs {seqs[i - 1]} and {seq}",
                                  destination=dest.url, log=seqs[i - 1] + 1)
        scanner = LogScanner(
            dest, seq, logs[seq], expect_first_lsn=expect, expect_link=link,
            start=place.scan_start if i == 0 else None,
            # The newest log may be written as we read: a batch cut short there is not yet.
            tail_ok=dest.appendable and i == len(seqs) - 1,
            keys=keys,
        )
        for batch in scanner:
            if batch.is_control:
                continue
            header = batch.header
            if (stop_lsn is not None and header.first_lsn >= stop_lsn) or (
                stop_us is not None and header.commit_us >= stop_us
            ):
                return
            last = header.first_lsn + header.count - 1
            if last < place.lsn:
                continue
            try:
                for lsn, kind, record in batch.numbered_records(loads):
                    if lsn < place.lsn:
                        continue
                    if stop_lsn is not None and lsn >= stop_lsn:
                        return
                    yield LoggedRecord(lsn, record, kind, header.commit_us / 1e6, seq,
                                       batch.segment, batch.offset, batch.end, last)
            except CodecError as e:
                raise e.locate(f"{dest.url} log {seq} {segment_name(seq, batch.segment)}")
            except Damage as d:
                raise CorruptLogError(d.reason, destination=dest.url, log=seq,
                                      segment=segment_name(seq, batch.segment), offset=batch.offset) from None
        st = scanner.state
        if st.after_gap:
            return
        expect = st.next_lsn
        link = st.chain_head if st.chained else None


__all__ = ["LoggedRecord", "Position", "read"]
