"""persistlog tail URL [-f]: records as they arrive, through persistlog.follow.

Like a follower, it starts from the newest complete log (so the first lines are that
log's enumeration) and then prints each batch once the writer has written it. Without -f
it prints what exists and exits; with -f it keeps following, across rotations, until
interrupted, and then prints the cursor it stopped at (resume with --cursor); a log that
is not there yet is waited for, unless none can be made there (a regular file, a missing
bucket: exit status 2). Lines carry LSN, log, segment, commit time and the record;
followers see batches, not record kinds.
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from .._follower import Follower, follow
from ._console import EXIT_OK, error
from ._options import UsageError, open_log, parse_storage_options
from ._records import RecordWriter

EXAMPLES = """\
examples:
  persistlog tail /var/lib/app/state                 # what is there now, then exit
  persistlog tail -f /var/lib/app/state --from-lsn 1000000
  persistlog tail -f s3://bucket/app --interval 2 --json | jq -c .record
  persistlog tail -f /var/lib/app/state --cursor 12:3:40960:1000417
"""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "tail",
        parents=[common],
        help="print records as they arrive (-f to keep following)",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-f", "--follow", action="store_true", help="keep following until interrupted")
    p.add_argument("--from-lsn", type=int, default=0, metavar="N", help="only print records with LSN >= N")
    p.add_argument("--interval", type=float, default=0.2, metavar="SECONDS", help="poll interval with -f (default 0.2)")
    p.add_argument("--cursor", metavar="CURSOR", help="resume after a cursor printed by an earlier tail -f")
    p.set_defaults(run=run)


def _stop_when_caught_up(follower: Follower, finished: threading.Event) -> None:
    # The follower sets "caught up" only from inside its polling loop, which then sleeps
    # until the next poll: stopping it there never interrupts a read.
    while not finished.is_set():
        if follower.wait_caught_up(0.05):
            follower.stop()
            return


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise UsageError("--interval must be a positive number of seconds")
    # Without -f a missing destination is an error; with -f it may appear later, unless
    # nothing can make it there.
    open_log(args, wait_for_log=args.follow).close()

    def on_reset() -> None:
        error("the cursor's data was removed by retention: starting again from the newest complete log")

    try:
        follower = follow(
            args.url,
            cursor=args.cursor,
            # Without -f the loop stops at the first poll that finds nothing new; a long
            # interval keeps it from polling again meanwhile.
            poll_interval=args.interval if args.follow else 3600.0,
            on_reset=on_reset,
            storage_options=parse_storage_options(args.storage_options),
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    writer = RecordWriter(sys.stdout, args.json)
    finished = threading.Event()
    watcher = None
    if not args.follow:
        watcher = threading.Thread(target=_stop_when_caught_up, args=(follower, finished), daemon=True)
        watcher.start()
    try:
        for fb in follower:
            cursor = fb.cursor
            for i, record in enumerate(fb.records):
                lsn = fb.first_lsn + i
                if lsn >= args.from_lsn:
                    writer.write(
                        lsn=lsn, log=cursor.log, segment=cursor.segment,
                        commit_us=round(fb.commit_time * 1e6), record=record,
                    )
            if args.follow:
                sys.stdout.flush()
    finally:
        finished.set()
        follower.stop()
        if watcher is not None:
            watcher.join()
        if args.follow and follower.cursor is not None:
            error(f"stopped at cursor {follower.cursor} (resume with --cursor {follower.cursor})")
    sys.stdout.flush()
    if follower.cursor is None and not args.follow:
        error(f"no log at {args.url}")
    return EXIT_OK
