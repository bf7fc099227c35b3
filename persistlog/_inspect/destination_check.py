"""Checking a whole destination: what ``persistlog info`` and ``persistlog verify`` print,
as data.

:func:`inspect_destination` checks every log (:class:`~persistlog._inspect.log_check.LogCheck`) and
then what only a whole-destination view can: the seq chain between logs, the LSN chain from
one log into the next, CURRENT, and where a restore would start and how far it reaches. It
reads the writer lock's holder too (:func:`~persistlog._write.lock_holder.read_holder`). The
result is a :class:`~persistlog._inspect.destination_report.DestinationReport`.
"""

from __future__ import annotations

from collections.abc import Callable

from destinations import Destination

from .._format import constants as F
from .._format.crypt import Keyring
from .._read.reader import declares_gap, list_logs, read_pointer
from .._read.restore import end_missing
from .._write.lock_holder import read_holder
from .destination_report import CORRUPT, TORN, WARNING, DestinationReport, LogInfo, Problem, Progress
from .log_check import LogCheck


def inspect_destination(
    dest: Destination,
    *,
    check_records: bool = True,
    progress: Callable[[Progress], None] | None = None,
    keys: Keyring | None = None,
) -> DestinationReport:
    """Read every log at ``dest`` and report what is there and what is wrong with it.

    Every batch's checksums are checked (the reader does that), and with
    ``check_records`` every app record is decoded too, so undecodable CBOR is found. Log
    headers and seals are checked per log (:class:`LogCheck`); the seq chain, the LSN chain
    across logs and CURRENT here. ``progress`` is called after every batch. Raises
    :class:`DestinationError` when the storage cannot be read; damage never raises, it is
    reported. ``keys`` opens encrypted batches (``crypt.OPAQUE``: their payloads stay
    shut); an encrypted batch without a key raises :class:`KeyUnavailableError`.
    """
    report = DestinationReport(url=dest.url, exists=dest.exists(), appendable=dest.appendable)
    report.holder = read_holder(dest)
    logs = list_logs(dest)
    report.current, report.current_status = _current_status(dest, logs)
    if report.current_status == "damaged":
        report.problems.append(Problem(WARNING, "CURRENT is damaged; readers fall back to the logs"))
    elif report.current_status == "dangling":
        report.problems.append(
            Problem(WARNING, f"CURRENT names log {report.current}, which is not here; readers fall back to the logs")
        )
    total_segments = sum(len(s) for s in logs.values())
    bytes_before = 0
    segments_before = 0
    checked = 0
    previous: LogInfo | None = None
    oldest: LogInfo | None = None
    cut_short: tuple[LogInfo, LogInfo, str] | None = None
    for seq, segments in logs.items():
        on_batch = None
        if progress is not None:
            on_batch = _batch_progress(progress, seq, segments_before, total_segments, bytes_before)
        expect = previous.next_lsn if previous is not None else None
        # Retention deletes the oldest log last segment first: an interrupted one leaves
        # it unsealed, ending before the next log starts. Whether that matters is decided
        # once it is known where a restore starts.
        after_oldest = previous is not None and previous is oldest and not previous.sealed
        if after_oldest:
            expect = None
        declared = previous is not None and declares_gap(dest, segments)
        if declared:
            report.gaps.append(seq)
            expect = None  # not a break in the chain: its writer said so
        lost_end = None
        if previous is not None and seq == previous.seq + 1 and not declared:
            torn = any(p.kind == TORN for p in previous.problems)
            lost_end = end_missing(dest, previous.seq, previous.next_lsn, previous.sealed, torn, segments)
            if lost_end is not None and not (after_oldest and not torn):
                # Retention deletes whole segments, never part of a batch: only an oldest
                # log without a torn tail waits for _judge_cut_short.
                _lost_end(previous, *lost_end)
                expect = lost_end[0]
        if previous is not None and seq != previous.seq + 1 and previous.segments and not declared:
            last = previous.segments[-1]
            missing = f"log {previous.seq + 1}" if seq == previous.seq + 2 else f"logs {previous.seq + 1}..{seq - 1}"
            previous.problems.append(
                Problem(
                    CORRUPT, f"{missing} missing between logs {previous.seq} and {seq}", previous.seq, last.name,
                    last.bytes, lsn=previous.next_lsn, records_before=previous.records,
                )
            )
            expect = None  # the gap is the finding; do not report the LSN jump twice
        link = previous.chain_head if previous is not None and expect == previous.next_lsn else None
        reader = LogCheck(dest, seq, segments, expect, check_records, on_batch, link, keys)
        info = reader.read()
        info.continues = previous is not None and not declared and not after_oldest
        if declared:
            info.problems.insert(0, Problem(
                WARNING, f"log {seq} follows a gap its writer left here (a secondary detached or behind when "
                "its writer crashed): no replay reads across it", seq, segments[0][1], 0,
            ))
        checked += reader.records_checked
        report.logs.append(info)
        if after_oldest and not declared and previous is not None and info.first_lsn != previous.next_lsn:
            cut_short = (previous, info, lost_end[1] if lost_end is not None else "")
        bytes_before += info.bytes
        segments_before += len(segments)
        if progress is not None:
            progress(Progress(seq, segments_before, total_segments, bytes_before))
        if not info.vanished:
            previous = info
            oldest = oldest or info
    if previous is not None:
        # The newest log: lost its end if CLOSED says a clean close sealed it further on.
        torn = any(p.kind == TORN for p in previous.problems)
        newest_end = end_missing(dest, previous.seq, previous.next_lsn, previous.sealed, torn, None)
        if newest_end is not None:
            _lost_end(previous, *newest_end)
    report.records_checked = checked if check_records else None
    _decide_restore(report)
    _restore_reach(report)
    if cut_short is not None:
        _judge_cut_short(report, *cut_short)
    return report


def _current_status(dest: Destination, logs: dict[int, list[tuple[int, str]]]) -> tuple[int | None, str]:
    pointer = read_pointer(dest)
    if pointer is None:
        try:
            dest.size(F.CURRENT_NAME)
        except FileNotFoundError:
            return None, "missing"
        except OSError:
            return None, "damaged"
        return None, "damaged"
    if pointer not in logs:
        return pointer, "dangling"
    return pointer, "ok"


def _lost_end(lg: LogInfo, first: int, why: str) -> None:
    """Log ``lg`` lost its end (:func:`end_missing`): its torn tail, if it has one, is that
    damage; else the damage is at the end of its last segment. Either way the records of
    LSNs ``lg.next_lsn`` to ``first - 1`` are gone."""
    lost = first - lg.next_lsn if lg.next_lsn is not None else None
    torn = next((p for p in lg.problems if p.kind == TORN), None)
    if torn is not None:
        torn.kind, torn.reason, torn.records_lost = CORRUPT, f"{why} ({torn.reason})", lost
        return
    last = lg.segments[-1] if lg.segments else None
    lg.problems.append(
        Problem(
            CORRUPT, why, lg.seq, last.name if last else None, last.bytes if last else None,
            lsn=lg.next_lsn, records_before=lg.records, records_lost=lost,
        )
    )


def _judge_cut_short(report: DestinationReport, old: LogInfo, new: LogInfo, why: str) -> None:
    """The oldest log ends, unsealed, before the next one starts: the leftover of an
    interrupted retention when a restore does not need it, a break in the chain if it does."""
    if report.restore_from is not None and report.restore_from > old.seq:
        last = old.segments[-1] if old.segments else None
        old.problems.append(
            Problem(
                WARNING,
                f"log {old.seq} ends at LSN {old.next_lsn} without a seal and log {new.seq} starts at LSN "
                f"{new.first_lsn}: retention was deleting it when it was interrupted (the next retention "
                f"finishes); restore starts at log {report.restore_from}",
                old.seq, last.name if last else None, last.bytes if last else None,
            )
        )
        return
    if why and new.first_lsn is not None:
        _lost_end(old, new.first_lsn, why)
        return
    first = new.segments[0].name if new.segments else None
    new.problems.insert(
        0,
        Problem(
            CORRUPT, f"segment starts at LSN {new.first_lsn}, expected {old.next_lsn}", new.seq, first, 0,
            lsn=old.next_lsn, records_before=0,
        ),
    )


def _batch_progress(
    progress: Callable[[Progress], None], seq: int, segments_before: int, total: int, bytes_before: int
) -> Callable[[int, int], None]:
    def on_batch(index: int, done: int) -> None:
        progress(Progress(seq, segments_before + index, total, bytes_before + done))

    return on_batch


def _decide_restore(report: DestinationReport) -> None:
    """Where a restore starts, as ``plan()`` decides it, and whether CURRENT misleads it."""
    present = [lg for lg in report.logs if not lg.vanished]
    if not present:
        return
    by_seq = {lg.seq: lg for lg in present}
    if report.current_status == "ok" and report.current is not None:
        target = by_seq.get(report.current)
        if target is not None and not target.complete:
            report.current_status = "incomplete"
            # log=None: a problem of CURRENT itself, which a repair rewrites.
            report.problems.append(
                Problem(CORRUPT, f"CURRENT names log {report.current}, which has no snapshot-complete marker")
            )
        elif target is not None:
            report.restore_from, report.restore_complete = target.seq, True
            return
    complete = [lg.seq for lg in present if lg.complete]
    if complete:
        report.restore_from, report.restore_complete = max(complete), True
    else:
        report.restore_from, report.restore_complete = min(by_seq), False


def _restore_reach(report: DestinationReport) -> None:
    """The logs a restore replays end at the first declared gap after its start: how far
    they reach, and which logs it leaves out."""
    start = report.restore_from
    if start is None:
        return
    replayed = [lg for lg in report.logs if lg.seq >= start and not lg.vanished]
    if not report.restore_complete and start in report.gaps:
        cut = 0
    else:
        cut = next((i for i, lg in enumerate(replayed) if i and lg.seq in report.gaps), len(replayed))
    report.restore_skips = [lg.seq for lg in replayed[cut:]]
    for lg in reversed(replayed[:cut]):
        if lg.last_lsn is not None:
            report.restore_last_lsn = lg.last_lsn
            break
    for lg in reversed(replayed[:cut]):
        if lg.last_commit_us is not None:
            report.restore_last_commit_us = lg.last_commit_us
            break


__all__ = ["inspect_destination"]
