"""persistlog dump URL: every record of every log, oldest first.

Each record is printed with its LSN, log, segment, byte offset of its batch, kind
(snapshot, update; control with --control) and commit time, in persistlog's lossless
JSON form. Damaged batches are passed over and reported on stderr; exit status 1 if any
corruption was met, 0 otherwise (a torn tail is only noted).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from destinations import Destination

from .._codec import Codec
from .._decoder import Damage
from .._reader import LogScanner, list_logs
from ._console import EXIT_DAMAGED, EXIT_OK, error
from ._options import UsageError, open_log
from ._records import RecordWriter

EXAMPLES = """\
examples:
  persistlog dump /var/lib/app/state | less
  persistlog dump /var/lib/app/state --log 12 --json > log12.jsonl
  persistlog dump s3://bucket/app --from-lsn 1500000 --json | jq 'select(.record.key == "user:1")'
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
    p.add_argument("--from-lsn", type=int, default=0, metavar="N", help="only records with LSN >= N")
    p.add_argument("--control", action="store_true", help="also print control records (log header, complete, seal)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.from_lsn < 0:
        raise UsageError("--from-lsn must be >= 0")
    dest = open_log(args)
    try:
        return dump(dest, args)
    finally:
        dest.close()


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
    from_lsn = args.from_lsn
    first_log, first_segment = _start(dest, logs, seqs, from_lsn)
    damaged = False
    for i, seq in enumerate(seqs[first_log:]):
        segments = logs[seq]
        start = None
        if i == 0 and first_segment:
            number = segments[first_segment][0]
            start = (number, 0, None)
        scanner = LogScanner(dest, seq, segments, recovery="skip", start=start)
        for batch in scanner:
            if batch.controls is not None:
                if args.control:
                    for c in batch.controls:
                        writer.write(lsn=None, log=seq, segment=batch.segment, offset=batch.offset,
                                     kind="control", commit_us=batch.header.commit_us, record=c)
                continue
            if batch.first_lsn + batch.header.count <= from_lsn:
                continue  # wholly before --from-lsn: no need to decode it
            try:
                slices = batch.record_slices(loads)
                kinds = slices.kinds()
                for first, records in slices:
                    for j, record in enumerate(records, first):
                        lsn = batch.first_lsn + j
                        if lsn >= from_lsn:
                            writer.write(lsn=lsn, log=seq, segment=batch.segment, offset=batch.offset,
                                         kind=kinds[j], commit_us=batch.header.commit_us, record=record)
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
    return EXIT_DAMAGED if damaged else EXIT_OK
