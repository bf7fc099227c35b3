"""Describing and verifying a destination: what ``persistlog info`` and ``persistlog verify``
print, as data.

:func:`inspect_destination` reads every log at a destination with the one shared reader
(:class:`~persistlog._reader.LogScanner` in ``recovery="skip"`` mode, so that it goes on
past damage and finds all of it) and checks what only a whole-destination view can: the seq
chain between logs, the LSN chain from one log into the next, the seal's ``next_lsn``, the
log header, and CURRENT. Nothing here knows the byte layout; positions come from the
reader, and every problem carries what a repair needs to cut there (the LSN due at that
point and the records before it).

Reading is bounded in memory like every reader: per log only counters and a few positions
are kept, never the records.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from destinations import Destination

from . import _format as F
from ._codec import Codec
from ._decoder import Damage
from ._reader import LogScanner, declares_gap, list_logs, read_pointer

log = logging.getLogger("persistlog")

#: Names of the writer's lock file (local) and lease object (remote); see docs/FORMAT.md.
HOLDER_NAMES = ("LOCK", "LEASE")
_MAX_HOLDER_BYTES = 4096

TORN = "torn"
CORRUPT = "corrupt"
WARNING = "warning"

# A position in a destination, comparable: (log seq, segment number, byte offset).
Position = tuple[int, int, int]


@dataclass
class Problem:
    """One thing wrong at a destination.

    ``kind`` is ``"torn"`` (a crash artefact restore drops), ``"corrupt"`` (restore raises
    :class:`CorruptLogError` in strict mode) or ``"warning"`` (harmless for readers, e.g. a
    damaged CURRENT). ``length`` is the number of damaged bytes when known. ``lsn`` is the
    LSN due at ``offset`` (the first LSN a cut there would lose) and ``records_before`` the
    app records of the log before it; both are None when unknown.
    """

    kind: str
    reason: str
    log: int | None = None
    segment: str | None = None
    offset: int | None = None
    length: int = 0
    lsn: int | None = None
    records_before: int | None = None
    #: Further findings at the same damage site (nothing intact between them).
    also: list[str] = field(default_factory=list)

    @property
    def position(self) -> Position:
        """Where the problem sits, for ordering (destination-level problems sort last)."""
        number = -1
        if self.segment is not None:
            parsed = F.parse_segment_name(self.segment)
            number = parsed[1] if parsed is not None else -1
        return (
            self.log if self.log is not None else 2**63,
            number,
            self.offset if self.offset is not None else 0,
        )

    def where(self) -> str:
        """``"log 7 segment 00..07-00..01.plog offset 4096"``, leaving out what is unknown."""
        parts = []
        if self.log is not None:
            parts.append(f"log {self.log}")
        if self.segment is not None:
            parts.append(f"segment {self.segment}")
        if self.offset is not None:
            parts.append(f"offset {self.offset}")
        return " ".join(parts) or "destination"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "reason": self.reason,
            "log": self.log,
            "segment": self.segment,
            "offset": self.offset,
            "length": self.length,
            "lsn": self.lsn,
            "records_before": self.records_before,
            "also": list(self.also),
        }


@dataclass
class SegmentInfo:
    number: int
    name: str
    bytes: int


@dataclass
class LogInfo:
    """What a scan of one log found. Positions are ``(segment number, offset)``."""

    seq: int
    segments: list[SegmentInfo]
    records: int = 0
    snapshot_records: int | None = None
    first_lsn: int | None = None
    next_lsn: int | None = None
    first_commit_us: int | None = None
    last_commit_us: int | None = None
    complete: bool = False
    sealed: bool = False
    version: int | None = None
    writer: str | None = None
    created_us: int | None = None
    #: End of the log header batch: cutting at or before it leaves no usable log.
    header_end: tuple[int, int] | None = None
    complete_at: tuple[int, int] | None = None
    seal_at: tuple[int, int] | None = None
    #: The file vanished while it was read (retention by a live writer): not damage.
    vanished: bool = False
    problems: list[Problem] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.segments)

    @property
    def last_lsn(self) -> int | None:
        """The last LSN a record of this log took, None when it took none."""
        if self.first_lsn is None or self.next_lsn is None or self.next_lsn <= self.first_lsn:
            return None
        return self.next_lsn - 1

    @property
    def state(self) -> str:
        """``sealed`` (complete and closed), ``complete``, ``incomplete`` or
        ``incomplete, sealed`` (closed before its enumeration finished)."""
        if self.complete:
            return "sealed" if self.sealed else "complete"
        return "incomplete, sealed" if self.sealed else "incomplete"

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "state": self.state,
            "complete": self.complete,
            "sealed": self.sealed,
            "segments": [{"number": s.number, "name": s.name, "bytes": s.bytes} for s in self.segments],
            "bytes": self.bytes,
            "records": self.records,
            "snapshot_records": self.snapshot_records,
            "first_lsn": self.first_lsn,
            "last_lsn": self.last_lsn,
            "next_lsn": self.next_lsn,
            "first_commit_us": self.first_commit_us,
            "last_commit_us": self.last_commit_us,
            "format_version": self.version,
            "writer": self.writer,
            "created_us": self.created_us,
            "vanished": self.vanished,
            "problems": [p.to_dict() for p in self.problems],
        }


@dataclass
class Holder:
    """Who holds (or last held) the writer lock or lease, as it recorded itself.

    Read without taking the lock. ``alive`` is True/False when the holder is a process on
    this host, None otherwise; ``expires`` is a lease's expiry (Unix seconds).
    """

    name: str
    description: str
    owner: str | None = None
    host: str | None = None
    pid: int | None = None
    since: float | None = None
    expires: float | None = None
    alive: bool | None = None

    @property
    def active(self) -> bool | None:
        """Whether a writer probably holds it right now (None: cannot tell)."""
        if self.expires is not None:
            return self.expires > time.time()
        return self.alive

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "owner": self.owner,
            "host": self.host,
            "pid": self.pid,
            "since": self.since,
            "expires": self.expires,
            "alive": self.alive,
            "active": self.active,
        }


@dataclass
class DestinationReport:
    """Everything :func:`inspect_destination` found at one destination."""

    url: str
    exists: bool
    appendable: bool
    logs: list[LogInfo] = field(default_factory=list)
    #: The seq CURRENT names (None: missing or damaged) and what is true of it:
    #: ``ok``, ``missing``, ``damaged``, ``dangling`` (names no log) or ``incomplete``.
    current: int | None = None
    current_status: str = "missing"
    holder: Holder | None = None
    #: Problems that belong to no single log (CURRENT).
    problems: list[Problem] = field(default_factory=list)
    #: The log a restore starts from and whether that log is complete.
    restore_from: int | None = None
    restore_complete: bool = False
    #: How far a restore reaches: its last LSN and that record's commit time (µs since the
    #: Unix epoch), so a secondary's report says what a failover to it would lose.
    restore_last_lsn: int | None = None
    restore_last_commit_us: int | None = None
    #: Logs whose writer declared that they do not continue the log before them here (a
    #: secondary that was detached or behind); those a restore leaves out.
    gaps: list[int] = field(default_factory=list)
    restore_skips: list[int] = field(default_factory=list)
    records_checked: int | None = None

    def all_problems(self) -> list[Problem]:
        """Every problem, in destination order."""
        found = [p for lg in self.logs for p in lg.problems] + list(self.problems)
        return sorted(found, key=lambda p: p.position)

    @property
    def torn(self) -> list[Problem]:
        return [p for p in self.all_problems() if p.kind == TORN]

    @property
    def corrupt(self) -> list[Problem]:
        return [p for p in self.all_problems() if p.kind == CORRUPT]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.all_problems() if p.kind == WARNING]

    @property
    def clean(self) -> bool:
        """No torn tail and no corruption (warnings do not count)."""
        return not self.torn and not self.corrupt

    def log_info(self, seq: int) -> LogInfo | None:
        for lg in self.logs:
            if lg.seq == seq:
                return lg
        return None

    @property
    def format_versions(self) -> list[int]:
        return sorted({lg.version for lg in self.logs if lg.version is not None})

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "exists": self.exists,
            "appendable": self.appendable,
            "clean": self.clean,
            "current": self.current,
            "current_status": self.current_status,
            "holder": self.holder.to_dict() if self.holder else None,
            "format_versions": self.format_versions,
            "restore_from": self.restore_from,
            "restore_complete": self.restore_complete,
            "restore_last_lsn": self.restore_last_lsn,
            "restore_last_commit_us": self.restore_last_commit_us,
            "gaps": self.gaps,
            "restore_skips": self.restore_skips,
            "logs": [lg.to_dict() for lg in self.logs],
            "records_checked": self.records_checked,
            "problems": [p.to_dict() for p in self.all_problems()],
            "torn": len(self.torn),
            "corrupt": len(self.corrupt),
            "warnings": len(self.warnings),
        }


@dataclass
class Progress:
    """Passed to the progress callback after every batch read: the log being read, the
    segments finished out of all at the destination, and the bytes read so far."""

    log: int
    segments_done: int
    segments_total: int
    bytes_done: int


def read_holder(dest: Destination) -> Holder | None:
    """The writer lock's or lease's recorded holder, read without taking it.

    A local ``LOCK`` is emptied by a clean release, so content there means a live writer or
    one that was killed; whether its process still runs is checked when it is on this host.
    """
    for name in HOLDER_NAMES:
        try:
            raw = dest.read(name, 0, _MAX_HOLDER_BYTES)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            log.debug("cannot read %s/%s: %s", dest.url, name, e)
            continue
        if not raw.strip():
            continue
        return _parse_holder(name, raw)
    return None


def _parse_holder(name: str, raw: bytes) -> Holder:
    try:
        info = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        info = None
    if not isinstance(info, dict):
        return Holder(name, raw.decode("utf-8", "replace").strip()[:200])
    pid = info.get("pid") if isinstance(info.get("pid"), int) else None
    host = info.get("host") if isinstance(info.get("host"), str) else None
    since = info.get("since") if isinstance(info.get("since"), (int, float)) else None
    expires = info.get("expires") if isinstance(info.get("expires"), (int, float)) else None
    owner = str(info.get("owner", "?"))
    alive: bool | None = None
    if pid is not None and host == socket.gethostname():
        alive = _process_alive(pid)
    return Holder(
        name,
        f"{owner} (pid {pid if pid is not None else '?'} on {host or '?'})",
        owner=owner,
        host=host,
        pid=pid,
        since=since,
        expires=expires,
        alive=alive,
    )


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    except OSError:
        return False
    return True


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


class _LogReader:
    """Scans one log in skip mode, turning what the scanner records into :class:`Problem`s
    located precisely enough to cut at."""

    def __init__(
        self,
        dest: Destination,
        seq: int,
        segments: list[tuple[int, str]],
        expect_first_lsn: int | None,
        check_records: bool,
        on_batch: Callable[[int, int], None] | None,
    ) -> None:
        self.dest = dest
        self.seq = seq
        self.segments = segments
        self.expect = expect_first_lsn
        self.check_records = check_records
        self.on_batch = on_batch
        self.loads = Codec().loads
        self.records_checked = 0

    def read(self) -> LogInfo:
        sizes = []
        for number, name in self.segments:
            try:
                sizes.append(SegmentInfo(number, name, self.dest.size(name)))
            except FileNotFoundError:
                info = LogInfo(self.seq, sizes, vanished=True)
                return info
        info = LogInfo(self.seq, sizes)
        # Bytes of the log before each segment, for progress.
        before: dict[int, tuple[int, int]] = {}
        total = 0
        for index, seg in enumerate(sizes):
            before[seg.number] = (index, total)
            total += seg.bytes
        scanner = LogScanner(self.dest, self.seq, self.segments, recovery="skip", expect_first_lsn=self.expect)
        st = scanner.state
        seen = 0
        # App records of the intact batches read so far, the LSN due after the last of
        # them, and how many batches were read: what a cut at the next damage keeps.
        records = 0
        lsn_due = self.expect
        read = 0
        # Damage the scanner reported but the scan has not passed yet (it reports a gap in
        # the segment numbers before reading any): placed once the scan reaches it.
        pending: list[Problem] = []
        last_point = -1

        def place(p: Problem) -> None:
            nonlocal last_point
            p.records_before = records
            p.lsn = lsn_due if lsn_due is not None else st.first_lsn
            previous = info.problems[-1] if info.problems else None
            if previous is not None and previous.kind == CORRUPT and last_point == read:
                # Nothing intact between the two: one damage site, and what followed from it
                # (an LSN the skipped batch would have carried, a segment after a gap).
                previous.also.append(f"{p.where()}: {p.reason}")
            else:
                info.problems.append(p)
            last_point = read

        def settle(upto: tuple[int, int] | None) -> None:
            nonlocal seen
            for sk in st.skipped[seen:]:
                pending.append(Problem(CORRUPT, sk.reason, sk.log, sk.segment, sk.offset, sk.length))
            seen = len(st.skipped)
            for p in sorted(pending, key=lambda q: q.position):
                if upto is None or p.position[1:] <= upto:
                    pending.remove(p)
                    place(p)

        try:
            for batch in scanner:
                settle((batch.segment, batch.offset))
                count = 0 if batch.is_control else batch.header.count
                if batch.controls is not None:
                    self._controls(info, batch.controls, batch.segment, batch.offset, batch.end)
                elif self.check_records:
                    try:
                        for _first, _records in batch.record_slices(self.loads):
                            pass
                        self.records_checked += count
                    except Damage as d:
                        place(Problem(CORRUPT, d.reason, self.seq, _name(self.segments, batch.segment),
                                      batch.offset, batch.header.size))
                records += count
                lsn_due = st.next_lsn
                read += 1
                if self.on_batch is not None:
                    index, done = before.get(batch.segment, (0, 0))
                    self.on_batch(index, done + batch.end)
        except FileNotFoundError:
            info.vanished = True
            return info
        settle(None)
        info.records = st.records
        # The scanner only records a first LSN it had to learn from a segment header.
        info.first_lsn = st.first_lsn if st.first_lsn is not None else self.expect
        info.next_lsn = st.next_lsn
        info.first_commit_us = st.first_commit_us
        info.last_commit_us = st.last_commit_us
        info.complete = st.complete
        info.sealed = st.sealed
        if st.torn is not None:
            t = st.torn
            info.problems.append(
                Problem(
                    TORN, t.reason, t.log, t.segment, t.offset, t.length, lsn=st.next_lsn, records_before=st.records
                )
            )
        if st.header is None and info.segments and not _has_problem_at_start(info):
            info.problems.append(
                Problem(
                    CORRUPT, "log has no header record", self.seq, info.segments[0].name, F.SEGMENT_HEADER_SIZE,
                    lsn=st.first_lsn, records_before=0,
                )
            )
        if st.seal is not None:
            sealed_next = st.seal.get("next_lsn")
            if sealed_next != st.next_lsn and info.seal_at is not None:
                info.problems.append(
                    Problem(
                        CORRUPT, f"seal says the next LSN is {sealed_next}, the log ends at {st.next_lsn}",
                        self.seq, _name(self.segments, info.seal_at[0]), info.seal_at[1],
                        lsn=st.next_lsn, records_before=st.records,
                    )
                )
        return info

    def _controls(self, info: LogInfo, controls: list[dict[str, Any]], segment: int, offset: int, end: int) -> None:
        for c in controls:
            t = c["t"]
            if t == F.CONTROL_HEADER:
                info.header_end = (segment, end)
                version = c.get("v")
                info.version = version if isinstance(version, int) else None
                writer = c.get("writer")
                info.writer = writer if isinstance(writer, str) else None
                created = c.get("created")
                info.created_us = created if isinstance(created, int) else None
            elif t == F.CONTROL_COMPLETE:
                info.complete_at = (segment, offset)
                n = c.get("records")
                info.snapshot_records = n if isinstance(n, int) else None
            elif t == F.CONTROL_SEAL:
                info.seal_at = (segment, offset)


def _name(segments: list[tuple[int, str]], number: int) -> str:
    for n, name in segments:
        if n == number:
            return name
    return F.segment_name(0, number)


def _has_problem_at_start(info: LogInfo) -> bool:
    """Whether segment 0's own header is already reported (then a missing log header is
    the same damage, not news)."""
    return any(p.kind == CORRUPT and p.offset == 0 and p.position[1] <= 0 for p in info.problems)


def inspect_destination(
    dest: Destination,
    *,
    check_records: bool = True,
    progress: Callable[[Progress], None] | None = None,
) -> DestinationReport:
    """Read every log at ``dest`` and report what is there and what is wrong with it.

    Every batch's checksums are checked (the reader does that), and with
    ``check_records`` every app record is decoded too, so undecodable CBOR is found. The
    seq chain, the LSN chain across logs, log headers, seals and CURRENT are checked here.
    ``progress`` is called after every batch. Raises :class:`DestinationError` when the
    storage cannot be read; damage never raises, it is reported.
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
    cut_short: tuple[LogInfo, LogInfo] | None = None
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
        reader = _LogReader(dest, seq, segments, expect, check_records, on_batch)
        info = reader.read()
        if declared:
            info.problems.insert(0, Problem(
                WARNING, f"log {seq} follows a gap its writer left here (a secondary detached or behind when "
                "its writer crashed): no replay reads across it", seq, segments[0][1], 0,
            ))
        checked += reader.records_checked
        report.logs.append(info)
        if after_oldest and not declared and previous is not None and info.first_lsn != previous.next_lsn:
            cut_short = (previous, info)
        bytes_before += info.bytes
        segments_before += len(segments)
        if progress is not None:
            progress(Progress(seq, segments_before, total_segments, bytes_before))
        if not info.vanished:
            previous = info
            oldest = oldest or info
    report.records_checked = checked if check_records else None
    _decide_restore(report)
    _restore_reach(report)
    if cut_short is not None:
        _judge_cut_short(report, *cut_short)
    return report


def _judge_cut_short(report: DestinationReport, old: LogInfo, new: LogInfo) -> None:
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


__all__ = [
    "CORRUPT",
    "TORN",
    "WARNING",
    "DestinationReport",
    "Holder",
    "LogInfo",
    "Problem",
    "Progress",
    "SegmentInfo",
    "inspect_destination",
    "read_holder",
]
