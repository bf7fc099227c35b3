"""persistlog restore-check URL: restore into a throwaway model and report its size.

Replays exactly what an application's restore would (the newest complete log and every
later one, in LSN order) into a model that counts records and, for logs following the
ResourceStore convention ({"op": "put"|"del", "key": ..., "value": ...}), keeps the set of
live keys. Prints records replayed, keys live, the seqs of the logs replayed, last LSN,
last commit time and how long it took. Exit status 0 when the restore succeeds, 1 when it
meets corruption (or passes over some with --recovery skip), 2 when there is no log.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from .. import CorruptLogError, RestoreResult, restore
from ..reading import parse_storage_options, to_json
from ._console import EXIT_DAMAGED, EXIT_OK, ProgressLine, fail, fmt_time, iso_time, plural, print_json
from ._options import key_provider, open_log

EXAMPLES = """\
examples:
  persistlog restore-check /var/lib/app/state
  persistlog restore-check s3://bucket/app --json | jq .records
  persistlog restore-check /var/lib/app/state --recovery skip   # replay around damage
"""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "restore-check",
        parents=[common],
        help="restore into a throwaway model and print the state size",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--recovery", choices=("strict", "skip"), default="strict",
        help="strict (default) stops at corruption, as an app's restore does; skip passes over it",
    )
    p.set_defaults(run=run)


class Model:
    """Counts records; tracks live keys while every record follows the ResourceStore
    convention (and stops tracking, freeing them, at the first one that does not)."""

    def __init__(self, progress: ProgressLine) -> None:
        self.records = 0
        self.puts = 0
        self.deletes = 0
        self.keys: set[Any] | None = set()
        self.progress = progress

    @staticmethod
    def _key(key: Any) -> Any:
        try:
            hash(key)
            return key
        except TypeError:
            return to_json(key)  # unhashable (a list or map): its JSON text is as unique

    def apply_batch(self, records: list[Any]) -> None:
        self.records += len(records)
        keys = self.keys
        if keys is not None:
            for r in records:
                op = r.get("op") if isinstance(r, dict) and "key" in r else None
                if op == "put":
                    self.puts += 1
                    keys.add(self._key(r["key"]))
                elif op == "del":
                    self.deletes += 1
                    keys.discard(self._key(r["key"]))
                else:
                    self.keys = None
                    break
        self.progress.update(f"{plural(self.records, 'record')} replayed")


def run(args: argparse.Namespace) -> int:
    open_log(args).close()
    line = ProgressLine("restore-check")
    model = Model(line)
    started = time.perf_counter()
    try:
        result = restore(
            args.url,
            replay_batch=model.apply_batch,
            recovery=args.recovery,
            storage_options=parse_storage_options(args.storage_options),
            key_provider=key_provider(args),
        )
    except CorruptLogError as e:
        line.done()
        return fail(args, f"restore failed after {plural(model.records, 'record')}: {e}", EXIT_DAMAGED)
    finally:
        line.done()
    seconds = time.perf_counter() - started
    damaged = bool(result.skipped)
    if args.json:
        print_json(summary(result, model, seconds))
    else:
        print_summary(result, model, seconds)
    return EXIT_DAMAGED if damaged else EXIT_OK


def summary(result: RestoreResult, model: Model, seconds: float) -> dict[str, Any]:
    return {
        "url": result.destination,
        "found": result.found,
        "complete": result.complete,
        "logs": result.logs,
        "records": result.records,
        "resource_store": model.keys is not None and result.records > 0,
        "keys": len(model.keys) if model.keys is not None else None,
        "puts": model.puts if model.keys is not None else None,
        "deletes": model.deletes if model.keys is not None else None,
        "last_lsn": result.last_lsn,
        "next_lsn": result.next_lsn,
        "last_commit_time": iso_time(result.last_commit_us),
        "torn_tails": [
            {"log": t.log, "segment": t.segment, "offset": t.offset, "length": t.length, "reason": t.reason}
            for t in result.torn_tails
        ],
        "skipped": [
            {"log": s.log, "segment": s.segment, "offset": s.offset, "length": s.length, "reason": s.reason}
            for s in result.skipped
        ],
        "seconds": round(seconds, 6),
        "records_per_second": round(result.records / seconds) if seconds > 0 else None,
    }


def print_summary(result: RestoreResult, model: Model, seconds: float) -> None:
    if not result.found:
        print(f"{result.destination}: no log, nothing to restore")
        return
    seqs = result.logs
    logs = f"log seq {seqs[0]}" if len(seqs) == 1 else f"log seqs {', '.join(map(str, seqs))}"
    start = "a complete log" if result.complete else "NO complete log (replayed every log from the oldest)"
    print(f"{result.destination}: restored from {start}")
    print(f"  replayed from    {logs}")
    print(f"  records          {result.records}")
    if model.keys is not None and result.records:
        ops = f"{model.puts} puts, {model.deletes} deletes"
        print(f"  keys live        {len(model.keys)} (ResourceStore convention: {ops})")
    else:
        print("  keys live        - (records do not follow the ResourceStore convention)")
    print(f"  last LSN         {result.last_lsn}")
    print(f"  last commit      {fmt_time(result.last_commit_us)}")
    rate = f", {result.records / seconds:,.0f} records/s" if seconds > 0 and result.records else ""
    print(f"  time             {seconds:.3f} s{rate}")
    for t in result.torn_tails:
        print(f"  torn tail        log {t.log} {t.segment} offset {t.offset}: {t.length} bytes dropped ({t.reason})")
    for s in result.skipped:
        print(f"  SKIPPED          log {s.log} {s.segment} offset {s.offset}: {s.length} bytes ({s.reason})")
