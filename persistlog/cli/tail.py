"""persistlog tail URL [-f]: records as they arrive, through persistlog.follow.

Like a follower, it starts from the newest complete log (so the first lines are that
log's enumeration) and then prints each batch once the writer has written it. --from-lsn N
and --from-time TIME (as dump takes them) start at that record instead, in any retained
log, found from segment and batch headers without reading what lies before it; a start the
log does not hold (before the oldest record retention left, past the end) is exit status
2, naming the LSNs and times it holds. Without -f
it prints what exists and exits; with -f it keeps following, across rotations, until
interrupted. A location holding no log is exit status 2, as for every command (a mistyped
path must not look like a quiet log); with -f --wait a log that is not there yet is waited
for, unless none can be made there (a regular file, a missing bucket: exit status 2). Lines carry LSN, log, segment, commit time
and the record; followers see batches, not record kinds.

Every record has its own cursor, the one that resumes right after it: the "cursor" field
with --json, the first word of the line with --with-cursor. A consumer that saves the
cursor of each line it has finished, and restarts tail with --cursor set to it, gets every
record exactly once. When tail -f stops it names the cursor after the last record it wrote
to stdout: lines still in a pipe had not reached the consumer, so resume from the
consumer's own cursor. A cursor that does not point at a batch of the log (not one tail
printed) is refused with exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from .. import Cursor, Follower, LogNotFoundError, follow
from ..reading import FIRST_LSN, UsageError, parse_storage_options
from ._console import EXIT_OK, error
from ._options import add_start_options, check_start, key_provider, open_log
from ._records import RecordWriter

EXAMPLES = """\
examples:
  persistlog tail /var/lib/app/state                 # what is there now, then exit
  persistlog tail -f /var/lib/app/state --from-lsn 1000000
  persistlog tail /var/lib/app/state --from-time 2026-11-26T09:00
  persistlog tail -f s3://bucket/app --interval 2 --json | jq -c .record
  persistlog tail -f /var/lib/app/state --cursor 12:3:40960:1000417
  persistlog tail -f /var/lib/app/state --with-cursor |
      while read -r cursor lsn where day time utc record; do   # restart: --cursor "$(cat app.cursor)"
          handle "$record" && echo "$cursor" > app.cursor || break
      done
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
    p.add_argument(
        "--wait", action="store_true",
        help="with -f: wait for a log to appear where there is none yet (else: exit status 2)",
    )
    add_start_options(p)
    p.add_argument("--interval", type=float, default=0.2, metavar="SECONDS", help="poll interval with -f (default 0.2)")
    p.add_argument("--cursor", metavar="CURSOR", help="resume right after the record a cursor printed by tail belongs to")
    p.add_argument(
        "--with-cursor", action="store_true",
        help="start each text line with the record's cursor (--json always has it, as \"cursor\")",
    )
    p.set_defaults(run=run)


def _start_cursor(args: argparse.Namespace) -> Cursor:
    """The cursor before the record ``--from-lsn`` or ``--from-time`` names, by persistlog's
    seek (``--from-lsn 0``, as for dump: the oldest record retained)."""
    options = parse_storage_options(args.storage_options)
    try:
        if args.from_time is not None:
            return Cursor.at_time(args.url, args.from_time, storage_options=options)
        if args.from_lsn < FIRST_LSN:
            return Cursor.earliest(args.url, storage_options=options)
        return Cursor.at_lsn(args.url, args.from_lsn, storage_options=options)
    except LogNotFoundError:
        if not args.wait:
            raise
        raise UsageError(
            f"no log at {args.url} yet to find --from-lsn/--from-time in: leave them out to wait "
            "for the first record"
        ) from None


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
    if args.wait and not args.follow:
        raise UsageError("--wait goes with -f (without -f, tail prints what exists and exits)")
    check_start(args)
    seeking = args.from_lsn is not None or args.from_time is not None
    if seeking and args.cursor is not None:
        raise UsageError("give --cursor or --from-lsn/--from-time, not both")
    # A location holding no log is an error; with -f --wait one may appear later, unless
    # nothing can make it there.
    open_log(args, wait_for_log=args.wait).close()
    cursor = _start_cursor(args) if seeking else args.cursor

    def on_reset() -> None:
        error("the cursor's data was removed by retention: starting again from the newest complete log")

    try:
        follower = follow(
            args.url,
            cursor=cursor,
            # Without -f the loop stops at the first poll that finds nothing new; a long
            # interval keeps it from polling again meanwhile.
            poll_interval=args.interval if args.follow else 3600.0,
            on_reset=on_reset,
            storage_options=parse_storage_options(args.storage_options),
            wait_for_log=args.wait,
            key_provider=key_provider(args),
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    writer = RecordWriter(sys.stdout, args.json)
    finished = threading.Event()
    watcher = None
    if not args.follow:
        watcher = threading.Thread(target=_stop_when_caught_up, args=(follower, finished), daemon=True)
        watcher.start()
    # The last record handed to stdout and its cursor.
    last: tuple[int, Cursor] | None = None
    closed = failed = False
    guard = Interrupts(enabled=args.follow)
    with guard.installed():
        try:
            for fb in follower:
                for i, record in enumerate(fb.records):
                    lsn = fb.first_lsn + i
                    cursor = fb.record_cursor(lsn)
                    guard.writing = True
                    writer.write(
                        lsn=lsn, log=fb.cursor.log, segment=fb.cursor.segment,
                        commit_us=round(fb.commit_time * 1e6), record=record,
                        cursor=str(cursor) if args.json or args.with_cursor else None,
                    )
                    last = lsn, cursor
                    guard.written()
                if args.follow:
                    guard.flush()
        except BrokenPipeError:
            closed = True
            raise
        except Exception:
            failed = True  # a bad cursor, damage: the error says why; a cursor only if one is due
            raise
        finally:
            finished.set()
            follower.stop()
            if watcher is not None:
                watcher.join()
            if args.follow and not (failed and last is None):
                closed = closed or (not guard.forced and not guard.flush(final=True))
                error(stop_message(last, args.cursor, closed, guard.forced))
    sys.stdout.flush()
    if follower.cursor is None and not args.follow:
        error(f"no log at {args.url}")
    return EXIT_OK


class Interrupts:
    """Ctrl-C during ``tail -f``, made exact: between lines it stops tail at once; while a
    line is written (``writing``) it takes effect once the line is out and its record noted
    (:meth:`written`), so that the stop message names exactly the last record written. A
    second Ctrl-C while a write is stuck (the reader stopped reading, the pipe is full)
    stops at once (``forced``)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.writing = False
        self.pending = False
        self.forced = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.writing and not self.pending:
            self.pending = True
            return
        self.forced = self.writing
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if not self.enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def written(self) -> None:
        """A line is out and its record noted: a Ctrl-C that came meanwhile stops tail now."""
        self.writing = False
        self._stop_if_asked()

    def _stop_if_asked(self) -> None:
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt

    def flush(self, final: bool = False) -> bool:
        """Flush stdout as a line is written. Its reader gone (a closed pipe) raises
        ``BrokenPipeError``, a second Ctrl-C while it is stuck ``KeyboardInterrupt``; the
        ``final`` flush, as tail stops, raises neither and returns False for them."""
        self.writing = True
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            if not final:
                raise
            return False
        except KeyboardInterrupt:
            self.forced = True
            if not final:
                raise
            return False
        finally:
            self.writing = False
        if not final:
            self._stop_if_asked()
        return True


def stop_message(last: tuple[int, Cursor] | None, started: str | None, closed: bool, forced: bool = False) -> str:
    """What ``tail -f`` says when it stops: which record its cursor follows, and that a
    consumer resumes from the cursor of the last line it finished, not from this one."""
    if last is None and not forced:
        where = f"resume with --cursor {started}" if started else "start again without --cursor"
        return f"stopped before writing any record: {where}"
    if forced:
        after = f" after LSN {last[0]}" if last is not None else ""
        return (
            f"stopped while writing to stdout{after} (its reader was not reading): the lines that "
            "reached it are unknown here: resume with the cursor of the last line it finished"
        )
    assert last is not None
    lsn, cursor = last
    if closed:
        return (
            f"stopped: stdout was closed by its reader; LSN {lsn} was the last record written to it, "
            "but what the reader took is unknown here: resume with the cursor of the last line it finished"
        )
    return (
        f"stopped after LSN {lsn}, the last record written to stdout: --cursor {cursor} resumes right "
        "after it. Lines still in a pipe had not reached the consumer: to resume after the last line "
        "the consumer finished, use that line's cursor (--json: \"cursor\", text: --with-cursor)"
    )
