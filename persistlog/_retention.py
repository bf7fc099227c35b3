"""Retention: delete old logs only once newer complete logs make them unnecessary.

Keeps the ``retain`` newest complete logs and everything newer. A log counts as complete
when this process completed it, when CURRENT named it at open, or when a scan of it finds
the snapshot-complete marker (done only when the known ones are too few, and remembered).
Deletion runs oldest log first and, within a log, last segment first, so an interrupted
deletion never leaves a log that starts in the middle.
"""

from __future__ import annotations

import logging

from destinations import Destination

from ._errors import PersistLogError
from ._reader import LogScanner, list_logs

log = logging.getLogger("persistlog")


def is_complete(dest: Destination, seq: int, segments: list[tuple[int, str]]) -> bool:
    """Whether log ``seq`` holds a snapshot-complete marker (stops reading at it)."""
    scanner = LogScanner(dest, seq, segments)
    try:
        for _batch in scanner:
            if scanner.state.complete:
                return True
    except (PersistLogError, OSError) as e:
        log.warning("cannot tell whether log %d at %s is complete: %s", seq, dest.url, e)
    return False


def apply_retention(dest: Destination, known_complete: list[int], retain: int, current: int) -> list[int]:
    """Delete what ``retain`` allows; returns the seqs deleted. ``known_complete`` is
    extended in place with logs a scan proved complete."""
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
    deleted = []
    for seq in sorted(s for s in logs if s < keep_from):
        for _number, name in sorted(logs[seq], reverse=True):
            dest.delete(name)
        deleted.append(seq)
    known_complete[:] = [s for s in known_complete if s >= keep_from]
    if deleted:
        log.info("retention at %s deleted log(s) %s, keeping from log %d", dest.url, deleted, keep_from)
    return deleted
