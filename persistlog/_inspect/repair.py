"""Repair: cut a damaged local destination back to the longest prefix that reads clean.

A torn tail (the crash artefact restore drops anyway) is safe to repair: the damaged
segment is copied aside and truncated at the last intact batch, which loses nothing a
restore reads (the unfinished batch, whose records its header counts, is dropped by restore
too). This is what etcd's ``wal/repair.go`` does. A log that ends short of where the next
log starts lost its end: that is corruption, never a torn tail.

Real corruption is refused unless ``force=True``, and the plan says what forcing would
lose. A forced repair picks the cut that keeps the most restorable state:

* damage in logs older than the one a restore starts from (history kept only for
  retention and audit) moves those old logs aside; the restored state does not change;
* damage at or after that log cuts there: the segment is copied aside and truncated at the
  damaged batch, later segments of the log move aside, and later logs move aside too unless
  their LSN chain still starts where the cut ends. If the cut removes the log's
  snapshot-complete marker, the restore start moves back to an older complete log and the
  rule applies again from there.

Nothing is ever deleted: every file that is cut or moved keeps a copy under ``broken/``
inside the destination, a directory that readers never look into (they list only files
named like segments). CURRENT is rewritten to the newest complete log that survives.

Only local destinations can be repaired: object stores write every segment object whole
and create-only, so nothing there is ever torn, and persistlog never rewrites an object.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from destinations import Destination, LockHeld
from destinations.local import LocalDestination, fsync_dir

from .._errors import DestinationError, WriterConflict
from .._format import encoder
from .._format import constants as F
from .._format.crypt import Keyring
from .._read.reader import closed_end
from .destination_check import inspect_destination
from .destination_report import CORRUPT, TORN, DestinationReport, LogInfo, Problem, Progress

logger = logging.getLogger("persistlog")

BROKEN_DIR = "broken"

TRUNCATE = "truncate"
MOVE_SEGMENT = "move-segment"
MOVE_LOG = "move-log"
WRITE_CURRENT = "write-current"
REMOVE_CURRENT = "remove-current"


@dataclass
class Action:
    """One step of a repair.

    ``records_lost`` counts app records that become unreadable (None: unknown, e.g. the
    contents of a damaged batch); ``bytes_lost`` the bytes removed from the log. ``safe``
    actions lose nothing that was acknowledged and run without ``force``.
    """

    kind: str
    log: int | None
    segment: str | None
    offset: int | None
    bytes_lost: int
    records_lost: int | None
    reason: str
    safe: bool
    target: int | None = None  # the seq CURRENT is rewritten to

    def describe(self) -> str:
        if self.kind == TRUNCATE:
            what = f"truncate log {self.log} segment {self.segment} to {self.offset} bytes (copy kept)"
        elif self.kind == MOVE_SEGMENT:
            what = f"move log {self.log} segment {self.segment} aside"
        elif self.kind == MOVE_LOG:
            what = f"move log {self.log} aside"
        elif self.kind == WRITE_CURRENT:
            what = f"point CURRENT at log {self.target}"
        else:
            what = "remove CURRENT (no complete log remains)"
        return f"{what}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "log": self.log,
            "segment": self.segment,
            "offset": self.offset,
            "bytes_lost": self.bytes_lost,
            "records_lost": self.records_lost,
            "reason": self.reason,
            "safe": self.safe,
            "target": self.target,
            "description": self.describe(),
        }


@dataclass
class RepairPlan:
    """What a repair would do, and what it would cost."""

    url: str
    report: DestinationReport
    actions: list[Action] = field(default_factory=list)
    #: The log a restore starts from after the repair (None: nothing left).
    restore_from: int | None = None
    #: The first LSN a forced cut loses (every LSN from it on); None when nothing is cut.
    lost_from_lsn: int | None = None
    #: App records the damage repaired holds, unreadable already (torn batches' headers
    #: count them; a log's missing end is counted by the next log's first LSN), and
    #: whether some damage holds records nobody can count.
    damaged_records: int = 0
    damaged_unknown: bool = False

    @property
    def needs_force(self) -> bool:
        return any(not a.safe for a in self.actions)

    @property
    def bytes_lost(self) -> int:
        return sum(a.bytes_lost for a in self.actions)

    @property
    def records_lost(self) -> int:
        """App records lost in intact batches (those of the damage: ``damaged_records``)."""
        return sum(a.records_lost or 0 for a in self.actions)

    @property
    def unknown_records(self) -> bool:
        """Whether damaged bytes, whose records cannot be counted, are among what is lost."""
        return self.damaged_unknown

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "needs_force": self.needs_force,
            "bytes_lost": self.bytes_lost,
            "records_lost": self.records_lost,
            "unknown_records": self.unknown_records,
            "damaged_records": self.damaged_records,
            "restore_from": self.restore_from,
            "lost_from_lsn": self.lost_from_lsn,
            "actions": [a.to_dict() for a in self.actions],
        }


@dataclass
class RepairResult:
    """What :func:`repair` did: the plan, whether it ran, and the destination afterwards."""

    plan: RepairPlan
    done: bool
    refused: bool = False
    dry_run: bool = False
    broken_dir: str | None = None
    saved: list[str] = field(default_factory=list)
    after: DestinationReport | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            "done": self.done,
            "refused": self.refused,
            "dry_run": self.dry_run,
            "broken_dir": self.broken_dir,
            "saved": self.saved,
            "clean_after": self.after.clean if self.after is not None else None,
            "after": self.after.to_dict() if self.after is not None else None,
        }


# -- planning ------------------------------------------------------------------------------


def _cut_position(p: Problem) -> tuple[int, int, int]:
    return p.position


def _survivors_complete(report: DestinationReport, cut: tuple[int, int, int] | None, moved: set[int]) -> list[int]:
    """Seqs of the complete logs whose snapshot-complete marker lies before ``cut``."""
    out = []
    for lg in report.logs:
        if lg.vanished or lg.seq in moved or lg.complete_at is None:
            continue
        if cut is None or (lg.seq, *lg.complete_at) < cut:
            out.append(lg.seq)
    return out


def plan_repair(report: DestinationReport) -> RepairPlan:
    """Decide the actions that make ``report``'s destination read clean (see the module
    docstring for the rule). Pure: reads nothing, changes nothing."""
    plan = RepairPlan(report.url, report)
    logs = [lg for lg in report.logs if not lg.vanished]
    by_seq = {lg.seq: lg for lg in logs}
    log_problems = [p for p in report.all_problems() if p.kind == CORRUPT and p.log is not None]

    # Find the cut: the earliest corruption at or after the log a restore would start from.
    # A cut before that log's complete marker makes it incomplete, which moves the start
    # back and may bring earlier damage into play: repeat until nothing changes.
    cut: tuple[int, int, int] | None = None
    while True:
        complete = _survivors_complete(report, cut, set())
        start = max(complete) if complete else (min(by_seq) if by_seq else None)
        if start is None:
            break
        pending = [
            p for p in log_problems
            if p.log is not None and p.log >= start and (cut is None or _cut_position(p) < cut)
        ]
        if not pending:
            break
        cut = min(_cut_position(p) for p in pending)
    history = sorted({p.log for p in log_problems if p.log is not None and (start is None or p.log < start)})

    moved: set[int] = set()
    if cut is not None:
        _plan_cut(plan, report, by_seq, cut, log_problems, moved)
    # Torn tails the cut did not already remove are truncated: that loses nothing.
    for p in report.all_problems():
        if p.kind != TORN or p.log is None or p.log in moved:
            continue
        if cut is not None and (p.log, p.position[1], p.offset or 0) >= cut:
            continue
        plan.actions.append(
            Action(TRUNCATE, p.log, p.segment, p.offset, p.length, 0,
                   f"torn tail of {p.length} bytes ({p.reason}); {_torn_cost(p)}", safe=True)
        )
    if history:
        newest_damaged = max(history)
        for lg in logs:
            if lg.seq <= newest_damaged and lg.seq not in moved:
                moved.add(lg.seq)
                plan.actions.append(
                    Action(MOVE_LOG, lg.seq, None, None, lg.bytes, lg.records,
                           f"history older than the restored log (damaged at log {newest_damaged}); "
                           "the restored state does not change", safe=False)
                )
    if plan.actions:
        damage = [p for p in report.all_problems() if p.kind in (TORN, CORRUPT) and p.log is not None]
        plan.damaged_records = sum(p.records_lost or 0 for p in damage)
        plan.damaged_unknown = any(p.records_lost is None for p in damage)
    complete = [s for s in _survivors_complete(report, cut, moved) if s not in moved]
    plan.restore_from = max(complete) if complete else min((s for s in by_seq if s not in moved), default=None)
    _plan_current(plan, report, complete)
    return plan


def _torn_cost(p: Problem) -> str:
    """What truncating a torn tail costs, as far as its bytes tell."""
    if p.records_lost == 0:
        return "no record is lost"
    if p.records_lost is None or p.lsn is None:
        held = "an unfinished batch whose header is unreadable"
    else:
        last = p.lsn + p.records_lost - 1
        held = f"an unfinished batch of LSN {p.lsn}" if last == p.lsn else f"an unfinished batch of LSNs {p.lsn}..{last}"
    return (f"it drops {held}, which a restore drops too: if a crash left it, those records "
            "were never durable; a file cut short after a clean close looks the same")


def _plan_cut(
    plan: RepairPlan,
    report: DestinationReport,
    by_seq: dict[int, LogInfo],
    cut: tuple[int, int, int],
    problems: list[Problem],
    moved: set[int],
) -> None:
    seq, number, offset = cut
    lg = by_seq[seq]
    at = next(p for p in problems if _cut_position(p) == cut)
    lsn_due = at.lsn
    records_before = at.records_before
    reason = f"corruption at {at.where()}: {at.reason}"
    # A seal must stay followed by its trailer: a cut after the seal goes before it (the
    # seal takes no LSN, so the chain into the next log is unchanged).
    sizes = {seg.number: seg.bytes for seg in lg.segments}
    only_seal = False
    if lg.seal_at is not None and lg.seal_at < (number, offset) and offset < sizes.get(number, 0):
        number, offset = lg.seal_at
        lsn_due = lg.next_lsn
        records_before = lg.records
        only_seal = True
    whole_log = lg.header_end is None or (number, offset) < lg.header_end
    plan.lost_from_lsn = lg.first_lsn if whole_log else lsn_due
    later = sorted(s for s in by_seq if s > seq)
    nxt = by_seq.get(seq + 1)
    chain_holds = (
        not whole_log and nxt is not None and nxt.first_lsn is not None and nxt.first_lsn == lsn_due
    )
    if only_seal and (chain_holds or not later):
        plan.lost_from_lsn = None  # only the seal and its trailer go: no LSN is lost
    if later and not chain_holds:
        for s in reversed(later):
            other = by_seq[s]
            moved.add(s)
            plan.actions.append(
                Action(MOVE_LOG, s, None, None, other.bytes, other.records,
                       f"follows the cut in log {seq}, so its LSN chain would be broken", safe=False)
            )
    if whole_log:
        moved.add(seq)
        plan.actions.append(Action(MOVE_LOG, seq, None, None, lg.bytes, lg.records, reason, safe=False))
        return
    lost_records = None if records_before is None else lg.records - records_before
    for seg in reversed(lg.segments):
        if seg.number > number:
            plan.actions.append(
                Action(MOVE_SEGMENT, seq, seg.name, None, seg.bytes, None, f"after the cut: {reason}", safe=False)
            )
        elif seg.number == number:
            if offset <= F.SEGMENT_HEADER_SIZE and number > 0:
                plan.actions.append(Action(MOVE_SEGMENT, seq, seg.name, None, seg.bytes, None, reason, safe=False))
            elif offset < seg.bytes:
                plan.actions.append(
                    Action(TRUNCATE, seq, seg.name, offset, seg.bytes - offset, None, reason, safe=False)
                )
    # Count the records once, on the action that starts the loss.
    cut_actions = [a for a in plan.actions if a.log == seq and a.kind in (TRUNCATE, MOVE_SEGMENT)]
    if cut_actions:
        cut_actions[-1].records_lost = lost_records


def _plan_current(plan: RepairPlan, report: DestinationReport, complete: list[int]) -> None:
    newest = max(complete) if complete else None
    status, current = report.current_status, report.current
    fine = status == "ok" and current in complete
    if fine or (status == "missing" and newest is None):
        return
    if newest is not None:
        why = {
            "damaged": "CURRENT is damaged",
            "dangling": f"CURRENT names log {current}, which is not here",
            "incomplete": f"CURRENT names log {current}, which is not complete",
            "missing": "CURRENT is missing",
        }.get(status, f"CURRENT names log {current}, which the repair removes or makes incomplete")
        plan.actions.append(Action(WRITE_CURRENT, None, None, None, 0, 0, why, safe=True, target=newest))
    elif status != "missing":
        plan.actions.append(Action(REMOVE_CURRENT, None, None, None, 0, 0, "no complete log remains", safe=True))


# -- doing it ------------------------------------------------------------------------------


def repair(
    dest: Destination,
    *,
    force: bool = False,
    dry_run: bool = False,
    owner: str = "persistlog repair",
    progress: Callable[[Progress], None] | None = None,
    keys: Keyring | None = None,
) -> RepairResult:
    """Repair the local destination ``dest``; see the module docstring.

    Takes the writer lock first (a live writer makes this raise :class:`WriterConflict`),
    except with ``dry_run``, which only plans. Without ``force`` a plan that needs it is
    not carried out (``result.refused``). Raises ``ValueError`` for a destination that is
    not local. ``progress`` is passed to the scan (see :func:`inspect_destination`).
    An encrypted batch that ``keys`` cannot open raises :class:`KeyUnavailableError` before
    anything is changed: what cannot be read is never cut.
    """
    if not isinstance(dest, LocalDestination):
        raise ValueError(
            f"repair works on local destinations only; {dest.url} is an object store, where "
            "segments are written whole and create-only, so nothing is ever torn there"
        )
    if dry_run:
        plan = plan_repair(inspect_destination(dest, progress=progress, keys=keys))
        return RepairResult(plan, done=False, refused=plan.needs_force and not force, dry_run=True)
    try:
        lock = dest.lock(owner)
    except LockHeld as e:
        raise WriterConflict(
            f"{dest.url} has a live writer ({e.holder or 'unknown holder'}): stop it before repairing"
        ) from None
    except OSError as e:
        raise DestinationError(f"cannot lock {dest.url}: {e}") from e
    try:
        plan = plan_repair(inspect_destination(dest, progress=progress, keys=keys))
        if not plan.actions:
            return RepairResult(plan, done=True, after=plan.report)
        if plan.needs_force and not force:
            return RepairResult(plan, done=False, refused=True)
        result = RepairResult(plan, done=False, broken_dir=os.path.join(dest.path, BROKEN_DIR))
        try:
            _execute(dest, plan, result)
        except OSError as e:
            raise DestinationError(f"repair of {dest.url} failed part way ({e}); run it again") from e
        result.done = True
        result.after = inspect_destination(dest, keys=keys)
        return result
    finally:
        lock.release()


def _execute(dest: LocalDestination, plan: RepairPlan, result: RepairResult) -> None:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    broken = os.path.join(dest.path, BROKEN_DIR)
    os.makedirs(broken, exist_ok=True)
    fsync_dir(dest.path)
    # CURRENT first: the log it will name is complete before and after every later step,
    # so readers never follow it into a log that is being cut.
    for a in plan.actions:
        if a.kind == WRITE_CURRENT and a.target is not None:
            dest.replace(F.CURRENT_NAME, encoder.pointer(a.target))
        elif a.kind == REMOVE_CURRENT:
            dest.delete(F.CURRENT_NAME)
    # CLOSED says where a clean close ended the newest log; a repair that cuts logs makes
    # that untrue for a log it cuts, which every later check would find missing again.
    cut = {a.log for a in plan.actions if a.kind in (MOVE_LOG, MOVE_SEGMENT, TRUNCATE) and a.log is not None}
    if cut and any(closed_end(dest, seq) is not None for seq in cut):
        dest.delete(F.CLOSED_NAME)
    by_seq = {lg.seq: lg for lg in plan.report.logs}
    # The plan lists newest material first for a cut, so an interrupted repair leaves a
    # prefix of the destination that a second run finishes.
    for a in plan.actions:
        if a.kind == MOVE_LOG and a.log is not None:
            for seg in reversed(by_seq[a.log].segments):
                result.saved.append(_move_aside(dest, broken, seg.name, stamp))
        elif a.kind == MOVE_SEGMENT and a.segment is not None:
            result.saved.append(_move_aside(dest, broken, a.segment, stamp))
        elif a.kind == TRUNCATE and a.segment is not None and a.offset is not None:
            result.saved.append(_copy_aside(dest, broken, a.segment, stamp))
            _truncate(os.path.join(dest.path, a.segment), a.offset)
            logger.warning("repair: truncated %s/%s to %d bytes (%s)", dest.url, a.segment, a.offset, a.reason)
    fsync_dir(broken)
    fsync_dir(dest.path)


def _free_name(broken: str, name: str, stamp: str) -> str:
    candidate = f"{name}.{stamp}"
    n = 1
    while os.path.exists(os.path.join(broken, candidate)):
        candidate = f"{name}.{stamp}-{n}"
        n += 1
    return candidate


def _copy_aside(dest: LocalDestination, broken: str, name: str, stamp: str) -> str:
    """Copy a segment into ``broken/`` durably before it is cut; returns the copy's path."""
    target = os.path.join(broken, _free_name(broken, name, stamp))
    shutil.copyfile(os.path.join(dest.path, name), target)
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(broken)
    return target


def _move_aside(dest: LocalDestination, broken: str, name: str, stamp: str) -> str:
    target = os.path.join(broken, _free_name(broken, name, stamp))
    os.rename(os.path.join(dest.path, name), target)
    fsync_dir(broken)
    fsync_dir(dest.path)
    logger.warning("repair: moved %s/%s to %s", dest.url, name, target)
    return target


def _truncate(path: str, size: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["Action", "RepairPlan", "RepairResult", "plan_repair", "repair"]
