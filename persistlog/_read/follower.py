"""Followers: replicas that tail a log, resumably.

A follower first restores (or resumes from a cursor), then polls for what is new:

* the growing segment of a local log: its size, and new batches from the cursor's offset
  (never re-reading from the start);
* new segments and new logs: the names that may come next (the log's next segment, the
  next log's first), asked for by :class:`~persistlog._read.probe.SegmentProbe`, never listed.

An idle poll therefore costs a size check of a growing local segment and two more (on an
object store, whose segments never grow: two ``HEAD`` requests, or a ``HEAD`` and a read of
CURRENT once every few seconds; never a ``LIST``), and the follower sleeps
``poll_interval`` between polls. A listing is made only when something is unexpected: the
cursor's data gone (retention), a later log that skipped numbers. A torn-looking end of
the live segment is a write in progress and is waited on; once a later segment or log
exists it is final, and is dropped as restore would drop it. Followers never write to the destination.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from destinations import Destination, open_destination

from .._errors import CorruptLogError, DestinationError, LogNotFoundError, PersistLogError, ResetRequired
from .._format import constants as F
from .._format.codec import Codec
from .._format.crypt import Keyring, keyring
from .._format.decoder import Damage, parse_segment_header
from .._format.shared_values import ValueTable
from .cursor import Cursor
from .probe import SegmentProbe
from .reader import (
    RESYNC_ATTEMPTS,
    Batch,
    LogScanner,
    LogState,
    SegmentGone,
    declares_gap,
    outrun,
    read_pointer,
    retention_gap,
)
from .restore import gc_pause, gone_since, plan, scan_from
from .resume import records_to_skip

logger = logging.getLogger("persistlog")

# A local poll is a few stats; a remote one is two billed requests (HEAD): poll object
# stores less often (their writers PUT about once a second anyway).
LOCAL_POLL_INTERVAL = 0.01
REMOTE_POLL_INTERVAL = 0.25


@dataclass(frozen=True)
class FollowedBatch:
    """One batch a follower applied: its records and the cursor just after it.

    ``kinds[i]`` is ``"update"`` or ``"snapshot"`` (written by an enumeration) for
    ``records[i]``. ``start`` is the cursor at the batch itself (its first LSN);
    :meth:`record_cursor` gives the cursor right after any one record.
    """

    records: list[Any]
    first_lsn: int
    last_lsn: int
    commit_time: float
    cursor: Cursor
    kinds: Sequence[str] = ()
    start: Cursor | None = None

    def record_cursor(self, lsn: int) -> Cursor:
        """The cursor that resumes right after the record with LSN ``lsn`` of this batch:
        :attr:`cursor` after its last record, else the batch's place with LSN ``lsn + 1``
        (a follower resuming there skips the batch's records before it)."""
        if lsn >= self.last_lsn or self.start is None:
            return self.cursor
        return Cursor(self.start.log, self.start.segment, self.start.offset, lsn + 1)


@dataclass(frozen=True)
class Lag:
    """How far behind the newest durable record this follower has seen."""

    records: int
    seconds: float


def gap_closed(dest: Destination, seq: int) -> bool:
    """Whether a reader stopped before log ``seq``, which follows a gap its writer declared,
    can re-sync: a log from ``seq`` on is complete (CURRENT names it). Until then nothing
    after the gap rebuilds a state, so there is nothing newer to read."""
    pointer = read_pointer(dest)
    return pointer is not None and pointer >= seq


def first_lsn(dest: Destination, name: str) -> int | None:
    """The first LSN a segment's header names (None if damaged: a scan reports it)."""
    try:
        return parse_segment_header(dest.read(name, 0, F.SEGMENT_HEADER_SIZE)).first_lsn
    except Damage:
        return None


def _as_cursor(value: Cursor | str | dict[str, Any] | None) -> Cursor | None:
    if value is None or isinstance(value, Cursor):
        return value
    if isinstance(value, str):
        return Cursor.parse(value)
    if isinstance(value, dict):
        return Cursor.from_dict(value)
    raise TypeError(f"cursor must be a Cursor, its str() or its to_dict(), not {type(value).__name__}")


class Follower:
    """Tails the log at a destination; build it with :func:`persistlog.follow`.

    Use it as a background thread (``start()``/``stop()`` or ``with``), or iterate it to
    drive your own loop: each item is a :class:`FollowedBatch` (already passed to
    ``replay``/``replay_batch`` if given), and iteration blocks until more arrives.
    ``async for`` does the same from an event loop without blocking it.
    """

    def __init__(
        self,
        dest: Destination,
        replay: Callable[[Any], Any] | None,
        replay_batch: Callable[[list[Any]], Any] | None,
        *,
        cursor: Cursor | None,
        poll_interval: float,
        on_reset: Callable[[], Any] | None,
        codec: Codec,
        recovery: str,
        wait_for_log: bool = False,
        keys: Keyring | None = None,
    ) -> None:
        self.dest = dest
        self._keys = keys
        self._wait_for_log = wait_for_log
        self._replay = replay
        self._replay_batch = replay_batch
        self._cursor = cursor
        self.poll_interval = poll_interval
        self._on_reset = on_reset
        self._loads = codec.loads
        self._recovery = recovery
        self._sealed = False
        # Chain heads at the last positions read, (log, segment, offset) -> head: a scan
        # that starts at one of them checks its first link against it, so the hash chain
        # is checked across segments, logs and polls (a position not in it: taken as given).
        self._heads: dict[tuple[int, int, int], bytes] = {}
        # The values the log being read shares, defined up to where the last scan stopped
        # (format version 3): the next scan starts from them instead of the log's start.
        self._values: ValueTable | None = None
        # Whether the cursor stands at the end of its segment as last seen. Object-store
        # segments never grow, so once read to the end only a listing is needed; a cursor
        # handed in (or left mid-segment by a stopped iteration) is checked with a size.
        self._at_end = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.applied_records = 0
        self.resets = 0
        self.polls = 0
        self._seen_lsn = 0
        self._seen_commit_us = 0
        self._applied_commit_us = 0
        self._caught_up = threading.Event()
        # A batch a replay raised in: ((log, segment, offset), records of it replayed).
        self._partial: tuple[tuple[int, int, int], int] | None = None
        # The last exception the app's own code raised (replay, replay_batch, on_reset):
        # passed on as it is, never taken for a file that storage lost.
        self._app_error: BaseException | None = None
        # Whether FollowedBatch.records are gathered: only for an app iterating the
        # follower, since holding a whole batch's records costs restore-like speed.
        self._keep_records = True
        # A cursor handed in is checked at the first poll; one inside a batch leaves the
        # records of that batch to skip: ((log, segment, offset), how many).
        self._check_cursor = cursor is not None
        self._skip: tuple[tuple[int, int, int], int] | None = None
        self._handed: Cursor | None = None  # the cursor handed in, while _skip is pending
        # Finds new segments and logs by their names, without listing.
        self._probe = SegmentProbe(dest)

    # -- public -------------------------------------------------------------------------

    @property
    def cursor(self) -> Cursor | None:
        """The position after the last applied record (None before anything was read)."""
        if self._skip is not None and self._handed is not None:
            # Handed a cursor inside a batch: the scan starts at the batch, the position is
            # still the one handed in until the records after it are applied.
            return self._handed
        return self._cursor

    @property
    def error(self) -> BaseException | None:
        """What stopped the background thread, if anything (``wait_caught_up()``, ``lag()``
        and ``stop()`` raise it)."""
        return self._error

    def lag(self) -> Lag:
        """How far behind the newest record seen this follower is.

        Raises the error that stopped the background thread, if one did.
        """
        self._raise_error()
        applied = (self._cursor.next_lsn - 1) if self._cursor else 0
        records = max(0, self._seen_lsn - applied)
        seconds = max(0.0, (self._seen_commit_us - self._applied_commit_us) / 1e6) if records else 0.0
        return Lag(records, seconds)

    def poll(self) -> int:
        """Apply whatever is new right now; returns the number of records applied."""
        before = self.applied_records
        self._keep_records = False
        try:
            for _fb in self._poll_once():
                pass
            if self._probe.deferred:  # the next log is unprobed yet: "nothing new" says nothing
                for _fb in self._poll_once():
                    pass
        finally:
            self._keep_records = True
        return self.applied_records - before

    def __repr__(self) -> str:
        if self._error is not None:
            state = f"stopped by {type(self._error).__name__}"
        elif self._thread is not None and self._thread.is_alive():
            state = "running"
        else:
            state = "idle"
        cursor = str(self._cursor) if self._cursor is not None else None
        return (
            f"<persistlog.Follower {self.dest.url!r} cursor={cursor} applied={self.applied_records} "
            f"lag={self.lag().records} {state}>"
        )

    def wait_caught_up(self, timeout: float | None = None) -> bool:
        """Block until a poll found nothing new (background mode); False on timeout.

        Like ``Future.result()``, raises the error that stopped the background thread (the
        app's own exception from ``replay``, or a :class:`PersistLogError`).
        """
        self._raise_error()
        caught_up = self._caught_up.wait(timeout)
        self._raise_error()
        return caught_up

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def start(self) -> Follower:
        """Follow on a background thread."""
        if self._thread is not None:
            raise RuntimeError("follower already started")
        self._thread = threading.Thread(target=self._run, name=f"persistlog-follow {self.dest.url}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop following; the cursor stays valid for a later resume.

        If an error stopped the background thread, it is raised once everything is let go
        (leaving a ``with`` block raises it too, unless another exception is on its way).
        """
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.dest.close()
        self._raise_error()

    def __enter__(self) -> Follower:
        if self._thread is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.stop()
            return
        try:
            self.stop()
        except BaseException as e:
            if e is not self._error:
                raise
            logger.debug("follower of %s had stopped on %r before %r", self.dest.url, e, exc)

    def __iter__(self) -> Iterator[FollowedBatch]:
        return self._batches(keep_records=True)

    def _batches(self, keep_records: bool) -> Iterator[FollowedBatch]:
        while not self._stop.is_set():
            self._keep_records = keep_records
            got = False
            for fb in self._poll_once():
                if not got:
                    got = True
                    self._caught_up.clear()
                yield fb
            if not got and self._caught_up_now():
                self._stop.wait(self.poll_interval)

    def _caught_up_now(self) -> bool:
        """After a poll that found nothing: whether that says "caught up" (then it is set,
        and the next poll waits ``poll_interval``). A poll that left the next log unprobed
        (the probe's CURRENT check took its place) says nothing: poll again at once."""
        if self._probe.deferred:
            return False
        self._caught_up.set()
        return True

    def __aiter__(self) -> AsyncIterator[FollowedBatch]:
        """``async for batch in follower``: the same batches as iterating, with every read
        on the loop's default executor and the waits between polls on the loop. ``replay``
        or ``replay_batch``, if given, run on that executor's thread: an asyncio app
        usually passes neither and applies ``batch.records`` in the loop's body."""
        from .._aio.async_follow import followed_batches  # asyncio only for asyncio apps

        return followed_batches(self)

    # -- the loop -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            for _ in self._batches(keep_records=False):
                pass
        except BaseException as e:
            self._error = e
            logger.error("follower of %s stopped: %s", self.dest.url, e)
            self._caught_up.set()

    def _apply(self, batch: Batch, next_lsn: int, after: Cursor) -> FollowedBatch:
        """Replay one batch, slice by slice; the cursor moves past it only once the app
        took all of it, so a replay that raises gets the rest of the batch (from the
        record it raised on) at the next poll."""
        kinds: Sequence[str]
        records: list[Any] = []
        where = (batch.log, batch.segment, batch.offset)
        # Records of this batch a replay that raised already took: not given twice.
        done = self._partial[1] if self._partial is not None and self._partial[0] == where else 0
        # Records before the cursor this follower was handed, inside this batch: not at all.
        drop = self._skip[1] if self._skip is not None and self._skip[0] == where else 0
        done = max(done, drop)
        try:
            slices = batch.record_slices(self._loads)
            kinds = slices.kinds()
            for first, part in slices:
                if first + len(part) > done:
                    skip = max(0, done - first)
                    self._replay_slice(part[skip:] if skip else part, where, first + skip)
                if self._keep_records:
                    records.extend(part[drop - first:] if drop > first else part)
        except Damage as d:
            # Checksums held but the records do not decode: corruption like any other.
            # (Skip mode passes over it: an empty batch, its LSNs not applied.)
            name = F.segment_name(batch.log, batch.segment)
            if self._recovery != "skip":
                raise CorruptLogError(
                    d.reason, destination=self.dest.url, log=batch.log, segment=name, offset=batch.offset
                ) from None
            logger.warning("follower of %s skips an undecodable batch in log %d %s at %d: %s",
                        self.dest.url, batch.log, name, batch.offset, d.reason)
            records, kinds = [], []
        self._partial = None
        self._skip = None
        commit = batch.header.commit_us
        self._applied_commit_us = commit
        if next_lsn - 1 > self._seen_lsn:
            self._seen_lsn = next_lsn - 1
            self._seen_commit_us = commit
        self._cursor = after
        start = Cursor(batch.log, batch.segment, batch.offset, batch.first_lsn)
        if drop:
            kinds = kinds[drop:]
        return FollowedBatch(records, batch.first_lsn + drop, next_lsn - 1, commit / 1e6, after, kinds, start)

    def _replay_slice(self, records: list[Any], where: tuple[int, int, int], before: int) -> None:
        """Replay records of the batch at ``where`` that follow its first ``before``; if the
        replay raises, remember how many it took, so that the batch (read again at the next
        poll) resumes after them."""
        self._partial = (where, before)
        if self._replay_batch is not None:
            self._app(self._replay_batch, records)
        elif self._replay is not None:
            replay = self._replay
            i = 0
            try:
                for i, r in enumerate(records):
                    replay(r)
            except BaseException as e:
                self._app_error = e
                self._partial = (where, before + i)
                self.applied_records += i
                raise
        self.applied_records += len(records)

    def _app(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run the app's ``fn``; what it raises is remembered as the app's (``_app_error``)."""
        try:
            fn(*args)
        except BaseException as e:
            self._app_error = e
            raise

    def _poll_once(self) -> Iterator[FollowedBatch]:
        self.polls += 1
        self._probe.deferred = False
        try:
            if self._cursor is None:
                yield from self._sync(None)
            else:
                if self._check_cursor:
                    self._resume_inside_batch(self._cursor)
                yield from self._tail()
        except FileNotFoundError as e:
            if isinstance(e, PersistLogError) or e is self._app_error:
                raise
            # What the cursor needs is gone: retention deleted its log, or it is ahead of
            # the log. (A segment missing in the middle of a log raises CorruptLogError.)
            yield from self._sync(self._why_gone(e))
        except OSError as e:
            if isinstance(e, PersistLogError) or e is self._app_error:
                raise
            raise DestinationError(f"reading {self.dest.url} failed: {e}") from e

    def _why_gone(self, e: FileNotFoundError) -> str:
        """Why the follower cannot go on, for a file found missing while reading from the
        cursor: the segment a scan names, else the cursor's own (anything later the
        follower reads is gone only once retention deleted the cursor's log too)."""
        if isinstance(e, SegmentGone):
            seq, segment = e.seq, e.segment
        else:
            assert self._cursor is not None
            seq, segment = self._cursor.log, self._cursor.segment
        gap = retention_gap(self.dest, seq, segment)
        if gap is not None:
            return str(gap)
        return f"a file the cursor needs is gone ({e})"

    def _sync(self, why: str | None) -> Iterator[FollowedBatch]:
        """Catch up from the newest complete log: the first sync (``why`` None), or a reset
        for the reason ``why`` (``on_reset``, else :class:`ResetRequired`).

        Retention may delete that log too while it is read: then the follower starts again
        from the newest complete log, with another reset if it had applied anything of the
        old one, at most ``RESYNC_ATTEMPTS`` times."""
        for _attempt in range(RESYNC_ATTEMPTS):
            if why is not None:
                self._start_over(why)
            applied = self.applied_records
            try:
                yield from self._sync_from_start()
                return
            except SegmentGone as e:
                # A segment missing in the middle of a log raises CorruptLogError here.
                gap = retention_gap(self.dest, e.seq, e.segment)
                gone = str(gap) if gap is not None else f"{e}, which was listed a moment ago"
            # What was applied of the vanished log must go: that needs a reset; nothing
            # applied (the state is what on_reset left, or the app's own) needs none.
            if self.applied_records == applied:
                why, self._cursor = None, None
                logger.info("follower of %s starts again from the newest complete log: %s", self.dest.url, gone)
            else:
                why = gone
        raise outrun(self.dest.url, RESYNC_ATTEMPTS)

    def _start_over(self, why: str) -> None:
        if self._on_reset is None:
            raise ResetRequired(f"cannot follow {self.dest.url} from cursor {self._cursor}: {why}")
        logger.warning("follower of %s resets: %s", self.dest.url, why)
        self.resets += 1
        self._app(self._on_reset)
        self._cursor = None
        self._partial = None
        self._skip = None
        self._sealed = False

    def _sync_from_start(self) -> Iterator[FollowedBatch]:
        p = plan(self.dest)
        if p.start is None:
            if not self._wait_for_log:
                # A mistyped location must not look like a quiet, caught-up log.
                raise LogNotFoundError(
                    f"no persistlog log at {self.dest.url}: follow(..., wait_for_log=True) waits "
                    "for a writer to make one"
                )
            return
        self._at_end = False
        # Only an appended segment can be caught mid-write; objects are written whole.
        tail_ok = self.dest.appendable
        # Catching up is a restore, paused GC and all -- unless an app iterating us runs
        # its own code between batches.
        with nullcontext() if self._keep_records else gc_pause.during_replay():
            try:
                for scanner, batch in scan_from(self.dest, p, recovery=self._recovery, tail_ok=tail_ok, keys=self._keys):
                    st = scanner.state
                    self._sealed = st.sealed
                    after = Cursor(scanner.seq, st.position[0], st.position[1], st.next_lsn or batch.first_lsn)
                    self._note_head(after, st)
                    if batch.is_control:
                        self._cursor = after
                    else:
                        yield self._apply(batch, st.next_lsn or batch.first_lsn, after)
            except CorruptLogError as e:
                # A listing taken while retention was deleting a log shows it cut short,
                # and the log after it then "starts at the wrong LSN": the log is going.
                gone = gone_since(self.dest, p, e.log)
                if gone is None:
                    raise
                raise gone from e
        self._at_end = True

    def _resume_inside_batch(self, cur: Cursor) -> None:
        """Check the cursor handed in (a bad one raises ``ValueError``); one inside a batch
        becomes the batch's own cursor, with the records before it to skip."""
        skip = records_to_skip(self.dest, cur.log, cur.segment, cur.offset, cur.next_lsn)
        self._check_cursor = False
        if skip:
            self._handed = cur
            self._cursor = Cursor(cur.log, cur.segment, cur.offset, cur.next_lsn - skip)
            self._skip = ((cur.log, cur.segment, cur.offset), skip)

    def _tail(self) -> Iterator[FollowedBatch]:
        cur = self._cursor
        assert cur is not None
        name = F.segment_name(cur.log, cur.segment)
        # Look for what follows before sizing this segment: a successor seen now means the
        # size read next holds every record of this segment. The names that may come next
        # are asked for (SegmentProbe): an idle poll lists nothing.
        following = self._probe.following(cur, self._sealed)
        if cur.offset == 0 or not self._at_end or (self.dest.appendable and not self._sealed):
            # A missing segment raises FileNotFoundError: a reset, or damage (_why_gone).
            size = self._probe.size(name)
            if cur.offset > size:
                yield from self._sync(f"the cursor is past the end of {name} ({size} bytes)")
                return
            if size > cur.offset or cur.offset == 0:
                # The segment is final once anything follows it: a torn end is then dropped
                # if it ends its log, and is corruption if a later segment of the log exists.
                more = following is not None and following[1].log == cur.log
                yield from self._scan(cur, name, final=following is not None, more_segments=more)
            else:
                self._at_end = True
        while following is not None:
            n, nxt = following
            cur = self._cursor
            assert cur is not None
            if nxt.log == cur.log and self._sealed:
                raise CorruptLogError(
                    f"expected the segment after log {cur.log} segment {cur.segment}, found {n} after the seal",
                    destination=self.dest.url, log=nxt.log, segment=n, offset=0,
                )
            if nxt.log != cur.log:
                first = None if self._sealed else first_lsn(self.dest, n)
                if first is not None and first != cur.next_lsn:
                    if declares_gap(self.dest, [(0, n)]):
                        yield from self._after_gap(nxt.log)
                        return
                    # The log we followed ended unsealed where the next one does not begin:
                    # its end was lost (a secondary detached mid-log, a power loss took bytes
                    # we had read). Our history and the log's diverged: re-sync.
                    yield from self._sync(
                        f"log {nxt.log} starts at LSN {first}, but log {cur.log} was followed to LSN {cur.next_lsn}"
                    )
                    return
                self._sealed = False
            self._cursor = cur = Cursor(nxt.log, nxt.segment, 0, cur.next_lsn)
            following = self._probe.following(cur, False)
            more = following is not None and following[1].log == cur.log
            yield from self._scan(cur, n, final=following is not None, more_segments=more)
        cur = self._cursor
        assert cur is not None
        skipped = self._probe.skipped_log(cur)
        if skipped is not None:
            seq, segments = skipped
            if declares_gap(self.dest, segments):
                yield from self._after_gap(seq)
                return
            raise CorruptLogError(f"log {cur.log + 1} is missing between logs {cur.log} and {seq}",
                                  destination=self.dest.url, log=cur.log + 1)

    def _after_gap(self, seq: int) -> Iterator[FollowedBatch]:
        """Log ``seq`` follows a gap its writer left here (a secondary that was detached or
        behind): our history cannot go on into it. Re-sync once a log from it on is
        complete (CURRENT names it); until then there is nothing newer to apply."""
        if gap_closed(self.dest, seq):
            yield from self._sync(f"log {seq} follows a gap its writer left at this destination")
        else:
            self._at_end = True

    def _scan(self, cur: Cursor, name: str, final: bool, more_segments: bool = False) -> Iterator[FollowedBatch]:
        self._at_end = False
        scanner = LogScanner(
            self.dest,
            cur.log,
            [(cur.segment, name)],
            recovery=self._recovery,
            expect_link=self._heads.get((cur.log, cur.segment, cur.offset)),
            start=(cur.segment, cur.offset, cur.next_lsn),
            tail_ok=not final and self.dest.appendable,
            more_segments=more_segments,
            keys=self._keys,
            values=self._values,
        )
        for batch in scanner:
            st = scanner.state
            next_lsn = st.next_lsn if st.next_lsn is not None else cur.next_lsn
            after = Cursor(cur.log, cur.segment, batch.end, next_lsn)
            self._note_head(after, st)
            self._values = scanner.values
            if next_lsn - 1 > self._seen_lsn:
                self._seen_lsn = next_lsn - 1
                self._seen_commit_us = batch.header.commit_us
            if batch.is_control:
                self._cursor = after
                if st.sealed:
                    self._sealed = True
                continue
            yield self._apply(batch, next_lsn, after)
        st = scanner.state
        self._values = scanner.values
        self._sealed = self._sealed or st.sealed
        self._cursor = Cursor(cur.log, st.position[0], st.position[1], st.next_lsn or cur.next_lsn)
        self._note_head(self._cursor, st)
        self._at_end = True

    def _note_head(self, at: Cursor, st: LogState) -> None:
        """Remember the chain head at ``at`` (where a scan may start next), and at the
        starts of the next segment and the next log, whose first batches link to it."""
        if not st.chained or st.chain_head is None or st.skipped:
            return
        if len(self._heads) > 64:
            self._heads.clear()
        head = st.chain_head
        self._heads[(at.log, at.segment, at.offset)] = head
        self._heads[(at.log, at.segment + 1, 0)] = head
        self._heads[(at.log + 1, 0, 0)] = head


def follow(
    url: str | os.PathLike[str],
    replay: Callable[[Any], Any] | None = None,
    *,
    replay_batch: Callable[[list[Any]], Any] | None = None,
    cursor: Cursor | str | dict[str, Any] | None = None,
    poll_interval: float | None = None,
    on_reset: Callable[[], Any] | None = None,
    storage_options: dict[str, Any] | None = None,
    codec: Codec | None = None,
    recovery: str = "strict",
    wait_for_log: bool = False,
    key_provider: Callable[[str], Any] | Keyring | None = None,
) -> Follower:
    """Follow the log at ``url``: restore (or resume after ``cursor``), then apply new
    records as they arrive.

    ``replay_batch(records)`` gets lists of records in LSN order, as ``restore`` gives
    them (a stored batch as one list or several). If a replay raises, the next poll goes
    on from the record it raised on. Catching up from the newest complete log (no
    cursor) pauses the cyclic GC as :func:`persistlog.restore` does, unless the app
    iterates the follower itself.
    Nothing runs until you call ``start()`` (or enter ``with``), ``poll()``, or iterate.
    If retention deleted what the cursor needs (before or while the follower reads it), or
    the cursor is ahead of the log, ``on_reset()`` is called (the app clears its state) and
    the follower re-syncs from the newest complete log; without ``on_reset`` it raises
    :class:`ResetRequired`. A re-sync that retention outruns in turn starts again (another
    ``on_reset()`` if it had applied anything), at most five times in a row, then raises
    :class:`DestinationError`. A segment missing in the middle of a log is
    :class:`CorruptLogError`.
    A location that holds no log is :class:`LogNotFoundError` at the first poll (from
    ``wait_caught_up()``, ``poll()`` or iteration), so that a mistyped path never looks
    like a healthy, caught-up replica; ``wait_for_log=True`` waits for a writer to make one.
    ``poll_interval`` defaults to 10 ms for local directories and 250 ms for object stores,
    where an idle poll is two requests (``HEAD``), never a ``LIST``.

    ``cursor`` may come from a follower or a record (:attr:`FollowedBatch.cursor`,
    :attr:`LoggedRecord.cursor`), or from a position: :meth:`Cursor.earliest` (the oldest
    record retained), :meth:`Cursor.at_lsn`, :meth:`Cursor.at_time`. A follower started
    at a position replays the log's history from there (snapshot records of later
    rotations included, in LSN order), not a restore.

    ``key_provider`` is the key provider of an encrypted log, as for :func:`persistlog.restore`.
    """
    if replay is not None and replay_batch is not None:
        raise TypeError("follow() takes replay= or replay_batch=, not both")
    if poll_interval is not None and (not isinstance(poll_interval, (int, float)) or poll_interval <= 0):
        raise ValueError(f"poll_interval must be a positive number of seconds, not {poll_interval!r}")
    if recovery not in ("strict", "skip"):
        raise ValueError(f"recovery must be 'strict' or 'skip', not {recovery!r}")
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options must be a dict, not {type(storage_options).__name__}")
    dest = open_destination(url, **(storage_options or {}))
    return Follower(
        dest,
        replay,
        replay_batch,
        cursor=_as_cursor(cursor),
        poll_interval=poll_interval or (LOCAL_POLL_INTERVAL if dest.appendable else REMOTE_POLL_INTERVAL),
        on_reset=on_reset,
        codec=codec or Codec(),
        recovery=recovery,
        wait_for_log=wait_for_log,
        keys=keyring(key_provider),
    )


__all__ = ["FollowedBatch", "Follower", "Lag", "follow"]
