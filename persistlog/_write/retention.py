"""Retention: delete old logs only once newer complete logs make them unnecessary.

Keeps the ``retain`` newest complete logs and everything newer, and, as :class:`Retention`
asks, older logs too: those a registered consumer has not read (``keep_for_consumers``,
from the positions stored in ``consumers/``, read at each retention), and those whose
records are younger than ``retain_seconds``; ``retain_max_logs`` caps what those two keep,
so that a consumer that never reads again cannot fill the disk (past the cap it resets). A log counts as complete
when this process completed it, when CURRENT named it at open, or when a scan of it finds
the snapshot-complete marker (done only when the known ones are too few, and remembered).
Deletion runs oldest log first and, within a log, last segment first, so an interrupted
deletion never leaves a log that starts in the middle.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from destinations import Destination

from .._errors import PersistLogError
from .._format import constants as F
from .._format.crypt import OPAQUE
from .._format.decoder import Damage, parse_batch_header
from .._read.positions import PositionStore
from .._read.reader import LogScanner, list_logs

logger = logging.getLogger("persistlog")


@dataclass(frozen=True, slots=True)
class Retention:
    """What retention keeps (the retention options of :func:`persistlog.open`).

    ``logs`` complete logs always (``retain``, 1 at least). Older logs are kept as well
    while a registered consumer has not read them (``keep_for_consumers``) or while the
    log after them started less than ``seconds`` ago (``retain_seconds``: every record of
    a log is written before the next log starts); but never more than ``max_logs`` logs
    in all (``retain_max_logs``, at least ``logs``): past it the oldest go, and a consumer
    still reading one resets.
    """

    logs: int = 2
    keep_for_consumers: bool = False
    seconds: float | None = None
    max_logs: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.logs, int) or isinstance(self.logs, bool) or self.logs < 1:
            raise ValueError(f"retain must be an integer >= 1, not {self.logs!r}")
        if not isinstance(self.keep_for_consumers, bool):
            raise TypeError(f"keep_for_consumers must be True or False, not {self.keep_for_consumers!r}")
        if self.seconds is not None and (
            not isinstance(self.seconds, (int, float)) or isinstance(self.seconds, bool) or not self.seconds >= 0
        ):
            raise ValueError(f"retain_seconds must be a number of seconds >= 0 or None, not {self.seconds!r}")
        if self.max_logs is not None and (
            not isinstance(self.max_logs, int) or isinstance(self.max_logs, bool) or self.max_logs < self.logs
        ):
            raise ValueError(
                f"retain_max_logs must be an integer >= retain ({self.logs}) or None, not {self.max_logs!r}"
            )

    @property
    def keeps_more(self) -> bool:
        """Whether anything but the ``logs`` newest complete logs may be kept."""
        return self.keep_for_consumers or self.seconds is not None


def log_started(dest: Destination, segments: list[tuple[int, str]]) -> float | None:
    """When the log made of ``segments`` started: the commit time of its header batch
    (seconds since the Unix epoch); None if it cannot be read."""
    if not segments or segments[0][0] != 0:
        return None
    try:
        head = dest.read(segments[0][1], F.SEGMENT_HEADER_SIZE, F.BATCH_HEADER_SIZE)
        return parse_batch_header(head, F.SEGMENT_HEADER_SIZE).commit_us / 1e6
    except (Damage, OSError):
        return None


def is_complete(dest: Destination, seq: int, segments: list[tuple[int, str]]) -> bool:
    """Whether log ``seq`` holds a snapshot-complete marker (stops reading at it)."""
    scanner = LogScanner(dest, seq, segments, keys=OPAQUE)
    try:
        for _batch in scanner:
            if scanner.state.complete:
                return True
    except (PersistLogError, OSError) as e:
        logger.warning("cannot tell whether log %d at %s is complete: %s", seq, dest.url, e)
    return False


def apply_retention(dest: Destination, known_complete: list[int], retain: int | Retention, current: int) -> list[int]:
    """Delete what ``retain`` (a :class:`Retention`, or the number of complete logs to
    keep) allows; returns the seqs deleted. ``known_complete`` is extended in place with
    logs a scan proved complete."""
    rules = retain if isinstance(retain, Retention) else Retention(retain)
    retain = rules.logs
    logs = list_logs(dest)
    complete = sorted(s for s in set(known_complete) if s in logs)
    if len(complete) < retain:
        oldest_known = complete[0] if complete else current + 1
        for seq in sorted((s for s in logs if s < oldest_known), reverse=True):
            if is_complete(dest, seq, logs[seq]):
                complete.insert(0, seq)
                known_complete.append(seq)
                if len(complete) >= retain:
                    break
    if len(complete) < retain:
        return []
    keep_from = complete[-retain]
    if rules.keeps_more or rules.max_logs is not None:
        keep_from = kept_longer(dest, logs, keep_from, rules)
    deleted = []
    for seq in sorted(s for s in logs if s < keep_from):
        for _number, name in sorted(logs[seq], reverse=True):
            dest.delete(name)
        deleted.append(seq)
    known_complete[:] = [s for s in known_complete if s >= keep_from]
    if deleted:
        logger.info("retention at %s deleted log(s) %s, keeping from log %d", dest.url, deleted, keep_from)
    return deleted


def kept_longer(dest: Destination, logs: dict[int, list[tuple[int, str]]], keep_from: int, rules: Retention) -> int:
    """The oldest log to keep, given that the ``retain`` rule keeps from ``keep_from`` on:
    earlier for the consumers' positions and ``retain_seconds``, never earlier than the
    ``retain_max_logs`` cap allows."""
    older = [s for s in logs if s < keep_from]
    if not older:
        return keep_from
    want = keep_from
    if rules.keep_for_consumers:
        for name, position in PositionStore(dest).all().items():
            # A damaged position says nothing of where its consumer is: keep everything.
            need = older[0] if position is None else position.cursor.log
            if need < want:
                want = need
                logger.debug("retention at %s keeps from log %d for consumer %r", dest.url, need, name)
    if rules.seconds is not None:
        cutoff = time.time() - rules.seconds
        seqs = sorted(logs)
        for seq in older:
            if seq >= want:
                break
            later = seqs[seqs.index(seq) + 1]
            started = log_started(dest, logs[later])
            if started is None or started > cutoff:
                want = seq  # log `seq` held records until `later` started, within the window
                break
    if rules.max_logs is not None:
        seqs = sorted(logs)
        cap = seqs[-rules.max_logs] if len(seqs) > rules.max_logs else seqs[0]
        if want < cap:
            logger.warning(
                "retention at %s deletes logs %d..%d although they are still wanted (retain_max_logs=%d): "
                "a consumer still reading them resets", dest.url, want, cap - 1, rules.max_logs,
            )
            want = cap
    return min(want, keep_from)
