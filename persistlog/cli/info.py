"""``persistlog info URL``: what is at a destination.

Every log with its seq, state, segments, bytes, records, LSN range and commit-time range;
CURRENT; the writer lock or lease holder (read, never taken); the format version; where a
restore would start and how far it reaches (its last LSN and commit time: on a secondary,
what a failover to it keeps). Reads every batch header and checksum, but decodes no app record
(``verify`` does that). Damage is summarised at the end. Exit status 0 when there is no
damage (warnings, such as a damaged CURRENT, do not count), 1 when there is a torn tail or
corruption (``verify`` says where), 2 when there is no log at URL.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..reading import OPAQUE, DestinationReport, Holder, Progress, inspect_destination
from ._console import EXIT_DAMAGED, EXIT_OK, ProgressLine, fmt_bytes, fmt_time, iso_time, plural, print_json
from ._options import key_provider, open_log

EXAMPLES = """\
examples:
  persistlog info /var/lib/app/state
  persistlog info s3://bucket/app --json | jq '.logs[] | {seq, state, records}'
"""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "info",
        parents=[common],
        help="describe the logs at a destination",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(run=run)


def progress_callback(line: ProgressLine) -> Any:
    def show(p: Progress) -> None:
        line.update(f"log {p.log}, segment {p.segments_done + 1}/{p.segments_total}, {fmt_bytes(p.bytes_done)} read")

    return show


def run(args: argparse.Namespace) -> int:
    dest = open_log(args)
    line = ProgressLine("info")
    try:
        # Without a key provider the structure is read and encrypted payloads stay shut.
        report = inspect_destination(
            dest, check_records=False, progress=progress_callback(line), keys=key_provider(args) or OPAQUE
        )
    finally:
        line.done()
        dest.close()
    if args.json:
        out = report_json(report)
        out["ok"] = report.clean
        print_json(out)
    else:
        print_report(report)
    return EXIT_OK if report.clean else EXIT_DAMAGED


def report_json(report: DestinationReport) -> dict[str, Any]:
    out = report.to_dict()
    out["restore_last_commit_time"] = iso_time(out["restore_last_commit_us"])
    for lg in out["logs"]:
        lg["first_commit_time"] = iso_time(lg["first_commit_us"])
        lg["last_commit_time"] = iso_time(lg["last_commit_us"])
    return out


def holder_text(holder: Holder | None) -> str:
    if holder is None:
        return "none (no writer holds the lock)"
    text = f"{holder.name} {holder.description}"
    if holder.expires is not None:
        left = holder.expires - time.time()
        text += f", lease expires in {left:.0f}s" if left > 0 else f", lease expired {-left:.0f}s ago"
    elif holder.alive is True:
        text += ", process running"
    elif holder.alive is False:
        text += ", process gone (left by a killed writer; the OS released the lock)"
    return text


def current_text(report: DestinationReport) -> str:
    status = report.current_status
    if status == "ok":
        return f"log {report.current}"
    if status == "missing":
        return "missing (readers search the logs)"
    if status == "damaged":
        return "damaged (readers search the logs)"
    if status == "dangling":
        return f"names log {report.current}, which is gone (readers search the logs)"
    return f"names log {report.current}, which is not complete (restore fails: run persistlog repair)"


def reach_text(report: DestinationReport) -> str:
    """How far a restore from here gets: what a failover to this destination keeps."""
    if report.restore_last_lsn is None:
        text = "no record"
    else:
        text = f"LSN {report.restore_last_lsn}, committed {fmt_time(report.restore_last_commit_us)}"
        if report.restore_fails_at is not None:
            text += ' (only with recovery="skip")'
    if report.restore_skips:
        text += (f"; log(s) {', '.join(map(str, report.restore_skips))} follow a gap its writer left and "
                 "are not restored until one of them is complete")
    return text


def lsn_range(first: int | None, last: int | None) -> str:
    if first is None:
        return "-"
    if last is None:
        return f"none (next {first})"
    return f"{first}..{last}"


def print_report(report: DestinationReport) -> None:
    kind = "local, appendable" if report.appendable else "object store"
    print(f"destination  {report.url} ({kind})")
    print(f"CURRENT      {current_text(report)}")
    print(f"writer       {holder_text(report.holder)}")
    versions = report.format_versions
    print(f"format       {', '.join(f'v{v}' for v in versions) if versions else '-'}")
    if not report.logs:
        print("logs         none")
        return
    total_bytes = sum(lg.bytes for lg in report.logs)
    total_records = sum(lg.records for lg in report.logs)
    print(f"logs         {len(report.logs)}, {fmt_bytes(total_bytes)}, {plural(total_records, 'record')}")
    encrypted = [kid for lg in report.logs for kid in lg.key_ids]
    signed = [kid for lg in report.logs for kid in lg.signing_key_ids]
    for label, named in (("encrypted", encrypted), ("signed", signed)):
        ids = list(dict.fromkeys(named))
        if ids:
            print(f"{label:<12} {'key' if len(ids) == 1 else 'keys'} {', '.join(ids)}")
    if report.restore_from is not None:
        how = "a complete log" if report.restore_complete else "NO complete log: replays every log from the oldest"
        print(f"restore      starts at log {report.restore_from} ({how})")
        fails = report.restore_fails_at
        if fails is not None:
            print(f"             and FAILS at {fails.where()}: corruption (restore(recovery=\"skip\") passes "
                  "over it, losing what it held; `persistlog repair` cuts it)")
        print(f"reaches      {reach_text(report)}")
    print()
    rows = [("LOG", "STATE", "SEGS", "BYTES", "RECORDS", "LSN", "FIRST COMMIT", "LAST COMMIT")]
    for lg in report.logs:
        state = "vanished (retention)" if lg.vanished else lg.state
        rows.append(
            (
                str(lg.seq),
                state,
                str(len(lg.segments)),
                fmt_bytes(lg.bytes),
                str(lg.records),
                lsn_range(lg.first_lsn, lg.last_lsn),
                fmt_time(lg.first_commit_us),
                fmt_time(lg.last_commit_us),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    left = (1, 5, 6, 7)  # text columns; numbers align right
    for r in rows:
        cells = (cell.ljust(w) if i in left else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
        print("  ".join(cells).rstrip())
    for lg in report.logs:
        if lg.fenced_by is not None:
            print(f"\nnote: log {lg.seq} ends at a fence: writer {lg.fenced_by} took the destination over "
                  "from the writer of this log, which can add nothing to it")
    torn, corrupt = report.torn, report.corrupt
    for p in report.warnings:
        print(f"\nwarning: {p.reason}")
    if torn or corrupt:
        print(
            f"\ndamage: {plural(len(torn), 'torn tail')}, {plural(len(corrupt), 'corruption')} "
            "(run persistlog verify for details)"
        )
