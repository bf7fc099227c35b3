"""What inspecting a destination finds, as data: the report ``persistlog info`` and
``persistlog verify`` print and ``repair`` plans from, and the progress passed on while it
is read.

A :class:`DestinationReport` holds one :class:`LogInfo` per log, each with the problems
found in it; every :class:`Problem` carries what a repair needs to cut there (the LSN due
at that point and the records before it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._format import constants as F
from .._write.lock_holder import Holder

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
    app records of the log before it; both are None when unknown. ``records_lost`` counts
    the app records the damaged bytes held (LSNs from ``lsn`` on), when that is known: the
    count in a torn batch's header, or the LSNs missing before the next log's first.
    """

    kind: str
    reason: str
    log: int | None = None
    segment: str | None = None
    offset: int | None = None
    length: int = 0
    lsn: int | None = None
    records_before: int | None = None
    records_lost: int | None = None
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
            "records_lost": self.records_lost,
            "also": list(self.also),
        }


@dataclass
class SignedHead:
    """A signed record found in a log: a ``checkpoint``, or a seal with a signature.

    ``lsn`` is the LSN due where it stands and ``head`` the chain head it signs, both
    checked against the links by the reader; ``record`` holds the key id and signature."""

    log: int
    segment: str
    offset: int
    kind: str
    lsn: int
    head: bytes
    record: dict[str, Any]

    @property
    def position(self) -> Position:
        parsed = F.parse_segment_name(self.segment)
        return (self.log, parsed[1] if parsed is not None else -1, self.offset)


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
    #: The writer that fenced the log (took the destination over while it was the newest
    #: log, unsealed): the log ends at its fence segment. None when it has no fence.
    fenced_by: str | None = None
    #: The file vanished while it was read (retention by a live writer): not damage.
    vanished: bool = False
    problems: list[Problem] = field(default_factory=list)
    #: Where the log's hash chain ends (None: the log is not chained, format version 1).
    chain_head: bytes | None = None
    #: The link of its first batch: the chain head of the log it follows (genesis: none).
    first_link: bytes | None = None
    #: Whether the log continues the one before it here, so that its first link must be
    #: that log's head: False for the oldest log, after a declared gap, and after an oldest
    #: log that retention may have been deleting (unsealed).
    continues: bool = False
    #: Its signed checkpoints and signed seal, in order.
    signed: list[SignedHead] = field(default_factory=list)
    #: Encrypted batches read, and those not opened (read without a key provider: their
    #: CRCs and links checked, their GCM tags not).
    encrypted_batches: int = 0
    unopened_batches: int = 0
    #: The key ids its encrypted batches name, in the order first met (never a key).
    key_ids: list[str] = field(default_factory=list)

    @property
    def signing_key_ids(self) -> list[str]:
        """The ids of the keys its signed records name, in the order first met."""
        ids: list[str] = []
        for s in self.signed:
            kid = s.record.get("key")
            if isinstance(kid, str) and kid not in ids:
                ids.append(kid)
        return ids

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
        """``sealed`` (complete and closed), ``complete``, ``incomplete``, ``incomplete,
        sealed`` (closed before its enumeration finished), or ``complete, fenced`` /
        ``incomplete, fenced`` (ended by the fence of a writer that took over)."""
        if self.sealed:
            return "sealed" if self.complete else "incomplete, sealed"
        base = "complete" if self.complete else "incomplete"
        return f"{base}, fenced" if self.fenced_by is not None else base

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
            "fenced_by": self.fenced_by,
            "chain_head": None if self.chain_head is None else self.chain_head.hex(),
            "encrypted_batches": self.encrypted_batches,
            "unopened_batches": self.unopened_batches,
            "key_ids": list(self.key_ids),
            "signing_key_ids": self.signing_key_ids,
            "created_us": self.created_us,
            "vanished": self.vanished,
            "problems": [p.to_dict() for p in self.problems],
        }


@dataclass
class DestinationReport:
    """Everything :func:`~persistlog._inspect.destination_check.inspect_destination` found at one
    destination."""

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
    def restore_fails_at(self) -> Problem | None:
        """The first corruption in a log a strict restore reads (from ``restore_from`` on,
        but the logs it leaves out): where ``restore()`` raises ``CorruptLogError``."""
        if self.restore_from is None:
            return None
        for p in self.corrupt:
            if p.log is not None and p.log >= self.restore_from and p.log not in self.restore_skips:
                return p
        return None

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
            "restore_fails_at": None if self.restore_fails_at is None else self.restore_fails_at.to_dict(),
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


__all__ = [
    "CORRUPT",
    "TORN",
    "WARNING",
    "DestinationReport",
    "LogInfo",
    "Position",
    "Problem",
    "Progress",
    "SegmentInfo",
]
