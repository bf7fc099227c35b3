"""persistlog dump URL: every record of every log, oldest first.

Each record is printed with its LSN, log, segment, byte offset of its batch, kind
(snapshot, update; control with --control) and commit time, in persistlog's lossless
JSON form. --from-lsn/--to-lsn and --from-time/--to-time bound what is printed (both ends
inclusive; a time is an ISO 8601 date and time, UTC unless it names a zone, compared with
the commit time of each batch); the start is found from segment and batch headers. Damaged batches are passed over and reported on stderr; exit status 1 if any
corruption was met, 0 otherwise (a torn tail is only noted).
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import Any

from destinations import Destination

from .. import Codec, CorruptLogError, PositionError
from ..reading import Damage, LogScanner, UsageError, list_logs, seek, utc_micros
from ._console import EXIT_DAMAGED, EXIT_OK, error
from ._options import add_start_options, check_start, iso_time, key_provider, open_log
from ._records import RecordWriter

EXAMPLES = """\
examples:
  persistlog dump /var/lib/app/state | less
  persistlog dump /var/lib/app/state --log 12 --json > log12.jsonl
  persistlog dump s3://bucket/app --from-lsn 1500000 --json | jq 'select(.record.key == "user:1")'
  persistlog dump /var/lib/app/state --from-time 2026-11-26T09:00 --to-time 2026-11-26T10:00
"""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "dump",
        parents=[common],
        help="print records (JSON lines with --json)",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--log", type=int, metavar="SEQ", help="only this log")
    add_start_options(p)
    p.add_argument("--to-lsn", type=int, default=None, metavar="N", help="only records with LSN <= N")
    p.add_argument("--to-time", type=iso_time, default=None, metavar="TIME",
                   help="only records committed at or before TIME")
    p.add_argument("--control", action="store_true", help="also print control records (log header, complete, seal)")
    p.set_defaults(run=run)


def check_bounds(args: argparse.Namespace) -> None:
    """Refuse bounds that contradict each other, before anything is read."""
    check_start(args)
    if args.to_lsn is not None and args.to_lsn < 0:
        raise UsageError("--to-lsn must be >= 0")
    if args.to_lsn is not None and args.to_time is not None:
        raise UsageError("give --to-lsn or --to-time, not both")
    if args.from_lsn is not None and args.to_lsn is not None and args.to_lsn < args.from_lsn:
        raise UsageError(f"--to-lsn {args.to_lsn} is before --from-lsn {args.from_lsn}")
    if args.from_time is not None and args.to_time is not None and args.to_time < args.from_time:
        raise UsageError(f"--to-time {args.to_time.isoformat()} is before --from-time {args.from_time.isoformat()}")


def run(args: argparse.Namespace) -> int:
    check_bounds(args)
    dest = open_log(args)
    try:
        return dump(dest, args)
    finally:
        dest.close()


def _lsn_at(dest: Destination, when: datetime) -> int:
    """The LSN of the first batch committed at or after ``when`` (0: from the oldest
    record, when ``when`` is before it; damage found on the way is reported by the scan)."""
    try:
        return seek(dest, when)[1].lsn
    except PositionError as e:
        error(f"note: {e}; printing from the oldest record")
    except CorruptLogError:
        pass
    return 0


def _first_lsn(dest: Destination, seq: int, segment: tuple[int, str]) -> int | None:
    """The first LSN a segment's header names (None if unreadable): reads one header."""
    scanner = LogScanner(dest, seq, [segment], recovery="skip", start=(segment[0], 0, None))
    for _batch in scanner:
        break
    return scanner.state.first_lsn


def _start(
    dest: Destination, logs: dict[int, list[tuple[int, str]]], seqs: list[int], from_lsn: int
) -> tuple[int, int]:
    """``(index into seqs, index into that log's segments)`` to start reading at so that
    nothing at or after ``from_lsn`` is missed: the newest segment that starts at or before
    it, found from segment headers alone."""
    if from_lsn <= 1:
        return 0, 0
    start = 0
    for i in range(len(seqs) - 1, -1, -1):
        first = _first_lsn(dest, seqs[i], logs[seqs[i]][0])
        if first is not None and first <= from_lsn:
            start = i
            break
    segments = logs[seqs[start]]
    lo, hi = 0, len(segments) - 1
    while lo < hi:  # the last segment whose first LSN <= from_lsn
        mid = (lo + hi + 1) // 2
        first = _first_lsn(dest, seqs[start], segments[mid])
        if first is not None and first <= from_lsn:
            lo = mid
        else:
            hi = mid - 1
    return start, lo


def dump(dest: Destination, args: argparse.Namespace) -> int:
    logs = list_logs(dest)
    if args.log is not None:
        if args.log not in logs:
            have = f"logs {min(logs)}..{max(logs)}" if logs else "no logs"
            raise UsageError(f"no log {args.log} at {dest.url} ({have})")
        seqs = [args.log]
    else:
        seqs = sorted(logs)
    writer = RecordWriter(sys.stdout, args.json)
    loads = Codec().loads
    keys = key_provider(args)
    from_lsn = args.from_lsn or 0
    if args.from_time is not None:
        from_lsn = _lsn_at(dest, args.from_time)
    to_lsn = args.to_lsn
    to_us = utc_micros(args.to_time) if args.to_time is not None else None
    first_log, first_segment = _start(dest, logs, seqs, from_lsn)
    damaged = ended = False
    printed = 0
    first_seen = last_seen = None  # the LSNs of the records read, for a note when none is printed
    for i, seq in enumerate(seqs[first_log:]):
        if ended:
            break
        segments = logs[seq]
        start = None
        if i == 0 and first_segment:
            number = segments[first_segment][0]
            start = (number, 0, None)
        scanner = LogScanner(dest, seq, segments, recovery="skip", start=start, keys=keys)
        for batch in scanner:
            if (to_lsn is not None and batch.first_lsn > to_lsn) or (to_us is not None and batch.header.commit_us > to_us):
                ended = True  # past the end asked for
                break
            if batch.controls is not None:
                if args.control:
                    for c in batch.controls:
                        writer.write(lsn=None, log=seq, segment=batch.segment, offset=batch.offset,
                                     kind="control", commit_us=batch.header.commit_us, record=c)
                continue
            if batch.header.count:
                if first_seen is None:
                    first_seen = batch.first_lsn
                last_seen = batch.first_lsn + batch.header.count - 1
            if batch.first_lsn + batch.header.count <= from_lsn:
                continue  # wholly before --from-lsn: no need to decode it
            try:
                for lsn, kind, record in batch.numbered_records(loads):
                    if from_lsn <= lsn and (to_lsn is None or lsn <= to_lsn):
                        printed += 1
                        writer.write(lsn=lsn, log=seq, segment=batch.segment, offset=batch.offset,
                                     kind=kind, commit_us=batch.header.commit_us, record=record)
            except Damage as d:
                damaged = True
                name = dict(segments).get(batch.segment, str(batch.segment))
                error(f"damage: log {seq} segment {name} offset {batch.offset}: {d.reason} (batch skipped)")
                continue
        st = scanner.state
        for sk in st.skipped:
            damaged = True
            error(f"damage: log {seq} segment {sk.segment} offset {sk.offset}: {sk.reason} ({sk.length} bytes skipped)")
        if st.torn is not None:
            t = st.torn
            error(f"note: log {seq} ends in a torn tail at {t.segment} offset {t.offset} ({t.length} bytes, dropped)")
    sys.stdout.flush()
    bounded = any(v is not None for v in (args.from_lsn, args.from_time, args.to_lsn, args.to_time))
    if bounded and not printed:
        held = "no record there" if last_seen is None else f"LSNs {first_seen}..{last_seen} were read"
        error(f"note: no record within the bounds given ({held}); `persistlog info` shows what the logs hold")
    return EXIT_DAMAGED if damaged else EXIT_OK
