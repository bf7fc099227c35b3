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

from .. import KeyUnavailableError, MissingDependencyError
from ..reading import (
    OPAQUE,
    Audit,
    DestinationReport,
    Problem,
    SignedHead,
    Verifier,
    audit,
    inspect_destination,
    load_public_key,
)
from ._console import EXIT_DAMAGED, EXIT_OK, EXIT_USAGE, ProgressLine, fail, fmt_bytes, plural, print_json
from ._options import key_provider, open_log
from .info import progress_callback, report_json

EXAMPLES = """\
examples:
  persistlog verify /var/lib/app/state && echo clean
  persistlog verify s3://bucket/app -o profile=backup --json | jq '.problems[]'
  persistlog verify /var/lib/app/state --torn-ok     # only corruption fails
  persistlog verify s3://bucket/app --public-key writer.pub   # prove it unchanged

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
    p.add_argument(
        "--public-key", metavar="FILE", action="append",
        help="Ed25519 public key (PEM, or 32 raw bytes) of the writer's signing_key: check every signed "
        "checkpoint and prove the history up to the newest signed head unchanged; give it again for each "
        "key the writer signed with (after a key change)",
    )
    p.set_defaults(run=run)


def describe(p: Problem) -> str:
    size = f" ({fmt_bytes(p.length)})" if p.length else ""
    return f"{LABELS.get(p.kind, p.kind)}: {p.where()}{size}: {p.reason}"


def run(args: argparse.Namespace) -> int:
    verifier = None
    if args.public_key:
        keys = []
        for path in args.public_key:
            try:
                with open(path, "rb") as f:
                    keys.append(load_public_key(f.read()))
            except MissingDependencyError as e:
                return fail(args, str(e), EXIT_USAGE)
            except (OSError, ValueError) as e:
                return fail(args, f"cannot use {path} as a public key: {e}", EXIT_USAGE)
        verifier = Verifier(*keys)
    dest = open_log(args)
    line = ProgressLine("verify")
    try:
        # Without a key provider everything but the GCM tags is checked (an auditor holding
        # only the public key proves the ciphertext through the chain and signatures).
        report = inspect_destination(
            dest, check_records=True, progress=progress_callback(line), keys=key_provider(args) or OPAQUE
        )
    except (MissingDependencyError, KeyUnavailableError) as e:
        # The bytes may well be sound: what cannot be read was not checked, so it is
        # neither clean (0) nor damaged (1).
        return fail(args, f"cannot check {args.url}: {e}", EXIT_USAGE)
    finally:
        line.done()
        dest.close()
    damaged = bool(report.corrupt) or (bool(report.torn) and not args.torn_ok)
    checked = audit(report, verifier) if verifier is not None else None
    if checked is not None and not checked.ok:
        damaged = True
    unopened = sum(info.unopened_batches for info in report.logs)
    if args.json:
        out = report_json(report)
        out["unopened_batches"] = unopened
        if checked is not None:
            out["signed"] = audit_json(checked)
        out["ok"] = not damaged
        print_json(out)
    else:
        print_verdict(report, damaged)
        if checked is not None:
            print_audit(checked)
        if unopened:
            print(f"{unopened} encrypted batches not opened (no --key-provider): their checksums and hash "
                  "links were checked, their records and GCM tags not")
    return EXIT_DAMAGED if damaged else EXIT_OK


def _head(s: SignedHead) -> str:
    return f"log {s.log} segment {s.segment} offset {s.offset} (the {s.kind} at LSN {s.lsn}, head {s.head.hex()[:16]})"


def _keys(a: Audit) -> str:
    return ("key " if len(a.key_ids) == 1 else "keys ") + ", ".join(a.key_ids)


def print_audit(a: Audit) -> None:
    """What the signatures prove, after the verdict of the checks every reader makes."""
    for p in a.problems:
        print(describe(p))
    if a.problems and a.proven is not None:
        first = a.problems[0]
        print(
            f"BROKEN: {plural(len(a.problems), 'signed record')} {'does' if len(a.problems) == 1 else 'do'} not verify, the first at {first.where()}: what "
            f"they sign was changed (or another key signed them); the newest signed head that verifies is {_head(a.proven)}"
        )
        return
    if a.proven is None:
        print(f"UNPROVEN: no checkpoint signed with {_keys(a)} verifies ({plural(a.signed, 'signed record')} found)")
        _note_unknown(a)
        return
    if a.breaks:
        print(f"BROKEN: the history before the newest signed head, {_head(a.proven)}, was changed:")
        for p in a.breaks:
            print(f"  {p.where()}: {p.reason}")
        return
    start = f"from log {a.chain_from}" if a.chain_from is not None else "from its log's start"
    verdict = "PROVEN" if a.ok else "PROVEN (but see the bad signatures above)"
    print(
        f"{verdict}: {plural(a.signed, 'signed record')} checked with {_keys(a)}; nothing {start} up to "
        f"the newest signed head, {_head(a.proven)}, was edited, inserted, removed or cut"
    )
    if a.unsigned_lsns:
        print(f"note: {plural(a.unsigned_lsns, 'record')} after it are not signed yet (the next checkpoint or seal signs them)")
    _note_unknown(a)


def _note_unknown(a: Audit) -> None:
    if a.unknown_keys:
        n = sum(a.unknown_keys.values())
        ids = ", ".join(a.unknown_keys)
        print(f"note: {plural(n, 'signed record')} name{'s' if n == 1 else ''} key(s) {ids}, not given: not checked "
              "(give --public-key once for each key the writer signed with)")


def audit_json(a: Audit) -> dict[str, Any]:
    proven = a.proven
    return {
        "key_ids": list(a.key_ids),
        "ok": a.ok,
        "records": a.signed,
        "proven": None if proven is None else {
            "log": proven.log, "segment": proven.segment, "offset": proven.offset, "kind": proven.kind,
            "lsn": proven.lsn, "head": proven.head.hex(), "chain_from": a.chain_from,
        },
        "breaks": [p.to_dict() for p in a.breaks],
        "problems": [p.to_dict() for p in a.problems],
        "unsigned_lsns": a.unsigned_lsns,
        "unknown_keys": dict(a.unknown_keys),
    }


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
