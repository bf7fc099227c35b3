"""Restore: replay the newest complete log and every later one, in order.

The newest complete log is the one CURRENT names when CURRENT is intact and that log still
exists; otherwise the logs themselves are searched, newest first, for a snapshot-complete
marker. With no complete log at all (a crash during the very first enumeration) every log
is replayed from the oldest and the result says the state is not from a complete log.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from destinations import Destination

from .._errors import CodecError, CorruptLogError, DestinationError, PersistLogError
from .._format.codec import Codec
from .._format.constants import FIRST_LSN, HEADER_AFTER_GAP, segment_name
from .._format.crypt import OPAQUE, Keyring
from .._format.decoder import Damage
from .reader import (
    Batch,
    LogScanner,
    LogState,
    SegmentGone,
    Skipped,
    TornTail,
    closed_end,
    declares_gap,
    end_of_logs,
    list_logs,
    log_header,
    no_log,
    read_pointer,
)
from .seek import seek

logger = logging.getLogger("persistlog")


@dataclass
class RestoreResult:
    """What a restore replayed.

    ``found`` is False when the destination held no log. ``complete`` is True when the
    replay started at a log whose enumeration completed (the normal case). ``next_lsn`` is
    the LSN the next record will take; ``last_lsn`` the last one replayed (0 if none) and
    ``last_commit_us`` the commit time of the last batch of records replayed (µs since
    the Unix epoch; None if none): together they say how far the destination's state
    reaches, so restoring a secondary tells what a failover to it would lose against the
    primary's ``last_lsn``.

    ``after_gap`` lists logs that were not replayed because they follow a gap the writer
    left at this destination (a secondary that was detached, or behind when its writer
    crashed) and none of them is complete yet: the state is the one before the gap, and
    the first of these logs to complete becomes the restore point.
    """

    destination: str
    found: bool = False
    complete: bool = False
    logs: list[int] = field(default_factory=list)
    records: int = 0
    last_lsn: int = 0
    next_lsn: int = 1
    torn_tails: list[TornTail] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    last_commit_us: int | None = None
    after_gap: list[int] = field(default_factory=list)

    @property
    def torn_tail(self) -> TornTail | None:
        """The torn tail dropped from the newest log, if any."""
        return self.torn_tails[-1] if self.torn_tails else None


@dataclass
class ReplayPlan:
    """Which logs a replay covers, decided from one listing."""

    logs: dict[int, list[tuple[int, str]]]
    start: int | None
    complete: bool
    pointer: int | None
    #: Logs the scan left unread because they follow a declared gap (set by scan_from).
    after_gap: list[int] = field(default_factory=list)


def plan(dest: Destination) -> ReplayPlan:
    """Which logs of ``dest`` a replay reads, from CURRENT and one listing: the log it starts
    at (the one CURRENT names, else the newest complete log, else the oldest) and whether
    that log holds a complete snapshot (``ReplayPlan.complete``)."""
    # CURRENT before the listing: a rotation finishing in between then only adds logs the
    # listing shows after the one CURRENT names, instead of naming a log not yet listed.
    pointer = read_pointer(dest)
    logs = list_logs(dest)
    if not logs:
        return ReplayPlan(logs, None, False, None)
    seqs = sorted(logs)
    # Only the newest run of consecutive logs can chain up to the newest log: a secondary
    # that missed logs while detached holds runs separated by gaps.
    run = len(seqs) - 1
    while run and seqs[run - 1] == seqs[run] - 1:
        run -= 1
    if pointer is not None and pointer in logs and pointer >= seqs[run]:
        return ReplayPlan(logs, pointer, True, pointer)
    if pointer is not None:
        logger.warning("%s/CURRENT names log %d, which is gone or stale; searching the logs", dest.url, pointer)
    for seq in reversed(seqs[run:]):
        if _is_complete(dest, seq, logs[seq]):
            return ReplayPlan(logs, seq, True, pointer)
    if pointer is not None and pointer in logs:
        return ReplayPlan(logs, pointer, True, pointer)  # a gap after it ends the replay or is reported
    # Older runs: a gap the writer declared ends the replay there; any other is reported.
    for seq in reversed(seqs[:run]):
        try:
            if _is_complete(dest, seq, logs[seq]):
                return ReplayPlan(logs, seq, True, pointer)
        except CorruptLogError as e:
            logger.warning("%s: cannot tell whether log %d is complete: %s", dest.url, seq, e)
            break
    oldest = min(logs)
    logger.warning("no complete log at %s: replaying every log from log %d", dest.url, oldest)
    return ReplayPlan(logs, oldest, False, pointer)


def reach(dest: Destination) -> int:
    """The next LSN a restore of ``dest`` reaches for sure (``FIRST_LSN``: none), reading
    little: CURRENT, one listing, the header of each log after the one a restore starts
    at, the end of the last log it replays.

    A restore stops before the newest log at a log whose header says it follows a gap (a
    secondary detached or left behind, and no log complete after it), or at a missing
    log. (A declared gap that the LSNs happen to bridge counts as a gap here, so the reach
    may fall short of what a restore replays, never beyond it.)
    """
    p = plan(dest)
    if p.start is None:
        return FIRST_LSN
    seqs = [s for s in sorted(p.logs) if s >= p.start]
    if not p.complete and declares_gap(dest, p.logs[seqs[0]]):
        return FIRST_LSN  # nothing here is a prefix of the history: the empty state
    kept = 1
    while kept < len(seqs) and seqs[kept] == seqs[kept - 1] + 1 and not declares_gap(dest, p.logs[seqs[kept]]):
        kept += 1
    return end_of_logs(dest, {s: p.logs[s] for s in seqs[:kept]})[1]


def plan_until(dest: Destination, to_lsn: int) -> ReplayPlan:
    """The plan of a restore that stops after LSN ``to_lsn``: from the newest log whose
    snapshot is complete at or before ``to_lsn`` (its ``complete`` marker at most that
    far), through the log holding ``to_lsn``, as a restore of the logs cut there would
    plan it. Raises :class:`PositionError` when ``to_lsn`` is not held (before the oldest
    record retention left, past the last one) or no complete state is left at or before
    it (the oldest retained log's snapshot ends after it)."""
    view, place = seek(dest, to_lsn)
    if place.at_end:
        raise view.not_held(f"LSN {to_lsn} is past the end (the next record takes LSN {place.lsn})")
    logs = {seq: segments for seq, segments in view.logs.items() if seq <= place.log}
    pointer = read_pointer(dest)
    seq = place.log
    while True:
        scanner = LogScanner(dest, seq, logs[seq], keys=OPAQUE)
        complete_lsn = next((scanner.state.complete_lsn for _batch in scanner if scanner.state.complete), None)
        if complete_lsn is not None and complete_lsn <= to_lsn:
            return ReplayPlan(logs, seq, True, pointer)
        if seq - 1 not in logs or declares_gap(dest, logs[seq]):
            break
        seq -= 1
    if view.first_lsn(seq) != FIRST_LSN:
        raise view.not_held(f"no complete state is left at or before LSN {to_lsn} (the oldest "
                            f"complete log retained completes its snapshot after it)")
    return ReplayPlan(logs, seq, False, pointer)  # the whole history, from the first record


def _is_complete(dest: Destination, seq: int, segments: list[tuple[int, str]]) -> bool:
    scanner = LogScanner(dest, seq, segments, keys=OPAQUE)
    return any(scanner.state.complete for _batch in scanner)


def end_missing(
    dest: Destination, seq: int, next_lsn: int | None, sealed: bool, torn: bool,
    next_segments: list[tuple[int, str]] | None,
) -> tuple[int, str] | None:
    """``(LSN log seq should end before, why)`` when log ``seq`` lost its end: it is not
    sealed, it ends at ``next_lsn`` (after the torn tail, if ``torn``, is dropped), and
    either log seq+1, made of ``next_segments``, starts at a later LSN without declaring a
    gap, or (``next_segments`` None: log ``seq`` is the newest) CLOSED says a clean close
    sealed it at a later LSN. None otherwise.

    A crash leaves its log unsealed, even ending in an unfinished batch, but a later writer
    starts its log where the intact part ends, and a rotation writes the old log's records
    out before it creates the next: a later log that starts further on says this log's
    records up to there were written, so what is missing is damage (a file cut short, a
    segment lost), not a crash's torn tail. So is a newest log that a clean close sealed
    and that now ends without its seal, before where the close said it ended. Reads the
    next log's header batch, or CLOSED, only.
    """
    if sealed or next_lsn is None:
        return None
    if next_segments is None:
        first = closed_end(dest, seq)
        evidence = f"the clean close that sealed it says it ends before LSN {first}"
    else:
        header = log_header(dest, next_segments)
        got = header.get("first_lsn") if header is not None else None
        first = got if header is not None and header.get(HEADER_AFTER_GAP) is not True and isinstance(got, int) else None
        evidence = f"log {seq + 1} starts at LSN {first}"
    if first is None or first <= next_lsn:
        return None
    how = "its last batch cut short" if torn else "without its seal"
    if first == next_lsn + 1:
        lost = f"LSN {next_lsn} (1 record) is"
    else:
        lost = f"LSNs {next_lsn}..{first - 1} ({first - next_lsn} records) are"
    return first, f"log {seq} stops before LSN {next_lsn} ({how}), but {evidence}: {lost} missing from its end"


def _check_end(
    dest: Destination, p: ReplayPlan, st: LogState, next_seq: int | None, recovery: str
) -> int | None:
    """After log ``st.seq``, before ``next_seq`` (None: it is the newest): a log that lost
    its end is corruption (:func:`end_missing`), raised in strict mode and listed in
    ``st.skipped`` in skip mode, where the LSN it should have ended before (returned) is
    where the chain resumes."""
    if next_seq is not None and next_seq != st.seq + 1:
        return None
    segments = p.logs[next_seq] if next_seq is not None else None
    found = end_missing(dest, st.seq, st.next_lsn, st.sealed, st.torn is not None, segments)
    if found is None or (next_seq is None and _grew(dest, st, p.logs[st.seq])):
        return None  # (a newest log that grew since it was read was being closed meanwhile)
    first, why = found
    if st.torn is not None:
        name, offset, length = st.torn.segment, st.torn.offset, st.torn.length
    else:
        name, offset, length = segment_name(st.seq, st.position[0]), st.position[1], 0
    if recovery == "strict":
        raise CorruptLogError(why, destination=dest.url, log=st.seq, segment=name, offset=offset)
    logger.warning("skipping damage in %s log %d %s at %d: %s", dest.url, st.seq, name, offset, why)
    st.torn = None
    st.skipped.append(Skipped(st.seq, name, offset, length, why))
    return first


def _grew(dest: Destination, st: LogState, segments: list[tuple[int, str]]) -> bool:
    """Whether log ``st.seq`` holds more than the scan read (a segment added, or the last
    one longer): its writer was still writing, so an end found missing was not lost."""
    try:
        now = list_logs(dest).get(st.seq, [])
        if [name for _, name in now] != [name for _, name in segments]:
            return True
        number, name = segments[-1]
        end = st.position[1]
        if st.torn is not None and st.torn.segment == name:
            end = max(end, st.torn.offset + st.torn.length)  # read, and found unfinished
        return number != st.position[0] or dest.size(name) > end
    except OSError:
        return False


def scan_from(
    dest: Destination, p: ReplayPlan, *, recovery: str = "strict", tail_ok: bool = False,
    keys: Keyring | None = None,
) -> Iterator[tuple[LogScanner, Batch]]:
    """Every batch from the plan's start log onward, with the seq and LSN chain checked.

    A log whose header declares a gap before it ends the scan there (``p.after_gap``)."""
    assert p.start is not None
    seqs = [s for s in sorted(p.logs) if s >= p.start]
    expect: int | None = None
    link: bytes | None = None
    for i, seq in enumerate(seqs):
        if not i and not p.complete and declares_gap(dest, p.logs[seq]):
            # No complete log, and the oldest one continues nothing held here: none of it
            # is a prefix of the history, so the valid state is the empty one.
            _stop_at_gap(dest, p, seqs)
            return
        if i and seq != seqs[i - 1] + 1:
            if declares_gap(dest, p.logs[seq]):
                _stop_at_gap(dest, p, seqs[i:])
                return
            raise CorruptLogError(
                f"log {seqs[i - 1] + 1} is missing between logs {seqs[i - 1]} and {seq}",
                destination=dest.url,
                log=seqs[i - 1] + 1,
            )
        scanner = LogScanner(
            dest, seq, p.logs[seq], recovery=recovery, expect_first_lsn=expect, expect_link=link,
            tail_ok=tail_ok and i == len(seqs) - 1, keys=keys,
        )
        for batch in scanner:
            yield scanner, batch
        st = scanner.state
        if st.after_gap:
            _stop_at_gap(dest, p, seqs[i:])
            return
        if i == 0 and p.complete and not st.complete:
            raise CorruptLogError(
                "CURRENT names this log but it has no snapshot-complete marker",
                destination=dest.url,
                log=seq,
            )
        if st.header is None and recovery == "strict":
            raise CorruptLogError("log has no header record", destination=dest.url, log=seq,
                                  segment=p.logs[seq][0][1], offset=0)
        expect = st.next_lsn
        link = st.chain_head if st.chained and not st.skipped else None
        cut = _check_end(dest, p, st, seqs[i + 1] if i + 1 < len(seqs) else None, recovery)
        if cut is not None:
            expect, link = cut, None


def _stop_at_gap(dest: Destination, p: ReplayPlan, rest: list[int]) -> None:
    p.after_gap = rest
    logger.warning(
        "%s: log %d follows a gap its writer left here and no log from it on is complete yet: "
        "replaying up to the gap, not log(s) %s", dest.url, rest[0], rest,
    )


def changed_under(dest: Destination, p: ReplayPlan) -> bool:
    """Whether a writer moved on since the plan was made: CURRENT names another log, or a
    segment the plan lists from its start log on is gone (retention deleting as we read)."""
    assert p.start is not None
    if p.pointer is not None and read_pointer(dest) != p.pointer:
        return True
    return gone_since(dest, p) is not None


def gone_since(dest: Destination, p: ReplayPlan, damaged: int | None = None) -> SegmentGone | None:
    """The first segment the plan lists, from its start log on, that is gone now.

    With ``damaged``, the log a read of the plan found damage in: also the segment after
    those listed of that log when CURRENT has moved past it since the plan was made.
    Retention deletes a log's segments last first once CURRENT moved past it, so a listing
    taken meanwhile shows the log cut short (its end "missing") while every segment it
    lists is still there."""
    assert p.start is not None
    now = list_logs(dest)
    for seq, segments in sorted(p.logs.items()):
        there = {number for number, _ in now.get(seq, [])}
        for number, _name in segments:
            if seq >= p.start and number not in there:
                return SegmentGone(dest.url, seq, number)
    if damaged is not None and damaged in p.logs and p.pointer is not None:
        pointer = read_pointer(dest)
        if pointer is not None and pointer != p.pointer and pointer > damaged:
            return SegmentGone(dest.url, damaged, p.logs[damaged][-1][0] + 1)
    return None


class _GcPause:
    """The cyclic GC, paused while logs are replayed.

    A replay builds state that lives on: every record the app keeps is a container the
    collector traverses again at each of the full collections the heap's growth triggers,
    and with the app's own heap besides. Paused, a replay of records kept whole runs
    about 1.8x faster (bench/README.md). Records decode acyclic, so all they leave is
    freed by reference counting; only cycles the app itself makes while the replay runs
    wait for the collector, which resumes (if it was on) when the last replay ends.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._replays = 0
        self._resume = False

    @contextmanager
    def during_replay(self) -> Iterator[None]:
        with self._lock:
            if self._replays == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._replays += 1
        try:
            yield
        finally:
            with self._lock:
                self._replays -= 1
                if self._replays == 0 and self._resume:
                    gc.enable()


# One per process, as the collector is: concurrent replays share the pause.
gc_pause = _GcPause()


def per_record(replay: Callable[[Any], Any]) -> Callable[[list[Any]], None]:
    """A ``replay_batch`` that calls ``replay`` once per record."""

    def apply(records: list[Any]) -> None:
        for r in records:
            replay(r)

    return apply


def restore_from(
    dest: Destination,
    replay: Callable[[Any], Any] | None = None,
    *,
    replay_batch: Callable[[list[Any]], Any] | None = None,
    recovery: str = "strict",
    missing_ok: bool = True,
    codec: Codec | None = None,
    to_lsn: int | None = None,
    keys: Keyring | None = None,
) -> tuple[RestoreResult, list[LogState]]:
    if (replay is None) == (replay_batch is None):
        raise TypeError("restore() needs exactly one of replay= or replay_batch=")
    if recovery not in ("strict", "skip"):
        raise ValueError(f"recovery must be 'strict' or 'skip', not {recovery!r}")
    codec = codec or Codec()
    loads = codec.loads
    apply = replay_batch if replay_batch is not None else per_record(replay)  # type: ignore[arg-type]
    result = RestoreResult(destination=dest.url)
    p = plan(dest) if to_lsn is None else plan_until(dest, to_lsn)
    if p.start is None:
        if not missing_ok:
            raise no_log(dest)
        logger.info("no log at %s: nothing to restore", dest.url)
        return result, []
    result.found = True
    result.complete = p.complete
    states: list[LogState] = []
    current: LogScanner | None = None
    try:
        with gc_pause.during_replay():
            for scanner, batch in scan_from(dest, p, recovery=recovery, keys=keys):
                if scanner is not current:
                    current = scanner
                    states.append(scanner.state)
                    result.logs.append(scanner.seq)
                if batch.is_control:
                    continue
                if to_lsn is not None and batch.first_lsn > to_lsn:
                    break
                try:
                    # Slice by slice: each slice is applied while its records are in the cache.
                    for first, records in batch.record_slices(loads):
                        if to_lsn is not None and batch.first_lsn + first + len(records) > to_lsn + 1:
                            records = records[:max(0, to_lsn + 1 - batch.first_lsn - first)]
                        if records:
                            apply(records)
                            result.records += len(records)
                except CodecError as e:
                    # Intact bytes the app's Codec refuses: its problem, never skipped.
                    raise e.locate(f"{dest.url} log {batch.log} {segment_name(batch.log, batch.segment)}")
                except Damage as d:
                    # Checksums held but the records do not decode: corruption like any other.
                    name = segment_name(batch.log, batch.segment)
                    if recovery == "skip":
                        logger.warning("skipping undecodable batch in %s log %d %s at %d: %s",
                                    dest.url, batch.log, name, batch.offset, d.reason)
                        scanner.state.skipped.append(Skipped(batch.log, name, batch.offset, batch.header.size, d.reason))
                        continue
                    raise CorruptLogError(
                        d.reason, destination=dest.url, log=batch.log, segment=name, offset=batch.offset
                    ) from None
                result.last_commit_us = batch.header.commit_us
    except (CorruptLogError, FileNotFoundError) as e:
        if isinstance(e, FileNotFoundError) and isinstance(e, PersistLogError):
            raise
        if changed_under(dest, p):
            raise DestinationError(
                f"logs at {dest.url} were deleted while being read (retention by a running "
                "writer); restore again"
            ) from e
        raise
    result.after_gap = list(p.after_gap)
    for st in states:
        if st.torn is not None:
            result.torn_tails.append(st.torn)
        result.skipped.extend(st.skipped)
    if to_lsn is not None:
        result.next_lsn, result.last_lsn = to_lsn + 1, to_lsn
    elif states and states[-1].next_lsn is not None:
        result.next_lsn = states[-1].next_lsn
        result.last_lsn = result.next_lsn - 1
    logger.info("restored %d records from log(s) %s at %s", result.records, result.logs, dest.url)
    return result, states
