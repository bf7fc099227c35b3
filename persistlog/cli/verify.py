"""persistlog verify URL: check every byte of every log at a destination.

Checks every segment header, every batch's header and payload checksums, decodes every
record, and checks the seq chain between logs, the LSN chain through segments and logs,
log headers, seals and CURRENT. It reads past damage to find all of it, and reports each
torn tail (a crash artefact restore drops) and each corruption (restore refuses it) with
its log, segment and byte offset. A torn tail is the unfinished last batch of a log that
was never sealed, where nothing later says more was written; a log that ends before the
next one starts lost its end, which is corruption. Exit status 0 when clean, 1 when
damaged, 2 when it cannot check (no log there, or a batch needs a package that is not
installed).
"""

from __future__ import annotations

import argparse
from typing import Any

from .._destination_check import inspect_destination
from .._destination_report import DestinationReport, Problem
from .._errors import MissingDependencyError
from ._console import EXIT_DAMAGED, EXIT_OK, EXIT_USAGE, ProgressLine, fail, fmt_bytes, plural, print_json
from ._options import open_log
from .info import progress_callback, report_json

EXAMPLES = """\
examples:
  persistlog verify /var/lib/app/state && echo clean
  persistlog verify s3://bucket/app -o profile=backup --json | jq '.problems[]'
  persistlog verify /var/lib/app/state --torn-ok     # only corruption fails

After a crash the newest log may end in a torn tail: restore drops it, and
"persistlog repair URL" truncates it (keeping a copy) so that verify is clean again.
"""

LABELS = {"torn": "TORN TAIL", "corrupt": "CORRUPT", "warning": "warning"}


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "verify",
        parents=[common],
        help="check every checksum and the seq/LSN chain",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--torn-ok", action="store_true", help="exit 0 when the only damage is torn tails")
    p.set_defaults(run=run)


def describe(p: Problem) -> str:
    size = f" ({fmt_bytes(p.length)})" if p.length else ""
    return f"{LABELS.get(p.kind, p.kind)}: {p.where()}{size}: {p.reason}"


def run(args: argparse.Namespace) -> int:
    dest = open_log(args)
    line = ProgressLine("verify")
    try:
        report = inspect_destination(dest, check_records=True, progress=progress_callback(line))
    except MissingDependencyError as e:
        # The bytes may well be sound: what cannot be read was not checked, so it is
        # neither clean (0) nor damaged (1).
        return fail(args, f"cannot check {args.url}: {e}", EXIT_USAGE)
    finally:
        line.done()
        dest.close()
    damaged = bool(report.corrupt) or (bool(report.torn) and not args.torn_ok)
    if args.json:
        out = report_json(report)
        out["ok"] = not damaged
        print_json(out)
    else:
        print_verdict(report, damaged)
    return EXIT_DAMAGED if damaged else EXIT_OK


def print_verdict(report: DestinationReport, damaged: bool) -> None:
    segments = sum(len(lg.segments) for lg in report.logs)
    size = sum(lg.bytes for lg in report.logs)
    checked = report.records_checked or 0
    print(
        f"{report.url}: {plural(len(report.logs), 'log')}, {plural(segments, 'segment')}, "
        f"{fmt_bytes(size)}, {plural(checked, 'record')} checked"
    )
    for p in report.all_problems():
        print(describe(p))
        for more in p.also:
            print(f"    and then {more}")
    torn, corrupt = report.torn, report.corrupt
    if corrupt:
        start = report.restore_from
        read = any(p.log is None or start is None or p.log >= start for p in corrupt)
        effect = (
            "Restore refuses corruption" if read
            else f"A restore starts at log {start} and reads none of it (only older history is damaged)"
        )
        print(
            f"DAMAGED: {plural(len(corrupt), 'corruption')}, {plural(len(torn), 'torn tail')}. "
            f"{effect}; see persistlog repair --dry-run."
        )
    elif torn:
        print(
            f"{'DAMAGED' if damaged else 'ok'}: {plural(len(torn), 'torn tail')}: a log never sealed ends in an "
            "unfinished batch, as a crash leaves it (a file cut short after a clean close looks the same); "
            "restore drops it, persistlog repair truncates it (--dry-run names its records)."
        )
    else:
        print("clean")
    if report.holder is not None and report.holder.active:
        print(f"note: a writer is active ({report.holder.description}); its newest log may still be growing")
