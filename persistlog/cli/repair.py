"""persistlog repair URL: truncate torn tails; with --force, cut corruption out.

A torn tail (the end of a log a crash left unfinished) is repaired safely: the segment is
copied into the destination's broken/ directory (which readers never look into) and
truncated at its last intact batch. That loses nothing a restore reads: the plan names the
records of the unfinished batch, which a restore drops as well (never durable if a crash
left it; a file cut short after a clean close looks the same). A log that ends before the
next log starts lost its end: that is corruption, and the plan counts the records missing.

Corruption is refused unless --force is given; the plan printed first says what forcing
would lose (records and bytes). A forced repair cuts the log at the first damage that
matters to a restore and moves what follows aside into broken/; damage only in logs older
than the one a restore starts from moves that old history aside, leaving the restored
state unchanged. CURRENT is pointed at the newest complete log that survives.

The writer must be stopped: repair takes the writer lock. Local destinations only: object
stores write every segment whole and create-only, so nothing there is ever torn.
Exit status 0 when the destination is clean afterwards (or already was), 1 when damage
remains (a refused repair, or --dry-run of one that would be refused), 2 when there is no
log or it cannot be checked (a batch needs a package that is not installed): then nothing
is written to the destination.
"""

from __future__ import annotations

import argparse
from typing import Any

from .. import KeyUnavailableError, MissingDependencyError
from ..reading import RepairPlan, RepairResult, UsageError, repair
from ._console import EXIT_DAMAGED, EXIT_OK, EXIT_USAGE, ProgressLine, fail, fmt_bytes, plural, print_json
from ._options import key_provider, open_log
from .info import progress_callback

EXAMPLES = """\
examples:
  persistlog repair /var/lib/app/state --dry-run    # show the plan, change nothing
  persistlog repair /var/lib/app/state              # torn tails only
  persistlog repair /var/lib/app/state --force      # also cut corruption out
"""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "repair",
        parents=[common],
        help="truncate torn tails (and, with --force, corruption) keeping copies",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--force", action="store_true", help="also repair corruption, losing what the plan says")
    p.add_argument("--dry-run", "-n", action="store_true", help="print the plan, change nothing")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    dest = open_log(args)
    line = ProgressLine("repair")
    try:
        try:
            result = repair(
                dest, force=args.force, dry_run=args.dry_run, progress=progress_callback(line), keys=key_provider(args)
            )
        except ValueError as e:
            raise UsageError(str(e)) from None
        except (MissingDependencyError, KeyUnavailableError) as e:
            # Unreadable is not damaged: cutting there would throw sound records away.
            return fail(args, f"repair refused, nothing changed: cannot check {args.url}: {e}", EXIT_USAGE)
    finally:
        line.done()
        dest.close()
    ok = not result.refused and (result.after is None or result.after.clean)
    if args.json:
        out = result.to_dict()
        out["ok"] = ok
        print_json(out)
    else:
        print_result(result)
    return EXIT_OK if ok else EXIT_DAMAGED


def loss_text(plan: RepairPlan) -> str:
    records = plural(plan.records_lost, "record")
    if plan.damaged_records or plan.unknown_records:
        records += " in intact batches"
    if plan.damaged_records:
        records += f", plus {plural(plan.damaged_records, 'record')} in the damage (unreadable already)"
    if plan.unknown_records:
        records += ", plus whatever the damaged bytes held" if not plan.damaged_records else " and whatever else"
    text = f"{records}, {fmt_bytes(plan.bytes_lost)}"
    if plan.lost_from_lsn is not None:
        text += f"; every LSN from {plan.lost_from_lsn} on"
    return text


def print_result(result: RepairResult) -> None:
    plan = result.plan
    url = plan.url
    if not plan.actions:
        print(f"{url}: nothing to repair")
        return
    verb = "would" if result.dry_run or result.refused else "will"
    print(f"{url}: {plural(len(plan.actions), 'step')} {verb} repair it:")
    for a in plan.actions:
        tag = "safe " if a.safe else "FORCE"
        print(f"  [{tag}] {a.describe()}")
    print(f"cost: {loss_text(plan)}")
    if plan.restore_from is not None:
        print(f"restore afterwards starts at log {plan.restore_from}")
    if result.refused:
        print("refused: this is corruption, not a torn tail; rerun with --force to accept the cost above")
        return
    if result.dry_run:
        print("dry run: nothing changed")
        return
    if result.saved:
        print(f"copies of what was cut or moved: {result.broken_dir}")
    after = result.after
    if after is not None and after.clean:
        print("repaired: verify is clean")
    elif after is not None:
        remains = f"{plural(len(after.torn), 'torn tail')}, {plural(len(after.corrupt), 'corruption')}"
        print(f"repaired, but damage remains: {remains}")
